"""Items that cannot be stored fail alone: a clear error, the page dead-lettered at once
(a refetch gives the same item), the rest of the page and of the batch stored."""

from __future__ import annotations

import datetime as dt
import json
import time
from urllib.parse import urlsplit

import pytest

from tests import crawlcheck, runner
from webfarm.itemstore import CREATED, ItemEntry, ItemError, ItemStore, make_entry

SPIDERS = ["-s", "SPIDER_MODULES=spiders,tests.spiders"]
NOW = dt.datetime(2026, 12, 5, tzinfo=dt.timezone.utc)
# A data team's rule on its products collection: SKUs end in an even digit.
EVEN_SKUS = {"$jsonSchema": {"properties": {"sku": {"bsonType": "string",
                                                    "pattern": "[02468]$"}}}}


@pytest.mark.parametrize(("item", "message"), [
    ({"_key": "sku", "sku": ["A1", "A2"]}, r"several values for its key field\(s\) sku.*\.get\(\)"),
    ({"_key": "sku", "sku": "A1", "price.usd": 1}, r"'price\.usd'.*without '\.' or a leading '\$'"),
    ({"_key": "sku", "sku": "A1", "$set": 1}, r"'\$set'.*rename"),
    ({"_key": "sku", "sku": "A1", "review": json.loads('"great \\ud83d"')},
     r"not valid Unicode \('\\ud83d', half of a surrogate pair.*encode\('utf-8', 'replace'\)"),
    ({"_key": "sku", "sku": "A1", "text": "x" * (17 * 2**20)},
     r"is 17\.0 MiB as BSON; MongoDB stores documents up to 16 MiB\. Keep long text out"),
])
def test_an_item_mongodb_cannot_hold_is_refused_with_what_to_fix(item, message):
    with pytest.raises(ItemError, match=message):
        make_entry(item, None, "http://s/1", None, NOW)


@pytest.mark.parametrize(("item", "source", "message"), [
    ({"_key": "sku", "name": "x"}, "http://s/1",
     r"no value for its key field\(s\) sku \(from http://s/1\); fill it in the spider, or "
     r"name another key"),
    # A dict a spider yields from start(): no page, so no source_url to key on.
    ({"title": "x"}, "",
     r"no value for its key field\(s\) source_url: it does not come from a page \(it was "
     r"yielded by start\(\) or by an errback\).*_key in a dict\)$"),
])
def test_an_item_with_no_key_says_where_to_get_one(item, source, message):
    with pytest.raises(ItemError, match=message):
        make_entry(item, None, source, None, NOW)


def test_a_document_the_server_refuses_fails_alone_and_the_batch_is_stored(mongo_db):
    mongo_db.create_collection("products", validator=EVEN_SKUS)
    store = ItemStore(mongo_db)
    entries = [make_entry({"_collection": "products", "_key": "sku", "sku": sku},
                          None, f"http://s/{sku}", None, NOW) for sku in ("A2", "A3", "A4")]
    # One past make_entry's checks (built by hand): the server's own refusal, too large.
    huge = ItemEntry("notes", "big", ("id",), {"id": "big", "text": "x" * (17 * 2**20)},
                     "http://s/big", None, NOW, None)
    small = make_entry({"_collection": "notes", "id": "small"}, None, "http://s/n", None, NOW)
    results = store.write_items([*entries, huge, small])  # before: one BulkWriteError
    assert [r if isinstance(r, str) else "refused" for r in results] == [
        CREATED, "refused", CREATED, "refused", CREATED]
    assert str(results[1]).startswith('MongoDB refused products item "A3": Document failed '
                                      "validation (code 121)")
    assert "(code 10334)" in str(results[3])
    assert sorted(d["_id"] for d in mongo_db.products.find()) == ["A2", "A4"]
    assert [d["_id"] for d in mongo_db.notes.find()] == ["http://s/n"]
    # The same batch again: stored ones unchanged, the refused one refused again.
    again = store.write_items(entries)
    assert again[0] == again[2] == "unchanged" and isinstance(again[1], ItemError)


def test_a_crawl_dead_letters_pages_whose_items_are_refused_and_stores_the_rest(
        web, stores, mongo_db):
    base = web.base_urls[0]
    mongo_db.create_collection("products", validator=EVEN_SKUS)
    env = runner.env_for(**stores, WEBFARM_STORAGE_RETRY_SECONDS="120")
    args = ["crawl", "test_products", "-a", f"start={base}/", *SPIDERS]
    started = time.monotonic()
    crawl = runner.scrapy(args, env, 180)
    assert crawl.returncode == 0, crawl.output[-3000:]
    # Nothing waited out a refusal as if MongoDB were down (120 s a batch).
    assert time.monotonic() - started < 90
    skus = 36  # 3 categories x 12 products (TestWeb defaults)
    stored = {d["_id"] for d in mongo_db.products.find()}
    assert len(stored) == skus // 2 and all(s[-1] in "02468" for s in stored)

    dead = crawlcheck.dead_letters(stores["REDIS_URL"], "test_products")
    # Each odd SKU's product page and its print version; each fetched once, not retried.
    assert len(dead) == skus, sorted(dead)
    paths = {url: urlsplit(url)._replace(scheme="", netloc="", fragment="").geturl()
             for url in dead}
    for url, letter in dead.items():
        assert int(letter["attempts"]) <= 1 and len(web.hits_for(path=paths[url])) == 1
        assert "item not stored: MongoDB refused products item" in letter["reason"]
        assert "Document failed validation (code 121)" in letter["reason"]
    assert crawlcheck.stat(crawl.output, "webfarm/items/refused") == skus
    # One line each, without the item or a traceback (a 17 MB item made a 17 MB line)
    assert "Error processing" not in crawl.output and "Traceback" not in crawl.output
    said = [line for line in crawl.output.splitlines() if "Item not stored: " in line]
    assert len(said) == skus and all("ERROR" in line and "MongoDB refused products item"
                                     in line for line in said), said[:3]
    # The pages themselves and their other items are stored.
    pages = len(web.expected_pages(base))
    assert mongo_db.pages.count_documents({}) == pages
    assert mongo_db.page_title.count_documents({}) == pages
    assert mongo_db.skus_seen.count_documents({}) == skus

    # The rule was wrong: drop it, requeue the dead letters, crawl again.
    mongo_db.command("collMod", "products", validator={})
    requeued = runner.scrapy(["dlq", "test_products", "--requeue", *SPIDERS], env)
    assert f"requeued {skus} dead letters" in requeued.output, requeued.output[-2000:]
    web.clear_hits()
    again = runner.scrapy(args, env, 180)
    assert again.returncode == 0, again.output[-3000:]
    assert mongo_db.products.count_documents({}) == skus
    assert crawlcheck.dead_letters(stores["REDIS_URL"], "test_products") == {}
    # Only the requeued pages were fetched again.
    assert sorted(h.path for h in web.hits if h.path != "/robots.txt") == sorted(
        paths.values())


