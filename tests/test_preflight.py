"""A wrong REDIS_URL / MONGO_URI / BLOB_STORE_URI stops the crawl at start, in one clear line."""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pymongo
import pytest
import redis

from tests import runner, servers
from tests.servers import free_port
from webfarm import config
from webfarm.config import ConfigError
from webfarm.redischeck import check_redis


@pytest.fixture()
def good(redis_url, mongo_uri, mongo_db_name, tmp_path):
    return {"REDIS_URL": redis_url, "MONGO_URI": mongo_uri, "MONGO_DATABASE": mongo_db_name,
            "BLOB_STORE_URI": (tmp_path / "blobs").as_uri()}


CASES = {
    "redis-down": ("REDIS_URL", lambda s3: f"redis://127.0.0.1:{free_port()}/0", "cannot reach"),
    "redis-scheme": ("REDIS_URL", lambda s3: "http://127.0.0.1:6379", "scheme 'http'"),
    "mongo-down": ("MONGO_URI", lambda s3: f"mongodb://127.0.0.1:{free_port()}", "cannot reach"),
    "mongo-scheme": ("MONGO_URI", lambda s3: "postgres://127.0.0.1/x", "scheme 'postgres'"),
    "mongo-garbage": ("MONGO_URI", lambda s3: "mongodb://", "not a valid URI"),
    "blob-scheme": ("BLOB_STORE_URI", lambda s3: "ftp://127.0.0.1/x", "scheme 'ftp'"),
    "blob-bucket": ("BLOB_STORE_URI", lambda s3: "s3://no-such-bucket/x", "does not exist"),
    "blob-nobucket": ("BLOB_STORE_URI", lambda s3: "s3:///x", "has no bucket"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_location_fails_before_any_request(case, good, web, s3_server):
    variable, make, message = CASES[case]
    env = runner.env_for(**{**good, "AWS_ENDPOINT_URL": s3_server.url, variable: make(s3_server)})
    result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/"], env,
                           timeout=60)
    assert result.returncode == 1
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("webfarm:")]
    assert len(errors) == 1, result.stderr[-2000:]
    assert errors[0].startswith(f"webfarm: {variable}") and message in errors[0], errors[0]
    assert web.hits == []  # not even robots.txt was fetched


@pytest.mark.parametrize(("variable", "value", "message"), [
    # urllib's ValueError ended the crawl in a traceback
    ("MONGO_URI", "mongodb://u:secret@[db1", "MONGO_URI='mongodb://***@[db1' is not a URL "
     "(Invalid IPv6 URL); use mongodb://host:27017"),
    ("REDIS_URL", "redis://[::1/0", "REDIS_URL='redis://[::1/0' is not a URL"),
    # a wrong scheme's line showed the password
    ("REDIS_URL", "http://u:secret@r:1/0", "REDIS_URL='http://***@r:1/0': scheme 'http' is "),
    ("MONGO_URI", "postgres://u:secret@m/x", "MONGO_URI='postgres://***@m/x': scheme "),
    ("BLOB_STORE_URI", "ftp://u:secret@b/x", "BLOB_STORE_URI='ftp://***@b/x': scheme 'ftp'"),
    ("BLOB_STORE_URI", "s3://[b/x", "BLOB_STORE_URI='s3://[b/x' is not a URL"),
    # said as "cannot reach" a server that answered
    ("MONGO_DATABASE", "crawl.v2", "MONGO_DATABASE='crawl.v2' is not a name MongoDB accepts "
     "(it has '.'); use letters, digits, _ and -, at most 63 bytes"),
    ("MONGO_DATABASE", "d" * 64, "is not a name MongoDB accepts (it is over 63 bytes)"),
    # botocore's ValueError: a traceback
    ("AWS_ENDPOINT_URL", "minio:9000", "AWS_ENDPOINT_URL='minio:9000' is not an http(s) URL; "
     "use http://host:9000"),
    ("AWS_ENDPOINT_URL", "http://[minio", "AWS_ENDPOINT_URL='http://[minio' is not a URL"),
])
def test_a_location_that_is_no_url_or_name_is_one_line(good, variable, value, message):
    from scrapy.settings import Settings

    if variable == "AWS_ENDPOINT_URL":
        good = {**good, "BLOB_STORE_URI": "s3://pages/raw"}
    settings = Settings({**good, variable: value})
    with pytest.raises(ConfigError) as refused:
        config.preflight(settings)
    assert message in str(refused.value) and "secret" not in str(refused.value)
    assert config.fleet_warning(settings) is None  # read before preflight: no traceback


