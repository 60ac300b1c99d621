"""The shared crawl frontier in Redis: per-host queues, politeness, leases, retries, DLQ.

Every operation is one call of one Lua script (``scripts/*.lua``, loaded once,
then EVALSHA), so a worker pays one round trip per call and never sees a half-done
state. All keys of a spider live under ``webfarm:{SPIDER}:`` (a Cluster hash tag: one
node holds a whole frontier). Payloads are opaque strings (the scheduler passes JSON
of ``Request.to_dict``); nothing is pickled, nothing read back is executed here.

Times are the server's clock (``TIME`` inside the script), so workers with skewed
clocks still agree on politeness and lease deadlines. Closing or dropping a
:class:`Frontier` deletes nothing; :meth:`Frontier.reset` is the only wipe.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import random
import re
from collections.abc import Sequence
from importlib import resources
from typing import Any, NamedTuple

import redis

from webfarm.frontier.bloom import hash_pair
from webfarm.frontier.ends import FrontierEnds
from webfarm.frontier.hosts import BAD_HOST, FrontierHosts, check_host
from webfarm.frontier.reading import FrontierReads, as_text
from webfarm.urls import bare_host, host_of

logger = logging.getLogger(__name__)

_SCRIPT_DIR = resources.files("webfarm.frontier").joinpath("scripts")
# One script from three files (each a part of one chunk; order matters), loaded once per
# client (the scheduler's asyncio client registers it too: webfarm.frontier.aio).
SCRIPT = "\n".join(
    _SCRIPT_DIR.joinpath(name).read_text() for name in ("common.lua", "bloom.lua", "ops.lua")
)
MAX_PUSH = 1000  # entries per script call: keeps each call short for the other workers
#: Payload bytes per script call: a call holds the server while it copies them in, and
#: MAX_PUSH entries near WEBFARM_MAX_ENTRY_BYTES each would hold every worker for seconds.
MAX_PUSH_BYTES = 32 << 20
#: hosts outside its domains a worker counts as its own (:meth:`Frontier.also_keep`): the
#: scope travels with every exchange, so it stays short
MAX_ALSO = 100


def _spelled(name: str) -> str:
    """A bare host name as the frontier's host keys spell it (:func:`webfarm.urls.host_of`:
    IPv6 compressed, IDN in punycode, lower case); "" for one with a space, which matches
    no host (in Scrapy's offsite filter neither)."""
    name = name.strip().lower().strip("[]")
    if not name or name.split() != [name]:
        return ""
    if ":" in name:
        with contextlib.suppress(ValueError):
            return ipaddress.ip_address(name).compressed
    elif not name.isascii():
        with contextlib.suppress(ValueError):
            return bare_host(host_of(f"http://{name}/"))
    return name


_WITH_PORT = (re.compile(r"^\[(.*)\]:(\d+)$"), re.compile(r"^([^:]+):(\d+)$"))


def _spelled_host(entry: str) -> str:
    """A scope entry, a bare name or ``host:port`` (:func:`webfarm.urls.host_of`'s
    spelling, ``[v6]:port`` too), as :func:`_spelled` spells names; the port kept."""
    entry = entry.strip()
    for pattern in _WITH_PORT:
        found = pattern.match(entry)
        if found:
            name = _spelled(found.group(1))
            if not name:
                return ""
            return f"[{name}]:{found.group(2)}" if ":" in name else f"{name}:{found.group(2)}"
    return _spelled(entry)


class Entry(NamedTuple):
    """One request to enqueue. ``host`` is the politeness key (``host[:port]``)."""

    host: str
    priority: int
    fingerprint: bytes
    payload: str
    dont_filter: bool = False


class Popped(NamedTuple):
    """A leased entry. ``attempts`` = how often it was retried before (0 the first time)."""

    lease_id: str
    host: str
    payload: str
    attempts: int


class Exchange(NamedTuple):
    """What one :meth:`Frontier.exchange` call did."""

    acked: int
    enqueued: list[bool]
    popped: list[Popped]
    ready_in: float | None  # seconds until something may be ready, when fewer were popped
    # per pushed entry: refused because its host used its budget (not seen, not enqueued)
    over_budget: list[bool] = []
    # the worker's exchanges so far, this one included (0: pushed without a worker name)
    count: int = 0
    # leases this call found expired and put back in their queues, and up to 3 of the
    # workers that held them (killed, or stalled past WEBFARM_LEASE_SECONDS)
    expired: int = 0
    expired_from: tuple[str, ...] = ()
    # the default host delay the fleet runs with (ms; the longest of the workers') and the
    # worker whose it is
    fleet_default_ms: int = 0
    fleet_default_of: str = ""


def key_prefix(spider: str) -> str:
    """``webfarm:{SPIDER}:``, the prefix of every key of the spider's frontier."""
    if not spider or "{" in spider or "}" in spider:
        raise ValueError(f"spider name {spider!r} cannot be a Redis hash tag")
    return f"webfarm:{{{spider}}}:"


def backoff(attempt: int, base: float = 1.0, cap: float = 600.0) -> float:
    """Seconds to wait before retry number ``attempt`` (0-based): exponential, full jitter.

    ``uniform(0, min(cap, base * 2**attempt))``: spreads retries of many workers apart
    instead of letting them hit a recovering host in lockstep.
    """
    return random.uniform(0.0, min(cap, base * 2.0 ** min(max(attempt, 0), 64)))


class Frontier(FrontierEnds, FrontierHosts, FrontierReads):
    """One spider's frontier. Cheap to create; thread-safe as far as the client is.

    ``server`` must return bytes (``decode_responses=False``, redis-py's default).
    ``dupefilter="bloom"`` (scalable Bloom filter, ~1.8 bytes per URL at 0.1 %) or
    ``"set"`` (exact, ~60-90 bytes per URL, for small crawls); the mode and the Bloom
    filter's capacity and error rate are fixed by the first push until :meth:`reset`.
    ``host_budget`` > 0: at most that many URLs of one host go through the dupefilter,
    across every worker and run of the frontier (a crawler trap in the query string,
    ``?month=`` without end, is cut there); the ones past it are refused unseen.
    """

    def __init__(
        self,
        server: redis.Redis,
        spider: str,
        *,
        lease_seconds: float = 300,
        default_delay: float = 1.0,
        dupefilter: str = "bloom",
        bloom_capacity: int = 1_000_000,
        bloom_error_rate: float = 0.001,
        requeue_batch: int = 100,
        host_budget: int = 0,
    ) -> None:
        if server.get_connection_kwargs().get("decode_responses"):
            raise ValueError("Frontier needs a redis client with decode_responses=False")
        if dupefilter not in ("bloom", "set"):
            raise ValueError(f"dupefilter must be 'bloom' or 'set', not {dupefilter!r}")
        if bloom_capacity < 1 or not 0 < bloom_error_rate < 1:
            raise ValueError("bloom_capacity must be >= 1 and 0 < bloom_error_rate < 1")
        self.server = server
        self.spider = spider
        self.prefix = key_prefix(spider)
        self.lease_ms = max(1, round(lease_seconds * 1000))
        self.default_delay = float(default_delay)
        self.dupefilter = dupefilter
        self.bloom_capacity = int(bloom_capacity)
        self.bloom_error_rate = float(bloom_error_rate)
        self.requeue_batch = max(1, min(int(requeue_batch), 10_000))
        if host_budget < 0:
            raise ValueError(f"host_budget must be 0 (no limit) or more, not {host_budget}")
        self.host_budget = int(host_budget)
        #: seconds until something may be ready, from the last pop that came back short
        self.last_ready_in: float | None = None
        self.keep_to((), 0)
        #: queued or delayed entries of other hosts, from the last idle check that found
        #: this worker's hosts idle (:meth:`keep_to`)
        self.others_waiting = 0
        self._keys = [self.prefix + "stats"]
        self._script = server.register_script(SCRIPT)

    def keep_to(self, domains: Sequence[str], wait: float) -> None:
        """Pop from ``domains`` (host names, or their subdomains: a spider's
        ``allowed_domains``; a ``host:port`` is that port only, as a WebfarmSpider's
        ``hosts``) first; a host outside them only once it has been due ``wait``
        seconds with no other worker taking it. Two ``scrapy crawl generic`` runs with
        other hosts share the spider's frontier: each took the other's pages and gave them
        back (offsite) until, after ``WEBFARM_RETRY_TIMES`` tries, some were dead letters.
        :meth:`is_idle` then asks about these hosts only. No ``domains``: every host."""
        names = {_spelled_host(d) for d in domains if isinstance(d, str) and d}
        self._domains = sorted(d for d in names if d)
        self._also: list[str] = []
        self._scope = " ".join(self._domains)
        self._scope_wait_ms = max(0, round(wait * 1000))

    def also_keep(self, name: str) -> None:
        """Count a host outside the domains as this worker's own: it queued a request
        there that Scrapy's offsite filter lets through (``dont_filter``, as start URLs
        have, or ``allow_offsite``), which would otherwise wait ``wait`` seconds, and
        which an idle check of the domains alone would leave behind. Past
        :data:`MAX_ALSO` such hosts, the worker takes every host, as one with no domains
        does, and is idle when the whole frontier is: no request it queued is left."""
        name = _spelled_host(name)
        if not self._scope or not name or name in self._also:
            return
        if len(self._also) >= MAX_ALSO:
            self._scope = ""
            logger.info("Requests queued to more than %d hosts outside allowed_domains: "
                        "this worker now takes every host of the frontier, and stops when "
                        "all of it is done", MAX_ALSO)
            return
        self._also.append(name)
        self._scope = " ".join([*self._domains, *self._also])

    @property
    def scope(self) -> list[str]:
        """The host names this worker is kept to (:meth:`keep_to`); [] for every host."""
        return self._scope.split()

    def _idle_call(self) -> list[Any]:
        return ["idle_in", self._scope] if self._scope else ["counts"]

    def _idle_reply(self, reply: Any) -> bool:
        if not self._scope:
            return self._idle(self._counts(reply))
        idle, self.others_waiting = int(reply[0]) == 1, int(reply[1])
        return idle

    def is_idle(self) -> bool:
        """Nothing queued, delayed or leased (dead letters do not count); for a worker
        kept to some hosts (:meth:`keep_to`), nothing of those hosts, so that it stops when
        its own crawl is done, not when every crawl sharing the frontier is."""
        return self._idle_reply(self._call(*self._idle_call()))

    def key(self, name: str) -> str:
        """Full key name of one of this frontier's structures (``ready``, ``dead``, ...)."""
        return self.prefix + name

    def _call(self, op: str, *args: Any) -> Any:
        return self._script(keys=self._keys, args=[self.prefix, op, *args])

    # -- the hot path ---------------------------------------------------------------------

    def exchange(
        self,
        worker: str,
        *,
        push: Sequence[Entry] = (),
        ack: Sequence[str] = (),
        pop: int = 1,
    ) -> Exchange:
        """Ack, push and pop in ONE round trip (a scheduler buffers between pops).

        Order inside the call: acks, then pushes (seen-check and enqueue), then due
        retries and expired leases go back (at most ``requeue_batch`` each), then up to
        ``pop`` leases, each from the host that has been allowed the longest.
        """
        steps = self._steps(worker, push, ack, pop)
        return self._joined([self._step_reply(self._call("step", *args), n) for args, n in steps])

    def _steps(self, worker: str, push: Sequence[Entry], ack: Sequence[str], pop: int
               ) -> list[tuple[list[Any], int]]:
        """The script calls of one exchange: pushes past :data:`MAX_PUSH` entries or
        :data:`MAX_PUSH_BYTES` of payload go first, alone."""
        if pop and (not worker or BAD_HOST.search(worker)):
            raise ValueError(f"a worker name without spaces is needed to pop, not {worker!r}")
        steps = []
        batch: list[Entry] = []
        size = 0
        for entry in push:
            if batch and (len(batch) == MAX_PUSH or size + len(entry[3]) > MAX_PUSH_BYTES):
                steps.append((self._step_args("", batch, (), 0), 0))
                batch, size = [], 0
            batch.append(entry)
            size += len(entry[3])
        steps.append((self._step_args(worker, batch, ack, pop), pop))
        return steps

    @staticmethod
    def _joined(results: list[Exchange]) -> Exchange:
        enqueued = [flag for result in results for flag in result.enqueued]
        over = [flag for result in results for flag in result.over_budget]
        return results[-1]._replace(enqueued=enqueued, over_budget=over)

    def _step_args(self, worker: str, push: Sequence[Entry], ack: Sequence[str], pop: int
                   ) -> list[Any]:
        bloom = self.dupefilter == "bloom"
        args: list[Any] = [
            worker,
            self.lease_ms,
            round(self.default_delay * 1000),
            self.requeue_batch,
            int(pop),
            self.dupefilter,
            self.bloom_capacity,
            repr(self.bloom_error_rate),
            self.host_budget,
            len(ack),
            len(push),
            self._scope_wait_ms,
            self._scope,
            *ack,
        ]
        for entry in push:
            host, priority, fingerprint, payload, dont_filter = Entry(*entry)
            check_host(host)
            if not isinstance(priority, int) or abs(priority) > 2**52:
                raise ValueError(f"priority must be an int within +-2**52, not {priority!r}")
            if bloom:
                k1, k2 = hash_pair(fingerprint)
            else:
                k1, k2 = fingerprint, b""
            args += [host, priority, b"1" if dont_filter else b"0", k1, k2, payload]
        return args

    def _step_reply(self, reply: Any, pop: int) -> Exchange:
        flags = reply[1]
        popped = [
            Popped(as_text(reply[i]), as_text(reply[i + 1]), as_text(reply[i + 2]),
                   int(reply[i + 3]))
            for i in range(8, len(reply), 4)
        ]
        ready_in = None if int(reply[2]) < 0 else int(reply[2]) / 1000
        if pop:
            self.last_ready_in = None if len(popped) == pop else ready_in
        return Exchange(int(reply[0]), [c == ord("1") for c in flags], popped, ready_in,
                        [c == ord("2") for c in flags], int(reply[3]), int(reply[4]),
                        tuple(as_text(reply[5]).split()), int(reply[6]), as_text(reply[7]))

    def push(self, entries: Sequence[Entry]) -> list[bool]:
        """Seen-check and enqueue a batch (a page's links) in one call.

        Returns, per entry, whether it was enqueued (False: seen before, or over its
        host's budget: :meth:`exchange` tells which). An entry with ``dont_filter`` is
        enqueued without touching the dupefilter, as in Scrapy.
        """
        return self.exchange("", push=entries, pop=0).enqueued

    def pop(self, worker: str) -> Popped | None:
        """Lease the next entry a polite crawler may fetch now, or None.

        When None, :attr:`last_ready_in` says how long until something may be ready
        (saves a :meth:`next_ready_in` round trip).
        """
        popped = self.exchange(worker, pop=1).popped
        return popped[0] if popped else None

    def ack(self, lease_ids: Sequence[str]) -> int:
        """Done with these leases: forget the entries. Returns how many were still held."""
        if not lease_ids:
            return 0
        return self.exchange("", ack=lease_ids, pop=0).acked

    def next_ready_in(self) -> float | None:
        """Seconds until a host may be ready, a retry is due or a lease expires; None = idle."""
        ms = int(self._call("next_ready"))
        return None if ms < 0 else ms / 1000

    # -- wiping ---------------------------------------------------------------------------

    def reset(self) -> int:
        """Delete every key of this spider's frontier (the only way anything is deleted).

        Uses SCAN, so it also finds keys nothing indexes; returns how many were deleted.
        """
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", self.prefix) + "*"
        deleted = 0
        batch: list[bytes] = []
        for key in self.server.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += int(self.server.unlink(*batch))
                batch = []
        if batch:
            deleted += int(self.server.unlink(*batch))
        return deleted
