"""Per-host state a worker keeps for the hosts it used last, and no more.

A broad crawl meets new hosts without end, and a worker with ``WEBFARM_IDLE_TIMEOUT=0``
runs for weeks. A dict keyed by host grew by every host the worker ever fetched (the
latency rule's delay, the scheduler's copy of it, a proxy's stickiness), and the latency
rule read all of it after every response: 1.3 ms a response at 100,000 hosts, against the
4-5 ms a whole page costs. State that a host's next responses learn again is kept for the
``WEBFARM_HOST_MEMORY`` hosts used most recently; the others are forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Generic, TypeVar, overload

from webfarm.config import whole_number

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

V = TypeVar("V")
T = TypeVar("T")
DEFAULT_SIZE = 10_000


def host_memory_size(settings: BaseSettings) -> int:
    """``WEBFARM_HOST_MEMORY``: hosts whose re-learnable state a worker keeps (0: all)."""
    return whole_number(settings, "WEBFARM_HOST_MEMORY", DEFAULT_SIZE, "hosts", "no limit")


class RecentHosts(Generic[V]):
    """A mapping of host to state that forgets the least recently set host beyond
    ``size`` (0: never). Reading does not count as use: the hosts a worker fetches set
    their state after each response, and those are the ones worth keeping. (The render
    modes shared in Redis are another thing, :class:`webfarm.rendermemory.HostMemory`.)"""

    __slots__ = ("size", "forgotten", "_items")

    def __init__(self, size: int) -> None:
        self.size = size
        self.forgotten = 0  # hosts dropped to stay within size, for a stat
        self._items: OrderedDict[str, V] = OrderedDict()

    def __setitem__(self, host: str, value: V) -> None:
        items = self._items
        items[host] = value
        items.move_to_end(host)
        if self.size and len(items) > self.size:
            items.popitem(last=False)
            self.forgotten += 1

    def add(self, host: str) -> None:
        """As a set's ``add``: for the hosts a line was logged about, say."""
        self[host] = None  # type: ignore[assignment]

    @overload
    def get(self, host: str) -> V | None: ...
    @overload
    def get(self, host: str, default: T) -> V | T: ...
    def get(self, host: str, default: object = None) -> object:
        return self._items.get(host, default)

    def __contains__(self, host: object) -> bool:
        return host in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)
