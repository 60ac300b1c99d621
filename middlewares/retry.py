"""Retries through the frontier instead of inside the worker, and ``Retry-After`` honoured.

Scrapy's ``RetryMiddleware`` re-schedules a failed request at once, from the
worker that failed, with no backoff. Here a retryable status or network error
becomes :class:`~webfarm.exceptions.RetryLater`; the frontier scheduler puts the
request in the delayed set with exponential backoff and full jitter, and after
``WEBFARM_RETRY_TIMES`` attempts moves it to the dead-letter queue with its
last status or error. Any worker may pick the retry up.

Scrapy ignores ``Retry-After``. Here, on 429 and 503, a valid one (seconds or an
HTTP date, capped at ``WEBFARM_RETRY_AFTER_MAX``) defers the whole host: a
``host_defer`` signal makes the frontier hand out none of its requests before
then (every worker), this worker holds back those it already took, and the
request itself comes back after exactly that wait instead of the backoff. A
missing or garbage value means the usual backoff.

Most rate limiters send no ``Retry-After``, and the host's delay stayed as it was: every
worker went on at the same pace, about every other request was refused and retried, and
pages ran out of attempts (4 dead letters of 15 pages at a 0.2 s delay against a
limiter's 0.7 s). Every 429 now doubles the host's delay for every worker (a
``host_limited`` signal; at least twice ``WEBFARM_HOST_DELAY`` and 0.5 s, at most
``AUTOTHROTTLE_MAX_DELAY``), once per delay, and comes down by itself, 0.05 s a
second (the frontier's ``limit`` op): a limiter is found in a few
refusals and not hit at once again, as TCP backs off (``WEBFARM_RATE_LIMIT_BACKOFF``).

Uses Scrapy's own ``RETRY_ENABLED``, ``RETRY_HTTP_CODES``, ``RETRY_EXCEPTIONS``
and the ``dont_retry`` meta key; ``WEBFARM_RETRY_AFTER`` switches the deferral.
Scrapy's ``RETRY_TIMES`` and ``max_retry_times`` meta key are counted by the
scheduler, which decides when to give up (:func:`webfarm.queue.allowed_attempts`).

A request the frontier does not hold (no lease: ``scrapy fetch``/``parse``/``shell``,
a ``webfarm_local`` login) is retried here as Scrapy's ``RetryMiddleware`` retries it,
at once, up to the same number of tries; then a status is passed on (``scrapy fetch``
prints the 503 it got) and a network error is Scrapy's "Error downloading". It is not
held back by a host's ``Retry-After``: no frontier would take it back.
"""

from __future__ import annotations

import logging
import math
import re
import time
from datetime import timezone
from email.utils import parsedate_to_datetime

from scrapy import Request, Spider
from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.utils.misc import load_object
from scrapy.utils.response import response_status_message

from webfarm import signals as wf_signals
from webfarm.exceptions import RetryLater, error_text
from webfarm.outcomes import retry_here
from webfarm.queue import LEASE, allowed_attempts, host_delay
from webfarm.urls import host_of

logger = logging.getLogger(__name__)

RETRY_AFTER_STATUSES = frozenset({429, 503})
LIMIT_FLOOR = 0.5  # seconds: the least delay a 429 gives a host, whatever the default
_SECONDS = re.compile(r"\d+(?:\.\d{1,6})?")  # any length: a huge wait is capped, not ignored


