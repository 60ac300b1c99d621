"""Example site spider: the products of the demo catalogue, upserted on their SKU.

    scrapy crawl catalogue                                  # the `make demo` shop
    scrapy crawl catalogue -a start=http://127.0.0.3:8081/  # the other demo shop, instead

What it teaches:

* a site spider is the base class plus :meth:`~CatalogueSpider.extract`; the base
  class already stores every page (raw, in the blob store) and follows links;
* an item declares where it is stored (``item_collection``) and what identifies it
  (``key_fields``): a product crawled twice, or reached through a mirror such as
  ``/print/product/<sku>``, is one document, updated in place. A SKU is one shop's
  identifier: the two demo shops' SKUs meet, so their products share one document each
  (a crawl or re-parse of both says so: "came from two pages with other values"); a
  spider of several shops adds the shop to its key, ``key_fields = ("shop", "sku")``;
* prices are kept exact (integer cents), not as floats;
* ``render = "http"``: the site needs no JavaScript, so the browser is never used.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar
from urllib.parse import urlsplit

from scrapy.http import Response

from spiders.base import WebfarmSpider
from webfarm.urls import canonical_url

_PRICE = re.compile(r"^\s*\$\s*(\d+)\.(\d{2})\s*$")


@dataclass
class Product:
    """One product of the catalogue (MongoDB collection ``products``, ``_id`` = SKU)."""

    item_collection: ClassVar[str] = "products"
    key_fields: ClassVar[tuple[str, ...]] = ("sku",)

    sku: str
    name: str
    price_cents: int
    currency: str
    category: str
    url: str


def price_cents(text: str | None) -> int | None:
    """``"$12.34"`` -> 1234; None when the text is not a dollar price."""
    match = _PRICE.match(text or "")
    return int(match[1]) * 100 + int(match[2]) if match else None


class CatalogueSpider(WebfarmSpider):
    name = "catalogue"
    start_urls = ["http://127.0.0.2:8081/"]  # `make demo` serves the catalogue here
    render = "http"
    extractor_version = "1"

    def extract(self, response: Response) -> Iterator[Product]:
        # The canonical URL: a link with ?utm_source=... must not make the item "changed".
        # Product pages only: /print/product/<sku> has the same body (the index records it
        # as a duplicate); extracting it too would store the same document again.
        if not urlsplit(response.url).path.startswith("/product/"):
            return
        card = response.css("article.product")
        sku = (card.css(".sku::text").get() or "").removeprefix("SKU:").strip()
        name = (card.css("h1::text").get() or "").strip()
        cents = price_cents(card.css(".price::text").get())
        if not (sku and name) or cents is None:
            self.logger.warning("No product found on %s (page layout changed?)", response.url)
            self.crawler.stats.inc_value("catalogue/product_missing")
            return
        category = (card.xpath(".//p[starts-with(normalize-space(), 'Category:')]/a/text()")
                    .get() or "").strip()
        yield Product(sku=sku, name=name, price_cents=cents, currency="USD",
                      category=category, url=canonical_url(response.url))
