"""The fetch ladder: plain HTTP first, a browser when a page needs it, a fetch API last.

Each request gets a render mode, the most specific one that is set:
``meta["render"]``, then ``WEBFARM_RENDER_HOSTS`` / ``WEBFARM_FETCH_API_HOSTS``
for its host, then the spider's ``render`` attribute (``-a render=``), then
``WEBFARM_RENDER`` (default ``auto``). The mode picks the rung:

* ``http`` / ``browser`` / ``api``: that rung, always.
* ``auto``: plain HTTP, and the response is judged (:func:`webfarm.render.needs_js`,
  or the spider's ``render_check``). A page that needs JavaScript goes back
  to the frontier as the same URL for the browser (``meta["playwright"]``,
  ``dont_filter``), so the frontier's politeness, leases and retries apply to
  it as to any request; the HTTP fetch's lease is acknowledged as done. Each
  judgement also feeds the host's shared memory in Redis
  (:class:`webfarm.rendermemory.HostMemory`): once a host's pages mostly need
  JavaScript, its later pages go straight to the browser, except one in
  ``1/WEBFARM_RENDER_PROBE_RATE`` that is probed over HTTP again, so a host
  that stops needing the browser is noticed and flips back. A host where the
  browser failed and the fetch API delivered goes straight to the API the same
  way.

A browser fetch that fails goes to the fetch API when one is configured
(``WEBFARM_FETCH_API_URL``); otherwise the usual retry policy applies. The API
call itself runs through Scrapy's downloader (:mod:`webfarm.fetchapi`).

Stats under ``webfarm/render/``: ``http``, ``browser``, ``api`` (pages by the
rung that delivered them), ``escalated`` (HTTP pages sent on to the browser),
``probes``, ``wrong_guess`` (a probe found HTTP enough, or a rendered page
still failed the check), ``browser_failed``, ``api_failed``.
Priority 560: after the SSRF guard and robots (request side), before the
proxy middleware (740), which gives browser requests a context per proxy; on
the response side after redirects and decompression, before the retry policy.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy import Request, signals
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response

from middlewares.offsite import LeftTheHosts
from webfarm import browser
from webfarm import signals as wf_signals
from webfarm.exceptions import DeadLetter, RetryLater
from webfarm.fetchapi import FLAG as API_FLAG
from webfarm.fetchapi import META_CALL, FetchAPI, FetchAPIError
from webfarm.hostmemory import RecentHosts, host_memory_size
from webfarm.redisconn import close_client, crawl_redis_client
from webfarm.render import (
    EMPTY_ROOT,
    PLAYWRIGHT_HANDLER,
    RenderCheck,
    RenderConfigError,
    check_contexts,
    check_render_check,
    empty_root_of,
    has_browser_handler,
    host_key,
    judgeable,
    mode_for_host,
    needs_js,
    parse_host_modes,
    parse_mode,
    rendering_helped,
    visible_text_length,
)
from webfarm.rendermemory import CHECK_MISSING, ROOT_MISLEADS, HostMemory
from webfarm.urls import host_of

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

PREFIX = "webfarm/render"
_HTML_TYPES = frozenset({b"text/html", b"application/xhtml+xml"})
BROWSER_FAILURES_TO_API = 3  # renders of a host that failed before its pages go to the API
META_MODE = "render"  # the user's per-request mode
META_RUNG = "webfarm_render_rung"  # the rung chosen for this request: http|browser|api
META_WHY = "webfarm_render_why"  # mode|auto|memory|probe|escalated|spider|browser_failed|not_html
META_REASON = "webfarm_render_reason"  # why an HTTP page was escalated
META_HTTP_TEXT = "webfarm_render_http_text"  # visible characters the HTTP fetch had
# Per-fetch meta that must not follow a request to its next rung.
_FETCH_META = ("proxy", "_auth_proxy", "download_slot", "download_latency", "playwright_context",
               "playwright_context_kwargs", "webfarm_proxy", "webfarm_proxy_sent_at")


class RenderMiddleware:
    """Downloader middleware; see the module docstring."""

    def __init__(self, crawler: Crawler) -> None:
        settings = crawler.settings
        self.crawler = crawler
        assert crawler.stats is not None
        self.stats: StatsCollector = crawler.stats
        self.default_mode = parse_mode(settings.get("WEBFARM_RENDER", "auto"), "WEBFARM_RENDER")
        self.host_modes = parse_host_modes(settings.get("WEBFARM_RENDER_HOSTS"))
        api_hosts = settings.getlist("WEBFARM_FETCH_API_HOSTS")
        self.host_modes.update({host_key(h, "WEBFARM_FETCH_API_HOSTS"): "api"
                                for h in api_hosts if h.strip()})
        self.memory_seconds = settings.getfloat("WEBFARM_RENDER_MEMORY_SECONDS", 21600.0)
        rate = settings.getfloat("WEBFARM_RENDER_PROBE_RATE", 0.05)
        self.probe_period = round(1 / rate) if rate > 0 else 0
        self.min_text = settings.getint("WEBFARM_RENDER_MIN_TEXT", 50)
        self.min_pages = settings.getint("WEBFARM_RENDER_HOST_MIN_PAGES", 2)
        self.share = settings.getfloat("WEBFARM_RENDER_HOST_SHARE", 0.9)
        self.api = FetchAPI.from_settings(settings)
        wants_api = "api" in self.host_modes.values() or self.default_mode == "api"
        if wants_api and self.api is None:
            raise RenderConfigError("a render mode is 'api' but WEBFARM_FETCH_API_URL is "
                                    "unset; set it (and WEBFARM_FETCH_API_KEY) or drop "
                                    "the 'api' mode")
        self.browser_ok = has_browser_handler(settings)
        check_contexts(settings)
        self.memory: HostMemory | None = None
        self.spider_mode: str | None = None
        self.check: RenderCheck = None
        if crawler.spider is not None:  # built before the middlewares: fail before any fetch
            self._read_spider(crawler.spider)
        self._served: defaultdict[str, int] = defaultdict(int)
        self._no_browser_logged = False
        self._check_said = False  # a render_check that the rendered page failed too
        self._left = LeftTheHosts(crawler, "browser went offsite", "keep")
        self._root_misleads = RecentHosts[None](host_memory_size(crawler.settings))
        # Per host, renders the browser failed in this worker (the hosts used last).
        self._browser_failures = RecentHosts[int](host_memory_size(crawler.settings))

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RenderMiddleware:
        mw = cls(crawler)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        crawler.signals.connect(mw.check_missing, signal=wf_signals.render_check_missing)
        return mw

    def _read_spider(self, spider: Spider) -> None:
        raw = getattr(spider, "render", None)
        self.spider_mode = parse_mode(raw, f"{spider.name}.render") if raw else None
        if self.spider_mode == "api" and self.api is None:
            # -a render=api dead-lettered every page, start URL first, and exited 0
            raise RenderConfigError(f"{spider.name}'s render mode is 'api' (-a render=api or "
                                    "its render attribute) but WEBFARM_FETCH_API_URL is unset; "
                                    "set it (and WEBFARM_FETCH_API_KEY) or drop the 'api' mode")
        self.check = check_render_check(getattr(spider, "render_check", None),
                                        f"{spider.name}.render_check")

    def spider_opened(self, spider: Spider) -> None:
        settings = self.crawler.settings
        self.memory = HostMemory(
            crawl_redis_client(settings), spider.name, self.memory_seconds,
            min_pages=self.min_pages, share=self.share)
        from webfarm.netguard import NetGuard

        browser.configure(NetGuard.from_settings(settings),
                          settings.getlist("WEBFARM_BROWSER_SKIP_RESOURCES"))
        if not self.browser_ok:
            logger.warning("Render: DOWNLOAD_HANDLERS do not use %s; pages that need "
                           "JavaScript are stored as fetched over HTTP", PLAYWRIGHT_HANDLER)
        # The mode in force first: "mode auto (spider: http)" read as if auto were.
        logger.info("Render: mode %s (%s), %d host rules, fetch API %s",
                    self.spider_mode or self.default_mode,
                    f"the spider's render; WEBFARM_RENDER {self.default_mode}"
                    if self.spider_mode else "WEBFARM_RENDER", len(self.host_modes),
                    "on" if self.api else "off")

    async def spider_closed(self, spider: Spider) -> None:
        if self.memory is not None:
            await self.memory.flush()
            await close_client(self.memory.server)
        refused = browser.take_refusals()
        if refused:
            self.stats.inc_value(f"{PREFIX}/browser_refused", len(refused))

    # -- choosing the rung -------------------------------------------------------------------

    def mode_of(self, request: Request) -> str:
        if request.meta.get(META_MODE):
            try:
                return parse_mode(request.meta[META_MODE], "meta['render']")
            except RenderConfigError as exc:
                raise DeadLetter(str(exc)) from None
        host_mode = mode_for_host(self.host_modes, host_of(request.url))
        return host_mode or self.spider_mode or self.default_mode

    async def _choose(self, request: Request) -> tuple[str, str]:
        if request.meta.get("playwright"):
            return "browser", "spider"
        mode = self.mode_of(request)
        if mode != "auto":
            return mode, "mode"
        if request.method != "GET" or not self.browser_ok:
            return "http", "mode"
        host = host_of(request.url)
        assert self.memory is not None
        remembered = await self.memory.mode(host)
        if remembered not in ("browser", "api"):
            return "http", "auto"
        self._served[host] += 1
        if self.probe_period and self._served[host] % self.probe_period == 0:
            self.stats.inc_value(f"{PREFIX}/probes")
            return "http", "probe"
        if remembered == "api" and self.api is not None:
            return "api", "memory"
        return "browser", "memory"

    async def process_request(self, request: Request) -> Response | None:
        meta = request.meta
        if meta.get(META_CALL) or urlsplit(request.url).path == "/robots.txt":
            return None
        if META_RUNG not in meta:
            meta[META_RUNG], meta[META_WHY] = await self._choose(request)
        rung = meta[META_RUNG]
        if rung == "browser":
            meta["playwright"] = True
            if isinstance(self.check, str) and not await self._check_missing(request):
                meta[browser.WAIT_FOR] = self.check  # a page complete once it matches
            elif (self.check is None and (root := empty_root_of(meta.get(META_REASON)))
                  and not await self._check_missing(request)):
                # Sent for an empty app root: complete once the root holds an element. A
                # page that fills it after load (a timer, a fetch) was read at load, empty,
                # stored so, and the host then took empty roots for no sign at all.
                meta[browser.WAIT_FOR] = f"#{root} > *"
        elif rung == "api":
            meta.pop("playwright", None)
            return await self._via_api(request)
        return None

    async def _check_missing(self, request: Request) -> bool:
        """Whether a worker found the render_check selector missing on the host's renders
        (see :meth:`check_missing`): renders there no longer wait for it."""
        if self.memory is None:
            return False
        host = host_of(request.url)
        await self.memory.mode(host)  # its marks come with it (a cached read)
        return self.memory.marked(host, CHECK_MISSING)

    async def check_missing(self, host: str, **kwargs: Any) -> None:
        """The selector came in none of the host's first renders here: each worker waited
        for it again, ``WEBFARM_RENDER_CHECK_WAIT`` a render, and said so."""
        if self.memory is not None:
            await self.memory.mark(host, CHECK_MISSING)

    # -- judging what came back --------------------------------------------------------------

    async def process_response(self, request: Request, response: Response
                               ) -> Request | Response:
        meta = request.meta
        rung = meta.get(META_RUNG)
        if rung is None or meta.get(META_CALL):
            return response
        if API_FLAG in response.flags:
            self.stats.inc_value(f"{PREFIX}/api")
            return response
        if "playwright" in response.flags:
            if response.url != request.url or meta.get("redirect_urls"):
                hops = [*(meta.get("redirect_urls") or [])[1:], response.url]
                refused = await browser.check_hops(hops)
                if refused is not None:
                    self.stats.inc_value(f"{PREFIX}/browser_refused")
                    raise DeadLetter(refused)
                self._check_offsite(request, response.url)
            ctype = response.headers.get(b"Content-Type", b"").split(b";")[0].strip().lower()
            if ctype and ctype not in _HTML_TYPES:
                # Chromium shows a PDF, JSON or plain text in a viewer of its own, and the
                # page's content is that viewer's HTML: a browser-first host's PDFs were
                # stored as an empty placeholder, its JSON wrapped in <pre>. The bytes
                # come over HTTP instead (a second fetch, of non-HTML only).
                self.stats.inc_value(f"{PREFIX}/not_html")
                return self._over_http(request)
            self.stats.inc_value(f"{PREFIX}/browser")
            if meta.get(META_WHY) == "escalated" and self.memory is not None:
                host = host_of(request.url)
                if await self.memory.mode(host) == "api":  # the browser works for it again
                    await self.memory.remember(host, "browser")
            if meta.get(META_WHY) == "escalated" and not rendering_helped(
                    response, self.check, int(meta.get(META_HTTP_TEXT) or 0)):
                self.stats.inc_value(f"{PREFIX}/wrong_guess")
                logger.info("Render: the browser added nothing to %s (escalated for: %s)",
                            request.url, meta.get(META_REASON))
                if str(meta.get(META_REASON, "")).startswith(EMPTY_ROOT):
                    await self._root_misled(request)
                if isinstance(self.check, str) and not self._check_said:
                    # A slip in the selector sends every page of the spider to the browser,
                    # for nothing, and was said at INFO only.
                    self._check_said = True
                    logger.warning(
                        "Render: render_check %r matches neither %s as fetched over HTTP nor "
                        "as the browser rendered it: if the selector is wrong, every page goes "
                        "to the browser for nothing; fix the spider's render_check (said once)",
                        self.check, request.url)
            return response
        why = meta.get(META_WHY)
        if why in ("auto", "probe") and judgeable(response):
            assert self.memory is not None
            host = host_of(request.url)
            if host not in self._root_misleads and self.memory.marked(host, ROOT_MISLEADS):
                self._root_misleads.add(host)  # another worker learned it
            reason = needs_js(response, self.check, self.min_text,
                              root_misleads=host in self._root_misleads)
            mode = await self.memory.observe(host, reason is not None)
            if reason is not None:
                self.stats.inc_value(f"{PREFIX}/escalated")
                logger.debug("Render: %s needs a browser (%s); host %s is now %s-first",
                             request.url, reason, host, mode)
                return self._escalate(request, reason, visible_text_length(response))
            if why == "probe":
                self.stats.inc_value(f"{PREFIX}/wrong_guess")
                logger.info("Render: host %s no longer needs a browser (an HTTP probe of %s "
                            "was enough)", host, request.url)
        self.stats.inc_value(f"{PREFIX}/http")
        return response

    async def _root_misled(self, request: Request) -> None:
        """An empty app root beside server-rendered text (a widget's mount point) sent
        every page of a site to the browser, for nothing, and the host went browser-first
        for good. For this host such a page is no longer escalated (one with little text
        still is), by any worker, and the observation brings it back to HTTP first."""
        host = host_of(request.url)
        if host not in self._root_misleads:
            self._root_misleads.add(host)
            logger.info("Render: %s: the browser added nothing to a page with an empty app "
                        "root, so an empty app root is no sign of JavaScript there when the "
                        "page has text (said once per host)", host)
        if self.memory is not None:
            await self.memory.mark(host, ROOT_MISLEADS)
            await self.memory.observe(host, False)

    def _check_offsite(self, request: Request, final_url: str) -> None:
        """A render that ended outside the spider's hosts (the page's script, or a
        redirect, sent the browser there) is not stored, as an HTTP redirect there is not
        followed: its body was the other site's page, stored under this URL."""
        host = self._left.host(request, final_url, bool(request.meta.get("allow_offsite")))
        if host is None:
            return
        self.stats.inc_value(f"{PREFIX}/browser_offsite")
        self._left.refuse(request, final_url, host, f"{request.url[:200]} → {final_url[:200]}",
                          f"Render: {request.url} sent the browser to {final_url[:200]}, "
                          "outside the spider's hosts: not stored")

    def _over_http(self, request: Request) -> Request:
        """The same URL again over plain HTTP, back through the frontier."""
        meta = {k: v for k, v in request.meta.items()
                if k not in _FETCH_META and k != "playwright"}
        meta.update({META_RUNG: "http", META_WHY: "not_html"})
        return request.replace(meta=meta, dont_filter=True, priority=request.priority + 1)

    def _escalate(self, request: Request, reason: str, http_text: int) -> Request:
        """The same URL again, for the browser, back through the frontier."""
        meta = {k: v for k, v in request.meta.items() if k not in _FETCH_META}
        meta.update({META_RUNG: "browser", META_WHY: "escalated", META_REASON: reason,
                     META_HTTP_TEXT: http_text, "playwright": True})
        # Ahead of the host's other queued pages: its lease was already spent once.
        return request.replace(meta=meta, dont_filter=True, priority=request.priority + 1)

    # -- the last rung -----------------------------------------------------------------------

    async def process_exception(self, request: Request, exception: BaseException
                                ) -> Response | None:
        meta = request.meta
        if meta.get(META_CALL) or isinstance(exception, IgnoreRequest):
            return None
        if meta.get(META_RUNG) != "browser":
            return None
        self.stats.inc_value(f"{PREFIX}/browser_failed")
        missing = isinstance(exception, browser.BrowserNotFound)
        if missing and not self._no_browser_logged:
            self._no_browser_logged = True
            logger.error("%s", exception)
        if self.api is not None:
            logger.info("Render: browser failed for %s (%s); asking the fetch API",
                        request.url, type(exception).__name__)
            meta.pop("playwright", None)
            meta[META_RUNG], meta[META_WHY] = "api", "browser_failed"
            page = await self._via_api(request)
            if self.memory is not None and self.mode_of(request) == "auto":
                # Skip the browser next, and pay for the API, once the browser failed the
                # host a few times, or is missing: one slow page (a navigation timeout)
                # sent every later page of a host the browser renders fine to the API.
                host = host_of(request.url)
                failures = self._browser_failures.get(host, 0) + 1
                self._browser_failures[host] = failures
                if missing or failures >= BROWSER_FAILURES_TO_API:
                    await self.memory.remember(host, "api")
            return page
        if missing:
            raise DeadLetter(f"needs a browser: {exception}", error="BrowserNotFound")
        return None

    async def _via_api(self, request: Request) -> Response:
        if self.api is None:
            raise DeadLetter("render mode 'api' but WEBFARM_FETCH_API_URL is unset; set it "
                             "(and WEBFARM_FETCH_API_KEY) or use another mode")
        engine = self.crawler.engine
        assert engine is not None
        try:
            answer = await engine.download_async(self.api.api_request(request))
        except IgnoreRequest:
            self.stats.inc_value(f"{PREFIX}/api_failed")
            raise
        except Exception as exc:  # noqa: BLE001 - any network failure: try again later
            self.stats.inc_value(f"{PREFIX}/api_failed")
            error = f"{type(exc).__name__}: {exc}"
            raise RetryLater(f"fetch API unreachable: {error}", error=error) from None
        try:
            return self.api.page(request, answer)
        except FetchAPIError as exc:
            self.stats.inc_value(f"{PREFIX}/api_failed")
            if exc.retry:
                logger.warning("Render: %s for %s; retrying later", exc.reason, request.url)
                raise RetryLater(exc.reason, status=exc.status) from None
            raise DeadLetter(exc.reason, status=exc.status) from None
