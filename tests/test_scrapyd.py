"""Two real scrapyd servers (two "machines") run one crawl against shared services.

Each server is a real ``scrapyd`` process in its own folder, on its own loopback address
and port, configured from ``deploy/scrapyd.conf`` (authentication on, bound to a chosen
address). The egg is built and uploaded with ``scrapyd-deploy`` using targets like the
ones in ``scrapy.cfg``; jobs are scheduled and cancelled through scrapyd's HTTP API.
The shared services (Valkey, SecantusDB, moto S3) reach the jobs through scrapyd's
environment; per-job values through ``-d setting=NAME=value``.
"""

from __future__ import annotations

import base64
import collections
import configparser
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import pymongo
import pytest
import redis

from tests import runner, servers
from tests.testweb import TestWeb
from webfarm.urls import canonical_url

BIN = Path(sys.executable).parent
USER = "webfarm"
PASSWORD = secrets.token_urlsafe(18)
USER_AGENT = "webfarm-scrapyd-test/1.0 (+https://example.invalid/bot)"
DELAY = 0.1  # WEBFARM_HOST_DELAY of the jobs: a crawl of the test web lasts ~9 s
SKIP = shutil.ignore_patterns(".venv", ".webfarm", ".git", "build", "*.egg-info", "__pycache__",
                              ".pytest_cache", ".ruff_cache", "tests")


