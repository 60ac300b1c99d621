"""The example spiders, end to end: real crawls of the test web into MongoDB.

``catalogue`` extracts the shop's products over plain HTTP and upserts them on their
SKU; ``js_catalogue`` crawls a catalogue that only JavaScript builds, through the
render ladder's browser rung (Chromium).
"""

from __future__ import annotations

import dataclasses
import json
import urllib.request

import pymongo
import redis

from tests import runner
from tests.testweb import Response, TestWeb
from tests.testweb.jscatalogue import JsCatalogue

ITEM_FIELDS = ("sku", "name", "price_cents", "currency", "category", "url")


def crawl(spider: str, start: str, stores: dict, timeout: float = 180, *args: str) -> str:
    env = runner.env_for(**stores, WEBFARM_IDLE_TIMEOUT="1")
    result = runner.scrapy(["crawl", spider, "-a", f"start={start}", *args], env, timeout)
    assert result.returncode == 0, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    return result.output


def stat(output: str, name: str) -> int:
    for line in output.splitlines():
        if f"'{name}':" in line:
            return int(line.split(":")[-1].strip().rstrip(",}"))
    return 0


def database(stores: dict):
    return pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]


class UpperNames:
    """A project's cleaning pipeline that returns a new item (``dataclasses.replace``)
    instead of changing the one it got."""

    def process_item(self, item):
        if dataclasses.is_dataclass(item) and hasattr(item, "name"):
            return dataclasses.replace(item, name=item.name.upper())
        return item


def test_an_item_a_pipeline_made_anew_keeps_its_page(web, stores):
    """The new object reached the item store without its page: products were stored
    with an empty source_url and no content_hash. The pipeline runs first of all (50),
    before webfarm's own, which once noted the page at 100."""
    base = web.base_urls[0]
    # As a spider's custom_settings or scrapyd's setting= give it: the project's own pipeline
    # alone. It replaced the storage pipelines once, and no page or item was stored.
    pipelines = {f"{__name__}.UpperNames": 50}
    crawl("catalogue", f"{base}/", stores, 180, "-s", f"ITEM_PIPELINES={json.dumps(pipelines)}")
    db = database(stores)
    pages = {doc["url"]: doc for doc in db.pages.find()}
    products = list(db.products.find())
    assert len(products) == len(web.shop(base).products)
    for doc in products:
        assert doc["name"].isupper()  # the pipeline's item was stored
        assert doc["source_url"] in (f"{base}/product/{doc['_id']}",
                                     f"{base}/print/product/{doc['_id']}")
        assert doc["content_hash"] == pages[doc["source_url"]]["content_hash"]


def test_catalogue_stores_each_product_once_upserted_on_its_sku(web, stores):
    base = web.base_urls[0]
    shop = web.shop(base)
    first = crawl("catalogue", f"{base}/", stores)
    db = database(stores)

    products = {doc["_id"]: doc for doc in db.products.find()}
    assert set(products) == set(shop.products)  # every product, once (the key is the SKU)
    pages = {doc["url"]: doc for doc in db.pages.find()}
    assert set(pages) == web.expected_pages(base)  # the base class stored every page
    for sku, product in shop.products.items():
        doc = products[sku]
        url = f"{base}/product/{sku}"
        assert {f: doc[f] for f in ITEM_FIELDS} == {
            "sku": sku, "name": product.name, "price_cents": product.price_cents,
            "currency": "USD", "category": shop.categories[product.category].title,
            "url": url}
        # Where it came from: the page's URL and content hash, and when.
        assert doc["source_url"] == url and doc["content_hash"] == pages[url]["content_hash"]
        assert doc["extracted_at"] is not None and doc["extractor_version"] == "1"
    assert stat(first, "webfarm/items/created") == len(shop.products)

    # The same crawl again (fresh frontier, same database): nothing changes, but for one
    # product taken off the site, whose page now says so.
    gone = sorted(shop.products)[0]
    web.route(f"/product/{gone}", Response.html(
        "<html><body><h1>This product is no longer available</h1></body></html>"),
        host=base, prefix=False)
    redis.Redis.from_url(stores["REDIS_URL"]).flushall()
    second = crawl("catalogue", f"{base}/", stores)
    again = {doc["_id"]: doc for doc in db.products.find()}
    assert set(again) == set(products)  # nothing deletes what a site no longer shows
    for sku, doc in again.items():
        before = products[sku]
        stamps = ("extracted_at", "source_fetched_at")  # when, not what
        assert {k: v for k, v in doc.items() if k not in stamps} == \
            {k: v for k, v in before.items() if k not in stamps}
    assert again[gone]["extracted_at"] == products[gone]["extracted_at"]
    assert stat(second, "webfarm/items/unchanged") == len(shop.products) - 1
    # The README's query for items a page no longer yields finds it, and only it.
    stale = db.products.aggregate([
        {"$lookup": {"from": "pages", "localField": "source_url", "foreignField": "url",
                     "as": "page"}},
        {"$unwind": "$page"},
        {"$match": {"$expr": {"$lt": ["$extracted_at", "$page.last_changed_at"]}}},
    ])
    assert [doc["_id"] for doc in stale] == [gone]
    assert stat(second, "webfarm/items/created") == stat(second, "webfarm/items/changed") == 0
    # Once nothing was in flight (the last page parsed, or the last response in) its batch
    # went without waiting for pages that could not come: the engine's idle state was read
    # from this Scrapy, and each crawl's end was seen.
    assert stat(first, "webfarm/index/idle_batches") >= 1
    assert stat(second, "webfarm/index/idle_batches") >= 1


