"""The example spiders' extraction, offline, on saved pages (no network).

``sites/catalogue/`` holds a product page and a category page saved from the test web;
``sites/js_catalogue/`` the same JavaScript product page as served (``product.source.html``)
and as Chromium rendered it (``product.rendered.html``). This is the test every site gets
from ``scrapy genspider -t site``, filled in.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from scrapy.http import HtmlResponse, Request

from spiders.catalogue import CatalogueSpider, Product, price_cents
from spiders.js_catalogue import JsCatalogueSpider

SITES = Path(__file__).parent / "sites"
SHOP = "http://127.0.0.2:8081"


def saved(path: Path, url: str) -> HtmlResponse:
    return HtmlResponse(url, body=path.read_bytes(), request=Request(url))


def test_catalogue_extracts_the_product_of_a_product_page():
    # A link with tracking parameters: the item's url is still the canonical one.
    url = f"{SHOP}/product/WF02-0003?utm_source=nav&utm_medium=category"
    items = list(CatalogueSpider().extract(saved(SITES / "catalogue" / "product.html", url)))
    assert [asdict(i) for i in items] == [{
        "sku": "WF02-0003", "name": "Everyday Workbench", "price_cents": 10524,
        "currency": "USD", "category": "Kitchen", "url": f"{SHOP}/product/WF02-0003"}]
    assert Product.key_fields == ("sku",) and Product.item_collection == "products"


def test_catalogue_extracts_nothing_from_other_pages():
    spider = CatalogueSpider()
    category = saved(SITES / "catalogue" / "category.html", f"{SHOP}/category/kitchen?page=1")
    mirror = saved(SITES / "catalogue" / "product.html", f"{SHOP}/print/product/WF02-0003")
    assert list(spider.extract(category)) == [] and list(spider.extract(mirror)) == []


def test_prices_are_exact_cents():
    assert [price_cents(t) for t in ("$105.24", " $0.99 ", "$7.5", "105.24", None)] == [
        10524, 99, None, None, None]


def test_js_catalogue_needs_the_rendered_page():
    url = "http://127.0.0.15:8081/js/product/WF01-0004"
    spider = JsCatalogueSpider(start="http://127.0.0.15:8081/js/")
    assert list(spider.extract(saved(SITES / "js_catalogue" / "product.source.html", url))) == []
    items = list(spider.extract(saved(SITES / "js_catalogue" / "product.rendered.html", url)))
    assert [asdict(i) for i in items] == [{
        "sku": "WF01-0004", "name": "Compact Skillet", "price_cents": 7334, "currency": "USD",
        "category": "Garden", "url": url}]
