"""The local test web: real HTTP on two loopback hosts, as the crawler tests will use it."""

from __future__ import annotations

import gzip
import hashlib
import http.client
import json
import os
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import parse_qsl, urldefrag, urlencode, urljoin, urlsplit, urlunsplit

import pytest
from w3lib.url import canonicalize_url

from tests.testweb import Response, TestWeb

ROOT = Path(__file__).resolve().parent.parent
SM = "{http://www.sitemaps.org/schemas/sitemap/0.9}"
# No proxy from the environment may see loopback test traffic.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with OPENER.open(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


@pytest.fixture(scope="module")
def web() -> Iterator[TestWeb]:
    with TestWeb(hosts=("127.0.0.2", "127.0.0.3")) as w:
        yield w


@pytest.fixture()
def fresh_web() -> Iterator[TestWeb]:
    """A web of its own, for tests that add routes or count hits."""
    with TestWeb(hosts=("127.0.0.2", "127.0.0.3"), categories=2, products_per_category=4) as w:
        yield w


def test_serves_a_different_shop_on_each_host_on_one_port(web: TestWeb) -> None:
    a, b = web.base_urls
    assert urlsplit(a).hostname == "127.0.0.2" and urlsplit(b).hostname == "127.0.0.3"
    assert urlsplit(a).port == urlsplit(b).port
    status_a, headers, home_a = get(a + "/")
    status_b, _, home_b = get(b + "/")
    assert (status_a, status_b) == (200, 200)
    assert headers["Content-Type"] == "text/html; charset=utf-8"
    assert int(headers["Content-Length"]) == len(home_a)
    assert b"<title>Home | Acme Outfitters</title>" in home_a
    assert b"<title>Home | Bluebird Supply Co.</title>" in home_b
    assert b'<meta charset="utf-8">' in home_a and b"<script>" in home_a and b"<style>" in home_a
    # Only the first host links the other one.
    assert f'href="{b}/"'.encode() in home_a
    assert a.encode() not in home_b
    status, _, body = get(a + "/no/such/page")
    assert status == 404 and b"Not found" in body
    assert get(a + "/category/garden?page=99")[0] == 404
    assert get(a + "/product/NOPE")[0] == 404


def test_product_page_mirror_and_tracking_variants_are_byte_identical(web: TestWeb) -> None:
    a = web.base_urls[0]
    _, headers, product = get(a + "/product/WF02-0003")
    assert b"SKU: WF02-0003" in product and b'class="price">$' in product
    assert b'href="/category/kitchen"' in product and b"?utm_content=related" in product
    for variant in ("/print/product/WF02-0003", "/product/WF02-0003?utm_source=nav",
                    "/product/WF02-0003?utm_content=related&gclid=x"):
        status, variant_headers, body = get(a + variant)
        assert status == 200 and body == product, variant
        assert variant_headers["ETag"] == headers["ETag"]
    assert get(a + "/category/kitchen")[2] == get(a + "/category/kitchen?page=1")[2]
    assert get(a + "/category/kitchen?page=1")[2] != get(a + "/category/kitchen?page=2")[2]


def test_conditional_requests_get_304(web: TestWeb) -> None:
    url = web.base_urls[1] + "/product/WF01-0001"
    status, headers, body = get(url)
    etag, modified = headers["ETag"], headers["Last-Modified"]
    assert status == 200 and etag.startswith('"')
    assert get(url)[1]["ETag"] == etag  # stable
    status, headers304, body304 = get(url, {"If-None-Match": etag})
    assert (status, body304) == (304, b"") and headers304["ETag"] == etag
    assert get(url, {"If-Modified-Since": modified})[0] == 304
    assert get(url, {"If-None-Match": '"something-else"'})[0] == 200
    # If-None-Match wins over If-Modified-Since (RFC 9110).
    assert get(url, {"If-None-Match": '"other"', "If-Modified-Since": modified})[0] == 200
    assert get(url, {"If-Modified-Since": "Mon, 01 Jan 2001 00:00:00 GMT"})[0] == 200


def test_hits_log_what_the_server_saw(fresh_web: TestWeb) -> None:
    a, b = fresh_web.base_urls
    before = time.monotonic()
    get(a + "/about", {"User-Agent": "webfarm-test/1.0"})
    get(a + "/product/WF01-0001?utm_source=nav")
    get(b + "/robots.txt")
    hits = fresh_web.hits
    assert [(h.method, h.path) for h in hits] == [
        ("GET", "/about"), ("GET", "/product/WF01-0001?utm_source=nav"), ("GET", "/robots.txt")]
    netloc, method, path, mono, wall, headers = hits[0]
    assert netloc == urlsplit(a).netloc and headers["user-agent"] == "webfarm-test/1.0"
    assert before <= mono <= hits[1].monotonic <= time.monotonic()
    assert abs(wall - time.time()) < 60
    assert len(fresh_web.hits_for(host="127.0.0.2")) == 2
    assert len(fresh_web.hits_for(host=b)) == 1
    assert len(fresh_web.hits_for(path="/product/WF01-0001")) == 1
    assert fresh_web.hits_for(path="/product/WF01-0001?ref=x") == []
    fresh_web.clear_hits()
    assert fresh_web.hits == []


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def _canonical(url: str) -> str:
    url = urldefrag(url)[0]
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
             if not k.startswith("utm_") and k not in ("gclid", "fbclid")]
    return canonicalize_url(urlunsplit(parts._replace(query=urlencode(query))))


