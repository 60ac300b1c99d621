"""A worker's per-host state stays within WEBFARM_HOST_MEMORY hosts on a broad crawl, and
politeness holds for the hosts it forgot."""

from __future__ import annotations

import re

import pymongo
import pytest
import redis
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from tests import runner
from tests.testweb import Response, TestWeb
from webfarm import signals as wf_signals
from webfarm.hostmemory import RecentHosts
from webfarm.throttle import HostThrottle

HOSTS = [f"127.0.40.{i}" for i in range(1, 13)]  # twelve sites, each a host of its own


def test_host_memory_forgets_the_host_set_least_recently():
    memory: RecentHosts[int] = RecentHosts(2)
    memory["a"], memory["b"] = 1, 2
    assert memory.get("a") == 1  # a read is not a use
    memory["c"] = 3
    assert list(memory) == ["b", "c"] and memory.forgotten == 1
    memory["b"] = 4  # set again: the most recent
    memory["d"] = 5
    assert list(memory) == ["b", "d"] and memory.forgotten == 2
    unbounded: RecentHosts[int] = RecentHosts(0)
    for i in range(100):
        unbounded[str(i)] = i
    assert len(unbounded) == 100 and not unbounded.forgotten


def _respond(throttle: HostThrottle, host: str, latency: float) -> None:
    request = Request(f"http://{host}/", meta={"download_latency": latency})
    throttle.response_received(HtmlResponse(request.url, request=request, body=b""), request,
                               None)


def test_the_latency_rule_keeps_the_hosts_that_answered_last():
    crawler = get_crawler(settings_dict={"WEBFARM_HOST_MEMORY": 20, "WEBFARM_HOST_DELAY": 0.1})
    crawler.stats = MemoryStatsCollector(crawler)
    sent: list[tuple[str, float, str]] = []

    def host_delay(host: str, delay: float, source: str, **kw: object) -> None:
        sent.append((host, delay, source))

    crawler.signals.connect(host_delay, signal=wf_signals.host_delay, weak=False)
    throttle = HostThrottle.from_crawler(crawler)
    _respond(throttle, "slow.test", 4.0)
    for i in range(50):
        _respond(throttle, f"h{i}.test", 0.3)
    assert len(throttle.delays) == 20 and "slow.test" not in throttle.delays
    # The high-water mark survives the host it came from.
    assert crawler.stats.get_value("webfarm/throttle/max_delay") == 4.0
    # Met again, a forgotten host is learned again and its delay sent, as a new host's.
    sent.clear()
    _respond(throttle, "slow.test", 4.0)
    assert sent == [("slow.test", 4.0, wf_signals.LEARNED)]
    throttle.spider_closed(None)
    assert crawler.stats.get_value("webfarm/throttle/hosts_forgotten") == 52 - 20


@pytest.fixture(scope="module")
def sites():
    with TestWeb(hosts=HOSTS) as web:
        yield web


def _mini_site(web: TestWeb, base: str) -> list[str]:
    paths = [f"/page/{i}" for i in range(4)]
    links = "".join(f'<p><a href="{p}">{p}</a></p>' for p in paths)
    web.route("/", Response.html(f"<html><body><h1>{base}</h1>{links}</body></html>"),
              host=base, prefix=False)
    web.route("/page/", lambda info: Response.html(
        f"<html><body><h1>{info.host}{info.path}</h1><p>A page.</p></body></html>"), host=base)
    return [f"{base}/"]


