"""``scrapy seed SPIDER URL… | -f FILE | --sitemap URL``: put start URLs into the frontier.

Seeds are enqueued exactly as a worker enqueues the links it finds: the same
JSON entry (:func:`webfarm.queue.request_entry`), the same fingerprint (the
project's ``REQUEST_FINGERPRINTER_CLASS`` with the spider's settings), through
the frontier's dupefilter — so seeding twice enqueues nothing the second time,
and a worker that later finds the same link does not fetch it again. The
callback is the spider's default (``parse``), so any worker can run a seed:
``scrapy crawl SPIDER`` with no start URLs (``generic``: ``-a domains=HOST``).

Every input is read and checked before anything is enqueued (all sitemaps of
an index included): a bad URL, an unreadable file or a response that is not a
sitemap costs one line and exit code 2, with nothing enqueued.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import redis
from scrapy import Request
from scrapy.commands import ScrapyCommand
from scrapy.crawler import Crawler
from scrapy.exceptions import UsageError
from scrapy.utils.misc import build_from_crawler, load_object

from webfarm.commands._common import (
    BAD_CONFIG,
    CommandError,
    open_spider_frontier,
    report,
    spider_class,
)
from webfarm.frontier import MAX_PUSH, Entry, Frontier
from webfarm.queue import request_entry
from webfarm.serialize import SerializationError
from webfarm.sitemaps import MAX_URLS, SitemapError, SitemapReader, is_http_url, start_url


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "SPIDER [URL ...] [-f FILE] [--sitemap URL] [--force] [--priority N]"

    def short_desc(self) -> str:
        return "Enqueue start URLs (arguments, a file, or sitemaps) in a spider's frontier"

    def long_desc(self) -> str:
        return (
            "Enqueue URLs for SPIDER in its shared frontier, as a worker would: through the "
            "dupefilter (URLs seen before are not enqueued again unless --force), with the "
            "spider's parse as callback. Sources can be combined: URL arguments, -f FILE (one "
            "URL per line, # comments; - reads stdin), --sitemap URL (a sitemap, a sitemap "
            "index, .xml.gz, a robots.txt, or a host whose robots.txt lists sitemaps). "
            "Everything is read and checked before anything is enqueued."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("-f", "--file", dest="files", action="append", default=[],
                            metavar="FILE", help="read URLs from FILE, one per line (- = stdin)")
        parser.add_argument("--sitemap", dest="sitemaps", action="append", default=[],
                            metavar="URL", help="enqueue every URL of this sitemap, sitemap "
                            "index, robots.txt or host (repeatable)")
        parser.add_argument("--force", action="store_true",
                            help="enqueue URLs the dupefilter has seen before, too")
        parser.add_argument("--priority", type=int, default=0, metavar="N",
                            help="request priority (higher is fetched first within a host)")
        parser.add_argument("--max-urls", dest="max_urls", type=int, default=MAX_URLS,
                            metavar="N", help=f"refuse sitemaps with more URLs (default "
                            f"{MAX_URLS})")

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if not args:
            raise UsageError("give the spider name first", print_help=False)
        try:
            self._seed(args[0], args[1:], opts)
        except CommandError as exc:
            report(self, exc)

    def _seed(self, name: str, urls: list[str], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        spidercls = spider_class(self.settings, name)
        seeds = [_checked(u, "argument") for u in urls]
        for path in opts.files:
            seeds += read_url_file(path)
        for value in opts.sitemaps:
            try:
                start_url(value)
            except SitemapError as exc:
                raise CommandError(f"--sitemap: {exc}") from None
        if not seeds and not opts.sitemaps:
            raise CommandError("nothing to seed: give URLs, -f FILE or --sitemap URL")
        if abs(opts.priority) > 2**52:
            raise CommandError(f"--priority {opts.priority} is out of range")
        # The spider's own settings apply, as on a worker (fingerprint, frontier options).
        crawler = Crawler(spidercls, self.settings)
        frontier = open_spider_frontier(crawler.settings, name)
        sitemap_note = ""
        if opts.sitemaps:
            reader = self._sitemap_reader(crawler, opts.max_urls)
            documents = skipped = 0
            for value in opts.sitemaps:
                try:
                    result = reader.read(value)
                except SitemapError as exc:
                    raise CommandError(f"{exc} (nothing was enqueued)") from None
                seeds += result.urls
                documents += len(result.sitemaps)
                skipped += result.skipped
            sitemap_note = f", {documents} sitemap documents read"
            if skipped:
                sitemap_note += f", {skipped} non-http(s) locations skipped"
        fingerprinter = build_from_crawler(
            load_object(crawler.settings["REQUEST_FINGERPRINTER_CLASS"]), crawler
        )
        entries, repeated = make_entries(seeds, opts.priority, fingerprinter)
        enqueued, seen, over = push(frontier, entries, force=opts.force)
        parts = [f"{enqueued} enqueued"]
        if opts.force:
            parts.append(f"{seen} of them seen before (--force)")
        else:
            parts.append(f"{seen} already seen")
        if over:
            parts.append(f"{over} over their host's budget (WEBFARM_HOST_BUDGET="
                         f"{frontier.host_budget})")
        if repeated:
            parts.append(f"{repeated} repeated in the input")
        given = f"{len(seeds)} URL{'' if len(seeds) == 1 else 's'} given{sitemap_note}"
        print(f"seeded {name}: {', '.join(parts)} ({given})")

    def _sitemap_reader(self, crawler: Crawler, max_urls: int) -> SitemapReader:
        """Fetches are checked by the SSRF guard: a sitemap index or robots.txt names
        the next URLs, and those are a stranger's choice."""
        from webfarm.netguard import NetGuard, NetGuardError

        try:
            guard = NetGuard.from_settings(crawler.settings)
        except NetGuardError as exc:
            raise CommandError(str(exc), BAD_CONFIG) from None
        return SitemapReader(
            user_agent=crawler.settings.get("USER_AGENT") or "webfarm",
            timeout=crawler.settings.getfloat("DOWNLOAD_TIMEOUT", 30.0),
            max_urls=max(1, max_urls),
            check_url=lambda url: asyncio.run(guard.check_url(url)),
        )


