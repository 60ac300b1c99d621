"""Every page a spider's callback gets keeps its items' source; a WebfarmSpider's is stored.

``WebfarmSpider.parse`` stores each page it gets (a :class:`PageItem`) and tags the items
of ``extract()`` with it (:func:`webfarm.items.attach_source`), so the item store writes
``source_url`` and ``content_hash``. Pages that reach another callback were neither
stored nor tagged: a ``WebfarmSpider`` whose own ``parse`` overrides the base class's (the
Scrapy habit), or a request with ``callback=self.parse_detail``. Their raw pages were
lost without a word, and their items stored with an empty ``source_url``. Here such a
page is stored as the base ``parse`` stores one, with the callback's name
(``pages.callback``) and the request's ``cb_kwargs`` (``pages.cb_kwargs``): ``scrapy
reparse`` runs that callback on it with them, and ``scrapy recrawl`` sends its refetch
there. The callback's items are tagged with the page. A refetch's 304, 404 or 410 is
recorded as the base ``parse`` records it, without calling the callback; a ``parse`` of
the spider's own that calls ``super().parse()`` gets its page stored once.

Such pages count toward the spider's ``max_pages`` too, and once the worker has stored
that many, the requests any callback yields (``extract()``'s, a callback's own) are
dropped, counted as ``webfarm/links/max_pages``: before, only the base ``parse``'s link
following stopped, so ``-a max_pages=`` did not bound a spider that follows its pages
the Scrapy way.

A plain Scrapy spider (``CrawlSpider``, ``SitemapSpider``, ``scrapy.Spider``) stores no
pages; its items are tagged with the response's URL (``content_hash`` stays empty), and
a dict without a key of its own, the item of ``scrapy genspider -t crawl``'s template, is
keyed on that page.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from scrapy import Request
from scrapy.crawler import Crawler
from scrapy.http import Response
from scrapy.spidermiddlewares.httperror import HttpError, HttpErrorMiddleware

from webfarm import serialize
from webfarm.exceptions import ItemError
from webfarm.items import (
    KEPT_JSON,
    ItemSource,
    PageItem,
    attach_source,
    has_source,
    mark_user_meta,
)
from webfarm.itemstore import collection_of, key_fields_of, keyless_advice
from webfarm.queue import LOCAL

logger = logging.getLogger(__name__)

#: The most of a request's ``cb_kwargs`` (as JSON, characters) kept with its page (its
#: headers are bounded alike, webfarm.index.HEADER_BYTES_KEPT).
KWARGS_KEPT = KEPT_JSON


def callback_name(spider: Any, response: Response) -> str | None:
    """The name of the spider method that gets ``response`` when it is not the base class's
    ``parse`` (which stores its page itself); None when it is, or when the callback is not
    a method of the spider (a closure cannot be run again by re-parse)."""
    request = response.request
    callback = request.callback if request is not None else None
    if callback is None:  # Scrapy calls spider.parse
        name = "parse"
        func = getattr(type(spider), "parse", None)
    else:
        name = getattr(callback, "__name__", "")
        func = getattr(callback, "__func__", None)
        if getattr(callback, "__self__", None) is not spider or func is None:
            return None
    base = getattr(type(spider), "webfarm_base_parse", None)  # the function, not bound
    return None if func is base else name


def errback_name(spider: Any, response: Response) -> str | None:
    """The name of the request's errback when it is a method of the spider (a recrawl's
    refetch of the page gets it again: it went without one, and a network error on it
    reached no errback), else None."""
    errback = getattr(response.request, "errback", None)
    if getattr(errback, "__self__", None) is not spider:
        return None
    return getattr(errback, "__name__", None)


def stored_kwargs(response: Response) -> str | None:
    """The request's ``cb_kwargs`` as JSON, kept with the page so re-parse can pass them
    (an item handed on to the next page's callback); None when there are none. They came
    through the frontier, so they serialise; one that does not is not kept."""
    request = response.request
    if request is None or not request.cb_kwargs:
        return None
    try:
        return serialize.dumps_value(request.cb_kwargs)
    except serialize.SerializationError:
        return None


class ItemSourceMiddleware:
    """Spider middleware; see the module docstring."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        assert crawler.stats is not None
        self.stats = crawler.stats
        self._said_large: set[str] = set()  # callbacks whose too large cb_kwargs were logged
        self._said_keyless: set[str] = set()  # collections whose collapsed items were said
        # Scrapy's own rule of which statuses reach a callback: one it refuses went to the
        # request's errback, whose output comes here as well. A 404 an errback handled was
        # stored as a page of the callback, and ``scrapy reparse`` ran the callback on it.
        self._http_errors = HttpErrorMiddleware.from_crawler(crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ItemSourceMiddleware:
        return cls(crawler)

    async def process_spider_output(self, response: Response, result: AsyncIterator[Any]
                                    ) -> AsyncIterator[Any]:
        spider = self.crawler.spider
        source: ItemSource | None = None
        page: PageItem | None = None
        limited = False  # a WebfarmSpider with max_pages
        if isinstance(response, Response):
            if getattr(spider, "tags_item_sources", False):  # a WebfarmSpider
                limited = bool(getattr(spider, "max_pages", 0))
                name = callback_name(spider, response)
                if name is not None and not self._reached_callback(response):
                    # The errback's output (an error status): no page of the callback.
                    source = ItemSource(response.url)
                    self.stats.inc_value("webfarm/items/errback_pages_not_stored")
                elif name is not None and response.meta.get(LOCAL):
                    # A page of this worker's session (a login's answer): not kept, as it
                    # could not be fetched again without it; its items keep its URL.
                    source = ItemSource(response.url)
                elif name is not None:
                    page = spider.page_item(response)
                    page.callback = name
                    page.errback = errback_name(spider, response)
                    page.cb_kwargs = self._kept(name, stored_kwargs(response), page.url)
                    spider.count_page(response)
                    self.stats.inc_value("webfarm/items/callback_pages")
                    yield page
                    if page.keeps_stored_content:  # a refetch's 304, 404 or 410: no
                        return  # body for the callback (a generator's code never runs)
                    source = ItemSource(page.url, page=page)
            else:
                source = ItemSource(response.url)
        keyless: dict[str, int] = {}  # collection -> items of this page keyed on it
        async for output in result:
            if page is not None and isinstance(output, PageItem) and output.url == page.url:
                continue  # a parse of its own that calls super().parse(): stored once
            if limited and isinstance(output, Request) and not spider.under_page_limit:
                self.stats.inc_value("webfarm/links/max_pages")
                continue
            if isinstance(output, Request) and getattr(spider, "tags_item_sources", False):
                mark_user_meta(output)  # its page keeps them for re-parse and recrawl
            if (source is not None and not isinstance(output, (Request, PageItem))
                    and output is not None and not has_source(output)):
                attach_source(output, source)
                if source.page is None:
                    self.stats.inc_value("webfarm/items/tagged")
            if output is not None and not isinstance(output, (Request, PageItem)):
                self._count_keyless(output, keyless)
            yield output
        for collection, n in keyless.items():
            if n > 1:
                self._collapsed(collection, n, response)

    def _reached_callback(self, response: Response) -> bool:
        try:
            self._http_errors.process_spider_input(response)
        except HttpError:
            return False
        return True

    def _count_keyless(self, item: Any, keyless: dict[str, int]) -> None:
        spider = self.crawler.spider
        try:
            if key_fields_of(item, spider) == ("source_url",):
                name = collection_of(item, spider)
                keyless[name] = keyless.get(name, 0) + 1
        except ItemError:  # refused by the item store, with its own message
            pass

    def _collapsed(self, collection: str, n: int, response: Response) -> None:
        """Items without a key of their own are keyed on their page: several from one page
        are one document, the last one's (Scrapy's feeds got them all): said once per
        collection, counted in ``webfarm/items/keyless_collapsed``."""
        self.stats.inc_value("webfarm/items/keyless_collapsed", n - 1)
        if collection in self._said_keyless:
            return
        self._said_keyless.add(collection)
        logger.warning(
            "%s yielded %d items without a key from %s into %r: they are stored as one "
            "document keyed on the page, the last one's. %s (said once per collection; "
            "counted in webfarm/items/keyless_collapsed)",
            getattr(self.crawler.spider, "name", "the spider"), n, response.url, collection,
            keyless_advice())

    def _kept(self, callback: str, kwargs: str | None, url: str) -> str | None:
        """``kwargs`` if small enough to keep with the page; else None, said once per
        callback: re-parse cannot give that callback those arguments."""
        if kwargs is None or len(kwargs) <= KWARGS_KEPT:
            return kwargs
        self.stats.inc_value("webfarm/items/cb_kwargs_too_large")
        if callback not in self._said_large:
            self._said_large.add(callback)
            logger.warning("The cb_kwargs of the request for %s are %d characters as JSON; "
                           "over %d they are not kept with the page, so `scrapy reparse` "
                           "cannot run %s on it. Hand the callback an id or a URL, not a "
                           "page's content (logged once per callback)", url, len(kwargs),
                           KWARGS_KEPT, callback)
        return None
