"""Hostile servers end in the dead-letter queue with a reason, not in silence or a retry loop.

Scrapy already bounds the work (``DOWNLOAD_MAXSIZE`` on the wire and during
decompression, ``REDIRECT_MAX_TIMES``, ``DOWNLOAD_TIMEOUT``), but reports the
outcome in ways the frontier cannot use: an oversized body is a bare
``DownloadCancelledError`` (which the frontier would retry five times), a
decompression bomb and a redirect chain past the limit are plain
``IgnoreRequest`` (acknowledged as if all went well), a redirect loop
``A → B → A`` silently ends when the frontier's dupefilter drops the second
``A``, and a redirect to a URL the downloader cannot fetch (a bad port, a
``user:password@``) failed at each of the frontier's tries. These drop-in
subclasses of Scrapy's middlewares (same priorities, same settings) raise
:class:`~webfarm.exceptions.DeadLetter` instead, so such a request is
dead-lettered at once with its reason and counted under ``webfarm/limits/``.
Dripping servers hit ``DOWNLOAD_TIMEOUT`` and truncated bodies
``DOWNLOAD_FAIL_ON_DATALOSS``; both can be a passing network fault, so they stay
with the retry policy (backoff, then the dead-letter queue).

Two spider middlewares belong here too: :class:`LinkEncodingMiddleware` (a UTF-16
page's links) and :class:`UrlLengthMiddleware` (Scrapy's, its log bounded).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request, Spider
from scrapy.crawler import Crawler
from scrapy.downloadermiddlewares import httpcompression, redirect
from scrapy.exceptions import DownloadCancelledError, IgnoreRequest, NotConfigured
from scrapy.http import Response, TextResponse
from scrapy.spidermiddlewares import urllength
from scrapy.utils.httpobj import urlparse_cached
from w3lib.encoding import (
    html_body_declared_encoding,
    http_content_type_encoding,
    read_bom,
    resolve_encoding,
)

from middlewares.offsite import LeftTheHosts
from webfarm.config import mask_credentials
from webfarm.download import header_limit, headers_too_large
from webfarm.exceptions import DeadLetter, RetryLater, Unreadable, error_text
from webfarm.hostmemory import RecentHosts, host_memory_size
from webfarm.urls import canonical_url, unfetchable

logger = logging.getLogger(__name__)
PREFIX = "webfarm/limits"


def _inc(crawler: Any, key: str) -> None:
    stats = getattr(crawler, "stats", None)
    if stats is not None:
        stats.inc_value(f"{PREFIX}/{key}")


#: meta key: the limit on a body once inflated, for a request downloaded with none
#: (``download_maxsize`` 0: robots.txt, whose download another limit stops)
INFLATE_MAX = "webfarm_inflate_max"


class HttpCompressionMiddleware(httpcompression.HttpCompressionMiddleware):
    """Scrapy's decompression (bounded by ``DOWNLOAD_MAXSIZE``), plus: a body over the
    limit, on the wire or once inflated, is dead-lettered, never retried; so are headers
    over ``WEBFARM_MAX_HEADER_BYTES`` (:mod:`webfarm.download`) and a body that does not
    decode as its ``Content-Encoding`` says."""

    def __init__(self, stats: Any = None, *, crawler: Crawler | None = None) -> None:
        super().__init__(stats, crawler=crawler)
        self.crawler = crawler
        if crawler is not None:
            header_limit(crawler.settings)  # a bad value stops the crawl here, at start

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Request | Response:
        if INFLATE_MAX in request.meta:  # downloaded without a limit: inflated with this one
            request.meta["download_maxsize"] = request.meta[INFLATE_MAX]
        limit = request.meta.get("download_maxsize", self._max_size)
        if limit and "playwright" in response.flags and len(response.body) > limit:
            # A page's script can build any size of DOM: the wire's limit never saw it.
            _inc(self.crawler, "too_big")
            _inc(self.crawler, "too_big/rendered")
            raise Unreadable(f"body over DOWNLOAD_MAXSIZE: the rendered page is "
                             f"{len(response.body)} B, past {limit} B")
        try:
            return super().process_response(request, response)
        except (DeadLetter, RetryLater):
            raise
        except IgnoreRequest as exc:
            if not isinstance(exc.__cause__, httpcompression._DecompressionMaxSizeExceeded):
                raise
            cause = exc.__cause__
            _inc(self.crawler, "too_big")
            _inc(self.crawler, "too_big/decompressed")
            raise Unreadable(
                f"body over DOWNLOAD_MAXSIZE after decompression: {len(response.body)} B "
                f"{response.headers.get('Content-Encoding', b'').decode('latin-1')} inflated "
                f"past {limit} B ({cause.decompressed_size} B so far)"
            ) from None
        except Exception as exc:  # noqa: BLE001 - gzip, zlib, brotli and zstd raise their own
            # A body its Content-Encoding does not decode: the same at every try. Scrapy
            # logs it with a traceback and gives up; the frontier retried it.
            _inc(self.crawler, "undecodable")
            encoding = response.headers.get("Content-Encoding", b"").decode("latin-1")
            error = error_text(exc)
            raise Unreadable(f"body does not decode as Content-Encoding {encoding!r}: {error}",
                             error=error) from None

    def process_exception(
        self, request: Request, exception: BaseException, spider: Spider | None = None
    ) -> None:
        if (too_large := headers_too_large(exception)) is not None:
            _inc(self.crawler, "too_big")
            _inc(self.crawler, "too_big/headers")
            raise Unreadable(str(too_large))
        if not isinstance(exception, DownloadCancelledError):
            return None
        message = str(exception)
        engine = getattr(self.crawler, "engine", None)
        if "max size" not in message and (message or not getattr(engine, "running", False)):
            return None  # cancelled for another reason (shutting down): not the body's fault
        limit = request.meta.get("download_maxsize", self._max_size)
        _inc(self.crawler, "too_big")
        detail = message.split(" in request ")[0] if message else "cut off while downloading"
        raise Unreadable(f"body over DOWNLOAD_MAXSIZE ({limit} B): {detail}")


class _DeadLetterRedirects:
    """``_redirect`` of Scrapy's redirect middlewares, with loops and chains past
    ``REDIRECT_MAX_TIMES`` dead-lettered instead of dropped."""

    crawler: Any
    max_redirect_times: int
    _left: LeftTheHosts | None = None  # redirects out of the spider's hosts

    def process_response(self, request: Request, response: Response,
                         spider: Spider | None = None) -> Request | Response:
        try:
            return super().process_response(request, response)  # type: ignore[misc]
        except ValueError as exc:  # a target w3lib cannot parse: a bad port, a broken IPv6
            location = (response.headers.get(b"Location") or b"<meta refresh>").decode(
                "latin-1")
            why = str(exc).lower()
            scheme = _scheme_of(location) if ":" in location else ""
            if scheme.isalpha() and scheme not in ("http", "https"):  # mailto:, javascript:
                why = _not_http(scheme)  # it said "missing scheme"
            raise self._unfetchable(request, location, why) from None

    def _unfetchable(self, request: Request, target: str, why: str) -> DeadLetter:
        """The downloader would fail on this redirect's target at every try."""
        _inc(self.crawler, "redirect_unfetchable")
        chain = [*request.meta.get("redirect_urls", []), request.url, target]
        return DeadLetter(f"redirect to a URL that cannot be fetched ({why}): "
                          + mask_credentials(_chain(chain)))

    def _redirect(self, redirected: Request, request: Request, reason: Any) -> Request:
        why = unfetchable(redirected.url)
        if why is not None:  # a user:password@, port 0
            raise self._unfetchable(request, redirected.url, why)
        chain = [*request.meta.get("redirect_urls", []), request.url]
        seen = {canonical_url(u) for u in chain}
        if canonical_url(redirected.url) in seen:
            _inc(self.crawler, "redirect_loop")
            raise DeadLetter(f"redirect loop: {_chain(chain + [redirected.url])}")
        self._check_offsite(redirected, request, chain)
        # A refetch's validators are the page's: sent on to where it moved, a 304 there
        # said "not modified" of another resource, and the page was kept as it was.
        for name in (b"If-None-Match", b"If-Modified-Since"):
            redirected.headers.pop(name, None)
        try:
            return super()._redirect(redirected, request, reason)  # type: ignore[misc]
        except (DeadLetter, RetryLater):
            raise
        except IgnoreRequest:
            _inc(self.crawler, "redirect_limit")
            raise DeadLetter(
                f"redirect: more than {self.max_redirect_times} redirects (REDIRECT_MAX_TIMES): "
                f"{_chain(chain + [redirected.url])}"
            ) from None

    def _check_offsite(self, redirected: Request, request: Request, chain: list[str]) -> None:
        """A redirect out of the spider's hosts is dropped, as by Scrapy's offsite filter,
        and said (:class:`~middlewares.offsite.LeftTheHosts`). A start URL outside the
        hosts is fetched anyway, as in Scrapy. Not ``dont_filter``, which the frontier
        sets on refetches, renders and proxy retries: a refetch followed a page that
        moved off the spider's hosts and stored the other site's data."""
        left = self._left
        if left is None:
            left = self._left = LeftTheHosts(self.crawler, "redirect offsite", "follow",
                                             " --reason 'redirect offsite'")
        host = left.host(request, redirected.url, bool(redirected.meta.get("allow_offsite")))
        if host is None:
            return
        _inc(self.crawler, "redirect_offsite")
        left.refuse(request, redirected.url, host, _chain(chain + [redirected.url]),
                    f"{request.url} redirects to {redirected.url[:200]}, outside the "
                    "spider's hosts: not followed")


