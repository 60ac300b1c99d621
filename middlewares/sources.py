"""Items of spiders not based on ``WebfarmSpider`` keep the URL of their page.

``WebfarmSpider`` tags each item it extracts with its page (:func:`webfarm.items.attach_source`),
so the item store writes ``source_url`` and ``content_hash``, and keys a dict without a key of
its own on its page. A plain Scrapy spider (``CrawlSpider``, ``SitemapSpider``,
``scrapy.Spider``) does not: its items were stored with an empty ``source_url``, and such a
dict, the item of ``scrapy genspider -t crawl``'s template, could not be stored at all. This
middleware tags them with the response's URL. Their raw pages are still not kept
(``content_hash`` stays empty): only ``WebfarmSpider`` stores pages, and re-parse needs its
``extract()``.
"""

from __future__ import annotations

from typing import Any

from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.spidermiddlewares.base import BaseSpiderMiddleware

from webfarm.items import ItemSource, PageItem, attach_source, has_source


class ItemSourceMiddleware(BaseSpiderMiddleware):
    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ItemSourceMiddleware:
        if getattr(crawler.spider, "tags_item_sources", False):
            raise NotConfigured  # a WebfarmSpider tags its own items: nothing to do per output
        return cls(crawler)

    def get_processed_item(self, item: Any, response: Response | None) -> Any:
        if response is not None and not isinstance(item, PageItem) and not has_source(item):
            attach_source(item, ItemSource(response.url))
            self.crawler.stats.inc_value("webfarm/items/tagged")
        return item
