"""Near-duplicate lookups against a growing ``contents`` collection: split or whole.

Run: ``.venv/bin/python bench/bench_neardup.py [--runs N] [--quick]`` (about 2 minutes).
It fills the embedded SecantusDB's ``contents`` with random SimHash band keys (as a crawl
stores them, indexed), then times :func:`webfarm.neardup.near_pages` for a batch of 200
new pages (800 band keys): with the keys in one ``$in`` (the baseline: what a batch sent
before) and split into queries of ``neardup.QUERY_KEYS``. Medians and the ratio, at each
size. A crawl's pages/s fell from ~200 to ~40 as its index grew past 20,000 contents,
with the server's CPU at 90 %: this is that lookup.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pymongo import MongoClient  # noqa: E402

from tests import servers  # noqa: E402
from webfarm import neardup  # noqa: E402

BATCH = 200  # pages per index batch (WEBFARM_INDEX_BATCH's default order)


def fill(coll, upto: int, have: int, rnd: random.Random) -> None:
    docs = []
    for i in range(have, upto):
        value = rnd.getrandbits(64)
        docs.append({"_id": f"{i:064x}", "simhash": neardup.to_stored(value),
                     "simhash_bands": neardup.bands(value), "first_page_id": str(i)})
        if len(docs) == 2000:
            coll.insert_many(docs)
            docs = []
    if docs:
        coll.insert_many(docs)


def lookup(coll, rnd: random.Random, per_query: int) -> float:
    pages = [{"simhash": rnd.getrandbits(64), "content_hash": f"new{i}"} for i in range(BATCH)]
    batch = [(i, f"p{i}", None) for i in range(BATCH)]
    contents = {p["content_hash"]: {"first_page_id": f"p{i}"} for i, p in enumerate(pages)}
    neardup.QUERY_KEYS = per_query
    started = time.perf_counter()
    neardup.near_pages(coll, 3, pages, batch, contents)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, 3 runs")
    opts, _ = parser.parse_known_args(argv)
    sizes = (5_000, 20_000) if opts.quick else (10_000, 40_000, 80_000)
    runs = 3 if opts.quick else opts.runs
    split = neardup.QUERY_KEYS
    server = servers.secantus(test_commands=False).start()
    try:
        coll = MongoClient(server.url)["bench"]["contents"]
        coll.create_index("simhash_bands")
        rnd, have = random.Random(7), 0
        print(f"{BATCH} new pages ({4 * BATCH} band keys) a batch; medians of {runs} runs")
        print(f"{'contents':>9}  {'one $in':>9}  {f'by {split}':>9}  ratio")
        for size in sizes:
            fill(coll, size, have, rnd)
            have = size
            whole, parts = [], []
            for _ in range(runs):  # interleaved: the machine's noise falls on both
                whole.append(lookup(coll, rnd, 10**9))
                parts.append(lookup(coll, rnd, split))
            w, p = statistics.median(whole), statistics.median(parts)
            print(f"{size:>9,}  {w * 1000:>7.0f}ms  {p * 1000:>7.0f}ms  {w / p:.1f}x faster")
    finally:
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
