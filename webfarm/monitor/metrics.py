"""Per-host crawl figures shared through Redis, in time buckets.

Every worker counts what it fetched in memory (:class:`Recorder`) and adds it to
Redis every few seconds in one pipelined batch, never a round trip per response.
Counts live in one hash per time bucket, ``webfarm:{SPIDER}:m:<bucket start>``
(epoch seconds), with fields ``<host>|<metric>``, and expire after the retention.
The pseudo-host ``*`` holds the spider's totals (so spider-wide rates need no walk
over every host) and the frontier gauges the evaluating worker samples once per
tick (``*|g:queued`` ...), so their trend can be read back.

Summing the buckets of a window (:meth:`MetricsStore.window`) gives every worker,
``scrapy frontier`` and the alert rules the same rates.
"""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from webfarm.frontier import key_prefix

SPIDER_HOST = "*"  # the pseudo-host of the spider's totals and gauges
#: How long before its bucket's end the bucket's first figure came (the largest of every
#: worker's): a window that begins before the crawl did covers the crawl's time only.
LEAD = f"{SPIDER_HOST}|lead_max"
OTHER_HOSTS = "\x00other"  # running totals of hosts past Recorder.totals_hosts
GAUGES = ("queued", "ready_hosts", "delayed", "leased", "dead")
STATUS_CLASSES = ("2xx", "3xx", "4xx", "5xx", "other")
FLOAT_METRICS = frozenset({"latency_sum"})

# One call per bucket and flush: ARGV[1] = how many increments follow as name/value pairs,
# then name/value pairs for maxima (latency_max), then the TTL. HINCRBYFLOAT keeps integer
# counts as integers ("3", not "3.0").
_WRITE_SCRIPT = """
local n = tonumber(ARGV[1])
for i = 2, 2 * n, 2 do redis.call('HINCRBYFLOAT', KEYS[1], ARGV[i], ARGV[i + 1]) end
for i = 2 * n + 2, #ARGV - 1, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '-1')
  if tonumber(ARGV[i + 1]) > cur then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
redis.call('EXPIRE', KEYS[1], ARGV[#ARGV])
return 1
"""


_GAUGE_PREFIX = f"{SPIDER_HOST}|g:".encode()
_LEAD = LEAD.encode()


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def status_class(status: int) -> str:
    return f"{status // 100}xx" if 200 <= status < 600 else "other"


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass
class Figures:
    """What happened at one host (or the whole spider) within a window."""

    requests: int = 0
    status: dict[str, int] = field(default_factory=dict)  # "2xx" -> responses
    errors: dict[str, int] = field(default_factory=dict)  # exception class -> count
    latency_sum: float = 0.0
    latency_count: int = 0
    latency_max: float = 0.0
    bytes: int = 0
    http: int = 0
    browser: int = 0
    api: int = 0
    items: int = 0
    duplicates: int = 0
    dead: int = 0

    def add(self, metric: str, value: float) -> None:
        if metric.startswith("status:"):
            key = metric[7:]
            self.status[key] = self.status.get(key, 0) + int(value)
        elif metric.startswith("error:"):
            key = metric[6:]
            self.errors[key] = self.errors.get(key, 0) + int(value)
        elif metric == "latency_max":
            self.latency_max = max(self.latency_max, value)
        elif metric in FLOAT_METRICS:
            setattr(self, metric, getattr(self, metric) + value)
        elif metric in ("requests", "latency_count", "bytes", "items", "duplicates", "dead"):
            setattr(self, metric, getattr(self, metric) + int(value))
        elif metric in ("fetch_http", "fetch_browser", "fetch_api"):
            setattr(self, metric[6:], getattr(self, metric[6:]) + int(value))
        # unknown metrics (a newer worker's) are ignored

    @property
    def responses(self) -> int:
        return sum(self.status.values())

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def outcomes(self) -> int:
        """Fetches that ended, one way or another: responses plus network errors."""
        return self.responses + self.error_count

    @property
    def successes(self) -> int:
        return self.status.get("2xx", 0) + self.status.get("3xx", 0)

    @property
    def success_rate(self) -> float | None:
        """2xx and 3xx over every outcome; None when nothing ended."""
        return self.successes / self.outcomes if self.outcomes else None

    @property
    def latency_avg(self) -> float | None:
        return self.latency_sum / self.latency_count if self.latency_count else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "responses": self.responses,
            "status": {k: self.status.get(k, 0) for k in STATUS_CLASSES},
            "errors": dict(sorted(((k, v) for k, v in self.errors.items() if v),
                                  key=lambda kv: -kv[1])),
            "error_count": self.error_count,
            "success_rate": self.success_rate,
            "latency_avg": self.latency_avg,
            "latency_max": self.latency_max if self.latency_count else None,
            "bytes": self.bytes,
            "http": self.http,
            "browser": self.browser,
            "api": self.api,
            "items": self.items,
            "duplicates": self.duplicates,
            "dead": self.dead,
        }


