"""Crawler traps end: links whose path repeats itself or runs too deep are not followed.

A server that answers every path (a relative ``shop/`` link on each page gives
``/shop/shop/shop/…``) made a crawl go on until URLLENGTH_LIMIT: hundreds of fetches per
trap, each a new URL to the dupefilter.
"""

from __future__ import annotations

import logging

import pytest
from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from middlewares.traps import PathTrapMiddleware, path_segments, repeats_more_than
from tests import crawlcheck, runner
from tests.testweb import RequestInfo, Response

BASE = "http://shop.test"


@pytest.mark.parametrize(("path", "trap"), [
    ("/a/a", False), ("/a/a/a", True), ("/shop/shop/shop/", True),
    ("/a/b/a/b/a", False), ("/a/b/a/b/a/b", True), ("/x/a/b/c/a/b/c/a/b/c/y", True),
    ("/2024/01/01/", False), ("/a/b/a/c/a/d", False), ("/a//a//a", True),
    ("/", False), ("/p/1/p/2/p/3", False),
])
def test_a_path_is_a_trap_when_a_run_of_segments_comes_more_than_twice_in_a_row(path, trap):
    assert repeats_more_than(path_segments(BASE + path + "?q=/a/a/a"), 2) is trap


def middleware(**settings):
    crawler = get_crawler(settings_dict=settings)
    crawler.stats.open_spider()
    return PathTrapMiddleware.from_crawler(crawler), crawler.stats


def test_links_found_on_pages_are_dropped_counted_and_said_once_per_host(caplog):
    mw, stats = middleware()
    page = HtmlResponse(f"{BASE}/shop/shop/", body=b"")
    links = [Request(f"{BASE}/shop/shop/shop/"), Request(f"{BASE}/shop/"),
             Request(f"{BASE}/a/a/a/b/"), Request(BASE + "/d" * 21),
             Request(BASE + "".join(f"/{i}" for i in range(20)))]
    with caplog.at_level(logging.INFO, logger="middlewares.traps"):
        kept = [mw.get_processed_request(r, page) for r in links]
    assert [r.url if r else None for r in kept] == [
        None, f"{BASE}/shop/", None, None, BASE + "".join(f"/{i}" for i in range(20))]
    assert stats.get_value("webfarm/traps/repeated_path") == 2
    assert stats.get_value("webfarm/traps/deep_path") == 1
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1, said  # one host: said once
    assert said[0].startswith(f"Not following {BASE}/shop/shop/shop/, found on {BASE}/shop/shop/"
                              ": path segments repeated more than 2 times in a row "
                              "(WEBFARM_MAX_PATH_REPEATS), a crawler trap")
    # A start request is the user's own: it goes, whatever its path.
    start = Request(f"{BASE}/a/a/a/")
    assert mw.get_processed_request(start, None) is start


def test_each_rule_has_its_setting_and_0_turns_it_off():
    deep = Request(BASE + "/d" * 8)
    page = HtmlResponse(f"{BASE}/", body=b"")
    strict, _ = middleware(WEBFARM_MAX_PATH_SEGMENTS=5, WEBFARM_MAX_PATH_REPEATS=0)
    assert strict.get_processed_request(deep, page) is None
    assert strict.get_processed_request(Request(f"{BASE}/a/a/a/a/"), page) is not None
    lenient, _ = middleware(WEBFARM_MAX_PATH_REPEATS=8)
    assert lenient.get_processed_request(deep, page) is deep  # 8 repeats of "d": allowed
    with pytest.raises(NotConfigured):
        middleware(WEBFARM_MAX_PATH_REPEATS=0, WEBFARM_MAX_PATH_SEGMENTS=0)


def trap_page(info: RequestInfo) -> Response:
    """Every path under /trap/ is the same page, linking a relative ``shop/``, a URL with
    a user:password, which Scrapy's downloader fails on at every try, and a JSON API."""
    creds = f"http://user:secret@{info.netloc}/trap/creds"
    return Response.html(f'<html><body><a href="shop/">shop</a><a href="{creds}">in</a>'
                         '<a href="/api.json">API</a></body></html>')


def deep_page(info: RequestInfo) -> Response:
    """/deep/1/2/…/k/ links ``k+1/``: no repeat, ever deeper."""
    depth = len(path_segments(info.base_url + info.path))
    return Response.html(f'<html><body><a href="{depth}/">next</a></body></html>')


