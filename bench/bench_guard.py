"""What the fetch layer's safety costs: the SSRF check per request, a gzip bomb, a header
flood and a page of links without end.

Run by hand: ``.venv/bin/python bench/bench_guard.py [--quick]`` (about 40 seconds).

* SSRF guard: median time of :meth:`webfarm.netguard.NetGuard.check_url` per URL for an
  IP literal, a host name in the guard's cache, and a host name resolved every time (a
  thread-pool ``getaddrinfo`` of ``localhost``), against the baseline of only parsing
  the URL (which every middleware does anyway).
* Gzip bomb: time and peak memory of Scrapy's bounded ``gunzip`` (``DOWNLOAD_MAXSIZE``
  1 MiB, what :class:`middlewares.limits.HttpCompressionMiddleware` relies on) refusing a
  bomb, against inflating the same bomb with no limit, each in a fresh process so the
  peak RSS (``ru_maxrss``) is its own.
* Header flood: a local server sends a status line and then headers without end; time
  and peak memory of one fetch through webfarm's download handler with
  ``WEBFARM_MAX_HEADER_BYTES`` (256 KiB), against the same handler unbounded (0, which
  is Scrapy's way), which reads until ``DOWNLOAD_TIMEOUT`` (3 s here). Fresh processes.
* Links: time of taking a page's links with ``WEBFARM_MAX_LINKS_PER_PAGE`` (10,000)
  against Scrapy's extractor reading all of a page of 200,000 anchors.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from webfarm.netguard import NetGuard  # noqa: E402

MIB = 1 << 20


def per_call(fn, n: int, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean seconds per call of ``n`` awaited calls."""

    async def run() -> list[float]:
        out = []
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(n):
                await fn()
            out.append((time.perf_counter() - started) / n)
        return out

    return statistics.median(asyncio.run(run()))


