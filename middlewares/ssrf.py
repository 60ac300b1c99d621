"""Refuse requests to loopback, private, link-local (cloud metadata), multicast and
reserved addresses: the SSRF guard.

Runs first among the downloader middlewares (priority 50), so nothing else
(robots.txt fetches, proxies, the browser) acts on a refused URL. The host is
judged by the addresses it resolves to (:class:`webfarm.netguard.NetGuard`),
resolved off the reactor and cached briefly. Redirects in webfarm go back
through the frontier and so through this middleware again: every hop is
checked. A refusal is logged, counted (``webfarm/ssrf/refused``) and raised as
:class:`~webfarm.exceptions.DeadLetter`, so it lands in the dead-letter queue
with its reason. A name that does not resolve is a network error, not a refusal:
``RetryLater`` (``webfarm/ssrf/unresolved``), dead-lettered after the retries.
``WEBFARM_ALLOWED_NETWORKS`` lists networks that are allowed anyway;
``WEBFARM_SSRF_GUARD=False`` turns the guard off.
"""

from __future__ import annotations

import logging

from scrapy import Request, Spider
from scrapy.crawler import Crawler
from scrapy.exceptions import CannotResolveHostError, NotConfigured
from scrapy.statscollectors import StatsCollector

from webfarm.exceptions import DeadLetter, RetryLater
from webfarm.netguard import UNRESOLVED, NetGuard, NetGuardError

logger = logging.getLogger(__name__)


class SSRFGuardMiddleware:
    def __init__(self, guard: NetGuard, stats: StatsCollector) -> None:
        if not guard.enabled:
            raise NotConfigured("WEBFARM_SSRF_GUARD is off")
        self.guard = guard
        self.stats = stats

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> SSRFGuardMiddleware:
        try:
            guard = NetGuard.from_settings(crawler.settings)
        except NetGuardError as exc:
            raise SystemExit(str(exc)) from None
        assert crawler.stats is not None
        return cls(guard, crawler.stats)

    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        reason = await self.guard.check_url(request.url)
        self.stats.inc_value("webfarm/ssrf/checked")
        if reason is None:
            return None
        if reason.startswith(UNRESOLVED):
            # Like Scrapy's own DNS errors: retried with backoff, dead-lettered in the end
            # (an errback gets the CannotResolveHostError Scrapy would give it).
            self.stats.inc_value("webfarm/ssrf/unresolved")
            raise RetryLater(f"ssrf: {reason}") from CannotResolveHostError(reason)
        self.stats.inc_value("webfarm/ssrf/refused")
        logger.warning("SSRF guard refused %s: %s", request.url[:300], reason)
        raise DeadLetter(f"ssrf: {reason}")
