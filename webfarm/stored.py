"""Pages as a crawl stored them, served to Scrapy's developer commands instead of the web.

``scrapy fetch|view|parse|shell --stored URL`` answer every request from the index
and the blob store (:class:`StoredPageHandler`, the download handler for http and
https under :data:`STORED_SETTINGS`): the body a crawl kept, with the status, headers
and encoding the spider saw (:func:`webfarm.reparsepages.rebuild_response`). So an
extractor is tried on the page as it was when an item came out wrong, after the site
changed, and without a request to it: no connection is ever opened. A request for a
page that is not stored fails alone, with one line, and is not retried.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy import Request
from scrapy.core.downloader.handlers.base import BaseDownloadHandler
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.settings import BaseSettings
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.threads import deferToThread

from webfarm import config
from webfarm.blobstore import BlobDamaged, BlobMissing, BlobStore, open_blob_store
from webfarm.index import IndexStore
from webfarm.reparsepages import PROJECTION, rebuild_response
from webfarm.urls import url_fingerprint

logger = logging.getLogger(__name__)

#: What ``--stored`` sets, over ``-s`` too: the handler below for the web, and nothing
#: that would reach a site or a shared service anyway (robots.txt, proxies and their
#: shared health, the fetch API), nor wait between pages.
STORED_SETTINGS: dict[str, Any] = {
    "DOWNLOAD_HANDLERS": {"http": "webfarm.stored.StoredPageHandler",
                          "https": "webfarm.stored.StoredPageHandler"},
    "ROBOTSTXT_OBEY": False,
    "WEBFARM_PROXIES": "",
    "WEBFARM_FETCH_API_URL": "",
    "WEBFARM_FETCH_API_HOSTS": "",
    "WEBFARM_HOST_DELAY": 0.0,
    "DOWNLOAD_DELAY": 0.0,
    "RETRY_ENABLED": False,
}
#: Left out as well: the SSRF guard (no address is connected to, so none is resolved and
#: checked) and the render ladder (the stored body is the page as the crawl kept it,
#: rendered or not, and nothing learnt from it may join the fleet's host memory).
OFF_MIDDLEWARES = ("middlewares.ssrf.SSRFGuardMiddleware", "middlewares.render.RenderMiddleware")


def use_stored_pages(settings: BaseSettings) -> None:
    """Set ``settings`` (a command's, before its crawler) to answer from stored pages.

    ``parse --stored --pipelines`` stores items as ``scrapy reparse`` does: through the
    project's pipelines and the item store, while the page storage pipelines (hash, blob,
    index) are off. Before, the stored page was recorded as fetched again: its
    ``fetch_count`` went up, and ``fetched_at`` and ``next_fetch_at`` moved, with no
    request made."""
    for name, value in STORED_SETTINGS.items():
        settings.set(name, value, priority="cmdline")
    base = settings.getdict("DOWNLOADER_MIDDLEWARES_BASE")
    settings.set("DOWNLOADER_MIDDLEWARES_BASE",
                 {**base, **dict.fromkeys(OFF_MIDDLEWARES)}, priority="cmdline")
    pipelines = settings.getdict("ITEM_PIPELINES_BASE")
    settings.set("ITEM_PIPELINES_BASE",
                 {path: None if _stores_pages(path) else order
                  for path, order in pipelines.items()}, priority="cmdline")


def _stores_pages(path: Any) -> bool:
    """Is the pipeline at ``path`` one of webfarm's page storage pipelines (a
    ``webfarm_stage`` other than the item store's)?"""
    from scrapy.utils.misc import load_object

    from webfarm.reparsepipes import ITEM_STORE_STAGE

    stage = getattr(load_object(path), "webfarm_stage", None)
    return stage is not None and stage != ITEM_STORE_STAGE


class NotStored(IgnoreRequest):
    """No stored page answers this request (never fetched, not kept, its blob gone)."""


class StoredPages:
    """Reads one page at a time: its ``pages`` document by URL, and its body."""

    def __init__(self, settings: BaseSettings) -> None:
        self.mongo = config.mongo_uri(settings)
        self.index = IndexStore(self.mongo, config.mongo_database(settings))
        self.blobs: BlobStore = open_blob_store(
            config.blob_uri(settings), endpoint_url=settings.get("AWS_ENDPOINT_URL") or None,
            max_attempts=settings.getint("WEBFARM_S3_MAX_ATTEMPTS", 5))

    def where(self) -> str:
        return f"{config.safe_url(self.mongo)}, database {self.index.db.name!r}"

    def find(self, url: str) -> dict[str, Any]:
        """The page stored for ``url`` (as requested, or as a redirect ended there)."""
        fields = dict.fromkeys((*PROJECTION, "spider"), 1)
        doc = self.index.pages.find_one({"_id": url_fingerprint(url)}, fields) \
            or self.index.pages.find_one({"final_url": url}, fields)
        if doc is None:
            raise NotStored(f"no stored page for {url} in {self.where()}: a crawl has not "
                            "fetched it, or fetched it with a spider that keeps no pages (one "
                            "not built on WebfarmSpider stores its items only), or "
                            "MONGO_URI/MONGO_DATABASE point elsewhere; run the command "
                            "without --stored to fetch it live")
        if not doc.get("blob_key"):
            raise NotStored(f"{url} is in the index but its body was never stored "
                            f"(status {doc.get('status')}); fetch it live, without --stored")
        return doc

    def response(self, url: str, request: Request | None = None) -> Response:
        return self.rebuilt(self.find(url), url, request)

    def rebuilt(self, doc: dict[str, Any], url: str, request: Request | None = None
                ) -> Response:
        """The response of a page :meth:`find` gave, its body read from the blob store."""
        try:
            body = self.blobs.read(doc["blob_key"])
        except (BlobMissing, BlobDamaged) as exc:
            raise NotStored(f"the stored body of {url} cannot be read ({exc}); fetch it "
                            "live, without --stored") from None
        return rebuild_response(doc, body, request=request, flags=["stored"])

    def close(self) -> None:
        self.index.close()


class StoredPageHandler(BaseDownloadHandler):
    """Download handler that answers from :class:`StoredPages`, in a thread (pymongo and
    boto3 block), and never from the network."""

    lazy = False

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self.pages = StoredPages(crawler.settings)

    async def download_request(self, request: Request) -> Response:
        try:
            response = await maybe_deferred_to_future(
                deferToThread(self.pages.response, request.url, request))
        except NotStored as exc:
            logger.error("%s", exc)
            self._inc("webfarm/stored/missing")
            raise
        self._inc("webfarm/stored/served")
        return response

    def _inc(self, key: str) -> None:
        if self.crawler.stats is not None:
            self.crawler.stats.inc_value(key)

    async def close(self) -> None:
        self.pages.close()
