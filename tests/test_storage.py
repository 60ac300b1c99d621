"""Storage: dedupe under concurrency and redelivery, near-duplicates, the refetch hook and
the 304 path, batched writes that hold an item until stored, items, atomic blobs."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import hashlib
import random
import subprocess
import sys
import threading
import time

import pymongo
import pytest
import scrapy
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from pipelines.blobs import BlobStorePipeline
from pipelines.index import IndexPipeline
from webfarm.blobstore import FileBlobStore, blob_key
from webfarm.config import ConfigError
from webfarm.content import fingerprint
from webfarm.index import FixedRefetch, IndexStore, load_refetch_policy
from webfarm.items import PageItem
from webfarm.itemstore import ItemError, ItemStore, index_fields, make_entry
from webfarm.s3store import S3BlobStore
from webfarm.threads import StorageThreads
from webfarm.urlcounts import APPLIED_KEEP
from webfarm.urls import url_fingerprint

HOST = "127.0.0.2:8081"


def page(path: str, content_hash: str, ts: float | None = None, **extra):
    url = f"http://{HOST}{path}"
    return {"url": url, "final_url": url, "host": HOST, "spider": "t", "status": 200,
            "body": b"x" * 10, "content_type": "text/html", "fetched_at": ts or time.time(),
            "fetch_method": "http", "content_hash": content_hash,
            "blob_key": f"raw/{content_hash[:2]}/{content_hash}", **extra}


@pytest.fixture()
def store(mongo_uri, mongo_db_name):
    s = IndexStore(mongo_uri, mongo_db_name)
    s.ensure_indexes()
    yield s
    s.client.drop_database(mongo_db_name)
    s.close()


def test_dedupe_is_exact_under_concurrent_writers_and_redelivery(store, mongo_uri,
                                                                 mongo_db_name):
    hashes = [f"{i:02x}" * 32 for i in range(5)]
    pages = [page(f"/p/{n}", hashes[n % 5]) for n in range(30)]

    def worker(seed: int) -> None:  # every worker records every page: 3 redeliveries each
        own = IndexStore(mongo_uri, mongo_db_name)
        mine = pages[:]
        random.Random(seed).shuffle(mine)
        for i in range(0, len(mine), 7):
            own.record_pages(mine[i:i + 7])
        own.close()

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert store.pages.count_documents({}) == 30
    assert {d["fetch_count"] for d in store.pages.find()} == {4}
    assert {d["_id"]: d["url_count"] for d in store.contents.find()} == dict.fromkeys(hashes, 6)
    for h in hashes:
        first = store.contents.find_one({"_id": h})["first_page_id"]
        sharing = list(store.pages.find({"content_hash": h}))
        assert {d["duplicate_of"] for d in sharing} == {None, first}
        assert [d["_id"] for d in sharing if d["duplicate_of"] is None] == [first]
    # A page whose content changes moves its count from the old content to the new one.
    store.record_pages([{**pages[0], "content_hash": "ab" * 32, "blob_key": "raw/ab/x"}])
    assert store.contents.find_one({"_id": hashes[0]})["url_count"] == 5
    assert store.contents.find_one({"_id": "ab" * 32})["url_count"] == 1


def test_a_retried_batch_is_applied_once(store):
    batch = [page("/a", "aa" * 32, fetch_id="f1"), page("/b", "aa" * 32, fetch_id="f2")]
    store.record_pages(batch)
    again = store.record_pages(batch)  # the same fetches again: a retry after a lost reply
    assert not any(r.new_page for r in again)
    assert {d["fetch_count"] for d in store.pages.find()} == {1}
    assert store.contents.find_one({"_id": "aa" * 32})["url_count"] == 2


def test_url_count_stays_exact_when_more_urls_share_a_content_than_it_remembers(store):
    """A soft-404 page shared by more URLs than ``contents.applied`` keeps fetch ids for:
    fetching every URL again (new fetches, same content) must count none of them twice."""
    h = "5f" * 32
    pages = [page(f"/missing/{n}", h) for n in range(APPLIED_KEEP + 16)]
    for i in range(0, len(pages), 10):
        store.record_pages(pages[i:i + 10])
    assert store.contents.find_one({"_id": h})["url_count"] == len(pages)
    for i in range(0, len(pages), 10):
        store.record_pages([{**p, "fetched_at": p["fetched_at"] + 60} for p in pages[i:i + 10]])
    assert store.contents.find_one({"_id": h})["url_count"] == len(pages)
    assert store.pages.count_documents({"counts_pending": True}) == 0


def test_a_worker_killed_between_content_and_page_writes_counts_the_page_once(store):
    """The content's insert counts its first page; if the worker dies before that page's
    own write, the page's next fetch (a new fetch id) must not count it again."""
    h = "6e" * 32
    first = page("/killed", h, fetch_id="before-the-crash")
    store.contents.insert_one(store._content_doc(first, url_fingerprint(first["url"])))
    assert store.pages.count_documents({}) == 0  # the crash: the page was never written
    record = store.record_pages([page("/killed", h)])[0]  # redelivered, fetched again
    assert record.new_page and record.duplicate_of is None
    assert store.contents.find_one({"_id": h})["url_count"] == 1
    store.record_pages([page("/other", h)])  # and a second URL still counts
    assert store.contents.find_one({"_id": h})["url_count"] == 2


