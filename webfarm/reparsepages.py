"""The reading half of ``scrapy reparse``: which stored pages, their bodies, their responses.

:func:`page_query` picks a spider's stored pages (since a date, matching a URL regex, in
one ``--shard``); :class:`PageReader` walks them in content-hash order and reads their
bodies ahead from the blob store, outages waited out; :func:`rebuild_response` gives a
callback the response it saw at crawl time. What is done with a page (the callback, the
project's pipelines, the item store) is :mod:`webfarm.reparse`'s.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pymongo.errors import ConnectionFailure, CursorNotFound
from scrapy import Request
from scrapy.http import Headers, Response, TextResponse
from scrapy.responsetypes import responsetypes

from webfarm import batching, serialize
from webfarm.batching import TRANSIENT
from webfarm.blobstore import Blob, BlobStore
from webfarm.index import IndexStore
from webfarm.items import USER_META
from webfarm.urls import canonical_url

logger = logging.getLogger(__name__)

PROJECTION = ("url", "final_url", "redirect_urls", "status", "headers", "content_type",
              "encoding", "content_hash", "blob_key", "fetched_at", "callback", "cb_kwargs",
              "meta", "spider")


def shard_range(shard: tuple[int, int]) -> dict[str, str]:
    """The content hashes of shard ``k`` of ``n`` (0 <= k < n): a slice of the hex space,
    cut on the first 8 digits, so ``n`` re-parse processes share the pages without
    talking to each other, each on its own range of the content-hash index."""
    k, n = shard
    if not 0 <= k < n:
        raise ValueError(f"shard {k}/{n}: use K/N with 0 <= K < N")
    bounds = {"$gte": f"{k * 2**32 // n:08x}"}
    if k + 1 < n:
        bounds["$lt"] = f"{(k + 1) * 2**32 // n:08x}"
    return bounds


def page_query(spider: str, since: dt.datetime | None = None,
               url_pattern: str | None = None, shard: tuple[int, int] | None = None
               ) -> dict[str, Any]:
    """The ``pages`` filter: the stored pages with a blob (in one shard) this spider
    stored, also those another spider stored since (``spiders``; ``spider`` alone on pages
    stored before 2026-12-07)."""
    query: dict[str, Any] = {"$or": [{"spiders": spider}, {"spider": spider}],
                             "blob_key": {"$type": "string"},
                             "content_hash": {"$type": "string",
                                              **(shard_range(shard) if shard else {})}}
    if since is not None:
        query["fetched_at"] = {"$gte": since}
    if url_pattern:
        re.compile(url_pattern)  # a bad pattern fails here, with re's message
        query["url"] = {"$regex": url_pattern}
    return query


def stored_meta(doc: dict[str, Any]) -> dict[str, Any]:
    """The meta the spider set on a stored page's request (``pages.meta``), or none."""
    if not doc.get("meta"):
        return {}
    try:
        meta = serialize.loads_value(doc["meta"])
    except (serialize.SerializationError, ValueError):
        return {}
    return {**meta, USER_META: list(meta)} if isinstance(meta, dict) else {}


def rebuild_response(doc: dict[str, Any], body: bytes | Blob, request: Request | None = None,
                     flags: list[str] | None = None) -> Response:
    """The response a spider callback saw at crawl time, from a ``pages`` document (for
    ``request``, else a GET of the stored URL).

    The body's content type and encoding are those written with the blob, when it has
    them: a page that shares its content hash with another (``duplicate_of``, or a
    refetch whose text did not change) has that page's bytes, which may be in another
    encoding than its own fetch was (the same text in UTF-8 and in windows-1251)."""
    own: dict[str, str] = {}
    if isinstance(body, Blob):
        body, own = body
    headers = Headers(doc.get("headers") or {})
    content_type = own.get("content-type") or doc.get("content_type")
    if content_type:
        headers[b"Content-Type"] = content_type
    headers.pop(b"Content-Encoding", None)  # the stored body is the decoded one
    headers.pop(b"Content-Length", None)
    url = doc.get("final_url") or doc["url"]
    cls = responsetypes.from_args(headers=headers, url=url, body=body)
    kwargs: dict[str, Any] = {}
    encoding = own.get("encoding") or doc.get("encoding")
    if issubclass(cls, TextResponse) and encoding:
        kwargs["encoding"] = encoding
    if request is not None:  # a command's (parse --stored): the spider's meta beside its own
        for key, value in stored_meta(doc).items():
            request.meta.setdefault(key, value)
    if request is None:  # the request the response came to: the last of its redirects
        hops = doc.get("redirect_urls")
        if "redirect_urls" not in doc and canonical_url(url) != doc["url"]:
            hops = [doc["url"]]  # stored before redirect_urls were: its first URL at least
        request = Request(url, meta={**stored_meta(doc), **({"redirect_urls": hops}
                                                              if hops else {})})
    return cls(url=url, status=int(doc.get("status") or 200), headers=headers, body=body,
               request=request, flags=flags or ["reparse"], **kwargs)


