"""Between Scrapy requests and frontier entries, and how a frontier is opened from settings.

Commands (``scrapy seed``, ``scrapy frontier``, ``scrapy dlq``) and the
scheduler all open a spider's frontier through :func:`open_frontier`, so they
agree on keys, delays and the dupefilter mode.
"""

from __future__ import annotations

import functools
import inspect
import json
from typing import Any
from urllib.parse import urlsplit
from weakref import WeakKeyDictionary

import redis
from scrapy import Request, Spider
from scrapy.http.request import _find_method
from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings
from scrapy.utils.misc import load_object
from scrapy.utils.request import request_from_dict

from webfarm import serialize
from webfarm.frontier import Entry, Frontier
from webfarm.hostmemory import RecentHosts, host_memory_size
from webfarm.redisconn import redis_client
from webfarm.urls import bare_host, host_of, unfetchable

DUPEFILTER_MODES = {"bloom", "set"}
#: meta key: the frontier's lease of a request it handed out (it alone acknowledges,
#: retries or dead-letters the request); absent on a request the frontier does not hold
LEASE = "webfarm_lease"
ATTEMPTS = "webfarm_attempts"  # meta key: the tries the frontier has counted before this one
#: meta key: when (time.monotonic()) the frontier handed the request out to this worker
HANDED_OUT = "webfarm_handed_out"
#: meta key: when (time.time()) the request left for its server, the page's fetched_at: a
#: worker stalled past its lease wrote its older fetch over another worker's newer one
#: when fetched_at was the time its callback ran, after the stall
SENT_AT = "webfarm_sent_at"
#: meta key: the request's lease expired while this worker stalled, and the frontier
#: handed it out again: another worker fetches it, this one drops it before it leaves
LEASE_LOST = "webfarm_lease_lost"
#: meta key: fetched by the worker that made the request, never queued in Redis (a login
#: form's POST: its password stays on that worker, whose own cookie jar gets the session)
LOCAL = "webfarm_local"


def dupefilter_mode(settings: BaseSettings) -> str:
    """``bloom`` or ``set``, from ``DUPEFILTER_CLASS`` (the familiar switch)."""
    path = settings.get("DUPEFILTER_CLASS") or "webfarm.dupefilter.BloomDupeFilter"
    mode = getattr(load_object(path), "mode", None)
    if mode not in DUPEFILTER_MODES:
        raise ValueError(
            f"DUPEFILTER_CLASS={path!r} cannot run inside the frontier; use "
            "webfarm.dupefilter.BloomDupeFilter (large crawls) or "
            "webfarm.dupefilter.SetDupeFilter (exact, small crawls)"
        )
    return mode


def host_delay(settings: BaseSettings) -> float:
    """Seconds between two requests to one host, across every worker: ``WEBFARM_HOST_DELAY``,
    or Scrapy's ``DOWNLOAD_DELAY`` when it is longer (a spider's ``custom_settings``, or its
    deprecated ``download_delay`` attribute, which Scrapy maps onto it). Scrapy waits that per
    worker; honoured only there, ten workers would hit a site ten times as often as the
    spider's author asked."""
    return max(settings.getfloat("WEBFARM_HOST_DELAY", 1.0), settings.getfloat("DOWNLOAD_DELAY"))


class SlotDelays:
    """The ``delay`` of each ``DOWNLOAD_SLOTS`` entry, as a floor of that host's delay in
    the frontier, for every worker. Why: as with ``DOWNLOAD_DELAY`` (:func:`host_delay`),
    Scrapy waits a slot's delay per worker only, so ten workers hit that site ten times as
    often as its entry asks. A slot is named by the bare host name (Scrapy's slot key);
    the frontier's hosts keep a non-default port, so each host is looked up once, when
    this worker first sees it."""

    def __init__(self, settings: BaseSettings) -> None:
        self.delays: dict[str, float] = {
            str(name).lower(): float(slot["delay"])
            for name, slot in settings.getdict("DOWNLOAD_SLOTS").items()
            if isinstance(slot, dict) and slot.get("delay")}
        # Hosts looked up, the last WEBFARM_HOST_MEMORY of them (a broad crawl's hosts are
        # many; a slot's host looked up again sends the scheduler the delay it holds).
        self._seen: RecentHosts[None] = RecentHosts(host_memory_size(settings))

    def first_seen(self, host: str) -> float | None:
        """The slot delay of frontier host ``host`` (``host[:port]``) the first time it is
        asked about; None after that, or when no slot names it."""
        if host in self._seen:
            return None
        self._seen.add(host)
        return self.delays.get(bare_host(host))


