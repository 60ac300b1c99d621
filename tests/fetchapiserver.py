"""A local fetch API that speaks webfarm's contract (stdlib only), for tests and benches.

``POST /`` with ``Authorization: Bearer KEY`` and ``{"url": URL, "format": "html"}``:
fetches URL itself (a plain GET, following redirects, naming itself a rendering
service so the test web's JS pages answer as rendered) and answers
``{"status": int, "url": final_url, "headers": {...}, "content": str}``.
Misbehaviour for tests: ``fail_first[url] = n`` answers 503 to the first ``n``
calls for ``url``; ``bad_json`` lists URLs answered with broken JSON. ``calls``
records (url, authorised) for every call.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests import servers
from tests.testweb.jspages import RENDERING_AGENT


class FetchAPIServer:
    def __init__(self, key: str, host: str = "127.0.0.9") -> None:
        self.key = key
        self.host = host
        self.port = servers.free_port(host)
        self.calls: list[tuple[str, bool]] = []
        self.fail_first: dict[str, int] = {}
        self.bad_json: set[str] = set()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1/fetch"

    def calls_for(self, url: str) -> int:
        with self._lock:
            return sum(1 for u, _ in self.calls if u == url)

    def start(self) -> FetchAPIServer:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                authorised = self.headers.get("Authorization") == f"Bearer {api.key}"
                try:
                    url = json.loads(raw)["url"]
                except (ValueError, KeyError, TypeError):
                    return self._send(400, b'{"error": "bad request"}')
                with api._lock:
                    api.calls.append((url, authorised))
                    failing = api.fail_first.get(url, 0)
                    if failing:
                        api.fail_first[url] = failing - 1
                if not authorised:
                    return self._send(401, b'{"error": "bad key"}')
                if failing:
                    return self._send(503, b'{"error": "busy"}')
                if url in api.bad_json:
                    return self._send(200, b'{"status": 200, "content": "<html>')
                self._send(200, json.dumps(fetch(url)).encode())

            def _send(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> FetchAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fetch(url: str) -> dict:
    """What the API saw at ``url``: status, final URL, headers, text."""
    request = urllib.request.Request(url, headers={"User-Agent": f"{RENDERING_AGENT}/1.0"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            status, final, headers, body = resp.status, resp.url, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        status, final, headers, body = err.code, url, err.headers, err.read()
    return {"status": status, "url": final, "headers": dict(headers.items()),
            "content": body.decode("utf-8", "replace")}