def parse_retry_after(value: bytes | str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` value (RFC 9110 10.2.3), None if unusable.

    ``delay-seconds`` or an HTTP date (a date in the past means 0). Anything else —
    negative numbers, words, absurd dates — is None, so the caller backs off as usual.
    """
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    text = text.strip()
    if not text:
        return None
    if _SECONDS.fullmatch(text):
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    try:
        seconds = when.timestamp() - (time.time() if now is None else now)
    except (OverflowError, OSError, ValueError):
        return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


class FrontierRetryMiddleware:
    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        self.retry_enabled = settings.getbool("RETRY_ENABLED")
        self.retry_after = settings.getbool("WEBFARM_RETRY_AFTER", True)
        self.rate_limit = settings.getbool("WEBFARM_RATE_LIMIT_BACKOFF", True)
        self.limit_floor = max(2 * host_delay(settings), LIMIT_FLOOR)
        self.limit_max = settings.getfloat("AUTOTHROTTLE_MAX_DELAY", 60.0)
        if not self.retry_enabled and not self.retry_after and not self.rate_limit:
            raise NotConfigured
        self.crawler = crawler
        self.stats = crawler.stats
        self.retry_after_max = settings.getfloat("WEBFARM_RETRY_AFTER_MAX", 3600.0)
        self.retry_codes = {int(c) for c in settings.getlist("RETRY_HTTP_CODES")}
        self.exceptions = tuple(
            load_object(e) if isinstance(e, str) else e
            for e in settings.getlist("RETRY_EXCEPTIONS")
        )
        self.attempts = allowed_attempts(settings)
        self._deferred: dict[str, float] = {}  # host -> monotonic end of its deferral

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FrontierRetryMiddleware:
        return cls(crawler)

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        """Hold back requests this worker took before their host said "Retry-After"."""
        if not self._deferred or LEASE not in request.meta:
            return None
        host = host_of(request.url)
        wait = self._deferred.get(host, 0.0) - time.monotonic()
        if wait <= 0:
            self._deferred.pop(host, None)
            return None
        self._inc("webfarm/retry_after/held_back")
        raise RetryLater(f"host deferred by Retry-After for {wait:.0f}s more", delay=wait)

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Response:
        wait = None
        if response.status == 429 and self.rate_limit:
            self._limit_host(request)
        if self.retry_after and response.status in RETRY_AFTER_STATUSES:
            wait = self._defer_host(request, response)
        if (not self.retry_enabled or request.meta.get("dont_retry")
                or response.status not in self.retry_codes):
            return response
        if LEASE not in request.meta:  # no frontier holds it: retried here, as in Scrapy
            reason = response_status_message(response.status)
            return retry_here(self.crawler, request, reason, self.attempts) or response
        if wait:
            raise RetryLater(f"HTTP {response.status}, Retry-After {round(wait, 1):g}s",
                             delay=wait, status=response.status, response=response)
        raise RetryLater(f"HTTP {response.status}", status=response.status, response=response)

    def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> Request | None:
        if (self.retry_enabled and isinstance(exception, self.exceptions)
                and not request.meta.get("dont_retry")):
            if LEASE not in request.meta:  # None: Scrapy's "Error downloading" after
                return retry_here(self.crawler, request, exception, self.attempts)
            error = error_text(exception)
            raise RetryLater(f"network error: {error}", error=error) from exception
        return None

    def _limit_host(self, request: Request) -> None:
        host = host_of(request.url)
        self._inc("webfarm/rate_limit/refused")
        logger.info("%s answered 429 (rate limited): the frontier doubles its delay for "
                    "every worker, once a delay, up to AUTOTHROTTLE_MAX_DELAY=%gs, and it "
                    "comes down by itself; `scrapy frontier` shows it", host, self.limit_max)
        self.crawler.signals.send_catch_log(wf_signals.host_limited, host=host,
                                            floor=self.limit_floor, maximum=self.limit_max)

    def _defer_host(self, request: Request, response: Response) -> float | None:
        raw = response.headers.get(b"Retry-After")
        if raw is None:
            return None
        seconds = parse_retry_after(raw)
        host = host_of(request.url)
        if seconds is None:
            logger.info("Ignoring unusable Retry-After %r from %s",
                        raw[:60].decode("latin-1"), host)
            self._inc("webfarm/retry_after/invalid")
            return None
        if seconds > self.retry_after_max:
            logger.warning("%s asks to wait %.0fs (Retry-After); capped at "
                           "WEBFARM_RETRY_AFTER_MAX=%.0fs", host, seconds, self.retry_after_max)
            self._inc("webfarm/retry_after/capped")
            seconds = self.retry_after_max
        if seconds <= 0:
            return None
        logger.info("%s answered %d with Retry-After: no request to it for %.1fs", host,
                    response.status, seconds)
        self._inc("webfarm/retry_after/deferred")
        if len(self._deferred) > 10_000:
            now = time.monotonic()
            self._deferred = {h: t for h, t in self._deferred.items() if t > now}
        self._deferred[host] = max(self._deferred.get(host, 0.0), time.monotonic() + seconds)
        self.crawler.signals.send_catch_log(wf_signals.host_defer, host=host, seconds=seconds,
                                            source="retry-after")
        return seconds

    def _inc(self, key: str) -> None:
        if self.stats is not None:
            self.stats.inc_value(key)
