"""Monitoring and alerts: shared per-host figures, Prometheus, Grafana, alert rules.

End-to-end tests run real ``scrapy crawl`` workers against the test web, with short
buckets and windows set through the environment/``-s``; alerts arrive at a real HTTP
webhook receiver on loopback.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from scrapy.settings import Settings

from tests import runner, servers
from tests.testweb import Response, TestWeb
from webfarm.frontier import Entry
from webfarm.monitor import table
from webfarm.monitor.alerts import Evaluator, Rules
from webfarm.monitor.metrics import MetricsStore, Recorder
from webfarm.monitor.notify import Notifier
from webfarm.queue import open_frontier
from webfarm.urls import host_of

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "monitoring" / "grafana-webfarm.json"
# Short buckets, windows and intervals so alerts fire within seconds.
FAST = {
    "WEBFARM_METRICS_BUCKET": "1",
    "WEBFARM_METRICS_FLUSH_INTERVAL": "0.2",
    "WEBFARM_MONITOR_INTERVAL": "0.5",
    "WEBFARM_ALERT_SUCCESS_WINDOW": "3",
    "WEBFARM_ALERT_MIN_REQUESTS": "8",
    "WEBFARM_ALERT_COOLDOWN": "600",
}


class Receiver:
    """A webhook receiver: records every JSON POST."""

    def __init__(self, host: str = "127.0.0.9") -> None:
        self.posts: list[dict] = []
        self.arrived: list[float] = []  # monotonic time of each post
        self.failing = False  # answer 503 and keep nothing, as a receiver that is down
        self.auth: list[str] = []  # the Authorization headers that came
        self.delay = 0.0  # seconds each POST takes to answer (a slow receiver)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                time.sleep(receiver.delay)
                if receiver.failing:
                    self.send_response(503)
                    self.end_headers()
                    return
                receiver.arrived.append(time.monotonic())
                receiver.posts.append(json.loads(body))
                if self.headers.get("Authorization"):
                    receiver.auth.append(self.headers["Authorization"])
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/hook/secret-token"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def find(self, alert_id: str, status: str) -> list[dict]:
        return [p for p in self.posts if p["id"] == alert_id and p["status"] == status]

    def when(self, alert_id: str, status: str) -> float:
        return next(t for t, p in zip(self.arrived, self.posts, strict=True)
                    if p["id"] == alert_id and p["status"] == status)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def shops() -> Iterator[TestWeb]:
    """A flaky endless site on the first host; three small catalogues on the others."""
    hosts = ("127.0.0.21", "127.0.0.22", "127.0.0.23", "127.0.0.24")
    with TestWeb(hosts=hosts, categories=1, products_per_category=3) as web:
        yield web


def settings_args(values: dict[str, str]) -> list[str]:
    return [arg for k, v in values.items() for arg in ("-s", f"{k}={v}")]


def frontier_of(redis_url: str, host_delay: float = 1.0):
    settings = Settings({"DUPEFILTER_CLASS": "webfarm.dupefilter.BloomDupeFilter",
                         "SCHEDULER_QUEUE_CLASS": "webfarm.frontier.Frontier",
                         "WEBFARM_HOST_DELAY": host_delay})
    return open_frontier(settings, "generic", redis.Redis.from_url(redis_url))


def stop(proc: subprocess.Popen, log: Path) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return log.read_text(errors="replace")


def endless(state: dict):
    """``/`` and ``/p/N`` link to ten new pages each; 403 for everything while broken."""

    def handler(info):
        if info.path == "/robots.txt":
            return None
        if state["broken"]:
            return Response.html("<html><body>blocked</body></html>", status=403)
        n = int(info.path.rsplit("/", 1)[-1]) if info.path.startswith("/p/") else 0
        links = "".join(f'<a href="/p/{n * 10 + i}">page {n * 10 + i}</a> '
                        for i in range(1, 11))
        return Response.html(f"<html><body><h1>page {n}</h1>{links}</body></html>")

    return handler


def scrape(port: int) -> list:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return list(text_string_to_metric_families(r.read().decode()))


def test_403_mid_crawl_alerts_and_recovers_prometheus_and_table(shops, stores, receiver,
                                                                 tmp_path):
    flaky, *others = shops.base_urls
    state = {"broken": False}
    shops.clear_routes()
    shops.route("/", endless(state), host=flaky)
    port = servers.free_port()
    env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0.05", WEBFARM_IDLE_TIMEOUT="0",
                         WEBFARM_RENDER="http", WEBFARM_ALERT_WEBHOOK=receiver.url)
    args = ["crawl", "generic", "-a", "start=" + ",".join(u + "/" for u in shops.base_urls),
            *settings_args({**FAST, "WEBFARM_PROMETHEUS_PORT": str(port),
                            "WEBFARM_PROMETHEUS_TOP_HOSTS": "2"})]
    log = tmp_path / "worker.log"
    worker = runner.popen(args, env, log)
    alert_id = f"success_rate:{host_of(flaky)}"
    try:
        servers.wait_for(lambda: all(shops.hits_for(host=u) for u in shops.base_urls)
                         and len(shops.hits_for(host=flaky)) >= 30, 60, "a healthy crawl")

        # Prometheus: scraped over HTTP, parsed; host labels bounded to top 2 + "other".
        families = scrape(port)
        hosts = {s.labels["host"] for f in families for s in f.samples if "host" in s.labels}
        assert len(hosts) <= 3 and "other" in hosts, hosts
        assert host_of(flaky) in hosts  # the busiest host keeps its own label
        ok = [s.value for f in families for s in f.samples
              if s.name == "webfarm_responses_total" and s.labels["host"] == host_of(flaky)
              and s.labels["status_class"] == "2xx"]
        assert ok and ok[0] >= 20, ok
        # Every family the exporter declares (a counter with no sample yet still is one).
        served = ({f.name for f in families} | {s.name for f in families for s in f.samples}
                  | {f.name + "_total" for f in families if f.type == "counter"})
        dashboard = json.loads(DASHBOARD.read_text())
        exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
        used = {m for e in exprs for m in re.findall(r"\bwebfarm_[a-z_]+", e)}
        assert used and used <= served, used - served
        assert not receiver.posts  # a healthy crawl raises nothing

        state["broken"] = True  # the host starts refusing us
        servers.wait_for(lambda: receiver.find(alert_id, "firing"), 40, "the success-rate alert")
        fired = receiver.find(alert_id, "firing")[0]
        assert fired["host"] == host_of(flaky) and fired["spider"] == "generic"
        assert fired["value"] < 0.5 and fired["details"]["status"].get("4xx", 0) >= 8

        # The per-host table puts the failing host first, with its 403s counted.
        store = MetricsStore(redis.Redis.from_url(stores["REDIS_URL"]), "generic",
                             bucket_seconds=1)
        data = table.report(store, frontier_of(stores["REDIS_URL"]), 3,
                            "webfarm:{generic}:alerts")
        worst = data["hosts"][0]
        assert worst["host"] == host_of(flaky) and worst["status"]["4xx"] > 0, worst
        assert [a["id"] for a in data["alerts"]] == [alert_id]
        lines = table.render(data).splitlines()
        header = next(i for i, line in enumerate(lines) if line.startswith("HOST"))
        assert lines[header + 1].startswith(host_of(flaky)), lines

        time.sleep(2)  # broken a little longer: the alert must hold, not flap
        assert not receiver.find(alert_id, "resolved")
        healed = time.monotonic()
        state["broken"] = False  # healed: pages (and links) again
        servers.wait_for(lambda: receiver.find(alert_id, "resolved"), 40, "the recovery")
        assert receiver.when(alert_id, "resolved") > healed
    finally:
        text = stop(worker, log)
    assert len(receiver.find(alert_id, "firing")) == 1  # not repeated within the cooldown
    assert len(receiver.find(alert_id, "resolved")) == 1
    assert "secret-token" not in text  # the webhook's token stays out of the log
    assert re.search(rf"ERROR: ALERT success_rate \[generic\]: {re.escape(host_of(flaky))}",
                     text), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    # Nothing counted is lost: the shared totals (last flush at close) match the worker's
    # own Scrapy stats.
    total = MetricsStore(redis.Redis.from_url(stores["REDIS_URL"]), "generic",
                         bucket_seconds=1).window(600).spider
    assert total.requests == stat(text, "downloader/request_count") > 0
    assert total.responses == stat(text, "downloader/response_count")
    assert total.items == stat(text, "item_scraped_count") + stat(
        text, "webfarm/pages/recorded") > 0  # the spider's items and its page records
    assert total.duplicates == stat(text, "webfarm/index/duplicates") > 0  # print pages
    assert total.status["4xx"] == stat(text, "downloader/response_status_count/403")


def stat(log_text: str, name: str) -> int:
    found = re.findall(rf"'{re.escape(name)}': (\d+)", log_text)
    return int(found[-1]) if found else 0


def test_a_crawl_shorter_than_the_monitor_interval_counts_its_dead_letters(shops, stores):
    """A probe: two crawls of about 10 s ending in dead letters left `scrapy frontier`
    saying "0 dead letters" for the window: the monitor's first pass came after
    WEBFARM_MONITOR_INTERVAL (15 s), and a first pass takes the queue as history."""
    base = shops.base_urls[1]
    shops.clear_routes()
    shops.route("/product/", Response(500, {"Content-Type": "text/plain"}, b"broken"),
                host=base)
    env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0", WEBFARM_IDLE_TIMEOUT="1",
                         WEBFARM_RETRY_TIMES="1")
    frontier = frontier_of(stores["REDIS_URL"])
    started = time.monotonic()
    done = runner.scrapy(["crawl", "generic", "-a", f"start={base}/"], env, timeout=60)
    assert done.returncode == 0 and time.monotonic() - started < 15, done.output[-2000:]
    assert frontier.counts()["dead"] == 3  # the shop's 3 products, once each
    shops.clear_routes()
    store = MetricsStore(redis.Redis.from_url(stores["REDIS_URL"]), "generic")
    data = table.report(store, frontier, 3600, "webfarm:{generic}:alerts")
    assert data["spider"]["dead"] == 3, data["spider"]
    assert "3 dead letters" in table.render(data)


def test_stalled_crawl_raises_no_progress_and_recovers(shops, stores, receiver, tmp_path):
    base = shops.base_urls[1]
    release = threading.Event()

    def hang(info):
        release.wait(60)  # the home page hangs until the test lets it go
        return None

    shops.clear_routes()
    shops.route("/", hang, host=base, prefix=False)
    env = runner.env_for(**stores, WEBFARM_IDLE_TIMEOUT="1", WEBFARM_RENDER="http",
                         WEBFARM_ALERT_WEBHOOK=receiver.url)
    args = ["crawl", "generic", "-a", f"start={base}/",
            *settings_args({**FAST, "WEBFARM_ALERT_STALL_SECONDS": "3",
                            "DOWNLOAD_TIMEOUT": "120",
                            # the hang must not slow the rest down (latency rule)
                            "WEBFARM_AUTOTHROTTLE": "False"})]
    log = tmp_path / "worker.log"
    worker = runner.popen(args, env, log)
    try:
        servers.wait_for(lambda: receiver.find("no_progress", "firing"), 60,
                         "the no-progress alert")
        fired = receiver.find("no_progress", "firing")[0]
        assert fired["details"]["leased"] == 1 and fired["value"] == 0, fired
        assert not [p for p in receiver.posts if p["alert"] != "no_progress"]
        released = time.monotonic()
        release.set()
        servers.wait_for(lambda: receiver.find("no_progress", "resolved"), 30, "the recovery")
        assert receiver.when("no_progress", "resolved") > released
        assert worker.wait(120) == 0  # the crawl then finishes by itself
    finally:
        release.set()
        text = stop(worker, log)
    assert "ERROR: ALERT no_progress [generic]: no fetch ended in the last 3s" in text
    assert "Traceback" not in text, text[-3000:]


# -- the rules against a real Valkey, with figures written as workers write them ---------------

def _store_and_frontier(redis_url: str) -> tuple[MetricsStore, object]:
    server = redis.Redis.from_url(redis_url)
    store = MetricsStore(server, "generic", bucket_seconds=60)
    # Stay clear of a minute boundary, so "this bucket" is the same for the whole test.
    while store.now() % 60 > 56:
        time.sleep(0.5)
    return store, frontier_of(redis_url, host_delay=0)


def _evaluator(store, frontier, worker: str, receiver: Receiver, **rules) -> Evaluator:
    return Evaluator(store, frontier, worker, Rules(**rules),
                     Notifier(receiver.url, "generic", worker, timeout=5), lock_seconds=30)


def _fired_while_the_receiver_is_down(redis_url: str, receiver: Receiver, host: str,
                                      failing_class: int, minutes_down: int = 0):
    """A host fetched fine two minutes ago and failing now (and, by ``minutes_down``,
    the minutes after), its success_rate alert fired while the receiver answered 503:
    the store, frontier, evaluator and alert id."""
    store, frontier = _store_and_frontier(redis_url)
    now = store.bucket_of(store.now())
    figures = {(now - 120, f"{host}|status:2xx"): 30}
    for minute in range(0, minutes_down * 60 + 1, 120):
        figures[(now + minute, f"{host}|status:{failing_class}xx")] = 20
    store.write(figures)
    evaluator = _evaluator(store, frontier, "w", receiver, success_window=120,
                           min_requests=10, cooldown=600)
    alert = f"success_rate:{host}"
    receiver.failing = True
    assert any(f.id == alert and f.firing for f in evaluator.tick())
    assert receiver.posts == []
    return store, frontier, evaluator, alert


def test_one_evaluator_at_a_time_cooldown_and_recovery_are_shared(redis_url, receiver):
    store, frontier = _store_and_frontier(redis_url)
    host, now = "shop.example", store.bucket_of(store.now())
    store.write({(now - 120, f"{host}|status:2xx"): 30, (now, f"{host}|status:4xx"): 20})
    rules = {"success_window": 120, "min_requests": 10, "cooldown": 600}
    a = _evaluator(store, frontier, "worker-a", receiver, **rules)
    b = _evaluator(store, frontier, "worker-b", receiver, **rules)
    alert = f"success_rate:{host}"

    assert [f.id for f in a.tick() if f.firing] == [alert]
    assert b.tick() == [] and not b.holds_lock()  # a holds the lock: b evaluates nothing
    a.tick()
    a.release()  # a stops; b takes over with the state a left in Redis
    assert any(f.id == alert and f.firing for f in b.tick())
    assert [p["status"] for p in receiver.posts] == ["firing"]  # once, not per worker/tick
    assert receiver.posts[0]["value"] == 0 and receiver.posts[0]["host"] == host

    store.write({(now, f"{host}|status:2xx"): 40})  # 67 %: better, not recovered
    b.tick()
    assert len(receiver.posts) == 1
    store.write({(now, f"{host}|status:2xx"): 100})  # 140 of 160: recovered
    b.tick()
    b.tick()
    assert [p["status"] for p in receiver.posts] == ["firing", "resolved"]

    store.write({(now, f"{host}|status:5xx"): 500})  # fires again within the cooldown:
    assert any(f.id == alert and f.firing for f in b.tick())
    store.write({(now, f"{host}|status:2xx"): 10_000})
    b.tick()
    assert [p["status"] for p in receiver.posts] == ["firing", "resolved"]  # neither repeated


def test_with_alerts_off_the_lock_holder_says_it_samples_only(redis_url, receiver, caplog):
    """With WEBFARM_ALERTS=False it said "this worker evaluates the alert rules"."""
    store, frontier = _store_and_frontier(redis_url)
    frontier.server.delete(frontier.key("monitor:lock"))
    off = _evaluator(store, frontier, "worker-off", receiver, enabled=False)
    with caplog.at_level("INFO", logger="webfarm.monitor.alerts"):
        assert off.tick() == []
    off.release()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Monitoring:")]
    assert said == ["Monitoring: this worker samples the frontier (WEBFARM_ALERTS is off: no "
                    "alert rules)"]


def test_an_alert_the_webhook_did_not_take_is_posted_again_and_a_reset_resolves_it(
        redis_url, receiver):
    """A failed POST was taken as sent: nothing again until the cooldown (30 min), and
    its "resolved" went to a receiver that never heard it fire. And `scrapy frontier
    --reset` deleted a firing alert's state without a word to the receiver."""
    store, frontier, evaluator, alert = _fired_while_the_receiver_is_down(
        redis_url, receiver, "down.example", 4)
    receiver.failing = False
    evaluator.tick()  # the next check posts it again
    assert [p["status"] for p in receiver.posts] == ["firing"]
    evaluator.tick()
    assert len(receiver.posts) == 1  # delivered: not again within the cooldown
    result = runner.scrapy(["frontier", "generic", "--reset", "--yes"],
                           runner.env_for(REDIS_URL=redis_url,
                                          WEBFARM_ALERT_WEBHOOK=receiver.url), 60)
    assert result.returncode == 0, result.output[-2000:]
    assert "1 firing alert(s) resolved" in result.output
    [resolved] = receiver.find(alert, "resolved")
    assert resolved["summary"].endswith("(the frontier was reset)")
    assert resolved["worker"] == "scrapy frontier --reset"


