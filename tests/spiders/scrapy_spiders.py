"""Scrapy's own generic spiders, as a user brings them from a plain Scrapy project: a
``CrawlSpider`` with rules and a ``SitemapSpider``, not based on ``WebfarmSpider``. Their
callbacks are private methods of Scrapy's (``_callback``, ``_errback``, ``_parse_sitemap``).
The sitemap spider yields plain dicts without a key, as ``genspider -t crawl``'s template
does: they are stored one per page, in the ``items`` collection. The listings spider
builds each item over two pages, passing it on in ``cb_kwargs``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, ClassVar
from urllib.parse import urlsplit

import scrapy
from scrapy.http import Response
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule, SitemapSpider


@dataclass
class ShopProduct:
    item_collection: ClassVar[str] = "scrapy_products"
    key_fields: ClassVar[tuple[str, ...]] = ("sku",)

    sku: str
    name: str


def product(response: Response) -> Iterator[ShopProduct]:
    sku = response.css(".sku::text").re_first(r"SKU:\s*(\S+)")
    if sku:
        yield ShopProduct(sku=sku, name=response.css("h1::text").get() or "")


class ShopCrawlSpider(CrawlSpider):
    name = "test_crawlspider"
    rules = (
        Rule(LinkExtractor(allow=r"/category/"), follow=True),
        Rule(LinkExtractor(allow=r"/product/"), callback="parse_product",
             errback="product_failed"),
    )

    def __init__(self, start: str = "", *args: Any, **kwargs: Any) -> None:
        self.start_urls = [start]
        self.allowed_domains = [urlsplit(start).hostname or ""]
        super().__init__(*args, **kwargs)

    def parse_product(self, response: Response) -> Iterator[ShopProduct]:
        return product(response)

    def product_failed(self, failure: Any) -> None:
        self.logger.error("product page failed: %s", failure)


class ShopSitemapSpider(SitemapSpider):
    name = "test_sitemapspider"
    sitemap_rules = [(r"/product/", "parse_product")]

    def __init__(self, start: str = "", *args: Any, **kwargs: Any) -> None:
        self.sitemap_urls = [f"{start.rstrip('/')}/sitemap_index.xml"]  # index -> .xml.gz
        super().__init__(*args, **kwargs)

    def parse_product(self, response: Response) -> Iterator[Any]:
        for item in product(response):
            yield {"sku": item.sku, "name": item.name}


@dataclass
class Listing:
    item_collection: ClassVar[str] = "listings"
    key_fields: ClassVar[tuple[str, ...]] = ("sku",)

    department: str
    sku: str = ""
    name: str = ""


class ShopListingSpider(scrapy.Spider):
    """A category page starts a ``Listing``; each product page it links to gets a copy in
    ``cb_kwargs`` and fills it in (Scrapy's way to build an item over several pages)."""

    name = "test_listings"

    def __init__(self, start: str = "", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [start]

    def parse(self, response: Response) -> Iterator[Any]:
        for link in response.css('nav a[href*="/category/"]'):
            yield response.follow(link, self.parse_category, cb_kwargs={
                "listing": Listing(department=link.css("::text").get() or "")})

    def parse_category(self, response: Response, listing: Listing) -> Iterator[Any]:
        for href in response.css('li.product a::attr(href)').getall():
            yield response.follow(href, self.parse_product,
                                  cb_kwargs={"listing": replace(listing)})
        for href in response.css('a[rel="next"]::attr(href)').getall():
            yield response.follow(href, self.parse_category, cb_kwargs={"listing": listing})

    def parse_product(self, response: Response, listing: Listing) -> Iterator[Listing]:
        assert isinstance(listing, Listing), type(listing)  # not a dict: an item again
        for found in product(response):
            yield replace(listing, sku=found.sku, name=found.name)


class DirectorySpider(scrapy.Spider):
    """Starts on a directory page outside ``allowed_domains`` and follows its links into
    them: Scrapy lets a start URL through its offsite filter (``dont_filter``)."""

    name = "test_directory"

    def __init__(self, start: str = "", domains: str = "", *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.start_urls = [start]
        self.allowed_domains = [domains]

    def parse(self, response: Response) -> Iterator[Any]:
        yield from response.follow_all(css="a")
