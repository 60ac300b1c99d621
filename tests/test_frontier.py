"""The Redis frontier against a real Valkey: order, politeness, leases, retries, DLQ, counts."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import time

import pytest
import redis
import redis.asyncio

from tests.relay import Relay
from tests.servers import free_port
from webfarm.frontier import MAX_PUSH, AsyncFrontier, Entry, Frontier, backoff
from webfarm.frontier.core import MAX_ALSO
from webfarm.frontier.reading import MAX_READ
from webfarm.frontierlink import FrontierLink


def fp(text: str) -> bytes:
    return hashlib.sha1(text.encode()).digest()


def entry(host: str, name: str, priority: int = 0, dont_filter: bool = False) -> Entry:
    return Entry(
        host, priority, fp(host + name), json.dumps({"url": f"http://{host}/{name}"}), dont_filter
    )


def url(popped) -> str:
    return json.loads(popped.payload)["url"]


@pytest.fixture()
def client(redis_url: str):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture()
def frontier(client: redis.Redis) -> Frontier:
    return Frontier(client, "spider", default_delay=0)


def drain(f: Frontier, worker: str = "w") -> list[str]:
    out = []
    while (p := f.pop(worker)) is not None:
        out.append(url(p))
    return out


def test_hosts_without_delay_take_turns_within_one_batch_of_pops(frontier):
    """With no delay a popped host's turn came back at once, and at equal turns Redis
    orders by name: after a batch's first round the first host took every pop (a probe's
    crawl: 9,918 fetches on one host, about 1,100 on each of three others)."""
    hosts = ["a.test", "b.test", "c.test", "d.test"]
    frontier.push([entry(h, f"p{i}") for i in range(20) for h in hosts])
    for _ in range(3):  # batches of 16, as a scheduler pops
        popped = frontier.exchange("w", pop=16).popped
        assert len(popped) == 16
        assert {h: sum(p.host == h for p in popped) for h in hosts} == dict.fromkeys(hosts, 4)


def wait_until(check, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError("condition not met in time")


def test_priority_then_fifo(frontier: Frontier) -> None:
    names = [("a", 0), ("b", 5), ("c", 0), ("d", 5), ("e", -3), ("f", 1), ("g", 0)]
    assert frontier.push([entry("h.test", n, p) for n, p in names]) == [True] * len(names)
    assert drain(frontier) == [f"http://h.test/{n}" for n in "bdfacge"]


def test_a_throttled_host_does_not_block_others(client: redis.Redis) -> None:
    f = Frontier(client, "spider", default_delay=0.4)
    f.push([entry("slow.test", "1"), entry("slow.test", "2"), entry("fast.test", "1")])
    f.set_delay("fast.test", 0)
    started = time.monotonic()
    hosts = {f.pop("w").host, f.pop("w").host}
    assert hosts == {"slow.test", "fast.test"}
    assert f.pop("w") is None  # slow.test must wait its delay
    assert f.last_ready_in is not None and 0.2 < f.last_ready_in <= 0.4
    third = wait_until(lambda: f.pop("w"))
    assert third.host == "slow.test" and time.monotonic() - started >= 0.3


def test_delay_is_shared_by_workers_and_survives_an_empty_queue(redis_url: str) -> None:
    one = Frontier(redis.Redis.from_url(redis_url), "spider", default_delay=0)
    two = Frontier(redis.Redis.from_url(redis_url), "spider", default_delay=0)
    one.set_delay("h.test", 0.5)
    assert two.get_delay("h.test") == 0.5 and two.get_delay("other.test") == 0
    one.push([entry("h.test", "1")])
    assert one.pop("w1") is not None
    # The queue is empty now; a new link still waits for the delay, for every worker.
    two.push([entry("h.test", "2")])
    t0 = time.monotonic()
    assert two.pop("w2") is None and one.pop("w1") is None
    assert two.host_stats()[0]["next_allowed_in"] > 0.3
    assert wait_until(lambda: two.pop("w2")) is not None
    assert time.monotonic() - t0 > 0.35


def test_a_worker_with_a_shorter_default_delay_does_not_speed_up_the_fleet(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A worker that joined with WEBFARM_HOST_DELAY=0.2 spaced every host by 0.2 s, for
    every worker (2 s gaps became 0.2 s ones): each pop used the popping worker's own
    default. The frontier now keeps the longest default of the workers running."""
    from webfarm import advice

    slow = Frontier(redis.Redis.from_url(redis_url), "spider", default_delay=1.0)
    fast = Frontier(redis.Redis.from_url(redis_url), "spider", default_delay=0.1)
    slow.push([entry("h.test", str(i)) for i in range(3)])
    assert slow.pop("slow") is not None
    assert wait_until(lambda: fast.pop("fast"), timeout=3) is not None
    assert fast.pop("fast") is None
    assert fast.last_ready_in is not None and fast.last_ready_in > 0.8  # not 0.1
    assert fast.fleet_delays() == {"slow": 1.0, "fast": 0.1}
    assert fast.effective_default_delay() == 1.0  # what `scrapy frontier` shows
    slow.release_worker("slow")  # closed: its default no longer counts (it did 2 minutes)
    assert fast.fleet_delays() == {"fast": 0.1}
    with caplog.at_level("WARNING", logger="webfarm.advice"):
        advice.shorter_default_delay(0.1, {"slow": 1.0, "fast": 0.1}, fast.prefix)
    assert ("default host delay (WEBFARM_HOST_DELAY, or a longer DOWNLOAD_DELAY) is 0.1s, "
            "but worker slow of webfarm:{spider}: runs with 1s: the frontier spaces every "
            "host by the longest") in caplog.text


