"""WebfarmSpiders written the Scrapy way: callbacks of their own instead of ``extract()``.

``test_detail_callback`` sends each product page to ``parse_product`` (its ``extract()``
only follows a category's products); ``test_own_parse`` overrides ``parse`` itself. Their
pages must be stored and their items tagged with them as the base class's ``parse`` does,
and ``scrapy reparse`` must run those callbacks again (``-a variant=upper`` changes the
extraction: product names in capitals).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import scrapy
from scrapy.http import Response

from spiders.base import WebfarmSpider
from tests.spiders.scrapy_spiders import Listing, ShopProduct, product


class DetailCallbackSpider(WebfarmSpider):
    name = "test_detail_callback"
    follow_links = False  # the category pages' product links only, through extract()

    def __init__(self, variant: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.variant = variant

    def extract(self, response: Response) -> Iterator[Any]:
        for href in response.css("li.product a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_product)

    def parse_product(self, response: Response) -> Iterator[ShopProduct]:
        for item in product(response):
            yield ShopProduct(sku=item.sku, name=item.name.upper() if self.variant else item.name)


class OwnParseSpider(WebfarmSpider):
    name = "test_own_parse"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield {"_collection": "titles", "_key": "url", "url": response.url,
               "title": response.css("title::text").get()}
        for href in response.css('nav a[href*="/category/"]::attr(href), '
                                 'li.product a::attr(href)').getall():
            yield scrapy.Request(response.urljoin(href), callback=self.parse)


class ExtendedParseSpider(WebfarmSpider):
    """A parse of its own that keeps the base class's (pages, extract(), links) and adds to it."""

    name = "test_extended_parse"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield from super().parse(response, **kwargs)
        yield {"_collection": "titles", "_key": "url", "url": response.url,
               "title": response.css("title::text").get()}


class ListingCallbackSpider(WebfarmSpider):
    """Scrapy's item built over two pages: a category page starts a ``Listing`` and hands it
    to each of its product pages in ``cb_kwargs``; ``parse_product`` fills it in."""

    name = "test_listing_callback"
    follow_links = False

    def __init__(self, variant: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.variant = variant

    def extract(self, response: Response) -> Iterator[Any]:
        listing = Listing(department=response.css("h1::text").get() or "")
        for href in response.css("li.product a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_product,
                                  cb_kwargs={"listing": replace(listing)})

    def parse_product(self, response: Response, listing: Listing) -> Iterator[Listing]:
        for found in product(response):
            yield replace(listing, sku=found.sku,
                          name=found.name.upper() if self.variant else found.name)


class BigKwargsSpider(WebfarmSpider):
    """Hands each product page's callback a listing page's whole text (``-a size`` times
    "x"), as a spider might: too large to keep with the page."""

    name = "test_big_cb_kwargs"
    follow_links = False

    def __init__(self, size: str = "0", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.size = int(size)

    def extract(self, response: Response) -> Iterator[Any]:
        for href in response.css("li.product a::attr(href)").getall()[:2]:
            yield response.follow(href, callback=self.parse_product,
                                  cb_kwargs={"listing_html": "x" * self.size})

    def parse_product(self, response: Response, listing_html: str) -> Iterator[ShopProduct]:
        yield from product(response)


class ErrbackCallbackSpider(DetailCallbackSpider):
    """Product pages to ``parse_product`` with an errback, which records the failure."""

    name = "test_errback_callback"

    def extract(self, response: Response) -> Iterator[Any]:
        for href in [*response.css("li.product a::attr(href)").getall(), "/product/NOPE"]:
            yield response.follow(href, callback=self.parse_product, errback=self.failed,
                                  cb_kwargs={"listing": response.url})

    def parse_product(self, response: Response, listing: str = "") -> Iterator[ShopProduct]:
        yield from super().parse_product(response)

    def failed(self, failure: Any) -> Iterator[Any]:
        yield {"_collection": "failures", "_key": "url", "url": failure.request.url,
               "status": getattr(getattr(failure.value, "response", None), "status", None)}


class MetaCallbackSpider(DetailCallbackSpider):
    """Hands the listing's URL to parse_product in meta, the Scrapy way."""

    name = "test_meta_callback"

    def extract(self, response: Response) -> Iterator[Any]:
        for href in response.css("li.product a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_product,
                                  meta={"listing": response.url, "rank": ("top", 1)})

    def parse_product(self, response: Response) -> Iterator[dict[str, Any]]:
        for item in product(response):
            yield {"_collection": "listed", "_key": "sku", "sku": item.sku,
                   "listing": response.meta.get("listing"), "rank": response.meta.get("rank")}
