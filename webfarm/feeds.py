"""Feed exports (``scrapy crawl acme -o products.jsonl``) of a spider's items, not of
webfarm's pages.

A webfarm spider yields a :class:`~webfarm.items.PageItem` for every page, so that the
storage pipelines keep it; Scrapy's feeds export every item, and a page's raw body
(bytes) is no JSON value: each page logged a ``TypeError`` traceback while the products
were written. Pages live in the index and the blob store; a feed gets them only when its
``item_classes`` name ``webfarm.items.PageItem`` (give it ``fields`` without ``body``
for JSON). A feed with an ``item_filter`` of its own keeps it.

Scrapy's ``CLOSESPIDER_*`` extension and its core stats count items too, so
:class:`CloseSpider` and :class:`CoreStats` are here as well: they count the spider's
items, not the page records.
"""

from __future__ import annotations

from typing import Any

from scrapy.extensions.closespider import CloseSpider as ScrapyCloseSpider
from scrapy.extensions.corestats import CoreStats as ScrapyCoreStats
from scrapy.extensions.feedexport import FeedExporter as ScrapyFeedExporter
from scrapy.extensions.feedexport import ItemFilter

from webfarm.items import PageItem


class SpiderItemFilter(ItemFilter):
    """Scrapy's filter (a feed's ``item_classes``), and no PageItem unless named there."""

    def accepts(self, item: Any) -> bool:
        if isinstance(item, PageItem) and not any(
                issubclass(PageItem, cls) for cls in self.item_classes):
            return False
        return super().accepts(item)


#: a dict item's keys that tell the item store where and how to keep it, not data
CONTROL_KEYS = ("_collection", "_key")


def without_controls(item: Any) -> Any:
    """``item`` without the item store's control keys (a dict's ``_key``, ``_collection``):
    they were exported as if they were fields."""
    if isinstance(item, dict) and any(k in item for k in CONTROL_KEYS):
        return {k: v for k, v in item.items() if k not in CONTROL_KEYS}
    return item


class FeedExporter(ScrapyFeedExporter):
    """Scrapy's feed exporter with :class:`SpiderItemFilter` as every feed's default, and
    without the item store's control keys in the items it writes."""

    def _load_filter(self, feed_options: dict[str, Any]) -> ItemFilter:
        return super()._load_filter({"item_filter": SpiderItemFilter, **feed_options})

    def item_scraped(self, item: Any, spider: Any) -> None:
        super().item_scraped(without_controls(item), spider)


class CloseSpider(ScrapyCloseSpider):
    """Scrapy's ``CLOSESPIDER_*`` extension counting the spider's items only: a webfarm
    spider yields a page record for every page too, so ``CLOSESPIDER_ITEMCOUNT=10``
    stopped a crawl at its tenth page, with 3 products exported, and
    ``CLOSESPIDER_TIMEOUT_NO_ITEM`` never fired while pages came."""

    def item_scraped(self, item: Any, spider: Any) -> None:
        if not isinstance(item, PageItem):
            super().item_scraped(item, spider)

    def item_scraped_no_item(self, item: Any, spider: Any) -> None:
        if not isinstance(item, PageItem):
            super().item_scraped_no_item(item, spider)


class CoreStats(ScrapyCoreStats):
    """Scrapy's core stats with ``item_scraped_count`` (and so LogStats' "scraped N
    items") counting the spider's items; page records count as ``webfarm/pages/recorded``.
    A spider that stored 12 products said "scraped 27 items": its 15 pages were counted."""

    def item_scraped(self, item: Any, spider: Any) -> None:
        if isinstance(item, PageItem):
            self.stats.inc_value("webfarm/pages/recorded")
        else:
            super().item_scraped(item, spider)
