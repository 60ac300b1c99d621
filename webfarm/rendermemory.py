"""What each host needed (HTTP, browser or fetch API), shared by every worker in Redis.

The I/O half of :mod:`webfarm.render`. Its calls are awaited: on ``redis.asyncio``
(the crawl's client, :func:`webfarm.redisconn.crawl_redis_client`) the reactor runs
on while Redis answers, so a broad crawl that reads a host's mode every few
requests never waits for a remote Redis.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import redis.asyncio

from webfarm.hostmemory import RecentHosts
from webfarm.redisconn import REDIS_ERRORS, AnyRedis, answer, run_script

logger = logging.getLogger(__name__)
_CACHE_SIZE = 10_000  # hosts whose mode is kept for cache_seconds (the oldest set go)

# The host's counts and mode, updated in one step so workers do not race.
# KEYS[1] the host's hash; ARGV: "js"|"ok", ttl ms, min pages, share, how many (of that kind).
_OBSERVE = """
local js = tonumber(redis.call('HGET', KEYS[1], 'js') or '0')
local ok = tonumber(redis.call('HGET', KEYS[1], 'ok') or '0')
local mode = redis.call('HGET', KEYS[1], 'mode') or 'http'
local n = tonumber(ARGV[5] or '1')
if ARGV[1] == 'js' then js = js + n else ok = ok + n end
if mode ~= 'http' and ARGV[1] == 'ok' then
  mode = 'http'; js = 0; ok = n
elseif mode == 'http' and js >= tonumber(ARGV[3]) and js >= tonumber(ARGV[4]) * (js + ok) then
  mode = 'browser'
