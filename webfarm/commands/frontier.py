"""``scrapy frontier SPIDER [--json] [--top N] [--reset --yes [--force]]``: what a
spider's frontier holds.

Queued requests in total and per host, hosts ready now, retries waiting for
their backoff, leases in flight, dead letters, URLs seen, and each host's delay
and next-allowed time — read from Redis, so it shows every worker's share.
``--json`` prints the same as one object with stable keys (see the README).

``--reset`` is the one explicit wipe of a frontier (closing a worker never
deletes shared state); it asks first, or needs ``--yes`` when not at a terminal.

The host table is built from :data:`HOST_COLUMNS` by :func:`host_table`; a view
that knows more per host adds a :class:`~webfarm.commands._common.Column`.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from datetime import UTC, datetime
from typing import Any, ClassVar

import redis
from scrapy.commands import ScrapyCommand
from scrapy.settings import BaseSettings

from webfarm.commands._common import (
    BAD_CONFIG,
    BAD_INPUT,
    Column,
    CommandError,
    one_spider,
    open_spider_frontier,
    pipe_may_close,
    render_table,
    report,
    seconds,
    spider_class,
    spider_settings,
    where,
)
from webfarm.config import ConfigError
from webfarm.frontier import Frontier
from webfarm.monitor import table as monitor_table
from webfarm.monitor.alerts import resolve_all
from webfarm.monitor.notify import Notifier
from webfarm.procs import pid_alive
from webfarm.proxies import health as proxy_health
from webfarm.proxyconfig import proxies_from_settings

DEFAULT_TOP = 20
DEFAULT_WINDOW = 300.0  # seconds of per-host figures (webfarm.monitor) shown

#: The per-host table: one column per key of a ``per_host`` row of :func:`snapshot`.
HOST_COLUMNS: list[Column] = [
    Column("HOST", lambda h: h["host"]),
    Column("QUEUED", lambda h: f"{h['queued']:,}", right=True),
    # admitted through the dupefilter, all time (what WEBFARM_HOST_BUDGET counts)
    Column("URLS", lambda h: f"{h.get('urls', 0):,}", right=True),
    Column("DELAY", lambda h: seconds(h["delay"]), right=True),
    Column("NEXT ALLOWED", lambda h: "now" if h["next_allowed_in"] <= 0
           else "in " + seconds(h["next_allowed_in"]), right=True),
]


def snapshot(frontier: Frontier, top: int = 0) -> dict[str, Any]:
    """Everything ``scrapy frontier`` shows, as JSON-ready data (the ``--json`` keys).

    ``per_host`` lists hosts with queued requests or a pending politeness wait, most
    queued first, at most ``top`` of them (0: all); ``hosts_listed`` counts them all.
    """
    counts = frontier.counts()
    stored_mode = frontier.server.hget(frontier.key("stats"), "dupefilter")
    mode = stored_mode.decode() if stored_mode else frontier.dupefilter
    # The mode the frontier was created with wins over this command's DUPEFILTER_CLASS.
    reader = frontier if mode == frontier.dupefilter else Frontier(
        frontier.server, frontier.spider, dupefilter=mode)
    memory = reader.memory()
    hosts = frontier.host_stats()
    return {
        "spider": frontier.spider,
        "prefix": frontier.prefix,
        "redis": where(frontier),
        "queued": counts["queued"],
        "hosts": counts["hosts"],
        "ready_hosts": counts["ready_hosts"],
        "delayed": counts["delayed"],
        "leased": counts["leased"],
        "leases_by_worker": frontier.leases_by_worker(),
        "dead": counts["dead"],
        "seen": counts["seen"],
        "seen_exact": mode == "set",
        "dupefilter": mode,
        "dupefilter_bytes": memory["bytes"],
        "bloom_layers": memory["layers"],
        "retried": counts["retried"],
        "waited": counts["waited"],  # of them: no attempt spent (a store down, an outage)
        "expired": counts["expired"],
        "default_delay": frontier.effective_default_delay(),
        "host_budget": frontier.host_budget,
        "hosts_listed": len(hosts),
        "per_host": hosts[:top] if top > 0 else hosts,
    }


def host_table(rows: list[dict[str, Any]], columns: list[Column] | None = None) -> str:
    """The per-host table of :func:`snapshot` rows (extra columns: pass ``columns``)."""
    return render_table(rows, HOST_COLUMNS if columns is None else columns)


def _workers(leases: dict[str, int], shown: int = 3) -> str:
    """``in flight on 2 workers: vm1:81:a1b2c3 (5), vm2:90:d4e5f6 (3)``, the busiest first."""
    if not leases:
        return "in flight on workers"
    # A killed worker's leases look like work in flight until they expire: one of this
    # machine whose process is gone is said so (others' cannot be told from here).
    names = [f"{name} ({n:,}{'; gone, its leases expire' if gone_here(name) else ''})"
             for name, n in list(leases.items())[:shown]]
    more = f", … {len(leases) - shown} more" if len(leases) > shown else ""
    return f"in flight on {_n(len(leases), 'worker')}: {', '.join(names)}{more}"


def _n(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def _waited(doc: dict[str, Any]) -> str:
    """The retries that spent no attempt, said apart: 460 storage re-queues read as 460
    failed fetches."""
    n = doc.get("waited") or 0
    return f" ({n:,} of them spent no attempt: a store down, a host's outage)" if n else ""


def summary(doc: dict[str, Any]) -> str:
    """The lines above the host table."""
    if doc["seen_exact"]:
        kind, approx = "exact set", ""
    else:
        kind, approx = f"Bloom filter, {_n(doc['bloom_layers'], 'layer')}", "~"
    rows = [
        ("queued", f"{doc['queued']:,}",
         f"{_n(doc['hosts'], 'host')}, {doc['ready_hosts']:,} ready now"),
        ("delayed", f"{doc['delayed']:,}", "retries waiting for their backoff"),
        ("leased", f"{doc['leased']:,}", _workers(doc["leases_by_worker"])),
        ("dead", f"{doc['dead']:,}", f"scrapy dlq {doc['spider']} --list"),
        ("seen", f"{approx}{doc['seen']:,}", f"{kind}, {_size(doc['dupefilter_bytes'])}"),
        ("retried", f"{doc['retried']:,}",
         f"all time{_waited(doc)}; {_n(doc['expired'], 'lease')} expired"),
    ]
    width = max(len(r[1]) for r in rows)
    lines = [f"frontier {doc['prefix']} on {doc['redis']}"]
    lines += [f"  {name:<8}{value:>{width}}   {note}" for name, value, note in rows]
    if doc.get("host_budget"):
        lines.append(f"  URLs of one host admitted at most: {doc['host_budget']:,} "
                     "(WEBFARM_HOST_BUDGET)")
    return "\n".join(lines)


def proxy_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The proxies' health, one line each (WEBFARM_PROXIES)."""
    lines = ["proxies (WEBFARM_PROXIES; health shared by all workers)"]
    width = max(len(r["id"]) for r in rows)
    for r in rows:
        why = f"{r['failures']} in a row; last: {r['last_reason'] or '?'}"
        # Past its cooldown, a proxy's failures count on until a request sent since then
        # is fetched fine: "healthy" alone hid how close it was to retirement.
        healthy = (f"in use again, {why}; a fetch through it clears them" if r["failures"]
                   else "healthy")
        state = {"healthy": healthy,
                 "cooling": f"cooling down {r['cooling_for']:.0f}s more ({why})",
                 "retired": f"retired ({why}); fix it, then delete {r['key']}"}[r["state"]]
        lines.append(f"  {r['id']:<{width}}  {state}")
    return lines


