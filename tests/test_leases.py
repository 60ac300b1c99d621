"""Leases under real crawls: a live worker keeps the pages it works on, however slow, and
a page that kills every worker that takes it ends in the dead-letter queue."""

from __future__ import annotations

import os
import signal
import threading
import time

import pymongo
import pytest

from tests import crawlcheck, runner, servers
from tests.testweb import Response, TestWeb
from webfarm.urls import host_of

SLOW = "/product/WF01-0002"


@pytest.fixture(scope="module")
def web():
    """A shop of its own (14 pages) on 127.0.0.27."""
    with TestWeb(hosts=("127.0.0.27",), categories=1, products_per_category=5) as web:
        yield web


@pytest.fixture()
def shop(web):
    web.clear_hits()
    web.clear_routes()
    return web


def hits(web, base: str, path: str) -> int:
    """Requests for ``path``, with any query (the shop's links carry tracking parameters)."""
    return len(web.hits_for(host=base, path=path))


def test_a_page_slower_than_the_lease_is_fetched_once(shop, stores, tmp_path):
    """A probe: a 25 s page under a 20 s lease was fetched again every 20 s, for ever, by
    two live workers, each time logged as leases of a killed worker, and the crawl never
    ended. A live worker now renews the leases of the pages it still works on."""
    base = shop.base_urls[0]

    def slow(info):
        time.sleep(5.0)  # two and a half leases
        return None  # then the catalogue answers

    shop.route(SLOW, slow)
    env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0", WEBFARM_LEASE_SECONDS="2",
                         WEBFARM_IDLE_TIMEOUT="3")
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    a = runner.popen(["crawl", "generic", "-a", f"start={base}/"], env, logs[0])
    b = runner.popen(["crawl", "generic", "-a", f"domains={host_of(base)}"], env, logs[1])
    assert a.wait(120) == 0 and b.wait(120) == 0
    assert hits(shop, base, SLOW) == 1
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    pages = {doc["url"]: doc["fetch_count"] for doc in db.pages.find()}
    assert set(pages) == shop.expected_pages(base) and set(pages.values()) == {1}
    text = [log.read_text() for log in logs]
    assert not any("leases expired" in t for t in text), text
    # renewed by the worker that fetched it: 5 s held, renewed every half second or so
    assert sum(crawlcheck.stat(t, "webfarm/frontier/renewed") for t in text) >= 4


def test_a_page_that_kills_its_worker_is_dead_lettered(shop, stores, tmp_path):
    """A page that kills the worker fetching it (an OOM on a pathological page) went back
    to the frontier each time its lease expired, and took the next worker down with it,
    for ever. Each expiry now spends an attempt; the worker that pops it with none left
    dead-letters it unfetched."""
    base = shop.base_urls[0]
    worker: dict[str, object] = {}

    def kills(info):
        os.kill(worker["proc"].pid, signal.SIGKILL)  # the worker we started: it asked
        return Response(200, {"Content-Type": "text/html"}, b"<html>too late</html>")

    shop.route(SLOW, kills)
    env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0", WEBFARM_LEASE_SECONDS="1",
                         WEBFARM_RETRY_TIMES="2", WEBFARM_IDLE_TIMEOUT="2")
    args = [["crawl", "generic", "-a", f"start={base}{SLOW}"]] + 2 * [
        ["crawl", "generic", "-a", f"domains={host_of(base)}"]]
    codes = []
    for n, arg in enumerate(args):
        worker["proc"] = runner.popen(arg, env, tmp_path / f"{n}.log")
        codes.append(worker["proc"].wait(90))
    assert codes == [-signal.SIGKILL, -signal.SIGKILL, 0]
    assert hits(shop, base, SLOW) == 2
    letter = crawlcheck.dead_letters(stores["REDIS_URL"])[f"{base}{SLOW}"]
    assert letter["attempts"] == 2 and "the last ended by its lease expiring" in letter["reason"]
    last = (tmp_path / "2.log").read_text()
    assert f"Dead-lettered <GET {base}{SLOW}>: gave up after 2 attempts" in last, last[-3000:]
    assert crawlcheck.stat(last, "webfarm/frontier/dead_unfetched") == 1
    servers.wait_for(lambda: crawlcheck.frontier(stores["REDIS_URL"]).counts()["leased"] == 0,
                     5, "no lease left")