def _html(text: str, banner: str = "") -> bytes:
    return f"<html><body>{banner}<h1>Catalogue</h1><p>{text}</p></body></html>".encode()


def test_near_duplicates_are_recorded_not_merged(store):
    rng = random.Random(3)  # a 1000-word page; the banner moves its SimHash by 2 bits
    words = [f"{rng.choice(['river', 'stone', 'lamp', 'kettle', 'north'])}{rng.randint(0, 50)}"
             for _ in range(1000)]
    bodies = {"/a": _html(" ".join(words)),
              "/mirror": _html(" ".join(words), "<div>Free shipping this week only</div>"),
              "/other": _html(" ".join(reversed(words)))}
    docs = []
    for path, body in bodies.items():
        digest, sim = fingerprint(body, "text/html", with_simhash=True)
        docs.append(page(path, digest, simhash=sim, body=body))
    store.record_pages(docs[:1])
    records = store.record_pages(docs[1:])
    a, mirror, other = (store.pages.find_one({"_id": url_fingerprint(d["url"])}) for d in docs)
    assert mirror["near_duplicate_of"] == a["_id"] and 0 < mirror["near_duplicate_distance"] <= 3
    assert records[0].near_duplicate_of == a["_id"]
    assert mirror["content_hash"] != a["content_hash"] and mirror["duplicate_of"] is None
    assert other["near_duplicate_of"] is None and a["near_duplicate_of"] is None
    assert store.contents.count_documents({}) == 3  # three contents, three blobs: not merged
    assert len(store.contents.find_one({"_id": a["content_hash"]})["simhash_bands"]) == 4
    assert "simhash_bands_1" in store.contents.index_information()

    off = IndexStore(store.client.address and f"mongodb://{store.client.address[0]}:"
                     f"{store.client.address[1]}", store.db.name, neardup_distance=-1)
    moved = {**docs[1], "url": docs[1]["url"] + "2", "final_url": docs[1]["url"] + "2"}
    assert off.record_pages([moved])[0].near_duplicate_of is None
    off.close()


def test_near_duplicates_are_found_when_the_lookup_is_split(store, monkeypatch):
    """A batch's band keys are looked up a few at a time (one $in of 800 took the embedded
    server seconds on a grown index); a key in any part finds its content, once."""
    from webfarm import neardup

    monkeypatch.setattr(neardup, "QUERY_KEYS", 3)  # 4 pages, 16 keys: six queries
    rng = random.Random(11)

    def words(seed: int) -> str:
        r = random.Random(seed)
        return " ".join(f"{r.choice(['pine', 'brook', 'slate', 'wren'])}{r.randint(0, 50)}"
                        for _ in range(1000))

    def fetched(path: str, body: bytes) -> dict:
        digest, sim = fingerprint(body, "text/html", with_simhash=True)
        return page(path, digest, simhash=sim, body=body)

    originals = [fetched(f"/o{i}", _html(words(i))) for i in range(3)]
    store.record_pages(originals)
    mirrors = [fetched(f"/m{i}", _html(words(i), f"<div>Sale {rng.randint(1, 9)}0% off</div>"))
               for i in range(3)]
    records = store.record_pages([fetched("/new", _html(words(99))), *mirrors])
    assert [r.near_duplicate_of for r in records] == [
        None, *(url_fingerprint(o["url"]) for o in originals)]


