"""The robots.txt copies every worker shares, in Redis, and the lock that makes one fetch.

Keys: ``webfarm:{SPIDER}:robots:<origin>`` (a hash of :class:`webfarm.robots.Record`:
plain fields and the raw text, never anything executable) and ``…:<origin>:lock``
(the token of the worker fetching it). A Redis outage degrades to "every worker
fetches for itself" with one logged line, never to "allowed".

The lock lasts ``WEBFARM_ROBOTS_LOCK_SECONDS`` and the fetching worker renews it every
third of that (:meth:`SharedRobotsCache.keep`) until its fetch ends. It used to last
the longest fetch could take, ``(MAX_REDIRECTS + 1) × DOWNLOAD_TIMEOUT + 10`` s: a worker
stopped mid-fetch (``kill -STOP``, a frozen VM) held it 190 s, and every other worker gave
the host's requests back meanwhile. A stopped worker renews nothing, so its lock lapses.

The calls are awaited: on ``redis.asyncio`` (the crawl's client, see
:func:`webfarm.redisconn.crawl_redis_client`) the reactor runs on meanwhile, so a
broad crawl meeting a new host every few requests never waits for a remote Redis.
"""

from __future__ import annotations

import logging
import time

import redis
from scrapy.utils.defer import deferred_from_coro
from twisted.internet.defer import Deferred
from twisted.internet.task import LoopingCall

from webfarm.frontier.core import key_prefix
from webfarm.redisconn import AnyRedis, answer
from webfarm.robots import Record

logger = logging.getLogger(__name__)

REDIS_ERRORS = (redis.RedisError, ConnectionError, TimeoutError)
_UNLOCK = ("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) "
           "end return 0")
_RENEW = ("if redis.call('GET', KEYS[1]) == ARGV[1] then "
          "return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0")


class SharedRobotsCache:
    def __init__(self, server: AnyRedis, spider: str, lock_seconds: float,
                 keep_seconds: float) -> None:
        self.server = server
        self.prefix = key_prefix(spider) + "robots:"
        self.lock_ms = int(lock_seconds * 1000)
        self.keep_seconds = keep_seconds  # how long a copy stays for outages (>= its freshness)
        self._warned = False

    def key(self, origin: str) -> str:
        return self.prefix + origin

    async def read(self, origin: str) -> Record | None:
        try:
            raw = await answer(self.server.hgetall(self.key(origin)))
        except REDIS_ERRORS as exc:
            self._trouble(exc)
            return None
        self._warned = False
        return Record.from_mapping(raw) if raw else None

    async def write(self, origin: str, record: Record) -> None:
        ttl = max(int(self.keep_seconds), int(record.expires - time.time()) + 60, 60)
        try:
            pipe = self.server.pipeline(transaction=True)
            pipe.delete(self.key(origin))
            pipe.hset(self.key(origin), mapping=record.to_mapping())  # type: ignore[arg-type]
            pipe.expire(self.key(origin), ttl)
            await answer(pipe.execute())
        except REDIS_ERRORS as exc:
            self._trouble(exc)

    async def lock(self, origin: str, token: str) -> bool:
        """True when this worker may fetch (it got the lock, or Redis is down)."""
        try:
            return bool(await answer(self.server.set(self.key(origin) + ":lock", token,
                                                     nx=True, px=self.lock_ms)))
        except REDIS_ERRORS as exc:
            self._trouble(exc)
            return True

    async def renew(self, origin: str, token: str) -> bool:
        """Extend this worker's lock; False once it is no longer this worker's."""
        try:
            return bool(await answer(self.server.eval(_RENEW, 1, self.key(origin) + ":lock",
                                                      token, self.lock_ms)))
        except REDIS_ERRORS as exc:
            self._trouble(exc)
            return True  # as lock() does: Redis away, this worker goes on with its fetch

    def keep(self, origin: str, token: str) -> LoopingCall:
        """Renew the lock every third of its time until the returned call is stopped."""

        def renew() -> Deferred[None]:
            d = deferred_from_coro(self.renew(origin, token))
            d.addCallback(lambda held: None if held else logger.debug(
                "robots.txt lock of %s was taken over while this worker fetched it", origin))
            return d

        call = LoopingCall(renew)
        call.start(self.lock_ms / 3000, now=False).addErrback(
            lambda f: logger.error("renewing the robots.txt lock of %s failed: %s", origin,
                                   f.value))
        return call

    async def unlock(self, origin: str, token: str) -> None:
        try:
            await answer(self.server.eval(_UNLOCK, 1, self.key(origin) + ":lock", token))
        except REDIS_ERRORS as exc:
            self._trouble(exc)

    def _trouble(self, exc: Exception) -> None:
        if not self._warned:
            self._warned = True
            logger.error("Redis unreachable for the shared robots.txt cache (%s): this worker "
                         "fetches robots.txt itself until it is back", exc)
