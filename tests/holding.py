"""A downloader middleware for tests: holds the first request it sees in the worker.

It stands for whatever keeps a request in a worker after its hand-out (a busy CPU, a
proxy to wait for): ``TEST_HOLD_SECONDS`` (0: off). Put it before the departure
middleware (940), e.g. ``-s 'DOWNLOADER_MIDDLEWARES={"tests.holding.HoldFirst": 500}'``.
"""

from __future__ import annotations

import asyncio

from scrapy import Request, Spider
from scrapy.crawler import Crawler


class HoldFirst:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.held = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> HoldFirst:
        return cls(crawler.settings.getfloat("TEST_HOLD_SECONDS", 0.0))

    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        if self.held or not self.seconds or request.url.endswith("/robots.txt"):
            return
        self.held = True
        await asyncio.sleep(self.seconds)
