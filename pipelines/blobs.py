"""Raw pages to the blob store, once per content hash."""

from __future__ import annotations

from typing import Any

from scrapy.crawler import Crawler
from scrapy.statscollectors import StatsCollector

from webfarm import config
from webfarm.blobstore import BlobStore, blob_key, open_blob_store
from webfarm.index import utc
from webfarm.items import PageItem
from webfarm.threads import StorageThreads, storage_threads


class BlobStorePipeline:
    """Writes each :class:`PageItem`'s raw body under ``raw/<hash[:2]>/<hash>``.

    Runs after the content hash and before the index, so an index entry never
    points at a blob that is not there.
    """

    def __init__(self, store: BlobStore, stats: StatsCollector, threads: StorageThreads) -> None:
        self.store = store
        self.stats = stats
        self.threads = threads

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> BlobStorePipeline:
        settings = crawler.settings
        store = open_blob_store(
            config.blob_uri(settings), endpoint_url=settings.get("AWS_ENDPOINT_URL") or None
        )
        assert crawler.stats is not None
        return cls(store, crawler.stats, storage_threads(crawler))

    async def process_item(self, item: Any) -> Any:
        if not isinstance(item, PageItem):
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
        written = await self.threads.run(self.store.put_once, key, item.body, metadata)
        self.stats.inc_value("webfarm/blobs/written" if written else "webfarm/blobs/existing")
        if written:
            self.stats.inc_value("webfarm/blobs/bytes", len(item.body))
        item.blob_key = key
        return item