def test_a_host_that_stays_down_keeps_its_alert_firing_until_it_is_delivered(
        redis_url, receiver):
    """A probe: a success_rate alert fired while the receiver was down; with the host at
    0 % in both windows the rule saw no drop and said "unknown", so the alert was neither
    posted again nor said after the cooldown: the receiver heard only "resolved"."""
    store, _, evaluator, alert = _fired_while_the_receiver_is_down(
        redis_url, receiver, "dark.example", 5, minutes_down=2)
    store.clock_offset += 120  # two minutes on: 0 % now and 0 % the window before
    receiver.failing = False
    assert any(f.id == alert and f.firing for f in evaluator.tick())  # not "unknown"
    assert [p["status"] for p in receiver.posts] == ["firing"]
    evaluator.tick()
    assert len(receiver.posts) == 1  # delivered: the cooldown runs from now


def test_a_slow_webhook_does_not_let_the_lock_pass_mid_check(redis_url, receiver):
    """A probe: POSTs to a slow receiver outlasted the evaluator's lock; another worker took
    it and announced the same alerts, 14 s apart. The lock is renewed as the check goes."""
    store, frontier = _store_and_frontier(redis_url)
    now = store.bucket_of(store.now())
    hosts = [f"slow{n}.example" for n in range(4)]
    for host in hosts:
        store.write({(now - 120, f"{host}|status:2xx"): 30, (now, f"{host}|status:5xx"): 20})
    rules = {"success_window": 120, "min_requests": 10, "cooldown": 600}
    a = Evaluator(store, frontier, "worker-a", Rules(**rules),
                  Notifier(receiver.url, "generic", "worker-a", timeout=5), lock_seconds=3)
    b = Evaluator(store, frontier, "worker-b", Rules(**rules),
                  Notifier(receiver.url, "generic", "worker-b", timeout=5), lock_seconds=3)
    receiver.delay = 1.2  # four alerts: 4.8 s of POSTs under a 3 s lock
    a.tick()
    assert len(receiver.posts) == 4
    assert not b.holds_lock()  # still a's: b would have announced them all again