def _scheme_of(location: str) -> str:
    return location.split(":", 1)[0].strip().lower()


def _not_http(scheme: str) -> str:
    """Why a redirect to a URL of ``scheme`` is dead-lettered."""
    return f"its scheme {scheme[:20]!r} is not http or https"


def _chain(urls: list[str], keep: int = 4) -> str:
    shown = urls if len(urls) <= keep * 2 else [*urls[:keep], "…", *urls[-keep:]]
    return " → ".join(u[:200] for u in shown)


class RedirectMiddleware(_DeadLetterRedirects, redirect.RedirectMiddleware):
    """Scrapy's 3xx handling; loops and over-long chains are dead-lettered, and so is a
    redirect with no ``Location`` or to a URL that is not http(s): Scrapy hands those on
    as the 3xx response, which ``HttpErrorMiddleware`` then drops ("HTTP status code is
    not handled"), so the page ended with neither a record nor the reason."""

    def process_response(self, request: Request, response: Response,
                         spider: Spider | None = None) -> Request | Response:
        result = super().process_response(request, response)
        if result is not response or response.status not in _REDIRECT_STATUSES or (
                request.meta.get("dont_redirect")
                or request.meta.get("handle_httpstatus_all")
                or response.status in request.meta.get("handle_httpstatus_list", ())
                or response.status in getattr(self.crawler.spider, "handle_httpstatus_list",
                                              ())):
            return result
        location = response.headers.get(b"Location")
        if location is None:
            _inc(self.crawler, "redirect_unfetchable")
            raise DeadLetter(f"redirect without a Location header: HTTP {response.status} "
                             f"from {request.url[:200]}")
        target = location.decode("latin-1")
        raise self._unfetchable(request, target[:200], _not_http(_scheme_of(target)))


