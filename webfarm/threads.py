"""One bounded thread pool per crawler for blocking storage calls.

boto3 and pymongo block; running them on the reactor thread would stall every
download. The pool is bounded (``WEBFARM_STORAGE_THREADS``) so a slow store
applies back-pressure instead of piling up threads.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from scrapy.crawler import Crawler

T = TypeVar("T")
_ATTR = "_webfarm_storage_threads"


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
        threads = StorageThreads(crawler.settings.getint("WEBFARM_STORAGE_THREADS", 8))
        setattr(crawler, _ATTR, threads)
    return threads
