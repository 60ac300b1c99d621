"""The index DB: ``pages`` and ``contents`` in MongoDB, written by idempotent upserts.

A page is keyed by its URL fingerprint, a content by its hash. Recording the
same fetch twice changes only counters and times, so a redelivered request
(at-least-once frontier) is harmless. Calls are blocking (pymongo); the index
pipeline runs them off the reactor thread.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pymongo
from pymongo import ReturnDocument
from pymongo.errors import DuplicateKeyError

from webfarm.urls import canonical_url, url_fingerprint

PAGE_INDEXES = ("content_hash", "host", "next_fetch_at", "spider")


@dataclass(frozen=True)
class PageRecord:
    """What the index did with one page."""

    page_id: str
    new_page: bool
    changed: bool
    new_content: bool
    duplicate_of: str | None


def utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc)


class IndexStore:
    def __init__(self, uri: str, database: str = "webfarm", timeout_ms: int = 10_000) -> None:
        self.client: pymongo.MongoClient = pymongo.MongoClient(
            uri, serverSelectionTimeoutMS=timeout_ms, tz_aware=True, retryWrites=True
        )
        self.db = self.client[database]
        self.pages = self.db["pages"]
        self.contents = self.db["contents"]

    def ensure_indexes(self) -> None:
        for name in PAGE_INDEXES:
            self.pages.create_index(name)

    def close(self) -> None:
        self.client.close()

    def _content(self, page: dict[str, Any], page_id: str, now: dt.datetime) -> dict[str, Any]:
        for _ in range(2):  # a concurrent first insert of the same hash loses the race once
            try:
                return self.contents.find_one_and_update(
                    {"_id": page["content_hash"]},
                    {
                        "$setOnInsert": {
                            "blob_key": page["blob_key"],
                            "size": len(page["body"]),
                            "first_url": canonical_url(page["url"]),
                            "first_page_id": page_id,
                            "first_seen": now,
                            "url_count": 0,
                        }
                    },
                    upsert=True,
                    return_document=ReturnDocument.AFTER,
                )
            except DuplicateKeyError:
                continue
        raise RuntimeError(f"could not upsert content {page['content_hash']}")

    def record_page(self, page: dict[str, Any], refetch_interval: float) -> PageRecord:
        """Upsert ``pages`` and ``contents`` for one fetched page (a PageItem as a dict)."""
        page_id = url_fingerprint(page["url"])
        fetched = utc(page["fetched_at"])
        content = self._content(page, page_id, fetched)
        new_content = content["first_page_id"] == page_id and content["url_count"] == 0
        duplicate_of = None if content["first_page_id"] == page_id else content["first_page_id"]
        interval = refetch_interval
        before = self.pages.find_one_and_update(
            {"_id": page_id},
            {
                "$set": {
                    "url": canonical_url(page["url"]),
                    "final_url": page["final_url"],
                    "host": page["host"],
                    "spider": page["spider"],
                    "status": page["status"],
                    "fetched_at": fetched,
                    "fetch_method": page["fetch_method"],
                    "content_type": page.get("content_type") or "",
                    "content_hash": page["content_hash"],
                    "blob_key": page["blob_key"],
                    "duplicate_of": duplicate_of,
                },
                "$inc": {"fetch_count": 1},
                "$setOnInsert": {
                    "first_fetched_at": fetched,
                    "change_count": 0,
                    "last_changed_at": fetched,
                    "refetch_interval": interval,
                    "next_fetch_at": fetched + dt.timedelta(seconds=interval),
                },
            },
            upsert=True,
            return_document=ReturnDocument.BEFORE,
        )
        previous_hash = before.get("content_hash") if before else None
        changed = before is not None and previous_hash != page["content_hash"]
        if changed:
            self.pages.update_one(
                {"_id": page_id},
                {"$inc": {"change_count": 1}, "$set": {"last_changed_at": fetched}},
            )
        if previous_hash != page["content_hash"]:
            # This URL now shares the content: count it once, and uncount the old content.
            self.contents.update_one({"_id": page["content_hash"]}, {"$inc": {"url_count": 1}})
            if previous_hash:
                self.contents.update_one({"_id": previous_hash}, {"$inc": {"url_count": -1}})
        return PageRecord(page_id, before is None, changed, new_content, duplicate_of)

    def summary(self) -> dict[str, Any]:
        """Counts for reports: pages, distinct contents, pages per host."""
        per_host = {
            row["_id"]: row["n"]
            for row in self.pages.aggregate([{"$group": {"_id": "$host", "n": {"$sum": 1}}}])
        }
        return {
            "pages": self.pages.count_documents({}),
            "contents": self.contents.count_documents({}),
            "duplicates": self.pages.count_documents({"duplicate_of": {"$ne": None}}),
            "per_host": dict(sorted(per_host.items())),
        }
