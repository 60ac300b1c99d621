"""When to fetch a page again: an adaptive refetch policy driven by each page's change rate.

The index calls :meth:`RefetchPolicy.fields` after every fetch of a page (a 304 counts as
a fetch that saw no change) and stores what it returns in the page's document. The rule:

1. **Estimate the page's change rate** λ from what the crawler saw, with Cho &
   Garcia-Molina's estimator for a Poisson process observed at intervals ("Estimating
   frequency of change", ACM TOIT 2003): after ``n`` checks that saw ``X`` changes over a
   mean interval ``Ī``, ``λ̂ = −ln((n − X + 0.5) / (n + 0.5)) / Ī``. It stays finite when
   every check saw a change (a plain ``X / (n·Ī)`` does not know how many changes one check
   hides). The counts live in the page as ``checks``, ``changes_seen`` and
   ``checked_seconds``, decayed by ``1 − 1/WEBFARM_REFETCH_MEMORY`` per check so a page that
   changes its habits is followed; one pseudo-check with half a change over the initial
   interval acts as a prior, so one quiet check never reads as "never changes".
   ``change_rate`` (changes per day) is stored for people to look at.
2. **Pick the interval that minimises cost**: a fetch costs as much as
   ``WEBFARM_REFETCH_COST`` seconds of one page being out of date. A page changing at
   rate λ, refetched every ``I``, is out of date a share ``1 − (1 − e^(−λI))/(λI)`` of the
   time; stale-seconds plus fetch cost per second is minimal where
   ``1 − (1 + λI)·e^(−λI) = cost·λ`` (the Lagrange condition of Cho & Garcia-Molina,
   "Synchronizing a database to improve freshness", SIGMOD 2000), i.e. about
   ``sqrt(2·cost/λ)`` for slow pages: a page changing 100 times as often gets about 10
   times the fetches, not 100 (spending in proportion to λ — where Nutch's rule settles —
   is worse than a fixed interval). A page changing faster than once per ``cost`` seconds
   is not worth chasing: its ideal is "never", so only the max bound and the rule below
   move it.
3. **Move toward it, one direction per outcome**: after a change the interval shrinks
   (to ``min(I·(1 − nudge), I*)``, no lower than ``I / step``), after no change it grows
   (to ``max(I·(1 + nudge), I*)``, no higher than ``I · step``), then it is bounded by
   ``[min, max]`` (``nudge`` 5 %, ``step`` 4). One noisy estimate never swings it far.

In ``bench/bench_refetch.py`` (10,000 simulated pages changing hourly..yearly, 180 days)
the default cost of 4 h needs 0.45x the fetches of Nutch's AdaptiveFetchSchedule at 0.91x
its staleness; along the cost curve, 0.39x the fetches at Nutch's staleness.

Bounds come from the settings ``WEBFARM_REFETCH_MIN`` / ``_MAX`` / ``_INTERVAL`` (first
interval) / ``_COST``, overridden per spider by class attributes ``refetch_min``,
``refetch_max``, ``refetch_interval``, ``refetch_cost``, and per URL by
``WEBFARM_REFETCH_RULES``: a list of ``{"pattern": REGEX, "min": …, "max": …,
"interval": …, "cost": …}`` (regex searched in the URL and in the host; the first match
wins; durations are seconds or ``"30m"``, ``"6h"``, ``"2d"``, ``"1w"``). Pricing or news
pages get a low ``max`` that way.

The arithmetic is written once, against an ``ops`` namespace (``math``-like scalars here,
numpy in ``bench/bench_refetch.py``), so the benchmark simulates this very code.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from scrapy.crawler import Crawler
from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object

DAY = 86400.0
PRIOR_CHECKS = 1.0  # one pseudo-check over the initial interval...
PRIOR_CHANGES = 0.5  # ...that saw half a change
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": DAY, "w": 7 * DAY}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([smhdw]?)\s*$", re.IGNORECASE)
R_MAX = 50.0  # change periods: "never" for the interval rule (then bounded by the max)
BISECTIONS = 40
RULE_KEYS = frozenset({"pattern", "min", "max", "interval", "cost"})


class RefetchConfigError(ValueError):
    """A refetch setting or rule is malformed; the message says which and how to fix it."""


def duration(value: Any, name: str) -> float:
    """Seconds from a number or ``"90"``, ``"30m"``, ``"6h"``, ``"2d"``, ``"1w"``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip().lstrip("+-"))
        if not match:
            raise RefetchConfigError(
                f"{name}={value!r} is not a duration; give seconds or e.g. '30m', '6h', '2d'")
        seconds = float(match.group(1)) * _UNITS[(match.group(2) or "s").lower()]
        if str(value).strip().startswith("-"):
            seconds = -seconds
    if not math.isfinite(seconds) or seconds <= 0:
        # -10 read "is not a duration; give seconds", and seconds it was
        raise RefetchConfigError(f"{name}={value!r} is not above 0; give a duration above 0 "
                                 "(seconds, or e.g. '30m', '6h', '2d')")
    return seconds


