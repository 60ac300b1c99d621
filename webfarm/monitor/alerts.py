"""Alert rules over the shared figures, evaluated by one worker at a time.

Each tick (``WEBFARM_MONITOR_INTERVAL``) every worker tries to take or renew a
Redis lock (``SET NX PX``, renewed by its holder; it expires if the holder dies,
and another worker takes over). The holder samples the frontier's counts into
the current bucket (so trends can be read), counts new dead letters per host,
and runs the rules:

* ``success_rate`` (per host): over the last ``WEBFARM_ALERT_SUCCESS_WINDOW`` the
  host's success rate (2xx/3xx over all outcomes) is below
  ``WEBFARM_ALERT_SUCCESS_RATE`` and below ``WEBFARM_ALERT_SUCCESS_DROP`` x the
  window before (when that one had enough fetches), with at least
  ``WEBFARM_ALERT_MIN_REQUESTS`` outcomes. Recovers when the rate is back above
  ``WEBFARM_ALERT_SUCCESS_RECOVER`` — usually a layout change or a new block, caught
  early.
* ``queue_growth``: queued entries grew by ``WEBFARM_ALERT_QUEUE_GROWTH`` (a
  fraction) and at least ``WEBFARM_ALERT_QUEUE_MIN`` over
  ``WEBFARM_ALERT_QUEUE_WINDOW`` while throughput did not grow: workers cannot
  keep up. Recovers when the queue stops growing.
* ``dead_letters``: at least ``WEBFARM_ALERT_DEAD_LETTERS`` new dead letters
  within ``WEBFARM_ALERT_DEAD_WINDOW``. Recovers when none arrive in a window.
* ``no_progress``: work is queued, delayed or leased but no fetch ended for
  ``WEBFARM_ALERT_STALL_SECONDS``. Recovers when fetches end again or the work is gone.
  Delayed work counts: with every proxy retired, or every host down and its pages
  waiting out their retries, the work sits there and nothing was said.

Alert state lives in Redis (``webfarm:{SPIDER}:alerts``), so whichever worker holds
the lock knows what was announced: a firing alert is logged at ERROR and POSTed to
``WEBFARM_ALERT_WEBHOOK`` at most once per ``WEBFARM_ALERT_COOLDOWN``, and its
recovery is announced once (``"status": "resolved"``). Everything here runs in a
thread, never on the reactor; the webhook has a bounded timeout.
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from scrapy.settings import BaseSettings

from webfarm.frontier import Frontier
from webfarm.monitor.metrics import SPIDER_HOST, MetricsStore
from webfarm.monitor.notify import Notifier

logger = logging.getLogger(__name__)

_LOCK_SCRIPT = """
local v = redis.call('GET', KEYS[1])
if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
if v == ARGV[1] then redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1 end
return 0
"""
_UNLOCK_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
DLQ_SCAN_MAX = 1000  # dead letters read per tick at most


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate * 100:.0f}%"


@dataclass(frozen=True)
class Rules:
    enabled: bool = True
    success_window: float = 300.0
    success_rate: float = 0.5
    success_drop: float = 0.5
    success_recover: float = 0.8
    min_requests: int = 20
    queue_window: float = 900.0
    queue_growth: float = 0.2
    queue_min: int = 1000
    dead_window: float = 600.0
    dead_letters: int = 50
    stall_seconds: float = 300.0
    cooldown: float = 1800.0

    @classmethod
    def from_settings(cls, s: BaseSettings) -> Rules:
        return cls(
            enabled=s.getbool("WEBFARM_ALERTS", True),
            success_window=s.getfloat("WEBFARM_ALERT_SUCCESS_WINDOW", 300.0),
            success_rate=s.getfloat("WEBFARM_ALERT_SUCCESS_RATE", 0.5),
            success_drop=s.getfloat("WEBFARM_ALERT_SUCCESS_DROP", 0.5),
            success_recover=s.getfloat("WEBFARM_ALERT_SUCCESS_RECOVER", 0.8),
            min_requests=s.getint("WEBFARM_ALERT_MIN_REQUESTS", 20),
            queue_window=s.getfloat("WEBFARM_ALERT_QUEUE_WINDOW", 900.0),
            queue_growth=s.getfloat("WEBFARM_ALERT_QUEUE_GROWTH", 0.2),
            queue_min=s.getint("WEBFARM_ALERT_QUEUE_MIN", 1000),
            dead_window=s.getfloat("WEBFARM_ALERT_DEAD_WINDOW", 600.0),
            dead_letters=s.getint("WEBFARM_ALERT_DEAD_LETTERS", 50),
            stall_seconds=s.getfloat("WEBFARM_ALERT_STALL_SECONDS", 300.0),
            cooldown=s.getfloat("WEBFARM_ALERT_COOLDOWN", 1800.0),
        )


@dataclass
class Finding:
    """One rule's verdict: ``firing`` True/False, or None when there is too little data."""

    id: str
    alert: str
    firing: bool | None
    summary: str
    host: str | None = None
    value: float | None = None
    threshold: float | None = None
    window: float | None = None
    details: dict[str, Any] | None = None


