"""A spider that logs in first (a form POST) and then crawls pages behind the login."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import scrapy

from spiders.base import WebfarmSpider


class MembersSpider(WebfarmSpider):
    name = "test_members"
    custom_settings = {"COOKIES_ENABLED": True}

    def __init__(self, start: str = "", account_links: str = "0", local: str = "1",
                 **kwargs: Any) -> None:
        super().__init__(start=start, **kwargs)
        self.base = start.rstrip("/")
        self.account_links = int(account_links)  # links to /account, a page of the session
        self.local = local != "0"  # "0": the login the Scrapy way, through the frontier

    async def start(self) -> AsyncIterator[scrapy.Request]:
        # Each worker logs in itself: its cookie jar is its own, and the password must not
        # be written to the shared frontier.
        yield scrapy.FormRequest(f"{self.base}/login", formdata={"user": "ann",
                                                                 "password": "s3cret-pw"},
                                 callback=self.logged_in, dont_filter=True,
                                 meta={"webfarm_local": True} if self.local else {})

    def logged_in(self, response: scrapy.http.Response) -> Any:
        yield scrapy.Request(f"{self.base}/members/", callback=self.parse_member)
        for _ in range(self.account_links):
            yield scrapy.Request(f"{self.base}/account", callback=self.parse_member,
                                 meta={"webfarm_local": True})

    def parse_member(self, response: scrapy.http.Response) -> Any:
        yield {"url": response.url, "title": response.css("title::text").get()}
        yield from response.follow_all(css="a.member", callback=self.parse_member)