# -- the rule, once, for scalars and for numpy arrays -------------------------------------


class _ScalarOps:
    log = staticmethod(math.log)
    exp = staticmethod(math.exp)
    sqrt = staticmethod(math.sqrt)
    minimum = staticmethod(min)
    maximum = staticmethod(max)

    @staticmethod
    def where(cond: Any, a: Any, b: Any) -> Any:
        return a if cond else b


SCALAR = _ScalarOps()


def observe(checks: Any, changes: Any, seconds: Any, changed: Any, elapsed: Any,
            decay: float, ops: Any = SCALAR) -> tuple[Any, Any, Any]:
    """Fold one check (``elapsed`` seconds after the previous, ``changed`` or not) into the
    decayed counts. A check with no elapsed time (the same fetch recorded twice) adds
    nothing."""
    seen = elapsed > 0
    return (ops.where(seen, checks * decay + 1.0, checks),
            ops.where(seen, changes * decay + changed * 1.0, changes),
            ops.where(seen, seconds * decay + ops.maximum(elapsed, 0.0), seconds))


def change_rate(checks: Any, changes: Any, seconds: Any, prior_interval: Any,
                ops: Any = SCALAR) -> Any:
    """Changes per second: Cho & Garcia-Molina's estimator, with the prior pseudo-check."""
    n = checks + PRIOR_CHECKS
    x = changes + PRIOR_CHANGES
    mean_interval = (seconds + PRIOR_CHECKS * prior_interval) / n
    return -ops.log((n - x + 0.5) / (n + 0.5)) / mean_interval


def ideal_interval(rate: Any, cost: Any, ops: Any = SCALAR) -> Any:
    """The interval that minimises stale time plus fetch cost for a page changing at
    ``rate``: ``r = rate·I`` solves ``1 − (1 + r)·e^(−r) = cost·rate`` (bisection, so the
    same steps run on numpy arrays). About ``sqrt(2·cost/rate)`` for slow pages; a page
    changing faster than once per ``cost`` gets ``R_MAX`` change periods: not worth it."""
    target = ops.minimum(cost * rate, 1.0)
    lo, hi = rate * 0.0, rate * 0.0 + R_MAX
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2.0
        below = 1.0 - (1.0 + mid) * ops.exp(-mid) < target
        lo, hi = ops.where(below, mid, lo), ops.where(below, hi, mid)
    return (lo + hi) / 2.0 / rate


def next_interval(prev: Any, changed: Any, ideal: Any, lo: Any, hi: Any, step: float,
                  nudge: float, ops: Any = SCALAR) -> Any:
    """Shorter after a change, longer after none, toward ``ideal``, within ``[lo, hi]``."""
    longer = ops.minimum(ops.maximum(ideal, prev * (1.0 + nudge)), prev * step)
    shorter = ops.maximum(ops.minimum(ideal, prev * (1.0 - nudge)), prev / step)
    return ops.minimum(ops.maximum(ops.where(changed, shorter, longer), lo), hi)


# -- bounds and rules ---------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    """What governs one page's interval (seconds)."""

    min: float
    max: float
    initial: float
    cost: float

    def clip(self, interval: float) -> float:
        return min(max(interval, self.min), self.max)


@dataclass(frozen=True)
class Rule:
    """``WEBFARM_REFETCH_RULES`` entry: values that replace the spider's for matching URLs."""

    pattern: re.Pattern[str]
    values: Mapping[str, float]

    def matches(self, url: str, host: str) -> bool:
        return bool(self.pattern.search(url) or (host and self.pattern.search(host)))


def _named(spidercls: type | None, settings: BaseSettings, bound: str) -> str:
    """Where a refetch bound came from, with its value: the spider's attribute or the
    setting."""
    value = getattr(spidercls, f"refetch_{bound}", None) if spidercls is not None else None
    if value is not None:
        return f"{getattr(spidercls, 'name', '?')}.refetch_{bound}={value!r}"
    setting = f"WEBFARM_REFETCH_{bound.upper()}"
    return f"{setting}={settings.get(setting)!r}"


