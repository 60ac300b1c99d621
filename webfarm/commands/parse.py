"""``scrapy parse``: Scrapy's, on its in-memory scheduler (see webfarm.commands._local)."""

from __future__ import annotations

import argparse
import warnings

from scrapy.commands.parse import Command as ScrapyCommand
from scrapy.exceptions import ScrapyDeprecationWarning

from webfarm.commands._local import FromStore


class Command(FromStore, ScrapyCommand):
    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        # Scrapy's parse wraps the spider's callback in one that returns a Deferred, and
        # Scrapy 2.19 warns about that once per run as if the spider did it: not the
        # user's to fix.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*Returning Deferreds from spider callbacks",
                                    ScrapyDeprecationWarning)
            super().run(args, opts)
