"""Outcomes a middleware or pipeline hands to the frontier instead of acting itself.

Middlewares never talk to Redis about a request's fate: they raise one of these
and the frontier scheduler, which holds the request's lease, re-queues it with
backoff or moves it to the dead-letter queue. ``DeadLetter`` and ``RetryLater``
subclass ``IgnoreRequest``, so Scrapy treats them as a quiet end of that request;
an ``ItemError`` from an item pipeline dead-letters the item's page.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.exceptions import IgnoreRequest

if TYPE_CHECKING:
    from scrapy.http import Response


class DeadLetter(IgnoreRequest):
    """Give up on this request for good; it goes to the dead-letter queue with ``reason``."""

    def __init__(self, reason: str, *, status: int | None = None, error: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.error = error


class Unreadable(DeadLetter):
    """A response the worker cannot read (a body over ``DOWNLOAD_MAXSIZE``, inflated or
    not, one its ``Content-Encoding`` does not decode, headers without end): a page is
    dead-lettered; a robots.txt is "unreachable" (RFC 9309), its host's pages held, not
    dead-lettered with a reason about another file."""


class RetryLater(IgnoreRequest):
    """Fetch this request again later, through the frontier.

    ``delay`` None means: exponential backoff with full jitter from the attempt
    count. After ``WEBFARM_RETRY_TIMES`` attempts the request is dead-lettered, and the
    spider gets what Scrapy would hand it then: ``response`` (a 503), or the error this
    was raised ``from`` (a refused connection), else this. ``spend=False``: the request
    was never sent (no proxy to send it through), so it spends no attempt and is never
    given up for it; it comes back after ``delay``.
    """

    def __init__(
        self, reason: str, *, delay: float | None = None, status: int | None = None,
        error: str | None = None, response: Response | None = None, spend: bool = True,
    ):
        super().__init__(reason)
        self.reason = reason
        self.delay = delay
        self.spend = spend
        self.status = status
        self.error = error
        self.response = response


class GiveBack(IgnoreRequest):
    """Put this leased request back in its host's queue as it was (no attempt spent), to be
    handed out again in its turn: it was popped in a burst the host's delay must space."""


class ItemError(ValueError):
    """An item that cannot be stored as declared; the message says what to fix. Fetching
    the page again gives the same item, so a crawl dead-letters its page at once (it can
    be requeued with ``scrapy dlq SPIDER --requeue`` once the spider or collection is fixed)."""


def error_text(exc: BaseException) -> str:
    """``Type: message`` of a download error, as dead letters and retries record it.

    Twisted's ``ResponseFailed`` (which Scrapy's ``DownloadFailedError`` wraps) holds a
    list of Failures, whose repr was the whole message: ``[<twisted.python.failure.Failure
    twisted.web._newclient.ParseError: ...>]``. Each of those is its own ``Type: message``
    here. Playwright's errors carry a "Call log:" of many lines after their message:
    only the message is kept (a dead letter is one line in `scrapy dlq`)."""
    reasons = getattr(exc, "reasons", None) or getattr(exc.__cause__, "reasons", None)
    if isinstance(reasons, list):
        inner = "; ".join(f"{type(r.value).__name__}: {r.value}" for r in reasons
                          if isinstance(getattr(r, "value", None), BaseException))
        if inner:
            return f"{type(exc).__name__}: {inner}"
    message = str(exc).split("\nCall log:", 1)[0].strip()
    return f"{type(exc).__name__}: {message}"
