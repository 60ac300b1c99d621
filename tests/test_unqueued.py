"""Requests the frontier does not hold: those of ``scrapy fetch``, ``parse``, ``shell``,
``view`` and ``check`` (Scrapy's own scheduler). Webfarm's middlewares end a request by
handing it to the frontier (``RetryLater``, ``DeadLetter``, both ``IgnoreRequest``); with
no frontier to take them, a 503, a refused connection or a body over the size limit
ended the command with nothing printed and nothing said. Here they are retried as
Scrapy's ``RetryMiddleware`` retries, and what ends one is said at ERROR."""

from __future__ import annotations

import pytest

from tests import runner
from tests.servers import free_port
from tests.testweb import Response, TestWeb

HOST = "127.0.0.13"


@pytest.fixture(scope="module")
def web():
    with TestWeb(hosts=(HOST,), categories=1, products_per_category=1) as web:
        base = web.base_urls[0]
        web.route("/busy", Response.html("<title>Come back later</title>", status=503),
                  host=base)
        web.route("/big", Response.html("<p>" + "x" * 50_000 + "</p>"), host=base)
        yield web


def fetch(stores, url: str, *args: str) -> runner.Result:
    env = runner.env_for(**stores, WEBFARM_RENDER="http", WEBFARM_RETRY_TIMES="3")
    return runner.scrapy(["fetch", *args, url], env, timeout=120)


def test_a_503_is_tried_again_then_printed_as_scrapy_fetch_prints_it(web, stores):
    url = f"{web.base_urls[0]}/busy"
    result = fetch(stores, url)
    assert result.returncode == 0, result.output[-3000:]
    assert "<title>Come back later</title>" in result.stdout  # the answer it got, in the end
    assert len(web.hits_for(host=url, path="/busy")) == 3  # WEBFARM_RETRY_TIMES tries
    assert f"Gave up retrying <GET {url}> (failed 3 times): 503" in result.stderr


@pytest.mark.parametrize("robots", ["obeyed", "not obeyed"])
def test_a_host_that_refuses_connections_is_said(stores, robots):
    url = f"http://{HOST}:{free_port(HOST)}/page"
    args = ["-s", "ROBOTSTXT_OBEY=False"] if robots == "not obeyed" else []
    result = fetch(stores, url, *args)
    assert result.returncode == 0, result.output[-3000:]
    assert result.stdout == ""
    said = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert any(f"Gave up retrying <GET {url}> (failed 3 times)" in line
               and "refused" in line for line in said), result.stderr[-3000:]
    if robots == "obeyed":  # robots.txt could not be read: the page was not asked for
        assert any("robots.txt unavailable" in line for line in said)
    else:  # Scrapy's own line for a download that failed
        assert any(f"Error downloading <GET {url}>" in line for line in said)


def test_a_body_over_the_size_limit_is_said_once(web, stores):
    url = f"{web.base_urls[0]}/big"
    result = fetch(stores, url, "-s", "DOWNLOAD_MAXSIZE=10000")
    assert result.returncode == 0, result.output[-3000:]
    assert result.stdout == ""
    assert len(web.hits_for(host=url, path="/big")) == 1  # the same answer again: no retry
    assert f"ERROR: Gave up on <GET {url}>: body over DOWNLOAD_MAXSIZE (10000 B)" \
        in result.stderr, result.stderr[-3000:]
