"""``scrapy fetch|view|parse|shell --stored``: the page as a crawl stored it, from the
index and the blob store, with the site down: no request leaves the machine."""

from __future__ import annotations

import argparse
import asyncio
import uuid

import pymongo
import pytest
from scrapy.settings import Settings

from tests import runner
from tests.testweb import TestWeb
from webfarm.blobstore import open_blob_store
from webfarm.commands import fetch, parse, shell, view
from webfarm.urls import url_fingerprint


def run(stores, *args: str, **env: str) -> runner.Result:
    env = runner.env_for(WEBFARM_RENDER="http", **stores, **env)
    return runner.scrapy(list(args), env, timeout=120)


@pytest.fixture(scope="module")
def gone_site(tmp_path_factory, valkey_server, mongo_server):
    """A product page stored by ``scrapy parse --pipelines``, then the site taken down:
    (its stores, its URL, the site's base URL, the stored body)."""
    stores = {"REDIS_URL": valkey_server.url, "MONGO_URI": mongo_server.url,
              "MONGO_DATABASE": f"wf_{uuid.uuid4().hex[:10]}",
              "BLOB_STORE_URI": (tmp_path_factory.mktemp("stored") / "blobs").as_uri()}
    with TestWeb(hosts=("127.0.0.7",), categories=1, products_per_category=3) as web:
        base = web.base_urls[0]
        product = f"{base}/product/{min(web.shop(base).products)}"
        result = run(stores, "parse", "--spider=catalogue", "--pipelines", "-L", "INFO",
                     "-a", f"start={base}/", product)
        assert result.returncode == 0, result.output[-3000:]
    client = pymongo.MongoClient(stores["MONGO_URI"])
    try:
        page = client[stores["MONGO_DATABASE"]].pages.find_one({"url": product})
        assert page is not None, result.output[-4000:]
        body = open_blob_store(stores["BLOB_STORE_URI"]).get(page["blob_key"])
        yield stores, product, base, body
    finally:
        client.drop_database(stores["MONGO_DATABASE"])
        client.close()


def test_fetch_stored_prints_the_kept_body_with_the_site_down(gone_site):
    stores, product, _, body = gone_site
    result = run(stores, "fetch", "--stored", "--nolog", product)
    assert result.returncode == 0, result.output[-3000:]
    assert result.stdout.encode() == body + b"\n"  # Scrapy's fetch adds the newline


def test_parse_stored_runs_the_callback_and_follows_only_stored_pages(gone_site):
    """The item comes out of the stored page, through the spider that stored it (no
    ``--spider``: no spider's domains name the test web); a link it follows (``--depth
    2``) has no stored page, and fails alone with one line naming it."""
    stores, product, base, _ = gone_site
    sku = product.rsplit("/", 1)[1]
    result = run(stores, "parse", "--stored", "-a", f"start={base}/", "--depth", "2", product)
    assert result.returncode == 0, result.output[-3000:]
    assert f"'sku': '{sku}'" in result.stdout
    assert f"no stored page for {base}/" in result.stderr
    assert "'webfarm/stored/served': 1" in result.stderr
    assert "'webfarm/stored/missing'" in result.stderr
    assert "Traceback" not in result.stderr


def test_parse_stored_pipelines_stores_items_and_leaves_the_page_as_fetched(gone_site):
    """``--pipelines`` stores the items, as ``scrapy reparse`` does; the page is not
    recorded as fetched again (before, its fetch_count went up and fetched_at and
    next_fetch_at moved, with no request made)."""
    stores, product, base, _ = gone_site
    client = pymongo.MongoClient(stores["MONGO_URI"])
    try:
        db = client[stores["MONGO_DATABASE"]]
        before = db.pages.find_one({"url": product})
        db.products.delete_many({})
        result = run(stores, "parse", "--stored", "--pipelines", "--spider=catalogue",
                     "-a", f"start={base}/", product)
        assert result.returncode == 0, result.output[-3000:]
        assert db.pages.find_one({"url": product}) == before
        assert db.pages.count_documents({}) == 1
        item = db.products.find_one()
        assert item["source_url"] == product and item["content_hash"] == before["content_hash"]
        assert "'webfarm/items/created': 1" in result.stderr
    finally:
        client.close()