def test_an_original_fetched_again_is_not_near_its_mirror(store):
    """The README probe: a second crawl found the original page near its mirror (stored
    after it), and the two named each other; so would two new contents of one batch."""
    rng = random.Random(5)
    words = " ".join(f"{rng.choice(['oak', 'fern', 'tide', 'salt'])}{rng.randint(0, 50)}"
                     for _ in range(1000))

    def fetched(path: str, body: bytes) -> dict:
        digest, sim = fingerprint(body, "text/html", with_simhash=True)
        return page(path, digest, simhash=sim, body=body)

    original, mirror = fetched("/p1", _html(words)), fetched("/mirror/p1", _html(
        words, "<div>Free shipping this week only</div>"))
    store.record_pages([original])
    store.record_pages([mirror])
    again = store.record_pages([{**original, "fetched_at": time.time() + 1},
                                {**mirror, "fetched_at": time.time() + 1}])
    assert [r.near_duplicate_of for r in again] == [None, url_fingerprint(original["url"])]

    def near(d: dict):
        return store.pages.find_one({"_id": url_fingerprint(d["url"])})["near_duplicate_of"]

    assert near(original) is None and near(mirror) == url_fingerprint(original["url"])
    # Both new in one batch: the later names the earlier, not both each other.
    other = " ".join(reversed(words.split()))
    first, second = fetched("/p2", _html(other)), fetched("/mirror/p2", _html(
        other, "<div>Free shipping this week only</div>"))
    store.record_pages([first, second])
    assert near(first) is None and near(second) == url_fingerprint(first["url"])


class Doubling:
    """A refetch policy: double the interval while nothing changes, reset on a change."""

    calls: list[tuple[dict | None, bool]] = []

    def __init__(self, start: float) -> None:
        self.start = start

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler.settings.getfloat("WEBFARM_REFETCH_INTERVAL"))

    def fields(self, before, changed, fetched_at, **page):
        assert page["url"].startswith("http://") and page["host"] == HOST
        Doubling.calls.append((before, changed))
        interval = self.start if before is None or changed else before["refetch_interval"] * 2
        return {"refetch_interval": interval,
                "next_fetch_at": fetched_at + dt.timedelta(seconds=interval), "seen": True}


def test_a_fetch_held_past_its_lease_never_writes_over_a_later_one(store, mongo_db):
    """A worker stalled past its leases (its storage process stopped) while another
    fetched the pages again and stored them; let go, it wrote its older fetches over the
    newer ones: 491 of 665 pages went back 12 s, to content the site no longer served,
    and their items disagreed with their pages."""
    t0 = time.time()
    newer, older = page("/p", "ee" * 32, t0 + 10), page("/p", "aa" * 32, t0)
    assert not store.record_pages([newer])[0].superseded
    record = store.record_pages([older])[0]
    assert record.superseded and not record.changed and not record.new_page
    doc = store.pages.find_one({"_id": url_fingerprint(f"http://{HOST}/p")})
    assert doc["content_hash"] == "ee" * 32 and doc["fetch_count"] == 1
    assert doc["fetched_at"].timestamp() == pytest.approx(t0 + 10)
    assert store.contents.find_one({"_id": "aa" * 32}) is None  # no orphan content
    assert store.contents.find_one({"_id": "ee" * 32})["url_count"] == 1
    # The same for the items: the later extraction stays.
    items = ItemStore(mongo_db)
    at = dt.datetime.now(dt.timezone.utc)
    later = make_entry(Offer(shop="a", sku="9", price="2.00"), SiteSpider, "http://s/9",
                       "ee" * 32, at)
    earlier = make_entry(Offer(shop="a", sku="9", price="1.00"), SiteSpider, "http://s/9",
                         "aa" * 32, at - dt.timedelta(seconds=10))
    assert items.write_items([later]) == ["created"]
    assert items.write_items([earlier]) == ["superseded"]
    offer = mongo_db.offer.find_one({"_id": {"shop": "a", "sku": "9"}})
    assert offer["price"] == "2.00" and offer["content_hash"] == "ee" * 32
    # A page's own next fetch is written as usual.
    assert store.record_pages([page("/p", "ff" * 32, t0 + 20)])[0].changed


