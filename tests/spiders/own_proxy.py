"""A spider that sets its own proxy in ``meta["proxy"]``, as Scrapy's docs show."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import scrapy


class OwnProxySpider(scrapy.Spider):
    """``-a start=URL -a proxy=http://user:password@host:port``."""

    name = "test_own_proxy"

    def __init__(self, start: str = "", proxy: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start_url, self.proxy = start, proxy

    async def start(self) -> AsyncIterator[scrapy.Request]:
        yield scrapy.Request(self.start_url, meta={"proxy": self.proxy})

    def parse(self, response: scrapy.http.Response) -> None:
        pass
