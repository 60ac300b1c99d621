"""Per-host politeness in the frontier: a host's delay, a 429's backoff, a deferral
(``Retry-After``). Mixed into :class:`~webfarm.frontier.core.Frontier`; the ``*_args``
build a script call's arguments, which the scheduler sends without blocking."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

BAD_HOST = re.compile(r"\s")  # hosts and worker names are space-separated in records


def check_host(host: str) -> None:
    if not isinstance(host, str) or not host or BAD_HOST.search(host) or len(host) > 1024:
        raise ValueError(f"invalid host {host!r}")


class FrontierHosts:
    """Host delays, backoffs and deferrals (mixed into ``Frontier``)."""

    default_delay: float
    _call: Callable[..., Any]

    def set_delay(self, host: str, seconds: float) -> None:
        """Per-host delay between two fetches, shared by every worker."""
        self._call("set_delay", *self._delay_args(host, seconds))

    def _delay_args(self, host: str, seconds: float) -> list[Any]:
        check_host(host)
        if not seconds >= 0 or math.isinf(seconds):
            raise ValueError(f"delay must be a finite number >= 0, not {seconds!r}")
        return [host, repr(float(seconds)), round(self.default_delay * 1000)]

    def get_delay(self, host: str) -> float:
        """The host's delay as the frontier spaces it: its own, never below the fleet's
        default (:meth:`effective_default_delay`), nor below what its 429s asked for."""
        return int(self._call("delay_of", host, round(self.default_delay * 1000))) / 1000

    def limit_host(self, host: str, floor: float, maximum: float) -> float:
        """A 429: the host's delay doubles for every worker (see :meth:`_limit_args`);
        returns it, in seconds."""
        return int(self._call("limit", *self._limit_args(host, floor, maximum))) / 1000

    def _limit_args(self, host: str, floor: float, maximum: float) -> list[Any]:
        """At least ``floor`` s, at most ``maximum`` s; it comes down by itself, 0.05 s a
        second (half of it in ten of its turns), and a 429 to a request sent before the
        last doubling is ignored."""
        check_host(host)
        return [host, round(floor * 1000), round(max(maximum, floor) * 1000),
                round(self.default_delay * 1000)]

    def defer_host(self, host: str, until_seconds_from_now: float) -> None:
        """Retry-After: the host's next-allowed time becomes max(current, now + x)."""
        self._call("defer", *self._defer_args(host, until_seconds_from_now))

    @staticmethod
    def _defer_args(host: str, until_seconds_from_now: float) -> list[Any]:
        check_host(host)
        return [host, max(0, round(until_seconds_from_now * 1000))]
