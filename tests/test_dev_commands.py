"""Scrapy's developer commands in a webfarm project: ``scrapy parse``, ``fetch``,
``view``, ``shell`` and ``check`` fetch and show a page as in any Scrapy project, on
Scrapy's in-memory scheduler, and leave the shared frontier alone (under scrapy-redis,
and here before, they failed: their callbacks cannot be stored in a frontier)."""

from __future__ import annotations

import argparse
import asyncio
import re

import pytest
import redis
from scrapy.settings import Settings

from tests import runner
from tests.servers import free_port
from tests.testweb import TestWeb
from webfarm.blobstore import open_blob_store
from webfarm.commands import parse, shell
from webfarm.items import PageItem


@pytest.fixture(scope="module")
def dev_web():
    """A small shop of its own on 127.0.0.6."""
    with TestWeb(hosts=("127.0.0.6",), categories=1, products_per_category=3) as web:
        yield web


def run(stores, *args: str, **env: str) -> runner.Result:
    env = runner.env_for(WEBFARM_RENDER="http", **stores, **env)
    return runner.scrapy(list(args), env, timeout=120)


def frontier_keys(redis_url: str) -> list[bytes]:
    """The spider's frontier keys (queues, seen URLs, hosts), but its robots.txt cache,
    which the fleet shares and a page fetched by hand may fill."""
    server = redis.Redis.from_url(redis_url)
    try:
        return [k for k in server.keys("webfarm:{generic}:*") if b":robots:" not in k]
    finally:
        server.close()


def test_scrapy_parse_shows_a_page_s_items_and_links_and_queues_nothing(dev_web, stores,
                                                                          redis_url):
    dev_web.clear_hits()
    base = dev_web.base_urls[0]
    product = min(u for u in dev_web.expected_pages(base) if u.startswith(f"{base}/product/"))

    result = run(stores, "parse", "--spider=generic", "--nolog", "-a", f"start={base}/",
                 product)

    assert result.returncode == 0, result.output[-3000:]
    out = result.stdout
    assert "# Scraped Items" in out and f"'url': '{product}'" in out  # the page item
    assert " bytes (the page, stored raw)" in out and "fetch_id" not in out  # in short
    assert "<!DOCTYPE" not in out.upper()  # not its raw body
    assert f"<GET {base}/about>" in out and "/print/product/" in out  # its links, shown
    fetched = [h.path for h in dev_web.hits_for(host=base)]
    assert fetched == ["/robots.txt", product[len(base):]]  # that page alone, robots first
    assert frontier_keys(redis_url) == []  # nothing joined the fleet's crawl


def test_scrapy_parse_without_pipelines_stores_nothing(dev_web, stores, mongo_db):
    """A WebfarmSpider whose own parse calls super().parse(): its page record reached the
    storage pipelines without --pipelines (the page indexed, its refetch scheduled, and a
    URL with a test query the source of the product's stored item)."""
    base = dev_web.base_urls[0]
    product = min(u for u in dev_web.expected_pages(base) if u.startswith(f"{base}/product/"))
    result = run(stores, "parse", "--spider=test_extended_parse", "-a", f"start={base}/",
                 "-s", "SPIDER_MODULES=spiders,tests.spiders", f"{product}?zz=1")
    assert result.returncode == 0, result.output[-3000:]
    assert "# Scraped Items" in result.stdout
    stored = {c: mongo_db[c].count_documents({}) for c in mongo_db.list_collection_names()}
    assert not any(stored.values()), stored


class SlowPipeline:
    """A project's pipeline that takes its time (an API lookup, say)."""

    async def process_item(self, item):
        await asyncio.sleep(1.0)
        return item


class RefusingPipeline:
    """A project's pipeline that refuses the spider's items (a price that is no number)."""

    def process_item(self, item):
        if isinstance(item, PageItem):
            return item
        raise ValueError("price 'call us' is not a number")


def test_scrapy_parse_pipelines_says_an_item_refused_in_one_line_and_fails(dev_web, stores):
    """Scrapy's parse starts each item's pipelines and leaves them: a refused item was a
    15-line "Task exception was never retrieved" traceback, and exit 0."""
    base = dev_web.base_urls[0]
    product = f"{base}/product/{min(dev_web.shop(base).products)}"
    result = run(stores, "parse", "--spider=catalogue", "--pipelines", "-a", f"start={base}/",
                 "-s", 'ITEM_PIPELINES={"tests.test_dev_commands.RefusingPipeline": 50}',
                 product)
    assert result.returncode == 1, result.output[-3000:]
    assert "Task exception was never retrieved" not in result.output
    assert "Traceback" not in result.output
    said = [line for line in result.stderr.splitlines() if "webfarm: an item pipeline" in line]
    assert said and all(line.endswith("ValueError: price 'call us' is not a number")
                        for line in said), result.stderr[-2000:]