def test_a_worker_hears_when_one_with_a_longer_default_delay_joins(
        redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The scrapyd re-probe: a job started later with WEBFARM_HOST_DELAY=1.0 slowed the
    running 0.5 s crawl to 1 s gaps, and that crawl's log said nothing (only workers that
    started after the slow one were told, at their start)."""
    from webfarm.frontierlink import FrontierLink

    fast = Frontier(redis.Redis.from_url(redis_url), "spider", default_delay=0.1)
    slow = Frontier(redis.Redis.from_url(redis_url), "spider", default_delay=1.0)
    link = FrontierLink(fast, "fast")
    caplog.set_level("WARNING", logger="webfarm.advice")
    assert link.exchange(pop=0).fleet_default_ms == 100
    assert "runs with" not in caplog.text
    slow.exchange("slow", pop=0)  # it joins
    assert (link.exchange(pop=0).fleet_default_ms, link.exchange(pop=0).fleet_default_of) == (
        1000, "slow")
    assert caplog.text.count("but worker slow of webfarm:{spider}: runs with 1s") == 1
    slow.release_worker("slow")  # it leaves, and comes back: said again
    link.exchange(pop=0)
    slow.exchange("slow", pop=0)
    link.exchange(pop=0)
    assert caplog.text.count("runs with 1s") == 2


def test_a_host_s_own_shorter_delay_does_not_undercut_the_fleet_default(
        redis_url: str) -> None:
    """The shorter worker's latency rule set each host it fetched to about its own 0.1 s
    default, and a host's own delay replaced the fleet's: those hosts went ten times
    faster, for every worker. A host's own delay now only raises the default."""
    slow = Frontier(redis.Redis.from_url(redis_url), "spider", default_delay=1.0)
    fast = Frontier(redis.Redis.from_url(redis_url), "spider", default_delay=0.1)
    slow.push([entry("h.test", str(i)) for i in range(3)])
    assert slow.pop("slow") is not None
    fast.set_delay("h.test", 0.15)  # what its latency rule sends after a quick answer
    assert wait_until(lambda: fast.pop("fast"), timeout=3) is not None
    t0 = time.monotonic()  # the next turn is a delay from this hand-out
    assert wait_until(lambda: fast.pop("fast"), timeout=3) is not None
    assert time.monotonic() - t0 > 0.8
    assert fast.get_delay("h.test") == 1.0  # as `scrapy frontier` shows it
    fast.set_delay("h.test", 1.5)  # a longer one still counts
    assert fast.get_delay("h.test") == 1.5


def test_a_429_doubles_a_host_s_delay_for_every_worker_and_it_comes_down_by_itself(
        redis_url: str) -> None:
    """Each worker kept the delay its own 429s asked for, and the last to write won: a
    worker that had seen none (or had forgotten them) set the host back to its default,
    and the fleet's gaps swung between 0.2 s and 18 s."""
    one = Frontier(redis.Redis.from_url(redis_url), "spider", default_delay=0.05)
    two = Frontier(redis.Redis.from_url(redis_url), "spider", default_delay=0.05)
    one.push([entry("h.test", str(i)) for i in range(3)])
    assert one.pop("w1") is not None
    assert one.limit_host("h.test", floor=0.2, maximum=1.0) == 0.2
    two.set_delay("h.test", 0.05)  # the other worker's latency rule, after a quick answer
    assert two.get_delay("h.test") == pytest.approx(0.2, abs=0.005)  # not undone
    # A 429 to a request that left before that doubling: the same burst, not doubled again.
    assert two.limit_host("h.test", 0.2, 1.0) == pytest.approx(0.2, abs=0.005)
    time.sleep(0.15)
    assert two.limit_host("h.test", 0.2, 1.0) == pytest.approx(0.38, abs=0.02)  # shared
    assert wait_until(lambda: two.pop("w2"), timeout=3) is not None
    t0 = time.monotonic()
    assert wait_until(lambda: one.pop("w1"), timeout=3) is not None
    assert time.monotonic() - t0 > 0.3  # both workers' pops are spaced by it
    rows = {h["host"]: h for h in one.host_stats()}
    assert 0.25 < rows["h.test"]["delay"] < 0.39  # `scrapy frontier`; coming down already
    assert two.limit_host("h.test", 0.2, 0.5) == 0.5  # AUTOTHROTTLE_MAX_DELAY's cap
    # It comes down by itself, 0.05 s a second, and reading it changes nothing: `scrapy
    # frontier` with its own (longer) default deleted a backoff still in force.
    quick = Frontier(redis.Redis.from_url(redis_url), "other", default_delay=0.03)
    assert quick.pop("wq") is None  # a worker of that spider, running with 0.03 s
    assert quick.limit_host("q.test", floor=0.1, maximum=1.0) == 0.1
    time.sleep(0.9)
    reader = Frontier(redis.Redis.from_url(redis_url), "other", default_delay=5.0)
    for _ in range(3):  # the workers' default counts, not the reader's own
        assert reader.get_delay("q.test") == pytest.approx(0.055, abs=0.015)
    time.sleep(1.2)
    assert quick.get_delay("q.test") == 0.03


def test_longer_delay_pushes_back_the_pending_slot(frontier: Frontier) -> None:
    frontier.set_delay("h.test", 0.1)
    frontier.push([entry("h.test", "1"), entry("h.test", "2")])
    t0 = time.monotonic()
    assert frontier.pop("w") is not None
    frontier.set_delay("h.test", 0.6)  # e.g. robots.txt Crawl-delay learned after a fetch
    time.sleep(0.2)
    assert frontier.pop("w") is None
    wait_until(lambda: frontier.pop("w"))
    assert time.monotonic() - t0 >= 0.5


def test_defer_host_only_moves_later(frontier: Frontier) -> None:
    frontier.push([entry("a.test", "1"), entry("b.test", "1")])
    frontier.defer_host("a.test", 0.4)
    frontier.defer_host("a.test", 0.05)  # max(current, now + x): not earlier
    t0 = time.monotonic()
    assert frontier.pop("w").host == "b.test"
    assert frontier.pop("w") is None
    assert 0.25 < frontier.next_ready_in() <= 0.4
    assert wait_until(lambda: frontier.pop("w")).host == "a.test"
    assert time.monotonic() - t0 >= 0.35
    frontier.defer_host("c.test", 0.3)  # before its first link arrives
    frontier.push([entry("c.test", "1")])
    assert frontier.pop("w") is None


def test_a_render_goes_a_delay_after_the_last_request_to_reach_its_host(redis_url: str
                                                                        ) -> None:
    """A render reaches its host a page-open (or a browser start) after its hand-out, so
    hand-outs spaced by the delay could arrive bunched: as it leaves, a render takes the
    host's turn, a delay after the last request known to reach it (not its own hand-out),
    and the host's next hand-out waits a delay after it."""
    f = Frontier(redis.Redis.from_url(redis_url), "spider", default_delay=0.3)
    f.push([entry("h.test", str(i)) for i in range(4)])

    async def arrive(lease_id: str) -> float:
        aio = AsyncFrontier(f, redis.asyncio.Redis.from_url(redis_url))
        try:
            return await aio.arrive("h.test", lease_id)
        finally:
            await aio.aclose()

    assert asyncio.run(arrive(f.pop("w1").lease_id)) == 0  # the host's first: at once
    slow = wait_until(lambda: f.pop("w1"))  # its page takes long to open ...
    fast = wait_until(lambda: f.pop("w2"))  # ... another's, handed out a delay later, not
    assert asyncio.run(arrive(fast.lease_id)) == 0
    assert 0.25 < asyncio.run(arrive(slow.lease_id)) <= 0.3  # a delay after the other
    assert f.pop("w2") is None
    assert 0.5 < f.next_ready_in() <= 0.6  # a delay after the slow one's arrival