def test_scrapy_redis_host_and_port_are_not_taken_for_the_embedded_frontier(good, web):
    """A migrated scrapy-redis project's REDIS_HOST/REDIS_PORT were ignored: each machine
    started an embedded Valkey and crawled on a frontier of its own."""
    env = {k: v for k, v in runner.env_for(**good).items() if k != "REDIS_URL"}
    env["WEBFARM_DATA_DIR"] = good["BLOB_STORE_URI"].removeprefix("file://") + "-data"
    try:
        result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/",
                                "-s", "REDIS_HOST=redis.internal", "-s", "REDIS_PORT=6380"],
                               env, timeout=60)
    finally:  # had it started the embedded services after all, they must not outlive us
        runner.scrapy(["services", "down"], env, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("webfarm:")]
    assert errors == ["webfarm: REDIS_HOST=redis.internal and REDIS_PORT=6380 are scrapy-redis "
                      "settings, and webfarm reads REDIS_URL only: set "
                      "REDIS_URL=redis://redis.internal:6380/0 (with user:password@ and the "
                      "db number your REDIS_PARAMS gave)"], result.stderr[-2000:]
    assert web.hits == []
    assert "valkey" not in result.output.lower()  # no embedded server was started
    # The same as environment variables (REDIS_URL is read from one) went unsaid.
    result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/"],
                           {**env, "REDIS_HOST": "redis.internal"}, timeout=60)
    assert result.returncode == 1, result.output[-2000:]
    assert ("webfarm: REDIS_HOST=redis.internal is a scrapy-redis setting, and webfarm reads "
            "REDIS_URL only: set REDIS_URL=redis://redis.internal:6379/0") in result.stderr
    assert web.hits == []


def test_a_shared_frontier_with_a_local_index_or_blob_folder_is_pointed_out():
    """A fleet whose REDIS_URL is on another machine but whose BLOB_STORE_URI (or
    MONGO_URI) is unset kept each machine's raw pages (or index) to itself, silently."""
    from scrapy.settings import Settings

    def warning(**values: str) -> str | None:
        return config.fleet_warning(Settings(values))

    assert warning(REDIS_URL="redis://10.0.0.5:6379/0", MONGO_URI="mongodb://10.0.0.6") == (
        "REDIS_URL is on 10.0.0.5, a frontier other machines share, but BLOB_STORE_URI is "
        "unset: this machine keeps its raw pages to itself, out of reach of other machines' "
        "workers and `scrapy reparse`, and lost with it; set BLOB_STORE_URI to the fleet's "
        "servers")
    assert "MONGO_URI and BLOB_STORE_URI are unset: this machine keeps its index and raw " \
        "pages to itself" in warning(REDIS_URL="redis://redis.internal:6379/0")
    for alone in ({}, {"REDIS_URL": "redis://127.0.0.1:6379/0"},
                  {"REDIS_URL": "redis://localhost/0"}, {"REDIS_URL": "unix:///run/r.sock"},
                  {"REDIS_URL": "redis://10.0.0.5/0", "MONGO_URI": "mongodb://m",
                   "BLOB_STORE_URI": "s3://b/p"}):
        assert warning(**alone) is None, alone  # one machine, or everything shared


def test_bad_blob_compression_fails_before_any_request(good, web):
    env = runner.env_for(**good)
    result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/",
                            "-s", "WEBFARM_BLOB_COMPRESSION=brotli"], env, timeout=60)
    assert result.returncode == 1
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("webfarm:")]
    assert errors == ["webfarm: WEBFARM_BLOB_COMPRESSION is 'brotli'; use zstd or gzip"], \
        result.stderr[-2000:]
    assert web.hits == []


