"""A live worker keeps the leases of the requests it still works on.

A lease (``WEBFARM_LEASE_SECONDS``) is how the frontier takes a page back from a worker
that was killed or stalled. A page that took longer than the lease in a live worker (a
slow server, a long render, storage retrying through an outage) was taken back all the
same, handed to another worker, fetched again and again, and its host's queue waited
behind it: a probe's 25 s page under a 20 s lease was fetched every 20 s until stopped,
each time logged as a killed worker's. :class:`LeaseRenewal` renews, from the reactor,
every lease held for a quarter of the lease time since it was handed out or last
renewed: one small script call every quarter lease, none for pages that end sooner. A
stalled reactor renews nothing, so a stalled worker's leases still expire.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from scrapy import Request
from twisted.internet.task import LoopingCall

from webfarm.queue import HANDED_OUT

if TYPE_CHECKING:
    from webfarm.frontier import Frontier
    from webfarm.frontierlink import FrontierLink

logger = logging.getLogger(__name__)


class LeaseRenewal:
    """Renews the leases of ``inflight`` (lease id -> request, the scheduler's) that were
    handed out or renewed at least a quarter of ``lease_seconds`` ago."""

    def __init__(self, lease_seconds: float, inflight: dict[str, Request],
                 inc: Callable[[str, int], None]) -> None:
        self.every = lease_seconds / 4
        self.inflight = inflight
        self._inc = inc
        self._renewed: dict[str, float] = {}  # lease id -> when last renewed (monotonic)
        self._loop: LoopingCall | None = None
        self.link: FrontierLink | None = None
        self.frontier: Frontier | None = None

    def open(self, link: FrontierLink, frontier: Frontier) -> None:
        self.link, self.frontier = link, frontier
        self._loop = LoopingCall(self.renew)
        self._loop.start(self.every, now=False)

    def close(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()

    def due(self, now: float) -> list[str]:
        """The leases held a quarter lease or longer since their hand-out or renewal."""
        self._renewed = {lease: at for lease, at in self._renewed.items()
                         if lease in self.inflight}
        return [lease for lease, request in self.inflight.items()
                if now - self._renewed.get(lease, request.meta.get(HANDED_OUT, now))
                >= self.every]

    def renew(self) -> None:
        if self.link is None or self.frontier is None or self.link.waiting():
            return  # Redis is away: the next turn tries again (what expires meanwhile, expires)
        now = time.monotonic()
        leases = self.due(now)
        if not leases:
            return
        logger.debug("Renewing %d leases still in work", len(leases))
        self.link.op("renew", self.frontier._renew_args(leases))
        self._renewed.update(dict.fromkeys(leases, now))
        self._inc("webfarm/frontier/renewed", len(leases))
