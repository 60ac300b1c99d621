"""``scrapy runspider FILE``: a one-file spider, checked as ``scrapy crawl`` checks one.

Without this, a spider file ran on the frontier and the stores without the start
checks: a wrong ``REDIS_URL`` or ``-s WEBFARM_HOST_DELAY=abc`` ended in tracebacks
("Engine slot not assigned"), and bad ``-a`` arguments were not refused.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scrapy.commands.runspider import Command as ScrapyRunSpiderCommand
from scrapy.commands.runspider import _import_file
from scrapy.utils.spider import iter_spider_classes

from webfarm.commands._common import check_log_level
from webfarm.commands.crawl import crawl_watched, prepare


class Command(ScrapyRunSpiderCommand):
    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        check_log_level(self.settings)

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        spidercls = self._spider_class(args)
        if spidercls is None:
            super().run(args, opts)  # it says what is wrong with the file
            return
        self.exitcode = prepare(self.settings, spidercls, opts) or crawl_watched(
            self, spidercls, opts)

    @staticmethod
    def _spider_class(args: list[str]) -> type | None:
        """The spider Scrapy's runspider will run (the file's last), or None when it will
        refuse the file itself."""
        if len(args) != 1 or not Path(args[0]).exists():
            return None
        try:
            module = _import_file(args[0])
        except (ImportError, ValueError):
            return None
        classes = list(iter_spider_classes(module))
        return classes[-1] if classes else None
