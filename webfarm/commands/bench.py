"""``scrapy bench``: Scrapy's, through webfarm's fetch layer on Scrapy's in-memory scheduler.

On the frontier it crawled nothing: the SSRF guard refuses Scrapy's bench server on
localhost, so its one start URL was dead-lettered and the run printed "Crawled 0
pages" for ten seconds (and the URL stayed "seen" in a ``follow`` frontier). Here it
runs as the other developer commands do (see webfarm.commands._local), and the guard
lets that server through: loopback's 127.0.0.1 and ::1 are added to
``WEBFARM_ALLOWED_NETWORKS`` for this command only. It measures this project's fetch
layer and parsing on this machine, not the frontier or storage (``make bench`` does).
"""

from __future__ import annotations

import argparse

from scrapy.commands.bench import Command as ScrapyCommand
from scrapy.settings import SETTINGS_PRIORITIES

from webfarm.commands._local import LocalScheduling

BENCH_SERVER = ("127.0.0.1/32", "::1/128")  # scrapy.utils.benchserver, at localhost:8998


class Command(LocalScheduling, ScrapyCommand):
    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        value = self.settings.get("WEBFARM_ALLOWED_NETWORKS") or []
        allowed = value.split(",") if isinstance(value, str) else list(value)
        priority = max(self.settings.getpriority("WEBFARM_ALLOWED_NETWORKS") or 0,
                       SETTINGS_PRIORITIES["cmdline"])
        self.settings.set("WEBFARM_ALLOWED_NETWORKS",
                          [*(a.strip() for a in allowed if a.strip()), *BENCH_SERVER],
                          priority=priority)
