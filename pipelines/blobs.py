"""Raw pages to the blob store, once per content hash."""

from __future__ import annotations

import asyncio
from typing import Any

from scrapy.crawler import Crawler
from scrapy.statscollectors import StatsCollector

from webfarm import config
from webfarm.batching import RETRY_SECONDS, retrying
from webfarm.blobstore import BlobStore, blob_key, open_blob_store
from webfarm.index import utc
from webfarm.items import PageItem
from webfarm.threads import StorageCalls, storage_calls


class BlobStorePipeline:
    """Writes each :class:`PageItem`'s raw body under ``raw/<hash[:2]>/<hash>``.

    Runs after the content hash and before the index, so an index entry never
    points at a blob that is not there. At most ``WEBFARM_BLOB_CONCURRENCY``
    writes run at once (in the storage threads, never on the reactor), so a
    slow store cannot take every storage thread from the index. A failing
    store is retried with backoff for ``WEBFARM_STORAGE_RETRY_SECONDS`` (on top
    of botocore's own ``standard`` retries); the item is not done until then.
    """

    def __init__(self, store: BlobStore, stats: StatsCollector, threads: StorageCalls,
                 concurrency: int = 8, retry_seconds: float = RETRY_SECONDS) -> None:
        self.store = store
        self.stats = stats
        self.threads = threads
        self.concurrency = max(1, concurrency)
        self.retry_seconds = retry_seconds
        self._slots: asyncio.Semaphore | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> BlobStorePipeline:
        settings = crawler.settings
        store = open_blob_store(
            config.blob_uri(settings), endpoint_url=settings.get("AWS_ENDPOINT_URL") or None,
            max_attempts=settings.getint("WEBFARM_S3_MAX_ATTEMPTS", 5),
            max_connections=settings.getint("WEBFARM_BLOB_CONCURRENCY", 8),
        )
        assert crawler.stats is not None
        return cls(store, crawler.stats, storage_calls(crawler),
                   settings.getint("WEBFARM_BLOB_CONCURRENCY", 8),
                   settings.getfloat("WEBFARM_STORAGE_RETRY_SECONDS", RETRY_SECONDS))

    async def process_item(self, item: Any) -> Any:
        if not isinstance(item, PageItem) or item.not_modified:
            return item
        if not item.content_hash:
            raise ValueError("PageItem has no content_hash: enable ContentHashPipeline first")
        key = blob_key(item.content_hash)
        metadata = {
            "url": item.final_url,
            "content-type": item.content_type,
            "fetched-at": utc(item.fetched_at).isoformat(),
        }
        if item.encoding:
            metadata["encoding"] = item.encoding
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.concurrency)
        async with self._slots:
            written = await retrying(
                lambda: self.threads.run(self.store.put_once, key, item.body, metadata),
                what=f"blob write {key}", retry_seconds=self.retry_seconds,
                stats=self.stats, stat_prefix="webfarm/blobs",
            )
        self.stats.inc_value("webfarm/blobs/written" if written else "webfarm/blobs/existing")
        if written:
            self.stats.inc_value("webfarm/blobs/bytes", len(item.body))
        item.blob_key = key
        return item
