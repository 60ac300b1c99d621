"""Fixtures that start real services on free ports and stop them afterwards."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import servers
from tests.testweb import TestWeb

# Tests never touch a developer's real AWS account or config files.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture(scope="session", autouse=True)
def the_checkout_stays_clean() -> Iterator[None]:
    """No test starts embedded services or writes blobs in the checkout's ``.webfarm/``:
    a test that resolved the default locations left a Valkey running there after the
    suite. Each test gives its own (``stores``, ``data_dir``)."""
    data = Path(__file__).resolve().parent.parent / ".webfarm"
    existed = data.exists()
    yield
    if not existed and data.exists():
        pytest.fail(f"a test created {data} (its default locations): give it stores of its "
                    "own; stop what runs there with `scrapy services down`")


@pytest.fixture(scope="session")
def valkey_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Server]:
    server = servers.valkey(tmp_path_factory.mktemp("valkey")).start()
    yield server
    server.stop()


@pytest.fixture()
def redis_url(valkey_server: servers.Server) -> Iterator[str]:
    """A Valkey URL whose database is empty at the start of the test."""
    import redis

    client = redis.Redis.from_url(valkey_server.url)
    client.flushall()
    yield valkey_server.url
    client.close()


@pytest.fixture(scope="session")
def mongo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Server]:
    server = servers.secantus(tmp_path_factory.mktemp("secantus")).start()
    yield server
    server.stop()


@pytest.fixture()
def own_mongo(tmp_path: Path) -> Iterator[servers.Server]:
    """A SecantusDB of this test alone: it gets stopped, restarted, fail-pointed, or its
    connections counted."""
    server = servers.secantus(tmp_path / "secantus").start()
    yield server
    server.stop()


@pytest.fixture()
def mongo_uri(mongo_server: servers.Server) -> str:
    return mongo_server.url


@pytest.fixture()
def mongo_db_name() -> str:
    """A database name of its own for each test."""
    return f"wf_{uuid.uuid4().hex[:10]}"


@pytest.fixture()
def mongo_db(mongo_uri: str, mongo_db_name: str):
    """That database on a client of the test's own (tz-aware), dropped at the end."""
    import pymongo

    client = pymongo.MongoClient(mongo_uri, tz_aware=True)
    yield client[mongo_db_name]
    client.drop_database(mongo_db_name)
    client.close()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[servers.Server]:
    server = servers.moto_s3(tmp_path_factory.mktemp("moto")).start()
    yield server
    server.stop()


@pytest.fixture()
def s3_bucket(s3_server: servers.Server) -> str:
    """A fresh, existing bucket on the moto server."""
    import boto3

    name = f"wf-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_server.url, region_name="us-east-1").create_bucket(
        Bucket=name
    )
    return name


@pytest.fixture()
def stores(redis_url: str, mongo_uri: str, mongo_db_name: str, tmp_path: Path) -> dict[str, str]:
    """Where a test crawl keeps things: the environment for ``tests.runner.env_for``."""
    return {"REDIS_URL": redis_url, "MONGO_URI": mongo_uri, "MONGO_DATABASE": mongo_db_name,
            "BLOB_STORE_URI": (tmp_path / "blobs").as_uri()}


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    path = tmp_path / "webfarm-data"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def testweb() -> Iterator[TestWeb]:
    """The catalogue test web on two loopback hosts (two different shops)."""
    with TestWeb(hosts=("127.0.0.2", "127.0.0.3")) as web:
        yield web


@pytest.fixture()
def web(testweb: TestWeb) -> TestWeb:
    """The shared test web, with its hit log and custom routes cleared for this test."""
    testweb.clear_hits()
    testweb.clear_routes()
    return testweb
