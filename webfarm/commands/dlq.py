"""``scrapy dlq SPIDER [--list|--requeue|--purge] [--reason REGEX] [--url REGEX]``: dead letters.

A request lands in ``webfarm:{SPIDER}:dead`` after its last retry, when a
middleware dead-letters it, when its callback fails, or when a queue entry is
not a request of ours. ``--list`` shows why (reason, last status or error,
attempts, first and last time, URL — user-info of URLs masked, since proxy and
site credentials can hide there); ``--requeue`` puts them back into their
host's queue with attempts reset; ``--purge`` deletes them. ``--reason`` and ``--url``
limit any of the three to letters whose reason, or URL, matches a regular expression.

Requeue is at-least-once, like the rest of the frontier: a letter is pushed to
its queue first and removed from the dead list after, so a crash in between
leaves a duplicate, never a loss. Letters that are not requests (malformed or
foreign entries) cannot be requeued and stay, to be looked at or purged.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import socket
from collections.abc import Generator
from datetime import UTC, datetime
from typing import Any, ClassVar

import redis
from scrapy.commands import ScrapyCommand

from webfarm import serialize
from webfarm.commands._common import (
    BAD_CONFIG,
    Column,
    CommandError,
    cut_cells,
    one_spider,
    open_spider_frontier,
    pipe_may_close,
    render_table,
    report,
    spider_class,
    spider_settings,
)
from webfarm.config import mask_credentials
from webfarm.frontier import Entry, Frontier
from webfarm.redisconn import held

CHUNK = 500
Chunk = list[tuple[int, bytes, dict[str, Any]]]  # (index in the dead list, raw, parsed)
DEFAULT_LIMIT = 50
# Removes the given (index, letter) pairs from the dead list in one atomic call: each is
# tombstoned where it still is (LSET), or found by value if the list shifted meanwhile;
# then one LREM drops the tombstones. O(list) per call instead of O(list) per letter.
_REMOVE = """
local n = 0
for i = 2, #ARGV, 2 do
  local idx = tonumber(ARGV[i])
  if redis.call('LINDEX', KEYS[1], idx) == ARGV[i + 1] then
    redis.call('LSET', KEYS[1], idx, ARGV[1])
    n = n + 1
  elseif redis.call('LREM', KEYS[1], 1, ARGV[i + 1]) > 0 then
    n = n + 1
  end
