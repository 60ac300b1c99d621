"""``Reparser`` in process, on a real SecantusDB (fail points) and a real blob store.

It reads bodies ahead, a bounded number at once, one read for the pages that share a body.
A store down for a while is waited for and no page is skipped or read twice; one down for
longer than the limit stops the run, and a second run finishes it; a blob that is missing
or damaged skips its page and is counted, and never passes for an empty page.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import re
import threading
import time
from pathlib import Path
from typing import ClassVar

import pymongo
import pytest
from scrapy.crawler import Crawler
from scrapy.exceptions import DropItem
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.project import get_project_settings
from scrapy.utils.test import get_crawler
from twisted.internet.defer import Deferred

from tests.spiders.products import PageTitle, ProductsSpider
from webfarm.batching import StorageUnavailable
from webfarm.blobstore import FileBlobStore, blob_key
from webfarm.index import IndexStore
from webfarm.itemstore import _CREATED_HERE, ItemStore, _before_batch, item_hash, make_entry
from webfarm.reparse import Reparser
from webfarm.reparsepages import shard_range
from webfarm.reparsepipes import PipelineNeedsReactor, ProjectPipelines
from webfarm.urls import url_fingerprint

SHOP = "http://shop.test"


@pytest.fixture()
def index(mongo_uri, mongo_db_name):
    store = IndexStore(mongo_uri, mongo_db_name)
    yield store
    store.client.drop_database(mongo_db_name)
    store.close()


@pytest.fixture()
def blobs(tmp_path: Path) -> FileBlobStore:
    return FileBlobStore(tmp_path / "blobs")


@pytest.fixture()
def fail_point(mongo_uri):
    """``arm(commands, mode, **data)`` sets SecantusDB's ``failCommand``; off at the end.
    By default the server drops the connection, as one that goes down does."""
    admin = pymongo.MongoClient(mongo_uri).admin

    def arm(commands: list[str], mode: object, **data: object) -> None:
        data = data or {"closeConnection": True}
        admin.command("configureFailPoint", "failCommand", mode=mode,
                      data={"failCommands": commands, **data})

    yield arm
    admin.command("configureFailPoint", "failCommand", mode="off")
    admin.client.close()


def store_pages(index: IndexStore, blobs: FileBlobStore, count: int, per_body: int = 1,
                skus: int = 0) -> list[str]:
    """``count`` stored pages of the spider, ``per_body`` URLs sharing each body (mirrors);
    with ``skus``, each page shows one product of that many (SKU ``S<n % skus>``). Their
    URLs."""
    now = dt.datetime.now(dt.timezone.utc)
    urls = []
    for i in range(count):
        url = f"{SHOP}/page/{i}"
        n = i // per_body
        product = (f'<article class="product"><h1>Thing {n % skus}</h1><p class="sku">SKU: '
                   f'S{n % skus}</p><p class="price">$1.00</p></article>') if skus else ""
        body = (f"<html><head><title>Page {n}</title></head><body>{product}<p>{n}</p></body>"
                "</html>").encode()
        digest = hashlib.sha256(body).hexdigest()
        blobs.put_once(blob_key(digest), body, {"url": url})
        index.pages.insert_one({
            "_id": url_fingerprint(url), "url": url, "spider": ProductsSpider.name,
            "status": 200, "content_type": "text/html; charset=utf-8", "encoding": "utf-8",
            "content_hash": digest, "blob_key": blob_key(digest), "fetched_at": now})
        urls.append(url)
    return urls


def reparser(index: IndexStore, blobs: FileBlobStore, **kwargs) -> Reparser:
    spider = ProductsSpider.from_crawler(get_crawler(ProductsSpider), start=f"{SHOP}/")
    return Reparser(spider, index, blobs, ItemStore(index.db), **kwargs)


def titles(index: IndexStore) -> dict[str, str]:
    return {d["url"]: d["title"] for d in index.db.page_title.find()}


@pytest.mark.parametrize(("failure", "retries"), [
    ({"closeConnection": True}, 2),  # the server went away: waited out as an outage
    ({"errorCode": 43}, 0),  # CursorNotFound: it timed the cursor out (idle 10 min)
])
def test_a_cursor_lost_mid_run_resumes_after_the_last_page(index, blobs, fail_point, failure,
                                                            retries):
    urls = store_pages(index, blobs, 30, per_body=3)  # 3 URLs a body: batches of 4 cut them
    fail_point(["getMore"], {"times": 2}, **failure)  # two of the cursor's next batches fail
    seen: list[str] = []
    job = reparser(index, blobs, page_batch=4, batch_size=5)
    extract = job.callback
    job.callback = lambda response: (seen.append(response.url), extract(response))[1]

    stats = job.run()
    assert sorted(seen) == sorted(urls)  # every page once: none skipped, none read twice
    assert stats.pages == 30 and stats.created == 30 and stats.retries == retries
    assert set(titles(index)) == set(urls)


def test_item_writes_wait_for_mongodb(index, blobs, fail_point):
    urls = store_pages(index, blobs, 12)
    fail_point(["insert", "update"], {"times": 3})
    stats = reparser(index, blobs, batch_size=4).run()
    assert stats.retries == 3 and stats.errors == 0
    assert stats.created == 12 and stats.items == 12
    assert titles(index) == {u: f"Page {u.rsplit('/', 1)[1]}" for u in urls}


def test_a_store_down_past_the_limit_stops_the_run_and_a_second_run_finishes(
        index, blobs, fail_point):
    urls = store_pages(index, blobs, 12)
    fail_point(["insert", "update"], "alwaysOn")
    job = reparser(index, blobs, batch_size=4, retry_seconds=0.5)
    with pytest.raises(StorageUnavailable, match=r"writing items to MongoDB failed for [\d.]+s "
                       r"\(WEBFARM_STORAGE_RETRY_SECONDS=0.5\): AutoReconnect"):
        job.run()
    # the first batch failing to land while the second was parsed: 8 pages read, none stored
    assert job.stats.pages == 8 and job.stats.items == 0 and job.stats.retries >= 1
    assert titles(index) == {}

    fail_point(["insert", "update"], "off")
    again = reparser(index, blobs, batch_size=4).run()
    assert again.pages == 12 and again.created == 12 and set(titles(index)) == set(urls)


def test_items_the_server_refuses_are_counted_as_errors_and_the_rest_stored(
        index, blobs, caplog):
    store_pages(index, blobs, 8, skus=8)  # SKUs S0..S7, one a page
    index.db.create_collection("products", validator={"$jsonSchema": {"properties": {
        "sku": {"pattern": "[0-3]$"}}}})
    stats = reparser(index, blobs, batch_size=5).run()
    assert stats.pages == 8 and stats.errors == 4
    assert sorted(d["_id"] for d in index.db.products.find()) == ["S0", "S1", "S2", "S3"]
    assert stats.created == 8 + 4 + 8  # titles, the products allowed, skus_seen
    refused = [r.getMessage() for r in caplog.records if "MongoDB refused" in r.getMessage()]
    assert len(refused) == 4 and "Document failed validation (code 121)" in refused[0]


def test_an_invalid_item_is_skipped_alone_and_the_pages_other_items_are_stored(
        index, blobs, caplog):
    store_pages(index, blobs, 4, skus=4)
    job = reparser(index, blobs)
    extract = job.callback

    def with_a_bad_item(response):
        items = list(extract(response))
        return [items[0], {"_key": "sku", "sku": ["S1", "S2"]}, *items[1:]]  # .getall()

    job.callback = with_a_bad_item
    stats = job.run()
    assert stats.pages == 4 and stats.errors == 4
    assert stats.created == 4 * 3  # title, product and skus_seen of every page
    assert index.db.products.count_documents({}) == 4
    assert any("several values for its key" in r.getMessage() for r in caplog.records)


def test_missing_and_damaged_blobs_skip_their_page_and_are_counted(index, blobs, tmp_path):
    urls = store_pages(index, blobs, 6)
    docs = {d["url"]: d for d in index.pages.find()}
    (blobs.root / docs[urls[1]]["blob_key"]).unlink()  # lost
    damaged = blobs.root / docs[urls[2]]["blob_key"]
    damaged.write_bytes(damaged.read_bytes()[:-8])  # cut short: zstd would give b"" quietly
    stats = reparser(index, blobs).run()
    assert stats.pages == 6 and stats.missing_blobs == 1 and stats.damaged_blobs == 1
    assert set(titles(index)) == {urls[0], *urls[3:]}  # no item from a page it could not read
    assert "1 missing blobs, 1 damaged" in stats.line()


class CountingStore(FileBlobStore):
    """The real file store, counting reads and how many run at once (each takes 20 ms,
    a far S3 endpoint's round trip)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads = self.active = self.peak = 0
        self.lock = threading.Lock()

    def get(self, key: str) -> bytes:
        with self.lock:
            self.reads += 1
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            time.sleep(0.02)
            return super().get(key)
        finally:
            with self.lock:
                self.active -= 1


def test_bodies_are_read_ahead_a_bounded_number_at_once_one_read_a_body(index, tmp_path):
    blobs = CountingStore(tmp_path / "blobs")
    urls = store_pages(index, blobs, 40, per_body=2)
    stats = reparser(index, blobs, blob_reads=4).run()
    assert stats.pages == 40 and stats.created == 40 and set(titles(index)) == set(urls)
    assert blobs.reads == 20  # the two pages of a body share its read
    assert blobs.peak == 4  # reads overlap, never more than blob_reads at once


def test_a_page_sharing_another_s_body_is_decoded_as_that_body_was(index, blobs):
    """The same text in windows-1251 and in UTF-8 is one content: one blob, the first
    page's bytes. The second page's own fetch said UTF-8; its re-parse reads the
    windows-1251 bytes, and must decode them as such, not as mojibake."""
    from webfarm.content import content_hash

    now = dt.datetime.now(dt.timezone.utc)
    html = "<html><head><title>Привет мир</title></head><body><p>Цена</p></body></html>"
    fetched = [("cp1251", "text/html; charset=windows-1251"), ("utf-8", "text/html")]
    hashes = set()
    for i, (encoding, content_type) in enumerate(fetched):
        url, body = f"{SHOP}/page/{i}", html.encode(encoding)
        digest = content_hash(body, content_type, encoding)
        hashes.add(digest)
        # as the blob pipeline writes it: put once, with the metadata of the first page
        blobs.put_once(blob_key(digest), body, {"url": url, "content-type": content_type,
                                                "encoding": encoding})
        index.pages.insert_one({
            "_id": url_fingerprint(url), "url": url, "spider": ProductsSpider.name,
            "status": 200, "content_type": content_type, "encoding": encoding,
            "content_hash": digest, "blob_key": blob_key(digest), "fetched_at": now})
    assert len(hashes) == 1 and len(list(blobs.iter_keys())) == 1

    stats = reparser(index, blobs).run()
    assert stats.pages == 2 and stats.errors == 0
    assert set(titles(index).values()) == {"Привет мир"}


def test_a_redirected_page_is_re_parsed_at_the_end_of_its_redirects(index, blobs):
    """The callback's request is the last of the redirects, with Scrapy's
    ``redirect_urls``, as in the crawl (it was the first URL, with none)."""
    from scrapy import Request
    from scrapy.http import HtmlResponse

    from webfarm.content import content_hash

    start, hop, final = f"{SHOP}/old", f"{SHOP}/older", f"{SHOP}/page/new"
    body = b"<html><head><title>Moved</title></head><body><p>here</p></body></html>"
    crawled = HtmlResponse(final, body=body, headers={"Content-Type": "text/html"},
                           request=Request(final, meta={"redirect_urls": [start, hop]}))
    job = reparser(index, blobs)
    item = job.spider.page_item(crawled)
    item.content_hash = content_hash(body, "text/html")
    item.blob_key = blob_key(item.content_hash)
    blobs.put_once(item.blob_key, body, {"url": final, "content-type": "text/html"})
    index.record_pages([{**vars(item), "hashing": None}])
    seen = []
    extract = job.callback
    job.callback = lambda response: (seen.append(response), extract(response))[1]

    assert job.run().pages == 1
    (response,) = seen
    assert response.url == response.request.url == final
    assert response.meta["redirect_urls"] == [start, hop]
    assert titles(index) == {final: "Moved"}

    # A page reached with a tracking parameter (stored under its canonical URL) was not
    # redirected: no redirect_urls, on a page stored now or before they were kept.
    from webfarm.reparsepages import rebuild_response

    tracked = f"{SHOP}/page/t?utm_source=mail"
    doc = {"url": f"{SHOP}/page/t", "final_url": tracked, "redirect_urls": None}
    for stored in (doc, {k: v for k, v in doc.items() if k != "redirect_urls"}):
        rebuilt = rebuild_response(stored, body)
        assert rebuilt.request.url == tracked and "redirect_urls" not in rebuilt.meta


def test_a_page_another_spider_stored_since_is_still_re_parsed(index, blobs):
    """Pages are one per URL: a second spider crawling the same site (a v2, ``generic``
    exploring first) stores over the first one's pages. A re-parse of the first one found
    only the pages still its own, without a word."""
    from scrapy import Request
    from scrapy.http import HtmlResponse

    from webfarm.content import content_hash

    job = reparser(index, blobs)
    urls = [f"{SHOP}/page/{i}" for i in range(3)]
    for spider in (job.spider.name, "other_spider"):
        for i, url in enumerate(urls[: 3 if spider == job.spider.name else 2]):
            body = f"<html><head><title>Page {i}</title></head><body>{i}</body></html>".encode()
            item = job.spider.page_item(HtmlResponse(url, body=body, request=Request(url)))
            item.spider = spider
            item.callback = None if spider == job.spider.name else "parse_of_other_spider"
            item.content_hash = content_hash(body, "text/html")
            item.blob_key = blob_key(item.content_hash)
            blobs.put_once(item.blob_key, body, {"url": url, "content-type": "text/html"})
            index.record_pages([{**vars(item), "hashing": None}])
    owners = {d["url"]: (d["spider"], sorted(d["spiders"])) for d in index.pages.find()}
    assert owners[urls[0]] == ("other_spider", sorted([job.spider.name, "other_spider"]))

    stats = job.run()
    assert stats.pages == 3 and stats.errors == 0  # the other's callback name is not ours
    assert set(titles(index)) == set(urls)


def test_a_page_a_crawl_stores_again_meanwhile_keeps_the_crawl_s_items(index, blobs):
    """A re-parse beside a crawl: the crawl stored a page's new version and wrote its
    items; the re-parse, which had read the older version, wrote the old values back and
    counted them "changed" (new prices reverted until the next refetch)."""
    from tests.spiders.products import PageTitle

    urls = store_pages(index, blobs, 4)
    items = ItemStore(index.db)

    def a_crawl_stores_page_1_again(stats) -> None:
        if stats.pages != 2:
            return
        now = dt.datetime.now(dt.timezone.utc)
        index.pages.update_one({"_id": url_fingerprint(urls[1])},
                               {"$set": {"content_hash": "f" * 64}})
        items.write_items([make_entry(PageTitle(url=urls[1], title="Page 1, new"),
                                      None, urls[1], "f" * 64, now)])

    stats = reparser(index, blobs, batch_size=4, progress_every=2,
                     progress=a_crawl_stores_page_1_again).run()
    assert titles(index) == {urls[0]: "Page 0", urls[1]: "Page 1, new", urls[2]: "Page 2",
                             urls[3]: "Page 3"}
    assert (stats.created, stats.superseded, stats.items) == (3, 1, 3)
    assert "3 created, 0 changed, 0 unchanged, 0 dropped, 1 left to a newer fetch" in stats.line()


def test_a_dry_run_counts_what_a_run_would_do_and_writes_nothing(index, blobs, caplog):
    store_pages(index, blobs, 12, skus=3)  # 12 titles; 3 products and 3 skus_seen, 4 times each

    def run(dry: bool) -> dict[str, int]:
        s = reparser(index, blobs, batch_size=5, dry_run=dry).run()
        return {"created": s.created, "changed": s.changed, "unchanged": s.unchanged}

    def stored() -> list[dict]:
        return [d for c in ("page_title", "products", "skus_seen") for d in index.db[c].find()]

    # Nothing stored yet: a product met again in a later batch counts as a run counts it.
    first = {"created": 18, "changed": 0, "unchanged": 18}
    assert run(True) == first and stored() == []
    assert run(False) == first and len(stored()) == 18

    # An older extractor's price on one product, and a title lost.
    index.db.products.update_one({"_id": "S0"}, {"$set": {"price": "$9.99", "item_hash": "x"}})
    index.db.page_title.delete_one({"_id": f"{SHOP}/page/0"})
    before = stored()
    caplog.set_level("INFO", logger="webfarm.reparse")
    preview = run(True)
    assert preview == {"created": 1, "changed": 1, "unchanged": 34} and stored() == before
    assert "would change products 'S0': price: '$9.99' -> '$1.00'" in caplog.text
    assert run(False) == preview  # the real run does what the dry run said


def test_a_field_an_item_no_longer_has_goes_and_others_annotations_stay(index, caplog):
    """A new extractor renamed ``price`` to ``price_cents``: the dry run said price would go,
    the real run kept it beside its successor ($set merged the fields). A field the item
    never had (a team's own annotation) is not the store's to remove."""
    items = ItemStore(index.db)
    now = dt.datetime.now(dt.timezone.utc)
    url = f"{SHOP}/product/1"

    def entry(**fields):
        return make_entry({"sku": "S1", "_key": "sku", "_collection": "products", **fields},
                          None, url, "h1", now)

    items.write_items([entry(name="Kettle", price="$1.00")])
    index.db.products.update_one({"_id": "S1"}, {"$set": {"checked_by": "ann"}})
    renamed = entry(name="Kettle", price_cents=100)
    [(outcome, stored)] = items.preview_items([renamed], {})
    from webfarm.reparse import describe_change
    assert describe_change(renamed, stored) == (
        "products 'S1': price: '$1.00' -> None; price_cents: None -> 100")
    assert items.write_items([renamed]) == ["changed"]
    doc = index.db.products.find_one({"_id": "S1"})
    assert "price" not in doc and doc["price_cents"] == 100 and doc["checked_by"] == "ann"
    assert doc["item_fields"] == ["name", "price_cents", "sku"]


def test_a_write_retried_after_part_of_it_landed_counts_as_its_first_attempt(
        index, blobs, fail_point):
    store_pages(index, blobs, 12, skus=3)
    reparser(index, blobs).run()
    index.db.products.update_one({"_id": "S0"}, {"$set": {"price": "$9.99", "item_hash": "x"}})
    index.db.page_title.delete_many({"_id": {"$in": [f"{SHOP}/page/0", f"{SHOP}/page/1"]}})
    # One bulk write: its insert command (the 2 lost titles) lands, its update command fails.
    fail_point(["update"], {"times": 1})
    stats = reparser(index, blobs, batch_size=100).run()
    assert stats.retries == 1
    assert (stats.created, stats.changed, stats.unchanged) == (2, 1, 33)  # as with no failure
    assert index.db.products.find_one({"_id": "S0"})["price"] == "$1.00"


@pytest.mark.parametrize(("stamps", "before"), [
    ({"first_extracted_at": 0, "changed_at": 0}, "created here"),  # this batch inserted it
    ({"first_extracted_at": -60, "changed_at": 0}, "(changed by this batch)"),
    ({"first_extracted_at": -60, "changed_at": -60}, "stored"),  # rewritten unchanged
])
def test_a_batch_tells_its_own_earlier_writes_by_their_timestamps(stamps, before):
    at = dt.datetime(2026, 12, 5, 10, 0, 0, 123456, tzinfo=dt.timezone.utc)
    entry = make_entry({"_collection": "c", "_key": "k", "k": 1}, None, "http://x/", None, at)
    ms = at.replace(microsecond=123000)  # as MongoDB keeps it
    doc = {"item_hash": item_hash(entry.fields), "extracted_at": ms,
           **{name: ms + dt.timedelta(seconds=s) for name, s in stamps.items()}}
    got = _before_batch(doc, entry)
    assert (got is _CREATED_HERE) if before == "created here" else (
        got == (doc["item_hash"] if before == "stored" else before))
    # Written by another batch (another time, or other fields): the stored hash, as it is.
    assert _before_batch({**doc, "extracted_at": ms - dt.timedelta(milliseconds=1)},
                         entry) == doc["item_hash"]
    assert _before_batch({**doc, "item_hash": "other"}, entry) == "other"


def test_shards_share_the_pages_out_each_once(index, blobs):
    urls = store_pages(index, blobs, 40, per_body=2)
    seen: list[list[str]] = []
    for k in range(3):
        job = reparser(index, blobs)
        extract, got = job.callback, []
        job.callback = lambda response, got=got, extract=extract: (
            got.append(response.url), extract(response))[1]
        job.run(shard=(k, 3))
        seen.append(got)
    assert all(seen) and sorted(u for got in seen for u in got) == sorted(urls)
    assert set(titles(index)) == set(urls)
    for bad in ((3, 3), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match="use K/N with 0 <= K < N"):
            shard_range(bad)


class Cleaner:
    """A project's cleaning pipeline: titles upper-cased, the page titled 'Page 3' dropped.
    Its open_spider/close_spider take the spider (the old signature)."""

    instances: ClassVar[list[Cleaner]] = []

    def __init__(self, stats) -> None:
        self.stats = stats
        self.events: list[str] = []
        Cleaner.instances.append(self)

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler.stats)

    def open_spider(self, spider) -> None:
        self.events.append(f"open {spider.name}")

    def close_spider(self, spider) -> None:
        self.events.append("close")

    def process_item(self, item):
        if isinstance(item, PageTitle):
            if item["title"] == "Page 3":
                raise DropItem("no page 3")
            item["title"] = item["title"].upper()
        return item