class Evaluator:
    """Samples the frontier and runs the rules; only the lock holder does anything."""

    def __init__(self, store: MetricsStore, frontier: Frontier, worker: str, rules: Rules,
                 notifier: Notifier, lock_seconds: float = 45.0) -> None:
        self.store = store
        self.server = store.server
        self.frontier = frontier
        self.worker = worker
        self.rules = rules
        self.notifier = notifier
        self.lock_ms = max(1000, round(lock_seconds * 1000))
        self.lock_key = frontier.key("monitor:lock")
        self.state_key = frontier.key("alerts")
        self.dlq_cursor_key = frontier.key("m:dlq")
        self._lock = self.server.register_script(_LOCK_SCRIPT)
        self._unlock = self.server.register_script(_UNLOCK_SCRIPT)
        self.holding_since: float | None = None

    def holds_lock(self) -> bool:
        """Take the lock, or renew it if ours."""
        held = bool(self._lock(keys=[self.lock_key], args=[self.worker, self.lock_ms]))
        if held and self.holding_since is None:
            self.holding_since = self.store.now()
            logger.info("Monitoring: this worker samples the frontier%s",
                        " and evaluates the alert rules" if self.rules.enabled
                        else " (WEBFARM_ALERTS is off: no alert rules)")
        elif not held:
            self.holding_since = None
        return held

    def release(self) -> None:
        try:
            self._unlock(keys=[self.lock_key], args=[self.worker])
        except Exception as exc:  # closing: the lock expires by itself anyway
            logger.debug("Monitoring: lock not released: %s", exc)
        self.holding_since = None

    def tick(self) -> list[Finding]:
        if not self.holds_lock():
            return []
        counts = self.frontier.counts()
        self.store.write({}, gauges={k: counts[k] for k in
                                     ("queued", "ready_hosts", "delayed", "leased", "dead")})
        self.scan_dead_letters()
        if not self.rules.enabled:
            return []
        findings = self.evaluate(counts)
        self.apply(findings)
        return findings

    # -- dead letters per host --------------------------------------------------------------

    def scan_dead_letters(self) -> int:
        """Count dead letters newer than the last scan per host, in the bucket of their
        time (letters are appended with their time; the cursor is that time)."""
        raw_cursor = self.server.get(self.dlq_cursor_key)
        dead_key = self.frontier.key("dead")
        if raw_cursor is None:  # first scan: what is there already is history
            tail = self.server.lrange(dead_key, -1, -1)
            start = _letter_time(tail[0]) if tail else 0.0
            self.server.set(self.dlq_cursor_key, repr(max(start or 0.0, 0.0)))
            return 0
        cursor = float(raw_cursor)
        new: list[dict] = []
        seen: set[bytes] = set()
        read = 0
        while read < DLQ_SCAN_MAX:
            batch = self.server.lrange(dead_key, -(read + 100), -(read + 1))
            stop = False
            for raw in reversed(batch):
                letter = _letter(raw)
                when = letter.get("last") if letter else None
                if not isinstance(when, (int, float)) or when <= cursor:
                    stop = True
                    break
                if raw not in seen:
                    seen.add(raw)
                    new.append(letter)
            read += len(batch)
            if stop or len(batch) < 100:
                break
        if not new:
            return 0
        per: dict[tuple[int, str], float] = defaultdict(float)
        for letter in new:
            bucket = self.store.bucket_of(float(letter["last"]))
            host = letter.get("host") if isinstance(letter.get("host"), str) else "unknown"
            per[(bucket, f"{host}|dead")] += 1
            per[(bucket, f"{SPIDER_HOST}|dead")] += 1
        self.store.write(per)
        self.server.set(self.dlq_cursor_key, repr(max(float(x["last"]) for x in new)))
        return len(new)

    # -- the rules --------------------------------------------------------------------------

    def evaluate(self, counts: dict[str, int]) -> list[Finding]:
        r = self.rules
        now = self.store.now()
        findings = self.success_rates(now)
        findings.append(self.queue_growth(now))
        dead = self.store.window(r.dead_window, end=now).spider.dead
        findings.append(Finding(
            "dead_letters", "dead_letters",
            True if dead >= r.dead_letters else (False if dead == 0 else None),
            f"{dead} new dead letters in the last {r.dead_window:.0f}s "
            f"(threshold {r.dead_letters}); {counts['dead']} in the queue",
            value=dead, threshold=r.dead_letters, window=r.dead_window,
            details={"dead_total": counts["dead"]},
        ))
        findings.append(self.no_progress(now, counts))
        return findings

    def success_rates(self, now: float) -> list[Finding]:
        r = self.rules
        cur = self.store.window(r.success_window, end=now)
        prev = self.store.window(r.success_window, back=1, end=now)
        firing_hosts = {i.split(":", 1)[1] for i in self._states() if i.startswith("success_rate:")}
        out = []
        for host in sorted(set(cur.hosts) | firing_hosts):
            fig = cur.hosts.get(host)
            rate = fig.success_rate if fig and fig.outcomes >= r.min_requests else None
            before = prev.hosts.get(host)
            prate = before.success_rate if before and before.outcomes >= r.min_requests else None
            if rate is None:
                firing = None
            elif rate < r.success_rate and (prate is None or rate < r.success_drop * prate
                                            or host in firing_hosts):
                # Firing, it stays so while the host is below the threshold: at 0 % in both
                # windows there is no drop to see, and an alert whose POST had failed was
                # never delivered, nor said again after the cooldown.
                firing = True
            else:  # recovered only well above the threshold, so a borderline host won't flap
                firing = False if rate >= max(r.success_recover, r.success_rate) else None
            if firing is None and host not in firing_hosts:
                continue
            top = sorted((fig.errors if fig else {}).items(), key=lambda kv: -kv[1])[:3]
            out.append(Finding(
                f"success_rate:{host}", "success_rate", firing,
                f"{host}: success rate {_pct(rate)} over the last {r.success_window:.0f}s "
                f"({fig.outcomes if fig else 0} fetches), {_pct(prate)} the window before",
                host=host, value=rate, threshold=r.success_rate, window=r.success_window,
                details={"outcomes": fig.outcomes if fig else 0,
                         "status": dict(fig.status) if fig else {}, "errors": dict(top),
                         "previous_rate": prate},
            ))
        return out

    def queue_growth(self, now: float) -> Finding:
        r = self.rules
        cur = self.store.window(r.queue_window, end=now)
        series = cur.gauge_series("queued")
        fid = "queue_growth"
        if len(series) < 2 or series[-1][0] - series[0][0] < r.queue_window / 2:
            return Finding(fid, fid, None, "not enough queue samples yet")
        first, last = series[0][1], series[-1][1]
        growth = last - first
        prev = self.store.window(r.queue_window, back=1, end=now)
        tp_now = cur.spider.outcomes / cur.seconds
        tp_before = prev.spider.outcomes / prev.seconds
        firing: bool | None = None
        if (growth >= r.queue_min and last >= first * (1 + r.queue_growth)
                and tp_now <= tp_before * 1.1):
            firing = True
        elif growth < r.queue_min / 2 or last < first * (1 + r.queue_growth / 2):
            # well under either threshold: a crawl that finds links a little faster than it
            # fetches them grows for ever, and the alert (resolved only at <= 0) never ended
            firing = False
        return Finding(
            fid, fid, firing,
            f"queue grew from {first} to {last} in {r.queue_window:.0f}s while throughput "
            f"went from {tp_before * 60:.1f} to {tp_now * 60:.1f} fetches/min",
            value=growth, threshold=r.queue_min, window=r.queue_window,
            details={"queued_first": first, "queued_last": last,
                     "per_minute_now": tp_now * 60, "per_minute_before": tp_before * 60},
        )

    def no_progress(self, now: float, counts: dict[str, int]) -> Finding:
        r = self.rules
        b = self.store.bucket_seconds
        start = now - r.stall_seconds
        win = self.store.read(range(self.store.bucket_of(start), self.store.bucket_of(now) + 1, b),
                              start, now)
        work = counts["queued"] + counts["leased"] + counts["delayed"]
        watched = now - (self.holding_since or now)
        ended = win.spider.outcomes
        firing: bool | None
        if ended > 0 or work == 0:
            firing = False
        elif watched >= r.stall_seconds:
            firing = True
        else:
            firing = None
        return Finding(
            "no_progress", "no_progress", firing,
            f"no fetch ended in the last {r.stall_seconds:.0f}s with {counts['queued']} queued, "
            f"{counts['delayed']} delayed and {counts['leased']} leased" if firing else
            f"{ended} fetches ended in the last {r.stall_seconds:.0f}s; "
            f"{counts['queued']} queued, {counts['delayed']} delayed, {counts['leased']} leased",
            value=ended, threshold=0, window=r.stall_seconds,
            details={"queued": counts["queued"], "leased": counts["leased"],
                     "delayed": counts["delayed"]},
        )

    # -- state, cooldown, notifications ------------------------------------------------------

    def _states(self) -> dict[str, dict]:
        return firing_states(self.server, self.state_key)

    def apply(self, findings: list[Finding]) -> None:
        now = self.store.now()
        ids = [f.id for f in findings]
        raw = self.server.hmget(self.state_key, ids) if ids else []
        renewed = time.monotonic()
        for finding, value in zip(findings, raw, strict=True):
            if self.notifier.url and time.monotonic() - renewed > 1.0:
                # Slow POSTs (each up to the webhook's timeout) let the lock lapse mid-check:
                # another worker took it and announced too, 14 s apart. Renewed as it goes.
                if not self.holds_lock():
                    logger.info("Monitoring: the lock passed to another worker during this "
                                "check (a slow webhook?); it evaluates from here")
                    return
                renewed = time.monotonic()
            state = json.loads(value) if value else {}
            firing_before = state.get("status") == "firing"
            if finding.firing is True:
                since = state["since"] if firing_before else now
                last = float(state.get("notified_at") or 0)
                if now - last >= self.rules.cooldown:
                    sent = self.notifier.send(self.notifier.payload(finding, "firing", since,
                                                                    now))
                    state.update(notified_at=now, notified=True, undelivered=not sent)
                elif state.get("undelivered"):  # the webhook failed: posted again, not logged
                    sent = self.notifier.post(self.notifier.payload(finding, "firing", since,
                                                                    now))
                    # the cooldown runs from when the receiver heard it, not the failed try
                    state.update(undelivered=not sent, **({"notified_at": now} if sent else {}))
                elif not firing_before:
                    logger.info("Alert %s fires again within the cooldown: not repeated (%s)",
                                finding.id, finding.summary)
                    state["notified"] = False
                state.update(status="firing", since=since, summary=finding.summary)
            elif finding.firing is None and firing_before and state.get("undelivered"):
                # The rule cannot tell now (a host at 0 % in both windows shows no drop), and
                # the receiver never heard of the alert: it stayed silent while it fired.
                sent = self.notifier.post(self.notifier.payload(
                    replace(finding, summary=state.get("summary") or finding.summary),
                    "firing", state["since"], now))
                state.update(undelivered=not sent, **({"notified_at": now} if sent else {}))
            elif finding.firing is False and firing_before:
                resolved = self.notifier.payload(finding, "resolved", state["since"], now)
                if state.get("resolving"):  # said; the webhook failed: posted again
                    if not self.notifier.post(resolved):
                        continue
                elif state.get("notified") and not self.notifier.send(resolved):
                    # Firing it stays, so the receiver hears of the end at a later check.
                    state["resolving"] = True
                    self.server.hset(self.state_key, finding.id, json.dumps(state))
                    continue
                state.pop("resolving", None)
                state.update(status="resolved", resolved_at=now, summary=finding.summary)
            else:
                continue
            self.server.hset(self.state_key, finding.id, json.dumps(state))

    def firing(self) -> dict[str, dict]:
        """Alerts firing now, by id (for ``scrapy frontier`` and Prometheus)."""
        return self._states()


def firing_states(server: Any, key: str) -> dict[str, dict]:
    """The state of each alert firing now, by id (``webfarm:{SPIDER}:alerts``)."""
    out = {}
    for k, v in server.hgetall(key).items():
        state = _letter(v)
        if state is not None and state.get("status") == "firing":
            out[k.decode()] = state
    return out


def resolve_all(frontier: Frontier, notifier: Notifier, why: str) -> int:
    """Announce the end of every alert firing in ``frontier`` (before a reset deletes their
    state: a receiver never heard they ended); how many."""
    now = time.time()
    firing = firing_states(frontier.server, frontier.key("alerts"))
    for fid, state in firing.items():
        alert, _, host = fid.partition(":")
        finding = Finding(fid, alert, False, f"{state.get('summary', '')} ({why})",
                          host=host or None)
        if state.get("notified"):
            notifier.send(notifier.payload(finding, "resolved", float(state.get("since") or
                                                                        now), now))
    return len(firing)


def _letter(raw: bytes) -> dict | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _letter_time(raw: bytes) -> float:
    letter = _letter(raw)
    when = letter.get("last") if letter else None
    return float(when) if isinstance(when, (int, float)) else time.time()
