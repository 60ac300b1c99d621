"""A spider that hands the next callback its page's whole HTML (a common first try) for
links named ``heavy``, and only the page's URL for the others."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy


class CarrySpider(scrapy.Spider):
    """``-a start=URL``: follows every link of that page, once."""

    name = "test_carry"
    custom_settings = {"ROBOTSTXT_OBEY": False}

    def __init__(self, start: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.url = start

    async def start(self) -> AsyncIterator[scrapy.Request]:
        yield scrapy.Request(self.url)

    def parse(self, response: scrapy.http.TextResponse) -> Iterator[scrapy.Request]:
        for href in response.css("a::attr(href)").getall():
            carried = ({"parent_html": response.text} if "heavy" in href
                       else {"parent_url": response.url})
            yield response.follow(href, callback=self.child, cb_kwargs=carried)

    def child(self, response: scrapy.http.Response, **carried: str) -> Iterator[dict]:
        yield {"url": response.url, "carried": sorted(carried)}
