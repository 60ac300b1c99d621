"""The full storage pipeline vs bare Scrapy vs stock scrapy-redis, crawling the same test web.

Run: ``.venv/bin/python bench/bench_pipeline.py [--quick] [--runs N] [--products N]
[--page-kb KB] [--set NAME=VALUE ...]`` (default: 3 runs of each setup, ~800 pages a
crawl, about 6 minutes). ``--set`` tries a tuning on every webfarm setup.

It starts the test web (a subprocess, ``python -m tests.testweb``), Valkey and
SecantusDB (tests/servers.py) and crawls one host with the ``test_products``
spider (tests/spiders: stores every page and extracts 3 items per product page)
in these setups, each in fresh processes (a fresh reactor):

* **webfarm**: the project as deployed: Redis frontier (leases, per-host queues,
  Bloom dedupe), content hash + SimHash, blob store (files), MongoDB bulk
  index writes, item store;
* **bare Scrapy**: the same spider and downloader middlewares with Scrapy's
  in-memory scheduler and dupefilter and no item pipelines;
* **scrapy-redis**: stock ``scrapy_redis.scheduler.Scheduler`` with its
  ``PriorityQueue`` and ``RFPDupeFilter`` (pickle serialisation), no pipelines;
* **storage only** / **frontier only**: the two halves of webfarm apart (Scrapy's
  scheduler with webfarm's pipelines; webfarm's frontier with no pipelines), to
  show which half costs what;
* **webfarm x2**: two webfarm processes crawling the same frontier at once, as a
  scrapyd deployment runs them (one Scrapy process uses one core at most; bare
  Scrapy's in-memory scheduler cannot share a crawl between processes). Its
  pages/s is both processes' pages from the first response to the last item, and
  its worker CPU is per page of either process.

Pages/second counts from the first response to the last item done (start-up and
the idle wait at the end excluded). ``WEBFARM_HOST_DELAY=0``; 4 shops (hosts), as
politeness is per host; monitoring (WEBFARM_METRICS) off in every setup, the
rest of the fetch layer on in every setup. scrapy-redis fetches more pages: its dupefilter does not
drop tracking parameters (pages/s is per page fetched and processed). Then it
re-parses the stored pages with ``scrapy reparse`` and prints its pages/second.

CPU per page is printed for the crawling process, its helper processes (storage and
hashing), Valkey + SecantusDB, and the whole machine (those and the test web): on a
machine whose cores are all busy, pages/s follows the machine's CPU per page, not the
crawling process's alone. A last table splits the measured time of the crawling
process's reactor thread into time on a CPU, time runnable but waiting for a CPU
(another process had it: the helpers, the servers, the test web) and time asleep
(waiting for the network, Redis or the helpers), from Linux's per-thread schedstat.
"""

from __future__ import annotations

import argparse
import contextlib
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

SETUPS = ("webfarm", "bare Scrapy", "scrapy-redis", "storage only", "frontier only",
          "webfarm x2")
# Setups run as several crawling processes at once on one frontier (the deployed form:
# scrapyd runs several crawl processes per machine, all sharing the Redis frontier).
WORKERS = {"webfarm x2": 2}
SPIDER = "test_products"