def test_refetch_policy_runs_on_every_fetch_and_304_keeps_the_content(store):
    crawler = get_crawler(settings_dict={
        "WEBFARM_REFETCH_POLICY": "tests.test_storage.Doubling", "WEBFARM_REFETCH_INTERVAL": 10})
    policy = load_refetch_policy(crawler)
    assert isinstance(policy, Doubling) and policy.start == 10
    assert isinstance(load_refetch_policy(get_crawler()), FixedRefetch)
    store.refetch = policy
    Doubling.calls.clear()
    t0 = time.time()
    store.record_pages([page("/r", "cc" * 32, t0, etag='"v1"', last_modified="Mon, 01 Jan 2024")])
    store.record_pages([page("/r", "cc" * 32, t0 + 10)])
    store.record_pages([page("/r", "dd" * 32, t0 + 20, etag='"v2"')])
    not_modified = {**page("/r", "00" * 32, t0 + 30), "status": 304, "not_modified": True,
                    "content_hash": None, "blob_key": None, "body": b""}
    record = store.record_pages([not_modified])[0]
    doc = store.pages.find_one({"_id": url_fingerprint(f"http://{HOST}/r")})
    assert [(b is None, changed) for b, changed in Doubling.calls] == [
        (True, False), (False, False), (False, True), (False, False)]
    assert record.not_modified and not record.changed
    assert doc["content_hash"] == "dd" * 32 and doc["blob_key"] == f"raw/dd/{'dd' * 32}"
    assert doc["status"] == 200 and doc["last_status"] == 304 and doc["etag"] == '"v2"'
    assert doc["fetch_count"] == 4 and doc["change_count"] == 1 and doc["seen"] is True
    assert doc["refetch_interval"] == 20 and doc["fetched_at"].timestamp() == pytest.approx(t0 + 30)
    assert (doc["next_fetch_at"] - doc["fetched_at"]).total_seconds() == pytest.approx(20)
    assert store.contents.find_one({"_id": "dd" * 32})["url_count"] == 1


def _fail_updates(client: pymongo.MongoClient, on: bool) -> None:
    client.admin.command("configureFailPoint", "failCommand",
                         mode="alwaysOn" if on else "off",
                         data={"failCommands": ["insert", "update"], "errorCode": 2})


def test_an_item_is_done_only_when_its_batch_is_stored(store):
    crawler = get_crawler()
    pipeline = IndexPipeline(store, crawler.stats, StorageThreads(2), batch_size=50,
                             batch_seconds=0.05, retry_seconds=30)
    items = [PageItem(url=f"http://{HOST}/held/{i}", final_url=f"http://{HOST}/held/{i}",
                      host=HOST, spider="t", status=200, body=b"b", fetched_at=time.time(),
                      content_hash=f"{i:02x}" * 32, blob_key=f"raw/{i:02x}/x")
             for i in range(5)]

    async def scenario():
        _fail_updates(store.client, True)
        try:
            tasks = [asyncio.ensure_future(pipeline.process_item(i)) for i in items]
            await asyncio.sleep(1.5)  # the store refuses writes: nothing may complete
            assert not any(t.done() for t in tasks)
            assert store.pages.count_documents({}) == 0
        finally:
            _fail_updates(store.client, False)
        done = await asyncio.wait_for(asyncio.gather(*tasks), 20)
        return done

    assert asyncio.run(scenario()) == items
    assert store.pages.count_documents({}) == 5
    assert crawler.stats.get_value("webfarm/index/retries") >= 1


def _held_page(i: int) -> PageItem:
    url = f"http://{HOST}/quiet/{i}"
    return PageItem(url=url, final_url=url, host=HOST, spider="t", status=200, body=b"b",
                    fetched_at=time.time(), content_hash=f"{i:02x}" * 32,
                    blob_key=f"raw/{i:02x}/x")


