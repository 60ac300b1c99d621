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
import itertools
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, ClassVar

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
from webfarm.config import mask_credentials
from webfarm.frontier import MAX_PUSH, Entry, Frontier
from webfarm.queue import host_delay, request_entry
from webfarm.serialize import SerializationError
from webfarm.sitemaps import MAX_URLS, SitemapError, SitemapReader, is_http_url, start_url
from webfarm.urls import host_of, unfetchable, within_domains

PROGRESS_EVERY = 100_000  # URLs between two progress lines of a long seed


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
        seeds = [_checked(u, "argument", file_hint=True) for u in urls]
        files = [UrlFile(path) for path in opts.files]  # checked now, read again below
        try:
            self._seed_checked(name, spidercls, seeds, files, opts)
        finally:
            for urls_file in files:
                urls_file.close()

    def _seed_checked(self, name: str, spidercls: type, seeds: list[str],
                      files: list[UrlFile], opts: argparse.Namespace) -> None:
        assert self.settings is not None
        for value in opts.sitemaps:
            try:
                start_url(value)
            except SitemapError as exc:
                raise CommandError(f"--sitemap: {exc}") from None
        if not seeds and not any(f.count for f in files) and not opts.sitemaps:
            raise CommandError("nothing to seed: give URLs, -f FILE or --sitemap URL")
        if abs(opts.priority) > 2**52:
            raise CommandError(f"--priority {opts.priority} is out of range: give a whole "
                               f"number from -{2**52} to {2**52}")
        if opts.max_urls < 1:  # it was taken as 1, and a sitemap of two URLs refused
            raise CommandError(f"--max-urls {opts.max_urls}: give 1 or more")
        # The spider's own settings apply, as on a worker (fingerprint, frontier options).
        crawler = Crawler(spidercls, self.settings)
        frontier = open_spider_frontier(crawler.settings, name)
        sitemap_note = ""
        mapped: list[str] = []
        if opts.sitemaps:
            reader = self._sitemap_reader(crawler, opts.max_urls)
            documents = skipped = 0
            for value in opts.sitemaps:
                try:
                    result = reader.read(value)
                except SitemapError as exc:
                    raise CommandError(f"{exc} (nothing was enqueued)") from None
                mapped += result.urls
                documents += len(result.sitemaps)
                skipped += result.skipped
            sitemap_note = f", {documents} sitemap document{'' if documents == 1 else 's'} read"
            if skipped:
                sitemap_note += f", {skipped} locations skipped (not http(s), or unfetchable)"
        fingerprinter = build_from_crawler(
            load_object(crawler.settings["REQUEST_FINGERPRINTER_CLASS"]), crawler
        )
        total = len(seeds) + sum(f.count for f in files) + len(mapped)
        counts: Counter[str] = Counter()
        hosts = spider_hosts(spidercls)
        batches = make_entries(itertools.chain(seeds, *files, mapped), opts.priority,
                               fingerprinter, counts, within_domains(hosts))
        progress = _progress(name, total) if total >= PROGRESS_EVERY else None
        enqueued, seen, over = push(frontier, batches, force=opts.force, total=total,
                                    progress=progress)
        repeated = counts["repeated"]
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
        given = f"{total} URL{'' if total == 1 else 's'} given{sitemap_note}"
        print(f"seeded {name}: {', '.join(parts)} ({given})")
        if counts["outside"]:
            print(f"seed {name}: {counts['outside']} of the URLs are outside the spider's "
                  f"hosts ({', '.join(hosts)}): a worker hands them back until they are dead "
                  f"letters, unless workers run with -a domains=HOST,... (or -a start=URL,...) "
                  f"that include them",
                  file=sys.stderr)

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
            max_urls=max_urls,
            check_url=lambda url: asyncio.run(guard.check_url(url)),
            delay=host_delay(crawler.settings),  # polite as a worker, between documents
        )


def spider_hosts(spidercls: type) -> list[str]:
    """The hosts the spider class keeps to (its ``hosts``, with their ports, or
    ``allowed_domains`` or start URLs), as its workers' offsite filter will; [] when its
    arguments decide."""
    check = getattr(spidercls, "check_arguments", None)
    if check is None:
        return sorted({d.lower() for d in getattr(spidercls, "allowed_domains", None) or ()})
    try:
        hosts = check().get("domains") or [host_of(u) for u in spidercls.start_urls]
    except ValueError:  # generic: its -a start or -a domains decide
        return []
    # With their ports: the workers follow that port only (a URL on another port of the
    # host was counted inside, then given back by every worker until dead-lettered).
    return sorted({h.lower() for h in hosts})


def _progress(name: str, total: int) -> Callable[[int], None]:
    """A line on stderr every :data:`PROGRESS_EVERY` URLs: a long list takes minutes."""
    said = [0]

    def say(done: int) -> None:
        if done - said[0] >= PROGRESS_EVERY:
            said[0] = done
            print(f"seeding {name}: {done:,} of about {total:,} URLs sent", file=sys.stderr,
                  flush=True)

    return say


