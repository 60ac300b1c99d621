"""Example site spider for a catalogue built by JavaScript: the browser rung at work.

    scrapy crawl js_catalogue -a start=http://SHOP/js/

The pages' HTML holds an empty ``<div id="app">`` and a script; names, prices and even
the links to the products exist only after the script ran. With ``render = "auto"``
the fetch layer (``middlewares/render.py``) fetches a page over plain HTTP, sees that it
needs JavaScript (the empty app root, or no ``render_check`` match) and fetches it again
in Chromium; after a couple of such pages it remembers, in Redis for every worker, that
this host needs the browser and sends its later pages there directly. ``extract`` and
link following then work on the rendered page as on any other.

``render = "browser"`` would skip the HTTP attempt (right when every page of a site
needs JavaScript); ``"auto"`` is the safe choice when only some pages do.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from scrapy.http import Response

from spiders.base import WebfarmSpider
from spiders.catalogue import Product
from webfarm.urls import canonical_url


class JsCatalogueSpider(WebfarmSpider):
    name = "js_catalogue"
    render = "auto"
    # What a complete page has: a product card or the product list. A page without
    # either is rendered in the browser.
    render_check = "article.product, ul.products"
    extractor_version = "1"

    @classmethod
    def check_arguments(cls, **spargs: Any) -> dict[str, Any]:
        args = super().check_arguments(**spargs)
        if not args["start"]:
            raise ValueError("js_catalogue needs -a start=URL (the catalogue's listing page)")
        return args

    def extract(self, response: Response) -> Iterator[Product]:
        card = response.css("article.product")
        if not card:
            return
        sku = (card.attrib.get("data-sku") or "").strip()
        name = (card.css(".name::text").get() or "").strip()
        cents = card.css(".price::attr(data-cents)").get()
        if not (sku and name and cents and cents.isdigit()):
            self.logger.warning("Incomplete product on %s", response.url)
            return
        yield Product(sku=sku, name=name, price_cents=int(cents), currency="USD",
                      category=(card.css(".category::text").get() or "").strip(),
                      url=canonical_url(response.url))