HUNG_AFTER = 10.0  # s a blob read may go unanswered before it counts as failing


class PageReader:
    """Stored pages and their bodies, for one run. ``index_outage`` is told of each
    failure and success of the page cursor; ``retry_read`` runs a blob read again until
    it succeeds (re-parse's outage wait), or raises past its limit."""

    def __init__(self, index: IndexStore, blobs: BlobStore, index_outage: batching.Outage,
                 retry_read: Callable[[Callable[[], Blob]], Blob], page_batch: int = 500,
                 blob_reads: int = 8, hint: list[tuple[str, int]] | None = None,
                 hung_after: float = HUNG_AFTER) -> None:
        self.index = index
        self.blobs = blobs
        self.index_outage = index_outage
        self.retry_read = retry_read
        # A read with no answer this long fails, for the outage wait: an endpoint that
        # stopped answering held the run, unsaid, for the client's read timeout a try.
        self.hung_after = hung_after
        self._pool: ThreadPoolExecutor | None = None
        self.page_batch = page_batch
        self.blob_reads = max(1, blob_reads)  # at once, WEBFARM_BLOB_CONCURRENCY
        self.hint = hint  # the content_hash index, when it could be made sure of
        self._reread: tuple[str, Blob] | None = None  # the last body read again, by key

    def pages(self, query: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The ``pages`` documents in content-hash order, on its index: the pages that share
        a body come together, so it is read once (mirrors, URL variants), and a cursor lost
        to an outage is opened again at the last hash read, skipping the pages of that hash
        already done: no page is skipped or read twice."""
        last: str | None = None
        done: set[Any] = set()  # _ids of the pages read with hash ``last``
        while True:
            where = query if last is None else {
                **query, "content_hash": {**query["content_hash"], "$gte": last}}
            try:
                with self.index.pages.find(where, dict.fromkeys(PROJECTION, 1),
                                           sort=[("content_hash", 1)],
                                           hint=self.hint,
                                           batch_size=self.page_batch) as cursor:
                    for doc in cursor:
                        self.index_outage.ended()
                        if doc["content_hash"] != last:
                            last, done = doc["content_hash"], set()
                        elif doc["_id"] in done:
                            continue
                        done.add(doc["_id"])
                        yield doc
                return
            except ConnectionFailure as exc:  # only the cursor's: a yield raises nothing
                self.index_outage.failed(exc)
            except CursorNotFound:  # the server dropped it, idle for 10 min (a long outage)
                logger.info("reparse: the page cursor timed out on the server; reopened")

    def read_ahead(self, docs: Iterator[dict[str, Any]], pool: ThreadPoolExecutor
                   ) -> Iterator[tuple[dict[str, Any], Future[Blob]]]:
        """Each page with the read of its body, started up to ``2 * blob_reads`` pages
        ahead, ``blob_reads`` at once: an S3 read is a round trip, and one at a time a
        20 ms endpoint gave 75 pages/s (bench/bench_reparse.py). The pages that share a
        body come together (content-hash order) and share one read; the window bounds
        the bodies held in memory."""
        self._pool = pool
        window: deque[tuple[dict[str, Any], Future[Blob]]] = deque()
        key: str | None = None
        read: Future[Blob] | None = None
        for doc in docs:
            if read is None or doc["blob_key"] != key:
                key = doc["blob_key"]
                read = pool.submit(self.blobs.read, key)
            window.append((doc, read))
            if len(window) > 2 * self.blob_reads:
                yield window.popleft()
        yield from window

    def body(self, key: str, read: Future[Blob]) -> Blob:
        """The body a read ahead got. One that failed for now (an outage, a blip) is read
        again here, where an outage is waited out; a missing or damaged blob raises."""
        if self._reread is not None and self._reread[0] == key:
            return self._reread[1]
        try:
            return self._answer(read, key)
        except TRANSIENT:
            pending = [read]

            def again() -> Blob:  # the read still out, else a new one
                if pending[0].done() and pending[0].exception() is not None:
                    assert self._pool is not None  # reads come from read_ahead
                    pending[0] = self._pool.submit(self.blobs.read, key)
                return self._answer(pending[0], key)

            body = self.retry_read(again)
            self._reread = (key, body)
            return body

    def _answer(self, read: Future[Blob], key: str) -> Blob:
        try:
            return read.result(timeout=self.hung_after)
        except TimeoutError:
            if read.done():
                raise  # the read's own
            raise TimeoutError(f"no answer in {self.hung_after:g}s reading {key}") from None
