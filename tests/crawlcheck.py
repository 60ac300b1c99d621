"""What a finished test crawl left behind: dead letters, stored pages, stats in the log."""

from __future__ import annotations

import json

import pymongo
import redis
from scrapy.settings import Settings

from webfarm.queue import open_frontier


def frontier(redis_url: str, spider: str = "generic"):
    settings = Settings({"DUPEFILTER_CLASS": "webfarm.dupefilter.BloomDupeFilter",
                         "SCHEDULER_QUEUE_CLASS": "webfarm.frontier.Frontier"})
    return open_frontier(settings, spider, redis.Redis.from_url(redis_url))


def dead_letters(redis_url: str, spider: str = "generic") -> dict[str, dict]:
    """URL -> dead letter (``reason``, ``status``, ``error``, ``attempts``, ...)."""
    return {json.loads(d["payload"])["url"]: d for d in frontier(redis_url, spider)
            .dead_letters(1000)}


def pages(stores: dict[str, str]) -> dict[str, dict]:
    """URL -> ``pages`` document."""
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    return {d["url"]: d for d in db.pages.find()}


def stat(output: str, name: str) -> int:
    """A counter from the stats dump at the end of a crawl's log (0 when absent)."""
    for line in output.splitlines():
        if f"'{name}':" in line:
            return int(line.split(":")[-1].strip().rstrip(",}"))
    return 0
