"""Nothing is lost when storage fails: MongoDB restarted and S3 unreachable mid-crawl, and a
store down for longer than WEBFARM_STORAGE_RETRY_SECONDS (the request goes back to the
frontier). Real servers, a real ``scrapy crawl`` subprocess."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import boto3
import pymongo

from tests import runner, servers
from tests.relay import Relay


def wait_pages(uri: str, db: str, at_least: int, timeout: float = 90) -> int:
    """Wait until ``at_least`` pages are stored; the count then."""
    client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=2000)
    try:
        servers.wait_for(lambda: client[db].pages.count_documents({}) >= at_least, timeout,
                         f"{at_least} pages stored")
        return client[db].pages.count_documents({})
    finally:
        client.close()


def finish(proc, log, timeout: float = 150) -> str:
    try:
        proc.wait(timeout)
    except Exception:
        proc.kill()
        raise
    output = log.read_text(errors="replace")
    assert proc.returncode == 0, output[-3000:]
    return output


def stat(output: str, name: str) -> int:
    found = re.search(rf"'{re.escape(name)}': (\d+)", output)
    return int(found.group(1)) if found else 0


def assert_every_page_once(web, base, db, blob_keys: set[str]) -> None:
    pages = list(db.pages.find())
    assert {d["url"] for d in pages} == web.expected_pages(base)
    assert len(pages) == len(web.expected_pages(base))  # one document per URL
    contents = list(db.contents.find())
    assert len(contents) == web.expected_contents(base)
    assert sum(c["url_count"] for c in contents) == len(pages)
    assert blob_keys == {c["blob_key"] for c in contents}  # every blob once, none missing


def crawl_env(web, redis_url, mongo_uri, db_name, blobs, **extra):
    return runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri, MONGO_DATABASE=db_name,
                          BLOB_STORE_URI=blobs, WEBFARM_HOST_DELAY="0.05", **extra)


def test_mongodb_restart_and_s3_outage_mid_crawl_lose_nothing(web, redis_url, own_mongo,
                                                               s3_server, s3_bucket, tmp_path):
    base = web.base_urls[0]
    relay = Relay(int(s3_server.url.rsplit(":", 1)[1]))
    env = crawl_env(web, redis_url, own_mongo.url, "faults", f"s3://{s3_bucket}/p",
                    AWS_ENDPOINT_URL=f"http://127.0.0.1:{relay.port}",
                    WEBFARM_STORAGE_RETRY_SECONDS="120")
    log = tmp_path / "crawl.log"
    proc = runner.popen(["crawl", "generic", "-a", f"start={base}/",
                         "-s", "WEBFARM_S3_MAX_ATTEMPTS=2"], env, log)
    try:
        # S3 first: blobs are written as pages are fetched, and fetching can be over by
        # the time MongoDB is back (the index drains its backlog after the downloads).
        stored = wait_pages(own_mongo.url, "faults", 8)
        relay.cut()  # S3 unreachable (connections reset and dropped)...
        time.sleep(2.5)
        relay.restore()  # ...and back
        before_mongo = wait_pages(own_mongo.url, "faults", stored + 8)
        own_mongo.stop()  # then MongoDB down mid-crawl (pymongo waits, then our retries)...
        time.sleep(2.5)
        own_mongo.start()  # ...and back, same port, same data
        output = finish(proc, log)
    finally:
        relay.close()
    # Both outages hit the crawl mid-way: pages were still to be stored when each began.
    assert stored < before_mongo < len(web.expected_pages(base))
    assert relay.dropped >= 1, "no S3 call happened during the outage"
    assert stat(output, "webfarm/blobs/retries") >= 1
    s3 = boto3.client("s3", endpoint_url=s3_server.url)
    listed = s3.list_objects_v2(Bucket=s3_bucket, Prefix="p/raw/").get("Contents", [])
    keys = [o["Key"].removeprefix("p/") for o in listed]
    assert len(keys) == len(set(keys))
    db = pymongo.MongoClient(own_mongo.url)["faults"]
    assert_every_page_once(web, base, db, set(keys))
    assert {d["fetch_count"] for d in db.pages.find()} == {1}  # no page counted twice


def test_storage_down_past_the_limit_sends_requests_back(web, redis_url, own_mongo, tmp_path):
    base = web.base_urls[0]
    blobs = tmp_path / "blobs"
    env = crawl_env(web, redis_url, own_mongo.url, "limit", blobs.as_uri(),
                    WEBFARM_STORAGE_RETRY_SECONDS="1")
    admin = pymongo.MongoClient(own_mongo.url).admin
    log = tmp_path / "crawl.log"
    # Two attempts a page: an outage past the window spent them, and a store down for
    # a while dead-lettered every page fetched meanwhile. It spends none now.
    proc = runner.popen(["crawl", "generic", "-a", f"start={base}/", "-s",
                         "WEBFARM_RETRY_TIMES=2"], env, log)
    assert wait_pages(own_mongo.url, "limit", 10) < len(web.expected_pages(base))
    admin.command("configureFailPoint", "failCommand", mode="alwaysOn",
                  data={"failCommands": ["insert", "update"], "errorCode": 2})
    time.sleep(4)
    admin.command("configureFailPoint", "failCommand", mode="off")
    output = finish(proc, log)

    assert stat(output, "webfarm/index/gave_up") >= 1  # writes failed past the limit...
    assert stat(output, "webfarm/frontier/storage_retried") >= 3  # ...so requests went back
    # scrapy frontier says them apart from failed fetches (460 read as 460 failures)
    shown = runner.scrapy(["frontier", "generic"], env, 60).stdout
    waited = stat(output, "webfarm/frontier/storage_retried")
    assert re.search(rf"retried +[\d,]+ +all time \({waited:,} of them spent no attempt", shown), \
        shown
    assert stat(output, "webfarm/frontier/dead") == 0
    # the store's own error, not a last attempt cut short and said to hang
    assert "StoreHung" not in output, output[-3000:]
    assert "item pipeline failed" not in output or "StorageUnavailable" in output
    # Said in one line a minute, no traceback: a 20 s outage wrote 156 ERRORs before
    said = [line for line in output.splitlines() if "Items not stored, their requests go "
            "back to the frontier to be fetched and stored again: index write" in line]
    assert len(said) == 1 and "WARNING" in said[0] and "OperationFailure" in said[0], said
    assert "Error processing" not in output and "Traceback" not in output, output[-3000:]
    db = pymongo.MongoClient(own_mongo.url)["limit"]
    from webfarm.blobstore import open_blob_store

    assert_every_page_once(web, base, db, set(open_blob_store(blobs.as_uri()).iter_keys()))


def test_a_hung_mongodb_gives_the_requests_back_within_the_retry_window(
        web, redis_url, own_mongo, tmp_path):
    """A MongoDB that stops answering (SIGSTOP: connections open, no reply) held the
    batch's write, and the leases waiting on it, until it woke up: pymongo has no socket
    timeout, and the retry window counted failures only."""
    base = web.base_urls[0]
    blobs = tmp_path / "blobs"
    env = crawl_env(web, redis_url, own_mongo.url, "hung", blobs.as_uri(),
                    WEBFARM_STORAGE_RETRY_SECONDS="1.5")
    log = tmp_path / "crawl.log"
    proc = runner.popen(["crawl", "generic", "-a", f"start={base}/", "-s",
                         "WEBFARM_RETRY_BACKOFF_BASE=0.3", "-s", "WEBFARM_RETRY_TIMES=30"],
                        env, log)
    try:
        stored = wait_pages(own_mongo.url, "hung", 8)
        os.kill(own_mongo.proc.pid, signal.SIGSTOP)
        try:
            servers.wait_for(lambda: "StoreHung: no answer in" in log.read_text(errors="replace"),
                             15, "a write given up while MongoDB hangs")
        finally:
            os.kill(own_mongo.proc.pid, signal.SIGCONT)
    except BaseException:
        proc.kill()
        raise
    output = finish(proc, log)
    assert stored < len(web.expected_pages(base))  # it hung mid-crawl
    assert stat(output, "webfarm/index/gave_up") + stat(output, "webfarm/items/gave_up") >= 1
    assert stat(output, "webfarm/frontier/dead") == 0
    db = pymongo.MongoClient(own_mongo.url)["hung"]
    from webfarm.blobstore import open_blob_store

    assert_every_page_once(web, base, db, set(open_blob_store(blobs.as_uri()).iter_keys()))


def storage_processes(parent: int) -> list[int]:
    """Pids of the storage processes (``python -m webfarm.storeworker 16 storage ...``) of a
    crawl (its hashing helpers run the same module with the role ``hashing``)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat_line = Path(f"/proc/{entry}/stat").read_text()
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue  # ended meanwhile
        ppid = int(stat_line.rsplit(")", 1)[1].split()[1])
        args = command.split(b"\0")
        if ppid != parent or b"webfarm.storeworker" not in args:
            continue
        role = args.index(b"webfarm.storeworker") + 2  # -m webfarm.storeworker THREADS ROLE
        if args[role:role + 1] == [b"storage"]:
            found.append(int(entry))
    return found


