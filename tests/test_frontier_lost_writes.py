"""Redis goes back in time under a running worker: it restarts from its last snapshot,
or fails over to a replica that lagged. Writes it had acknowledged (links pushed,
leases acknowledged, delays set) are gone. The worker notices, forgets which links it
sent (it would drop them as sent when the pages that found them come back), sets its
host delays again, and the crawl still stores every page."""

from __future__ import annotations

import signal

import pymongo
import pytest
import redis

from tests import runner, servers
from tests.testweb import TestWeb


@pytest.fixture()
def snapshot_valkey(tmp_path):
    """A Valkey that keeps snapshots only (``SAVE``), no append-only log: killed, it
    comes back as it was at the last snapshot."""
    server = servers.valkey(tmp_path / "valkey")
    server.argv[server.argv.index("--appendonly") + 1] = "no"
    server.start()
    yield server
    server.stop()


def stored(stores) -> list[str]:
    client = pymongo.MongoClient(stores["MONGO_URI"])
    try:
        return [doc["url"] for doc in client[stores["MONGO_DATABASE"]].pages.find()]
    finally:
        client.close()


def test_a_redis_restored_from_an_older_snapshot_loses_no_page(snapshot_valkey, stores,
                                                                tmp_path):
    """Before, the worker's memory of the links it had sent dropped them again when the
    pages that found them were fetched again after the restore: those links were never
    queued, and their pages never fetched."""
    with TestWeb(hosts=("127.0.0.8",), categories=2, products_per_category=5) as web:
        base = web.base_urls[0]
        pages = lambda: [h for h in web.hits_for(host=base) if h.path != "/robots.txt"]  # noqa: E731
        stores = {**stores, "REDIS_URL": snapshot_valkey.url}
        env = runner.env_for(**stores, WEBFARM_HOST_DELAY="0.2", WEBFARM_LEASE_SECONDS="2",
                             WEBFARM_IDLE_TIMEOUT="4")
        log = tmp_path / "worker.log"
        worker = runner.popen(["crawl", "generic", "-a", f"start={base}/"], env, log)
        try:
            servers.wait_for(lambda: len(pages()) >= 3, 60, "the first pages")
            admin = redis.Redis.from_url(snapshot_valkey.url)
            admin.save()  # the state the server will come back to
            admin.close()
            servers.wait_for(lambda: len(pages()) >= 12, 60, "pages after the snapshot")
            snapshot_valkey.stop(signal.SIGKILL)  # no save at exit: back to the snapshot
            snapshot_valkey.start()
            assert worker.wait(120) == 0
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(10)
        text = log.read_text()
        assert "Redis lost this worker's last" in text, text[-3000:]
        assert "Traceback" not in text
        urls = stored(stores)
        assert len(urls) == len(set(urls)) and set(urls) == web.expected_pages(base)
