"""``scrapy check`` contracts that see a spider's items, not webfarm's page records.

A webfarm spider's ``parse`` yields a :class:`~webfarm.items.PageItem` for every page (for
storage) besides the spider's items: ``@returns items 1 1`` on it failed with "Returned 2
items" and ``@scrapes sku name`` with "Missing fields" (the page record has none of them).
These are Scrapy's ``@returns`` and ``@scrapes`` with the page records left out.
"""

from __future__ import annotations

from typing import Any

from scrapy.contracts import default

from webfarm.items import PageItem


def _items_only(output: list[Any]) -> list[Any]:
    return [x for x in output if not isinstance(x, PageItem)]


class ReturnsContract(default.ReturnsContract):
    """Scrapy's ``@returns``, counting the spider's items only."""

    def post_process(self, output: list[Any]) -> None:
        super().post_process(_items_only(output))


class ScrapesContract(default.ScrapesContract):
    """Scrapy's ``@scrapes``, checking the spider's items only."""

    def post_process(self, output: list[Any]) -> None:
        super().post_process(_items_only(output))
