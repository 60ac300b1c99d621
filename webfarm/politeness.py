"""The frontier scheduler's politeness half: what middlewares say about a host, sent on.

Per-host delays (robots.txt's ``Crawl-delay``, ``DOWNLOAD_SLOTS``, the latency rule), a
429's backoff and a ``Retry-After``'s deferral arrive as signals (:mod:`webfarm.signals`)
and are kept in Redis, where they gate every worker's hand-outs. Requests that reach
their host some time after their hand-out (a render, a request held in the worker) ask
the frontier for the host's turn as they leave. Apart from :mod:`webfarm.scheduler`,
which hands requests out, because it is its own concern; it talks to Redis through the
scheduler's :class:`~webfarm.frontierlink.FrontierLink`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import Request

from webfarm.hostdelays import HostDelays
from webfarm.queue import HANDED_OUT, LEASE
from webfarm.urls import host_of

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

    from webfarm.frontier import Frontier
    from webfarm.frontierlink import FrontierLink


class Politeness:
    """Signal handlers for host delays, backoffs, deferrals and late arrivals; ``inc``
    counts a stat. Connected by the scheduler, working once :meth:`open` gave the link."""

    def __init__(self, settings: BaseSettings, inc: Callable[[str], None]) -> None:
        self.delays = HostDelays(settings)  # by source; the frontier gets the largest
        self._inc = inc
        self.link: FrontierLink | None = None
        self.frontier: Frontier | None = None

    def open(self, link: FrontierLink, frontier: Frontier) -> None:
        self.link, self.frontier = link, frontier

    def host_delay(self, host: str, delay: float, source: str = "", **kwargs: Any) -> None:
        """Keep each source's delay per host; the frontier gets the largest."""
        send = self.delays.update(host, delay, source)
        if send is None or self.link is None:
            return
        # The latency rule changes one after most responses: they travel with the next
        # exchange, the latest per host.
        if self.link.aio is not None:
            self.link.delays[host] = send
        else:
            self.link.op("set_delay", self.frontier._delay_args(host, send))

    def send_all_again(self) -> None:
        """Redis lost its writes: every host delay this worker knows goes again (robots.txt's
        Crawl-delay included), with the next exchange or tick."""
        self.link.delays.update(self.delays.known())

    def slot_delay(self, host: str) -> None:
        """A ``DOWNLOAD_SLOTS`` delay, the first time its host is met."""
        if not self.delays.slots.delays:
            return
        delay = self.delays.slots.first_seen(host)
        if delay is not None:
            self.host_delay(host, delay, source="DOWNLOAD_SLOTS")

    def host_limited(self, host: str, floor: float, maximum: float, **kwargs: Any) -> None:
        """A 429: the host's delay doubles in the frontier, for every worker."""
        self.link.op("limit", self.frontier._limit_args(host, floor, maximum))

    def host_defer(self, host: str, seconds: float, source: str = "", **kwargs: Any) -> None:
        self._inc("webfarm/frontier/deferred")
        self.link.op("defer", self.frontier._defer_args(host, seconds))

    async def render_arrival(self, request: Request, **kwargs: Any) -> None:
        """A render is about to reach its host: wait there for the host's turn."""
        lease_id = request.meta.get(LEASE)
        if self.link is None or lease_id is None:  # not from the frontier
            return
        wait = await self.link.arrive(host_of(request.url), lease_id)
        if wait > 0:
            self._inc("webfarm/frontier/render_waits")
            await asyncio.sleep(wait)

    async def request_departure(self, request: Request, **kwargs: Any) -> None:
        """An HTTP request leaves for its host after waiting in this worker: one that left
        over a tenth of its host's delay after its hand-out takes the host's turn (and
        waits for a render that reached the host meanwhile)."""
        lease_id, handed = request.meta.get(LEASE), request.meta.get(HANDED_OUT)
        if self.link is None or lease_id is None or handed is None:
            return
        host = host_of(request.url)
        delay = max(self.frontier.default_delay, self.delays.of(host) or 0.0)
        if delay <= 0 or time.monotonic() - handed < 0.1 * delay:
            return
        self._inc("webfarm/frontier/late_departures")
        wait = await self.link.arrive(host, lease_id, record=False)
        if wait > 0:
            await asyncio.sleep(wait)
