"""Components for tests: a downloader middleware holding the first request it sees in
the worker, and an item pipeline that is slow.

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


class SlowItems:
    """An item pipeline: each item waits ``TEST_ITEM_SECONDS`` (a slow store), e.g.
    ``-s 'ITEM_PIPELINES={"tests.holding.SlowItems": 50}'``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> SlowItems:
        return cls(crawler.settings.getfloat("TEST_ITEM_SECONDS", 0.0))

    async def process_item(self, item: object) -> object:
        await asyncio.sleep(self.seconds)
        return item