def test_a_worker_kept_to_its_hosts_takes_another_crawl_s_only_when_none_took_them(
        client: redis.Redis) -> None:
    """Two ``scrapy crawl generic`` runs with other hosts share the spider's frontier: each
    took the other's due hosts, gave them back (offsite), and some became dead letters."""
    theirs = ["b.test:8080", "xa.test", "[::2]:81"]  # xa.test is no subdomain of a.test
    ours = ["a.test:8080", "www.a.test", "[::ffff:7f00:3]:8080", "xn--bcher-kva.de"]
    mine = Frontier(client, "spider", default_delay=0)
    # as a spider's allowed_domains may spell them; the host keys are host_of()'s
    mine.keep_to(["A.test", "::FFFF:127.0.0.3", "bücher.de", "bad name"], wait=0.6)
    mine.push([entry(h, "1") for h in theirs])
    time.sleep(0.1)  # their hosts have been due longer than ours
    mine.push([entry(h, "1") for h in ours])
    assert sorted(mine.pop("w1").host for _ in ours) == sorted(ours)
    assert mine.pop("w1") is None
    assert 0.3 < mine.last_ready_in <= 0.5  # when theirs have waited 0.6 s
    # Their own worker takes one in time; the others are this worker's after the wait.
    other = Frontier(client, "spider", default_delay=0)
    other.keep_to(["b.test"], wait=0.6)
    assert other.pop("w2").host == "b.test:8080" and other.pop("w2") is None
    t0 = time.monotonic()
    late = sorted(wait_until(lambda: mine.pop("w1")).host for _ in range(2))
    assert late == ["[::2]:81", "xa.test"] and time.monotonic() - t0 > 0.3
    # A worker with no hosts of its own (no allowed_domains) takes every host as it is due.
    anyone = Frontier(client, "spider", default_delay=0)
    anyone.keep_to([], wait=0.6)
    anyone.push([entry("c.test", "1")])
    assert anyone.pop("w3").host == "c.test"


def test_a_scope_with_ports_takes_those_ports_only(client: redis.Redis) -> None:
    """Two crawls of one host on two ports took each other's pages as their own: a scope
    named hosts without their ports. A ``host:port`` is that port only (a bare name: any
    port; no port in the host: 80 or 443)."""
    mine = Frontier(client, "spider", default_delay=0)
    mine.keep_to(["a.test:8161", "[::1]:8080", "b.test:443", "c.test"], wait=60)
    assert mine.scope == ["[::1]:8080", "a.test:8161", "b.test:443", "c.test"]
    ours = ["a.test:8161", "www.a.test:8161", "[::1]:8080", "b.test", "c.test:9000"]
    theirs = ["a.test:8162", "a.test", "[::1]:9090", "b.test:8443"]
    mine.push([entry(h, "1") for h in theirs + ours])
    assert sorted(mine.pop("w1").host for _ in ours) == sorted(ours)
    assert mine.pop("w1") is None and not mine.is_idle()  # ours leased, theirs waiting


def test_a_worker_kept_to_its_hosts_is_idle_when_they_are_done(
        client: redis.Redis, redis_url: str) -> None:
    """It waited for every crawl sharing the frontier to end, and took their hosts."""
    mine = Frontier(client, "spider", default_delay=0)
    mine.keep_to(["a.test"], wait=60)
    everything = Frontier(client, "spider", default_delay=0)
    mine.push([entry("b.test", "1"), entry("a.test", "1")])
    assert not mine.is_idle()
    lease = mine.pop("w1")
    assert lease.host == "a.test" and not mine.is_idle()  # leased: links may follow
    assert mine.retry(lease.lease_id, 30, "http 503") and not mine.is_idle()  # delayed
    mine.release_worker("w1")
    mine.reset()
    mine.push([entry("b.test", "1")])
    assert mine.is_idle() and not everything.is_idle()
    assert asyncio.run(_idle_async(mine, redis_url)) is True
    mine.also_keep("B.test")  # e.g. its start URL, which Scrapy's offsite filter lets by
    taken = mine.pop("w1")
    assert not mine.is_idle() and taken.host == "b.test"  # and without the wait
    assert mine.ack([taken.lease_id]) == 1 and mine.is_idle()
    # Past MAX_ALSO such hosts it takes every host, and waits for the whole frontier: a
    # request it queued to the next one was left behind when its own hosts were done.
    for i in range(MAX_ALSO - 1):
        mine.also_keep(f"h{i}.test")
    assert mine.scope[-1] == f"h{MAX_ALSO - 2}.test"
    mine.push([entry("many.test", "1")])
    assert mine.is_idle()  # many.test is not its own yet
    mine.also_keep("many.test")
    assert mine.scope == [] and not mine.is_idle() and mine.pop("w1").host == "many.test"


async def _idle_async(f: Frontier, redis_url: str) -> bool:
    aio = AsyncFrontier(f, redis.asyncio.Redis.from_url(redis_url))
    try:
        return await aio.is_idle()
    finally:
        await aio.aclose()


def test_lease_expiry_gives_the_entry_back(client: redis.Redis) -> None:
    f = Frontier(client, "spider", default_delay=0, lease_seconds=0.2)
    f.push([entry("h.test", "1")])
    first = f.pop("dead-worker")
    assert f.counts()["leased"] == 1 and f.pop("w2") is None
    again = wait_until(lambda: f.pop("w2"))
    assert again.payload == first.payload and again.lease_id != first.lease_id
    # An expiry spends an attempt: a page that kills its worker is not handed out for ever
    # (the worker that pops it with none left dead-letters it, LeaseEnds.used_up).
    assert again.attempts == 1
    assert f.ack([first.lease_id]) == 0  # the stale lease is gone
    assert f.ack([again.lease_id]) == 1
    c = f.counts()
    assert (c["queued"], c["leased"], c["expired"]) == (0, 0, 1)