def test_a_batch_waits_for_more_pages_only_while_they_keep_coming(store):
    """The end of a crawl (or a lull) writes what is pending after 50 ms without a new
    page, not after WEBFARM_INDEX_BATCH_SECONDS; a steady stream still fills one batch."""
    crawler = get_crawler()
    pipeline = IndexPipeline(store, crawler.stats, StorageThreads(2), batch_size=500,
                             batch_seconds=10, retry_seconds=30)

    async def scenario() -> tuple[float, float]:
        started = time.monotonic()
        await asyncio.wait_for(pipeline.process_item(_held_page(0)), 20)
        lone = time.monotonic() - started
        tasks = []
        for i in range(1, 31):  # a page every 10 ms: never quiet for 50 ms
            tasks.append(asyncio.ensure_future(pipeline.process_item(_held_page(i))))
            await asyncio.sleep(0.01)
        started = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
        return lone, time.monotonic() - started

    lone, stream_tail = asyncio.run(scenario())
    assert lone < 2.0  # not the 10 s window
    assert stream_tail < 2.0
    assert store.pages.count_documents({}) == 31
    # one batch for the lone page, and the stream (1 at most 2, if the machine stalled)
    assert 2 <= crawler.stats.get_value("webfarm/index/batches") <= 3


def test_a_write_failing_past_the_limit_fails_the_item(store):
    from webfarm.batching import StorageUnavailable

    crawler = get_crawler()
    pipeline = IndexPipeline(store, crawler.stats, StorageThreads(2), batch_seconds=0.01,
                             retry_seconds=0.5)
    item = PageItem(url=f"http://{HOST}/x", final_url=f"http://{HOST}/x", host=HOST,
                    spider="t", status=200, body=b"b", fetched_at=time.time(),
                    content_hash="ee" * 32, blob_key="raw/ee/x")
    _fail_updates(store.client, True)
    try:
        with pytest.raises(StorageUnavailable, match="WEBFARM_STORAGE_RETRY_SECONDS"):
            asyncio.run(asyncio.wait_for(pipeline.process_item(item), 20))
    finally:
        _fail_updates(store.client, False)


class Offer(scrapy.Item):
    key_fields = ("shop", "sku")
    shop = scrapy.Field()
    sku = scrapy.Field()
    price = scrapy.Field()


class SiteSpider:
    extractor_version = 3
    item_collection = "things"


def test_items_go_to_one_collection_per_type_keyed_as_declared(mongo_db):
    store = ItemStore(mongo_db)
    now = dt.datetime.now(dt.timezone.utc)

    def entries(price: str):
        return [make_entry(Offer(shop="a", sku="1", price=price), SiteSpider, "http://s/1",
                           "ab" * 32, now),
                make_entry({"_key": "id", "id": 7, "name": "n"}, SiteSpider, "http://s/2",
                           None, now)]

    assert store.write_items(entries("1.00")) == ["created", "created"]
    assert store.write_items(entries("1.00")) == ["unchanged", "unchanged"]
    assert store.write_items(entries("2.00")) == ["changed", "unchanged"]
    offer = mongo_db.offer.find_one()
    assert offer["_id"] == {"shop": "a", "sku": "1"} and offer["price"] == "2.00"
    assert offer["source_url"] == "http://s/1" and offer["content_hash"] == "ab" * 32
    assert offer["extractor_version"] == "3" and offer["extracted_at"] is not None
    assert mongo_db.things.find_one({"_id": 7})["name"] == "n"
    assert "shop_1_sku_1" in mongo_db.offer.index_information()
    with pytest.raises(ItemError, match="no value for its key"):
        make_entry(Offer(shop="a", price="1"), SiteSpider, "http://s/3", None, now)
    with pytest.raises(ItemError, match=r"cannot be stored.*store a set as a sorted list"):
        make_entry({"id": 1, "x": {1, 2}}, SiteSpider, "http://s/4", None, now)
    # A Decimal is a number: "use str, numbers, ..." sent users in circles
    with pytest.raises(ItemError, match=r"<class 'decimal.Decimal'>; store a Decimal as "
                       r"str\(value\) \(exact\), float\(value\)"):
        make_entry({"id": 2, "x": decimal.Decimal("9.99")}, SiteSpider, "http://s/5", None, now)
    with pytest.raises(ItemError, match=r"store a date as its ISO text"):
        make_entry({"id": 3, "x": dt.date(2026, 12, 7)}, SiteSpider, "http://s/6", None, now)


def _ms(at: dt.datetime) -> dt.datetime:
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


