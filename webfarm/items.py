"""Items every spider yields, and how an extracted item remembers its page.

A :class:`PageItem` carries one fetched response through the storage
pipelines (hash, blob, index), kept apart from whatever a spider extracts so
raw pages can be re-parsed later. Structured items (dicts, dataclasses,
``scrapy.Item``) stay plain: the page they came from travels beside them
(:func:`attach_source` / :func:`source_of`), because a ``scrapy.Item`` cannot
take undeclared fields and an item pipeline receives only the item.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import OrderedDict
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

_PROCESS = os.urandom(8).hex()
_COUNTER = itertools.count()


#: meta key: the names of the meta keys a spider set on a request as it yielded it
#: (:func:`mark_user_meta`); those are kept with its page (:func:`user_meta_json`).
USER_META = "webfarm_user_meta"
#: The most of a request's ``meta`` or ``cb_kwargs`` (as JSON, characters) kept with its
#: page. A page document must stay far below MongoDB's 16 MiB: one over it was refused,
#: and its write retried as a storage outage until the request was dead-lettered.
KEPT_JSON = 256 * 1024


def mark_user_meta(request: Any) -> None:
    """Note which meta keys the spider set on ``request`` (not webfarm's ``webfarm_*`` or
    private ``_*`` ones, nor ``proxy`` and the browser's, which may hold credentials),
    before other components add theirs."""
    if USER_META in request.meta:
        return
    names = [k for k in request.meta if isinstance(k, str) and not k.startswith(
        ("webfarm_", "_", "playwright")) and k not in ("download_slot", "proxy")]
    if names:
        request.meta[USER_META] = names


def user_meta_json(response: Any) -> str | None:
    """The spider's own meta of ``response``'s request as JSON (``serialize.dumps_value``),
    None when it set none, or when it is over :data:`KEPT_JSON` or does not serialise."""
    from webfarm import serialize

    meta = getattr(response, "meta", None) or {}
    names = meta.get(USER_META) or ()
    values = {k: meta[k] for k in names if k in meta}
    if not values:
        return None
    try:
        kept = serialize.dumps_value(values)
    except serialize.SerializationError:
        return None
    return kept if len(kept) <= KEPT_JSON else None


def _fetch_id() -> str:
    """Unique per fetch across workers: a random per-process prefix and a counter (cheaper
    than a uuid4 per page; reset after fork is not an issue, workers do not fork)."""
    return f"{_PROCESS}{next(_COUNTER):x}"


@dataclass
class PageItem:
    """One fetched page: what the index and the blob store keep of a response."""

    url: str  # the URL as requested (canonicalised for the page's id)
    final_url: str  # after redirects
    host: str
    spider: str
    status: int
    body: bytes = field(repr=False)
    content_type: str = ""
    encoding: str | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    fetched_at: float = 0.0
    fetch_method: str = "http"  # http | browser | api
    # HTTP validators for conditional refetches (None when the response had none).
    etag: str | None = None
    last_modified: str | None = None
    # A 304 answer to a conditional request: no body to hash or store, the page is unchanged.
    not_modified: bool = False
    # A stored page that a refetch found gone (404 or 410): its last content stays stored
    # and indexed; the index notes since when it is gone (``gone_at``).
    gone: bool = False
    # The spider method the page went to when not WebfarmSpider's own parse (a spider's
    # parse of its own, a parse_detail): re-parse runs that one on it.
    callback: str | None = None
    # Its request's cb_kwargs, as JSON (webfarm.serialize.dumps_value), for that callback.
    cb_kwargs: str | None = field(default=None, repr=False)
    # Its request's errback, a method of the spider: a recrawl's refetch goes with it too.
    errback: str | None = None
    # The meta keys the spider set on its request (USER_META), as JSON: re-parse and
    # recrawl give them back (a callback reading response.meta["listing"] got None).
    meta: str | None = field(default=None, repr=False)
    # The URLs redirected from, first to last (Scrapy's ``redirect_urls`` meta); None when
    # there was no redirect. Re-parse gives them back to the callback's request.
    redirect_urls: list[str] | None = None
    # One id per fetch, so a retried index write is recognised and applied once.
    fetch_id: str = field(default_factory=_fetch_id, repr=False)
    # Filled by the pipelines.
    content_hash: str | None = None
    blob_key: str | None = None
    simhash: int | None = None
    # Set by the index pipeline: the page id this content was first seen at, "" if this page
    # is the first (read by monitoring to count duplicates per host exactly).
    duplicate_of: str | None = None
    # Set while a pipeline computes the hash, so others await it instead of hashing again.
    hashing: asyncio.Future | None = field(default=None, repr=False, compare=False)

    @property
    def keeps_stored_content(self) -> bool:
        """A refetch's 304 or 404/410: no body to hash or store; the stored content stays."""
        return self.not_modified or self.gone


@dataclass(frozen=True)
class ItemSource:
    """Where a structured item came from: its page's URL and content hash."""

    url: str
    page: PageItem | None = None  # the page being stored now (its hash may be pending)
    content_hash: str | None = None  # known up front when re-parsing stored pages


_SOURCES: OrderedDict[int, tuple[Any, ItemSource]] = OrderedDict()
_MAX_SOURCES = 100_000  # items dropped before the item store never pop theirs
_CHAIN_SOURCE: ContextVar[ItemSource | None] = ContextVar("webfarm_item_source", default=None)


def attach_source(item: Any, source: ItemSource) -> Any:
    """Remember which page ``item`` was extracted from, until the item store asks."""
    _SOURCES[id(item)] = (item, source)
    while len(_SOURCES) > _MAX_SOURCES:
        _SOURCES.popitem(last=False)
    return item


def _known(item: Any) -> ItemSource | None:
    """``item``'s page if :func:`attach_source` noted it (an id reused by another object
    does not count), without forgetting it."""
    entry = _SOURCES.get(id(item))
    return entry[1] if entry is not None and entry[0] is item else None


def has_source(item: Any) -> bool:
    """Whether ``item``'s page is known (:func:`attach_source`)."""
    return _known(item) is not None


def enter_chain(item: Any) -> None:
    """At the head of the item pipelines (``pipelines.chain``): remember ``item``'s page
    for this chain, for an item a pipeline makes anew (:func:`source_of` ``in_chain``)."""
    _CHAIN_SOURCE.set(_known(item))


def source_of(item: Any, in_chain: bool = False) -> ItemSource | None:
    """The page of ``item`` (and forget it); None for items not yielded by a WebfarmSpider.
    ``in_chain``: an item a pipeline made anew gets the page of the item its chain began
    with (:func:`enter_chain`)."""
    entry = _SOURCES.pop(id(item), None)
    chained = _CHAIN_SOURCE.get() if in_chain else None
    if in_chain:
        _CHAIN_SOURCE.set(None)
    if entry is None or entry[0] is not item:
        return chained
    return entry[1]
