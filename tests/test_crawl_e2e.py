"""A real ``scrapy crawl generic`` through every stage: frontier, fetch, hash, blobs, index."""

from __future__ import annotations

import collections
import re
import uuid

import boto3
import pymongo
import pytest
import redis
from scrapy.utils.test import get_crawler

from tests import runner
from webfarm.blobstore import open_blob_store
from webfarm.urls import canonical_url


def crawl(web, env, base_url, timeout=120):
    result = runner.scrapy(["crawl", "generic", "-a", f"start={base_url}/"], env, timeout)
    assert result.returncode == 0, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    return result


def stored_urls(db):
    return {doc["url"] for doc in db.pages.find()}


def assert_each_url_fetched_once(web, base_url):
    host = base_url.split("//")[1]
    paths = [h.path for h in web.hits_for(host=host) if h.path != "/robots.txt"]
    counts = collections.Counter(canonical_url(f"http://{host}{p}") for p in paths)
    assert counts and max(counts.values()) == 1, [u for u, n in counts.items() if n > 1]


def test_crawl_stores_every_page_once_on_file_store(web, redis_url, mongo_uri, mongo_db_name,
                                                    tmp_path):
    base, other = web.base_urls
    blobs_dir = tmp_path / "blobs"
    env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri, MONGO_DATABASE=mongo_db_name,
                         BLOB_STORE_URI=blobs_dir.as_uri())
    crawl(web, env, base)

    db = pymongo.MongoClient(mongo_uri)[mongo_db_name]
    assert stored_urls(db) == web.expected_pages(base)
    assert db.contents.count_documents({}) == web.expected_contents(base)
    store = open_blob_store(blobs_dir.as_uri())
    blob_keys = set(store.iter_keys())
    assert blob_keys == {doc["blob_key"] for doc in db.contents.find()}
    for doc in db.pages.find():
        assert doc["blob_key"] in blob_keys and doc["status"] == 200
        assert doc["fetch_method"] == "http" and doc["spider"] == "generic"
    # The print mirror shares its product page's content and points at it.
    mirror = db.pages.find_one({"url": f"{base}/print/product/WF01-0001"})
    product = db.pages.find_one({"url": f"{base}/product/WF01-0001"})
    assert mirror["content_hash"] == product["content_hash"]
    assert {mirror["duplicate_of"], product["duplicate_of"]} - {None} <= {mirror["_id"],
                                                                          product["_id"]}
    # Tracking-parameter variants were not fetched again; the other host was never touched.
    assert_each_url_fetched_once(web, base)
    assert web.hits_for(host=other) == []
    assert store.get(product["blob_key"]).startswith(b"<!DOCTYPE html")

    # The same crawl again (fresh frontier, same index and blobs): nothing new is stored.
    redis.Redis.from_url(redis_url).flushall()
    crawl(web, env, base)
    assert stored_urls(db) == web.expected_pages(base)
    assert db.contents.count_documents({}) == web.expected_contents(base)
    assert set(store.iter_keys()) == blob_keys
    assert {doc["fetch_count"] for doc in db.pages.find()} == {2}
    assert {doc["url_count"] for doc in db.contents.find()} <= set(range(1, 10))
    assert sum(doc["url_count"] for doc in db.contents.find()) == len(web.expected_pages(base))


def test_crawl_writes_blobs_to_s3(web, redis_url, mongo_uri, mongo_db_name, s3_server, s3_bucket):
    base = web.base_urls[1]
    env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri, MONGO_DATABASE=mongo_db_name,
                         BLOB_STORE_URI=f"s3://{s3_bucket}/pages", AWS_ENDPOINT_URL=s3_server.url)
    crawl(web, env, base)

    db = pymongo.MongoClient(mongo_uri)[mongo_db_name]
    assert stored_urls(db) == web.expected_pages(base)
    s3 = boto3.client("s3", endpoint_url=s3_server.url)
    listed = s3.list_objects_v2(Bucket=s3_bucket, Prefix="pages/raw/")
    keys = {obj["Key"].removeprefix("pages/") for obj in listed.get("Contents", [])}
    assert keys == {doc["blob_key"] for doc in db.contents.find()}
    assert len(keys) == web.expected_contents(base)
    page = db.pages.find_one({"url": f"{base}/about"})
    store = open_blob_store(f"s3://{s3_bucket}/pages", endpoint_url=s3_server.url)
    meta = store.metadata(page["blob_key"])
    assert meta["url"].startswith(base) and meta["content-type"].startswith("text/html")
    assert b"<html" in store.get(page["blob_key"])