class AsyncTagger:
    async def process_item(self, item):
        await asyncio.sleep(0)
        if isinstance(item, PageTitle):
            item["title"] += "!"
        return item


class Broken:
    def process_item(self, item):
        if isinstance(item, PageTitle) and item["title"] == "PAGE 5!":
            raise ValueError("cannot clean this one")
        return item


class AfterTheStore:
    def process_item(self, item):
        raise AssertionError("a pipeline after the item store must not run in reparse")


class WaitsOnTheReactor:
    def process_item(self, item):
        return Deferred()  # fired by something on the reactor, in a crawl


def project_pipelines(extra: dict[str, int]) -> tuple[ProjectPipelines, object]:
    settings = get_project_settings()
    settings.set("ITEM_PIPELINES", {**settings.getdict("ITEM_PIPELINES"), **extra})
    crawler = Crawler(ProductsSpider, settings)  # as the command builds it: no engine
    crawler.stats = MemoryStatsCollector(crawler)
    spider = ProductsSpider.from_crawler(crawler, start=f"{SHOP}/")
    return ProjectPipelines.from_crawler(crawler, spider), spider


def test_items_go_through_the_project_s_pipelines_before_the_item_store(
        index, blobs, caplog):
    """A crawl's items pass the project's pipelines before the item store writes them, so
    re-parse runs those (and only those) too: cleaned fields, dropped items not stored."""
    urls = store_pages(index, blobs, 6)
    here = __name__
    pipelines, spider = project_pipelines({
        f"{here}.Cleaner": 200, f"{here}.AsyncTagger": 400, f"{here}.Broken": 550,
        f"{here}.AfterTheStore": 700})
    assert [type(p).__name__ for p in pipelines.pipelines] == ["Cleaner", "AsyncTagger",
                                                               "Broken"]
    job = Reparser(spider, index, blobs, ItemStore(index.db), pipelines=pipelines)
    with caplog.at_level("INFO"):
        stats = job.run()

    assert stats.pages == 6 and stats.dropped == 1 and stats.errors == 1
    assert stats.created == 4 and "1 dropped" in stats.line()
    assert titles(index) == {u: f"PAGE {u.rsplit('/', 1)[1]}!" for u in urls
                             if not u.endswith(("/3", "/5"))}
    assert Cleaner.instances[-1].events == ["open test_products", "close"]
    log = caplog.text
    assert "Dropped: no page 3 (Cleaner, an item from http://shop.test/page/3)" in log
    assert "an item pipeline failed on an item from http://shop.test/page/5" in log
    assert "cannot clean this one" in log
    assert f"not running {here}.AfterTheStore: they come after the item store" in log


