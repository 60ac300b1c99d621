"""A TCP relay that holds every reply for a while: a far-away Redis, on loopback.

Requests pass at once; each chunk the server sends back reaches the client
``delay`` seconds later, in order. Used to show that a crawl's reactor does not
wait for Redis.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Callable


class SlowRelay:
    def __init__(self, target: tuple[str, int], delay: float, host: str = "127.0.0.1") -> None:
        self.target = target
        self.delay = delay
        self._listener = socket.create_server((host, 0))
        self.host, self.port = self._listener.getsockname()[:2]
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}"

    def __enter__(self) -> SlowRelay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        for sock in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            ways_left = [2]
            lock = threading.Lock()

            def one_way_done(pair: tuple[socket.socket, ...] = (client, server),
                             ways_left: list[int] = ways_left, lock: threading.Lock = lock
                             ) -> None:
                """Both ways over: close the pair (a relay that outlives many clients,
                say one a request, would run out of file descriptors)."""
                with lock:
                    ways_left[0] -= 1
                    if ways_left[0]:
                        return
                for sock in pair:
                    with contextlib.suppress(OSError, ValueError):
                        sock.close()
                        self._sockets.remove(sock)

            threading.Thread(target=self._pipe, args=(client, server, 0.0, one_way_done),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, self.delay, one_way_done),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, delay: float,
              done: Callable[[], None]) -> None:
        held: deque[tuple[float, bytes]] = deque()
        lock = threading.Condition()

        def sender() -> None:
            while True:
                with lock:
                    while not held:
                        lock.wait()
                    due, data = held.popleft()
                if not data:
                    with contextlib.suppress(OSError):
                        dst.shutdown(socket.SHUT_WR)
                    done()
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                try:
                    dst.sendall(data)
                except OSError:
                    done()
                    return

        threading.Thread(target=sender, daemon=True).start()
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            with lock:
                held.append((time.monotonic() + delay, data))
                lock.notify()
            if not data:
                return
