"""Reading sitemaps over HTTP from the test web: index, gzip, robots.txt, bad input."""

from __future__ import annotations

import gzip
import io
import re
import threading

import pytest

from tests.testweb import Response
from webfarm.netguard import NetGuard, parse_networks
from webfarm.sitemaps import SitemapError, SitemapReader, start_url

XMLNS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'


def product_urls(web, base: str) -> list[str]:
    return sorted(u for u in web.expected_pages(base) if "/product/" in u and "/print/" not in u)


def urlset(*locs: str) -> str:
    body = "".join(f"<url><loc>{loc}</loc></url>" for loc in locs)
    return f'<?xml version="1.0"?><urlset {XMLNS}>{body}</urlset>'


def index(*locs: str) -> str:
    body = "".join(f"<sitemap><loc>{loc}</loc></sitemap>" for loc in locs)
    return f'<?xml version="1.0"?><sitemapindex {XMLNS}>{body}</sitemapindex>'


def xml(text: str, **headers: str) -> Response:
    return Response(200, {"Content-Type": "application/xml", **headers}, text.encode())


def test_sitemap_index_of_a_gzip_sitemap_and_robots_lines(web):
    base = web.base_urls[0]
    expected = product_urls(web, base)
    reader = SitemapReader()
    plain = reader.read(f"{base}/sitemap.xml")
    assert sorted(plain.urls) == expected and plain.sitemaps == [f"{base}/sitemap.xml"]
    nested = reader.read(f"{base}/sitemap_index.xml")
    assert sorted(nested.urls) == expected
    assert nested.sitemaps == [f"{base}/sitemap_index.xml", f"{base}/sitemap-products.xml.gz"]
    # A host (or its root URL) means its robots.txt, whose Sitemap: line is followed.
    for value in (base, base + "/", f"{base}/robots.txt"):
        via_robots = reader.read(value)
        assert sorted(via_robots.urls) == expected, value
        assert via_robots.sitemaps == [f"{base}/robots.txt", f"{base}/sitemap.xml"]


def test_content_encoding_gzip_and_text_sitemaps(web):
    base = web.base_urls[0]
    locs = [f"{base}/a", f"{base}/b"]
    payload = gzip.compress(urlset(*locs).encode())
    web.route("/enc.xml", Response(200, {"Content-Type": "application/xml",
                                         "Content-Encoding": "gzip"}, payload))
    # gzip on the wire around a .gz file: two layers
    web.route("/twice.xml.gz", Response(200, {"Content-Encoding": "gzip"},
                                        gzip.compress(payload)))
    web.route("/list.txt", Response.text(f"{locs[0]}\n\n{locs[1]}\n"))
    reader = SitemapReader()
    assert reader.read(f"{base}/enc.xml").urls == locs
    assert reader.read(f"{base}/twice.xml.gz").urls == locs
    assert reader.read(f"{base}/list.txt").urls == locs
    hit = web.hits_for(path="/enc.xml")[0]
    assert "gzip" in hit.headers["accept-encoding"]


def test_non_http_locations_are_skipped_and_duplicates_kept_once(web):
    base = web.base_urls[0]
    # Also skipped: locations Scrapy's downloader fails on at every try. One with a
    # user:password made `scrapy seed --sitemap` refuse the whole sitemap.
    web.route("/mixed.xml", xml(urlset(f"{base}/a", "ftp://x/y", "/relative", f"{base}/a",
                                       "http://me:secret@127.0.0.2/b", "http://127.0.0.2:0/c")))
    result = SitemapReader().read(f"{base}/mixed.xml")
    assert result.urls == [f"{base}/a"] and result.skipped == 4