def test_a_page_the_generic_spider_stored_needs_no_spider_arguments(gone_site):
    """``generic`` needs ``-a start`` or ``-a domains`` to crawl, not to read what it
    stored: ``fetch --stored`` (which has no ``-a``) died with a traceback, and
    ``reparse generic`` refused to run."""
    stores, product, base, body = gone_site
    client = pymongo.MongoClient(stores["MONGO_URI"])
    try:
        pages = client[stores["MONGO_DATABASE"]].pages
        page = pages.find_one({"url": product})
        url = f"{base}/mirror/{uuid.uuid4().hex[:8]}"
        pages.insert_one({**page, "_id": url_fingerprint(url), "url": url, "final_url": url,
                          "spider": "generic"})
        result = run(stores, "fetch", "--stored", "--nolog", url)
        assert result.returncode == 0, result.output[-3000:]
        assert result.stdout.encode() == body + b"\n"
        reparse = run(stores, "reparse", "generic", "--dry-run")
        assert reparse.returncode == 0, reparse.output[-3000:]
        assert "pages=1 " in reparse.output and "errors=0" in reparse.output
    finally:
        client.close()


def test_generic_crawled_without_start_or_domains_closes_saying_why(caplog):
    """Outside ``scrapy crawl`` (which refuses it first), a generic crawl with neither
    argument closes at its start rather than take every host of the frontier."""
    from scrapy.exceptions import CloseSpider

    from spiders.generic import GenericSpider

    with pytest.raises(ValueError, match="generic needs -a start=URL"):
        GenericSpider.check_crawl_arguments()
    with pytest.raises(CloseSpider):
        asyncio.run(anext(GenericSpider().start()))
    assert "generic needs -a start=URL" in caplog.text
    assert asyncio.run(anext(GenericSpider(domains="127.0.0.7").start(), None)) is None


def test_shell_stored_gives_the_stored_response(gone_site):
    stores, product, _, _ = gone_site
    code = "(response.status, response.flags, response.css('title::text').get())"
    result = run(stores, "shell", "--stored", "--nolog", "-c", code, product)
    assert result.returncode == 0, result.output[-3000:]
    assert "(200, ['stored'], " in result.stdout


def test_a_page_never_stored_is_one_line_and_exit_code_2(gone_site):
    stores, _, base, _ = gone_site
    result = run(stores, "fetch", "--stored", "--nolog", f"{base}/about")
    assert result.returncode == 2
    assert result.stderr.startswith(f"webfarm: no stored page for {base}/about in mongodb://")
    assert "without --stored" in result.stderr
    assert result.stdout == ""


def test_a_blob_store_without_the_page_s_body_is_one_line_and_exit_code_2(gone_site, tmp_path):
    """The index names the page, but BLOB_STORE_URI points at a store without its body
    (another folder or bucket): said before the run, which printed nothing."""
    stores, product, _, _ = gone_site
    other = (tmp_path / "other-blobs").as_uri()
    result = run({**stores, "BLOB_STORE_URI": other}, "fetch", "--stored", "--nolog", product)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"webfarm: the stored body of {product} cannot be read "
                                    "(no blob raw/"), result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [fetch.Command, view.Command, parse.Command,
                                     shell.Command])
def test_stored_answers_from_the_stores_over_any_s_setting(command):
    cmd = command()
    cmd.settings = Settings({"DOWNLOAD_HANDLERS": {"http": "x.Handler"},
                             "DOWNLOADER_MIDDLEWARES_BASE": {
                                 "middlewares.render.RenderMiddleware": 560,
                                 "middlewares.robots.RobotsMiddleware": 100}},
                            priority="project")
    parser = argparse.ArgumentParser(conflict_handler="resolve")  # as scrapy.cmdline's
    cmd.add_options(parser)
    opts = parser.parse_args(["--stored", "-s", "ROBOTSTXT_OBEY=1"])
    cmd.process_options([], opts)
    assert cmd.settings.getdict("DOWNLOAD_HANDLERS") == {
        "http": "webfarm.stored.StoredPageHandler", "https": "webfarm.stored.StoredPageHandler"}
    assert cmd.settings.getbool("ROBOTSTXT_OBEY") is False
    assert cmd.settings.getdict("DOWNLOADER_MIDDLEWARES_BASE") == {
        "middlewares.render.RenderMiddleware": None,
        "middlewares.robots.RobotsMiddleware": 100,
        "middlewares.ssrf.SSRFGuardMiddleware": None}