def test_a_crawl_into_two_traps_ends_after_a_few_pages(web, stores):
    base = web.base_urls[0]
    web.route("/trap/", trap_page, host=base)
    web.route("/deep/", deep_page, host=base)
    web.route("/api.json", Response(200, {"Content-Type": "application/json"},
                                    b'{"html": "<a href=\\"/trap/\\">x</a>"}'), host=base)
    result = runner.scrapy(
        ["crawl", "generic", "-a", f"start={base}/trap/,{base}/deep/",
         "-s", "WEBFARM_MAX_PATH_SEGMENTS=6", "-s", "LOG_LEVEL=INFO"],
        runner.env_for(**stores, WEBFARM_HOST_DELAY="0", WEBFARM_IDLE_TIMEOUT="2"),
        timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    fetched = sorted(h.path for h in web.hits if h.path.startswith(("/trap/", "/deep/")))
    assert fetched == ["/deep/", "/deep/1/", "/deep/1/2/", "/deep/1/2/3/", "/deep/1/2/3/4/",
                       "/deep/1/2/3/4/5/", "/trap/", "/trap/shop/", "/trap/shop/shop/"]
    assert crawlcheck.stat(result.output, "webfarm/traps/repeated_path") == 1
    assert crawlcheck.stat(result.output, "webfarm/traps/deep_path") == 1
    assert result.output.count("a crawler trap; further such links") == 1  # one host
    # The user:password link is not queued (it failed 5 times, then was dead-lettered),
    # said once for the host, with its password masked.
    assert crawlcheck.stat(result.output, "webfarm/frontier/unfetchable") == 3  # 3 pages
    assert result.output.count("a user:password@ in the URL, which Scrapy does not") == 1
    assert "secret" not in result.output
    assert crawlcheck.dead_letters(stores["REDIS_URL"]) == {}
    # The JSON page is stored, with no links taken from it; its callback failed before,
    # and it was dead-lettered.
    pages = crawlcheck.pages(stores)
    assert pages[base + "/api.json"]["status"] == 200
    # The trap's copies are one content: stored once as a blob, the rest duplicates.
    copies = [pages[base + p] for p in ("/trap/", "/trap/shop/", "/trap/shop/shop/")]
    assert len({p["content_hash"] for p in copies}) == 1


def calendar_page(info: RequestInfo) -> Response:
    """/calendar?month=N links the month before and after: a URL space without end."""
    month = int(info.query.partition("month=")[2] or 0)
    return Response.html(f'<html><body><h1>Events, month {month}</h1>'
                         f'<a href="?month={month - 1}">earlier</a>'
                         f'<a href="?month={month + 1}">later</a></body></html>')


def test_a_query_string_trap_ends_at_the_host_budget_across_two_workers(web, stores,
                                                                        tmp_path):
    """A calendar's ?month= links go on for ever and no path rule sees them. Two workers of
    one spider with WEBFARM_HOST_BUDGET=20 fetch 20 of its URLs together (the start URL
    is one: it went through the dupefilter), then stop; before, each ran until
    CLOSESPIDER_PAGECOUNT."""
    base = web.base_urls[0]
    web.route("/calendar", calendar_page, host=base)
    args = ["crawl", "generic", "-a", f"start={base}/calendar?month=0",
            "-s", "WEBFARM_HOST_BUDGET=20", "-s", "CLOSESPIDER_PAGECOUNT=150",
            "-s", "LOG_LEVEL=INFO"]
    env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0", WEBFARM_IDLE_TIMEOUT="2")
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    workers = [runner.popen(args, env, log) for log in logs]
    assert [w.wait(120) for w in workers] == [0, 0], logs[0].read_text()[-3000:]
    outputs = [log.read_text() for log in logs]
    fetched = [h.path for h in web.hits if h.path.startswith("/calendar")]
    assert len(fetched) == len(set(fetched)) == 20, sorted(fetched)  # each once
    assert sum(crawlcheck.stat(out, "webfarm/frontier/over_host_budget")
               for out in outputs) >= 2  # the links of the last pages, at least
    said = [line for out in outputs for line in out.splitlines()
            if "has used its budget of 20 URLs (WEBFARM_HOST_BUDGET)" in line]
    assert 1 <= len(said) <= 2  # once per worker that met it
    assert len(crawlcheck.pages(stores)) == 20
