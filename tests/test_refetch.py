"""Keeping a corpus fresh, end to end: real crawls, `scrapy recrawl`, continuous recrawl.

Test-web pages change when the test says so. A churning page changes before every
recrawl round, a static one never does: after a few rounds the churning page's interval
has shrunk and the static one's has grown, and the static page was answered with 304s
(conditional requests, no body, no new blob) while its fetch count went up.
"""

from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import threading
import time
from email.utils import formatdate, parsedate_to_datetime

import pymongo
import pytest
import redis
from scrapy.settings import Settings

from tests import crawlcheck, runner
from tests.testweb import Response
from tests.testweb.server import validators_for
from webfarm.blobstore import open_blob_store
from webfarm.queue import decode_request, open_frontier
from webfarm.recrawl import Recrawler, due_pages, lock_key, take_lock
from webfarm.urls import RequestFingerprinter, url_fingerprint

ROUNDS = 4
POLICY = {"WEBFARM_REFETCH_POLICY": "webfarm.refetch.RefetchPolicy",
          "WEBFARM_REFETCH_INTERVAL": "2", "WEBFARM_REFETCH_MIN": "1",
          "WEBFARM_REFETCH_MAX": "60", "WEBFARM_REFETCH_COST": "0.5"}


class ChangingSite:
    """``/fresh/`` links to ``/fresh/churn`` (changes on :meth:`change`) and
    ``/fresh/static`` (never changes). Answers conditional requests itself and logs 304s."""

    def __init__(self) -> None:
        self.version = 0
        self.not_modified: list[str] = []
        self.gone: dict[str, int] = {}  # path -> the status it answers instead (404, 410)
        self.lock = threading.Lock()

    def change(self) -> None:
        with self.lock:
            self.version += 1

    def __call__(self, info):
        with self.lock:
            version = self.version
            gone = self.gone.get(info.path)
        if gone:
            return Response.html(f"<html><body><h1>Error {gone}</h1></body></html>", gone,
                                 headers={"ETag": f'"error-{gone}"'})
        if info.path == "/fresh/":
            body = ('<html><body><h1>Fresh</h1><a href="/fresh/churn">churn</a> '
                    '<a href="/fresh/static">static</a></body></html>')
            modified = 1704067200
        elif info.path == "/fresh/churn":
            body = f"<html><body><h1>Prices</h1><p>price version {version}</p></body></html>"
            modified = 1704067200 + 60 * version
        elif info.path == "/fresh/static":
            body = "<html><body><h1>About</h1><p>We never change.</p></body></html>"
            modified = 1704067200
        else:
            return None
        validators = validators_for(body.encode(), modified)
        if fresh(info.headers, validators):
            with self.lock:
                self.not_modified.append(info.path)
            return Response(304, dict(validators))
        return Response.html(body, headers=validators)


def fresh(request_headers: dict, validators: dict) -> bool:
    if "if-none-match" in request_headers:
        return validators["ETag"] in [t.strip() for t in request_headers["if-none-match"]
                                      .split(",")]
    since = request_headers.get("if-modified-since")
    return bool(since) and (parsedate_to_datetime(validators["Last-Modified"])
                            <= parsedate_to_datetime(since))


@pytest.fixture()
def site(web):
    changing = ChangingSite()
    web.route("/fresh/", changing, host=web.base_urls[0])
    return changing


@pytest.fixture()
def env(redis_url, mongo_uri, mongo_db_name, tmp_path):
    return runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri,
                          MONGO_DATABASE=mongo_db_name,
                          BLOB_STORE_URI=(tmp_path / "blobs").as_uri(), **POLICY)


def ok(result: runner.Result) -> str:
    assert result.returncode == 0, result.output[-3000:]
    assert "Traceback" not in result.output, result.output[-3000:]
    return result.output


def page(db, url: str) -> dict:
    doc = db.pages.find_one({"_id": url_fingerprint(url)})
    assert doc is not None, url
    return doc


