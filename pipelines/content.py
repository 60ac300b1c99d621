"""Content hashing: decides which pages hold the same content (see webfarm.content)."""

from __future__ import annotations

import asyncio
from typing import Any

from scrapy.crawler import Crawler
from scrapy.settings import BaseSettings
from scrapy.statscollectors import StatsCollector

from webfarm.content import fingerprint, volatile_patterns
from webfarm.items import PageItem
from webfarm.storeworker import StorageProcess, StorageProcessDied, sched_batch_setting
from webfarm.threads import StorageThreads, storage_threads


class PageHasher:
    """Hashes a page once, however many pipelines ask (the page pipeline and the
    structured-item pipeline both need it), off the reactor thread.

    In ``processes`` helper processes (``WEBFARM_HASH_PROCESSES``, each a
    :class:`~webfarm.storeworker.StorageProcess` of one thread), not threads: on
    a 100 KB page that work is about 5 ms, mostly Python, which in a thread
    holds the GIL the reactor needs; and not in the storage process, where it
    would hold up the store calls. A page whose helper dies is hashed again in a
    new one; if that dies too the item fails and its request goes back to the
    frontier. ``processes=0`` hashes in the storage threads.
    """

    def __init__(self, threads: StorageThreads, volatile: tuple[str, ...], simhash: bool,
                 stats: StatsCollector | None = None, processes: int = 0,
                 sched_batch: bool = False) -> None:
        self.threads = threads
        self.volatile = volatile
        self.simhash = simhash
        self.stats = stats
        self.processes = max(0, processes)
        self.sched_batch = sched_batch
        self._helpers: list[StorageProcess] = []
        self._closed = False

    @classmethod
    def from_settings(cls, settings: BaseSettings, threads: StorageThreads,
                      stats: StatsCollector | None = None) -> PageHasher:
        raw = settings.get("WEBFARM_VOLATILE_PATTERNS") or []
        volatile = volatile_patterns(raw, settings.getbool("WEBFARM_VOLATILE_TIMES", True))
        return cls(threads, volatile, settings.getbool("WEBFARM_NEARDUP", True),
                   stats, settings.getint("WEBFARM_HASH_PROCESSES", 1),
                   sched_batch_setting(settings))

    @property
    def restarts(self) -> int:
        """Helpers started again after one died."""
        return sum(helper.restarts for helper in self._helpers)

    def pids(self) -> list[int]:
        """Process ids of the running helpers."""
        return sorted(pid for helper in self._helpers if (pid := helper.pid) is not None)

    async def start(self) -> None:
        """Start the helpers now (a new Python takes a few hundred ms), not on the first
        page; one that cannot start is a ConfigError that says what to do."""
        if self.processes and not self._closed:
            await asyncio.gather(*(helper.run(fingerprint, b"", None, None, (), False)
                                   for helper in self._ensure_helpers()))

    async def close(self) -> None:
        self._closed = True
        if self.stats is not None and self.restarts:
            self.stats.set_value("webfarm/content/hash_helper_restarts", self.restarts)
        await asyncio.gather(*(helper.close() for helper in self._helpers))

    def _ensure_helpers(self) -> list[StorageProcess]:
        if not self._helpers:
            fallback = ("set WEBFARM_HASH_PROCESSES=0 to hash in the storage threads "
                        f"(WEBFARM_HASH_PROCESSES={self.processes} now)")
            self._helpers = [StorageProcess(1, fallback, role="hashing",
                                            sched_batch=self.sched_batch)
                             for _ in range(self.processes)]
        return self._helpers

    async def _fingerprint(self, page: PageItem) -> tuple[str, int | None]:
        args = (page.body, page.content_type, page.encoding, self.volatile, self.simhash)
        if not self.processes:
            return await self.threads.run(fingerprint, *args)
        if self._closed:
            raise StorageProcessDied("the hashing helpers are closed (the crawl is ending)")
        helper = min(self._ensure_helpers(), key=lambda h: h.in_flight)
        try:
            return await helper.run(fingerprint, *args)
        except StorageProcessDied:
            if self._closed:
                raise
            return await helper.run(fingerprint, *args)  # in a new helper; a second death fails

    async def ensure(self, page: PageItem) -> str | None:
        if page.content_hash or page.keeps_stored_content:
            return page.content_hash
        if page.hashing is not None:
            await asyncio.shield(page.hashing)
            return page.content_hash
        page.hashing = asyncio.get_running_loop().create_future()
        try:
            page.content_hash, page.simhash = await self._fingerprint(page)
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
    :class:`PageItem`; a 304 (``not_modified``) or ``gone`` page has no body to hash."""

    webfarm_stage = "hash"  # a storage pipeline (webfarm.reparsepipes leaves it out)

    def __init__(self, hasher: PageHasher) -> None:
        self.hasher = hasher

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ContentHashPipeline:
        return cls(page_hasher(crawler))

    async def open_spider(self) -> None:
        await self.hasher.start()

    async def close_spider(self) -> None:
        await self.hasher.close()

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
