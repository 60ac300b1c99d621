"""How a request the frontier leased ends: acknowledged, retried, or dead-lettered.

The frontier scheduler hands requests out under a lease (``meta[LEASE]``) and must
tell the frontier what became of each. Middlewares and pipelines say it by raising
(:mod:`webfarm.exceptions`) or through Scrapy's ``item_error`` and ``spider_error``
signals, never by talking to Redis; :class:`LeaseEnds` turns that into an
acknowledgement, a retry (exponential backoff with full jitter; after
``WEBFARM_RETRY_TIMES`` tries, the dead-letter queue) or a dead letter, queued on the
:class:`~webfarm.frontierlink.FrontierLink` with the next exchange.

It sees each result through the engine's download-output hook. As under Scrapy's
``RetryMiddleware``, a try the frontier will retry is kept from the spider, and the
last one hands it what Scrapy would (:func:`webfarm.outcomes.given_up`), so an
errback hears of a failure once, with the error itself. A part of the scheduler,
apart because it is its own concern: the scheduler keeps the leases in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.settings import BaseSettings
from twisted.internet.defer import succeed
from twisted.python.failure import Failure

from webfarm.batching import StorageUnavailable, quiet_storage_errors
from webfarm.exceptions import DeadLetter, GiveBack, ItemError, RetryLater, error_text
from webfarm.frontier import Frontier, backoff
from webfarm.outcomes import OutputHandler, given_up, retry_reason
from webfarm.queue import ATTEMPTS, LEASE, allowed_attempts, request_attempts

if TYPE_CHECKING:
    from webfarm.frontierlink import FrontierLink

logger = logging.getLogger(__name__)


class LeaseEnds:
    """Ends the leases of ``inflight`` (lease id -> request, the scheduler's) once their
    requests are done; ``inc`` counts a stat."""

    def __init__(self, settings: BaseSettings, inflight: dict[str, Request],
                 inc: Callable[[str], None], given_back: Callable[[], None] = lambda: None
                 ) -> None:
        quiet_storage_errors()  # an item its store refused: one line, see item_error
        self.retry_times = allowed_attempts(settings)
        self.backoff_base = settings.getfloat("WEBFARM_RETRY_BACKOFF_BASE", 2.0)
        self.backoff_max = settings.getfloat("WEBFARM_RETRY_BACKOFF_MAX", 600.0)
        #: a request whose store stayed down waits up to this long in the frontier
        self.storage_wait = max(1.0, min(self.backoff_max, settings.getfloat(
            "WEBFARM_STORAGE_RETRY_SECONDS", 300.0)))
        self.inflight = inflight
        self._inc = inc
        self._given_back = given_back  # the frontier holds a request again: ask it soon
        self._failed: dict[str, tuple[str, str]] = {}  # lease -> (kind, reason)
        self.link: FrontierLink | None = None
        self.frontier: Frontier | None = None

    def open(self, link: FrontierLink, frontier: Frontier) -> None:
        self.link, self.frontier = link, frontier

    def wrap(self, original: OutputHandler) -> OutputHandler:
        """The engine's handler of a download's result, ending the lease after it."""
        def handle_downloader_output(result: Any, request: Request) -> Any:
            shown = result
            if self._retried(result, request):
                # As Scrapy's RetryMiddleware: the spider (an errback) hears of a failure
                # once, when the request is given up, and of the error itself.
                if not self._last_try(request) or not _spends(result.value):
                    return self._finished_passthrough(succeed(None), request, result)
                shown = given_up(result, request)
            d = original(shown, request)
            d.addBoth(self._finished_passthrough, request, result)
            return d

        return handle_downloader_output

    def _finished_passthrough(self, passthrough: Any, request: Request, result: Any) -> Any:
        try:
            self.finished(request, result)
        except Exception:  # never break the engine's callback chain
            logger.exception("Error while finishing %s", request)
        return passthrough

    def finished(self, request: Request, result: Any) -> None:
        """Acknowledge, retry or dead-letter the lease of a request that is done."""
        lease = request.meta.get(LEASE)
        if not lease or self.inflight.pop(lease, None) is None:
            return
        assert self.link is not None
        failed = self._failed.pop(lease, None)
        exc = result.value if isinstance(result, Failure) else None
        if isinstance(exc, DeadLetter):
            self._dead(lease, request, exc.reason, exc.status, exc.error)
        elif isinstance(exc, RetryLater) and not exc.spend:  # never sent: no attempt spent
            self._again(lease, exc.delay or 0.0, exc.reason, "webfarm/frontier/waited")
        elif isinstance(exc, RetryLater):
            self._retry(lease, request, exc.reason, exc.delay, exc.status, exc.error,
                        retry_reason(exc))
        elif isinstance(exc, GiveBack):
            self.link.op("release", [lease])
            self._inc("webfarm/frontier/given_back")
            self._given_back()
        elif isinstance(exc, IgnoreRequest):
            self.link.acks.append(lease)  # robots.txt disallows it...: a normal end
            self._inc("webfarm/frontier/acked")
        elif exc is not None:
            error = error_text(exc)
            self._retry(lease, request, f"download failed: {error}", None, None, error,
                        retry_reason(exc))
        elif failed is not None and failed[0] == "spider":
            self._dead(lease, request, failed[1], None, None)
        elif failed is not None and failed[0] == "storage":
            # A store down past WEBFARM_STORAGE_RETRY_SECONDS: the page is fine, so no
            # attempt is spent (an S3 outage of 25 minutes dead-lettered every page the
            # worker fetched meanwhile, their retries spent on the store's failures).
            self._again(lease, backoff(0, self.storage_wait, self.storage_wait), failed[1],
                        "webfarm/frontier/storage_retried")
        elif failed is not None:
            self._retry(lease, request, failed[1], None, None, None)
        else:
            self.link.acks.append(lease)
            self._inc("webfarm/frontier/acked")

    def item_error(self, item: Any, response: Any, spider: Spider, failure: Failure) -> None:
        lease = getattr(response, "meta", {}).get(LEASE) if response is not None else None
        if not lease:
            return
        if isinstance(failure.value, ItemError):  # a refetch gives the same item: dead-letter
            self._failed[lease] = ("spider", f"item not stored: {failure.value}")
        elif isinstance(failure.value, StorageUnavailable):  # the store, not the page
            self._failed.setdefault(lease, ("storage", f"not stored: {failure.value}"))
        else:  # a pipeline that failed: fetch and store the page again later
            self._failed.setdefault(lease, ("item", f"item pipeline failed: {failure.value!r}"))

    def spider_error(self, failure: Failure, response: Any, spider: Spider) -> None:
        lease = getattr(response, "meta", {}).get(LEASE) if response is not None else None
        if lease:
            reason = f"spider callback failed: {type(failure.value).__name__}: {failure.value}"
            self._failed[lease] = ("spider", reason)

    def used_up(self, lease: str, request: Request) -> bool:
        """Whether a request was handed out with no attempt left, and so dead-lettered
        unfetched. A worker that fails a request's last try dead-letters it; one left here
        was spent by leases that expired: each worker holding it was killed or stalled
        (a page that kills its worker was handed out for ever), or WEBFARM_RETRY_TIMES
        was lowered since."""
        attempts = int(request.meta.get(ATTEMPTS, 0))
        allowed = request_attempts(request, self.retry_times)
        if attempts < allowed:
            return False
        reason = (f"gave up after {attempts} attempts, the last ended by its lease "
                  f"expiring: the worker holding it was killed or stalled past "
                  f"WEBFARM_LEASE_SECONDS ({allowed} allowed)")
        self._dead(lease, request, reason, None, None, tried=False)
        self._inc("webfarm/frontier/dead_unfetched")
        return True

    def _again(self, lease: str, delay: float, reason: str, stat: str) -> None:
        """Back to the frontier in ``delay`` seconds, spending no attempt; counted in
        ``stat``."""
        self._inc(stat)
        assert self.link is not None and self.frontier is not None
        self.link.op("retry", self.frontier._retry_args(lease, delay, reason, spend=False))

    def _retry(self, lease: str, request: Request, reason: str, delay: float | None,
               status: int | None, error: str | None, scrapys: str | None = None) -> None:
        """``scrapys``: a download's retry, counted in Scrapy's ``retry/*`` stats as well
        (what monitoring built for Scrapy reads) under that reason."""
        attempts = int(request.meta.get(ATTEMPTS, 0)) + 1
        if self._last_try(request):
            if scrapys is not None:
                self._inc("retry/max_reached")
            self._dead(lease, request, f"gave up after {attempts} attempts: {reason}", status,
                       error)
            return
        if scrapys is not None:
            self._inc("retry/count")
            self._inc(f"retry/reason_count/{scrapys}")
        wait = delay if delay is not None else backoff(attempts - 1, self.backoff_base,
                                                       self.backoff_max)
        logger.debug("Retrying %s in %.1fs (attempt %d): %s", request, wait, attempts, reason)
        self._inc("webfarm/frontier/retried")
        assert self.link is not None and self.frontier is not None
        self.link.op("retry", self.frontier._retry_args(lease, wait, reason))

    def _retried(self, result: Any, request: Request) -> bool:
        """Whether :meth:`finished` retries this lease for ``result``: a ``RetryLater``, or
        an error that is no ``IgnoreRequest`` (robots.txt's disallow: a normal end;
        offsite gives a leased request back as ``RetryLater``)."""
        if not isinstance(result, Failure) or request.meta.get(LEASE) not in self.inflight:
            return False
        return isinstance(result.value, RetryLater) or not isinstance(result.value,
                                                                       IgnoreRequest)

    def _last_try(self, request: Request) -> bool:
        return int(request.meta.get(ATTEMPTS, 0)) + 1 >= request_attempts(request,
                                                                         self.retry_times)

    def _dead(self, lease: str, request: Request, reason: str, status: int | None,
              error: str | None, tried: bool = True) -> None:
        """``tried``: False for a hand-out dead-lettered unfetched (no attempt spent)."""
        proxy = request.meta.get("webfarm_proxy")  # the rotation's id: never a secret
        if proxy and "proxy" not in reason:  # an operator first asks which one
            reason = f"{reason} (last through proxy {proxy})"
        logger.warning("Dead-lettered %s: %s", request, reason)
        self._inc("webfarm/frontier/dead")
        assert self.link is not None and self.frontier is not None
        self.link.op("dead", self.frontier._dead_args(lease, reason, status=status, error=error,
                                                      tried=tried))


def _spends(exc: BaseException) -> bool:
    """Whether ``exc`` costs its request an attempt: all but a ``RetryLater`` of a request
    that was never sent."""
    return not isinstance(exc, RetryLater) or exc.spend