def test_a_renewed_lease_outlives_its_first_deadline(client: redis.Redis) -> None:
    """A live worker's slow page (longer than the lease) was taken back and fetched again
    by another worker, every lease period, for ever."""
    f = Frontier(client, "spider", default_delay=0, lease_seconds=0.4)
    f.push([entry("h.test", "slow"), entry("h.test", "fast")])
    slow, fast = f.pop("w1"), f.pop("w1")
    assert f.ack([fast.lease_id]) == 1
    for _ in range(4):  # 1.2 s held, renewed every 0.3 s
        time.sleep(0.3)
        assert f.renew([slow.lease_id, fast.lease_id]) == 1  # the acked one stays gone
        assert f.pop("w2") is None  # nothing taken back
    assert f.counts()["expired"] == 0 and f.ack([slow.lease_id]) == 1
    # Once expired and handed out again, the old lease is not brought back by a renewal.
    f.push([entry("h.test", "late")])
    late = f.pop("w1")
    time.sleep(0.5)
    again = f.pop("w2")
    assert again is not None and url(again).endswith("late")
    assert f.renew([late.lease_id]) == 0 and f.ack([late.lease_id]) == 0
    assert f.ack([again.lease_id]) == 1


def test_a_lease_lost_in_a_stall_is_found_and_its_request_dropped(client, redis_url):
    """A probe: a worker stopped (SIGSTOP) past its lease, holding a request it had not
    sent, fetched it when resumed, though another worker had it by then (fetch_count 2).
    Asked before the request leaves, Redis says the lease is gone; the request is
    dropped. One whose lease is still held is renewed instead."""
    import scrapy
    from scrapy.exceptions import IgnoreRequest

    from middlewares.departure import _not_lost
    from webfarm.leaserenew import LeaseRenewal
    from webfarm.queue import HANDED_OUT, LEASE, LEASE_LOST

    f = Frontier(client, "spider", default_delay=0, lease_seconds=0.3)
    f.push([entry("h.test", "lost"), entry("k.test", "kept")])
    lost, kept = f.pop("stalled"), f.pop("stalled")
    stalled = time.monotonic() - 1.0  # handed out a second ago: past the 0.3 s lease
    requests = {p.lease_id: scrapy.Request(url(p), meta={LEASE: p.lease_id,
                                                         HANDED_OUT: stalled})
                for p in (lost, kept)}
    time.sleep(0.4)
    assert f.renew([kept.lease_id]) == 1  # expired by the clock, but nobody took it yet
    other = f.pop("other")  # takes the other one over
    assert other is not None and url(other) == url(lost)
    counted: dict[str, int] = {}

    async def departures() -> None:
        link = FrontierLink(f, "stalled", aio=AsyncFrontier(f, redis.asyncio.Redis.from_url(
            redis_url)))
        renewal = LeaseRenewal(0.3, requests, lambda k, n: counted.__setitem__(k, n))
        renewal.link, renewal.frontier = link, f
        try:
            for request in requests.values():
                await renewal.request_departure(request)
        finally:
            await link.aclose()

    asyncio.run(departures())
    gone, held = requests[lost.lease_id], requests[kept.lease_id]
    assert gone.meta.get(LEASE_LOST) and not held.meta.get(LEASE_LOST)
    assert counted == {"webfarm/frontier/leases_lost": 1}
    with pytest.raises(IgnoreRequest, match="another worker has it"):
        _not_lost(gone)
    _not_lost(held)
    assert f.ack([kept.lease_id]) == 1 and f.ack([other.lease_id]) == 1


def test_an_exchange_says_which_worker_s_leases_it_took_back(client: redis.Redis) -> None:
    """A worker killed with kill -9 said nothing, nor did the one that took its leases
    back: the exchange now says how many, and whose (the scheduler logs it)."""
    f = Frontier(client, "spider", default_delay=0, lease_seconds=0.2)
    f.push([entry("h.test", "1"), entry("h.test", "2")])
    assert len(f.exchange("dead-worker", pop=2).popped) == 2
    time.sleep(0.3)
    taken = f.exchange("w2", pop=2)
    assert (taken.expired, taken.expired_from, len(taken.popped)) == (2, ("dead-worker",), 2)
    assert f.exchange("w2", pop=1).expired == 0


def test_ack_forgets_for_good(client: redis.Redis) -> None:
    f = Frontier(client, "spider", default_delay=0, lease_seconds=0.1)
    f.push([entry("h.test", "1"), entry("h.test", "2")])
    leases = [f.pop("w").lease_id, f.pop("w").lease_id]
    assert f.ack(leases) == 2 and f.ack(leases) == 0
    time.sleep(0.15)
    assert f.pop("w") is None and f.is_idle()
    assert client.hlen(f.key("lease")) == 0


def test_release_and_release_worker_give_back_at_once(frontier: Frontier) -> None:
    frontier.push([entry("h.test", str(i), priority=i) for i in range(4)])
    mine = [frontier.pop("w1") for _ in range(3)]
    other = frontier.pop("w2")
    assert [url(p)[-1] for p in mine + [other]] == ["3", "2", "1", "0"]
    assert frontier.release([mine[0].lease_id]) == 1
    assert frontier.release([mine[0].lease_id]) == 0
    assert frontier.counts()["queued"] == 1
    assert frontier.release_worker("w1") == 2
    assert frontier.counts()["leased"] == 1  # w2 keeps its lease
    back = drain(frontier, "w3")
    assert [u[-1] for u in back] == ["3", "2", "1"]  # same priorities, same order


def test_retry_waits_then_returns_with_attempts(frontier: Frontier) -> None:
    frontier.push([entry("h.test", "1")])
    p = frontier.pop("w")
    assert frontier.retry(p.lease_id, 0.3, "http 503")
    assert not frontier.retry(p.lease_id, 0.3, "http 503")  # lease no longer held
    c = frontier.counts()
    assert (c["delayed"], c["leased"], c["queued"], c["retried"]) == (1, 0, 0, 1)
    assert not frontier.is_idle()
    t0 = time.monotonic()
    assert frontier.pop("w") is None and 0.1 < frontier.last_ready_in <= 0.3
    p2 = wait_until(lambda: frontier.pop("w"))
    assert time.monotonic() - t0 >= 0.2
    assert (p2.payload, p2.attempts) == (p.payload, 1)
    assert frontier.retry(p2.lease_id, 0, "timeout", payload='{"url": "x", "retry": 2}')
    p3 = frontier.pop("w")
    assert (p3.payload, p3.attempts) == ('{"url": "x", "retry": 2}', 2)
    reasons = frontier.server.hgetall(frontier.key("retries"))
    assert reasons == {b"http 503": b"1", b"timeout": b"1"}


