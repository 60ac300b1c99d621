"""The frontier scheduler: scrapy-redis's, with webfarm's connection, JSON and lifecycle.

scrapy-redis gives the shared queue and dupefilter. On top: the Redis URL comes
from :mod:`webfarm.config` (embedded Valkey when unset), queued requests are
JSON (``webfarm.serialize``), an entry that is not one of our requests is moved
to the dead-letter list instead of crashing the worker, and a worker stops only
after the shared queue stayed empty for ``WEBFARM_IDLE_TIMEOUT`` seconds, so it
does not quit while another worker is still adding links.
"""

from __future__ import annotations

import importlib
import json
import logging
import time
from typing import Any

from scrapy import Spider, signals
from scrapy.crawler import Crawler
from scrapy.exceptions import DontCloseSpider
from scrapy.settings import BaseSettings
from scrapy_redis.queue import PriorityQueue
from scrapy_redis.scheduler import Scheduler as RedisScheduler

from webfarm.redisconn import redis_client
from webfarm.serialize import SerializationError

logger = logging.getLogger(__name__)


def dead_key(spider_name: str) -> str:
    return f"webfarm:{{{spider_name}}}:dead"


class SafePriorityQueue(PriorityQueue):
    """A priority queue that dead-letters undecodable entries instead of raising."""

    def _decode_request(self, encoded_request: bytes) -> Any:
        try:
            return super()._decode_request(encoded_request)
        except (SerializationError, ValueError, TypeError, AttributeError, KeyError) as exc:
            reason = f"malformed queue entry: {exc}"
            logger.error("%s; moved to the dead-letter list %s", reason, dead_key(self.spider.name))
            entry = {"reason": reason, "raw": encoded_request.decode("utf-8", "replace"),
                     "at": time.time()}
            self.server.rpush(dead_key(self.spider.name), json.dumps(entry))
            return None


class Scheduler(RedisScheduler):
    def __init__(self, *args: Any, idle_timeout: float = 10.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.idle_timeout = idle_timeout
        self._empty_since: float | None = None

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Scheduler:
        kwargs: dict[str, Any] = {
            "persist": True,
            "flush_on_start": settings.getbool("SCHEDULER_FLUSH_ON_START"),
            "queue_key": settings.get("SCHEDULER_QUEUE_KEY"),
            "queue_cls": settings.get("SCHEDULER_QUEUE_CLASS"),
            "dupefilter_key": settings.get("SCHEDULER_DUPEFILTER_KEY"),
            "dupefilter_cls": settings.get("DUPEFILTER_CLASS"),
            "serializer": importlib.import_module(settings.get("SCHEDULER_SERIALIZER")),
            "idle_timeout": settings.getfloat("WEBFARM_IDLE_TIMEOUT", 10.0),
        }
        if kwargs["queue_cls"] == "scrapy_redis.queue.PriorityQueue":
            kwargs["queue_cls"] = "webfarm.scheduler.SafePriorityQueue"
        server = redis_client(settings)
        server.ping()
        return cls(server=server, **kwargs)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Scheduler:
        scheduler = cls.from_settings(crawler.settings)
        scheduler.stats = crawler.stats
        crawler.signals.connect(scheduler.spider_idle, signal=signals.spider_idle)
        return scheduler

    def open(self, spider: Spider) -> None:
        super().open(spider)
        kw = self.server.connection_pool.connection_kwargs
        logger.info("Frontier %s on redis://%s:%s/%s (%d queued)", self.queue.key,
                    kw.get("host", "?"), kw.get("port", "?"), kw.get("db", 0), len(self.queue))

    def close(self, reason: str) -> None:
        """Never delete shared state when one worker stops."""

    def spider_idle(self, spider: Spider) -> None:
        """Keep the worker until the shared queue stayed empty for ``idle_timeout``."""
        if self.idle_timeout <= 0:
            raise DontCloseSpider
        if len(self.queue) > 0:
            self._empty_since = None
            raise DontCloseSpider
        now = time.monotonic()
        if self._empty_since is None:
            self._empty_since = now
        if now - self._empty_since < self.idle_timeout:
            raise DontCloseSpider
        logger.info("Frontier empty for %.0fs: closing this worker", now - self._empty_since)
