"""Says what a stopping worker still does before it exits.

A Ctrl-C (or scrapyd's cancel, a TERM) stops new fetches at once, then lets the pages
already fetched be parsed and stored: nothing fetched is thrown away. With a slow store
and a large ``SCRAPER_SLOT_MAX_ACTIVE_SIZE`` that took 107 s on a probe's crawl, and the
log said nothing but LogStats' "0 pages/min". :class:`StopProgress` says how many pages
are left, how many were done since the stop, and what a second Ctrl-C does.
"""

from __future__ import annotations

import logging
import time

from scrapy import signals
from scrapy.crawler import Crawler
from twisted.internet.task import LoopingCall

logger = logging.getLogger(__name__)

CHECK_EVERY = 1.0  # seconds between looks at the engine
SAY_EVERY = 15.0  # seconds between lines while pages are left


class StopProgress:
    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler
        self._loop = LoopingCall(self.check)
        self._stopped_with: int | None = None  # pages left when the stop was seen
        self._said_at = 0.0
        crawler.signals.connect(self.engine_started, signal=signals.engine_started)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> StopProgress:
        return cls(crawler)

    def engine_started(self) -> None:
        self._loop.start(CHECK_EVERY, now=False)

    def spider_closed(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def pages_left(self) -> int:
        """Responses the engine still parses or stores (Scrapy's scraper slot)."""
        slot = getattr(getattr(self.crawler.engine, "scraper", None), "slot", None)
        return len(getattr(slot, "active", ()) or ())

    def check(self) -> None:
        engine = self.crawler.engine
        if engine is None or engine.running:
            return
        left, now = self.pages_left(), time.monotonic()
        if self._stopped_with is None:
            self._stopped_with = left
        elif now - self._said_at < SAY_EVERY:
            return
        if not left:
            return
        self._said_at = now
        logger.info("Stopping: %d fetched page(s) still to parse and store before this worker "
                    "exits (%d done since the stop). Ctrl-C again to stop now: their "
                    "requests go back to the frontier and are fetched again",
                    left, max(0, self._stopped_with - left))