class Scrapyd:
    """One scrapyd server we started (a stand-in for one machine)."""

    def __init__(self, name: str, folder: Path, address: str, env: dict[str, str]) -> None:
        self.name, self.folder, self.address, self.env = name, folder, address, env
        # Free on its own address, and not in use on 127.0.0.1 either (the session's other
        # servers listen there): the binding test below asserts that port is closed.
        self.port = next(port for port in (servers.free_port(address) for _ in range(50))
                         if not servers.port_open("127.0.0.1", port))
        self.url = f"http://{address}:{self.port}/"
        self.proc: subprocess.Popen | None = None

    def write_config(self) -> None:
        """deploy/scrapyd.conf, with this machine's address, port and secret."""
        config = configparser.ConfigParser()
        config.read(runner.ROOT / "deploy" / "scrapyd.conf")
        config["scrapyd"].update({"bind_address": self.address, "http_port": str(self.port),
                                  "username": USER, "password": PASSWORD,
                                  "poll_interval": "0.2", "max_proc": "2"})
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "scrapyd.conf", "w") as f:
            config.write(f)

    def start(self) -> Scrapyd:
        self.write_config()
        with open(self.folder / "scrapyd.out", "ab") as out:
            self.proc = subprocess.Popen([str(BIN / "scrapyd")], cwd=self.folder, env=self.env,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        return self

    def wait_up(self) -> None:
        assert self.proc is not None

        def up() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"scrapyd {self.name} exited: {self.output()[-2000:]}")
            return self.api("daemonstatus.json")["status"] == "ok"

        servers.wait_for(up, 30, f"scrapyd {self.name}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def output(self) -> str:
        return (self.folder / "scrapyd.out").read_text(errors="replace")

    def request(self, endpoint: str, data: dict | list | None = None,
                auth: tuple[str, str] | None = (USER, PASSWORD)) -> urllib.request.Request:
        body = urllib.parse.urlencode(data, doseq=True).encode() if data is not None else None
        req = urllib.request.Request(self.url + endpoint, data=body)
        if auth:
            token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        return req

    def api(self, endpoint: str, data: dict | list | None = None) -> dict:
        with urllib.request.urlopen(self.request(endpoint, data), timeout=30) as resp:
            answer = json.loads(resp.read())
        assert answer.get("status") == "ok", (endpoint, answer)
        return answer

    def schedule(self, spider: str, settings: dict[str, str], **args: str) -> str:
        data = [("project", "webfarm"), ("spider", spider), *args.items(),
                *(("setting", f"{k}={v}") for k, v in settings.items())]
        return self.api("schedule.json", data)["jobid"]

    def jobs(self) -> dict[str, dict]:
        """Job id -> job (with its ``state``: pending, running or finished)."""
        listed = self.api("listjobs.json?project=webfarm")
        return {job["id"]: {**job, "state": state}
                for state in ("pending", "running", "finished") for job in listed[state]}

    def wait_finished(self, job: str, timeout: float) -> dict:
        servers.wait_for(lambda: self.jobs()[job]["state"] == "finished", timeout,
                         f"job {job} on scrapyd {self.name}")
        return self.jobs()[job]

    def job_log(self, job: str) -> str:
        path = self.folder / "logs" / "webfarm" / "generic" / f"{job}.log"
        return path.read_text(errors="replace") if path.exists() else ""


def at_once(call, *iterables):
    """``call`` over ``zip(*iterables)`` in threads: each call can take seconds."""
    args = list(zip(*iterables, strict=True))
    with ThreadPoolExecutor(len(args)) as pool:
        return list(pool.map(lambda a: call(*a), args))


@pytest.fixture(scope="module")
def egg(tmp_path_factory) -> tuple[Path, Path]:
    """A copy of the project and the egg ``scrapyd-deploy --build-egg`` built from it."""
    folder = tmp_path_factory.mktemp("deploy")
    project = folder / "project"
    shutil.copytree(runner.ROOT, project, ignore=SKIP)
    path = folder / "webfarm.egg"
    proc = subprocess.run([str(BIN / "scrapyd-deploy"), "--build-egg", str(path)], cwd=project,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return project, path


@pytest.fixture(scope="module")
def machines(egg, valkey_server, mongo_server, s3_server, tmp_path_factory):
    """Two scrapyd servers on 127.0.0.11 and 127.0.0.12, the egg deployed to both."""
    project, egg_path = egg
    env = runner.env_for(REDIS_URL=valkey_server.url, MONGO_URI=mongo_server.url,
                         AWS_ENDPOINT_URL=s3_server.url, WEBFARM_IDLE_TIMEOUT="3",
                         WEBFARM_USER_AGENT=USER_AGENT)
    for name in ("SCRAPYD_USERNAME", "SCRAPYD_PASSWORD"):
        env.pop(name, None)
    folder = tmp_path_factory.mktemp("machines")
    farm = [Scrapyd(n, folder / n, addr, env) for n, addr in (("a", "127.0.0.11"),
                                                              ("b", "127.0.0.12"))]
    try:
        for machine in farm:
            machine.start()
        for machine in farm:
            machine.wait_up()
        # Deploy targets as in scrapy.cfg: credentials come from the environment.
        with open(project / "scrapy.cfg", "a") as cfg:
            for machine in farm:
                cfg.write(f"\n[deploy:machine_{machine.name}]\nurl = {machine.url}\n"
                          "project = webfarm\nusername = $SCRAPYD_USERNAME\n"
                          "password = $SCRAPYD_PASSWORD\n")
        deploy_env = {**os.environ, "SCRAPYD_USERNAME": USER, "SCRAPYD_PASSWORD": PASSWORD}

        def deploy(machine: Scrapyd) -> subprocess.CompletedProcess:
            # Machine a: build and upload in one go; machine b: upload the egg built before.
            egg_args = [] if machine.name == "a" else ["--egg", str(egg_path)]
            return subprocess.run(
                [str(BIN / "scrapyd-deploy"), f"machine_{machine.name}", *egg_args, "-v", "1"],
                cwd=project, env=deploy_env, capture_output=True, text=True, timeout=90)

        for proc in at_once(deploy, farm):
            assert proc.returncode == 0, proc.stdout + proc.stderr
            assert json.loads(proc.stdout)["spiders"] >= 1
        yield farm
    finally:
        for machine in farm:
            machine.stop()


@pytest.fixture()
def job_settings(redis_url, mongo_db_name, s3_bucket):
    """Per-job settings passed with ``-d setting=``; REDIS_URL is flushed per test.

    Plain HTTP only: the render ladder would fetch a short page again with the browser
    (by design, tested in its own suite); here every fetch must be a frontier hand-out.
    The latency rule is off so the slow pages of the cancel test do not stretch the
    host delay (it has its own tests too)."""
    return {"MONGO_DATABASE": mongo_db_name, "BLOB_STORE_URI": f"s3://{s3_bucket}/crawl",
            "WEBFARM_HOST_DELAY": str(DELAY), "WEBFARM_RENDER": "http",
            "WEBFARM_AUTOTHROTTLE": "False"}


def page_hits(web: TestWeb, base: str) -> list[str]:
    host = base.split("//")[1]
    return [canonical_url(f"http://{host}{h.path}") for h in web.hits_for(host=base)
            if h.path != "/robots.txt"]


def stored_urls(mongo_uri: str, database: str) -> list[str]:
    return [d["url"] for d in pymongo.MongoClient(mongo_uri)[database].pages.find()]


def stat(log: str, name: str) -> int:
    for line in log.splitlines():
        if f"'{name}':" in line:
            return int(line.split(":")[-1].strip().rstrip(",}"))
    return 0


def leases_of(redis_url: str, pid: int) -> int:
    """Leases the worker with this pid holds (lease records start 'host:pid:token ')."""
    records = redis.Redis.from_url(redis_url).hvals("webfarm:{generic}:lease")
    return sum(1 for r in records if r.split(b" ", 1)[0].split(b":")[1] == str(pid).encode())


def test_scrapyd_requires_authentication_and_binds_its_address(machines):
    machine = machines[0]
    for auth in (None, (USER, "wrong")):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(machine.request("daemonstatus.json", auth=auth), timeout=10)
        assert err.value.code == 401
    for machine in machines:
        assert "webfarm" in machine.api("listprojects.json")["projects"]
        spiders = machine.api("listspiders.json?project=webfarm")["spiders"]
        assert {"generic", "catalogue", "js_catalogue"} <= set(spiders)
        # Bound to its own address only (bind_address), not to every interface.
        assert servers.port_open(machine.address, machine.port)
        assert not servers.port_open("127.0.0.1", machine.port)


def test_two_machines_crawl_both_hosts_once(machines, web, job_settings, redis_url, mongo_uri,
                                            s3_server, s3_bucket):
    start = ",".join(f"{b}/" for b in web.base_urls)
    jobs = at_once(lambda m: m.schedule("generic", job_settings, start=start), machines)
    at_once(lambda m, j: m.wait_finished(j, 120), machines, jobs)
    logs = [m.job_log(j) for m, j in zip(machines, jobs, strict=True)]
    for log in logs:
        assert "'finish_reason': 'finished'" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        # settings/base.py was loaded (its frontier scheduler) and REDIS_URL came from
        # scrapyd's environment.
        assert f"Frontier webfarm:{{generic}}: on {redis_url}" in log
        assert stat(log, "webfarm/frontier/dequeued") > 0  # both machines took part
    urls = stored_urls(mongo_uri, job_settings["MONGO_DATABASE"])
    expected = set().union(*(web.expected_pages(b) for b in web.base_urls))
    assert len(urls) == len(set(urls)) and set(urls) == expected
    for base in web.base_urls:
        fetched = collections.Counter(page_hits(web, base))
        assert set(fetched) == web.expected_pages(base)
        assert max(fetched.values()) == 1, [u for u, n in fetched.items() if n > 1]
        # scrapyd's environment reached the jobs (WEBFARM_USER_AGENT, like REDIS_URL).
        assert {h.headers.get("user-agent") for h in web.hits_for(host=base)} == {USER_AGENT}
        # WEBFARM_HOST_DELAY came with -d setting= (scrapyd's environment says 0) and the
        # two machines kept it together: hand-outs per host are at least that far apart
        # (arrivals jitter by a few ms, so the whole span is measured).
        times = sorted(h.monotonic for h in web.hits_for(host=base) if h.path != "/robots.txt")
        assert times[-1] - times[0] >= (len(times) - 1) * DELAY * 0.9
    # Every page handed out once, but those given back unfetched (a host's first page
    # waits a delay after its robots.txt, which the other machine may be fetching).
    assert sum(stat(log, "webfarm/frontier/dequeued") - stat(log, "webfarm/frontier/given_back")
               for log in logs) == len(expected)
    listed = boto3.client("s3", endpoint_url=s3_server.url).list_objects_v2(
        Bucket=s3_bucket, Prefix="crawl/raw/")
    assert listed["KeyCount"] == sum(web.expected_contents(b) for b in web.base_urls)


def test_cancel_gives_leases_back_and_the_other_machine_finishes(
        machines, web, job_settings, redis_url, mongo_uri):
    def slow(info):
        time.sleep(0.4)  # a product page takes a while: a worker holds leases on it
        return None

    web.route("/product/", slow, prefix=True)
    start = ",".join(f"{b}/" for b in web.base_urls)
    settings = job_settings
    a, b = machines
    job_a = a.schedule("generic", settings, start=start)
    job_b = b.schedule("generic", settings, start=start)
    servers.wait_for(lambda: a.jobs()[job_a].get("pid"), 30, "job a running")
    pid = a.jobs()[job_a]["pid"]
    first = web.base_urls[0]
    servers.wait_for(lambda: leases_of(redis_url, pid) >= 1 and len(page_hits(web, first)) >= 10,
                     60, "job a mid-crawl, holding leases")
    a.api("cancel.json", {"project": "webfarm", "job": job_a, "signal": "TERM"})
    cancelled = time.monotonic()
    servers.wait_for(lambda: leases_of(redis_url, pid) == 0, 10, "job a's leases given back")
    given_back = time.monotonic() - cancelled
    print(f"job a gave its leases back {given_back:.2f}s after cancel.json")
    a.wait_finished(job_a, 30)
    b.wait_finished(job_b, 120)
    log_a, log_b = a.job_log(job_a), b.job_log(job_b)
    assert "'finish_reason': 'shutdown'" in log_a, log_a[-3000:]
    assert "'finish_reason': 'finished'" in log_b, log_b[-3000:]
    assert stat(log_b, "webfarm/frontier/dequeued") > 0
    # The lease time is 600 s: on SIGTERM the worker finished (acked) what it was fetching
    # and gave the rest back, at once.
    assert given_back < 10
    urls = stored_urls(mongo_uri, job_settings["MONGO_DATABASE"])
    expected = set().union(*(web.expected_pages(b) for b in web.base_urls))
    assert len(urls) == len(set(urls)) and set(urls) == expected
    # Only a request whose lease job a gave back may have been fetched a second time.
    released = stat(log_a, "webfarm/frontier/released")
    refetched = sum(n - 1 for base in web.base_urls
                    for n in collections.Counter(page_hits(web, base)).values())
    assert refetched <= released, (refetched, released)


def test_embedded_services_inside_scrapyd(machines, web, tmp_path):
    """With no service URLs, a scrapyd job starts the embedded services under
    WEBFARM_DATA_DIR; a bad URL ends the job with one line naming the variable."""
    a, b = machines
    data_dir = tmp_path / "data"
    settings = {"REDIS_URL": "", "MONGO_URI": "", "BLOB_STORE_URI": "",
                "WEBFARM_DATA_DIR": str(data_dir), "WEBFARM_IDLE_TIMEOUT": "1",
                "WEBFARM_RENDER": "http"}
    base = web.base_urls[1]
    env = runner.env_for(WEBFARM_DATA_DIR=str(data_dir))
    try:
        job = a.schedule("generic", settings, start=f"{base}/")
        bad = b.schedule("generic", {"REDIS_URL": "redis://127.0.0.1:1/0"}, start=f"{base}/")
        a.wait_finished(job, 120)
        log = a.job_log(job)
        assert "'finish_reason': 'finished'" in log, log[-3000:]
        status = json.loads(runner.scrapy(["services", "status", "--json"], env).stdout)
        mongo = pymongo.MongoClient(status["services"]["mongo"]["url"])
        assert {d["url"] for d in mongo.webfarm.pages.find()} == web.expected_pages(base)
        assert any((data_dir / "blobs").rglob("*"))
    finally:
        runner.scrapy(["services", "down"], env)
    b.wait_finished(bad, 60)
    # One line naming the variable, in the job's log (what scrapyd's web UI shows).
    lines = [x for x in b.job_log(bad).splitlines() if "webfarm: REDIS_URL" in x]
    assert len(lines) == 1 and "cannot reach redis://127.0.0.1:1/0" in lines[0], lines
    assert b.jobs()[bad]["state"] == "finished"
    # Still listed after a restart of scrapyd, beside its log (deploy/scrapyd.conf's
    # jobstorage; scrapyd's default forgot every finished job)
    b.stop()
    b.start()
    b.wait_up()
    assert b.jobs()[bad]["state"] == "finished"