class MetaRefreshMiddleware(_DeadLetterRedirects, redirect.MetaRefreshMiddleware):
    """Scrapy's ``<meta http-equiv=refresh>`` handling; same as :class:`RedirectMiddleware`."""


_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


def _decodes(body: bytes, encoding: str) -> bool:
    try:
        body.decode(encoding)
    except (UnicodeDecodeError, LookupError):
        return False
    return True


_NO_BOM = {"utf-16": "utf-16-le", "utf-32": "utf-32-le"}
_WIDE = ("utf-16", "utf-32")


def sensible_encoding(body: bytes, declared: list[str | None]) -> str | None:
    """The encoding to read ``body`` with, given the labels it came with (header first).

    A BOM wins; a body that is valid UTF-8 with non-ASCII bytes is UTF-8 whatever it claims
    (legacy text is almost never valid UTF-8 by accident); else the first known declared
    encoding that decodes the body; else windows-1252, the web's legacy default. None when
    nothing fits (Scrapy's own guess stays).
    """
    bom, _ = read_bom(body)
    if bom:
        return bom
    if not body.isascii() and _decodes(body, "utf-8"):
        return "utf-8"
    for label in declared:
        encoding = resolve_encoding(label) if label else None
        # "utf-16" with no BOM is little-endian, as browsers read it (WHATWG)
        encoding = _NO_BOM.get(encoding or "", encoding)
        if encoding and _decodes(body, encoding):
            return encoding
    return "cp1252" if _decodes(body, "cp1252") else None


