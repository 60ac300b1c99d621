"""Refetch policies on a simulated corpus: fetches per page per day against staleness.

A synthetic corpus (default 10,000 pages) whose pages change as Poisson processes with
rates log-uniform from once an hour to once a year, simulated over 180 days. Every
policy sees the same corpus and the same bounds (min 1 h, max 30 d, first interval 1 d):

* ``fixed``: one interval for every page (a cron recrawl);
* ``nutch``: Apache Nutch's AdaptiveFetchSchedule with the shipped defaults of
  ``conf/nutch-default.xml`` (``db.fetch.schedule.adaptive.inc_rate`` 0.4, ``dec_rate``
  0.2): changed → interval × 0.8, unchanged → × 1.4, bounded (its ``sync_delta`` needs
  server modification times, which a content-hash crawler does not have; left out);
* ``stormcrawler``: StormCrawler's AdaptiveScheduler (defaults ``rate.decr`` 0.5,
  ``rate.incr`` 0.5): changed → interval moves halfway to the minimum
  (``(1 − 0.5)·I + 0.5·min``), unchanged → × 1.5, bounded by the maximum;
* ``webfarm``: :class:`webfarm.refetch.RefetchPolicy` — its own ``advance`` method run on
  numpy arrays, not a copy of the rule.

Staleness is the share of time a page's stored copy is out of date (changed at the
source since it was fetched), averaged over pages and time; age is how long, on average,
the stored copy has been out of date (0 while fresh). Poisson changes are memoryless, so
each refetch interval draws the time to the next change afresh. Prints one line per
policy, ratios against Nutch, and the curve of webfarm's cost setting and of the fixed
interval, so the comparison also holds at matched fetch budgets.

    python bench/bench_refetch.py [--pages N] [--days D] [--seed S] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from webfarm.refetch import DAY, RefetchPolicy  # noqa: E402

HOUR = 3600.0
MIN_I, MAX_I, FIRST_I = HOUR, 30 * DAY, DAY


@dataclass
class Result:
    name: str
    fetches_per_page_day: float
    staleness: float  # share of page-time out of date
    age_hours: float  # mean time out of date, over page-time
    seconds: float  # wall time of the simulation


Step = Callable[[np.ndarray, np.ndarray, np.ndarray, dict], np.ndarray]


def simulate(name: str, rates: np.ndarray, days: float, step: Step, seed: int) -> Result:
    """Run one policy over the corpus. ``step(idx, interval, changed, state)`` returns the
    next intervals of pages ``idx`` after a fetch that saw ``changed``."""
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    n = len(rates)
    horizon = days * DAY
    t = rng.uniform(0, DAY, n)  # first fetch of each page during the first day
    observed = horizon - t
    interval = np.full(n, FIRST_I)
    stale = np.zeros(n)
    age = np.zeros(n)
    fetches = np.ones(n)
    state: dict = {}
    active = np.arange(n)
    while active.size:
        i = active
        gap = interval[i]
        nxt = t[i] + gap
        first_change = t[i] + rng.exponential(1.0 / rates[i])
        end = np.minimum(nxt, horizon)
        late = np.maximum(end - first_change, 0.0)
        stale[i] += late
        age[i] += late * late / 2.0
        due = nxt <= horizon
        i, changed = i[due], (first_change < nxt)[due]
        fetches[i] += 1
        t[i] = nxt[due]
        interval[i] = step(i, interval[i], changed, state)
        active = i
    total = observed.sum()
    return Result(name, fetches.sum() / (total / DAY), stale.sum() / total,
                  age.sum() / total / HOUR, time.perf_counter() - started)


def fixed(every: float) -> Step:
    def step(i, interval, changed, state):
        return np.full(len(i), every)
    return step


def nutch(inc: float = 0.4, dec: float = 0.2) -> Step:
    def step(i, interval, changed, state):
        return np.clip(np.where(changed, interval * (1 - dec), interval * (1 + inc)),
                       MIN_I, MAX_I)
    return step


def stormcrawler(inc: float = 0.5, dec: float = 0.5) -> Step:
    def step(i, interval, changed, state):
        shrunk = (1 - dec) * interval + dec * MIN_I
        return np.clip(np.where(changed, shrunk, interval * (1 + inc)), MIN_I, MAX_I)
    return step


def webfarm(cost: float, n: int) -> Step:
    policy = RefetchPolicy(initial=FIRST_I, min_interval=MIN_I, max_interval=MAX_I, cost=cost)
    checks, changes, seconds = np.zeros(n), np.zeros(n), np.zeros(n)

    def step(i, interval, changed, state):
        nxt, checks[i], changes[i], seconds[i] = policy.advance(
            interval, changed, interval, checks[i], changes[i], seconds[i],
            MIN_I, MAX_I, FIRST_I, cost, ops=np)
        return nxt
    return step


def corpus(pages: int, seed: int) -> np.ndarray:
    """Change rates (per second), log-uniform from hourly to yearly."""
    rng = np.random.default_rng(seed)
    return np.exp(rng.uniform(np.log(1 / (365 * DAY)), np.log(1 / HOUR), pages))


def line(r: Result, ref: Result | None = None) -> str:
    text = (f"{r.name:<22} {r.fetches_per_page_day:8.3f} {100 * r.staleness:9.2f} %"
            f" {r.age_hours:9.2f}")
    if ref is not None:
        text += (f"   x{r.fetches_per_page_day / ref.fetches_per_page_day:5.2f}"
                 f"   x{r.staleness / ref.staleness:5.2f}")
    return text


def matched(curve: list[Result], base: Result) -> tuple[float, float]:
    """On a policy's curve (log-interpolated): its fetches at the baseline's staleness, and
    its staleness at the baseline's fetches, as ratios to the baseline."""
    by_fetch = sorted(curve, key=lambda r: r.fetches_per_page_day)
    f = np.log([r.fetches_per_page_day for r in by_fetch])
    st = np.array([r.staleness for r in by_fetch])
    stale_at = float(np.interp(np.log(base.fetches_per_page_day), f, st))
    order = np.argsort(st)
    fetch_at = float(np.exp(np.interp(base.staleness, st[order], f[order])))
    return fetch_at / base.fetches_per_page_day, stale_at / base.staleness


