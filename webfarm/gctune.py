"""Garbage collection tuned for a crawl: fewer full collections, over young objects only.

A crawl allocates many short-lived objects (responses, selectors, requests,
items, futures) while its long-lived ones (modules, settings, components,
clients) never change once the spider is open. CPython's cyclic collector walks
those long-lived objects in every full collection, and with its default
thresholds (700, 10, 10) it runs often: on the test web the reactor thread
spent about 15% of a bare Scrapy crawl in the collector, and 19% with webfarm's
components loaded (``bench/bench_pipeline.py``).

When the spider opens, :class:`GcTuning` collects once, freezes what exists then
(:func:`gc.freeze`: never walked again) and raises the thresholds
(``WEBFARM_GC_THRESHOLDS``). Every object is still collected when it becomes
garbage, only in fewer, cheaper passes. When the last spider of the process
closes, the objects are unfrozen and the thresholds restored. The default
young-generation threshold is 100000: objects kept across a response's trip
through the pipelines survive each pass and make the older passes costly, and at
10000 the collector still took 0.38-0.46 s of an 8 s webfarm crawl of the test
web, at 100000 0.03-0.15 s. Objects that die without a cycle are freed at once
either way; only cyclic garbage waits longer, up to that many allocations. Stats:
``webfarm/gc/frozen_objects``, ``webfarm/gc/collections``, ``webfarm/gc/seconds``.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from scrapy import signals
from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured
from scrapy.statscollectors import StatsCollector

from webfarm.config import ConfigError

DEFAULT_THRESHOLDS = (100_000, 20, 20)
_open = {"count": 0, "saved": gc.get_threshold()}  # spiders open in this process


def parse_thresholds(value: Any) -> tuple[int, int, int]:
    """``WEBFARM_GC_THRESHOLDS``: three positive integers, as a list or ``"100000,20,20"``."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    try:
        numbers = tuple(int(str(item).strip()) for item in items)
    except ValueError:
        numbers = ()
    if len(numbers) != 3 or min(numbers) < 1:
        raise ConfigError(
            f"WEBFARM_GC_THRESHOLDS={value!r}: give three positive integers (young "
            "objects, then passes, before the next older generation is collected), e.g. "
            f"{','.join(map(str, DEFAULT_THRESHOLDS))}, or set WEBFARM_GC_TUNING=False")
    return numbers  # type: ignore[return-value]


class GcTuning:
    """Freezes the startup heap and raises the collector's thresholds while spiders run."""

    def __init__(self, stats: StatsCollector, thresholds: tuple[int, int, int]) -> None:
        self.stats = stats
        self.thresholds = thresholds
        self.collections = 0
        self.seconds = 0.0
        self._started = 0.0

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> GcTuning:
        settings = crawler.settings
        if not settings.getbool("WEBFARM_GC_TUNING", True):
            raise NotConfigured
        thresholds = parse_thresholds(settings.get("WEBFARM_GC_THRESHOLDS", DEFAULT_THRESHOLDS))
        assert crawler.stats is not None
        extension = cls(crawler.stats, thresholds)
        crawler.signals.connect(extension.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(extension.spider_closed, signal=signals.spider_closed)
        return extension

    def spider_opened(self) -> None:
        if _open["count"] == 0:
            _open["saved"] = gc.get_threshold()
            gc.collect()
            gc.freeze()
        _open["count"] += 1
        gc.set_threshold(*self.thresholds)
        gc.callbacks.append(self._timer)
        self.stats.set_value("webfarm/gc/frozen_objects", gc.get_freeze_count())

    def spider_closed(self) -> None:
        if self._timer in gc.callbacks:
            gc.callbacks.remove(self._timer)
        self.stats.set_value("webfarm/gc/collections", self.collections)
        self.stats.set_value("webfarm/gc/seconds", round(self.seconds, 3))
        _open["count"] = max(0, _open["count"] - 1)
        if _open["count"] == 0:
            gc.unfreeze()
            gc.set_threshold(*_open["saved"])

    def _timer(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.collections += 1
            self.seconds += time.perf_counter() - self._started
