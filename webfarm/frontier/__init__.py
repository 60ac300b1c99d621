"""webfarm's shared crawl frontier in Redis (see :mod:`webfarm.frontier.core`)."""

from webfarm.frontier.core import (
    MAX_PUSH,
    SCRIPT,
    Entry,
    Exchange,
    Frontier,
    Popped,
    backoff,
    key_prefix,
)

__all__ = ["MAX_PUSH", "SCRIPT", "Entry", "Exchange", "Frontier", "Popped", "backoff", "key_prefix"]
