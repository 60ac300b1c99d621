"""A Scrapy spider whose requests have an errback, as in Scrapy's docs: it logs which
error reached it, once per request that failed for good."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import scrapy
from twisted.python.failure import Failure


class ErrbacksSpider(scrapy.Spider):
    """``-a start=URL,URL,...``: each URL once, with ``errback=self.failed``."""

    name = "test_errbacks"
    custom_settings = {"ROBOTSTXT_OBEY": False}

    def __init__(self, start: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.urls = [u for u in start.split(",") if u]

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for url in self.urls:
            yield scrapy.Request(url, errback=self.failed)

    def parse(self, response: scrapy.http.Response) -> Any:
        yield {"status": response.status}  # keyed on its page (a plain spider's dict)

    def failed(self, failure: Failure) -> Any:
        self.logger.warning("errback: %s %s", failure.request.url, type(failure.value).__name__)
        # Scrapy's docs record failures as items: after a network error the item comes with
        # the Failure where a response would be.
        yield {"url": failure.request.url, "error": type(failure.value).__name__,
               "_key": "url", "_collection": "failures"}
