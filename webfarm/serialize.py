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
import os
import sys
import sysconfig
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from itemadapter import ItemAdapter
from scrapy import Item
from scrapy.utils.project import ENVVAR

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
_PAGE_METHOD = "__page_method__"
_ITEM = "__item__"
_TUPLE = "__tuple__"
_SET = "__set__"
_FROZENSET = "__frozenset__"
_LIBRARY_ROOTS = frozenset(
    os.path.abspath(path) for name, path in sysconfig.get_paths().items()
    if name in ("stdlib", "platstdlib", "purelib", "platlib"))
#: Page methods a queued scrapy-playwright ``PageMethod`` may name: ones that wait for or
#: act on the page. Not ``screenshot``/``pdf`` (they write files on the worker with
#: ``path=``), ``set_input_files``/``add_script_tag`` (they read them), ``goto``, ``route``
#: or ``expose_function``: whoever can write to Redis must not reach the worker's files.
PAGE_METHODS = frozenset({
    "wait_for_selector", "wait_for_timeout", "wait_for_load_state", "wait_for_function",
    "wait_for_url", "evaluate", "click", "dblclick", "hover", "tap", "focus", "fill",
    "type", "press", "check", "uncheck", "select_option", "dispatch_event",
    "set_viewport_size", "emulate_media",
})


class SerializationError(ValueError):
    """A request cannot be stored as JSON, or a stored entry is not a request of ours."""


def _encode(obj: Any) -> Any:
    if isinstance(obj, bytes):
        return {_BYTES: base64.b64encode(obj).decode("ascii")}
    if type(obj).__name__ == "PageMethod" and type(obj).__module__.startswith("scrapy_playwright"):
        return {_PAGE_METHOD: [_page_method_name(obj.method), _encode(list(obj.args)),
                               _encode(obj.kwargs)]}
    if isinstance(obj, dict):
        return {_key(k): _encode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_encode(v) for v in obj]
    # Tagged, so that a callback gets what the spider put in cb_kwargs or meta: a tuple
    # came back as a list, and ``pos == (1, 2)`` or a dict key made of it broke.
    if isinstance(obj, tuple):
        return {_TUPLE: [_encode(v) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        tag = _FROZENSET if isinstance(obj, frozenset) else _SET
        return {tag: [_encode(v) for v in sorted(obj, key=repr)]}
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if ItemAdapter.is_item(obj):  # an item passed on to the next page's callback
        cls = type(obj)
        return {_ITEM: [f"{cls.__module__}:{cls.__qualname__}",
                        {_key(k): _encode(v) for k, v in ItemAdapter(obj).items()}]}
    raise SerializationError(
        f"cannot queue a {type(obj).__name__} in a request; keep meta and cb_kwargs to JSON "
        "types (str, numbers, lists, dicts), tuples, sets and items"
    )


def _key(key: Any) -> str:
    if isinstance(key, bytes):
        return key.decode("latin-1")
    if isinstance(key, str):
        return key
    raise SerializationError(f"dict keys in a queued request must be strings, got {key!r}")


def _page_method_name(method: Any) -> str:
    if not isinstance(method, str):
        raise SerializationError(
            f"cannot queue a PageMethod that calls {method!r}: name a Page method instead, "
            "e.g. PageMethod('wait_for_selector', 'div.price')")
    if method not in PAGE_METHODS:
        raise SerializationError(
            f"cannot queue PageMethod({method!r}): a queued request may wait for or act on "
            f"the page only ({', '.join(sorted(PAGE_METHODS))})")
    return method


def _decode(obj: Any) -> Any:
    if isinstance(obj, dict):
        if len(obj) == 1 and _BYTES in obj:
            return base64.b64decode(obj[_BYTES])
        if len(obj) == 1 and _PAGE_METHOD in obj:
            return _page_method(obj[_PAGE_METHOD])
        if len(obj) == 1 and _ITEM in obj:
            return _item(obj[_ITEM])
        if len(obj) == 1 and isinstance(tagged := next(iter(obj.values())), list):
            if _TUPLE in obj:
                return tuple(_decode(v) for v in tagged)
            if _SET in obj or _FROZENSET in obj:
                members = [_decode(v) for v in tagged]
                try:
                    return set(members) if _SET in obj else frozenset(members)
                except TypeError:  # written by someone else: a list is not a member
                    raise SerializationError("malformed set in a queued entry") from None
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def _page_method(spec: Any) -> Any:
    """A scrapy-playwright ``PageMethod`` back from ``[name, args, kwargs]``, checked as on
    the way in (an entry written to Redis by someone else gets no more)."""
    from scrapy_playwright.page import PageMethod

    if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[1], list)
            and isinstance(spec[2], dict)):
        raise SerializationError(f"malformed PageMethod: {spec!r}"[:300])
    return PageMethod(_page_method_name(spec[0]), *_decode(spec[1]), **_decode(spec[2]))


