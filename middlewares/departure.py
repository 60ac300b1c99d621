"""A request that leaves long after its hand-out takes its host's turn again.

The frontier spaces a host's requests as it hands them out, a delay apart. A request
that waits in the worker after that (for robots.txt, fetched meanwhile; for a busy CPU)
reaches the host late, and the host's next hand-out, due a delay after this one's,
reaches it early: with a 3 s robots.txt and a 1.5 s delay, two workers' first pages
came 0.05 s apart at the server. Such a request now asks the frontier for the host's
turn as it leaves (``webfarm.signals.request_departure``, handled by the frontier
scheduler): the host's next hand-out waits a delay after it. One that leaves within
20 ms of its hand-out goes as it is, without a signal, and the scheduler lets one go
without a Redis round trip unless it left over a tenth of the host's delay late
(stat ``webfarm/frontier/late_departures``). A render takes its turn as its navigation
leaves instead (:mod:`webfarm.download`), so browser requests are left alone here.

Last of the middlewares that may hold a request (robots.txt at 100, the proxies at 740):
priority 940. So it also notes when each request leaves (``webfarm.queue.SENT_AT``): its
page's ``fetched_at``.
"""

from __future__ import annotations

import time

from scrapy import Request, Spider
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest

from webfarm import signals as wf_signals
from webfarm.queue import HANDED_OUT, LEASE_LOST, SENT_AT

PROMPT = 0.02  # seconds after its hand-out within which a request is not late at any delay


class DepartureMiddleware:
    """Downloader middleware; see the module docstring."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> DepartureMiddleware:
        return cls(crawler)

    async def process_request(self, request: Request, spider: Spider | None = None) -> None:
        request.meta[SENT_AT] = time.time()  # the page's fetched_at (webfarm.queue.SENT_AT)
        handed = request.meta.get(HANDED_OUT)
        if handed is None or request.meta.get("playwright"):
            _not_lost(request)
            return
        if time.monotonic() - handed < PROMPT:
            return
        await self.crawler.signals.send_catch_log_async(wf_signals.request_departure,
                                                        request=request)
        _not_lost(request)


def _not_lost(request: Request) -> None:
    """IgnoreRequest for a request whose lease expired while this worker stalled: the
    frontier handed it to another worker, which fetches it (webfarm.leaserenew)."""
    if request.meta.get(LEASE_LOST):
        raise IgnoreRequest(f"its lease expired while this worker stalled, and another worker "
                            f"has it: {request.url} is not fetched here")
