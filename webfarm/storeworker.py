"""Storage calls in a helper process, so that pymongo and boto3 never hold the crawler's GIL.

Storage threads in the crawling process spent 1.2-1.8 ms of Python per page on
the test web in pymongo's and boto3's client code (commands, BSON, HTTP). That
time holds the GIL, and every time such a thread wakes from a socket read it
takes the GIL back from the reactor. Here the calls run in a helper process,
``python -m webfarm.storeworker THREADS ROLE``, with its own GIL and ``THREADS``
threads; the crawler talks to it over pipes from the reactor's event loop,
without a thread of its own. The hashing helpers (``WEBFARM_HASH_PROCESSES``)
are helpers of this kind too, with one thread and the role ``hashing``.

:meth:`StorageProcess.run` takes the same arguments as
:meth:`webfarm.threads.StorageThreads.run`: a bound method of a store and its
arguments. The store travels once, pickled (each store pickles as the recipe
that opens it again: URI, database, options), and the helper keeps its copy.
Results and exceptions come back pickled; an exception that cannot be pickled
comes back as :class:`RemoteStoreError`, or as :class:`StorageProcessDied` (an
``OSError``, so retried) when it was a transient store error.

If the helper dies, every call in flight fails with :class:`StorageProcessDied`;
the pipelines retry those with backoff (:func:`webfarm.batching.retrying`), the
next call starts a new helper, and the leases stay unacknowledged until then.
Every store write is idempotent, so a write the dead helper did finish is
harmless to repeat (an item written twice is counted as unchanged the second
time). A helper whose parent dies sees the end of its input, finishes the calls
it holds and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import pickle
import signal
import struct
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

try:
    import fcntl
except ImportError:  # Windows has none: the pipe keeps its size
    fcntl = None  # type: ignore[assignment]

from webfarm.batching import TRANSIENT
from webfarm.config import ConfigError

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings

logger = logging.getLogger(__name__)
T = TypeVar("T")
_LEN = struct.Struct("!I")
_HELLO = b"webfarm-storeworker\n"
START_TIMEOUT = 60.0
EXIT_GRACE = 5.0  # seconds for a helper whose output ended to be reaped before a kill
BATCH_FLAG = "--sched-batch"
PIPE_SIZE = 1 << 20


class StorageProcessDied(OSError):
    """The helper died (or is closed) with the call in flight; the call is worth retrying."""


class RemoteStoreError(RuntimeError):
    """An exception from the helper that could not be sent back as itself (type: message)."""


def _write_out(stdin: asyncio.StreamWriter, out: list[bytes]) -> None:
    data = b"".join(out)
    out.clear()
    stdin.write(data)


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _LEN.pack(len(data)) + data


def sched_batch_setting(settings: BaseSettings) -> bool:
    """``WEBFARM_HELPER_SCHED_BATCH``, read alike for the storage and the hashing helpers."""
    return settings.getbool("WEBFARM_HELPER_SCHED_BATCH", True)


class StorageProcess:
    """One helper process that runs blocking store calls for one crawler."""

    def __init__(self, threads: int = 16, fallback: str = "set WEBFARM_STORAGE_PROCESS=False "
                 "to run storage calls in threads", role: str = "storage",
                 sched_batch: bool = False) -> None:
        self.threads = max(1, threads)
        self.role = role  # on the helper's command line, for ps and top
        self.sched_batch = sched_batch  # WEBFARM_HELPER_SCHED_BATCH: see _batch_scheduling
        self.fallback = fallback  # what the user can do instead, for the error messages
        self.restarts = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._starting: asyncio.Lock | None = None
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count()
        self._stores: dict[int, Any] = {}  # kept alive so that their ids stay theirs
        self._sent: set[int] = set()  # stores this helper holds already
        self._closed = False
        self._out: list[bytes] = []  # frames for the running helper, written at the turn's end

    @property
    def in_flight(self) -> int:
        """Calls sent and not answered yet."""
        return len(self._pending)

    @property
    def pid(self) -> int | None:
        """The running helper's process id."""
        proc = self._proc
        return proc.pid if proc is not None and proc.returncode is None else None

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in the helper; ``fn`` is a store's bound method or a
        module-level function."""
        store = getattr(fn, "__self__", None)
        if store is not None and not isinstance(store, type) and hasattr(fn, "__func__"):
            key: int | None = id(store)
            target: Any = fn.__name__
        else:
            key, target = None, fn
        proc = await self._ensure()
        pending = self._pending  # this helper's calls (a dying one fails only its own)
        call_id = next(self._ids)
        ship = key is not None and key not in self._sent
        try:
            payload = pickle.dumps((store if ship else None, target, args, kwargs),
                                   protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"{getattr(fn, '__qualname__', fn)!s} or its arguments cannot go to the "
                f"storage process ({exc}); make them picklable (a store pickles as what opens "
                f"it again) or {self.fallback}") from exc
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        pending[call_id] = future
        assert proc.stdin is not None
        # In order (a store's first call carries it ahead of the rest), and the calls of one
        # turn of the event loop in one write: one wake-up of the helper for all of them.
        out = self._out
        out.append(_frame((call_id, key, payload)))
        if len(out) == 1:
            asyncio.get_running_loop().call_soon(_write_out, proc.stdin, out)
        if ship:
            assert key is not None
            self._stores[key] = store
            self._sent.add(key)
        try:
            await proc.stdin.drain()
        except (ConnectionError, OSError) as exc:
            pending.pop(call_id, None)
            raise StorageProcessDied(f"the {self.role} process died ({exc})") from exc
        return await future

    async def _ensure(self) -> asyncio.subprocess.Process:
        if self._closed:
            raise StorageProcessDied(f"the {self.role} process is closed (the crawl is ending)")
        if self._proc is not None and self._proc.returncode is None and not self._reader_done():
            return self._proc
        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self._proc is None or self._proc.returncode is not None or self._reader_done():
                if self._proc is not None:
                    self.restarts += 1
                    logger.warning("The %s process (pid %d) died; starting a new one", self.role,
                                   self._proc.pid)
                await self._start()
            assert self._proc is not None
            return self._proc

    def _reader_done(self) -> bool:
        return self._reader is not None and self._reader.done()

    async def _start(self) -> None:
        """Start a helper and wait for its hello; one that cannot start is a ConfigError."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        command = (sys.executable, "-m", "webfarm.storeworker", str(self.threads), self.role,
                   *((BATCH_FLAG,) if self.sched_batch else ()))
        what = f"the {self.role} process ({' '.join(command[:3])})"
        try:
            proc = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                env=env)
        except OSError as exc:
            raise ConfigError(f"{what} does not start ({exc}); fix that Python, or "
                              f"{self.fallback}") from exc
        assert proc.stdout is not None
        try:
            hello = await asyncio.wait_for(proc.stdout.readexactly(len(_HELLO)), START_TIMEOUT)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
            await self._end(proc)
            raise ConfigError(
                f"{what} does not start ({type(exc).__name__}: {exc}); its error is above. "
                f"Fix that Python, or {self.fallback}") from exc
        if hello != _HELLO:
            await self._end(proc)
            raise ConfigError(f"{what} answered {hello!r}, not its hello; something in it "
                              "writes to stdout")
        _widen(proc.stdin)
        self._proc = proc
        self._out = []
        self._sent = set()
        self._pending = {}
        self._reader = asyncio.ensure_future(self._read(proc, self._pending))

    async def _read(self, proc: asyncio.subprocess.Process,
                    pending: dict[int, asyncio.Future[Any]]) -> None:
        """Replies to their callers; when the helper ends, every call in flight fails."""
        assert proc.stdout is not None
        reason = "its output ended"
        try:
            while True:
                size = _LEN.unpack(await proc.stdout.readexactly(_LEN.size))[0]
                call_id, ok, data = pickle.loads(await proc.stdout.readexactly(size))
                future = pending.pop(call_id, None)
                if future is None or future.done():
                    continue
                try:
                    result = pickle.loads(data)
                except Exception as exc:  # e.g. a class this process cannot import
                    future.set_exception(RemoteStoreError(
                        f"the {self.role} process's reply could not be read: {exc}"))
                    continue
                if ok:
                    future.set_result(result)
                else:
                    future.set_exception(result)
        except asyncio.IncompleteReadError:
            pass  # the helper exited (or was killed): its output ended
        except (ConnectionError, OSError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        except (pickle.UnpicklingError, EOFError, ValueError) as exc:
            reason = f"a reply could not be read ({exc})"
        finally:
            await self._end(proc)
            for future in pending.values():
                if not future.done():
                    future.set_exception(StorageProcessDied(
                        f"the {self.role} process died with the call in flight ({reason}); "
                        "it is retried in a new one"))
            pending.clear()

    @staticmethod
    async def _end(proc: asyncio.subprocess.Process) -> None:
        """Kill a helper that is not wanted any more, and let go of its pipes.

        A helper whose output ended is exiting, or gone: it gets ``EXIT_GRACE`` to be
        reaped before it is killed. ``Process.kill()`` polls first, and that poll reaps an
        exited helper before asyncio's child watcher does, which then logs "Unknown child
        process pid ..., will report returncode 255" (it did so at 19 of 20 closes)."""
        if proc.stdin is not None:
            proc.stdin.close()
        if proc.returncode is None and proc.stdout is not None and proc.stdout.at_eof():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), EXIT_GRACE)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), 10)

    async def close(self, timeout: float = 30.0) -> None:
        """Let the helper finish what it holds and exit (killed after ``timeout``)."""
        self._closed = True
        proc, reader = self._proc, self._reader
        if proc is None:
            return
        if proc.stdin is not None:
            if self._out:  # calls made in this turn of the loop go before the end of input
                _write_out(proc.stdin, self._out)
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        if reader is not None:
            await asyncio.wait([reader], timeout=5)
        self._stores.clear()