def test_a_webhook_url_with_credentials_sends_them_as_basic_auth(receiver):
    """A probe: ``http://user:pass@host/…`` failed every POST with a DNS error (urllib took
    "user:pass@host" for the host), and no alert reached the receiver."""
    from webfarm.monitor.notify import Notifier

    url = receiver.url.replace("http://", "http://hook%40user:s3cret@")
    notifier = Notifier(url, "generic", "w")
    assert notifier.where == "http://127.0.0.9" and "s3cret" not in notifier.url
    assert notifier.post({"id": "x", "status": "firing"})
    assert receiver.auth == ["Basic " + base64.b64encode(b"hook@user:s3cret").decode()]


def test_dead_letters_per_host_and_queue_growth(redis_url, receiver):
    store, frontier = _store_and_frontier(redis_url)
    ev = _evaluator(store, frontier, "worker-a", receiver, dead_window=120, dead_letters=3,
                    queue_window=600, queue_min=1000, queue_growth=0.2)
    ev.tick()  # the first scan only notes where the dead-letter queue ends
    frontier.push([Entry(h, 0, f"{h}{i}".encode(), f"payload {h} {i}")
                   for i, h in enumerate(["a.example"] * 3 + ["b.example"])])
    for _ in range(4):
        frontier.dead(frontier.pop("w").lease_id, "HTTP 404", status=404)
    now = store.bucket_of(store.now())
    store.write({(now - 540, "*|g:queued"): 100})  # the queue ten minutes ago
    frontier.push([Entry("c.example", 0, f"c{i}".encode(), f"p{i}") for i in range(1500)])

    found = {f.id: f for f in ev.tick()}
    window = store.window(120)
    assert {h: f.dead for h, f in window.hosts.items()} == {"a.example": 3, "b.example": 1}
    assert window.spider.dead == 4 and store.last_gauges()["dead"] == 4
    assert store.last_gauges()["queued"] == 1500
    assert found["dead_letters"].firing and found["dead_letters"].value == 4
    assert found["queue_growth"].firing and found["queue_growth"].value == 1400
    assert {p["alert"] for p in receiver.posts} == {"dead_letters", "queue_growth"}
    data = table.report(store, frontier, 600, ev.state_key)
    assert [a["id"] for a in data["alerts"]] == ["dead_letters", "queue_growth"]
    assert data["trend"]["queued"] == {"first": 100, "last": 1500, "change": 1400,
                                       "samples": 2}
    assert {r["host"]: r["queued"] for r in data["hosts"]}["c.example"] == 1500
    # Ten minutes on, the queue grows a little (10 entries): well under both thresholds,
    # resolved. It resolved only once the queue stopped growing altogether.
    store.clock_offset += 600
    store.write({(now + 60, "*|g:queued"): 1500})
    frontier.push([Entry("c.example", 0, f"d{i}".encode(), f"q{i}") for i in range(10)])
    found = {f.id: f for f in ev.tick()}
    assert found["queue_growth"].firing is False and found["queue_growth"].value == 10
    assert [p["status"] for p in receiver.posts if p["alert"] == "queue_growth"] == [
        "firing", "resolved"]