def overrides(setup: str) -> dict[str, object]:
    common: dict[str, object] = {"SPIDER_MODULES": ["spiders", "tests.spiders"],
                                 "LOG_LEVEL": "WARNING", "WEBFARM_HOST_DELAY": 0.0,
                                 "WEBFARM_IDLE_TIMEOUT": 1.0,
                                 # monitoring is not storage, and it needs the frontier
                                 "WEBFARM_METRICS": False}
    if os.environ.get("WF_BENCH_LATENCY_RULE") == "off":
        # The per-host latency rule keeps about one request per host in flight (politeness
        # bare Scrapy does not have); off, the setups compare overhead alone.
        common["WEBFARM_AUTOTHROTTLE"] = False
    extra = json.loads(os.environ.get("WF_BENCH_SET") or "{}")  # --set, webfarm setups only
    bare = {"SCHEDULER": "scrapy.core.scheduler.Scheduler",
            "DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter"}
    if setup == "bare Scrapy":
        return {**common, **bare, "ITEM_PIPELINES_BASE": {}}
    if setup != "scrapy-redis":
        common.update(extra)
    if setup == "storage only":  # Scrapy's scheduler + webfarm's storage pipelines
        return {**common, **bare}
    if setup in WORKERS:  # the parent flushed Redis; a later worker must not flush it again
        return {**common, "SCHEDULER_FLUSH_ON_START": False}
    if setup == "frontier only":  # webfarm's frontier, no pipelines
        return {**common, "SCHEDULER_FLUSH_ON_START": True, "ITEM_PIPELINES_BASE": {}}
    if setup == "scrapy-redis":
        return {**common, "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
                "SCHEDULER_QUEUE_CLASS": "scrapy_redis.queue.PriorityQueue",
                "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
                "SCHEDULER_QUEUE_KEY": "%(spider)s:requests",
                "SCHEDULER_DUPEFILTER_KEY": "%(spider)s:dupefilter",
                "SCHEDULER_SERIALIZER": "scrapy_redis.picklecompat",
                "SCHEDULER_FLUSH_ON_START": True, "SCHEDULER_PERSIST": False,
                "ITEM_PIPELINES_BASE": {}}
    return {**common, "SCHEDULER_FLUSH_ON_START": True}


def child(setup: str, start: str) -> None:
    """One crawl in this process; prints one JSON line with pages and seconds."""
    from scrapy import signals
    from scrapy.crawler import CrawlerProcess
    from scrapy.utils.project import get_project_settings

    from webfarm.items import PageItem

    settings = get_project_settings()
    settings.setdict(overrides(setup), priority="cmdline")
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(SPIDER)
    marks = {"first": None, "last": None, "pages": 0, "items": 0, "cpu0": 0.0, "cpu1": 0.0,
             "helpers0": 0.0, "helpers1": 0.0, "sampled": 0.0,
             "sched0": (0.0, 0.0), "sched1": (0.0, 0.0)}
    clock = ThreadClock()  # the reactor's thread: signals are sent from it

    def response_received(**kw: object) -> None:
        marks["last_response"] = time.perf_counter()
        if marks["first"] is None:
            marks["first"] = time.perf_counter()
            marks["cpu0"] = time.process_time()
            marks["helpers0"] = helpers_cpu()
            marks["sched0"] = clock.read()

    def item_scraped(item: object, **kw: object) -> None:
        marks["last"] = time.perf_counter()
        marks["cpu1"] = time.process_time()
        marks["sched1"] = clock.read()
        marks["pages" if isinstance(item, PageItem) else "items"] += 1
        if marks["last"] - marks["sampled"] >= 0.05:  # /proc reads, at most 20 a second
            marks["sampled"], marks["helpers1"] = marks["last"], helpers_cpu()

    crawler.signals.connect(response_received, signal=signals.response_received)
    crawler.signals.connect(item_scraped, signal=signals.item_scraped)
    process.crawl(crawler, start=start)
    process.start()
    seconds = (marks["last"] or 0) - (marks["first"] or 0)
    cpu = marks["cpu1"] - marks["cpu0"]
    (ran0, wait0), (ran1, wait1) = marks["sched0"], marks["sched1"]
    print(json.dumps({"pages": marks["pages"], "items": marks["items"], "seconds": seconds,
                      "first": marks["first"], "last": marks["last"],
                      "last_response": marks.get("last_response", 0),
                      "tail": (marks["last"] or 0) - marks.get("last_response", 0),
                      "cpu_ms": 1000 * cpu / max(1, marks["pages"]),
                      "helpers_ms": 1000 * (marks["helpers1"] - marks["helpers0"])
                      / max(1, marks["pages"]),
                      # the reactor thread's share of the measured time on a CPU, and
                      # runnable but waiting for one (taken by another process)
                      "on_cpu": (ran1 - ran0) / seconds if seconds else 0,
                      "cpu_wait": (wait1 - wait0) / seconds if seconds else 0,
                      "blobs": crawler.stats.get_value("webfarm/blobs/written", 0),
                      "recent": crawler.stats.get_value("webfarm/blobs/recent", 0),
                      "errors": crawler.stats.get_value("log_count/ERROR", 0),
                      "item_errors": crawler.stats.get_value("webfarm/items/gave_up", 0)}))