def _widen(stream: asyncio.StreamWriter | None) -> None:
    """Give the pipe to a helper room for several pages. Linux's default 64 KiB held less
    than one 100 KB page: the event loop kept a backlog of frames and re-copied it on
    every partial write (100 -> 118 pages/s at 100 KB with 1 MiB)."""
    if stream is None or fcntl is None or not hasattr(fcntl, "F_SETPIPE_SZ"):
        return
    pipe = stream.transport.get_extra_info("pipe")
    try:
        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except PermissionError:  # above pipe-max-size (not root): take the most allowed
        with contextlib.suppress(OSError, ValueError):
            most = int(Path("/proc/sys/fs/pipe-max-size").read_text())
            fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, min(PIPE_SIZE, most))
    except (OSError, ValueError, AttributeError):
        pass  # not a pipe after all, or no such fcntl: the default size still works


# -- the helper ---------------------------------------------------------------------------


def _portable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a stand-in of the same kind."""
    with contextlib.suppress(Exception):
        pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))
        return exc
    text = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    if isinstance(exc, TRANSIENT):
        return StorageProcessDied(f"transient store error in the storage process: {text}")
    return RemoteStoreError(text)


def _read_frame(stream: BinaryIO) -> Any:
    header = stream.read(_LEN.size)
    if len(header) < _LEN.size:
        raise EOFError
    size = _LEN.unpack(header)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def _batch_scheduling() -> None:
    """Put this process under Linux's ``SCHED_BATCH`` policy, before its threads start
    (they inherit it).

    A helper wakes each time the crawler writes to its pipe. Under the normal policy the
    kernel often lets the woken helper preempt the crawler on the crawler's own CPU, so
    the crawler's write returned only after the helper's turn: on the 2-core bench py-spy
    found a storage-only crawler inside those writes in 6% of its samples, and one webfarm
    process was preempted 1,000-2,700 times a crawl against bare Scrapy's 100. A batch
    task does not preempt on wakeup; it runs on a free CPU, or when the tick ends the
    crawler's slice. Its share of the CPU stays that of nice 0 (``nice 19`` starved the
    helpers of two crawlers on 2 cores), and a few ms more per call do not matter to
    batched writes. Elsewhere than Linux, or where it is refused, nothing changes.
    """
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None:
        return
    try:
        setter(0, os.SCHED_BATCH, os.sched_param(0))
    except OSError as exc:
        print(f"webfarm.storeworker: SCHED_BATCH refused ({exc}); this helper keeps the "
              "normal policy. Set WEBFARM_HELPER_SCHED_BATCH=False to stop asking",
              file=sys.stderr)


def main() -> None:
    """The helper (``THREADS [ROLE] [--sched-batch]``, the role only for ps): calls in on
    stdin, ``(call_id, ok, result)`` out on stdout."""
    # Ctrl-C reaches the whole process group, and so does a TERM to it (systemd's stop of
    # scrapyd, KillMode=control-group): the crawler shuts down gracefully and still needs
    # this helper for that, which it took for dead and started again. It ends when its
    # input does (or is killed by the crawler).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if BATCH_FLAG in sys.argv[3:]:
        _batch_scheduling()
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing else may write into the reply pipe
    lock = threading.Lock()
    stores: dict[int, Any] = {}
    pool = ThreadPoolExecutor(threads, thread_name_prefix="webfarm-store")

    def reply(call_id: int, ok: bool, result: Any) -> None:
        try:
            data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # an unpicklable result is the caller's error, not ours
            ok, data = False, pickle.dumps(RemoteStoreError(
                f"the result could not be sent back: {type(exc).__name__}: {exc}"))
        frame = _frame((call_id, ok, data))
        with lock, contextlib.suppress(OSError):  # the parent is gone: nothing to tell
            stdout.write(frame)
            stdout.flush()

    def serve(call_id: int, fn: Callable[..., Any], args: Any, kwargs: Any) -> None:
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:  # the parent decides; this helper keeps serving
            reply(call_id, False, _portable(exc))
        else:
            reply(call_id, True, result)

    stdout.write(_HELLO)
    stdout.flush()
    while True:
        try:
            call_id, key, payload = _read_frame(stdin)
        except EOFError:
            break
        try:
            store, target, args, kwargs = pickle.loads(payload)
            if key is not None:
                if store is not None:
                    stores[key] = store
                fn = getattr(stores[key], target)
            else:
                fn = target
        except Exception as exc:
            reply(call_id, False, _portable(exc))
            continue
        pool.submit(serve, call_id, fn, args, kwargs)
    pool.shutdown(wait=True)
    for store in stores.values():
        close = getattr(store, "close", None)
        if callable(close):
            with contextlib.suppress(Exception):
                close()
    # Every reply is written and every store closed: nothing is left to do, and the
    # interpreter's own exit joins pymongo's monitor threads, which wake only every 0.5 s
    # (measured: 0.57 s of every crawl's close, which waits for this helper).
    logging.shutdown()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    # From the module by its name, so that the errors it sends back are
    # ``webfarm.storeworker`` classes, not ``__main__`` ones the crawler cannot load.
    from webfarm.storeworker import main as helper_main

    helper_main()