def gone_here(worker: str) -> bool:
    """Whether a worker name (``HOST:PID:TOKEN``) names this machine and a process that is
    not running: a worker killed with ``kill -9`` still counts as running for 2 minutes,
    and ``--reset`` named it with no word that it was gone. Said, never assumed: another
    container with this host name has its own process ids."""
    parts = worker.split(":")
    if len(parts) < 3 or not parts[-2].isdigit():
        return False
    host, pid = ":".join(parts[:-2]), int(parts[-2])
    return host == socket.gethostname() and not pid_alive(pid)


class Command(ScrapyCommand):
    requires_project = True
    requires_crawler_process = False
    default_settings: ClassVar[dict[str, Any]] = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "SPIDER [--json] [--top N] | SPIDER --reset [--yes] [--force]"

    def short_desc(self) -> str:
        return "Show a spider's shared frontier (queues per host, leases, dead, seen) or reset it"

    def long_desc(self) -> str:
        return (
            "Show what SPIDER's frontier holds: queued requests in total and per host (most "
            "queued first), hosts ready now, delayed retries, leases in flight, dead letters, "
            "URLs seen, and each host's delay and next-allowed time; with figures from the "
            "workers (webfarm.monitor), each host's rates, success, status classes, errors, "
            "latency and bytes over --window, worst hosts first. --watch refreshes. --json "
            "prints one object for scripts. --reset deletes the whole frontier (queues, seen "
            "URLs, dead letters); it asks first, or needs --yes."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument("--json", dest="json", action="store_true",
                            help="print one JSON object instead of tables")
        parser.add_argument("--top", type=int, default=DEFAULT_TOP, metavar="N",
                            help=f"hosts to list (default {DEFAULT_TOP}; 0 = all)")
        parser.add_argument("--window", type=float, default=DEFAULT_WINDOW, metavar="SECONDS",
                            help="per-host figures over the last SECONDS (default "
                                 f"{DEFAULT_WINDOW:.0f})")
        parser.add_argument("--watch", type=float, nargs="?", const=5.0, metavar="SECONDS",
                            help="refresh every SECONDS (default 5, at least 0.5) until "
                                 "Ctrl-C; with --json one object per line")
        parser.add_argument("--count", type=int, default=0, metavar="N",
                            help="with --watch: stop after N refreshes (default: never)")
        parser.add_argument("--reset", action="store_true",
                            help="delete this spider's whole frontier")
        parser.add_argument("--yes", action="store_true", help="do not ask before --reset")
        parser.add_argument("--force", action="store_true",
                            help="--reset even while workers of the spider run")

    @pipe_may_close
    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        one_spider(args, "frontier")
        try:
            if opts.top < 0:
                raise CommandError(f"--top {opts.top}: give 0 (all hosts) or more")
            if opts.window <= 0 or opts.count < 0 or (opts.watch is not None
                                                      and opts.watch <= 0):
                raise CommandError("--window and --watch take seconds > 0, --count 0 or more")
            assert self.settings is not None
            settings = spider_settings(self.settings, spider_class(self.settings, args[0]))
            frontier = open_spider_frontier(settings, args[0])
            try:
                if opts.reset:
                    self._reset(frontier, settings, opts.yes, opts.force)
                else:
                    self._show(frontier, settings, opts)
            except redis.RedisError as exc:
                raise CommandError(f"Redis failed: {exc}", BAD_CONFIG) from None
        except CommandError as exc:
            report(self, exc)

    def _show(self, frontier: Frontier, settings: BaseSettings,
              opts: argparse.Namespace) -> None:
        if opts.watch is None:
            self._show_once(frontier, settings, opts)
        else:
            monitor_table.watch(lambda: self._show_once(frontier, settings, opts), opts.watch,
                                opts.count)

    def _show_once(self, frontier: Frontier, settings: BaseSettings,
                   opts: argparse.Namespace) -> None:
        doc = snapshot(frontier)
        # Per-host figures of the workers (webfarm.monitor), worst hosts first, when any.
        figures = monitor_table.add_figures(doc, frontier, settings, opts.window)
        if opts.top > 0:
            doc["per_host"] = doc["per_host"][:opts.top]
        try:
            proxies = proxies_from_settings(settings)
        except ConfigError as exc:
            raise CommandError(str(exc), BAD_CONFIG) from None
        if proxies:  # health is shared by every spider's workers
            doc["proxies"] = proxy_health(frontier.server, proxies)
        # When it was taken: frames of --watch piped to a file, snapshots kept by a script
        doc["at"] = datetime.now(UTC).isoformat(timespec="seconds")
        if opts.json:
            print(json.dumps(doc, indent=None if opts.watch else 2))
            return
        if opts.watch is not None:
            print(f"{doc['spider']} at {doc['at'].replace('T', ' ').replace('+00:00', ' UTC')}")
        print(summary(doc))
        if proxies:
            print("\n".join(proxy_lines(doc["proxies"])))
        if figures:
            print("\n".join(monitor_table.summary_lines(doc["monitor"])))
        if doc["per_host"]:
            print()
            extra = [Column(h, cell, right=r) for h, cell, r in monitor_table.FIGURE_COLUMNS]
            print(host_table(doc["per_host"], HOST_COLUMNS + extra if figures else None))
            hidden = doc["hosts_listed"] - len(doc["per_host"])
            if hidden > 0:
                print(f"… and {hidden:,} more hosts (--top 0 lists all)")

    def _reset(self, frontier: Frontier, settings: BaseSettings, yes: bool,
               force: bool) -> None:
        running = sorted(frontier.fleet_delays())
        if running and not force:
            # A worker running on keeps what it holds and pushes the links it finds into
            # the new, empty frontier, and took the reset for Redis losing its writes.
            gone = [w for w in running if gone_here(w)]
            note = (f"; {len(gone)} of them ({', '.join(gone[:5])}) named this machine and "
                    "no process of theirs runs here: killed, they count until 2 minutes "
                    "after their last exchange" if gone else "")
            raise CommandError(
                f"--reset: {len(running)} worker(s) of {frontier.spider} exchanged with the "
                f"frontier in the last 2 minutes ({', '.join(running[:5])}"
                f"{', …' if len(running) > 5 else ''}){note}; stop them first (Ctrl-C, or "
                "scrapyd's cancel), or add --force to reset under them", BAD_INPUT)
        c = frontier.counts()
        what = (f"the whole frontier {frontier.prefix} on {where(frontier)}: {c['queued']:,} "
                f"queued, {c['leased']:,} leased, {c['delayed']:,} delayed, {c['dead']:,} dead, "
                f"{c['seen']:,} seen")
        if not yes:
            if not sys.stdin.isatty():
                raise CommandError(f"--reset would delete {what}; add --yes to confirm",
                                   BAD_INPUT)
            answer = input(f"Delete {what}? Type the spider name to confirm: ")
            if answer.strip() != frontier.spider:
                print("not reset")
                return
        # The alerts' state goes with the frontier: their receiver hears they ended (it
        # never did, and the same alert firing later was its next message).
        notifier = Notifier.from_settings(settings, frontier.spider, "scrapy frontier --reset")
        ended = resolve_all(frontier, notifier, "the frontier was reset")
        deleted = frontier.reset()
        print(f"reset {frontier.spider}: deleted {deleted} keys of {frontier.prefix}"
              + (f"; {ended} firing alert(s) resolved" if ended else ""))
