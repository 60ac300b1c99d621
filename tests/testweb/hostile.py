"""Hostile and broken servers for the test web: plug in with ``web.route(path, handler)``.

Each function returns a handler (or a fixed :class:`Response`). Writers own the socket,
stop quietly when the crawler hangs up, and never run longer than ``max_seconds``.
"""

from __future__ import annotations

import functools
import gzip
import io
import time
import zlib
from http.server import BaseHTTPRequestHandler

from tests.testweb.server import Handler, RequestInfo, Response

HTML = "text/html"
_HANGUP = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


def _head(h: BaseHTTPRequestHandler, status: int, headers: dict[str, str]) -> None:
    h.send_response(status)
    for name, value in {"Connection": "close", **headers}.items():
        h.send_header(name, value)
    h.end_headers()


def huge_body(size: int, declare_length: bool, chunk: int = 64 * 1024,
              max_seconds: float = 30.0) -> Handler:
    """A ``size``-byte HTML page, streamed; with or without a Content-Length."""

    def writer(h: BaseHTTPRequestHandler) -> None:
        headers = {"Content-Type": HTML}
        if declare_length:
            headers["Content-Length"] = str(size)
        _head(h, 200, headers)
        block = b"<p>" + b"x" * (chunk - 7) + b"</p>\n"
        sent, deadline = 0, time.monotonic() + max_seconds
        try:
            while sent < size and time.monotonic() < deadline:
                piece = block[: size - sent]
                h.wfile.write(piece)
                sent += len(piece)
        except _HANGUP:
            pass

    return lambda info: writer


@functools.cache
def gzip_bomb_body(decompressed: int) -> bytes:
    """``decompressed`` bytes of an HTML page (mostly spaces), gzip-compressed (~1000:1)."""
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", compresslevel=9) as gz:
        gz.write(b"<html><body><p>bomb</p>")
        block = b" " * (1 << 20)
        left = decompressed - 30
        while left > 0:
            gz.write(block[:left])
            left -= len(block)
        gz.write(b"</body></html>")
    return out.getvalue()


def gzip_bomb(decompressed: int, encoding: str = "gzip") -> Response:
    """A small response that inflates to ``decompressed`` bytes (``gzip`` or ``deflate``)."""
    body = gzip_bomb_body(decompressed)
    if encoding == "deflate":
        body = zlib.compress(gzip.decompress(body), 9)
    return Response(200, {"Content-Type": HTML, "Content-Encoding": encoding}, body)


def redirect_cycle(*paths: str, status: int = 302) -> dict[str, Response]:
    """Routes where ``paths[0]`` → ``paths[1]`` → … → ``paths[0]``."""
    return {p: Response(status, {"Location": paths[(i + 1) % len(paths)]}, b"")
            for i, p in enumerate(paths)}


def endless_redirects(prefix: str = "/endless/") -> Handler:
    """``/endless/N`` → ``/endless/N+1`` forever: never the same URL twice."""

    def handler(info: RequestInfo) -> Response:
        tail = info.path[len(prefix):]
        n = int(tail) if tail.isdigit() else 0
        return Response(302, {"Location": f"{prefix}{n + 1}"}, b"")

    return handler


def drip(size: int = 10_000, every: float = 0.2, max_seconds: float = 20.0) -> Handler:
    """Declares ``size`` bytes, then sends one byte every ``every`` seconds."""

    def writer(h: BaseHTTPRequestHandler) -> None:
        _head(h, 200, {"Content-Type": HTML, "Content-Length": str(size)})
        deadline = time.monotonic() + max_seconds
        try:
            for _ in range(size):
                if time.monotonic() > deadline:
                    return
                h.wfile.write(b" ")
                h.wfile.flush()
                time.sleep(every)
        except _HANGUP:
            pass

    return lambda info: writer


def header_flood(line_bytes: int = 8000, max_seconds: float = 20.0) -> Handler:
    """A status line, then headers without end (each line under Twisted's 16 KiB cap)."""
    line = b"X-Flood: " + b"v" * (line_bytes - 11) + b"\r\n"

    def writer(h: BaseHTTPRequestHandler) -> None:
        deadline = time.monotonic() + max_seconds
        try:
            h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n")
            while time.monotonic() < deadline:
                h.wfile.write(line * 64)
        except _HANGUP:
            pass

    return lambda info: writer


def truncated(declared: int = 10_000, sent: int = 200) -> Handler:
    """Declares ``declared`` bytes, sends ``sent`` and closes the connection."""
    body = (b"<html><body><p>" + b"t" * declared)[:sent]

    def writer(h: BaseHTTPRequestHandler) -> None:
        _head(h, 200, {"Content-Type": HTML, "Content-Length": str(declared)})
        _write(h, body)

    return lambda info: writer


def raw(data: bytes) -> Handler:
    """Sends ``data`` as it is, status line and headers included, and closes."""
    return lambda info: functools.partial(_write, data=data)


def _write(h: BaseHTTPRequestHandler, data: bytes) -> None:
    try:
        h.wfile.write(data)
        h.wfile.flush()
    except _HANGUP:
        pass


LEGACY_TEXT = ("<html><head><title>Café</title></head><body><h1>Café crème</h1>"
               "<p>Crème brûlée, naïve façade, 5 € — «voilà»</p></body></html>")


def legacy_page(content_type: str, body_encoding: str = "cp1252") -> Response:
    """A French page encoded in ``body_encoding`` served with ``content_type`` (which may name
    no charset, a wrong one or an unknown one)."""
    return Response(200, {"Content-Type": content_type}, LEGACY_TEXT.encode(body_encoding))


BROKEN_HTML = (b"<html><head><title>Broken</tit<body><div><p>unclosed <b>bold <i>"
               b"<table><tr><td>cell</div></p><a href='/product/WF01-0001'>link</a"
               b"<script>var x = '</p>';<!-- never closed \x00\xff\xfe</html")
