"""The index DB: ``pages`` and ``contents`` in MongoDB, written by idempotent bulk upserts.

A page is keyed by its URL fingerprint, a content by its hash. Recording the
same fetch twice changes only counters and times, so a redelivered request
(at-least-once frontier) is harmless. Calls are blocking (pymongo); the index
pipeline batches pages and runs :meth:`IndexStore.record_pages` off the reactor.

One batch is a few round trips whatever its size: read the stored pages and
contents (``$in``; who holds a content first gives ``duplicate_of``), insert the
contents not stored yet, look up near-duplicates by SimHash band, insert new
``pages`` and update known ones, then move ``url_count`` from each page's old
content to its new one. New documents are inserted, not upserted: half the
server's work per document.

Exactly once under concurrency and retries: each page write is conditional on
the ``fetch_count`` it was read with (an insert: on there being none), so of two
workers writing one page, one gets a duplicate-key error and simply re-reads and
writes again. ``url_count`` is counted once per URL by :mod:`webfarm.urlcounts`,
whatever is retried or killed between the writes.

A document the server refuses for good (a validator on ``pages`` or ``contents``, one
too large) fails its page alone: its record says why (``PageRecord.refused``) and the
rest of the batch is stored; only other errors fail the batch, to be retried.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Protocol

import pymongo
from pymongo import InsertOne, UpdateOne
from scrapy.crawler import Crawler
from scrapy.utils.misc import build_from_crawler, load_object

from webfarm import neardup
from webfarm.bulkwrite import WriteOp, durable, write_unordered
from webfarm.refetch import duration, stored_later
from webfarm.urlcounts import CountMoves, count_ops, counted_by_insert, forget_orphans
from webfarm.urls import canonical_url, url_fingerprint

PAGE_INDEXES = ("content_hash", "host", "next_fetch_at", "spider")
CONTENT_INDEXES = ("simhash_bands",)
KNOWN_CONTENTS = 100_000  # content hash -> first page id, cached per store
DEFAULT_REFETCH_POLICY = "webfarm.index.FixedRefetch"
# Response headers kept in ``pages`` (re-parse rebuilds the response from them); never cookies.
_SKIP_HEADERS = frozenset({"set-cookie", "set-cookie2"})
HEADER_BYTES_KEPT = 256 * 1024  # Chromium's limit for a whole header block


def stored_headers(headers: dict[str, str] | None) -> dict[str, str]:
    """The headers a ``pages`` document keeps: no cookies, and none a MongoDB field cannot
    be named (a leading ``$`` or a ``.``: legal in HTTP, and a hostile server's way to get
    a page's whole batch refused), up to HEADER_BYTES_KEPT (a browser or fetch API
    answer is not bounded by ``WEBFARM_MAX_HEADER_BYTES``)."""
    kept: dict[str, str] = {}
    size = 0
    for name, value in (headers or {}).items():
        if name.lower() in _SKIP_HEADERS or name.startswith("$") or "." in name or not name:
            continue
        size += len(name) + len(value)
        if size > HEADER_BYTES_KEPT:
            break
        kept[name] = value
    return kept


class RefetchPolicy(Protocol):
    def fields(
        self, before: dict[str, Any] | None, changed: bool, fetched_at: dt.datetime,
        **page: Any,  # url=, host=: a new page has no ``before`` to match rules on
    ) -> dict[str, Any]:
        """``$set`` fields of a page on each fetch; at least ``refetch_interval`` (seconds)
        and ``next_fetch_at``. ``before`` is the stored page (None if new); ``changed``
        is True when a stored page's content hash differs (False for new or 304 pages)."""
        ...