def test_storage_process_killed_mid_crawl_loses_nothing(web, redis_url, mongo_uri,
                                                         mongo_db_name, tmp_path):
    base = web.base_urls[0]
    blobs = tmp_path / "blobs"
    env = crawl_env(web, redis_url, mongo_uri, mongo_db_name, blobs.as_uri())
    log = tmp_path / "crawl.log"
    proc = runner.popen(["crawl", "generic", "-a", f"start={base}/"], env, log)
    try:
        stored = wait_pages(mongo_uri, mongo_db_name, 8)
        [helper] = storage_processes(proc.pid)
        os.kill(helper, signal.SIGKILL)  # a crash in pymongo, the OOM killer, a stray kill
    except BaseException:
        proc.kill()
        raise
    output = finish(proc, log)
    assert stored < len(web.expected_pages(base))  # it died mid-crawl
    assert stat(output, "webfarm/storage/process_restarts") == 1
    db = pymongo.MongoClient(mongo_uri)[mongo_db_name]
    from webfarm.blobstore import open_blob_store

    assert_every_page_once(web, base, db, set(open_blob_store(blobs.as_uri()).iter_keys()))
    assert {d["fetch_count"] for d in db.pages.find()} == {1}  # no page counted twice


def test_writes_acknowledged_to_the_crawl_outlive_a_mongodb_crash(web, redis_url, own_mongo,
                                                                  tmp_path):
    """A probe: SecantusDB killed (kill -9) mid-crawl lost page writes it had acknowledged,
    and whose leases were acknowledged with them: those pages were never fetched again
    (w:1 without j is acknowledged before the journal reaches the disk). Writes are
    journaled now."""
    base = web.base_urls[0]
    env = crawl_env(web, redis_url, own_mongo.url, "crash", f"file://{tmp_path / 'blobs'}",
                    WEBFARM_STORAGE_RETRY_SECONDS="120")
    log = tmp_path / "crawl.log"
    proc = runner.popen(["crawl", "generic", "-a", f"start={base}/"], env, log)
    stored = wait_pages(own_mongo.url, "crash", 8)
    own_mongo.stop(signal.SIGKILL)  # a crash: what it acknowledged must still be there
    own_mongo.start()
    finish(proc, log)
    assert stored < len(web.expected_pages(base))  # killed mid-crawl
    db = pymongo.MongoClient(own_mongo.url)["crash"]
    blob_keys = {str(p.relative_to(tmp_path / "blobs")) for p in (tmp_path / "blobs").rglob("*")
                 if p.is_file() and not p.name.endswith(".meta.json")}
    assert_every_page_once(web, base, db, blob_keys)
