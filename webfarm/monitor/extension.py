"""The Scrapy side of monitoring: count where fetches happen, flush off the hot path.

* :class:`MonitorMiddleware` sits next to the downloader (950), so it sees every
  response before the retry middleware turns a 5xx into a frontier retry and
  before ``HttpErrorMiddleware`` hides a 403 from the spider, and every network
  error before anything converts it. It only counts, in memory.
* :class:`MonitorExtension` counts stored items, writes the counts to Redis in
  one pipelined batch every ``WEBFARM_METRICS_FLUSH_INTERVAL`` seconds in a
  thread, runs the :class:`~webfarm.monitor.alerts.Evaluator` (frontier samples,
  dead letters per host, alert rules; one worker at a time) every
  ``WEBFARM_MONITOR_INTERVAL`` seconds, also in a thread, and serves the
  Prometheus endpoint when ``WEBFARM_PROMETHEUS_PORT`` is set.

Both are off when ``WEBFARM_METRICS`` is false.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.http import Response
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet import threads
from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall
from twisted.python.failure import Failure

from webfarm import fetchapi, robots
from webfarm.items import PageItem
from webfarm.monitor.alerts import Evaluator, Rules
from webfarm.monitor.metrics import MetricsStore, Recorder
from webfarm.monitor.notify import Notifier
from webfarm.queue import open_frontier
from webfarm.redisconn import REDIS_FAILURES, redis_client
from webfarm.urls import host_of

logger = logging.getLogger(__name__)

_ATTR = "_webfarm_monitor"
_FLAG = "_webfarm_monitor_counted"  # meta: this request was counted as a fetch


def shared_recorder(crawler: Crawler) -> Recorder:
    """The crawler's one :class:`Recorder` (middleware and extension share it)."""
    recorder = getattr(crawler, _ATTR, None)
    if recorder is None:
        settings = crawler.settings
        if not settings.getbool("WEBFARM_METRICS", True):
            raise NotConfigured  # off by choice (or by a dev command): no warning, as in Scrapy
        store = MetricsStore(
            redis_client(settings), crawler.spider.name,
            bucket_seconds=settings.getint("WEBFARM_METRICS_BUCKET", 60),
            retention=settings.getfloat("WEBFARM_METRICS_RETENTION", 7200.0),
        )
        # Running totals per host only for Prometheus, and for a bounded number of hosts.
        top = max(0, settings.getint("WEBFARM_PROMETHEUS_TOP_HOSTS", 20))
        port = settings.getint("WEBFARM_PROMETHEUS_PORT", 0)
        recorder = Recorder(store, totals_hosts=max(1000, 10 * top) if port else 0)
        setattr(crawler, _ATTR, recorder)
    return recorder