class FixedRefetch:
    """The default policy (``WEBFARM_REFETCH_POLICY``): every page again after
    ``WEBFARM_REFETCH_INTERVAL`` seconds, whatever happened."""

    def __init__(self, interval_seconds: float = 86400.0) -> None:
        self.interval = float(interval_seconds)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FixedRefetch:
        raw = crawler.settings.get("WEBFARM_REFETCH_INTERVAL")
        return cls(86400.0 if raw in (None, "") else duration(raw, "WEBFARM_REFETCH_INTERVAL"))

    def fields(
        self, before: dict[str, Any] | None, changed: bool, fetched_at: dt.datetime,
        **page: Any,
    ) -> dict[str, Any]:
        return {
            "refetch_interval": self.interval,
            "next_fetch_at": fetched_at + dt.timedelta(seconds=self.interval),
        }


def load_refetch_policy(crawler: Crawler) -> RefetchPolicy:
    """The policy named by ``WEBFARM_REFETCH_POLICY`` (an import path), built from the crawler."""
    path = crawler.settings.get("WEBFARM_REFETCH_POLICY") or DEFAULT_REFETCH_POLICY
    return build_from_crawler(load_object(path), crawler)


@dataclass(frozen=True)
class PageRecord:
    """What the index did with one page."""

    page_id: str
    new_page: bool
    changed: bool
    new_content: bool
    duplicate_of: str | None
    near_duplicate_of: str | None = None
    near_duplicate_distance: int | None = None
    not_modified: bool = False
    gone: bool = False  # a refetch found the page gone (404/410); its last content is kept
    # The server refused the page's documents for good (a validator, a document too
    # large): its message. Nothing of the page was written; sending it again cannot help.
    refused: str | None = None
    # A later fetch of the page is stored: nothing of this older one was written.
    superseded: bool = False


def utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc)