class CharsetMiddleware:
    """Wrong, missing or unknown charsets: pages are read with an encoding their bytes fit.

    Scrapy trusts the declared charset (mojibake or U+FFFD when it lies) and guesses
    when there is none; links, extraction and the content hash all read
    ``response.text``, so one sensible decision here serves them all. Counted as
    ``webfarm/limits/charset_fixed``; off with ``WEBFARM_CHARSET_FIX=False``.
    """

    def __init__(self, crawler: Crawler) -> None:
        if not crawler.settings.getbool("WEBFARM_CHARSET_FIX", True):
            raise NotConfigured
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> CharsetMiddleware:
        return cls(crawler)

    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Response:
        if not isinstance(response, TextResponse) or not response.body or (
                "playwright" in response.flags):  # the browser decoded it already
            return response
        header = response.headers.get(b"Content-Type", b"").decode("latin-1")
        declared = [http_content_type_encoding(header),
                    html_body_declared_encoding(response.body[:4096])]
        encoding = sensible_encoding(response.body, declared)
        if encoding is None or encoding == resolve_encoding(response.encoding):
            return response
        _inc(self.crawler, "charset_fixed")
        logger.debug("Reading %s as %s (declared %s)", response, encoding,
                     " / ".join(d or "-" for d in declared))
        return response.replace(encoding=encoding)


class LinkEncodingMiddleware:
    """Requests a UTF-16 or UTF-32 page yields are made UTF-8 ones (spider middleware).

    ``response.follow`` gives a request its page's encoding, and Scrapy encodes header
    names with it: the ``Referer`` that ``RefererMiddleware`` adds next went out as UTF-16
    bytes, which the HTTP client refuses (``InvalidHeaderName``), so every link of such
    a page was retried into the dead-letter queue. Browsers send UTF-8 for these pages'
    URLs too. Runs before ``RefererMiddleware`` (700) on a callback's output.
    """

    async def process_spider_output(self, response: Response, result: AsyncIterator[Any]
                                    ) -> AsyncIterator[Any]:
        async for item in result:
            yield _utf8(item)


def _utf8(item: Any) -> Any:
    if isinstance(item, Request) and item.encoding.lower().replace("_", "-").startswith(_WIDE):
        return item.replace(encoding="utf-8")
    return item


class UrlLengthMiddleware(urllength.UrlLengthMiddleware):
    """Scrapy's ``URLLENGTH_LIMIT`` check, said with the URL cut short and once per host.

    Scrapy logs every link it drops, whole, at INFO: a page of 10,000 links 20,000
    characters long (a crawler trap, or a hostile site) wrote 200 MB of log. Counted in
    Scrapy's ``urllength/request_ignored_count`` as before.
    """

    _said: RecentHosts[None]  # hosts whose dropped link was said at INFO

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> UrlLengthMiddleware:
        o = super().from_crawler(crawler)
        o._said = RecentHosts(host_memory_size(crawler.settings))
        return o

    def get_processed_request(self, request: Request, response: Response | None
                              ) -> Request | None:
        if len(request.url) <= self.maxlength:
            return request
        self.crawler.stats.inc_value("urllength/request_ignored_count")
        host = urlparse_cached(request).hostname or ""
        level = logging.DEBUG if host in self._said else logging.INFO
        self._said.add(host)
        logger.log(level, "Ignoring a link longer than URLLENGTH_LIMIT=%d (%d characters): "
                   "%s… (said once per host at INFO; counted in "
                   "urllength/request_ignored_count)", self.maxlength, len(request.url),
                   request.url[:200])
        return None