@pytest.mark.parametrize("setting, message", [
    ("WEBFARM_HOST_DELAY=abc", "WEBFARM_HOST_DELAY='abc' is not a number (the project's "
                               "settings give: 0.0)"),  # the tests' WEBFARM_HOST_DELAY=0
    ("WEBFARM_INDEX_BATCH_SIZE=1.5", "'1.5' is not a whole number (the project's "
                                     "settings give: 200)"),
    ("WEBFARM_NEARDUP=yes", "'yes' is not a boolean (True/False or 1/0) (the project's "
                            "settings give: True)"),
    ("CLOSESPIDER_PAGECOUNT=ten", "CLOSESPIDER_PAGECOUNT='ten' is not a whole number "
                                  "(Scrapy's default: 0)"),
    ("WEBFARM_HOST_BUDGET=-5", "WEBFARM_HOST_BUDGET='-5' is below 0; give a number, or 0 for "
                               "no limit"),
    # Before: "RuntimeError: Engine slot not assigned", and a traceback from the throttle.
    ("WEBFARM_MAX_ENTRY_BYTES=-1", "WEBFARM_MAX_ENTRY_BYTES='-1' is below 0; give a number, or "
                                   "0 for no limit"),
    ("WEBFARM_HOST_MEMORY=-1", "WEBFARM_HOST_MEMORY='-1' is below 0"),
    # Before: a traceback ("max_workers must be greater than 0"), pages fetched twice (a
    # lease that expired at once) and a worker that never ended (Scrapy's own timeout).
    ("WEBFARM_STORAGE_THREADS=0", "WEBFARM_STORAGE_THREADS='0' is out of range: give a "
                                  "number 1 or more"),
    ("WEBFARM_BLOOM_ERROR_RATE=1.5", "WEBFARM_BLOOM_ERROR_RATE='1.5' is out of range: give a "
                                     "number above 0 and below 1"),
    ("WEBFARM_LEASE_SECONDS=-1", "WEBFARM_LEASE_SECONDS='-1' is out of range: give a number "
                                 "above 0 (seconds)"),
    ("DOWNLOAD_TIMEOUT=-1", "DOWNLOAD_TIMEOUT='-1' is out of range: give a number above 0"),
    ("CONCURRENT_REQUESTS_PER_DOMAIN=0", "CONCURRENT_REQUESTS_PER_DOMAIN='0' is out of range: "
                                         "give a number 1 or more"),
    # Before: "OverflowError: bind(): port must be 0-65535" in a traceback, and the crawl
    # went on without /metrics, exit code 0.
    ("WEBFARM_PROMETHEUS_PORT=99999", "WEBFARM_PROMETHEUS_PORT='99999' is out of range: give "
                                      "a number 0 to 65535"),
    # Scrapy reads these with getint: a traceback from the download handler's loading.
    ("DOWNLOAD_MAXSIZE=1e3", "DOWNLOAD_MAXSIZE='1e3' is not a whole number (the project's "
                             "settings give: 33554432)"),
    ("CONCURRENT_REQUESTS_PER_DOMAIN=1.5", "CONCURRENT_REQUESTS_PER_DOMAIN='1.5' is not a "
                                           "whole number"),
    # Before: every page dead-lettered "body over DOWNLOAD_MAXSIZE (-1 B)", exit 0.
    ("DOWNLOAD_MAXSIZE=-1", "DOWNLOAD_MAXSIZE='-1' is out of range: give a number 0 or more "
                            "(bytes; 0: no limit)"),
    # Before: a ValueError traceback with proxies, taken in silence without.
    ("WEBFARM_PROXY_BAN_STATUSES=403,abc", "WEBFARM_PROXY_BAN_STATUSES='403,abc': 'abc' is "
                                           "not an HTTP status; give statuses from 100 to 599"),
    ("RETRY_HTTP_CODES=500,5000", "RETRY_HTTP_CODES='500,5000': '5000' is not an HTTP "
                                  "status"),
])
def test_a_setting_of_the_wrong_type_fails_before_any_request(good, web, setting, message):
    """Before: a traceback once the component read it ("Task exception was never
    retrieved"), or "Engine slot not assigned" for WEBFARM_IDLE_TIMEOUT=soon."""
    env = runner.env_for(**good)
    result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/",
                            "-s", setting], env, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("webfarm:")]
    assert len(errors) == 1 and message in errors[0] and "custom_settings" in errors[0], \
        result.stderr[-2000:]
    assert web.hits == []


@pytest.mark.parametrize("setting, message", [
    ('WEBFARM_REFETCH_RULES=[{"pattern": "("}]', "WEBFARM_REFETCH_RULES[0]: bad regex '('"),
    ("WEBFARM_REFETCH_MAX=soon", "WEBFARM_REFETCH_MAX='soon' is not a duration"),
    ("WEBFARM_REFETCH_INTERVAL=-10", "WEBFARM_REFETCH_INTERVAL='-10' is not above 0"),
    ("WEBFARM_REFETCH_POLICY=no.such.Policy", "WEBFARM_REFETCH_POLICY='no.such.Policy' does "
                                              "not import (No module named 'no')"),
    # Refused by their components as the crawl starts: said in one line all the same.
    ("WEBFARM_RENDER=bogus", "WEBFARM_RENDER='bogus' is not a render mode"),
    ("WEBFARM_VOLATILE_PATTERNS=(", "WEBFARM_VOLATILE_PATTERNS: '(' is not a valid regex"),
    ("WEBFARM_FETCH_API_URL=notaurl", "WEBFARM_FETCH_API_URL='notaurl' is not an http(s) URL"),
])
def test_a_setting_a_component_refuses_fails_in_one_line(good, web, setting, message):
    """Before: the crawl ended in "Task exception was never retrieved" and a traceback
    around the component's message (the refetch policy, render rules, volatile patterns)."""
    result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/",
                            "-s", setting], runner.env_for(**good), timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("webfarm:")]
    assert len(errors) == 1 and message in errors[0], result.stderr[-2000:]
    assert web.hits == []


def test_the_api_render_mode_without_a_fetch_api_fails_in_one_line(good, web):
    """-s WEBFARM_RENDER=api was refused at start, -a render=api was not: it dead-lettered
    the start URL and exited 0."""
    for args in (["-a", "render=api"], ["-s", "WEBFARM_RENDER=api"]):
        result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/", *args],
                               runner.env_for(**good), timeout=60)
        assert result.returncode == 1 and "Traceback" not in result.output, result.output[-2000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("webfarm:")]
        assert len(errors) == 1 and "render mode is 'api'" in errors[0] and \
            "WEBFARM_FETCH_API_URL is unset" in errors[0], result.stderr[-2000:]
    assert web.hits == []


