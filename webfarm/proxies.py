"""The proxy pool: health shared in Redis, a healthy proxy chosen per request.

Proxies are parsed from ``WEBFARM_PROXIES`` by :mod:`webfarm.proxyconfig` and known
here by their id (never containing the userinfo).

Health is shared by every worker through one Redis hash per proxy,
``webfarm:proxies:<id>`` (``failures``: consecutive incidents, ``cooldown_until``
and ``cooldown_from``: epoch seconds, ``retired``, counters). A failure is
recorded by one Lua script, so two workers never lose an increment. Requests
that were already in flight when an incident was recorded do not count again:
``n`` consecutive failures means ``n`` separate incidents, not one burst of
sixteen concurrent requests through a dead proxy. Each worker reads every
proxy's hash in one pipelined round trip at most every ``refresh`` seconds and
chooses locally, so the hot path costs no Redis call. The calls that reach Redis are
coroutines: on ``redis.asyncio`` (the crawl's client under the asyncio reactor) the
reactor runs on while Redis answers, as it does for the frontier's exchange.

A ban answered by the site (not the proxy) must not burn the pool:
``webfarm:proxies:hosts:<host>`` remembers, per host, when each proxy last
fetched it fine; the middleware counts a ban against a proxy only when another
proxy fetched the same host fine recently. With ``WEBFARM_PROXY_STICKY``,
``webfarm:proxies:sticky:<host>`` names the host's proxy. Both expire when
unused, and a worker keeps its own copies for the ``WEBFARM_HOST_MEMORY`` hosts used
last, so a broad crawl's hosts do not pile up in Redis or in the worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from webfarm.hostmemory import DEFAULT_SIZE, RecentHosts
from webfarm.proxyconfig import Proxy
from webfarm.redisconn import REDIS_FAILURES, AnyRedis, answer

if TYPE_CHECKING:
    import redis

logger = logging.getLogger(__name__)

KEY_PREFIX = "webfarm:proxies:"
#: the flag of a response banned through every proxy tried, none known to reach its host:
#: it may be the proxies' answer, not the site's (a robots.txt keeps it briefly)
UNPROVEN = "webfarm-proxy-unproven"


# --- shared health ------------------------------------------------------------------------

# KEYS[1] proxy hash. ARGV: now, sent_at, base, cap, max_failures, ttl, reason, counter.
# An incident counts only if the failed request was sent after the current cooldown began.
_FAILURE_LUA = """
local now = tonumber(ARGV[1])
local sent = tonumber(ARGV[2])
redis.call('HINCRBY', KEYS[1], ARGV[8], 1)
local from = tonumber(redis.call('HGET', KEYS[1], 'cooldown_from') or '0') or 0
local n = tonumber(redis.call('HGET', KEYS[1], 'failures') or '0') or 0
local counted = 0
if sent >= from then
  n = redis.call('HINCRBY', KEYS[1], 'failures', 1)
  local delay = tonumber(ARGV[3]) * (2 ^ (n - 1))
  if delay > tonumber(ARGV[4]) then delay = tonumber(ARGV[4]) end
  redis.call('HSET', KEYS[1], 'cooldown_until', tostring(now + delay),
             'cooldown_from', tostring(now), 'last_reason', ARGV[7])
  redis.call('HINCRBY', KEYS[1], 'cooldowns', 1)
  if n >= tonumber(ARGV[5]) then redis.call('HSET', KEYS[1], 'retired', '1') end
  counted = 1
end
redis.call('EXPIRE', KEYS[1], ARGV[6])
return counted
"""

# KEYS[1] proxy hash. ARGV: sent_at, ttl. A success resets the count only if it was sent
# after the last incident: an old in-flight request proves nothing about recovery.
_SUCCESS_LUA = """
local from = tonumber(redis.call('HGET', KEYS[1], 'cooldown_from') or '0') or 0
if tonumber(ARGV[1]) >= from and redis.call('HEXISTS', KEYS[1], 'retired') == 0 then
  redis.call('HSET', KEYS[1], 'failures', '0')
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_FIELDS = ("failures", "cooldown_until", "cooldown_from", "retired", "last_reason")


@dataclass
class ProxyState:
    """What every worker agrees on about one proxy (as of the last refresh)."""

    failures: int = 0
    cooldown_until: float = 0.0
    cooldown_from: float = 0.0
    retired: bool = False
    last_reason: str = ""

    def healthy(self, now: float) -> bool:
        return not self.retired and self.cooldown_until <= now

    @classmethod
    def from_redis(cls, values: Sequence[bytes | None]) -> ProxyState:
        failures, until, since, retired, reason = values

        def num(v: bytes | None) -> float:
            try:
                return float(v) if v is not None else 0.0
            except ValueError:
                return 0.0

        return cls(int(num(failures)), num(until), num(since), retired not in (None, b"0", b""),
                   (reason or b"").decode("utf-8", "replace"))


