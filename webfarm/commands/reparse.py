"""``scrapy reparse SPIDER [--since DATE] [--url-pattern REGEX]``: re-extract from stored pages.

Reads ``pages`` from the index and bodies from the blob store, runs the spider's
``extract`` on each rebuilt response, passes the items through the project's own item
pipelines (those before the item store) and stores them as a crawl would. It
never builds a Scrapy engine or downloader: no request leaves the machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import re
import signal
import sys
from typing import Any, ClassVar

from scrapy.commands import ScrapyCommand
from scrapy.crawler import Crawler
from scrapy.exceptions import UsageError
from scrapy.utils.conf import arglist_to_dict
from scrapy.utils.misc import load_object

from webfarm import config
from webfarm.batching import StorageUnavailable, batch_options
from webfarm.blobstore import open_blob_store
from webfarm.commands._common import (
    BAD_CONFIG,
    CommandError,
    check_log_level,
    one_spider,
    report,
    spider_class,
)
from webfarm.index import IndexStore
from webfarm.itemstore import ItemStore, index_fields
from webfarm.reparse import Reparser, ReparseStats
from webfarm.reparsepages import shard_range
from webfarm.reparsepipes import PipelineNeedsReactor, ProjectPipelines

logger = logging.getLogger("webfarm.reparse")
SHOW_CHANGES = 10  # changed items a --dry-run logs field by field, unless told
STOPPED = 3  # a store stayed down past WEBFARM_STORAGE_RETRY_SECONDS, or Ctrl-C


def parse_shard(value: str) -> tuple[int, int]:
    k, _, n = value.partition("/")
    try:
        shard = (int(k), int(n))
        shard_range(shard)
    except ValueError:
        raise CommandError(f"--shard {value!r}: use K/N with 0 <= K < N, e.g. --shard 0/4 "
                           "to 3/4 for four processes") from None
    return shard


def parse_since(value: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise CommandError(f"--since {value!r} is not an ISO date; use e.g. 2026-12-01 or "
                           "2026-12-01T08:00:00+00:00") from None
    return when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc)


def check_counts(opts: argparse.Namespace) -> None:
    """The numeric options, refused out of range: they were taken as 1 (a progress line
    for every page after ``--progress-every 0``). ``--show-changes`` without ``--dry-run``
    was ignored without a word: a run that writes logs no field-by-field changes."""
    if opts.show_changes is not None and not opts.dry_run:
        raise CommandError(f"--show-changes {opts.show_changes} goes with --dry-run, which logs "
                           "what a re-parse would change and writes nothing; a re-parse that "
                           "writes counts its changes only")
    opts.show_changes = SHOW_CHANGES if opts.show_changes is None else opts.show_changes
    for flag, value, least, zero in (
            ("--progress-every", opts.progress_every, 0, "0 (no progress lines)"),
            ("--batch-size", opts.batch_size, 1, "1"),
            ("--show-changes", opts.show_changes, 0, "0 (none)")):
        if value < least:
            raise CommandError(f"{flag} {value}: give {zero} or more")


class Command(ScrapyCommand):
    requires_project = True
    default_settings: ClassVar[dict[str, Any]] = {"LOG_LEVEL": "INFO"}

    def syntax(self) -> str:
        return "[options] <spider>"

    def short_desc(self) -> str:
        return "Re-extract items from stored raw pages (no network)"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("-a", dest="spargs", action="append", default=[],
                            metavar="NAME=VALUE", help="spider argument (may be repeated)")
        parser.add_argument("--since", help="only pages fetched at or after this ISO date")
        parser.add_argument("--url-pattern", help="only pages whose URL matches this regex")
        parser.add_argument("--progress-every", type=int, default=500, metavar="N",
                            help="log a progress line every N pages (default 500; 0 = none)")
        parser.add_argument("--batch-size", type=int, default=200, metavar="N",
                            help="items per bulk write (default 200)")
        parser.add_argument("--shard", metavar="K/N",
                            help="only shard K of N (0 <= K < N), by content hash: run N "
                                 "processes, one per shard, to use N cores or machines")
        parser.add_argument("--dry-run", action="store_true",
                            help="write nothing: count what a run would create and change, "
                                 "and log the first changed items field by field")
        parser.add_argument("--show-changes", type=int, metavar="N",
                            help=f"with --dry-run, changed items to log (default {SHOW_CHANGES})")

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        check_log_level(self.settings)
        try:
            opts.spargs = arglist_to_dict(opts.spargs)
        except ValueError:
            raise UsageError("Invalid -a value, use -a NAME=VALUE", print_help=False) from None

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        one_spider(args, "reparse")
        assert self.settings is not None
        try:
            self._run(args[0], opts)
        except CommandError as exc:
            report(self, exc)

    def _run(self, name: str, opts: argparse.Namespace) -> None:
        settings = self.settings
        since = parse_since(opts.since) if opts.since else None
        shard = parse_shard(opts.shard) if opts.shard else None
        check_counts(opts)
        if opts.url_pattern:
            try:
                re.compile(opts.url_pattern)
            except re.error as exc:
                raise CommandError(f"--url-pattern {opts.url_pattern!r}: {exc}") from None
        spidercls = spider_class(settings, name)
        if not getattr(spidercls, "tags_item_sources", False):
            # It stores no raw pages: "no stored page matched ... crawl it first" sent its
            # user to crawl again, for nothing.
            base = spidercls.__mro__[1].__name__ if len(spidercls.__mro__) > 1 else "Spider"
            raise CommandError(
                f"{name} is a {base}, not a WebfarmSpider: it stores its items but not its "
                "raw pages, so there is nothing to re-parse. Base it on "
                "spiders.base.WebfarmSpider (its callbacks work as they are, or put the "
                "extraction in extract()) and crawl again (README: Adding a site)")
        check = getattr(spidercls, "check_arguments", None)
        try:
            if check is not None:
                check(**opts.spargs)
            crawler = Crawler(spidercls, settings)
            spider = spidercls.from_crawler(crawler, **opts.spargs)
        except ValueError as exc:
            raise CommandError(f"{name}: {exc}") from None
        settings = crawler.settings  # the spider's own (a database or bucket of its own)
        # No crawl starts, so nothing sets the stats; a pipeline's from_crawler may take them.
        crawler.stats = load_object(settings["STATS_CLASS"])(crawler)
        pipelines = ProjectPipelines.from_crawler(crawler, spider)
        try:
            config.check_settings(settings)
            mongo = config.mongo_uri(settings)
            database = config.mongo_database(settings)
            config.check_mongo(mongo, database=None if opts.dry_run else database)
            blob_uri = config.blob_uri(settings)
            endpoint = settings.get("AWS_ENDPOINT_URL") or None
            config.check_blobs(blob_uri, endpoint)
            indexes = index_fields(settings)
        except config.ConfigError as exc:
            raise CommandError(str(exc), BAD_CONFIG) from None
        index = IndexStore(mongo, database)
        reads = settings.getint("WEBFARM_BLOB_CONCURRENCY", 8)
        blobs = open_blob_store(blob_uri, endpoint_url=endpoint, max_connections=reads,
                                max_attempts=settings.getint("WEBFARM_S3_MAX_ATTEMPTS", 5))
        reparser = Reparser(
            spider, index, blobs, ItemStore(index.db, indexes=indexes),
            batch_size=opts.batch_size, progress_every=opts.progress_every,
            progress=self._progress, retry_seconds=batch_options(settings)["retry_seconds"],
            blob_reads=reads, dry_run=opts.dry_run, show_changes=opts.show_changes,
            pipelines=pipelines,
        )
        # SIGTERM (systemd, scrapyd, kill) stops it as Ctrl-C does, with the same summary:
        # it ended the run at once, exit 143 and not a word of how far it had come.
        previous = signal.signal(signal.SIGTERM, _terminated)
        try:
            stats = reparser.run(since, opts.url_pattern, shard)
        except PipelineNeedsReactor as exc:
            raise CommandError(str(exc), BAD_CONFIG) from None
        except (StorageUnavailable, KeyboardInterrupt) as exc:
            # Items are upserts: a second run redoes the pages whose items were not
            # written yet and counts the others unchanged. Nothing is lost.
            print(reparser.stats.line())
            why = "interrupted" if type(exc) is KeyboardInterrupt else str(exc)
            pending = reparser.stats.writing
            report(self, CommandError(
                f"reparse stopped after {reparser.stats.pages} pages: {why}. The "
                f"{reparser.stats.items} items written stay"
                + (f"; {pending} extracted were not written yet (a batch on its way may have "
                   "landed in part)" if pending else "")
                + ". Run the same command again to finish: what was written counts as "
                "unchanged then", STOPPED))
            # Now, not when the blob reads read ahead end: against an endpoint that hangs
            # they hold a normal exit for read timeout x attempts (minutes). Every item
            # written so far is acknowledged by MongoDB; the reads are only reads.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(STOPPED)
        finally:
            signal.signal(signal.SIGTERM, previous)
            index.close()
        print(stats.line())
        print(f"created={stats.created} changed={stats.changed} unchanged={stats.unchanged} "
              f"dropped={stats.dropped} pages={stats.pages} items={stats.items} "
              f"errors={stats.errors}"
              + (f" superseded={stats.superseded}" if stats.superseded else "")
              + (f" folded={stats.folded}" if stats.folded else "")
              + (f" old_keys={stats.old_keys}" if stats.old_keys else "")
              + (f" clashes={stats.clashes}" if stats.clashes else "")
              # Pages skipped for their blob: exit code 1, and errors=0 said nothing of them.
              + (f" missing_blobs={stats.missing_blobs}" if stats.missing_blobs else "")
              + (f" damaged_blobs={stats.damaged_blobs}" if stats.damaged_blobs else "")
              + (" (dry run: nothing written)" if opts.dry_run else ""))
        if stats.errors or stats.missing_blobs or stats.damaged_blobs:
            self.exitcode = 1
        if stats.missing_blobs or stats.damaged_blobs:
            # Blobs are write-once: a crawl that fetches such a page again finds its key
            # and keeps the bad blob (a refetch alone repaired nothing, and nothing said so).
            print(f"webfarm: to repair a missing or damaged blob, delete it from the blob "
                  f"store (if damaged), then fetch its page again: scrapy seed {name} --force "
                  f"URL ..., and a crawl", file=sys.stderr)
        if not stats.pages:  # not an error (a --since in the future), but often a typo
            where = f"{config.safe_url(mongo)}, database {index.db.name!r}"
            print(f"webfarm: no stored page of {name!r} matched in {where}; check "
                  "MONGO_URI, MONGO_DATABASE, --since and --url-pattern (or crawl it first: "
                  f"scrapy crawl {name})", file=sys.stderr)

    @staticmethod
    def _progress(stats: ReparseStats) -> None:
        logger.info("%s", stats.line())
        sys.stderr.flush()


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is, as Ctrl-C's KeyboardInterrupt is."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated("stopped by SIGTERM")
