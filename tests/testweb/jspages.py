"""Pages that need JavaScript, for the render ladder's tests and bench (stdlib only).

A :class:`JsSite` takes over one test-web host (``web.route("/", site, host=…)``)
and serves a small site under a path ``prefix``: a home page linking ``pages``
pages ``<prefix>p/<n>``. Page ``n`` is a JavaScript page when ``is_js(n)``:

* ``style="app"``: the HTML is an empty ``<div id="app"></div>`` app root, a
  ``<noscript>`` asking for JavaScript, and an inline script that inserts the
  content (title, text, links to the next pages) when it runs;
* ``style="widget"``: plenty of static text, but the ``<div class="product">``
  a spider wants is inserted by inline script (only a spider's
  ``render_check`` can tell).

Every JavaScript page also loads ``/static/app.js?page=<path>``, which only a
browser fetches: its hits count renders per page (:meth:`JsSite.renders`).
``js`` can be switched off while serving (the host "stops needing JavaScript").
A client whose User-Agent contains ``RENDERING_AGENT`` (the test fetch API, which
stands for a rendering service) gets the rendered page.
The rendered DOM of a JS page and the static page of the same ``n`` carry the
same marker text ``content of page <n>``.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from urllib.parse import parse_qs

from tests.testweb.server import RequestInfo, Response, TestWeb

# A rendering fetch API (tests/fetchapiserver.py) cannot run scripts; it names itself with
# this User-Agent and gets what a browser would end up with.
RENDERING_AGENT = "fetchapi-test"
FILLER = ("This shop sells sturdy hand tools, garden supplies and spare parts. Orders ship "
          "within two working days; returns are accepted for thirty days. ") * 3


class JsSite:
    def __init__(self, pages: int = 6, is_js: Callable[[int], bool] = lambda n: True,
                 prefix: str = "/", style: str = "app", home_js: bool = False) -> None:
        self.pages = pages
        self.is_js = is_js
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.style = style
        self.home_js = home_js
        self.js = True  # False: every page is served as plain HTML
        self.web: TestWeb | None = None
        self.host: str | None = None

    def install(self, web: TestWeb, host: str) -> JsSite:
        self.web, self.host = web, host
        web.route(self.prefix, self, host=host)
        web.route("/static/app.js", self._script, host=host)
        return self

    # -- what a crawler should find --------------------------------------------------------

    def url(self, n: int | None = None) -> str:
        assert self.host is not None, "install() first"
        base = self.host if "://" in self.host else f"http://{self.host}"
        return base.rstrip("/") + self.path(n)

    def path(self, n: int | None = None) -> str:
        return self.prefix if n is None else f"{self.prefix}p/{n}"

    def js_pages(self) -> list[int]:
        return [n for n in range(self.pages) if self.is_js(n)]

    def all_urls(self) -> set[str]:
        return {self.url()} | {self.url(n) for n in range(self.pages)}

    def renders(self, path: str) -> int:
        """How many times a browser rendered ``path`` (its app.js was fetched)."""
        assert self.web is not None
        return len(self.web.hits_for(host=self.host, path=f"/static/app.js?page={path}"))

    def fetches(self, path: str) -> int:
        assert self.web is not None
        return len(self.web.hits_for(host=self.host, path=path))

    # -- serving ---------------------------------------------------------------------------

    def __call__(self, info: RequestInfo) -> Response | None:
        path = info.path
        if path == self.prefix:
            links = [self.path(n) for n in range(self.pages)]
            return self._page(path, "Home", "content of the home page", links,
                              js=self.home_js and self.js)
        if not path.startswith(self.prefix + "p/"):
            return None  # robots.txt and the rest: the catalogue answers
        try:
            n = int(path[len(self.prefix) + 2:])
        except ValueError:
            return None
        if not 0 <= n < self.pages:
            return None
        links = [self.path(m) for m in (n + 1, n + 2) if m < self.pages]
        rendered = RENDERING_AGENT in info.headers.get("user-agent", "")
        return self._page(path, f"Page {n}", f"content of page {n}", links,
                          js=self.js and self.is_js(n) and not rendered)

    def _page(self, path: str, title: str, marker: str, links: list[str], js: bool) -> Response:
        anchors = "".join(f'<li><a href="{html.escape(u)}">{html.escape(u)}</a></li>'
                          for u in links)
        content = (f'<h1>{html.escape(title)}</h1><div class="product"><p>{marker}</p>'
                   f"<p>{FILLER}</p></div><ul>{anchors}</ul>")
        if not js:
            return Response.html(f"<!doctype html><html><head><title>{title}</title></head>"
                                 f"<body><main>{content}</main></body></html>")
        script = f'<script src="/static/app.js?page={html.escape(path)}"></script>'
        if self.style == "widget":
            # Static text and links; only the product block is rendered by script.
            static = (f"<h1>{html.escape(title)}</h1><p>{FILLER}</p><ul>{anchors}</ul>"
                      '<div id="widget"></div>')
            insert = (f'<div class="product"><p>{marker}</p></div>')
            return Response.html(
                f"<!doctype html><html><head><title>{title}</title>{script}</head><body>"
                f"<main>{static}</main><script>document.getElementById('widget').innerHTML = "
                f"{json.dumps(insert)};</script></body></html>")
        return Response.html(
            f"<!doctype html><html><head><title>{title}</title>{script}</head><body>"
            '<noscript>You need to enable JavaScript to run this app.</noscript>'
            '<div id="app"></div>'
            f"<script>document.getElementById('app').innerHTML = {json.dumps(content)};"
            "</script></body></html>")

    def _script(self, info: RequestInfo) -> Response:
        page = parse_qs(info.query).get("page", ["?"])[0]
        return Response.text(f"window.appPage = {json.dumps(page)};",
                             content_type="application/javascript")
