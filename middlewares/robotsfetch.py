"""Fetching one robots.txt through the crawl's own downloader, redirects followed by hand.

The fetching half of :mod:`middlewares.robots` (the rules are :mod:`webfarm.robots`). The
file goes through every downloader middleware like a page (the SSRF guard sees each
redirect hop, proxies carry it), but never to the browser, never retried by Scrapy and
never redirected by Scrapy: RFC 9309 allows 5 hops, and what each answer means is
:func:`webfarm.robots.classify`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from scrapy import Request
from scrapy.exceptions import CannotResolveHostError, DownloadConnectionRefusedError
from scrapy.http import Response
from scrapy.http.request import NO_CALLBACK
from twisted.internet import error as txerror

from middlewares.retry import parse_retry_after
from webfarm.exceptions import DeadLetter, RetryLater, Unreadable
from webfarm.proxies import UNPROVEN
from webfarm.robots import MAX_BYTES, MAX_REDIRECTS, Fetched, classify

if TYPE_CHECKING:
    from scrapy.core.engine import ExecutionEngine

logger = logging.getLogger(__name__)

META = "webfarm_robots"  # marks our own robots.txt requests
#: the host does not answer at all: nothing listens, or its name does not resolve
ABSENT_ERRORS: tuple[type[BaseException], ...] = (
    DownloadConnectionRefusedError, CannotResolveHostError, txerror.ConnectionRefusedError,
    txerror.DNSLookupError, txerror.NoRouteError)


async def fetch(engine: ExecutionEngine, origin: str, priority: int,
                inc: Callable[[str], None]) -> Fetched:
    """``origin``'s robots.txt, as :class:`~webfarm.robots.Fetched`; ``inc`` counts stats."""
    url = f"{origin}/robots.txt"
    for hop in range(MAX_REDIRECTS + 1):
        request = Request(
            url, priority=priority, callback=NO_CALLBACK, dont_filter=True,
            meta={META: True, "dont_obey_robotstxt": True, "dont_redirect": True,
                  "dont_retry": True, "handle_httpstatus_all": True, "allow_offsite": True,
                  "download_maxsize": 8 * MAX_BYTES,
                  "render": "http"},  # plain HTTP: never the browser rung
        )
        try:
            response: Response = await engine.download_async(request)
        except RetryLater as exc:  # e.g. the host is deferred by a Retry-After
            return Fetched("unreachable", error=exc.reason, retry_after=exc.delay)
        except Unreadable as exc:  # too large, undecodable: the file cannot be read
            return Fetched("unreachable", error=f"{url}: {exc.reason}")
        except DeadLetter as exc:
            if hop == 0:  # the origin itself is refused (SSRF guard, ...): so are its pages
                return Fetched("refused", error=exc.reason, dead=exc)
            return Fetched("unreachable", error=f"redirect to {url} refused: {exc.reason}")
        except Exception as exc:
            logger.info("robots.txt %s unreachable: %s: %s", url, type(exc).__name__, exc)
            return Fetched("unreachable", error=f"{type(exc).__name__}: {exc}",
                           absent=isinstance(exc, ABSENT_ERRORS))
        inc(f"webfarm/robots/status/{response.status}")
        kind = classify(response.status)
        if kind == "redirect":
            location = response.headers.get(b"Location")
            target = urljoin(response.url, location.decode("latin-1")) if location else ""
            if urlsplit(target).scheme not in ("http", "https"):
                return Fetched("unreachable", response.status,
                               error=f"redirect to {target!r} cannot be followed")
            url = target
            continue
        if kind == "parse":
            if len(response.body) > MAX_BYTES or "download_stopped" in response.flags:
                inc("webfarm/robots/truncated")
            return Fetched("parse", response.status, response.body[:MAX_BYTES])
        if kind == "allow":
            # Refused through every proxy tried, none known to reach the host: maybe
            # a proxy's answer, so not the site's for a day (webfarm.proxies).
            unproven = UNPROVEN in response.flags
            return Fetched("allow", response.status, brief=unproven,
                           error="refused through the proxies" if unproven else "")
        return Fetched("unreachable", response.status, error=f"HTTP {response.status}",
                       retry_after=parse_retry_after(response.headers.get(b"Retry-After")))
    return Fetched("allow", error=f"more than {MAX_REDIRECTS} redirects (RFC 9309 2.3.1.2)")
