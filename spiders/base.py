"""The base class every webfarm spider stands on.

It turns each response into a :class:`~webfarm.items.PageItem` (the raw page,
kept for re-parsing), follows links inside the spider's hosts, and leaves a
site spider only its extraction: override :meth:`extract`.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import time
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any, Self
from urllib.parse import urlsplit

import scrapy
from scrapy.crawler import Crawler
from scrapy.http import Response, TextResponse
from scrapy.linkextractors import LinkExtractor

from webfarm.attrnames import spider_slips
from webfarm.config import mask_credentials, whole_number
from webfarm.items import ItemSource, PageItem, attach_source, user_meta_json
from webfarm.links import MAX_LINKS_PER_PAGE, extract_links, has_anchors
from webfarm.queue import SENT_AT
from webfarm.recrawl import GONE_STATUSES
from webfarm.recrawl import META_KEY as RECRAWL
from webfarm.render import check_render_arguments
from webfarm.urls import host_of, scope_host, unfetchable, within_domains

logger = logging.getLogger(__name__)
_PORTS = {"http": 80, "https": 443}


def _split(value: str | Iterable[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = value.split(",")
    return [v.strip() for v in value if v and v.strip()]


#: The ``-a`` arguments the base class reads (``render*``: :mod:`webfarm.render`).
ARGUMENTS = ("start", "start_urls", "domains", "allowed_domains", "max_pages", "render",
             "render_check")


#: Spider attributes Scrapy's components read, which Scrapy deprecates for these settings.
SCRAPY_ATTRIBUTES = {
    "download_delay": "DOWNLOAD_DELAY", "max_concurrent_requests": "CONCURRENT_REQUESTS_PER_DOMAIN",
    "user_agent": "USER_AGENT", "http_user": "HTTPAUTH_USER", "http_pass": "HTTPAUTH_PASS",
    "http_auth_domain": "HTTPAUTH_DOMAIN", "download_timeout": "DOWNLOAD_TIMEOUT",
    "download_maxsize": "DOWNLOAD_MAXSIZE", "download_warnsize": "DOWNLOAD_WARNSIZE",
    "handle_httpstatus_list": "HTTPERROR_ALLOWED_CODES",
}


def _taken(cls: type) -> set[str]:
    """The argument names ``cls`` reads: the base's and its ``__init__``'s parameters."""
    params = inspect.signature(cls.__init__).parameters.values()
    return set(ARGUMENTS) | {p.name for p in params
                             if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"self"}


def _check_names(cls: type, spargs: dict[str, Any], strict: bool = False) -> None:
    """ValueError for an argument nothing reads that is one letter or two from one that
    is (``-a max_page=10`` crawled the whole site), or, when ``strict``, for any argument
    nothing reads. Scrapy sets an unknown ``-a`` as an attribute for the spider's own
    code, so a class attribute or ``__init__`` parameter of that name is left alone
    (unless ``strict``: ``-a follow_links=false`` would set a string, which is true), and
    so are ``_``-names (scrapyd's ``_job``). ``strict`` names the setting of a Scrapy
    spider attribute such as ``user_agent``."""
    taken = _taken(cls)
    for name in spargs:
        if name in taken or name.startswith("_") or (hasattr(cls, name) and not strict):
            continue
        if strict and name in SCRAPY_ATTRIBUTES:  # -a user_agent=..., as Scrapy users write
            raise ValueError(f"-a {name}: {cls.name} takes Scrapy's setting for it instead, "
                             f"-s {SCRAPY_ATTRIBUTES[name]}=VALUE (Scrapy deprecates the "
                             "spider attribute)")
        close = difflib.get_close_matches(name, sorted(taken), n=1, cutoff=0.75)
        if close:
            own = ("" if strict else f" (a spider that reads {name!r} itself declares it: "
                   f"a class attribute {name} = None)")
            raise ValueError(f"-a {name}: no such argument; did you mean -a {close[0]}?{own}")
        if strict:
            raise ValueError(f"-a {name}: no such argument; {cls.name} takes -a start, "
                             "domains, max_pages, render and render_check (or Scrapy's "
                             "names start_urls and allowed_domains)")


def _hosts(value: str | Iterable[str] | None, source: str) -> list[str]:
    """The hosts a spider stays inside, spelled as the hosts of URLs (:func:`scope_host`)."""
    hosts = []
    for entry in _split(value):
        try:
            hosts.append(scope_host(entry))
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None
    return list(dict.fromkeys(hosts))


def _scrapy_names(spargs: dict[str, Any], start: Any, domains: Any) -> tuple[Any, Any]:
    """``-a start_urls=URL,...`` and ``-a allowed_domains=HOST,...`` (taken out of
    ``spargs``) as ``start`` and ``domains``. Why: Scrapy users write the attributes'
    names, and Scrapy would set them as strings: ``start_urls`` was then read one
    character at a time ("Missing scheme in request url: h") and ``allowed_domains``
    was replaced by the start URLs' hosts without a word. A list given from code
    (``CrawlerProcess.crawl(Spider, start_urls=[...])``) is joined the same way."""
    names = {"start_urls": start, "allowed_domains": domains}
    for name, given in list(names.items()):
        value = spargs.pop(name, None)
        if value is None:
            continue
        parts = _split(value)
        names[name] = ",".join(_split(given) + parts) if given else ",".join(parts)
    return names["start_urls"], names["allowed_domains"]


class WebfarmSpider(scrapy.Spider):
    """Crawl ``start_urls``, store every page, follow links inside ``hosts``.

    Spider arguments (``-a name=value``): ``start`` (comma-separated URLs; or
    ``start_urls``), ``domains`` (comma-separated hosts, ``host`` or ``host:port``;
    or ``allowed_domains``; default: the start URLs' hosts) and ``max_pages`` (stop
    following links after this worker stored that many pages, whichever callback got
    them; 0 = no limit).
    """

    name = ""
    start_urls: list[str] = []
    hosts: list[str] = []
    follow_links = True
    link_extractor = LinkExtractor(unique=True)
    max_links = MAX_LINKS_PER_PAGE  # WEBFARM_MAX_LINKS_PER_PAGE in a crawl (0: no limit)
    #: it tags its items with their page itself (middlewares.sources leaves it alone)
    tags_item_sources = True
    #: refuse every ``-a`` it does not read (a spider with no code of its own: generic)
    strict_arguments = False

    def __init__(
        self, start: str | None = None, domains: str | None = None,
        max_pages: str | int | None = None, **kwargs: Any,
    ) -> None:
        start, domains = _scrapy_names(kwargs, start, domains)
        super().__init__(**kwargs)
        args = self.check_arguments(start=start, domains=domains, max_pages=max_pages)
        self.start_urls = args["start"] or list(self.start_urls)
        self.hosts = args["domains"] or [host_of(u) for u in self.start_urls]
        scope = [urlsplit(f"//{h}") for h in self.hosts]
        # The offsite middleware compares bare host names; ``hosts`` keep the port.
        self.allowed_domains = sorted({p.hostname or "" for p in scope})
        self._within = within_domains(self.hosts)  # for in_scope
        self.max_pages = args["max_pages"]
        self.pages_seen = 0
        self._counted: weakref.WeakSet[Response] = weakref.WeakSet()

    @classmethod
    def from_crawler(cls, crawler: Crawler, *args: Any, **kwargs: Any) -> Self:
        spider = super().from_crawler(crawler, *args, **kwargs)
        spider.max_links = whole_number(crawler.settings, "WEBFARM_MAX_LINKS_PER_PAGE",
                                        MAX_LINKS_PER_PAGE, "anchors", "no limit")
        for name, meant in spider_slips(cls, WebfarmSpider):
            logger.warning("%s.%s is no name webfarm reads; did you mean %s? (as it is, "
                           "the spider runs without it)", cls.__name__, name, meant)
        return spider

    @classmethod
    def check_arguments(cls, **spargs: Any) -> dict[str, Any]:
        """Validate ``-a`` arguments; ``scrapy crawl`` calls this before starting
        anything, so a typo costs one line, not a traceback. Raises ValueError."""
        spargs = dict(spargs)
        _check_names(cls, spargs, strict=cls.strict_arguments)
        spargs["start"], spargs["domains"] = _scrapy_names(
            spargs, spargs.get("start"), spargs.get("domains"))
        start = _split(spargs.get("start"))
        for url in start:
            why = unfetchable(url)
            if why is not None:
                raise ValueError(f"start URL {mask_credentials(url)!r} cannot be fetched: {why}")
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                hint = (f": write it with its scheme, e.g. 'https://{mask_credentials(url)}'"
                        if "://" not in url else "")
                raise ValueError(f"start URL {mask_credentials(url)!r} is not an http(s) "
                                 f"URL{hint}")
        raw = spargs.get("max_pages")
        try:
            max_pages = int(raw or 0)
        except ValueError:
            raise ValueError(f"max_pages={raw!r} is not a whole number") from None
        if max_pages < 0:
            raise ValueError(f"max_pages={raw!r} must be 0 (no limit) or more")
        check_render_arguments(spargs)  # -a render=, -a render_check= (RenderConfigError)
        if inspect.iscoroutinefunction(cls.extract) or inspect.isasyncgenfunction(cls.extract):
            raise ValueError(f"{cls.__name__}.extract is 'async def'; make it a plain 'def' "
                             "that yields items: the crawl and `scrapy reparse` call it "
                             "synchronously")
        domains = (_hosts(spargs.get("domains"), "domains")
                   or _hosts(cls.hosts, f"{cls.__name__}.hosts")
                   or _hosts(getattr(cls, "allowed_domains", None),
                             f"{cls.__name__}.allowed_domains"))
        return {"start": start, "domains": domains, "max_pages": max_pages}

    @classmethod
    def check_crawl_arguments(cls, **spargs: Any) -> dict[str, Any]:
        """:meth:`check_arguments`, and what a crawl needs on top of them (a re-parse and
        ``--stored`` fetch nothing); ``scrapy crawl`` and ``runspider`` call this one."""
        return cls.check_arguments(**spargs)

    async def start(self) -> AsyncIterator[Any]:
        for url in self.start_urls:
            # Scrapy fetches a start URL outside allowed_domains (its start requests are
            # dont_filter); here it was dropped, and the crawl ended with nothing. Not
            # dont_filter: through the frontier's dupefilter, ten workers fetch it once.
            meta = {} if self.in_scope(url) else {"allow_offsite": True}
            yield scrapy.Request(url, callback=self.parse, meta=meta)

    def in_scope(self, url: str) -> bool:
        """Is ``url`` on one of this spider's hosts or their subdomains (``host`` matches
        any port, ``host:port`` that port only)?"""
        parts = urlsplit(url)
        if parts.scheme not in _PORTS or not parts.hostname:
            return False
        return self._within is not None and self._within(url)

    def page_item(self, response: Response) -> PageItem:
        # The URL asked for: the first of its redirects, else the request's (a page whose
        # script navigated elsewhere comes back at another URL, and was stored under it,
        # while the page asked for was never recorded).
        request_url = response.meta.get("redirect_urls", [response.request.url])[0]
        headers = response.headers
        content_type = headers.get(b"Content-Type", b"").decode("latin-1")
        etag = headers.get(b"ETag")
        last_modified = headers.get(b"Last-Modified")
        return PageItem(
            url=request_url,
            final_url=response.url,
            redirect_urls=list(response.meta.get("redirect_urls") or ()) or None,
            host=host_of(request_url),
            spider=self.name,
            status=response.status,
            body=response.body,
            content_type=content_type,
            encoding=response.encoding if isinstance(response, TextResponse) else None,
            headers={k.decode("latin-1"): b",".join(v).decode("latin-1")
                     for k, v in response.headers.items()},
            # when the request left, not when this callback ran: after a stall past the
            # lease, the later of two workers' fetches must win (webfarm.queue.SENT_AT)
            fetched_at=response.meta.get(SENT_AT) or time.time(),
            etag=etag.decode("latin-1") if etag else None,
            last_modified=last_modified.decode("latin-1") if last_modified else None,
            not_modified=response.status == 304,
            # Only a refetch lets a 404/410 through (a crawl's never reach the spider).
            gone=response.status in GONE_STATUSES and RECRAWL in response.meta,
            fetch_method=("api" if "fetch-api" in response.flags  # webfarm.fetchapi.FLAG
                          else "browser" if "playwright" in response.flags else "http"),
            meta=user_meta_json(response),
        )

    def count_page(self, response: Response) -> None:
        """Count ``response``'s page toward ``max_pages``, once: the base ``parse`` and
        middlewares.sources (a page sent to a callback of the spider's own) both store
        pages, and a ``parse`` of its own that calls ``super().parse()`` goes through both."""
        if response in self._counted:
            return
        self._counted.add(response)
        self.pages_seen += 1
        if self.pages_seen == self.max_pages:
            logger.info("Stored max_pages=%d pages: the links of pages from now on are not "
                        "followed (requests already queued are still fetched)", self.max_pages)

    def closed(self, reason: str) -> None:
        if self.max_pages and self.pages_seen >= self.max_pages:
            # The frontier remembers what was seen, and a page whose links were not queued
            # is not fetched again: a trial run's limit would bound every later crawl.
            logger.warning(
                "max_pages=%d was reached: the links of the pages stored after it were not "
                "queued, and those pages count as seen, so a later crawl of %s does not reach "
                "what they link to. To crawl the whole site later, reset the frontier first: "
                "scrapy frontier %s --reset --yes (its pages are then fetched again)",
                self.max_pages, self.name, self.name)

    @property
    def under_page_limit(self) -> bool:
        """Are links still followed (fewer than ``max_pages`` pages stored, or no limit)?"""
        return not self.max_pages or self.pages_seen < self.max_pages

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        self.count_page(response)
        page = self.page_item(response)
        yield page
        if page.gone:  # its last content stays as stored: nothing to extract or follow
            return
        if not page.not_modified:  # a 304 has no body to extract from
            yield from self.extracted(response, ItemSource(page.url, page=page))
        if self.follow_links and self.under_page_limit and has_anchors(response):
            yield from self.follow(response)

    webfarm_base_parse = parse  # pages sent to another callback: middlewares/sources.py

    def extract(self, response: Response) -> Iterable[Any]:
        """Structured items of a page; site spiders override this. Items go to the item
        store (see :mod:`webfarm.itemstore` for collections and keys); ``scrapy reparse``
        calls this same method on stored pages."""
        return ()

    def extracted(self, response: Response, source: ItemSource) -> Iterator[Any]:
        """:meth:`extract`'s output, each item tagged with the page it came from (an item
        pipeline receives only the item; the item store needs the page's URL and hash)."""
        for output in self.extract(response) or ():
            if not isinstance(output, scrapy.Request):
                attach_source(output, source)
            yield output

    def follow(self, response: TextResponse) -> Iterator[scrapy.Request]:
        links, more = extract_links(self.link_extractor, response, self.max_links)
        if more:
            logger.warning("Followed the links of the first %d anchors of %s, which has more "
                           "(WEBFARM_MAX_LINKS_PER_PAGE)", self.max_links, response.url)
            stats = getattr(getattr(self, "crawler", None), "stats", None)
            if stats is not None:
                stats.inc_value("webfarm/links/capped")
        for link in links:
            if self.in_scope(link.url):
                yield response.follow(link.url, callback=self.parse)
