"""A WebfarmSpider's pages are stored whatever callback gets them, and re-parse runs it.

Before, only the base class's ``parse`` stored a page: a spider that overrides ``parse``
(the Scrapy habit) or sends product pages to ``callback=self.parse_product`` had those raw
pages dropped without a word (nothing for re-parse), and their items stored with an empty
``source_url`` and no ``content_hash``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging

import pymongo
import pytest
import redis
import scrapy

from tests import runner
from tests.crawlcheck import frontier as frontier_of
from tests.testweb import Response, TestWeb
from webfarm.urls import url_fingerprint

SPIDERS = ["-s", "SPIDER_MODULES=spiders,tests.spiders"]
SKUS = sorted(f"WF0{c}-000{p}" for c in (1, 2) for p in range(1, 6))


@pytest.fixture(scope="module")
def small_web():
    """A small shop of its own (2 categories of 5 products) on 127.0.0.6."""
    with TestWeb(hosts=("127.0.0.6",), categories=2, products_per_category=5) as web:
        yield web


def crawl(spider: str, start: str, stores: dict, *args: str) -> str:
    result = runner.scrapy(["crawl", spider, "-a", f"start={start}", *args, *SPIDERS],
                           runner.env_for(**stores), timeout=180)
    assert result.returncode == 0, result.output[-3000:]
    assert "ERROR" not in result.output, result.output[-3000:]
    return result.output


def reparse(spider: str, stores: dict, *args: str, returncode: int = 0) -> str:
    result = runner.scrapy(["reparse", spider, *args, *SPIDERS], runner.env_for(**stores),
                           timeout=120)
    assert result.returncode == returncode, result.output[-3000:]  # 1: some pages failed
    return result.output


def test_pages_sent_to_a_callback_of_the_spider_are_stored_and_re_parsed(small_web, stores):
    base = small_web.base_urls[0]
    crawl("test_detail_callback", f"{base}/category/garden,{base}/category/kitchen", stores)
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    products = {d["sku"]: d for d in db.scrapy_products.find()}
    assert sorted(products) == SKUS
    for sku, doc in products.items():
        page = db.pages.find_one({"_id": url_fingerprint(f"{base}/product/{sku}")})
        assert page is not None, sku  # the raw page is kept
        assert page["callback"] == "parse_product" and page["blob_key"]
        assert (doc["source_url"], doc["content_hash"]) == (page["url"], page["content_hash"])
    category = db.pages.find_one({"_id": url_fingerprint(f"{base}/category/garden")})
    assert "callback" not in category  # the base class's parse stored it
    # Re-parse runs parse_product on the product pages (extract() on the others).
    assert "10 items: 0 created, 0 changed, 10 unchanged" in reparse(
        "test_detail_callback", stores)
    out = reparse("test_detail_callback", stores, "-a", "variant=upper")
    assert "10 items: 0 created, 10 changed, 0 unchanged" in out and "0 errors" in out
    assert {d["name"] for d in db.scrapy_products.find()} == {
        d["name"].upper() for d in products.values()}
    db.client.close()


@pytest.mark.parametrize("spider", ["test_own_parse", "test_extended_parse"])
def test_a_spider_s_own_parse_gets_its_pages_stored_and_its_items_tagged(small_web, stores,
                                                                         spider):
    """Its own parse only, or one that calls super().parse() too: each page stored once."""
    base = small_web.base_urls[0]
    crawl(spider, f"{base}/", stores)
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    titles = list(db.titles.find())
    pages = {d["url"]: d for d in db.pages.find()}
    # home, 2 categories and 10 products; the base class's parse follows every link (26)
    assert len(titles) == {"test_own_parse": 13, "test_extended_parse": 26}[spider]
    assert set(pages) == {d["source_url"] for d in titles}
    for doc in titles:
        page = pages[doc["source_url"]]
        assert page["callback"] == "parse" and doc["content_hash"] == page["content_hash"]
        assert page["fetch_count"] == 1
    out = reparse(spider, stores)
    assert f"{len(titles)} items: 0 created, 0 changed, {len(titles)} unchanged" in out
    assert "0 errors" in out
    assert list(frontier_of(stores["REDIS_URL"], spider).dead_letters()) == []
    db.client.close()


@pytest.mark.parametrize(("spider", "start", "dropped"), [
    ("test_own_parse", "/", 2),  # its parse follows the home page's 2 categories
    ("test_detail_callback", "/category/garden", 5),  # extract() follows 5 products
])
def test_max_pages_bounds_a_spider_that_follows_pages_through_its_own_callbacks(
        small_web, stores, spider, start, dropped):
    """Before, only the base class's parse stopped following links at max_pages: these two
    crawled the whole shop (13 and 6 pages) with -a max_pages=1."""
    base = small_web.base_urls[0]
    out = crawl(spider, f"{base}{start}", stores, "-a", "max_pages=1")
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    assert [d["url"] for d in db.pages.find()] == [f"{base}{start}"]
    assert "Stored max_pages=1 pages: the links of pages from now on are not followed" in out
    assert f"'webfarm/links/max_pages': {dropped}," in out
    # a trial run's limit would bound later crawls: said, with what to do
    assert f"a later crawl of {spider} does not reach what they link to" in out
    assert f"scrapy frontier {spider} --reset --yes" in out
    db.client.close()


def test_a_page_its_own_parse_and_the_base_parse_both_see_counts_once_toward_max_pages(
        small_web, stores):
    """With max_pages=2 the home page's links are followed (1 page stored, not 2), and the
    pages they lead to are stored but their links are not."""
    base = small_web.base_urls[0]
    crawl("test_extended_parse", f"{base}/", stores, "-a", "max_pages=2")
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    stored = sorted(d["url"].removeprefix(base) for d in db.pages.find())
    # the home page and its 5 links; counted twice, it alone would be stored
    assert stored == ["/", "/about", "/category/garden", "/category/kitchen",
                      "/product/WF01-0001", "/product/WF02-0001"]
    db.client.close()


def test_cb_kwargs_too_large_to_keep_leave_the_page_stored_and_its_refetch_dead_lettered(
        small_web, stores):
    """Before, a page whose request had 17 MB of cb_kwargs was not stored: MongoDB refused
    its document (over 16 MiB), the write was retried as a storage outage
    (WEBFARM_STORAGE_RETRY_SECONDS, five times) and the request dead-lettered as
    'StorageUnavailable', its page logged whole in the error."""
    base = small_web.base_urls[0]
    # Queued only with the entry limit lifted (WEBFARM_MAX_ENTRY_BYTES, 1 MiB by default)
    out = crawl("test_big_cb_kwargs", f"{base}/category/garden", stores,
                "-a", "size=17000000", "-s", "WEBFARM_STORAGE_RETRY_SECONDS=2",
                "-s", "WEBFARM_MAX_ENTRY_BYTES=0")
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    products = [d for d in db.pages.find() if "/product/" in d["url"]]
    assert len(products) == 2 and all(d["callback"] == "parse_product" for d in products)
    assert all(d.get("cb_kwargs") is None and d["blob_key"] for d in products)
    assert db.scrapy_products.count_documents({}) == 2
    assert out.count("characters as JSON; over 262144 they are not kept with the page") == 1
    assert "'webfarm/items/cb_kwargs_too_large': 2," in out and "xxxxxxxxxx" not in out
    # A refetch cannot give parse_product its argument: dead-lettered before it is fetched,
    # with what to do (before: fetched, then a TypeError traceback from the callback).
    env = runner.env_for(**stores)
    due = runner.scrapy(["recrawl", "test_big_cb_kwargs", "--now", "+200000", *SPIDERS], env,
                        timeout=60)
    assert "3 enqueued (" in due.output and " of 3 due" in due.output, due.output[-2000:]
    again = runner.scrapy(["crawl", "test_big_cb_kwargs", "-a", "size=0", *SPIDERS], env,
                          timeout=120)
    assert again.returncode == 0 and "Spider error" not in again.output, again.output[-3000:]
    letters = frontier_of(stores["REDIS_URL"], "test_big_cb_kwargs").dead_letters()
    assert len(letters) == 2 and all(letter["reason"].startswith(
        "malformed frontier entry: callback 'parse_product' does not take the request's "
        "cb_kwargs [] (missing a required argument: 'listing_html')") and letter["reason"]
        .endswith("then `scrapy dlq test_big_cb_kwargs --requeue`") for letter in letters)
    db.client.close()


def test_an_item_handed_on_in_cb_kwargs_is_kept_with_the_page_for_re_parse(small_web, stores):
    """Scrapy's way to build one item over two pages: re-parse gives the callback the
    Listing the category page handed it in the crawl (kept as pages.cb_kwargs)."""
    base = small_web.base_urls[0]
    crawl("test_listing_callback", f"{base}/category/garden,{base}/category/kitchen", stores)
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    departments = {"1": "Garden", "2": "Kitchen"}
    listings = list(db.listings.find())
    assert sorted(d["sku"] for d in listings) == SKUS
    assert all(d["department"] == departments[d["sku"][3]] for d in listings), listings
    # scrapy parse --stored, like re-parse, runs the page's callback with its cb_kwargs: it
    # ran the spider's parse (no item), and -c parse_product failed for its argument.
    page = f"{base}/product/WF02-0003"
    shown = runner.scrapy(["parse", "--stored", "--spider=test_listing_callback", page,
                           *SPIDERS], runner.env_for(**stores), timeout=120)
    assert shown.returncode == 0, shown.output[-3000:]
    assert "'department': 'Kitchen'" in shown.stdout and "'sku': 'WF02-0003'" in shown.stdout
    out = reparse("test_listing_callback", stores, "-a", "variant=upper")
    assert "10 items: 0 created, 10 changed, 0 unchanged" in out and "0 errors" in out
    again = {d["sku"]: d for d in db.listings.find()}
    for doc in listings:  # the department came from the stored cb_kwargs
        assert again[doc["sku"]]["department"] == doc["department"]
        assert again[doc["sku"]]["name"] == doc["name"].upper()
    db.client.close()


def test_re_parse_skips_pages_of_a_callback_it_cannot_run_alone_and_says_why(small_web,
                                                                            stores):
    base = small_web.base_urls[0]
    crawl("test_detail_callback", f"{base}/category/garden", stores)
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    db.pages.update_many({"callback": "parse_product"}, {"$set": {"callback": "gone_method"}})
    out = reparse("test_detail_callback", stores, returncode=1)
    assert out.count("skipping the pages stored for test_detail_callback.gone_method, which "
                     "is no callback of the spider (renamed or removed?)") == 1, out[-2000:]
    assert "5 errors" in out
    db.pages.update_many({"callback": "gone_method"}, {"$set": {"callback": "start"}})
    out = reparse("test_detail_callback", stores, returncode=1)  # Scrapy's own: never run
    assert "test_detail_callback.start, which is no callback" in out
    db.client.close()


def test_a_recrawl_sends_each_page_back_to_the_callback_that_stored_it(redis_url, mongo_uri,
                                                                      mongo_db_name, caplog):
    from scrapy.settings import Settings

    from tests.spiders.callbacks import ListingCallbackSpider
    from tests.spiders.scrapy_spiders import Listing
    from webfarm.queue import decode_request, open_frontier
    from webfarm.recrawl import Recrawler
    from webfarm.serialize import dumps_value
    from webfarm.urls import RequestFingerprinter

    db = pymongo.MongoClient(mongo_uri, tz_aware=True)[mongo_db_name]
    now = dt.datetime.now(dt.timezone.utc)
    handed = {"listing": Listing(department="Garden")}
    for path, callback, kwargs in (("/product/A", "parse_product", dumps_value(handed)),
                                   ("/category/b", None, None),
                                   ("/product/damaged", "parse_product", "{not json")):
        url = f"http://127.0.0.6:9{path}"
        db.pages.insert_one({"_id": url_fingerprint(url), "url": url, "callback": callback,
                             "cb_kwargs": kwargs, "spider": "test_listing_callback",
                             "refetch_interval": 60.0,
                             "next_fetch_at": now - dt.timedelta(seconds=60)})
    settings = Settings({"DUPEFILTER_CLASS": "webfarm.dupefilter.BloomDupeFilter",
                         "SCHEDULER_QUEUE_CLASS": "webfarm.frontier.Frontier",
                         "WEBFARM_HOST_DELAY": 0})
    frontier = open_frontier(settings, "test_listing_callback", redis.Redis.from_url(redis_url))
    # `scrapy recrawl` has no spider object: the callback goes by name
    with caplog.at_level(logging.ERROR, logger="webfarm.recrawl"):
        assert Recrawler(db.pages, frontier, "test_listing_callback",
                         RequestFingerprinter()).run(now).enqueued == 2
    assert "cannot refetch http://127.0.0.6:9/product/damaged: its stored cb_kwargs are " \
        "not JSON" in caplog.text  # a damaged page document stops no other
    spider = ListingCallbackSpider(start="http://127.0.0.6:9/")
    requests = {r.url.rsplit("/", 1)[1]: r for r in (
        decode_request(frontier.pop("w1").payload, spider) for _ in range(2))}
    assert requests["A"].callback == spider.parse_product
    assert requests["A"].cb_kwargs == handed  # an item again, as the crawl handed it on
    assert requests["b"].callback is None  # the spider's parse, as Scrapy calls it
    db.client.close()


def test_a_queued_request_whose_callback_does_not_take_its_cb_kwargs_is_refused():
    """Checked as Scrapy would call it: a decorator's own signature counts (one that
    supplies an argument itself is not refused)."""
    import functools

    from webfarm.queue import decode_request, request_entry
    from webfarm.serialize import SerializationError
    from webfarm.urls import RequestFingerprinter

    def with_listing(func):
        @functools.wraps(func)
        def wrapper(self, response, **kwargs):
            return func(self, response, listing="from the decorator", **kwargs)
        return wrapper

    class Spider(scrapy.Spider):
        name = "misfit"

        def needs_listing(self, response, listing):
            return []

        @with_listing
        def decorated(self, response, listing):
            return []

        def takes_any(self, response, **kwargs):
            return []

    spider = Spider()

    def queued(callback, **cb_kwargs):
        request = scrapy.Request("http://127.0.0.6:9/p", callback=callback, cb_kwargs=cb_kwargs)
        return request_entry(request, spider, RequestFingerprinter()).payload

    assert decode_request(queued(spider.needs_listing, listing=1), spider).cb_kwargs == {
        "listing": 1}
    for fits in (queued(spider.decorated), queued(spider.takes_any, other=2)):
        decode_request(fits, spider)
    for misfit, why in ((queued(spider.needs_listing), "missing a required argument: "
                                                       "'listing'"),
                        (queued(spider.needs_listing, listing=1, other=2),
                         "got an unexpected keyword argument 'other'")):
        with pytest.raises(SerializationError, match=rf"callback 'needs_listing' does not "
                                                     rf"take the request's cb_kwargs .*{why}"):
            decode_request(misfit, spider)


def test_links_to_files_are_followed_by_a_spider_that_asks_for_them(small_web, stores):
    """generic does not follow links to a PDF or an image (Scrapy's LinkExtractor ignores
    their extensions, as the README says); a spider with deny_extensions=[] stores them."""
    base = small_web.base_urls[0]
    pdf, png = b"%PDF-1.4 a small document", b"\x89PNG\r\n\x1a\n a small image"
    small_web.route("/files", Response.html(
        '<html><body><a href="/doc.pdf">doc</a> <a href="/img.png">img</a></body></html>'))
    small_web.route("/doc.pdf", Response(200, {"Content-Type": "application/pdf"}, pdf))
    small_web.route("/img.png", Response(200, {"Content-Type": "image/png"}, png))
    try:
        crawl("generic", f"{base}/files", stores)
        db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
        assert sorted(d["url"] for d in db.pages.find()) == [f"{base}/files"]
        runner.scrapy(["frontier", "generic", "--reset", "--yes"], runner.env_for(**stores))
        crawl("test_files", f"{base}/files", stores)
        stored = {d["url"]: d for d in db.pages.find()}
        assert set(stored) == {f"{base}/files", f"{base}/doc.pdf", f"{base}/img.png"}
        assert stored[f"{base}/doc.pdf"]["content_type"] == "application/pdf"
        assert stored[f"{base}/doc.pdf"]["content_hash"] == hashlib.sha256(pdf).hexdigest()
        db.client.close()
    finally:
        small_web.clear_routes()


def test_an_error_page_an_errback_handled_is_not_stored_as_the_callback_s(small_web, stores):
    """A 404 went to the errback, as in Scrapy, and was stored as a page of parse_product
    all the same: scrapy reparse then ran parse_product on the "not found" page (a
    KeyError traceback, exit 1)."""
    base = small_web.base_urls[0]
    out = crawl("test_errback_callback", f"{base}/category/garden", stores)
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    assert db.pages.count_documents({"url": f"{base}/product/NOPE"}) == 0
    assert db.pages.count_documents({"callback": "parse_product"}) == 5
    assert [(d["url"], d["status"]) for d in db.failures.find()] == [
        (f"{base}/product/NOPE", 404)]  # the errback's item, stored as in a crawl
    assert "'webfarm/items/errback_pages_not_stored': 1" in out
    again = reparse("test_errback_callback", stores)
    assert "errors=0" in again and "Traceback" not in again, again[-2000:]
    # A recrawl's refetch goes to parse_product with its errback (it went without one).
    assert {d.get("errback") for d in db.pages.find({"callback": "parse_product"})} == {"failed"}
    due = runner.scrapy(["recrawl", "test_errback_callback", "--now", "+200000", *SPIDERS],
                        runner.env_for(**stores), timeout=60)
    assert due.returncode == 0, due.output[-2000:]
    frontier = frontier_of(stores["REDIS_URL"], "test_errback_callback")
    queued = [json.loads(member.split(b":", 3)[3])
              for key in frontier.server.scan_iter(match=frontier.key("q:*"))
              for member in frontier.server.zrange(key, 0, -1)]
    products = [q for q in queued if q.get("callback") == "parse_product"]
    assert len(products) == 5 and all(q.get("errback") == "failed" for q in products), queued
    done = runner.scrapy(["crawl", "test_errback_callback", *SPIDERS], runner.env_for(**stores),
                         timeout=120)  # the worker takes them as requests of the spider
    assert done.returncode == 0 and frontier.dead_letters() == [], done.output[-3000:]
    assert frontier.counts()["queued"] == 0
    db.client.close()


def test_the_meta_a_spider_gave_a_request_comes_back_on_reparse_and_recrawl(small_web, stores):
    """A callback reading response.meta["listing"] got None on re-parse and on a recrawl:
    only cb_kwargs were kept with the page, and re-parse wiped the field from 21 items."""
    base = small_web.base_urls[0]
    crawl("test_meta_callback", f"{base}/category/garden", stores)
    db = pymongo.MongoClient(stores["MONGO_URI"])[stores["MONGO_DATABASE"]]
    listing = f"{base}/category/garden"
    assert {(d["listing"], tuple(d["rank"])) for d in db.listed.find()} == {(listing, ("top", 1))}
    assert db.listed.count_documents({}) == 5
    again = reparse("test_meta_callback", stores)
    assert "changed=0" in again and "unchanged=5" in again, again[-2000:]
    assert {d["listing"] for d in db.listed.find()} == {listing}
    # The product changed on the site: its refetch reaches parse_product (a 304 would not).
    small_web.route("/product/WF01-0001", Response.html(
        '<article class="product"><h1>Renamed</h1><p class="sku">SKU: WF01-0001</p></article>'))
    env = runner.env_for(**stores)
    try:
        due = runner.scrapy(["recrawl", "test_meta_callback", "--now", "+200000", *SPIDERS],
                            env, timeout=60)
        assert due.returncode == 0, due.output[-2000:]
        refetched = runner.scrapy(["crawl", "test_meta_callback", *SPIDERS], env, timeout=120)
        assert refetched.returncode == 0, refetched.output[-3000:]
    finally:
        small_web.clear_routes()
    renamed = db.listed.find_one({"_id": "WF01-0001"})
    assert renamed["extracted_at"] > renamed["first_extracted_at"]  # extracted again...
    assert renamed["listing"] == listing and renamed["rank"] == ["top", 1]  # ...with its meta
    stored = db.pages.find_one({"url": f"{base}/product/WF01-0001"})
    assert "proxy" not in (stored.get("meta") or "")
    db.client.close()
