"""Where the frontier, the index and the blobs live, checked before a crawl starts.

A wrong ``REDIS_URL`` should cost the user one clear line naming the variable,
not a traceback after the first pages were fetched. :func:`preflight` resolves
each location (starting the embedded service when the variable is unset),
connects to it, and raises :class:`ConfigError` with that line otherwise.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from scrapy.settings import BaseSettings

from webfarm.settingtypes import check_types

if TYPE_CHECKING:
    from webfarm.blobstore import Compression

REDIS_SCHEMES = ("redis", "rediss", "unix", "valkey", "valkeys")
MONGO_SCHEMES = ("mongodb", "mongodb+srv")
BLOB_SCHEMES = ("s3", "file")


class ConfigError(Exception):
    """A deployment setting is wrong; the message is one line that says what to do."""


def whole_number(settings: BaseSettings, name: str, default: int, unit: str,
                 zero: str) -> int:
    """A setting that counts ``unit`` (0 means ``zero``); ValueError saying what is wanted
    (read it at start: a value read on the first page fails every page)."""
    raw = settings.get(name, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = -1
    if value < 0:
        raise ValueError(f"{name}={raw!r} is not a whole number of {unit}; 0 means {zero} "
                         f"(default {default})")
    return value


@dataclass(frozen=True)
class Locations:
    redis_url: str
    mongo_uri: str
    mongo_database: str
    blob_uri: str
    aws_endpoint_url: str | None


def _services(settings: BaseSettings):
    from webfarm.services import EmbeddedServices

    return EmbeddedServices(settings.get("WEBFARM_DATA_DIR") or None)


def _embedded(settings: BaseSettings, name: str, variable: str) -> str:
    from webfarm.services import ServiceError

    try:
        return _services(settings).ensure(name)
    except ServiceError as exc:
        raise ConfigError(f"{variable} is unset and the embedded service failed: {exc}") from None


def _scheme(uri: str, variable: str, example: str) -> str:
    """The scheme of ``uri``; ConfigError when it is not a URL at all (``mongodb://[db``,
    an unclosed IPv6 bracket, ended in urllib's traceback)."""
    try:
        return urlsplit(uri).scheme
    except ValueError as exc:
        raise ConfigError(f"{variable}={safe_url(uri)!r} is not a URL ({exc}); use {example}"
                          ) from None


def redis_url(settings: BaseSettings) -> str:
    """``REDIS_URL``, or the embedded Valkey's URL (started if needed)."""
    url = settings.get("REDIS_URL") or ""
    if not url:
        _refuse_scrapy_redis_address(settings)
        return _embedded(settings, "redis", "REDIS_URL")
    scheme = _scheme(url, "REDIS_URL", "redis://host:6379/0")
    if scheme not in REDIS_SCHEMES:
        raise ConfigError(
            f"REDIS_URL={safe_url(url)!r}: scheme {scheme!r} is not one of "
            f"{', '.join(REDIS_SCHEMES)}; "
            "use redis://host:6379/0, or unset it for the embedded Valkey"
        )
    return url.replace("valkey", "redis", 1) if scheme.startswith("valkey") else url


def _refuse_scrapy_redis_address(settings: BaseSettings) -> None:
    """scrapy-redis's ``REDIS_HOST``/``REDIS_PORT`` without ``REDIS_URL``: webfarm read
    neither and started the embedded Valkey, so each machine of a migrated deployment
    crawled on a frontier of its own (every URL once per machine, and each machine as
    impolite as the whole fleet should be). Said in one line instead."""
    values = {name: settings.get(name) or os.environ.get(name, "").strip()
              for name in ("REDIS_HOST", "REDIS_PORT")}  # as variables, as REDIS_URL is read
    given = [f"{name}={value}" for name, value in values.items() if value]
    if given:
        host = values["REDIS_HOST"] or "localhost"
        port = values["REDIS_PORT"] or 6379
        raise ConfigError(
            f"{' and '.join(given)} "
            f"{'are scrapy-redis settings' if len(given) > 1 else 'is a scrapy-redis setting'}"
            ", and webfarm reads REDIS_URL "
            f"only: set REDIS_URL=redis://{host}:{port}/0 (with user:password@ and the db "
            "number your REDIS_PARAMS gave)")


def mongo_uri(settings: BaseSettings) -> str:
    """``MONGO_URI``, or the embedded SecantusDB's URI (started if needed)."""
    uri = settings.get("MONGO_URI") or ""
    if not uri:
        return _embedded(settings, "mongo", "MONGO_URI")
    scheme = _scheme(uri, "MONGO_URI", "mongodb://host:27017")
    if scheme not in MONGO_SCHEMES:
        raise ConfigError(
            f"MONGO_URI={safe_url(uri)!r}: scheme {scheme!r} is not mongodb or mongodb+srv; "
            "use mongodb://host:27017, or unset it for the embedded server"
        )
    return uri


def mongo_database(settings: BaseSettings) -> str:
    """``MONGO_DATABASE`` (default ``webfarm``), refused when MongoDB would refuse it: it
    was said as "cannot reach" the server (``a.b``), or as the server's refusal."""
    name = settings.get("MONGO_DATABASE") or "webfarm"
    bad = "".join(sorted({c for c in str(name) if c in '/\\. "$\x00'}))
    if bad or len(str(name).encode()) > 63:
        why = f"it has {bad!r}" if bad else "it is over 63 bytes"
        raise ConfigError(f"MONGO_DATABASE={name!r} is not a name MongoDB accepts ({why}); "
                          "use letters, digits, _ and -, at most 63 bytes")
    return str(name)


def blob_uri(settings: BaseSettings) -> str:
    """``BLOB_STORE_URI``, or ``file://`` under the data folder."""
    uri = settings.get("BLOB_STORE_URI") or ""
    if not uri:
        return _embedded(settings, "blobs", "BLOB_STORE_URI")
    scheme = _scheme(uri, "BLOB_STORE_URI", "s3://bucket/prefix or file:///path")
    if scheme not in BLOB_SCHEMES:
        raise ConfigError(
            f"BLOB_STORE_URI={safe_url(uri)!r}: scheme {scheme!r} is not s3 or file; "
            "use s3://bucket/prefix or file:///path, or unset it for the local folder"
        )
    return uri


def locations(settings: BaseSettings) -> Locations:
    return Locations(
        redis_url=redis_url(settings),
        mongo_uri=mongo_uri(settings),
        mongo_database=mongo_database(settings),
        blob_uri=blob_uri(settings),
        aws_endpoint_url=settings.get("AWS_ENDPOINT_URL") or None,
    )


def _where(settings: BaseSettings, variable: str) -> str:
    return variable if settings.get(variable) else f"{variable} (unset: embedded)"


def check_mongo(uri: str, variable: str = "MONGO_URI", timeout: float = 5.0,
                database: str | None = None) -> None:
    """The server answers; with ``database``, the URI's user may also write there: the
    index DB's indexes are created (as a crawl does at its start), so a secured server
    without credentials, or a read-only user, is one line here instead of a traceback
    from the first pipeline."""
    import pymongo
    from pymongo.errors import (
        ConfigurationError,
        OperationFailure,
        ProtocolError,
        PyMongoError,
    )

    try:
        client = pymongo.MongoClient(uri, serverSelectionTimeoutMS=int(timeout * 1000))
        try:
            client.admin.command("ping")
        finally:
            client.close()
        if database is not None:
            from webfarm.index import IndexStore

            store = IndexStore(uri, database, timeout_ms=int(timeout * 1000))
            try:
                store.ensure_indexes()
            finally:
                store.close()
    except ConfigurationError as exc:
        raise ConfigError(f"{variable}={safe_url(uri)!r} is not a valid URI ({exc})") from None
    except OperationFailure as exc:
        raise ConfigError(_refused(exc, uri, variable, database)) from None
    except (PyMongoError, ValueError) as exc:
        first = str(exc).split(",")[0]
        if isinstance(exc, ProtocolError) or "ProtocolError(" in str(exc):
            raise ConfigError(
                f"{variable}: {safe_url(uri)} is not a MongoDB server: something there "
                f"answered, but not as MongoDB does ({first}); is that another service's "
                "port? Point the URI at MongoDB (port 27017 by default)") from None
        if first.startswith("No servers found yet"):  # connected, or connecting: no reply
            raise ConfigError(
                f"{variable}: no MongoDB answered at {safe_url(uri)} within {timeout:g}s: "
                "another service's port (MongoDB's is 27017 by default), or a network that "
                "holds the connection; fix the URI or start MongoDB there") from None
        # pymongo's "(configured timeouts: a, b)" held the comma the cut was at
        first = first.split(" (configured timeouts:")[0]
        raise ConfigError(
            f"{variable}: cannot reach {safe_url(uri)} ({first}); "
            "start that server or fix the URI"
        ) from None


def _refused(exc: Exception, uri: str, variable: str, database: str | None) -> str:
    """What to do when MongoDB answers but refuses this user (or no user)."""
    from pymongo.uri_parser import parse_uri

    code = getattr(exc, "code", None)
    why = str(exc).split(", full error")[0]
    where = safe_url(uri)
    user = parse_uri(uri).get("username")
    if code in (18, 8000):  # AuthenticationFailed (8000: Atlas's)
        return (f"{variable}: {where} refused the user name or password ({why}); fix them in "
                "the URI (with authSource=DB if the user is defined in another database)")
    if code == 13 and not user:  # Unauthorized, and no credentials were given
        return (f"{variable}: {where} requires a user ({why}); put user:password@ in the URI")
    if code == 13:
        return (f"{variable}: user {user!r} may not write to database {database!r} at {where} "
                f"({why}); give it the readWrite role there, or use another user")
    return f"{variable}: {where} refused ({why}); check the server's log"


def check_blobs(uri: str, endpoint_url: str | None, variable: str = "BLOB_STORE_URI") -> None:
    from webfarm.blobstore import BlobStoreError, open_blob_store

    if endpoint_url and uri.startswith("s3:"):  # botocore's ValueError was a traceback
        example = "http://host:9000 (an S3-compatible server), or unset it for AWS"
        scheme = _scheme(endpoint_url, "AWS_ENDPOINT_URL", example)
        if scheme not in ("http", "https") or not urlsplit(endpoint_url).hostname:
            raise ConfigError(f"AWS_ENDPOINT_URL={safe_url(endpoint_url)!r} is not an "
                              f"http(s) URL; use {example}")
    try:
        open_blob_store(uri, endpoint_url=endpoint_url).check()
    except BlobStoreError as exc:
        raise ConfigError(f"{variable}: {exc}") from None


def blob_compression(settings: BaseSettings) -> Compression:
    """How new blobs are compressed: ``WEBFARM_BLOB_COMPRESSION`` (zstd or gzip) at
    ``WEBFARM_BLOB_COMPRESSION_LEVEL`` (empty: that codec's default)."""
    from webfarm.blobstore import BlobStoreError, Compression

    name = str(settings.get("WEBFARM_BLOB_COMPRESSION") or "zstd").strip().lower()
    level = settings.get("WEBFARM_BLOB_COMPRESSION_LEVEL")
    if isinstance(level, str):  # from -s or a settings file: "", "9", or junk
        with contextlib.suppress(ValueError):
            level = int(level) if level.strip() else None
    try:
        return Compression(name, level)
    except BlobStoreError as exc:
        raise ConfigError(str(exc)) from None


def check_settings(settings: BaseSettings) -> None:
    """:class:`ConfigError` naming a setting whose value is of the wrong type (see
    :mod:`webfarm.settingtypes`): every command checks this before it connects."""
    try:
        check_types(settings)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def preflight(settings: BaseSettings, spider: str | None = None) -> Locations:
    """Resolve and check every location, one at a time, so a bad ``REDIS_URL`` is
    reported before an embedded MongoDB is started for nothing (with ``spider``, also that
    Redis lets the user at that spider's keys). Raises :class:`ConfigError` on the first
    bad one. Settings of the wrong type (``-s WEBFARM_HOST_DELAY=abc``) are refused first."""
    from webfarm.redischeck import check_redis

    check_settings(settings)
    redis = redis_url(settings)
    check_redis(redis, _where(settings, "REDIS_URL"), spider=spider)
    mongo = mongo_uri(settings)
    database = mongo_database(settings)
    check_mongo(mongo, _where(settings, "MONGO_URI"), database=database)
    blobs = blob_uri(settings)
    endpoint = settings.get("AWS_ENDPOINT_URL") or None
    check_blobs(blobs, endpoint, _where(settings, "BLOB_STORE_URI"))
    blob_compression(settings)
    return Locations(redis, mongo, database, blobs, endpoint)


def fleet_warning(settings: BaseSettings) -> str | None:
    """What a worker should hear when its frontier is on another machine (a fleet's
    shared Redis) while its index or raw pages stay on this one (``MONGO_URI`` or
    ``BLOB_STORE_URI`` unset: the embedded server, the local folder). Other machines'
    workers and ``scrapy reparse`` elsewhere cannot read them, and a lost machine loses
    them. Read before :func:`apply` pins the resolved locations."""
    try:
        host = urlsplit(settings.get("REDIS_URL") or "").hostname
    except ValueError:  # not a URL: preflight says so
        return None
    if not host or host == "localhost" or _loopback(host):
        return None
    local = {"MONGO_URI": "index", "BLOB_STORE_URI": "raw pages"}
    unset = [name for name in local if not settings.get(name)]
    if not unset:
        return None
    return (f"REDIS_URL is on {host}, a frontier other machines share, but "
            f"{' and '.join(unset)} {'is' if len(unset) == 1 else 'are'} unset: this "
            f"machine keeps its {' and '.join(local[n] for n in unset)} to itself, out of "
            "reach of other machines' workers and `scrapy reparse`, and lost with it; set "
            f"{' and '.join(unset)} to the fleet's servers")


def _loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def apply(settings: BaseSettings, loc: Locations) -> None:
    """Pin resolved locations into ``settings`` so components do not resolve them again."""
    settings.set("REDIS_URL", loc.redis_url, priority="cmdline")
    settings.set("MONGO_URI", loc.mongo_uri, priority="cmdline")
    settings.set("BLOB_STORE_URI", loc.blob_uri, priority="cmdline")


_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s]*@")


def mask_credentials(text: str) -> str:
    """Hide the ``user:password@`` part of every URL in ``text`` (user names are often
    tokens too, so the whole user-info goes)."""
    return _USERINFO.sub(r"\1***@", text)


def safe_url(url: str) -> str:
    """A URL without its credentials, for messages and logs."""
    return mask_credentials(url)


def file_path(uri: str) -> Path:
    """The folder of a ``file://`` URI."""
    return Path(urlsplit(uri).path)