def allowed_attempts(settings: BaseSettings) -> int:
    """Tries a request gets before the dead-letter queue: ``WEBFARM_RETRY_TIMES``, or one
    more than Scrapy's ``RETRY_TIMES`` (retries after the first try) when a spider's
    ``custom_settings``, ``-s`` or the project set that one, at a priority no lower than
    ``WEBFARM_RETRY_TIMES``'s. Why: a Scrapy project's ``RETRY_TIMES`` was ignored."""
    scrapys = settings.getpriority("RETRY_TIMES") or 0
    if scrapys > SETTINGS_PRIORITIES["default"] and \
            scrapys >= (settings.getpriority("WEBFARM_RETRY_TIMES") or 0):
        return max(1, settings.getint("RETRY_TIMES") + 1)
    return max(1, settings.getint("WEBFARM_RETRY_TIMES", 5))


def request_attempts(request: Request, default: int) -> int:
    """Tries for this request: one more than its ``max_retry_times`` meta key (Scrapy's
    per-request retry limit) if it has a whole number there, else ``default``."""
    limit = request.meta.get("max_retry_times")
    if isinstance(limit, bool) or not isinstance(limit, (int, str)):
        return default
    try:
        return max(1, int(limit) + 1)
    except ValueError:
        return default


def open_frontier(
    settings: BaseSettings, spider_name: str, server: redis.Redis | None = None
) -> Frontier:
    """The frontier of ``spider_name`` as every worker of the deployment sees it.

    ``SCHEDULER_QUEUE_CLASS`` names the frontier class (a :class:`Frontier` subclass).
    """
    cls = load_object(settings.get("SCHEDULER_QUEUE_CLASS") or Frontier)
    if not (isinstance(cls, type) and issubclass(cls, Frontier)):
        raise ValueError(
            f"SCHEDULER_QUEUE_CLASS={settings.get('SCHEDULER_QUEUE_CLASS')!r} is not a "
            "webfarm.frontier.Frontier; the webfarm scheduler needs one"
        )
    return cls(
        server if server is not None else redis_client(settings),
        spider_name,
        lease_seconds=settings.getfloat("WEBFARM_LEASE_SECONDS", 600.0),
        default_delay=host_delay(settings),
        dupefilter=dupefilter_mode(settings),
        bloom_capacity=settings.getint("WEBFARM_BLOOM_CAPACITY", 1_000_000),
        bloom_error_rate=settings.getfloat("WEBFARM_BLOOM_ERROR_RATE", 0.001),
        host_budget=settings.getint("WEBFARM_HOST_BUDGET", 0),
    )


_METHOD_NAMES: WeakKeyDictionary[Any, dict[Any, str]] = WeakKeyDictionary()


def _method_name(spider: Spider | None, func: Any) -> Any:
    """``Request.to_dict``'s callback/errback name, remembered per spider and function:
    Scrapy finds it with an ``inspect.getmembers`` walk of the spider for every link
    (a tenth of its serialisation time)."""
    if not callable(func):
        return func
    if spider is None or getattr(func, "__self__", None) is not spider:
        return _spider_method(spider, func)  # SerializationError when it has no name there
    names = _METHOD_NAMES.setdefault(spider, {})
    name = names.get(func.__func__)
    if name is None:
        name = names[func.__func__] = _spider_method(spider, func)
    return name