def _item(spec: Any) -> Any:
    """An item back from ``[module:qualname, fields]``. Only a class this worker already
    loaded (nothing is imported on a queued entry's word) that is a ``scrapy.Item`` or an
    item class of the project's own code (see :func:`_project_item`)."""
    if not (isinstance(spec, list) and len(spec) == 2 and isinstance(spec[0], str)
            and isinstance(spec[1], dict)):
        raise SerializationError(f"malformed item: {spec!r}"[:300])
    module, _, qualname = spec[0].partition(":")
    cls: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if cls is None or not part or part.startswith("_"):
            raise SerializationError(f"item class {spec[0]!r} is not loaded in this worker")
        cls = getattr(cls, part, None)
    if not (isinstance(cls, type) and ItemAdapter.is_item_class(cls) and _project_item(cls)):
        raise SerializationError(f"{spec[0]!r} is not an item class of this project")
    try:
        return cls(**_decode(spec[1]))
    except Exception as exc:  # a field it does not have, a validator refusing a value
        raise SerializationError(f"cannot rebuild {spec[0]}: {exc}"[:300]) from None


def _project_item(cls: type) -> bool:
    """A ``scrapy.Item``, a class of the project's package (the one holding its settings
    module, installed or not), or one whose file is not in the standard library or the
    installed packages (a project run from its directory, or from scrapyd's egg)."""
    if issubclass(cls, Item):
        return True
    project = os.environ.get(ENVVAR, "").partition(".")[0]
    if project and cls.__module__.partition(".")[0] == project:
        return True
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    return path is not None and not any(
        os.path.abspath(path).startswith(os.path.join(root, "")) for root in _LIBRARY_ROOTS)


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
    """Serialise a ``Request.to_dict()`` result to JSON, without secrets. A request class
    :func:`loads` would refuse is refused here, when the spider yields it, not
    dead-lettered when a worker takes it."""
    cls = request_dict.get("_class")
    if cls is not None and cls not in ALLOWED_REQUEST_CLASSES:
        raise SerializationError(
            f"its class {cls} is not one a worker rebuilds from the frontier (Request, "
            "FormRequest, JsonRequest, XmlRpcRequest); yield one of those and carry the "
            "extra values in meta or cb_kwargs")
    return json.dumps(_encode(scrub(request_dict)), separators=(",", ":"), sort_keys=True)


def dumps_value(value: Any) -> str:
    """One value (a request's ``cb_kwargs``, kept with its page for re-parse) as JSON, in
    the forms :func:`dumps` allows (bytes, items, page methods); SerializationError else."""
    return json.dumps(_encode(value), separators=(",", ":"), sort_keys=True)


def loads_value(data: str) -> Any:
    """What :func:`dumps_value` wrote (an item only of a class already loaded)."""
    try:
        return _decode(json.loads(data))
    except (ValueError, TypeError) as exc:
        raise SerializationError(f"not a stored value: {exc}") from None


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
