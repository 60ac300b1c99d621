"""HTTP first, browser when needed: real crawls, real Chromium, real Valkey and SecantusDB."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
import uuid

import pymongo
import pytest
import redis
import redis.asyncio
from scrapy.settings import Settings

from tests import runner, servers
from tests.fetchapiserver import FetchAPIServer
from tests.testweb import Response, TestWeb
from tests.testweb.jspages import JsSite
from webfarm.blobstore import open_blob_store
from webfarm.queue import open_frontier
from webfarm.redisconn import close_client
from webfarm.rendermemory import HostMemory


def crawl(env, *args: str, timeout: float = 120) -> runner.Result:
    # Browser latency includes rendering: keep the latency rule from slowing the test hosts.
    result = runner.scrapy(["crawl", "generic", "-s", "WEBFARM_AUTOTHROTTLE=False", *args], env,
                           timeout)
    assert result.returncode == 0, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    return result


def stat(result: runner.Result, name: str) -> int:
    found = re.search(rf"'{re.escape(name)}': (\d+)", result.output)
    return int(found.group(1)) if found else 0


def pages(stores) -> dict[str, dict]:
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    return {doc["url"]: doc for doc in db.pages.find()}


def body_of(stores, doc) -> str:
    return open_blob_store(stores["BLOB_STORE_URI"]).get(doc["blob_key"]).decode("utf-8")


def frontier_counts(redis_url: str) -> dict[str, int]:
    settings = Settings({"DUPEFILTER_CLASS": "webfarm.dupefilter.BloomDupeFilter",
                         "SCHEDULER_QUEUE_CLASS": "webfarm.frontier.Frontier"})
    return open_frontier(settings, "generic", redis.Redis.from_url(redis_url)).counts()


def test_auto_renders_only_pages_that_need_javascript(web, stores, redis_url):
    """Host A: a shop where pages 1 and 4 of 6 are JS apps (stays HTTP-first).
    Host B: every page is a JS app (goes browser-first after its first pages)."""
    host_a, host_b = (u.split("//")[1] for u in web.base_urls)
    mixed = JsSite(pages=6, is_js=lambda n: n in (1, 4)).install(web, host_a)
    app = JsSite(pages=8, home_js=True).install(web, host_b)
    env = runner.env_for(**stores, WEBFARM_RENDER_PROBE_RATE="0")
    # One fetch at a time, as a host's politeness delay makes it in production: with
    # HOST_DELAY=0 a host's 8 pages would all be on their way before the memory flips.
    result = crawl(env, "-s", "CONCURRENT_REQUESTS=1", "-a", f"start={mixed.url()},{app.url()}")

    stored = pages(stores)
    assert set(stored) == mixed.all_urls() | app.all_urls()  # links inserted by JS followed too
    assert {doc["fetch_count"] for doc in stored.values()} == {1}  # none stored twice
    for n in range(6):
        doc = stored[mixed.url(n)]
        assert doc["fetch_method"] == ("browser" if n in (1, 4) else "http"), doc["url"]
        assert f"content of page {n}" in body_of(stores, doc)  # the rendered DOM was stored
        assert mixed.renders(mixed.path(n)) == (1 if n in (1, 4) else 0)
    assert stored[mixed.url()]["fetch_method"] == "http"
    # The all-JS host: every page rendered exactly once; after the first two pages were
    # escalated, the memory in Redis sends the rest straight to the browser (no HTTP try).
    assert {stored[u]["fetch_method"] for u in app.all_urls()} == {"browser"}
    paths = [app.path()] + [app.path(n) for n in range(8)]
    assert [app.renders(p) for p in paths] == [1] * 9
    http_tries = sum(app.fetches(p) - app.renders(p) for p in paths)
    assert http_tries == 2, [app.fetches(p) for p in paths]
    memory = redis.Redis.from_url(redis_url).hgetall(f"webfarm:{{generic}}:render:{host_b}")
    assert memory[b"mode"] == b"browser"
    assert redis.Redis.from_url(redis_url).pttl(f"webfarm:{{generic}}:render:{host_b}") > 0

    assert stat(result, "webfarm/render/escalated") == 2 + 2
    assert stat(result, "webfarm/render/browser") == 2 + 9
    assert stat(result, "webfarm/render/http") == 5
    assert stat(result, "webfarm/render/wrong_guess") == 0
    assert stat(result, "playwright/page_count/closed") == stat(result, "playwright/page_count")
    # Escalation went back through the frontier: every lease acknowledged, nothing left over.
    counts = frontier_counts(redis_url)
    assert (counts["queued"], counts["leased"], counts["delayed"], counts["dead"]) == (0, 0, 0, 0)


def test_an_empty_widget_root_beside_plenty_of_text_stops_sending_pages_to_the_browser(
        web, stores, redis_url):
    """A server-rendered site with an empty ``<div id="root">`` on every page (a chat
    widget's mount point): every page was escalated, the host went browser-first after
    two, and every page was rendered for nothing ever after."""
    base = web.base_urls[0]
    text = "<p>" + "Server-rendered words about this product, its uses and its care. " * 8
    links = "".join(f'<a href="/w/{n}">page {n}</a> ' for n in range(8))

    def page(info):
        return Response.html(f"<!doctype html><html><head><title>{info.path}</title></head>"
                             f"<body><h1>{info.path}</h1>{text}</p><nav>{links}</nav>"
                             '<div id="root"></div><script>window.widget = 1;</script>'
                             "</body></html>")

    web.route("/w/", page, host=base)
    env = runner.env_for(**stores, WEBFARM_RENDER_PROBE_RATE="0")
    result = crawl(env, "-s", "CONCURRENT_REQUESTS=1", "-a", f"start={base}/w/home")
    stored = pages(stores)
    assert len(stored) == 9
    methods = [doc["fetch_method"] for doc in stored.values()]
    assert methods.count("browser") == 1, methods  # the one that showed the sign misleads
    assert stat(result, "webfarm/render/wrong_guess") == 1
    memory = redis.Redis.from_url(redis_url).hget(
        f"webfarm:{{generic}}:render:{base.split('//')[1]}", "mode")
    assert memory == b"http"
    assert result.output.count("an empty app root is no sign of JavaScript there") == 1

    # Another worker, on pages of that host it has not met: it knows from Redis, and
    # renders none (each worker paid a render of its own to learn it, and the host swung
    # back to browser-first while the others had not).
    web.route("/v/", page, host=base)
    crawl(env, "-s", "CONCURRENT_REQUESTS=1", "-a", f"start={base}/v/home,{base}/v/1")
    methods = [doc["fetch_method"] for doc in pages(stores).values()
               if "/v/" in doc["url"]]
    assert methods == ["http", "http"], methods


def test_probe_notices_a_host_that_stopped_needing_javascript(web, stores, redis_url):
    host = web.base_urls[0].split("//")[1]
    site = JsSite(pages=8).install(web, host)
    site.js = False  # the host was redesigned: plain HTML now
    memory = HostMemory(redis.Redis.from_url(redis_url), "generic", 3600)
    assert asyncio.run(observe_all(memory, host, [True, True])) == ["http", "browser"]
    env = runner.env_for(**stores, WEBFARM_RENDER_PROBE_RATE="0.5")
    # One fetch at a time (a politeness delay's effect), so the flip is seen by the rest.
    result = crawl(env, "-s", "CONCURRENT_REQUESTS=1", "-a", f"start={site.url()}")

    assert memory.server.hget(memory.key(host), "mode") == b"http"
    assert stat(result, "webfarm/render/probes") == 1
    assert stat(result, "webfarm/render/wrong_guess") == 1
    stored = pages(stores)
    assert set(stored) == site.all_urls()
    methods = [doc["fetch_method"] for doc in stored.values()]
    assert methods.count("browser") == 1 and methods.count("http") == 8  # home, then flipped


async def observe_all(memory: HostMemory, host: str, needed: list[bool]) -> list[str]:
    return [await memory.observe(host, js) for js in needed]


async def until(check, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not seen in time"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("client_kind", ["asyncio", "blocking"])
def test_plain_pages_are_counted_in_batches_and_a_js_page_at_once(redis_url, client_kind):
    """A page that did not need JavaScript on an http host cannot change its mode: it is
    counted with others in one round trip (in the background on asyncio, webfarm's
    reactor). One that needed it goes to Redis at once, after the ones counted before it.
    The blocking client is what a crawl under another reactor gets."""
    client = redis.Redis.from_url(redis_url)
    host = f"batch-{uuid.uuid4().hex[:8]}.test"
    key = f"webfarm:{{generic}}:render:{host}"

    def ok() -> bytes | None:
        return client.hget(key, "ok")

    async def scenario() -> None:
        make = redis.asyncio.Redis.from_url if client_kind == "asyncio" else redis.Redis.from_url
        memory = HostMemory(make(redis_url), "generic", 3600, min_pages=2, share=0.2,
                            batch_size=5, batch_seconds=60)
        assert await memory.observe(host, False) == "http"  # unknown host: asked at once
        assert ok() == b"1"
        assert await observe_all(memory, host, [False] * 3) == ["http"] * 3
        assert ok() == b"1"  # counted, not sent yet
        assert await memory.observe(host, True) == "http"  # sent with the 3 before it
        assert (ok(), client.hget(key, "js")) == (b"4", b"1")
        await observe_all(memory, host, [False] * 5)  # the fifth fills the batch
        await until(lambda: ok() == b"9")  # sent without a flush
        await memory.observe(host, False)
        await memory.flush()  # what the middleware does when the spider closes
        assert ok() == b"10"
        # Another worker's pages flip the host to the browser; this worker's plain pages,
        # once sent, flip it back (an HTTP fetch that was enough), as one observation would.
        other = HostMemory(make(redis_url), "generic", 3600, min_pages=2, share=0.2)
        assert await observe_all(other, host, [True, True]) == ["http", "browser"]
        await memory.observe(host, False)  # this worker still holds "http"
        await memory.flush()
        assert client.hget(key, "mode") == b"http"
        await close_client(memory.server)
        await close_client(other.server)

    asyncio.run(scenario())


def test_requests_asking_a_hosts_mode_together_share_one_read(redis_url):
    """Sixteen requests to a host this worker has no fresh mode for ask together: one HMGET
    (its mode and marks) goes to Redis, and all get its answer (another worker's
    "browser")."""
    client = redis.Redis.from_url(redis_url)
    host = f"read-{uuid.uuid4().hex[:8]}.test"
    client.hset(f"webfarm:{{generic}}:render:{host}", "mode", "browser")

    def hgets() -> int:
        return int(client.info("commandstats").get("cmdstat_hmget", {}).get("calls", 0))

    async def scenario() -> list[str]:
        memory = HostMemory(redis.asyncio.Redis.from_url(redis_url), "generic", 3600)
        try:
            return list(await asyncio.gather(*(memory.mode(host) for _ in range(16))))
        finally:
            await close_client(memory.server)

    before = hgets()
    assert asyncio.run(scenario()) == ["browser"] * 16
    assert hgets() - before == 1


def test_render_memory_without_redis_decides_from_what_it_knows(caplog):
    """No Redis behind the memory: hosts are fetched over HTTP (or as last known), nothing
    raises, and the outage is one logged line."""
    from tests import servers
    from webfarm.redisconn import CLIENT_OPTIONS

    async def scenario() -> list[str]:
        client = redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{servers.free_port()}",
                                              **CLIENT_OPTIONS)
        memory = HostMemory(client, "generic", 3600, batch_size=2)
        try:
            got = [await memory.mode("a.test"), await memory.observe("a.test", True)]
            await memory.remember("b.test", "api")  # kept here, at least
            got.append(await memory.mode("b.test"))
            await memory.flush()
            return got
        finally:
            await close_client(client)

    assert asyncio.run(scenario()) == ["http", "http", "api"]
    lines = [r for r in caplog.records if "Render memory: Redis unreachable" in r.getMessage()]
    assert len(lines) == 1


def test_render_check_selector_escalates_pages_missing_it(web, stores):
    host = web.base_urls[1].split("//")[1]
    site = JsSite(pages=4, is_js=lambda n: n % 2 == 1, style="widget").install(web, host)
    env = runner.env_for(**stores)
    result = crawl(env, "-a", f"start={site.url()}", "-a", "render_check=div.product p")

    stored = pages(stores)
    for n in range(4):
        doc = stored[site.url(n)]
        assert doc["fetch_method"] == ("browser" if n % 2 else "http")
        assert f"content of page {n}" in body_of(stores, doc)
    assert stat(result, "webfarm/render/escalated") == 2


def test_a_render_waits_for_the_render_check_selector(web, stores):
    """A page whose script fetches its content after load: the browser read it at load,
    without the content; it was stored so, and counted as a wrong guess."""
    base = web.base_urls[0]
    web.route("/late", Response.html(
        "<!doctype html><html><head><title>late</title></head><body><div id='app'></div>"
        "<script>setTimeout(function () { document.getElementById('app').innerHTML = "
        "'<h1>Spade</h1><span class=price>12.50</span>'; }, 1200);</script></body></html>"),
        host=base, prefix=False)
    web.route("/never", Response.html(
        "<!doctype html><html><head><title>never</title></head><body><div id='app'></div>"
        "<script>window.x = 1;</script></body></html>"), host=base, prefix=False)
    result = crawl(runner.env_for(**stores, WEBFARM_RENDER_PROBE_RATE="0"),
                   "-a", f"start={base}/late,{base}/never", "-a", "render_check=span.price",
                   "-s", "WEBFARM_RENDER_CHECK_WAIT=3")
    stored = pages(stores)
    assert 'class="price">12.50' in body_of(stores, stored[f"{base}/late"])  # not the script's
    assert stored[f"{base}/late"]["fetch_method"] == "browser"
    assert stored[f"{base}/never"]["fetch_method"] == "browser"  # read as it stands
    assert stat(result, "webfarm/render/check_wait_timeouts") == 1
    assert stat(result, "webfarm/render/wrong_guess") == 1  # /never only


def test_a_page_sent_for_its_empty_app_root_is_read_once_the_root_is_filled(web, stores):
    """A probe: pages filling their app root after load (a 300 ms timer, a fetch of JSON)
    were rendered, read at load with the root still empty, stored so, and counted as
    wrong guesses; the host then took empty roots for no sign at all. With no
    render_check, such a render now waits for the root to hold an element."""
    base = web.base_urls[0]
    web.route("/timer", Response.html(
        "<!doctype html><html><head><title>timer</title></head><body><div id='root'></div>"
        "<script>setTimeout(function () { document.getElementById('root').innerHTML = "
        "'<h1>Rake</h1><p>made by a timer after load</p>'; }, 300);</script></body></html>"),
        host=base, prefix=False)
    web.route("/fetched", Response.html(
        "<!doctype html><html><head><title>fetched</title></head><body><div id='app'></div>"
        "<script>fetch('/data.json').then(r => r.json()).then(d => {"
        "document.getElementById('app').innerHTML = '<h1>' + d.name + '</h1>'; });"
        "</script></body></html>"), host=base, prefix=False)
    web.route("/data.json", Response(200, {"Content-Type": "application/json"},
                                     b'{"name": "Hoe from the API"}'), host=base, prefix=False)
    result = crawl(runner.env_for(**stores, WEBFARM_RENDER_PROBE_RATE="0"),
                   "-a", f"start={base}/timer,{base}/fetched")
    stored = pages(stores)
    assert "made by a timer after load" in body_of(stores, stored[f"{base}/timer"])
    assert "Hoe from the API" in body_of(stores, stored[f"{base}/fetched"])
    assert {stored[u]["fetch_method"] for u in (f"{base}/timer", f"{base}/fetched")} == {
        "browser"}
    assert stat(result, "webfarm/render/wrong_guess") == 0
    assert stat(result, "webfarm/render/check_wait_timeouts") == 0


@pytest.mark.serial
def test_the_host_delay_holds_between_http_fetches_and_the_host_s_first_render(web, stores):
    """A probe: on a site mixing plain and JavaScript pages, an HTTP request handed out
    after a render's reached the host 0.23-0.83 s before the render at a 1 s delay: the
    host's first render was spaced from the last render only, and there was none.
    (Timing at the server: marked serial.)"""
    host = web.base_urls[1].split("//")[1]
    site = JsSite(pages=6, is_js=lambda n: n in (1, 4), prefix="/m/").install(web, host)
    result = crawl(runner.env_for(**stores, WEBFARM_HOST_DELAY="0.8",
                                  WEBFARM_RENDER_PROBE_RATE="0"), "-a", f"start={site.url()}")
    assert result.returncode == 0, result.output[-2000:]
    assert stat(result, "webfarm/render/browser") == 2
    pages_at = sorted(h.monotonic for h in web.hits_for(host=host)
                      if h.path.startswith(site.prefix))  # not robots.txt, app.js, favicon
    gaps = [b - a for a, b in zip(pages_at, pages_at[1:], strict=False)]
    assert len(pages_at) == 9, pages_at  # home, 6 pages, 2 renders
    short = [g for g in gaps if g < 0.8 * 0.9]
    assert len(short) <= 1 and min(gaps) > 0.5, sorted(gaps)[:4]


def test_a_render_check_no_page_matches_is_said_once(web, stores):
    """A slip in the selector sends every page to the browser, for nothing; it was said
    at INFO, page by page, as 'the browser added nothing'."""
    host = web.base_urls[1].split("//")[1]
    site = JsSite(pages=3, is_js=lambda n: False, style="widget").install(web, host)
    result = crawl(runner.env_for(**stores), "-a", f"start={site.url()}",
                   "-a", "render_check=div.prodcut p", "-s", "WEBFARM_RENDER_CHECK_WAIT=0.5",
                   "-s", "CONCURRENT_REQUESTS=1")  # one render at a time: each learns
    assert stat(result, "webfarm/render/wrong_guess") >= 2
    assert result.output.count("render_check 'div.prodcut p' matches neither") == 1
    assert "fix the spider's render_check" in result.output
    assert stat(result, "webfarm/render/check_wait_timeouts") == 2  # then no more waits

    # Another worker, on pages of that host it has not met, in the browser: it knows the
    # selector never came there (it waited twice again, and said so again).
    other = JsSite(pages=1, is_js=lambda n: False, style="widget", prefix="/b/").install(
        web, host)
    again = crawl(runner.env_for(**stores), "-a", f"start={other.url()}", "-a", "render=browser",
                  "-a", "render_check=div.prodcut p", "-s", "WEBFARM_RENDER_CHECK_WAIT=0.5")
    assert stat(again, "webfarm/render/browser") == 2
    assert stat(again, "webfarm/render/check_wait_timeouts") == 0
    assert "did not appear" not in again.output
    # Each render waited for the selector, until two of the host's had waited in vain.
    renders = stat(result, "webfarm/render/browser")
    assert renders >= 3 and stat(result, "webfarm/render/check_wait_timeouts") == 2
    assert result.output.count("did not appear in 2 renders of") == 1


# -- the fetch API rung (tests/fetchapiserver.py speaks the contract) -----------------------

def frontier(redis_url: str):
    settings = Settings({"DUPEFILTER_CLASS": "webfarm.dupefilter.BloomDupeFilter",
                         "SCHEDULER_QUEUE_CLASS": "webfarm.frontier.Frontier"})
    return open_frontier(settings, "generic", redis.Redis.from_url(redis_url))


def redis_dump(redis_url: str) -> str:
    client = redis.Redis.from_url(redis_url)
    out = []
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        value = {"string": client.get, "hash": client.hgetall, "list": lambda k: client.lrange(
            k, 0, -1), "zset": lambda k: client.zrange(k, 0, -1, withscores=True),
                 "set": client.smembers}.get(kind, lambda k: b"")(key)
        out.append(f"{key!r} {value!r}")
    return "\n".join(out)


def test_fetch_api_hosts_go_through_the_api(web, stores, redis_url):
    key = f"sk-live-{uuid.uuid4().hex}"
    site = JsSite(pages=3, is_js=lambda n: False).install(web, web.base_urls[0])
    with FetchAPIServer(key) as api:
        api.fail_first[site.url(0)] = 1  # 503 once: back to the frontier, then fine
        api.bad_json.add(site.url(2))  # broken JSON: dead-lettered with the reason
        env = runner.env_for(**stores, WEBFARM_FETCH_API_URL=api.url, WEBFARM_FETCH_API_KEY=key,
                             WEBFARM_FETCH_API_HOSTS=site.host)
        result = crawl(env, "-a", f"start={site.url()}", "-s", "WEBFARM_RETRY_BACKOFF_BASE=0.2")
        calls = list(api.calls)

    stored = pages(stores)
    assert set(stored) == {site.url(), site.url(0), site.url(1)}, result.output[-6000:]
    for doc in stored.values():
        assert doc["fetch_method"] == "api" and doc["status"] == 200
        assert "content of" in body_of(stores, doc)
    assert all(ok for _, ok in calls) and [u for u, _ in calls].count(site.url(0)) == 2
    # Only the API fetched the pages (the crawler itself fetched robots.txt at most).
    crawler_hits = [h for h in web.hits_for(host=site.host) if "webfarm" in
                    h.headers.get("user-agent", "") and h.path != "/robots.txt"]
    assert crawler_hits == []
    dead = frontier(redis_url).dead_letters()
    assert [d["reason"] for d in dead] == [dead[0]["reason"]] and "not JSON" in dead[0]["reason"]
    assert site.url(2) in dead[0]["payload"]
    assert stat(result, "webfarm/render/api") == 3
    # No page needed a browser: neither Playwright's driver nor Chromium was started.
    assert "Launching Chromium" not in result.output
    assert stat(result, "playwright/browser_count") == 0
    assert stat(result, "webfarm/render/api_failed") == 2
    # The key never leaves the process: not in logs, stats, Redis or the index.
    assert key not in result.output
    assert key not in redis_dump(redis_url)
    assert key not in repr(list(stored.values()))


def test_browser_failure_falls_back_to_the_api_and_is_remembered(web, stores, redis_url):
    """No Chromium: one clear line; the fetch API delivers the page, and the host's
    later pages go straight to the API (neither an HTTP try nor the browser)."""
    key = f"sk-{uuid.uuid4().hex}"
    site = JsSite(pages=4).install(web, web.base_urls[1])
    with FetchAPIServer(key) as api:
        env = runner.env_for(**stores, WEBFARM_FETCH_API_URL=api.url, WEBFARM_FETCH_API_KEY=key,
                             WEBFARM_CHROMIUM="/nonexistent/chromium",
                             WEBFARM_RENDER_PROBE_RATE="0")
        # Start at a JS page: its links exist only once it is rendered, so the others
        # are found after the host's rung was learned.
        result = crawl(env, "-a", f"start={site.url(0)}")
        calls = [u for u, _ in api.calls]
    stored = pages(stores)
    assert set(stored) == {site.url(n) for n in range(4)}
    assert {d["fetch_method"] for d in stored.values()} == {"api"}
    assert sorted(calls) == sorted(stored)  # one API call per page
    crawler_hits = [h.path for h in web.hits_for(host=site.host)
                    if "webfarm" in h.headers.get("user-agent", "") and h.path != "/robots.txt"]
    assert crawler_hits == [site.path(0)]  # only the first page was tried over HTTP
    assert stat(result, "webfarm/render/browser_failed") == 1
    assert stat(result, "webfarm/render/escalated") == 1
    assert redis.Redis.from_url(redis_url).hget(
        f"webfarm:{{generic}}:render:{site.host.split('//')[1]}", "mode") == b"api"
    assert result.output.count("WEBFARM_CHROMIUM='/nonexistent/chromium' is not an executable "
                               "file; fix it or unset it") == 1


def test_one_page_the_browser_fails_does_not_send_its_host_to_the_fetch_api(web, stores,
                                                                            redis_url):
    """One page slow to answer timed the browser out; the fetch API delivered it, and
    the host was remembered as an API host: every later page of a site the browser
    renders fine went to the paid API."""
    key = f"sk-{uuid.uuid4().hex}"
    site = JsSite(pages=3).install(web, web.base_urls[1])

    def slow_page(info):
        time.sleep(2.5)  # past the browser's 1.5 s navigation timeout
        return Response.html(
            '<!doctype html><html><head><title>hang</title></head><body><div id="app"></div>'
            '<script>document.getElementById("app").innerHTML = "<h1>Hang</h1><p>built at '
            'once</p>";</script></body></html>')

    web.route("/hang", slow_page, host=site.host, prefix=False)
    with FetchAPIServer(key) as api:
        env = runner.env_for(**stores, WEBFARM_FETCH_API_URL=api.url, WEBFARM_FETCH_API_KEY=key,
                             WEBFARM_RENDER_PROBE_RATE="0")
        starts = ",".join([f"{site.url().rstrip('/')}/hang", *(site.url(n) for n in range(3))])
        # Not crawl(): scrapy-playwright logs the timed-out page's traceback itself.
        result = runner.scrapy(["crawl", "generic", "-a", f"start={starts}", "-s",
                                "PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT=1500", "-s",
                                "WEBFARM_HOST_DELAY=0", "-s", "WEBFARM_AUTOTHROTTLE=False"],
                               env, 120)
        assert result.returncode == 0, result.output[-3000:]
        calls = [u for u, _ in api.calls]
    assert calls == [f"{site.url().rstrip('/')}/hang"], result.output[-3000:]
    assert stat(result, "webfarm/render/browser_failed") == 1
    mode = redis.Redis.from_url(redis_url).hget(
        f"webfarm:{{generic}}:render:{site.host.split('//')[1]}", "mode")
    assert mode != b"api"


def test_a_rendered_page_with_half_a_surrogate_pair_is_stored(web, stores, redis_url):
    """A JavaScript string may hold half a surrogate pair (a cut emoji); the DOM keeps it
    and scrapy-playwright could not encode the page: a failed download, rendered again
    WEBFARM_RETRY_TIMES times, then dead-lettered."""
    base = web.base_urls[0]
    web.route("/cut-emoji", Response.html(
        "<html><body><p id='x'>loading</p><script>document.getElementById('x')"
        ".textContent = 'great ' + String.fromCharCode(0xD83D);</script></body></html>"),
        host=base)
    crawl(runner.env_for(**stores), "-a", f"start={base}/cut-emoji", "-a", "render=browser",
          "-a", "max_pages=1")
    doc = pages(stores)[f"{base}/cut-emoji"]
    assert doc["fetch_method"] == "browser" and doc["status"] == 200
    raw = open_blob_store(stores["BLOB_STORE_URI"]).get(doc["blob_key"])
    assert b"great \xed\xa0\xbd</p>" in raw  # the code unit's bytes; read as U+FFFD
    assert frontier(redis_url).dead_letters() == []
    assert len(web.hits_for(host=base, path="/cut-emoji")) == 1


def test_a_pdf_or_json_of_a_browser_first_host_is_stored_as_its_bytes(web, stores, redis_url):
    """Chromium shows a PDF, JSON or text in a viewer of its own: through the browser, a
    PDF was stored as the viewer's empty placeholder and JSON wrapped in <pre>, with the
    content type still saying application/pdf or application/json."""
    base = web.base_urls[0]
    pdf = b"%PDF-1.4\n1 0 obj <<>> endobj\ntrailer <<>>\n%%EOF\n"
    files = {"/doc.pdf": ("application/pdf", pdf),
             "/items.json": ("application/json", b'[{"sku": "A1", "price": 3}]'),
             "/notes.txt": ("text/plain; charset=utf-8", b"plain notes\n")}
    web.route("/files", Response.html("<html><body><p>Files</p></body></html>"), host=base,
              prefix=False)
    for path, (ctype, body) in files.items():
        web.route(path, Response(200, {"Content-Type": ctype}, body), host=base, prefix=False)
    # Start URLs: Scrapy's link extractor leaves .pdf links alone.
    starts = ",".join(f"{base}{path}" for path in ["/files", *files])
    result = crawl(runner.env_for(**stores), "-a", f"start={starts}", "-a", "render=browser")
    stored = pages(stores)
    blobs = open_blob_store(stores["BLOB_STORE_URI"])
    for path, (ctype, body) in files.items():
        assert f"{base}{path}" in stored, result.output[-4000:]
        doc = stored[f"{base}{path}"]
        assert blobs.get(doc["blob_key"]) == body, path
        assert doc["fetch_method"] == "http" and doc["content_type"].startswith(ctype[:9])
    assert stored[f"{base}/files"]["fetch_method"] == "browser"  # the HTML page still is
    assert stat(result, "webfarm/render/not_html") == 3
    assert frontier(redis_url).dead_letters() == []


def test_a_render_that_waited_for_a_browser_page_goes_back_without_an_attempt(web, stores,
                                                                              redis_url):
    """With every page of the browser context busy, a render waited for one, and its time
    ran out before the host saw a request: it was dead-lettered as a page "whose
    JavaScript does not let go", and a start page lost that way lost the whole site."""
    base = web.base_urls[0]

    def slow(info):
        time.sleep(1.5)
        return Response.html(f"<html><body><p>page {info.path}</p></body></html>")

    web.route("/slow/", slow, host=base)
    starts = ",".join(f"{base}/slow/{i}" for i in range(4))
    result = crawl(runner.env_for(**stores, WEBFARM_HOST_DELAY="0"), "-a", f"start={starts}",
                   "-a", "render=browser", "-s", "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT=1",
                   "-s", "DOWNLOAD_TIMEOUT=1", "-s", "PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT=2000",
                   "-s", "WEBFARM_RETRY_TIMES=1")
    assert frontier(redis_url).dead_letters() == []
    assert set(pages(stores)) == {f"{base}/slow/{i}" for i in range(4)}
    assert stat(result, "webfarm/render/slot_waits") >= 1
    assert stat(result, "webfarm/render/timeouts") == 0


def test_a_spider_written_for_scrapy_playwright_queues_its_page_methods(web, stores, redis_url):
    """``PageMethod("wait_for_selector", ...)`` in a request's meta: before, such a request
    could not be queued ("cannot queue a PageMethod") and was dropped."""
    base = web.base_urls[0]
    late = ("<html><body><p>early</p><script>setTimeout(function () {"
            "var p = document.createElement('p'); p.id = 'late'; p.textContent = 'arrived late';"
            " document.body.appendChild(p); }, 700);</script></body></html>")
    web.route("/late", Response.html(late), host=base)
    web.route("/late-too", Response.html(late), host=base)
    result = runner.scrapy(["crawl", "test_page_methods", "-s", "WEBFARM_AUTOTHROTTLE=False",
                            "-s", "SPIDER_MODULES=spiders,tests.spiders",
                            "-a", f"start={base}/late,{base}/late-too"],
                           runner.env_for(**stores), 120)
    assert result.returncode == 0 and "Traceback" not in result.output, result.output[-3000:]
    assert "Cannot queue" not in result.output
    stored = pages(stores)
    waited, plain = stored[f"{base}/late"], stored[f"{base}/late-too"]
    assert waited["fetch_method"] == plain["fetch_method"] == "browser"
    added = '<p id="late">arrived late</p>'  # in the DOM; the script spells it otherwise
    assert added in body_of(stores, waited)  # the page method ran in the browser
    assert added not in body_of(stores, plain)  # (it is what made the difference)


@pytest.mark.parametrize(("how", "reason"), [
    ("no Chromium on PATH", "no Chromium was found on PATH"),
    # Before: Playwright tried the path anew for each page, each try a traceback.
    ("a wrong executable_path", "PLAYWRIGHT_LAUNCH_OPTIONS executable_path="
                                "'/nonexistent/chrome' is not an executable file"),
])
def test_missing_chromium_dead_letters_with_the_reason(web, stores, redis_url, tmp_path, how,
                                                       reason):
    site = JsSite(pages=1).install(web, web.base_urls[0])
    empty = tmp_path / "bin"
    empty.mkdir()
    if how == "no Chromium on PATH":
        env = runner.env_for(**stores, PATH=f"{empty}:{runner.SCRAPY[0].rsplit('/', 1)[0]}")
        args = ()
    else:
        env = runner.env_for(**stores)
        args = ("-s", 'PLAYWRIGHT_LAUNCH_OPTIONS={"executable_path": "/nonexistent/chrome"}')
    result = crawl(env, "-a", f"start={site.url()}", "-a", "render=browser", *args)
    assert pages(stores) == {}
    dead = frontier(redis_url).dead_letters()
    assert len(dead) == 1 and reason in dead[0]["reason"], dead
    assert "make chromium" in dead[0]["reason"] or "fix it, or remove it" in dead[0]["reason"]
    assert stat(result, "webfarm/render/browser_failed") <= 1


def test_browser_subresources_pass_the_ssrf_guard_and_useless_renders_count(web, stores,
                                                                            redis_url):
    """A rendered page's script from a non-allowed address is never fetched; a browser
    redirected to one stores nothing and dead-letters the page; a page whose app never
    renders is escalated once and counted as a wrong guess."""
    with TestWeb(hosts=("127.0.0.5",)) as internal:
        host, browser_host = web.base_urls
        page = ("<!doctype html><html><head><title>t</title>"
                f'<script src="{internal.base_urls[0]}/admin.js"></script></head><body>'
                '<div id="app"></div><script>document.getElementById("app").innerHTML = '
                '"<p>content of the app</p><a href=/broken>next</a>";'
                f'window.open("{internal.base_urls[0]}/popup");</script></body></html>')
        broken = '<!doctype html><html><body><div id="root"></div></body></html>'
        web.route("/app", Response.html(page), host=host)
        web.route("/broken", Response.html(broken), host=host)
        web.route("/jump", Response(302, {"Location": f"{internal.base_urls[0]}/secret"}),
                  host=browser_host)
        env = runner.env_for(**stores, WEBFARM_ALLOWED_NETWORKS="127.0.0.2/31",
                             WEBFARM_RENDER_HOSTS=f"{browser_host.split('//')[1]}=browser")
        result = crawl(env, "-a", f"start={host}/app,{browser_host}/jump")
        assert internal.hits_for(path="/admin.js") == []
        assert internal.hits_for(path="/popup") == []  # a popup's request went out unchecked
    stored = pages(stores)
    assert set(stored) == {f"{host}/app", f"{host}/broken"}  # nothing of /jump's target
    app, broken_doc = stored[f"{host}/app"], stored[f"{host}/broken"]
    assert app["fetch_method"] == "browser" and "content of the app" in body_of(stores, app)
    assert broken_doc["fetch_method"] == "browser"
    (dead,) = frontier(redis_url).dead_letters()
    assert dead["reason"].startswith(f"ssrf: browser redirected to {internal.base_urls[0]}")
    assert stat(result, "webfarm/render/browser_refused") == 2  # the script, the redirect
    assert stat(result, "webfarm/render/escalated") == 2
    assert stat(result, "webfarm/render/wrong_guess") == 1  # /broken: the browser added nothing
    assert stat(result, "webfarm/render/popups") == 1  # closed as it opened


def test_a_page_whose_load_event_never_comes_is_kept_as_built(web, stores, redis_url):
    """A script that never finishes loading keeps the load event away: the render timed
    out though the page was built at once, and after its tries the page was a dead
    letter. A document that sits parsed is kept; one still being parsed is not."""
    released = threading.Event()
    base = web.base_urls[0]

    def never(info):  # a tracker that never answers (released as the test ends)
        released.wait(30)
        return Response.text("window.late = 1;", content_type="application/javascript")

    web.route("/never.js", never, host=base)
    web.route("/built", Response.html(
        '<!doctype html><html><head><title>built</title><script async src="/never.js">'
        '</script></head><body><div id="app"></div><script>document.getElementById("app")'
        '.innerHTML = "<h1>Built</h1><p>built at once</p>";</script></body></html>'),
        host=base, prefix=False)
    web.route("/blocked", Response.html(  # a script in the way of the document's parsing
        '<!doctype html><html><head><title>blocked</title><script src="/never.js?b">'
        '</script></head><body><p>never parsed</p></body></html>'), host=base, prefix=False)
    try:
        result = runner.scrapy(["crawl", "generic", "-a", f"start={base}/built,{base}/blocked",
                                "-a", "render=browser", "-s",
                                "PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT=1500", "-s",
                                "WEBFARM_RETRY_TIMES=1"], runner.env_for(**stores), 120)
    finally:
        released.set()
    assert result.returncode == 0, result.output[-3000:]
    stored = pages(stores)
    assert set(stored) == {f"{base}/built"}
    assert "built at once" in body_of(stores, stored[f"{base}/built"])
    assert stored[f"{base}/built"]["fetch_method"] == "browser"
    assert stat(result, "webfarm/render/load_timeouts") == 1
    assert result.output.count("the page's load event did not come") == 1
    (dead,) = frontier(redis_url).dead_letters()
    assert f"{base}/blocked" in dead["payload"] and "Timeout" in dead["reason"], dead


def test_a_render_that_never_lets_go_is_closed_and_dead_lettered(web, stores, redis_url):
    """A script that loops once the page has loaded: Playwright bounds the navigation,
    not reading the page, so the render never ended, the worker never stopped and the
    next worker to take the lease hung the same way."""
    base = web.base_urls[0]
    web.route("/spin", Response.html(
        "<html><body><div id='app'>loaded</div><script>window.addEventListener('load', "
        "function () { setTimeout(function () { while (true) {} }, 0); });</script>"
        "</body></html>"), host=base)
    started = time.monotonic()
    result = crawl(runner.env_for(**stores), "-a", f"start={base}/spin", "-a", "render=browser",
                   "-s", "DOWNLOAD_TIMEOUT=2", "-s", "PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT=2000",
                   "-s", "WEBFARM_RETRY_TIMES=1", timeout=90)
    assert time.monotonic() - started < 60
    (dead,) = frontier(redis_url).dead_letters()
    assert "the render took over 4s (DOWNLOAD_TIMEOUT and the navigation timeout)" in \
        dead["reason"]
    assert stat(result, "webfarm/render/timeouts") == 1
    assert pages(stores) == {}
    # the mode in force first ("mode auto (spider: browser)" read as if auto were)
    assert "Render: mode browser (the spider's render; WEBFARM_RENDER auto)" in result.output


def test_a_script_s_navigation_keeps_robots_txt_and_the_page_its_own_url(web, stores,
                                                                        redis_url):
    """A page's script that sends the browser elsewhere: to a path robots.txt disallows,
    it was followed there and that page stored in place of the one asked for (which was
    never recorded). Now the navigation is refused, and the page dead-lettered saying so;
    to an allowed path, the page is stored under the URL asked for, ending where it went."""
    base = web.base_urls[0]
    web.route("/robots.txt", Response.text("User-agent: *\nDisallow: /private/\n"),
              host=base)
    for name, target in (("go-private", "/private/away"), ("go-public", "/public/landing")):
        web.route(f"/{name}", Response.html(
            f"<html><body><p>moving</p><script>location.href = '{target}';</script>"
            "</body></html>"), host=base)
    web.route("/public/landing", Response.html("<html><body><p>landed</p></body></html>"),
              host=base)
    # and a script that builds a page past DOWNLOAD_MAXSIZE: stored, where the wire's
    # limit never saw it
    web.route("/big", Response.html("<html><body><script>document.body.textContent = "
                                    "'x'.repeat(300000);</script></body></html>"), host=base)
    crawl(runner.env_for(**stores), "-a", f"start={base}/go-private,{base}/go-public,{base}/big",
          "-a", "render=browser", "-s", "DOWNLOAD_MAXSIZE=200000")
    assert web.hits_for(host=base, path="/private/away") == []
    stored = pages(stores)
    assert set(stored) == {f"{base}/go-public"}
    assert stored[f"{base}/go-public"]["final_url"] == f"{base}/public/landing"
    assert "landed" in body_of(stores, stored[f"{base}/go-public"])
    dead = {json.loads(d["payload"])["url"]: d["reason"]
            for d in frontier(redis_url).dead_letters()}
    assert dead == {
        f"{base}/go-private": f"robots.txt disallows {base}/private/away, where the page's "
                              "browser navigation went",
        f"{base}/big": "body over DOWNLOAD_MAXSIZE: the rendered page is 300039 B, past "
                       "200000 B"}


# -- the judgement and the configuration, without a crawl -----------------------------------

def html_response(body: str, status: int = 200):
    from scrapy.http import HtmlResponse

    return HtmlResponse("http://shop.example/p", status=status, body=body.encode(),
                        headers={"Content-Type": "text/html; charset=utf-8"})


def test_needs_js_signs():
    from webfarm.render import needs_js

    words = "<p>" + "A sturdy spade with an ash handle. " * 20 + "</p>"
    assert needs_js(html_response('<body><div id="root"></div><script></script></body>')) \
        == "empty app root #root"
    assert needs_js(html_response("<body><noscript>Please enable JavaScript to continue"
                                  "</noscript><p>Loading shop</p></body>")) \
        == "noscript asks for JavaScript"
    assert needs_js(html_response("<body><p>Loading…</p><script src=app.js></script></body>")
                    ).startswith("almost no visible text")
    assert needs_js(html_response(f"<body>{words}<script src=a.js></script></body>")) is None
    # Where an empty root misled before (a widget's mount point), a page with text passes;
    # an app shell with little text still does not.
    widget = html_response(f'<body>{words}<div id="root"></div></body>')
    assert needs_js(widget) == "empty app root #root"
    assert needs_js(widget, root_misleads=True) is None
    assert needs_js(html_response('<body><p>Shop</p><div id="root"></div></body>'),
                    root_misleads=True) == "empty app root #root"
    assert needs_js(html_response("<body><p>Short page, no scripts.</p></body>")) is None
    # A short page is not an app shell because of analytics or JSON-LD (the test web's
    # about page: 191 characters and a dataLayer script).
    short = "<p>" + "About our shop: tools since 1990. " * 4 + "</p>"
    assert needs_js(html_response(f"<body>{short}<script>dataLayer=[]</script></body>")) is None
    assert needs_js(html_response('<body><p>Hi</p><script type="application/ld+json">{}'
                                  "</script></body>")) is None
    assert needs_js(html_response('<body><div id="app"></div></body>', status=404)) is None
    # A spider's check replaces the built-in signs.
    assert needs_js(html_response(f"<body>{words}</body>"), "span.price") \
        == "render_check 'span.price' not found"
    assert needs_js(html_response('<div id="app"></div><span class="price">3</span>'),
                    "span.price") is None
    assert needs_js(html_response(words), lambda r: b"spade" in r.body) is None


def test_visible_text_counts_the_body_outside_scripts_styles_and_templates():
    """What a page shows, counted in one walk: the XPath before took time with the square
    of the page (2.3 s for 20,000 paragraphs, minutes at 31 MB), a probe's worker frozen
    while it judged one page."""
    from webfarm.render import visible_text_length

    page = ("<html><head><title>Not the body</title></head><body>a<script>var x</script>b"
            "<!-- a comment -->d<style>p{}</style> e <noscript>n</noscript>f"
            "<template>t</template>g<div>h<p>i</p>j</div>k</body></html>")
    assert visible_text_length(html_response(page)) == len("a b d e f g h i j k")
    assert visible_text_length(html_response("<p>no   body\n tag</p>")) == len("no body tag")
    assert visible_text_length(html_response('<body><div id="root"></div></body>')) == 0
    flat = "".join(f'<p><a href="/p{i}">link {i}</a> text</p>' for i in range(20_000))
    assert visible_text_length(html_response(f"<body>{flat}</body>")) == len(
        " ".join(f"link {i} text" for i in range(20_000)))


def test_configuration_errors_are_one_clear_line(tmp_path):
    from webfarm.browser import BrowserNotFound, find_chromium
    from webfarm.render import RenderConfigError, mode_for_host, parse_host_modes, parse_mode

    with pytest.raises(RenderConfigError, match="'fast' is not a render mode; use one of http"):
        parse_mode("fast", "WEBFARM_RENDER")
    with pytest.raises(RenderConfigError, match="'shop.example' is not host=mode"):
        parse_host_modes("shop.example")
    assert parse_host_modes('{"http://Shop.example:8080/": "browser"}') == {
        "shop.example:8080": "browser"}
    # As page hosts are spelled (punycode): "Bücher.de" as given matched no page.
    assert mode_for_host(parse_host_modes("Bücher.de=browser"), "www.xn--bcher-kva.de") \
        == "browser"
    with pytest.raises(RenderConfigError, match=r"WEBFARM_RENDER_HOSTS: '\*\.shop\.example': "
                                                r"give 'shop\.example'"):
        parse_host_modes("*.shop.example=browser")
    rules = parse_host_modes("example.com=browser, api.example.com:8443=http")
    assert mode_for_host(rules, "www.example.com") == "browser"  # a domain covers subdomains
    assert mode_for_host(rules, "api.example.com:8443") == "http"
    assert mode_for_host(rules, "api.example.com:9000") == "browser"
    assert mode_for_host(rules, "example.org") is None
    with pytest.raises(BrowserNotFound, match="WEBFARM_CHROMIUM='/no/such' is not an exec"):
        find_chromium("/no/such")
    fake = tmp_path / "chromium-browser"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert find_chromium(path=str(tmp_path)) == str(fake)
    assert find_chromium(path=str(tmp_path / "empty")) is None


def test_bad_render_modes_stop_the_worker_with_one_line(stores):
    env = runner.env_for(**stores)
    bad_arg = runner.scrapy(["crawl", "generic", "-a", "start=http://127.0.0.2:9/",
                             "-a", "render=fast"], env, 60)
    assert bad_arg.returncode == 2
    assert "-a render='fast' is not a render mode; use one of http" in bad_arg.stderr
    bad_env = runner.scrapy(["crawl", "generic", "-a", "start=http://127.0.0.2:9/"],
                            {**env, "WEBFARM_RENDER": "fast"}, 60)
    assert bad_env.returncode != 0 and "Traceback" not in bad_env.output
    assert "WEBFARM_RENDER='fast' is not a render mode" in bad_env.output


def test_a_page_whose_script_leaves_the_site_is_not_stored_as_the_other_site(web, stores,
                                                                            redis_url):
    """A script sent the browser to another site, and that site's page was stored under
    this site's URL (final_url told, nothing else), as an HTTP redirect there is not."""
    base, other = web.base_urls
    web.route("/away", Response.html(
        f"<html><body><p>leaving</p><script>location.href = '{other}/about'</script>"
        "</body></html>"), host=base, prefix=False)
    links = '<a href="/away">away</a> <a href="/stay">stay</a>'
    web.route("/", Response.html(f"<html><body><p>home</p>{links}</body></html>"), host=base,
              prefix=False)
    web.route("/stay", Response.html("<html><body><p>stay</p></body></html>"), host=base,
              prefix=False)
    result = crawl(runner.env_for(**stores), "-a", f"start={base}/", "-a", "render=browser")
    stored = pages(stores)
    assert set(stored) == {f"{base}/", f"{base}/stay"}, result.output[-3000:]
    assert stat(result, "webfarm/render/browser_offsite") == 1
    assert result.output.count(f"sent the browser to {other}/about, outside the spider's "
                               "hosts: not stored") == 1
    assert frontier(redis_url).dead_letters() == []


def _descendants(pid: int) -> list[int]:
    """The processes started under ``pid`` (ours: the worker this test started)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def _browser_of(pid: int) -> int | None:
    """The worker's Chromium: its browser process, not a renderer (``--type=``)."""
    for child in _descendants(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"chrom" in args[0] and not any(a.startswith(b"--type=") for a in args):
            return child
    return None


def test_a_chromium_killed_mid_crawl_is_said_and_loses_no_page(web, stores, tmp_path):
    """A probe: Chromium killed under a worker left no line in its log (scrapy-playwright
    says it at DEBUG). It is a WARNING, and the crawl still stores every page."""
    host = web.base_urls[0].split("//")[1]
    app = JsSite(pages=6, home_js=True).install(web, host)
    env = runner.env_for(**stores, WEBFARM_RENDER_PROBE_RATE="0", WEBFARM_HOST_DELAY="0.5",
                         WEBFARM_IDLE_TIMEOUT="2")
    log = tmp_path / "worker.log"
    proc = runner.popen(["crawl", "generic", "-s", "WEBFARM_AUTOTHROTTLE=False",
                         "-a", f"start={app.url()}"], env, log)
    try:
        servers.wait_for(lambda: app.renders(app.path()) and _browser_of(proc.pid), 90,
                         "the worker's first render")
        os.kill(_browser_of(proc.pid), signal.SIGKILL)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert "Traceback" not in output, output[-3000:]
    assert "Chromium exited while the crawl ran" in output
    assert int(re.search(r"'webfarm/render/browser_lost': (\d+)", output).group(1)) >= 1
    stored = pages(stores)
    assert set(stored) == app.all_urls()
    assert {doc["fetch_method"] for doc in stored.values()} == {"browser"}
