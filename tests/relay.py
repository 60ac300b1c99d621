"""A TCP relay in front of a real server, to make it far away, or take it away and back.

* ``delay``: each chunk the server sends back reaches the client that many seconds
  later, in order (requests pass at once): a far-away Redis or S3 on loopback. It is
  read for every chunk, so raising it mid-run holds every reply from then on (an
  endpoint that stopped answering).
* ``cut()``: the server is down. Open connections are reset (boto3 and redis-py keep
  them alive between calls) and new ones are accepted and dropped at once, counted in
  ``dropped``. ``restore()`` brings it back.

Used as a context manager, or started at once and ended with ``close()``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Callable


class Relay:
    """A relay on ``host`` (a free port) to ``target`` (a port on 127.0.0.1, or host and
    port); see the module docstring for its switches."""

    def __init__(self, target: tuple[str, int] | int, delay: float = 0.0,
                 host: str = "127.0.0.1") -> None:
        self.target = ("127.0.0.1", target) if isinstance(target, int) else target
        self.delay = delay
        self.open = True
        self.dropped = 0
        self._listener = socket.create_server((host, 0))
        self.host, self.port = self._listener.getsockname()[:2]
        self._live: set[socket.socket] = set()  # both ends of every relayed connection
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        """The relay as a Redis URL."""
        return f"redis://{self.host}:{self.port}"

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def cut(self) -> None:
        """Down: open connections are reset and new ones dropped, until ``restore()``."""
        self.open = False
        self._end_all()

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread in accept()
        with contextlib.suppress(OSError):
            self._listener.close()
        self._end_all(close=True)

    def _end_all(self, close: bool = False) -> None:
        """Reset every relayed connection (a shutdown wakes a thread blocked in recv;
        a close alone would not)."""
        with self._lock:
            live = list(self._live)
        for sock in live:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            if close:
                sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if not self.open:
                self.dropped += 1
                # A reset, not a polite close: the endpoint is gone.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            pair = (client, server)
            with self._lock:
                self._live.update(pair)
            ways_left = [2]

            def one_way_done(pair: tuple[socket.socket, ...] = pair,
                             ways_left: list[int] = ways_left) -> None:
                """Both ways over: close the pair (a relay that outlives many clients,
                say one a request, would run out of file descriptors)."""
                with self._lock:
                    ways_left[0] -= 1
                    if ways_left[0]:
                        return
                    self._live.difference_update(pair)
                for sock in pair:
                    with contextlib.suppress(OSError):
                        sock.close()

            threading.Thread(target=self._pipe, args=(client, server, False, one_way_done),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True, one_way_done),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, delayed: bool,
              done: Callable[[], None]) -> None:
        """Copy ``src`` to ``dst`` until either ends; replies (``delayed``) go through a
        sender thread that holds each chunk ``self.delay`` seconds."""
        held: deque[tuple[float, bytes]] = deque()
        ready = threading.Condition()

        def send(data: bytes) -> bool:
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return False
            try:
                dst.sendall(data)
            except OSError:
                return False
            return True

        def sender() -> None:
            while True:
                with ready:
                    while not held:
                        ready.wait()
                    due, data = held.popleft()
                time.sleep(max(0.0, due - time.monotonic()))
                if not send(data):
                    done()
                    return

        if delayed:
            threading.Thread(target=sender, daemon=True).start()
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if delayed:
                with ready:
                    held.append((time.monotonic() + self.delay, data))
                    ready.notify()
                if not data:
                    return
            elif not send(data):
                done()
                return