@dataclass
class Window:
    """The figures of a run of whole buckets; ``seconds`` is the time they cover so far."""

    start: float
    end: float
    hosts: dict[str, Figures]
    spider: Figures
    gauges: list[tuple[int, dict[str, int]]]  # (bucket start, sampled gauges), oldest first

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)

    def per_minute(self, count: float) -> float:
        return count * 60.0 / self.seconds

    def gauge_series(self, name: str) -> list[tuple[int, int]]:
        return [(b, g[name]) for b, g in self.gauges if name in g]


class MetricsStore:
    """Reads and writes one spider's buckets. Thread-safe as far as the client is."""

    def __init__(
        self, server: redis.Redis, spider: str, *, bucket_seconds: int = 60,
        retention: float = 7200.0,
    ) -> None:
        if bucket_seconds < 1:
            raise ValueError(f"WEBFARM_METRICS_BUCKET must be >= 1 second, not {bucket_seconds}")
        self.server = server
        self.spider = spider
        self.bucket_seconds = int(bucket_seconds)
        self.retention = max(float(retention), float(bucket_seconds))
        self.prefix = key_prefix(spider) + "m:"
        self.clock_offset = 0.0
        self._write = server.register_script(_WRITE_SCRIPT)

    def sync_clock(self) -> None:
        """Use the Redis server's clock, so workers with skewed clocks share buckets."""
        sec, usec = self.server.time()
        self.clock_offset = sec + usec / 1e6 - time.time()

    def now(self) -> float:
        return time.time() + self.clock_offset

    def bucket_of(self, t: float) -> int:
        return int(t // self.bucket_seconds) * self.bucket_seconds

    def key(self, bucket: int) -> str:
        return f"{self.prefix}{bucket}"

    # -- writing --------------------------------------------------------------------------

    def write(
        self, counts: Mapping[tuple[int, str], float],
        maxes: Mapping[tuple[int, str], float] | None = None,
        gauges: Mapping[str, int] | None = None,
    ) -> None:
        """Add ``counts`` (``(bucket, "host|metric") -> n``), raise ``maxes`` and set
        ``gauges`` (spider gauges, current bucket), all in one pipelined round trip with
        one script call per bucket (few commands to encode, even for thousands of hosts)."""
        ttl = math.ceil(self.retention + self.bucket_seconds)
        incr: dict[int, list[Any]] = defaultdict(list)
        for (bucket, name), value in counts.items():
            incr[bucket] += [name, _num(value)]
        high: dict[int, list[Any]] = defaultdict(list)
        for (bucket, name), value in (maxes or {}).items():
            high[bucket] += [name, repr(float(value))]
        pipe = self.server.pipeline(transaction=False)
        for bucket in set(incr) | set(high):
            args = [len(incr[bucket]) // 2, *incr[bucket], *high[bucket], ttl]
            self._write(keys=[self.key(bucket)], args=args, client=pipe)
        if gauges:
            key = self.key(self.bucket_of(self.now()))
            pipe.hset(key, mapping={f"{SPIDER_HOST}|g:{k}": int(v) for k, v in gauges.items()})
            pipe.expire(key, ttl)
        if incr or high or gauges:
            # The bucket size the figures are in, for readers (scrapy frontier) whose
            # WEBFARM_METRICS_BUCKET differs: they read other buckets, and showed a fifth.
            pipe.set(self.prefix + "bucket", self.bucket_seconds, ex=ttl)
            pipe.execute()

    @classmethod
    def reader(cls, server: redis.Redis, spider: str, bucket_seconds: int = 60,
               retention: float = 7200.0) -> MetricsStore:
        """A store reading the figures in the bucket size the workers wrote them in."""
        recorded = server.get(key_prefix(spider) + "m:bucket")
        if recorded is not None and recorded.isdigit() and int(recorded) >= 1:
            bucket_seconds = int(recorded)
        return cls(server, spider, bucket_seconds=bucket_seconds, retention=retention)

    # -- reading --------------------------------------------------------------------------

    def window(self, seconds: float, back: int = 0, end: float | None = None) -> Window:
        """The last ``seconds`` (rounded to whole buckets, the current one included);
        ``back=1`` is the window of the same size just before it, and so on."""
        now = self.now() if end is None else end
        n = max(1, round(seconds / self.bucket_seconds))
        last = self.bucket_of(now) - back * n * self.bucket_seconds
        first = last - (n - 1) * self.bucket_seconds
        stop = now if back == 0 else last + self.bucket_seconds
        return self.read(range(first, last + 1, self.bucket_seconds), first, stop)

    def read(self, buckets: Iterable[int], start: float, end: float) -> Window:
        buckets = list(buckets)
        pipe = self.server.pipeline(transaction=False)
        for bucket in buckets:
            pipe.hgetall(self.key(bucket))
        totals: dict[bytes, float] = defaultdict(float)
        gauges: list[tuple[int, dict[str, int]]] = []
        began: float | None = None  # when the first figure of the window came
        for bucket, data in zip(buckets, pipe.execute() if buckets else [], strict=True):
            sampled: dict[str, int] = {}
            lead = data.pop(_LEAD, None)
            if began is None and data:
                began = bucket + self.bucket_seconds - float(lead or self.bucket_seconds)
            for name, value in data.items():
                if name.startswith(_GAUGE_PREFIX):
                    sampled[_text(name[len(_GAUGE_PREFIX):])] = int(float(value))
                    continue
                try:
                    totals[name] += float(value)
                except ValueError:
                    continue
                if name.endswith(b"|latency_max"):  # a maximum, not a sum
                    totals[name] = max(totals[name] - float(value), float(value))
            if sampled:
                gauges.append((bucket, sampled))
        hosts: dict[str, Figures] = {}
        spider = Figures()
        for name, value in totals.items():
            host, _, metric = _text(name).partition("|")
            if host == SPIDER_HOST:
                spider.add(metric, value)
            elif host and metric:
                if host not in hosts:
                    hosts[host] = Figures()
                hosts[host].add(metric, value)
        # Figures per minute over the time the crawl ran in the window: 25 s into a crawl,
        # `scrapy frontier` divided by its whole window (256 s) and showed a tenth.
        return Window(max(start, min(began or start, end)), end, hosts, spider, gauges)

    def last_gauges(self) -> dict[str, int] | None:
        """The most recent frontier sample within the last two buckets, or None."""
        now = self.bucket_of(self.now())
        fields = [f"{SPIDER_HOST}|g:{g}" for g in GAUGES]
        pipe = self.server.pipeline(transaction=False)
        for bucket in (now, now - self.bucket_seconds):
            pipe.hmget(self.key(bucket), fields)
        for values in pipe.execute():
            if any(v is not None for v in values):
                return {g: int(v or 0) for g, v in zip(GAUGES, values, strict=True)}
        return None


class Recorder:
    """One worker's counts, buffered until the next flush, plus running totals for
    Prometheus. Thread-safe: the reactor adds, a flush thread drains."""

    def __init__(self, store: MetricsStore, totals_hosts: int = 0) -> None:
        """``totals_hosts``: hosts whose running totals are kept one by one (for
        Prometheus; 0 = none); later hosts add to :data:`OTHER_HOSTS`, so memory stays
        bounded on a crawl of millions of hosts."""
        self.store = store
        self.totals_hosts = totals_hosts
        self._lock = threading.Lock()
        self._counts: dict[tuple[int, str], float] = defaultdict(float)
        self._maxes: dict[tuple[int, str], float] = {}
        self._totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def _add(self, host: str, pairs: Iterable[tuple[str, float]]) -> None:
        now = self.store.now()
        bucket = self.store.bucket_of(now)
        lead = bucket + self.store.bucket_seconds - now
        with self._lock:
            if lead > self._maxes.get((bucket, LEAD), 0.0):
                self._maxes[(bucket, LEAD)] = lead
            if not self.totals_hosts:
                totals = None
            elif host in self._totals or len(self._totals) < self.totals_hosts:
                totals = self._totals[host]
            else:
                totals = self._totals[OTHER_HOSTS]
            for metric, value in pairs:
                for who in (host, SPIDER_HOST):
                    self._counts[(bucket, f"{who}|{metric}")] += value
                if totals is not None:
                    totals[metric] += value

    def request(self, host: str) -> None:
        self._add(host, (("requests", 1),))

    def response(self, host: str, status: int, latency: float | None, size: int,
                 method: str = "http") -> None:
        """``method``: ``http``, ``browser`` or ``api`` (the fetch-API rung)."""
        pairs: list[tuple[str, float]] = [
            (f"status:{status_class(status)}", 1),
            ("bytes", size),
            (f"fetch_{method}", 1),
        ]
        if latency is not None:
            pairs += [("latency_sum", latency), ("latency_count", 1)]
            bucket = self.store.bucket_of(self.store.now())
            with self._lock:
                for who in (host, SPIDER_HOST):
                    key = (bucket, f"{who}|latency_max")
                    self._maxes[key] = max(self._maxes.get(key, 0.0), latency)
        self._add(host, pairs)

    def error(self, host: str, kind: str) -> None:
        self._add(host, ((f"error:{kind}", 1),))

    def item(self, host: str, duplicate: bool) -> None:
        self._add(host, (("items", 1), ("duplicates", 1 if duplicate else 0)))

    def drain(self) -> tuple[dict[tuple[int, str], float], dict[tuple[int, str], float]]:
        """Take what was counted since the last drain (give it back with :meth:`restore`
        if writing it failed)."""
        with self._lock:
            counts, maxes = dict(self._counts), self._maxes
            self._counts, self._maxes = defaultdict(float), {}
        return {k: v for k, v in counts.items() if v}, maxes

    def restore(self, counts: Mapping[tuple[int, str], float],
                maxes: Mapping[tuple[int, str], float]) -> None:
        with self._lock:
            for key, value in counts.items():
                self._counts[key] += value
            for key, value in maxes.items():
                self._maxes[key] = max(self._maxes.get(key, 0.0), value)

    def pending(self) -> int:
        with self._lock:
            return len(self._counts) + len(self._maxes)

    def totals(self) -> dict[str, dict[str, float]]:
        """This worker's counts since it started, per host (a copy)."""
        with self._lock:
            return {host: dict(metrics) for host, metrics in self._totals.items()}
