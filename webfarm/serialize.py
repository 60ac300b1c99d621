"""JSON serialisation of requests for Redis — never pickle.

Whoever can write to Redis must not be able to run code on the workers, so a
queued request is plain JSON of :meth:`scrapy.Request.to_dict`, bytes tagged as
base64, and decoding accepts only known request classes. Credentials never
reach Redis: ``Authorization``/``Proxy-Authorization``/``Cookie`` headers and
the user:password part of ``meta["proxy"]`` are dropped on the way in (the
middlewares that add them run again when the request is fetched).

The module has ``dumps``/``loads`` so it plugs into scrapy-redis as
``SCHEDULER_SERIALIZER``.
"""

from __future__ import annotations

import base64
import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ALLOWED_REQUEST_CLASSES = frozenset(
    {
        "scrapy.http.request.Request",
        "scrapy.http.request.form.FormRequest",
        "scrapy.http.request.json_request.JsonRequest",
        "scrapy.http.request.rpc.XmlRpcRequest",
        "scrapy.Request",
        "scrapy.FormRequest",
        "scrapy.http.Request",
        "scrapy.http.FormRequest",
        "scrapy.http.JsonRequest",
    }
)
SECRET_HEADERS = frozenset({b"authorization", b"proxy-authorization", b"cookie"})
# meta keys that hold live objects or secrets and must not be queued.
DROPPED_META = frozenset({"_auth_proxy", "playwright_page", "download_slot"})
_BYTES = "__b64__"


class SerializationError(ValueError):
    """A request cannot be stored as JSON, or a stored entry is not a request of ours."""


def _encode(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return {_BYTES: base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, dict):
        return {_key(k): _encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise SerializationError(
        f"cannot queue a {type(obj).__name__} in a request; keep meta and cb_kwargs to JSON "
        "types (str, numbers, lists, dicts)"
    )


def _key(key: Any) -> str:
    if isinstance(key, bytes):
        return key.decode("latin-1")
    if isinstance(key, str):
        return key
    raise SerializationError(f"dict keys in a queued request must be strings, got {key!r}")


def _decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if len(obj) == 1 and _BYTES in obj:
            return base64.b64decode(obj[_BYTES])
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def strip_proxy_credentials(proxy: str) -> str:
    """``http://user:pass@host:port`` -> ``http://host:port``."""
    parts = urlsplit(proxy)
    if "@" not in parts.netloc:
        return proxy
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))


def scrub(request_dict: dict[str, Any]) -> dict[str, Any]:
    """Remove credentials and live objects from ``Request.to_dict()`` output."""
    d = dict(request_dict)
    headers = d.get("headers") or {}
    d["headers"] = {
        k: v
        for k, v in headers.items()
        if (k.lower() if isinstance(k, bytes) else k.lower().encode()) not in SECRET_HEADERS
    }
    meta = {k: v for k, v in (d.get("meta") or {}).items() if k not in DROPPED_META}
    if isinstance(meta.get("proxy"), str):
        meta["proxy"] = strip_proxy_credentials(meta["proxy"])
    d["meta"] = meta
    return d


def dumps(request_dict: dict[str, Any]) -> str:
    """Serialise a ``Request.to_dict()`` result to JSON, without secrets."""
    return json.dumps(_encode(scrub(request_dict)), separators=(",", ":"), sort_keys=True)


def loads(data: str | bytes) -> dict[str, Any]:
    """Parse a queued entry back into a dict for ``request_from_dict``.

    Raises :class:`SerializationError` for anything that is not a request we
    wrote: the caller dead-letters it instead of crashing or running it.
    """
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SerializationError(f"not JSON: {exc}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("url"), str):
        raise SerializationError("not a serialised request (no 'url')")
    cls = obj.get("_class")
    if cls is not None and cls not in ALLOWED_REQUEST_CLASSES:
        raise SerializationError(f"request class {cls!r} is not allowed")
    for name in ("callback", "errback"):
        value = obj.get(name)
        if value is not None and (not isinstance(value, str) or value.startswith("__")):
            raise SerializationError(f"{name} must name a spider method, got {value!r}")
    return _decode(obj)