def test_a_worker_stalled_past_its_lease_does_not_write_its_older_fetch_over_the_newer(
        shop, stores, tmp_path):
    """A probe: worker A stopped (SIGSTOP) with a page in flight, B took the lease over
    and stored the page, and A, resumed, stored its older copy over B's: the page's
    fetched_at was the time A's callback ran, after the stall. It is now when the request
    left, and A's write is superseded."""
    base = shop.base_urls[0]
    versions = []

    def versioned(info):
        versions.append(time.time())
        n = len(versions)
        time.sleep(3.0)
        return Response(200, {"Content-Type": "text/html"},
                        f"<html><body><h1>version {n}</h1></body></html>".encode())

    shop.route(SLOW, versioned)
    env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0", WEBFARM_LEASE_SECONDS="2",
                         WEBFARM_IDLE_TIMEOUT="2")
    a = runner.popen(["crawl", "generic", "-a", f"start={base}{SLOW}"], env, tmp_path / "a.log")
    servers.wait_for(lambda: versions, 60, "worker a asking for the page")
    a.send_signal(signal.SIGSTOP)  # stalled with its request in flight
    try:
        b = runner.scrapy(["crawl", "generic", "-a", f"domains={host_of(base)}"], env, 90)
        assert b.returncode == 0 and len(versions) == 2, b.output[-3000:]
    finally:
        a.send_signal(signal.SIGCONT)
    assert a.wait(60) == 0
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    [page] = list(db.pages.find({"url": f"{base}{SLOW}"}))
    # B's fetch stands: stored once, never changed back to A's older version 1
    assert (page["fetch_count"], page["change_count"]) == (1, 0), page
    assert abs(page["fetched_at"].timestamp() - versions[1]) < 1.0
    assert crawlcheck.stat((tmp_path / "a.log").read_text(), "webfarm/index/superseded") == 1



def test_a_worker_stopped_while_it_fetches_robots_txt_hands_the_fetch_over(
        shop, stores, tmp_path):
    """A worker stopped mid robots.txt fetch kept the shared lock for (MAX_REDIRECTS+1) ×
    DOWNLOAD_TIMEOUT + 10 s, 190 s by default: every other worker gave the host's requests
    back until it lapsed. The lock is now short and renewed only by a live fetch."""
    base = shop.base_urls[0]
    asked: list[float] = []
    release = threading.Event()

    def robots(info):
        asked.append(time.monotonic())
        if len(asked) == 1:
            release.wait(60)  # worker a's fetch: a stalls while it is out
        return Response.text("User-agent: *\nDisallow: /private/\n")

    shop.route("/robots.txt", robots)
    env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0", WEBFARM_LEASE_SECONDS="3",
                         WEBFARM_ROBOTS_LOCK_SECONDS="1", WEBFARM_IDLE_TIMEOUT="3")
    a = runner.popen(["crawl", "generic", "-a", f"start={base}/"], env, tmp_path / "a.log")
    try:
        servers.wait_for(lambda: asked, 60, "worker a fetching robots.txt")
        a.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        b = runner.scrapy(["crawl", "generic", "-a", f"domains={host_of(base)}"], env, 90)
        assert b.returncode == 0, b.output[-3000:]
    finally:
        release.set()
        a.send_signal(signal.SIGCONT)
    assert a.wait(60) == 0
    # b took the fetch over within its start, a lease and a lock, not after 190 s
    assert len(asked) == 2 and asked[1] - started < 20, asked
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    pages = {doc["url"]: doc["fetch_count"] for doc in db.pages.find()}
    assert set(pages) == shop.expected_pages(base) and set(pages.values()) == {1}
    assert "Traceback" not in (tmp_path / "a.log").read_text()
