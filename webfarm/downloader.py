"""Scrapy's downloader, keeping ``CONCURRENT_REQUESTS_PER_DOMAIN`` (and a slot's own
``concurrency`` in ``DOWNLOAD_SLOTS``) when a slot has no delay.

Scrapy 2.19's ``Downloader._process_queue`` starts each queued request as a task and
counts it in ``slot.transferring`` only once that task runs; its loop, checking
``slot.free_transfer_slots()``, so sends every queued request of the slot at once. With
no download delay (webfarm spaces a host's requests in the frontier, and
``WEBFARM_HOST_DELAY=0`` with AutoThrottle off left nothing else) a probe's worker had 11
requests in flight at one host with ``CONCURRENT_REQUESTS_PER_DOMAIN=1``; so did plain
``scrapy runspider``. Here a request counts as transferring as its task is made.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from scrapy.core.downloader import Downloader as ScrapyDownloader
from scrapy.core.downloader import Slot
from scrapy.http import Request, Response
from twisted.internet.defer import Deferred


class Downloader(ScrapyDownloader):
    def _wait_for_download(self, slot: Slot, request: Request,
                           queue_dfd: Deferred[Response]) -> Coroutine[Any, Any, None]:
        # Called in _process_queue's loop, before the next free_transfer_slots() check;
        # _download adds it again (a set) and removes it when the download ends.
        slot.transferring.add(request)
        return super()._wait_for_download(slot, request, queue_dfd)