def test_prometheus_labels_and_worker_memory_stay_bounded_with_many_hosts(redis_url):
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from webfarm.monitor.metrics import Recorder
    from webfarm.monitor.prometheus import WorkerCollector

    store = MetricsStore(redis.Redis.from_url(redis_url), "generic", bucket_seconds=60)
    recorder = Recorder(store, totals_hosts=50)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(WorkerCollector("generic", recorder, store, 5, "webfarm:{generic}:alerts"))
    for i in range(2000):  # a broad crawl: 2,000 hosts, the first ten busier
        host = f"site{i}.example"
        for _ in range(10 if i < 10 else 1):
            recorder.request(host)
            recorder.response(host, 200, 0.01, 100)
    assert len(recorder.totals()) == 51  # 50 hosts one by one, the rest summed
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    requests = {s.labels["host"]: s.value for f in families for s in f.samples
                if s.name == "webfarm_requests_total"}
    assert set(requests) == {f"site{i}.example" for i in range(5)} | {"other"}
    assert sum(requests.values()) == 10 * 10 + 1990  # nothing lost in the aggregation
    recorder.request("site0.example")  # a labelled host keeps its label and its count
    after = {s.labels["host"]: s.value for f in registry.collect() for s in f.samples
             if s.name == "webfarm_requests_total"}
    assert after["site0.example"] == 11 and len(after) == 6