def test_scrapy_parse_pipelines_stores_the_page_and_its_items(dev_web, stores, redis_url,
                                                             mongo_db):
    """``--pipelines``: the page, its blob and its product are stored as a crawl stores
    them, the frontier is left alone, and no warning a user cannot act on is printed
    (Scrapy's parse wraps callbacks in one returning a Deferred; metrics are off).
    Scrapy's parse does not wait for the pipelines: with a slow one in the chain, the
    spider closed first, and the page and item were not stored."""
    base = dev_web.base_urls[0]
    sku = min(dev_web.shop(base).products)
    product = f"{base}/product/{sku}"

    result = run(stores, "parse", "--spider=catalogue", "--pipelines", "-a", f"start={base}/",
                 "-s", 'ITEM_PIPELINES={"tests.test_dev_commands.SlowPipeline": 50}', product)

    assert result.returncode == 0, result.output[-3000:]
    db = mongo_db  # the database the command wrote to (stores["MONGO_DATABASE"])
    page = db.pages.find_one({"url": product})
    assert page is not None and page["blob_key"]
    assert open_blob_store(stores["BLOB_STORE_URI"]).get(page["blob_key"])
    assert [d["_id"] for d in db.products.find()] == [sku]
    assert db.products.find_one()["content_hash"] == page["content_hash"]
    assert frontier_keys(redis_url) == []
    assert "returned a Deferred" not in result.stderr
    assert "WEBFARM_METRICS" not in result.stderr


ONE_FILE = '''from dataclasses import dataclass
from typing import ClassVar

from spiders.base import WebfarmSpider


@dataclass
class Sku:
    item_collection: ClassVar[str] = "skus"
    key_fields: ClassVar[tuple[str, ...]] = ("sku",)
    sku: str


class OneFileSpider(WebfarmSpider):
    name = "onefile"
    render = "http"

    def extract(self, response):
        for sku in response.css(".sku::text").re(r"SKU:\\s*(\\S+)"):
            yield Sku(sku)
'''


def test_scrapy_runspider_crawls_a_spider_file_like_a_project_spider(dev_web, stores,
                                                                      tmp_path, mongo_db):
    """A one-file spider on the base class, run by path, crawls on the frontier and
    stores its pages and items as a project spider does."""
    base = dev_web.base_urls[0]
    path = tmp_path / "onefile.py"
    path.write_text(ONE_FILE)
    result = run(stores, "runspider", str(path), "-a", f"start={base}/")
    assert result.returncode == 0, result.output[-3000:]
    db = mongo_db  # the database the command wrote to (stores["MONGO_DATABASE"])
    assert {d["url"] for d in db.pages.find({"spider": "onefile"})} == \
        dev_web.expected_pages(base)
    assert sorted(d["_id"] for d in db.skus.find()) == sorted(dev_web.shop(base).products)


