"""Zero set-up: with no REDIS_URL/MONGO_URI/BLOB_STORE_URI, workers share embedded services."""

from __future__ import annotations

import json
import re

import pymongo
import pytest

from tests import runner


@pytest.fixture()
def embedded_env(tmp_path):
    env = runner.env_for(WEBFARM_DATA_DIR=str(tmp_path / "data"), WEBFARM_IDLE_TIMEOUT="3")
    yield env
    runner.scrapy(["services", "down"], env, timeout=60)


def test_two_workers_join_one_embedded_frontier(web, embedded_env, tmp_path):
    base = web.base_urls[0]
    host = base.split("//")[1]
    args = ["-s", "DOWNLOAD_DELAY=0.05", "-s", "CONCURRENT_REQUESTS_PER_DOMAIN=1"]
    first = runner.popen(["crawl", "generic", "-a", f"start={base}/", *args], embedded_env,
                         tmp_path / "first.log")
    second = runner.popen(["crawl", "generic", "-a", f"domains={host}", *args], embedded_env,
                          tmp_path / "second.log")
    assert first.wait(180) == 0 and second.wait(180) == 0
    logs = [(tmp_path / name).read_text() for name in ("first.log", "second.log")]
    frontiers = [re.search(r"Frontier \S+ on (redis://\S+)", log).group(1) for log in logs]
    assert frontiers[0] == frontiers[1]
    for log in logs:
        assert "Traceback" not in log

    status = runner.scrapy(["services", "status", "--json"], embedded_env, timeout=60)
    services = json.loads(status.stdout)["services"]
    assert services["redis"]["running"] and services["mongo"]["running"]
    assert services["redis"]["url"] == frontiers[0]
    assert str(tmp_path / "data") in services["blobs"]["url"]

    db = pymongo.MongoClient(services["mongo"]["url"])["webfarm"]
    assert {doc["url"] for doc in db.pages.find()} == web.expected_pages(base)
    fetched = [h.path for h in web.hits_for(host=host) if h.path != "/robots.txt"]
    assert len(fetched) == len(set(fetched))  # shared dupefilter: no URL fetched twice

    down = runner.scrapy(["services", "down"], embedded_env, timeout=60)
    assert down.returncode == 0
    after = json.loads(runner.scrapy(["services", "status", "--json"], embedded_env).stdout)
    assert not after["services"]["redis"]["running"]
