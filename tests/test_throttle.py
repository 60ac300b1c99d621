"""Scrapy's AUTOTHROTTLE_ENABLED in a webfarm project: the shared per-host latency rule
(webfarm/throttle.py) does its work, without a per-worker copy on top."""

from __future__ import annotations

import logging
import re

import pymongo
import pytest
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler

from tests import runner
from webfarm.throttle import WorkerAutoThrottle


def test_scrapys_autothrottle_is_left_to_the_shared_rule(caplog):
    caplog.set_level(logging.INFO, logger="webfarm.throttle")
    with pytest.raises(NotConfigured):
        WorkerAutoThrottle.from_crawler(get_crawler(settings_dict={
            "AUTOTHROTTLE_ENABLED": True, "WEBFARM_AUTOTHROTTLE": True}))
    assert "Scrapy's per-worker AutoThrottle stays off" in caplog.text
    with pytest.raises(NotConfigured):  # off, as in Scrapy
        WorkerAutoThrottle.from_crawler(get_crawler(settings_dict={
            "AUTOTHROTTLE_ENABLED": False}))
    # The shared rule switched off: Scrapy's runs, as the project asked.
    ext = WorkerAutoThrottle.from_crawler(get_crawler(settings_dict={
        "AUTOTHROTTLE_ENABLED": True, "WEBFARM_AUTOTHROTTLE": False}))
    assert ext.target_concurrency == 1.0


def test_a_download_delay_below_the_host_delay_is_said(caplog):
    """A migrated spider's DOWNLOAD_DELAY of 0.05 s ran at WEBFARM_HOST_DELAY's 1 s, unsaid."""
    caplog.set_level(logging.INFO, logger="webfarm.throttle")
    for delay, said in ((0.05, True), (2.0, False), (0.0, False)):
        caplog.clear()
        with pytest.raises(NotConfigured):
            WorkerAutoThrottle.from_crawler(get_crawler(settings_dict={
                "DOWNLOAD_DELAY": delay, "WEBFARM_HOST_DELAY": 1.0}))
        assert ("DOWNLOAD_DELAY=0.05 is below WEBFARM_HOST_DELAY=1, the delay every worker "
                "keeps" in caplog.text) is said, (delay, caplog.text)


def test_a_crawl_with_autothrottle_enabled_does_not_wait_its_start_delay(
        web, redis_url, mongo_uri, mongo_db_name, tmp_path):
    """Before, each worker also ran Scrapy's AutoThrottle, which starts every host at
    AUTOTHROTTLE_START_DELAY: with 30 s here, five pages took minutes."""
    base = web.base_urls[0]
    env = runner.env_for(REDIS_URL=redis_url, MONGO_URI=mongo_uri, MONGO_DATABASE=mongo_db_name,
                         BLOB_STORE_URI=(tmp_path / "b").as_uri())
    result = runner.scrapy(["crawl", "generic", "-a", f"start={base}/", "-a", "max_pages=5",
                            "-s", "AUTOTHROTTLE_ENABLED=True",
                            "-s", "AUTOTHROTTLE_START_DELAY=30"], env, timeout=120)
    assert result.returncode == 0, result.output[-2000:]
    assert "Scrapy's per-worker AutoThrottle stays off" in result.output
    assert "webfarm.throttle.HostThrottle" in result.output  # the shared rule is on
    elapsed = float(re.search(r"'elapsed_time_seconds': ([\d.]+)", result.output).group(1))
    assert elapsed < 25  # no 30 s wait before the second request to the host
    pages = pymongo.MongoClient(mongo_uri)[mongo_db_name].pages.count_documents({})
    assert pages >= 5
