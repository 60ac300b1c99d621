"""A small real forward HTTP proxy for tests (stdlib: sockets and threads).

    with ProxyServer(mode="ok") as proxy:           # http://127.0.0.1:PORT
        ...
        proxy.relayed_count(), proxy.log            # what it relayed / answered

Modes (``proxy.mode = ...`` switches at run time):

* ``ok``: forwards absolute-URI requests (``GET http://host:port/path``) and
  opens ``CONNECT host:port`` tunnels.
* ``auth``: like ``ok`` but requires ``Proxy-Authorization: Basic user:pass``
  (``credentials=(user, password)``), answering 407 otherwise.
* ``ban``: answers every request with ``ban_status`` (403) and a page holding
  ``BAN_MARKER``, as a blocked exit IP would.
* ``reset``: accepts and resets the connection at once.
* ``refuse``: stops listening, so connecting is refused (the port stays ours
  as far as this process goes; switching back to another mode listens again).

Only loopback destinations are relayed (anything else gets 502): tests never
send traffic off the machine. Each request is one connection
(``Connection: close``), which keeps the relay simple and the log exact.
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from tests.servers import free_port

BAN_MARKER = "Access denied: your IP is banned (webfarm-test-ban)"
MODES = ("ok", "auth", "ban", "reset", "refuse")


@dataclass(frozen=True)
class Entry:
    """One request the proxy received and what it did with it."""

    method: str
    target: str  # absolute URI, or host:port for CONNECT
    status: int  # status it answered (relayed ones: the upstream's), 0 for reset/failed
    relayed: bool
    proxy_authorization: str | None  # the header as received (tests check credentials)
    at: float


class ProxyServer:
    """A forward proxy on ``host`` and a free port; see the module docstring."""

    def __init__(self, mode: str = "ok", host: str = "127.0.0.1", port: int = 0,
                 credentials: tuple[str, str] | None = None, ban_status: int = 403,
                 ban_body: str | None = None, timeout: float = 10.0) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        if mode == "auth" and credentials is None:
            raise ValueError("mode 'auth' needs credentials=(user, password)")
        self.host = host
        self.port = port or free_port(host)
        self.credentials = credentials
        self.ban_status = ban_status
        self.ban_body = ban_body if ban_body is not None else (
            f"<html><body><h1>Forbidden</h1><p>{BAN_MARKER}</p></body></html>")
        self.timeout = timeout
        self.log: list[Entry] = []
        self._mode = mode
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()

    # ---- lifecycle ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def url_with(self, user: str, password: str) -> str:
        return f"http://{user}:{password}@{self.host}:{self.port}"

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r} is not one of {MODES}")
        self._mode = mode
        if mode == "refuse":
            self._close_listener()
        elif self._listener is None and self._thread is not None:
            self._listen()

    def start(self) -> ProxyServer:
        self._stopping.clear()
        if self._mode != "refuse":
            self._listen()
        else:
            self._thread = threading.Thread(target=lambda: None)  # marks "started"
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._close_listener()

    def __enter__(self) -> ProxyServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        sock.settimeout(0.1)
        self._listener = sock
        self._thread = threading.Thread(target=self._accept_loop, args=(sock,),
                                        name=f"proxy-{self.port}", daemon=True)
        self._thread.start()

    def _close_listener(self) -> None:
        sock, self._listener = self._listener, None
        if sock is not None:
            sock.close()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and thread.ident:
            thread.join(2)

    def _accept_loop(self, sock: socket.socket) -> None:
        while self._listener is sock and not self._stopping.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    # ---- log ------------------------------------------------------------------------------

    def _record(self, entry: Entry) -> None:
        with self._lock:
            self.log.append(entry)

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self.log)

    def relayed_count(self) -> int:
        return sum(1 for e in self.entries() if e.relayed)

    def clear(self) -> None:
        with self._lock:
            self.log.clear()

    # ---- one connection -------------------------------------------------------------------

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(self.timeout)
        try:
            if self._mode == "reset":
                self._record(Entry("?", "?", 0, False, None, time.time()))
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            head, rest = _read_head(conn)
            if head is None:
                return
            request_line, headers = _parse_head(head)
            method, target, _version = (request_line.split(" ", 2) + ["", ""])[:3]
            auth = headers.get("proxy-authorization")
            if self._mode == "ban":
                self._answer(conn, self.ban_status, self.ban_body)
                self._record(Entry(method, target, self.ban_status, False, auth, time.time()))
                return
            if self._mode == "auth" and not self._authorized(auth):
                self._answer(conn, 407, "proxy authentication required\n",
                             {"Proxy-Authenticate": 'Basic realm="webfarm-test"'})
                self._record(Entry(method, target, 407, False, auth, time.time()))
                return
            if method == "CONNECT":
                self._tunnel(conn, target, auth, rest)
            else:
                self._forward(conn, method, target, headers, rest, auth)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    def _authorized(self, header: str | None) -> bool:
        if not header or self.credentials is None:
            return False
        scheme, _, value = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(value.strip()).decode("latin-1")
        except ValueError:
            return False
        return decoded == f"{self.credentials[0]}:{self.credentials[1]}"

    @staticmethod
    def _answer(conn: socket.socket, status: int, body: str,
                headers: dict[str, str] | None = None) -> None:
        data = body.encode()
        lines = [f"HTTP/1.1 {status} {'Proxy Says' if status != 200 else 'OK'}",
                 "Content-Type: text/html; charset=utf-8", f"Content-Length: {len(data)}",
                 "Connection: close", *(f"{k}: {v}" for k, v in (headers or {}).items())]
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)

    def _forward(self, conn: socket.socket, method: str, target: str,
                 headers: dict[str, str], rest: bytes, auth: str | None) -> None:
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            self._answer(conn, 400, "absolute http URI expected\n")
            self._record(Entry(method, target, 400, False, auth, time.time()))
            return
        if not _loopback(parts.hostname):
            self._answer(conn, 502, "test proxy relays loopback only\n")
            self._record(Entry(method, target, 502, False, auth, time.time()))
            return
        length = int(headers.get("content-length") or 0)
        body = rest
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        drop = {"proxy-authorization", "proxy-connection", "connection", "keep-alive"}
        out = [f"{method} {path} HTTP/1.1"]
        out += [f"{k}: {v}" for k, v in headers.items() if k not in drop]
        out.append("Connection: close")
        try:
            upstream = socket.create_connection((parts.hostname, parts.port or 80), self.timeout)
        except OSError:
            self._answer(conn, 502, "upstream unreachable\n")
            self._record(Entry(method, target, 502, False, auth, time.time()))
            return
        with upstream:
            upstream.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + body[:length])
            status = 0
            first = True
            while True:
                chunk = upstream.recv(65536)
                if not chunk:
                    break
                if first:
                    first = False
                    with contextlib.suppress(ValueError, IndexError):
                        status = int(chunk.split(b" ", 2)[1])
                conn.sendall(chunk)
        self._record(Entry(method, target, status, True, auth, time.time()))

    def _tunnel(self, conn: socket.socket, target: str, auth: str | None, rest: bytes) -> None:
        host, _, port = target.rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not _loopback(host):
            self._answer(conn, 502, "test proxy tunnels to loopback only\n")
            self._record(Entry("CONNECT", target, 502, False, auth, time.time()))
            return
        try:
            upstream = socket.create_connection((host, int(port)), self.timeout)
        except OSError:
            self._answer(conn, 502, "upstream unreachable\n")
            self._record(Entry("CONNECT", target, 502, False, auth, time.time()))
            return
        conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self._record(Entry("CONNECT", target, 200, True, auth, time.time()))
        with upstream:
            if rest:
                upstream.sendall(rest)
            _pipe(conn, upstream, self.timeout)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read_head(conn: socket.socket, limit: int = 65536) -> tuple[bytes | None, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return None, b""
        data += chunk
        if len(data) > limit:
            return None, b""
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    return lines[0], headers


def _pipe(a: socket.socket, b: socket.socket, timeout: float) -> None:
    """Copy bytes both ways until either side closes or nothing moves for ``timeout``."""
    socks = [a, b]
    while True:
        readable, _, _ = select.select(socks, [], [], timeout)
        if not readable:
            return
        for sock in readable:
            data = sock.recv(65536)
            if not data:
                return
            (b if sock is a else a).sendall(data)