class ThreadClock:
    """The calling thread's seconds on a CPU and waiting for one (runnable, but another
    task had the CPU): Linux's per-thread schedstat, read in under a microsecond."""

    def __init__(self) -> None:
        try:
            self.fd: int | None = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:  # not Linux, or no scheduler statistics: the columns read 0
            self.fd = None

    def read(self) -> tuple[float, float]:
        if self.fd is None:
            return 0.0, 0.0
        run, wait = os.pread(self.fd, 64, 0).split()[:2]
        return int(run) / 1e9, int(wait) / 1e9


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a server process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def helpers_cpu() -> float:
    """CPU so far of this process's children: webfarm's storage and hashing helpers."""
    total = 0.0
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            for pid in (task / "children").read_text().split():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    total += cpu_seconds(int(pid))
    return total


def run_child(setup: str, start: str, env: dict[str, str]) -> dict[str, float]:
    """One crawl in ``WORKERS.get(setup, 1)`` processes at once; their pages summed over
    the time from the first response of any to the last item of any."""
    procs = [subprocess.Popen([sys.executable, __file__, "--child", setup, "--start", start],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for _ in range(WORKERS.get(setup, 1))]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=600)
            lines = [x for x in out.splitlines() if x.startswith("{")]
            if proc.returncode or not lines:
                raise RuntimeError(f"{setup} crawl failed ({proc.returncode}): {err[-2000:]}")
            results.append(json.loads(lines[-1]))
    finally:  # one worker failed: do not leave the other crawling
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    if len(results) == 1:
        return results[0]
    pages = sum(r["pages"] for r in results)
    results = [r for r in results if r["pages"]] or results[:1]  # a worker may get none
    return {"pages": pages, "items": sum(r["items"] for r in results),
            "blobs": sum(r["blobs"] for r in results),
            "recent": sum(r["recent"] for r in results),
            "seconds": max(r["last"] for r in results) - min(r["first"] for r in results),
            "tail": max(r["last"] for r in results) - max(r["last_response"] for r in results),
            "cpu_ms": sum(r["cpu_ms"] * r["pages"] for r in results) / max(1, pages),
            "helpers_ms": sum(r["helpers_ms"] * r["pages"] for r in results) / max(1, pages),
            # each worker's share of its own measured time, averaged over the workers
            "on_cpu": statistics.mean(r["on_cpu"] for r in results),
            "cpu_wait": statistics.mean(r["cpu_wait"] for r in results)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--products", type=int, default=30, help="products per category")
    parser.add_argument("--categories", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=4, help="shops on 127.0.0.2, .3, ...")
    parser.add_argument("--page-kb", type=int, default=0,
                        help="KB of review text added to every product page (real product "
                             "pages weigh about 100 KB; content hashing grows with size)")
    parser.add_argument("--quick", action="store_true", help="1 run each, a smaller shop")
    parser.add_argument("--latency-rule", choices=("on", "off"), default="on",
                        help="webfarm's per-host latency rule (politeness); off compares "
                             "overhead alone")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for every setup but bare Scrapy and scrapy-redis "
                             "(VALUE as JSON, else a string), to measure a tuning")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--start", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.start)
        return 0
    if args.quick:
        args.runs, args.hosts = 1, 2

    import pymongo
    import redis

    from tests import servers

    tmp = Path(tempfile.mkdtemp(prefix="wf-bench-pipeline-"))
    valkey = servers.valkey(tmp / "valkey").start()
    mongo = servers.secantus(tmp / "mongo").start()
    hosts = [f"127.0.0.{2 + i}" for i in range(args.hosts)]
    web = subprocess.Popen(
        [sys.executable, "-m", "tests.testweb", *(a for h in hosts for a in ("--host", h)),
         "--categories", str(args.categories), "--products", str(args.products),
         "--reviews-kb", str(args.page_kb)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    servers_ = {"valkey": valkey, "mongo": mongo}
    try:
        start = ",".join(u + "/" for u in json.loads(web.stdout.readline())["base_urls"])
        env = {k: v for k, v in os.environ.items()
               if k not in ("SCRAPY_SETTINGS_MODULE", "http_proxy", "https_proxy")}
        env.update(REDIS_URL=valkey.url, MONGO_URI=mongo.url, WEBFARM_HOST_DELAY="0",
                   WEBFARM_ALLOWED_NETWORKS="127.0.0.0/8", WEBFARM_IDLE_TIMEOUT="1")
        env["WF_BENCH_LATENCY_RULE"] = args.latency_rule
        env["WF_BENCH_SET"] = json.dumps(dict(setting(s) for s in args.set))
        results: dict[str, list[dict[str, float]]] = {s: [] for s in SETUPS}
        reparse: list[float] = []
        print(f"test web: {args.hosts} shops x {args.categories} categories x {args.products} "
              f"products (+{args.page_kb} KB a product page); {args.runs} runs of each setup, "
              f"interleaved; per-host latency rule {args.latency_rule}", flush=True)
        for run in range(args.runs):
            for setup in SETUPS:
                db = f"bench{run}"
                # A blob store of its own for each crawl, as its database: in a shared one
                # the setups after the first found every blob there and wrote none.
                blobs = tmp / f"blobs{run}-{setup.replace(' ', '-')}"
                run_env = {**env, "MONGO_DATABASE": db, "BLOB_STORE_URI": blobs.as_uri()}
                redis.Redis.from_url(valkey.url).flushall()
                pymongo.MongoClient(mongo.url).drop_database(db)
                before = {n: cpu_seconds(p.proc.pid) for n, p in servers_.items()}
                web_before = cpu_seconds(web.pid)
                r = run_child(setup, start, run_env)
                r["server_ms"] = 1000 * sum(cpu_seconds(p.proc.pid) - before[n]
                                            for n, p in servers_.items()) / max(1, r["pages"])
                r["web_ms"] = 1000 * (cpu_seconds(web.pid) - web_before) / max(1, r["pages"])
                results[setup].append(r)
                print(f"  run {run + 1} {setup:12s} {r['pages']:5d} pages "
                      f"{r['pages'] / r['seconds']:7.1f} pages/s"
                      + (f"  {r['blobs']} blobs written" if r["blobs"] else "")
                      + (f", {r['recent']} pages' blobs known stored" if r["recent"] else ""),
                      flush=True)
                if setup == "webfarm":
                    reparse.append(run_reparse(run_env))
                    print(f"  run {run + 1} re-parse     {reparse[-1]:7.1f} pages/s",
                          flush=True)
        report(results, reparse)
    finally:
        web.terminate()
        web.wait(10)
        mongo.stop()
        valkey.stop()
        servers.remove_tree(tmp)
    return 0


def setting(text: str) -> tuple[str, object]:
    """``NAME=VALUE`` from ``--set``; VALUE is JSON when it parses as JSON."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--set {text!r}: write NAME=VALUE, e.g. --set WEBFARM_NEARDUP=false")
    try:
        return name, json.loads(value)
    except ValueError:
        return name, value


def run_reparse(env: dict[str, str]) -> float:
    proc = subprocess.run(
        [sys.executable, "-m", "scrapy", "reparse", SPIDER, "-s",
         "SPIDER_MODULES=spiders,tests.spiders", "--progress-every", "1000000"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    found = re.search(r"\((\d+) pages/s\)", proc.stdout)
    if proc.returncode or not found:
        raise RuntimeError(f"reparse failed: {proc.stdout[-1000:]} {proc.stderr[-2000:]}")
    return float(found.group(1))


def report(results: dict[str, list[dict[str, float]]], reparse: list[float]) -> None:
    rates = {s: statistics.median(r["pages"] / r["seconds"] for r in rs)
             for s, rs in results.items()}
    pages = {s: statistics.median(r["pages"] for r in rs) for s, rs in results.items()}
    cpu = {s: statistics.median(r["cpu_ms"] for r in rs) for s, rs in results.items()}
    helpers = {s: statistics.median(r["helpers_ms"] for r in rs) for s, rs in results.items()}
    server = {s: statistics.median(r["server_ms"] for r in rs) for s, rs in results.items()}
    machine = {s: statistics.median(r["cpu_ms"] + r["helpers_ms"] + r["server_ms"] + r["web_ms"]
                                    for r in rs) for s, rs in results.items()}
    tail = {s: statistics.median(r["tail"] for r in rs) for s, rs in results.items()}
    bare = rates["bare Scrapy"]
    # Each run measures every setup back to back, so a setup's ratio to bare Scrapy within
    # one run sees the same neighbours on a shared machine; their median is the steadier one.
    per_run = {s: [(r["pages"] / r["seconds"]) / (b["pages"] / b["seconds"])
                   for r, b in zip(rs, results["bare Scrapy"], strict=True)]
               for s, rs in results.items()}
    paired = {s: statistics.median(ratios) for s, ratios in per_run.items()}
    print("\nmedian of runs (pages/s from first response to last item stored; CPU per page: "
          "the crawling process's and its helpers' over that time, Valkey's + SecantusDB's "
          "for the whole crawl, and the machine's: those and the test web's)")
    print(f"{'setup':14s} {'pages':>6s} {'pages/s':>9s} {'vs bare':>8s} {'paired':>7s} "
          f"{'worker CPU':>11s} {'helpers':>8s} {'server CPU':>11s} {'machine':>8s} "
          f"{'end wait':>9s}")
    for setup in SETUPS:
        print(f"{setup:14s} {pages[setup]:6.0f} {rates[setup]:9.1f} {rates[setup] / bare:7.2f}x "
              f"{paired[setup]:6.2f}x {cpu[setup]:8.1f} ms {helpers[setup]:5.1f} ms "
              f"{server[setup]:8.1f} ms {machine[setup]:5.1f} ms {tail[setup]:7.2f} s")
    print(f"{'re-parse':14s} {pages['webfarm']:6.0f} {statistics.median(reparse):9.1f} "
          f"{statistics.median(reparse) / bare:7.2f}x")
    print("(vs bare: ratio of the medians; paired: median of each run's ratio to that run's "
          "bare Scrapy; end wait: last item stored after the last response; machine CPU "
          f"against {os.cpu_count()} cores: a setup that needs more per page than bare "
          "Scrapy gets fewer pages/s once the cores are busy)")
    for name in ("webfarm", "storage only", "webfarm x2"):
        # Three decimals and the runs' spread: near the target a rounded 0.80 can miss it,
        # and one median says nothing of how often a run does.
        verdict = "meets" if rates[name] >= 0.8 * bare else "MISSES"
        ratios = per_run[name]
        print(f"{name} / bare Scrapy = {rates[name] / bare:.3f}, paired {paired[name]:.3f} "
              f"(runs {min(ratios):.2f}-{max(ratios):.2f}, "
              f"{sum(x >= 0.8 for x in ratios)} of {len(ratios)} at 0.8 or above): "
              f"{verdict} the 0.8x target")
    print(f"webfarm / scrapy-redis = {rates['webfarm'] / rates['scrapy-redis']:.2f}")
    print(f"\n{'setup':14s} {'crawler on a CPU':>17s} {'waiting for one':>16s} "
          f"{'asleep':>7s}   (the crawling process's reactor thread, share of the "
          "measured time; medians)")
    for setup in SETUPS:
        on = statistics.median(r["on_cpu"] for r in results[setup])
        wait = statistics.median(r["cpu_wait"] for r in results[setup])
        print(f"{setup:14s} {on:16.0%} {wait:16.0%} {max(0.0, 1 - on - wait):7.0%}")


if __name__ == "__main__":
    sys.exit(main())
