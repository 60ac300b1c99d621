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

from middlewares.limits import INFLATE_MAX
from middlewares.retry import parse_retry_after
from webfarm.exceptions import DeadLetter, RetryLater, Unreadable
from webfarm.proxies import UNPROVEN
from webfarm.robots import MAX_BYTES, MAX_REDIRECTS, META, Fetched, classify
from webfarm.urls import unfetchable

if TYPE_CHECKING:
    from scrapy.core.engine import ExecutionEngine

logger = logging.getLogger(__name__)

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
                  # No limit on the wire: the robots middleware stops the download past
                  # MAX_BYTES and parses what came. A declared Content-Length over a limit
                  # here cancelled it before a byte, the file was "unreachable" and its
                  # host held for good. Inflating stays bounded (limits.INFLATE_MAX).
                  "download_maxsize": 0, INFLATE_MAX: 8 * MAX_BYTES,
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
            # A redirect the guard refuses (to a private address): so are the pages, with
            # its reason. It was an outage, retried and holding the host for 30 days.
            why = f"robots.txt redirects to {url}, refused: {exc.reason}"
            return Fetched("refused", error=why,
                           dead=DeadLetter(why, status=exc.status, error=exc.error))
        except Exception as exc:
            logger.info("robots.txt %s unreachable: %s: %s", url, type(exc).__name__, exc)
            return Fetched("unreachable", error=f"{type(exc).__name__}: {exc}",
                           absent=isinstance(exc, ABSENT_ERRORS))
        inc(f"webfarm/robots/status/{response.status}")
        kind = classify(response.status)
        if kind == "redirect":
            location = response.headers.get(b"Location")
            target = urljoin(response.url, location.decode("latin-1")) if location else ""
            why = ("its scheme is not http(s)" if urlsplit(target).scheme not in
                   ("http", "https") else unfetchable(target))
            if why:
                logger.info("robots.txt %s redirects to %r, which cannot be followed (%s): "
                            "unavailable, so everything is allowed (RFC 9309 2.3.1.2)", url,
                            target, why)
                # A redirect no crawler can follow (ftp:, a port past 65535): "unavailable",
                # as more than 5 redirects are (RFC 9309 2.3.1.2). It was an outage for 30
                # days, said as "HTTP 301", or a traceback at every try for a bad port.
                return Fetched("allow", response.status,
                               error=f"redirect to {target!r} cannot be followed ({why})")
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