end
while js + ok > 50 do js = math.floor(js / 2); ok = math.floor(ok / 2) end
redis.call('HSET', KEYS[1], 'js', js, 'ok', ok, 'mode', mode)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return mode
"""

Observation = tuple[str, str, int]  # host, "js" or "ok", how many
#: What a worker learned of a host with a render, for the others (see HostMemory.mark):
#: ``root_misleads``, an empty app root there is a widget's mount point, no sign;
#: ``check_missing``, the spider's render_check selector never came in its renders.
ROOT_MISLEADS, CHECK_MISSING = "root_misleads", "check_missing"
MARKS = (ROOT_MISLEADS, CHECK_MISSING)


class HostMemory:
    """What each host needed, in Redis under ``webfarm:{SPIDER}:render:<host>``.

    Every plain-HTTP fetch judged in ``auto`` mode is an observation: it needed
    JavaScript or it did not. A host is sent to the browser once at least
    ``min_pages`` of its pages needed it and they are at least ``share`` of
    those seen (a shop where one page in five is a JS widget stays on HTTP);
    a host where the browser failed and the fetch API delivered is sent to the
    API. One HTTP probe that turns out fine flips either back. The key expires
    ``seconds`` after the last observation. Workers keep what they read for
    ``cache_seconds`` to spare Redis a round trip per request; requests that
    ask while a host's mode is being read wait for that one read.

    An observation that cannot change the mode (a page that did not need
    JavaScript, on a host this worker holds as ``http``) is only counted here and
    sent with others in one round trip: ``batch_size`` of them or after
    ``batch_seconds``, in the background, and at :meth:`flush`. The share rule
    sees those counts that much later. An observation that may change the mode
    goes at once, after the counted ones (same round trip), and is awaited.
    """

    def __init__(self, server: AnyRedis, spider: str, seconds: float, min_pages: int = 2,
                 share: float = 0.9, cache_seconds: float = 2.0, batch_size: int = 64,
                 batch_seconds: float = 0.5) -> None:
        self.server = server
        self.prefix = f"webfarm:{{{spider}}}:render:"
        self.ttl_ms = max(1, int(seconds * 1000))
        self.min_pages = max(1, min_pages)
        self.share = share
        self.cache_seconds = cache_seconds
        self.batch_size = max(1, batch_size)
        self.batch_seconds = batch_seconds
        self._cache: RecentHosts[tuple[float, str]] = RecentHosts(_CACHE_SIZE)
        self._marks: RecentHosts[frozenset[str]] = RecentHosts(_CACHE_SIZE)  # as last read
        self._pending: dict[str, int] = {}  # host -> "ok" observations not sent yet
        self._pending_count = 0
        self._pending_since = 0.0
        self._script = server.register_script(_OBSERVE)
        # Only a redis.asyncio client lets requests overlap a call (and batches go unawaited).
        self._background = isinstance(server, redis.asyncio.Redis)
        self._reading: dict[str, list[asyncio.Future[None]]] = {}
        self._sending: asyncio.Future[None] | None = None
        self._lock = asyncio.Lock()  # sends land in the order observations were made
        self._down_logged = False

    def key(self, host: str) -> str:
        return self.prefix + host

    async def mode(self, host: str) -> str:
        """The rung ``host`` is remembered to need: ``http``, ``browser`` or ``api``."""
        cached = self._cache.get(host)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        waiters = self._reading.get(host)
        if waiters is not None:  # being read for another request: its answer is this one's
            waiter = asyncio.get_running_loop().create_future()
            waiters.append(waiter)
            await waiter
            return self._cache.get(host, (0.0, "http"))[1]
        self._reading[host] = []
        try:
            raw, *marks = await answer(self.server.hmget(self.key(host), "mode", *MARKS))
            self._marks[host] = frozenset(m for m, v in zip(MARKS, marks, strict=True) if v)
        except REDIS_ERRORS as exc:
            self._redis_down(exc)
            return cached[1] if cached else "http"
        finally:
            for waiter in self._reading.pop(host):
                if not waiter.done():
                    waiter.set_result(None)
        return self._remember_mode(host, raw or b"http")

    def marked(self, host: str, mark: str) -> bool:
        """Whether a worker marked ``host`` with ``mark`` (one of :data:`MARKS`), as of
        this worker's last read of its mode."""
        return mark in self._marks.get(host, frozenset())

    async def mark(self, host: str, mark: str) -> None:
        """Mark ``host`` for every worker (what one learned with a render of its own),
        for as long as the host's memory lasts."""
        self._marks[host] = self._marks.get(host, frozenset()) | {mark}
        try:
            pipe = self.server.pipeline(transaction=True)
            pipe.hset(self.key(host), mark, "1")
            pipe.pexpire(self.key(host), self.ttl_ms)
            await answer(pipe.execute())
        except REDIS_ERRORS as exc:
            self._redis_down(exc)

    async def observe(self, host: str, needed_js: bool) -> str:
        """Record one plain-HTTP observation of ``host``; returns its mode afterwards."""
        now = time.monotonic()
        cached = self._cache.get(host)
        if not needed_js and cached is not None and cached[0] > now and cached[1] == "http":
            if not self._pending_count:
                self._pending_since = now
            self._pending[host] = self._pending.get(host, 0) + 1
            self._pending_count += 1
            if (self._pending_count >= self.batch_size
                    or now - self._pending_since >= self.batch_seconds):
                await self._send_batch()
            return "http"
        async with self._lock:  # after what came before it, in the same round trip
            await self._send([*self._take(), (host, "js" if needed_js else "ok", 1)])
        return self._cache.get(host, (0.0, "http"))[1]

    async def flush(self) -> None:
        """Send the counted observations now (all hosts in one round trip)."""
        async with self._lock:
            await self._send(self._take())

    async def remember(self, host: str, mode: str) -> None:
        """Set ``host``'s rung outright: ``api`` after the browser failed and the fetch
        API delivered, ``browser`` when the browser works for it again."""
        try:
            pipe = self.server.pipeline(transaction=True)
            pipe.hset(self.key(host), "mode", mode)
            pipe.pexpire(self.key(host), self.ttl_ms)
            await answer(pipe.execute())
        except REDIS_ERRORS as exc:
            self._redis_down(exc)
        self._cache[host] = (time.monotonic() + self.cache_seconds, mode)

    async def _send_batch(self) -> None:
        if not self._background:
            await self.flush()
        elif self._sending is None or self._sending.done():
            self._sending = asyncio.ensure_future(self.flush())
            self._sending.add_done_callback(_log_failure)
        # else: one batch at a time; the next observation sends what gathered meanwhile

    def _take(self) -> list[Observation]:
        pending, self._pending, self._pending_count = self._pending, {}, 0
        return [(host, "ok", count) for host, count in pending.items()]

    async def _send(self, observations: list[Observation]) -> None:
        """One round trip, in order. On a Redis error they are not counted nor retried
        (the share rule is a rule of thumb; the next pages are observed again)."""
        if not observations:
            return
        try:
            modes = await run_script(self.server, self._script, [
                ([self.key(host)], [kind, self.ttl_ms, self.min_pages, self.share, count])
                for host, kind, count in observations])
        except REDIS_ERRORS as exc:
            self._redis_down(exc)
            return
        for (host, _, _), raw in zip(observations, modes, strict=True):
            self._remember_mode(host, raw)

    def _remember_mode(self, host: str, raw: Any) -> str:
        mode = raw.decode() if isinstance(raw, bytes) else str(raw)
        self._cache[host] = (time.monotonic() + self.cache_seconds, mode)
        self._down_logged = False
        return mode

    def _redis_down(self, exc: Exception) -> None:
        if not self._down_logged:
            self._down_logged = True
            logger.error("Render memory: Redis unreachable (%s); deciding from what this "
                         "worker knows until it is back", exc)


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("Render memory: sending observations failed", exc_info=task.exception())
