"""Page URLs from sitemaps, for ``scrapy seed --sitemap``.

A seed run reads every sitemap first and enqueues only when all of them were
read, so a broken child of a sitemap index costs one clear line and enqueues
nothing half-way. Accepted inputs: a sitemap (``<urlset>``), a sitemap index
(``<sitemapindex>``, followed recursively up to ``max_depth``), either one
gzip-compressed (``.xml.gz`` or ``Content-Encoding: gzip``), a plain-text
sitemap (one URL per line), a robots.txt URL, or a bare host / site root,
whose robots.txt ``Sitemap:`` lines are followed.

Parsing is Scrapy's (:class:`scrapy.utils.sitemap.Sitemap`,
:func:`~scrapy.utils.sitemap.sitemap_urls_from_robots`): lxml without entity
resolution, so a hostile sitemap cannot read local files (XXE). Every fetch is
bounded in time and size (the compressed and the decompressed size: a gzip bomb
stops at ``max_bytes``), and every URL fetched, redirects included, can be
checked by ``check_url`` (the SSRF guard), because a sitemap index or a
robots.txt chosen by a stranger names the next URLs to fetch.
"""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import lxml.etree
from scrapy.utils.sitemap import Sitemap, sitemap_urls_from_robots

from webfarm.urls import unfetchable

MAX_BYTES = 50 * 1024 * 1024  # the sitemaps.org limit for one uncompressed sitemap
MAX_DEPTH = 3  # sitemap index -> sitemap index -> ... -> sitemap
MAX_SITEMAPS = 1000
MAX_URLS = 1_000_000
GZIP_MAGIC = b"\x1f\x8b"

#: Returns why a URL must not be fetched, or None (see :class:`webfarm.netguard.NetGuard`).
UrlCheck = Callable[[str], "str | None"]


class SitemapError(Exception):
    """A sitemap could not be read; the message is one line that says what to do."""


@dataclass
class SitemapResult:
    """Page URLs (unique, in document order) and what was read to find them."""

    urls: list[str] = field(default_factory=list)
    sitemaps: list[str] = field(default_factory=list)  # documents read, robots.txt included
    skipped: int = 0  # <loc> values that are not absolute http(s) URLs


