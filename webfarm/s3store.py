"""Blobs in an S3 bucket (AWS or any S3-compatible endpoint): :class:`S3BlobStore`.

The layout, compression and write-once rule are :mod:`webfarm.blobstore`'s; this
module adds what S3 needs: botocore's retries, its error codes, and metadata that S3
accepts whatever a page sent.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote

from webfarm.blobstore import (
    Blob,
    BlobMissing,
    BlobStoreError,
    Compression,
    PutMany,
    decompress,
)

_NOT_FOUND = ("404", "NoSuchKey", "NotFound")  # S3 error codes of a key that is not there
S3_METADATA_BYTES = 2000  # S3 refuses a PUT whose user metadata passes 2 KB (keys and values)


def s3_metadata(metadata: dict[str, str]) -> dict[str, str]:
    """``metadata`` as S3 takes it: ASCII (values percent-encoded) and under its size
    limit, past which S3 answers 400 to every retry. A long URL (a redirect target may
    be 16 KB) or a hostile content type is cut to fit and ``truncated`` says so; the
    index keeps the whole URL."""
    out = {k: _quote(v) for k, v in metadata.items()}
    if sum(len(k) + len(v) for k, v in out.items()) <= S3_METADATA_BYTES:
        return out
    budget = S3_METADATA_BYTES - sum(map(len, out)) - len("truncated1")
    names = sorted(out, key=lambda k: len(out[k]))  # shortest first: each takes its share
    for i, name in enumerate(names):
        share = budget // (len(names) - i)
        if len(out[name]) > share:  # the most characters whose encoding fits
            low, high = 0, len(metadata[name])
            while low < high:
                mid = (low + high + 1) // 2
                low, high = (mid, high) if len(_quote(metadata[name][:mid])) <= share else (
                    low, mid - 1)
            out[name] = _quote(metadata[name][:low])
        budget -= len(out[name])
    out["truncated"] = "1"
    return out


def _quote(value: str) -> str:
    return quote(value, safe="/:?=&%+;,@")


CHECK_SECONDS = 10  # the start's bucket check waits this long for an answer


def boto3_client(endpoint_url: str | None, config: Any) -> Any:
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


class S3BlobStore(PutMany):
    """Blobs in an S3 bucket (AWS or any S3-compatible endpoint).

    botocore's "standard" retry mode handles throttling and transient errors;
    the client's connection pool bounds concurrency with the pipeline's threads.
    """

    def __init__(
        self, bucket: str, prefix: str = "", endpoint_url: str | None = None,
        max_connections: int = 16, uri: str | None = None, max_attempts: int = 5,
        compression: Compression | None = None,
    ) -> None:
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.endpoint_url = endpoint_url
        self.uri = uri or f"s3://{bucket}/{self.prefix}"
        self.compression = compression or Compression()
        # Pickled as what opens it again (the storage process gets a client of its own).
        self._recipe = (bucket, prefix, endpoint_url, max_connections, self.uri, max_attempts,
                        self.compression)
        config = Config(
            retries={"mode": "standard", "max_attempts": max_attempts},
            max_pool_connections=max_connections,
            connect_timeout=5,
            read_timeout=30,
        )
        self.client = boto3_client(endpoint_url, config)

    def __reduce__(self) -> tuple[Any, ...]:
        return (S3BlobStore, self._recipe)

    def check(self) -> None:
        from botocore.config import Config
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectTimeoutError,
            ReadTimeoutError,
        )

        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        # Its own client, quick to give up: with the crawl's (30 s reads, 5 attempts) a
        # stopped endpoint held the start for 3 minutes without a word.
        client = boto3_client(self.endpoint_url, Config(
            retries={"mode": "standard", "max_attempts": 2}, connect_timeout=5,
            read_timeout=CHECK_SECONDS))
        try:
            client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchBucket"):
                raise BlobStoreError(
                    f"bucket {self.bucket!r} does not exist{where} (or that is no S3 "
                    "endpoint); create the bucket or fix BLOB_STORE_URI / AWS_ENDPOINT_URL"
                ) from None
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise BlobStoreError(
                    f"bucket {self.bucket!r}{where}: access denied ({code}); check the "
                    "credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_PROFILE) and "
                    "that they may read and write the bucket") from None
            raise BlobStoreError(f"bucket {self.bucket!r}{where}: {code or exc}") from None
        except (ConnectTimeoutError, ReadTimeoutError):
            raise BlobStoreError(
                f"S3{where} did not answer within {CHECK_SECONDS} s, twice (a stopped or "
                "overloaded server?); check AWS_ENDPOINT_URL") from None
        except BotoCoreError as exc:
            raise BlobStoreError(
                f"cannot reach S3{where} ({exc}); check AWS_ENDPOINT_URL and credentials"
            ) from None
        finally:
            client.close()

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self.prefix + key)
            return True
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _NOT_FOUND:
                return False
            raise

    def put_once(self, key: str, body: bytes, metadata: dict[str, str]) -> bool:
        """Write ``body`` (compressed) unless ``key`` exists; True if written now."""
        if self.exists(key):
            return False
        self.client.put_object(
            Bucket=self.bucket,
            Key=self.prefix + key,
            Body=self.compression.compress(body),
            ContentEncoding=self.compression.content_encoding,
            ContentType="application/octet-stream",
            Metadata=s3_metadata(metadata),
        )
        return True

    def get(self, key: str) -> bytes:
        """The body under ``key``; BlobMissing or BlobDamaged when there is none to read."""
        return self.read(key).body

    def read(self, key: str) -> Blob:
        """The body under ``key`` and its metadata, in one GET."""
        from botocore.exceptions import ClientError

        try:
            obj = self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _NOT_FOUND:
                raise BlobMissing(f"no blob {key} in {self.uri}") from None
            raise
        metadata = {k: unquote(v) for k, v in obj.get("Metadata", {}).items()}
        return Blob(decompress(obj["Body"].read()), metadata)

    def metadata(self, key: str) -> dict[str, str]:
        head = self.client.head_object(Bucket=self.bucket, Key=self.prefix + key)
        return {k: unquote(v) for k, v in head.get("Metadata", {}).items()}

    def iter_keys(self, prefix: str = "raw/") -> Iterator[str]:
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
            for obj in page.get("Contents", []):
                yield obj["Key"][len(self.prefix):]