@pytest.mark.parametrize(
    ("route", "response", "message"),
    [
        ("/page.xml", Response.html("<html><body>hi</body></html>"), "root element <html>"),
        ("/empty.xml", xml(""), "is empty"),
        ("/data.json", Response.text('{"urls": []}', content_type="application/json"),
         "neither XML nor one URL per line"),
        ("/gone.xml", Response.text("no", status=404), "HTTP 404"),
        ("/bad.xml.gz", Response(200, {}, b"\x1f\x8b\x08\x00garbage"), "broken gzip"),
    ],
)
def test_what_is_not_a_sitemap_is_one_clear_error(web, route, response, message):
    base = web.base_urls[0]
    web.route(route, response)
    with pytest.raises(SitemapError, match=message) as info:
        SitemapReader().read(base + route)
    assert "\n" not in str(info.value) and base + route in str(info.value)


def test_robots_without_sitemap_lines_and_bad_input(web):
    base = web.base_urls[0]
    web.route("/robots.txt", Response.text("User-agent: *\nAllow: /\n"))
    with pytest.raises(SitemapError, match="lists no 'Sitemap:' lines"):
        SitemapReader().read(base)
    for bad in ("ftp://example.com/sitemap.xml", "http://", "not a url/x y"):
        with pytest.raises(SitemapError, match="not an http"):
            SitemapReader().read(bad)
    assert start_url("example.com") == ("https://example.com/robots.txt", True)
    # A bare host is tried over https; a plain-HTTP site answered with an SSL error only.
    netloc = base.split("//")[1]
    with pytest.raises(SitemapError, match=rf"; if the site serves plain HTTP, give "
                                           rf"http://{re.escape(netloc)}/$"):
        SitemapReader().read(netloc)
    assert start_url("http://h:81/s.xml") == ("http://h:81/s.xml", False)


def test_a_bad_child_fails_the_whole_index(web):
    base = web.base_urls[0]
    web.route("/idx.xml", xml(index(f"{base}/sitemap.xml", f"{base}/missing.xml")))
    web.route("/missing.xml", Response.text("gone", status=410))
    # ... and names the index that listed it: with hundreds of children, which one?
    with pytest.raises(SitemapError, match=r"missing\.xml: HTTP 410 .*\(listed by the "
                       r"sitemap index http://[\d.:]+/idx\.xml\)$"):
        SitemapReader().read(f"{base}/idx.xml")


