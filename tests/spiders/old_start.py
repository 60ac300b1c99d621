"""Spiders written for older Scrapy: ``start_requests()`` and no ``start()``, the
``download_delay`` attribute."""

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


class DelayAttributeSpider(scrapy.Spider):
    """Scrapy's deprecated ``download_delay`` attribute, as older projects have it."""

    name = "test_delay_attribute"
    download_delay = 3.5

    async def start(self):  # type: ignore[override]
        return
        yield
