"""Hostile and broken servers do not hurt: every such page ends stored or dead-lettered with
a reason, nothing is retried forever, and the worker's memory stays bounded.

One crawl of the test web fetches all the hostile routes side by side (a worker meets
them mixed with good pages too), then each outcome is checked on its own.
"""

from __future__ import annotations

import pytest
from scrapy import Request
from scrapy.utils.test import get_crawler

from middlewares.limits import HttpCompressionMiddleware
from tests import crawlcheck, runner
from tests.testweb import Response
from tests.testweb import hostile as h
from webfarm.content import content_hash

MIB = 1 << 20
MAXSIZE = 1 * MIB
BOMB = 256 * MIB  # what the bombs inflate to: fatal if a worker held it
HUGE = 128 * MIB  # what the huge bodies would be if read to the end
RETRIES = 2
SETTINGS = {
    "DOWNLOAD_MAXSIZE": MAXSIZE, "DOWNLOAD_WARNSIZE": 0, "DOWNLOAD_TIMEOUT": 2,
    "REDIRECT_MAX_TIMES": 5, "WEBFARM_RETRY_TIMES": RETRIES,
    "WEBFARM_RETRY_BACKOFF_BASE": 0.05, "WEBFARM_RETRY_BACKOFF_MAX": 0.2,
    # Peak RSS (ru_maxrss, a kernel high-water mark) into the stats, read often.
    "MEMUSAGE_ENABLED": True, "MEMUSAGE_CHECK_INTERVAL_SECONDS": 0.25,
    # The plain HTTP client: the browser rung is not under test here.
    "WEBFARM_RENDER": "http",
}
SIZE_ROUTES: dict[str, object] = {
    "/huge-declared": h.huge_body(HUGE, declare_length=True),
    "/huge-streamed": h.huge_body(HUGE, declare_length=False),
    "/bomb-gzip": h.gzip_bomb(BOMB),
    "/bomb-deflate": h.gzip_bomb(BOMB, encoding="deflate"),
    "/small-gzip": h.gzip_bomb(MAXSIZE // 2),  # compressed and under the limit: fine
    "/header-flood": h.header_flood(),  # 1.76 GB in 5 s into a bare Scrapy worker
    "/header-line": Response(302, {"Location": "/next?" + "a" * 20_000}),  # one 20 KB line
}
OTHER_ROUTES: dict[str, object] = {
    **h.redirect_cycle("/loop/a", "/loop/b"),
    "/loop/self": Response(301, {"Location": "/loop/self"}),
    "/endless/": h.endless_redirects("/endless/"),
    "/drip": h.drip(size=10_000, every=0.1),
    "/truncated": h.truncated(declared=10_000, sent=300),
    "/charset/utf8": h.legacy_page("text/html; charset=utf-8", "utf-8"),
    "/charset/missing": h.legacy_page("text/html"),
    "/charset/wrong": h.legacy_page("text/html; charset=utf-8"),
    "/charset/unknown": h.legacy_page("text/html; charset=x-klingon"),
    "/charset/mislabelled": h.legacy_page("text/html; charset=iso-8859-1", "utf-8"),
    "/broken": Response.html(h.BROKEN_HTML),
    # Redirects the downloader would fail on at every try (w3lib refuses the first two).
    "/to/bad-port": Response(302, {"Location": "http://127.0.0.2:99999/x"}),
    "/to/bad-ipv6": Response(302, {"Location": "http://[::1/x"}),
    "/to/credentials": Response(302, {"Location": "http://user:secret@127.0.0.2/x"}),
    # Redirects Scrapy hands on as the 3xx, which was then dropped without a record.
    "/to/file": Response(302, {"Location": "file:///etc/passwd"}),
    "/to/data": Response(302, {"Location": "data:text/html,<h1>hi</h1>"}),
    "/to/mailto": Response(302, {"Location": "mailto:shop@shop.invalid"}),
    "/to/nowhere": Response(302, {}),
    # Out of the spider's hosts (a site that moved): dropped by the offsite filter.
    "/to/offsite": Response(302, {"Location": "http://127.0.0.9:9/moved"}),
    "/to/loopback6": Response(302, {"Location": "http://[::1]:9/admin"}),
    # Bodies their Content-Encoding does not decode; a status line that is not HTTP.
    "/enc/gzip": Response(200, {"Content-Type": "text/html", "Content-Encoding": "gzip"},
                          b"not gzip at all"),
    "/enc/br": Response(200, {"Content-Type": "text/html", "Content-Encoding": "br"}, b"nope"),
    "/bad-status": h.raw(b"HTTP/1.1 abc Weird\r\nContent-Length: 2\r\n\r\nhi"),
    # Legal HTTP names MongoDB cannot take as field names, among 180 KB of headers.
    "/odd-headers": Response(200, {"Content-Type": "text/html", "X.Dotted": "1", "$Set": "2",
                                   **{f"X-Pad-{i}": "p" * 80 for i in range(2000)}},
                             b"<html><body><p>odd headers</p></body></html>"),
}


@pytest.fixture(scope="module")
def bombs_ready():
    h.gzip_bomb_body(BOMB)  # compress once, outside the crawl
    h.gzip_bomb_body(MAXSIZE // 2)


def crawl(web, routes, starts, stores):
    """One worker crawls ``starts`` (paths) on the test web; returns (base, result, dead
    letters by URL, pages by URL, peak RSS growth in bytes)."""
    base = web.base_urls[0]
    for path, handler in routes.items():
        web.route(path, handler, host=base)
    args = ["crawl", "generic", "-a", "start=" + ",".join(base + p for p in starts),
            "-a", "max_pages=1"]  # the hostile pages only, no catalogue around them
    for name, value in SETTINGS.items():
        args += ["-s", f"{name}={value}"]
    result = runner.scrapy(args, runner.env_for(**stores), timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    peak = crawlcheck.stat(result.output, "memusage/max")
    startup = crawlcheck.stat(result.output, "memusage/startup")
    assert peak and startup, "MemoryUsage stats missing"
    return (base, result, crawlcheck.dead_letters(stores["REDIS_URL"]),
            crawlcheck.pages(stores), peak - startup)


def test_oversized_bodies_and_compression_bombs(web, bombs_ready, stores):
    starts = list(SIZE_ROUTES)
    base, result, dead, pages, growth = crawl(web, SIZE_ROUTES, starts, stores)
    # Held in full, a bomb alone would add 256 MiB, a huge body 128 MiB.
    assert growth < 96 * MIB, f"peak RSS grew by {growth / MIB:.0f} MiB"
    for path in ("/huge-declared", "/huge-streamed"):
        letter = dead[base + path]
        assert letter["reason"].startswith("body over DOWNLOAD_MAXSIZE"), letter
        assert letter["attempts"] == 1, letter  # deterministic: not retried
    for path in ("/bomb-gzip", "/bomb-deflate"):
        letter = dead[base + path]
        assert letter["reason"].startswith("body over DOWNLOAD_MAXSIZE after decompression"), \
            letter
        assert letter["attempts"] == 1, letter
    # Headers without end: cut at WEBFARM_MAX_HEADER_BYTES, not read for DOWNLOAD_TIMEOUT.
    letter = dead[base + "/header-flood"]
    assert letter["reason"] == "response headers over WEBFARM_MAX_HEADER_BYTES (262144 B)"
    assert letter["attempts"] == 1, letter
    # One header line past the HTTP client's 16 KiB: before, a closed connection, fetched
    # again and again as a network error.
    letter = dead[base + "/header-line"]
    assert letter["reason"] == "a response header line over 16384 B (the HTTP client's limit)"
    assert letter["attempts"] == 1, letter
    assert set(pages) == {base + "/small-gzip"}
    assert pages[base + "/small-gzip"]["status"] == 200
    assert len(dead) == 6, sorted(dead)
    # The server was asked once per page: no retry loop.
    for path in starts:
        assert len(web.hits_for(host=base, path=path)) == 1, path
    assert crawlcheck.stat(result.output, "webfarm/limits/too_big") == 6
    assert crawlcheck.stat(result.output, "webfarm/limits/too_big/headers") == 2


def test_loops_drips_truncation_charsets_and_broken_html(web, stores):
    starts = ["/loop/a", "/loop/self", "/endless/0", "/drip", "/truncated", "/charset/utf8",
              "/charset/missing", "/charset/wrong", "/charset/unknown", "/charset/mislabelled",
              "/broken", "/odd-headers", "/to/bad-port", "/to/bad-ipv6", "/to/credentials",
              "/to/file", "/to/data", "/to/mailto", "/to/nowhere", "/to/offsite", "/to/loopback6",
              "/enc/gzip", "/enc/br", "/bad-status"]
    base, result, dead, pages, growth = crawl(web, OTHER_ROUTES, starts, stores)
    reasons = {url[len(base):]: d["reason"] for url, d in dead.items()}

    # Redirect loops end at the first repeat; an endless chain at REDIRECT_MAX_TIMES.
    assert reasons["/loop/b"].startswith("redirect loop: "), reasons
    assert "/loop/a" in reasons["/loop/b"]
    assert reasons["/loop/self"].startswith("redirect loop: "), reasons
    assert reasons["/endless/5"].startswith("redirect: more than 5 redirects"), reasons
    assert len(web.hits_for(host=base, path="/endless/5")) == 1
    assert not web.hits_for(host=base, path="/endless/6")
    # A server that drips bytes hits DOWNLOAD_TIMEOUT, is retried, then dead-lettered.
    drip = dead[base + "/drip"]
    assert drip["reason"].startswith(f"gave up after {RETRIES} attempts"), drip
    assert "DownloadTimeoutError" in drip["reason"], drip
    assert len(web.hits_for(host=base, path="/drip")) == RETRIES
    # A truncated body (Content-Length larger than what came) may be a network hiccup:
    # retried, then dead-lettered with the data loss named.
    cut = dead[base + "/truncated"]
    assert cut["reason"].startswith(f"gave up after {RETRIES} attempts"), cut
    assert "DataLoss" in cut["reason"], cut
    assert len(web.hits_for(host=base, path="/truncated")) == RETRIES
    # A redirect to a URL that cannot be fetched is dead-lettered at once, saying why.
    for path, why in [("/to/bad-port", "port out of range"), ("/to/bad-ipv6", "invalid ipv6"),
                      ("/to/credentials", "a user:password@ in the URL")]:
        assert reasons[path].startswith(f"redirect to a URL that cannot be fetched ({why}"), (
            reasons[path])
        assert len(web.hits_for(host=base, path=path)) == 1
    assert "secret" not in reasons["/to/credentials"] and "secret" not in result.output
    # One with no Location, or to a URL that is not http(s): dead-lettered, saying so (it
    # was an INFO line, "HTTP status code is not handled or not allowed", and no record).
    # (mailto: was "missing scheme in request url", though it has one.)
    for path, scheme in (("/to/file", "file"), ("/to/data", "data"), ("/to/mailto", "mailto")):
        assert reasons[path].startswith("redirect to a URL that cannot be fetched (its "
                                        f"scheme '{scheme}' is not http or https)"), reasons
    assert reasons["/to/nowhere"] == (f"redirect without a Location header: HTTP 302 from "
                                      f"{base}/to/nowhere"), reasons
    # A start URL that redirects out of the spider's hosts: a dead letter that says how to
    # follow it, and nothing fetched there.
    assert reasons["/to/offsite"].startswith(
        f"redirect offsite: {base}/to/offsite → http://127.0.0.9:9/moved; to follow it, add "
        "127.0.0.9:9 to the spider's hosts (-a domains=… or allowed_domains; now 127.0.0."), (
        reasons["/to/offsite"])
    assert reasons["/to/offsite"].endswith(
        "then `scrapy dlq generic --requeue --reason 'redirect offsite'`")
    # Out of the hosts to an address the SSRF guard refuses (the tests allow 127.0.0.0/8
    # only): "add [::1]:9 to the spider's hosts" was the advice.
    assert reasons["/to/loopback6"] == (
        f"redirect offsite: {base}/to/loopback6 → http://[::1]:9/admin; the SSRF guard "
        "refuses it too (loopback address ::1 (not in WEBFARM_ALLOWED_NETWORKS)): "
        "there is nothing to follow"), reasons["/to/loopback6"]
    # A body that does not decode is the same at every try: dead-lettered at once (it was
    # retried, with a traceback in the log); a broken status line may be a network fault:
    # retried, and the reason names Twisted's error, not the repr of a list of Failures.
    assert reasons["/enc/gzip"] == ("body does not decode as Content-Encoding 'gzip': "
                                    "BadGzipFile: Not a gzipped file (b'no')"), reasons
    assert reasons["/enc/br"].startswith("body does not decode as Content-Encoding 'br': ")
    assert [len(web.hits_for(host=base, path=p)) for p in ("/enc/gzip", "/enc/br")] == [1, 1]
    assert reasons["/bad-status"] == (
        f"gave up after {RETRIES} attempts: network error: DownloadFailedError: ParseError: "
        "('non-integer status code', b'HTTP/1.1 abc Weird')"), reasons
    assert len(dead) == 17, sorted(reasons)

    # Wrong, missing and unknown charsets: stored, and decoded to the same text as the
    # correctly labelled page (same content hash: the index sees one content).
    charset_pages = {p: pages[base + p] for p in starts if p.startswith("/charset/")}
    assert {d["status"] for d in charset_pages.values()} == {200}
    right = content_hash(h.LEGACY_TEXT.encode("utf-8"), "text/html; charset=utf-8")
    hashes = {p: d["content_hash"] for p, d in charset_pages.items()}
    assert set(hashes.values()) == {right}, hashes
    assert charset_pages["/charset/missing"]["encoding"] == "cp1252"
    assert charset_pages["/charset/mislabelled"]["encoding"] == "utf-8"
    # Header names MongoDB cannot hold are left out of the stored page; the rest stay.
    odd = pages[base + "/odd-headers"]["headers"]
    assert "X.Dotted" not in odd and "$Set" not in odd
    assert odd["Content-Type"] == "text/html" and odd["X-Pad-1999"] == "p" * 80
    # Broken HTML is stored as it came.
    assert pages[base + "/broken"]["status"] == 200
    assert set(pages) == {base + p for p in starts
                          if p.startswith(("/charset/", "/broken", "/odd-headers"))}
    assert growth < 96 * MIB, f"peak RSS grew by {growth / MIB:.0f} MiB"


@pytest.mark.parametrize("value", ["lots", "-1"])
def test_a_bad_header_limit_stops_the_crawl_at_start(value):
    # Scrapy loads the download handler at the first request and only logs its errors:
    # every fetch would fail. The middleware reads the setting when the crawl starts.
    crawler = get_crawler(settings_dict={"WEBFARM_MAX_HEADER_BYTES": value})
    with pytest.raises(ValueError, match=rf"WEBFARM_MAX_HEADER_BYTES='{value}' is not a whole "
                       r"number of bytes; 0 means unbounded \(default 262144\)"):
        HttpCompressionMiddleware.from_crawler(crawler)


def test_utf16_pages_are_read_little_endian_and_their_links_followed(web, stores):
    """A UTF-16 page's links were lost: their requests took the page's encoding, so the
    Referer header's name went out as UTF-16 bytes (``InvalidHeaderName``), retried to the
    dead-letter queue. And "charset=utf-16" without a BOM was read big-endian (garbage, no
    links), where browsers read it little-endian."""
    base = web.base_urls[0]

    def page(name: str, charset: str, bom: bool) -> Response:
        text = f"<html><body><h1>{name}</h1><a href='/u16/{name}-next'>next</a></body></html>"
        body = ("\ufeff" if bom else "") + text
        return Response(200, {"Content-Type": f"text/html; charset={charset}"},
                        body.encode("utf-16-le"))

    web.route("/u16/bom", page("bom", "utf-8", bom=True), host=base)  # the BOM wins
    web.route("/u16/nobom", page("nobom", "utf-16", bom=False), host=base)
    for name in ("bom", "nobom"):
        web.route(f"/u16/{name}-next", Response.html(f"<title>{name} next</title>"), host=base)
    args = ["crawl", "generic", "-a", f"start={base}/u16/bom,{base}/u16/nobom",
            "-s", "WEBFARM_RETRY_TIMES=1"]
    result = runner.scrapy(args, runner.env_for(**stores), timeout=120)
    assert result.returncode == 0 and "Traceback" not in result.output, result.output[-3000:]
    assert crawlcheck.dead_letters(stores["REDIS_URL"]) == {}
    pages = crawlcheck.pages(stores)
    assert set(pages) == {f"{base}/u16/{p}" for p in ("bom", "nobom", "bom-next",
                                                       "nobom-next")}, sorted(pages)
    assert pages[f"{base}/u16/nobom"]["encoding"] == "utf-16-le"


def redirect(mw, request: Request, target: str):
    """``mw``'s answer to a 301 from ``request`` to ``target``: the request it follows."""
    from scrapy.http import Response as ScrapyResponse

    return mw.process_response(request, ScrapyResponse(request.url, status=301,
                                                       headers={"Location": target}))


def test_a_link_that_redirects_out_of_the_spider_s_hosts_is_said_once_per_host(caplog):
    """Scrapy's offsite filter drops it with a DEBUG line; a site whose pages moved to
    another host gave a crawl of nothing and no hint why."""
    from scrapy import Spider
    from scrapy.exceptions import IgnoreRequest

    from middlewares.limits import RedirectMiddleware

    crawler = get_crawler(Spider)
    crawler.spider = Spider("shop", allowed_domains=["shop.test"])
    mw = RedirectMiddleware.from_crawler(crawler)
    caplog.set_level("WARNING")
    # dont_filter does not let it out: the frontier sets it on refetches (which followed a
    # page that moved off the hosts and stored the other site's data), renders, retries.
    for path, dont_filter in (("/a", False), ("/b", True)):
        request = Request(f"http://shop.test{path}", meta={"depth": 2},
                          dont_filter=dont_filter)
        with pytest.raises(IgnoreRequest, match="redirect offsite"):
            redirect(mw, request, f"https://shop.example{path}")
    # A start URL outside the hosts is fetched, as in Scrapy, and so is where it leads.
    outside = Request("http://other.test/", meta={"allow_offsite": True})
    assert redirect(mw, outside, "https://other.test/").url == "https://other.test/"
    said = [r.getMessage() for r in caplog.records if "outside the spider's hosts" in r.message]
    assert said == ["http://shop.test/a redirects to https://shop.example/a, outside the "
                    "spider's hosts: not followed; to follow it, add shop.example to the "
                    "spider's hosts (-a domains=… or allowed_domains; now shop.test) (said "
                    "once per host)"]
    assert crawler.stats.get_value("webfarm/limits/redirect_offsite") == 2


def test_a_redirect_to_another_port_of_the_spider_s_host_is_not_followed(caplog):
    """A WebfarmSpider keeps to its hosts' ports (its links do, and the frontier's
    scope). The redirect check compared bare names: ``shop.test:8080`` → ``:9090`` was
    followed, and the frontier then gave the page back as another crawl's, try after try,
    until it was dead-lettered as "offsite"."""
    from scrapy.exceptions import IgnoreRequest

    from middlewares.limits import RedirectMiddleware
    from spiders.generic import GenericSpider

    crawler = get_crawler(GenericSpider)
    crawler.spider = GenericSpider(start_urls="http://shop.test:8080/",
                                   allowed_domains="shop.test:8080")
    mw = RedirectMiddleware.from_crawler(crawler)
    caplog.set_level("WARNING")
    request = Request("http://shop.test:8080/a", meta={"depth": 1})
    for target in ("http://shop.test:9090/a", "http://shop.test:9090/b"):
        with pytest.raises(IgnoreRequest, match="redirect offsite"):
            redirect(mw, request, target)
    # Its own port, and a subdomain on it, are followed.
    for target in ("http://shop.test:8080/b", "http://www.shop.test:8080/b"):
        assert redirect(mw, request, target).url == target
    said = [r.getMessage() for r in caplog.records if "outside the spider's hosts" in r.message]
    assert said == ["http://shop.test:8080/a redirects to http://shop.test:9090/a, outside the "
                    "spider's hosts: not followed; to follow it, add shop.test:9090 to the "
                    "spider's hosts (-a domains=… or allowed_domains; now shop.test:8080) "
                    "(said once per host)"]
    assert crawler.stats.get_value("webfarm/limits/redirect_offsite") == 2


def test_links_past_the_url_length_limit_are_said_short_and_once_per_host(caplog):
    """Scrapy logged each dropped link whole at INFO: 10,000 links of 20,000 characters
    on one page wrote 200 MB of log."""
    from scrapy import Spider

    from middlewares.limits import UrlLengthMiddleware

    crawler = get_crawler(Spider, {"URLLENGTH_LIMIT": 100})
    crawler.spider = Spider("shop")
    mw = UrlLengthMiddleware.from_crawler(crawler)
    caplog.set_level("INFO", logger="middlewares.limits")
    long = "http://shop.test/?q=" + "a" * 20_000
    assert mw.get_processed_request(Request("http://shop.test/ok"), None) is not None
    for _ in range(3):
        assert mw.get_processed_request(Request(long), None) is None
    infos = [r.getMessage() for r in caplog.records if r.levelname == "INFO"]
    assert len(infos) == 1 and len(infos[0]) < 400, infos
    assert "(20020 characters)" in infos[0]
    assert crawler.stats.get_value("urllength/request_ignored_count") == 3


def test_a_refetch_s_validators_do_not_follow_its_redirect():
    """A refetch sends the page's ETag and Last-Modified; sent on to where the page moved,
    a 304 there kept the page "not modified" while its URL served another product."""
    from scrapy import Spider
    from scrapy.http import Response as ScrapyResponse

    from middlewares.limits import RedirectMiddleware

    crawler = get_crawler(Spider)
    crawler.spider = Spider("shop", allowed_domains=["shop.test"])
    mw = RedirectMiddleware.from_crawler(crawler)
    refetch = Request("http://shop.test/product/4", dont_filter=True, headers={
        "If-None-Match": '"6b45"', "If-Modified-Since": "Mon, 07 Dec 2026 03:37:53 GMT",
        "Accept-Language": "en"})
    moved = ScrapyResponse(refetch.url, status=301, headers={"Location": "/product/9"})
    followed = mw.process_response(refetch, moved)
    assert followed.url == "http://shop.test/product/9"
    assert b"If-None-Match" not in followed.headers
    assert b"If-Modified-Since" not in followed.headers
    assert followed.headers[b"Accept-Language"] == b"en"  # the rest goes on


def test_memusage_max_is_the_peak_of_a_crawl_shorter_than_its_interval(web, stores):
    """A probe: a 43 s crawl peaked at 3.9 GB and said ``memusage/max`` 115 MB, its start-up
    size: Scrapy samples once a minute. The peak is read once more as the spider closes,
    and it is the worker's own (``VmHWM``): ``ru_maxrss`` started at this test run's
    650 MB, carried over fork and exec, so no growth below that showed."""
    base = web.base_urls[0]
    flat = "".join(f'<p><a href="/p{i}">link {i}</a> {"text " * 20}</p>' for i in range(60_000))
    web.route("/big", Response.html(f"<html><body>{flat}</body></html>"), host=base)
    result = runner.scrapy(["crawl", "generic", "-a", f"start={base}/big", "-a", "max_pages=1",
                            "-s", "MEMUSAGE_ENABLED=True", "-s", "WEBFARM_RENDER=http"],
                           runner.env_for(**stores), timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    peak = crawlcheck.stat(result.output, "memusage/max")
    startup = crawlcheck.stat(result.output, "memusage/startup")
    assert startup < 400 * MIB and peak - startup > 32 * MIB, (peak, startup)  # a 9 MB page
