"""Content hashing in helper processes, so that it never holds the crawler's GIL.

On a 100 KB page, normalising the text, masking volatile fragments and the
SimHash take about 50 ms of pure Python (:func:`webfarm.content.fingerprint`).
In a thread of the crawling process that time holds the GIL, and the reactor
waits for it. Here each of ``processes`` threads owns one helper,
``python -m webfarm.hashworker``, and hands it a page over a pipe: the thread
only waits on I/O.

The helpers are plain subprocesses rather than ``multiprocessing``: its ``spawn``
and ``forkserver`` start methods import the parent's ``__main__`` again in the
child, which would start a second crawl when a user's script calls
``CrawlerProcess`` without an ``if __name__ == "__main__"`` guard; ``fork`` is
unsafe in a process that runs threads. A helper that dies (killed, or a crash in
libxml2 on a hostile page) is replaced and the page sent once more; if that
fails too, :class:`HashWorkerDied` is raised. A helper whose parent dies sees
the end of its input and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

from webfarm.content import fingerprint

_LEN = struct.Struct("!I")


class HashWorkerDied(RuntimeError):
    """A helper process died twice in a row on one page."""


class HashError(ValueError):
    """:func:`~webfarm.content.fingerprint` raised in the helper (its type and message)."""


def _send(stream: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LEN.pack(len(data)) + data)
    stream.flush()


def _recv(stream: BinaryIO) -> Any:
    header = stream.read(_LEN.size)
    if len(header) < _LEN.size:
        raise EOFError("the other end closed the pipe")
    size = _LEN.unpack(header)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError("the other end closed the pipe mid-message")
    return pickle.loads(data)


class HashWorkers:
    """``processes`` helpers; :meth:`fingerprint` takes the same arguments as
    :func:`webfarm.content.fingerprint`."""

    def __init__(self, processes: int) -> None:
        self.processes = max(1, processes)
        self.executor = ThreadPoolExecutor(self.processes, thread_name_prefix="webfarm-hash")
        self.restarts = 0
        self._local = threading.local()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._closed = False

    async def fingerprint(self, *args: Any) -> tuple[str, int | None]:
        if self._closed:
            raise HashWorkerDied("the hash workers are closed (the crawl is ending)")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self._call, args)

    def _start(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        proc = subprocess.Popen([sys.executable, "-m", "webfarm.hashworker"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        with self._lock:
            if self._closed:
                proc.kill()
                raise HashWorkerDied("the hash workers are closed (the crawl is ending)")
            self._procs.add(proc)
        return proc

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._procs.discard(proc)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                # Closing flushes what a dead helper never read: a broken pipe, nothing lost.
                with contextlib.suppress(OSError):
                    stream.close()

    def _call(self, args: tuple[Any, ...]) -> tuple[str, int | None]:
        """In an executor thread: one page to this thread's helper and back."""
        for attempt in (1, 2):
            proc = getattr(self._local, "proc", None)
            if proc is None or proc.poll() is not None:
                proc = self._local.proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                _send(proc.stdin, args)
                ok, result = _recv(proc.stdout)
            except (OSError, EOFError, pickle.UnpicklingError) as exc:
                self._local.proc = None
                self._stop(proc)
                self.restarts += 1
                if attempt == 2:
                    raise HashWorkerDied(
                        f"the hashing helper died twice on one page ({exc}); the request "
                        "goes back to the frontier") from exc
                continue
            if not ok:
                raise HashError(result)
            return result
        raise AssertionError("unreachable")  # pragma: no cover

    def pids(self) -> list[int]:
        """Process ids of the running helpers."""
        with self._lock:
            return sorted(p.pid for p in self._procs if p.poll() is None)

    def close(self) -> None:
        """Stop every helper (a page being hashed fails with HashWorkerDied)."""
        with self._lock:
            self._closed = True
            procs = list(self._procs)
        for proc in procs:
            self._stop(proc)
        self.executor.shutdown(wait=False, cancel_futures=True)


def main() -> None:
    """The helper: pages in on stdin, ``(ok, result)`` out on stdout, until stdin ends."""
    # Ctrl-C reaches the whole process group: the crawler shuts down gracefully and still
    # needs this helper for that; it ends when its input does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the reply pipe
    while True:
        try:
            args = _recv(stdin)
        except EOFError:
            return
        try:
            reply: tuple[bool, Any] = (True, fingerprint(*args))
        except Exception as exc:  # the parent decides; this helper keeps serving
            reply = (False, f"{type(exc).__name__}: {exc}")
        _send(stdout, reply)


if __name__ == "__main__":
    main()