def _checked(url: str, where: str, file_hint: bool = False) -> str:
    """``url`` stripped, or a CommandError before any frontier is opened. With
    ``file_hint``, an argument naming a file says to give it with ``-f``."""
    url = url.strip()
    if not is_http_url(url):  # it asks unfetchable() too; its reason is said when it has one
        why = unfetchable(url)
        problem = f"cannot be fetched: {why}" if why else "is not an http(s) URL"
        if file_hint and os.path.isfile(url):
            problem += f"; it is a file: to read URLs from it, give -f {url}"
        raise CommandError(f"{where}: {mask_credentials(url[:200])!r} {problem} "
                           "(nothing was enqueued)")
    return url


class UrlFile:
    """The URLs of a file, one per line (blank lines and ``#`` comments skipped), checked
    in one pass when opened and read again, a line at a time, when iterated: a list of
    ten million URLs is not held in memory. ``-`` (stdin) is copied to a temporary file
    on the way, so that it can be read twice."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0
        self._spool: IO[str] | None = None
        try:
            if path == "-":
                # Kept open past this call: read again by __iter__, closed by close().
                self._spool = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115
                self._check(sys.stdin, self._spool)
            else:
                # utf-8-sig: a file saved by Excel or Notepad starts with a BOM, and its
                # first URL was "not an http(s) URL"
                with open(path, encoding="utf-8-sig") as lines:
                    self._check(lines, None)
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise CommandError(f"cannot read {path}: not UTF-8 text (one URL per line)"
                               ) from None

    def _check(self, lines: Iterable[str], spool: IO[str] | None) -> None:
        for number, line in enumerate(lines, 1):
            text = line.strip()
            if text and not text.startswith("#"):
                _checked(text, f"{self.path}, line {number}")
                self.count += 1
                if spool is not None:
                    spool.write(text + "\n")

    def __iter__(self) -> Iterator[str]:
        if self._spool is not None:
            self._spool.seek(0)
            lines: Iterable[str] = self._spool
        else:
            lines = open(self.path, encoding="utf-8-sig")  # noqa: SIM115 - closed below
        try:
            for line in lines:
                text = line.strip()
                if text and not text.startswith("#"):
                    yield text
        finally:
            if lines is not self._spool:
                lines.close()  # type: ignore[union-attr]

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()


def make_entries(urls: Iterable[str], priority: int, fingerprinter: Any,
                 counts: Counter[str], within: Callable[[str], bool] | None = None,
                 ) -> Iterator[list[Entry]]:
    """Frontier entries (callback: the spider's default) in batches of :data:`MAX_PUSH`,
    one per fingerprint; ``counts["repeated"]`` counts the URLs that were the same request
    as an earlier one (tracking variants, repeats), ``counts["outside"]`` those ``within``
    says no to (enqueued all the same). A set of 8-byte prefixes remembers the requests,
    about 70 bytes a URL."""
    met: set[int] = set()
    batch: list[Entry] = []
    for url in urls:
        try:
            entry = request_entry(Request(url, priority=priority), None, fingerprinter)
        except (ValueError, SerializationError) as exc:
            raise CommandError(f"cannot queue {mask_credentials(url[:200])!r}: {exc}") from None
        key = int.from_bytes(entry.fingerprint[:8], "big")
        if key in met:
            counts["repeated"] += 1
            continue
        met.add(key)
        if within is not None and not within(url):  # once a request: "15 outside" of 13
            counts["outside"] += 1
        batch.append(entry)
        if len(batch) == MAX_PUSH:
            yield batch
            batch = []
    if batch:
        yield batch


def push(frontier: Frontier, batches: Iterable[list[Entry]], *, force: bool, total: int,
         progress: Callable[[int], None] | None = None) -> tuple[int, int, int]:
    """Push through the dupefilter; ``(enqueued, seen before, over their host's budget)``.
    With ``force`` the seen ones are pushed again past the dupefilter (each still recorded
    as seen once); never the ones over budget (``WEBFARM_HOST_BUDGET`` bounds seeds too).
    ``progress`` is told how many entries went so far, after each batch."""
    enqueued = seen = over = done = 0
    try:
        for batch in batches:
            result = frontier.exchange("", push=batch, pop=0)
            old = [e._replace(dont_filter=True) for e, new, cut in zip(
                batch, result.enqueued, result.over_budget, strict=True) if not new and not cut]
            seen += len(old)
            over += sum(result.over_budget)
            enqueued += sum(result.enqueued)
            if force and old:
                enqueued += sum(frontier.push(old))
            done += len(batch)
            if progress is not None:
                progress(done)
    except redis.RedisError as exc:
        if str(exc).startswith("WEBFARM "):  # the frontier refused (dupefilter mode)
            raise CommandError(str(exc)[8:], BAD_CONFIG) from None
        raise CommandError(
            f"Redis failed after {enqueued} of {total} URLs were enqueued ({exc}); "
            "run the same seed again: what is already enqueued is skipped", BAD_CONFIG,
        ) from None
    except CommandError as exc:
        if not done:
            raise CommandError(f"{exc} (nothing was enqueued)") from None
        raise CommandError(f"{exc} ({enqueued} URLs before it were enqueued; run the same "
                           "seed again once it is fixed: those are skipped)") from None
    return enqueued, seen, over
