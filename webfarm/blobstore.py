"""Raw pages, compressed and content-addressed, on a filesystem or any S3 endpoint.

Both stores keep ``raw/<hash[:2]>/<hash>`` under their prefix, compressed
(zstd, or gzip with ``WEBFARM_BLOB_COMPRESSION``), with the URL, content type and
fetch time as metadata, and write a key only once. A blob is read by its magic
bytes, so one store can hold both kinds (blobs written before zstd are gzip).
The calls are blocking on purpose (boto3 is); pipelines run them in a bounded
thread pool so the reactor never waits on storage.
"""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import os
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, Protocol
from urllib.parse import unquote, urlsplit

META_SUFFIX = ".meta.json"


class BlobStoreError(Exception):
    """The store cannot be used; the message says what to do."""


class BlobMissing(BlobStoreError):
    """No blob under that key (deleted, or the index points to another store)."""


class BlobDamaged(BlobStoreError):
    """A stored blob that does not decompress to a whole body."""


def blob_key(content_hash: str) -> str:
    """The key of a raw page under the store's prefix: ``raw/<hash[:2]>/<hash>``."""
    if len(content_hash) < 8 or not all(c in "0123456789abcdef" for c in content_hash):
        raise ValueError(f"not a hex content hash: {content_hash!r}")
    return f"raw/{content_hash[:2]}/{content_hash}"


# name -> (default level, lowest, highest)
COMPRESSIONS = {"zstd": (3, 1, 22), "gzip": (6, 1, 9)}
_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class Compression:
    """How new blobs are compressed (``WEBFARM_BLOB_COMPRESSION``, ``..._LEVEL``).

    zstd by default: on 150 real HTML pages (125 KB each) level 3 took 0.17 ms a
    page where gzip -6 took 1.08 ms, for 3% more bytes; the storage helper shares
    the crawler's cores. gzip is there for tools that read nothing else.
    """

    def __init__(self, name: str = "zstd", level: int | None = None) -> None:
        if name not in COMPRESSIONS:
            raise BlobStoreError(f"WEBFARM_BLOB_COMPRESSION is {name!r}; use "
                                 f"{' or '.join(COMPRESSIONS)}")
        default, low, high = COMPRESSIONS[name]
        if level is None:
            level = default
        if isinstance(level, bool) or not isinstance(level, int) or not low <= level <= high:
            raise BlobStoreError(f"WEBFARM_BLOB_COMPRESSION_LEVEL is {level!r}; {name} takes "
                                 f"a whole number from {low} to {high} (default {default})")
        self.name = name
        self.level = level
        self._local = threading.local()  # a zstd compressor is not safe to share

    def __reduce__(self) -> tuple[Any, ...]:
        return (Compression, (self.name, self.level))

    @property
    def content_encoding(self) -> str:
        """The HTTP ``Content-Encoding`` token of the compressed bytes (RFC 8878: zstd)."""
        return self.name

    def compress(self, body: bytes) -> bytes:
        if self.name == "gzip":
            # mtime=0: the same body always compresses to the same bytes.
            return gzip.compress(body, compresslevel=self.level, mtime=0)
        compressor = getattr(self._local, "zstd", None)
        if compressor is None:
            import zstandard

            # With the frame's checksum a flipped bit is a damaged blob, not another page
            # (gzip has its CRC); 4 bytes a blob.
            compressor = self._local.zstd = zstandard.ZstdCompressor(level=self.level,
                                                                     write_checksum=True)
        return compressor.compress(body)


def decompress(data: bytes) -> bytes:
    """A blob's body, whichever compression it was written with. A blob that does not
    decompress whole (truncated, overwritten, not webfarm's) raises :class:`BlobDamaged`:
    a partial body must never pass for the page."""
    try:
        if data.startswith(_ZSTD_MAGIC):
            import zstandard

            inflater = zstandard.ZstdDecompressor().decompressobj()
            body = inflater.decompress(data)
            if not inflater.eof:  # a truncated frame gives what it has, silently
                raise BlobDamaged(f"a zstd blob that ends early ({len(data)} bytes)")
            return body
        if data.startswith(_GZIP_MAGIC):
            return gzip.decompress(data)
    except BlobDamaged:
        raise
    except Exception as exc:  # zstandard.ZstdError, EOFError, gzip.BadGzipFile, zlib.error
        raise BlobDamaged(f"a blob that does not decompress ({type(exc).__name__}: {exc})"
                          ) from None
    raise BlobDamaged(f"a blob that is neither zstd nor gzip (it starts {data[:4]!r}); "
                      "it was not written by webfarm, or it was damaged")


BlobWrite = tuple[str, bytes, dict[str, str]]  # key, body, metadata


class Blob(NamedTuple):
    """A body and the metadata written with it: the content type and encoding of *these*
    bytes (the first page that had the content), which a page sharing the content by
    its hash may not have had."""

    body: bytes
    metadata: dict[str, str]


class BlobStore(Protocol):
    uri: str

    def check(self) -> None: ...
    def exists(self, key: str) -> bool: ...
    def put_once(self, key: str, body: bytes, metadata: dict[str, str]) -> bool: ...
    def put_many(self, writes: list[BlobWrite], concurrency: int = 8) -> list[bool | str]: ...
    def get(self, key: str) -> bytes: ...
    def read(self, key: str) -> Blob: ...
    def metadata(self, key: str) -> dict[str, str]: ...
    def iter_keys(self, prefix: str = "raw/") -> Iterator[str]: ...


