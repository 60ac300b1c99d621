"""A TCP gate in front of a real server, to take it away and bring it back mid-run."""

from __future__ import annotations

import contextlib
import socket
import threading


class Gate:
    """A TCP forwarder in front of a real server. Closed, it accepts and drops every
    connection at once (an endpoint that is down), and counts them."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.open = True
        self.dropped = 0
        self._live: set[socket.socket] = set()  # both ends of every relayed connection
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            if not self.open:
                self.dropped += 1
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            self._live |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Down: new connections are dropped, and open ones (boto3 keeps them alive
        between calls) are reset, as when the endpoint itself goes away."""
        self.open = False
        for s in list(self._live):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self._live.clear()

    def close(self) -> None:
        self.sock.close()
