"""What monitoring costs a worker, against baselines measured in the same run.

Run by hand: ``.venv/bin/python bench/bench_monitoring.py [--quick]`` (about a minute;
``--crawl`` adds real crawls of the test web with WEBFARM_METRICS on and off). It
starts its own valkey-server (tests/servers.py) and prints medians of:

* the hot path per response, in microseconds: Scrapy's own stats counting of a
  response (what ``DownloaderStats`` does: the baseline), webfarm's in-memory
  :class:`~webfarm.monitor.metrics.Recorder`, and the naive design this avoids —
  one pipelined Redis round trip per response;
* one flush (drain + one pipelined write) after 1,000 responses over 10 or 1,000
  hosts, and reading a 10-bucket window of 1,000 hosts (what a rule or
  ``scrapy frontier`` does);
* with ``--crawl``: pages per second of a whole crawl, metrics on vs off.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402
from scrapy.statscollectors import MemoryStatsCollector  # noqa: E402

from tests import servers  # noqa: E402
from webfarm.monitor.metrics import MetricsStore, Recorder  # noqa: E402


def median_of(runs: int, fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(runs))


def per_call_us(n: int, call: Callable[[int], None]) -> float:
    t = time.perf_counter()
    for i in range(n):
        call(i)
    return (time.perf_counter() - t) / n * 1e6


def hot_path(server: redis.Redis, runs: int, n: int) -> list[tuple[str, float]]:
    hosts = [f"host{i}.example:80" for i in range(50)]
    stats = MemoryStatsCollector.__new__(MemoryStatsCollector)
    stats._stats = {}

    def scrapy_stats(i: int) -> None:
        stats.inc_value("downloader/response_count")
        stats.inc_value("downloader/response_status_count/200")
        stats.inc_value("downloader/response_bytes", 5000)

    recorder = Recorder(MetricsStore(server, "bench", bucket_seconds=60))

    def monitor(i: int) -> None:
        host = hosts[i % 50]
        recorder.request(host)
        recorder.response(host, 200, 0.05, 5000)

    store = MetricsStore(server, "bench_naive", bucket_seconds=60)

    def naive(i: int) -> None:
        host = hosts[i % 50]
        key = store.key(store.bucket_of(time.time()))
        pipe = server.pipeline(transaction=False)
        for metric, value in (("requests", 1), ("status:2xx", 1), ("bytes", 5000),
                              ("fetch_http", 1), ("latency_count", 1)):
            pipe.hincrby(key, f"{host}|{metric}", value)
        pipe.hincrbyfloat(key, f"{host}|latency_sum", 0.05)
        pipe.execute()

    # Interleaved, so each ratio compares measurements taken at the same time.
    measures = [("Scrapy stats per response (baseline)", n, scrapy_stats),
                ("webfarm Recorder per response", n, monitor),
                ("naive: one Redis round trip per response", max(n // 20, 200), naive)]
    samples: list[list[float]] = [[] for _ in measures]
    for _ in range(runs):
        for i, (_, count, call) in enumerate(measures):
            samples[i].append(per_call_us(count, call))
    return [(name, statistics.median(values))
            for (name, _, _), values in zip(measures, samples, strict=True)]


def flush_and_read(server: redis.Redis, runs: int) -> list[tuple[str, float]]:
    out = []
    for n_hosts in (10, 1000):
        store = MetricsStore(server, f"bench_flush{n_hosts}", bucket_seconds=60)
        recorder = Recorder(store)

        def one_flush(recorder: Recorder = recorder, store: MetricsStore = store,
                      n_hosts: int = n_hosts) -> float:
            for i in range(1000):
                host = f"h{i % n_hosts}.example:80"
                recorder.request(host)
                recorder.response(host, 200 if i % 10 else 503, 0.05, 5000)
            t = time.perf_counter()
            counts, maxes = recorder.drain()
            store.write(counts, maxes)
            return (time.perf_counter() - t) * 1e3

        out.append((f"flush of 1,000 responses over {n_hosts:,} hosts (ms, 1 round trip)",
                    median_of(runs, one_flush)))
    store = MetricsStore(server, "bench_read", bucket_seconds=60)
    now = store.bucket_of(store.now())
    for b in range(10):
        store.write({(now - 60 * b, f"h{i}.example:80|{m}"): 3
                     for i in range(1000) for m in ("requests", "status:2xx", "bytes")})

    def read() -> float:
        t = time.perf_counter()
        store.window(600)
        return (time.perf_counter() - t) * 1e3

    out.append(("read a 10-bucket window of 1,000 hosts (ms)", median_of(runs, read)))
    return out


def crawl(runs: int) -> list[tuple[str, float]]:
    from tests import runner
    from tests.testweb import TestWeb

    out = []
    with tempfile.TemporaryDirectory() as tmp, TestWeb(hosts=("127.0.0.31", "127.0.0.32")) as web:
        valkey = servers.valkey(Path(tmp) / "v").start()
        mongo = servers.secantus(Path(tmp) / "m").start()
        try:
            rates: dict[str, list[float]] = {"on": [], "off": []}
            for i in range(runs):
                for mode in ("off", "on"):
                    redis.Redis.from_url(valkey.url).flushall()
                    env = runner.env_for(REDIS_URL=valkey.url, MONGO_URI=mongo.url,
                                         MONGO_DATABASE=f"bench{i}{mode}",
                                         BLOB_STORE_URI=(Path(tmp) / f"b{i}{mode}").as_uri(),
                                         WEBFARM_RENDER="http")
                    web.clear_hits()
                    result = runner.scrapy(
                        ["crawl", "generic", "-a", "start=" + ",".join(u + "/" for u in
                                                                       web.base_urls),
                         "-s", f"WEBFARM_METRICS={mode == 'on'}"], env, timeout=300)
                    if result.returncode:
                        raise SystemExit(result.output[-2000:])
                    # Scrapy's own open-to-close time: start-up noise left out.
                    found = re.search(r"'elapsed_time_seconds': ([0-9.]+)", result.output)
                    elapsed = float(found.group(1)) if found else float("nan")
                    rates[mode].append(len(web.hits) / elapsed)
            for mode in ("off", "on"):
                out.append((f"crawl, metrics {mode} (fetches/s, spider open to close)",
                            statistics.median(rates[mode])))
        finally:
            mongo.stop()
            valkey.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--crawl", action="store_true", help="also crawl with metrics on/off")
    args = parser.parse_args(argv)
    runs, n = (3, 20_000) if args.quick else (7, 100_000)
    with tempfile.TemporaryDirectory() as tmp:
        valkey = servers.valkey(Path(tmp)).start()
        try:
            server = redis.Redis.from_url(valkey.url)
            hot = hot_path(server, runs, n)
            other = flush_and_read(server, runs)
        finally:
            valkey.stop()
    base = hot[0][1]
    print(f"{'measure':<60}{'median':>12}{'ratio':>10}")
    for name, value in hot:
        print(f"{name + ' (us)':<60}{value:>12.2f}{value / base:>9.1f}x")
    for name, value in other:
        print(f"{name:<60}{value:>12.2f}")
    if args.crawl:
        rows = crawl(1 if args.quick else 3)
        for name, value in rows:
            print(f"{name:<60}{value:>12.1f}")
        print(f"{'crawl throughput on/off':<60}{rows[1][1] / rows[0][1]:>21.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
