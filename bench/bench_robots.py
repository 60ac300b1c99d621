"""What obeying robots.txt costs per request: webfarm's rules vs. Scrapy's Protego parser.

Run by hand: ``.venv/bin/python bench/bench_robots.py [--quick]`` (about half a minute).
For a typical robots.txt and two hostile ones (30 000 wildcard rules; 600 KiB of binary
garbage) it prints the median time to parse the file and to check one URL, for
:class:`webfarm.robots.RobotsRules` (cut at 500 KiB, BOM and NUL handling, errors
contained) and for Scrapy's ``ProtegoRobotParser`` on the same bytes, and the ratio.
Politeness itself (one robots.txt fetch per origin for many workers, Crawl-delay,
Retry-After) is measured at the server in ``tests/test_robots.py``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scrapy.robotstxt import ProtegoRobotParser  # noqa: E402

from webfarm.robots import RobotsRules  # noqa: E402

TYPICAL = b"""User-agent: *
Disallow: /cart/
Disallow: /checkout/
Disallow: /search?*
Allow: /search?q=*
Disallow: /*.pdf$
Crawl-delay: 2

User-agent: webfarm
Disallow: /private/
Disallow: /*?sessionid=
Sitemap: https://example.com/sitemap.xml
"""
MANY = b"User-agent: *\n" + b"".join(b"Disallow: /p%d/*x*y$\n" % i for i in range(30_000))
GARBAGE = bytes(random.Random(1).randrange(256) for _ in range(600 * 1024))
URLS = [f"https://example.com/{p}" for p in (
    "product/123", "private/a", "search?q=shoes", "search?page=2", "doc.pdf",
    "p77/axby", "category/x?sessionid=1", "",
)]


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args(argv)
    repeat = 3 if args.quick else 7
    print(f"{'file':<10} {'what':<14} {'webfarm':>12} {'scrapy':>12} {'ratio':>7}")
    for name, body in (("typical", TYPICAL), ("30k rules", MANY), ("garbage", GARBAGE)):
        ours = RobotsRules.parse(body)
        theirs = ProtegoRobotParser(body, None)
        rows = [
            ("parse", lambda b=body: RobotsRules.parse(b),
             lambda b=body: ProtegoRobotParser(b, None)),
            ("check 1 URL", lambda r=ours: [r.allowed(u, "webfarm") for u in URLS],
             lambda r=theirs: [r.allowed(u, "webfarm") for u in URLS]),
        ]
        for what, mine, stock in rows:
            a = median_seconds(mine, repeat)
            b = median_seconds(stock, repeat)
            if what.startswith("check"):
                a, b = a / len(URLS), b / len(URLS)
            print(f"{name:<10} {what:<14} {a * 1e6:>10.1f}us {b * 1e6:>10.1f}us "
                  f"{a / b if b else float('nan'):>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
