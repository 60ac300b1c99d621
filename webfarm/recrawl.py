"""Refetching what is due: the shared core of ``scrapy recrawl`` and of continuous recrawl.

A page is due when its ``next_fetch_at`` (set by :mod:`webfarm.refetch` after each fetch)
has passed. Due pages go into the spider's frontier as ordinary requests, so politeness,
leases, retries and the dead-letter queue apply as for any link; they bypass the
dupefilter (``dont_filter``: every one of them was seen before). Most overdue first: the
priority grows with the overdue ratio (time past due / the page's interval), so a page a
whole interval late beats one a minute late whatever their intervals.

A refetch is conditional: ``If-None-Match`` / ``If-Modified-Since`` from the validators the
last response gave (``etag``, ``last_modified``), and ``handle_httpstatus_list`` lets a 304
reach the spider, which records "fetched, unchanged" without downloading a body; a 404
or 410 reaches it too, and the index marks the page gone (``gone_at``), its last content
kept.

Each enqueued page is marked ``recrawl_queued_at``; until it is fetched (or its interval,
at least :data:`REQUEUE_AFTER` seconds, has passed) it is not enqueued again, so rounds that
follow each other quickly do not stack copies of one request in the frontier, and a page
whose refetch keeps failing (dead-lettered) is tried once an interval. A frontier that
holds nothing at all, not even dead letters (it was reset), holds none of the marked
pages: the marks are ignored then.

:class:`RecrawlExtension` runs rounds inside workers every ``WEBFARM_RECRAWL_INTERVAL``
seconds. One worker at a time does it: the first to take the Redis lock
``webfarm:{SPIDER}:recrawl:lock`` (``SET NX PX``, expiring after 0.9 interval, never
deleted) runs the round; the others skip. A worker's round enqueues only the pages on its
spider's ``allowed_domains`` (``scrapy recrawl`` enqueues all). A worker with continuous
recrawl does not stop when the frontier is empty (pages become due later), whatever
``WEBFARM_IDLE_TIMEOUT``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import heapq
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from email.utils import format_datetime
from secrets import token_hex
from typing import Any

import pymongo
import redis
from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import DontCloseSpider, NotConfigured
from twisted.internet import threads
from twisted.internet.task import LoopingCall

from webfarm import config
from webfarm.frontier import Entry, Frontier, key_prefix
from webfarm.queue import open_frontier, request_entry
from webfarm.redisconn import held, redis_client
from webfarm.refetch import as_utc
from webfarm.reparsepages import stored_meta
from webfarm.serialize import SerializationError
from webfarm.urls import spider_scope

logger = logging.getLogger(__name__)

REQUEUE_AFTER = 600.0  # seconds: an enqueued, never-fetched page may be enqueued again
MAX_PRIORITY = 100
META_KEY = "webfarm_recrawl"
# A refetch answered with one of these found the page gone: the spider records it (the index's
# ``gone_at``) instead of Scrapy dropping the response unseen.
GONE_STATUSES = (404, 410)
_FIELDS = ("url", "next_fetch_at", "refetch_interval", "fetched_at", "etag", "last_modified",
           "recrawl_queued_at", "callback", "cb_kwargs", "meta", "errback", "spider")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclass(frozen=True, order=True)
class DuePage:
    """A page to refetch; orders by overdue ratio, then seconds overdue."""

    ratio: float
    overdue: float
    url: str = field(compare=False)
    page_id: str = field(compare=False)
    etag: str | None = field(compare=False, default=None)
    last_modified: str | None = field(compare=False, default=None)
    callback: str | None = field(compare=False, default=None)  # not the spider's parse
    cb_kwargs: str | None = field(compare=False, default=None)  # its request's, as JSON
    meta: dict[str, Any] = field(compare=False, default_factory=dict)  # the spider's own
    errback: str | None = field(compare=False, default=None)  # its request's, by name

    @property
    def priority(self) -> int:
        """0 when just due, +10 per doubling of the lateness ratio, at most 100."""
        return min(MAX_PRIORITY, int(10 * math.log2(1 + max(self.ratio, 0.0))))

    @property
    def conditional(self) -> bool:
        return bool(self.etag or self.last_modified)


def _still_queued(doc: Mapping[str, Any], wall: dt.datetime) -> bool:
    queued = doc.get("recrawl_queued_at")
    if queued is None:
        return False
    queued = as_utc(queued)
    fetched = doc.get("fetched_at")
    if fetched is not None and as_utc(fetched) >= queued:
        return False  # fetched since it was enqueued
    wait = max(float(doc.get("refetch_interval") or 0.0), REQUEUE_AFTER)
    return (wall - queued).total_seconds() < wait


def due_pages(pages: Any, spider: str, now: dt.datetime, limit: int | None = None,
              wall: dt.datetime | None = None, keep: Callable[[str], bool] | None = None,
              queued_marks: bool = True) -> tuple[list[DuePage], int, int]:
    """The spider's pages due at ``now``, most overdue first (at most ``limit``), how
    many due pages were skipped because an earlier round enqueued them and they were not
    fetched yet, and how many were due in all (past the limit too, none skipped).
    ``wall`` is the real time (``now`` may be moved for tests and what-ifs);
    ``keep``, if given, says which URLs to consider at all; ``queued_marks`` False: the
    frontier holds nothing, so no page is still queued whatever its mark says."""
    wall = wall or utcnow()
    # Every page the spider stored, also those another spider stored since (``spiders``,
    # as re-parse reads them): on ``spider``, the last to store it, a generic crawl's
    # pages that a site spider had stored again were never due for generic.
    cursor = pages.find({"$or": [{"spiders": spider}, {"spider": spider}],
                         "next_fetch_at": {"$lte": now}}, dict.fromkeys(_FIELDS, 1))
    skipped = total = 0

    def candidates() -> Iterator[DuePage]:
        nonlocal skipped, total
        for doc in cursor:
            if keep is not None and not keep(doc["url"]):
                continue
            if queued_marks and _still_queued(doc, wall):
                skipped += 1
                continue
            total += 1
            overdue = (now - as_utc(doc["next_fetch_at"])).total_seconds()
            interval = float(doc.get("refetch_interval") or 0.0)
            ratio = overdue / interval if interval > 0 else overdue
            own = doc.get("spider") == spider  # another spider's callback is not this one's
            yield DuePage(ratio, overdue, doc["url"], doc["_id"], doc.get("etag") or None,
                          _http_date(doc.get("last_modified")),
                          doc.get("callback") if own else None,
                          doc.get("cb_kwargs") if own else None,
                          stored_meta(doc) if own else {},
                          doc.get("errback") if own else None)

    if limit is None:
        found = sorted(candidates(), reverse=True)
    else:
        found = heapq.nlargest(max(limit, 0), candidates())
    return found, skipped, total


def _http_date(value: Any) -> str | None:
    if not value:
        return None
    if isinstance(value, dt.datetime):
        return format_datetime(as_utc(value).astimezone(dt.timezone.utc), usegmt=True)
    return str(value)


def refetch_request(page: DuePage) -> Request:
    """The request for one due page: conditional, past the dupefilter, prioritised."""
    headers = {}
    if page.etag:
        headers["If-None-Match"] = page.etag
    if page.last_modified:
        headers["If-Modified-Since"] = page.last_modified
    # The spider's own meta of the page's request comes back with it (a callback reading
    # response.meta got None after a recrawl); a 304, 404 and 410 always reach it.
    allowed = [304, *GONE_STATUSES]
    mine = page.meta.get("handle_httpstatus_list")
    if isinstance(mine, (list, tuple)):
        allowed += [s for s in mine if s not in allowed]
    return Request(page.url, headers=headers, priority=page.priority, dont_filter=True,
                   meta={**page.meta, "handle_httpstatus_list": allowed,
                         META_KEY: round(page.ratio, 3)})


@dataclass
class RoundResult:
    due: list[DuePage]
    enqueued: int
    skipped_queued: int
    dry_run: bool = False
    total_due: int = 0  # due in all: more than ``due`` under a limit

    @property
    def left(self) -> int:
        """Due pages past the limit, for a later run."""
        return max(0, self.total_due - len(self.due))

    @property
    def conditional(self) -> int:
        return sum(1 for p in self.due if p.conditional)


class Recrawler:
    """Finds a spider's due pages in ``pages`` and pushes them into its frontier."""

    def __init__(self, pages: Any, frontier: Frontier, spider: str, fingerprinter: Any,
                 spider_obj: Spider | None = None) -> None:
        self.pages = pages
        self.frontier = frontier
        self.spider = spider
        self.fingerprinter = fingerprinter
        self.spider_obj = spider_obj
        # A worker's round enqueues only what its spider's offsite filter lets through: a
        # generic crawl of another site, in the same spider's index, would be handed back
        # by every worker until it is dead-lettered, every round (middlewares/offsite.py).
        self.keep = spider_scope(spider_obj)[1] if spider_obj is not None else None

    def run(self, now: dt.datetime | None = None, limit: int | None = None,
            dry_run: bool = False) -> RoundResult:
        wall = utcnow()
        # An empty frontier (reset since) holds none of the pages an earlier round marked
        # queued: they were skipped as "still queued" for up to their refetch interval, a
        # day or more. Not one whose refetches were dead-lettered: a page that failed each
        # try was enqueued again every round, five tries and a dead letter each (a probe:
        # 25 requests in 80 s to a page answering 503, 5 dead letters of it); its mark
        # holds, and it is tried again once its interval (10 minutes at least) has passed.
        try:
            counts = self.frontier.counts()
            holds = any(counts[k] for k in ("queued", "delayed", "leased", "dead"))
        except redis.RedisError:  # cannot tell (a read-only user's --dry-run): marks hold
            holds = True
        due, skipped, total = due_pages(self.pages, self.spider, now or wall, limit, wall,
                                        self.keep, queued_marks=holds)
        if dry_run or not due:
            return RoundResult(due, 0, skipped, dry_run, total)
        entries: list[Entry] = []
        queued: list[DuePage] = []
        for p in due:
            try:
                entries.append(request_entry(refetch_request(p), self.spider_obj,
                                             self.fingerprinter, callback=p.callback,
                                             cb_kwargs=p.cb_kwargs, errback=p.errback))
            except SerializationError as exc:  # a damaged page document: the others go
                logger.error("Recrawl: cannot refetch %s: %s", p.url, exc)
                continue
            queued.append(p)
        total -= len(due) - len(queued)
        due = queued
        enqueued = sum(self.frontier.push(entries))
        self.pages.update_many({"_id": {"$in": [p.page_id for p in due]}},
                               {"$set": {"recrawl_queued_at": wall}})
        return RoundResult(due, enqueued, skipped, total_due=total)


