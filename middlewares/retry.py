"""Retries through the frontier instead of inside the worker.

Scrapy's ``RetryMiddleware`` re-schedules a failed request at once, from the
worker that failed, with no backoff. Here a retryable status or network error
becomes :class:`~webfarm.exceptions.RetryLater`; the frontier scheduler puts the
request in the delayed set with exponential backoff and full jitter, and after
``WEBFARM_RETRY_TIMES`` attempts moves it to the dead-letter queue with its
last status or error. Any worker may pick the retry up.

Uses Scrapy's own ``RETRY_ENABLED``, ``RETRY_HTTP_CODES``, ``RETRY_EXCEPTIONS``
and the ``dont_retry`` meta key.
"""

from __future__ import annotations

from scrapy import Request, Spider
from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object

from webfarm.exceptions import RetryLater


class FrontierRetryMiddleware:
    def __init__(self, settings: BaseSettings) -> None:
        if not settings.getbool("RETRY_ENABLED"):
            raise NotConfigured
        self.retry_codes = {int(c) for c in settings.getlist("RETRY_HTTP_CODES")}
        self.exceptions = tuple(
            load_object(e) if isinstance(e, str) else e
            for e in settings.getlist("RETRY_EXCEPTIONS")
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FrontierRetryMiddleware:
        return cls(crawler.settings)

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Response:
        if request.meta.get("dont_retry") or response.status not in self.retry_codes:
            return response
        raise RetryLater(f"HTTP {response.status}", status=response.status)

    def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> None:
        if isinstance(exception, self.exceptions) and not request.meta.get("dont_retry"):
            error = f"{type(exception).__name__}: {exception}"
            raise RetryLater(f"network error: {error}", error=error)
        return None
