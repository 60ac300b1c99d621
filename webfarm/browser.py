"""The browser rung's plumbing: find a system Chromium, launch it lazily, guard its traffic.

Playwright downloads its own browser build, which is not possible everywhere
(air-gapped hosts, this project's CI). :class:`SystemChromiumProvider` plugs
into scrapy-playwright (``PLAYWRIGHT_BROWSER_PROVIDER``) and launches the
Chromium it finds: ``WEBFARM_CHROMIUM`` (a path or a command name), else
``PLAYWRIGHT_LAUNCH_OPTIONS["executable_path"]``, else ``chromium``,
``chromium-browser``, ``google-chrome`` on ``PATH``, else Playwright's own
download if it is there. It also starts the Playwright driver only when the
first page needs a browser, so a crawl that never renders pays nothing for it
(scrapy-playwright would start the driver when the engine starts).

:func:`abort_request` is the ``PLAYWRIGHT_ABORT_REQUEST`` predicate: every
request the browser makes (the navigation, scripts, XHR, images) is checked
against the SSRF guard the render middleware installs (a navigation's redirect
hops, which Playwright's routing does not see, by :func:`check_hops`),
and resource types listed in ``WEBFARM_BROWSER_SKIP_RESOURCES`` (images, fonts,
media by default: a crawler needs the DOM, not the pixels) are not fetched. Nor is
what the worker knows robots.txt disallows (:func:`configure_robots`): a page's script
that navigated to a disallowed path was followed there, and that page stored instead.
A refused navigation of a page's main frame leaves Chromium's error page, which
:func:`navigation_refusal` tells the download handler why.
"""

from __future__ import annotations

import logging
import os
import shutil
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from scrapy_playwright.provider import PlaywrightBrowserProvider

if TYPE_CHECKING:
    from playwright.async_api import Browser, BrowserContext, Page
    from playwright.async_api import Request as PlaywrightRequest

    from webfarm.netguard import NetGuard

logger = logging.getLogger(__name__)

CHROMIUM_ENV = "WEBFARM_CHROMIUM"
WAIT_FOR = "webfarm_wait_for"  # meta: a CSS selector the render waits for (render_check)
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
INSTALL_HINT = ("install one (`make chromium`, or `apt-get install chromium`) or set "
                f"{CHROMIUM_ENV}=/path/to/chromium")


class BrowserNotFound(RuntimeError):
    """No Chromium to launch; the message is one line that says what to do."""


def find_chromium(override: str | None = None, names: Iterable[str] = CHROMIUM_NAMES,
                  path: str | None = None) -> str | None:
    """The Chromium executable to launch, or None.

    ``override`` (normally ``$WEBFARM_CHROMIUM``) wins and must exist: a typo
    there raises :class:`BrowserNotFound` rather than silently using another
    browser.
    """
    if override:
        found = shutil.which(override, path=path) if os.sep not in override else (
            override if os.access(override, os.X_OK) and os.path.isfile(override) else None)
        if found is None:
            raise BrowserNotFound(f"{CHROMIUM_ENV}={override!r} is not an executable file; "
                                  f"fix it or unset it to search PATH for {', '.join(names)}")
        return found
    for name in names:
        found = shutil.which(name, path=path)
        if found:
            return found
    return None


def launch_options(base: dict[str, Any] | None = None, executable: str | None = None
                   ) -> dict[str, Any]:
    """Playwright launch options for ``executable``: ``--no-sandbox`` when running as
    root (Chromium refuses to start as root with its sandbox on)."""
    options = dict(base or {})
    if executable:
        options["executable_path"] = executable
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args = list(options.get("args") or [])
        if "--no-sandbox" not in args:
            args.append("--no-sandbox")
        options["args"] = args
    return options


class SystemChromiumProvider(PlaywrightBrowserProvider):
    """scrapy-playwright's provider, with a system Chromium and a lazy driver start.

    Scrapy builds one download handler per scheme, and scrapy-playwright one
    browser per handler: a crawl over http and https sites would run two
    Chromiums. Providers of one process share the first browser launched.
    """

    _started = False
    _shared: Browser | None = None  # the process's browser, while it is connected

    async def start(self) -> None:
        """Called when the engine starts: do nothing yet (most crawls never render)."""

    async def _ensure_started(self) -> None:
        if not self._started:
            await super().start()
            self._started = True

    def _executable(self) -> str | None:
        override = os.environ.get(CHROMIUM_ENV, "").strip()
        configured = self.config.launch_options.get("executable_path")
        if not override and configured:
            path = str(configured)
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                # Playwright tried it anew for each page, WEBFARM_RETRY_TIMES times each.
                raise BrowserNotFound(f"PLAYWRIGHT_LAUNCH_OPTIONS executable_path={path!r} is "
                                      "not an executable file; fix it, or remove it to search "
                                      f"PATH for {', '.join(CHROMIUM_NAMES)}")
            return path
        found = find_chromium(override or None)
        if found:
            return found
        assert self.browser_type is not None
        bundled = self.browser_type.executable_path  # Playwright's own download, if any
        if bundled and os.path.isfile(bundled):
            return bundled
        raise BrowserNotFound(f"a page needs a browser but no Chromium was found on PATH "
                              f"({', '.join(CHROMIUM_NAMES)}): {INSTALL_HINT}")

    async def launch_browser(self) -> Browser:
        shared = SystemChromiumProvider._shared
        if shared is not None and shared.is_connected():
            return shared
        await self._ensure_started()
        remote = self.config.cdp_url or self.config.connect_url
        if not remote and self.config.browser_type_name == "chromium":
            executable = self._executable()
            self.config.launch_options = launch_options(self.config.launch_options, executable)
            logger.info("Launching Chromium from %s", executable)
        browser = await super().launch_browser()
        SystemChromiumProvider._shared = browser
        return browser

    async def launch_persistent_context(self, context_kwargs: dict) -> BrowserContext:
        await self._ensure_started()
        return await super().launch_persistent_context(context_kwargs)

    async def close(self) -> None:
        if self._started:
            SystemChromiumProvider._shared = None
            await super().close()