def wait_fetched(db, urls, count, worker, log, timeout=60.0) -> None:
    """Until every page of ``urls`` was fetched ``count`` times (the worker must live)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        docs = [db.pages.find_one({"_id": url_fingerprint(u)}) for u in urls]
        if all(d is not None and d["fetch_count"] >= count for d in docs):
            return
        assert worker.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    pytest.fail(f"pages not fetched {count} times in {timeout:.0f} s: "
                f"{log.read_text()[-3000:]}")


def fresh_worker(web, env: dict, mongo_uri: str, mongo_db_name: str, tmp_path):
    """A worker that crawls /fresh/ and stays up (WEBFARM_IDLE_TIMEOUT=0), fetching whatever
    each recrawl round enqueues. Returns the index database, the churning and static
    pages' URLs by name, every page's URL, the worker and its log's path."""
    base = web.base_urls[0]
    db = pymongo.MongoClient(mongo_uri, tz_aware=True)[mongo_db_name]
    urls = {name: f"{base}/fresh/{name}" for name in ("churn", "static")}
    log = tmp_path / "worker.log"
    worker = runner.popen(["crawl", "generic", "-a", f"start={base}/fresh/"],
                          {**env, "WEBFARM_IDLE_TIMEOUT": "0"}, log)
    return db, urls, [f"{base}/fresh/", *urls.values()], worker, log