def median_of(runs: list[Result]) -> Result:
    mid = sorted(runs, key=lambda r: r.staleness)[len(runs) // 2]
    return Result(mid.name, float(np.median([r.fetches_per_page_day for r in runs])),
                  float(np.median([r.staleness for r in runs])),
                  float(np.median([r.age_hours for r in runs])), sum(r.seconds for r in runs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=10_000)
    parser.add_argument("--days", type=float, default=180.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=3, help="corpora; medians are printed")
    parser.add_argument("--quick", action="store_true", help="2,000 pages, 90 days, once")
    args, _ = parser.parse_known_args(argv)
    if args.quick:
        args.pages, args.days, args.repeat = 2_000, 90.0, 1
    default_cost = RefetchPolicy().defaults["cost"]
    policies: list[tuple[str, Callable[[], Step]]] = [
        ("fixed 1 d", lambda: fixed(DAY)),
        ("nutch (0.8x / 1.4x)", nutch),
        ("stormcrawler", stormcrawler),
        (f"webfarm (cost {default_cost / HOUR:g} h)", lambda: webfarm(default_cost, args.pages)),
    ]
    print(f"corpus: {args.pages} pages, change rates log-uniform hourly..yearly, "
          f"{args.days:g} days, median of {args.repeat} corpora; "
          f"bounds min 1 h, max 30 d, first interval 1 d")
    runs: dict[str, list[Result]] = {name: [] for name, _ in policies}
    for k in range(args.repeat):
        rates = corpus(args.pages, args.seed + 100 * k)
        for name, make in policies:
            runs[name].append(simulate(name, rates, args.days, make(), args.seed + 100 * k + 1))
    rows = [median_of(runs[name]) for name, _ in policies]
    base = rows[1]
    print(f"{'policy':<22} {'fetch/pg/d':>8} {'staleness':>11} {'age (h)':>9}"
          "   fetches  staleness (vs nutch)")
    for r in rows:
        print(line(r, base))

    # The curves, on the first corpus: every budget of webfarm's cost and of a fixed interval.
    rates = corpus(args.pages, args.seed)
    sim_seed = args.seed + 1
    base = runs[policies[1][0]][0]
    print(f"\ncurves on the first corpus (nutch there: {base.fetches_per_page_day:.3f} fetches, "
          f"{100 * base.staleness:.2f} % stale):")
    curves: dict[str, list[Result]] = {"webfarm": [], "fixed": []}
    for cost_h in (0.25, 0.5, 1, 2, 4, 8, 16, 32):
        curves["webfarm"].append(simulate(f"webfarm cost {cost_h:g} h", rates, args.days,
                                          webfarm(cost_h * HOUR, args.pages), sim_seed))
        print(line(curves["webfarm"][-1], base))
    for every_h in (3, 6, 12, 24, 48, 96):
        curves["fixed"].append(simulate(f"fixed {every_h:g} h", rates, args.days,
                                        fixed(every_h * HOUR), sim_seed))
        print(line(curves["fixed"][-1], base))
    print()
    for name, curve in curves.items():
        fetch_ratio, stale_ratio = matched(curve, base)
        print(f"{name:<8} at Nutch's staleness: x{fetch_ratio:.2f} of its fetches; "
              f"at Nutch's fetch budget: x{stale_ratio:.2f} of its staleness")
    return 0


if __name__ == "__main__":
    sys.exit(main())
