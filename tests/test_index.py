"""pages and contents upserts: idempotent, duplicates and changes recorded."""

from __future__ import annotations

import time

import pymongo
import pytest

from webfarm.index import IndexStore
from webfarm.urlcounts import count_ops
from webfarm.urls import url_fingerprint


def page(url, content_hash, body=b"body", ts=None):
    return {
        "url": url, "final_url": url, "host": "127.0.0.2:8081", "spider": "generic",
        "status": 200, "body": body, "content_type": "text/html", "fetched_at": ts or time.time(),
        "fetch_method": "http", "content_hash": content_hash,
        "blob_key": f"raw/{content_hash[:2]}/{content_hash}",
    }


@pytest.fixture()
def store(mongo_uri, mongo_db_name):
    s = IndexStore(mongo_uri, mongo_db_name)
    s.ensure_indexes()
    yield s
    s.client.drop_database(mongo_db_name)
    s.close()


def test_same_page_twice_changes_only_counters(store):
    a = page("http://127.0.0.2:8081/p/1", "aa" * 32)
    first = store.record_page(a, 3600)
    snapshot = store.pages.find_one({"_id": first.page_id})
    second = store.record_page({**a, "fetched_at": a["fetched_at"] + 5}, 3600)
    again = store.pages.find_one({"_id": first.page_id})
    assert first.new_page and not second.new_page and not second.changed
    assert store.pages.count_documents({}) == 1 and store.contents.count_documents({}) == 1
    assert again["fetch_count"] == 2 and snapshot["fetch_count"] == 1
    moving = ("fetch_count", "fetched_at", "fetch_id", "next_fetch_at", "counts_pending")
    unchanged = {k for k in snapshot if k not in moving}
    assert {k: again[k] for k in unchanged} == {k: snapshot[k] for k in unchanged}
    assert store.contents.find_one({"_id": "aa" * 32})["url_count"] == 1


def test_page_fields_follow_the_design(store):
    rec = store.record_page(page("http://127.0.0.2:8081/p/1?utm_source=x#top", "bb" * 32), 60)
    doc = store.pages.find_one({"_id": rec.page_id})
    assert rec.page_id == url_fingerprint("http://127.0.0.2:8081/p/1")
    for field in ("url", "final_url", "host", "spider", "status", "fetched_at", "fetch_method",
                  "content_hash", "blob_key", "duplicate_of", "fetch_count", "change_count",
                  "last_changed_at", "refetch_interval", "next_fetch_at"):
        assert field in doc, field
    assert doc["duplicate_of"] is None and doc["refetch_interval"] == 60
    assert (doc["next_fetch_at"] - doc["fetched_at"]).total_seconds() == 60
    content = store.contents.find_one({"_id": "bb" * 32})
    assert set(content) >= {"blob_key", "size", "first_url", "first_seen", "url_count"}
    names = {next(iter(ix["key"])) for ix in store.pages.list_indexes()}
    assert {"content_hash", "host", "next_fetch_at"} <= names


def test_duplicate_content_shares_hash(store):
    one = store.record_page(page("http://127.0.0.2:8081/product/1", "cc" * 32), 60)
    two = store.record_page(page("http://127.0.0.2:8081/print/product/1", "cc" * 32), 60)
    assert one.duplicate_of is None and two.duplicate_of == one.page_id
    assert store.contents.count_documents({}) == 1
    assert store.contents.find_one({"_id": "cc" * 32})["url_count"] == 2
    store.record_page(page("http://127.0.0.2:8081/print/product/1", "cc" * 32), 60)
    assert store.contents.find_one({"_id": "cc" * 32})["url_count"] == 2


def test_changed_content_counts_a_change(store):
    url = "http://127.0.0.2:8081/product/9"
    store.record_page(page(url, "dd" * 32), 60)
    rec = store.record_page(page(url, "ee" * 32, ts=time.time() + 10), 60)
    doc = store.pages.find_one({"_id": rec.page_id})
    assert rec.changed and doc["change_count"] == 1 and doc["content_hash"] == "ee" * 32
    assert store.contents.find_one({"_id": "dd" * 32})["url_count"] == 0
    assert store.contents.find_one({"_id": "ee" * 32})["url_count"] == 1


