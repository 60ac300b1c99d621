"""A request's errback hears of a failure as in Scrapy: once, when the request is given
up, with the error itself. The frontier retries a 503 or a refused connection; the
errback was called on every try, with webfarm's ``RetryLater`` (an ``IgnoreRequest``),
so the checks of Scrapy's docs (``failure.check(HttpError)``, a DNS error,
``TimeoutError``) never matched and an errback that records failures recorded each try."""

from __future__ import annotations

import re

from tests import crawlcheck, runner
from tests.servers import free_port
from tests.testweb import Response, TestWeb

HOST = "127.0.0.14"


def test_the_errback_gets_the_error_once_when_the_frontier_gives_up(stores):
    with TestWeb(hosts=(HOST,), categories=1, products_per_category=1) as web:
        base = web.base_urls[0]
        web.route("/busy", Response.html("<title>Busy</title>", status=503), host=base)
        web.route("/ok", Response.html("<title>Fine</title>"), host=base)
        refused = f"http://{HOST}:{free_port(HOST)}/gone"
        unresolved = f"http://bad..host:{free_port(HOST)}/"  # no DNS name: idna refuses it
        env = runner.env_for(**stores, WEBFARM_IDLE_TIMEOUT="2")
        result = runner.scrapy(
            ["crawl", "test_errbacks", "-a",
             f"start={base}/busy,{refused},{unresolved},{base}/ok", "-a", "max_pages=3",
             "-s", "SPIDER_MODULES=spiders,tests.spiders", "-s", "WEBFARM_RETRY_TIMES=3",
             "-s", "WEBFARM_RETRY_BACKOFF_BASE=0.05"], env, timeout=120)
        busy_tries = len(web.hits_for(host=base, path="/busy"))
    assert result.returncode == 0, result.output[-3000:]
    assert busy_tries == 3  # retried by the frontier
    said = re.findall(r"errback: (\S+) (\w+)", result.stderr)
    assert sorted(said) == sorted([(f"{base}/busy", "HttpError"),
                                   (refused, "DownloadConnectionRefusedError"),
                                   (unresolved, "CannotResolveHostError")]), said
    assert crawlcheck.stat(result.stderr, "webfarm/frontier/dead") == 3, "\n".join(
        line for line in result.stderr.splitlines() if "Dead-letter" in line)
    # /ok's, and the errbacks' records: after a network error an item comes with the
    # Failure, which the monitor took for a response (an AttributeError traceback each)
    assert crawlcheck.stat(result.stderr, "item_scraped_count") == 4
    assert "Traceback" not in result.output, result.output[-3000:]
    # A plain Scrapy spider takes -a max_pages as an attribute nothing reads: said.
    assert ("-a max_pages is read by WebfarmSpider only; test_errbacks is a Spider, which "
            "ignores it: use -s CLOSESPIDER_PAGECOUNT=N") in result.output
    # Scrapy's retry stats, as its RetryMiddleware keeps them (monitoring reads them)
    assert crawlcheck.stat(result.stderr, "retry/count") == 6
    assert crawlcheck.stat(result.stderr, "retry/max_reached") == 3
    assert crawlcheck.stat(result.stderr, "retry/reason_count/503 Service Unavailable") == 2
    assert crawlcheck.stat(
        result.stderr,
        "retry/reason_count/scrapy.exceptions.DownloadConnectionRefusedError") == 2
    assert crawlcheck.stat(
        result.stderr, "retry/reason_count/scrapy.exceptions.CannotResolveHostError") == 2


def test_a_playwright_error_is_one_line_in_its_dead_letter():
    """Playwright's errors end with a "Call log:" of many lines: a dead letter's reason
    is one line in `scrapy dlq`."""
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    from webfarm.exceptions import error_text

    exc = PlaywrightTimeout("Page.goto: Timeout 8000ms exceeded.\nCall log:\n  - navigating "
                            'to "http://shop.test/x", waiting until "load"\n')
    assert error_text(exc) == "TimeoutError: Page.goto: Timeout 8000ms exceeded."
    assert error_text(ValueError("two\nlines")) == "ValueError: two\nlines"  # others as they are
