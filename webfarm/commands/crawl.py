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


class Command(ScrapyCrawlCommand):
    def short_desc(self) -> str:
        return "Run a webfarm worker for a spider (checks Redis, MongoDB and blobs first)"

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None and self.crawler_process is not None
        if len(args) == 1 and not self._arguments_ok(args[0], opts):
            self.exitcode = 2
            return
        try:
            loc = config.preflight(self.settings, args[0] if len(args) == 1 else None)
        except config.ConfigError as exc:
            print(f"webfarm: {exc}", file=sys.stderr)
            if self.settings.get("LOG_FILE"):  # scrapyd: the job's log must say why, too
                logging.getLogger(__name__).error("webfarm: %s", exc)
            self.exitcode = 1
            return
        config.apply(self.settings, loc)
        super().run(args, opts)

    def _arguments_ok(self, name: str, opts: argparse.Namespace) -> bool:
        """Let the spider class check its ``-a`` arguments before anything starts."""
        assert self.crawler_process is not None
        try:
            spidercls = self.crawler_process.spider_loader.load(name)
        except KeyError:
            print(f"webfarm: no spider named {name!r}; `scrapy list` shows them", file=sys.stderr)
            return False
        check = getattr(spidercls, "check_arguments", None)
        if check is None:
            return True
        try:
            check(**opts.spargs)
        except ValueError as exc:
            print(f"webfarm: {name}: {exc}", file=sys.stderr)
            return False
        return True
