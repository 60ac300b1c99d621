"""A spider that sets Scrapy's per-request retry limit (``max_retry_times`` meta)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import scrapy


class RetryLimitsSpider(scrapy.Spider):
    """``-a start=BASE``: ``BASE/once`` may not be retried, ``BASE/twice`` once, and
    ``BASE/default`` follows the settings."""

    name = "test_retry_limits"

    def __init__(self, start: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.base = start.rstrip("/")

    async def start(self) -> AsyncIterator[scrapy.Request]:
        yield scrapy.Request(f"{self.base}/once", meta={"max_retry_times": 0})
        yield scrapy.Request(f"{self.base}/twice", meta={"max_retry_times": 1})
        yield scrapy.Request(f"{self.base}/default")

    def parse(self, response: scrapy.http.Response) -> None:
        pass