def test_an_error_that_is_not_a_setting_s_keeps_its_traceback(good, web):
    result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/",
                            "-s", 'DOWNLOADER_MIDDLEWARES={"no.such.Mw": 5}'],
                           runner.env_for(**good), timeout=60)
    assert result.returncode == 1
    assert "The crawl failed:" in result.stderr and "Traceback" in result.stderr
    assert "No module named 'no'" in result.stderr
    assert web.hits == []


@pytest.mark.parametrize("command", [["seed", "generic", "http://127.0.0.2:1/"],
                                     ["reparse", "generic", "-a", "start=http://127.0.0.2:1/"]])
def test_the_other_commands_check_setting_types_too(good, command):
    result = runner.scrapy([*command, "-s", "WEBFARM_RETRY_TIMES=often"], runner.env_for(**good),
                           timeout=60)
    assert result.returncode != 0 and "Traceback" not in result.output, result.output[-2000:]
    assert "webfarm: WEBFARM_RETRY_TIMES='often' is not a whole number" in result.stderr


def test_a_misspelt_setting_name_is_said_with_the_name_meant(good, web):
    """Scrapy ignores a setting nothing reads: these ran the crawl on the defaults, with
    no word. A project's own setting (MYAPI_KEY) passes in silence."""
    result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/",
                            "-s", "WEBFARM_HOST_DELAI=0.5", "-s", "CONCURENT_REQUESTS=1",
                            "-s", "webfarm_idle_timeout=1", "-s", "WEBFARM_SPEED=9",
                            "-s", "MYAPI_KEY=k", "-s", "WEBFARM_RETRY_TIMES=often"],
                           {**runner.env_for(**good), "WEBFARM_IDLE_TIMEOT": "0"}, timeout=60)
    said = [line.split("webfarm: ", 1)[1] for line in result.stderr.splitlines()
            if "webfarm: -s " in line]
    assert ("webfarm: environment variable WEBFARM_IDLE_TIMEOT: no setting reads it; did you "
            "mean WEBFARM_IDLE_TIMEOUT?") in result.stderr
    assert said == [
        "-s CONCURENT_REQUESTS: no such setting, Scrapy ignores it; did you mean "
        "CONCURRENT_REQUESTS?",
        "-s WEBFARM_HOST_DELAI: no such setting, Scrapy ignores it; did you mean "
        "WEBFARM_HOST_DELAY?",
        "-s WEBFARM_SPEED: no such webfarm setting, it is ignored (the README's Settings "
        "table lists them)",
        "-s webfarm_idle_timeout: setting names are upper case; Scrapy ignores this one: "
        "write WEBFARM_IDLE_TIMEOUT",
    ], result.stderr[-2000:]
    assert result.returncode == 1  # then the bad value is refused, as before
    assert "WEBFARM_RETRY_TIMES='often' is not a whole number" in result.stderr
    assert web.hits == []


def test_a_library_s_own_setting_is_no_slip():
    """scrapy-playwright's settings webfarm does not set are known by the names its code
    spells: PLAYWRIGHT_CONTEXTS was a letter from PLAYWRIGHT_MAX_CONTEXTS."""
    from scrapy.utils.project import get_project_settings

    from webfarm.settingnames import misspelt_names

    settings = get_project_settings()
    settings.set("PLAYWRIGHT_CONTEXTS", {"a": {}}, priority="cmdline")
    settings.set("PLAYWRIGHT_BROWSER_TYPE", "chromium", priority="cmdline")
    settings.set("MYPROJECT_API_KEY", "k", priority="spider")  # a project's own
    assert misspelt_names(settings) == []
    settings.set("PLAYWRIGHT_CONTEXT", {}, priority="cmdline")
    assert misspelt_names(settings) == [
        "-s PLAYWRIGHT_CONTEXT: no such setting, Scrapy ignores it; did you mean "
        "PLAYWRIGHT_CONTEXTS?"]


def test_a_negative_idle_timeout_is_refused_in_process():
    """Below 0 ran the worker for ever (as 0 does), without a word."""
    from scrapy.settings import Settings

    from webfarm.settingtypes import check_types

    with pytest.raises(ValueError, match=re.escape(
            "WEBFARM_IDLE_TIMEOUT='-5' is out of range: give a number 0 or more (seconds; "
            "0: never stop)")):
        check_types(Settings({"WEBFARM_IDLE_TIMEOUT": "-5"}))
    check_types(Settings({"WEBFARM_IDLE_TIMEOUT": "0"}))


