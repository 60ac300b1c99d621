"""A spider that groups its requests in a download slot of its own, as in Scrapy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import scrapy


class SlotsSpider(scrapy.Spider):
    name = "test_slots"

    def __init__(self, start: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_url = start

    async def start(self) -> AsyncIterator[scrapy.Request]:
        yield scrapy.Request(self.start_url)

    def parse(self, response: scrapy.http.Response) -> Any:
        for path in ("/about", "/category/garden"):
            yield response.follow(path, self.parse_grouped, meta={"download_slot": "shop"})

    def parse_grouped(self, response: scrapy.http.Response) -> None:
        pass
