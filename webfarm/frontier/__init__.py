"""webfarm's shared crawl frontier in Redis (see :mod:`webfarm.frontier.core`)."""

from webfarm.frontier.aio import AsyncFrontier
from webfarm.frontier.core import (
    MAX_PUSH,
    Entry,
    Exchange,
    Frontier,
    Popped,
    backoff,
    key_prefix,
)

__all__ = ["MAX_PUSH", "AsyncFrontier", "Entry", "Exchange", "Frontier", "Popped", "backoff",
           "key_prefix"]