def test_a_crawl_dead_letters_pages_whose_index_document_is_refused(web, stores, mongo_db):
    """A data team's rule on ``pages`` (no query-string URLs) refuses the listing pages'
    documents. Before, each batch holding one failed as a whole and was retried as if
    MongoDB were down, then dead-lettered as StorageUnavailable with the rest of its batch."""
    base = web.base_urls[0]
    mongo_db.create_collection("pages", validator={"$jsonSchema": {"properties": {
        "url": {"bsonType": "string", "pattern": "^[^?]*$"}}}})
    env = runner.env_for(**stores, WEBFARM_STORAGE_RETRY_SECONDS="120")
    args = ["crawl", "generic", "-a", f"start={base}/"]
    started = time.monotonic()
    crawl = runner.scrapy(args, env, 180)
    assert crawl.returncode == 0, crawl.output[-3000:]
    assert time.monotonic() - started < 90  # no refusal waited out as an outage
    expected = web.expected_pages(base)
    listings = {url for url in expected if "?" in url}
    assert len(listings) == 9  # 3 categories x 3 pages (TestWeb defaults)
    assert {d["url"] for d in mongo_db.pages.find()} == expected - listings
    dead = crawlcheck.dead_letters(stores["REDIS_URL"])
    assert set(dead) == listings, sorted(dead)  # each fetched once, not retried
    for letter in dead.values():
        assert int(letter["attempts"]) <= 1
        assert "MongoDB refused the index document of" in letter["reason"]
        assert "Document failed validation (code 121)" in letter["reason"]
        assert "scrapy dlq generic --requeue" in letter["reason"]
    assert crawlcheck.stat(crawl.output, "webfarm/index/refused") == len(dead)
    # No content counts a refused page (before: each listing's, once).
    assert sum(c["url_count"] for c in mongo_db.contents.find()) == (
        mongo_db.pages.count_documents({}))

    # The rule was wrong: drop it, requeue the dead letters, crawl again.
    mongo_db.command("collMod", "pages", validator={})
    requeued = runner.scrapy(["dlq", "generic", "--requeue"], env)
    assert f"requeued {len(dead)} dead letters" in requeued.output, requeued.output[-2000:]
    web.clear_hits()
    again = runner.scrapy(args, env, 180)
    assert again.returncode == 0, again.output[-3000:]
    assert {d["url"] for d in mongo_db.pages.find()} == expected
    assert sorted(h.path for h in web.hits if h.path != "/robots.txt") == sorted(
        urlsplit(url)._replace(scheme="", netloc="").geturl() for url in listings)
    assert crawlcheck.dead_letters(stores["REDIS_URL"]) == {}
    # Each stored page counted once on its content.
    assert sum(c["url_count"] for c in mongo_db.contents.find()) == (
        mongo_db.pages.count_documents({}))


def test_items_without_a_key_from_one_page_are_said_to_be_stored_as_one(caplog):
    """A listing page's five dicts without a key are keyed on the page: one document, the
    last product's. Scrapy's feed got all five, the store one, and nothing said so."""
    import asyncio

    from scrapy import Request, Spider
    from scrapy.http import HtmlResponse
    from scrapy.utils.test import get_crawler

    from middlewares.sources import ItemSourceMiddleware

    crawler = get_crawler(Spider)
    crawler.spider = Spider("listing")
    mw = ItemSourceMiddleware.from_crawler(crawler)
    url = "http://shop.test/category/garden"
    response = HtmlResponse(url, body=b"<html></html>", request=Request(url))

    async def callback():
        for i in range(5):
            yield {"name": f"Chisel {i}"}
        yield {"sku": "WF01", "_key": "sku"}  # keyed: not counted
        yield Request("http://shop.test/next")

    async def run():
        return [out async for out in mw.process_spider_output(response, callback())]

    caplog.set_level("WARNING")
    for _ in range(2):  # two such pages: said once
        assert len(asyncio.run(run())) == 7  # every item and request still goes on
    said = [r.getMessage() for r in caplog.records if "without a key" in r.message]
    assert said == [
        f"listing yielded 5 items without a key from {url} into 'items': they are stored as "
        "one document keyed on the page, the last one's. Give them a key: key_fields on the "
        "Item class, '_key' in a dict, or the spider's item_key_fields (said once per "
        "collection; counted in webfarm/items/keyless_collapsed)"]
    assert crawler.stats.get_value("webfarm/items/keyless_collapsed") == 8
