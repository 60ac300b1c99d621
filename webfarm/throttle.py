"""AutoThrottle's latency rule, per host, shared by every worker.

Scrapy's AutoThrottle slows one worker's download slot; ten workers would
still hit a slow site ten times as hard. Here each response's latency moves
the host's delay by the same rule (target = latency / target concurrency;
new = mean of old and target; never below the base delay or above the maximum;
errors never lower it; browser and fetch-API responses are skipped, since their
time is mostly rendering, not the server) and the result is sent as a ``host_delay`` signal, which
the frontier scheduler stores in Redis where it gates every worker.

Scrapy's own ``AUTOTHROTTLE_ENABLED``, common in Scrapy projects, asks for this
rule: :class:`WorkerAutoThrottle` (in Scrapy's place) then leaves it to the shared
one, and says so, instead of adding a per-worker copy that starts each host at
``AUTOTHROTTLE_START_DELAY`` (5 s) on every worker (measured: a 1.8 s crawl of 70
pages took 12 s).

A host's delay here is kept for the ``WEBFARM_HOST_MEMORY`` hosts that answered last
(:mod:`webfarm.hostmemory`); a host met again after that starts from the base delay, as
on a new worker, and the frontier keeps what every worker learned meanwhile.
"""

from __future__ import annotations

import logging

from scrapy import Request, Spider, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured
from scrapy.extensions.throttle import AutoThrottle
from scrapy.http import Response
from scrapy.settings import BaseSettings

from webfarm import signals as wf_signals
from webfarm.hostmemory import RecentHosts, host_memory_size
from webfarm.queue import host_delay
from webfarm.urls import host_of

logger = logging.getLogger(__name__)


class HostThrottle:
    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        if not settings.getbool("WEBFARM_AUTOTHROTTLE", True):
            raise NotConfigured
        self.crawler = crawler
        self.min_delay = host_delay(settings)
        self.max_delay = settings.getfloat("AUTOTHROTTLE_MAX_DELAY", 60.0)
        self.target = settings.getfloat("AUTOTHROTTLE_TARGET_CONCURRENCY", 1.0)
        if self.target <= 0:
            raise NotConfigured("AUTOTHROTTLE_TARGET_CONCURRENCY must be > 0")
        self.delays: RecentHosts[float] = RecentHosts(host_memory_size(settings))
        self.max_seen = 0.0  # the largest delay the rule gave a host: the stat
        crawler.signals.connect(self.response_received, signal=signals.response_received)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> HostThrottle:
        return cls(crawler)

    def response_received(self, response: Response, request: Request, spider: Spider) -> None:
        latency = request.meta.get("download_latency")
        if latency is None or request.meta.get("autothrottle_dont_adjust_delay"):
            return
        if request.meta.get("playwright") or {"playwright", "fetch-api"} & set(response.flags):
            return  # render time, not server latency
        host = host_of(request.url)
        first = host not in self.delays
        old = self.delays.get(host, self.min_delay)
        target = latency / self.target
        new = max(target, (old + target) / 2.0)
        new = min(max(self.min_delay, new), self.max_delay)
        if response.status != 200 and new <= old:
            return  # an error page is fast; it must not speed the crawl up
        self.delays[host] = new
        if first or abs(new - old) > 0.05 * old:
            self.crawler.signals.send_catch_log(
                wf_signals.host_delay, host=host, delay=new, source=wf_signals.LEARNED
            )
        if new > self.max_seen and self.crawler.stats is not None:
            # A high-water mark: the largest delay held now would read every host's.
            self.max_seen = new
            self.crawler.stats.set_value("webfarm/throttle/max_delay", new)

    def spider_closed(self, spider: Spider) -> None:
        if self.delays.forgotten and self.crawler.stats is not None:
            self.crawler.stats.set_value("webfarm/throttle/hosts_forgotten",
                                         self.delays.forgotten)


def say_download_delay(settings: BaseSettings) -> None:
    """A ``DOWNLOAD_DELAY`` (a spider's ``custom_settings``, the Scrapy habit) shorter than
    ``WEBFARM_HOST_DELAY`` changes nothing, since the longer one holds: a migrated spider
    asking for 0.05 s took 66 s where Scrapy took 2, with no word why."""
    mine = settings.getfloat("DOWNLOAD_DELAY")
    shared = settings.getfloat("WEBFARM_HOST_DELAY", 1.0)
    if 0 < mine < shared:
        logger.info("DOWNLOAD_DELAY=%g is below WEBFARM_HOST_DELAY=%g, the delay every worker "
                    "keeps between two requests to a host, which holds (DOWNLOAD_DELAY counts "
                    "when longer); set WEBFARM_HOST_DELAY for a site you may crawl faster",
                    mine, shared)


class WorkerAutoThrottle(AutoThrottle):
    """Scrapy's AutoThrottle, for ``AUTOTHROTTLE_ENABLED`` with ``WEBFARM_AUTOTHROTTLE``
    off only: with it on, :class:`HostThrottle` applies the same rule to each host for
    every worker at once (``AUTOTHROTTLE_TARGET_CONCURRENCY``, ``AUTOTHROTTLE_MAX_DELAY``)."""

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        say_download_delay(settings)  # an extension every crawl builds: said once, at start
        if settings.getbool("AUTOTHROTTLE_ENABLED") and \
                settings.getbool("WEBFARM_AUTOTHROTTLE", True):
            logger.info("AUTOTHROTTLE_ENABLED: webfarm's per-host latency rule "
                        "(WEBFARM_AUTOTHROTTLE) already adapts each host's delay, for every "
                        "worker at once; Scrapy's per-worker AutoThrottle stays off "
                        "(WEBFARM_AUTOTHROTTLE=False uses it instead)")
            raise NotConfigured
        super().__init__(crawler)