def bench_guard(n: int) -> None:
    allow = ["127.0.0.0/8"]
    from webfarm.netguard import parse_networks

    cached = NetGuard(parse_networks(allow), cache_seconds=3600)
    fresh = NetGuard(parse_networks(allow), cache_seconds=0)

    async def parse_only() -> None:
        urlsplit("http://localhost:8080/product/123?x=1").hostname  # noqa: B018

    async def literal() -> None:
        assert await cached.check_url("http://127.0.0.2:8080/product/123") is None

    async def hit() -> None:
        assert await cached.check_url("http://localhost:8080/product/123") is None

    async def miss() -> None:
        assert await fresh.check_url("http://localhost:8080/product/123") is None

    base = per_call(parse_only, n)
    rows = [("parse the URL only (baseline)", base)]
    for name, fn, count in (("IP literal", literal, n), ("host name, cached", hit, n),
                            ("host name, resolved each time", miss, max(50, n // 20))):
        rows.append((f"check_url: {name}", per_call(fn, count)))
    print("SSRF guard, per request (median of 5 rounds)")
    for name, seconds in rows:
        print(f"  {name:<40} {seconds * 1e6:9.1f} µs   x{seconds / base:7.1f}")


BOMB_CHILD = """
import gzip, io, resource, sys, time
from scrapy.utils.gz import gunzip
size, limit = int(sys.argv[1]), int(sys.argv[2])
out = io.BytesIO()
with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as gz:
    block = b" " * (1 << 20)
    for _ in range(size >> 20):
        gz.write(block)
body = out.getvalue(); del out
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
try:
    gunzip(body, max_size=limit)
    outcome = "inflated"
except Exception as exc:
    outcome = type(exc).__name__
took = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(f"{len(body)} {took} {(peak - before) * 1024} {outcome}")
"""


def bench_bomb(size: int) -> None:
    print(f"\nGzip bomb: {size // MIB} MiB inflated (one fresh process per run, median of 3)")
    results = {}
    for label, limit in (("no limit (Scrapy with DOWNLOAD_MAXSIZE=0)", 0),
                         ("DOWNLOAD_MAXSIZE = 1 MiB (webfarm)", MIB)):
        runs = []
        for _ in range(3):
            out = subprocess.run([sys.executable, "-c", BOMB_CHILD, str(size), str(limit)],
                                 capture_output=True, text=True, check=True, cwd=ROOT)
            compressed, took, grew, outcome = out.stdout.split()
            runs.append((float(took), int(grew), outcome, int(compressed)))
        took = statistics.median(r[0] for r in runs)
        grew = statistics.median(r[1] for r in runs)
        results[limit] = (took, grew)
        print(f"  {label:<42} {took * 1e3:8.1f} ms  peak RSS +{grew / MIB:7.1f} MiB  "
              f"({runs[0][2]}; {runs[0][3] // 1024} KiB compressed)")
    (t0, m0), (t1, m1) = results[0], results[MIB]
    print(f"  bounded / unbounded: time x{t1 / t0:.3f}, memory x{m1 / max(m0, 1):.3f}")


FLOOD_CHILD = r"""
import resource, socket, sys, threading, time
from scrapy import Request, Spider
from scrapy.crawler import CrawlerProcess
limit, timeout = int(sys.argv[1]), float(sys.argv[2])
server = socket.create_server(("127.0.0.1", 0))
def flood():
    conn, _ = server.accept()
    conn.recv(65536)
    line = b"X-Flood: " + b"v" * 8000 + b"\r\n"
    try:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n")
        end = time.monotonic() + timeout + 5
        while time.monotonic() < end:
            conn.sendall(line * 64)
    except OSError:
        pass
threading.Thread(target=flood, daemon=True).start()
outcome = []
class Flood(Spider):
    name = "flood"
    async def start(self):
        yield Request(f"http://127.0.0.1:{server.getsockname()[1]}/", errback=self.failed)
    def parse(self, response):
        outcome.append("response")
    def failed(self, failure):
        outcome.append(type(failure.value).__name__)
process = CrawlerProcess({"DOWNLOAD_HANDLERS": {"http": "webfarm.download.DownloadHandler"},
                          "WEBFARM_MAX_HEADER_BYTES": limit, "DOWNLOAD_TIMEOUT": timeout,
                          "RETRY_ENABLED": False, "LOG_LEVEL": "CRITICAL"})
process.crawl(Flood)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
process.start()
took = time.perf_counter() - started
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
print(f"{took} {grew} {outcome[0] if outcome else 'none'}")
"""


def bench_header_flood(timeout: float) -> None:
    print(f"\nHeader flood: one fetch, DOWNLOAD_TIMEOUT {timeout:g} s (a fresh process per run, "
          "median of 3)")
    results = {}
    for label, limit in (("unbounded (WEBFARM_MAX_HEADER_BYTES=0)", 0),
                         ("WEBFARM_MAX_HEADER_BYTES = 256 KiB", 256 * 1024)):
        runs = []
        for _ in range(3):
            out = subprocess.run([sys.executable, "-c", FLOOD_CHILD, str(limit), str(timeout)],
                                 capture_output=True, text=True, check=True, cwd=ROOT)
            took, grew, outcome = out.stdout.split()[-3:]
            runs.append((float(took), int(grew), outcome))
        took = statistics.median(r[0] for r in runs)
        grew = statistics.median(r[1] for r in runs)
        results[limit] = (took, grew)
        print(f"  {label:<42} {took:8.2f} s   peak RSS +{grew / MIB:7.1f} MiB  ({runs[0][2]})")
    (t0, m0), (t1, m1) = results[0], results[256 * 1024]
    print(f"  bounded / unbounded: time x{t1 / t0:.3f}, memory x{m1 / max(m0, 1):.3f}")


def bench_links(anchors: int) -> None:
    from scrapy.http import HtmlResponse
    from scrapy.linkextractors import LinkExtractor

    from webfarm.links import MAX_LINKS_PER_PAGE, extract_links

    body = ("<html><body>" + "".join(f'<a href="/p/{i}">x</a>' for i in range(anchors))
            + "</body></html>").encode()
    print(f"\nLinks: a {len(body) / 1e6:.1f} MB page of {anchors:,} anchors (median of 3)")
    results = {}
    for label, limit in (("all (Scrapy's extractor)", 0),
                         (f"WEBFARM_MAX_LINKS_PER_PAGE = {MAX_LINKS_PER_PAGE:,}",
                          MAX_LINKS_PER_PAGE)):
        runs = []
        for _ in range(3):
            page = HtmlResponse("http://shop.test/", body=body, encoding="utf-8")
            started = time.perf_counter()
            links, _ = extract_links(LinkExtractor(unique=True), page, limit)
            runs.append(time.perf_counter() - started)
        results[limit] = statistics.median(runs)
        print(f"  {label:<42} {results[limit]:8.2f} s   {len(links):,} links")
    print(f"  bounded / all: time x{results[MAX_LINKS_PER_PAGE] / results[0]:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls, a smaller bomb")
    args = parser.parse_args(argv)
    bench_guard(2_000 if args.quick else 20_000)
    bench_bomb(64 * MIB if args.quick else 256 * MIB)
    bench_header_flood(1.0 if args.quick else 3.0)
    bench_links(50_000 if args.quick else 200_000)
    print(f"\n(bench process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}"
          " MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