class PutMany:
    """``put_many`` for both stores: one call (one round trip to the storage process)
    for many writes, which run ``concurrency`` at a time in a pool of the store's own."""

    _pool: ThreadPoolExecutor | None = None
    _pool_lock = threading.Lock()

    def put_once(self, key: str, body: bytes, metadata: dict[str, str]) -> bool:
        raise NotImplementedError

    def put_many(self, writes: list[BlobWrite], concurrency: int = 8) -> list[bool | str]:
        """``put_once`` for each write; per write True (written now), False (it was
        there) or, if it failed for now (a store error worth retrying), the error as
        text. Any other error is raised, once every write ended."""
        from webfarm.batching import TRANSIENT

        # Always in the pool, even a single write: calls of two writers at once must not
        # run more than ``concurrency`` writes between them.
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max(1, concurrency),
                                                thread_name_prefix="webfarm-blob")
        futures = [self._pool.submit(self.put_once, *w) for w in writes]
        results: list[bool | str] = []
        fatal: Exception | None = None
        for future in futures:
            try:
                results.append(future.result())
            except TRANSIENT as exc:
                results.append(f"{type(exc).__name__}: {exc}")
            except Exception as exc:
                fatal = fatal or exc
                results.append(f"{type(exc).__name__}: {exc}")
        if fatal is not None:
            raise fatal
        return results


class FileBlobStore(PutMany):
    """Blobs as files; a write goes to a temp file, is fsynced and renamed into place,
    so a crash never leaves a half-written blob under its final name."""

    def __init__(self, root: str | Path, uri: str | None = None,
                 compression: Compression | None = None) -> None:
        self.root = Path(root)
        self.uri = uri or self.root.resolve().as_uri()
        self.compression = compression or Compression()
        self._real = os.path.realpath(self.root)
        self._dirs: set[str] = set()  # folders known to exist (saves a mkdir per write)
        self._seq = itertools.count()

    def __reduce__(self) -> tuple[Any, ...]:
        return (FileBlobStore, (str(self.root), self.uri, self.compression))

    def _path(self, key: str) -> Path:
        return Path(self._file(key))

    def _file(self, key: str) -> str:
        parts = key.split("/")
        if key.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"blob key escapes the store: {key!r}")
        return os.path.join(self._real, *parts)

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".check-"):
                pass
        except OSError as exc:
            raise BlobStoreError(f"cannot write to {self.root} ({exc.strerror})") from None

    def exists(self, key: str) -> bool:
        return os.path.exists(self._file(key))

    def _write_new(self, path: str, data: bytes, replace: bool = False) -> bool:
        """Write ``data`` to a temp file, fsync it, then link it to ``path``.

        ``os.link`` fails if ``path`` exists, so of two writers racing on one key
        exactly one wins, and ``path`` never names a partly written file (a crash
        leaves at most a hidden ``.tmp-*`` file, which no reader looks at).
        """
        folder = os.path.dirname(path)
        if folder not in self._dirs:
            os.makedirs(folder, exist_ok=True)
            self._dirs.add(folder)
        tmp = os.path.join(folder, f".tmp-{os.getpid()}-{threading.get_ident()}-"
                                   f"{next(self._seq)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if replace:
                os.replace(tmp, path)
                return True
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def put_once(self, key: str, body: bytes, metadata: dict[str, str]) -> bool:
        """Write ``body`` (compressed) unless ``key`` exists; True if written now."""
        path = self._file(key)
        if os.path.exists(path):
            return False
        # Metadata first: a blob under its final name always has its metadata.
        self._write_new(path + META_SUFFIX, json.dumps(metadata).encode(), replace=True)
        return self._write_new(path, self.compression.compress(body))

    def get(self, key: str) -> bytes:
        """The body under ``key``; BlobMissing or BlobDamaged when there is none to read."""
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            raise BlobMissing(f"no blob {key} in {self.uri}") from None
        return decompress(data)

    def read(self, key: str) -> Blob:
        """The body under ``key`` with its metadata ({} if its file is gone)."""
        body = self.get(key)
        try:
            return Blob(body, self.metadata(key))
        except (OSError, ValueError):  # written first, so only a hand could remove it
            return Blob(body, {})

    def metadata(self, key: str) -> dict[str, str]:
        path = self._path(key)
        return json.loads(path.with_name(path.name + META_SUFFIX).read_bytes())

    def iter_keys(self, prefix: str = "raw/") -> Iterator[str]:
        base = self.root / prefix
        if not base.exists():
            return
        for path in sorted(base.rglob("*")):
            if path.is_file() and not path.name.startswith(".") and not path.name.endswith(
                META_SUFFIX
            ):
                yield path.relative_to(self.root).as_posix()


def open_blob_store(
    uri: str, endpoint_url: str | None = None, max_attempts: int = 5, max_connections: int = 16,
    compression: Compression | None = None,
) -> BlobStore:
    """A store for ``s3://bucket/prefix`` or ``file:///path``; ``max_attempts`` is
    botocore's retry budget per S3 call, ``max_connections`` its connection pool,
    ``compression`` how it writes new blobs (it reads both kinds)."""
    parts = urlsplit(uri)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise BlobStoreError(f"file URI {uri!r} names a host; use file:///absolute/path")
        return FileBlobStore(unquote(parts.path), uri=uri, compression=compression)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise BlobStoreError(f"S3 URI {uri!r} has no bucket; use s3://bucket/prefix")
        from webfarm.s3store import S3BlobStore

        return S3BlobStore(parts.netloc, parts.path, endpoint_url=endpoint_url, uri=uri,
                           max_attempts=max_attempts, max_connections=max_connections,
                           compression=compression)
    raise BlobStoreError(f"unknown blob store {uri!r}; use s3://bucket/prefix or file:///path")
