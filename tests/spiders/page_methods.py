"""A spider written the scrapy-playwright way: ``meta["playwright"]`` and PageMethods."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import scrapy
from scrapy_playwright.page import PageMethod

from spiders.base import WebfarmSpider


class PageMethodsSpider(WebfarmSpider):
    """Its first start URL waits in the browser for ``#late`` (added by the page's script
    after it loaded); the others are rendered without waiting."""

    name = "test_page_methods"

    async def start(self) -> AsyncIterator[Any]:
        for i, url in enumerate(self.start_urls):
            methods = [PageMethod("wait_for_selector", "#late", timeout=15_000)] if i == 0 else []
            yield scrapy.Request(url, callback=self.parse,
                                 meta={"playwright": True, "playwright_page_methods": methods})
