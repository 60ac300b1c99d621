"""The Redis client every webfarm component shares the settings of."""

from __future__ import annotations

import redis
import redis.asyncio
from scrapy.settings import BaseSettings

from webfarm import config

# What a Redis call raises when the server is unreachable or too slow to answer.
REDIS_ERRORS = (redis.ConnectionError, redis.TimeoutError, ConnectionError, TimeoutError)
# Short timeouts: a dead Redis must show up as an error, not a hung worker.
CLIENT_OPTIONS = {
    "socket_timeout": 10,
    "socket_connect_timeout": 5,
    "health_check_interval": 30,
    "retry_on_timeout": True,
}


def redis_client(settings: BaseSettings) -> redis.Redis:
    """A client for ``REDIS_URL`` (or the embedded Valkey)."""
    return redis.Redis.from_url(config.redis_url(settings), **CLIENT_OPTIONS)


def async_redis_client(settings: BaseSettings) -> redis.asyncio.Redis:
    """The same, on asyncio: the scheduler's hot path, so the reactor never waits for Redis."""
    return redis.asyncio.Redis.from_url(config.redis_url(settings), **CLIENT_OPTIONS)