def is_http_url(url: str) -> bool:
    """An absolute ``http(s)://host…`` URL that a worker can fetch (no bad port, no
    ``user:password@``: :func:`~webfarm.urls.unfetchable`)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    return (parts.scheme in ("http", "https") and " " not in url
            and unfetchable(url) is None)


def start_url(value: str) -> tuple[str, bool]:
    """``(URL to fetch first, is it a robots.txt)`` for what the user typed.

    ``example.com`` and ``https://example.com/`` mean the site's robots.txt;
    anything with a path is a sitemap (or a robots.txt, by its name).
    """
    text = value.strip()
    if "://" not in text:
        text = "https://" + text
    if not is_http_url(text):
        raise SitemapError(f"{value!r} is not an http(s) URL or host name of a sitemap")
    parts = urlsplit(text)
    if parts.path in ("", "/") and not parts.query:
        return urlunsplit((parts.scheme, parts.netloc, "/robots.txt", "", "")), True
    return text, parts.path.rstrip("/").lower().endswith("/robots.txt")


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows at most a few redirects, each one checked like the first URL."""

    max_redirections = 5

    def __init__(self, check: UrlCheck | None) -> None:
        self.check = check

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> Any:
        if not is_http_url(newurl):
            raise SitemapError(f"{req.full_url} redirects to {newurl!r}, not an http(s) URL")
        if self.check is not None and (reason := self.check(newurl)):
            raise SitemapError(f"{req.full_url} redirects to a refused address: {reason}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class SitemapReader:
    """Reads a sitemap tree with a plain blocking HTTP client (a command, not a worker)."""

    def __init__(
        self,
        *,
        user_agent: str = "webfarm",
        timeout: float = 30.0,
        max_bytes: int = MAX_BYTES,
        max_depth: int = MAX_DEPTH,
        max_sitemaps: int = MAX_SITEMAPS,
        max_urls: int = MAX_URLS,
        check_url: UrlCheck | None = None,
        delay: float = 0.0,
    ) -> None:
        self.user_agent = user_agent
        #: seconds between two fetches from one host (``WEBFARM_HOST_DELAY``): a 50-child
        #: index came in 0.13 s, where a worker's SitemapSpider waited its delay each time
        self.delay = max(0.0, delay)
        self._last: dict[str, float] = {}  # host -> monotonic time of its last fetch
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.max_depth = max_depth
        self.max_sitemaps = max_sitemaps
        self.max_urls = max_urls
        self.check_url = check_url
        self._opener = urllib.request.build_opener(_CheckedRedirects(check_url))

    # -- fetching -------------------------------------------------------------------------

    def fetch(self, url: str) -> bytes:
        """The body of ``url``, gunzipped when compressed, at most ``max_bytes``."""
        if self.check_url is not None and (reason := self.check_url(url)):
            raise SitemapError(f"{url}: refused: {reason}")
        self._wait_turn(urlsplit(url).netloc.lower())
        request = urllib.request.Request(url, headers={
            "User-Agent": self.user_agent, "Accept-Encoding": "gzip",
        })
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                data = response.read(self.max_bytes + 1)
                encoding = (response.headers.get("Content-Encoding") or "").strip().lower()
                declared = response.headers.get("Content-Length")
        except urllib.error.HTTPError as exc:
            raise SitemapError(f"{url}: HTTP {exc.code} {exc.reason}") from None
        except urllib.error.URLError as exc:
            # A bare host is tried over https: a site on plain HTTP only answered with
            # "[SSL: WRONG_VERSION_NUMBER]" and no word of what to type instead.
            hint = (f"; if the site serves plain HTTP, give http://{urlsplit(url).netloc}/"
                    if isinstance(exc.reason, ssl.SSLError) and url.startswith("https://")
                    else "")
            raise SitemapError(f"{url}: cannot fetch ({exc.reason}){hint}") from None
        except (OSError, ValueError) as exc:  # timeouts, resets, malformed responses
            raise SitemapError(f"{url}: cannot fetch ({type(exc).__name__}: {exc})") from None
        if len(data) > self.max_bytes:
            raise SitemapError(f"{url}: larger than {self.max_bytes} bytes")
        if declared and declared.strip().isdigit() and len(data) < int(declared):
            # read(n) returns what came when the server closes early: a sitemap cut in
            # half was seeded in half, exit 0
            raise SitemapError(f"{url}: cut short in transfer ({len(data):,} of "
                               f"{int(declared):,} bytes); try again")
        if encoding not in ("", "identity", "gzip", "x-gzip"):
            raise SitemapError(f"{url}: unsupported Content-Encoding {encoding!r}")
        # Content-Encoding: gzip of a .xml.gz file is gzip twice; never more.
        for _ in range(2):
            if data[:2] != GZIP_MAGIC:
                break
            data = self._gunzip(url, data)
        return data

    def _wait_turn(self, host: str) -> None:
        last = self._last.get(host)
        if last is not None and self.delay:
            time.sleep(max(0.0, last + self.delay - time.monotonic()))
        self._last[host] = time.monotonic()

    def _gunzip(self, url: str, data: bytes) -> bytes:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(data, self.max_bytes + 1)
        except zlib.error as exc:
            raise SitemapError(f"{url}: broken gzip data ({exc})") from None
        if len(out) > self.max_bytes or inflater.unconsumed_tail:
            raise SitemapError(f"{url}: decompresses to more than {self.max_bytes} bytes")
        if not inflater.eof:
            raise SitemapError(f"{url}: broken gzip data (truncated)")
        return out

    # -- walking --------------------------------------------------------------------------

    def read(self, value: str) -> SitemapResult:
        """Every page URL under ``value`` (a sitemap, index, robots.txt or host).

        Raises :class:`SitemapError` for the first document that cannot be read: a
        seed is all or nothing.
        """
        first, is_robots = start_url(value)
        result = SitemapResult()
        found: dict[str, None] = {}
        todo: deque[tuple[str, int]]
        if is_robots:
            body = self.fetch(first)
            result.sitemaps.append(first)
            listed = [u for u in sitemap_urls_from_robots(body, base_url=first) if u]
            if not listed:
                raise SitemapError(f"{first} lists no 'Sitemap:' lines; pass a sitemap URL")
            todo = deque((u, 0) for u in listed)
        else:
            todo = deque([(first, 0)])
        visited: set[str] = set()
        listed_by: dict[str, str] = {}  # a child sitemap -> the index that listed it
        while todo:
            url, depth = todo.popleft()
            if url in visited:
                continue
            visited.add(url)
            if not is_http_url(url):
                raise SitemapError(f"sitemap location {url!r} is not an http(s) URL")
            if len(result.sitemaps) >= self.max_sitemaps:
                raise SitemapError(f"{value}: more than {self.max_sitemaps} sitemaps")
            try:
                kind, locs = self.parse(url, self.fetch(url))
            except SitemapError as exc:
                parent = listed_by.get(url)
                if parent is None:
                    raise
                raise SitemapError(f"{exc} (listed by the sitemap index {parent})") from None
            result.sitemaps.append(url)
            if kind == "sitemapindex":
                if depth >= self.max_depth:
                    raise SitemapError(
                        f"{url}: sitemap indexes nested deeper than {self.max_depth} levels"
                    )
                todo.extend((loc, depth + 1) for loc in locs)
                for loc in locs:
                    listed_by.setdefault(loc, url)
                continue
            for loc in locs:
                if not is_http_url(loc):
                    result.skipped += 1
                    continue
                found[loc] = None
                if len(found) > self.max_urls:
                    raise SitemapError(
                        f"{value}: more than {self.max_urls} URLs; raise --max-urls or seed "
                        "one child sitemap at a time"
                    )
        result.urls = list(found)
        return result

    @staticmethod
    def parse(url: str, body: bytes) -> tuple[str, list[str]]:
        """``("urlset" | "sitemapindex", locations)``; raises for anything else."""
        stripped = body.lstrip()
        if not stripped:
            raise SitemapError(f"{url} is empty, not a sitemap")
        if not stripped.startswith(b"<"):
            return "urlset", _text_sitemap(url, stripped)
        try:
            # Scrapy's reader recovers from broken XML: a file cut short gave the URLs
            # before the cut, and an unescaped '&' in a <loc> another URL, in silence
            lxml.etree.fromstring(body, parser=_STRICT)
        except lxml.etree.XMLSyntaxError as exc:
            raise SitemapError(
                f"{url} is not well-formed XML ({exc}); nothing was enqueued. Fix the "
                "sitemap (an '&' in a URL is written &amp;), or seed its URLs with -f") from None
        try:
            sitemap = Sitemap(body)
            kind = sitemap.type
            locs = [entry["loc"].strip() for entry in sitemap if entry.get("loc")]
        except (StopIteration, lxml.etree.LxmlError, ValueError) as exc:
            raise SitemapError(f"{url} is not a sitemap (unreadable XML: {exc})") from None
        if kind not in ("urlset", "sitemapindex"):
            raise SitemapError(
                f"{url} is not a sitemap (root element <{kind}>, expected <urlset> or "
                "<sitemapindex>)"
            )
        return kind, locs


_STRICT = lxml.etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=True)


def _text_sitemap(url: str, body: bytes) -> list[str]:
    """A text sitemap: one absolute URL per line, nothing else (so HTML or JSON is refused)."""
    try:
        lines = [line.strip() for line in body.decode("utf-8").splitlines()]
    except UnicodeDecodeError:
        raise SitemapError(f"{url} is not a sitemap (binary data)") from None
    urls = [line for line in lines if line]
    if not all(is_http_url(line) for line in urls):
        raise SitemapError(f"{url} is not a sitemap (neither XML nor one URL per line)")
    return urls
