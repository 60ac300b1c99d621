"""A wrong REDIS_URL / MONGO_URI / BLOB_STORE_URI stops the crawl at start, in one clear line."""

from __future__ import annotations

import pytest

from tests import runner
from tests.servers import free_port


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