@pytest.mark.parametrize("setting, value, message", [
    # each was taken in silence: no delay, 1 attempt, a monitor that never fires
    ("WEBFARM_HOST_DELAY", "-1", "WEBFARM_HOST_DELAY='-1' is below 0; give 0 or more"),
    ("WEBFARM_RECRAWL_INTERVAL", "-5", "WEBFARM_RECRAWL_INTERVAL='-5' is below 0"),
    ("WEBFARM_RETRY_TIMES", "0", "WEBFARM_RETRY_TIMES='0' is out of range: give a number 1 or "
                                 "more (attempts)"),
    ("RETRY_TIMES", "-1", "RETRY_TIMES='-1' is out of range: give a number 0 or more"),
    ("WEBFARM_ALERT_SUCCESS_RATE", "5", "give a number 0 to 1 (a share of requests)"),
    ("WEBFARM_NEARDUP_DISTANCE", "-1", "give a number 0 to 64 (bits; WEBFARM_NEARDUP=False"),
    ("WEBFARM_INDEX_BATCH_SIZE", "0", "WEBFARM_INDEX_BATCH_SIZE='0' is out of range"),
    # a lock of 0.1 s would lapse between its renewals
    ("WEBFARM_ROBOTS_LOCK_SECONDS", "0.1", "give a number 1 or more (seconds)"),
])
def test_numbers_out_of_their_range_are_refused_in_process(monkeypatch, setting, value,
                                                            message):
    from scrapy.settings import Settings

    from webfarm.settingtypes import check_types

    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "settings")
    with pytest.raises(ValueError, match=re.escape(message)):
        check_types(Settings({setting: value}))


def test_a_spider_argument_refused_under_scrapyd_is_in_the_job_s_log(caplog):
    """scrapyd keeps the job's log (LOG_FILE) apart from its own stderr: the job's log
    ended after Scrapy's banner, and why was only on scrapyd's stderr."""
    import argparse

    from scrapy.settings import Settings

    from spiders.generic import GenericSpider
    from webfarm.commands.crawl import prepare

    opts = argparse.Namespace(spargs={"start": "shop.example/"})
    with caplog.at_level(logging.ERROR):
        assert prepare(Settings({"LOG_FILE": "job.log"}), GenericSpider, opts) == 2
    assert "webfarm: generic: start URL 'shop.example/' is not an http(s) URL" in caplog.text


def test_settings_of_the_right_type_pass_the_check():
    """Numbers as strings (as -s gives them), floats where Scrapy reads floats, Scrapy's
    boolean spellings, and the project's own values all read."""
    from scrapy.settings import Settings

    from webfarm.settingtypes import check_types

    settings = Settings()
    settings.setmodule("settings", priority="project")
    check_types(settings)
    settings.setdict({"WEBFARM_HOST_DELAY": "2.5", "DOWNLOAD_TIMEOUT": "7.5",
                      "WEBFARM_INDEX_BATCH_SIZE": "50", "ROBOTSTXT_OBEY": "false",
                      "WEBFARM_NEARDUP": "0", "CLOSESPIDER_ITEMCOUNT": 10}, priority="cmdline")
    check_types(settings)
    settings.set("DOWNLOAD_SLOTS", {"a.test": {"delay": "2", "concurrency": 1}}, "spider")
    check_types(settings)
    for slots, why in [({"a.test": {"delay": "soon"}}, r"DOWNLOAD_SLOTS\['a.test'\] = "
                        r"\{'delay': 'soon'\}: give a dict with a number of seconds"),
                       ({"a.test": 2}, r"DOWNLOAD_SLOTS\['a.test'\] = 2: give a dict")]:
        settings.set("DOWNLOAD_SLOTS", slots, priority="cmdline")
        with pytest.raises(ValueError, match=why):
            check_types(settings)
    settings.set("DOWNLOAD_SLOTS", {}, priority="cmdline")
    settings.set("DOWNLOAD_DELAY", [1], priority="spider")  # custom_settings: any object
    with pytest.raises(ValueError, match=r"DOWNLOAD_DELAY=\[1\] is not a number") as said:
        check_types(settings)
    # It names where the value came from: it said "-s, scrapyd's or custom_settings" of all
    assert str(said.value).endswith("fix the spider's custom_settings (or update_settings) "
                                    "that set it")
    settings.set("DOWNLOAD_DELAY", 0, priority="spider")
    settings.set("CLOSESPIDER_TIMEOUT", "abc", priority="project")  # settings/base.py's
    with pytest.raises(ValueError, match=r"fix the project's settings module \(settings\)"):
        check_types(settings)


@pytest.fixture(scope="module")
def secured_mongo(tmp_path_factory):
    """A SecantusDB that requires SCRAM users: 'crawler' may write to database 'crawl',
    'reader' may only read it. Its address, without credentials."""
    server = servers.secantus(tmp_path_factory.mktemp("secured"), test_commands=False).start()
    try:
        admin = pymongo.MongoClient(server.url).admin
        admin.command("createUser", "crawler", pwd="right",
                      roles=[{"role": "readWrite", "db": "crawl"}])
        admin.command("createUser", "reader", pwd="right", roles=[{"role": "read", "db": "crawl"}])
        admin.client.close()
        server.stop()
        server.argv.append("--auth")
        server.start()
        yield server.url.removeprefix("mongodb://")
    finally:
        server.stop()