def test_scrapy_frontier_shows_figures_worst_first_json_and_watch(redis_url, receiver, tmp_path):
    store, frontier = _store_and_frontier(redis_url)
    now = store.bucket_of(store.now())
    store.write({(now, "good.example|requests"): 50, (now, "good.example|status:2xx"): 50,
                 (now, "bad.example|requests"): 40, (now, "bad.example|status:2xx"): 10,
                 (now, "bad.example|status:4xx"): 25, (now, "bad.example|error:TimeoutError"): 5,
                 (now, "*|requests"): 90, (now, "*|status:2xx"): 60, (now, "*|status:4xx"): 25,
                 (now, "*|error:TimeoutError"): 5})
    frontier.push([Entry("queued.example", 0, f"q{i}".encode(), f"p{i}") for i in range(7)])
    # bad.example: crawled, nothing queued now; its URLs and delay are the frontier's
    frontier.server.hset(frontier.key("urls"), "bad.example", 59)
    frontier.set_delay("bad.example", 0.5)
    env = runner.env_for(REDIS_URL=redis_url)

    doc = json.loads(runner.scrapy(["frontier", "generic", "--json"], env, 60).stdout)
    assert [h["host"] for h in doc["per_host"]] == ["bad.example", "good.example",
                                                    "queued.example"]
    bad = doc["per_host"][0]
    assert bad["success_rate"] == 0.25 and bad["status"]["4xx"] == 25
    assert bad["errors"] == {"TimeoutError": 5} and bad["queued"] == 0
    assert (bad["urls"], bad["delay"]) == (59, 0.5)  # were 0 and this command's default
    assert doc["per_host"][2]["queued"] == 7 and doc["per_host"][2]["success_rate"] is None
    assert doc["monitor"]["spider"]["error_count"] == 5 and doc["queued"] == 7

    log = tmp_path / "watch.log"
    watcher = runner.popen(["frontier", "generic", "--watch", "0.5"], env, log)
    servers.wait_for(lambda: log.read_text().count("REQ/MIN") >= 2, 60, "two refreshes")
    watcher.send_signal(signal.SIGINT)
    try:
        code = watcher.wait(30)
    except subprocess.TimeoutExpired:  # seen once in CI: keep what it printed
        watcher.kill()
        pytest.fail(f"Ctrl-C did not end the watch in 30 s; it printed:\n"
                    f"{log.read_text()[-3000:]}")
    assert code == 0  # Ctrl-C ends the watch cleanly
    text = log.read_text()
    assert "Traceback" not in text
    table_lines = text.splitlines()
    header = next(i for i, line in enumerate(table_lines) if line.startswith("HOST"))
    assert table_lines[header].split()[:6] == ["HOST", "QUEUED", "URLS", "DELAY", "NEXT",
                                               "ALLOWED"]
    assert "OK%" in table_lines[header] and "4XX" in table_lines[header]
    assert table_lines[header + 1].split()[0] == "bad.example"
    assert "25.0" in table_lines[header + 1].split()  # its success rate, in percent
    # each frame says when it was taken (frames piped to a file ran together)
    stamps = re.findall(r"^generic at (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) UTC$", text, re.M)
    assert len(stamps) >= 2 and stamps == sorted(stamps)
    frame = json.loads(runner.scrapy(["frontier", "generic", "--json", "--watch", "0.5",
                                      "--count", "1"], env, 60).stdout)
    assert abs(datetime.fromisoformat(frame["at"]).timestamp() - time.time()) < 60


