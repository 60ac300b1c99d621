"""The Redis client every webfarm component shares the settings of."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import NoScriptError
from scrapy.settings import BaseSettings
from scrapy.utils.reactor import is_asyncio_reactor_installed, is_reactor_installed

from webfarm import config

# What a Redis call raises when the server cannot take work now and will again:
# unreachable or too slow to answer, full (maxmemory with noeviction refuses writes), or
# read-only (a replica; a failover under way). Callers keep what they hold and retry.
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError,
                redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)
# Any way a Redis call can fail, refusals (out of memory, read-only) included, on either
# client (redis.asyncio lets OS errors through): for components that carry on without it.
REDIS_FAILURES = (redis.RedisError, OSError, TimeoutError)
# Short timeouts: a dead Redis must show up as an error, not a hung worker.
CLIENT_OPTIONS = {
    "socket_timeout": 10,
    "socket_connect_timeout": 5,
    "health_check_interval": 30,
    "retry_on_timeout": True,
}

AnyRedis = redis.Redis | redis.asyncio.Redis


def redis_client(settings: BaseSettings) -> redis.Redis:
    """A client for ``REDIS_URL`` (or the embedded Valkey)."""
    return redis.Redis.from_url(config.redis_url(settings), **CLIENT_OPTIONS)


def async_redis_client(settings: BaseSettings) -> redis.asyncio.Redis:
    """The same, on asyncio: the scheduler's hot path, so the reactor never waits for Redis."""
    return redis.asyncio.Redis.from_url(config.redis_url(settings), **CLIENT_OPTIONS)


def crawl_redis_client(settings: BaseSettings) -> AnyRedis:
    """The client for a component that awaits its calls during a crawl (via :func:`answer`):
    ``redis.asyncio`` under the asyncio reactor (webfarm's), so the reactor runs on while
    Redis answers; the blocking client under any other reactor, or none yet."""
    if is_reactor_installed() and is_asyncio_reactor_installed():
        return async_redis_client(settings)
    return redis_client(settings)


async def answer(call: Any) -> Any:
    """What a Redis call returns, from either client: awaited on ``redis.asyncio``, as it
    is from the blocking client (one code path for both)."""
    return await call if inspect.isawaitable(call) else call


async def close_client(client: AnyRedis) -> None:
    if isinstance(client, redis.asyncio.Redis):
        await client.aclose()
    else:
        client.close()


async def run_script(client: AnyRedis, script: Any, calls: Sequence[tuple[Sequence[Any],
                                                                          Sequence[Any]]]
                     ) -> list[Any]:
    """Calls (keys, args) of one registered Lua script in one round trip, in order (a
    non-transactional pipeline of EVALSHA). NOSCRIPT (a restarted or flushed server)
    means none ran: the script is loaded and they are sent again. redis-py's own
    pipelines would ask SCRIPT EXISTS first, a round trip each time."""
    for attempt in (1, 2):
        pipe = client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        replies = await answer(pipe.execute(raise_on_error=False))
        if attempt == 1 and any(isinstance(r, NoScriptError) for r in replies):
            script.sha = await answer(client.script_load(script.script))
            continue
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return list(replies)
    raise AssertionError("unreachable")


@contextlib.contextmanager
def held(server: redis.Redis, key: str, owner: str, seconds: float) -> Iterator[str | None]:
    """Hold ``key`` (``SET NX PX``) for the ``with`` block: None when this one holds it,
    else who does (its value). Given back at the end; expires by itself if its holder
    dies. For work two runs must not do at once (they would both queue the same URLs)."""
    if not server.set(key, owner, nx=True, px=max(1, round(seconds * 1000))):
        holder = server.get(key)
        yield holder.decode("utf-8", "replace") if holder else "someone"
        return
    try:
        yield None
    finally:
        with contextlib.suppress(*REDIS_FAILURES):
            server.eval(_RELEASE, 1, key, owner)


_RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end"