@pytest.mark.parametrize(("user", "message"), [
    ("", r"^MONGO_URI: mongodb://127\.0\.0\.1:\d+ requires a user \(command createIndexes "
         r"requires authentication\); put user:password@ in the URI$"),
    ("crawler:wrong@", r"^MONGO_URI: mongodb://\*\*\*@127\.0\.0\.1:\d+ refused the user name "
                       r"or password \(authentication failed\); fix them in the URI"),
    ("reader:right@", r"^MONGO_URI: user 'reader' may not write to database 'crawl' at "
                      r"mongodb://\*\*\*@127\.0\.0\.1:\d+ \(not authorized .*\); give it the "
                      r"readWrite role there, or use another user$"),
])
def test_a_secured_mongodb_refusing_the_user_says_what_to_fix(secured_mongo, user, message):
    """Before, a ping passed and the crawl died at its first pipeline with a traceback (no
    credentials, or a read-only user), or said 'cannot reach' for a wrong password."""
    with pytest.raises(ConfigError, match=message):
        config.check_mongo(f"mongodb://{user}{secured_mongo}", database="crawl")
    config.check_mongo(f"mongodb://crawler:right@{secured_mongo}", database="crawl")
    config.check_mongo(f"mongodb://reader:right@{secured_mongo}")  # reading is enough here


def test_a_crawl_without_credentials_stops_in_one_line_and_a_reader_may_preview(
        secured_mongo, good, web):
    env = runner.env_for(**{**good, "MONGO_URI": f"mongodb://{secured_mongo}",
                            "MONGO_DATABASE": "crawl"})
    result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/"], env,
                           timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("webfarm:")]
    assert len(errors) == 1 and "requires a user" in errors[0], result.stderr[-2000:]
    assert web.hits == []

    # A read-only user may preview a re-parse (it writes nothing), not run one.
    env["MONGO_URI"] = f"mongodb://reader:right@{secured_mongo}"
    preview = runner.scrapy(["reparse", "generic", "-a", f"start={web.base_urls[0]}/",
                             "--dry-run"], env, timeout=60)
    assert preview.returncode == 0 and "Traceback" not in preview.output, preview.output[-2000:]
    run = runner.scrapy(["reparse", "generic", "-a", f"start={web.base_urls[0]}/"], env,
                        timeout=60)
    assert run.returncode != 0 and "Traceback" not in run.output
    assert "user 'reader' may not write to database 'crawl'" in run.stderr


@pytest.fixture(scope="module")
def secured_redis(tmp_path_factory):
    """A Valkey with a password (requirepass); its address without one."""
    server = servers.valkey(tmp_path_factory.mktemp("secured-redis"))
    server.argv += ["--requirepass", "s3cret"]
    server.start()
    try:
        yield server.url.removeprefix("redis://")
    finally:
        server.stop()


@pytest.mark.parametrize(("credentials", "message"), [
    ("", r"^REDIS_URL: redis://127\.0\.0\.1:\d+/0 requires a password; put it in the URL: "
         r"redis://:PASSWORD@host:port/db"),
    (":wrong@", r"^REDIS_URL: redis://\*\*\*@127\.0\.0\.1:\d+/0 refused the user name or "
                r"password \(.*\); fix them in the URL$"),
])
def test_a_redis_with_a_password_says_what_to_fix(secured_redis, credentials, message):
    """Both said 'cannot reach ...; start that server', with the server answering."""
    with pytest.raises(ConfigError, match=message):
        check_redis(f"redis://{credentials}{secured_redis}")
    check_redis(f"redis://:s3cret@{secured_redis}")


@pytest.fixture(scope="module")
def acl_redis(secured_redis):
    """ACL users of the secured Valkey: 'noscript' may not run Lua scripts, 'reader' may only
    read the keys webfarm:*, 'crawler' is what the README's advice grants."""
    admin = redis.Redis.from_url(f"redis://:s3cret@{secured_redis}")
    admin.execute_command("ACL", "SETUSER", "noscript", "on", ">pw", "~*", "+@all", "-@scripting")
    admin.execute_command("ACL", "SETUSER", "reader", "on", ">pw", "%R~webfarm:*", "+@all")
    admin.execute_command("ACL", "SETUSER", "crawler", "on", ">pw", "~webfarm:*", "+@all",
                          "-@dangerous")
    admin.close()
    return secured_redis


@pytest.mark.parametrize(("user", "why"), [
    ("noscript", "User noscript has no permissions to run the 'evalsha' command"),
    ("reader", "No permissions to access a key"),
])
def test_a_redis_user_the_acl_limits_is_told_what_to_grant(acl_redis, user, why):
    """Before, the ping passed and the crawl died opening its scheduler, with tracebacks."""
    with pytest.raises(ConfigError) as caught:
        check_redis(f"redis://{user}:pw@{acl_redis}", spider="generic")
    assert str(caught.value) == (
        f"REDIS_URL: user '{user}' at redis://{acl_redis} may not do what webfarm needs ({why}): "
        "run Lua scripts (EVALSHA, SCRIPT LOAD) that read and write the keys webfarm:*; "
        f"grant that, e.g. ACL SETUSER {user} ~webfarm:* +@all -@dangerous")
    check_redis(f"redis://{user}:pw@{acl_redis}")  # without a spider: only the ping
    check_redis(f"redis://crawler:pw@{acl_redis}", spider="generic")