def test_scrapy_frontier_reads_the_bucket_size_the_workers_wrote(redis_url):
    """Workers with WEBFARM_METRICS_BUCKET=10 and a `scrapy frontier` without it: the
    command read only the 60-aligned buckets and showed a fraction of the fetches, and
    no word of it."""
    store = MetricsStore(redis.Redis.from_url(redis_url), "generic", bucket_seconds=10)
    now = store.bucket_of(store.now())
    store.write({(now - 10 * i, name): 10 for i in range(6)
                 for name in ("*|requests", "*|status:2xx", "w.example|requests",
                              "w.example|status:2xx")})
    doc = json.loads(runner.scrapy(["frontier", "generic", "--json"],
                                   runner.env_for(REDIS_URL=redis_url), 60).stdout)
    assert doc["monitor"]["spider"]["requests"] == 60


def test_fetch_rates_count_the_time_the_crawl_ran_in_the_window(redis_url):
    """The scrapyd probe: 25 s into a crawl, `scrapy frontier` divided the fetches by its
    whole window (256 s) and showed 9.6 fetches/min where the crawl made 96."""
    server = redis.Redis.from_url(redis_url)
    server.delete(*server.keys("webfarm:{rates}:m:*") or ["none"])
    store = MetricsStore(server, "rates", bucket_seconds=60)
    start = store.bucket_of(store.now()) + 60 * 10  # a bucket of the future: none written
    recorder = Recorder(store)
    store.clock_offset += start + 35 - store.now()  # the crawl's first fetch, 35 s in
    for _ in range(40):
        recorder.response("r.example", 200, 0.1, 100)
    store.write(*recorder.drain())
    store.clock_offset += 25  # 25 s later
    window = store.window(240)
    assert 24 <= window.seconds <= 26
    assert 90 <= window.per_minute(window.spider.outcomes) <= 100  # 40 in 25 s: 96/min
    assert window.spider.requests == 0 and window.spider.outcomes == 40  # not a figure


