"""Crawl any site with no code: store every page inside the given hosts.

    scrapy crawl generic -a start=https://example.com/[,URL...] [-a domains=HOST,...]
                         [-a max_pages=N]
"""

from __future__ import annotations

from typing import Any

from spiders.base import WebfarmSpider


class GenericSpider(WebfarmSpider):
    name = "generic"
    strict_arguments = True  # no code of its own reads an attribute: any other -a is a slip

    @classmethod
    def check_arguments(cls, **spargs: Any) -> dict[str, Any]:
        args = super().check_arguments(**spargs)
        if not args["start"] and not args["domains"]:
            # A worker joining a seeded crawl needs only the hosts to stay inside.
            raise ValueError(
                "generic needs -a start=URL[,URL...] or, to join a seeded crawl, -a domains=HOST"
            )
        return args