def test_a_crawl_or_a_seed_as_a_read_only_redis_user_stops_in_one_line(acl_redis, good, web):
    env = runner.env_for(**{**good, "REDIS_URL": f"redis://reader:pw@{acl_redis}"})
    for command in (["crawl", "generic", "-a", f"start={web.base_urls[0]}/"],
                    ["seed", "generic", f"{web.base_urls[0]}/"],
                    ["dlq", "generic", "--requeue"]):
        result = runner.scrapy(command, env, timeout=60)
        assert result.returncode == 1 and "Traceback" not in result.output, result.output[-2000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("webfarm:")]
        assert len(errors) == 1, result.stderr[-2000:]
        assert "user 'reader'" in errors[0] and "ACL SETUSER reader" in errors[0], errors[0]
    assert web.hits == []
    # Reading is enough to list the dead letters.
    listing = runner.scrapy(["dlq", "generic"], env, timeout=60)
    assert listing.returncode == 0 and "0 dead letters" in listing.stdout, listing.output[-2000:]
    # ... and to preview a recrawl (it reads the index only), but not to run one.
    preview = runner.scrapy(["recrawl", "generic", "--dry-run"], env, timeout=60)
    assert preview.returncode == 0 and "Traceback" not in preview.output, preview.output[-2000:]
    run = runner.scrapy(["recrawl", "generic"], env, timeout=60)
    assert run.returncode == 1 and "ACL SETUSER reader" in run.stderr, run.output[-2000:]


@pytest.fixture()
def own_redis(tmp_path):
    """A Valkey of the test's own, to configure as a deployment might have it."""
    server = servers.valkey(tmp_path / "valkey").start()
    try:
        yield server
    finally:
        server.stop()


def test_a_redis_that_keeps_the_frontier_in_memory_only_is_said_at_start(own_redis, caplog):
    """appendonly no and no save points: a restart of the server empties the frontier.
    A worker (and seed, recrawl) says so, once, at start; the log or snapshots are fine."""
    admin = redis.Redis.from_url(own_redis.url)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "webfarm.redischeck"]

    with caplog.at_level(logging.WARNING, logger="webfarm.redischeck"):
        check_redis(own_redis.url, spider="generic")  # appendonly yes, no save points
        assert said() == []
        admin.config_set("appendonly", "no")
        check_redis(own_redis.url, spider="generic")
        check_redis(own_redis.url)  # a reading command is not told
        assert said() == [
            f"REDIS_URL: {own_redis.url} keeps the frontier in memory only (appendonly no, "
            "no save points): if that server restarts, the queued URLs, leases and seen URLs "
            "are gone and the spider must be seeded again. Set appendonly yes (appendfsync "
            "everysec) on it"]
        caplog.clear()
        admin.config_set("save", "3600 1")  # snapshots: a restart redoes work, loses none
        check_redis(own_redis.url, spider="generic")
        assert said() == []
    admin.close()


def test_a_redis_that_evicts_keys_when_full_is_refused_for_writing(own_redis, good, web):
    """A Redis set up as a cache (maxmemory with an allkeys-* policy) drops keys of its
    choice once full: queued requests, leases and the dupefilter would vanish silently."""
    admin = redis.Redis.from_url(own_redis.url)
    admin.config_set("maxmemory", str(64 * 2**20))
    admin.config_set("maxmemory-policy", "allkeys-lru")
    with pytest.raises(ConfigError, match=(
            r"^REDIS_URL: redis://127\.0\.0\.1:\d+/0 evicts keys when it is full \(maxmemory 64 "
            r"MiB, maxmemory-policy allkeys-lru\): the frontier's queues, leases and seen URLs "
            r"would disappear without an error\. Set maxmemory-policy noeviction")):
        check_redis(own_redis.url, spider="generic")
    check_redis(own_redis.url)  # reading (scrapy frontier, dlq --list) is still fine
    env = runner.env_for(**{**good, "REDIS_URL": own_redis.url})
    result = runner.scrapy(["crawl", "generic", "-a", f"start={web.base_urls[0]}/"], env, 60)
    assert result.returncode == 1 and "Traceback" not in result.output, result.output[-2000:]
    assert "evicts keys when it is full" in result.stderr and web.hits == []
    for policy in ("volatile-lru", "noeviction"):  # only keys with a TTL, or none
        admin.config_set("maxmemory-policy", policy)
        check_redis(own_redis.url, spider="generic")
    admin.close()


