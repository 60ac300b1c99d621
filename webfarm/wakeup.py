"""When the engine asks the scheduler again, and when an idle worker may close.

The scheduler answers ``next_request`` at once and never waits for Redis
(:mod:`webfarm.scheduler`), so the engine has to be woken: when leases arrive, when the
frontier says a host's turn comes (``ready_in``), and a second later at most in any case,
since another worker may push meanwhile. A worker closes only once the whole frontier
(every worker's share) stayed empty for ``WEBFARM_IDLE_TIMEOUT`` seconds: one worker's
empty moment is not the crawl's end while another's pages still bring links.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from scrapy import Spider
from scrapy.crawler import Crawler
from scrapy.exceptions import DontCloseSpider
from twisted.internet import reactor

from webfarm import advice

if TYPE_CHECKING:
    from webfarm.frontier import Frontier
    from webfarm.frontierlink import FrontierLink


class Wakeup:
    """The scheduler's poll gate, the engine's wake-up call and the idle close."""

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        self.crawler = crawler
        self.idle_timeout = settings.getfloat("WEBFARM_IDLE_TIMEOUT", 10.0)
        extensions = settings.getwithbase("EXTENSIONS")
        if (settings.getfloat("WEBFARM_RECRAWL_INTERVAL", 0.0) > 0
                and extensions.get("webfarm.recrawl.RecrawlExtension") is not None):
            # A recrawling worker never idles out (webfarm.recrawl keeps it): it said
            # "Frontier empty ... closing this worker" every second and stayed.
            self.idle_timeout = 0.0
        self.next_poll = 0.0  # no exchange before this (monotonic), unless links wait
        self._call: Any = None
        self._empty_since: float | None = None
        self.waiting = advice.WaitingNotice(settings.getfloat("LOGSTATS_INTERVAL", 60.0))

    def work_came(self) -> None:
        """The frontier holds work again: lift the idle poll gate, or the engine would get
        one request per batch of links until the gate expires (a starved crawl); and the
        frontier's idle time starts again."""
        self.next_poll = 0.0
        self._empty_since = None

    def idle_until(self, ready_in: float | None) -> None:
        """Nothing ready: ask again when the frontier says, at most a second from now
        (another worker may push meanwhile)."""
        wait = 1.0 if ready_in is None else min(max(ready_in, 0.01), 1.0)
        self.next_poll = time.monotonic() + wait
        self.wake_in(wait)

    def wake_in(self, wait: float) -> None:
        """Have the engine ask again in ``wait`` s (or sooner, if already planned)."""
        if self._call is not None and self._call.active():
            if self._call.getTime() <= reactor.seconds() + wait:
                return
            self._call.cancel()  # a host is ready sooner than the pending wake-up
        self._call = reactor.callLater(max(wait, 0.001), self.wake)

    def poll_now(self) -> None:
        self.next_poll = 0.0
        self.wake()

    def wake(self) -> None:
        slot = getattr(self.crawler.engine, "_slot", None)
        if slot is not None:
            slot.nextcall.schedule()

    def cancel(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()

    def spider_idle(self, link: FrontierLink, frontier: Frontier, spider: Spider | None
                    ) -> None:
        """Raise ``DontCloseSpider`` until the whole frontier (for a spider with
        ``allowed_domains``, of those hosts) stayed empty for ``WEBFARM_IDLE_TIMEOUT``
        seconds; 0 keeps the worker for ever. Under the asyncio reactor nothing here waits
        for Redis: what is held and the check are sent, and the engine asks again when
        they are back."""
        if link.waiting():  # Redis unreachable: asked again after the backoff
            raise DontCloseSpider
        link.tick()  # links and acks held go first: the check must see them
        if link.waiting() or link.push or link.in_flight:
            raise DontCloseSpider
        idle = link.frontier_idle()
        if idle is None:
            raise DontCloseSpider
        stats, name = self.crawler.stats, spider.name if spider else ""
        if not idle:
            # Said with WEBFARM_IDLE_TIMEOUT=0 too (a fleet's setting): a lease a killed
            # worker held kept such a worker silent for its 10 minutes.
            self._empty_since = None
            self.waiting.idle_with_work(stats, name, frontier.last_ready_in)
            raise DontCloseSpider
        if self.idle_timeout <= 0:
            raise DontCloseSpider
        now = time.monotonic()
        if self._empty_since is None:
            self._empty_since = now
        if now - self._empty_since < self.idle_timeout:
            self.idle_until(min(1.0, self.idle_timeout))
            raise DontCloseSpider
        advice.explain_at_close(stats, name, frontier, now - self._empty_since,
                                stores_pages=callable(getattr(spider, "page_item", None)))
