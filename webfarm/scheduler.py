"""The frontier scheduler: Scrapy's scheduler interface over the shared Redis frontier.

What it adds to a plain scheduler, and why:

* **Leases, not pops.** A request handed to the engine stays leased in Redis
  until its response went through the spider callback and every item through
  the pipelines; only then is it acknowledged. A worker killed with ``kill -9``
  loses nothing: its leases expire and go back to their queues.
* **One round trip per request.** Links a page yields and finished leases are
  buffered and travel with the next pop in one Lua call
  (:meth:`~webfarm.frontier.Frontier.exchange`); a timer flushes them when the
  engine is not asking.
* **Outcomes, not actions, from middlewares.** A request that ends in
  :class:`~webfarm.exceptions.RetryLater` goes back to the frontier with
  exponential backoff and full jitter (never a sleep); one that ends in
  :class:`~webfarm.exceptions.DeadLetter`, a failed spider callback, or too
  many attempts goes to the dead-letter queue with its reason.
* **Politeness is the frontier's.** Per-host delays from robots.txt, the
  latency rule and ``Retry-After`` arrive as signals and are stored in Redis,
  where they gate every worker (:class:`~webfarm.politeness.Politeness`).
* **The reactor never waits for Redis on the hot path.** Under the asyncio reactor
  exchanges run on an asyncio client (:class:`~webfarm.frontier.AsyncFrontier`): the
  engine gets ``None`` at once and is woken when the leases arrive; delay changes
  ride along, the latest per host, and so do retries, dead letters and deferrals,
  after the links. One exchange at a time, so acks still never overtake the links
  pushed before them.
* **Redis trouble is survivable.** When Redis is unreachable the worker logs
  one line, keeps what it holds, backs off and reconnects.

What is held for Redis and the calls that carry it live in
:class:`~webfarm.frontierlink.FrontierLink`; this module decides what to send, and
:class:`~webfarm.leaseends.LeaseEnds` how each lease ends,
:class:`~webfarm.leaserenew.LeaseRenewal` keeps the leases of slow pages, and
:class:`~webfarm.wakeup.Wakeup` when the engine asks again and when an idle worker closes.

Scrapy has no "request finished" hook, so the scheduler wraps the engine's
``_handle_downloader_output`` — the one place every request's download ends and
its scraping (callback and pipelines) completes. It is checked at start.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from secrets import token_hex

import redis
from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.crawler import Crawler
from scrapy.statscollectors import StatsCollector
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.reactor import is_asyncio_reactor_installed
from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall

from webfarm import advice
from webfarm import signals as wf_signals
from webfarm.config import whole_number
from webfarm.dupefilter import RecentFingerprints
from webfarm.frontier import AsyncFrontier, Exchange, Frontier, Popped
from webfarm.frontierlink import FrontierLink
from webfarm.hostmemory import RecentHosts, host_memory_size
from webfarm.leaseends import LeaseEnds
from webfarm.leaserenew import LeaseRenewal
from webfarm.outcomes import hook_downloader_output
from webfarm.politeness import Politeness
from webfarm.queue import (
    ATTEMPTS,
    HANDED_OUT,
    LEASE,
    LEASE_LOST,
    LOCAL,
    SENT_AT,
    UnfetchableURL,
    decode_request,
    open_frontier,
    request_entry,
)
from webfarm.redisconn import REDIS_ERRORS, async_redis_client, redis_client
from webfarm.serialize import SerializationError
from webfarm.sharedhosts import SharedHosts
from webfarm.urls import spider_scope
from webfarm.wakeup import Wakeup

logger = logging.getLogger(__name__)

PUSH_BATCH = 200
POP_MAX = 16  # leases asked for in one exchange, at most (never more than the engine takes)


class Scheduler(BaseScheduler):
    def __init__(self, crawler: Crawler, server: redis.Redis) -> None:
        settings = crawler.settings
        self.crawler = crawler
        self.server = server
        self.stats: StatsCollector | None = crawler.stats
        self.offsite_wait = settings.getfloat("WEBFARM_OFFSITE_WAIT", 60.0)
        self._cookies_said = settings.getbool("COOKIES_ENABLED")  # nothing to say then
        self._slot_said = False
        self._post_said = False  # a POST queued to the frontier was said (advice)
        # The robots middleware's check of the rules this worker holds (see enqueue_request)
        self._robots_allow: Callable[[str], bool] | None = None
        self._unfetchable_said: RecentHosts[None] = RecentHosts(host_memory_size(settings))
        self.flush_interval = settings.getfloat("WEBFARM_FLUSH_INTERVAL", 0.5)
        self.max_entry_bytes = whole_number(settings, "WEBFARM_MAX_ENTRY_BYTES", 1 << 20,
                                            "bytes", "no limit")
        self._recent = RecentFingerprints(settings.getint("WEBFARM_RECENT_FINGERPRINTS",
                                                          100_000))
        self.worker = f"{socket.gethostname()}:{os.getpid()}:{token_hex(3)}"
        self.frontier: Frontier | None = None
        self._within: Callable[[str], bool] | None = None  # in the spider's allowed_domains
        self.spider: Spider | None = None
        self.link: FrontierLink | None = None
        self._inflight: dict[str, Request] = {}
        # acks, retries, dead letters; a request given back may be due before the next poll
        self.wakeup = Wakeup(crawler)  # when the engine asks again; the idle close
        self.ends = LeaseEnds(settings, self._inflight, self._inc, self.wakeup.poll_now)
        self.renewal = LeaseRenewal(settings.getfloat("WEBFARM_LEASE_SECONDS", 600.0),
                                    self._inflight, self._inc)
        self._popped: deque[Popped] = deque()  # leased in the last exchange, not handed out
        self._local: deque[Request] = deque()  # meta[LOCAL]: this worker's own, not queued
        self._local_seen: set[bytes] = set()  # their fingerprints (Scrapy's own dupefilter)
        self.polite = Politeness(settings, self._inc)  # host delays, deferrals, turns
        self._loop: LoopingCall | None = None
        self.shared: SharedHosts | None = None  # hosts another spider crawls too

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Scheduler:
        server = redis_client(crawler.settings)
        server.ping()
        scheduler = cls(crawler, server)
        connect = crawler.signals.connect
        connect(scheduler.spider_idle, signal=signals.spider_idle)
        connect(scheduler.ends.item_error, signal=signals.item_error)
        connect(scheduler.ends.spider_error, signal=signals.spider_error)
        polite = scheduler.polite
        connect(polite.host_delay, signal=wf_signals.host_delay)
        connect(polite.host_defer, signal=wf_signals.host_defer)
        connect(polite.host_limited, signal=wf_signals.host_limited)
        connect(polite.render_arrival, signal=wf_signals.render_arrival)
        connect(polite.request_departure, signal=wf_signals.request_departure)
        connect(scheduler.renewal.request_departure, signal=wf_signals.request_departure)
        return scheduler

    # -- lifecycle --------------------------------------------------------------------------

    def open(self, spider: Spider) -> None:
        self.spider = spider
        self.frontier = open_frontier(self.crawler.settings, spider.name, self.server)
        # Another crawl's hosts in this spider's frontier wait for their own workers first.
        # Its hosts with their ports: two crawls of one host on two ports took each other's
        # pages as their own, and dropped their links (the spider follows its ports only).
        hosts, self._within = spider_scope(spider)
        self.frontier.keep_to(hosts, self.offsite_wait)
        # DOWNLOAD_DELAY is part of the host delay the frontier keeps between any two
        # workers' requests (webfarm.queue.host_delay). Scrapy's own wait, per worker, would
        # hold a request handed out on time until just after another worker's reached the
        # host; as Scrapy's AutoThrottle does, set the delay of new download slots.
        downloader = self.crawler.engine.downloader
        downloader._delay = 0.0
        # DOWNLOAD_SLOTS' delays likewise (SlotDelays): the frontier keeps them.
        downloader.per_slot_settings = {
            name: {**slot, "delay": 0.0} if isinstance(slot, dict) and "delay" in slot else slot
            for name, slot in downloader.per_slot_settings.items()}
        if self.crawler.settings.getbool("SCHEDULER_FLUSH_ON_START"):
            deleted = self.frontier.reset()
            logger.warning("SCHEDULER_FLUSH_ON_START: wiped the frontier (%d keys)", deleted)
        hook_downloader_output(self.crawler, self.ends.wrap, "webfarm.scheduler")
        self._robots_allow = next(
            (mw.allowed_if_known for mw in self.crawler.engine.downloader.middleware.middlewares
             if hasattr(mw, "allowed_if_known")), None)
        # A frontier class that overrides exchange() keeps the blocking path it overrides.
        aio = None
        if is_asyncio_reactor_installed() and type(self.frontier).exchange is Frontier.exchange:
            aio = AsyncFrontier(self.frontier, async_redis_client(self.crawler.settings))
        self.shared = SharedHosts(self.server, self.frontier.prefix, self.stats.inc_value)
        self.link = FrontierLink(self.frontier, self.worker, self.stats, aio,
                                 on_exchange=self._exchanged,
                                 leases_held=lambda: len(self._inflight),
                                 on_idle_answer=self.wakeup.wake,
                                 on_lost_writes=self._frontier_lost_writes,
                                 host_memory=self.polite.delays.memory)
        self.ends.open(self.link, self.frontier)
        self.polite.open(self.link, self.frontier)
        self.renewal.open(self.link, self.frontier)
        self._loop = LoopingCall(self.link.tick)
        self._loop.start(self.flush_interval, now=False)
        self.shared.open()
        counts = self.frontier.counts()
        kw = self.server.connection_pool.connection_kwargs
        logger.info(
            "Frontier %s on redis://%s:%s/%s as worker %s: %d queued, %d delayed, %d leased",
            self.frontier.prefix, kw.get("host", "?"), kw.get("port", "?"), kw.get("db", 0),
            self.worker, counts["queued"], counts["delayed"], counts["leased"],
        )

    def close(self, reason: str) -> Deferred[None] | None:
        """Flush what is held and give back unfinished leases at once; delete nothing."""
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self.renewal.close()
        if self.shared is not None:
            self.shared.close()
        self.wakeup.cancel()
        if self.link is None or self.link.aio is None:
            self._close()
            return None
        return deferred_from_coro(self._close_async())

    async def _close_async(self) -> None:
        assert self.link is not None
        await self.link.settle()
        self._close()
        await self.link.aclose()

    def _close(self) -> None:
        try:
            if self.link is not None:
                self.link.flush(force=True)
            released = self.frontier.release_worker(self.worker) if self.frontier else 0
        except REDIS_ERRORS as exc:
            logger.error("Redis unreachable while closing (%s): %d leases will expire and "
                         "return to the frontier by themselves", exc, len(self._inflight))
            return
        if released:
            logger.info("Gave back %d unfinished leases", released)
            self._inc("webfarm/frontier/released", released)

    def give_back_all(self) -> int:
        """After a forced stop (the reactor stopped, :meth:`close` never ran): send the
        links and acks held, then give back every other lease of this worker, blocking;
        how many. A page stored whose ack was held was given back and fetched again. (An
        exchange that was on its way when the reactor stopped never lands: its pages are
        given back and fetched again, and their links found again.)"""
        if self.frontier is None:
            return 0
        try:
            if self.link is not None:
                self.link.flush(force=True)
            return self.frontier.release_worker(self.worker)
        except REDIS_ERRORS as exc:
            logger.error("Redis unreachable after a forced stop (%s): the leases will expire "
                         "and return to the frontier by themselves", exc)
            return 0

    # -- the scheduler interface ------------------------------------------------------------

    def has_pending_requests(self) -> bool:
        link = self.link
        return bool(self._popped or self._local
                    or (link is not None and (link.push or link.in_flight)))

    def __len__(self) -> int:
        held = len(self._popped) + len(self._local)
        return held + (len(self.link.push) if self.link is not None else 0)

    def enqueue_request(self, request: Request) -> bool:
        # A request coming back from the downloader (a redirect) carries its parent's
        # lease; the parent is acknowledged when its download finishes, not here.
        request.meta.pop(LEASE, None)
        request.meta.pop(ATTEMPTS, None)
        request.meta.pop(HANDED_OUT, None)
        request.meta.pop(SENT_AT, None)
        request.meta.pop(LEASE_LOST, None)
        if request.meta.get(LOCAL):  # as Scrapy's own scheduler would, in this worker
            if not request.dont_filter:
                fingerprint = self.crawler.request_fingerprinter.fingerprint(request)
                if fingerprint in self._local_seen:
                    self._inc("webfarm/frontier/duplicates")
                    return False
                self._local_seen.add(fingerprint)
            self._local.append(request)
            self._inc("webfarm/frontier/local")
            return True
        if request.method == "POST" and not self._post_said:
            self._post_said = True
            advice.post_queued(request, self.crawler.settings.getbool("COOKIES_ENABLED"))
        fingerprint = None
        if not request.dont_filter:
            fingerprint = self.crawler.request_fingerprinter.fingerprint(request)
            if fingerprint in self._recent:  # this worker sent it: the frontier has it
                self._inc("webfarm/frontier/duplicates")
                self._inc("webfarm/frontier/duplicates_local")
                return False  # dropped, as Scrapy's own scheduler drops a duplicate
        if (self._robots_allow is not None and not request.meta.get("dont_obey_robotstxt")
                and not self._robots_allow(request.url)):
            # robots.txt, as this worker holds it, disallows it: refused here, not handed out
            # to be refused at download, which spent its host's turn (a site that disallows
            # half its links was crawled at half speed). After the local duplicate check, so
            # a link this worker queued lately costs no match (8 us each). Not marked seen:
            # a robots.txt that allows it later lets a page that links it queue it then.
            self._inc("webfarm/frontier/robots_disallowed")
            return False
        try:
            entry = request_entry(request, self.spider, self.crawler.request_fingerprinter,
                                  fingerprint, max_bytes=self.max_entry_bytes)
        except UnfetchableURL as exc:
            self._inc("webfarm/frontier/unfetchable")
            advice.url_not_queued(request, exc, self._unfetchable_said)
            return False
        except SerializationError as exc:
            logger.error("Cannot queue %s: %s", request, exc)
            self._inc("webfarm/frontier/unserializable")
            return False
        if fingerprint is not None:
            self._recent.add(fingerprint)
        if ((request.dont_filter or request.meta.get("allow_offsite"))
                and self._within is not None and not self._within(request.url)):
            # Let through by Scrapy's offsite filter (a start URL on another host): this
            # worker's own work, not another crawl's.
            self.frontier.also_keep(entry.host)
        self.polite.slot_delay(entry.host)
        if not self._slot_said and "download_slot" in request.meta:
            self._slot_said = advice.slot_not_used(request, entry.host)
        if request.cookies and not self._cookies_said:
            self._cookies_said = True
            advice.cookies_not_sent(request)
        if request.meta.get("is_start_request"):  # for advice.explain_links_seen
            self._inc("webfarm/frontier/start_requests")
        assert self.link is not None
        self.link.push.append(entry)
        if len(self.link.push) >= PUSH_BATCH and not self.link.start(0):
            self.link.flush()
        return True

    def next_request(self) -> Request | None:
        if self._local:
            return self._local.popleft()
        for _ in range(10):  # a few malformed entries in a row are dead-lettered, then retry
            if not self._popped and not self._pop():
                return None
            popped = self._popped.popleft()
            self.polite.slot_delay(popped.host)  # seeded by `scrapy seed`: never enqueued here
            try:
                request = decode_request(popped.payload, self.spider)
            except SerializationError as exc:
                reason = f"malformed frontier entry: {exc}"
                logger.error("%s (lease %s); moved to the dead-letter queue", reason,
                             popped.lease_id)
                self._inc("webfarm/frontier/malformed")
                self.link.op("dead", self.frontier._dead_args(popped.lease_id, reason))
                continue
            request.meta[LEASE] = popped.lease_id
            request.meta[ATTEMPTS] = popped.attempts
            request.meta[HANDED_OUT] = time.monotonic()
            if self.ends.used_up(popped.lease_id, request):
                continue
            self._inflight[popped.lease_id] = request
            self._inc("webfarm/frontier/dequeued")
            return request
        return None

    def _pop(self) -> bool:
        """One exchange that leases as many requests as the downloader can start right now
        (the engine takes them in the same loop, so none waits here past its host's turn)."""
        now = time.monotonic()
        link = self.link
        assert link is not None
        if link.waiting():
            return False
        if now < self.wakeup.next_poll and not link.push:
            # The reactor may wake us a hair early: always keep a wake-up pending.
            self.wakeup.wake_in(self.wakeup.next_poll - now)
            return False
        size = self._pop_size()
        if link.start(size):
            return False  # the engine is woken when the leases arrive
        exchange = link.exchange(pop=size)
        if exchange is None:
            return False
        if not exchange.popped:
            self.wakeup.idle_until(exchange.ready_in)
            return False
        self._popped.extend(exchange.popped)
        return True

    def _pop_size(self) -> int:
        downloader = getattr(self.crawler.engine, "downloader", None)
        total = getattr(downloader, "total_concurrency", 0)
        if not total:
            return 1
        return max(1, min(POP_MAX, total - len(getattr(downloader, "active", ()))))

    # -- talking to Redis (webfarm.frontierlink) ------------------------------------------

    def _frontier_lost_writes(self) -> None:
        """Redis went back in time: forget which links this worker sent (they may be gone,
        and would be dropped here when a page that found them is fetched again) and send
        every host delay this worker knows again."""
        self._recent.clear()
        self.polite.send_all_again()

    def _exchanged(self, result: Exchange, pop: int, later: bool) -> None:
        if sum(result.enqueued) or result.popped:
            self.wakeup.work_came()
            self.link.forget_idle_answer()
        if self.shared is not None:
            for popped in result.popped:
                self.shared.note(popped.host)
        if not later:
            return  # the caller of the blocking exchange takes its leases
        if result.popped:
            self._popped.extend(result.popped)
        elif pop:
            self.wakeup.idle_until(result.ready_in)
        self.wakeup.wake()  # the engine asks again: for the leases, new work, or to see it idle

    # -- closing when there is nothing left -------------------------------------------------

    def spider_idle(self, spider: Spider) -> None:
        """Keep the worker until the whole frontier stayed empty (:class:`Wakeup`)."""
        self.wakeup.spider_idle(self.link, self.frontier, spider)

    def _inc(self, key: str, count: int = 1) -> None:
        if self.stats is not None and count:
            self.stats.inc_value(key, count)
