"""Pages and contents to the index DB (MongoDB)."""

from __future__ import annotations

from typing import Any

from scrapy.crawler import Crawler
from scrapy.statscollectors import StatsCollector

from webfarm import config
from webfarm.index import IndexStore
from webfarm.items import PageItem
from webfarm.threads import StorageThreads, storage_threads


class IndexPipeline:
    """Upserts ``pages`` and ``contents`` for each :class:`PageItem`."""

    def __init__(
        self, store: IndexStore, stats: StatsCollector, threads: StorageThreads,
        refetch_interval: float,
    ) -> None:
        self.store = store
        self.stats = stats
        self.threads = threads
        self.refetch_interval = refetch_interval

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> IndexPipeline:
        settings = crawler.settings
        store = IndexStore(config.mongo_uri(settings), settings.get("MONGO_DATABASE") or "webfarm")
        assert crawler.stats is not None
        return cls(
            store, crawler.stats, storage_threads(crawler),
            settings.getfloat("WEBFARM_REFETCH_INTERVAL", 86400.0),
        )

    async def open_spider(self) -> None:
        await self.threads.run(self.store.ensure_indexes)

    async def close_spider(self) -> None:
        self.store.close()

    async def process_item(self, item: Any) -> Any:
        if not isinstance(item, PageItem):
            return item
        if not item.blob_key:
            raise ValueError("PageItem has no blob_key: enable BlobStorePipeline first")
        record = await self.threads.run(self.store.record_page, vars(item), self.refetch_interval)
        self.stats.inc_value("webfarm/index/pages_new" if record.new_page else
                             "webfarm/index/pages_updated")
        if record.duplicate_of:
            self.stats.inc_value("webfarm/index/duplicates")
        if record.changed:
            self.stats.inc_value("webfarm/index/changed")
        return item
