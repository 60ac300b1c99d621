"""Crawl any site with no code: store every page inside the given hosts.

    scrapy crawl generic -a start=https://example.com/[,URL...] [-a domains=HOST,...]
                         [-a max_pages=N]
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from scrapy.exceptions import CloseSpider

from spiders.base import WebfarmSpider

logger = logging.getLogger(__name__)

NEEDS_ARGUMENTS = (
    "generic needs -a start=URL[,URL...] or, to join a seeded crawl, -a domains=HOST")


class GenericSpider(WebfarmSpider):
    name = "generic"
    strict_arguments = True  # no code of its own reads an attribute: any other -a is a slip

    @classmethod
    def check_crawl_arguments(cls, **spargs: Any) -> dict[str, Any]:
        """A crawl needs where to start or which hosts to keep to (a worker joining a
        seeded crawl needs only the hosts); without either it would take every host of
        the frontier. ``scrapy reparse generic`` and ``--stored`` need neither."""
        args = cls.check_arguments(**spargs)
        if not args["start"] and not args["domains"]:
            raise ValueError(NEEDS_ARGUMENTS)
        return args

    async def start(self) -> AsyncIterator[Any]:
        if not self.start_urls and not self.hosts:  # a crawl not begun by `scrapy crawl`
            logger.error("%s", NEEDS_ARGUMENTS)
            raise CloseSpider("no_start_or_domains")
        async for request in super().start():
            yield request
