"""How a request the frontier does not hold ends: retried and said, as in Scrapy.

Webfarm's middlewares end a request by handing it to the frontier: ``RetryLater``
(back off, fetch again) or ``DeadLetter`` (give up, with a reason). Both are
``IgnoreRequest``, which Scrapy drops without a word, because the frontier
scheduler, holding the request's lease, acts on them. A request with no lease has
no frontier behind it: every request of ``scrapy fetch``, ``parse``, ``shell``,
``view`` and ``check`` (Scrapy's own scheduler) and a crawl's ``webfarm_local``
ones (a login). Such a request vanished: ``scrapy fetch`` of a page answering 503,
or of one over ``DOWNLOAD_MAXSIZE``, printed nothing and said nothing, and a login that
met a 503 ended there: its callback never ran, and nothing in the log said why.

:class:`UnqueuedOutcomes` gives those requests Scrapy's behaviour. A
``RetryLater`` is retried at once with :func:`retry_here` (Scrapy's
``get_retry_request``: ``retry_times``, ``max_retry_times``, ``RETRY_PRIORITY_ADJUST``,
"Gave up retrying" at ``RETRY_GIVE_UP_LOG_LEVEL``), up to the tries the frontier
would give (``WEBFARM_RETRY_TIMES``); its ``delay`` is not waited, as Scrapy waits
none. A ``DeadLetter`` is logged at ERROR with its reason. The frontier's own
requests are left to the scheduler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from scrapy import Request, signals
from scrapy.crawler import Crawler
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.utils.python import global_object_name
from scrapy.utils.response import response_status_message
from twisted.python.failure import Failure

from webfarm.exceptions import DeadLetter, RetryLater
from webfarm.queue import LEASE, allowed_attempts, request_attempts

logger = logging.getLogger(__name__)

#: ``fn(result, request)`` in place of the engine's handler of a download's result
OutputHandler = Callable[[Any, Request], Any]


def hook_downloader_output(crawler: Crawler, wrap: Callable[[OutputHandler], OutputHandler],
                           who: str) -> None:
    """Put ``wrap(original)`` in place of the engine's ``_handle_downloader_output``: the
    one place that sees how every scheduled request ended (a response, a request to
    schedule, or a failure), including the ``IgnoreRequest`` ones Scrapy says nothing of."""
    engine = crawler.engine
    original = getattr(engine, "_handle_downloader_output", None)
    if original is None:  # pragma: no cover - guards a Scrapy upgrade
        raise RuntimeError(f"this Scrapy has no engine._handle_downloader_output; {who} "
                           "needs updating for it")
    engine._handle_downloader_output = wrap(original)  # type: ignore[union-attr]


def retry_here(crawler: Crawler, request: Request, reason: str | Exception,
               attempts: int) -> Request | None:
    """The request again, as Scrapy's ``RetryMiddleware`` makes it, or None (said at
    ``RETRY_GIVE_UP_LOG_LEVEL``) after ``attempts`` tries, or the request's own
    ``max_retry_times`` + 1."""
    assert crawler.spider is not None
    return get_retry_request(request, spider=crawler.spider, reason=reason,
                             max_retry_times=request_attempts(request, attempts) - 1)


def retry_reason(exc: BaseException) -> str | None:
    """How Scrapy's ``RetryMiddleware`` names a retry in ``retry/reason_count/…``: the
    status line (``503 Service Unavailable``), else the error's class (for a
    ``RetryLater``, the error it was raised from). None for a ``RetryLater`` of neither
    (robots.txt's ``Crawl-delay``, a host's ``Retry-After`` holding requests back): a
    wait for politeness, which Scrapy would not count as a retry."""
    if isinstance(exc, RetryLater):
        if exc.status:
            return response_status_message(exc.status)
        if not isinstance(exc.__cause__, Exception):
            return None
        exc = exc.__cause__
    return global_object_name(type(exc))


def given_up(result: Failure, request: Request) -> Any:
    """What Scrapy hands the spider once a request's retries ran out: the last response
    of a ``RetryLater`` (a 503: the callback if it takes that status, else ``HttpError``
    to the errback), the error it was raised from (a refused connection) to an errback,
    or ``result``. Without an errback that error stays quiet: the dead letter says it in
    one line, where Scrapy's "Error downloading" would add a traceback."""
    exc = result.value
    if isinstance(exc, RetryLater):
        if exc.response is not None:
            exc.response.request = request
            return exc.response
        if isinstance(exc.__cause__, Exception) and request.errback is not None:
            return Failure(exc.__cause__)
    return result


class UnqueuedOutcomes:
    """Retry or say the frontier's outcomes of requests that have no lease."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self.retry_enabled = crawler.settings.getbool("RETRY_ENABLED")
        self.attempts = allowed_attempts(crawler.settings)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> UnqueuedOutcomes:
        ext = cls(crawler)
        crawler.signals.connect(ext.spider_opened, signal=signals.spider_opened)
        return ext

    def spider_opened(self, spider: Any) -> None:
        hook_downloader_output(self.crawler, self._wrap, "webfarm.outcomes")

    def _wrap(self, original: OutputHandler) -> OutputHandler:
        def handle_downloader_output(result: Any, request: Request) -> Any:
            return original(self.outcome(result, request), request)

        return handle_downloader_output

    def outcome(self, result: Any, request: Request) -> Any:
        """``result``, or the request to fetch again in its place (its retry stats under
        ``webfarm.exceptions.RetryLater``, the reason in the log)."""
        if not isinstance(result, Failure) or LEASE in request.meta:
            return result
        exc = result.value
        if isinstance(exc, RetryLater):
            if self.retry_enabled and not request.meta.get("dont_retry"):
                return (retry_here(self.crawler, request, exc, self.attempts)
                        or given_up(result, request))
            self._gave_up(request, exc.reason)
        elif isinstance(exc, DeadLetter):
            self._gave_up(request, exc.reason)
        return result

    def _gave_up(self, request: Request, reason: str) -> None:
        logger.error("Gave up on %s: %s", request, reason, extra={"spider": self.crawler.spider})
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value("webfarm/unqueued/gave_up")
