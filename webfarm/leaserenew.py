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

A worker resumed after such a stall fetched the requests it held all the same, though
another worker had them by then. Redis answers each renewal with the leases no longer
held; their requests are marked (``webfarm.queue.LEASE_LOST``) and dropped before they
leave (``middlewares/departure.py``). A request about to leave whose lease nobody
confirmed for a whole lease time is asked about first (:meth:`request_departure`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.utils.defer import deferred_from_coro
from twisted.internet.task import LoopingCall

from webfarm.queue import HANDED_OUT, LEASE, LEASE_LOST

if TYPE_CHECKING:
    from webfarm.frontier import Frontier
    from webfarm.frontierlink import FrontierLink

logger = logging.getLogger(__name__)


class LeaseRenewal:
    """Renews the leases of ``inflight`` (lease id -> request, the scheduler's) that were
    handed out or renewed at least a quarter of ``lease_seconds`` ago."""

    def __init__(self, lease_seconds: float, inflight: dict[str, Request],
                 inc: Callable[[str, int], None]) -> None:
        self.lease_seconds = lease_seconds
        self.every = lease_seconds / 4
        self.inflight = inflight
        self._inc = inc
        self._renewed: dict[str, float] = {}  # lease id -> when a renewal was last sent
        self._confirmed: dict[str, float] = {}  # lease id -> when Redis last said it held
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
        self._confirmed = {lease: at for lease, at in self._confirmed.items()
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
        self._renewed.update(dict.fromkeys(leases, now))
        self._inc("webfarm/frontier/renewed", len(leases))
        if self.link.aio is None:  # the blocking path: sent with the next exchange, unanswered
            self.link.op("renew", self.frontier._renew_args(leases))
            return
        deferred_from_coro(self._renew(leases, now))

    async def _renew(self, leases: list[str], sent: float) -> set[str]:
        """Renew ``leases``; mark the requests of those no longer held. Which were gone."""
        assert self.link is not None
        gone = await self.link.renew(leases)
        if gone is None:
            return set()
        self._confirmed.update((lease, sent) for lease in leases if lease not in gone)
        self._lost(gone)
        return gone

    async def request_departure(self, request: Request, **kwargs: Any) -> None:
        """A request leaving whose lease nobody confirmed for a whole lease time (the
        worker stalled since): asked about first, and marked if it is gone."""
        lease = request.meta.get(LEASE)
        if lease is None or self.link is None or lease not in self.inflight:
            return
        now = time.monotonic()
        if now - self._confirmed.get(lease, request.meta.get(HANDED_OUT, now)) >= \
                self.lease_seconds:
            self._renewed[lease] = now
            await self._renew([lease], now)

    def _lost(self, leases: Iterable[str]) -> None:
        lost = [self.inflight[lease] for lease in leases if lease in self.inflight]
        for request in lost:
            request.meta[LEASE_LOST] = True
        if lost:
            self._inc("webfarm/frontier/leases_lost", len(lost))
            logger.warning(
                "%d leases of this worker expired while it stalled past "
                "WEBFARM_LEASE_SECONDS, and another worker has their requests (%s%s): "
                "those not sent yet are dropped here", len(lost), lost[0].url,
                ", …" if len(lost) > 1 else "")