def lock_key(spider: str) -> str:
    return key_prefix(spider) + "recrawl:lock"


def running_key(spider: str) -> str:
    return key_prefix(spider) + "recrawl:running"


def one_round(server: redis.Redis, spider: str, owner: str,
              seconds: float = 900.0) -> contextlib.AbstractContextManager[str | None]:
    """Hold ``webfarm:{SPIDER}:recrawl:running`` while a round runs (None: this one
    holds it, else who does). Two rounds at once (two cron runs of ``scrapy recrawl``,
    or one beside a worker's round) both read the pages as not queued yet and queued
    every due page twice."""
    return held(server, running_key(spider), owner, seconds)


def take_lock(server: redis.Redis, spider: str, seconds: float, owner: str) -> bool:
    """One round per interval for the whole fleet: the lock expires after ``seconds`` and is
    never released early, so the next round anywhere is at least that far away."""
    return bool(server.set(lock_key(spider), owner, nx=True, px=max(1, round(seconds * 1000))))


class RecrawlExtension:
    """Continuous recrawl in a worker (``WEBFARM_RECRAWL_INTERVAL`` > 0)."""

    def __init__(self, crawler: Crawler, interval: float, batch: int) -> None:
        self.crawler = crawler
        self.interval = interval
        self.batch = batch
        self.owner = f"{token_hex(4)}:{time.time():.0f}"
        self.loop: LoopingCall | None = None
        self.recrawler: Recrawler | None = None
        self.server: redis.Redis | None = None
        self.client: pymongo.MongoClient | None = None
        self.running = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RecrawlExtension:
        interval = crawler.settings.getfloat("WEBFARM_RECRAWL_INTERVAL", 0.0)
        if interval <= 0:
            raise NotConfigured  # off by default: no warning for the usual case
        ext = cls(crawler, interval, crawler.settings.getint("WEBFARM_RECRAWL_BATCH", 10_000))
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(ext.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(ext.spider_idle, signal=signals.spider_idle)
        return ext

    def spider_opened(self, spider: Spider) -> None:
        settings = self.crawler.settings
        self.server = redis_client(settings)
        self.client = pymongo.MongoClient(config.mongo_uri(settings), tz_aware=True,
                                          serverSelectionTimeoutMS=10_000)
        pages = self.client[config.mongo_database(settings)]["pages"]
        frontier = open_frontier(settings, spider.name, self.server)
        self.recrawler = Recrawler(pages, frontier, spider.name,
                                   self.crawler.request_fingerprinter, spider)
        self.loop = LoopingCall(self.tick, spider)
        self.loop.start(self.interval, now=True)
        logger.info("Continuous recrawl every %.0fs (one worker at a time, lock %s)",
                    self.interval, lock_key(spider.name))

    def spider_closed(self, spider: Spider) -> None:
        if self.loop is not None and self.loop.running:
            self.loop.stop()
        if self.client is not None:
            self.client.close()

    def spider_idle(self, spider: Spider) -> None:
        raise DontCloseSpider  # pages become due later: a recrawling worker stays

    def tick(self, spider: Spider) -> Any:
        if self.running:  # the previous round is still going
            return None
        self.running = True
        d = threads.deferToThread(self._round, spider.name)
        d.addCallbacks(self._report, lambda f: logger.error("Recrawl round failed: %s",
                                                            f.getErrorMessage()))
        d.addBoth(self._done)
        return None  # never stop the loop on a failed round

    def _done(self, _: Any) -> None:
        self.running = False

    def _round(self, name: str) -> RoundResult | None:
        """In a thread (blocking Redis and MongoDB calls): the round, if this worker
        holds the lock for this interval."""
        assert self.server is not None and self.recrawler is not None
        # Expires a little before the next tick, so the holder's next tick can take it
        # again instead of racing the expiry; rounds stay >= 0.9 interval apart.
        if not take_lock(self.server, name, 0.9 * self.interval, self.owner):
            return None
        with one_round(self.server, name, self.owner) as busy:
            if busy is not None:
                logger.info("Recrawl: a round is running already (%s); this one skipped",
                            busy)
                return None
            return self.recrawler.run(limit=self.batch)

    def _report(self, result: RoundResult | None) -> None:
        stats = self.crawler.stats
        if result is None or stats is None:
            return
        stats.inc_value("webfarm/recrawl/rounds")
        stats.inc_value("webfarm/recrawl/enqueued", result.enqueued)
        stats.inc_value("webfarm/recrawl/conditional", result.conditional)
        if result.due:
            # past WEBFARM_RECRAWL_BATCH, what is left waits for the next round: said
            left = (f"; {result.left} more due, past WEBFARM_RECRAWL_BATCH={self.batch}, "
                    "wait for the next rounds" if result.left else "")
            logger.info("Recrawl: %d due pages enqueued (%d conditional, %d still queued)%s",
                        result.enqueued, result.conditional, result.skipped_queued, left)