def _spider_method(spider: Spider | None, func: Any) -> str:
    """The name of ``func`` on ``spider``; a lambda, ``functools.partial`` or another
    object's method cannot be named in a frontier entry: SerializationError, with the fix
    (before, Scrapy's ValueError ended the task handling the rest of the callback's output)."""
    try:
        return _find_method(spider, func)
    except ValueError:
        what = getattr(func, "__qualname__", None) or type(func).__name__
        raise serialize.SerializationError(
            f"its callback or errback {what} is not a method of the spider; a queued request "
            "names it, so make it one (pass values with cb_kwargs, not a lambda or "
            "functools.partial)") from None


def request_dict(request: Request, spider: Spider | None) -> dict[str, Any]:
    """``request.to_dict(spider=spider)``, faster for classes that keep Scrapy's to_dict."""
    if type(request).to_dict is not Request.to_dict:
        return request.to_dict(spider=spider)
    d: dict[str, Any] = {
        "url": request.url,
        "callback": _method_name(spider, request.callback),
        "errback": _method_name(spider, request.errback),
        "headers": dict(request.headers),
    }
    for attr in request.attributes:
        d.setdefault(attr, getattr(request, attr))
    if type(request) is not Request:
        d["_class"] = type(request).__module__ + "." + type(request).__name__
    return d


class UnfetchableURL(serialize.SerializationError):
    """A request Scrapy's downloader fails on at every try (:func:`~webfarm.urls.unfetchable`):
    never queued, so that it is not fetched, retried and dead-lettered by each worker."""


def request_entry(request: Request, spider: Spider | None, fingerprinter: Any,
                  fingerprint: bytes | None = None, callback: str | None = None,
                  cb_kwargs: str | None = None, max_bytes: int = 0,
                  errback: str | None = None) -> Entry:
    """A frontier entry for ``request``: politeness host, priority, fingerprint, JSON
    (``fingerprint``: the request's, if the caller computed it already; ``callback``: the
    name of the spider method it goes to, for a caller without the spider: recrawl, and
    ``cb_kwargs`` as a page stored them, ``serialize.dumps_value``). An entry's JSON over
    ``max_bytes`` (0: no limit) is refused: Redis holds every queued entry in memory."""
    _refuse_proxy_credentials(request)
    why = unfetchable(request.url)
    if why is not None:
        raise UnfetchableURL(f"it cannot be fetched: {why}")
    data = request_dict(request, spider)
    if callback:  # checked against the spider by the worker that decodes it
        data["callback"] = callback
        if errback:  # the page's request's errback, with it (recrawl)
            data["errback"] = errback
    if cb_kwargs:  # already in the queue's JSON forms, which encode to themselves
        try:
            data["cb_kwargs"] = json.loads(cb_kwargs)
        except ValueError as exc:
            raise serialize.SerializationError(f"its stored cb_kwargs are not JSON: {exc}"
                                               ) from None
    payload = serialize.dumps(data)
    if max_bytes and len(payload) > max_bytes:
        raise serialize.SerializationError(
            f"its frontier entry is {len(payload):,} bytes of JSON (URL, headers, body, meta, "
            f"cb_kwargs), over WEBFARM_MAX_ENTRY_BYTES={max_bytes:,}: Redis would hold it "
            "in memory until a worker takes it; pass the next callback what it needs (an id, "
            "a few fields), not a page or its body, or raise the setting")
    return Entry(
        host=host_of(request.url),
        priority=int(request.priority),
        fingerprint=fingerprinter.fingerprint(request) if fingerprint is None else fingerprint,
        payload=payload,
        dont_filter=bool(request.dont_filter),
    )


