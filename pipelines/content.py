"""Content hashing: decides which pages hold the same content (see webfarm.content)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from scrapy.crawler import Crawler
from scrapy.settings import BaseSettings
from scrapy.statscollectors import StatsCollector

from webfarm.config import ConfigError
from webfarm.content import fingerprint, volatile_patterns
from webfarm.hashworker import HashWorkerDied, HashWorkers
from webfarm.items import PageItem
from webfarm.threads import StorageThreads, storage_threads


class PageHasher:
    """Hashes a page once, however many pipelines ask (the page pipeline and the
    structured-item pipeline both need it), off the reactor thread.

    In ``processes`` helper processes (``WEBFARM_HASH_PROCESSES``, see
    :mod:`webfarm.hashworker`), not threads: on a 100 KB page that work is about
    50 ms of pure Python, which in a thread holds the GIL the reactor needs. If a
    helper dies twice on one page the item fails and its request goes back to the
    frontier. ``processes=0`` hashes in the storage threads.
    """

    def __init__(self, threads: StorageThreads, volatile: tuple[str, ...], simhash: bool,
                 stats: StatsCollector | None = None, processes: int = 0) -> None:
        self.threads = threads
        self.volatile = volatile
        self.simhash = simhash
        self.stats = stats
        self.processes = max(0, processes)
        self._workers: HashWorkers | None = None

    @classmethod
    def from_settings(cls, settings: BaseSettings, threads: StorageThreads,
                      stats: StatsCollector | None = None) -> PageHasher:
        raw = settings.get("WEBFARM_VOLATILE_PATTERNS") or []
        return cls(threads, volatile_patterns(raw), settings.getbool("WEBFARM_NEARDUP", True),
                   stats, settings.getint("WEBFARM_HASH_PROCESSES", 1))

    async def start(self) -> None:
        """Start a helper now (a new Python takes a few hundred ms), not on the first page."""
        if self.processes and self._workers is None:
            self._workers = HashWorkers(self.processes)
            try:
                await self._workers.fingerprint(b"", None, None, (), False)
            except HashWorkerDied as exc:
                self.close()
                raise ConfigError(
                    f"WEBFARM_HASH_PROCESSES={self.processes}: the hashing helper "
                    f"({sys.executable} -m webfarm.hashworker) does not start ({exc}); its "
                    "error is above. Fix that Python, or set WEBFARM_HASH_PROCESSES=0 to "
                    "hash in the storage threads") from exc

    def close(self) -> None:
        if self._workers is not None:
            if self.stats is not None and self._workers.restarts:
                self.stats.set_value("webfarm/content/hash_helper_restarts",
                                     self._workers.restarts)
            self._workers.close()
            self._workers = None

    async def _fingerprint(self, page: PageItem) -> tuple[str, int | None]:
        args = (page.body, page.content_type, page.encoding, self.volatile, self.simhash)
        if not self.processes:
            return await self.threads.run(fingerprint, *args)
        if self._workers is None:
            self._workers = HashWorkers(self.processes)
        return await self._workers.fingerprint(*args)

    async def ensure(self, page: PageItem) -> str | None:
        if page.content_hash or page.not_modified:
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
    :class:`PageItem`; a 304 (``not_modified``) page has no body and is not hashed."""

    def __init__(self, hasher: PageHasher) -> None:
        self.hasher = hasher

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ContentHashPipeline:
        return cls(page_hasher(crawler))

    async def open_spider(self) -> None:
        await self.hasher.start()

    async def close_spider(self) -> None:
        self.hasher.close()

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
