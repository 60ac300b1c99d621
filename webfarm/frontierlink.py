"""A worker's link to the frontier: what it holds for Redis and the calls that carry it.

Links to push, leases to acknowledge and delay changes wait here and travel in
one exchange; retries, dead letters and deferrals queue behind it, so a retried
parent never lands before its children. Under a running asyncio loop (the
reactor's) an exchange does not block, and those calls travel in its round trip
too: one exchange is in flight at a time, so order holds, and its result goes to
``on_exchange``. When Redis is unreachable
everything stays held: one line is logged, and calls back off and try again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import redis
from scrapy.statscollectors import StatsCollector

from webfarm import advice
from webfarm.frontier import AsyncFrontier, Entry, Exchange, Frontier
from webfarm.hostmemory import DEFAULT_SIZE, RecentHosts
from webfarm.redisconn import REDIS_ERRORS

logger = logging.getLogger(__name__)


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # called outside the reactor (a test, a command): block instead
        return False
    return True


def outage(exc: BaseException) -> str:
    """Why Redis cannot take the frontier's calls now, and what would end it."""
    if isinstance(exc, redis.exceptions.OutOfMemoryError):
        return (f"Redis is full ({exc}): raise its maxmemory or free memory (scrapy frontier "
                "SPIDER shows what a spider's frontier holds)")
    if isinstance(exc, redis.exceptions.ReadOnlyError):
        return (f"Redis is read-only ({exc}): REDIS_URL names a replica, or a failover is "
                "under way")
    return f"Redis unreachable ({exc})"


