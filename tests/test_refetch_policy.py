"""The refetch policy on its own: intervals move the right way, bounds and rules hold,
the change-rate estimate is right, bad settings get one clear line."""

from __future__ import annotations

import datetime as dt
import math
import random

import numpy as np
import pytest
from scrapy.settings import Settings

from webfarm.refetch import (
    DAY,
    RefetchConfigError,
    RefetchPolicy,
    change_rate,
    duration,
    ideal_interval,
    parse_rules,
)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
URL = "http://shop.example/product/1"


def run(policy, outcomes, url=URL, start=T0):
    """Fetch a page once, then once per outcome when it is due; the intervals after each."""
    doc = {"url": url, "host": "shop.example", "fetched_at": start,
           **policy.fields(None, False, start, url=url, host="shop.example")}
    intervals = [doc["refetch_interval"]]
    for changed in outcomes:
        now = doc["next_fetch_at"]
        doc.update(policy.fields(doc, changed, now), fetched_at=now)
        intervals.append(doc["refetch_interval"])
    return intervals, doc


def test_new_page_gets_the_first_interval():
    policy = RefetchPolicy(initial=DAY)
    fields = policy.fields(None, False, T0, url=URL)
    assert fields["refetch_interval"] == DAY
    assert fields["next_fetch_at"] == T0 + dt.timedelta(days=1)
    assert fields["checks"] == 0 and fields["changes_seen"] == 0


def test_shorter_after_a_change_longer_after_none_within_bounds():
    policy = RefetchPolicy(initial=DAY, min_interval=3600, max_interval=7 * DAY)
    churning, doc = run(policy, [True] * 60)
    assert all(b < a for a, b in zip(churning, churning[1:], strict=False) if a > 3600)
    assert churning[-1] == 3600  # the minimum, never below
    assert doc["change_rate"] > 1 and doc["changes_seen"] > 10

    static, doc = run(policy, [False] * 30)
    assert all(b > a for a, b in zip(static, static[1:], strict=False) if a < 7 * DAY)
    assert static[-1] == 7 * DAY  # the maximum, never above
    assert doc["change_rate"] < 0.2

    # One surprise moves a settled page one step, not back to the start.
    settled, _ = run(policy, [False] * 30 + [True])
    assert 3 * DAY < settled[-1] < settled[-2]


def test_interval_tracks_the_change_rate():
    """Pages changing daily vs weekly (Poisson), checked when due: the estimated rate is
    close to the truth and the daily page gets the shorter interval."""
    rng = random.Random(3)
    policy = RefetchPolicy(initial=DAY, min_interval=600, max_interval=60 * DAY,
                           cost=3600, memory=1000)
    result = {}
    for days_per_change in (1, 7):
        rate = 1 / (days_per_change * DAY)
        doc = {"url": URL, "fetched_at": T0, **policy.fields(None, False, T0)}
        for _ in range(300):
            gap = doc["refetch_interval"]
            changed = rng.random() < 1 - math.exp(-rate * gap)
            now = doc["fetched_at"] + dt.timedelta(seconds=gap)
            doc.update(policy.fields(doc, changed, now), fetched_at=now)
        result[days_per_change] = doc
        assert doc["change_rate"] == pytest.approx(1 / days_per_change, rel=0.35)
        assert doc["refetch_interval"] == pytest.approx(ideal_interval(rate, 3600), rel=0.5)
    assert result[1]["refetch_interval"] < result[7]["refetch_interval"] / 2


def test_ideal_interval_is_the_cost_optimum():
    cost = 3600.0
    for rate in (1 / (365 * DAY), 1 / DAY, 1 / (6 * 3600)):
        best = ideal_interval(rate, cost)

        def loss(i, rate=rate):  # stale share + fetch cost per second
            r = rate * i
            return 1 - (1 - math.exp(-r)) / r + cost / i
        assert loss(best) <= min(loss(best * 0.9), loss(best * 1.1))
    slow = 1 / (365 * DAY)
    assert ideal_interval(slow, cost) == pytest.approx(math.sqrt(2 * cost / slow), rel=0.02)
    # Changing faster than once per `cost`: not worth chasing (many change periods).
    assert ideal_interval(1 / 600, cost) > 40 * 600


def test_estimator_is_cho_garcia_molina():
    # n checks at interval I with X changes: -ln((n - X + 0.5)/(n + 0.5)) / I, plus one
    # pseudo-check with half a change over the first interval.
    n, x, interval = 20, 5, 3600.0
    got = change_rate(n, x, n * interval, interval)
    assert got == pytest.approx(-math.log((21 - 5.5 + 0.5) / 21.5) / interval)
    assert math.isfinite(change_rate(10, 10, 36000, 3600))  # every check saw a change


def test_same_fetch_twice_changes_nothing_but_times():
    policy = RefetchPolicy()
    _, doc = run(policy, [False, True, False])
    again = policy.fields(doc, False, doc["fetched_at"])
    assert again["refetch_interval"] == doc["refetch_interval"]
    assert (again["checks"], again["changes_seen"]) == (doc["checks"], doc["changes_seen"])


