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
from redis.exceptions import NoScriptError

from webfarm.frontier.core import SCRIPT, Entry, Exchange, Frontier


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
    ) -> Exchange:
        """:meth:`Frontier.exchange`; ``delays`` (host -> seconds, as
        :meth:`Frontier.set_delay`) are set first, in the same round trip: the latency
        rule changes a host's delay after most responses."""
        f = self.frontier
        steps = f._steps(worker, push, ack, pop)
        calls = [["set_delay", *f._delay_args(host, seconds)]
                 for host, seconds in (delays or {}).items()]
        calls += [["step", *args] for args, _ in steps]
        if len(calls) == 1:
            replies = [await self._script(keys=f._keys, args=[f.prefix, *calls[0]])]
        else:
            replies = await self._pipelined(calls)
        replies = replies[len(calls) - len(steps):]
        return f._joined([f._step_reply(reply, n)
                          for reply, (_, n) in zip(replies, steps, strict=True)])

    async def _pipelined(self, calls: list[list[Any]]) -> list[Any]:
        """The script's calls in one round trip. NOSCRIPT (a restarted or flushed server)
        means none ran: load the script and send them again."""
        f, script = self.frontier, self._script
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            for args in calls:
                pipe.evalsha(script.sha, len(f._keys), *f._keys, f.prefix, *args)
            replies = await pipe.execute(raise_on_error=False)
            if attempt == 1 and any(isinstance(r, NoScriptError) for r in replies):
                script.sha = await self.client.script_load(script.script)
                continue
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            return list(replies)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self.client.aclose()
