"""What one worker knows of each host's delay, by source, so that the frontier gets the
largest.

Delays come from several places: robots.txt's ``Crawl-delay``, a ``DOWNLOAD_SLOTS``
entry, ``DOWNLOAD_DELAY`` and the latency rule. The frontier keeps one delay a host,
shared by every worker, so a worker sends the largest it knows, and only when the
frontier would see the change (it counts whole milliseconds; the latency rule moves a
host's delay after most responses). Sources that say a host's delay once (robots.txt,
``DOWNLOAD_SLOTS``) are kept; the latency rule's, said again after a host's next
responses, is kept for the ``WEBFARM_HOST_MEMORY`` hosts used last (a broad crawl).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from webfarm import signals as wf_signals
from webfarm.hostmemory import RecentHosts, host_memory_size
from webfarm.queue import SlotDelays

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings


def _ms(seconds: float) -> int:
    """A delay as the frontier's script rounds it."""
    return int(seconds * 1000 + 0.5)


class HostDelays:
    def __init__(self, settings: BaseSettings) -> None:
        self.slots = SlotDelays(settings)  # DOWNLOAD_SLOTS floors, looked up once a host
        self._kept: dict[str, dict[str, float]] = {}
        self._learned: RecentHosts[float] = RecentHosts(host_memory_size(settings))

    @property
    def memory(self) -> int:
        """Hosts whose learned delay is kept (``WEBFARM_HOST_MEMORY``; 0: all)."""
        return self._learned.size

    def update(self, host: str, delay: float, source: str) -> float | None:
        """Note ``source``'s delay for ``host``; the host's delay to send the frontier if
        it changed enough for the frontier to see, else None."""
        before = self.of(host)
        if source == wf_signals.LEARNED:
            self._learned[host] = float(delay)
        else:
            self._kept.setdefault(host, {})[source] = float(delay)
        after = self.of(host)
        assert after is not None
        if before is None or (abs(after - before) > 0.05 * max(before, 0.01)
                              and _ms(after) != _ms(before)):
            return after
        return None

    def of(self, host: str) -> float | None:
        """The largest delay any source gave ``host``, as far as this worker remembers."""
        kept = self._kept.get(host)
        delay = max(kept.values()) if kept else None
        learned = self._learned.get(host)
        if learned is not None and (delay is None or learned > delay):
            delay = learned
        return delay

    def known(self) -> dict[str, float]:
        """Every host's delay this worker remembers (to send again after Redis lost it)."""
        delays = {host: self.of(host) for host in {*self._kept, *self._learned}}
        return {host: delay for host, delay in delays.items() if delay is not None}
