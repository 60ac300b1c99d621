"""webfarm's frontier vs. stock scrapy-redis on the same Valkey, in the same run.

Run by hand: ``.venv/bin/python bench/bench_frontier.py [--quick]`` (a full run takes a few
minutes). It starts its own valkey-server (tests/servers.py) and prints one table:
push/pop/seen operations per second, Redis round trips and blocked time per crawled
request in a simulated crawl (each page yields ~10 links), memory per seen URL, memory
per queued request, and pop latency with 10^4 and 10^6 requests queued.

Stock = ``scrapy_redis.queue.PriorityQueue`` + ``scrapy_redis.dupefilter.RFPDupeFilter``
with their defaults, used directly with a minimal spider. Round trips are counted in the
client (one per command or per pipeline) and cross-checked with ``INFO commandstats``.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402
import redis.client  # noqa: E402
from scrapy import Request, Spider  # noqa: E402
from scrapy.utils.request import fingerprint as scrapy_fingerprint  # noqa: E402
from scrapy.utils.request import request_from_dict  # noqa: E402
from scrapy_redis.dupefilter import RFPDupeFilter  # noqa: E402
from scrapy_redis.queue import PriorityQueue  # noqa: E402

from tests import servers  # noqa: E402
from webfarm import serialize  # noqa: E402
from webfarm.frontier import Entry, Frontier  # noqa: E402


class Meter:
    """Round trips and seconds spent inside redis-py calls (the caller's thread is blocked)."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0

    def reset(self) -> None:
        self.calls, self.seconds = 0, 0.0


class MeteredPipeline(redis.client.Pipeline):
    meter: Meter

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        t = time.perf_counter()
        try:
            return super().execute(raise_on_error)
        finally:
            self.meter.calls += 1
            self.meter.seconds += time.perf_counter() - t


class MeteredRedis(redis.Redis):
    meter: Meter

    def execute_command(self, *args: Any, **options: Any) -> Any:
        t = time.perf_counter()
        try:
            return super().execute_command(*args, **options)
        finally:
            self.meter.calls += 1
            self.meter.seconds += time.perf_counter() - t

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> MeteredPipeline:
        p = MeteredPipeline(self.connection_pool, self.response_callbacks, transaction, shard_hint)
        p.meter = self.meter
        return p


SPIDER = Spider(name="bench")


def make_request(url: str) -> Request:
    return Request(url, dont_filter=False)


def host_of(url: str) -> str:
    return urlsplit(url).netloc


def our_entry(req: Request) -> Entry:
    payload = serialize.dumps(req.to_dict(spider=SPIDER))
    return Entry(host_of(req.url), req.priority, scrapy_fingerprint(req), payload, req.dont_filter)


def our_decode(payload: str) -> Request:
    return request_from_dict(serialize.loads(payload), spider=SPIDER)


def links_of(url: str, n_hosts: int, paths: int, rng_seed: int = 7) -> list[str]:
    """~10 links of a page: 8 on its own host, 2 elsewhere; the same page, the same links."""
    rng = random.Random(f"{rng_seed}:{url}")
    host = host_of(url)
    out = [f"http://{host}/p{rng.randrange(paths)}" for _ in range(8)]
    out += [f"http://h{rng.randrange(n_hosts)}.test/p{rng.randrange(paths)}" for _ in range(2)]
    return out


def cmdstats(client: redis.Redis) -> dict[str, int]:
    return {k[len("cmdstat_") :]: v["calls"] for k, v in client.info("commandstats").items()}


def server_cpu(client: redis.Redis) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


class Bench:
    def __init__(self, url: str, quick: bool) -> None:
        self.meter = Meter()
        self.client = MeteredRedis.from_url(url)
        self.client.meter = self.meter
        self.admin = redis.Redis.from_url(url)
        self.quick = quick
        self.rows: list[tuple[str, str, str, str]] = []

    def fresh(self) -> None:
        self.admin.flushall()
        self.admin.config_resetstat()
        self.meter.reset()

    def stock(self) -> tuple[PriorityQueue, RFPDupeFilter]:
        return (
            PriorityQueue(self.client, SPIDER, "%(spider)s:requests", serializer=serialize),
            RFPDupeFilter(self.client, "bench:dupefilter"),
        )

    def ours(self, **kw: Any) -> Frontier:
        kw.setdefault("default_delay", 0)
        return Frontier(self.client, "bench", **kw)

    def row(self, what: str, stock: float | None, ours: float | None, unit: str,
            better: str = "higher") -> None:
        def fmt(v: float | None) -> str:
            if v is None:
                return "-"
            return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"

        ratio = "-"
        if stock and ours:
            r = ours / stock if better == "higher" else stock / ours
            ratio = f"{r:.2f}x"
        self.rows.append((what, fmt(stock), fmt(ours), f"{unit}  {ratio}"))
        print(f"  {what:<44} stock {fmt(stock):>12}  webfarm {fmt(ours):>12}  {unit}  {ratio}",
              flush=True)

    # -- 1. operations per second ----------------------------------------------------------

    def throughput(self) -> None:
        n = 5_000 if self.quick else 20_000
        urls = [f"http://h{i % 100}.test/p{i}" for i in range(n)]
        reqs = [make_request(u) for u in urls]
        print(f"\n[1] operations per second ({n:,} requests over 100 hosts)")

        self.fresh()
        queue, df = self.stock()
        t = time.perf_counter()
        for r in reqs:
            if not df.request_seen(r):
                queue.push(r)
        push_stock = rate(n, time.perf_counter() - t)
        t = time.perf_counter()
        got = 0
        while queue.pop() is not None:
            got += 1
        pop_stock = rate(got, time.perf_counter() - t)
        fresh = [make_request(f"http://x.test/{i}") for i in range(n)]
        t = time.perf_counter()
        for r in fresh:
            df.request_seen(r)
        seen_stock = rate(n, time.perf_counter() - t)

        self.fresh()
        f = self.ours()
        t = time.perf_counter()
        for i in range(0, n, 10):
            f.push([our_entry(r) for r in reqs[i : i + 10]])
        push_ours = rate(n, time.perf_counter() - t)
        self.fresh()
        f = self.ours()
        t = time.perf_counter()
        for r in reqs:
            f.push([our_entry(r)])
        push_ours_1 = rate(n, time.perf_counter() - t)
        t = time.perf_counter()
        got = 0
        while (p := f.pop("w")) is not None:
            our_decode(p.payload)
            got += 1
        pop_ours = rate(got, time.perf_counter() - t)
        fps = [scrapy_fingerprint(r) for r in fresh]
        t = time.perf_counter()
        for x in fps:
            f.seen(x)
        seen_ours = rate(n, time.perf_counter() - t)
        t = time.perf_counter()
        f.seen_many(fps)
        seen_many = rate(n, time.perf_counter() - t)

        self.row("push (seen-check + enqueue), batch of 10", push_stock, push_ours, "req/s")
        self.row("push, one request per call", push_stock, push_ours_1, "req/s")
        self.row("pop (+ decode to Request)", pop_stock, pop_ours, "req/s")
        self.row("seen check, one per call", seen_stock, seen_ours, "ops/s")
        self.row("seen check, seen_many", seen_stock, seen_many, "ops/s")

    # -- 2. simulated crawl ---------------------------------------------------------------

    def crawl(self) -> None:
        pages = 3_000 if self.quick else 10_000
        n_hosts, paths = 100, 2_000
        seeds = [f"http://h{i}.test/" for i in range(n_hosts)]
        print(f"\n[2] simulated crawl: {pages:,} pages, ~10 links each, {n_hosts} hosts")

        def run(name: str, crawl: Callable[[], tuple[int, float]]) -> dict[str, float]:
            self.fresh()
            before = cmdstats(self.admin)
            cpu0 = server_cpu(self.admin)
            t = time.perf_counter()
            crawled, sched = crawl()
            wall = time.perf_counter() - t
            cpu = server_cpu(self.admin) - cpu0
            after = cmdstats(self.admin)
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            if name == "stock":
                server_rt = delta.get("sadd", 0) + delta.get("zadd", 0) + delta.get("exec", 0)
            else:
                server_rt = delta.get("evalsha", 0)
            out = {
                "rt": self.meter.calls / crawled,
                "server_rt": server_rt / crawled,
                "blocked_ms": self.meter.seconds / crawled * 1000,
                "sched_ms": sched / crawled * 1000,
                "server_us": cpu / crawled * 1e6,
                "pages_s": crawled / wall,
            }
            print(f"    {name:<22} " + "  ".join(f"{k}={v:.3g}" for k, v in out.items()))
            return out

        def stock() -> tuple[int, float]:
            queue, df = self.stock()
            sched = 0.0
            t = time.perf_counter()
            for u in seeds:
                r = make_request(u)
                if not df.request_seen(r):
                    queue.push(r)
            sched += time.perf_counter() - t
            self.meter.reset()
            crawled = 0
            while crawled < pages:
                t = time.perf_counter()
                req = queue.pop()
                sched += time.perf_counter() - t
                if req is None:
                    break
                crawled += 1
                links = [make_request(u) for u in links_of(req.url, n_hosts, paths)]
                t = time.perf_counter()
                for r in links:
                    if not df.request_seen(r):
                        queue.push(r)
                sched += time.perf_counter() - t
            return crawled, sched

        def ours(mode: str, prefetch: int = 1) -> Callable[[], tuple[int, float]]:
            def crawl() -> tuple[int, float]:
                f = self.ours()
                sched = 0.0
                t = time.perf_counter()
                f.push([our_entry(make_request(u)) for u in seeds])
                sched += time.perf_counter() - t
                self.meter.reset()
                crawled = 0
                pending: list[Entry] = []
                acks: list[str] = []
                while crawled < pages:
                    t = time.perf_counter()
                    if mode == "exchange":  # a scheduler buffers links and acks until its pop
                        want = min(prefetch, pages - crawled)
                        popped = f.exchange("w", push=pending, ack=acks, pop=want).popped
                    else:
                        if pending:
                            f.push(pending)
                        if acks:
                            f.ack(acks)
                        p = f.pop("w")
                        popped = [p] if p else []
                    pending, acks = [], []
                    if not popped:
                        break
                    reqs = [our_decode(p.payload) for p in popped]
                    sched += time.perf_counter() - t
                    for p, req in zip(popped, reqs, strict=True):
                        crawled += 1
                        links = [make_request(u) for u in links_of(req.url, n_hosts, paths)]
                        t = time.perf_counter()
                        pending += [our_entry(r) for r in links]
                        acks.append(p.lease_id)
                        sched += time.perf_counter() - t
                if pending or acks:
                    t = time.perf_counter()
                    f.exchange("w", push=pending, ack=acks, pop=0)
                    sched += time.perf_counter() - t
                return crawled, sched

            return crawl

        s = run("stock", stock)
        e = run("webfarm exchange()", ours("exchange"))
        e4 = run("webfarm exchange(pop=4)", ours("exchange", 4))
        p = run("webfarm push/pop/ack", ours("plain"))
        self.row("round trips per crawled request (client)", s["rt"], e["rt"], "", "lower")
        self.row("  same, from INFO commandstats", s["server_rt"], e["server_rt"], "", "lower")
        self.row("  same, plain push/pop/ack calls", s["rt"], p["rt"], "", "lower")
        self.row("blocked in Redis calls per request", s["blocked_ms"], e["blocked_ms"], "ms",
                 "lower")
        self.row("  same, plain push/pop/ack calls", s["blocked_ms"], p["blocked_ms"], "ms",
                 "lower")
        self.row("  same, exchange(pop=4) prefetch", s["blocked_ms"], e4["blocked_ms"], "ms",
                 "lower")
        self.row("Redis server CPU per request", s["server_us"], e["server_us"], "us", "lower")
        self.row("  same, exchange(pop=4) prefetch", s["server_us"], e4["server_us"], "us",
                 "lower")
        self.row("scheduler time per request (incl. JSON)", s["sched_ms"], e["sched_ms"], "ms",
                 "lower")
        self.row("crawl throughput, one process", s["pages_s"], e["pages_s"], "req/s")

    # -- 3. memory per seen URL ----------------------------------------------------------

    def memory(self) -> None:
        n = 50_000 if self.quick else 200_000
        print(f"\n[3] memory per seen URL ({n:,} URLs, 0.1% false positives)")
        fps = [hashlib.sha1(b"url-%d" % i).digest() for i in range(n)]
        self.fresh()
        pipe = self.admin.pipeline(transaction=False)
        for i, x in enumerate(fps):
            pipe.sadd("bench:dupefilter", x.hex())
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
        stock = self.admin.memory_usage("bench:dupefilter", samples=0) / n

        result = {}
        for mode in ("bloom", "set"):
            self.fresh()
            f = self.ours(dupefilter=mode, bloom_capacity=n, bloom_error_rate=0.001)
            for i in range(0, n, 1000):
                f.push([Entry(f"h{j % 1000}.test", 0, x, "") for j, x in
                        enumerate(fps[i : i + 1000], i)])
            result[mode] = f.memory()["bytes"] / n
            if mode == "bloom":
                probes = f.seen_many([hashlib.sha1(b"probe-%d" % i).digest()
                                      for i in range(100_000)])
                fp_rate = sum(probes) / len(probes)
                used = self.admin.info("memory")["used_memory"]
                queued = f.counts()["queued"]
        self.row("bytes per seen URL, Bloom (at capacity)", stock, result["bloom"], "B", "lower")
        self.row("bytes per seen URL, exact set mode", stock, result["set"], "B", "lower")
        print(f"    Bloom false-positive rate measured on 100,000 new URLs: {fp_rate:.5f}")
        print(f"    whole server, {queued:,} queued (empty payloads) + filter: "
              f"{used / queued:.0f} B per queued request")

    # -- 4. pop latency vs. queue size ---------------------------------------------------

    def latency(self) -> None:
        sizes = [10_000, 100_000] if self.quick else [10_000, 1_000_000]
        n_hosts, samples = 1_000, 3_000
        template = serialize.dumps(make_request("http://HOST/PATH").to_dict(spider=SPIDER))
        print(f"\n[4] pop latency, {samples:,} pops at each size, {n_hosts} hosts, "
              f"payload {len(template)} B")

        def payload(i: int) -> tuple[str, str]:
            host = f"h{i % n_hosts}.test"
            return host, template.replace("HOST", host).replace("PATH", f"p{i}")

        def measure(pop: Callable[[], Any], after: Callable[[Any], None]) -> list[float]:
            out = []
            for _ in range(samples):
                t = time.perf_counter()
                got = pop()
                out.append(time.perf_counter() - t)
                after(got)
            return out

        stock_lat: dict[int, list[float]] = {}
        self.fresh()
        queue, _ = self.stock()
        next_i = 0
        for size in sizes:
            pipe = self.admin.pipeline(transaction=False)
            while next_i < size + samples * len(stock_lat):
                host, body = payload(next_i)
                pipe.execute_command("ZADD", queue.key, -random.randrange(3), body.encode())
                next_i += 1
                if next_i % 10_000 == 0:
                    pipe.execute()
            pipe.execute()
            assert len(queue) == size
            stock_lat[size] = measure(queue.pop, lambda r: None)
        per_stock = self.admin.info("memory")["used_memory"] / len(queue)

        ours_lat: dict[int, list[float]] = {}
        self.fresh()
        f = self.ours(bloom_capacity=sizes[-1] + samples * len(sizes))
        next_i = 0
        t0 = time.perf_counter()
        for size in sizes:
            while next_i < size + samples * len(ours_lat):
                batch = []
                for i in range(next_i, min(size + samples * len(ours_lat), next_i + 1000)):
                    host, body = payload(i)
                    batch.append(Entry(host, random.randrange(3), b"fp%d" % i, body, True))
                f.push(batch)
                next_i += len(batch)
            assert f.counts()["queued"] == size
            ours_lat[size] = measure(lambda: f.pop("w"), lambda p: f.ack([p.lease_id]))
        fill_s = time.perf_counter() - t0
        used = self.admin.info("memory")["used_memory"]
        per_queued = (used - f.memory()["bytes"]) / f.counts()["queued"]

        for size in sizes:
            s = statistics.median(stock_lat[size]) * 1000
            o = statistics.median(ours_lat[size]) * 1000
            self.row(f"pop latency p50 at {size:,} queued", s, o, "ms", "lower")
            s99 = sorted(stock_lat[size])[int(samples * 0.99)] * 1000
            o99 = sorted(ours_lat[size])[int(samples * 0.99)] * 1000
            self.row(f"pop latency p99 at {size:,} queued", s99, o99, "ms", "lower")
        lo, hi = (statistics.median(ours_lat[s]) for s in sizes)
        s_lo, s_hi = (statistics.median(stock_lat[s]) for s in sizes)
        print(f"    p50 at {sizes[-1]:,} / p50 at {sizes[0]:,}: webfarm {hi / lo:.2f}x "
              f"(target <= 1.2x), stock {s_hi / s_lo:.2f}x")
        self.row("bytes per queued request (whole server)", per_stock, per_queued, "B", "lower")
        print(f"    filling {sizes[-1]:,} entries (seen-check + enqueue) took {fill_s:.1f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, ~1 minute")
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="wf-bench-"))
    server = servers.valkey(data)
    # Measure the frontier, not the disk: no AOF (the test fixture keeps it on).
    server.argv[server.argv.index("--appendonly") + 1] = "no"
    server.start()
    try:
        version = redis.Redis.from_url(server.url).info("server")
        print(f"valkey {version.get('valkey_version', version['redis_version'])} on {server.url}")
        bench = Bench(server.url, args.quick)
        started = time.perf_counter()
        bench.throughput()
        bench.crawl()
        bench.memory()
        bench.latency()
        print(f"\ndone in {time.perf_counter() - started:.0f} s")
    finally:
        server.stop()
        servers.remove_tree(data)


if __name__ == "__main__":
    main()