def stop(proc) -> None:
    """Ctrl-C, as a user would stop a worker; killed if it does not stop in 30 s."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def test_recrawl_rounds_adapt_intervals_and_send_conditional_requests(web, site, env,
                                                                     mongo_uri, mongo_db_name,
                                                                     tmp_path):
    db, urls, everything, worker, log = fresh_worker(web, env, mongo_uri, mongo_db_name,
                                                     tmp_path)
    try:
        wait_fetched(db, everything, 1, worker, log)
        first = {name: page(db, url) for name, url in urls.items()}
        assert {d["refetch_interval"] for d in first.values()} == {2.0}
        assert first["static"]["etag"] and first["static"]["last_modified"]
        contents_before = db.contents.count_documents({})
        blobs_before = set(open_blob_store((tmp_path / "blobs").as_uri()).iter_keys())

        intervals = {name: [2.0] for name in urls}
        for n in range(ROUNDS):
            site.change()
            out = ok(runner.scrapy(["recrawl", "generic", "--now", "+3600"], env, 60))
            assert "3 enqueued (3 conditional) of 3 due" in out, out
            wait_fetched(db, everything, n + 2, worker, log)
            for name, url in urls.items():
                intervals[name].append(page(db, url)["refetch_interval"])
    finally:
        stop(worker)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]

    churn, static = intervals["churn"], intervals["static"]
    assert all(b < a for a, b in zip(churn, churn[1:], strict=False)), churn
    assert all(b > a for a, b in zip(static, static[1:], strict=False)), static
    assert churn[-1] < 2.0 < static[-1]

    churned, stayed = page(db, urls["churn"]), page(db, urls["static"])
    assert churned["change_count"] == ROUNDS and churned["fetch_count"] == ROUNDS + 1
    assert stayed["change_count"] == 0 and stayed["fetch_count"] == ROUNDS + 1
    assert stayed["content_hash"] == first["static"]["content_hash"]
    assert churned["change_rate"] > stayed["change_rate"]
    due_in = (churned["next_fetch_at"] - churned["fetched_at"]).total_seconds()
    assert due_in == pytest.approx(churn[-1], abs=0.002)  # MongoDB keeps milliseconds
    # The static page and the hub were answered 304 every round; the churning page never.
    assert site.not_modified.count("/fresh/static") == ROUNDS
    assert site.not_modified.count("/fresh/") == ROUNDS
    assert "/fresh/churn" not in site.not_modified
    static_hits = web.hits_for(host=web.base_urls[0], path="/fresh/static")
    assert len(static_hits) == ROUNDS + 1
    assert all(h.headers.get("if-none-match") == first["static"]["etag"]
               and h.headers.get("if-modified-since") for h in static_hits[1:])
    # 304s stored nothing new: one new content (and blob) per change of the churning page.
    assert db.contents.count_documents({}) == contents_before + ROUNDS
    blobs_after = set(open_blob_store((tmp_path / "blobs").as_uri()).iter_keys())
    assert blobs_before <= blobs_after and len(blobs_after) == len(blobs_before) + ROUNDS


def test_continuous_recrawl_in_a_worker(web, site, env, mongo_uri, mongo_db_name, redis_url,
                                        tmp_path):
    """One worker with WEBFARM_RECRAWL_INTERVAL keeps refetching due pages on its own and
    does not stop when the frontier is empty (WEBFARM_IDLE_TIMEOUT is 1 s here)."""
    base = web.base_urls[0]
    db = pymongo.MongoClient(mongo_uri, tz_aware=True)[mongo_db_name]
    log = tmp_path / "worker.log"
    proc = runner.popen(["crawl", "generic", "-a", f"start={base}/fresh/"],
                        {**env, "WEBFARM_RECRAWL_INTERVAL": "1"}, log)
    try:
        deadline = time.monotonic() + 60
        static = f"{base}/fresh/static"
        while time.monotonic() < deadline:
            doc = db.pages.find_one({"_id": url_fingerprint(static)})
            if doc and doc["fetch_count"] >= 3:
                break
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        else:
            pytest.fail(f"static page not refetched twice in 60 s: {log.read_text()[-3000:]}")
        assert proc.poll() is None  # still running, though the frontier was empty between
        server = redis.Redis.from_url(redis_url)
        ttls = []
        for _ in range(20):  # the lock exists for 0.9 s of every second
            ttls.append(server.pttl(lock_key("generic")))
            time.sleep(0.1)
        assert 0 < max(ttls) <= 900, ttls
    finally:
        stop(proc)
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    assert "Recrawl: " in text and "'webfarm/recrawl/rounds'" in text
    assert site.not_modified.count("/fresh/static") >= 2
    # It stays, and says nothing of closing (it said so every second and stayed).
    assert "closing this worker" not in text


def test_a_refetch_that_finds_a_page_gone_marks_it_and_keeps_its_last_content(
        web, site, env, mongo_uri, mongo_db_name, tmp_path):
    """A stored page that now answers 404 or 410: before, Scrapy dropped the response
    unseen, so the index went on calling the page current (no fetch counted, no sign of
    it) and every recrawl round fetched it again at the old interval."""
    db, urls, everything, worker, log = fresh_worker(web, env, mongo_uri, mongo_db_name,
                                                     tmp_path)
    try:
        wait_fetched(db, everything, 1, worker, log)
        first = {name: page(db, url) for name, url in urls.items()}
        site.gone.update({"/fresh/churn": 410, "/fresh/static": 404})
        for n in (2, 3):  # two rounds: gone_at stays the first one's
            ok(runner.scrapy(["recrawl", "generic", "--now", "+3600"], env, 60))
            wait_fetched(db, everything, n, worker, log)
        gone = {name: page(db, url) for name, url in urls.items()}
        site.gone.clear()  # served again, unchanged: the next refetch's 304 says so
        ok(runner.scrapy(["recrawl", "generic", "--now", "+3600"], env, 60))
        wait_fetched(db, everything, 4, worker, log)
        back = page(db, urls["static"])
    finally:
        stop(worker)
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    for name, status in (("churn", 410), ("static", 404)):
        doc, before = gone[name], first[name]
        assert doc["last_status"] == status and doc["fetch_count"] == 3
        assert before["fetched_at"] < doc["gone_at"] < doc["fetched_at"]  # the first round's
        # The last content stays what the index, the blob store and re-parse hold.
        for field in ("status", "content_hash", "blob_key", "etag", "last_modified"):
            assert doc[field] == before[field], field
        assert doc["change_count"] == 0
        assert doc["next_fetch_at"] > doc["fetched_at"]
    assert "gone_at" not in first["static"]
    assert back["gone_at"] is None and back["last_status"] == 304
    assert back["content_hash"] == first["static"]["content_hash"]
    # A gone page still holds its content: url_count went down at each refetch that found
    # it gone, below 0 (a probe: -1, -2, -3), and stayed there when it came back.
    counts = {d["_id"]: d["url_count"] for d in db.contents.find()}
    holders: dict[str, int] = {}
    for doc in db.pages.find():
        holders[doc["content_hash"]] = holders.get(doc["content_hash"], 0) + 1
    assert counts == holders, (counts, holders)
    assert site.not_modified.count("/fresh/static") == 1
    assert "'webfarm/index/gone': 4" in text, text[-3000:]


def test_due_pages_most_overdue_first_and_queued_once(redis_url, mongo_uri, mongo_db_name):
    db = pymongo.MongoClient(mongo_uri, tz_aware=True)[mongo_db_name]
    now = dt.datetime.now(dt.timezone.utc)
    rows = [  # (path, seconds overdue, interval)
        ("/a", 60, 3600),       # ratio 0.017
        ("/b", 3600, 3600),     # ratio 1
        ("/c", 600, 60),        # ratio 10: the most overdue relative to its interval
        ("/d", -60, 3600),      # not due
    ]
    for path, late, interval in rows:
        url = f"http://127.0.0.2:9/{path.strip('/')}"
        db.pages.insert_one({
            "_id": url_fingerprint(url), "url": url, "spider": "generic",
            "refetch_interval": float(interval), "fetched_at": now - dt.timedelta(hours=5),
            "next_fetch_at": now - dt.timedelta(seconds=late),
            "etag": '"v1"' if path == "/b" else None,
            "last_modified": formatdate(1704067200, usegmt=True) if path == "/c" else None})
    db.pages.insert_one({"_id": "other", "url": "http://127.0.0.2:9/x", "spider": "other",
                         "spiders": ["other"], "refetch_interval": 1.0, "next_fetch_at": now})
    # generic stored it first, a site spider since: still generic's to refetch (it found
    # 0 due), without the site spider's callback.
    db.pages.insert_one({"_id": "both", "url": "http://127.0.0.2:9/e", "spider": "acme",
                         "spiders": ["generic", "acme"], "callback": "parse_product",
                         "refetch_interval": 3600.0,
                         "next_fetch_at": now - dt.timedelta(seconds=30)})
    due, _, _ = due_pages(db.pages, "generic", now)
    assert [p.url.rsplit("/", 1)[1] for p in due] == ["c", "b", "a", "e"]
    assert due[-1].callback is None
    db.pages.delete_one({"_id": "both"})
    due, _, _ = due_pages(db.pages, "generic", now)
    assert [p.url.rsplit("/", 1)[1] for p in due] == ["c", "b", "a"]
    assert due[0].priority > due[1].priority > due[2].priority >= 0

    settings = Settings({"DUPEFILTER_CLASS": "webfarm.dupefilter.BloomDupeFilter",
                         "SCHEDULER_QUEUE_CLASS": "webfarm.frontier.Frontier",
                         "WEBFARM_HOST_DELAY": 0})
    frontier = open_frontier(settings, "generic", redis.Redis.from_url(redis_url))
    recrawler = Recrawler(db.pages, frontier, "generic", RequestFingerprinter())
    assert recrawler.run(now, limit=2).enqueued == 2  # the two most overdue
    again = recrawler.run(now)  # /c and /b are queued and not fetched yet: only /a
    assert (again.enqueued, again.skipped_queued) == (1, 2)
    assert recrawler.run(now).enqueued == 0
    popped = [frontier.pop("w1") for _ in range(3)]
    requests = {r.url.rsplit("/", 1)[1]: r for r in
                (decode_request(p.payload, None) for p in popped if p is not None)}
    assert set(requests) == {"a", "b", "c"}
    assert requests["b"].headers.get("If-None-Match") == b'"v1"'
    assert requests["c"].headers.get("If-Modified-Since") == b"Mon, 01 Jan 2024 00:00:00 GMT"
    # 304: unchanged; 404/410: gone (both reach the spider, which records them)
    assert all(r.dont_filter and r.meta["handle_httpstatus_list"] == [304, 404, 410]
               and r.callback is None for r in requests.values())
    assert recrawler.run(now).skipped_queued == 3  # leased: still on their way
    # Dead-lettered (a page answering 503 each try): the marks hold, or each round sent
    # it again for five more tries and another dead letter (a probe: 25 requests in 80 s).
    for p in popped:
        frontier.dead(p.lease_id, "gave up after 5 attempts: HTTP 503")
    assert frontier.counts()["leased"] == 0 and frontier.counts()["dead"] == 3
    assert recrawler.run(now).skipped_queued == 3
    # The frontier was reset: none is queued any more, so none is skipped as "still queued
    # from an earlier round" (for up to its interval, an hour).
    frontier.reset()
    after_reset = recrawler.run(now)
    assert (after_reset.enqueued, after_reset.skipped_queued) == (3, 0)


def test_a_worker_s_round_enqueues_only_pages_its_offsite_filter_lets_through(
        redis_url, mongo_uri, mongo_db_name):
    """The pages of a generic crawl of another site, in the same spider's index, were
    enqueued by every round; every worker handed them back as offsite until they were dead
    letters, and the next round enqueued them again. ``scrapy recrawl`` (no spider) still
    enqueues every due page."""
    from spiders.generic import GenericSpider

    db = pymongo.MongoClient(mongo_uri, tz_aware=True)[mongo_db_name]
    now = dt.datetime.now(dt.timezone.utc)
    urls = ["http://mine.test/a", "http://www.mine.test:8080/b", "http://other.test/c"]
    for url in urls:
        db.pages.insert_one({"_id": url_fingerprint(url), "url": url, "spider": "generic",
                             "refetch_interval": 60.0, "next_fetch_at": now})
    settings = Settings({"DUPEFILTER_CLASS": "webfarm.dupefilter.BloomDupeFilter",
                         "SCHEDULER_QUEUE_CLASS": "webfarm.frontier.Frontier",
                         "WEBFARM_HOST_DELAY": 0})
    frontier = open_frontier(settings, "generic", redis.Redis.from_url(redis_url))
    spider = GenericSpider(domains="mine.test")
    worker = Recrawler(db.pages, frontier, "generic", RequestFingerprinter(), spider)
    assert sorted(p.url for p in worker.run(now).due) == urls[:2]
    command = Recrawler(db.pages, frontier, "generic", RequestFingerprinter())
    assert [p.url for p in command.run(now).due] == urls[2:]


def test_one_recrawler_at_a_time(redis_url):
    server = redis.Redis.from_url(redis_url)
    assert take_lock(server, "generic", 5, "worker-a")
    assert not take_lock(server, "generic", 5, "worker-b")
    assert server.get(lock_key("generic")) == b"worker-a"
    assert 0 < server.pttl(lock_key("generic")) <= 5000
    assert lock_key("generic") == "webfarm:{generic}:recrawl:lock"


def test_recrawl_command_dry_run_and_bad_input(env, mongo_uri, mongo_db_name):
    db = pymongo.MongoClient(mongo_uri, tz_aware=True)[mongo_db_name]
    url = "http://127.0.0.2:9/late"
    db.pages.insert_one({"_id": url_fingerprint(url), "url": url, "spider": "generic",
                         "refetch_interval": 60.0,
                         "next_fetch_at": dt.datetime.now(dt.timezone.utc)})
    out = ok(runner.scrapy(["recrawl", "generic", "--dry-run", "--json", "--now", "+120"],
                           env, 60))
    report = json.loads(out.strip().splitlines()[-1])
    assert report["due"] == 1 and report["enqueued"] == 0 and report["pages"][0]["url"] == url
    # --limit N said "N due" (a probe: "5 enqueued of 5 due" with 98 due): the rest is said
    later = "http://127.0.0.2:9/later"
    db.pages.insert_one({"_id": url_fingerprint(later), "url": later, "spider": "generic",
                         "refetch_interval": 60.0,
                         "next_fetch_at": dt.datetime.now(dt.timezone.utc)})
    out = ok(runner.scrapy(["recrawl", "generic", "--dry-run", "--now", "+120", "--limit",
                            "1"], env, 60))
    assert ("(dry run): 2 due; the 1 most overdue taken (--limit), 1 left for another run"
            in out), out
    out = ok(runner.scrapy(["recrawl", "generic", "--dry-run", "--json", "--now", "+120",
                            "--limit", "1"], env, 60))
    report = json.loads(out.strip().splitlines()[-1])
    assert (report["due"], report["taken"], report["left"], len(report["pages"])) == (2, 1, 1, 1)
    db.pages.delete_one({"_id": url_fingerprint(later)})
    result = runner.scrapy(["recrawl", "generic", "--limit", "0"], env, 60)
    assert result.returncode == 2 and "--limit 0" in result.stderr, result.output[-2000:]
    assert "Traceback" not in result.output
    bad = runner.scrapy(["recrawl", "nosuchspider"], env, 60)
    assert bad.returncode == 2 and "no spider named 'nosuchspider'" in bad.stderr
    # While another round runs (a cron run, a worker's), a second one waits its turn: two
    # at once both read the pages as not queued and queued every due page twice.
    server = redis.Redis.from_url(env["REDIS_URL"])
    server.set("webfarm:{generic}:recrawl:running", "scrapy recrawl on box:42", px=60_000)
    busy = runner.scrapy(["recrawl", "generic", "--now", "+120"], env, 60)
    assert busy.returncode == 1 and (
        "another recrawl round of generic is running (scrapy recrawl on box:42)") in busy.stderr
    assert crawlcheck.frontier(env["REDIS_URL"]).counts()["queued"] == 0
    server.delete("webfarm:{generic}:recrawl:running")
    done = ok(runner.scrapy(["recrawl", "generic", "--now", "+120", "--json"], env, 60))
    assert json.loads(done.strip().splitlines()[-1])["enqueued"] == 1
    assert server.get("webfarm:{generic}:recrawl:running") is None  # given back at its end


def test_recrawl_now_option():
    from webfarm.commands._common import CommandError
    from webfarm.commands.recrawl import parse_now

    assert parse_now("2026-05-01T12:00:00Z") == dt.datetime(2026, 5, 1, 12,
                                                           tzinfo=dt.timezone.utc)
    ahead = parse_now("+3600") - dt.datetime.now(dt.timezone.utc)
    assert 3590 < ahead.total_seconds() <= 3600
    with pytest.raises(CommandError, match="--now 'soon': give an ISO 8601 time"):
        parse_now("soon")


def test_a_round_past_its_batch_says_how_many_due_pages_wait(caplog):
    """A probe: with WEBFARM_RECRAWL_BATCH=3, "3 due pages enqueued" every round, and no
    word of the 9 more that waited for the next rounds."""
    import logging

    from scrapy.utils.test import get_crawler

    from webfarm.recrawl import DuePage, RecrawlExtension, RoundResult

    crawler = get_crawler(settings_dict={"WEBFARM_RECRAWL_INTERVAL": 10,
                                         "WEBFARM_RECRAWL_BATCH": 3})
    crawler.stats.open_spider()
    ext = RecrawlExtension.from_crawler(crawler)
    due = [DuePage(1.0, 60.0, f"http://127.0.0.2:9/{n}", str(n)) for n in range(3)]
    with caplog.at_level(logging.INFO, logger="webfarm.recrawl"):
        ext._report(RoundResult(due, enqueued=3, skipped_queued=0, total_due=12))
        ext._report(RoundResult(due, enqueued=3, skipped_queued=0, total_due=3))
    said = [r.getMessage() for r in caplog.records]
    assert said == ["Recrawl: 3 due pages enqueued (0 conditional, 0 still queued); 9 more "
                    "due, past WEBFARM_RECRAWL_BATCH=3, wait for the next rounds",
                    "Recrawl: 3 due pages enqueued (0 conditional, 0 still queued)"], said
