"""Structured items (whatever a spider extracts besides pages) to MongoDB.

One collection per item type, upserted on the key the item declares, with the
page's ``source_url`` and ``content_hash``, ``extracted_at`` and the spider's
``extractor_version`` (rules in :mod:`webfarm.itemstore`). Written in batches
like pages; an item is done only when its batch is stored.

An item that cannot be stored (``ItemError``: no key, a value or field name MongoDB
cannot hold, or a document the server refuses, say by the collection's validator)
fails alone: its page is dead-lettered at once, as a refetch would give the same item,
and the other items of its page and batch are stored.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from scrapy.crawler import Crawler
from scrapy.statscollectors import StatsCollector

from pipelines.content import PageHasher, page_hasher
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
)
from webfarm.items import ItemSource, PageItem, source_of
from webfarm.itemstore import ItemEntry, ItemError, ItemStore, index_fields, make_entry
from webfarm.keyclash import KeyClashes
from webfarm.threads import StorageCalls, storage_calls
from webfarm.urls import canonical_url

logger = logging.getLogger(__name__)


def extracted_at(source: ItemSource | None) -> dt.datetime:
    """When an item's page was fetched (its request left), else now: an item stored by a
    worker that stalled past its lease is older than another worker's of the same page,
    and ``extracted_at`` is what the item store orders them by."""
    sent = getattr(getattr(source, "page", None), "fetched_at", None)
    if isinstance(sent, (int, float)) and sent > 0:
        return min(dt.datetime.fromtimestamp(sent, dt.timezone.utc),
                   dt.datetime.now(dt.timezone.utc))
    return dt.datetime.now(dt.timezone.utc)


class ItemStorePipeline:
    """Writes structured items to their collections (webfarm/itemstore.py), in batches."""

    webfarm_stage = "items"  # the item store: reparse runs the project's pipelines before it

    def __init__(
        self, crawler: Crawler, store: ItemStore, stats: StatsCollector,
        threads: StorageCalls, hasher: PageHasher, batch_size: int = BATCH_SIZE,
        batch_seconds: float = BATCH_SECONDS, retry_seconds: float = RETRY_SECONDS,
        writers: int = BATCH_WRITERS,
    ) -> None:
        self.crawler = crawler
        self.store = store
        self.stats = stats
        self.threads = threads
        self.hasher = hasher
        self.batcher: Batcher[ItemEntry, str | ItemError] = Batcher(
            self._write, size=batch_size, seconds=batch_seconds, retry_seconds=retry_seconds,
            what="item write", stats=stats, stat_prefix="webfarm/items", writers=writers,
            idle=engine_idle(crawler),
        )
        recheck_on_responses(crawler, self.batcher)
        # Keys two pages gave other values (two shops' SKUs that meet): said once per
        # collection. Fewer keys kept than a re-parse keeps: a worker lives long.
        self.clashes = KeyClashes(max_keys=20_000)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ItemStorePipeline:
        settings = crawler.settings
        store = ItemStore.open(config.mongo_uri(settings),
                               config.mongo_database(settings),
                               index_fields(settings))
        assert crawler.stats is not None
        return cls(crawler, store, crawler.stats, storage_calls(crawler), page_hasher(crawler),
                   **batch_options(settings))

    async def close_spider(self) -> None:
        await self.batcher.flush()
        self.store.close()

    async def _write(self, entries: list[ItemEntry], retried: bool) -> list[str | ItemError]:
        # A retried write may find part of itself landed: write_items counts it as the
        # first attempt would.
        return await self.threads.run(self.store.write_items, entries, retried)

    async def process_item(self, item: Any) -> Any:
        if isinstance(item, PageItem):
            return item
        source = source_of(item, in_chain=True)
        if source is None:
            self.stats.inc_value("webfarm/items/no_source")
            url, content_hash = "", None
        else:
            url = canonical_url(source.url)
            content_hash = source.content_hash
            if content_hash is None and source.page is not None:
                content_hash = await self.hasher.ensure(source.page)
        try:
            entry = make_entry(item, self.crawler.spider, url, content_hash,
                               extracted_at(source))
        except ItemError:
            self.stats.inc_value("webfarm/items/invalid")
            raise
        other = self.clashes.meet(entry)
        if other is not None:
            self.stats.inc_value("webfarm/items/key_clashes")
            if said := self.clashes.advice_once(
                    entry, other, getattr(self.crawler.spider, "name", "SPIDER")):
                logger.warning("%s", said)
        outcome = await self.batcher.submit(entry)
        if isinstance(outcome, ItemError):  # refused by the server's rules; the rest stored
            self.stats.inc_value("webfarm/items/refused")
            raise outcome
        self.stats.inc_value(f"webfarm/items/{outcome}")
        return item
