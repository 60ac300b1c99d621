"""webfarm's download handler: scrapy-playwright's, with its holes closed.

**Headers without end.** ``DOWNLOAD_MAXSIZE`` bounds bodies only. Twisted's HTTP client
caps each header line (16 KiB) but not how many come, so a server that sends headers
without end grows the worker until ``DOWNLOAD_TIMEOUT``: measured here with bare Scrapy,
1.76 GB of memory in 5 s on loopback, then a retry that does it again. Chromium refuses
a response whose headers pass 256 KiB; webfarm's HTTP client does the same
(``WEBFARM_MAX_HEADER_BYTES``): it stops reading there, and the request fails with
:class:`HeadersTooLarge`, which ``middlewares.limits.HttpCompressionMiddleware``
dead-letters at once, as it does a body over ``DOWNLOAD_MAXSIZE``. This reaches into
Scrapy's private ``_LenientHTTP11ClientProtocol`` (Scrapy swaps the parser's class the
same way); ``tests/test_hostile.py`` fails if a Scrapy upgrade moves it.

**Half a surrogate pair in a rendered page.** A JavaScript string may hold one
(``String.fromCharCode(0xD83D)``, a cut emoji), the DOM keeps it, and scrapy-playwright's
``_encode_body`` then fails on the page's text with ``UnicodeEncodeError``: the page went
back to the frontier as a failed download and was rendered again, up to
``WEBFARM_RETRY_TIMES`` times. Such a text is encoded with those code units' bytes
(read back as U+FFFD), as :mod:`webfarm.fetchapi` does for the fetch API's answers.

**A render without end.** Playwright bounds the navigation, not what comes after it:
a page whose script loops once loaded (``setTimeout(() => {while (true) {}})``) never
gave its content, so the download never ended, the worker never stopped (not even on a
graceful stop) and its lease went to the next worker to hang it the same way. A render
now has ``DOWNLOAD_TIMEOUT`` on top of the navigation timeout; past that its page is
closed (Chromium closes a busy page) and the request fails with Scrapy's
``DownloadTimeoutError``: retried, then dead-lettered with that reason.

**A page whose ``load`` never comes.** A script, image or frame that never finishes
loading (a third-party tracker) kept the ``load`` event away: the navigation timed out
though the page's content was built at once, and the render failed, a navigation
timeout each try, then a dead letter, or a page bought from the fetch API. A navigation
that times out with its document in and parsed (``DOMContentLoaded``) now keeps the page
as the browser built it (stat ``webfarm/render/load_timeouts``, said once per host).

**Popups.** scrapy-playwright routes each page's requests (the SSRF guard, skipped
resource types) on that page only, and a ``window.open`` opens another page: its
requests went out unchecked, with Chromium's own User-Agent. A popup is closed as it
opens, and every request of a page not routed by its own (a popup, a service worker)
is refused at the browser context (stats ``webfarm/render/popups`` and
``webfarm/render/popup_requests_refused``).

**Chromium's death.** scrapy-playwright says it at DEBUG only; a killed browser left no
line in the log. It is a WARNING now, with stat ``webfarm/render/browser_lost``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import weakref
from typing import TYPE_CHECKING, Any

import scrapy_playwright.handler
from playwright.async_api import TimeoutError as PlaywrightTimeoutError
from scrapy import Request, Spider
from scrapy.core.downloader.handlers import http11
from scrapy.crawler import Crawler
from scrapy.exceptions import DownloadTimeoutError
from scrapy.http import Headers, Response
from scrapy.utils.httpobj import urlparse_cached
from scrapy_playwright._utils import _encode_body
from scrapy_playwright.handler import ScrapyPlaywrightDownloadHandler

from webfarm import browser
from webfarm import signals as wf_signals
from webfarm.config import whole_number
from webfarm.exceptions import DeadLetter, RetryLater
from webfarm.hostmemory import RecentHosts, host_memory_size
from webfarm.urls import host_of

if TYPE_CHECKING:
    from playwright.async_api import Page, Route

logger = logging.getLogger(__name__)

MAX_HEADER_BYTES = 256 * 1024
CHECK_MISSES = 2  # renders of a host without the render_check selector, before no more waits


class HeadersTooLarge(Exception):
    """A response's status line and headers passed ``WEBFARM_MAX_HEADER_BYTES``, or one
    of its lines the HTTP client's limit (Twisted's 16 KiB)."""

    def __init__(self, limit: int, what: str = "") -> None:
        super().__init__(what or f"response headers over WEBFARM_MAX_HEADER_BYTES ({limit} B)")
        self.limit = limit


def header_limit(settings: Any) -> int:
    """``WEBFARM_MAX_HEADER_BYTES`` (0: unbounded); ValueError saying what is wanted.
    ``middlewares.limits`` reads it at start too: Scrapy loads a download handler at
    the first request and only logs its errors, so every fetch would then fail."""
    return whole_number(settings, "WEBFARM_MAX_HEADER_BYTES", MAX_HEADER_BYTES, "bytes",
                        "unbounded")


def headers_too_large(exception: BaseException) -> HeadersTooLarge | None:
    """The HeadersTooLarge behind a failed download (Scrapy wraps it in
    ``DownloadFailedError`` from Twisted's ``ResponseFailed``), or None."""
    seen: set[int] = set()
    todo = [exception]
    while todo:
        exc = todo.pop()
        if isinstance(exc, HeadersTooLarge):
            return exc
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        todo += [getattr(f, "value", f) for f in getattr(exc, "reasons", None) or ()]
        todo += [e for e in (exc.__cause__, exc.__context__) if e is not None]
    return None


class _BoundedParser(http11._LenientHTTPClientParser):
    """Scrapy's lenient response parser, counting the bytes of the header block."""

    max_header_bytes = MAX_HEADER_BYTES
    header_bytes = 0

    def lineReceived(self, line: bytes) -> None:
        # Lines come only before the body (the parser reads the body in raw mode).
        self.header_bytes += len(line) + 2
        if self.header_bytes > self.max_header_bytes:
            # Raised into HTTP11ClientProtocol.dataReceived, which drops the connection
            # and fails the request with it.
            raise HeadersTooLarge(self.max_header_bytes)
        super().lineReceived(line)

    def lineLengthExceeded(self, line: bytes) -> None:
        # Twisted drops the connection on a line over MAX_LENGTH (16 KiB): the request
        # failed as "Connection was closed cleanly", a network error, and was fetched
        # again WEBFARM_RETRY_TIMES times for the same answer. Dead-lettered at once now.
        raise HeadersTooLarge(self.MAX_LENGTH, f"a response header line over "
                                               f"{self.MAX_LENGTH} B (the HTTP client's limit)")


class _BoundedProtocol(http11._LenientHTTP11ClientProtocol):
    max_header_bytes = MAX_HEADER_BYTES

    def request(self, request: Any) -> Any:
        d = super().request(request)
        assert self._parser is not None  # as in Scrapy's own class swap
        self._parser.__class__ = _BoundedParser
        self._parser.max_header_bytes = self.max_header_bytes
        return d


def encode_rendered(headers: Headers, text: str) -> tuple[bytes, str]:
    """scrapy-playwright's choice of encoding for a rendered page's text, and UTF-8 with
    surrogates passed through when the text holds half a pair (no encoding takes it)."""
    try:
        return _encode_body(headers=headers, text=text)  # the original, from its own module
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass"), "utf-8"


class DownloadHandler(ScrapyPlaywrightDownloadHandler):
    """scrapy-playwright's handler with the module's guards."""

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        settings = crawler.settings
        self.download_timeout = settings.getfloat("DOWNLOAD_TIMEOUT", 180.0)
        navigation_ms = settings.getfloat("PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT", 30_000.0)
        self.navigation_timeout = max(navigation_ms, 0.0) / 1000
        self.check_wait = settings.getfloat("WEBFARM_RENDER_CHECK_WAIT", 10.0)
        self._render_pages: weakref.WeakKeyDictionary[Request, Page] = (
            weakref.WeakKeyDictionary())
        self._own_pages: weakref.WeakSet[Page] = weakref.WeakSet()  # not popups
        self._openings: set[asyncio.Future[Page]] = set()  # own pages being opened
        self._closing = False
        self._load_timeout_hosts = RecentHosts[None](host_memory_size(settings))  # said once
        # Per host: renders where the render_check selector came, and where it did not.
        self._check_seen = RecentHosts[tuple[int, int]](host_memory_size(settings))
        self._opened: weakref.WeakKeyDictionary[Request, asyncio.Event] = (
            weakref.WeakKeyDictionary())
        # The handler calls its module's name; set once, for every handler in the process.
        scrapy_playwright.handler._encode_body = encode_rendered
        limit = header_limit(crawler.settings)
        if limit > 0:
            protocol = type("BoundedProtocol", (_BoundedProtocol,), {"max_header_bytes": limit})

            class Factory(http11._LenientHTTP11ClientFactory):
                def buildProtocol(self, addr: Any) -> Any:
                    return protocol(self._quiescentCallback)

            self._pool._factory = Factory

    async def _download_request(self, request: Request, spider: Spider | None = None
                                ) -> Response:
        """The render, bounded: past the navigation timeout and ``DOWNLOAD_TIMEOUT`` from
        when it has its page, the page is closed and the request fails as a download
        timeout (waiting for a free page of its context has the same bound of its own)."""
        limit = (float(request.meta.get("download_timeout") or self.download_timeout)
                 + self.navigation_timeout)
        render = asyncio.ensure_future(super()._download_request(request, spider))
        opened = self._opened[request] = asyncio.Event()  # set by _create_page
        has_page = asyncio.ensure_future(opened.wait())
        try:
            await asyncio.wait({render, has_page}, timeout=limit,
                               return_when=asyncio.FIRST_COMPLETED)
            if opened.is_set() and not render.done():  # the time a page wait took is not
                await asyncio.wait({render}, timeout=limit)  # the page's to answer for
        except asyncio.CancelledError:  # the download is cancelled (a shutdown): so is it
            render.cancel()
            raise
        finally:
            has_page.cancel()
            self._opened.pop(request, None)
        if render.done():
            response = render.result()
            page = self._render_pages.pop(request, None)
            why = browser.navigation_refusal(page) if page is not None else None
            if why is not None and response.url.startswith("chrome-error:"):
                # Chromium's error page, left by a navigation the page's script began and
                # the browser refused: not the page, and not worth another try.
                raise DeadLetter(why)
            return response
        render.cancel()
        render.add_done_callback(lambda task: task.cancelled() or task.exception())  # seen
        await asyncio.wait({render}, timeout=10)
        page = self._render_pages.pop(request, None)
        if page is None:
            # It never had a page: it waited for one while every page of its context was
            # busy. It was dead-lettered as a page whose JavaScript never lets go, though
            # the host never saw a request. Back to the frontier, no attempt spent.
            self.stats.inc_value("webfarm/render/slot_waits")
            raise RetryLater(
                f"waited over {limit:.0f}s for a browser page (every page of its context was "
                "busy: PLAYWRIGHT_MAX_PAGES_PER_CONTEXT)", delay=limit / 2, spend=False)
        if not page.is_closed():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(page.close(), 10)
        self.stats.inc_value("webfarm/render/timeouts")
        raise DownloadTimeoutError(
            f"the render took over {limit:.0f}s (DOWNLOAD_TIMEOUT and the navigation "
            "timeout): the page's JavaScript does not let go (a busy loop?); its page was "
            "closed")

    async def _download_request_with_page(self, request: Request, page: Page, spider: Spider
                                          ) -> Response:
        # The host's turn, which the frontier handed out before this page opened (or the
        # browser started), is taken as the navigation's request leaves (abort_request).
        browser.wait_turn(page, functools.partial(
            self.crawler.signals.send_catch_log_async, wf_signals.render_arrival,
            request=request))
        try:
            return await super()._download_request_with_page(request, page, spider)
        finally:
            browser.wait_turn(page, None)  # not taken: refused, or the page kept

    async def _get_response_and_download(self, request: Request, page: Page, spider: Spider
                                         ) -> tuple[Any, Any]:
        """The navigation, then the wait for the spider's ``render_check`` selector."""
        result = await self._navigate(request, page, spider)
        selector = request.meta.get(browser.WAIT_FOR)
        if selector and self.check_wait > 0:
            await self._wait_for(page, selector, host_of(request.url))
        return result

    async def _wait_for(self, page: Page, selector: str, host: str) -> None:
        """A page that builds its content after ``load`` (data fetched by a script) was
        read before the content came: stored without it, and counted as a wrong guess.
        The render now waits, ``WEBFARM_RENDER_CHECK_WAIT`` at most, for the spider's
        ``render_check`` selector; a page where it never comes is read as it stands. A
        host where it never came in two renders is waited for no more (a slip in the
        selector made each render of the site that much longer)."""
        found, missed = self._check_seen.get(host, (0, 0))
        if not found and missed >= CHECK_MISSES:
            return
        try:
            await page.wait_for_selector(selector, state="attached",
                                         timeout=self.check_wait * 1000)
            found += 1
        except PlaywrightTimeoutError:
            self.stats.inc_value("webfarm/render/check_wait_timeouts")
            missed += 1
            if not found and missed == CHECK_MISSES:
                logger.warning("Render: %r did not appear in %d renders of %s within "
                               "WEBFARM_RENDER_CHECK_WAIT (%gs): renders there no longer wait "
                               "for it, in any worker (a spider's render_check: is the "
                               "selector right?)", selector, missed, host, self.check_wait)
                await self.crawler.signals.send_catch_log_async(
                    wf_signals.render_check_missing, host=host, selector=selector)
        except Exception as exc:  # noqa: BLE001 - a closed page is found by what follows
            logger.debug("Waiting for %r on %s failed: %s", selector, page.url, exc)
        self._check_seen[host] = (found, missed)

    async def _navigate(self, request: Request, page: Page, spider: Spider) -> tuple[Any, Any]:
        """The navigation; one that timed out waiting for the page's ``load`` event, its
        document in and parsed, keeps the page as it stands. A script, image or frame
        that never finished loading (a third-party tracker, say) failed the render
        though its content was built at once: retried at a navigation timeout each, then
        dead-lettered, or bought from the fetch API."""
        documents: list[Any] = []

        def on_response(response: Any) -> None:
            try:  # a service worker's response has no frame: Playwright raises
                ours = response.frame == page.main_frame
            except Exception:  # noqa: BLE001
                return
            if ours and response.request.is_navigation_request():
                documents.append(response)

        page.on("response", on_response)
        try:
            return await super()._get_response_and_download(request, page, spider)
        except PlaywrightTimeoutError:
            if not documents or 300 <= documents[-1].status < 400 or not await _parsed(page):
                raise
            self.stats.inc_value("webfarm/render/load_timeouts")
            host = urlparse_cached(request).netloc
            if host not in self._load_timeout_hosts:
                self._load_timeout_hosts.add(host)
                logger.info("%s: the page's load event did not come within the navigation "
                            "timeout (a script, image or frame that never loads?); the page "
                            "is kept as the browser built it (said once per host)", request.url)
            return documents[-1], None
        finally:
            page.remove_listener("response", on_response)

    async def _create_page(self, request: Request, spider: Spider) -> Page:
        # A render cancelled at its timeout while Playwright opened its page: scrapy-
        # playwright gives the context's page slot back on an Exception, and a
        # CancelledError is none, so the slot was lost for good, and after a few such
        # timeouts the worker's browser rung stood still. The opening now runs to its end
        # and a page opened for a cancelled render is closed, which frees its slot.
        opening = asyncio.ensure_future(super()._create_page(request=request, spider=spider))
        self._openings.add(opening)
        opening.add_done_callback(self._opened_own)
        try:
            page = await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(_close_unwanted)
            raise
        self._render_pages[request] = page
        if (opened := self._opened.get(request)) is not None:
            opened.set()
        return page

    async def _create_browser_context(self, name: str, context_kwargs: dict | None,
                                      spider: Spider | None = None) -> Any:
        wrapper = await super()._create_browser_context(name, context_kwargs, spider)
        # Pages route their own requests first: what reaches this is a popup's (or a
        # service worker's), which nothing checked.
        await wrapper.context.route("**", self._refuse_unrouted)
        wrapper.context.on("page", self._close_popup)
        return wrapper

    async def _refuse_unrouted(self, route: Route) -> None:
        self.stats.inc_value("webfarm/render/popup_requests_refused")
        with contextlib.suppress(Exception):  # the popup may be closed already
            await route.abort()

    def _opened_own(self, opening: asyncio.Future[Page]) -> None:
        """Known as ours before anything awaits the opening (a popup check among them)."""
        self._openings.discard(opening)
        if not opening.cancelled() and opening.exception() is None:
            self._own_pages.add(opening.result())

    async def _browser_disconnected_callback(self) -> None:
        """Chromium gone while the crawl runs (killed, out of memory): said, where
        scrapy-playwright logs it at DEBUG. The renders it held fail and are retried; the
        next render launches it again."""
        if not self._closing:
            self.stats.inc_value("webfarm/render/browser_lost")
            logger.warning("Chromium exited while the crawl ran (killed, or out of memory?): "
                           "the renders it held are retried, and the next render launches "
                           "it again")
        await super()._browser_disconnected_callback()

    async def _close(self) -> None:
        self._closing = True  # the browser's end from here on is ours
        await super()._close()

    async def _close_popup(self, page: Page) -> None:
        """Every new page of the context: a popup is closed. (A page's own "popup" event
        is not sent once that page is closed, which a render does as soon as it has read
        it: the popup stayed open, a renderer process each.) A page of ours is known once
        the openings under way as it appeared have ended; a popup's opener may be closed
        by then, and a guess by time missed some (a popup counted 0 under load)."""
        if self._openings:
            await asyncio.wait(set(self._openings), timeout=self.navigation_timeout or None)
        if page in self._own_pages:
            return
        self.stats.inc_value("webfarm/render/popups")
        logger.debug("Closed a popup a page opened: %s", page.url)
        with contextlib.suppress(Exception):
            await page.close()


async def _parsed(page: Page) -> bool:
    """Whether the page's document was parsed (``DOMContentLoaded``: its own scripts ran)."""
    try:
        state = await asyncio.wait_for(page.evaluate("document.readyState"), 5)
    except Exception:  # closed, crashed, or its script busy
        return False
    return state in ("interactive", "complete")


def _close_unwanted(opening: asyncio.Future[Page]) -> None:
    """Close the page opened for a render cancelled meanwhile (its close frees its slot)."""
    if opening.cancelled() or opening.exception() is not None:
        return
    page = opening.result()
    closing = asyncio.ensure_future(page.close())
    closing.add_done_callback(lambda done: done.cancelled() or done.exception())  # seen
