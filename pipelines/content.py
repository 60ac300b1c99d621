"""Content hashing: decides which pages hold the same content (see webfarm.content)."""

from __future__ import annotations

import asyncio
from typing import Any

from scrapy.crawler import Crawler
from scrapy.settings import BaseSettings
from scrapy.statscollectors import StatsCollector

from webfarm.content import fingerprint, volatile_patterns
from webfarm.items import PageItem
from webfarm.threads import StorageThreads, storage_threads


class PageHasher:
    """Hashes a page once, however many pipelines ask (the page pipeline and the
    structured-item pipeline both need it), off the reactor thread: normalising a
    large page takes milliseconds and a SimHash tens of them."""

    def __init__(self, threads: StorageThreads, volatile: tuple[str, ...], simhash: bool,
                 stats: StatsCollector | None = None) -> None:
        self.threads = threads
        self.volatile = volatile
        self.simhash = simhash
        self.stats = stats

    @classmethod
    def from_settings(cls, settings: BaseSettings, threads: StorageThreads,
                      stats: StatsCollector | None = None) -> PageHasher:
        raw = settings.get("WEBFARM_VOLATILE_PATTERNS") or []
        return cls(threads, volatile_patterns(raw), settings.getbool("WEBFARM_NEARDUP", True),
                   stats)

    async def ensure(self, page: PageItem) -> str | None:
        if page.content_hash or page.not_modified:
            return page.content_hash
        if page.hashing is not None:
            await asyncio.shield(page.hashing)
            return page.content_hash
        page.hashing = asyncio.get_running_loop().create_future()
        try:
            page.content_hash, page.simhash = await self.threads.run(
                fingerprint, page.body, page.content_type, page.encoding, self.volatile,
                self.simhash,
            )
        except Exception as exc:
            page.hashing.set_exception(exc)
            page.hashing.exception()  # retrieved: whoever awaits it re-raises
            raise
        page.hashing.set_result(None)
        if self.stats is not None:
            self.stats.inc_value("webfarm/content/hashed")
            if page.simhash is not None:
                self.stats.inc_value("webfarm/content/simhashed")
        return page.content_hash


class ContentHashPipeline:
    """Sets ``content_hash`` (and ``simhash`` when ``WEBFARM_NEARDUP`` is on) on every
    :class:`PageItem`; a 304 (``not_modified``) page has no body and is not hashed."""

    def __init__(self, hasher: PageHasher) -> None:
        self.hasher = hasher

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ContentHashPipeline:
        return cls(page_hasher(crawler))

    async def process_item(self, item: Any) -> Any:
        if isinstance(item, PageItem):
            await self.hasher.ensure(item)
        return item


def page_hasher(crawler: Crawler) -> PageHasher:
    """The crawler's one hasher (shared by the page and item pipelines)."""
    hasher = getattr(crawler, "_webfarm_page_hasher", None)
    if hasher is None:
        hasher = PageHasher.from_settings(crawler.settings, storage_threads(crawler),
                                          crawler.stats)
        crawler._webfarm_page_hasher = hasher  # type: ignore[attr-defined]
    return hasher
