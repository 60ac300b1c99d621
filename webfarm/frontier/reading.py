"""What a frontier holds: counts, hosts, the dupefilter, dead letters (read only; the
count of queued entries heals itself when it drifted). For ``scrapy frontier``,
``scrapy dlq``, monitoring and the idle check; kept apart from
:mod:`webfarm.frontier.core`, whose hot path (push, pop, ack) and writes are the part
every worker runs. :class:`~webfarm.frontier.core.Frontier` inherits these.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import redis

from webfarm.frontier.bloom import hash_pair

MAX_READ = 1000  # fingerprints per script call of seen_many: each call stays short


def as_text(value: Any) -> str:
    """A Redis reply as text (invalid UTF-8 replaced: hosts and payloads come from sites)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class FrontierReads:
    """Read-only views of one spider's frontier (mixed into ``Frontier``)."""

    server: redis.Redis
    default_delay: float
    dupefilter: str
    key: Callable[[str], str]
    _call: Callable[..., Any]

    def counts(self) -> dict[str, int]:
        """queued, ready_hosts, hosts, delayed, leased, dead, seen, retried, expired and
        waited (the retries that spent no attempt: a store down, a host's outage)."""
        return self._counts(self._call("counts"))

    @staticmethod
    def _counts(reply: Sequence[Any]) -> dict[str, int]:
        names = (
            "queued",
            "ready_hosts",
            "hosts",
            "delayed",
            "leased",
            "dead",
            "seen",
            "retried",
            "expired",
            "waited",
        )
        return dict(zip(names, (int(v) for v in reply), strict=True))

    def is_idle(self) -> bool:
        """Nothing queued, delayed or leased (dead letters do not count)."""
        return self._idle(self.counts())

    @staticmethod
    def _idle(c: dict[str, int]) -> bool:
        return c["queued"] == 0 and c["delayed"] == 0 and c["leased"] == 0

    def host_stats(self) -> list[dict]:
        """Per host with queued entries or a pending wait: queued, delay, next_allowed_in,
        urls (admitted through the dupefilter so far: what the host budget counts).

        Walks every such host (for ``scrapy frontier``, not for the hot path), in script
        calls of ``MAX_READ`` hosts (read whole, 200,000 hosts held Redis up for 59 ms in
        one HMGET and 40 ms in one ZRANGE; now each call takes a few ms).
        """
        hosts: dict[str, dict[str, Any]] = {}
        for where in ("cool", "ready"):  # a host moved meanwhile: its 'ready' row wins
            cursor: Any = "0"
            while True:
                reply = self._call("hosts", where, cursor, MAX_READ,
                                   round(self.default_delay * 1000))
                cursor, now_ms = reply[0], int(reply[1])
                for i in range(2, len(reply), 5):
                    name, at, depth, delay, admitted = reply[i:i + 5]
                    host = as_text(name)
                    hosts[host] = {
                        "host": host,
                        "queued": int(depth),
                        "delay": int(delay) / 1000,
                        "next_allowed_in": max(0.0, (float(at) - now_ms) / 1000),
                        "urls": int(admitted or 0),
                    }
                if as_text(cursor) == "0":
                    break
        return sorted(hosts.values(), key=lambda h: (-h["queued"], h["host"]))

    def fleet_delays(self) -> dict[str, float]:
        """The default host delay each worker runs with (its ``WEBFARM_HOST_DELAY``, or a
        longer ``DOWNLOAD_DELAY``), for the workers that exchanged lately: the frontier
        spaces hosts by the longest of them."""
        now_ms = int(self.server.time()[0]) * 1000
        delays = {}
        for worker, value in self.server.hgetall(self.key("defaults")).items():
            ms, _, expires = as_text(value).partition(" ")
            if ms.isdigit() and expires.isdigit() and int(expires) >= now_ms:
                delays[as_text(worker)] = int(ms) / 1000
        return delays

    def effective_default_delay(self) -> float:
        """The default host delay the frontier spaces hosts by: the longest of the workers'
        (:meth:`fleet_delays`), or this process's own when no worker runs."""
        return max(self.fleet_delays().values(), default=self.default_delay)

    def leases_by_worker(self) -> dict[str, int]:
        """Leases (requests in flight) per worker name, most first: which workers are at
        work. A lease record starts with its worker's name; the records are read in
        pages (HSCAN), as each holds its request."""
        counts: dict[str, int] = {}
        for _, record in self.server.hscan_iter(self.key("lease"), count=MAX_READ):
            worker = as_text(record).split(" ", 1)[0]
            counts[worker] = counts.get(worker, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def seen(self, fingerprint: bytes) -> bool:
        """Whether the dupefilter holds ``fingerprint`` (Bloom: maybe, with its error rate)."""
        return self.seen_many([fingerprint])[0]

    def seen_many(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """:meth:`seen` for many fingerprints in one round trip (read-only)."""
        out: list[bool] = []
        for start in range(0, len(fingerprints), MAX_READ):
            args: list[Any] = []
            for fp in fingerprints[start : start + MAX_READ]:
                args += hash_pair(fp) if self.dupefilter == "bloom" else (fp, b"")
            out += [c == ord("1") for c in self._call("seen", self.dupefilter, *args)]
        return out

    def memory(self) -> dict[str, int]:
        """Bytes Redis uses for the dupefilter (``MEMORY USAGE``), and what it holds."""
        if self.dupefilter == "set":
            return {
                "bytes": int(self.server.memory_usage(self.key("seen"), samples=0) or 0),
                "layers": 0,
            }
        n = int(self.server.hget(self.key("bloom"), "n") or 0)
        size = sum(
            int(self.server.memory_usage(self.key(f"bloom:{i}"), samples=0) or 0) for i in range(n)
        )
        return {"bytes": size, "layers": n}

    def dead_letters(self, limit: int = 100) -> list[dict]:
        """The oldest ``limit`` dead letters, as dicts (``reason``, ``status``, ``error``,
        ``attempts``, ``first``, ``last``, ``host``, ``priority``, ``payload``, ...)."""
        out = []
        for raw in self.server.lrange(self.key("dead"), 0, max(0, limit) - 1):
            text = as_text(raw)
            try:
                letter = json.loads(text)
                if not isinstance(letter, dict):
                    raise ValueError("not an object")
            except ValueError:
                letter = {"reason": "unreadable dead letter", "payload": text}
            for field in ("reason", "status", "error", "attempts", "host", "payload"):
                letter.setdefault(field, None)
            out.append(letter)
        return out
