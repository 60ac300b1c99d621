"""The per-host figures of ``scrapy frontier``: worst hosts first, as text or JSON."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

from webfarm.frontier import Frontier
from webfarm.monitor.alerts import firing_states
from webfarm.monitor.metrics import GAUGES, Figures, MetricsStore, Window

DEFAULT_LIMIT = 50  # rows of the text table (JSON has every host)


def _worst_first(row: dict[str, Any]) -> tuple:
    rate = row["success_rate"]
    # Hosts with fetches that ended come first, lowest success and most errors first;
    # hosts that only wait in the queue follow, deepest queue first.
    if rate is None:
        return (1, 0.0, 0, -row["queued"], row["host"])
    return (0, rate, -row["error_count"], -row["queued"], row["host"])


def host_rows(window: Window, host_stats: list[dict] | None = None,
              default_delay: float | None = None) -> list[dict[str, Any]]:
    """One row per host seen in the window or waiting in the queue, worst first.

    ``host_stats`` rows (``Frontier.host_stats()``, or ``scrapy frontier``'s own) keep
    their keys; the window's figures are added to them."""
    queued = {h["host"]: h for h in host_stats or []}
    rows = []
    for host in set(window.hosts) | set(queued):
        fig = window.hosts.get(host, Figures())
        row: dict[str, Any] = {"host": host, "queued": 0, "delay": default_delay,
                               "next_allowed_in": 0.0}
        row.update(queued.get(host, {}))
        row.update(fig.to_dict())
        row["requests_per_minute"] = window.per_minute(fig.requests)
        row["outcomes_per_minute"] = window.per_minute(fig.outcomes)
        rows.append(row)
    rows.sort(key=_worst_first)
    return rows


def trend(window: Window) -> dict[str, dict[str, Any]]:
    """Each frontier gauge: first and last sample in the window and the change."""
    out = {}
    for name in GAUGES:
        series = window.gauge_series(name)
        if series:
            out[name] = {"first": series[0][1], "last": series[-1][1],
                         "change": series[-1][1] - series[0][1], "samples": len(series)}
    return out


def alerts_firing(server: Any, key: str) -> list[dict[str, Any]]:
    """The alerts firing now (their state is in Redis), by id."""
    return [{"id": fid, "since": state.get("since"), "summary": state.get("summary")}
            for fid, state in sorted(firing_states(server, key).items())]


def spider_figures(window: Window) -> dict[str, Any]:
    spider = window.spider.to_dict()
    spider["requests_per_minute"] = window.per_minute(window.spider.requests)
    spider["outcomes_per_minute"] = window.per_minute(window.spider.outcomes)
    return spider


def report(store: MetricsStore, frontier: Frontier, window_seconds: float,
           alerts_key: str | None = None) -> dict[str, Any]:
    """Everything the monitoring view shows, as plain data (``--json``)."""
    window = store.window(window_seconds)
    return {
        "window_seconds": round(window.seconds, 1),
        "frontier": frontier.counts(),
        "trend": trend(window),
        "spider": spider_figures(window),
        "hosts": host_rows(window, frontier.host_stats(), frontier.effective_default_delay()),
        "alerts": alerts_firing(store.server, alerts_key) if alerts_key else [],
    }


def add_figures(doc: dict[str, Any], frontier: Frontier, settings: Any,
                window_seconds: float) -> bool:
    """Merge the last ``window_seconds`` of figures into a ``scrapy frontier`` snapshot.

    ``doc["per_host"]`` (every host, not cut to ``--top`` yet) gets each host's figures
    and hosts that only have figures, worst first; ``doc["monitor"]`` the spider's
    totals, the frontier's trend and the firing alerts. Nothing changes, and False is
    returned, when no worker recorded anything in the window.
    """
    store = MetricsStore.reader(
        frontier.server, frontier.spider,
        bucket_seconds=settings.getint("WEBFARM_METRICS_BUCKET", 60),
        retention=settings.getfloat("WEBFARM_METRICS_RETENTION", 7200.0),
    )
    window = store.window(window_seconds)
    if not window.hosts and not window.spider.requests and not window.gauges:
        return False
    doc["per_host"] = host_rows(window, doc["per_host"], frontier.effective_default_delay())
    _known_to_the_frontier(frontier, [row for row in doc["per_host"] if "urls" not in row])
    doc["hosts_listed"] = len(doc["per_host"])
    doc["monitor"] = {
        "window_seconds": round(window.seconds, 1),
        "spider": spider_figures(window),
        "trend": trend(window),
        "alerts": alerts_firing(store.server, frontier.key("alerts")),
    }
    return True


def _known_to_the_frontier(frontier: Frontier, rows: list[dict[str, Any]]) -> None:
    """Hosts with figures and nothing queued: their URLs and delay from the frontier, as
    a queued host's (they showed 0 URLs and this command's own default delay)."""
    if not rows:
        return
    hosts = [row["host"] for row in rows]
    urls = frontier.server.hmget(frontier.key("urls"), hosts)
    delays = frontier.server.hmget(frontier.key("delay"), hosts)
    for row, admitted, delay in zip(rows, urls, delays, strict=True):
        row["urls"] = int(admitted or 0)
        if delay:
            row["delay"] = float(delay)


def _num(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.1f}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    return f"{value:.0f}" if value == int(value) or value >= 100 else f"{value:.1f}"


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}"