def parse_rules(raw: Any) -> list[Rule]:
    """Rules from a setting: a list of dicts, or the same as a JSON string (env, ``-s``)."""
    if raw is None or raw == "" or raw == []:
        return []
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise RefetchConfigError(
                f"WEBFARM_REFETCH_RULES is not JSON ({exc}); give a list like "
                '[{"pattern": "/pricing", "max": "1h"}]') from None
    if isinstance(raw, Mapping) or not isinstance(raw, Iterable):
        raise RefetchConfigError("WEBFARM_REFETCH_RULES must be a list of "
                                 '{"pattern": REGEX, "min"/"max"/"interval"/"cost": DURATION}')
    rules = []
    for i, entry in enumerate(raw):
        where = f"WEBFARM_REFETCH_RULES[{i}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("pattern"), str):
            raise RefetchConfigError(f'{where} needs a "pattern" (a regex on URL or host)')
        unknown = set(entry) - RULE_KEYS
        if unknown:
            raise RefetchConfigError(f"{where} has unknown keys {sorted(unknown)}; "
                                     f"use {sorted(RULE_KEYS)}")
        try:
            pattern = re.compile(entry["pattern"])
        except re.error as exc:
            raise RefetchConfigError(f"{where}: bad regex {entry['pattern']!r}: {exc}") from None
        values = {"initial" if k == "interval" else k: duration(v, f"{where}.{k}")
                  for k, v in entry.items() if k != "pattern"}
        rules.append(Rule(pattern, values))
    return rules


def _bounds(values: Mapping[str, float]) -> Bounds:
    hi = values["max"]
    lo = min(values["min"], hi)
    return Bounds(lo, hi, min(max(values["initial"], lo), hi), values["cost"])


def as_utc(value: Any) -> dt.datetime:
    """Epoch seconds, or a BSON date (naive UTC unless the client is ``tz_aware``), as an
    aware UTC datetime."""
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, tz=dt.timezone.utc)
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.timezone.utc)
    return value


def stored_later(doc: Mapping[str, Any] | None, field: str, at: Any) -> bool:
    """Whether ``doc``'s ``field`` (a BSON date) is later than ``at`` (epoch seconds or a
    datetime): a later fetch of a page, or extraction of an item, is stored already (a
    worker stalled past its lease; the workers' clocks decide)."""
    stored = (doc or {}).get(field)
    return isinstance(stored, dt.datetime) and as_utc(stored) > as_utc(at)


