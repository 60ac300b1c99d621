"""Both blob stores: compressed, content-addressed, write-once, with metadata."""

from __future__ import annotations

import gzip
import hashlib
import pickle

import boto3
import pytest
import zstandard
from scrapy.settings import Settings

from webfarm.blobstore import (
    BlobDamaged,
    BlobStoreError,
    Compression,
    FileBlobStore,
    blob_key,
    open_blob_store,
)
from webfarm.config import ConfigError, blob_compression

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
    # re-parse reads both at once: the body's own content type and encoding
    assert store.read(key) == (BODY, META)
    assert list(store.iter_keys()) == [key]


def test_file_store(tmp_path):
    store = open_blob_store((tmp_path / "blobs").as_uri())
    store.check()
    _check_store(store)
    raw = (tmp_path / "blobs" / blob_key(HASH)).read_bytes()
    # stored compressed, as zstd by default: any zstd tool reads it
    assert zstandard.ZstdDecompressor().decompress(raw) == BODY and len(raw) < len(BODY) / 5


def test_gzip_store_writes_gzip_and_every_store_reads_both(tmp_path):
    gz = open_blob_store(tmp_path.as_uri(), compression=Compression("gzip", 9))
    assert gz.put_once(blob_key(HASH), BODY, META) is True
    assert gzip.decompress((tmp_path / blob_key(HASH)).read_bytes()) == BODY
    other = b"<html>" + b"other page " * 300 + b"</html>"
    other_key = blob_key(hashlib.sha256(other).hexdigest())
    zs = open_blob_store(tmp_path.as_uri())  # a later crawl on zstd, same store
    assert zs.put_once(blob_key(HASH), b"never written", META) is False  # still write-once
    assert zs.put_once(other_key, other, META) is True
    for store in (gz, zs):  # blobs of both kinds side by side, read by either store
        assert store.get(blob_key(HASH)) == BODY
        assert store.get(other_key) == other