def _refuse_proxy_credentials(request: Request) -> None:
    """A spider's own ``meta["proxy"]`` with a user:password cannot be queued: credentials
    are never written to Redis, so the worker fetching it went without them, got 407 from
    the proxy and dropped the page with one INFO line. A proxy webfarm's proxy middleware
    chose (``webfarm_proxy`` in meta) is picked again at fetch time."""
    proxy = request.meta.get("proxy")
    if not isinstance(proxy, str) or "webfarm_proxy" in request.meta:
        return
    if "@" in urlsplit(proxy if "//" in proxy else f"//{proxy}").netloc:  # scheme optional
        raise serialize.SerializationError(
            "its meta['proxy'] holds a user:password, which is never written to Redis, so "
            "the worker fetching it would go without them (407); list the proxy in "
            "WEBFARM_PROXIES instead (its credentials stay in the workers' settings) and "
            "leave meta['proxy'] unset")


def decode_request(payload: str | bytes, spider: Spider | None) -> Request:
    """A request back from a frontier payload; raises ``SerializationError`` (or the
    errors of ``request_from_dict``) for anything that is not one of ours."""
    data = serialize.loads(payload)
    try:
        request = request_from_dict(data, spider=spider)
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise serialize.SerializationError(f"not a request of this spider: {exc}") from None
    if spider is not None:
        for what in ("callback", "errback"):
            func = getattr(request, what)
            if func is not None and not _is_callback(spider, func, data[what]):
                raise serialize.SerializationError(
                    f"{what} {data[what]!r} is not a callback of spider {spider.name!r}")
        if request.callback is not None and (why := _misfit(request.callback,
                                                            request.cb_kwargs)):
            # else fetched for nothing: the callback fails with a TypeError on the response
            raise serialize.SerializationError(
                f"callback {data['callback']!r} does not take the request's cb_kwargs "
                f"{sorted(request.cb_kwargs)} ({why}): it changed since the request was "
                "queued, or a recrawl had no cb_kwargs kept for the page; give its "
                f"arguments defaults, then `scrapy dlq {spider.name} --requeue`")
    return request


#: What Scrapy's Spider defines that is no callback (``_set_crawler``, ``start``, ...): an
#: entry naming one is refused. Private callbacks are allowed, because Scrapy's own spiders
#: have them: CrawlSpider's ``_callback``/``_errback``, SitemapSpider's ``_parse_sitemap``.
_SPIDER_INTERNALS = frozenset(n for n in dir(Spider) if not n.startswith("__")) - {
    "parse", "_parse"}


def _is_callback(spider: Spider, func: Any, name: str) -> bool:
    """``func`` is a method of this spider instance, and not one of Scrapy's own machinery."""
    return (getattr(func, "__self__", None) is spider and name not in _SPIDER_INTERNALS
            and getattr(func, "__name__", name) not in _SPIDER_INTERNALS)


def callback_for(spider: Spider, name: str, kwargs: dict[str, Any]
                 ) -> tuple[Any, str | None]:
    """The spider's callback ``name`` to run on a stored page with ``kwargs`` (its request's
    stored ``cb_kwargs``; re-parse), or None and why not: no such callback, or arguments
    that do not fit it (a page stored before cb_kwargs were kept, or a changed callback)."""
    method = getattr(spider, name, None)
    if method is None or not _is_callback(spider, method, name):
        return None, "is no callback of the spider (renamed or removed?)"
    why = _misfit(method, kwargs)
    if why:
        return None, (f"does not take the stored cb_kwargs {sorted(kwargs)} ({why}); give "
                      "its arguments defaults to re-parse these pages")
    return method, None


def _misfit(method: Any, kwargs: dict[str, Any]) -> str | None:
    """Why ``method(response, **kwargs)`` would fail on its arguments, or None."""
    return _misfit_names(method, tuple(sorted(kwargs)))


@functools.lru_cache(maxsize=1024)  # the worker checks every request it takes
def _misfit_names(method: Any, names: tuple[str, ...]) -> str | None:
    try:  # a decorator's own signature, not its function's: it may supply arguments itself
        signature = inspect.signature(method, follow_wrapped=False)
    except (TypeError, ValueError):  # no signature to read: try it
        return None
    try:
        signature.bind(None, **dict.fromkeys(names))
    except TypeError as exc:
        return str(exc)
    return None
