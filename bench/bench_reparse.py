"""Re-parse pages/s by blob store: files, S3 (moto) on loopback, and S3 20 ms away.

Run: ``.venv/bin/python bench/bench_reparse.py [--runs N] [--delay SECONDS] [--quick]``
(default 5 runs, about 6 minutes). It crawls the test web once (4 shops, ~2,700 pages, the
``test_products`` spider) into a file store and once into an S3 bucket on a moto server,
then runs ``scrapy reparse`` over each store, interleaved, with
``WEBFARM_BLOB_CONCURRENCY=1`` (one blob read at a time, the baseline) and with the
default (8 reads ahead at once). The far endpoint is the same moto behind a relay that
holds each reply ``--delay`` seconds (tests/relay.py): an S3 GET's first byte takes
10-30 ms in a region, and one read at a time that is what a re-parse waits for.

Pages/s is the command's own (pages over the run, start-up excluded); medians, and the
ratio of the two concurrencies measured in the same run. Last, the file store's pages
re-parsed by two processes at once (``--shard 0/2`` and ``1/2``) against one whole run,
from launch to the last exit.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SPIDER = "test_products"
SPIDERS = "SPIDER_MODULES=spiders,tests.spiders"
BUCKET = "wf-bench-reparse"


def scrapy(args: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run([sys.executable, "-m", "scrapy", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"scrapy {args[0]} failed: {proc.stderr[-2000:]}")
    return proc.stdout


def reparse(env: dict[str, str], reads: int) -> float:
    out = scrapy(["reparse", SPIDER, "-s", SPIDERS, "-s", f"WEBFARM_BLOB_CONCURRENCY={reads}",
                  "--progress-every", "1000000"], env)
    found = re.search(r"reparse: (\d+) pages, .*\((\d+) pages/s\)", out)
    if not found or found.group(1) == "0":
        raise RuntimeError(f"no pages/s in: {out[-1000:]}")
    return float(found.group(2))


def sharded(env: dict[str, str], shards: int) -> tuple[float, int]:
    """Seconds from launch to the last exit, and pages, of ``shards`` reparse processes
    at once (``--shard k/N``), or of one whole run for 1: start-up included both ways."""
    started = time.perf_counter()
    args = [sys.executable, "-m", "scrapy", "reparse", SPIDER, "-s", SPIDERS,
            "--progress-every", "1000000"]
    procs = [subprocess.Popen([*args, *(["--shard", f"{k}/{shards}"] if shards > 1 else [])],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for k in range(shards)]
    pages = 0
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        found = re.search(r"reparse: (\d+) pages", out)
        if proc.returncode or not found:
            raise RuntimeError(f"sharded reparse failed: {err[-2000:]}")
        pages += int(found.group(1))
    return time.perf_counter() - started, pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--delay", type=float, default=0.02,
                        help="seconds the far S3 endpoint holds each reply (default 0.02)")
    parser.add_argument("--products", type=int, default=100,
                        help="products per category (default 100: ~2,700 pages)")
    parser.add_argument("--quick", action="store_true", help="1 run, 2 shops, 30 products")
    args = parser.parse_args(argv)
    hosts = 2 if args.quick else 4
    runs = 1 if args.quick else args.runs
    products = 30 if args.quick else args.products

    import boto3
    import redis

    from tests import servers
    from tests.relay import Relay

    tmp = Path(tempfile.mkdtemp(prefix="wf-bench-reparse-"))
    started = [servers.valkey(tmp / "valkey").start(), servers.secantus(tmp / "mongo").start(),
               servers.moto_s3(tmp / "moto").start()]
    valkey, mongo, moto = started
    web = subprocess.Popen(
        [sys.executable, "-m", "tests.testweb",
         *(a for i in range(hosts) for a in ("--host", f"127.0.0.{2 + i}")),
         "--products", str(products)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        start = ",".join(u + "/" for u in json.loads(web.stdout.readline())["base_urls"])
        env = {k: v for k, v in os.environ.items()
               if k not in ("SCRAPY_SETTINGS_MODULE", "http_proxy", "https_proxy")}
        env.update(REDIS_URL=valkey.url, MONGO_URI=mongo.url, WEBFARM_HOST_DELAY="0",
                   WEBFARM_ALLOWED_NETWORKS="127.0.0.0/8", WEBFARM_IDLE_TIMEOUT="1",
                   AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                   AWS_DEFAULT_REGION="us-east-1", LOG_LEVEL="WARNING")
        boto3.client("s3", endpoint_url=moto.url, region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing"
                     ).create_bucket(Bucket=BUCKET)
        stores = {"files": {"MONGO_DATABASE": "files",
                            "BLOB_STORE_URI": (tmp / "blobs").as_uri()},
                  "S3 loopback": {"MONGO_DATABASE": "s3", "BLOB_STORE_URI": f"s3://{BUCKET}/p",
                                  "AWS_ENDPOINT_URL": moto.url}}
        for store in stores.values():
            redis.Redis.from_url(valkey.url).flushall()  # a new frontier for each crawl
            scrapy(["crawl", SPIDER, "-a", f"start={start}", "-s", SPIDERS], {**env, **store})
        port = int(moto.url.rsplit(":", 1)[1])
        with Relay(("127.0.0.1", port), args.delay) as relay:
            stores[f"S3 +{args.delay * 1000:.0f} ms"] = {
                **stores["S3 loopback"], "AWS_ENDPOINT_URL": f"http://127.0.0.1:{relay.port}"}
            results: dict[tuple[str, int], list[float]] = {}
            print(f"{hosts} shops; {runs} runs of each store and concurrency, interleaved",
                  flush=True)
            for run in range(runs):
                for name, store in stores.items():
                    order = (1, 8) if run % 2 == 0 else (8, 1)  # neither always goes first
                    for reads in order:
                        rate = reparse({**env, **store}, reads)
                        results.setdefault((name, reads), []).append(rate)
                        print(f"  run {run + 1} {name:12s} {reads} at once {rate:7.1f} pages/s",
                              flush=True)
        # The file store's pages on all cores: 2 shards at once against 1 whole run, wall
        # time from launch to exit (start-up included both ways, as a user waits for it).
        walls: dict[int, list[float]] = {1: [], 2: []}
        for run in range(runs):
            for shards in ((1, 2) if run % 2 == 0 else (2, 1)):
                seconds, pages = sharded({**env, **stores["files"]}, shards)
                walls[shards].append(pages / seconds)
                print(f"  run {run + 1} files, {shards} process(es) at once "
                      f"{pages / seconds:7.1f} pages/s ({pages} pages, {seconds:.1f} s)",
                      flush=True)
        print("\nmedians (re-parse pages/s)")
        print(f"{'blob store':14s} {'1 at once':>10s} {'8 at once':>10s} {'ratio':>7s}")
        for name in stores:
            one = statistics.median(results[(name, 1)])
            eight = statistics.median(results[(name, 8)])
            print(f"{name:14s} {one:10.1f} {eight:10.1f} {eight / max(one, 1e-9):6.2f}x")
        one, two = statistics.median(walls[1]), statistics.median(walls[2])
        print(f"files, --shard 0/2 and 1/2 at once against one process (wall, start-up "
              f"included): {two:.1f} vs {one:.1f} pages/s = {two / one:.2f}x on "
              f"{os.cpu_count()} cores")
    finally:
        web.terminate()
        web.wait(10)
        for server in started:
            server.stop()
        servers.remove_tree(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