def _bfs(start: str) -> tuple[set[str], set[bytes], set[str]]:
    """Follow every in-host <a href> from ``start``: pages, body hashes, off-host links."""
    netloc = urlsplit(start).netloc
    seen, bodies, foreign = {_canonical(start)}, set(), set()
    queue = deque(seen)
    while queue:
        url = queue.popleft()
        status, _, body = get(url)
        assert status == 200, url
        bodies.add(hashlib.sha256(body).digest())
        parser = _Links()
        parser.feed(body.decode("utf-8"))
        for href in parser.hrefs:
            target = _canonical(urljoin(url, href))
            if urlsplit(target).netloc != netloc:
                foreign.add(target)
            elif target not in seen:
                seen.add(target)
                queue.append(target)
    return seen, bodies, foreign


def test_expected_pages_match_a_real_crawl(web: TestWeb) -> None:
    a, b = web.base_urls
    web.clear_hits()
    pages, bodies, foreign = _bfs(a + "/")
    assert pages == web.expected_pages(a)
    assert len(bodies) == web.expected_contents(a)
    assert foreign == {canonicalize_url(b + "/")}
    assert len(pages) == 86 and len(bodies) == 47  # the documented default sizes
    # The crawl (which never refetches a canonical URL) asked the server once per page.
    paths = [h.path for h in web.hits_for(host=a)]
    assert len(paths) == len(set(paths)) == len(pages)
    pages_b, bodies_b, foreign_b = _bfs(b + "/")
    assert pages_b == web.expected_pages(b) and foreign_b == set()
    assert not bodies & bodies_b


def test_sitemaps_and_robots(web: TestWeb) -> None:
    a = web.base_urls[0]
    status, headers, robots = get(a + "/robots.txt")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert "User-agent: *" in robots.decode() and f"Sitemap: {a}/sitemap.xml" in robots.decode()
    urlset = ET.fromstring(get(a + "/sitemap.xml")[2])
    listed = [loc.text for loc in urlset.iter(f"{SM}loc")]
    assert len(listed) == 36 and set(listed) <= web.expected_pages(a)
    assert all("/product/" in u for u in listed)
    index = ET.fromstring(get(a + "/sitemap_index.xml")[2])
    (gz_url,) = [loc.text for loc in index.iter(f"{SM}loc")]
    assert gz_url == f"{a}/sitemap-products.xml.gz"
    status, _, raw = get(gz_url)
    assert status == 200 and raw[:2] == b"\x1f\x8b"
    assert [loc.text for loc in ET.fromstring(gzip.decompress(raw)).iter(f"{SM}loc")] == listed


def test_custom_routes_win_over_the_catalogue(fresh_web: TestWeb) -> None:
    a, b = fresh_web.base_urls
    fresh_web.route("/about", Response.html("<p>custom about</p>"))
    fresh_web.route("/product/", lambda info: Response(403, {}, b"go away"), host=b)
    seen: list[str] = []

    def spy(info):  # falls through to the catalogue after looking
        seen.append(info.path_with_query)
        return None

    fresh_web.route("/category/", spy)
    fresh_web.route("/teapot", lambda info: Response.text("short and stout", status=418))

    def truncated(handler) -> None:  # owns the socket: promises 1000 bytes, sends 5
        handler.send_response(200)
        handler.send_header("Content-Length", "1000")
        handler.end_headers()
        handler.wfile.write(b"hello")

    fresh_web.route("/broken", lambda info: truncated)

    assert get(a + "/about")[2] == b"<p>custom about</p>"
    assert get(b + "/about")[2] == b"<p>custom about</p>"
    assert get(a + "/product/WF01-0001")[0] == 200
    assert get(b + "/product/WF01-0001")[:3:2] == (403, b"go away")
    assert get(a + "/category/garden?page=1")[0] == 200 and seen == ["/category/garden?page=1"]
    assert get(a + "/teapot")[0] == 418
    with pytest.raises(http.client.IncompleteRead):
        get(a + "/broken")
    fresh_web.unroute("/product/", host=b)
    assert get(b + "/product/WF01-0001")[0] == 200


def test_many_concurrent_requests_and_bounded_stop() -> None:
    web = TestWeb(hosts=("127.0.0.2", "127.0.0.3")).start()
    urls = [f"{base}/product/WF0{c}-000{i}" for base in web.base_urls
            for c in (1, 2, 3) for i in range(1, 10)] * 3
    with ThreadPoolExecutor(40) as pool:
        statuses = list(pool.map(lambda u: get(u)[0], urls))
    assert statuses == [200] * len(urls) and len(web.hits) == len(urls)
    # An idle keep-alive connection must not hold stop() up.
    host, port = urlsplit(web.base_urls[0]).hostname, urlsplit(web.base_urls[0]).port
    conn = http.client.HTTPConnection(host, port, timeout=5)
    conn.request("GET", "/")
    assert conn.getresponse().read()
    started = time.monotonic()
    web.stop()
    assert time.monotonic() - started < 3
    with pytest.raises(OSError):
        get(web.base_urls[0] + "/")
    conn.close()


def test_cli_prints_its_urls_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.testweb", "--host", "127.0.0.2", "--host", "127.0.0.3",
         "--port", "0", "--categories", "2", "--products", "3"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        assert ready, "no JSON line within 20s"
        info = json.loads(proc.stdout.readline())
        assert info["pid"] == proc.pid and len(info["base_urls"]) == 2
        status, _, body = get(info["base_urls"][1] + "/category/kitchen")
        assert status == 200 and b"Bluebird Supply Co." in body
        assert get(info["base_urls"][0] + "/product/WF02-0004")[0] == 404  # only 3 a category
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        assert proc.stdout.read() == b""  # exactly one line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        proc.stdout.close()
        proc.stderr.close()