end
if n > 0 then redis.call('LREM', KEYS[1], 0, ARGV[1]) end
return n
"""


def parse_letter(raw: bytes) -> dict[str, Any]:
    """A dead letter as stored (JSON object), or a stand-in for one that is not."""
    text = raw.decode("utf-8", "replace")
    try:
        letter = json.loads(text)
        if isinstance(letter, dict):
            return letter
    except ValueError:
        pass
    return {"reason": "unreadable dead letter", "payload": text}


def requeue_entry(letter: dict[str, Any]) -> Entry | None:
    """The frontier entry to put a letter back, or None when it is not a request of ours."""
    host, priority, payload = letter.get("host"), letter.get("priority"), letter.get("payload")
    if not isinstance(host, str) or not host or re.search(r"\s", host):
        return None
    if not isinstance(priority, (int, float)) or priority != int(priority):
        return None
    if not isinstance(payload, str):
        return None
    try:
        serialize.loads(payload)
    except serialize.SerializationError:
        return None
    # Past the dupefilter: the URL is in it already, from when it was first enqueued.
    return Entry(host, int(priority), b"", payload, dont_filter=True)


def letter_view(letter: dict[str, Any]) -> dict[str, Any]:
    """What ``--list`` shows of a letter (the ``--json`` keys); no payload, no credentials."""
    url = method = None
    payload = letter.get("payload")
    if isinstance(payload, str):
        try:
            request = serialize.loads(payload)
            url, method = request["url"], request.get("method") or "GET"
        except serialize.SerializationError:
            pass

    def text(key: str) -> str | None:
        value = letter.get(key)
        return None if value is None else mask_credentials(str(value))

    return {
        "reason": text("reason") or "",
        "status": letter.get("status"),
        "error": text("error"),
        "attempts": letter.get("attempts"),
        "first": letter.get("first"),
        "last": letter.get("last"),
        "host": text("host"),
        "priority": letter.get("priority"),
        "worker": text("worker"),
        "method": method,
        "url": mask_credentials(url) if url else None,
        "requeueable": requeue_entry(letter) is not None,
    }


def _utc(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S")


#: The ``--list`` table: one column per key of :func:`letter_view`.
LETTER_COLUMNS: list[Column] = [
    Column("REASON", lambda v: v["reason"], width=60),
    Column("STATUS/ERROR", lambda v: v["status"] if v["status"] is not None
           else (v["error"] or "-"), width=40),
    Column("ATTEMPTS", lambda v: "-" if v["attempts"] is None else v["attempts"], right=True),
    Column("FIRST (UTC)", lambda v: _utc(v["first"])),
    Column("LAST (UTC)", lambda v: _utc(v["last"])),
    Column("URL", lambda v: v["url"] or "(not a request)"),
]


class DeadLetters:
    """The dead list of one frontier, walked in chunks (it can be long)."""

    def __init__(self, frontier: Frontier) -> None:
        self.frontier = frontier
        self.server = frontier.server
        self.key = frontier.key("dead")
        self._remove = self.server.register_script(_REMOVE)

    def __len__(self) -> int:
        return int(self.server.llen(self.key))

    def chunks(self) -> Generator[Chunk, int | None, None]:
        """``(index, raw, letter)`` chunks of the letters there were when the walk began.

        The caller may remove letters of a chunk before asking for the next one: pass
        the count through ``send`` so the walk stays on the unvisited ones.
        """
        budget = len(self)
        pos = 0
        while budget > 0:
            raws = self.server.lrange(self.key, pos, pos + min(CHUNK, budget) - 1)
            if not raws:
                return
            budget -= len(raws)
            removed = yield [(pos + i, raw, parse_letter(raw)) for i, raw in enumerate(raws)]
            pos += len(raws) - int(removed or 0)

    def remove(self, picked: list[tuple[int, bytes]]) -> int:
        """Remove these ``(index, raw)`` letters atomically; returns how many were there."""
        if not picked:
            return 0
        args: list[Any] = ["\x00webfarm-removed:" + secrets.token_hex(8)]
        for index, raw in picked:
            args += [index, raw]
        return int(self._remove(keys=[self.key], args=args))


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return ("SPIDER [--list|--requeue|--purge] [--reason REGEX] [--url REGEX] [--json] "
                "[--limit N]")

    def short_desc(self) -> str:
        return "List, requeue or purge a spider's dead letters (requests that failed for good)"

    def long_desc(self) -> str:
        return (
            "--list (default) shows each dead letter's reason, last status or error, "
            "attempts, first and last time (UTC) and URL; --json prints them for scripts. "
            "--requeue puts them back into their host's queue with attempts reset; --purge "
            "deletes them. --reason REGEX and --url REGEX limit any of these to matching letters."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        action = parser.add_mutually_exclusive_group()
        for flag, text in (("--list", "show dead letters (the default)"),
                           ("--requeue", "put dead letters back into their queues"),
                           ("--purge", "delete dead letters")):
            action.add_argument(flag, dest="action", action="store_const",
                                const=flag[2:], help=text)
        parser.add_argument("--reason", metavar="REGEX", default=None,
                            help="only letters whose reason matches (Python regex, searched)")
        parser.add_argument("--url", metavar="REGEX", default=None,
                            help="only letters whose URL matches (Python regex, searched; "
                                 "one host: --url '//shop.example.com[:/]')")
        parser.add_argument("--json", dest="json", action="store_true",
                            help="--list as one JSON object")
        parser.add_argument("--limit", type=int, default=DEFAULT_LIMIT, metavar="N",
                            help=f"letters --list shows (default {DEFAULT_LIMIT}; 0 = all)")

    @pipe_may_close
    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        one_spider(args, "dlq")
        try:
            pattern = _Filter(_pattern(opts.reason), _pattern(opts.url, "--url"))
            if opts.limit < 0:
                raise CommandError(f"--limit {opts.limit}: give 0 (all) or more")
            assert self.settings is not None
            settings = spider_settings(self.settings, spider_class(self.settings, args[0]))
            frontier = open_spider_frontier(settings, args[0],
                                            writes=opts.action in ("requeue", "purge"))
            letters = DeadLetters(frontier)
            try:
                if opts.action in ("requeue", "purge"):
                    owner = f"scrapy dlq --{opts.action} on {socket.gethostname()}:{os.getpid()}"
                    with held(frontier.server, frontier.key("dlq:busy"), owner, 900) as busy:
                        if busy is not None:  # two at once queued letters twice
                            raise CommandError(
                                f"another change to {args[0]}'s dead letters is running "
                                f"({busy}); run this one when it has ended", BAD_CONFIG)
                        if opts.action == "requeue":
                            self._requeue(letters, pattern)
                        else:
                            self._purge(letters, pattern)
                else:
                    self._list(letters, pattern, opts.limit, opts.json)
            except redis.RedisError as exc:
                raise CommandError(f"Redis failed: {exc}", BAD_CONFIG) from None
        except CommandError as exc:
            report(self, exc)

    def _list(self, letters: DeadLetters, pattern: _Filter, limit: int,
              as_json: bool) -> None:
        total = len(letters)
        shown: list[dict[str, Any]] = []
        matched = 0
        for chunk in letters.chunks():
            for _, _, letter in chunk:
                if pattern(letter):
                    matched += 1
                    if not limit or len(shown) < limit:
                        shown.append(letter_view(letter))
            if not pattern and limit and len(shown) >= limit:
                matched = total  # no filter: every letter matches, no need to read on
                break
        frontier = letters.frontier
        if as_json:
            print(json.dumps({"spider": frontier.spider, "prefix": frontier.prefix,
                              "total": total, "matched": matched, "listed": len(shown),
                              "letters": shown}, indent=2))
            return
        what = f"{total:,} dead letters in {frontier.key('dead')}"
        if pattern:
            what += f", {matched:,} {pattern.said()}"
        print(what)
        if shown:
            print()
            print(render_table(shown, LETTER_COLUMNS))
            if cut_cells(shown, LETTER_COLUMNS):
                print("(a cell ending in … is cut: --json has every reason and error whole)")
        if matched > len(shown):
            print(f"… {matched - len(shown):,} more (--limit 0 lists all)")

    def _requeue(self, letters: DeadLetters, pattern: _Filter) -> None:
        requeued = kept = 0
        walk = letters.chunks()
        chunk = next(walk, None)
        while chunk is not None:
            picked: list[tuple[int, bytes]] = []
            entries: list[Entry] = []
            for index, raw, letter in chunk:
                if not pattern(letter):
                    continue
                entry = requeue_entry(letter)
                if entry is None:
                    kept += 1
                    continue
                picked.append((index, raw))
                entries.append(entry)
            if entries:  # push first, then remove: a crash between leaves a duplicate
                requeued += sum(letters.frontier.push(entries))
            removed = letters.remove(picked)
            chunk = _send(walk, removed)
        line = f"requeued {requeued:,} dead letters of {letters.frontier.spider}"
        if kept:
            line += f"; {kept:,} are not requests and stay (scrapy dlq --list shows them)"
        print(line)

    def _purge(self, letters: DeadLetters, pattern: _Filter) -> None:
        if not pattern:
            purged = letters.frontier.purge_dead()
        else:
            purged = 0
            walk = letters.chunks()
            chunk = next(walk, None)
            while chunk is not None:
                picked = [(i, raw) for i, raw, letter in chunk if pattern(letter)]
                removed = letters.remove(picked)
                purged += removed
                chunk = _send(walk, removed)
        print(f"purged {purged:,} dead letters of {letters.frontier.spider}")


def _send(walk: Generator[Chunk, int | None, None], removed: int) -> Chunk | None:
    try:
        return walk.send(removed)
    except StopIteration:
        return None


def _pattern(value: str | None, flag: str = "--reason") -> re.Pattern[str] | None:
    if value is None:
        return None
    try:
        return re.compile(value)
    except re.error as exc:
        raise CommandError(f"{flag} {value!r} is not a regular expression ({exc})") from None


class _Filter:
    """``--reason`` and ``--url``: a letter matches both that are given. By reason alone,
    one host's letters could not be picked (an "HTTP 500" names no host)."""

    def __init__(self, reason: re.Pattern[str] | None, url: re.Pattern[str] | None) -> None:
        self.reason, self.url = reason, url

    def __bool__(self) -> bool:
        return self.reason is not None or self.url is not None

    def said(self) -> str:
        parts = [f"{what} matching {p.pattern!r}" for what, p in (
            ("with a reason", self.reason), ("with a URL", self.url)) if p is not None]
        return " and ".join(parts)

    def __call__(self, letter: dict[str, Any]) -> bool:
        if self.reason is not None and not self.reason.search(str(letter.get("reason") or "")):
            return False
        return self.url is None or bool(self.url.search(letter_view(letter)["url"] or ""))