@pytest.mark.serial
def test_a_broad_crawl_forgets_hosts_and_keeps_their_crawl_delay(sites, stores):
    """Twelve hosts through a memory of three: the latency rule forgets hosts between two
    responses of the host whose robots.txt asks for Crawl-delay: 1, and that host's
    requests stay a second apart (its Crawl-delay is kept apart from what is forgotten)."""
    slow = sites.base_urls[0]
    sites.route("/robots.txt", Response.text("User-agent: *\nCrawl-delay: 1\n"), host=slow)
    starts = [url for base in sites.base_urls for url in _mini_site(sites, base)]
    env = runner.env_for(**stores, WEBFARM_RENDER="http")
    result = runner.scrapy(["crawl", "generic", "-a", "start=" + ",".join(starts),
                            "-s", "WEBFARM_HOST_MEMORY=3", "-s", "WEBFARM_HOST_DELAY=0.25"],
                           env, timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    forgotten = re.search(r"'webfarm/throttle/hosts_forgotten': (\d+)", result.output)
    assert forgotten and int(forgotten.group(1)) >= len(HOSTS) - 3, result.output[-3000:]
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    assert db.pages.count_documents({}) == 5 * len(HOSTS)
    times = sorted(h.monotonic for h in sites.hits_for(host=slow) if h.path != "/robots.txt")
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(times) == 5 and min(gaps) >= 0.85, gaps
    # Hosts answered between two of its pages: its latency was forgotten meanwhile.
    slow_netloc = slow.split("//", 1)[1]
    others = [h.monotonic for h in sites.hits if h.netloc != slow_netloc]
    assert any(times[0] < t < times[1] for t in others)
    delays = redis.Redis.from_url(stores["REDIS_URL"]).hgetall("webfarm:{generic}:delay")
    assert float(delays[slow_netloc.encode()]) >= 1.0


def test_a_proxy_pool_keeps_the_hosts_used_last_and_still_knows_the_rest_from_redis(
        redis_url):
    """Stickiness and recent successes of hosts past the memory are read back from Redis,
    which every worker shares."""
    import asyncio

    from webfarm.proxies import ProxyPool
    from webfarm.proxyconfig import parse_proxies

    pool = ProxyPool(parse_proxies("127.0.0.1:1,127.0.0.1:2"), redis.Redis.from_url(redis_url),
                     refresh=0.0, sticky=True, host_memory=5)

    async def crawl() -> tuple[list[str], bool]:
        first = [(await pool.pick(f"h{i}.test")).id for i in range(30)]
        for i in range(30):
            await pool.record_success(first[i], f"h{i}.test", 0.0)
        again = [(await pool.pick(f"h{i}.test")).id for i in range(30)]
        assert again == first  # sticky, the forgotten hosts through Redis
        other = "127.0.0.1:2" if first[0] == "127.0.0.1:1" else "127.0.0.1:1"
        return again, await pool.host_ok_elsewhere("h0.test", other)

    chosen, ok_elsewhere = asyncio.run(crawl())
    assert ok_elsewhere  # h0's success, forgotten here, read back from Redis
    assert len(pool._sticky) <= 5 and len(pool._host_ok) <= 5
    assert len(pool._host_ok_written) <= 5
    # In Redis, a key per host that expires unused (one hash of every host never did).
    client = redis.Redis.from_url(redis_url)
    assert client.get("webfarm:proxies:sticky:h0.test").decode() == chosen[0]
    assert 0 < client.ttl("webfarm:proxies:sticky:h29.test") <= 86400
    assert not client.exists("webfarm:proxies:sticky")


def test_download_slots_look_up_a_host_once_among_the_hosts_met_last():
    from scrapy.settings import Settings

    from webfarm.queue import SlotDelays

    slots = SlotDelays(Settings({"DOWNLOAD_SLOTS": {"slow.test": {"delay": 2.0}},
                                 "WEBFARM_HOST_MEMORY": 3}))
    assert slots.first_seen("slow.test:8080") == 2.0  # a slot is named by the bare host
    assert slots.first_seen("slow.test:8080") is None  # said once
    assert [slots.first_seen(f"h{i}.test") for i in range(5)] == [None] * 5
    assert len(slots._seen) == 3
    # Forgotten, then met again: its floor is given again (the scheduler holds it already).
    assert slots.first_seen("slow.test:8080") == 2.0


def test_a_worker_sends_the_largest_delay_of_a_host_and_only_changes_the_frontier_sees():
    from scrapy.settings import Settings

    from webfarm.hostdelays import HostDelays

    delays = HostDelays(Settings({"WEBFARM_HOST_MEMORY": 2}))
    assert delays.update("a.test", 2.0, "robots.txt") == 2.0  # first: always sent
    assert delays.update("a.test", 0.5, wf_signals.LEARNED) is None  # robots.txt's is larger
    assert delays.update("a.test", 3.0, wf_signals.LEARNED) == 3.0
    assert delays.update("a.test", 3.0004, wf_signals.LEARNED) is None  # same millisecond
    assert delays.update("a.test", 3.05, wf_signals.LEARNED) is None  # within 5%
    assert delays.update("a.test", 1.0, wf_signals.LEARNED) == 2.0  # back to robots.txt's
    for host in ("b.test", "c.test"):  # the latency rule's delays: the last two hosts kept
        delays.update(host, 0.2, wf_signals.LEARNED)
    # After Redis lost writes, every delay remembered is sent again; a.test keeps its
    # robots.txt delay though its learned one was forgotten.
    assert delays.known() == {"a.test": 2.0, "b.test": 0.2, "c.test": 0.2}
    delays.update("d.test", 0.2, wf_signals.LEARNED)
    assert delays.known() == {"a.test": 2.0, "c.test": 0.2, "d.test": 0.2}