def test_summary(store):
    store.record_page(page("http://127.0.0.2:8081/a", "11" * 32), 60)
    store.record_page(page("http://127.0.0.2:8081/b", "11" * 32), 60)
    s = store.summary()
    assert s["pages"] == 2 and s["contents"] == 1 and s["duplicates"] == 1
    assert s["per_host"] == {"127.0.0.2:8081": 2}
    assert isinstance(store.client, pymongo.MongoClient)


def test_a_count_another_worker_already_made_does_not_drop_the_batchs_others(store):
    """Worker A writes pages 2 and 3 of a content in one batch and counts both moves in one
    guarded update. Between its page write and that update, worker B (retrying page 2)
    finds the page's count pending and makes it. A's update then finds a tag of its group
    applied: page 3's move must still count (seen once in ~6 suite runs as 5 for 6)."""
    h = "cc" * 32
    store.record_pages([page("http://127.0.0.2:8081/p/1", h)])  # the content's first page
    two = {**page("http://127.0.0.2:8081/p/2", h), "fetch_id": "f2"}
    three = {**page("http://127.0.0.2:8081/p/3", h), "fetch_id": "f3"}
    # B's re-issue of page 2's pending move, as the index makes it
    store.contents.bulk_write(count_ops("f2", None, h))
    store.record_pages([two, three])  # A read both pages as new, before B's count
    assert store.contents.find_one({"_id": h})["url_count"] == 3
    store.record_pages([two, three])  # a retry of A's batch changes nothing
    assert store.contents.find_one({"_id": h})["url_count"] == 3


def test_a_page_document_the_server_refuses_fails_alone_and_the_batch_is_stored(
        store, mongo_db):
    """A rule on ``pages`` or ``contents`` (a data team's validator) refusing one page's
    documents: before, the whole batch raised BulkWriteError and was retried as a store
    outage (WEBFARM_STORAGE_RETRY_SECONDS on each attempt) though no retry could help."""
    mongo_db.command("collMod", "pages", validator={
        "$jsonSchema": {"properties": {"url": {"bsonType": "string", "pattern": "^[^?]*$"}}}})
    mongo_db.command("collMod", "contents", validator={
        "$jsonSchema": {"properties": {"size": {"bsonType": "int", "maximum": 100}}}})
    base = "http://127.0.0.2:8081"
    ok, query, big = ("01" * 32, "02" * 32, "03" * 32)
    records = store.record_pages([
        page(f"{base}/a", ok), page(f"{base}/b?q=1", query), page(f"{base}/c", big, b"x" * 200),
        page(f"{base}/d", ok),
    ])
    assert [r.refused is None for r in records] == [True, False, False, True]
    assert "Document failed validation (code 121)" in records[1].refused
    assert records[2].refused.startswith("contents: ")
    assert records[3].duplicate_of == records[0].page_id
    assert sorted(d["url"] for d in store.pages.find()) == [f"{base}/a", f"{base}/d"]
    assert store.contents.find_one({"_id": ok})["url_count"] == 2
    assert store.contents.find_one({"_id": big}) is None
    # No content counts a page that is not stored (before: the refused page's, at 1).
    assert store.contents.find_one({"_id": query}) is None
    # The same pages again: the stored ones updated, the refused ones refused again.
    again = store.record_pages([page(f"{base}/a", ok), page(f"{base}/b?q=1", query)])
    assert again[0].refused is None and again[1].refused
    # The rule dropped: the refused page is stored and counted once.
    mongo_db.command("collMod", "pages", validator={})
    stored = store.record_pages([page(f"{base}/b?q=1", query)])[0]
    assert stored.refused is None and stored.new_page
    assert store.contents.find_one({"_id": query})["url_count"] == 1