def health(server: redis.Redis, proxies: Sequence[Proxy], now: float | None = None
           ) -> list[dict[str, Any]]:
    """Each proxy's shared health as every worker sees it (for ``scrapy frontier``): its
    ``state`` (``healthy``, ``cooling``, ``retired``), ``cooling_for`` seconds, the
    ``failures`` in a row, the ``last_reason`` and the ``key`` to delete to revive it."""
    now = time.time() if now is None else now
    pipe = server.pipeline(transaction=False)
    for proxy in proxies:
        pipe.hmget(f"{KEY_PREFIX}{proxy.id}", _FIELDS)
    rows = []
    for proxy, values in zip(proxies, pipe.execute(), strict=True):
        state = ProxyState.from_redis(values)
        kind = ("retired" if state.retired else "cooling" if state.cooldown_until > now
                else "healthy")
        rows.append({"id": proxy.id, "state": kind,
                     "cooling_for": round(max(0.0, state.cooldown_until - now), 1),
                     "failures": state.failures, "last_reason": state.last_reason,
                     "key": f"{KEY_PREFIX}{proxy.id}"})
    return rows


class ProxyPool:
    """Chooses a healthy proxy per request and records outcomes in Redis.

    ``base``/``cap``: cooldown after the n-th consecutive incident is
    ``min(cap, base * 2**(n-1))`` seconds; ``max_failures`` incidents retire the
    proxy (until its Redis hash expires after ``ttl`` seconds without news, or an
    operator deletes it). ``host_window``: how recent another proxy's success
    on a host must be to blame a ban on this one.
    """

    def __init__(
        self, proxies: Sequence[Proxy], client: AnyRedis, *, base: float = 30.0,
        cap: float = 3600.0, max_failures: int = 5, refresh: float = 1.0,
        ttl: float = 86400.0, host_window: float = 600.0, sticky: bool = False,
        clock: Callable[[], float] = time.time, host_memory: int = DEFAULT_SIZE,
    ) -> None:
        if not proxies:
            raise ValueError("ProxyPool needs at least one proxy")
        self.proxies = {p.id: p for p in proxies}
        self.order = [p.id for p in proxies]
        self.redis = client
        self.base, self.cap, self.max_failures = base, cap, max(1, max_failures)
        self.refresh_interval, self.ttl = refresh, int(max(ttl, 1))
        self.host_window, self.sticky = host_window, sticky
        self.clock = clock
        self.state: dict[str, ProxyState] = {pid: ProxyState() for pid in self.order}
        self._refreshed_at = float("-inf")
        self._last_used: dict[str, float] = dict.fromkeys(self.order, 0.0)
        self._use_seq = 0
        # Per host, for the hosts used last (Redis holds the shared copies):
        self._sticky: RecentHosts[str] = RecentHosts(host_memory)
        # host -> proxy id -> epoch of the last success we know of (ours or, read lazily, others')
        self._host_ok: RecentHosts[dict[str, float]] = RecentHosts(host_memory)
        # host -> proxy id -> epoch of the last success written to Redis
        self._host_ok_written: RecentHosts[dict[str, float]] = RecentHosts(host_memory)
        self._failure_script = client.register_script(_FAILURE_LUA)
        self._success_script = client.register_script(_SUCCESS_LUA)

    @staticmethod
    def key(pid: str) -> str:
        return f"{KEY_PREFIX}{pid}"

    @staticmethod
    def host_key(host: str) -> str:
        return f"{KEY_PREFIX}hosts:{host}"

    @staticmethod
    def sticky_key(host: str) -> str:
        """A host's sticky proxy: a key per host, expiring ``ttl`` seconds after its last
        choice (one hash of every host was kept alive by any write, and grew with the
        crawl)."""
        return f"{KEY_PREFIX}sticky:{host}"

    # -- reading ---------------------------------------------------------------------------

    async def refresh(self, force: bool = False) -> bool:
        """Re-read every proxy's state in one round trip, at most every ``refresh`` s.

        Returns True when it read. A Redis error keeps the last known state: a
        hiccup must not stop a crawl that has healthy proxies.
        """
        mono = time.monotonic()
        if not force and mono - self._refreshed_at < self.refresh_interval:
            return False
        self._refreshed_at = mono
        try:
            pipe = self.redis.pipeline(transaction=False)
            for pid in self.order:
                pipe.hmget(self.key(pid), _FIELDS)
            rows = await answer(pipe.execute())
        except REDIS_FAILURES as exc:
            logger.warning("proxy health: Redis read failed, keeping the last state: %s", exc)
            return False
        for pid, row in zip(self.order, rows, strict=True):
            state = ProxyState.from_redis(row)
            if self.state[pid].retired and not state.retired:  # nothing said it before
                logger.info("Proxy %s is back in use: its health key %s was deleted or "
                            "expired", pid, self.key(pid))
            self.state[pid] = state
        return True

    def healthy_ids(self, now: float | None = None) -> list[str]:
        """As of the last :meth:`refresh` (which :meth:`pick` makes when one is due)."""
        now = self.clock() if now is None else now
        return [pid for pid in self.order if self.state[pid].healthy(now)]

    def retired_ids(self) -> list[str]:
        return [pid for pid in self.order if self.state[pid].retired]

    def next_available(self) -> float | None:
        """Epoch when the first proxy in cooldown comes back, None if all are retired."""
        times = [s.cooldown_until for s in self.state.values() if not s.retired]
        return min(times) if times else None

    # -- choosing --------------------------------------------------------------------------

    async def pick(self, host: str, exclude: Iterable[str] = ()) -> Proxy | None:
        """A healthy proxy for ``host``, not one of ``exclude``; None if there is none.

        Least recently used among the healthy ones (round-robin under steady
        load), or the host's sticky proxy while it stays healthy.
        """
        excluded = set(exclude)
        await self.refresh()
        healthy = [pid for pid in self.healthy_ids() if pid not in excluded]
        if not healthy:
            return None
        chosen: str | None = None
        if self.sticky:
            chosen = await self._sticky_choice(host, healthy, bool(excluded))
        new_sticky = False
        if chosen is None:
            chosen = min(healthy, key=lambda pid: self._last_used[pid])
            new_sticky = self.sticky and not excluded
        self._use_seq += 1
        self._last_used[chosen] = self._use_seq  # before any await: others pick after it
        if new_sticky:
            await self._set_sticky(host, chosen)
        return self.proxies[chosen]

    async def _sticky_choice(self, host: str, healthy: list[str], retrying: bool
                             ) -> str | None:
        current = self._sticky.get(host)
        if current in healthy:
            return current
        if retrying:
            return None
        try:
            shared = await answer(self.redis.get(self.sticky_key(host)))
        except REDIS_FAILURES:
            shared = None
        current = self._sticky.get(host)
        if current in healthy:  # chosen by a request of this host while we read
            return current
        pid = shared.decode() if shared else None
        if pid in healthy:
            self._sticky[host] = pid
            return pid
        return None

    async def _set_sticky(self, host: str, pid: str) -> None:
        self._sticky[host] = pid
        try:
            await answer(self.redis.set(self.sticky_key(host), pid, ex=self.ttl))
        except REDIS_FAILURES as exc:
            logger.warning("proxy sticky map: Redis write failed: %s", exc)

    # -- outcomes --------------------------------------------------------------------------

    async def record_success(self, pid: str, host: str, sent_at: float) -> None:
        """The proxy fetched ``host`` fine. Costs a Redis write only when news."""
        now = self.clock()
        local = self._host_ok.get(host) or {}
        local[pid] = now
        self._host_ok[host] = local
        written = self._host_ok_written.get(host) or {}
        self._host_ok_written[host] = written
        try:
            if now - written.get(pid, 0.0) > min(30.0, self.host_window / 4):
                written[pid] = now
                pipe = self.redis.pipeline(transaction=False)
                pipe.hset(self.host_key(host), pid, f"{now:.3f}")
                pipe.expire(self.host_key(host), int(max(self.host_window, 1)))
                await answer(pipe.execute())
            state = self.state[pid]
            recovered = state.failures and sent_at >= state.cooldown_from and not state.retired
            if recovered and await answer(
                    self._success_script(keys=[self.key(pid)], args=[sent_at, self.ttl])):
                state.failures = 0
        except REDIS_FAILURES as exc:
            logger.warning("proxy health: Redis write failed: %s", exc)

    async def host_ok_elsewhere(self, host: str, pid: str = "") -> bool:
        """Did a proxy other than ``pid`` (any, without one) fetch ``host`` fine within
        ``host_window`` seconds?"""
        since = self.clock() - self.host_window
        local = self._host_ok.get(host) or {}
        if any(other != pid and ts >= since for other, ts in local.items()):
            return True
        try:
            shared = await answer(self.redis.hgetall(self.host_key(host)))
        except REDIS_FAILURES:
            return False
        for other, ts in shared.items():
            other_id = other.decode()
            try:
                when = float(ts)
            except ValueError:
                continue
            if other_id != pid and when >= since:
                local[other_id] = max(when, local.get(other_id, 0.0))
                self._host_ok[host] = local
                return True
        return False

    async def record_failure(self, pid: str, reason: str, sent_at: float,
                             counter: str = "bans") -> tuple[bool, ProxyState]:
        """Count an incident against ``pid``: cooldown with growing backoff, maybe retire.

        Returns (counted, state): ``counted`` is False when the request was sent
        before the proxy's current cooldown began (same incident, already
        counted). ``reason`` must not hold secrets; it is stored in Redis.
        """
        now = self.clock()
        try:
            counted = bool(await answer(self._failure_script(
                keys=[self.key(pid)],
                args=[now, sent_at, self.base, self.cap, self.max_failures, self.ttl,
                      reason[:200], counter],
            )))
            row = await answer(self.redis.hmget(self.key(pid), _FIELDS))
            self.state[pid] = ProxyState.from_redis(row)
        except REDIS_FAILURES as exc:
            logger.warning("proxy health: Redis write failed, cooling %s down locally: %s",
                           pid, exc)
            state = self.state[pid]
            counted = sent_at >= state.cooldown_from
            if counted:
                state.failures += 1
                state.cooldown_from = now
                state.cooldown_until = now + min(self.cap,
                                                 self.base * 2 ** (state.failures - 1))
                state.retired = state.failures >= self.max_failures
        return counted, self.state[pid]