def test_an_item_met_twice_in_a_batch_keeps_the_time_it_changed(mongo_db):
    """A probe: a product and its print page (one item, two pages) in one batch, with a
    new price: counted changed once and unchanged once, right, but its ``changed_at``
    stayed the first crawl's (the batch's last entry, unchanged against the first, won)."""
    store = ItemStore(mongo_db)
    first = dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1)
    later = first + dt.timedelta(minutes=30)

    def offer(price: str, url: str, at: dt.datetime):
        return make_entry(Offer(shop="a", sku="1", price=price), SiteSpider, url, None, at)

    assert store.write_items([offer("1.00", "http://s/1", first)]) == ["created"]
    assert store.write_items([offer("2.00", "http://s/1", later),
                              offer("2.00", "http://s/1/print", later)]) == ["changed",
                                                                            "unchanged"]
    stored = mongo_db.offer.find_one()
    assert stored["price"] == "2.00" and stored["changed_at"] == _ms(later)


class _InsertedMeanwhile:
    """The item collections of ``db``, where another writer stores ``item`` between this
    store's read and its write: the race of two workers extracting one item."""

    def __init__(self, db, other: ItemStore, item) -> None:
        self.db, self.other, self.item = db, other, item

    def __getitem__(self, name: str):
        collection = self.db[name]
        outer = self

        class Racing:
            def __getattr__(self, attr):
                return getattr(collection, attr)

            def find(self, *args, **kwargs):
                found = list(collection.find(*args, **kwargs))
                if outer.item is not None:
                    outer.other.write_items([outer.item])
                    outer.item = None
                return found

        return Racing()


def test_an_item_another_writer_inserted_first_is_not_counted_created(mongo_db):
    """A probe: ``items/created`` said 41 for 40 items stored: an insert that lost the race
    to another worker was upserted, and still counted created."""
    now = dt.datetime.now(dt.timezone.utc)
    other = ItemStore(mongo_db)

    def offer(price: str, at: dt.datetime):
        return make_entry(Offer(shop="a", sku="1", price=price), SiteSpider, "http://s/1",
                          None, at)

    theirs = offer("1.00", now - dt.timedelta(seconds=5))
    store = ItemStore(_InsertedMeanwhile(mongo_db, other, theirs))
    assert store.write_items([offer("1.00", now)]) == ["unchanged"]
    assert mongo_db.offer.find_one()["changed_at"] == _ms(theirs.extracted_at)
    theirs = offer("1.00", now)
    mongo_db.offer.delete_many({})
    store = ItemStore(_InsertedMeanwhile(mongo_db, other, theirs))
    later = now + dt.timedelta(seconds=5)
    assert store.write_items([offer("3.00", later)]) == ["changed"]
    stored = mongo_db.offer.find_one()
    assert stored["price"] == "3.00" and stored["changed_at"] == _ms(later)
    assert mongo_db.offer.count_documents({}) == 1


def test_item_collections_index_their_key_and_the_fields_named_in_settings(mongo_db):
    now = dt.datetime.now(dt.timezone.utc)
    offer = make_entry(Offer(shop="a", sku="1", price="1"), SiteSpider, "http://s/1", "ab", now)
    ItemStore(mongo_db).write_items([offer])
    assert sorted(mongo_db.offer.index_information()) == ["_id_", "shop_1_sku_1"]

    indexes = index_fields(Settings({"WEBFARM_ITEM_INDEXES": "source_url, content_hash,name"}))
    assert indexes == ("source_url", "content_hash", "name")
    thing = make_entry({"_key": "name", "name": "n"}, SiteSpider, "http://s/2", None, now)
    ItemStore(mongo_db, indexes=indexes).write_items([thing])
    # name is the key: its index is the key's, not a second one
    assert sorted(mongo_db.things.index_information()) == [
        "_id_", "content_hash_1", "name_1", "source_url_1"]
    shop = make_entry(Offer(shop="b", sku="2", price="1"), SiteSpider, "http://s/3", "cd", now)
    ItemStore(mongo_db, indexes=("shop", "sku")).write_items([shop])
    # shop leads the key's compound index, which serves queries on it; sku does not lead
    assert sorted(mongo_db.offer.index_information()) == ["_id_", "shop_1_sku_1", "sku_1"]
    for bad in (["source url"], ["$where"], [""]):
        with pytest.raises(ConfigError, match="WEBFARM_ITEM_INDEXES.*not a field name"):
            index_fields(Settings({"WEBFARM_ITEM_INDEXES": bad}))


