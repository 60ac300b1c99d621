"""robots.txt per RFC 9309, shared by every worker, in place of Scrapy's middleware.

Why not Scrapy's ``RobotsTxtMiddleware``: it parses a 5xx error page as an
empty robots.txt (allow all), treats network errors as allow all, follows up to
20 redirects, caches forever per process and fetches once per worker. Here
(rule table in :mod:`webfarm.robots`):

* 2xx is parsed (first 500 KiB; the download stops there), 4xx allows all,
  429/5xx/network errors disallow all. The requests that were in flight go back
  with :class:`~webfarm.exceptions.RetryLater` (one attempt each); the host is
  deferred in the frontier past the next robots.txt attempt
  (``WEBFARM_ROBOTS_RETRY_DELAY``, or the answer's ``Retry-After``), which this
  worker makes in the background, again and again while the outage lasts. So
  queued requests wait in the frontier without spending attempts, and none is
  fetched before robots.txt answers.
* During an outage the last good copy is used if one is still cached (RFC 9309
  section 2.4 allows it). With no copy, after ``WEBFARM_ROBOTS_OUTAGE_ALLOW_AFTER``
  seconds of continuous outage (30 days, the RFC's example; 0 = never) the file
  counts as unavailable: allow all (section 2.3.1.4 MAY).
* At most 5 redirects are followed (across hosts too); a 6th means "unavailable",
  i.e. allow all (section 2.3.1.2 MAY). Redirect hops go through the downloader
  middlewares like any request (the SSRF guard sees each one).
* A fetched copy is good for ``WEBFARM_ROBOTS_CACHE_SECONDS`` (at most a day) and is
  shared through Redis (``webfarm:{SPIDER}:robots:<origin>``, the raw text only):
  one worker fetches under a Redis lock (renewed while it fetches, so a stopped worker's
  lapses in ``WEBFARM_ROBOTS_LOCK_SECONDS``), the others wait for its result.
* While a robots.txt is being fetched, every other request to that origin waits
  for the result (in this worker: on the same fetch; in others: on the lock); none
  slips through as "allowed". (Scrapy's waiters share one Deferred, which
  ``asFuture`` leaves firing None for all but the first: read as "allow".)
* Disallowed requests end in :class:`~webfarm.robots.RobotsDisallowed` (an
  ``IgnoreRequest``): the frontier acknowledges them, stats count them
  (``webfarm/robots/disallowed``); they are not dead letters, since nothing failed.
* ``Crawl-delay`` for our product token becomes the host's delay (``host_delay``
  signal, capped at ``WEBFARM_MAX_CRAWL_DELAY``; a capped value is logged).

The file is fetched by :mod:`middlewares.robotsfetch`; the rule table and the shared
record are :mod:`webfarm.robots` and :mod:`webfarm.robotscache`.

Rules match the User-Agent's product token (``webfarm`` in ``webfarm/0.1 (+…)``),
or ``WEBFARM_ROBOTS_AGENT``. ``ROBOTSTXT_OBEY`` switches it all off; the
``dont_obey_robotstxt`` meta key skips one request.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from dataclasses import dataclass
from secrets import token_hex

from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import (
    NotConfigured,
    StopDownload,
)
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import reactor
from twisted.internet.base import DelayedCall
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from middlewares.robotsfetch import META, fetch
from webfarm import browser
from webfarm import signals as wf_signals
from webfarm.exceptions import DeadLetter, GiveBack, RetryLater
from webfarm.queue import LEASE, host_delay
from webfarm.redisconn import close_client, crawl_redis_client
from webfarm.robots import (
    ALLOW_ALL,
    DISALLOW_ALL,
    MAX_BYTES,
    Fetched,
    Record,
    RobotsDisallowed,
    RobotsRules,
    next_record,
    origin_of,
    robots_agent,
    verdict,
    warn_placeholder_user_agent,
)
from webfarm.robotscache import SharedRobotsCache
from webfarm.threads import storage_threads
from webfarm.urls import host_of

logger = logging.getLogger(__name__)

MEMORY_ORIGINS = 4096  # parsed robots.txt kept in memory per worker (LRU)
PARSE_IN_THREAD = 64 * 1024  # bodies larger than this are parsed off the reactor


@dataclass
class Known:
    """What this worker currently knows about an origin's robots.txt."""

    kind: str  # "rules", "unreachable", "busy", "refused"
    until: float  # monotonic time until which this holds
    rules: RobotsRules = DISALLOW_ALL
    reason: str = ""
    dead: DeadLetter | None = None
    deferred: bool = False  # the host is held in the frontier for this outage
    spacing: float = 0.0  # the Crawl-delay in force (0: none)
    burst: bool = False  # loaded while requests of other workers waited for the same file
    fetched: bool = False  # loaded by a fetch of the file just now: a request to the host
    absent: bool = False  # "unreachable" because the host does not answer at all
    ongoing: bool = False  # "unreachable", as it already was here: the outage goes on


