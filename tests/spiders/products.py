"""A test spider that extracts products from the test web's catalogue.

Three item kinds, one per way a spider can declare storage: a dataclass keyed
on SKU, a ``scrapy.Item`` keyed on the page URL, and a plain dict naming its
collection and key. ``-a variant=cents`` changes the extraction (prices in
cents), which a re-parse must report as changed items.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import scrapy
from scrapy.http import Response

from spiders.base import WebfarmSpider


@dataclass
class Product:
    key_fields: ClassVar[tuple[str, ...]] = ("sku",)
    item_collection: ClassVar[str] = "products"

    sku: str
    name: str
    price: str


class PageTitle(scrapy.Item):
    key_fields = ("url",)
    url = scrapy.Field()
    title = scrapy.Field()


class ProductsSpider(WebfarmSpider):
    name = "test_products"
    extractor_version = "1"

    def __init__(self, variant: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.variant = variant
        if variant == "cents":
            self.extractor_version = "2"

    def extract(self, response: Response) -> Iterator[Any]:
        yield PageTitle(url=response.url, title=response.css("title::text").get())
        product = response.css("article.product")
        if not product:
            return
        sku = product.css(".sku::text").re_first(r"SKU:\s*(\S+)")
        price = product.css(".price::text").get("").strip()
        if self.variant == "cents":
            price = str(round(float(price.lstrip("$").replace(",", "")) * 100))
        yield Product(sku=sku, name=product.css("h1::text").get(), price=price)
        yield {"_collection": "skus_seen", "_key": "sku", "sku": sku, "shop": response.css(
            "header a::text").get()}
