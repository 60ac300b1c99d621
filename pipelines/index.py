"""Pages and contents to the index DB (MongoDB), in batched bulk upserts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from scrapy.crawler import Crawler
from scrapy.statscollectors import StatsCollector

from webfarm import config
from webfarm.batching import (
    BATCH_SECONDS,
    BATCH_SIZE,
    BATCH_WRITERS,
    RETRY_SECONDS,
    Batcher,
    batch_options,
    engine_idle,
    recheck_on_responses,
    retrying,
)
from webfarm.exceptions import ItemError
from webfarm.index import IndexStore, PageRecord, RefetchPolicy, load_refetch_policy
from webfarm.items import PageItem
from webfarm.threads import StorageCalls, storage_calls

logger = logging.getLogger(__name__)


class IndexPipeline:
    """Upserts ``pages`` and ``contents`` for each :class:`PageItem`.

    Pages are written in batches (``WEBFARM_INDEX_BATCH_SIZE`` pages or
    ``WEBFARM_INDEX_BATCH_SECONDS``, whichever comes first), and an item is done
    only when its batch is stored: the frontier acknowledges the request after
    that, never before. Every fetch sets ``refetch_interval``/``next_fetch_at``
    through the ``WEBFARM_REFETCH_POLICY`` object. A page whose document MongoDB
    refuses for good fails alone with an :class:`ItemError` (its request is
    dead-lettered); the rest of its batch is stored.
    """

    webfarm_stage = "index"  # a storage pipeline (webfarm.reparsepipes leaves it out)

    def __init__(
        self, store: IndexStore, stats: StatsCollector, threads: StorageCalls,
        batch_size: int = BATCH_SIZE, batch_seconds: float = BATCH_SECONDS,
        retry_seconds: float = RETRY_SECONDS, writers: int = BATCH_WRITERS,
        idle: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        self.stats = stats
        self.threads = threads
        self.retry_seconds = retry_seconds
        self.batcher: Batcher[PageItem, PageRecord] = Batcher(
            self._write, size=batch_size, seconds=batch_seconds, retry_seconds=retry_seconds,
            what="index write", stats=stats, stat_prefix="webfarm/index", writers=writers,
            idle=idle,
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> IndexPipeline:
        settings = crawler.settings
        refetch: RefetchPolicy = load_refetch_policy(crawler)
        distance = settings.getint("WEBFARM_NEARDUP_DISTANCE", 3)
        store = IndexStore(
            config.mongo_uri(settings), config.mongo_database(settings),
            refetch=refetch,
            neardup_distance=distance if settings.getbool("WEBFARM_NEARDUP", True) else -1,
        )
        assert crawler.stats is not None
        pipeline = cls(store, crawler.stats, storage_calls(crawler),
                       **batch_options(settings), idle=engine_idle(crawler))
        # Where this worker stores, said once at start as the frontier's place is: a fleet
        # job given setting=MONGO_DATABASE=crawl and an operator reading 'webfarm' saw
        # 0 pages, and no log line told them apart (Scrapy's "Overridden settings" omit it).
        loc = config.locations(settings)
        logger.info("Storing pages in %s database %r, raw bodies in %s",
                    config.safe_url(loc.mongo_uri), loc.mongo_database,
                    config.safe_url(loc.blob_uri))
        recheck_on_responses(crawler, pipeline.batcher)
        return pipeline

    async def open_spider(self) -> None:
        # MongoDB gone between the start-up check and here is waited out as a write is;
        # the worker ended in a traceback after pymongo's 10 s (a probe).
        await retrying(lambda: self.threads.run(self.store.ensure_indexes),
                       what="creating the index's indexes", retry_seconds=self.retry_seconds,
                       stats=self.stats, stat_prefix="webfarm/index")

    async def close_spider(self) -> None:
        await self.batcher.flush()
        self.store.close()

    async def _write(self, pages: list[PageItem], retried: bool) -> list[PageRecord]:
        # ``retried`` needs no handling: a page's fetch id makes a re-issue count once.
        # The index needs a body's size, not the body, and never the pending hash's future
        # (the pages may go to the storage process).
        docs = [{**vars(p), "body": b"", "body_size": len(p.body), "hashing": None}
                for p in pages]
        return await self.threads.run(self.store.record_pages, docs)

    async def process_item(self, item: Any) -> Any:
        if not isinstance(item, PageItem):
            return item
        if not item.blob_key and not item.keeps_stored_content:
            raise ValueError("PageItem has no blob_key: enable BlobStorePipeline first")
        record = await self.batcher.submit(item)
        inc = self.stats.inc_value
        if record.refused:  # for good: a refetch gets the same answer, so dead-letter it
            inc("webfarm/index/refused")
            raise ItemError(
                f"MongoDB refused the index document of {item.url}: {record.refused}. Fix "
                f"what refuses it (a validator on that collection?), then requeue the page: "
                f"scrapy dlq {item.spider} --requeue")
        item.duplicate_of = record.duplicate_of or ""
        if record.superseded:  # a later fetch is stored: this older one was not written
            inc("webfarm/index/superseded")
            return item
        if record.gone:
            inc("webfarm/index/gone")
        elif record.not_modified:
            inc("webfarm/index/not_modified")
        inc("webfarm/index/pages_new" if record.new_page else "webfarm/index/pages_updated")
        if record.duplicate_of:
            inc("webfarm/index/duplicates")
        if record.near_duplicate_of:
            inc("webfarm/index/near_duplicates")
        if record.changed:
            inc("webfarm/index/changed")
        return item
