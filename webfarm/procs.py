"""Processes the embedded services run as: who runs a pid, whether it lives, how to start
one that outlives its starter and stop it. Plain POSIX, no servers' knowledge here."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path


class ServiceError(Exception):
    """An embedded service cannot be used; the message says what to do."""


def cmdline(pid: int) -> list[str] | None:
    """The argv of a live process, or None (gone, zombie, or not ours to read)."""
    proc = Path(f"/proc/{pid}/cmdline")
    if Path("/proc/self").exists():
        try:
            raw = proc.read_bytes()
        except OSError:
            return None
        args = [a for a in raw.decode(errors="replace").split("\0") if a]
        return args or None
    try:  # no /proc (macOS): ask ps
        out = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.split() or None


def runs_program(pid: int, program: str) -> bool:
    """True if ``pid`` is alive and runs ``program`` (directly or as a script).

    Valkey rewrites its title to ``<path> 127.0.0.1:<port>``; a Python console script
    shows as ``python <script> ...``. So the program is looked for in the first two args.
    """
    if pid <= 0:
        return False
    args = cmdline(pid)
    if not args:
        return False
    return any(a == program or a.startswith(program + " ") for a in args[:2])


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        # Reap it if we are its parent (the same process ran up() and down()).
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError, IndexError):
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def spawn_detached(argv: list[str], cwd: Path, log_path: Path) -> int:
    """Start ``argv`` as a daemon and return its pid.

    ``sh`` forks the server into the background and exits at once, so the server is
    re-parented to init: it is nobody's zombie and outlives whoever started it. Its own
    session means a Ctrl-C or SIGHUP aimed at a ``scrapy crawl`` does not reach it.
    """
    script = 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'
    with open(log_path, "ab") as log:
        done = subprocess.run(
            ["/bin/sh", "-c", script, "sh", str(log_path), *argv], cwd=cwd,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
            start_new_session=True, timeout=30, check=False,
        )
    try:
        return int(done.stdout.strip())
    except ValueError:
        raise ServiceError(
            f"could not start {Path(argv[0]).name}: see {log_path}: {tail(log_path)}"
        ) from None


def terminate(pid: int, timeout: float) -> str:
    """SIGTERM, wait bounded, then SIGKILL; say which one it took."""
    steps = ((signal.SIGTERM, timeout, "stopped"), (signal.SIGKILL, 5.0, "killed"))
    for sig, wait, how in steps:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return how
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return how
            time.sleep(0.05)
    raise ServiceError(f"pid {pid} survived SIGKILL; stop it by hand")


def tail(path: Path, start: int = 0, lines: int = 8) -> str:
    """The last lines a server logged since ``start``, on one line."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    kept = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("--- ")]
    return " | ".join(kept[-lines:]) or "(empty log)"


def port_free(host: str, port: int) -> bool:
    """Can a server bind ``port`` (as servers do, with SO_REUSEADDR)?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