class MonitorMiddleware:
    """Counts fetches, responses by status class, errors by kind, latency and bytes."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> MonitorMiddleware:
        return cls(shared_recorder(crawler))

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        if request.meta.get(fetchapi.META_CALL) or request.meta.get(robots.META):
            return  # robots.txt: counted when it ends, as it may not count at all
        request.meta[_FLAG] = True
        self.recorder.request(host_of(request.url))

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Response:
        if request.meta.get(fetchapi.META_CALL):
            return response  # the call to the fetch API: counted as the page it brings back
        host = host_of(request.url)
        if request.meta.get(robots.META) and robots.classify(response.status) == "allow":
            # A 404 (or 401, 403, ...) robots.txt is the site's answer "no rules",
            # not a failed fetch: it cost hosts without one a point of success rate.
            return response
        if not request.meta.pop(_FLAG, None):
            # Answered before reaching us (the fetch-API rung, a cache): still a fetch.
            self.recorder.request(host)
        if fetchapi.FLAG in response.flags:
            method = "api"
        elif "playwright" in response.flags or request.meta.get("playwright"):
            method = "browser"
        else:
            method = "http"
        self.recorder.response(host, response.status, request.meta.get("download_latency"),
                               len(response.body), method)
        return response

    def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> None:
        # Only fetches that reached the downloader; robots.txt, SSRF refusals and the like
        # (IgnoreRequest from an earlier middleware) are decisions, not errors.
        counted = request.meta.pop(_FLAG, None)
        if isinstance(exception, IgnoreRequest):
            return None
        host = host_of(request.url)
        if request.meta.get(robots.META):  # not counted as it started
            self.recorder.request(host)
            counted = True
        if counted:
            self.recorder.error(host, type(exception).__name__)
        return None


class MonitorExtension:
    def __init__(self, crawler: Crawler, recorder: Recorder) -> None:
        settings = crawler.settings
        self.crawler = crawler
        self.recorder = recorder
        self.store = recorder.store
        self.flush_interval = max(0.05, settings.getfloat("WEBFARM_METRICS_FLUSH_INTERVAL", 5.0))
        self.monitor_interval = max(0.1, settings.getfloat("WEBFARM_MONITOR_INTERVAL", 15.0))
        self.prometheus_port = settings.getint("WEBFARM_PROMETHEUS_PORT", 0)
        self.prometheus_addr = settings.get("WEBFARM_PROMETHEUS_ADDR") or "127.0.0.1"
        self.top_hosts = max(0, settings.getint("WEBFARM_PROMETHEUS_TOP_HOSTS", 20))
        self.worker = f"{socket.gethostname()}:{os.getpid()}"
        frontier = open_frontier(settings, crawler.spider.name, self.store.server)
        self.evaluator = Evaluator(
            self.store, frontier, self.worker, Rules.from_settings(settings),
            Notifier.from_settings(settings, crawler.spider.name, self.worker),
            # past a POST's timeout too: one slow POST let the lock lapse mid-check
            lock_seconds=max(5.0, 3 * self.monitor_interval,
                             3 * settings.getfloat("WEBFARM_ALERT_WEBHOOK_TIMEOUT", 5.0)),
        )
        self._loops: list[LoopingCall] = []
        self._running: dict[str, Deferred] = {}
        self._flush_failing_since: float | None = None
        self._monitor_failing = False
        self._dupes_seen = 0.0
        self._http: Any = None
        connect = crawler.signals.connect
        connect(self.spider_opened, signal=signals.spider_opened)
        connect(self.spider_closed, signal=signals.spider_closed)
        connect(self.item_scraped, signal=signals.item_scraped)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> MonitorExtension:
        return cls(crawler, shared_recorder(crawler))

    # -- lifecycle --------------------------------------------------------------------------

    def spider_opened(self, spider: Spider) -> None:
        try:
            self.store.sync_clock()
        except REDIS_FAILURES as exc:
            logger.warning("Monitoring: cannot read the Redis clock (%s); using ours", exc)
        for name, every, call in (("flush", self.flush_interval, self._flush),
                                  ("monitor", self.monitor_interval, self._monitor)):
            loop = LoopingCall(self._in_thread, name, call)
            # The monitor's first pass at once, and a last one at close: a crawl shorter
            # than WEBFARM_MONITOR_INTERVAL never ran one, so its dead letters were never
            # counted (the first pass takes what the queue holds as history).
            loop.start(every, now=name == "monitor")
            self._loops.append(loop)
        if self.prometheus_port:
            self._start_prometheus()

    async def spider_closed(self, spider: Spider, reason: str) -> None:
        for loop in self._loops:
            if loop.running:
                loop.stop()
        for d in list(self._running.values()):
            await maybe_deferred_to_future(d)
        await maybe_deferred_to_future(threads.deferToThread(self._flush))
        await maybe_deferred_to_future(threads.deferToThread(self._monitor))
        await maybe_deferred_to_future(threads.deferToThread(self.evaluator.release))
        if self._http is not None:  # shutdown() waits for the serving loop: not on the reactor
            await maybe_deferred_to_future(threads.deferToThread(self._http.shutdown))
            self._http.server_close()

    def _in_thread(self, name: str, call: Any) -> None:
        """Run ``call`` in the reactor's thread pool unless its last run is still going."""
        if name in self._running:
            return
        d = threads.deferToThread(call)
        self._running[name] = d

        def done(result: Any) -> None:
            self._running.pop(name, None)
            if hasattr(result, "getTraceback"):
                logger.error("Monitoring %s failed: %s", name, result.getTraceback())

        d.addBoth(done)

    # -- items ------------------------------------------------------------------------------

    def item_scraped(self, item: Any, response: Response | Failure, spider: Spider) -> None:
        if isinstance(item, PageItem):
            self.recorder.item(item.host, self._is_duplicate(item))
            return
        # An errback's item after a network error comes with the Failure, not a response
        # (an AttributeError traceback for each such item).
        url = getattr(response, "url", None) or getattr(
            getattr(response, "request", None), "url", None)
        if url:
            self.recorder.item(host_of(url), False)

    def _is_duplicate(self, item: PageItem) -> bool:
        """A field on the item if the pipelines set one; else the index pipeline's
        ``webfarm/index/duplicates`` stat, which rose while this item was indexed (the
        total is exact; with items in flight together the host may be a neighbour's)."""
        mark = getattr(item, "duplicate_of", None)
        if mark is not None:
            return bool(mark)
        stats = self.crawler.stats
        now = float(stats.get_value("webfarm/index/duplicates", 0) or 0) if stats else 0.0
        if now > self._dupes_seen:
            self._dupes_seen += 1
            return True
        return False

    # -- threads ----------------------------------------------------------------------------

    def _flush(self) -> None:
        counts, maxes = self.recorder.drain()
        if not counts and not maxes:
            return
        try:
            self.store.write(counts, maxes)
        except REDIS_FAILURES as exc:
            self.recorder.restore(counts, maxes)
            if self._flush_failing_since is None:
                self._flush_failing_since = time.monotonic()
                logger.warning("Monitoring: cannot write figures to Redis (%s); keeping them "
                               "and retrying", exc)
            return
        if self._flush_failing_since is not None:
            logger.info("Monitoring: figures reach Redis again")
            self._flush_failing_since = None

    def _monitor(self) -> None:
        try:
            self.evaluator.tick()
        except REDIS_FAILURES as exc:
            if not self._monitor_failing:
                logger.warning("Monitoring: frontier samples and alert rules wait for Redis "
                               "(%s)", exc)
            self._monitor_failing = True
            return
        if self._monitor_failing:
            logger.info("Monitoring: frontier samples and alert rules run again")
            self._monitor_failing = False

    # -- prometheus -------------------------------------------------------------------------

    def _start_prometheus(self) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        from webfarm.monitor.prometheus import WorkerCollector

        registry = CollectorRegistry(auto_describe=False)
        registry.register(WorkerCollector(self.store.spider, self.recorder, self.store,
                                          self.top_hosts, self.evaluator.state_key))
        try:
            self._http, _ = start_http_server(self.prometheus_port, self.prometheus_addr,
                                              registry=registry)
        except OSError as exc:
            logger.error("WEBFARM_PROMETHEUS_PORT=%d: cannot listen on %s:%d (%s); give each "
                         "worker on a machine its own port, or 0 to turn the endpoint off",
                         self.prometheus_port, self.prometheus_addr, self.prometheus_port, exc)
            return
        logger.info("Prometheus metrics on http://%s:%d/metrics", self.prometheus_addr,
                    self.prometheus_port)
