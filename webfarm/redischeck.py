"""Is the Redis in ``REDIS_URL`` one the frontier can live in? Checked at start.

A worker and the commands that write to the frontier check, in one line each: the
server answers and takes the credentials; its user may run the frontier's Lua scripts
on the spider's keys; it does not evict keys of its choice when full (the queues,
leases and seen URLs would vanish silently); and, as a warning, that it keeps the
frontier somewhere a restart does not empty. Where the server is comes from
:mod:`webfarm.config`.
"""

from __future__ import annotations

import logging
from typing import Any

from webfarm.config import ConfigError, safe_url

logger = logging.getLogger(__name__)

#: Run through EVALSHA as the frontier's scripts are: reads and writes (a DEL of a key
#: nobody uses) under the spider's prefix, so an ACL user that may not is refused at start.
_ACCESS_CHECK = "redis.call('EXISTS', KEYS[1]) return redis.call('DEL', KEYS[1])"


def check_redis(url: str, variable: str = "REDIS_URL", timeout: float = 5.0,
                spider: str | None = None) -> None:
    """The server answers and takes the URL's credentials; with ``spider``, its user may
    also run Lua scripts on that spider's keys, as every frontier call does."""
    import redis

    from webfarm.frontier.core import key_prefix

    try:
        probe = None if spider is None else key_prefix(spider) + "access-check"
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    client = None
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
        client.ping()
        if probe is not None:
            _check_scripts(client, probe, url, variable)
            _check_eviction(client, url, variable)
            _check_durability(client, url, variable)
    except redis.AuthenticationError as exc:  # reached, and it wants (other) credentials
        if client is not None and client.get_connection_kwargs().get("password") is None:
            raise ConfigError(
                f"{variable}: {safe_url(url)} requires a password; put it in the URL: "
                "redis://:PASSWORD@host:port/db (redis://USER:PASSWORD@... for an ACL user)"
            ) from None
        raise ConfigError(f"{variable}: {safe_url(url)} refused the user name or password "
                          f"({exc}); fix them in the URL") from None
    except redis.exceptions.NoPermissionError as exc:
        raise ConfigError(_redis_refused(exc, client, variable)) from None
    except redis.ResponseError as exc:  # it answered: "DB index is out of range", ...
        raise ConfigError(f"{variable}: {safe_url(url)} refused ({exc}); fix the URL") from None
    except (redis.RedisError, ValueError, OSError) as exc:
        if _not_redis(exc):
            raise ConfigError(
                f"{variable}: {safe_url(url)} is not a Redis server: something there took "
                f"the connection but did not answer as Redis does ({exc}); is that another "
                "service's port? Point the URL at Redis or Valkey (port 6379 by default)"
            ) from None
        raise ConfigError(
            f"{variable}: cannot reach {safe_url(url)} ({exc}); start that server or fix the URL"
        ) from None
    finally:
        if client is not None:
            client.close()


def _not_redis(exc: BaseException) -> bool:
    """Was the connection made, and the reply not Redis's (an HTTP server's page, MongoDB
    closing on a command it cannot read, or silence)? Said as "cannot reach" before, with
    the server running."""
    import redis

    text = str(exc)
    return isinstance(exc, redis.exceptions.InvalidResponse) or any(
        marker in text for marker in ("reading from", "Connection closed by server"))


def _check_scripts(client: Any, probe: str, url: str, variable: str) -> None:
    """Run :data:`_ACCESS_CHECK` on ``probe``; NOPERM goes up to :func:`check_redis`."""
    import redis

    try:
        client.register_script(_ACCESS_CHECK)(keys=[probe])
    except redis.exceptions.NoPermissionError:
        raise
    except redis.ResponseError as exc:  # e.g. a managed Redis with scripting switched off
        raise ConfigError(
            f"{variable}: {safe_url(url)} refused a Lua script ({exc}); webfarm's frontier "
            "runs them (EVALSHA, SCRIPT LOAD): use a Redis or Valkey that allows them"
        ) from None


def _check_eviction(client: Any, url: str, variable: str) -> None:
    """ConfigError when the server drops keys of its choice once full (``maxmemory`` with
    an ``allkeys-*`` policy, as a cache is set up): the frontier's queues, leases and seen
    URLs would vanish without an error. A ``volatile-*`` policy drops only keys with a
    TTL (webfarm's caches: robots.txt, render memory, metrics), so it is fine; a server
    that does not let this user run INFO is not judged."""
    import redis

    try:
        memory = client.info("memory")
    except redis.ResponseError:  # NOPERM (INFO is @dangerous) or INFO renamed away
        return
    policy = str(memory.get("maxmemory_policy", ""))
    limit = int(memory.get("maxmemory") or 0)
    if limit > 0 and policy.startswith("allkeys-"):
        raise ConfigError(
            f"{variable}: {safe_url(url)} evicts keys when it is full (maxmemory "
            f"{limit / 2**20:,.0f} MiB, maxmemory-policy {policy}): the frontier's queues, "
            "leases and seen URLs would disappear without an error. Set maxmemory-policy "
            "noeviction (or a volatile-* policy) on that server, or use another one")


def _check_durability(client: Any, url: str, variable: str) -> None:
    """Warn when the server keeps the frontier in memory only (``appendonly no`` and no
    ``save`` points): a restart of it loses every queued URL, lease and seen URL, and the
    crawl has to be seeded again. Not refused: a throwaway crawl may choose that. With
    snapshots only, a restart goes back to the last one, and what was done since is done
    again (refetched, upserted), not lost. A server that does not let this user run
    ``CONFIG GET`` (most managed ones) is not judged."""
    import redis

    try:
        if int(client.info("persistence").get("aof_enabled") or 0):
            return
        saves = client.config_get("save").get("save")
    except redis.ResponseError:  # NOPERM, or CONFIG renamed away
        return
    if saves is None or str(saves).strip():
        return
    logger.warning(
        "%s: %s keeps the frontier in memory only (appendonly no, no save points): if that "
        "server restarts, the queued URLs, leases and seen URLs are gone and the spider "
        "must be seeded again. Set appendonly yes (appendfsync everysec) on it",
        variable, safe_url(url))


def redis_address(client: Any) -> str:
    """``redis://host:port/db`` (or ``unix://path``) of a redis-py client, for messages:
    no credentials."""
    kw = client.get_connection_kwargs()
    if kw.get("path"):
        return f"unix://{kw['path']}"
    return f"redis://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"


def _redis_refused(exc: Exception, client: Any, variable: str = "REDIS_URL") -> str:
    """What to do when Redis's ACL refuses ``client``'s user a command or a key (NOPERM)."""
    user = client.get_connection_kwargs().get("username") or "default"
    return (f"{variable}: user {user!r} at {redis_address(client)} may not do what webfarm "
            f"needs ({exc}): run Lua scripts (EVALSHA, SCRIPT LOAD) that read and write the "
            f"keys webfarm:*; grant that, e.g. ACL SETUSER {user} ~webfarm:* +@all -@dangerous")