@pytest.mark.parametrize("compression", ["zstd", "gzip"])
@pytest.mark.parametrize(("damage", "message"), [
    (lambda raw: b"PK\x03\x04 not ours", "neither zstd nor gzip.*damaged"),
    (lambda raw: raw[: len(raw) // 2], "ends early|does not decompress"),  # a cut-off copy
    (lambda raw: raw[:6] + b"\xff" * (len(raw) - 6), "does not decompress"),  # overwritten
    # One flipped bit in the middle: same length, still decompresses; zstd without its
    # frame checksum read it as another page (a re-parse wrote the wrong value to items).
    (lambda raw: raw[:len(raw) // 2] + bytes([raw[len(raw) // 2] ^ 1]) + raw[len(raw) // 2 + 1:],
     "checksum|CRC check failed|does not decompress"),
])
def test_damaged_blob_says_so(tmp_path, compression, damage, message):
    """A damaged blob raises BlobDamaged; it never reads as a shorter page (a truncated
    zstd frame decompresses to what it holds, without an error of its own)."""
    store = FileBlobStore(tmp_path, compression=Compression(compression))
    store.put_once(blob_key(HASH), BODY, META)
    path = tmp_path / blob_key(HASH)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(BlobDamaged, match=message):
        store.get(blob_key(HASH))


@pytest.mark.parametrize(("name", "level", "want"), [
    (None, None, ("zstd", 3)), ("gzip", None, ("gzip", 6)), ("ZSTD", "19", ("zstd", 19)),
    ("gzip", " 1 ", ("gzip", 1)), ("zstd", "", ("zstd", 3)), ("zstd", 7, ("zstd", 7)),
])
def test_compression_settings(name, level, want):
    settings = Settings({"WEBFARM_BLOB_COMPRESSION": name,
                         "WEBFARM_BLOB_COMPRESSION_LEVEL": level})
    compression = blob_compression(settings)
    assert (compression.name, compression.level) == want
    assert Compression(*want).compress(BODY) == compression.compress(BODY)


@pytest.mark.parametrize(("name", "level", "match"), [
    ("brotli", None, "WEBFARM_BLOB_COMPRESSION is 'brotli'; use zstd or gzip"),
    ("gzip", "12", r"gzip takes a whole number from 1 to 9 \(default 6\)"),
    ("zstd", "fast", r"is 'fast'; zstd takes a whole number from 1 to 22"),
    ("zstd", 0, "from 1 to 22"),
    ("zstd", 2.5, "from 1 to 22"),
    ("zstd", "\u00b2", "is '\u00b2'; zstd takes"),
])
def test_bad_compression_settings_say_what_to_use(name, level, match):
    settings = Settings({"WEBFARM_BLOB_COMPRESSION": name,
                         "WEBFARM_BLOB_COMPRESSION_LEVEL": level})
    with pytest.raises(ConfigError, match=match):
        blob_compression(settings)


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
    assert obj["ContentEncoding"] == "zstd"
    assert zstandard.ZstdDecompressor().decompress(obj["Body"].read()) == BODY
    gz = open_blob_store(f"s3://{s3_bucket}/crawl2", endpoint_url=s3_server.url,
                         compression=Compression("gzip"))
    gz.put_once(blob_key(HASH), BODY, META)
    obj = client.get_object(Bucket=s3_bucket, Key="crawl2/" + blob_key(HASH))
    assert obj["ContentEncoding"] == "gzip"
    assert gzip.decompress(obj["Body"].read()) == BODY == gz.get(blob_key(HASH))


def test_s3_checks_at_start_say_what_is_wrong_and_give_up_soon(s3_server, monkeypatch):
    """A stopped endpoint held the start for 3 minutes without a word (30 s reads, five
    attempts); a server that is no S3 endpoint read as "the bucket does not exist"."""
    import socket
    import time

    from webfarm import s3store

    monkeypatch.setattr(s3store, "CHECK_SECONDS", 1)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # takes connections, never answers
    try:
        store = open_blob_store("s3://pages/raw",
                                endpoint_url=f"http://127.0.0.1:{silent.getsockname()[1]}")
        began = time.monotonic()
        with pytest.raises(BlobStoreError, match=r"S3 at http://127\.0\.0\.1:\d+ did not "
                           r"answer within 1 s, twice \(a stopped or overloaded server\?\); "
                           r"check AWS_ENDPOINT_URL"):
            store.check()
        assert time.monotonic() - began < 10
    finally:
        silent.close()
    missing = open_blob_store("s3://no-such-bucket/x", endpoint_url=s3_server.url)
    with pytest.raises(BlobStoreError, match=r"does not exist at .* \(or that is no S3 "
                       r"endpoint\); create the bucket or fix BLOB_STORE_URI"):
        missing.check()


def test_s3_metadata_fits_s3s_limit_whatever_the_page_sent(s3_server, s3_bucket):
    """S3 refuses a PUT whose metadata passes 2 KB, with a 400 every retry gets again
    (moto does not check it: the test measures what S3 would count)."""
    store = open_blob_store(f"s3://{s3_bucket}/meta", endpoint_url=s3_server.url)
    url = "http://shop.test/r?" + "é" * 3000 + "&x=" + "y" * 12000  # a redirect target
    long = {"url": url, "content-type": "text/html; " + "q" * 3000,
            "fetched-at": "2026-12-05T12:00:00+00:00"}
    assert store.put_once(blob_key(HASH), BODY, long)
    client = boto3.client("s3", endpoint_url=s3_server.url)
    sent = client.head_object(Bucket=s3_bucket, Key="meta/" + blob_key(HASH))["Metadata"]
    assert sum(len(k.encode()) + len(v.encode()) for k, v in sent.items()) <= 2000
    kept = store.metadata(blob_key(HASH))
    assert kept["truncated"] == "1" and kept["fetched-at"] == long["fetched-at"]
    assert url.startswith(kept["url"]) and len(kept["url"]) > 100  # cut, still readable
    assert long["content-type"].startswith(kept["content-type"])
    assert store.get(blob_key(HASH)) == BODY
    # Usual metadata goes as it is.
    store.put_once(blob_key("ab" * 32), BODY, META)
    assert store.metadata(blob_key("ab" * 32)) == META


def test_s3_missing_bucket(s3_server):
    store = open_blob_store("s3://no-such-bucket-here/x", endpoint_url=s3_server.url)
    with pytest.raises(BlobStoreError, match="does not exist"):
        store.check()


@pytest.mark.parametrize("uri", ["ftp://x/y", "s3:///nobucket", "file://otherhost/tmp"])
def test_bad_uris(uri):
    with pytest.raises(BlobStoreError):
        open_blob_store(uri)


@pytest.mark.parametrize("level", [None, "2"])
def test_pipeline_store_compresses_as_set_also_in_the_storage_process(tmp_path, level):
    from scrapy.utils.test import get_crawler

    from pipelines.blobs import BlobStorePipeline

    crawler = get_crawler(settings_dict={
        "BLOB_STORE_URI": tmp_path.as_uri(), "WEBFARM_BLOB_COMPRESSION": "gzip",
        "WEBFARM_BLOB_COMPRESSION_LEVEL": level})
    store = BlobStorePipeline.from_crawler(crawler).store
    copy = pickle.loads(pickle.dumps(store))  # as the storage process gets it
    assert (copy.compression.name, copy.compression.level) == ("gzip", 6 if level is None else 2)
    copy.put_once(blob_key(HASH), BODY, META)
    assert gzip.decompress((tmp_path / blob_key(HASH)).read_bytes()) == BODY
