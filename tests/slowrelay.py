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
            threading.Thread(target=self._pipe, args=(client, server, 0.0), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, self.delay),
                             daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, delay: float) -> None:
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
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                try:
                    dst.sendall(data)
                except OSError:
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