def test_dead_letters_requeue_and_purge(frontier: Frontier) -> None:
    frontier.push([entry("h.test", "1", priority=7)])
    p = frontier.pop("w")
    frontier.retry(p.lease_id, 0, "http 503")
    p = frontier.pop("w")
    assert frontier.dead(p.lease_id, "http 503 after retries", status=503)
    assert not frontier.dead(p.lease_id, "again")
    assert frontier.dead(None, "undecodable", payload="{not json", error="JSONDecodeError")
    letters = frontier.dead_letters()
    assert len(letters) == 2 and frontier.counts()["dead"] == 2
    first = letters[0]
    assert (first["reason"], first["status"], first["attempts"]) == (
        "http 503 after retries",
        503,
        2,
    )
    assert (first["host"], first["priority"], first["worker"]) == ("h.test", 7, "w")
    assert first["payload"] == p.payload and first["first"] <= first["last"]
    assert letters[1]["error"] == "JSONDecodeError" and letters[1]["status"] is None
    assert frontier.is_idle()
    assert frontier.requeue_dead() == 1  # the never-leased payload has no host: stays
    assert frontier.counts()["dead"] == 1
    again = frontier.pop("w")
    assert (again.payload, again.attempts) == (p.payload, 0)
    assert frontier.purge_dead() == 1 and frontier.dead_letters() == []


def test_counts_are_exact_across_operations(client: redis.Redis) -> None:
    f = Frontier(client, "spider", default_delay=0, lease_seconds=0.2)
    f.push([entry(f"h{i % 7}.test", str(i), priority=i % 3) for i in range(60)])
    f.push([entry("h0.test", "0")])  # duplicate
    leases = [f.pop("w").lease_id for _ in range(20)]
    f.ack(leases[:5])
    f.release(leases[5:8])
    for lease in leases[8:12]:
        f.retry(lease, 10, "later")
    f.dead(leases[12], "gone")
    # leases[13:20] (7) are left to expire
    time.sleep(0.25)
    assert f.pop("w2") is not None  # requeues the 7 expired leases, then leases one

    def truth() -> dict:
        queued = sum(h["queued"] for h in f.host_stats())
        return {
            "queued": queued,
            "delayed": client.zcard(f.key("delayed")),
            "leased": client.zcard(f.key("leases")),
            "dead": client.llen(f.key("dead")),
        }

    c = f.counts()
    assert {k: c[k] for k in ("queued", "delayed", "leased", "dead")} == truth()
    assert (c["queued"], c["delayed"], c["leased"], c["dead"]) == (60 - 20 + 3 + 7 - 1, 4, 1, 1)
    assert (c["seen"], c["hosts"], c["expired"], c["retried"]) == (60, 7, 7, 4)
    assert c["ready_hosts"] == 7


def test_host_stats_walks_every_host_a_page_at_a_time(client: redis.Redis) -> None:
    """``scrapy frontier`` reads hosts in script calls of MAX_READ (it read them whole:
    200,000 hosts held Redis up for 100 ms); every host comes once, with its figures."""
    f = Frontier(client, "spider", default_delay=0.5)
    hosts = [f"h{i}.test" for i in range(2 * MAX_READ + 500)]
    f.push([entry(h, str(n)) for i, h in enumerate(hosts) for n in range(1 + i % 3)])
    f.set_delay("h7.test", 3)
    popped = {f.pop("w").host for _ in range(MAX_READ + 10)}  # their hosts wait their delay
    client.delete(f.key("q:h5.test"))
    client.set(f.key("q:h5.test"), "not a queue")  # a key written by hand: no error
    rows = f.host_stats()
    assert sorted(r["host"] for r in rows) == sorted(hosts)
    by_host = {r["host"]: r for r in rows}
    for i, host in enumerate(hosts):
        want = 1 + i % 3 - (host in popped)
        assert by_host[host]["queued"] == (0 if host == "h5.test" else want), host
        assert by_host[host]["urls"] == 1 + i % 3
        assert (by_host[host]["next_allowed_in"] > 0) == (host in popped), host
    assert by_host["h7.test"]["delay"] == 3 and by_host["h8.test"]["delay"] == 0.5
    assert [r["queued"] for r in rows] == sorted((r["queued"] for r in rows), reverse=True)


def test_queue_keys_deleted_by_hand_still_let_workers_go_idle(client: redis.Redis) -> None:
    f = Frontier(client, "spider", default_delay=0)
    f.push([entry("h.test", str(i)) for i in range(3)])
    client.delete(*[k for k in client.keys(f.key("*")) if b":q:" in k], f.key("ready"))
    assert client.hget(f.key("stats"), "queued") == b"3"  # the counter drifted
    assert f.counts()["queued"] == 0 and f.is_idle()
    f.push([entry("h.test", "new")])
    assert f.counts()["queued"] == 1 and not f.is_idle()


@pytest.mark.parametrize("mode", ["bloom", "set"])
def test_dedupe(client: redis.Redis, mode: str) -> None:
    f = Frontier(client, "spider", dupefilter=mode, default_delay=0)
    batch = [entry("h.test", "1"), entry("h.test", "2"), entry("h.test", "1")]
    assert f.push(batch) == [True, True, False]
    assert f.push([entry("h.test", "2"), entry("h.test", "3")]) == [False, True]
    assert f.push([entry("h.test", "2", dont_filter=True)]) == [True]
    assert f.seen(fp("h.test1")) and not f.seen(fp("h.test9"))
    assert f.seen_many([fp("h.test3"), fp("nope")]) == [True, False]
    assert f.counts()["seen"] == 3 and f.counts()["queued"] == 4
    # A dont_filter entry (a start URL, a refetch) is never refused, and is seen from then
    # on: after a reset, a recrawl's refetches and the crawl's links to them were both
    # fetched.
    assert f.push([entry("h.test", "refetched", dont_filter=True)]) == [True]
    assert f.push([entry("h.test", "refetched")]) == [False]
    assert f.seen(fp("h.testrefetched"))
    other = "set" if mode == "bloom" else "bloom"
    with pytest.raises(redis.ResponseError, match="dupefilter"):
        Frontier(client, "spider", dupefilter=other).push([entry("h.test", "4")])


def test_bloom_at_capacity_costs_under_two_bytes_per_url(client: redis.Redis) -> None:
    f = Frontier(client, "spider", bloom_capacity=20_000, bloom_error_rate=0.001)
    fps = [fp(f"u{i}") for i in range(20_000)]
    added = [
        ok
        for i in range(0, len(fps), 1000)
        for ok in f.push([Entry("h.test", 0, x, "p") for x in fps[i : i + 1000]])
    ]
    assert added.count(False) < 40  # false positives while inserting
    mem = f.memory()
    assert mem["layers"] == 1 and mem["bytes"] / 20_000 <= 1.85
    probes = f.seen_many([fp(f"probe{i}") for i in range(50_000)])
    assert sum(probes) / len(probes) < 0.0016  # target 0.1 %


