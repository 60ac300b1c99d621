"""Both blob stores: compressed, content-addressed, write-once, with metadata."""

from __future__ import annotations

import gzip
import hashlib

import boto3
import pytest

from webfarm.blobstore import BlobStoreError, FileBlobStore, blob_key, open_blob_store

BODY = b"<html><body>" + b"hello world " * 500 + b"</body></html>"
HASH = hashlib.sha256(BODY).hexdigest()
META = {"url": "http://127.0.0.2:8081/caf\u00e9?q=1", "content-type": "text/html",
        "fetched-at": "2026-12-02T00:00:00+00:00"}


def test_blob_key_layout():
    assert blob_key(HASH) == f"raw/{HASH[:2]}/{HASH}"
    with pytest.raises(ValueError):
        blob_key("../../etc/passwd")


def _check_store(store):
    key = blob_key(HASH)
    assert not store.exists(key)
    assert store.put_once(key, BODY, META) is True
    assert store.put_once(key, b"other bytes", META) is False  # write-once
    assert store.get(key) == BODY
    assert store.metadata(key)["url"] == META["url"]
    assert list(store.iter_keys()) == [key]


def test_file_store(tmp_path):
    store = open_blob_store((tmp_path / "blobs").as_uri())
    store.check()
    _check_store(store)
    raw = (tmp_path / "blobs" / blob_key(HASH)).read_bytes()
    assert gzip.decompress(raw) == BODY and len(raw) < len(BODY) / 5  # stored compressed


def test_file_store_leaves_no_partial_blob(tmp_path, monkeypatch):
    store = FileBlobStore(tmp_path)

    def crash(*args, **kwargs):
        raise OSError("disk died mid-write")

    monkeypatch.setattr("os.fsync", crash)
    with pytest.raises(OSError):
        store.put_once(blob_key(HASH), BODY, META)
    assert not store.exists(blob_key(HASH))
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == []


def test_file_store_unwritable(tmp_path):
    (tmp_path / "a-file").write_text("not a folder")  # fails for root too
    store = open_blob_store((tmp_path / "a-file" / "blobs").as_uri())
    with pytest.raises(BlobStoreError, match="cannot write"):
        store.check()


def test_s3_store(s3_server, s3_bucket):
    store = open_blob_store(f"s3://{s3_bucket}/crawl1", endpoint_url=s3_server.url)
    store.check()
    _check_store(store)
    client = boto3.client("s3", endpoint_url=s3_server.url)
    obj = client.get_object(Bucket=s3_bucket, Key="crawl1/" + blob_key(HASH))
    assert gzip.decompress(obj["Body"].read()) == BODY


def test_s3_missing_bucket(s3_server):
    store = open_blob_store("s3://no-such-bucket-here/x", endpoint_url=s3_server.url)
    with pytest.raises(BlobStoreError, match="does not exist"):
        store.check()


@pytest.mark.parametrize("uri", ["ftp://x/y", "s3:///nobucket", "file://otherhost/tmp"])
def test_bad_uris(uri):
    with pytest.raises(BlobStoreError):
        open_blob_store(uri)
