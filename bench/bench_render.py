"""HTTP first, browser when needed (``auto``) vs. the browser for every page, same run.

Run by hand: ``.venv/bin/python bench/bench_render.py [--quick] [--runs N] [--pages N]``.
It starts its own Valkey and SecantusDB (tests/servers.py) and a test web of three
hosts (tests/testweb/jspages.py) where one page in five is a JavaScript app (empty
``#app``, content inserted by script), then crawls it with ``scrapy crawl generic``
in ``WEBFARM_RENDER=auto`` and in ``WEBFARM_RENDER=browser``, alternating, and prints
medians of:

* browser renders per JavaScript page (counted at the server: every render fetches
  the page's ``app.js``; target <= 1.1), and renders of plain pages;
* wall time of the whole ``scrapy crawl`` process (Python and Scrapy start-up and
  the idle wait before closing included), and of the crawl itself (the crawler's
  first request at the server to the last page stored), and their ratios
  auto/browser (target <= 0.3);
* peak memory: the largest sum of PSS (RSS where PSS is unavailable) over the
  worker and its children (the Playwright driver and Chromium's processes),
  sampled every 0.1 s.

Both modes use the same settings otherwise: no host delay, the latency rule off
(a browser's latency includes rendering, which says nothing about the server).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pymongo  # noqa: E402
import redis  # noqa: E402

from tests import runner, servers  # noqa: E402
from tests.testweb import TestWeb  # noqa: E402
from tests.testweb.jspages import JsSite  # noqa: E402

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def _pss(pid: int) -> int | None:
    """Proportional set size (shared pages split between sharers), or None."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def tree_rss(root: int) -> int:
    """Bytes of memory of ``root`` and every process below it: PSS where the kernel
    gives it (Chromium's processes share much of their memory), else RSS."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(entry), int(fields[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        pss = _pss(pid)
        total += pss if pss is not None else rss.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


def crawl(mode: str, sites: list[JsSite], web: TestWeb, stores: dict[str, str],
          workdir: Path) -> dict[str, float]:
    redis.Redis.from_url(stores["REDIS_URL"]).flushall()
    db_name = f"bench_render_{mode}_{time.monotonic_ns()}"
    env = runner.env_for(**stores, MONGO_DATABASE=db_name, WEBFARM_RENDER=mode,
                         WEBFARM_LOG_LEVEL="WARNING")
    web.clear_hits()
    starts = ",".join(site.url() for site in sites)
    args = ["crawl", "generic", "-a", f"start={starts}", "-s", "WEBFARM_AUTOTHROTTLE=False"]
    peak = 0
    started = time.monotonic()
    proc = runner.popen(args, env, workdir / f"{mode}.log")

    def sample() -> None:
        nonlocal peak
        while proc.poll() is None:
            peak = max(peak, tree_rss(proc.pid))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        code = proc.wait(600)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    wall = time.monotonic() - started
    sampler.join()
    if code != 0:
        raise SystemExit(f"{mode} crawl failed; see {workdir / f'{mode}.log'}")
    client = pymongo.MongoClient(stores["MONGO_URI"])
    docs = list(client[db_name].pages.find({}, {"fetched_at": 1, "url": 1,
                                                "fetch_method": 1}))
    client.drop_database(db_name)
    expected = sum(len(site.all_urls()) for site in sites)
    if len(docs) != expected:
        raise SystemExit(f"{mode}: stored {len(docs)} pages, expected {expected}")
    last = max(d["fetched_at"].timestamp() if hasattr(d["fetched_at"], "timestamp")
               else float(d["fetched_at"]) for d in docs)
    first = min(hit.wall for hit in web.hits)  # the crawler's first request (robots.txt)
    js_urls = {site.url(n) for site in sites for n in site.js_pages()}
    # A JS page's render fetches its app.js (counted at the server, so a page rendered
    # twice counts twice); a plain page leaves no trace but its stored fetch_method.
    js_renders = sum(site.renders(site.path(n)) for site in sites for n in site.js_pages())
    plain_renders = sum(1 for d in docs if d["url"] not in js_urls
                        and d.get("fetch_method") == "browser")
    js_pages = len(js_urls)
    return {"wall": wall, "span": last - first, "peak": peak,
            "renders_per_js_page": js_renders / js_pages, "plain_renders": plain_renders,
            "pages": expected, "js_pages": js_pages}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one run of each, fewer pages")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--pages", type=int, default=40, help="pages per host")
    args = parser.parse_args()
    runs = 1 if args.quick else args.runs
    per_host = 20 if args.quick else args.pages
    data = Path(tempfile.mkdtemp(prefix="bench-render-"))
    valkey = servers.valkey(data / "valkey").start()
    mongo = servers.secantus(data / "mongo").start()
    results: dict[str, list[dict[str, float]]] = {"auto": [], "browser": []}
    try:
        with TestWeb(hosts=HOSTS) as web:
            sites = [JsSite(pages=per_host, is_js=lambda n: n % 5 == 2).install(web, h)
                     for h in web.base_urls]
            stores = {"REDIS_URL": valkey.url, "MONGO_URI": mongo.url,
                      "BLOB_STORE_URI": (data / "blobs").as_uri()}
            for i in range(runs):
                for mode in (("auto", "browser") if i % 2 == 0 else ("browser", "auto")):
                    result = crawl(mode, sites, web, stores, data)
                    results[mode].append(result)
                    print(f"run {i + 1} {mode:8s} wall {result['wall']:6.1f} s  crawl "
                          f"{result['span']:6.1f} s  peak {result['peak'] / 2**20:6.0f} MiB  "
                          f"renders/JS page {result['renders_per_js_page']:.2f}  "
                          f"plain pages rendered {result['plain_renders']:.0f}", flush=True)
    finally:
        mongo.stop()
        valkey.stop()
        servers.remove_tree(data)

    def med(mode: str, key: str) -> float:
        return statistics.median(r[key] for r in results[mode])

    first = results["auto"][0]
    print(f"\n{len(HOSTS)} hosts, {first['pages']:.0f} pages, {first['js_pages']:.0f} need "
          f"JavaScript (one in five); medians of {runs} run(s)")
    print(f"{'':32s}{'auto':>10s}{'browser':>10s}{'auto/browser':>14s}")
    for label, key, scale, unit in (("wall time of the crawl, s", "wall", 1, ""),
                                    ("first request to last page, s", "span", 1, ""),
                                    ("peak memory, MiB", "peak", 2**20, "")):
        a, b = med("auto", key) / scale, med("browser", key) / scale
        print(f"{label:32s}{a:10.1f}{b:10.1f}{a / b:14.2f}{unit}")
    print(f"{'browser renders / JS page':32s}{med('auto', 'renders_per_js_page'):10.2f}"
          f"{med('browser', 'renders_per_js_page'):10.2f}")
    print(f"{'plain pages rendered':32s}{med('auto', 'plain_renders'):10.0f}"
          f"{med('browser', 'plain_renders'):10.0f}")
    print("targets: renders per JS page <= 1.1, wall-time ratio auto/browser <= 0.3")


if __name__ == "__main__":
    main()