class RefetchPolicy:
    """Sets ``refetch_interval`` and ``next_fetch_at`` (and the change-rate counts) after
    each fetch; selected with ``WEBFARM_REFETCH_POLICY``."""

    def __init__(self, *, initial: float = DAY, min_interval: float = 3600.0,
                 max_interval: float = 30 * DAY, cost: float = 4 * 3600.0,
                 rules: Iterable[Rule] = (), memory: float = 30.0, step: float = 4.0,
                 nudge: float = 0.05) -> None:
        if memory < 1 or step <= 1 or not 0 <= nudge < 1:
            raise RefetchConfigError("refetch policy needs memory >= 1, step > 1, 0 <= nudge < 1")
        self.defaults = {"min": min_interval, "max": max_interval, "initial": initial,
                         "cost": cost}
        self.base = _bounds(self.defaults)
        self.rules = list(rules)
        self.decay = 1.0 - 1.0 / memory
        self.step = step
        self.nudge = nudge

    @classmethod
    def from_settings(cls, settings: BaseSettings, spidercls: type | None = None) -> RefetchPolicy:
        """The policy of one spider: settings, then the spider's ``refetch_*`` attributes."""
        def get(attr: str, setting: str, default: float) -> float:
            value = getattr(spidercls, attr, None) if spidercls is not None else None
            if value is not None:
                return duration(value, f"{getattr(spidercls, 'name', '?')}.{attr}")
            raw = settings.get(setting)
            return duration(raw, setting) if raw not in (None, "") else default

        lo = get("refetch_min", "WEBFARM_REFETCH_MIN", 3600.0)
        hi = get("refetch_max", "WEBFARM_REFETCH_MAX", 30 * DAY)
        if lo > hi:  # the bounds were swapped in silence: every page got the maximum
            raise RefetchConfigError(
                f"the refetch minimum ({_named(spidercls, settings, 'min')}) is above the "
                f"maximum ({_named(spidercls, settings, 'max')}); give a minimum no longer "
                "than the maximum")
        rules = parse_rules(getattr(spidercls, "refetch_rules", None) or
                            settings.get("WEBFARM_REFETCH_RULES"))
        memory = settings.getfloat("WEBFARM_REFETCH_MEMORY", 30.0)
        return cls(
            initial=get("refetch_interval", "WEBFARM_REFETCH_INTERVAL", DAY),
            min_interval=lo,
            max_interval=hi,
            cost=get("refetch_cost", "WEBFARM_REFETCH_COST", 4 * 3600.0),
            rules=rules, memory=memory,
        )

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RefetchPolicy:
        return cls.from_settings(crawler.settings, getattr(crawler, "spidercls", None))

    @classmethod
    def check(cls, settings: BaseSettings, spidercls: type | None = None) -> None:
        """:class:`RefetchConfigError` for a malformed refetch setting, rule or spider
        attribute, when ``WEBFARM_REFETCH_POLICY`` is this policy (or a subclass). The
        index pipeline builds it as the crawl starts, where such an error ended the crawl
        in a traceback; ``scrapy crawl`` asks here first."""
        path = settings.get("WEBFARM_REFETCH_POLICY") or ""
        try:
            policy = load_object(path) if isinstance(path, str) and path else path
        except (ImportError, NameError, ValueError) as exc:
            raise RefetchConfigError(
                f"WEBFARM_REFETCH_POLICY={path!r} does not import ({exc}); give the path "
                "of a policy class, e.g. webfarm.refetch.RefetchPolicy") from None
        if isinstance(policy, type) and issubclass(policy, cls):
            policy.from_settings(settings, spidercls)
        elif settings.get("WEBFARM_REFETCH_INTERVAL") not in (None, ""):  # FixedRefetch's
            duration(settings.get("WEBFARM_REFETCH_INTERVAL"), "WEBFARM_REFETCH_INTERVAL")

    def bounds_for(self, url: str = "", host: str = "") -> Bounds:
        for rule in self.rules:
            if rule.matches(url or "", host or ""):
                return _bounds({**self.defaults, **rule.values})
        return self.base

    def advance(self, prev: Any, changed: Any, elapsed: Any, checks: Any, changes: Any,
                seconds: Any, lo: Any, hi: Any, initial: Any, cost: Any,
                ops: Any = SCALAR) -> tuple[Any, Any, Any, Any]:
        """One fetch's step of the rule: new interval and counts. Works on scalars and,
        with ``ops=numpy``, on arrays of pages (the benchmark's simulation)."""
        checks, changes, seconds = observe(checks, changes, seconds, changed, elapsed,
                                           self.decay, ops)
        rate = change_rate(checks, changes, seconds, initial, ops)
        moved = next_interval(prev, changed, ideal_interval(rate, cost, ops), lo, hi,
                              self.step, self.nudge, ops)
        return ops.where(elapsed > 0, moved, prev), checks, changes, seconds

    def fields(self, before: Mapping[str, Any] | None, changed: bool,
               fetched_at: dt.datetime | float, *, url: str | None = None,
               host: str | None = None) -> dict[str, Any]:
        """``$set`` fields of a page after a fetch at ``fetched_at``. ``before`` is the
        stored page before this fetch (None for a new page); ``changed`` whether the
        content differs from it (a 304 is unchanged)."""
        doc = before or {}
        bounds = self.bounds_for(url or doc.get("url") or "", host or doc.get("host") or "")
        fetched = as_utc(fetched_at)
        prev, last = doc.get("refetch_interval"), doc.get("fetched_at")
        checks = float(doc.get("checks") or 0.0)
        changes = float(doc.get("changes_seen") or 0.0)
        seconds = float(doc.get("checked_seconds") or 0.0)
        if not before or last is None or not prev or prev <= 0:
            interval = bounds.initial
        else:
            elapsed = (fetched - as_utc(last)).total_seconds()
            interval, checks, changes, seconds = self.advance(
                bounds.clip(float(prev)), bool(changed), elapsed, checks, changes, seconds,
                bounds.min, bounds.max, bounds.initial, bounds.cost)
        rate = change_rate(checks, changes, seconds, bounds.initial)
        return {
            "refetch_interval": interval,
            "next_fetch_at": fetched + dt.timedelta(seconds=interval),
            "checks": checks,
            "changes_seen": changes,
            "checked_seconds": seconds,
            "change_rate": rate * DAY,
        }