CRASH = """
import os, sys
from webfarm.blobstore import FileBlobStore
store = FileBlobStore(sys.argv[1])
real = os.{target}
def crash(*a, **k):
    {before}
    os._exit(9)  # the process dies here, as with kill -9 or a power cut
os.{target} = crash
store.put_once(sys.argv[2], b"<html>" + b"x" * 1_000_000, {{"url": "http://s/"}})
"""


@pytest.mark.parametrize("target, before", [
    ("fsync", "pass"),  # mid-write: the temp file is half flushed
    ("link", "pass"),  # written, not yet linked into place
])
def test_file_store_crash_leaves_no_partial_blob(tmp_path, target, before):
    key = blob_key(hashlib.sha256(target.encode()).hexdigest())
    code = CRASH.format(target=target, before=before)
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path), key], timeout=60)
    assert proc.returncode == 9
    store = FileBlobStore(tmp_path)
    assert not store.exists(key) and list(store.iter_keys()) == []
    assert store.put_once(key, b"whole", {"url": "http://s/"}) is True
    assert store.get(key) == b"whole" and list(store.iter_keys()) == [key]


class SlowStore(FileBlobStore):
    """A real file store that notes how many writes run at once."""

    def __init__(self, root):
        super().__init__(root)
        self.active = self.peak = 0
        self.lock = threading.Lock()

    def put_once(self, key, body, metadata):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        time.sleep(0.05)
        try:
            return super().put_once(key, body, metadata)
        finally:
            with self.lock:
                self.active -= 1


def test_blob_writes_have_bounded_concurrency(tmp_path):
    store = SlowStore(tmp_path)
    crawler = get_crawler()
    pipeline = BlobStorePipeline(store, crawler.stats, StorageThreads(8), concurrency=3)
    items = [PageItem(url=f"http://{HOST}/{i}", final_url=f"http://{HOST}/{i}", host=HOST,
                      spider="t", status=200, body=b"b%d" % i, content_hash=f"{i:02x}" * 32)
             for i in range(12)]

    async def run():
        return await asyncio.gather(*(pipeline.process_item(i) for i in items))

    asyncio.run(run())
    assert store.peak == 3 and len(list(store.iter_keys())) == 12
    s3 = S3BlobStore("b", endpoint_url="http://127.0.0.1:9", max_attempts=7)
    retries = s3.client.meta.config.retries  # botocore counts the first try in the total
    assert retries["mode"] == "standard" and retries["total_max_attempts"] == 8


def test_indexes_are_created_through_a_mongodb_outage_at_start(own_mongo, mongo_db_name):
    """A probe: MongoDB went down between a worker's start-up check and the index
    pipeline's open; the worker ended in a traceback after pymongo's 10 s. Creating the
    indexes is now waited out as a write is (WEBFARM_STORAGE_RETRY_SECONDS)."""
    store = IndexStore(own_mongo.url, mongo_db_name, timeout_ms=1000)
    crawler = get_crawler()
    pipeline = IndexPipeline(store, crawler.stats, StorageThreads(2), retry_seconds=30)
    client = pymongo.MongoClient(own_mongo.url)
    client.admin.command("configureFailPoint", "failCommand", mode={"times": 3},
                         data={"failCommands": ["createIndexes"], "errorCode": 2})
    try:
        asyncio.run(asyncio.wait_for(pipeline.open_spider(), 30))
        names = {i["name"] for i in store.pages.list_indexes()}
        assert "content_hash_1" in names, names
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
        client.close()
        store.close()
    # and past the window, one clear error, not a traceback from the pipeline's open
    from webfarm.batching import StorageUnavailable

    store = IndexStore(own_mongo.url, mongo_db_name, timeout_ms=1000)
    pipeline = IndexPipeline(store, crawler.stats, StorageThreads(2), retry_seconds=2)
    own_mongo.stop()
    try:
        with pytest.raises(StorageUnavailable, match=r"creating the index's indexes failed"):
            asyncio.run(asyncio.wait_for(pipeline.open_spider(), 30))
    finally:
        store.close()