def summary_lines(data: dict[str, Any]) -> list[str]:
    """The window's totals, the frontier's trend and the firing alerts, as text."""
    sp = data["spider"]
    lines = [
        f"last {data['window_seconds']:.0f}s: {_num(sp['outcomes_per_minute'])} fetches/min, "
        f"success {_pct(sp['success_rate'])}%, {sp['error_count']} errors, "
        f"{sp['items']} items, {sp['duplicates']} duplicates, {sp['dead']} dead letters",
    ]
    if data["trend"]:
        parts = [f"{name} {t['last']} ({t['change']:+d})" for name, t in data["trend"].items()]
        lines.append("trend over the window: " + ", ".join(parts))
    lines += [f"ALERT {a['id']}: {a['summary']}" for a in data["alerts"]]
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _errors(row: dict[str, Any]) -> str:
    top = next(iter(row["errors"]), None)
    return f"{row['error_count']} {top}" if top else str(row["error_count"])


#: Per-host figure columns: (header, cell, right-aligned).
FIGURE_COLUMNS: list[tuple[str, Any, bool]] = [
    ("REQ/MIN", lambda r: _num(r["requests_per_minute"]), True),
    ("OK%", lambda r: _pct(r["success_rate"]), True),
    ("2XX", lambda r: _num(r["status"]["2xx"]), True),
    ("3XX", lambda r: _num(r["status"]["3xx"]), True),
    ("4XX", lambda r: _num(r["status"]["4xx"]), True),
    ("5XX", lambda r: _num(r["status"]["5xx"]), True),
    ("ERRORS", _errors, False),
    ("LAT_MS", lambda r: _ms(r["latency_avg"]), True),
    ("MAX_MS", lambda r: _ms(r["latency_max"]), True),
    ("KB", lambda r: _num(r["bytes"] / 1024), True),
    ("BROWSER", lambda r: _num(r["browser"]), True),
    ("ITEMS", lambda r: _num(r["items"]), True),
    ("DUPES", lambda r: _num(r["duplicates"]), True),
    ("DEAD", lambda r: _num(r["dead"]), True),
]


def render(data: dict[str, Any], limit: int = DEFAULT_LIMIT) -> str:
    """The report as a readable table (at most ``limit`` hosts)."""
    lines = summary_lines(data)
    columns = [("HOST", lambda r: r["host"], False), ("QUEUED", lambda r: _num(r["queued"]),
                                                       True), *FIGURE_COLUMNS]
    table = [[h for h, _, _ in columns]]
    table += [[str(cell(row)) for _, cell, _ in columns] for row in data["hosts"][:limit]]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns))]
    for r in table:
        cells = [c.rjust(w) if right else c.ljust(w)
                 for c, w, (_, _, right) in zip(r, widths, columns, strict=True)]
        lines.append("  ".join(cells).rstrip())
    hidden = len(data["hosts"]) - limit
    if hidden > 0:
        lines.append(f"... {hidden} more hosts (--json lists every host)")
    if not data["hosts"]:
        lines.append("(no host fetched in the window, none queued)")
    return "\n".join(lines)


def watch(show: Callable[[], None], every: float, count: int = 0,
          clear: bool | None = None) -> int:
    """Call ``show`` every ``every`` seconds (at least 0.5), ``count`` times (0: until
    Ctrl-C), clearing a terminal in between. Ctrl-C ends it quietly; returns the
    number of refreshes."""
    every = max(0.5, every)
    clear = sys.stdout.isatty() if clear is None else clear
    shown = 0
    try:
        while True:
            if clear:
                sys.stdout.write("\x1b[H\x1b[2J")
            show()
            sys.stdout.flush()
            shown += 1
            if count and shown >= count:
                break
            time.sleep(every)
    except KeyboardInterrupt:
        print()
    return shown
