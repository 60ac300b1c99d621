"""Raw pages to the blob store, once per content hash."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from scrapy.crawler import Crawler
from scrapy.statscollectors import StatsCollector

from webfarm import config
from webfarm.batching import RETRY_SECONDS, Batcher
from webfarm.blobstore import BlobStore, blob_key, open_blob_store
from webfarm.dupefilter import RecentFingerprints
from webfarm.index import utc
from webfarm.items import PageItem
from webfarm.threads import StorageCalls, storage_calls


class BlobWriteFailed(OSError):
    """Some writes of a batch failed for now (an ``OSError``: retried with backoff)."""


@dataclass(slots=True)
class _Write:
    key: str
    body: bytes
    metadata: dict[str, str]
    written: bool | None = None  # None until it succeeded (a retry skips the others)


class BlobStorePipeline:
    """Writes each :class:`PageItem`'s raw body under ``raw/<hash[:2]>/<hash>``.

    Runs after the content hash and before the index, so an index entry never
    points at a blob that is not there. Writes go to the store in batches (one
    call to the storage process carries every write waiting while the previous
    calls ran, so their number is not capped by that round trip), and at most
    ``WEBFARM_BLOB_CONCURRENCY`` of them run at once (in the store's threads,
    never on the reactor). A failing store is retried with backoff for
    ``WEBFARM_STORAGE_RETRY_SECONDS`` (on top of botocore's own ``standard``
    retries); the item is not done until then.

    Keys this worker saw stored lately (``WEBFARM_RECENT_BLOBS``) are not asked for
    again: a page whose content is already stored (a mirror, a URL variant) then costs
    no trip to the storage process, no S3 HEAD and no copy of its body; one that comes
    while that content's write is out waits for it. Blobs are write-once and webfarm
    never deletes one, so a key it holds is still stored.
    """

    webfarm_stage = "blobs"  # a storage pipeline (webfarm.reparsepipes leaves it out)

    def __init__(self, store: BlobStore, stats: StatsCollector, threads: StorageCalls,
                 concurrency: int = 8, retry_seconds: float = RETRY_SECONDS,
                 recent: int = 100_000) -> None:
        self.store = store
        self.stats = stats
        self.threads = threads
        self.concurrency = max(1, concurrency)
        self.recent = RecentFingerprints(recent)
        self._writing: dict[bytes, asyncio.Future[None]] = {}  # content -> its write, done
        # No waiting for a batch to fill: a write goes at once when a writer is free,
        # and the writes that come while both are busy go together next.
        self.batcher: Batcher[_Write, bool] = Batcher(
            self._write, size=4 * self.concurrency, seconds=0.0, writers=2,
            retry_seconds=retry_seconds, what="blob writes", stats=stats,
            stat_prefix="webfarm/blobs")

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> BlobStorePipeline:
        settings = crawler.settings
        # A bad value is refused before the store is opened (which creates the default
        # blob folder and may start the embedded services).
        recent = config.whole_number(settings, "WEBFARM_RECENT_BLOBS", 100_000, "keys",
                                     "none remembered")
        store = open_blob_store(
            config.blob_uri(settings), endpoint_url=settings.get("AWS_ENDPOINT_URL") or None,
            max_attempts=settings.getint("WEBFARM_S3_MAX_ATTEMPTS", 5),
            max_connections=settings.getint("WEBFARM_BLOB_CONCURRENCY", 8),
            compression=config.blob_compression(settings),
        )
        assert crawler.stats is not None
        return cls(store, crawler.stats, storage_calls(crawler),
                   settings.getint("WEBFARM_BLOB_CONCURRENCY", 8),
                   settings.getfloat("WEBFARM_STORAGE_RETRY_SECONDS", RETRY_SECONDS), recent)

    async def close_spider(self) -> None:
        await self.batcher.flush()

    async def _write(self, writes: list[_Write], retried: bool) -> list[bool]:
        # ``retried`` needs no handling: each write keeps whether it landed (``written``).
        first: dict[str, _Write] = {}  # one write per key: the others find it there
        for w in writes:
            if w.written is None:
                first.setdefault(w.key, w)
        todo = list(first.values())
        results = await self.threads.run(
            self.store.put_many, [(w.key, w.body, w.metadata) for w in todo], self.concurrency)
        failed = [r for r in results if isinstance(r, str)]
        for w, result in zip(todo, results, strict=True):
            if not isinstance(result, str):
                w.written = result
        for w in writes:
            if w.written is None and first[w.key].written is not None:
                w.written = False
        if failed:
            raise BlobWriteFailed(f"{len(failed)} of {len(todo)} failed, first: {failed[0]}")
        return [bool(w.written) for w in writes]

    async def _stored_lately(self, digest: bytes) -> bool:
        """Whether this worker stored (or found) the blob lately. A page whose content is
        being written for another page waits for that write rather than sending its own
        (on S3 20 ms away, most of a mirror's pages come while the first write is out)."""
        if not self.recent.size:  # WEBFARM_RECENT_BLOBS=0: every page asks the store
            return False
        while digest not in self.recent and (writing := self._writing.get(digest)):
            await asyncio.shield(writing)  # a write that failed: this page tries its own
        return digest in self.recent

    async def process_item(self, item: Any) -> Any:
        if not isinstance(item, PageItem) or item.keeps_stored_content:
            return item
        if not item.content_hash:
            raise ValueError("PageItem has no content_hash: enable ContentHashPipeline first")
        key = blob_key(item.content_hash)  # ValueError unless the hash is hex
        item.blob_key = key
        # 110 B a key remembered, not 160 (an odd-length hex hash, from a custom hasher,
        # has no bytes form)
        h = item.content_hash
        digest = bytes.fromhex(h) if len(h) % 2 == 0 else h.encode()
        if await self._stored_lately(digest):
            self.stats.inc_value("webfarm/blobs/existing")
            self.stats.inc_value("webfarm/blobs/recent")
            return item
        metadata = {
            "url": item.final_url,
            "content-type": item.content_type,
            "fetched-at": utc(item.fetched_at).isoformat(),
        }
        if item.encoding:
            metadata["encoding"] = item.encoding
        writing = self._writing[digest] = asyncio.get_running_loop().create_future()
        try:
            written = await self.batcher.submit(_Write(key, item.body, metadata))
            self.recent.add(digest)
        finally:
            if self._writing.get(digest) is writing:
                del self._writing[digest]
            writing.set_result(None)
        self.stats.inc_value("webfarm/blobs/written" if written else "webfarm/blobs/existing")
        if written:
            self.stats.inc_value("webfarm/blobs/bytes", len(item.body))
        return item