def test_a_pipeline_that_waits_on_the_reactor_stops_the_run_saying_what_to_do(index, blobs):
    store_pages(index, blobs, 2)
    pipelines, spider = project_pipelines({f"{__name__}.WaitsOnTheReactor": 200})
    job = Reparser(spider, index, blobs, ItemStore(index.db), pipelines=pipelines)
    with pytest.raises(PipelineNeedsReactor, match="WaitsOnTheReactor.process_item returned "
                       "a Deferred that did not fire.*'async def'"):
        job.run()


def test_progress_lines_every_n_pages_or_none(index, blobs):
    """``--progress-every 0`` was taken as 1: a progress line for every page."""
    store_pages(index, blobs, 12)
    for every, lines in ((5, 2), (0, 0)):
        said: list[int] = []
        reparser(index, blobs, progress_every=every,
                 progress=lambda stats, said=said: said.append(stats.pages)).run()
        assert said == [5 * (n + 1) for n in range(lines)]
    # Items are written in batches: a progress line said "0 items" until one landed.
    lines_said: list[str] = []
    stats = reparser(index, blobs, progress_every=5, batch_size=200,
                     progress=lambda stats: lines_said.append(stats.line())).run()
    assert "5 pages, 0 items (+5 not written yet):" in lines_said[0], lines_said
    assert stats.writing == 0 and f"12 pages, {stats.items} items: " in stats.line()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("progress_every", -1, "--progress-every -1: give 0 (no progress lines) or more"),
    ("batch_size", 0, "--batch-size 0: give 1 or more"),
    ("show_changes", -2, "--show-changes -2: give 0 (none) or more"),
    # It was ignored without a word: a re-parse that writes logs no changes.
    ("dry_run", False, "--show-changes 10 goes with --dry-run, which logs what a re-parse "
                       "would change"),
])
def test_reparse_counts_out_of_range_are_one_line(flag, value, message):
    import argparse

    from webfarm.commands._common import CommandError
    from webfarm.commands.reparse import check_counts

    opts = argparse.Namespace(**{"progress_every": 500, "batch_size": 200, "show_changes": 10,
                                 "dry_run": True, flag: value})
    with pytest.raises(CommandError, match=re.escape(message)):
        check_counts(opts)


def test_reparse_shows_ten_changes_by_default_and_only_with_dry_run():
    import argparse

    from webfarm.commands.reparse import check_counts

    for dry_run in (True, False):
        opts = argparse.Namespace(progress_every=500, batch_size=200, show_changes=None,
                                  dry_run=dry_run)
        check_counts(opts)
        assert opts.show_changes == 10
