"""Garbage-collection tuning while a spider runs: the startup heap is frozen and the
thresholds raised, both undone when the spider closes; bad settings say what to do."""

from __future__ import annotations

import gc

import pytest
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from webfarm.config import ConfigError
from webfarm.gctune import GcTuning, parse_thresholds


def open_and_close(crawler, during):
    """Open the spider, run ``during()``, close it; the extension and what ``during`` gave."""
    extension = GcTuning.from_crawler(crawler)
    crawler.stats.open_spider()
    extension.spider_opened()
    try:
        return extension, during()
    finally:
        extension.spider_closed()


def test_the_startup_heap_is_frozen_and_the_thresholds_raised_while_the_spider_runs():
    before = gc.get_threshold()
    crawler = get_crawler(settings_dict={"WEBFARM_GC_THRESHOLDS": "5000,15,12"})

    def during():
        garbage = []
        for _ in range(20_000):  # cycles: only the collector frees them
            node: list = []
            node.append(node)
            garbage.append(node)
        garbage.clear()
        gc.collect(0)
        return gc.get_threshold(), gc.get_freeze_count()

    extension, (thresholds, frozen) = open_and_close(crawler, during)
    assert thresholds == (5000, 15, 12)
    assert frozen > 1000  # modules, classes, settings: never walked while crawling
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0  # all undone
    stats = crawler.stats.get_stats()
    assert stats["webfarm/gc/frozen_objects"] > 1000
    assert stats["webfarm/gc/collections"] >= 1 and stats["webfarm/gc/seconds"] >= 0


@pytest.mark.parametrize("value", ["10000,20", "10000,0,20", "lots,20,20", [1, 2, 3, 4]])
def test_bad_thresholds_say_what_to_give(value):
    with pytest.raises(ConfigError, match=r"three positive integers.*WEBFARM_GC_TUNING=False"):
        GcTuning.from_crawler(get_crawler(settings_dict={"WEBFARM_GC_THRESHOLDS": value}))


def test_thresholds_come_as_a_list_or_a_string():
    assert parse_thresholds([10000, 20, 20]) == parse_thresholds("10000, 20, 20")


def test_off_leaves_the_collector_alone():
    with pytest.raises(NotConfigured):
        GcTuning.from_crawler(get_crawler(settings_dict={"WEBFARM_GC_TUNING": False}))
