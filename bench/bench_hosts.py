"""A worker's per-host cost on a broad crawl: the latency rule's CPU per response and its
memory, after 100 to 1,000,000 hosts.

Run: ``.venv/bin/python bench/bench_hosts.py [--quick] [--runs N]`` (two minutes;
``--quick`` stops at 100,000 hosts).

Each response of a crawl goes through :class:`webfarm.throttle.HostThrottle` (the shared
latency rule), which keeps a delay per host in a :class:`webfarm.hostmemory.HostMemory`.
Before the bound, it kept every host it met and read all of them after each response
(1.3 ms a response at 100,000 hosts on this machine). Printed: microseconds a response
(median of ``--runs`` rounds of 5,000 responses to hosts met before and new ones, as a
broad crawl sees them) and the ratio to the same code after 100 hosts, the baseline of
the run; and the memory the rule holds (tracemalloc), with the default
``WEBFARM_HOST_MEMORY`` and with ``0`` (no limit).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scrapy import Request  # noqa: E402
from scrapy.http import HtmlResponse  # noqa: E402
from scrapy.statscollectors import MemoryStatsCollector  # noqa: E402
from scrapy.utils.test import get_crawler  # noqa: E402

from webfarm.hostmemory import DEFAULT_SIZE  # noqa: E402
from webfarm.throttle import HostThrottle  # noqa: E402

ROUND = 5_000


def throttle(memory: int) -> HostThrottle:
    crawler = get_crawler(settings_dict={"WEBFARM_HOST_MEMORY": memory})
    crawler.stats = MemoryStatsCollector(crawler)
    return HostThrottle.from_crawler(crawler)


def responses(hosts: list[str]) -> list[tuple[HtmlResponse, Request]]:
    out = []
    for i, host in enumerate(hosts):
        request = Request(f"http://{host}/", meta={"download_latency": 0.2 + (i % 7) / 10})
        out.append((HtmlResponse(request.url, request=request, body=b""), request))
    return out


def fill(rule: HostThrottle, count: int, start: int = 0) -> None:
    for first in range(start, start + count, 1000):  # a few responses alive at a time
        last = min(first + 1000, start + count)
        for response, request in responses([f"h{i}.test" for i in range(first, last)]):
            rule.response_received(response, request, None)


def per_response_us(rule: HostThrottle, seen: int, runs: int) -> float:
    """Half the responses to hosts met lately, half to new hosts."""
    timings = []
    for run in range(runs):
        recent = [f"h{seen - 1 - (i * 7) % min(seen, 1000)}.test" for i in range(ROUND // 2)]
        new = [f"n{run}-{i}.test" for i in range(ROUND // 2)]
        batch = [pair for pair in zip(responses(recent), responses(new), strict=True)]
        started = time.perf_counter()
        for (r1, q1), (r2, q2) in batch:
            rule.response_received(r1, q1, None)
            rule.response_received(r2, q2, None)
        timings.append((time.perf_counter() - started) / ROUND * 1e6)
    return statistics.median(timings)


def held_bytes(memory: int, hosts: int) -> int:
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    rule = throttle(memory)
    fill(rule, hosts)
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    del rule
    return grown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args, _ = parser.parse_known_args(argv)
    sizes = [100, 1_000, 10_000, 100_000] + ([] if args.quick else [1_000_000])
    print(f"latency rule, µs a response (median of {args.runs} rounds of {ROUND:,}); "
          f"WEBFARM_HOST_MEMORY={DEFAULT_SIZE:,}")
    base = None
    rule, seen = throttle(DEFAULT_SIZE), 0
    for size in sizes:
        fill(rule, size - seen, seen)
        seen = size
        us = per_response_us(rule, seen, args.runs)
        base = base or us
        print(f"  after {size:>9,} hosts: {us:6.1f} µs  ({us / base:4.2f}x the 100-host cost)",
              flush=True)
    print("memory the rule holds (tracemalloc)")
    for size in (10_000, 100_000):  # tracemalloc slows a fill tenfold
        bounded, unbounded = held_bytes(DEFAULT_SIZE, size), held_bytes(0, size)
        print(f"  after {size:>9,} hosts: {bounded / 2**20:7.1f} MiB bounded, "
              f"{unbounded / 2**20:7.1f} MiB with WEBFARM_HOST_MEMORY=0 "
              f"({unbounded / size:.0f} B a host)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