def test_scrapy_runspider_checks_what_scrapy_crawl_checks(dev_web, stores, tmp_path):
    """Before, a spider file started without the start checks: a wrong REDIS_URL or a
    setting of the wrong type ended in tracebacks, bad -a arguments were not refused."""
    base = dev_web.base_urls[0]
    path = tmp_path / "onefile.py"
    path.write_text(ONE_FILE)
    before = len(dev_web.hits)  # the test web serves the whole module
    for args, env, code, line in [
        (["-a", "max_pages=ten"], {}, 2, "webfarm: onefile: max_pages='ten' is not a whole "
                                         "number"),
        (["-s", "WEBFARM_HOST_DELAY=abc"], {}, 1, "webfarm: WEBFARM_HOST_DELAY='abc' is not "
                                                  "a number"),
        # refused by its component as the crawl starts (before: a traceback)
        (["-s", "WEBFARM_RENDER_HOSTS=x"], {}, 1, "webfarm: WEBFARM_RENDER_HOSTS: 'x' is not "
                                                  "host=mode"),
        ([], {"REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, 1,
         "webfarm: REDIS_URL: cannot reach")]:
        result = run({**stores, **env}, "runspider", str(path), "-a", f"start={base}/", *args)
        assert result.returncode == code and "Traceback" not in result.output, \
            result.output[-2000:]
        assert [x for x in result.stderr.splitlines() if x.startswith("webfarm:")][0] \
            .startswith(line), result.stderr[-2000:]
    assert len(dev_web.hits) == before  # nothing was fetched


CRAWL_SPIDER_TYPO = """
import scrapy
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule


class ShopSpider(CrawlSpider):
    name = "typo_shop"
    rules = (Rule(LinkExtractor(allow=r"/product/"), callback="parse_itme"),)

    def parse_item(self, response):
        yield {"url": response.url}
"""


def test_a_rule_naming_a_method_the_spider_lacks_is_refused(dev_web, stores, tmp_path):
    """A probe: Rule(..., callback="parse_itme") crawled every page, stored no item and
    exited 0 (Scrapy takes a name it cannot find for no callback)."""
    base = dev_web.base_urls[0]
    path = tmp_path / "typo_shop.py"
    path.write_text(CRAWL_SPIDER_TYPO)
    before = len(dev_web.hits)
    result = run(stores, "runspider", str(path), "-a", f"start={base}/")
    assert result.returncode == 2, result.output[-2000:]
    assert ("webfarm: typo_shop: a Rule's callback='parse_itme' is no method of ShopSpider "
            "(Scrapy would skip it without a word); did you mean 'parse_item'?"
            ) in result.stderr, result.stderr[-2000:]
    assert len(dev_web.hits) == before  # nothing was fetched


def test_scrapy_bench_crawls_scrapy_s_bench_server(stores, redis_url):
    """On the frontier the SSRF guard dead-lettered the bench server's localhost URL and
    the run printed 'Crawled 0 pages' until its timeout."""
    result = run(stores, "bench", "-s", "CLOSESPIDER_TIMEOUT=3",
                 WEBFARM_ALLOWED_NETWORKS="")  # the guard as deployed: loopback refused
    assert result.returncode == 0, result.output[-3000:]
    crawled = [int(n) for n in re.findall(r"Crawled (\d+) pages", result.output)]
    assert crawled and crawled[-1] > 50, result.output[-3000:]
    assert "SSRF guard refused" not in result.output
    keys = redis.Redis.from_url(redis_url).keys("webfarm:{follow}:*")
    assert [k for k in keys if b":robots:" not in k] == []  # nothing queued, seen or dead


def test_scrapy_fetch_prints_the_body(dev_web, stores, redis_url):
    base = dev_web.base_urls[0]
    result = run(stores, "fetch", "--nolog", f"{base}/about")
    assert result.returncode == 0, result.output[-3000:]
    assert "<title>About us | Acme Outfitters</title>" in result.stdout
    assert frontier_keys(redis_url) == []


def test_scrapy_view_opens_the_page_as_scrapy_got_it(dev_web, stores, tmp_path):
    """``view`` hands the page to $BROWSER (Python's webbrowser) as a file:// URL: here a
    script that prints that file, so the page a browser would open is printed."""
    base = dev_web.base_urls[0]
    browser = tmp_path / "browser"
    browser.write_text('#!/bin/sh\ncat "${1#file://}"\n')
    browser.chmod(0o755)
    result = run(stores, "view", "--nolog", f"{base}/about", BROWSER=f"{browser} %s")
    assert result.returncode == 0, result.output[-3000:]
    assert "<title>About us | Acme Outfitters</title>" in result.stdout


def test_scrapy_shell_fetches_and_fetches_again(dev_web, stores):
    dev_web.clear_hits()
    base = dev_web.base_urls[0]
    code = f"fetch('{base}/about') or (response.status, response.css('title::text').get())"
    result = run(stores, "shell", "--nolog", "-c", code, f"{base}/about")
    assert result.returncode == 0, result.output[-3000:]
    assert "(200, 'About us | Acme Outfitters')" in result.stdout
    assert len(dev_web.hits_for(host=base, path="/about")) == 2  # no duplicate filter


PROBE = '''import scrapy

from spiders.base import WebfarmSpider


class ProbeSpider({base}):
    name = "probe"

    def parse(self, response, **kwargs):
        """@url {url}
        @returns items 1 1
        @scrapes {fields}
        """
        {page}yield {{"sku": response.css(".sku::text").re_first(r"SKU:\\s*(\\S+)")}}
'''


@pytest.mark.parametrize(("fields", "passes", "kind"), [
    ("sku", True, "scrapy.Spider"), ("sku name", False, "scrapy.Spider"),
    # its parse yields the page's record too: "Returned 2 items", "Missing fields: sku"
    ("sku", True, "WebfarmSpider")])
def test_scrapy_check_runs_a_spider_s_contracts(dev_web, stores, tmp_path, fields, passes,
                                                kind):
    """On the frontier ``check`` ran no contract and said OK; here a contract the page
    meets passes and one it does not (no ``name``) fails."""
    base = dev_web.base_urls[0]
    product = min(u for u in dev_web.expected_pages(base) if u.startswith(f"{base}/product/"))
    (tmp_path / "probespiders").mkdir()
    (tmp_path / "probespiders" / "__init__.py").write_text("")
    page = "yield from super().parse(response, **kwargs)\n        " if kind != "scrapy.Spider" \
        else ""
    (tmp_path / "probespiders" / "probe.py").write_text(PROBE.format(url=product,
                                                                     fields=fields, base=kind,
                                                                     page=page))
    result = run(stores, "check", "probe", "-s", "SPIDER_MODULES=probespiders",
                 PYTHONPATH=str(tmp_path))
    assert "Ran 2 contracts" in result.stderr, result.output[-3000:]
    if passes:
        assert result.returncode == 0 and result.stderr.rstrip().endswith("OK")
    else:
        assert result.returncode == 1 and "Missing fields: name" in result.stderr


@pytest.mark.parametrize("command", [parse.Command, shell.Command])
def test_a_setting_given_with_s_still_wins(command):
    cmd = command()
    cmd.settings = Settings({"SCHEDULER": "webfarm.scheduler.Scheduler",
                             "WEBFARM_METRICS": True}, priority="project")
    parser = argparse.ArgumentParser()
    cmd.add_options(parser)
    opts = parser.parse_args(["-s", "WEBFARM_METRICS=1"])
    cmd.process_options([], opts)
    assert cmd.settings["SCHEDULER"] == "scrapy.core.scheduler.Scheduler"
    assert cmd.settings.getbool("WEBFARM_METRICS") is True  # -s beat the local default


PLAIN_SPIDER = '''import scrapy


class PlainSpider(scrapy.Spider):
    name = "plain"
    start_urls = [{start!r}]

    def parse(self, response):
        yield {{"title": response.css("title::text").get()}}
        yield from response.follow_all(css="a")
'''


def test_a_scrapy_style_spider_run_again_says_why_it_fetched_only_its_start_url(
        dev_web, stores, tmp_path):
    """Run again, a Scrapy spider fetches its start URL (Scrapy's start requests are
    dont_filter) and finds every link seen by the frontier: it stopped after one page,
    with no word of why (the "fetched nothing" advice needs nothing fetched)."""
    base = dev_web.base_urls[0]
    path = tmp_path / "plain.py"
    path.write_text(PLAIN_SPIDER.format(start=f"{base}/"))
    first = run(stores, "runspider", str(path))
    assert first.returncode == 0, first.output[-3000:]
    assert "fetched its start URL(s) and nothing else" not in first.output
    dev_web.clear_hits()
    again = run(stores, "runspider", str(path))
    assert again.returncode == 0, again.output[-3000:]
    assert [h.path for h in dev_web.hits_for(host=base) if h.path != "/robots.txt"] == ["/"]
    assert re.search(r"This worker fetched its start URL\(s\) and nothing else: the \d+ "
                     r"link\(s\) found were seen before by plain's frontier", again.output)
    assert "scrapy frontier plain --reset --yes" in again.output
    # Not `scrapy recrawl`: a spider not on WebfarmSpider stores no pages, and a
    # CrawlSpider told to run it got "0 due".
    assert "scrapy recrawl" not in again.output


def test_the_links_seen_advice_needs_the_start_urls_to_be_all_it_fetched(caplog):
    """A worker that also fetched the 10 pages `scrapy recrawl` had queued was told to run
    `scrapy recrawl`, the command just run."""
    from webfarm.advice import explain_links_seen

    class Stats(dict):
        def get_value(self, key, default=None):
            return self.get(key, default)

    ran = {"webfarm/frontier/start_requests": 1, "webfarm/frontier/duplicates": 10,
           "webfarm/frontier/enqueued": 1}
    with caplog.at_level("WARNING", logger="webfarm.advice"):
        explain_links_seen(Stats(ran, **{"webfarm/frontier/dequeued": 11}), "acme")
        assert caplog.records == []
        explain_links_seen(Stats(ran, **{"webfarm/frontier/dequeued": 1}), "acme")
    assert "fetched its start URL(s) and nothing else: the 10 link(s)" in caplog.text


def test_a_mistyped_spider_of_parse_is_one_line_and_exit_2(stores):
    """`scrapy parse --spider=acm URL` was Scrapy's "Unable to find spider", exit 0."""
    result = run(stores, "parse", "--spider=catalog", "http://127.0.0.2:9/")
    assert result.returncode == 2, result.output[-2000:]
    assert "webfarm: no spider named 'catalog'; `scrapy list` shows them" in result.stderr
    assert "Traceback" not in result.output