def test_a_sitemap_cut_short_or_not_well_formed_seeds_nothing(web):
    """Scrapy's reader recovers from broken XML: a transfer cut in half seeded half the
    URLs with exit 0, and an unescaped '&' queued another URL (id=3=2), in silence."""
    base = web.base_urls[0]
    whole = urlset(*(f"{base}/p{i}" for i in range(2000))).encode()

    def cut(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "application/xml")
        handler.send_header("Content-Length", str(len(whole)))
        handler.end_headers()
        handler.wfile.write(whole[:len(whole) // 2])
        handler.wfile.flush()
        handler.close_connection = True

    web.route("/cut.xml", lambda info: cut)
    with pytest.raises(SitemapError, match=r"cut\.xml: cut short in transfer \([\d,]+ of "
                                           rf"{len(whole):,} bytes\)"):
        SitemapReader().read(f"{base}/cut.xml")
    web.route("/half.xml", xml(whole[:len(whole) // 2].decode()))  # whole on the wire
    web.route("/amp.xml", xml(urlset(f"{base}/q?id=3&cat=2")))
    web.route("/page.html", Response.html("<!doctype html><html><body>hi</body></html>"))
    for route in ("/half.xml", "/amp.xml", "/page.html"):
        with pytest.raises(SitemapError, match=r"is not well-formed XML \(.+\); nothing was "
                                               r"enqueued\. Fix the sitemap"):
            SitemapReader().read(base + route)
    web.route("/amp.xml", xml(urlset(f"{base}/q?id=3&amp;cat=2")))  # escaped: as meant
    assert SitemapReader().read(f"{base}/amp.xml").urls == [f"{base}/q?id=3&cat=2"]


def test_index_loops_and_depth_are_bounded(web):
    base = web.base_urls[0]
    web.route("/loop.xml", xml(index(f"{base}/loop.xml", f"{base}/sitemap.xml")))
    assert len(SitemapReader().read(f"{base}/loop.xml").urls) == len(product_urls(web, base))
    for level in range(5):
        web.route(f"/deep{level}.xml", xml(index(f"{base}/deep{level + 1}.xml")))
    web.route("/deep5.xml", xml(urlset(f"{base}/a")))
    with pytest.raises(SitemapError, match="nested deeper than 3 levels"):
        SitemapReader().read(f"{base}/deep0.xml")
    assert SitemapReader(max_depth=5).read(f"{base}/deep0.xml").urls == [f"{base}/a"]


def test_size_limits_hold_for_plain_and_compressed_bodies(web):
    base = web.base_urls[0]
    big = urlset(*(f"{base}/p{i}" for i in range(2000)))
    web.route("/big.xml", xml(big))
    # a gzip bomb: small on the wire, large once inflated
    bomb = io.BytesIO()
    with gzip.GzipFile(fileobj=bomb, mode="wb") as f:
        f.write(b" " * (4 * 1024 * 1024))
    web.route("/bomb.xml.gz", Response(200, {}, bomb.getvalue()))
    reader = SitemapReader(max_bytes=64 * 1024)
    with pytest.raises(SitemapError, match="larger than 65536 bytes"):
        reader.read(f"{base}/big.xml")
    with pytest.raises(SitemapError, match="decompresses to more than 65536 bytes"):
        reader.read(f"{base}/bomb.xml.gz")
    with pytest.raises(SitemapError, match="more than 100 URLs"):
        SitemapReader(max_urls=100).read(f"{base}/big.xml")


def test_xml_entities_are_not_resolved(web, tmp_path):
    base = web.base_urls[0]
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET")
    body = (f'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY e SYSTEM "file://{secret}">]>'
            f"<urlset {XMLNS}><url><loc>{base}/a&e;</loc></url></urlset>")
    web.route("/xxe.xml", xml(body))
    result = SitemapReader().read(f"{base}/xxe.xml")
    assert not any("TOP-SECRET" in u for u in result.urls)


def test_every_fetch_and_redirect_goes_through_the_guard(web):
    base = web.base_urls[0]
    web.route("/moved.xml", Response(302, {"Location": f"{base}/sitemap.xml"}))
    strict = NetGuard()  # loopback refused
    guarded = SitemapReader(check_url=lambda u: _check(strict, u))
    with pytest.raises(SitemapError, match="refused: loopback"):
        guarded.read(f"{base}/sitemap.xml")
    allowed = NetGuard(parse_networks("127.0.0.2/32"))
    reader = SitemapReader(check_url=lambda u: _check(allowed, u))
    assert len(reader.read(f"{base}/moved.xml").urls) == len(product_urls(web, base))
    other = web.base_urls[1]
    web.route("/away.xml", Response(301, {"Location": f"{other}/sitemap.xml"}))
    with pytest.raises(SitemapError, match="redirects to a refused address"):
        reader.read(f"{base}/away.xml")


def test_documents_of_one_host_are_fetched_a_delay_apart(web):
    """A 50-child index came in 0.13 s: the seed command fetched as fast as it could,
    where a worker waits WEBFARM_HOST_DELAY between two requests to a host."""
    base = web.base_urls[0]
    web.route("/kids.xml", xml(index(*(f"{base}/kid{i}.xml" for i in range(3)))))
    for i in range(3):
        web.route(f"/kid{i}.xml", xml(urlset(f"{base}/k{i}")))
    web.clear_hits()
    result = SitemapReader(delay=0.3).read(f"{base}/kids.xml")
    assert len(result.urls) == 3
    times = sorted(h.monotonic for h in web.hits)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(times) == 4 and min(gaps) >= 0.29, times


def test_a_slow_server_times_out(web):
    base = web.base_urls[0]
    release = threading.Event()

    def stall(handler):
        release.wait(10)

    web.route("/slow.xml", lambda info: stall)
    try:
        with pytest.raises(SitemapError, match="cannot fetch"):
            SitemapReader(timeout=0.5).read(f"{base}/slow.xml")
    finally:
        release.set()


def _check(guard: NetGuard, url: str) -> str | None:
    import asyncio

    return asyncio.run(guard.check_url(url))
