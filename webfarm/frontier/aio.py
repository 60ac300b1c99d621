"""The frontier's hot path on asyncio: the scheduler's exchanges, off the reactor's back.

A blocking exchange holds the reactor thread for a round trip to Redis (about
1 ms on a busy machine, some 70 times a second in a fast crawl); here the event
loop runs on meanwhile. Same script, same arguments, same answers as
:meth:`Frontier.exchange <webfarm.frontier.core.Frontier.exchange>`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import redis.asyncio

from webfarm.frontier.core import SCRIPT, Entry, Exchange, Frontier
from webfarm.redisconn import run_script


class AsyncFrontier:
    """A :class:`Frontier`'s exchange through a ``redis.asyncio`` client (closed by
    :meth:`aclose`)."""

    def __init__(self, frontier: Frontier, client: redis.asyncio.Redis) -> None:
        self.frontier = frontier
        self.client = client
        self._script = client.register_script(SCRIPT)

    async def exchange(
        self,
        worker: str,
        *,
        push: Sequence[Entry] = (),
        ack: Sequence[str] = (),
        pop: int = 1,
        delays: Mapping[str, float] | None = None,
        ops: Sequence[tuple[str, Sequence[Any]]] = (),
    ) -> Exchange:
        """:meth:`Frontier.exchange`, in one round trip with: ``delays`` (host ->
        seconds, as :meth:`Frontier.set_delay`), set first, since the latency rule changes
        a host's delay after most responses; and ``ops``, the script's other calls
        (``("retry", Frontier._retry_args(...))``, ``dead``, ``defer``), run last, so a
        retried parent never lands before the children pushed with it."""
        f = self.frontier
        steps = f._steps(worker, push, ack, pop)
        calls = [["set_delay", *f._delay_args(host, seconds)]
                 for host, seconds in (delays or {}).items()]
        first = len(calls)
        calls += [["step", *args] for args, _ in steps]
        calls += [[name, *args] for name, args in ops]
        if len(calls) == 1:
            replies = [await self._script(keys=f._keys, args=[f.prefix, *calls[0]])]
        else:
            replies = await run_script(self.client, self._script,
                                       [(f._keys, [f.prefix, *args]) for args in calls])
        replies = replies[first:first + len(steps)]
        return f._joined([f._step_reply(reply, n)
                          for reply, (_, n) in zip(replies, steps, strict=True)])

    async def arrive(self, host: str, lease_id: str, record: bool = True) -> float:
        """Seconds the request of ``lease_id`` must still wait before it reaches ``host``
        (the script's ``arrive``; it counts as arrived then)."""
        f = self.frontier
        reply = await self._script(keys=f._keys, args=[
            f.prefix, "arrive", host, lease_id, round(f.default_delay * 1000),
            "1" if record else "0", f.lease_ms])
        return int(reply) / 1000

    async def renew(self, lease_ids: list[str]) -> set[str]:
        """:meth:`Frontier.renew <webfarm.frontier.ends.FrontierEnds.renew>`, not blocking:
        the leases of ``lease_ids`` no longer held."""
        f = self.frontier
        reply = await self._script(keys=f._keys, args=[f.prefix, "renew",
                                                       *f._renew_args(lease_ids)])
        return {r.decode() if isinstance(r, bytes) else str(r) for r in reply}

    async def is_idle(self) -> bool:
        """:meth:`Frontier.is_idle <webfarm.frontier.core.Frontier.is_idle>`, not blocking."""
        f = self.frontier
        return f._idle_reply(await self._script(keys=f._keys, args=[f.prefix, *f._idle_call()]))

    async def aclose(self) -> None:
        await self.client.aclose()