def test_bloom_grows_past_capacity_keeping_the_error_rate(client: redis.Redis) -> None:
    f = Frontier(client, "spider", bloom_capacity=10_000, bloom_error_rate=0.001)
    fps = [fp(f"u{i}") for i in range(50_000)]
    added = [
        ok
        for i in range(0, len(fps), 1000)
        for ok in f.push([Entry(f"h{i % 9}.test", 0, x, "p") for x in fps[i : i + 1000]])
    ]
    assert added.count(False) / len(fps) < 0.002
    assert all(f.seen_many(fps))  # no false negatives, ever
    mem = f.memory()
    assert mem["layers"] == 3  # 10k + 20k + 40k
    probes = f.seen_many([fp(f"probe{i}") for i in range(100_000)])
    rate = sum(probes) / len(probes)
    assert rate < 0.002  # compound bound 2 x target; expected ~0.0015
    per_url = mem["bytes"] / 50_000
    assert per_url < 3.0  # grown filter, 30% empty at the end (1.8 when full, one layer)
    assert f.counts()["seen"] == added.count(True)


def test_malformed_entries_go_to_the_dead_letter_queue(frontier: Frontier, client) -> None:
    frontier.push([entry("h.test", "good")])
    client.zadd(frontier.key("q:h.test"), {b"\x00garbage": -100, b"not:a:member": -50})
    client.set(frontier.key("q:foreign.test"), "a string")
    client.zadd(frontier.key("ready"), {"foreign.test": 0})
    client.zadd(frontier.key("delayed"), {b"no record here": 0})
    popped = drain(frontier)
    assert popped == ["http://h.test/good"]
    reasons = sorted(d["reason"].split(":")[0] for d in frontier.dead_letters())
    assert reasons == [
        "malformed delayed record",
        "malformed queue entry",
        "malformed queue entry",
        "queue key is not a sorted set",
    ]
    assert client.get(frontier.key("q:foreign.test")) == b"a string"  # not deleted
    assert frontier.requeue_dead() == 0  # junk stays dead
    frontier.push([entry("foreign.test", "1")])  # a push into the foreign key: DLQ too
    assert frontier.counts()["dead"] == 5 and frontier.counts()["queued"] == 0


def test_every_key_is_under_the_spider_prefix(client: redis.Redis) -> None:
    f = Frontier(client, "my-spider", default_delay=0.01, lease_seconds=0.05)
    g = Frontier(client, "other", dupefilter="set")
    f.push([entry("a.test", "1"), entry("b.test", "1"), entry("c.test", "1")])
    g.push([entry("a.test", "1")])
    f.set_delay("a.test", 2)
    f.defer_host("d.test", 5)
    p = [f.pop("w") for _ in range(3)]
    f.retry(p[0].lease_id, 0.01, "x")
    f.dead(p[1].lease_id, "y")
    time.sleep(0.06)
    f.pop("w")
    f.counts(), f.host_stats(), f.next_ready_in(), f.seen(fp("a")), f.requeue_dead()
    keys = {k.decode() for k in client.keys("*")}
    mine = {k for k in keys if k.startswith("webfarm:{my-spider}:")}
    assert keys - mine and all(k.startswith("webfarm:{other}:") for k in keys - mine)
    assert len(mine) > 8
    assert f.reset() == len(mine)
    assert {k.decode() for k in client.keys("*")} == keys - mine
    assert g.counts()["queued"] == 1


def test_recreating_a_frontier_deletes_nothing(redis_url: str) -> None:
    c1 = redis.Redis.from_url(redis_url)
    f = Frontier(c1, "spider", default_delay=0)
    f.push([entry("h.test", str(i)) for i in range(5)])
    f.pop("w")
    before = f.counts()
    del f
    gc.collect()
    c1.close()
    g = Frontier(redis.Redis.from_url(redis_url), "spider", default_delay=0)
    assert g.counts() == before
    assert g.push([entry("h.test", "1")]) == [False]


def test_exchange_is_one_round_trip_without_keys_or_scan(frontier: Frontier, client) -> None:
    frontier.push([entry("h.test", "seed")])
    p = frontier.pop("w")
    client.config_resetstat()
    r = frontier.exchange(
        "w", push=[entry("h.test", str(i)) for i in range(10)], ack=[p.lease_id], pop=3
    )
    assert r.acked == 1 and r.enqueued == [True] * 10 and len(r.popped) == 3
    stats = client.info("commandstats")
    top_level = {
        k: v["calls"] for k, v in stats.items() if k in ("cmdstat_evalsha", "cmdstat_eval")
    }
    assert top_level == {"cmdstat_evalsha": 1}
    assert not any(k in stats for k in ("cmdstat_keys", "cmdstat_scan"))
    r2 = frontier.exchange("w", pop=100)
    assert len(r2.popped) == 7 and r2.ready_in is not None  # 10 leases pending
    assert frontier.exchange("w", pop=0).popped == []


def test_the_asyncio_exchange_does_what_exchange_does(redis_url: str, client: redis.Redis) -> None:
    """The scheduler's asyncio path: the same acks, pushes (past MAX_PUSH too), leases and
    duplicates as the blocking call, and the same refusals."""
    blocking = Frontier(client, "a", default_delay=0)
    awaited = Frontier(client, "b", default_delay=0)

    async def run() -> list:
        aio = AsyncFrontier(awaited, redis.asyncio.Redis.from_url(redis_url))
        try:
            results = []
            for f in (blocking, awaited):
                f.push([entry("h.test", "seed")])
                lease = f.pop("w").lease_id
                push = [entry(f"h{i % 3}.test", str(i)) for i in range(MAX_PUSH + 5)]
                push.append(entry("h0.test", "0"))  # a duplicate
                if f is blocking:
                    r = f.exchange("w", push=push, ack=[lease], pop=4)
                else:
                    r = await aio.exchange("w", push=push, ack=[lease], pop=4)
                results.append((r.acked, r.enqueued, sorted(p.host for p in r.popped),
                                f.counts()))
            with pytest.raises(ValueError, match="worker name"):
                await aio.exchange("a worker", pop=1)
            return results
        finally:
            await aio.aclose()

    (acked, enqueued, hosts, counts), other = asyncio.run(run())
    assert (acked, enqueued, hosts, counts) == other
    assert acked == 1 and enqueued == [True] * (MAX_PUSH + 5) + [False]
    assert len(hosts) == 4
    assert counts["leased"] == 4 and counts["queued"] == MAX_PUSH + 1