class FrontierLink:
    def __init__(
        self, frontier: Frontier, worker: str, stats: StatsCollector | None = None,
        aio: AsyncFrontier | None = None,
        on_exchange: Callable[[Exchange, int, bool], None] | None = None,
        leases_held: Callable[[], int] = lambda: 0,
        on_idle_answer: Callable[[], None] = lambda: None,
        on_lost_writes: Callable[[], None] = lambda: None,
        host_memory: int = DEFAULT_SIZE,
    ) -> None:
        self.frontier = frontier
        self.worker = worker
        self.stats = stats
        self.aio = aio  # None: every call blocks
        #: ``(result, pop, later)`` after each exchange; ``later`` for one that did not block
        self.on_exchange = on_exchange or (lambda result, pop, later: None)
        self.leases_held = leases_held  # for the outage log line
        self.on_idle_answer = on_idle_answer  # a check of frontier_idle() is back
        #: Redis lost writes of this worker it had acknowledged (see :meth:`_check_count`)
        self.on_lost_writes = on_lost_writes
        self._count = 0  # this worker's exchanges, as the frontier last counted them
        self._fleet_said = 0  # the fleet's default delay (ms) last seen; said if above ours
        self._idle_check: asyncio.Future[bool] | None = None
        self.push: list[Entry] = []
        self.acks: list[str] = []
        self.delays: dict[str, float] = {}  # host -> seconds, the latest change of each
        # Script calls after the exchange: ("retry", Frontier._retry_args(...)), "dead", ...
        self.ops: deque[tuple[str, list[Any]]] = deque()
        self.in_flight: asyncio.Future[None] | None = None
        self.down_since: float | None = None
        self._retry_at = 0.0
        # hosts whose used budget was logged (the last ``host_memory`` of them)
        self._budget_said: RecentHosts[None] = RecentHosts(host_memory)
        self._failures = 0

    def waiting(self) -> bool:
        """Redis was unreachable and the backoff has not passed yet."""
        return self.down_since is not None and time.monotonic() < self._retry_at

    # -- calls ----------------------------------------------------------------------------

    def op(self, name: str, args: list[Any]) -> None:
        """Send a frontier script call (``retry``, ``dead``, ``defer``, ``set_delay``)
        now, without blocking when a loop runs, or keep it for when Redis is back."""
        self.ops.append((name, args))
        if not self.waiting() and not self.start(0):
            self.run_ops()

    def run_ops(self) -> None:
        """The held calls, blocking."""
        if self.in_flight or self.waiting():
            return  # the exchange in flight runs these when it is back
        # Pushes and acks first, so a retried parent never lands before its children
        # (a delay or a deferral does not care, and skips that extra round trip).
        ordered = any(name in ("retry", "dead") for name, _ in self.ops)
        if ordered and (self.push or self.acks) and self.exchange(pop=0) is None:
            return
        while self.ops:
            name, args = self.ops[0]
            try:
                self.frontier._call(name, *args)
            except REDIS_ERRORS as exc:
                self.error(exc)
                return
            self.ops.popleft()
        self.ok()

    def exchange(self, pop: int) -> Exchange | None:
        """A blocking exchange; None when Redis is unreachable (everything stays held)."""
        push, acks = self.push, self.acks
        try:
            result = self.frontier.exchange(self.worker, push=push, ack=acks, pop=pop)
        except REDIS_ERRORS as exc:
            self.error(exc)
            return None
        self.push, self.acks = [], []
        self._succeeded(push, result, pop, later=False)
        return result

    def start(self, pop: int) -> bool:
        """Start an exchange that does not block, unless one is in flight; False when
        there is no asyncio loop to run it (the caller blocks instead)."""
        if self.aio is None or not _loop_running():
            return False
        if self.in_flight is None:
            self.in_flight = asyncio.ensure_future(self._exchange_async(pop))
        return True

    async def _exchange_async(self, pop: int) -> None:
        assert self.aio is not None
        push, acks, delays, ops = self.push, self.acks, self.delays, list(self.ops)
        self.push, self.acks, self.delays = [], [], {}
        self.ops.clear()
        try:
            result = await self.aio.exchange(self.worker, push=push, ack=acks, pop=pop,
                                             delays=delays, ops=ops)
        except Exception as exc:  # kept, in order, for the next exchange
            self.push[:0] = push
            self.acks[:0] = acks
            if isinstance(exc, REDIS_ERRORS):
                self.delays = {**delays, **self.delays}  # a newer one wins
                self.ops.extendleft(reversed(ops))
            elif delays or ops:
                # Not an outage: one of these may be what fails, and the crawl must not
                # stall on it. Their leases expire and come back; delays are set again.
                logger.error("Dropped %d delay changes and %d retries, dead letters or "
                             "deferrals of a failed exchange; their leases expire and return "
                             "to the frontier", len(delays), len(ops))
            self.error(exc)
            return
        finally:
            self.in_flight = None
        self._succeeded(push, result, pop, later=True)
        if self.ops:  # came while this one was on its way
            self.start(0)

    async def arrive(self, host: str, lease_id: str, record: bool = True) -> float:
        """Seconds a render of ``lease_id`` must still wait before it reaches ``host``; 0
        while Redis cannot say (it hands out nothing meanwhile either). ``record=False``
        (a late HTTP request): the host's next hand-out waits a delay after it, but the
        host joins the ``arrived`` hash only if a render put it there."""
        if self.aio is None or self.waiting():
            return 0.0
        try:
            return await self.aio.arrive(host, lease_id, record)
        except REDIS_ERRORS as exc:
            self.error(exc)
            return 0.0

    async def renew(self, lease_ids: list[str]) -> set[str] | None:
        """Renew leases this worker still works on; those no longer held (expired while
        it stalled, and handed out again), or None while Redis cannot say."""
        if self.aio is None or self.waiting():
            return None
        try:
            return await self.aio.renew(lease_ids)
        except REDIS_ERRORS as exc:
            self.error(exc)
            return None

    def frontier_idle(self) -> bool | None:
        """Is the whole frontier empty (nothing queued, delayed or leased, by any worker)?

        Without a running loop, asked now (blocking). Under one, the answer of the check
        the previous call sent; None when it was sent now or is still on its way
        (``on_idle_answer`` runs when it is back), and while Redis is unreachable."""
        if self.aio is None or not _loop_running():
            try:
                return self.frontier.is_idle()
            except REDIS_ERRORS as exc:
                self.error(exc)
                return None
        check = self._idle_check
        if check is None:
            self._idle_check = asyncio.ensure_future(self.aio.is_idle())
            self._idle_check.add_done_callback(self._idle_answered)
            return None
        if not check.done():
            return None
        self._idle_check = None
        try:
            idle = check.result()
        except Exception as exc:  # logged (an outage once), and asked again next time
            self.error(exc)
            return None
        self.ok()
        return idle

    def forget_idle_answer(self) -> None:
        """Work came: an answer sent before it may be out of date; the next call asks anew."""
        self._idle_check = None

    def _idle_answered(self, check: asyncio.Future[bool]) -> None:
        if not check.cancelled():
            check.exception()  # seen: a forgotten check's error is not worth a log line
        self.on_idle_answer()

    def flush(self, force: bool = False) -> None:
        """Send what is held now, blocking (``force``: even within the backoff)."""
        if self.in_flight:
            return  # the exchange in flight goes first; the next tick sends the rest
        if force:
            self._retry_at = 0.0
        for host, seconds in self.delays.items():
            self.ops.append(("set_delay", self.frontier._delay_args(host, seconds)))
        self.delays = {}
        if self.push or self.acks:
            self.exchange(pop=0)
        if self.ops:
            self.run_ops()

    def tick(self) -> None:
        """Send what is held, without blocking when a loop runs (a timer's call)."""
        if (self.push or self.acks or self.delays or self.ops) and self.start(0):
            return
        self.flush()

    async def settle(self) -> None:
        """Wait for the exchange in flight (it ends within the client's timeout)."""
        if self.in_flight is not None:
            await self.in_flight

    async def aclose(self) -> None:
        if self.aio is not None:
            await self.aio.aclose()

    # -- Redis trouble ----------------------------------------------------------------------

    def error(self, exc: Exception) -> None:
        now = time.monotonic()
        self._failures += 1
        self._retry_at = now + min(30.0, 0.5 * 2 ** min(self._failures, 6))
        redis_down = isinstance(exc, REDIS_ERRORS)
        if not redis_down:  # Redis refused this call (a bug, a script error): each time
            logger.error("Frontier exchange failed: %s: %s", type(exc).__name__, exc,
                         exc_info=None if isinstance(exc, redis.RedisError) else exc)
        if self.down_since is None:
            self.down_since = now
            logger.error(
                "%s; holding %d links, %d acks, %d other operations and %d in-flight leases, "
                "retrying with backoff", outage(exc) if redis_down else "Frontier exchanges fail",
                len(self.push), len(self.acks), len(self.ops), self.leases_held(),
            )
            if redis_down:
                self._inc("webfarm/frontier/redis_outages")

    def ok(self) -> None:
        if self.down_since is not None:
            logger.info("Frontier exchanges work again (Redis reachable again) after %.1fs",
                        time.monotonic() - self.down_since)
            self.down_since = None
        self._failures = 0

    def _succeeded(self, push: list[Entry], result: Exchange, pop: int, later: bool) -> None:
        """What follows an exchange Redis took, blocking or not."""
        self.ok()
        self._check_count(result)
        self._check_fleet_default(result)
        self._counted(push, result)
        self.on_exchange(result, pop, later)

    def _check_count(self, result: Exchange) -> None:
        """Each exchange adds one to this worker's count in the frontier, in the same atomic
        call. A count no higher than the last one seen means Redis lost writes it had
        acknowledged: it restarted from an older snapshot (or empty), or failed over to a
        replica that lagged. (A count that skips one is a call redis-py retried after a
        dropped connection, applied twice: nothing lost.)"""
        if not result.count:
            return
        if result.count <= self._count:
            logger.warning(
                "Redis lost this worker's last %d frontier exchanges (it restarted from an "
                "older state, or failed over to a replica that lagged; or `scrapy frontier "
                "--reset` ran while this worker did): the links they "
                "pushed are queued again as pages that found them are fetched again, once "
                "their leases expire (WEBFARM_LEASE_SECONDS); host delays are set again",
                self._count - result.count + 1)
            self._inc("webfarm/frontier/lost_writes")
            self.on_lost_writes()
        self._count = result.count

    def _check_fleet_default(self, result: Exchange) -> None:
        """Say when the fleet's default host delay rises above this worker's: a worker
        started later with a longer one slowed every crawl of the frontier, and only the
        workers that started after it were told, at their start."""
        ms = result.fleet_default_ms
        if ms == self._fleet_said:
            return
        self._fleet_said = ms
        own = self.frontier.default_delay
        if ms > round(own * 1000):
            advice.shorter_default_delay(own, {result.fleet_default_of or "?": ms / 1000},
                                         self.frontier.prefix)

    def _counted(self, push: list[Entry], result: Exchange) -> None:
        if result.expired:
            # A worker killed with kill -9 said nothing, and neither did the one that took
            # its work back: `scrapy frontier` alone showed it, minutes later.
            self._inc("webfarm/frontier/expired_taken_back", result.expired)
            logger.warning("%d leases expired and went back to the frontier, of worker(s) %s "
                           "(killed, or stalled past WEBFARM_LEASE_SECONDS): their pages are "
                           "fetched again", result.expired,
                           ", ".join(result.expired_from) or "unknown")
        added, over = sum(result.enqueued), sum(result.over_budget)
        self._inc("webfarm/frontier/enqueued", added)
        self._inc("webfarm/frontier/duplicates", len(push) - added - over)
        if over:
            self._inc("webfarm/frontier/over_host_budget", over)
            for entry, refused in zip(push, result.over_budget, strict=True):
                if refused and entry.host not in self._budget_said:
                    self._budget_said.add(entry.host)
                    logger.info("%s has used its budget of %d URLs (WEBFARM_HOST_BUDGET): "
                                "its new links are not queued (webfarm/frontier/"
                                "over_host_budget)", entry.host, self.frontier.host_budget)

    def _inc(self, key: str, count: int = 1) -> None:
        if self.stats is not None and count:
            self.stats.inc_value(key, count)
