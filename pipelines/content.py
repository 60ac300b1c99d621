"""Content hashing: decides which pages hold the same content (see webfarm.content)."""

from __future__ import annotations

from typing import Any

from scrapy.crawler import Crawler
from scrapy.statscollectors import StatsCollector

from webfarm.content import content_hash
from webfarm.items import PageItem
from webfarm.threads import StorageThreads, storage_threads


class ContentHashPipeline:
    """Sets ``content_hash`` on every :class:`PageItem`, off the reactor thread
    (normalising a large HTML page takes milliseconds)."""

    def __init__(self, stats: StatsCollector, threads: StorageThreads) -> None:
        self.stats = stats
        self.threads = threads

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ContentHashPipeline:
        assert crawler.stats is not None
        return cls(crawler.stats, storage_threads(crawler))

    async def process_item(self, item: Any) -> Any:
        if isinstance(item, PageItem):
            item.content_hash = await self.threads.run(
                content_hash, item.body, item.content_type, item.encoding
            )
            self.stats.inc_value("webfarm/content/hashed")
        return item
