"""A spider that passes cookies with its requests (a consent or locale cookie)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import scrapy


class CookiesSpider(scrapy.Spider):
    name = "test_cookies"

    def __init__(self, start: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_url = start

    async def start(self) -> AsyncIterator[scrapy.Request]:
        yield scrapy.Request(self.start_url, cookies={"consent": "yes"})

    def parse(self, response: scrapy.http.Response) -> Any:
        yield response.follow("/about", self.parse_about, cookies={"locale": "en"})

    def parse_about(self, response: scrapy.http.Response) -> None:
        pass
