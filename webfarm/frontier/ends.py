"""How leases end besides an ack: given back, retried later, dead-lettered; and the
dead-letter queue's own writes. Mixed into :class:`~webfarm.frontier.core.Frontier`,
apart from its hot path (push, pop, ack)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis


class FrontierEnds:
    """Lease endings and dead-letter writes (mixed into ``Frontier``)."""

    server: redis.Redis
    key: Callable[[str], str]
    _call: Callable[..., Any]
    lease_ms: int

    def release(self, lease_ids: Sequence[str]) -> int:
        """Give leases back at once (SIGTERM), same priority and place, attempts unchanged."""
        if not lease_ids:
            return 0
        return int(self._call("release", *lease_ids))

    def renew(self, lease_ids: Sequence[str]) -> int:
        """A live worker still works on these: each is due ``lease_ms`` from now again (a
        slow page no longer expires in a live worker and is fetched again by another).
        How many were still held."""
        if not lease_ids:
            return 0
        return len(lease_ids) - len(self._call("renew", *self._renew_args(lease_ids)))

    def _renew_args(self, lease_ids: Sequence[str]) -> list[Any]:
        return [self.lease_ms, *lease_ids]

    def release_worker(self, worker: str) -> int:
        """Give back every lease ``worker`` holds."""
        return int(self._call("release_worker", worker))

    def retry(self, lease_id: str, delay: float, reason: str, payload: str | None = None,
              spend: bool = True) -> bool:
        """Put a leased entry in the delayed set, due in ``delay`` s (see :func:`backoff`).

        Its attempts count goes up by one (``spend``: not for a request never sent);
        ``payload`` replaces the stored one if given.
        False when the lease is no longer held (expired and handed out again): then the
        entry is already back in the frontier and nothing is done.
        """
        return bool(self._call("retry", *self._retry_args(lease_id, delay, reason, payload,
                                                          spend)))

    @staticmethod
    def _retry_args(lease_id: str, delay: float, reason: str, payload: str | None = None,
                    spend: bool = True) -> list[Any]:
        has = payload is not None
        return [lease_id, max(0, round(delay * 1000)), reason, b"1" if has else b"0",
                payload or "", b"1" if spend else b"0"]

    def dead(
        self,
        lease_id: str | None,
        reason: str,
        *,
        payload: str | None = None,
        status: int | None = None,
        error: str | None = None,
    ) -> bool:
        """Move a leased entry to the dead-letter queue with why it failed.

        The dead letter keeps host, priority, attempts (tries made), first and last times,
        worker and payload. ``lease_id=None`` records a ``payload`` that was never leased.
        False when the lease is no longer held (nothing recorded).
        """
        return bool(self._call("dead", *self._dead_args(lease_id, reason, payload=payload,
                                                        status=status, error=error)))

    @staticmethod
    def _dead_args(lease_id: str | None, reason: str, *, payload: str | None = None,
                   status: int | None = None, error: str | None = None, tried: bool = True
                   ) -> list[Any]:
        return [lease_id or "", reason, b"1" if payload is not None else b"0", payload or "",
                "" if status is None else int(status), error or "", b"1" if tried else b"0"]

    def requeue_dead(self) -> int:
        """Put dead letters back in their queues with attempts reset; returns how many.

        Letters without host, priority or payload (malformed entries) stay dead.
        """
        total = int(self.server.llen(self.key("dead")))
        moved = 0
        while total > 0:
            done, examined = self._call("requeue_dead", min(total, 1000))
            moved += int(done)
            total -= int(examined)
            if not int(examined):
                break
        return moved

    def purge_dead(self) -> int:
        """Delete every dead letter; returns how many there were."""
        return int(self._call("purge_dead"))