def test_a_push_is_split_by_payload_bytes_too(client: redis.Redis, monkeypatch) -> None:
    """Entries of up to WEBFARM_MAX_ENTRY_BYTES each, MAX_PUSH of them in one script call,
    would hold the server (every worker's exchange) while it copies them in."""
    monkeypatch.setattr("webfarm.frontier.core.MAX_PUSH_BYTES", 10_000)
    f = Frontier(client, "spider", default_delay=0)
    push = [Entry("h.test", 0, fp(str(i)), json.dumps({"url": f"http://h.test/{i}",
                                                      "pad": "x" * 3_000}))
            for i in range(10)]
    calls = f._steps("w", push, (), 1)
    assert [n for _, n in calls] == [0, 0, 0, 1]  # 3 entries a call; the pop goes last
    result = f.exchange("w", push=push, pop=1)
    assert result.enqueued == [True] * 10 and len(result.popped) == 1
    assert f.counts()["queued"] == 9


def test_delays_sent_with_an_exchange_gate_its_pops(redis_url: str, client: redis.Redis
                                                     ) -> None:
    """Delay changes ride with the next exchange and come first in it; after SCRIPT FLUSH
    (a restarted Redis) the script is loaded again and nothing runs twice."""
    f = Frontier(client, "spider", default_delay=0)

    async def run() -> tuple:
        aio = AsyncFrontier(f, redis.asyncio.Redis.from_url(redis_url))
        try:
            push = [entry("slow.test", str(i)) for i in range(3)]
            first = await aio.exchange("w", push=push, pop=3, delays={"slow.test": 60.0})
            client.script_flush()
            second = await aio.exchange("w", push=[entry("fast.test", "1")], pop=3,
                                        delays={"fast.test": 0.0, "other.test": 2.5})
            with pytest.raises(ValueError, match="finite number"):
                await aio.exchange("w", pop=1, delays={"slow.test": float("inf")})
            return first, second
        finally:
            await aio.aclose()

    first, second = asyncio.run(run())
    assert [url(p) for p in first.popped] == ["http://slow.test/0"]  # 60 s between two
    assert second.enqueued == [True] and [url(p) for p in second.popped] == ["http://fast.test/1"]
    assert f.get_delay("slow.test") == 60.0 and f.get_delay("other.test") == 2.5
    assert f.counts()["queued"] == 2


def test_retries_and_dead_letters_ride_an_exchange_without_blocking(valkey_server) -> None:
    """Under a running loop (the reactor's), a retry, a dead letter and a Retry-After
    deferral wait for no round trip: they travel in an exchange's round trip, after the
    links held before them. Redis answers in 150 ms here (a relay); the retried
    parent, the dead letter and the deferral land all the same."""
    direct = Frontier(redis.Redis(host=valkey_server.host, port=valkey_server.port),
                      "opsrelay", default_delay=0)
    direct.reset()
    direct.push([entry("a.test", "parent"), entry("b.test", "gone")])
    parent, gone = direct.pop("w"), direct.pop("w")
    assert parent is not None and gone is not None

    with Relay((valkey_server.host, valkey_server.port), 0.15) as relay:
        f = Frontier(redis.Redis.from_url(relay.url), "opsrelay", default_delay=0)

        async def run() -> float:
            link = FrontierLink(f, "w", aio=AsyncFrontier(f, redis.asyncio.Redis.from_url(
                relay.url)))
            try:
                link.push.append(entry("a.test", "child"))
                started = time.perf_counter()
                link.op("retry", f._retry_args(parent.lease_id, 0, "HTTP 503"))
                link.op("dead", f._dead_args(gone.lease_id, "HTTP 404", status=404))
                link.op("defer", f._defer_args("c.test", 60))
                took = time.perf_counter() - started
                deadline = time.monotonic() + 10
                while link.in_flight is not None or link.ops or link.push:
                    assert time.monotonic() < deadline, "the calls did not land"
                    await asyncio.sleep(0.01)
                assert link.down_since is None
                return took
            finally:
                await link.aclose()

        took = asyncio.run(run())
    assert took < 0.1  # one reply alone takes 150 ms
    counts = direct.counts()
    assert (counts["leased"], counts["dead"]) == (0, 1)
    assert [letter["status"] for letter in direct.dead_letters()] == [404]
    assert sorted(url(p) for p in [direct.pop("w"), direct.pop("w")]) == [
        "http://a.test/child", "http://a.test/parent"]  # the retry was due at once
    direct.push([entry("c.test", "later")])
    assert direct.pop("w") is None  # c.test waits out its Retry-After
    direct.reset()


def test_the_idle_check_waits_for_no_reply(valkey_server) -> None:
    """A worker with nothing to do asks whether the whole frontier is empty before it
    closes. Under a running loop that question blocks nothing: it is sent, the answer is
    taken on the next call (the engine asks again when it is back), an answer sent before
    new work came is not used, and an unreachable Redis is an outage, not an error."""
    direct = Frontier(redis.Redis(host=valkey_server.host, port=valkey_server.port),
                      "idlerelay", default_delay=0)
    direct.reset()

    async def answer(link: FrontierLink, answers: list[int]) -> bool | None:
        before = len(answers)
        started = time.perf_counter()
        assert link.frontier_idle() is None  # sent
        assert time.perf_counter() - started < 0.05  # one reply alone takes 150 ms
        deadline = time.monotonic() + 10
        while len(answers) == before:
            assert time.monotonic() < deadline, "no answer came back"
            await asyncio.sleep(0.01)
        return link.frontier_idle()

    with Relay((valkey_server.host, valkey_server.port), 0.15) as relay:
        f = Frontier(redis.Redis.from_url(relay.url), "idlerelay", default_delay=0)

        async def run() -> tuple:
            answers: list[int] = []
            link = FrontierLink(f, "w", aio=AsyncFrontier(f, redis.asyncio.Redis.from_url(
                relay.url)), on_idle_answer=lambda: answers.append(1))
            try:
                empty = await answer(link, answers)
                direct.push([entry("a.test", "new")])
                busy = await answer(link, answers)
                direct.pop("w")  # leased: still not empty
                leased = await answer(link, answers)
                # An answer sent before work came is forgotten: the next call asks anew.
                assert link.frontier_idle() is None
                link.forget_idle_answer()
                assert link.frontier_idle() is None
                return empty, busy, leased, link.down_since
            finally:
                await link.aclose()

        empty, busy, leased, down_since = asyncio.run(run())
    assert (empty, busy, leased, down_since) == (True, False, False, None)

    closed = f"redis://127.0.0.1:{free_port()}/0"
    gone = Frontier(redis.Redis.from_url(closed), "idlerelay", default_delay=0)

    async def unreachable() -> tuple:
        answers: list[int] = []
        link = FrontierLink(gone, "w", aio=AsyncFrontier(gone, redis.asyncio.Redis.from_url(
            closed)), on_idle_answer=lambda: answers.append(1))
        try:
            return await answer(link, answers), link.down_since is not None, link.waiting()
        finally:
            await link.aclose()

    assert asyncio.run(unreachable()) == (None, True, True)  # an outage: retried later
    direct.reset()