def test_js_catalogue_relies_on_the_browser_rung(web, stores):
    base = web.base_urls[1]
    catalogue = JsCatalogue(web.shop(base), count=5).install(web, base)
    product = catalogue.products[0]
    with urllib.request.urlopen(f"{base}/js/product/{product.sku}", timeout=10) as resp:
        source = resp.read().decode()
    # Over plain HTTP there is nothing to extract: no name, no SKU, no product links.
    assert product.name not in source and product.sku not in source

    output = crawl("js_catalogue", f"{base}/js/", stores, timeout=240)
    db = database(stores)
    products = {doc["_id"]: doc for doc in db.products.find()}
    assert set(products) == {p.sku for p in catalogue.products}
    for p in catalogue.products:
        assert {f: products[p.sku][f] for f in ITEM_FIELDS} == {
            "sku": p.sku, "name": p.name, "price_cents": p.price_cents, "currency": "USD",
            "category": catalogue.category_title(p), "url": f"{base}/js/product/{p.sku}"}
    pages = {doc["url"]: doc for doc in db.pages.find()}
    expected = {f"{base}/js/"} | {f"{base}/js/product/{p.sku}" for p in catalogue.products}
    assert set(pages) == expected
    assert {doc["fetch_method"] for doc in pages.values()} == {"browser"}
    assert stat(output, "webfarm/render/browser") >= len(expected)
    # Nothing of the host outside the JavaScript catalogue was fetched (Chromium may ask
    # for /favicon.ico on its own while a page is open; that is not the crawler's request).
    paths = {h.path for h in web.hits_for(host=base)}
    assert all(p.startswith("/js/") or p in ("/robots.txt", "/favicon.ico")
               for p in paths), paths


def test_two_shops_whose_skus_meet_are_said_to_share_item_keys(stores):
    """``catalogue`` keys products on their SKU: one shop's. Crawled over two shops whose
    SKUs meet, each product document held whichever shop's page came last, and every
    re-parse swapped some (418 and 558 "changed" for 279 documents), unsaid."""
    with TestWeb(hosts=("127.0.0.25", "127.0.0.26"), categories=1,
                 products_per_category=3) as shops:
        a, b = shops.base_urls
        assert {p.sku for p in shops.shop(a).products.values()} == {
            p.sku for p in shops.shop(b).products.values()}
        output = crawl("catalogue", f"{a}/,{b}/", stores)
    said = [line for line in output.splitlines() if "came from two pages" in line]
    assert len(said) == 1, said or output[-3000:]
    assert "'products' item 'WF01-000" in said[0] and "their key (sku)" in said[0]
    assert stat(output, "webfarm/items/key_clashes") == 3
