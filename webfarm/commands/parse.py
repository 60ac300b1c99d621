"""``scrapy parse``: Scrapy's, on its in-memory scheduler (see webfarm.commands._local)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import warnings
from typing import Any

from scrapy.commands.parse import Command as ScrapyCommand
from scrapy.exceptions import DropItem, ScrapyDeprecationWarning

from webfarm.commands._local import FromStore
from webfarm.items import PageItem
from webfarm.itemstore import ItemError

logger = logging.getLogger(__name__)


def shown(item: Any) -> Any:
    """What ``parse`` prints of an item: a page record as a short summary. Printed whole,
    its raw body and storage fields came before the spider's own items."""
    if not isinstance(item, PageItem):
        return item
    summary: dict[str, Any] = {"url": item.url, "status": item.status,
                               "content_type": item.content_type,
                               "body": f"{len(item.body):,} bytes (the page, stored raw)"}
    if item.final_url != item.url:
        summary["final_url"] = item.final_url
    return summary


class Command(FromStore, ScrapyCommand):
    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        if not opts.pipelines:
            # Scrapy's parse stores nothing without --pipelines. The page record a
            # WebfarmSpider's own parse yields reached webfarm's storage pipelines anyway:
            # the page was indexed (its refetch schedule begun), and a URL with a test
            # query became the source of the product's stored item.
            for name in ("ITEM_PIPELINES_BASE", "ITEM_PIPELINES"):
                self.settings.set(name, {}, priority="cmdline")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        # Scrapy's parse wraps the spider's callback in one that returns a Deferred, and
        # Scrapy 2.19 warns about that once per run as if the spider did it: not the
        # user's to fix.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*Returning Deferreds from spider callbacks",
                                    ScrapyDeprecationWarning)
            super().run(args, opts)

    def scraped_data(self, args: tuple[Any, ...]) -> list[Any]:
        """Scrapy's, with each item's pipeline chain watched: Scrapy starts the chains and
        leaves them, so an item refused (a list for its key, a bad value) was a 15-line
        "Task exception was never retrieved" and exit 0, where `scrapy reparse` says it
        in one line and exits 1."""
        items, requests, opts, depth, spider, callback = args
        if not opts.pipelines:
            return super().scraped_data(args)
        assert self.pcrawler is not None and self.pcrawler.engine is not None
        itemproc = self.pcrawler.engine.scraper.itemproc
        for item in items:
            chain = asyncio.ensure_future(itemproc.process_item_async(item))
            chain.add_done_callback(functools.partial(self._processed, item))
        started = argparse.Namespace(**{**vars(opts), "pipelines": False})
        return super().scraped_data((items, requests, started, depth, spider, callback))

    def _processed(self, item: Any, chain: asyncio.Future[Any]) -> None:
        if chain.cancelled() or (exc := chain.exception()) is None:
            return
        if isinstance(exc, DropItem):
            logger.info("Dropped: %s", exc)
            return
        self.exitcode = 1
        if isinstance(exc, ItemError):
            logger.error("webfarm: %s", exc)
        else:
            logger.error("webfarm: an item pipeline failed on %s: %s: %s",
                         type(item).__name__, type(exc).__name__, exc)

    def add_items(self, lvl: int, new_items: list[Any]) -> None:
        # Only what is printed: the pipelines and -o already had the items themselves.
        super().add_items(lvl, [shown(item) for item in new_items])
