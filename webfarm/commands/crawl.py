"""``scrapy crawl``, checking where the frontier, index and blobs live before it starts.

A wrong ``REDIS_URL``/``MONGO_URI``/``BLOB_STORE_URI`` stops the worker with one
line naming the variable, before any request is fetched. Unset ones start (or
join) the embedded services, whose URLs are then pinned in the settings so
every component and every worker of the machine uses the same ones.
"""

from __future__ import annotations

import argparse
import logging
import sys

from scrapy.commands.crawl import Command as ScrapyCrawlCommand

from webfarm import config
from webfarm.commands._common import spider_settings


class Command(ScrapyCrawlCommand):
    def short_desc(self) -> str:
        return "Run a webfarm worker for a spider (checks Redis, MongoDB and blobs first)"

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None and self.crawler_process is not None
        settings, name = self.settings, None
        if len(args) == 1:
            spidercls = self._spider_class(args[0], opts)
            if spidercls is None:
                self.exitcode = 2
                return
            # Check the locations the spider's crawler will use (its custom_settings too).
            settings, name = spider_settings(self.settings, spidercls), args[0]
        try:
            loc = config.preflight(settings, name)
        except config.ConfigError as exc:
            print(f"webfarm: {exc}", file=sys.stderr)
            if self.settings.get("LOG_FILE"):  # scrapyd: the job's log must say why, too
                logging.getLogger(__name__).error("webfarm: %s", exc)
            self.exitcode = 1
            return
        config.apply(self.settings, loc)
        super().run(args, opts)

    def _spider_class(self, name: str, opts: argparse.Namespace) -> type | None:
        """The spider's class, once it has checked its ``-a`` arguments; None (and one
        line on stderr) when there is no such spider or they are wrong."""
        assert self.crawler_process is not None
        try:
            spidercls = self.crawler_process.spider_loader.load(name)
        except KeyError:
            print(f"webfarm: no spider named {name!r}; `scrapy list` shows them", file=sys.stderr)
            return None
        try:
            refuse_ignored_start_requests(spidercls)
            check = getattr(spidercls, "check_arguments", None)
            if check is not None:
                check(**opts.spargs)
        except ValueError as exc:
            print(f"webfarm: {name}: {exc}", file=sys.stderr)
            return None
        return spidercls


def refuse_ignored_start_requests(spidercls: type) -> None:
    """ValueError when the spider's ``start_requests()`` would never run: Scrapy 2.19 calls
    ``start()`` only, so a spider written for older Scrapy (or on scrapy-redis's spiders)
    crawled nothing, or only its ``start_urls``, without a word."""
    mro = spidercls.__mro__

    def owner(attr: str) -> int:
        return next((i for i, cls in enumerate(mro) if attr in vars(cls)), len(mro))

    if owner("start_requests") < owner("start"):
        if mro[owner("start_requests")].__module__.startswith("scrapy_redis"):
            raise ValueError(
                "it is a scrapy-redis spider, whose start URLs come from a Redis list webfarm "
                "does not read (and whose start_requests() Scrapy 2.19 no longer calls); base "
                "it on spiders.base.WebfarmSpider or scrapy.Spider and give it URLs with "
                "'scrapy seed SPIDER URL...'")
        raise ValueError(
            "it defines start_requests(), which Scrapy 2.19 no longer calls (it calls start()); "
            "rename it 'async def start(self)' and keep its body, its yields included")
