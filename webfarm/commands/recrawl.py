"""``scrapy recrawl SPIDER``: enqueue every page of SPIDER that is due for a refetch.

Due pages (``next_fetch_at`` passed) go into the spider's frontier most overdue first, as
conditional requests that bypass the dupefilter but not politeness; workers
(``scrapy crawl SPIDER``) fetch them. See :mod:`webfarm.recrawl`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
from typing import Any, ClassVar

import pymongo
from scrapy.commands import ScrapyCommand
from scrapy.crawler import Crawler
from scrapy.utils.misc import build_from_crawler, load_object

from webfarm import config
from webfarm.commands._common import (
    BAD_CONFIG,
    CommandError,
    one_spider,
    open_spider_frontier,
    pipe_may_close,
    report,
    service_variable,
    spider_class,
)
from webfarm.recrawl import Recrawler, RoundResult, one_round, utcnow


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "SPIDER [--limit N] [--dry-run] [--now TIME] [--json]"

    def short_desc(self) -> str:
        return "Enqueue the pages of a spider that are due for a refetch"

    def long_desc(self) -> str:
        return (
            "Find the pages of SPIDER whose next_fetch_at has passed and enqueue them in its "
            "frontier, most overdue first (priority from how late they are relative to their "
            "interval), as conditional requests (If-None-Match / If-Modified-Since) that "
            "bypass the dupefilter but keep per-host politeness. Pages enqueued by an earlier "
            "round and not fetched yet are not enqueued again. Workers fetch them: "
            "`scrapy crawl SPIDER`. For a fleet without cron, set WEBFARM_RECRAWL_INTERVAL."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--limit", type=int, default=None, metavar="N",
                            help="enqueue at most the N most overdue pages")
        parser.add_argument("--dry-run", dest="dry_run", action="store_true",
                            help="show what is due, enqueue nothing")
        parser.add_argument("--now", default=None, metavar="TIME",
                            help="what is due at TIME (ISO 8601, or +SECONDS from now) "
                                 "instead of now")
        parser.add_argument("--json", dest="json", action="store_true",
                            help="print the counts (and with --dry-run the pages) as JSON")

    @pipe_may_close  # `scrapy recrawl … --json | head` ended in a BrokenPipeError traceback
    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        one_spider(args, "recrawl")
        try:
            self._run(args[0], opts)
        except CommandError as exc:
            report(self, exc)

    def _run(self, name: str, opts: argparse.Namespace) -> None:
        assert self.settings is not None
        if opts.limit is not None and opts.limit < 1:
            raise CommandError(f"--limit {opts.limit}: give a positive number of pages")
        now = parse_now(opts.now)
        crawler = Crawler(spider_class(self.settings, name), self.settings)
        settings = crawler.settings  # the spider's own settings apply
        # A preview only reads the index: a read-only Redis user may run it.
        frontier = open_spider_frontier(settings, name, writes=not opts.dry_run)
        try:
            mongo_uri = config.mongo_uri(settings)
            database = config.mongo_database(settings)
            config.check_mongo(mongo_uri, service_variable(settings, "MONGO_URI"),
                               database=None if opts.dry_run else database)
        except config.ConfigError as exc:
            raise CommandError(str(exc), BAD_CONFIG) from None
        fingerprinter = build_from_crawler(
            load_object(settings["REQUEST_FINGERPRINTER_CLASS"]), crawler)
        client: pymongo.MongoClient = pymongo.MongoClient(mongo_uri, tz_aware=True,
                                                          serverSelectionTimeoutMS=10_000)
        try:
            pages = client[database]["pages"]
            recrawler = Recrawler(pages, frontier, name, fingerprinter)
            if opts.dry_run:  # reads only
                result = recrawler.run(now=now, limit=opts.limit, dry_run=True)
            else:
                owner = f"scrapy recrawl on {socket.gethostname()}:{os.getpid()}"
                with one_round(frontier.server, name, owner) as busy:
                    if busy is not None:
                        raise CommandError(
                            f"another recrawl round of {name} is running ({busy}); run this "
                            "one when it has ended (two at once queued every due page twice)",
                            BAD_CONFIG)
                    result = recrawler.run(now=now, limit=opts.limit)
        finally:
            client.close()
        print(render(name, result, opts.json))


def parse_now(value: str | None) -> dt.datetime:
    """``None`` (now), ``+SECONDS`` (from now) or an ISO 8601 time (UTC if no zone)."""
    if value is None:
        return utcnow()
    text = value.strip()
    try:
        if text.startswith("+"):
            return utcnow() + dt.timedelta(seconds=float(text[1:]))
        moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise CommandError(f"--now {value!r}: give an ISO 8601 time (2026-05-01T12:00:00Z) or "
                     "+SECONDS") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def render(name: str, result: RoundResult, as_json: bool) -> str:
    # "due" is every due page: under --limit N it said N, and 98 due looked like 5
    counts = {"spider": name, "due": result.total_due, "taken": len(result.due),
              "left": result.left, "enqueued": result.enqueued,
              "conditional": result.conditional, "still_queued": result.skipped_queued,
              "dry_run": result.dry_run}
    left = (f"; the {len(result.due)} most overdue taken (--limit), {result.left} left for "
            "another run" if result.left else "")
    if as_json:
        if result.dry_run:
            counts["pages"] = [{"url": p.url, "overdue_seconds": round(p.overdue, 1),
                                "overdue_ratio": round(p.ratio, 3), "priority": p.priority,
                                "conditional": p.conditional} for p in result.due]
        return json.dumps(counts)
    if result.dry_run:
        lines = [f"{'overdue':>10} {'ratio':>8} {'prio':>4}  url"]
        lines += [f"{_span(p.overdue):>10} {p.ratio:8.2f} {p.priority:>4}  {p.url}"
                  for p in result.due[:50]]
        if len(result.due) > 50:
            lines.append(f"... and {len(result.due) - 50} more")
        lines.append(f"recrawl {name} (dry run): {result.total_due} due{left}, "
                     f"{result.conditional} with validators, "
                     f"{result.skipped_queued} still queued from an earlier round")
        return "\n".join(lines)
    # the conditional ones are among those enqueued: said after "left", they read as its
    return (f"recrawl {name}: {result.enqueued} enqueued ({result.conditional} conditional) "
            f"of {result.total_due} due{left}, {result.skipped_queued} still queued "
            "from an earlier round")


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"
