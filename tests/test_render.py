"""HTTP first, browser when needed: real crawls, real Chromium, real Valkey and SecantusDB."""

from __future__ import annotations

import re

import pymongo
import pytest
import redis
from scrapy.settings import Settings

from tests import runner
from tests.testweb.jspages import JsSite
from webfarm.blobstore import open_blob_store
from webfarm.queue import open_frontier
from webfarm.render import HostMemory


@pytest.fixture()
def stores(redis_url, mongo_uri, mongo_db_name, tmp_path):
    return {"REDIS_URL": redis_url, "MONGO_URI": mongo_uri, "MONGO_DATABASE": mongo_db_name,
            "BLOB_STORE_URI": (tmp_path / "blobs").as_uri()}


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
    result = crawl(env, "-a", f"start={mixed.url()},{app.url()}")

    stored = pages(stores)
    assert set(stored) == mixed.all_urls() | app.all_urls()  # links inserted by JS followed too
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


def test_probe_notices_a_host_that_stopped_needing_javascript(web, stores, redis_url):
    host = web.base_urls[0].split("//")[1]
    site = JsSite(pages=8).install(web, host)
    site.js = False  # the host was redesigned: plain HTML now
    memory = HostMemory(redis.Redis.from_url(redis_url), "generic", 3600)
    assert [memory.observe(host, True) for _ in range(2)] == ["http", "browser"]
    env = runner.env_for(**stores, WEBFARM_RENDER_PROBE_RATE="0.5")
    result = crawl(env, "-a", f"start={site.url()}")

    assert memory.server.hget(memory.key(host), "mode") == b"http"
    assert stat(result, "webfarm/render/probes") == 1
    assert stat(result, "webfarm/render/wrong_guess") == 1
    stored = pages(stores)
    assert set(stored) == site.all_urls()
    methods = [doc["fetch_method"] for doc in stored.values()]
    assert methods.count("browser") == 1 and methods.count("http") == 8  # home, then flipped


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