# -- what the browser may fetch -------------------------------------------------------------

_guard: NetGuard | None = None
_skip_types: frozenset[str] = frozenset()
_refusals: list[str] = []  # recent refusals, for the render middleware's stats and tests
_robots: Callable[[str], bool] | None = None  # False: robots.txt known to disallow the URL
#: why a page's main-frame navigation was refused (it shows Chromium's error page then)
_navigations: weakref.WeakKeyDictionary[Page, str] = weakref.WeakKeyDictionary()
#: what a page's next main-frame request waits for (:func:`wait_turn`)
_turns: weakref.WeakKeyDictionary[Page, Callable[[], Awaitable[Any]]] = (
    weakref.WeakKeyDictionary())


def configure(guard: NetGuard | None, skip_resources: Iterable[str]) -> None:
    """Install the SSRF guard and the skipped resource types for :func:`abort_request`
    (scrapy-playwright loads the predicate by name, so it cannot get them itself)."""
    global _guard, _skip_types
    _guard = guard
    _skip_types = frozenset(t.strip().lower() for t in skip_resources if t.strip())


def configure_robots(allowed: Callable[[str], bool] | None) -> None:
    """Install the robots.txt check (the robots middleware's rules of the origins this
    worker knows; an origin it does not know is allowed), or None to drop it."""
    global _robots
    _robots = allowed


def wait_turn(page: Page, turn: Callable[[], Awaitable[Any]] | None) -> None:
    """Have ``page``'s next main-frame request await ``turn()`` once it passed every check,
    the last step before it leaves for the host (None: no longer). The frontier spaces
    hand-outs; a render reaches the host a page-open or a browser start later, so its
    host's turn is taken here (``webfarm.signals.render_arrival``)."""
    if turn is None:
        _turns.pop(page, None)
    else:
        _turns[page] = turn


def navigation_refusal(page: Page) -> str | None:
    """Why ``page``'s navigation was refused, once, or None."""
    return _navigations.pop(page, None)


def take_refusals() -> list[str]:
    """Refusals since the last call (and forget them)."""
    taken = list(_refusals)
    _refusals.clear()
    return taken


async def check_hops(urls: Iterable[str]) -> str | None:
    """Why one of ``urls`` (a browser navigation's redirect hops) is refused, or None.

    Playwright's routing does not see redirect hops, so a page that redirects the
    browser to a refused address is caught only here, after the hop was made: its
    content is never stored, but the request happened.
    """
    if _guard is None:
        return None
    for url in dict.fromkeys(urls):
        reason = await _guard.check_url(url)
        if reason is not None:
            logger.warning("SSRF guard: browser redirected to %s: %s", url, reason)
            return f"ssrf: browser redirected to {url[:200]}: {reason}"
    return None


async def abort_request(request: PlaywrightRequest) -> bool:
    """``PLAYWRIGHT_ABORT_REQUEST``: True to stop the browser fetching ``request``."""
    navigation = request.is_navigation_request()
    if request.resource_type in _skip_types and not navigation:
        return True
    kind = "navigation" if navigation else request.resource_type
    if _robots is not None and not _robots(request.url):
        logger.log(logging.INFO if navigation else logging.DEBUG,
                   "robots.txt: browser %s to %s refused", kind, request.url)
        _refused(request, f"robots.txt disallows {request.url[:200]}, where the page's "
                          f"browser {kind} went")
        return True
    reason = None if _guard is None else await _guard.check_url(request.url)
    if reason is not None:
        logger.warning("SSRF guard: browser %s to %s refused: %s", kind, request.url, reason)
        if len(_refusals) < 1000:
            _refusals.append(f"{kind}: {reason}")
        _refused(request, f"ssrf: browser {kind} to {request.url[:200]} refused: {reason}")
        return True
    if navigation:
        turn = _turns.pop(_main_frame_page(request), None) if _turns else None
        if turn is not None:
            await turn()
    return False


def _main_frame_page(request: PlaywrightRequest) -> Page | None:
    try:
        frame = request.frame
        return frame.page if frame.parent_frame is None else None
    except Exception:  # a service worker's request has no frame
        return None


def _refused(request: PlaywrightRequest, why: str) -> None:
    """Keep why a main-frame navigation was refused, for the page's download."""
    if request.is_navigation_request() and (page := _main_frame_page(request)) is not None:
        _navigations[page] = why
