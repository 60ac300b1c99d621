"""Proxy rotation: every request through a healthy proxy, bans cool a proxy down.

On when ``WEBFARM_PROXIES`` lists proxies (see :mod:`webfarm.proxies` for the
format, the ids and the health shared through Redis). Per request:

* ``process_request`` picks a healthy proxy (least recently used, or the
  host's sticky one) and sets ``meta["webfarm_proxy"]`` (its id, for others to
  record) and, for the plain HTTP client, ``meta["proxy"]`` with the userinfo,
  which Scrapy's ``HttpProxyMiddleware`` (750, so this one must run before it)
  turns into ``Proxy-Authorization``. Browser requests (``meta["playwright"]``)
  get one Playwright context per proxy instead: scrapy-playwright has no
  per-request proxy, and a context's proxy is fixed when it is created.
* ``process_response`` / ``process_exception`` spot bans (407, the
  ``WEBFARM_PROXY_BAN_STATUSES``, the ``WEBFARM_PROXY_BAN_MARKERS``) and
  connection failures. A 407 or a failure to reach the proxy is always the
  proxy's fault. A ban status, a marker or a timeout counts against the proxy
  only if another proxy fetched the same host fine in the last
  ``WEBFARM_PROXY_HOST_WINDOW`` seconds and this request was not already
  banned through another proxy: otherwise it is the site's doing and the pool
  is left alone.
* The request is tried again through a proxy it has not used yet, the Scrapy
  way (``request.replace(dont_filter=True)``, back through the frontier), up
  to ``WEBFARM_PROXY_RETRY_TIMES`` times. Then: if a proxy was to blame,
  ``RetryLater`` (the frontier backs off and dead-letters in the end); if
  only the site refused, its last response goes on down the chain, so robots
  (4xx = allow all), Retry-After and the retry policy see the site's answer.
  With no healthy proxy at all the request gets ``RetryLater(spend=False)``: back to
  the frontier until the first cooldown ends (every proxy retired: for
  ``WEBFARM_PROXY_BACKOFF_BASE``), spending no attempt, as it was not sent; it is never
  fetched without a proxy.

Credentials never leave this process: ids in logs, stats and Redis; the
browser context's ``proxy`` kwargs are taken out of ``meta`` as soon as the
download is done (the context exists by then), so no later request copy,
redirect or queued entry carries them.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from scrapy.exceptions import (
    CannotResolveHostError,
    DownloadConnectionRefusedError,
    DownloadFailedError,
    DownloadTimeoutError,
    NotConfigured,
)
from scrapy.http import Response
from twisted.internet import error as txerror
from twisted.web._newclient import ResponseFailed, ResponseNeverReceived

from middlewares.robotsfetch import META as ROBOTS_META
from webfarm.exceptions import RetryLater
from webfarm.hostmemory import host_memory_size
from webfarm.proxies import UNPROVEN, ProxyPool
from webfarm.proxyconfig import proxies_from_settings
from webfarm.redisconn import close_client, crawl_redis_client
from webfarm.urls import host_of

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from webfarm.proxyconfig import Proxy

logger = logging.getLogger(__name__)

PREFIX = "webfarm/proxies"
HTTPPROXY = "scrapy.downloadermiddlewares.httpproxy.HttpProxyMiddleware"
# meta keys this middleware owns; all JSON-safe, none secret.
META_ID = "webfarm_proxy"
META_SENT = "webfarm_proxy_sent_at"
META_TRIED = "webfarm_proxy_tried"
META_RETRIES = "webfarm_proxy_retries"
META_BANNED = "webfarm_proxy_banned"  # this request was answered with a ban already
# [proxy id, reason, sent at] of a ban not counted yet: the proxy's only if another proxy
# then fetches this same request fine (else the page answers so through every proxy)
META_SUSPECT = "webfarm_proxy_suspect"
# Reaching the proxy failed: its fault whatever the site does. (Scrapy 2.19's handlers
# wrap Twisted's errors in its own; both are listed for other handlers.)
PROXY_ERRORS: tuple[type[BaseException], ...] = (
    DownloadConnectionRefusedError,
    CannotResolveHostError,  # only the proxy's name is looked up here
    txerror.ConnectError,  # refused, no route, TCP connect timeout
    txerror.DNSLookupError,
)
# The proxy was reached but no (whole) answer came back: the proxy's or the site's.
AMBIGUOUS_ERRORS: tuple[type[BaseException], ...] = (
    DownloadTimeoutError, DownloadFailedError, txerror.TimeoutError, txerror.ConnectionLost,
    txerror.ConnectionDone, ResponseFailed, ResponseNeverReceived,
)
# Chromium/Firefox network errors that name the proxy (Playwright raises a plain Error).
BROWSER_PROXY_ERRORS = ("ERR_PROXY", "ERR_TUNNEL_CONNECTION_FAILED", "ERR_SOCKS",
                        "ERR_NO_SUPPORTED_PROXIES", "ERR_MANDATORY_PROXY", "NS_ERROR_PROXY")
MARKER_SCAN_BYTES = 256 * 1024
# Answered by a proxy that cannot reach the site as often as by the site: the proxy's
# when others fetch the host fine.
GATEWAY_STATUSES = frozenset({502, 503, 504})

try:  # Scrapy's tunnel error, raised when a CONNECT through the proxy fails
    from scrapy.core.downloader.handlers.http11 import TunnelError

    PROXY_ERRORS += (TunnelError,)
except ImportError:  # pragma: no cover - older Scrapy
    pass


class ProxyMiddleware:
    """Downloader middleware; see the module docstring. Priority: between the
    render ladder (which sets ``meta["playwright"]``) and ``HttpProxyMiddleware``
    (750); 740 is the recommended slot."""

    def __init__(self, crawler: Crawler, pool: ProxyPool) -> None:
        settings = crawler.settings
        self.crawler = crawler
        self.pool = pool
        assert crawler.stats is not None
        self.stats: StatsCollector = crawler.stats
        self.ban_statuses = {int(s) for s in settings.getlist("WEBFARM_PROXY_BAN_STATUSES",
                                                              ["403", "429"])}
        self.ban_markers = [m.lower().encode("utf-8")
                            for m in settings.getlist("WEBFARM_PROXY_BAN_MARKERS", []) if m]
        self.retry_times = settings.getint("WEBFARM_PROXY_RETRY_TIMES", 3)
        # With every proxy retired, a request looks again after a first cooldown's time.
        self.retired_wait = settings.getfloat("WEBFARM_PROXY_BACKOFF_BASE", 30.0)
        self.browser_bypass = settings.get("WEBFARM_PROXY_BROWSER_BYPASS", "") or ""
        self._healthy_seen: list[str] | None = None
        self._all_retired_logged = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ProxyMiddleware:
        settings = crawler.settings
        proxies = proxies_from_settings(settings)  # ProxyConfigError: one line, no secrets
        if not proxies:
            raise NotConfigured  # off by default: no warning for the usual case
        cls._check_order(crawler)
        pool = ProxyPool(
            proxies, crawl_redis_client(settings),
            base=settings.getfloat("WEBFARM_PROXY_BACKOFF_BASE", 30.0),
            cap=settings.getfloat("WEBFARM_PROXY_BACKOFF_MAX", 3600.0),
            max_failures=settings.getint("WEBFARM_PROXY_MAX_FAILURES", 5),
            refresh=settings.getfloat("WEBFARM_PROXY_HEALTH_REFRESH", 1.0),
            ttl=settings.getfloat("WEBFARM_PROXY_STATE_TTL", 86400.0),
            host_window=settings.getfloat("WEBFARM_PROXY_HOST_WINDOW", 600.0),
            sticky=settings.getbool("WEBFARM_PROXY_STICKY", False),
            host_memory=host_memory_size(settings),
        )
        mw = cls(crawler, pool)
        crawler.signals.connect(mw.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    @classmethod
    def _check_order(cls, crawler: Crawler) -> None:
        """Credentials reach the proxy only if HttpProxyMiddleware runs after us."""
        settings = crawler.settings
        if not settings.getbool("HTTPPROXY_ENABLED", True):
            raise NotConfigured("WEBFARM_PROXIES needs HTTPPROXY_ENABLED=True")
        mws = settings.getwithbase("DOWNLOADER_MIDDLEWARES")
        ours = mws.get(f"{cls.__module__}.{cls.__name__}")
        theirs = mws.get(HTTPPROXY)
        if theirs is None or (ours is not None and ours >= theirs):
            raise ValueError(
                f"{cls.__module__}.{cls.__name__} must have a lower DOWNLOADER_MIDDLEWARES "
                f"priority than {HTTPPROXY} ({theirs}); 740 is the recommended slot"
            )

    # -- lifecycle ---------------------------------------------------------------------------

    async def spider_opened(self) -> None:
        await self.pool.refresh(force=True)
        self._update_health_stats()
        logger.info("Proxy rotation on: %d proxies (%s), %d healthy", len(self.pool.order),
                    ", ".join(self.pool.order), len(self._healthy_seen or []))

    async def spider_closed(self) -> None:
        await self.pool.refresh(force=True)
        self._update_health_stats()
        await close_client(self.pool.redis)
        for pid in self.pool.order:
            state = self.pool.state[pid]
            if state.retired or state.failures:
                logger.info("proxy %s: %s after %d consecutive failures (last: %s)", pid,
                            "retired" if state.retired else "cooling down", state.failures,
                            state.last_reason or "?")

    def _update_health_stats(self) -> None:
        healthy = self.pool.healthy_ids()
        if healthy != self._healthy_seen:
            self._healthy_seen = healthy
            if healthy:  # one is back: should all be retired again, say so again
                self._all_retired_logged = False
            self.stats.set_value(f"{PREFIX}/healthy", healthy)
            self.stats.set_value(f"{PREFIX}/retired", self.pool.retired_ids())

    # -- requests ----------------------------------------------------------------------------

    async def process_request(self, request: Request) -> None:
        meta = request.meta
        if "proxy" in meta and META_ID not in meta:
            return  # the spider chose its own proxy (or None for none): leave it alone
        host = host_of(request.url)
        tried = list(meta.get(META_TRIED) or [])
        proxy = await self.pool.pick(host, exclude=tried)
        self._update_health_stats()
        if proxy is None:
            self._no_proxy(request, tried)
        assert proxy is not None
        meta[META_ID] = proxy.id
        meta[META_SENT] = self.pool.clock()
        if meta.get("playwright"):
            self._browser_proxy(request, proxy)
        else:
            meta["proxy"] = proxy.url
        self.stats.inc_value(f"{PREFIX}/{proxy.id}/requests")

    def _browser_proxy(self, request: Request, proxy: Proxy) -> None:
        """One Playwright context per proxy; no proxy header on the browser's requests.

        scrapy-playwright copies the Scrapy headers onto the navigation request,
        so a ``Proxy-Authorization`` here would be sent to the site.
        """
        meta = request.meta
        meta["proxy"] = None  # HttpProxyMiddleware then drops any Proxy-Authorization
        request.headers.pop(b"Proxy-Authorization", None)
        meta.pop("_auth_proxy", None)
        meta["playwright_context"] = f"proxy-{proxy.id}"
        kwargs = dict(meta.get("playwright_context_kwargs") or {})
        kwargs["proxy"] = proxy.playwright_proxy(self.browser_bypass)
        meta["playwright_context_kwargs"] = kwargs

    def _no_proxy(self, request: Request, tried: list[str]) -> None:
        """No healthy proxy left for this request: back to the frontier, never direct."""
        self.stats.inc_value(f"{PREFIX}/unavailable")
        healthy = self.pool.healthy_ids()
        if healthy:  # every healthy one was tried for this request already
            raise RetryLater(f"proxy: banned through every healthy proxy ({', '.join(tried)})")
        # Not sent: no attempt spent. Before, each such turn spent one, and a crawl whose
        # proxies were all retired emptied its frontier into the dead-letter queue.
        comes_back = self.pool.next_available()
        if comes_back is None:
            if not self._all_retired_logged:
                self._all_retired_logged = True
                logger.error("every proxy is retired (%s); requests wait in the frontier. "
                             "Fix or replace them, then delete their webfarm:proxies:<id> keys",
                             ", ".join(self.pool.order))
            raise RetryLater("proxy: every proxy is retired", spend=False,
                             delay=round(self.retired_wait * random.uniform(1.0, 1.1), 3))
        delay = max(0.0, comes_back - self.pool.clock())
        raise RetryLater("proxy: every proxy is cooling down", delay=round(delay, 3),
                         spend=False)

    # -- outcomes ----------------------------------------------------------------------------

    async def process_response(self, request: Request, response: Response
                               ) -> Request | Response:
        pid = request.meta.get(META_ID)
        if pid not in self.pool.proxies:
            return response
        self._forget_secrets(request)
        reason = self._ban_reason(response)
        host = host_of(request.url)
        sent_at = float(request.meta.get(META_SENT) or 0.0)
        if reason is None and response.status in GATEWAY_STATUSES:
            return await self._gateway_error(request, response, pid, host, sent_at)
        if reason is None:
            suspect = request.meta.pop(META_SUSPECT, None)
            if suspect:  # fetched fine through this proxy: the earlier one's ban after all
                await self._penalise(str(suspect[0]), str(suspect[1]), float(suspect[2]))
            await self.pool.record_success(pid, host, sent_at)
            for key in (META_TRIED, META_RETRIES, META_BANNED):
                request.meta.pop(key, None)  # a redirect from here starts afresh
            return response
        self.stats.inc_value(f"{PREFIX}/{pid}/bans")
        # A 407 is the proxy's. Another ban is suspected, not counted, until another proxy
        # fetches this request fine: the site's own 403 pages were each counted against
        # the first proxy that met them, and 15 of them retired two healthy proxies.
        blame = response.status == 407
        suspected = not blame and await self._blame_proxy(request, pid, host)
        if blame:
            await self._penalise(pid, reason, sent_at)
        elif suspected:
            request.meta[META_SUSPECT] = [pid, reason, sent_at]
        else:
            request.meta.pop(META_SUSPECT, None)  # banned through another proxy too: the site's
            self.stats.inc_value(f"{PREFIX}/site_bans")
            if response.status in (429, 503) and b"Retry-After" in response.headers:
                return response  # the site asks us to wait: politeness, not rotation
        request.meta[META_BANNED] = True
        retry = self._retry(request, pid, reason, response.status)
        if retry is not None:
            return retry
        if suspected:  # no other proxy to ask: counted, as before (the frontier retries)
            request.meta.pop(META_SUSPECT, None)
            await self._penalise(pid, reason, sent_at)
            blame = True
        if blame:
            raise RetryLater(f"proxy: {reason} through {self._tried(request, pid)}",
                             status=response.status, response=response)
        if await self.pool.host_ok_elsewhere(host):
            return response  # the site's consistent answer through several proxies
        # No proxy has fetched this host fine: the proxies may be what refuses (one that
        # answers 403 to everything). Handed on, the page was lost as the site's answer.
        self.stats.inc_value(f"{PREFIX}/unproven_bans")
        if request.meta.get(ROBOTS_META):  # RFC 9309: 4xx is "allow all"; kept briefly
            return response.replace(flags=[*response.flags, UNPROVEN])
        raise RetryLater(f"proxy: {reason} through {self._tried(request, pid)}, and no "
                         f"proxy has fetched {host} fine yet: the proxies or the site refuse",
                         status=response.status, response=response)

    async def _gateway_error(self, request: Request, response: Response, pid: str,
                             host: str, sent_at: float) -> Request | Response:
        """A 502/503/504 through a proxy: the proxy's own when others fetch the host fine
        (it was taken for the site's: retried at an attempt each, dead-lettered with a
        healthy proxy at hand); else the site's, retried as such."""
        if b"Retry-After" in response.headers or not await self._blame_proxy(request, pid,
                                                                            host):
            return response
        reason = f"HTTP {response.status} from the proxy"
        self.stats.inc_value(f"{PREFIX}/{pid}/failures")
        await self._penalise(pid, reason, sent_at, counter="errors")
        retry = self._retry(request, pid, reason, response.status)
        if retry is not None:
            return retry
        raise RetryLater(f"proxy: {reason} through {self._tried(request, pid)}",
                         status=response.status, response=response)

    async def process_exception(self, request: Request, exception: BaseException
                                ) -> Request | None:
        pid = request.meta.get(META_ID)
        if pid not in self.pool.proxies:
            return None
        self._forget_secrets(request)
        name = type(exception).__name__
        message = str(exception)
        if isinstance(exception, PROXY_ERRORS) or any(m in message
                                                       for m in BROWSER_PROXY_ERRORS):
            blame = True
        elif isinstance(exception, AMBIGUOUS_ERRORS):
            blame = await self._blame_proxy(request, pid, host_of(request.url))
        else:
            return None  # not about the connection: not ours to judge
        self.stats.inc_value(f"{PREFIX}/{pid}/failures")
        timed_out = isinstance(exception, (DownloadTimeoutError, txerror.TimeoutError))
        reason = f"{'no answer in time' if timed_out else 'connection failed'} ({name})"
        if blame:
            await self._penalise(pid, reason, float(request.meta.get(META_SENT) or 0.0),
                                 counter="errors")
        retry = self._retry(request, pid, reason, None)
        if retry is not None:
            return retry
        raise RetryLater(f"proxy: {reason} through {self._tried(request, pid)}",
                         error=name) from exception

    def _ban_reason(self, response: Response) -> str | None:
        if response.status == 407:
            return "407 proxy authentication required"
        if response.status in self.ban_statuses:
            return f"ban status {response.status}"
        if self.ban_markers:
            head = response.body[:MARKER_SCAN_BYTES].lower()
            for i, marker in enumerate(self.ban_markers, 1):
                if marker in head:
                    return f"ban marker {i} ({marker.decode('utf-8', 'replace')[:40]})"
        return None

    async def _blame_proxy(self, request: Request, pid: str, host: str) -> bool:
        """The proxy, not the site, may be to blame if others fetch this host fine and this
        request was not banned through another proxy already (then it is the page); it is,
        once another proxy fetches this request fine (``META_SUSPECT``)."""
        if request.meta.get(META_BANNED):
            return False
        return await self.pool.host_ok_elsewhere(host, pid)

    async def _penalise(self, pid: str, reason: str, sent_at: float, counter: str = "bans"
                        ) -> None:
        counted, state = await self.pool.record_failure(pid, reason, sent_at, counter)
        if not counted:
            return
        self.stats.inc_value(f"{PREFIX}/{pid}/cooldowns")
        if state.retired:
            self.stats.inc_value(f"{PREFIX}/retirements")
            logger.error("proxy %s retired after %d consecutive failures (last: %s)", pid,
                         state.failures, reason)
        else:
            logger.warning("proxy %s cooling down for %.1fs after %s (%d in a row)", pid,
                           max(0.0, state.cooldown_until - self.pool.clock()), reason,
                           state.failures)
        self._update_health_stats()

    def _retry(self, request: Request, pid: str, reason: str, status: int | None
               ) -> Request | None:
        """The same request through another proxy, or None when out of tries."""
        retries = int(request.meta.get(META_RETRIES) or 0)
        tried = self._tried_list(request, pid)
        untried = [p for p in self.pool.healthy_ids() if p not in tried]
        if retries >= self.retry_times or not untried:
            self.stats.inc_value(f"{PREFIX}/gave_up")
            return None
        meta: dict[str, Any] = dict(request.meta)
        for key in ("proxy", "_auth_proxy", "playwright_context", "playwright_context_kwargs",
                    "download_slot"):
            meta.pop(key, None)
        meta[META_RETRIES] = retries + 1
        meta[META_TRIED] = tried
        retry = request.replace(meta=meta, dont_filter=True)
        retry.headers.pop(b"Proxy-Authorization", None)
        self.stats.inc_value(f"{PREFIX}/retries")
        logger.debug("retrying %s through another proxy (%s via %s)", request.url, reason, pid)
        return retry

    @staticmethod
    def _tried_list(request: Request, pid: str) -> list[str]:
        tried = list(request.meta.get(META_TRIED) or [])
        if pid not in tried:
            tried.append(pid)
        return tried

    def _tried(self, request: Request, pid: str) -> str:
        return ", ".join(self._tried_list(request, pid))

    @staticmethod
    def _forget_secrets(request: Request) -> None:
        """The browser context exists now; its proxy password must not travel further."""
        kwargs = request.meta.get("playwright_context_kwargs")
        if isinstance(kwargs, dict) and "proxy" in kwargs:
            rest = {k: v for k, v in kwargs.items() if k != "proxy"}
            if rest:
                request.meta["playwright_context_kwargs"] = rest
            else:
                del request.meta["playwright_context_kwargs"]
