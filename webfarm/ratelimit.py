"""A bare 429 slows its host for every worker; the host comes back to speed slowly.

A 429 with ``Retry-After`` defers the host (:mod:`middlewares.retry`). Most limiters send
none, and the host's delay stayed as it was: every worker went on at the same pace, about
every other request was refused and retried, and pages ran out of attempts (4 dead
letters of 15 pages at a 0.2 s delay against a limiter's 0.7 s). Here each 429 doubles
the host's delay (from at least twice ``WEBFARM_HOST_DELAY``, and 0.5 s, up to
``AUTOTHROTTLE_MAX_DELAY``) and each answer that is not a 429 takes a tenth off, down to
the default: a limiter is found in a few refusals and not hit at once again, as TCP backs
off. The delay travels as a ``host_delay`` signal of its own source, so robots.txt's
``Crawl-delay`` and the latency rule still count: the frontier spaces the host by the
largest.
"""

from __future__ import annotations

from webfarm.hostmemory import RecentHosts

FLOOR = 0.5  # seconds: the least delay a 429 gives a host, whatever the default
DOWN = 0.9  # each answer that is not a 429 keeps this much of the delay


class RateLimits:
    """Per host, the delay its 429s asked for, in this worker, for the hosts used last."""

    def __init__(self, base: float, maximum: float, memory: int) -> None:
        self.base = base
        self.maximum = max(maximum, base)
        self.delays: RecentHosts[float] = RecentHosts(memory)

    def refused(self, host: str) -> float | None:
        """A 429 from ``host``: its new delay, or None when it is at the maximum already."""
        old = self.delays.get(host, 0.0)
        new = min(max(2 * old, 2 * self.base, FLOOR), self.maximum)
        if new <= old:
            return None
        self.delays[host] = new
        return new

    def answered(self, host: str) -> float | None:
        """Another answer from a host a 429 slowed: its delay a tenth lower, down to the
        default (then the host is forgotten); None for a host no 429 slowed."""
        old = self.delays.get(host)
        if old is None:
            return None
        new = old * DOWN
        if new <= self.base:
            self.delays.discard(host)
            return self.base
        self.delays[host] = new
        return new
