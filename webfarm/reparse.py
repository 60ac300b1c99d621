"""Re-parse: run a spider's extraction again over stored raw pages, with no network.

Raw pages and parsed data are kept apart so that an improved extractor can be
run over history without refetching a thing. :class:`Reparser` streams the
spider's ``pages`` from the index (optionally since a date and matching a URL
regex), reads each body from the blob store (mirrors share one blob, read
once), rebuilds the response (final URL, status, stored headers with the
content type, encoding, the original request) and calls the spider's
``extract`` (or, for a plain Scrapy spider, ``parse``; for a page a WebfarmSpider stored
for a callback of its own, ``pages.callback``, that one). Requests it yields are
ignored; items go through the project's own item pipelines, those a crawl runs
before the item store (:mod:`webfarm.reparsepipes`: cleaning, validation, DropItem),
and are stored exactly as a crawl stores them
(:func:`webfarm.itemstore.make_entry` + :class:`~webfarm.itemstore.ItemStore`),
with the page's stored URL and content hash, and counted as created, changed
or unchanged. No Scrapy engine or downloader is ever built.

Pages come in content-hash order (mirrors together: one read a body); bodies are read
ahead, ``WEBFARM_BLOB_CONCURRENCY`` at once (:mod:`webfarm.reparsepages`, the reading
half), and items are written by a thread of their
own while the next pages are parsed. ``--shard K/N`` takes a slice of the hash space;
``--dry-run`` previews the outcomes and writes nothing.

A store that fails for a while (MongoDB restarting, the S3 endpoint unreachable) is
waited for, with backoff, for ``WEBFARM_STORAGE_RETRY_SECONDS`` per outage, as a crawl
waits; the page cursor resumes where it was. Past that the run stops with
:class:`~webfarm.batching.StorageUnavailable`, and running the same command again
finishes the job (items are upserts). A blob that is not there or does not decompress
is counted and logged, and its page skipped: it never passes for an empty page.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pymongo.errors import ConnectionFailure, OperationFailure
from scrapy import Request, Spider
from scrapy.http import Response

from webfarm import batching, serialize
from webfarm.batching import RETRY_SECONDS, TRANSIENT
from webfarm.blobstore import Blob, BlobDamaged, BlobMissing, BlobStore
from webfarm.index import IndexStore
from webfarm.items import PageItem
from webfarm.itemstore import (
    CHANGED,
    CREATED,
    STORED_FIELDS,
    SUPERSEDED,
    UNCHANGED,
    ItemEntry,
    ItemError,
    ItemStore,
    RunOrder,
    fold_keyless,
    keyless_advice,
    make_entry,
)
from webfarm.keyclash import KeyClashes
from webfarm.queue import callback_for
from webfarm.reparsepages import HUNG_AFTER, PageReader, page_query, rebuild_response
from webfarm.reparsepipes import PipelineNeedsReactor, ProjectPipelines
from webfarm.urls import url_fingerprint

logger = logging.getLogger(__name__)
R = TypeVar("R")

@dataclass
class ReparseStats:
    pages: int = 0
    items: int = 0
    created: int = 0
    changed: int = 0
    unchanged: int = 0
    errors: int = 0
    dropped: int = 0  # by the project's item pipelines (DropItem)
    missing_blobs: int = 0
    damaged_blobs: int = 0
    superseded: int = 0  # items of pages a crawl stored again meanwhile: left as it wrote
    folded: int = 0  # keyless items of one page stored as one document (the last one's)
    old_keys: int = 0  # documents stored under a key the spider's items no longer use
    clashes: int = 0  # items whose key another page gave other values in this run
    requests: int = 0  # requests the callbacks yielded: not followed (no network)
    retries: int = 0
    writing: int = 0  # items extracted and not written yet (a progress line's "+N")
    started: float = field(default_factory=time.monotonic)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def line(self) -> str:
        rate = self.pages / self.seconds if self.seconds > 0 else 0.0
        newer = (f", {self.superseded} left to a newer fetch" if self.superseded else "")
        newer += f", {self.folded} folded (no key)" if self.folded else ""
        newer += f", {self.clashes} keys from two pages" if self.clashes else ""
        newer += (f", {self.requests} requests not followed (no network)" if self.requests
                  else "")
        # Items are counted as written, in batches: progress lines said "0 items" until
        # the first batch landed.
        writing = f" (+{self.writing} not written yet)" if self.writing else ""
        return (f"reparse: {self.pages} pages, {self.items} items{writing}: "
                f"{self.created} created, "
                f"{self.changed} changed, {self.unchanged} unchanged, {self.dropped} dropped"
                f"{newer}; "
                f"{self.errors} errors, "
                f"{self.missing_blobs} missing blobs, {self.damaged_blobs} damaged; "
                f"{self.retries} store retries; {self.seconds:.1f}s "
                f"({rate:.0f} pages/s)")


def describe_change(entry: ItemEntry, stored: dict[str, Any] | None, width: int = 60) -> str:
    """``collection key: field: old -> new; ...``, values cut to ``width`` characters."""

    def cut(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= width else text[:width - 3] + "..."

    old = stored or {}
    # The fields the store removes are those the stored item had (``item_fields``, kept
    # since 2026-12-07); others on the document (someone's annotations) stay: no change.
    fields = sorted(set(entry.fields) | (set(old.get("item_fields") or ()) - STORED_FIELDS))
    diffs = [f"{name}: {cut(old.get(name))} -> {cut(entry.fields.get(name))}"
             for name in fields if old.get(name) != entry.fields.get(name)]
    # No field differs from the stored document: the change is against another page of
    # this run that gave the key other values (or a document stored without item_hash).
    same = ("(the same fields as stored; another page of this run gave this key other "
            "values before)" if old.get("item_hash") else "(the same fields; stored without "
            "item_hash)")
    return f"{entry.collection} {cut(entry.key)}: " + ("; ".join(diffs) or same)


class Outage(batching.Outage):
    """:class:`webfarm.batching.Outage` for re-parse's blocking calls: ``call`` retries in
    this thread. One outage may span calls (a cursor fails and resumes per document)."""

    def __init__(self, what: str, seconds: float, stats: ReparseStats,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__(what, seconds)
        self.stats = stats
        self.sleep = sleep

    def call(self, fn: Callable[[], R], transient: tuple[type[BaseException], ...] = TRANSIENT
             ) -> R:
        while True:
            try:
                result = fn()
            except transient as exc:
                self.failed(exc)
                continue
            self.ended()
            return result

    def failed(self, exc: BaseException) -> float:
        """Wait before the next attempt, or raise StorageUnavailable past the limit."""
        delay = super().failed(exc)
        self.stats.retries += 1
        self.sleep(delay)
        return delay


class Reparser:
    def __init__(
        self, spider: Spider, index: IndexStore, blobs: BlobStore, items: ItemStore,
        batch_size: int = 200, progress_every: int = 500,
        progress: Callable[[ReparseStats], None] | None = None,
        retry_seconds: float = RETRY_SECONDS, page_batch: int = 500, blob_reads: int = 8,
        dry_run: bool = False, show_changes: int = 10,
        pipelines: ProjectPipelines | None = None,
    ) -> None:
        self.spider = spider
        self.pipelines = pipelines  # the project's own, run before an item is stored
        self.index = index
        self.blobs = blobs
        self.items = items
        self.batch_size = max(1, batch_size)
        self.progress_every = max(0, progress_every)  # 0: no progress lines
        self.progress = progress or (lambda s: logger.info("%s", s.line()))
        self.retry_seconds = retry_seconds
        self.page_batch = page_batch
        self.blob_reads = max(1, blob_reads)  # at once, WEBFARM_BLOB_CONCURRENCY
        # dry run: nothing written; the first show_changes changed items are logged, field by
        # field, and what the run would have written is kept to count as a run would
        self.dry_run = dry_run
        self.show_changes = show_changes
        self._written: dict[tuple[str, str], tuple[str, dt.datetime]] = {}
        self._shown = 0
        self.stats = ReparseStats()
        callback = getattr(spider, "extract", None) or spider.parse
        self.callback: Callable[[Response], Iterable[Any] | None] = callback
        # pages a WebfarmSpider stored for another callback (``pages.callback``): that one
        self._callbacks: dict[tuple[str, tuple[str, ...]], Callable[..., Any] | None] = {}
        self._keys: dict[str, tuple[str, ...]] = {}  # collection -> the key its items use
        self._said_keyless: set[str] = set()
        self._clashes = KeyClashes()  # keys two pages gave other values

    def run(self, since: dt.datetime | None = None, url_pattern: str | None = None,
            shard: tuple[int, int] | None = None) -> ReparseStats:
        """Re-parse the matching pages; the stats so far are ``self.stats`` if it raises."""
        stats = self.stats = ReparseStats()
        # Of two pages giving one key, the item of the page fetched last is kept, whichever
        # this run reads first (a product's stale second URL read after the newer one);
        # the rule for items stored before the run: webfarm.itemstore._superseded.
        query = page_query(self.spider.name, since, url_pattern, shard)
        self._order = RunOrder(dt.datetime.now(dt.timezone.utc),
                               functools.partial(self._read_too, query))
        self._written.clear()
        self._index = Outage("reading pages from MongoDB", self.retry_seconds, stats)
        self._blobs = Outage(f"reading blobs from {self.blobs.uri}", self.retry_seconds, stats)
        self._items = Outage("writing items to MongoDB", self.retry_seconds, stats)
        hint: list[tuple[str, int]] | None = [("content_hash", 1)]  # the page cursor's
        try:  # the content_hash index the page cursor runs on (a crawl creates it at start)
            self._index.call(self.index.ensure_indexes, (ConnectionFailure,))
        except OperationFailure:  # a read-only user may still preview, on the indexes there
            if not self.dry_run:
                raise
            hint = None  # which may be none (never crawled): no hint then
        self._reader = PageReader(self.index, self.blobs, self._index, self._blobs.call,
                                  self.page_batch, self.blob_reads, hint,
                                  hung_after=min(HUNG_AFTER, self.retry_seconds or HUNG_AFTER))
        if self.pipelines is not None:
            self.pipelines.open()
        pending: list[ItemEntry] = []
        pool = ThreadPoolExecutor(self.blob_reads, thread_name_prefix="reparse-blobs")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="reparse-items")
        self._writing: Future[list[str]] | None = None
        try:
            pages = self._reader.pages(query)
            for doc, read in self._reader.read_ahead(pages, pool):
                stats.pages += 1
                extracted = self._page(doc, read, stats)
                stats.writing += len(extracted)
                pending += extracted
                if len(pending) >= self.batch_size:
                    self._write(pending, stats)
                    pending = []
                if self.progress_every and stats.pages % self.progress_every == 0:
                    self.progress(stats)
            self._write(pending, stats)
            self._flush(stats)
            self._old_keys(stats)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            self._writer.shutdown(wait=False)
            if self.pipelines is not None:
                self.pipelines.close()
        return stats

    def _page(self, doc: dict[str, Any], read: Future[Blob], stats: ReparseStats
              ) -> list[ItemEntry]:
        try:
            body = self._reader.body(doc["blob_key"], read)
        except BlobMissing as exc:  # one lost blob must not stop the others
            stats.missing_blobs += 1
            logger.error("reparse: skipped %s: %s", doc["url"], exc)
            return []
        except BlobDamaged as exc:
            stats.damaged_blobs += 1
            logger.error("reparse: skipped %s: blob %s is damaged (%s)", doc["url"],
                         doc["blob_key"], exc)
            return []
        callback = self._callback_of(doc)
        if callback is None:
            stats.errors += 1
            return []
        now = dt.datetime.now(dt.timezone.utc)
        entries: list[ItemEntry] = []
        try:
            for output in callback(rebuild_response(doc, body)) or ():
                if isinstance(output, Request):  # links: a re-parse fetches nothing
                    stats.requests += 1
                    continue
                if isinstance(output, PageItem) or output is None:
                    continue  # a callback calling super().parse() yields the page too
                item = self._piped(output, doc["url"], stats)
                if item is None:
                    continue
                try:
                    entries.append(make_entry(item, self.spider, doc["url"],
                                              doc.get("content_hash"), now,
                                              doc.get("fetched_at")))
                except ItemError as exc:  # that item alone, as in a crawl
                    stats.errors += 1
                    logger.error("reparse: %s", exc)
        except PipelineNeedsReactor:
            raise
        except Exception:  # a callback bug on one page: log it, go on
            stats.errors += 1
            logger.exception("reparse: %s failed on %s", self.spider.name, doc["url"])
        return self._folded(entries, doc["url"], stats)

    def _folded(self, entries: list[ItemEntry], url: str, stats: ReparseStats
                ) -> list[ItemEntry]:
        """A page's entries as stored: keyless ones of a collection are one document. They
        were counted as changed (each replaced the one before), and nothing said why."""
        entries, folded = fold_keyless(entries)
        for collection, n in folded.items():
            stats.folded += n
            if collection not in self._said_keyless:
                self._said_keyless.add(collection)
                logger.warning("reparse: %s gave %d items without a key from %s into %r: "
                               "they are stored as one document keyed on the page, the "
                               "last one's. %s (said once per collection)", self.spider.name,
                               n + 1, url, collection, keyless_advice())
        for entry in entries:
            self._keys.setdefault(entry.collection, entry.key_fields)
            other = self._clashes.meet(entry)
            if other is not None:
                stats.clashes += 1
                if said := self._clashes.advice_once(entry, other, self.spider.name):
                    logger.warning("reparse: %s", said)
        return entries

    def _old_keys(self, stats: ReparseStats) -> None:
        """Say how many documents of the collections written are stored under another key
        than the items' now (a spider that gained key_fields): re-parse writes the items
        under their new key and leaves the old documents beside them, duplicates."""
        for collection, key in self._keys.items():
            other = {"item_key": {"$exists": True, "$ne": list(key)}}
            coll = self.items.db[collection]
            n = self._index.call(functools.partial(coll.count_documents, other))
            if not n:
                continue
            stats.old_keys += n
            was = self._index.call(functools.partial(coll.find_one, other, {"item_key": 1}))
            stored = "would be stored" if self.dry_run else "were stored"
            logger.warning(
                "reparse: %d documents in %r are keyed on %s, and %s's items are now keyed "
                "on %s: their items %s again under the new key, and these stay beside "
                "them. Once every page is re-parsed (no --since or --url-pattern), remove "
                "them: db[%r].delete_many(%r)", n, collection,
                ", ".join((was or {}).get("item_key") or ()) or "another key",
                self.spider.name, ", ".join(key), stored, collection, other)

    def _callback_of(self, doc: dict[str, Any]) -> Callable[[Response], Any] | None:
        """What to run on a page: ``extract`` (or a plain spider's ``parse``), or the spider
        method a WebfarmSpider's page went to in the crawl, with the request's stored
        ``cb_kwargs``. None, said once per name, for a name that is no callback of the
        spider or one whose arguments the stored ``cb_kwargs`` do not give."""
        name = doc.get("callback")
        if not name or doc.get("spider", self.spider.name) != self.spider.name:
            return self.callback  # another spider's callback is no name of this one's
        try:
            kwargs = serialize.loads_value(doc["cb_kwargs"]) if doc.get("cb_kwargs") else {}
        except serialize.SerializationError as exc:
            logger.error("reparse: skipped %s: its stored cb_kwargs: %s", doc["url"], exc)
            return None
        key = (name, tuple(sorted(kwargs)))
        if key not in self._callbacks:
            method, why = callback_for(self.spider, name, kwargs)
            if why:
                logger.error("reparse: skipping the pages stored for %s.%s, which %s",
                             self.spider.name, name, why)
            self._callbacks[key] = None if why else method
        method = self._callbacks[key]
        return None if method is None else functools.partial(method, **kwargs)

    def _piped(self, item: Any, url: str, stats: ReparseStats) -> Any | None:
        """The item after the project's pipelines; None if one dropped it or failed on it
        (that item alone, as in a crawl)."""
        if self.pipelines is None:
            return item
        try:
            piped = self.pipelines.process(item, url)
        except PipelineNeedsReactor:
            raise
        except Exception:
            stats.errors += 1
            logger.exception("reparse: an item pipeline failed on an item from %s", url)
            return None
        if piped is None:
            stats.dropped += 1
        return piped

    def _write(self, entries: list[ItemEntry], stats: ReparseStats) -> None:
        """Hand the batch to the writer thread once the one before it is stored: the next
        pages are parsed while MongoDB stores this one (on the bench the server's CPU
        for a batch was twice the parsing's), and batches still land in order."""
        self._flush(stats)
        if entries:
            self._writing = self._writer.submit(self._store, entries)

    def _flush(self, stats: ReparseStats) -> None:
        """Wait for the batch being written (its errors raise here) and count it."""
        writing, self._writing = self._writing, None
        outcomes = writing.result() if writing is not None else ()
        stats.writing -= len(outcomes)
        for outcome in outcomes:
            if isinstance(outcome, ItemError):  # refused by the server's rules; others stored
                stats.errors += 1
                logger.error("reparse: %s", outcome)
                continue
            if outcome == SUPERSEDED:
                stats.superseded += 1
                continue
            stats.items += 1
            if outcome == CREATED:
                stats.created += 1
            elif outcome == CHANGED:
                stats.changed += 1
            elif outcome == UNCHANGED:
                stats.unchanged += 1

    def _read_too(self, query: dict[str, Any], urls: set[str]) -> set[str]:
        """Which of ``urls`` (the pages stored items came from) this run reads too."""
        ids = [url_fingerprint(u) for u in urls]
        return {d["url"] for d in self.index.pages.find(
            {"$and": [query, {"_id": {"$in": ids}}]}, {"url": 1})}

    def _refetched(self, entries: list[ItemEntry]) -> set[int]:
        """The entries whose page a crawl stored again since it was read here: the crawl
        wrote their items from the newer page, and these would put older values back (a
        re-parse running beside a crawl reverted new prices, counted as "changed")."""
        ids = {e.source_url: url_fingerprint(e.source_url) for e in entries}
        now = {d["_id"]: d.get("content_hash") for d in self.index.pages.find(
            {"_id": {"$in": list(set(ids.values()))}}, {"content_hash": 1})}
        return {i for i, e in enumerate(entries)
                if ids[e.source_url] in now and now[ids[e.source_url]] != e.content_hash}

    def _store(self, entries: list[ItemEntry]) -> list[str | ItemError]:
        """In the writer thread: each entry's outcome, written or (dry run) previewed."""
        if not self.dry_run:
            stale = self._items.call(lambda: self._refetched(entries))
            fresh = [e for i, e in enumerate(entries) if i not in stale]
            attempts = itertools.count()
            written = iter(self._items.call(
                lambda: self.items.write_items(fresh, retried=next(attempts) > 0,
                                               run=self._order)))
            return [SUPERSEDED if i in stale else next(written) for i in range(len(entries))]
        previews = self._items.call(
            lambda: self.items.preview_items(entries, self._written, self._order))
        for entry, (outcome, stored) in zip(entries, previews, strict=True):
            if outcome == CHANGED and self._shown < self.show_changes:
                self._shown += 1
                logger.info("reparse: would change %s", describe_change(entry, stored))
        return [outcome for outcome, _ in previews]
