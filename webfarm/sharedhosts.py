"""Hosts another spider's workers crawl at the same time: said, since no delay spans them.

Each spider's frontier keeps its own hosts' delays (every key under ``webfarm:{SPIDER}:``,
one Redis Cluster slot, so the atomic hand-out cannot read another spider's). Two spiders
on one host at once, such as ``generic`` exploring a site that has a spider of its own,
each fetch from it at the delay: together more often (a probe saw gaps of 3 ms on a host
whose spider asked for 2 s). Nothing said so.

Each worker adds its frontier's prefix to :data:`REGISTRY`. A second after it opens, then
ever less often up to once a minute (two crawls may overlap for seconds only), it looks up
the hosts it was handed since the last look in the other frontiers that have a live worker
(one whose default delay still counts: the ``defaults`` hash), in their ``ready`` and
``cool`` sets, and warns once per host and spider. The lookups run in a thread: the
reactor never waits for them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
from twisted.internet import reactor, threads
from twisted.internet.base import DelayedCall
from twisted.python.failure import Failure

from webfarm.frontier.reading import as_text
from webfarm.hostmemory import RecentHosts
from webfarm.redisconn import REDIS_ERRORS

logger = logging.getLogger(__name__)

REGISTRY = "webfarm:frontiers"  # SET of frontier prefixes, 'webfarm:{SPIDER}:'
FIRST_LOOK = 1.0  # seconds after the spider opens; then 2, 4, 8 ... seconds apart
EVERY = 60.0  # seconds between looks, at most
MAX_HOSTS = 1000  # hosts kept between two looks (the most recent are enough to see it)
MAX_SAID = 10_000  # host and spider pairs remembered as said (a broad crawl meets many)


def spider_of(prefix: str) -> str:
    """'webfarm:{shop}:' -> 'shop'."""
    return prefix.partition("{")[2].rpartition("}")[0] or prefix


class SharedHosts:
    """Notes the hosts this worker was handed and, now and then, which of them another
    spider's live workers crawl too; ``inc`` counts a stat."""

    def __init__(self, server: redis.Redis, prefix: str, inc: Callable[[str, int], None]) -> None:
        self.server, self.prefix, self._inc = server, prefix, inc
        self.hosts: set[str] = set()
        self.said: RecentHosts[None] = RecentHosts(MAX_SAID)  # 'HOST SPIDER' said
        self._call: DelayedCall | None = None
        self._busy = False
        self._every = FIRST_LOOK

    def open(self) -> None:
        self._call = reactor.callLater(FIRST_LOOK, self._look)

    def close(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def note(self, host: str) -> None:
        if len(self.hosts) < MAX_HOSTS:
            self.hosts.add(host)

    def _look(self) -> None:
        self._every = min(EVERY, self._every * 2)
        self._call = reactor.callLater(self._every, self._look)
        if self._busy:
            return
        hosts, self.hosts = sorted(self.hosts), set()
        self._busy = True
        d = threads.deferToThread(self.shared, hosts)
        d.addCallbacks(self._say, self._failed)
        d.addBoth(self._done)

    def _done(self, _: object) -> None:
        self._busy = False

    def _failed(self, failure: Failure) -> None:
        if failure.check(*REDIS_ERRORS):
            return  # Redis away: the frontier's exchanges say so; the next look tries again
        # Refused (a Redis user kept to this spider's keys: NOPERM) or a bug: said once.
        logger.warning("Cannot look for other spiders crawling this worker's hosts (%s: %s); "
                       "their delays do not add up with this spider's, and will not be said",
                       failure.type.__name__, failure.getErrorMessage())
        self.close()

    def shared(self, hosts: list[str]) -> dict[str, tuple[str, int]]:
        """Host -> (other spider, its live workers), for ``hosts`` another spider's live
        workers crawl; registers this worker's frontier first. Blocking: call in a thread."""
        self.server.sadd(REGISTRY, self.prefix)
        others = sorted(p for p in map(as_text, self.server.smembers(REGISTRY))
                        if p != self.prefix)
        if not hosts or not others:
            return {}
        seconds, micros = self.server.time()
        now = seconds * 1000 + micros // 1000
        found: dict[str, tuple[str, int]] = {}
        for prefix in others:
            live = sum(1 for v in self.server.hvals(prefix + "defaults")
                       if _expires(v) >= now)
            if not live:
                continue
            pipe = self.server.pipeline(transaction=False)
            pipe.zmscore(prefix + "ready", hosts)
            pipe.zmscore(prefix + "cool", hosts)
            ready, cool = pipe.execute()
            for host, a, b in zip(hosts, ready, cool, strict=True):
                if (a is not None or b is not None) and host not in found:
                    found[host] = (spider_of(prefix), live)
        return found

    def _say(self, found: dict[str, tuple[str, int]]) -> None:
        for host, (spider, live) in sorted(found.items()):
            if f"{host} {spider}" in self.said:
                continue
            self.said.add(f"{host} {spider}")
            self._inc("webfarm/frontier/shared_hosts", 1)
            logger.warning(
                "%s is crawled by spider %r too (%d worker(s) now): each spider's frontier "
                "keeps a host's delay for its own workers only, so together they fetch from "
                "it more often than the delay asks (WEBFARM_HOST_DELAY, DOWNLOAD_DELAY, "
                "Crawl-delay). Crawl a site with one spider at a time: stop one, or leave "
                "the host out of its hosts (-a domains=…, allowed_domains) (said once per "
                "host and spider)", host, spider, live)


def _expires(value: bytes | str) -> int:
    """A ``defaults`` value 'MS EXPIRES_MS' -> EXPIRES_MS (0 when malformed)."""
    try:
        return int(as_text(value).split()[1])
    except (IndexError, ValueError):
        return 0