class IndexStore:
    def __init__(
        self, uri: str, database: str = "webfarm", timeout_ms: int = 10_000,
        refetch: RefetchPolicy | None = None, neardup_distance: int = 3,
    ) -> None:
        # connect=False: no monitoring threads or connections until the first call. A
        # crawler's pipelines hold a store only to send it to the storage process, which
        # opens its own; connected, each store cost the crawler 3 threads and 2 idle
        # connections to MongoDB.
        self.client: pymongo.MongoClient = pymongo.MongoClient(
            uri, serverSelectionTimeoutMS=timeout_ms, tz_aware=True, retryWrites=True,
            connect=False, **durable(uri),
        )
        # Pickled as what opens it again (the storage process gets a client of its own).
        self._recipe = (uri, database, timeout_ms, refetch, neardup_distance)
        self.db = self.client[database]
        self.pages = self.db["pages"]
        self.contents = self.db["contents"]
        self.refetch: RefetchPolicy = refetch or FixedRefetch()
        self.neardup_distance = neardup_distance
        self._known: OrderedDict[str, str] = OrderedDict()

    def ensure_indexes(self) -> None:
        for name in PAGE_INDEXES:
            self.pages.create_index(name)
        for name in CONTENT_INDEXES:
            self.contents.create_index(name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (IndexStore, self._recipe)

    def close(self) -> None:
        self.client.close()

    # -- writing pages ----------------------------------------------------------------------

    def record_page(self, page: dict[str, Any], refetch_interval: float | None = None
                    ) -> PageRecord:
        """Upsert ``pages`` and ``contents`` for one fetched page (a PageItem as a dict)."""
        policy = FixedRefetch(refetch_interval) if refetch_interval is not None else None
        return self.record_pages([page], policy)[0]

    def record_pages(self, pages: list[dict[str, Any]], refetch: RefetchPolicy | None = None
                     ) -> list[PageRecord]:
        """Upsert a batch of pages (PageItems as dicts); one record per page, in order."""
        policy = refetch or self.refetch
        pages = [p if p.get("fetch_id") else {**p, "fetch_id": uuid.uuid4().hex} for p in pages]
        records: dict[int, PageRecord] = {}
        pending = list(range(len(pages)))
        for _ in range(20):
            batch: list[int] = []
            later: list[int] = []
            seen: set[str] = set()
            for i in pending:  # the same page twice in a batch: the second one next round
                pid = url_fingerprint(pages[i]["url"])
                (later if pid in seen else batch).append(i)
                seen.add(pid)
            conflicts = self._write(pages, batch, policy, records)
            pending = sorted(conflicts + later)
            if not pending:
                return [records[i] for i in range(len(pages))]
        raise RuntimeError(f"{len(pending)} pages kept conflicting with concurrent writers")

    def _write(self, pages: list[dict[str, Any]], batch: list[int], policy: RefetchPolicy,
               records: dict[int, PageRecord]) -> list[int]:
        ids = {i: url_fingerprint(pages[i]["url"]) for i in batch}
        before = {d["_id"]: d for d in self.pages.find({"_id": {"$in": list(ids.values())}})}
        # A later fetch of the page is stored already: this fetch was held past its lease
        # (a stalled worker), and another worker fetched the page again meanwhile. Written,
        # it put the older content back over the newer (491 of 665 pages went back 12 s).
        stale = {i for i in batch
                 if stored_later(before.get(ids[i]), "fetched_at", pages[i]["fetched_at"])}
        for i in stale:
            b = before[ids[i]]
            records[i] = PageRecord(ids[i], False, False, False, b.get("duplicate_of"),
                                    b.get("near_duplicate_of"),
                                    b.get("near_duplicate_distance"), superseded=True)
        batch = [i for i in batch if i not in stale]
        # 1. who holds each content first (never changes: cached); a content not stored
        # yet gets its document now (url_count moves in 4.), inserted rather than upserted
        # as it was just read as missing; a duplicate key means another worker was first.
        hashes = {pages[i]["content_hash"] for i in batch if pages[i].get("content_hash")}
        inserted: dict[str, str] = {}  # content hash -> page id, for contents inserted now
        refused: dict[str, str] = {}  # content hash -> why the server refused its document
        contents = {h: {"first_page_id": self._known[h]} for h in hashes if h in self._known}
        if len(contents) < len(hashes):
            contents.update(self._read_contents(hashes - set(contents)))
            new: dict[str, dict[str, Any]] = {}
            for i in batch:
                h = pages[i].get("content_hash")
                if h and h not in contents and h not in new and not pages[i].get("not_modified"):
                    new[h] = self._content_doc(pages[i], ids[i])
            keys = list(new)
            inserts = [InsertOne(d) for d in new.values()]
            refused_at: dict[int, str] = {}
            lost = {keys[k] for k in write_unordered(self.contents, inserts, refused_at)}
            refused = {keys[k]: why for k, why in refused_at.items()}
            inserted = {h: new[h]["first_page_id"] for h in keys
                        if h not in lost and h not in refused}
            contents.update({h: doc for h, doc in new.items()
                             if h not in lost and h not in refused})
            contents.update(self._read_contents(lost))
            for h, doc in contents.items():
                self._known[h] = doc["first_page_id"]
            while len(self._known) > KNOWN_CONTENTS:
                self._known.popitem(last=False)
        # 2. near-duplicates of the contents this batch holds first.
        near = neardup.near_pages(self.contents, self.neardup_distance, pages,
                                  [(i, ids[i], before.get(ids[i])) for i in batch], contents)
        # 3. pages, each conditional on the version it was read at.
        ops: list[WriteOp] = []
        order: list[int] = []
        moves = CountMoves([])
        for i in batch:
            page, pid, b = pages[i], ids[i], before.get(ids[i])
            if b and b.get("counts_pending"):  # its last move may not have been counted
                moves.pending += count_ops(b["fetch_id"], b.get("prev_content_hash"),
                                           b.get("content_hash"))
            if b and b.get("fetch_id") == page["fetch_id"]:  # a retry of an applied write
                records[i] = PageRecord(pid, False, False, False, b.get("duplicate_of"),
                                        b.get("near_duplicate_of"),
                                        b.get("near_duplicate_distance"),
                                        bool(page.get("not_modified")), bool(page.get("gone")))
                continue
            if b is None and page.get("gone"):  # no stored page to mark (deleted meanwhile)
                records[i] = PageRecord(pid, False, False, False, None, gone=True)
                continue
            if page.get("content_hash") in refused and not page.get("not_modified"):
                records[i] = PageRecord(pid, False, False, False, None,
                                        refused=f"contents: {refused[page['content_hash']]}")
                continue
            content = contents.get(page.get("content_hash") or "")
            op, record = self._page_op(page, pid, b, content, near.get(i), policy)
            ops.append(op)
            order.append(i)
            records[i] = record
        page_refused: dict[int, str] = {}
        conflicts = [order[k] for k in write_unordered(self.pages, ops, page_refused)]
        for i in conflicts:
            del records[i]
        for k, why in page_refused.items():
            records[order[k]] = replace(records[order[k]], new_page=False, changed=False,
                                        new_content=False, refused=f"pages: {why}")
        # 4. url_count follows the pages that now hold (or left) a content
        # (:mod:`webfarm.urlcounts`: counted once, whatever is retried).
        failed = set(conflicts) | {order[k] for k in page_refused}
        for i in order:
            page, b = pages[i], before.get(ids[i])
            old, new = (b or {}).get("content_hash"), page["content_hash"]
            # A 304 or a gone page keeps its stored content: no move. (A gone page moved
            # away from it: url_count went down one at each refetch that found it gone,
            # below 0, and stayed down when the page came back.)
            if i in failed or page.get("not_modified") or page.get("gone") or old == new:
                continue
            if not counted_by_insert(b, contents.get(new), ids[i]):
                moves.add(ids[i], page["fetch_id"], old, new)
        moves.write(self.contents, self.pages)
        orphans = [(h, ids[i]) for i in (order[k] for k in page_refused)
                   if (h := pages[i].get("content_hash")) and inserted.get(h) == ids[i]]
        forget_orphans(self.contents, orphans)
        for h, _ in orphans:
            self._known.pop(h, None)
        return conflicts

    def _read_contents(self, hashes: set[str]) -> dict[str, dict[str, Any]]:
        if not hashes:
            return {}
        return {d["_id"]: d for d in self.contents.find({"_id": {"$in": sorted(hashes)}},
                                                         {"first_page_id": 1})}

    def _content_doc(self, page: dict[str, Any], pid: str) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "_id": page["content_hash"],
            "blob_key": page["blob_key"],
            "size": page["body_size"] if "body_size" in page else len(page.get("body") or b""),
            "first_url": canonical_url(page["url"]),
            "first_page_id": pid,
            "first_seen": utc(page["fetched_at"]),
            # Its first page is counted here, not by a later $inc: most contents have one
            # page, and an update costs the server more than the insert. If that page's
            # own write never happens (a crash), its next fetch finds the content naming
            # it first and no page yet, and does not count it again.
            "url_count": 1,
            "applied": [f"+{page['fetch_id']}"],
        }
        if page.get("simhash") is not None:
            fields["simhash"] = neardup.to_stored(page["simhash"])
            fields["simhash_bands"] = neardup.bands(page["simhash"])
        return fields

    def _page_op(self, page: dict[str, Any], pid: str, b: dict[str, Any] | None,
                 content: dict[str, Any] | None, near: tuple[str, int] | None,
                 policy: RefetchPolicy) -> tuple[WriteOp, PageRecord]:
        fetched = utc(page["fetched_at"])
        gone = bool(page.get("gone")) and b is not None
        # A 304 or a gone page has no new content: the stored one stays.
        not_modified = gone or (bool(page.get("not_modified")) and b is not None)
        fields: dict[str, Any] = {
            "fetched_at": fetched,
            "fetch_id": page["fetch_id"],
            "fetch_method": page.get("fetch_method") or "http",
            "last_status": page["status"],
            "etag": page.get("etag"),
            "last_modified": page.get("last_modified"),
        }
        if not_modified:  # a 304 need not repeat the validators: keep the stored ones
            for name in ("etag", "last_modified"):
                # A gone page's are its error page's: the stored content's stay, so the
                # next refetch's 304 means that content is back.
                fields[name] = b.get(name) if gone else fields[name] or b.get(name)
        if not_modified:
            changed = False
            fields["counts_pending"] = False
            duplicate_of = b.get("duplicate_of")
            record = PageRecord(pid, False, False, False, duplicate_of,
                                b.get("near_duplicate_of"), b.get("near_duplicate_distance"),
                                True, gone)
            if gone:  # since when: the first refetch that found it gone
                fields["gone_at"] = b.get("gone_at") or fetched
            elif b.get("gone_at"):  # a 304 to a page found gone before: it is back
                fields["gone_at"] = None
        else:
            changed = b is not None and b.get("content_hash") != page["content_hash"]
            first = (content or {}).get("first_page_id", pid)
            duplicate_of = None if first == pid else first
            fields.update({
                "url": canonical_url(page["url"]),
                "final_url": page["final_url"],
                "redirect_urls": page.get("redirect_urls"),
                "host": page["host"],
                "spider": page["spider"],
                "status": page["status"],
                "content_type": page.get("content_type") or "",
                "encoding": page.get("encoding"),
                "headers": stored_headers(page.get("headers")),
                "content_hash": page["content_hash"],
                "blob_key": page["blob_key"],
                "duplicate_of": duplicate_of,
                "near_duplicate_of": near[0] if near and not duplicate_of else None,
                "near_duplicate_distance": near[1] if near and not duplicate_of else None,
            })
            if changed or b is None:
                fields["last_changed_at"] = fetched
            if b is not None and b.get("gone_at"):  # found gone before, served again
                fields["gone_at"] = None
            if page.get("callback") or (b or {}).get("callback"):
                # the spider method it went to, if not WebfarmSpider's parse, and its
                # cb_kwargs: re-parse and recrawl send it there again (middlewares/sources.py)
                fields["callback"] = page.get("callback")
                fields["cb_kwargs"] = page.get("cb_kwargs")
                fields["errback"] = page.get("errback")
            if page.get("meta") or (b or {}).get("meta"):
                fields["meta"] = page.get("meta")  # the spider's own meta of its request
            moved = ((b or {}).get("content_hash") != page["content_hash"]
                     and not counted_by_insert(b, content, pid))
            fields["counts_pending"] = moved
            fields["prev_content_hash"] = (b or {}).get("content_hash") if moved else None
            new_content = (content or {}).get("first_page_id") == pid and (
                b is None or changed)
            record = PageRecord(pid, b is None, changed, new_content, duplicate_of,
                                fields["near_duplicate_of"], fields["near_duplicate_distance"])
        fields.update(policy.fields(b, changed, fetched, url=canonical_url(page["url"]),
                                    host=page["host"]))
        if b is None:  # read as missing: insert (a duplicate key is a concurrent writer)
            return InsertOne({"_id": pid, **fields, "spiders": [page["spider"]],
                              "fetch_count": 1, "change_count": 0,
                              "first_fetched_at": fetched}), record
        update: dict[str, Any] = {
            "$set": fields,
            "$inc": {"fetch_count": 1, "change_count": 1 if changed else 0},
            # every spider that stored the page: ``spider`` is the last one, and a re-parse
            # of an earlier one must still find it
            "$addToSet": {"spiders": page["spider"]},
        }
        return UpdateOne({"_id": pid, "fetch_count": b.get("fetch_count")}, update,
                         upsert=True), record

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
            "near_duplicates": self.pages.count_documents({"near_duplicate_of": {"$ne": None}}),
            "per_host": dict(sorted(per_host.items())),
        }
