"""Retry-After on 429 and 503: the host is left alone until then, measured at the server."""

from __future__ import annotations

import threading
import time
from email.utils import formatdate

import pytest

from middlewares.retry import parse_retry_after
from tests.test_robots import (
    crawl_args,
    env,
    frontier_of,
    mini_site,
    run,
    stat,
    stored_urls,
)

NOW = 1_800_000_000.0


@pytest.mark.parametrize("value, seconds", [
    (b"120", 120.0), ("  7 ", 7.0), ("1.5", 1.5), ("0", 0.0),
    (formatdate(NOW + 90, usegmt=True), 90.0),
    (formatdate(NOW - 90, usegmt=True), 0.0),  # a date in the past: go ahead
    ("Sun, 06 Nov 1994 08:49:37 GMT", 0.0),
    (None, None), ("", None), ("-5", None), ("soon", None), ("1e9", None), ("12abc", None),
    ("Mon, 99 Foo 2026 99:99:99 GMT", None), (b"\xff\xfe", None), ("9" * 40, 1e40),
    ("9" * 400, float("inf")),  # the caller caps it at WEBFARM_RETRY_AFTER_MAX
])
def test_parse_retry_after(value, seconds):
    assert parse_retry_after(value, now=NOW) == seconds


def first_hit_refused(status: int, retry_after):
    """A handler: the host's first page request gets ``status`` + Retry-After, then pages."""
    state = {"refused": None}
    lock = threading.Lock()

    def handler(info):
        if info.path == "/robots.txt":
            return None
        with lock:
            if state["refused"] is None:
                state["refused"] = info.path
                value = retry_after() if callable(retry_after) else retry_after
                return type(info.catalogue())(status, {"Retry-After": value,
                                                       "Content-Type": "text/plain"},
                                              b"slow down\n")
        return None

    return handler, state


@pytest.mark.serial
def test_retry_after_defers_the_host(web, stores, tmp_path):  # noqa: F811 - fixture
    capped, dated = web.base_urls
    urls_capped = mini_site(web, capped, pages=3, private=0)
    urls_dated = mini_site(web, dated, pages=3, private=0)
    # Any number of digits is delay-seconds (RFC 9110): 30 nines was "unusable", so the
    # host that asked for the longest wait was asked again after the usual backoff.
    h503, refused_capped = first_hit_refused(503, "9" * 30)
    h429, refused_dated = first_hit_refused(429, lambda: formatdate(time.time() + 3,
                                                                    usegmt=True))
    for base, handler in ((capped, h503), (dated, h429)):
        web.route("/", handler, host=base)  # ahead of the mini site's pages, falls through
    result = run(crawl_args(urls_capped + urls_dated, "WEBFARM_RETRY_AFTER_MAX=3"),
                 env(stores, WEBFARM_HOST_DELAY="0.5"), timeout=90)

    for base, state, wait in ((capped, refused_capped, 3.0), (dated, refused_dated, 2.0)):
        hits = sorted((h for h in web.hits_for(host=base) if h.path != "/robots.txt"),
                      key=lambda h: h.monotonic)
        first = next(i for i, h in enumerate(hits) if h.path == state["refused"])
        refused_at = hits[first].monotonic
        later = [h.monotonic - refused_at for h in hits[first + 1:]]
        # Nothing reached the host before the deferral ended (the host delay alone is 0.5 s).
        assert later and min(later) >= wait * 0.9, (base, later)
        # The refused page itself came back and was fetched.
        assert [h.path for h in hits].count(state["refused"]) == 2
    assert stored_urls(stores) == set(urls_capped + urls_dated)
    assert frontier_of(stores["REDIS_URL"]).counts()["dead"] == 0
    assert "capped at WEBFARM_RETRY_AFTER_MAX=3s" in result.output
    assert stat(result.output, "webfarm/retry_after/deferred") == 2


