"""A spider written for Scrapy before 2.13: ``start_requests()`` and no ``start()``."""

from __future__ import annotations

from collections.abc import Iterator

import scrapy


class OldStartSpider(scrapy.Spider):
    name = "test_old_start"

    def start_requests(self) -> Iterator[scrapy.Request]:
        yield scrapy.Request("http://127.0.0.2:1/")


class BothStartsSpider(OldStartSpider):
    """Written for both: Scrapy 2.19 calls start(), older Scrapy start_requests()."""

    name = "test_both_starts"

    async def start(self):  # type: ignore[override]
        for request in self.start_requests():
            yield request