def _checked(url: str, where: str) -> str:
    url = url.strip()
    if not is_http_url(url):
        raise CommandError(f"{where}: {url[:200]!r} is not an http(s) URL (nothing was enqueued)")
    return url


def read_url_file(path: str) -> list[str]:
    """URLs of a file, one per line; blank lines and ``#`` comments skipped."""
    try:
        if path == "-":
            lines: Iterable[str] = sys.stdin.read().splitlines()
        else:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CommandError(f"cannot read {path}: not UTF-8 text (one URL per line)") from None
    out = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if text and not text.startswith("#"):
            out.append(_checked(text, f"{path}, line {number}"))
    return out


def make_entries(urls: Iterable[str], priority: int, fingerprinter: Any) -> tuple[list[Entry],
                                                                                  int]:
    """Frontier entries (callback: the spider's default), one per fingerprint; and how
    many URLs were the same request as an earlier one (tracking variants, repeats)."""
    entries: dict[bytes, Entry] = {}
    repeated = 0
    for url in urls:
        try:
            entry = request_entry(Request(url, priority=priority), None, fingerprinter)
        except (ValueError, SerializationError) as exc:
            raise CommandError(
                f"cannot queue {url[:200]!r}: {exc} (nothing was enqueued)"
            ) from None
        if entry.fingerprint in entries:
            repeated += 1
        else:
            entries[entry.fingerprint] = entry
    return list(entries.values()), repeated


def push(frontier: Frontier, entries: list[Entry], *, force: bool) -> tuple[int, int, int]:
    """Push through the dupefilter; ``(enqueued, seen before, over their host's budget)``.
    With ``force`` the seen ones are pushed again past the dupefilter (each still recorded
    as seen once); never the ones over budget (``WEBFARM_HOST_BUDGET`` bounds seeds too)."""
    enqueued = seen = over = 0
    try:
        for start in range(0, len(entries), MAX_PUSH):
            batch = entries[start : start + MAX_PUSH]
            result = frontier.exchange("", push=batch, pop=0)
            old = [e._replace(dont_filter=True) for e, new, cut in zip(
                batch, result.enqueued, result.over_budget, strict=True) if not new and not cut]
            seen += len(old)
            over += sum(result.over_budget)
            enqueued += sum(result.enqueued)
            if force and old:
                enqueued += sum(frontier.push(old))
    except redis.RedisError as exc:
        if str(exc).startswith("WEBFARM "):  # the frontier refused (dupefilter mode)
            raise CommandError(str(exc)[8:], BAD_CONFIG) from None
        raise CommandError(
            f"Redis failed after {enqueued} of {len(entries)} URLs were enqueued ({exc}); "
            "run the same seed again: what is already enqueued is skipped", BAD_CONFIG,
        ) from None
    return enqueued, seen, over
