"""Serve the catalogue over real HTTP on several loopback addresses, one "host" each.

Stdlib only, so ``python -m tests.testweb`` runs anywhere. Later hostile behaviours (drips,
bombs, changing pages, hosts turning 403) plug in through :meth:`TestWeb.route`: a handler
may return a :class:`Response`, a writer that owns the socket, or ``None`` to fall through
to the catalogue (which it can also fetch and alter through ``RequestInfo.catalogue()``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple
from urllib.parse import parse_qs, urlsplit

from tests.testweb.site import HTML_TYPE, Shop

logger = logging.getLogger("tests.testweb")

# A fixed epoch for Last-Modified, so the same body always has the same date.
_EPOCH = 1704067200  # 2024-01-01T00:00:00Z


@dataclass
class Response:
    """A whole response; the server adds Content-Length and answers conditional requests."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | str = b""

    @classmethod
    def html(cls, body: bytes | str, status: int = 200, headers: Mapping[str, str] | None = None,
             validators: bool = False) -> Response:
        data = body.encode("utf-8") if isinstance(body, str) else body
        hdrs = {"Content-Type": HTML_TYPE, **(headers or {})}
        if validators:
            hdrs = {**validators_for(data), **hdrs}
        return cls(status, hdrs, data)

    @classmethod
    def text(cls, body: str, status: int = 200, content_type: str = "text/plain; charset=utf-8",
             headers: Mapping[str, str] | None = None) -> Response:
        return cls(status, {"Content-Type": content_type, **(headers or {})}, body.encode())

    def payload(self) -> bytes:
        return self.body.encode("utf-8") if isinstance(self.body, str) else self.body


def validators_for(body: bytes, last_modified: float | None = None) -> dict[str, str]:
    """A strong ETag and a Last-Modified that are stable for ``body``.

    The date is derived from the body hash, so it is not ordered in time: a handler whose
    page changes should pass its own ``last_modified`` (epoch seconds).
    """
    digest = hashlib.sha256(body).hexdigest()
    if last_modified is None:
        last_modified = _EPOCH + int(digest[:8], 16) % (365 * 86400)
    return {"ETag": f'"{digest[:20]}"', "Last-Modified": formatdate(last_modified, usegmt=True)}


class Hit(NamedTuple):
    """One served request, logged when it arrived (before any answer)."""

    netloc: str  # "127.0.0.2:PORT"
    method: str
    path: str  # path with query, as requested (fragments never reach a server)
    monotonic: float
    wall: float
    headers: dict[str, str]  # lower-case names