@pytest.mark.parametrize("spider_args, message", [
    ([], "generic needs -a start=URL"),
    (["-a", "start=ftp://example.com/"], "not an http(s) URL"),
    (["-a", "start=http://127.0.0.2:1/", "-a", "max_pages=ten"], "not a whole number"),
    (["-a", "start_urls=ftp://example.com/"], "not an http(s) URL"),
    # A typo crawled the whole site (max_pages unset) or left the scope to the start URLs.
    (["-a", "start=http://127.0.0.2:1/", "-a", "max_page=10"],
     "-a max_page: no such argument; did you mean -a max_pages?"),
    (["-a", "start=http://127.0.0.2:1/", "-a", "domains=https://127.0.0.2:1/blog/"],
     "domains: 'https://127.0.0.2:1/blog/' is a URL with a path; give its host, '127.0.0.2:1'"),
])
def test_bad_spider_arguments(redis_url, mongo_uri, tmp_path, spider_args, message):
    env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri,
                         MONGO_DATABASE=f"wf_{uuid.uuid4().hex[:8]}",
                         BLOB_STORE_URI=(tmp_path / "b").as_uri())
    result = runner.scrapy(["crawl", "generic", *spider_args], env, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("webfarm: generic:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]


def test_scrapy_argument_names_start_urls_and_allowed_domains_work_as_start_and_domains():
    """Scrapy users write ``-a start_urls=URL``: Scrapy sets it as a string, which was read
    one character at a time ("Missing scheme in request url: h"); ``-a allowed_domains``
    was replaced by the start URLs' hosts."""
    from spiders.generic import GenericSpider

    spider = GenericSpider(start_urls="http://a.test/,http://b.test:8080/x",
                           allowed_domains="a.test, b.test:8080")
    assert spider.start_urls == ["http://a.test/", "http://b.test:8080/x"]
    assert spider.hosts == ["a.test", "b.test:8080"]
    assert spider.allowed_domains == ["a.test", "b.test"]
    both = GenericSpider(start="http://a.test/", start_urls=["http://c.test/"])  # from code
    assert both.start_urls == ["http://a.test/", "http://c.test/"]
    with pytest.raises(ValueError, match="'h' is not an http"):
        GenericSpider.check_arguments(start_urls="h")


def test_a_spiders_own_arguments_pass_and_a_near_miss_of_the_base_ones_is_refused():
    """Scrapy sets an ``-a`` nothing reads as an attribute, for the spider's own code; a
    near miss of one webfarm reads (``max_page``) is a typo, whatever the spider."""
    from spiders.base import WebfarmSpider

    class Shop(WebfarmSpider):
        name = "shop"
        category: str | None = None
        star = None  # its own, though one letter from start

        def __init__(self, region: str = "eu", **kwargs):
            super().__init__(**kwargs)
            self.region = region

    ok = Shop.check_arguments(start="http://a.test/", category="books", region="us",
                              star="5", price_max="9", _job="abc")
    assert ok["start"] == ["http://a.test/"]
    for typo, meant in [("max_page", "max_pages"), ("domain", "domains"),
                        ("start_url", "start_urls"), ("regoin", "region")]:
        with pytest.raises(ValueError, match=f"-a {typo}: no such argument; did you mean "
                                             f"-a {meant}\\? \\(a spider that reads"):
            Shop.check_arguments(start="http://a.test/", **{typo: "1"})



@pytest.mark.parametrize(("name", "message"), [
    ("domain", "-a domain: no such argument; did you mean -a domains?"),
    ("depth", "-a depth: no such argument; generic takes -a start, domains, max_pages"),
    # one of its attributes: Scrapy would set the string "false", which is true
    ("follow_links", "-a follow_links: no such argument; generic takes -a start, domains"),
    # Scrapy's spider attributes: their settings, which Scrapy reads now, are named.
    ("user_agent", "-a user_agent: generic takes Scrapy's setting for it instead, "
                   "-s USER_AGENT=VALUE (Scrapy deprecates the spider attribute)"),
    ("download_delay", "-a download_delay: generic takes Scrapy's setting for it instead, "
                       "-s DOWNLOAD_DELAY=VALUE"),
    ("http_pass", "-s HTTPAUTH_PASS=VALUE"),
])
def test_generic_refuses_any_argument_it_does_not_read(name, message):
    from spiders.generic import GenericSpider

    with pytest.raises(ValueError, match=re.escape(message)):
        GenericSpider.check_arguments(start="http://a.test/", **{name: "false"})
    assert GenericSpider.check_arguments(start="http://a.test/", _job="1")["start"]


LINKS = ["http://example.com/a", "https://www.example.com:8443/b", "http://xn--bcher-kva.de/c",
         "http://shop.test:8080/d", "http://shop.test:9090/e", "https://shop.test/f",
         "http://other.test/g", "http://notexample.com/h"]


def followed(spider) -> list[str]:
    """The links ``spider`` follows from a page linking to :data:`LINKS`, as far as Scrapy's
    offsite middleware lets them through too."""
    from scrapy.downloadermiddlewares.offsite import OffsiteMiddleware
    from scrapy.http import HtmlResponse

    body = "".join(f'<a href="{url}">x</a>' for url in LINKS).encode()
    page = HtmlResponse("http://example.com/", body=body, encoding="utf-8")
    offsite = OffsiteMiddleware.from_crawler(get_crawler(type(spider)))
    return [r.url for r in spider.follow(page) if offsite.should_follow(r, spider)]


def test_domains_are_matched_however_the_user_spells_them():
    """``-a domains=`` given as ``Example.COM``, an IDN or a site's root URL matched no link
    (links' hosts are lower case and punycode), so the crawl stopped after its start pages
    without a word; ``host:443`` did not match ``https://host/``."""
    from spiders.generic import GenericSpider

    spider = GenericSpider(domains="Example.COM,Bücher.de,http://shop.test:8080/,shop.test:443")
    assert spider.hosts == ["example.com", "xn--bcher-kva.de", "shop.test:8080", "shop.test:443"]
    assert followed(spider) == ["http://example.com/a", "https://www.example.com:8443/b",
                                "http://xn--bcher-kva.de/c", "http://shop.test:8080/d",
                                "https://shop.test/f"]


def test_a_scrapy_spider_s_allowed_domains_attribute_sets_its_hosts():
    """A spider written the Scrapy way (``allowed_domains`` on the class) had them replaced
    by its start URLs' hosts: ``www.example.com`` only, not the domain it named."""
    from spiders.base import WebfarmSpider

    class Shop(WebfarmSpider):
        name = "shop"
        start_urls = ["https://www.example.com/"]
        allowed_domains = ["example.com", "shop.test"]

    assert followed(Shop()) == ["http://example.com/a", "https://www.example.com:8443/b",
                                "http://shop.test:8080/d", "http://shop.test:9090/e",
                                "https://shop.test/f"]
    Shop.hosts = ["*.example.com"]  # hosts, when given, win; a bad one says what to write
    with pytest.raises(ValueError, match=r"Shop\.hosts: '\*\.example\.com': give 'example\.com'"):
        Shop()


def test_crawl_with_scrapys_argument_names(web, redis_url, mongo_uri, mongo_db_name, tmp_path):
    base, other = web.base_urls
    host = base.split("//")[1]
    env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri, MONGO_DATABASE=mongo_db_name,
                         BLOB_STORE_URI=(tmp_path / "b").as_uri())
    result = runner.scrapy(["crawl", "generic", "-a", f"start_urls={base}/about",
                            "-a", f"allowed_domains={host}", "-a", "max_pages=1"], env, 120)
    assert result.returncode == 0 and "ERROR" not in result.output, result.output[-3000:]
    db = pymongo.MongoClient(mongo_uri)[mongo_db_name]
    assert f"{base}/about" in stored_urls(db)
    assert web.hits_for(host=other.split("//")[1]) == []


def test_a_spider_whose_start_requests_scrapy_no_longer_calls_is_refused():
    """Scrapy 2.19 calls start() only: such a spider crawled nothing, without a word."""
    from scrapy.spiders import SitemapSpider
    from scrapy_redis.spiders import RedisSpider

    from spiders.generic import GenericSpider
    from tests.spiders.old_start import BothStartsSpider, OldStartSpider
    from tests.spiders.scrapy_spiders import ShopCrawlSpider
    from webfarm.commands.crawl import refuse_ignored_start_requests

    with pytest.raises(ValueError, match=r"defines start_requests\(\), which Scrapy 2\.19 "
                                         r"no longer calls .*'async def start\(self\)'"):
        refuse_ignored_start_requests(OldStartSpider)
    with pytest.raises(ValueError, match=r"scrapy-redis spider, whose start URLs come from a "
                                         r"Redis list .*'scrapy seed SPIDER URL\.\.\.'"):
        refuse_ignored_start_requests(type("Migrated", (RedisSpider,), {"name": "migrated"}))
    for spider in (BothStartsSpider, GenericSpider, ShopCrawlSpider, SitemapSpider):
        refuse_ignored_start_requests(spider)


def test_crawl_refuses_a_spider_written_for_start_requests(redis_url, mongo_uri, tmp_path):
    env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri,
                         MONGO_DATABASE=f"wf_{uuid.uuid4().hex[:8]}",
                         BLOB_STORE_URI=(tmp_path / "b").as_uri())
    result = runner.scrapy(["crawl", "test_old_start", "-s",
                            "SPIDER_MODULES=spiders,tests.spiders"], env, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.output, result.output[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("webfarm:")]
    assert errors == ["webfarm: test_old_start: it defines start_requests(), which Scrapy 2.19 "
                      "no longer calls (it calls start()); rename it 'async def start(self)' "
                      "and keep its body, its yields included"], result.stderr[-2000:]


@pytest.mark.parametrize(("start", "message"), [
    ("shop.example/", "is not an http(s) URL: write it with its scheme, e.g. "
                      "'https://shop.example/'"),
    ("127.0.0.41:8098/", "e.g. 'https://127.0.0.41:8098/'"),
])
def test_a_start_url_without_its_scheme_is_told_how_to_write_it(start, message):
    from spiders.generic import GenericSpider

    with pytest.raises(ValueError, match=re.escape(message)):
        GenericSpider.check_arguments(start=start)