class RobotsMiddleware:
    DOWNLOAD_PRIORITY = 1000

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        warn_placeholder_user_agent(settings)
        if not settings.getbool("ROBOTSTXT_OBEY"):
            raise NotConfigured
        self.crawler = crawler
        self.stats = crawler.stats
        self.agent = robots_agent(settings)
        self.cache_seconds = min(settings.getfloat("WEBFARM_ROBOTS_CACHE_SECONDS", 86400.0),
                                 86400.0)
        self.retry_delay = max(settings.getfloat("WEBFARM_ROBOTS_RETRY_DELAY", 300.0), 0.1)
        self.outage_allow = settings.getfloat("WEBFARM_ROBOTS_OUTAGE_ALLOW_AFTER", 2592000.0)
        self.wait_seconds = settings.getfloat("WEBFARM_ROBOTS_WAIT", 30.0)
        self.max_crawl_delay = settings.getfloat("WEBFARM_MAX_CRAWL_DELAY", 60.0)
        self.retry_after_max = settings.getfloat("WEBFARM_RETRY_AFTER_MAX", 3600.0)
        self.base_delay = host_delay(settings)
        self.lock_seconds = settings.getfloat("WEBFARM_ROBOTS_LOCK_SECONDS", 15.0)
        spider = crawler.spider.name if crawler.spider else crawler.spidercls.name
        self.cache = SharedRobotsCache(crawl_redis_client(settings), spider, self.lock_seconds,
                                       keep_seconds=2 * self.cache_seconds)
        self._known: OrderedDict[str, Known] = OrderedDict()
        self._pending: dict[str, list[Deferred[None]]] = {}
        self._delays: dict[str, float] = {}
        self._rechecks: dict[str, DelayedCall] = {}  # origins with an outage being watched
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(self.bytes_received, signal=signals.bytes_received)
        browser.configure_robots(self.allowed_if_known)  # a page's own requests

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RobotsMiddleware:
        return cls(crawler)

    async def spider_closed(self, spider: Spider) -> None:
        for call in self._rechecks.values():
            if call.active():
                call.cancel()
        self._rechecks.clear()
        browser.configure_robots(None)
        await close_client(self.cache.server)

    def bytes_received(self, data: bytes, request: Request, spider: Spider) -> None:
        """Stop a robots.txt download past the parsing limit and keep what came."""
        if not request.meta.get(META):
            return
        got = request.meta.get("webfarm_robots_bytes", 0) + len(data)
        request.meta["webfarm_robots_bytes"] = got
        if got > MAX_BYTES:
            raise StopDownload(fail=False)

    # -- enforcing ---------------------------------------------------------------------------

    def allowed_if_known(self, url: str) -> bool:
        """False when the rules this worker holds for ``url``'s origin disallow it."""
        if not url.startswith(("http://", "https://")):
            return True  # data:, blob:: no robots.txt speaks for them
        try:
            known = self._known.get(origin_of(url))
        except ValueError:  # a URL the browser can make and urlsplit cannot read
            return True
        return known is None or known.kind != "rules" or known.rules.allowed(url, self.agent)

    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        if request.meta.get("dont_obey_robotstxt") or request.meta.get(META):
            return None
        if urlparse_cached(request).scheme not in ("http", "https"):
            return None
        origin = origin_of(request.url)
        known, waited = await self._known_for(origin)
        if known.kind == "rules":
            if not known.rules.allowed(request.url, self.agent):
                # A start URL refused: the crawl may end with nothing fetched, and only
                # a stat said why.
                logger.log(logging.WARNING if request.meta.get("is_start_request")
                           else logging.DEBUG,
                           "Forbidden by robots.txt (user agent %r): %s%s", self.agent,
                           request, " is a start URL: nothing of the site is fetched through "
                           "it. Check the site's robots.txt, or WEBFARM_ROBOTS_AGENT"
                           if request.meta.get("is_start_request") else "")
                self._inc("webfarm/robots/disallowed")
                raise RobotsDisallowed("Forbidden by robots.txt")
            if waited and (known.spacing or self.base_delay) and LEASE in request.meta:
                # Popped while robots.txt was read, and held: they would all go at once,
                # right after the file. Back to the frontier, which hands the host's
                # requests out one per delay (a Crawl-delay's, or WEBFARM_HOST_DELAY's: that
                # one was not kept), the first a delay after the file's fetch.
                self._inc("webfarm/robots/spaced")
                raise GiveBack("held for robots.txt: back to the frontier, to be spaced")
            self._inc("webfarm/robots/allowed")
            return None
        if known.kind == "refused" and known.dead is not None:
            raise DeadLetter(known.dead.reason, status=known.dead.status,
                             error=known.dead.error)
        wait = max(known.until - time.monotonic(), 1.0)
        if known.absent:
            # A host that does not answer at all (refused, no such name): holding its pages
            # without spending attempts kept a crawl from ever ending (30 days, RFC 9309's
            # outage), its errbacks never run. They are retried at robots.txt's pace and
            # dead-lettered, as their own fetch would be; none is fetched meanwhile.
            self._inc("webfarm/robots/host_absent")
            raise RetryLater(f"robots.txt unavailable: the host does not answer "
                             f"({known.reason})", delay=wait * random.uniform(1.0, 1.1))
        if known.kind == "unreachable" and not known.deferred:
            known.deferred = True
            self._hold_host(origin, wait)
        self._inc("webfarm/robots/retry_later")
        # The requests in flight as the outage is found spend an attempt; those popped
        # while it goes on (the host's hold ran out as a slow file was fetched again) spend
        # none: a robots.txt that timed out each try had its host's pages dead-lettered.
        raise RetryLater(f"robots.txt unavailable ({known.reason})",
                         delay=wait * random.uniform(1.0, 1.1), spend=not known.ongoing)

    # -- outages: the host waits in the frontier while this worker re-fetches robots.txt ------

    def _hold_host(self, origin: str, wait: float) -> None:
        """Defer the host past the next robots.txt attempt, which runs in the background:
        its queued requests stay in the frontier (no attempts spent) until it answers."""
        margin = max(2.0, 0.1 * wait)
        self.crawler.signals.send_catch_log(wf_signals.host_defer, host=host_of(origin),
                                            seconds=wait + margin, source="robots")
        call = self._rechecks.get(origin)
        if call is None or not call.active():
            self._rechecks[origin] = reactor.callLater(wait, self._recheck, origin)

    def _recheck(self, origin: str) -> None:
        self._rechecks.pop(origin, None)
        if self.crawler.engine is None or not self.crawler.crawling:
            return
        self._inc("webfarm/robots/rechecks")
        deferred_from_coro(self._recheck_async(origin)).addErrback(
            lambda f: logger.error("robots.txt re-check of %s failed: %s", origin, f.value))

    async def _recheck_async(self, origin: str) -> None:
        known = self._known.get(origin)
        if known is not None and known.until > time.monotonic():
            if known.kind == "unreachable":  # re-checked meanwhile by a request: still down
                self._hold_host(origin, max(known.until - time.monotonic(), 1.0))
            return
        known, _ = await self._known_for(origin)
        if known.kind == "unreachable":
            known.deferred = True
            self._hold_host(origin, max(known.until - time.monotonic(), 1.0))

    async def _known_for(self, origin: str) -> tuple[Known, bool]:
        """This worker's view of ``origin``, and whether this request had to wait for it.

        One load at a time per origin; the other requests wait for its result.
        """
        waited = False
        while True:
            known = self._known.get(origin)
            if known is not None and known.until > time.monotonic():
                self._known.move_to_end(origin)
                return known, waited
            waiters = self._pending.get(origin)
            if waiters is None:
                break
            waiter: Deferred[None] = Deferred()
            waiters.append(waiter)
            waited = True
            self._inc("webfarm/robots/waited")
            await maybe_deferred_to_future(waiter)
        self._pending[origin] = []
        before = self._known.get(origin)
        try:
            known = await self._load(origin)
        except Exception as exc:  # never let one origin's trouble escape as "allowed"
            logger.exception("robots.txt of %s could not be loaded", origin)
            known = Known("unreachable", time.monotonic() + self.retry_delay,
                          reason=f"{type(exc).__name__}: {exc}")
        finally:
            for waiter in self._pending.pop(origin, []):
                waiter.callback(None)  # they go on once this returns
        if known.kind == "unreachable" and before is not None and before.kind == "unreachable":
            known.ongoing = True
        self._known[origin] = known
        self._known.move_to_end(origin)
        while len(self._known) > MEMORY_ORIGINS:
            self._known.popitem(last=False)
        return known, waited or known.burst or known.fetched

    # -- loading: Redis first, else fetch under a lock ------------------------------------------

    async def _load(self, origin: str) -> Known:
        record = await self.cache.read(origin)
        if record is not None and record.expires > time.time():
            self._inc("webfarm/robots/shared_hits")
            return await self._known_from(origin, record)
        token = token_hex(8)
        if not await self.cache.lock(origin, token):
            waited = await self._wait_for_other(origin, token)
            if isinstance(waited, Known):
                return waited
            record = waited  # the other worker gave up: we hold the lock now
        keeping = self.cache.keep(origin, token)
        try:
            fetched = await self._fetch(origin)
            if fetched.kind == "refused":
                return Known("refused", time.monotonic() + self.retry_delay,
                             reason=fetched.error, dead=fetched.dead)
            self._inc(f"webfarm/robots/outcome/{fetched.kind}")
            retry_in = self.retry_delay
            if fetched.retry_after is not None:
                retry_in = min(max(fetched.retry_after, 1.0), self.retry_after_max)
            record = next_record(fetched, await self.cache.read(origin) or record, time.time(),
                                 self.cache_seconds, retry_in)
            await self.cache.write(origin, record)
        finally:
            if keeping.running:
                keeping.stop()
            await self.cache.unlock(origin, token)
        known = await self._known_from(origin, record)
        if known.kind == "rules":
            self._fetched_now(origin, known)
        return known

    def _fetched_now(self, origin: str, known: Known) -> None:
        """The file's fetch was a request to the host: its next hand-out waits a delay
        after it. The request that asked goes back to the frontier (see process_request);
        it went right after robots.txt, two requests at once, once a day per host."""
        known.fetched = True
        spacing = known.spacing or self.base_delay
        if spacing > 0:
            self.crawler.signals.send_catch_log(wf_signals.host_defer, host=host_of(origin),
                                                seconds=spacing, source="robots")

    async def _wait_for_other(self, origin: str, token: str) -> Known | Record | None:
        """Another worker holds the lock: wait for its record, or take over the lock."""
        self._inc("webfarm/robots/waited_other_worker")
        deadline = time.monotonic() + self.wait_seconds
        while time.monotonic() < deadline:
            await maybe_deferred_to_future(deferLater(reactor, 0.2, lambda: None))
            record = await self.cache.read(origin)
            if record is not None and record.expires > time.time():
                known = await self._known_from(origin, record)
                known.burst = True
                return known
            if await self.cache.lock(origin, token):
                return record
        return Known("busy", time.monotonic() + 1.0,
                     reason="another worker is still fetching it")

    async def _known_from(self, origin: str, record: Record) -> Known:
        now, mono = time.time(), time.monotonic()
        until = mono + max(min(record.expires - now, self.cache_seconds), 0.5)
        reason = f"HTTP {record.status}" if record.status else record.error or "unreachable"
        how = verdict(record, now, 2 * self.cache_seconds, self.outage_allow)
        if how == "unreachable":
            logger.info("robots.txt of %s unreachable (%s): its requests wait %.0fs", origin,
                        reason, record.expires - now)
            return Known("unreachable", until, reason=reason, absent=record.absent)
        if how == "outage-allow":
            logger.warning("robots.txt of %s unreachable for %.0f days: treated as unavailable "
                           "(allow all), as RFC 9309 2.3.1.4 permits", origin,
                           (now - record.since) / 86400)
            return Known("rules", until, ALLOW_ALL)
        if how == "stale":
            logger.info("robots.txt of %s unreachable (%s); using the copy fetched %.0fs ago",
                        origin, reason, now - record.good_at)
        if how == "allow" or record.good == "allow":
            return Known("rules", until, ALLOW_ALL)
        if len(record.body) > PARSE_IN_THREAD:
            rules = await storage_threads(self.crawler).run(RobotsRules.parse, record.body)
        else:
            rules = RobotsRules.parse(record.body)
        spacing = self._crawl_delay(origin, rules)
        return Known("rules", until, rules, spacing=spacing)

    def _crawl_delay(self, origin: str, rules: RobotsRules) -> float:
        """Make the file's Crawl-delay the host's delay; returns it (0: none)."""
        host = host_of(origin)
        delay = rules.crawl_delay(self.agent)
        if delay is None:
            if host in self._delays:  # the file no longer asks for one
                self._delays.pop(host)
                self.crawler.signals.send_catch_log(wf_signals.host_delay, host=host,
                                                    delay=self.base_delay, source="robots")
            return 0.0
        elif delay > self.max_crawl_delay:
            logger.warning("robots.txt of %s asks for Crawl-delay %g s; capped at "
                           "WEBFARM_MAX_CRAWL_DELAY=%g s", origin, delay, self.max_crawl_delay)
            self._inc("webfarm/robots/crawl_delay_capped")
            delay = self.max_crawl_delay
        delay = max(delay, self.base_delay)
        if self._delays.get(host) == delay:
            return delay
        self._delays[host] = delay
        send = self.crawler.signals.send_catch_log
        send(wf_signals.host_delay, host=host, delay=delay, source="robots")
        # The request about to go out is the host's latest: the next one waits a full delay.
        send(wf_signals.host_defer, host=host, seconds=delay, source="robots")
        return delay

    # -- fetching --------------------------------------------------------------------------

    async def _fetch(self, origin: str) -> Fetched:
        self._inc("webfarm/robots/fetched")
        return await fetch(self.crawler.engine, origin, self.DOWNLOAD_PRIORITY, self._inc)

    def _inc(self, key: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(key)
