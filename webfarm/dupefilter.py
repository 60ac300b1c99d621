"""Which dupefilter the frontier runs: ``DUPEFILTER_CLASS`` stays the familiar switch.

The frontier checks and records fingerprints inside the same Lua call that
enqueues a page's links, so these classes only choose the mode:

* :class:`BloomDupeFilter` (default): a scalable Bloom filter over Redis
  bitmaps, about 1.8 bytes per seen URL at 0.1 % false positives, growing when
  full — for crawls of any size.
* :class:`SetDupeFilter`: an exact Redis set of fingerprints (~60–90 bytes
  per URL) for small crawls where no URL may ever be skipped by mistake.

The fingerprint is the project's ``REQUEST_FINGERPRINTER_CLASS``
(:class:`webfarm.urls.RequestFingerprinter`): canonical URL, method and body.

Each worker also keeps :class:`RecentFingerprints`, the fingerprints it sent to
the frontier lately: a page's navigation links repeat on every page, and a
request the worker already sent needs neither serialising nor a trip to Redis
to be found a duplicate.
"""

from __future__ import annotations

from collections.abc import Hashable

from scrapy import Request
from scrapy.dupefilters import BaseDupeFilter


class FrontierDupeFilter(BaseDupeFilter):
    mode = ""

    def request_seen(self, request: Request) -> bool:
        raise RuntimeError(
            f"{type(self).__name__} runs inside the frontier: use it with "
            "SCHEDULER = 'webfarm.scheduler.Scheduler'"
        )


class BloomDupeFilter(FrontierDupeFilter):
    mode = "bloom"


class SetDupeFilter(FrontierDupeFilter):
    mode = "set"


class RecentFingerprints:
    """The last ``size`` to ``2 * size`` fingerprints added, in two generations.

    Bounded on purpose: it only saves the frontier work, never decides alone. A
    fingerprint it forgot is checked by the frontier's dupefilter as before;
    one it holds was sent to the frontier by this worker, which would drop it.
    """

    def __init__(self, size: int) -> None:
        self.size = max(0, size)
        self._new: set[Hashable] = set()
        self._old: set[Hashable] = set()

    def __contains__(self, fingerprint: Hashable) -> bool:
        return fingerprint in self._new or fingerprint in self._old

    def clear(self) -> None:
        self._new, self._old = set(), set()

    def add(self, fingerprint: Hashable) -> None:
        if not self.size:
            return
        if len(self._new) >= self.size:
            self._old, self._new = self._new, set()
        self._new.add(fingerprint)
