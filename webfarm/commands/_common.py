"""What webfarm's commands (seed, frontier, dlq, recrawl, reparse) share: finding the
spider, reaching its frontier the way a worker does, one-line errors, tables.

Not a command itself (it defines no ScrapyCommand), so Scrapy lists nothing for it.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from scrapy.exceptions import UsageError
from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings
from scrapy.spiderloader import get_spider_loader

from webfarm import config
from webfarm.frontier import Frontier
from webfarm.queue import open_frontier
from webfarm.redischeck import check_redis, redis_address
from webfarm.redisconn import CLIENT_OPTIONS

#: exit codes: bad input (arguments, files, URLs) vs. a deployment that is not reachable
BAD_INPUT = 2
BAD_CONFIG = 1


def pipe_may_close(run: Callable[..., None]) -> Callable[..., None]:
    """A command's ``run`` whose output may go to a reader that stops early (``scrapy
    frontier SPIDER | head``): it ends quietly, as ``ls | head`` does, not with a
    BrokenPipeError traceback."""

    @functools.wraps(run)
    def wrapped(*args: Any, **kwargs: Any) -> None:
        try:
            run(*args, **kwargs)
            sys.stdout.flush()
        except BrokenPipeError:
            # What is left in the buffer must not be written at exit either.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    return wrapped


def one_spider(args: list[str], command: str) -> str:
    """The one spider name a command takes. Scrapy hands a command the options it does not
    know as arguments, so a slip (``--dryrun``) was said as a missing spider name."""
    unknown = [arg for arg in args if arg.startswith("-")]
    if unknown:
        raise UsageError(f"no option {unknown[0]} (see `scrapy {command} -h`)",
                         print_help=False)
    if len(args) != 1:
        raise UsageError(f"name one spider: scrapy {command} SPIDER (`scrapy list` shows "
                         "them)", print_help=False)
    return args[0]


class CommandError(Exception):
    """Stop the command with one line on stderr and ``code`` as exit code."""

    def __init__(self, message: str, code: int = BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


def check_log_level(settings: BaseSettings) -> None:
    """``-L debug`` or ``-s LOG_LEVEL=debug`` upper-cased, as ``WEBFARM_LOG_LEVEL`` is; a
    level that is none a UsageError (one line, exit code 2). Scrapy handed it to
    ``logging`` as it came, whose ValueError was a traceback before any output."""
    level = settings.get("LOG_LEVEL")
    if isinstance(level, int):
        return
    name = str(level).strip().upper()
    if not isinstance(logging.getLevelName(name), int):  # the name's number, if it is one
        raise UsageError(f"LOG_LEVEL={level!r} is not a log level; give DEBUG, INFO, WARNING, "
                         "ERROR or CRITICAL", print_help=False)
    settings.set("LOG_LEVEL", name, priority=settings.getpriority("LOG_LEVEL") or 0)


def report(command: Any, exc: CommandError) -> None:
    """Print the one line and set the command's exit code."""
    print(f"webfarm: {exc}", file=sys.stderr)
    command.exitcode = exc.code


def spider_class(settings: BaseSettings, name: str) -> type:
    """The spider class named ``name``, so a typo never reads or writes an empty frontier."""
    try:
        return get_spider_loader(settings).load(name)
    except KeyError:
        raise CommandError(f"no spider named {name!r}; `scrapy list` shows them") from None


def spider_settings(settings: BaseSettings, spidercls: type) -> BaseSettings:
    """``settings`` with the spider's ``custom_settings`` applied, as its crawler will have
    them: a spider may keep its pages in a database or bucket of its own."""
    own = settings.copy()
    spidercls.update_settings(own)  # type: ignore[attr-defined]
    # Scrapy's deprecated spider attributes, as its Crawler maps them in a crawl: a spider
    # with ``download_delay = 5`` has that delay in the frontier the commands show.
    for attr, name in (("download_delay", "DOWNLOAD_DELAY"),
                       ("max_concurrent_requests", "CONCURRENT_REQUESTS_PER_DOMAIN")):
        if hasattr(spidercls, attr) and \
                (own.getpriority(name) or 0) < SETTINGS_PRIORITIES["spider"]:
            own.set(name, getattr(spidercls, attr), priority="spider")
    return own


def service_variable(settings: BaseSettings, name: str) -> str:
    """``name`` for messages, marked when it is unset and the embedded service is meant."""
    return name if settings.get(name) else f"{name} (unset: embedded)"


def open_spider_frontier(settings: BaseSettings, name: str, writes: bool = True) -> Frontier:
    """The spider's frontier on ``REDIS_URL`` (or the embedded Valkey, started or joined),
    with the same keys, delays and dupefilter mode as the workers; checked reachable, and,
    for a command that ``writes``, that its user may run the frontier's scripts on the
    spider's keys (a read-only user may still list dead letters)."""
    try:
        config.check_settings(settings)
        url = config.redis_url(settings)
        check_redis(url, service_variable(settings, "REDIS_URL"),
                    spider=name if writes else None)
    except config.ConfigError as exc:
        raise CommandError(str(exc), BAD_CONFIG) from None
    try:
        return open_frontier(settings, name, redis.Redis.from_url(url, **CLIENT_OPTIONS))
    except ValueError as exc:
        raise CommandError(str(exc), BAD_CONFIG) from None


def where(frontier: Frontier) -> str:
    """``redis://host:port/db``, for the header line (no password)."""
    return redis_address(frontier.server)


@dataclass(frozen=True)
class Column:
    """One table column: header, how to get the cell from a row, right-aligned or not."""

    header: str
    cell: Callable[[dict[str, Any]], str]
    right: bool = False
    width: int | None = None  # cut longer cells to this many characters


def _cell(row: dict[str, Any], column: Column) -> str:
    return " ".join(str(column.cell(row)).split())


def cut_cells(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> bool:
    """Whether :func:`render_table` cuts a cell of these rows (to say where it is whole)."""
    return any(c.width is not None and len(_cell(row, c)) > c.width
               for row in rows for c in columns)


def render_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    """An aligned text table; add a :class:`Column` to show one more value per row."""
    cells = [[c.header for c in columns]]
    for row in rows:
        line = []
        for c in columns:
            text = _cell(row, c)
            if c.width is not None and len(text) > c.width:
                text = text[: max(1, c.width - 1)] + "…"
            line.append(text)
        cells.append(line)
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    out = []
    for line in cells:
        parts = [
            text.rjust(w) if c.right else text.ljust(w)
            for text, w, c in zip(line, widths, columns, strict=True)
        ]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def seconds(value: float | None) -> str:
    """``0.25s``, ``12s``, ``3m05s``, ``2h10m`` — short and sortable by eye."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f}s".replace(".00s", "s")
    if value < 60:
        return f"{value:.0f}s"
    if value < 3600:
        return f"{int(value // 60)}m{int(value % 60):02d}s"
    return f"{int(value // 3600)}h{int(value % 3600 // 60):02d}m"
