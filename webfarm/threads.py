"""Where a crawler's blocking storage calls run: never on the reactor thread.

boto3 and pymongo block; running them on the reactor thread would stall every
download. :func:`storage_calls` gives the pipelines the crawler's storage
process (:mod:`webfarm.storeworker`, ``WEBFARM_STORAGE_PROCESS``, the default)
or, with that off, its bounded thread pool. Either is bounded
(``WEBFARM_STORAGE_THREADS``) so a slow store applies back-pressure instead of
piling up threads.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from scrapy import signals
from scrapy.crawler import Crawler

if TYPE_CHECKING:
    from webfarm.storeworker import StorageProcess

T = TypeVar("T")
_ATTR = "_webfarm_storage_threads"
_PROCESS_ATTR = "_webfarm_storage_process"


class StorageCalls(Protocol):
    """What the storage pipelines need: run a blocking store call off the reactor."""

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...


class StorageThreads:
    def __init__(self, max_workers: int) -> None:
        self.executor = ThreadPoolExecutor(max_workers, thread_name_prefix="webfarm-storage")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, functools.partial(fn, *args, **kwargs))

    def shutdown(self) -> None:
        self.executor.shutdown(wait=True)


def storage_threads(crawler: Crawler) -> StorageThreads:
    """The crawler's shared pool, created on first use."""
    threads = getattr(crawler, _ATTR, None)
    if threads is None:
        threads = StorageThreads(crawler.settings.getint("WEBFARM_STORAGE_THREADS", 16))
        setattr(crawler, _ATTR, threads)
    return threads


def storage_calls(crawler: Crawler) -> StorageCalls:
    """Where the storage pipelines run their store calls: the crawler's storage process,
    started on first use and stopped when the spider closes, or with
    ``WEBFARM_STORAGE_PROCESS`` off its storage threads."""
    if not crawler.settings.getbool("WEBFARM_STORAGE_PROCESS", True):
        return storage_threads(crawler)
    process: StorageProcess | None = getattr(crawler, _PROCESS_ATTR, None)
    if process is None:
        from webfarm.storeworker import StorageProcess, sched_batch_setting

        process = StorageProcess(crawler.settings.getint("WEBFARM_STORAGE_THREADS", 16),
                                 sched_batch=sched_batch_setting(crawler.settings))
        setattr(crawler, _PROCESS_ATTR, process)

        async def spider_closed() -> None:
            if process.restarts and crawler.stats is not None:
                crawler.stats.set_value("webfarm/storage/process_restarts", process.restarts)
            await process.close()

        # After the pipelines' close_spider: the engine sends spider_closed once they flushed.
        crawler.signals.connect(spider_closed, signal=signals.spider_closed, weak=False)
    return process