def test_a_failing_call_in_an_exchange_does_not_stall_the_crawl(redis_url: str,
                                                                  client: redis.Redis) -> None:
    """A call the script refuses (here an unknown one; a bug in real life) fails the whole
    round trip. It is dropped with one logged line, since its lease would only expire and
    come back, while the links travelling with it are kept and land next time."""
    f = Frontier(client, "poison", default_delay=0)

    async def run() -> tuple:
        link = FrontierLink(f, "w", aio=AsyncFrontier(f, redis.asyncio.Redis.from_url(
            redis_url)))
        try:
            link.push.append(entry("a.test", "kept"))
            link.op("no_such_call", [])
            await link.settle()
            held = (len(link.push), len(link.ops), link.down_since is not None)
            link.start(0)
            await link.settle()
            return held, link.down_since
        finally:
            await link.aclose()

    held, down_since = asyncio.run(run())
    assert held == (1, 0, True)  # the link kept, the call dropped
    assert down_since is None and f.counts()["queued"] == 1


def test_bad_input_is_refused(client: redis.Redis) -> None:
    with pytest.raises(ValueError):
        Frontier(client, "bad{name}")
    with pytest.raises(ValueError):
        Frontier(redis.Redis(decode_responses=True), "spider")
    f = Frontier(client, "spider")
    for bad in ("", "two words", "tab\there"):
        with pytest.raises(ValueError):
            f.push([entry(bad, "1")])
    with pytest.raises(ValueError):
        f.push([Entry("h.test", 1.5, b"x", "p")])
    assert f.counts()["queued"] == 0


def test_backoff_is_full_jitter_and_capped() -> None:
    values = [backoff(3, base=1.0, cap=600) for _ in range(2000)]
    assert 0 <= min(values) < 1 and 7 < max(values) <= 8
    assert all(0 <= backoff(50, base=1.0, cap=30) <= 30 for _ in range(100))


@pytest.mark.parametrize("mode", ["bloom", "set"])
def test_a_host_budget_admits_that_many_urls_of_a_host_across_workers(
        client: redis.Redis, mode: str) -> None:
    """WEBFARM_HOST_BUDGET: a query-string trap (a calendar's ?month= without end) stops at
    the budget, counted in Redis so that every worker and run of the spider shares it."""
    one = Frontier(client, "spider", default_delay=0, dupefilter=mode, host_budget=3)
    two = Frontier(client, "spider", default_delay=0, dupefilter=mode, host_budget=3)
    first = one.exchange("", push=[entry("a", "m1"), entry("a", "m2"), entry("b", "x")], pop=0)
    assert first.enqueued == [True, True, True] and first.over_budget == [False] * 3
    # Another worker: a seen URL is a duplicate, the third new one fits, then the budget ends.
    second = two.exchange("", push=[entry("a", "m1"), entry("a", "m3"), entry("a", "m4"),
                                     entry("a", "m5"), entry("b", "y")], pop=0)
    assert second.enqueued == [False, True, False, False, True]
    assert second.over_budget == [False, False, True, True, False]
    # A start URL or a refetch (dont_filter) is the user's own: never counted or refused.
    assert one.push([entry("a", "start", dont_filter=True)]) == [True]
    assert {h["host"]: h["urls"] for h in one.host_stats()} == {"a": 3, "b": 2}
    assert sorted(drain(one)) == sorted(f"http://{h}/{n}" for h, n in (
        ("a", "m1"), ("a", "m2"), ("a", "m3"), ("a", "start"), ("b", "x"), ("b", "y")))
    # Refused URLs were not marked seen: a larger budget admits them when found again.
    larger = Frontier(client, "spider", default_delay=0, dupefilter=mode, host_budget=4)
    assert larger.exchange("", push=[entry("a", "m4"), entry("a", "m5")], pop=0
                           ).over_budget == [False, True]
    assert larger.counts()["queued"] == 1
    unlimited = Frontier(client, "spider", default_delay=0, dupefilter=mode)
    assert unlimited.push([entry("a", "m5"), entry("a", "m4")]) == [True, False]
    with pytest.raises(ValueError, match="host_budget must be 0 .no limit. or more"):
        Frontier(client, "spider", host_budget=-1)


def test_a_worker_s_exchanges_are_counted_so_writes_redis_lost_show(frontier, client, caplog):
    """Each exchange of a worker adds one to its count, in the same atomic call, so a
    count the worker saw before means Redis lost writes it had acknowledged (restored
    from an older snapshot, a lagging replica promoted). One the worker skips is a call
    applied twice (redis-py sends it again after a dropped connection): nothing lost."""
    lost: list[int] = []
    link = FrontierLink(frontier, "w1", on_lost_writes=lambda: lost.append(1))
    counts = []
    for name in ("a", "b", "c"):
        link.push.append(entry("h.test", name))
        counts.append(link.exchange(pop=0).count)
    assert counts == [1, 2, 3] and lost == []
    assert frontier.exchange("", push=[entry("h.test", "d")], pop=0).count == 0  # no worker
    client.hincrby(frontier.prefix + "workers", "w1", 1)  # a call applied twice
    assert link.exchange(pop=0).count == 5 and lost == []
    client.hset(frontier.prefix + "workers", "w1", 2)  # back to before the last three
    with caplog.at_level("WARNING", logger="webfarm.frontierlink"):
        assert link.exchange(pop=0).count == 3
    assert lost == [1]
    assert "Redis lost this worker's last 3 frontier exchanges" in caplog.text
    assert link.exchange(pop=0).count == 4 and lost == [1]  # counted from there on
    frontier.release_worker("w1")  # a worker that stops leaves no count behind
    assert client.hget(frontier.prefix + "workers", "w1") is None
    # A reset while the worker runs: its links may be gone with the seen set, so it sends
    # them again as they are found, and says why.
    other = FrontierLink(frontier, "w2", on_lost_writes=lambda: lost.append(2))
    assert [other.exchange(pop=0).count for _ in range(2)] == [1, 2]
    caplog.clear()
    frontier.reset()
    with caplog.at_level("WARNING", logger="webfarm.frontierlink"):
        assert other.exchange(pop=0).count == 1
    assert lost == [1, 2] and "or `scrapy frontier --reset` ran while this worker did" in (
        caplog.text)