def test_a_worker_waiting_on_its_frontier_says_why_at_the_log_s_pace(caplog):
    """A start URL whose server refuses: robots.txt and the retry wait minutes here
    (Scrapy gives up in seconds), and the log said only "Crawled 0 pages" meanwhile."""
    from scrapy.statscollectors import MemoryStatsCollector
    from scrapy.utils.test import get_crawler

    from webfarm.advice import WaitingNotice

    stats = MemoryStatsCollector(get_crawler())
    notice = WaitingNotice(every=60)
    said = []
    with caplog.at_level("INFO", logger="webfarm.scheduler"):
        for now in range(0, 700, 5):  # the engine asks while idle, every 5 s
            if now == 400:
                stats.inc_value("webfarm/frontier/dequeued")  # a fetch: quiet starts again
            if notice.idle_with_work(stats, "acme", ready_in=311.0, now=float(now)):
                said.append(now)
    assert said == [60, 360, 460]  # after a quiet minute, then every five; anew after a fetch
    assert caplog.records[0].getMessage().startswith(
        "Nothing fetched for 1m 00s, though acme's frontier holds work for this worker: it "
        "waits for a retry (a refused connection, a 5xx), a host's delay, an unreadable "
        "robots.txt, or a lease another worker holds (one that died gives it back after "
        "WEBFARM_LEASE_SECONDS); the next may be ready in 5m 11s. `scrapy frontier acme` "
        "shows what waits")
    # With proxy rotation on and none healthy, that comes first: requests wait for one,
    # and a retired proxy never comes back on its own (it was not said).
    stats.set_value("webfarm/proxies/healthy", [])
    stats.set_value("webfarm/proxies/retired", ["eu-1", "eu-2"])
    stats.inc_value("webfarm/frontier/dequeued")
    caplog.clear()
    with caplog.at_level("INFO", logger="webfarm.scheduler"):
        for now in range(1000, 1100, 5):
            notice.idle_with_work(stats, "acme", ready_in=None, now=float(now))
    assert caplog.records[0].getMessage().endswith(
        "`scrapy dlq acme`. No proxy is healthy: eu-1, eu-2 retired (WEBFARM_PROXIES); fix "
        "or replace them, then delete their webfarm:proxies:<id> keys")


def rate_limiter(window: float):
    """A handler: a page request within ``window`` seconds of the host's last page answer
    gets a bare 429 (no Retry-After), as many sites' limiters send; counts them."""
    state = {"last": 0.0, "refused": 0}
    lock = threading.Lock()

    def handler(info):
        if info.path == "/robots.txt":
            return None
        with lock:
            now = time.monotonic()
            if now - state["last"] < window:
                state["refused"] += 1
                return type(info.catalogue())(429, {"Content-Type": "text/plain"},
                                              b"too many requests\n")
            state["last"] = now
        return None

    return handler, state


def test_a_bare_429_slows_the_host_for_the_fleet(web, stores):
    """A limiter that answers 429 without Retry-After: the host delay stayed at 0.1 s, so
    most requests were refused and retried, and pages ran out of attempts."""
    base = web.base_urls[0]
    urls = mini_site(web, base, pages=10, private=0)
    handler, state = rate_limiter(window=0.4)
    web.route("/page/", handler, host=base)  # newer: ahead of the pages, falls through
    result = run(crawl_args(urls[:1], "WEBFARM_RETRY_TIMES=3"),
                 env(stores, WEBFARM_HOST_DELAY="0.1"), timeout=120)
    assert stored_urls(stores) == set(urls)
    assert frontier_of(stores["REDIS_URL"]).counts()["dead"] == 0
    # 0.5 s after the first 429 (twice the default, at least 0.5 s), then coming down: a
    # few more 429s as it does, not one a page.
    assert 1 <= state["refused"] <= 6, state
    assert stat(result.output, "webfarm/rate_limit/refused") == state["refused"]
    assert "answered 429" in result.output