@dataclass(frozen=True)
class RequestInfo:
    """What a custom handler gets: the request, and the catalogue's own answer on demand."""

    method: str
    host: str  # the address this server listens on, e.g. "127.0.0.2"
    port: int
    path: str  # without query
    query: str
    headers: dict[str, str]  # lower-case names
    body: bytes
    shop: Shop
    web: TestWeb

    @property
    def netloc(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"http://{self.netloc}"

    @property
    def path_with_query(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path

    @property
    def params(self) -> dict[str, list[str]]:
        return parse_qs(self.query, keep_blank_values=True)

    def catalogue(self) -> Response:
        """The response the catalogue would give (handy for wrapping or altering it)."""
        return catalogue_response(self.shop, self.method, self.path, self.query)


Writer = Callable[[BaseHTTPRequestHandler], None]
"""Writes the raw response itself via ``handler.wfile``; the connection closes afterwards."""
Handler = Callable[[RequestInfo], "Response | Writer | None"]


def catalogue_response(shop: Shop, method: str, path: str, query: str) -> Response:
    if method not in ("GET", "HEAD"):
        return Response(405, {"Allow": "GET, HEAD", "Content-Type": "text/plain"}, b"GET only\n")
    page = shop.render(path, query)
    headers = {"Content-Type": page.content_type}
    if page.status == 200:
        headers.update(validators_for(page.body))
    return Response(page.status, headers, page.body)


@dataclass
class _Route:
    host: str | None
    path: str
    prefix: bool
    handler: Handler | Response
    seq: int

    def matches(self, host: str, path: str) -> bool:
        if self.host is not None and self.host != host:
            return False
        return path.startswith(self.path) if self.prefix else path == self.path


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_port = False  # never share a port with another process's test web
    request_queue_size = 256

    def __init__(self, addr: tuple[str, int], web: TestWeb) -> None:
        self.web = web
        self.shop: Shop | None = None
        super().__init__(addr, _RequestHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) that can stall offline.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request: object, client_address: object) -> None:
        logger.debug("connection from %s ended with an error", client_address, exc_info=True)


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "webfarm-testweb/1.0"
    sys_version = ""
    timeout = 30  # idle keep-alive connections must not pin a thread forever
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.web._track(self.connection, True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.web._track(self.connection, False)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        logger.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._serve()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_OPTIONS = do_GET

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        path, query = _split_target(self.path)
        host, port = self.server.server_address[:2]
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        web = self.server.web
        target = f"{path}?{query}" if query else path
        web._record(Hit(f"{host}:{port}", self.command, target, time.monotonic(), time.time(),
                        headers))
        assert self.server.shop is not None
        info = RequestInfo(self.command, host, port, path, query, headers, body,
                           self.server.shop, web)
        try:
            result = web._dispatch(info)
        except Exception:
            logger.exception("test web handler failed for %s", self.path)
            result = Response(500, {"Content-Type": "text/plain"}, b"handler error\n")
        if isinstance(result, Response):
            self._send(result, headers)
        else:
            self.close_connection = True
            result(self)

    def _send(self, resp: Response, req_headers: dict[str, str]) -> None:
        data = resp.payload()
        headers = dict(resp.headers)
        lower = {k.lower(): k for k in headers}
        status = resp.status
        if status == 200 and self.command in ("GET", "HEAD") and _not_modified(headers, lower,
                                                                              req_headers):
            status, data = 304, b""
            for name in ("content-type", "content-length"):
                headers.pop(lower.get(name, ""), None)
        elif "content-length" not in lower and status not in (204, 304):
            headers["Content-Length"] = str(len(data))
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD" and status not in (204, 304):
            self.wfile.write(data)


def _split_target(target: str) -> tuple[str, str]:
    """Path and query of a request target; absolute-form (from proxies) is accepted too."""
    if not target.startswith("/"):
        split = urlsplit(target)
        target = f"{split.path or '/'}?{split.query}" if split.query else split.path or "/"
    path, _, query = target.split("#", 1)[0].partition("?")
    return path, query


def _not_modified(headers: dict[str, str], lower: dict[str, str],
                  req: dict[str, str]) -> bool:
    """RFC 9110 13.1.2-3: If-None-Match wins over If-Modified-Since."""
    etag = headers.get(lower.get("etag", ""))
    if "if-none-match" in req:
        if etag is None:
            return False
        wanted = [t.strip().removeprefix("W/") for t in req["if-none-match"].split(",")]
        return "*" in wanted or etag.removeprefix("W/") in wanted
    modified = headers.get(lower.get("last-modified", ""))
    if "if-modified-since" in req and modified:
        try:
            return parsedate_to_datetime(modified) <= parsedate_to_datetime(
                req["if-modified-since"])
        except (TypeError, ValueError):
            return False
    return False


def _host_of(value: str) -> str:
    """"127.0.0.2", "127.0.0.2:8081" or "http://127.0.0.2:8081/" -> "127.0.0.2"."""
    if "//" in value:
        return urlsplit(value).hostname or value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class TestWeb:
    """Catalogue shops on several loopback hosts, one ThreadingHTTPServer (and thread) each."""

    __test__ = False  # not a pytest test class

    def __init__(self, hosts: Iterable[str] = ("127.0.0.2", "127.0.0.3"), port: int = 0,
                 categories: int = 3, products_per_category: int = 12, per_page: int = 5,
                 reviews_kb: int = 0) -> None:
        self.hosts = list(hosts)
        if not self.hosts:
            raise ValueError("TestWeb needs at least one host")
        self.port = port
        self.categories = categories
        self.products_per_category = products_per_category
        self.per_page = per_page
        self.reviews_kb = reviews_kb
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []
        self._shops: dict[str, Shop] = {}
        self._hits: list[Hit] = []
        self._routes: list[_Route] = []
        self._seq = 0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self.base_urls: list[str] = []

    # ---- lifecycle ------------------------------------------------------------------------

    def start(self) -> TestWeb:
        if self._servers:
            return self
        self._servers, self._threads, self._shops = self._bind(), [], {}
        self.base_urls = [f"http://{s.server_address[0]}:{s.server_address[1]}"
                          for s in self._servers]
        for i, (server, url) in enumerate(zip(self._servers, self.base_urls, strict=True)):
            peer = self.base_urls[1] if i == 0 and len(self.base_urls) > 1 else None
            server.shop = Shop(i, url, self.categories, self.products_per_category,
                               self.per_page, peer_url=peer, reviews_kb=self.reviews_kb)
            self._shops[url] = server.shop
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                                      name=f"testweb-{url}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _bind(self) -> list[_Server]:
        """Bind every host, on one shared port when ``port`` is 0 and one can be found."""
        def bind_all(port: int) -> list[_Server]:
            servers: list[_Server] = []
            try:
                for host in self.hosts:
                    servers.append(_Server((host, port), self))
                    port = port or servers[0].server_address[1]
            except OSError:
                for s in servers:
                    s.server_close()
                raise
            return servers

        if self.port:
            return bind_all(self.port)
        for _ in range(50):
            try:
                return bind_all(0)
            except OSError:
                continue
        return [_Server((host, 0), self) for host in self.hosts]  # distinct ports, still works

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving, cut open connections (drips included) and join threads, bounded."""
        for server in self._servers:
            server.shutdown()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):  # already closed by the client
                conn.shutdown(socket.SHUT_RDWR)
        for server in self._servers:
            server.server_close()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._servers, self._threads = [], []

    def __enter__(self) -> TestWeb:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- hits -----------------------------------------------------------------------------

    @property
    def hits(self) -> list[Hit]:
        """A snapshot of every request served so far, in arrival order."""
        with self._lock:
            return list(self._hits)

    def hits_for(self, host: str | None = None, path: str | None = None) -> list[Hit]:
        """Hits filtered by host (address, host:port or base URL) and path.

        A ``path`` with a ``?`` must equal the path with query; without one it matches the
        path part only, so ``/product/X`` also counts ``/product/X?utm_source=nav``.
        """
        hits = self.hits
        if host is not None:
            if "//" in host or ":" in host:
                netloc = urlsplit(host).netloc if "//" in host else host
                hits = [h for h in hits if h.netloc == netloc]
            else:
                hits = [h for h in hits if h.netloc.rsplit(":", 1)[0] == host]
        if path is not None:
            if "?" in path:
                hits = [h for h in hits if h.path == path]
            else:
                hits = [h for h in hits if h.path.split("?", 1)[0] == path]
        return hits

    def clear_hits(self) -> None:
        with self._lock:
            self._hits.clear()

    def _record(self, hit: Hit) -> None:
        with self._lock:
            self._hits.append(hit)

    def _track(self, conn: socket.socket, alive: bool) -> None:
        with self._lock:
            if alive:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    # ---- custom routes --------------------------------------------------------------------

    def route(self, path: str, handler: Handler | Response, host: str | None = None,
              prefix: bool | None = None) -> None:
        """Serve ``path`` with ``handler`` ahead of the catalogue.

        ``prefix`` defaults to ``path.endswith("/")``: ``route("/", h)`` takes over a whole
        host, ``route("/product/", h)`` every product. ``host`` (address, host:port or base
        URL) limits the route to one host. The most specific route wins: host-bound before
        global, longer path before shorter, newer before older. A handler may be a fixed
        Response; a callable returning None falls through to the next route or the catalogue.
        """
        with self._lock:
            self._seq += 1
            bound = _host_of(host) if host else None
            is_prefix = path.endswith("/") if prefix is None else prefix
            self._routes.append(_Route(bound, path, is_prefix, handler, self._seq))

    def unroute(self, path: str, host: str | None = None) -> None:
        """Remove the routes registered for ``path`` (and ``host``)."""
        bound = _host_of(host) if host else None
        with self._lock:
            self._routes = [r for r in self._routes if (r.path, r.host) != (path, bound)]

    def clear_routes(self) -> None:
        with self._lock:
            self._routes.clear()

    def _dispatch(self, info: RequestInfo) -> Response | Writer:
        with self._lock:
            routes = [r for r in self._routes if r.matches(info.host, info.path)]
        routes.sort(key=lambda r: (r.host is not None, len(r.path), r.seq), reverse=True)
        for r in routes:
            result = r.handler if isinstance(r.handler, Response) else r.handler(info)
            if result is not None:
                return result
        return info.catalogue()

    # ---- what a crawler should find -------------------------------------------------------

    def shop(self, base_url: str) -> Shop:
        """The catalogue served at ``base_url`` (after start())."""
        key = base_url.rstrip("/")
        if key not in self._shops:
            raise KeyError(f"{base_url!r} is not one of {self.base_urls if self._shops else []}")
        return self._shops[key]

    @property
    def shops(self) -> list[Shop]:
        return list(self._shops.values())

    def expected_pages(self, base_url: str) -> set[str]:
        """Canonical URLs a crawler following every in-host link from "/" must store."""
        return self.shop(base_url).expected_pages()

    def expected_contents(self, base_url: str) -> int:
        """How many distinct page bodies there are among :meth:`expected_pages`."""
        return self.shop(base_url).expected_contents()