def test_no_progress_counts_work_waiting_in_the_delayed_set(redis_url, receiver):
    """Every proxy retired (or every host down): the work waits in the delayed set, turn
    after turn, and no fetch ends. The rule counted queued and leased work only, so it
    said nothing while the crawl stood still."""
    store, frontier = _store_and_frontier(redis_url)
    frontier.push([Entry("a.example", 0, b"a1", "payload a 1")])
    popped = frontier.pop("w")
    assert frontier.retry(popped.lease_id, 0.5, "proxy: every proxy is retired", spend=False)
    counts = frontier.counts()
    assert (counts["queued"], counts["leased"], counts["delayed"]) == (0, 0, 1)
    ev = _evaluator(store, frontier, "w", receiver, stall_seconds=1)
    ev.tick()  # watching starts
    time.sleep(1.2)
    found = {f.id: f for f in ev.tick()}
    assert found["no_progress"].firing, found["no_progress"]
    assert "1 delayed" in found["no_progress"].summary
    # Not sent, so no attempt spent: it comes back as the first try it was.
    again = frontier.pop("w")
    assert again is not None and again.attempts == popped.attempts == 0


def test_a_robots_txt_the_site_does_not_have_is_not_a_failed_fetch(redis_url):
    """A 404 robots.txt means "no rules" (RFC 9309): it counted as a 4xx against the host,
    the one failure of a healthy site. A 503 one is the site failing, and still counts."""
    from scrapy import Request
    from scrapy.http import HtmlResponse
    from twisted.internet.error import ConnectionRefusedError as Refused

    from webfarm.monitor.extension import MonitorMiddleware
    from webfarm.robots import META

    server = redis.Redis.from_url(redis_url)
    server.delete(*server.keys("webfarm:{robots404}:m:*") or ["none"])
    store = MetricsStore(server, "robots404", bucket_seconds=60)
    mw = MonitorMiddleware(Recorder(store))

    def fetch(url: str, status: int, meta: dict | None = None) -> None:
        request = Request(url, meta=dict(meta or {}))
        mw.process_request(request)
        mw.process_response(request, HtmlResponse(url, status=status, body=b"x"))

    robots = {META: True}
    fetch("http://a.example/robots.txt", 404, robots)
    fetch("http://b.example/robots.txt", 503, robots)
    fetch("http://c.example/robots.txt", 200, robots)
    for host in ("a", "b", "c"):
        fetch(f"http://{host}.example/", 200)
    failed = Request("http://d.example/robots.txt", meta=robots)
    mw.process_request(failed)
    mw.process_exception(failed, Refused())
    store.write(*mw.recorder.drain())
    hosts = store.window(60).hosts
    assert hosts["a.example"].success_rate == 1.0 and hosts["a.example"].requests == 1
    assert hosts["b.example"].success_rate == 0.5 and hosts["b.example"].requests == 2
    assert hosts["c.example"].success_rate == 1.0 and hosts["c.example"].requests == 2
    assert hosts["d.example"].requests == 1 and hosts["d.example"].error_count == 1