def test_scalar_and_numpy_paths_agree():
    policy = RefetchPolicy()
    args = [(DAY, True, DAY, 3.0, 2.0, 3 * DAY), (2 * DAY, False, 5 * DAY, 10.0, 0.0, 30 * DAY),
            (3600.0, True, 3600.0, 30.0, 29.0, 30 * 3600.0), (DAY, False, 0.0, 1.0, 0.0, DAY)]
    bounds = (3600.0, 30 * DAY, DAY, 4 * 3600.0)
    scalar = [policy.advance(*a, *bounds) for a in args]
    columns = zip(*args, strict=True)
    cols = [np.array(c, dtype=float if i != 1 else bool) for i, c in enumerate(columns)]
    vector = policy.advance(*cols, *bounds, ops=np)
    for k in range(4):
        assert np.allclose(vector[k], [s[k] for s in scalar])


def test_rules_override_bounds_by_url_or_host():
    settings = Settings({"WEBFARM_REFETCH_MIN": "1h", "WEBFARM_REFETCH_MAX": "30d",
                         "WEBFARM_REFETCH_RULES": '[{"pattern": "/pricing", "max": "2h"},'
                         ' {"pattern": "^news\\\\.example$", "min": 60, "max": "30m",'
                         ' "interval": "5m"}]'})
    policy = RefetchPolicy.from_settings(settings)
    assert policy.bounds_for("http://a.example/pricing/plans", "a.example").max == 7200
    news = policy.bounds_for("http://news.example/world", "news.example")
    assert (news.min, news.max, news.initial) == (60, 1800, 300)
    assert policy.bounds_for("http://a.example/about", "a.example").max == 30 * DAY
    # The initial interval of a matching new page is bounded by the rule.
    intervals, _ = run(policy, [False] * 10, url="http://a.example/pricing/x")
    assert intervals[0] == 7200 and max(intervals) == 7200


def test_spider_attributes_override_settings():
    class Prices:
        name = "prices"
        refetch_min = 60
        refetch_max = "6h"
        refetch_interval = 600

    settings = Settings({"WEBFARM_REFETCH_MAX": "30d", "WEBFARM_REFETCH_COST": "1h"})
    policy = RefetchPolicy.from_settings(settings, Prices)
    assert (policy.base.max, policy.base.initial, policy.base.cost) == (6 * 3600, 600, 3600)


@pytest.mark.parametrize("rules, message", [
    ("[{'pattern': 'x'}]", "not JSON"),
    ('{"pattern": "x"}', "must be a list"),
    ('[{"max": "1h"}]', 'needs a "pattern"'),
    ('[{"pattern": "(", "max": "1h"}]', "bad regex"),
    ('[{"pattern": "x", "maxx": "1h"}]', "unknown keys"),
    ('[{"pattern": "x", "max": "soon"}]', "is not a duration"),
    ('[{"pattern": "x", "min": -5}]', "is not above 0"),
])
def test_bad_rules_get_one_clear_line(rules, message):
    with pytest.raises(RefetchConfigError, match=message) as info:
        parse_rules(rules)
    assert "WEBFARM_REFETCH_RULES" in str(info.value) and "\n" not in str(info.value)


def test_durations():
    assert [duration(v, "x") for v in (90, "90", "30m", "6h", "2d", "1w", "1.5h")] == [
        90, 90, 1800, 21600, 172800, 604800, 5400]
    with pytest.raises(RefetchConfigError, match="WEBFARM_REFETCH_MIN"):
        RefetchPolicy.from_settings(Settings({"WEBFARM_REFETCH_MIN": "an hour"}))
    # "-10" was "not a duration; give seconds or e.g. '30m'": seconds it was
    for value in ("-10", -10, "0", "-2h"):
        with pytest.raises(RefetchConfigError, match=r"is not above 0; give a duration above 0"):
            duration(value, "WEBFARM_REFETCH_INTERVAL")


def test_the_first_interval_is_a_duration_for_either_policy():
    """WEBFARM_REFETCH_INTERVAL=2h was refused as "not a number" while the message for
    -10 told the user to give '2h'; the MIN/MAX beside it took durations all along."""
    from scrapy.utils.test import get_crawler

    from webfarm.index import FixedRefetch

    settings = Settings({"WEBFARM_REFETCH_INTERVAL": "2h"})
    assert RefetchPolicy.from_settings(settings).base.initial == 7200
    crawler = get_crawler(settings_dict={"WEBFARM_REFETCH_INTERVAL": "2h"})
    assert FixedRefetch.from_crawler(crawler).interval == 7200
    fixed = Settings({"WEBFARM_REFETCH_POLICY": "webfarm.index.FixedRefetch",
                      "WEBFARM_REFETCH_INTERVAL": "soon"})
    with pytest.raises(RefetchConfigError, match="WEBFARM_REFETCH_INTERVAL='soon' is not a "):
        RefetchPolicy.check(fixed)


def test_a_minimum_above_the_maximum_is_refused():
    """WEBFARM_REFETCH_MIN=2d with WEBFARM_REFETCH_MAX=1d stored every page at 1 day, with
    no word that the bounds were swapped."""
    with pytest.raises(RefetchConfigError, match=r"minimum \(WEBFARM_REFETCH_MIN='2d'\) is "
                       r"above the maximum \(WEBFARM_REFETCH_MAX='1d'\)"):
        RefetchPolicy.from_settings(Settings({"WEBFARM_REFETCH_MIN": "2d",
                                              "WEBFARM_REFETCH_MAX": "1d"}))

    class Fast:
        name = "fast"
        refetch_max = "10m"

    with pytest.raises(RefetchConfigError, match=r"is above the maximum \(fast.refetch_max="):
        RefetchPolicy.from_settings(Settings(), Fast)
