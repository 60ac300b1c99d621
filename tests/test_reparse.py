"""``scrapy reparse``: items re-extracted from stored pages, with no network at all."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import time
from pathlib import Path

import pymongo
import pytest
import redis

from tests import runner, servers
from tests.relay import Relay
from tests.spiders.products import ProductsSpider

SPIDERS = ["-s", "SPIDER_MODULES=spiders,tests.spiders"]


class AsyncExtract(ProductsSpider):
    name = "async_extract"

    async def extract(self, response):
        yield {"url": response.url}


class CoroutineExtract(ProductsSpider):
    name = "coroutine_extract"

    async def extract(self, response):
        return [{"url": response.url}]


@pytest.mark.parametrize("spider", [AsyncExtract, CoroutineExtract])
def test_an_async_extract_is_refused_before_anything_starts(spider):
    """The crawl and reparse call ``check_arguments`` first: one line instead of an error on
    every page (an async generator is not iterable)."""
    with pytest.raises(ValueError, match=rf"{spider.__name__}.extract is 'async def'; make it "
                                         "a plain 'def'"):
        spider.check_arguments(start="http://shop.test/")


def counts(output: str) -> dict[str, int]:
    line = next(x for x in output.splitlines() if x.startswith("created="))
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}


def test_reparse_reextracts_without_network(web, redis_url, mongo_uri, mongo_db_name, tmp_path):
    base = web.base_urls[0]
    env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri, MONGO_DATABASE=mongo_db_name,
                         BLOB_STORE_URI=(tmp_path / "blobs").as_uri())
    crawl = runner.scrapy(["crawl", "test_products", "-a", f"start={base}/", *SPIDERS], env, 180)
    assert crawl.returncode == 0 and "Traceback" not in crawl.output, crawl.output[-3000:]

    db = pymongo.MongoClient(mongo_uri, tz_aware=True)[mongo_db_name]
    pages = len(web.expected_pages(base))
    shop_skus = 36  # 3 categories x 12 products (TestWeb defaults)
    assert db.pages.count_documents({}) == pages
    assert db.products.count_documents({}) == shop_skus
    assert db.page_title.count_documents({}) == pages
    assert db.skus_seen.count_documents({}) == shop_skus
    product = db.products.find_one({"_id": "WF01-0001"})
    page = db.pages.find_one({"url": product["source_url"]})
    assert page["url"] in (f"{base}/product/WF01-0001", f"{base}/print/product/WF01-0001")
    assert product["content_hash"] == page["content_hash"]
    assert product["extractor_version"] == "1" and product["price"].startswith("$")
    assert isinstance(product["extracted_at"], dt.datetime)
    assert "sku_1" in db.products.index_information()

    web.clear_hits()
    began = dt.datetime.now(dt.timezone.utc)
    first = runner.scrapy(["reparse", "test_products", *SPIDERS, "--progress-every", "20"], env)
    assert first.returncode == 0, first.output[-3000:]
    # Unchanged items are stamped too (the README: items older than a full re-parse are
    # those no page yields any more).
    assert db.products.count_documents({"extracted_at": {"$lt": began}}) == 0
    # Every item a crawl stored comes out the same: titles, products and dicts of 86 pages.
    items = pages + 2 * shop_skus * 2  # product and print page each yield a product and a dict
    assert counts(first.output) == {"created": 0, "changed": 0, "unchanged": items,
                                    "dropped": 0, "pages": pages, "items": items,
                                    "errors": 0}
    assert "reparse: 20 pages" in first.output and "reparse: 80 pages" in first.output
    assert "Spider opened" not in first.output and "Crawled (" not in first.output

    # A better extractor (prices in cents) over one category's product pages; two items lost.
    db.products.delete_many({"_id": {"$in": ["WF01-0001", "WF01-0002"]}})
    cents = ["reparse", "test_products", "-a", "variant=cents", *SPIDERS, "--url-pattern",
             r"^http://[^/]+/product/WF01-"]
    expected = {"created": 2, "changed": 10, "unchanged": 24, "dropped": 0, "pages": 12,
                "items": 36, "errors": 0}
    preview = runner.scrapy([*cents, "--dry-run", "--show-changes", "3"], env)
    assert preview.returncode == 0, preview.output[-3000:]
    assert counts(preview.output) == expected and "(dry run: nothing written)" in preview.output
    shown = re.findall(r"would change products '(WF01-\d+)': price: '\$[\d.,]+' -> '\d+'",
                       preview.output)
    assert len(shown) == 3, preview.output[-3000:]
    assert db.products.find_one({"_id": "WF01-0003"})["extractor_version"] == "1"
    assert db.products.count_documents({}) == shop_skus - 2  # the dry run wrote nothing
    second = runner.scrapy(cents, env)
    assert second.returncode == 0, second.output[-3000:]
    assert counts(second.output) == expected
    cents = db.products.find_one({"_id": "WF01-0003"})
    assert cents["price"].isdigit() and cents["extractor_version"] == "2"
    assert db.products.find_one({"_id": "WF02-0001"})["extractor_version"] == "1"

    later = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1)).isoformat()
    none = runner.scrapy(["reparse", "test_products", *SPIDERS, "--since", later], env)
    assert counts(none.output)["pages"] == 0 and none.returncode == 0
    assert f"no stored page of 'test_products' matched in {mongo_uri}, database " \
           f"'{mongo_db_name}'; check MONGO_URI" in none.stderr
    assert "(or crawl it first: scrapy crawl test_products)" in none.stderr

    bad = runner.scrapy(["reparse", "test_products", *SPIDERS, "--since", "yesterday"], env)
    assert bad.returncode == 2 and "not an ISO date" in bad.stderr
    bad = runner.scrapy(["reparse", "test_products", *SPIDERS, "--shard", "4/4"], env)
    assert bad.returncode == 2 and "--shard '4/4': use K/N with 0 <= K < N" in bad.stderr
    # Two shards together re-parse every page once: their counts add up to a whole run's.
    halves = [counts(runner.scrapy(["reparse", "test_products", *SPIDERS, "--shard", f"{k}/2"],
                                   env).output) for k in (0, 1)]
    assert all(h["pages"] for h in halves) and sum(h["pages"] for h in halves) == pages
    # The project's own pipelines (ITEM_PIPELINES) clean items before they are stored.
    cleaned = runner.scrapy(["reparse", "test_products", *SPIDERS, "--url-pattern", "/about$",
                             "--dry-run", "-s",
                             'ITEM_PIPELINES={"tests.test_reparser.Cleaner": 200}'], env)
    assert cleaned.returncode == 0, cleaned.output[-3000:]
    assert counts(cleaned.output)["changed"] == 1
    assert re.search(r"would change page_title '[^']+/about': title: 'About us \| Acme "
                     r"Outfitters' -> 'ABOUT US \| ACME OUTFITTERS'", cleaned.output)
    assert web.hits == []  # not one request reached the test web, robots.txt included
    # A damaged blob: its page is skipped, and the run says how to repair it (blobs are
    # write-once: a refetch alone kept the damaged one, and nothing said so).
    about = db.pages.find_one({"url": f"{base}/about"})
    (tmp_path / "blobs" / about["blob_key"]).write_bytes(b"\x28\xb5\x2f\xfd damaged")
    damaged = runner.scrapy(["reparse", "test_products", *SPIDERS, "--url-pattern", "/about$"],
                            env)
    assert damaged.returncode == 1 and "is damaged" in damaged.stderr
    # The summary counts it (errors=0 alone, a script reading it missed the skipped page).
    assert re.search(r"^created=.* errors=0 damaged_blobs=1$", damaged.stdout, re.M), (
        damaged.stdout)
    assert ("to repair a missing or damaged blob, delete it from the blob store (if damaged), "
            "then fetch its page again: scrapy seed test_products --force URL") in damaged.stderr


def wait_log(log: Path, text: str, proc, timeout: float = 60) -> None:
    servers.wait_for(lambda: text in log.read_text(errors="replace") or proc.poll() is not None,
                     timeout, f"{text!r} in the reparse log")
    assert text in log.read_text(errors="replace"), log.read_text(errors="replace")[-3000:]


def test_reparse_waits_out_store_outages_and_stops_past_the_limit(
        web, redis_url, own_mongo, s3_server, s3_bucket, tmp_path):
    base = web.base_urls[0]
    relay = Relay(int(s3_server.url.rsplit(":", 1)[1]))
    env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=own_mongo.url, MONGO_DATABASE="rp",
                         BLOB_STORE_URI=f"s3://{s3_bucket}/rp",
                         AWS_ENDPOINT_URL=f"http://127.0.0.1:{relay.port}",
                         WEBFARM_S3_MAX_ATTEMPTS="1")
    admin = pymongo.MongoClient(own_mongo.url).admin

    def mongo_writes(mode: str) -> None:  # the server drops a write's connection, as if down
        admin.command("configureFailPoint", "failCommand", mode=mode,
                      data={"failCommands": ["insert", "update"], "closeConnection": True})

    try:
        crawl = runner.scrapy(["crawl", "test_products", "-a", f"start={base}/", *SPIDERS], env,
                              180)
        assert crawl.returncode == 0, crawl.output[-3000:]
        db = pymongo.MongoClient(own_mongo.url)["rp"]
        pages, products = db.pages.count_documents({}), db.products.count_documents({})
        assert products == 36
        db.products.delete_many({})  # lost, say: a re-parse must store them again
        web.clear_hits()

        # MongoDB refuses writes for longer than the limit: the run stops and says what to do.
        mongo_writes("alwaysOn")
        stopped = runner.scrapy(["reparse", "test_products", *SPIDERS, "--batch-size", "20",
                                 "-s", "WEBFARM_STORAGE_RETRY_SECONDS=1"], env)
        assert stopped.returncode == 3, stopped.output[-3000:]
        assert re.search(r"reparse stopped after [1-9]\d* pages: writing items to MongoDB "
                         r"failed for [\d.]+s \(WEBFARM_STORAGE_RETRY_SECONDS=1\).*\. The 0 items "
                         r"written stay; \d+ extracted were not written yet .*\. Run the same "
                         "command again", stopped.stderr
                         ), stopped.stderr[-2000:]
        assert db.products.count_documents({}) == 0
        # Ctrl-C while it waits: the same stop, the same advice.
        log = tmp_path / "interrupted.log"
        proc = runner.popen(["reparse", "test_products", *SPIDERS], env, log)
        try:
            wait_log(log, "writing items to MongoDB failed", proc)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(30) == 3
        finally:
            proc.kill()
        assert re.search(r"stopped after [1-9]\d* pages: interrupted\. The 0 items written "
                         "stay", log.read_text()), log.read_text()[-2000:]

        # Both stores go away for a while during one run: it waits, then finishes the job.
        log = tmp_path / "reparse.log"
        proc = runner.popen(["reparse", "test_products", *SPIDERS, "--batch-size", "20",
                             "-s", "WEBFARM_STORAGE_RETRY_SECONDS=60"], env, log)
        try:
            wait_log(log, "writing items to MongoDB failed", proc)
            relay.cut()  # S3 unreachable (connections reset and dropped)...
            mongo_writes("off")  # ...as MongoDB comes back
            wait_log(log, f"reading blobs from s3://{s3_bucket}/rp failed", proc)
            time.sleep(1)
            relay.restore()
            proc.wait(90)
        finally:
            proc.kill()
        output = log.read_text(errors="replace")
        assert proc.returncode == 0, output[-3000:]
        assert "writing items to MongoDB works again" in output
        assert f"reading blobs from s3://{s3_bucket}/rp works again" in output
        done = counts(output)
        assert done["created"] == 36 and done["pages"] == pages and done["errors"] == 0
        assert "0 missing blobs, 0 damaged" in output
        assert db.products.count_documents({}) == 36
        assert web.hits == []

        # SIGTERM (systemd, scrapyd) while blob reads hang (an endpoint that stopped
        # answering): the same stop as Ctrl-C's (it was exit 143, no summary), and the reads
        # read ahead must not hold the exit for their timeouts.
        relay.delay = 0.2  # a slow endpoint, so that the run is still going after 5 pages
        log = tmp_path / "hang.log"
        proc = runner.popen(["reparse", "test_products", *SPIDERS, "--progress-every", "5"],
                            env, log)
        try:
            wait_log(log, "reparse: 5 pages", proc)
            relay.delay = 1000  # every reply from now on is held
            time.sleep(1)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 3
        finally:
            proc.kill()
        assert re.search(r"stopped after [1-9]\d* pages: stopped by SIGTERM\. The \d+ items "
                         "written stay", log.read_text()), log.read_text()[-2000:]

        # Left alone, a hang is an outage: said, waited out, and past the limit the run
        # stops. It waited for the S3 client's read timeout (30 s) a try, unsaid, and a
        # limit shorter than that was never kept.
        relay.delay = 0.2
        log = tmp_path / "hung.log"
        proc = runner.popen(["reparse", "test_products", *SPIDERS, "--progress-every", "5",
                             "-s", "WEBFARM_STORAGE_RETRY_SECONDS=2"], env, log)
        try:
            wait_log(log, "reparse: 5 pages", proc)
            relay.delay = 1000
            hung = time.monotonic()
            assert proc.wait(30) == 3, log.read_text()[-3000:]
            took = time.monotonic() - hung
        finally:
            proc.kill()
        output = log.read_text()
        assert re.search(rf"reading blobs from s3://{s3_bucket}/rp failed \(TimeoutError: no "
                         r"answer in 2s reading raw/", output), output[-3000:]
        assert re.search(r"reparse stopped after \d+ pages: reading blobs from .* failed for "
                         r"[\d.]+s \(WEBFARM_STORAGE_RETRY_SECONDS=2\)", output), output[-2000:]
        assert took < 15, took  # 2 s unanswered, then 2 s of outage
    finally:
        mongo_writes("off")
        relay.close()


def test_a_spider_with_stores_of_its_own_is_crawled_and_reparsed_there(
        web, redis_url, mongo_uri, mongo_db_name, tmp_path):
    """A spider's custom_settings name its Redis, database and bucket. Before, ``scrapy crawl``
    pinned the project's REDIS_URL and BLOB_STORE_URI over the spider's, ``scrapy reparse``
    read the project's database ("no stored page matched") and ``scrapy frontier`` showed
    the project's Redis."""
    own_db, own_blobs = f"{mongo_db_name}_own", tmp_path / "own-blobs"
    own_redis = redis_url.rsplit("/", 1)[0] + "/3"
    env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri, MONGO_DATABASE=mongo_db_name,
                         BLOB_STORE_URI=(tmp_path / "blobs").as_uri(),
                         OWN_STORES_DATABASE=own_db, OWN_STORES_REDIS=own_redis,
                         OWN_STORES_BLOBS=own_blobs.as_uri())
    crawl = runner.scrapy(["crawl", "test_own_stores", "-a", f"start={web.base_urls[0]}/",
                           "-a", "max_pages=5", *SPIDERS], env, 120)
    assert crawl.returncode == 0 and "Traceback" not in crawl.output, crawl.output[-3000:]
    client = pymongo.MongoClient(mongo_uri)
    try:
        stored = client[own_db].pages.count_documents({})
        assert stored >= 5
        assert mongo_db_name not in client.list_database_names()  # not even its indexes
        hashes = set(client[own_db].pages.distinct("content_hash"))
        assert {p.name.split(".")[0] for p in own_blobs.rglob("*") if p.is_file()} == hashes
        assert not (tmp_path / "blobs").exists()

        reparse = runner.scrapy(["reparse", "test_own_stores", "-a", f"start={web.base_urls[0]}/",
                                 *SPIDERS, "--dry-run"], env)
        assert reparse.returncode == 0, reparse.output[-3000:]
        assert counts(reparse.output)["pages"] == stored

        frontier = runner.scrapy(["frontier", "test_own_stores", "--json", *SPIDERS], env)
        assert frontier.returncode == 0, frontier.output[-3000:]
        shown = json.loads(frontier.stdout)
        assert shown["redis"] == own_redis and shown["seen"] >= stored
        assert redis.Redis.from_url(redis_url).dbsize() == 0  # the project's Redis: unused
    finally:
        client.drop_database(own_db)
        client.close()


def test_reparse_of_a_spider_that_keeps_no_pages_says_why_and_fails(stores):
    """A plain Scrapy spider stores its items but no raw pages: "no stored page of it
    matched ... (or crawl it first)", exit 0, sent its user to crawl again for nothing."""
    result = runner.scrapy(["reparse", "test_errbacks", *SPIDERS], runner.env_for(**stores),
                           timeout=60)
    assert result.returncode == 2, result.output[-2000:]
    assert ("test_errbacks is a Spider, not a WebfarmSpider: it stores its items but not its "
            "raw pages, so there is nothing to re-parse") in result.stderr
    assert "its callbacks work as they are" in result.stderr  # no rewrite into extract()
