"""The per-host figures of ``scrapy frontier``: worst hosts first, as text or JSON."""

from __future__ import annotations

import json
from typing import Any

from webfarm.frontier import Frontier
from webfarm.monitor.metrics import GAUGES, Figures, MetricsStore, Window

DEFAULT_LIMIT = 50  # rows of the text table (JSON has every host)


def _worst_first(row: dict[str, Any]) -> tuple:
    rate = row["success_rate"]
    # Hosts with fetches that ended come first, lowest success and most errors first;
    # hosts that only wait in the queue follow, deepest queue first.
    if rate is None:
        return (1, 0.0, 0, -row["queued"], row["host"])
    return (0, rate, -row["error_count"], -row["queued"], row["host"])


def host_rows(window: Window, host_stats: list[dict] | None = None) -> list[dict[str, Any]]:
    """One row per host seen in the window or waiting in the queue, worst first."""
    queued = {h["host"]: h for h in host_stats or []}
    rows = []
    for host in set(window.hosts) | set(queued):
        fig = window.hosts.get(host, Figures())
        row: dict[str, Any] = {"host": host, **fig.to_dict()}
        q = queued.get(host, {})
        row["queued"] = q.get("queued", 0)
        row["delay"] = q.get("delay")
        row["next_allowed_in"] = q.get("next_allowed_in")
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


def report(store: MetricsStore, frontier: Frontier, window_seconds: float,
           alerts_key: str | None = None) -> dict[str, Any]:
    """Everything ``scrapy frontier`` shows about monitoring, as plain data."""
    window = store.window(window_seconds)
    counts = frontier.counts()
    spider = window.spider.to_dict()
    spider["requests_per_minute"] = window.per_minute(window.spider.requests)
    spider["outcomes_per_minute"] = window.per_minute(window.spider.outcomes)
    firing = []
    if alerts_key:
        for key, value in store.server.hgetall(alerts_key).items():
            try:
                state = json.loads(value)
            except ValueError:
                continue
            if state.get("status") == "firing":
                firing.append({"id": key.decode(), "since": state.get("since"),
                               "summary": state.get("summary")})
    return {
        "window_seconds": round(window.seconds, 1),
        "frontier": counts,
        "trend": trend(window),
        "spider": spider,
        "hosts": host_rows(window, frontier.host_stats()),
        "alerts": sorted(firing, key=lambda a: a["id"]),
    }


def _num(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.1f}M"
    if value >= 1e4:
        return f"{value / 1e3:.0f}k"
    return f"{value:.0f}" if value == int(value) else f"{value:.1f}"


def _pct(rate: float | None) -> str:
    return "-" if rate is None else f"{rate * 100:.1f}"


def render(data: dict[str, Any], limit: int = DEFAULT_LIMIT) -> str:
    """The report as a readable table (at most ``limit`` hosts)."""
    sp = data["spider"]
    lines = [
        f"last {data['window_seconds']:.0f}s: {_num(sp['outcomes_per_minute'])} fetches/min, "
        f"success {_pct(sp['success_rate'])}%, {sp['error_count']} errors, "
        f"{sp['items']} items, {sp['duplicates']} duplicates, {sp['dead']} dead letters",
    ]
    trend = data["trend"]
    if trend:
        parts = [f"{name} {t['last']} ({t['change']:+d})" for name, t in trend.items()]
        lines.append("trend over the window: " + ", ".join(parts))
    for alert in data["alerts"]:
        lines.append(f"ALERT {alert['id']}: {alert['summary']}")
    header = ("HOST", "QUEUED", "REQ/MIN", "OK%", "2XX", "3XX", "4XX", "5XX", "ERRORS",
              "LAT ms", "MAX ms", "KB", "BROWSER", "ITEMS", "DUPES", "DEAD")
    table = [header]
    for row in data["hosts"][:limit]:
        errors = row["error_count"]
        top = next(iter(row["errors"]), None)
        lat, mx = row["latency_avg"], row["latency_max"]
        table.append((
            row["host"], _num(row["queued"]), _num(row["requests_per_minute"]),
            _pct(row["success_rate"]),
            *(_num(row["status"][c]) for c in ("2xx", "3xx", "4xx", "5xx")),
            f"{errors} {top}" if top else str(errors),
            "-" if lat is None else f"{lat * 1000:.0f}",
            "-" if mx is None else f"{mx * 1000:.0f}",
            _num(row["bytes"] / 1024), _num(row["browser"]), _num(row["items"]),
            _num(row["duplicates"]), _num(row["dead"]),
        ))
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header))]
    for r in table:
        cells = [str(c).ljust(w) if i in (0, 8) else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    hidden = len(data["hosts"]) - limit
    if hidden > 0:
        lines.append(f"... {hidden} more hosts (--json lists every host)")
    if not data["hosts"]:
        lines.append("(no host fetched in the window, none queued)")
    return "\n".join(lines)