def test_a_redis_that_fills_up_mid_crawl_holds_the_crawl_until_it_has_room(
        own_redis, good, web, tmp_path):
    """noeviction: a full Redis refuses writes (OOM). The worker holds what it has, says
    what to do, and goes on once the server has room: every page stored, none twice."""
    admin = redis.Redis.from_url(own_redis.url)
    used = int(admin.info("memory")["used_memory"])
    # Room for the first exchange (it makes the 1.8 MB Bloom filter), none after it.
    admin.config_set("maxmemory", str(used + 2**20))
    base = web.base_urls[0]
    env = runner.env_for(**{**good, "REDIS_URL": own_redis.url})
    log = tmp_path / "crawl.log"
    proc = runner.popen(["crawl", "generic", "-a", f"start={base}/"], env, log)
    try:
        deadline = time.monotonic() + 60
        while "Redis is full (command not allowed when used memory > 'maxmemory'" not in (
                log.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        admin.config_set("maxmemory", "0")
        assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        admin.close()
    output = log.read_text()
    assert "raise its maxmemory or free memory" in output
    assert "Frontier exchanges work again" in output and "Dropped" not in output
    db = pymongo.MongoClient(good["MONGO_URI"])[good["MONGO_DATABASE"]]
    assert {d["url"] for d in db.pages.find()} == web.expected_pages(base)
    hits = [h.path for h in web.hits if h.path != "/robots.txt"]
    assert len(hits) == len(set(hits)), sorted(hits)


@pytest.fixture(scope="module")
def other_services(valkey_server, mongo_server):
    """Addresses where something other than the wanted server answers: MongoDB, Valkey, an
    HTTP server, a listener that never says a word; and a port nobody listens on."""
    silent = socket.create_server(("127.0.0.1", 0))
    http = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        yield {"mongo": mongo_server.url.removeprefix("mongodb://"),
               "valkey": valkey_server.url.removeprefix("redis://").split("/")[0],
               "http": f"127.0.0.1:{http.server_address[1]}",
               "silent": f"127.0.0.1:{silent.getsockname()[1]}",
               "nobody": f"127.0.0.1:{free_port()}"}
    finally:
        http.shutdown()
        http.server_close()
        silent.close()


NOT_REDIS = r"^REDIS_URL: redis://{}/0 is not a Redis server: something there took the " \
            r"connection but did not answer as Redis does \(.+\); is that another service's " \
            r"port\? Point the URL at Redis or Valkey \(port 6379 by default\)$"
NOT_MONGO = r"^MONGO_URI: mongodb://{} is not a MongoDB server: something there answered, " \
            r"but not as MongoDB does \(.+\); is that another service's port\?"
SILENT_MONGO = r"^MONGO_URI: no MongoDB answered at mongodb://{} within 1s: another " \
               r"service's port \(MongoDB's is 27017 by default\), or a network that holds"


@pytest.mark.parametrize(("server", "other", "message"), [
    ("redis", "mongo", NOT_REDIS), ("redis", "http", NOT_REDIS),
    ("redis", "silent", NOT_REDIS),
    ("redis", "nobody", r"^REDIS_URL: cannot reach redis://{}/0 \(.*Connection refused.*\); "
                        r"start that server or fix the URL$"),
    ("mongo", "http", NOT_MONGO), ("mongo", "valkey", SILENT_MONGO),
    ("mongo", "silent", SILENT_MONGO),
    # one pair of parentheses: pymongo's "(configured timeouts: ..." was cut in two
    ("mongo", "nobody", r"^MONGO_URI: cannot reach mongodb://{} \([^()]*Connection refused"
                        r"[^()]*\); start that server or fix the URI$"),
])
def test_another_service_s_port_is_said_as_such(other_services, server, other, message):
    """A URL pointing at the other store's port, or a web server's, said "cannot reach ...;
    start that server", with a server running there. A port nobody listens on still says
    that."""
    address = other_services[other]
    with pytest.raises(ConfigError, match=message.format(re.escape(address))):
        if server == "redis":
            check_redis(f"redis://{address}/0", timeout=1)
        else:
            config.check_mongo(f"mongodb://{address}", timeout=1)


def test_a_mistyped_environment_variable_is_said(monkeypatch):
    """`-s WEBFARM_HOST_DELEY=2` was named as a slip, `WEBFARM_IDLE_TIMEOT=0 scrapy crawl`
    went unsaid, and the README sets settings through the environment."""
    from webfarm.settingnames import _known, misspelt_variables

    # the project's names, as in `scrapy crawl` (alone, this test had Scrapy's only)
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "settings")
    _known.cache_clear()

    assert misspelt_variables({
        "WEBFARM_IDLE_TIMEOT": "0", "WEBFARM_HOST_DELAY": "1",  # a webfarm setting
        "WEBFARM_CONCURRENT_REQUESTS": "4", "WEBFARM_LOG_LEVEL": "INFO",  # Scrapy's, mapped
        "WEBFARM_CHROMIUM": "/usr/bin/chromium", "PATH": "/bin", "WEBFARM_SHINY": "1",
    }) == ["environment variable WEBFARM_IDLE_TIMEOT: no setting reads it; did you mean "
           "WEBFARM_IDLE_TIMEOUT?",
           "environment variable WEBFARM_SHINY: no setting reads it; the README's Settings "
           "table lists them"]
