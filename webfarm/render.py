"""HTTP first, browser when needed: which rung fetches a page, and what each host needed.

The pure half of :mod:`middlewares.render`. A browser fetch costs tens of times
the time and memory of a plain HTTP fetch, so in ``auto`` mode every page is
fetched over HTTP first and only escalated when :func:`needs_js` says the
plain response is not the page a user sees. What a host needed is kept in
Redis (:class:`webfarm.rendermemory.HostMemory`), shared by every worker and expiring, so a host
that renders everything in JavaScript is sent straight to the browser after
its first pages, while a host where only a few pages need it stays on HTTP.

Modes: ``http`` (never a browser), ``browser`` (always), ``auto`` (as above),
``api`` (the external fetch API, :mod:`webfarm.fetchapi`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

from scrapy.http import Response, TextResponse

from webfarm.links import has_anchors
from webfarm.urls import host_of, scope_host

logger = logging.getLogger(__name__)

MODES = ("http", "browser", "auto", "api")
# Elements single-page-app frameworks mount into; empty in the HTML means "rendered later".
APP_ROOT_IDS = ("root", "app", "__next", "__nuxt", "___gatsby", "svelte", "main-app")
_APP_ROOTS = " or ".join(f"@id='{i}'" for i in APP_ROOT_IDS)
_EMPTY_ROOT_XPATH = f"//body//*[({_APP_ROOTS}) and not(*) and normalize-space()='']/@id"
# Scripts that run (not JSON-LD or templates).
_CODE_XPATH = ("//script[not(@type) or normalize-space(@type)='' or @type='module'"
               " or contains(translate(@type, 'JAVASCRIPT', 'javascript'), 'javascript')]")
_NOSCRIPT_JS = re.compile(
    r"(enable|turn on|activate|allow|requires?|need|needs|switch on)\W+(\w+\W+){0,3}?javascript"
    r"|javascript\W+(is\W+|must be\W+)?(required|disabled|needed|turned off|enabled)",
    re.IGNORECASE,
)
RenderCheck = str | Callable[[Response], bool] | None


class RenderConfigError(ValueError):
    """A render setting or spider attribute is wrong; one line that says what to do."""


def parse_mode(value: Any, source: str) -> str:
    mode = str(value or "").strip().lower()
    if mode not in MODES:
        raise RenderConfigError(f"{source}={value!r} is not a render mode; use one of "
                                f"{', '.join(MODES)}")
    return mode


def parse_host_modes(value: Any, source: str = "WEBFARM_RENDER_HOSTS") -> dict[str, str]:
    """``{"host[:port]": mode}`` from a dict, JSON, or ``host=mode,host=mode``."""
    if not value:
        return {}
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise RenderConfigError(f"{source} is not valid JSON: {exc}") from None
        else:
            pairs = {}
            for part in filter(None, (p.strip() for p in text.split(","))):
                host, sep, mode = part.partition("=")
                if not sep or not host.strip():
                    raise RenderConfigError(f"{source}: {part!r} is not host=mode "
                                            f"(e.g. shop.example=browser)")
                pairs[host.strip()] = mode
            value = pairs
    if not isinstance(value, Mapping):
        raise RenderConfigError(f"{source} must map host to mode, got {type(value).__name__}")
    return {host_key(h, source): parse_mode(m, f"{source}[{h!r}]") for h, m in value.items()}


def host_key(value: Any, source: str = "WEBFARM_RENDER_HOSTS") -> str:
    """``host``, ``host:port`` or a URL (its host), spelled as :func:`host_of` spells the
    hosts rules are matched on: ``Bücher.de`` as given never matched a page."""
    text = str(value).strip()
    try:
        return scope_host(host_of(text) if "://" in text else text)
    except ValueError as exc:
        raise RenderConfigError(f"{source}: {exc}") from None


def mode_for_host(host_modes: Mapping[str, str], host: str) -> str | None:
    """The mode configured for ``host`` ("host:port"), its bare name, or a parent domain."""
    if not host_modes:
        return None
    host = host.lower()
    if host in host_modes:
        return host_modes[host]
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    while name:
        if name in host_modes:
            return host_modes[name]
        name = name.partition(".")[2]
    return None


def check_render_check(check: Any, source: str) -> RenderCheck:
    if check is None or callable(check):
        return check
    if isinstance(check, str) and check.strip():
        from parsel import Selector

        try:
            Selector(text="<html></html>").css(check)
        except Exception as exc:  # noqa: BLE001 - cssselect raises several types
            raise RenderConfigError(f"{source}={check!r} is not a CSS selector: {exc}") from None
        return check.strip()
    raise RenderConfigError(f"{source} must be a CSS selector or a callable(response) -> bool, "
                            f"got {check!r}")


PLAYWRIGHT_HANDLER = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"


def has_browser_handler(settings: Any) -> bool:
    """Whether ``DOWNLOAD_HANDLERS`` send http(s) through scrapy-playwright (or a subclass)."""
    from scrapy.utils.misc import load_object

    path = settings.getwithbase("DOWNLOAD_HANDLERS").get("http")
    try:
        cls = load_object(path) if isinstance(path, str) else path
        return bool(cls) and issubclass(cls, load_object(PLAYWRIGHT_HANDLER))
    except (ImportError, TypeError, ValueError):
        return False


def check_contexts(settings: Any) -> None:
    """scrapy-playwright never closes a context, and the proxy middleware opens one per
    proxy: with fewer allowed than proxies, browser requests would wait for ever."""
    limit = settings.getint("PLAYWRIGHT_MAX_CONTEXTS") or 0
    if not limit:
        return
    try:
        from webfarm.proxyconfig import proxies_from_settings

        proxies = len(proxies_from_settings(settings))
    except Exception:  # noqa: BLE001 - the proxy middleware reports its own errors
        return
    if proxies + 1 > limit:
        logger.warning("PLAYWRIGHT_MAX_CONTEXTS=%d is less than one browser context per "
                       "proxy (%d) plus one: raise it, or browser pages will stall",
                       limit, proxies)


def check_render_arguments(spargs: Mapping[str, Any]) -> None:
    """Validate ``-a render=`` and ``-a render_check=`` before a crawl starts."""
    if spargs.get("render"):
        parse_mode(spargs["render"], "-a render")
    if spargs.get("render_check"):
        check_render_check(spargs["render_check"], "-a render_check")


def visible_text_length(response: TextResponse) -> int:
    """Characters of the body's text outside scripts, styles, ``<noscript>`` and templates,
    whitespace collapsed.

    One walk of the tree. The XPath it replaces (``//body//text()[not(ancestor::script
    or …)]``) took time growing with the square of the page: 2.3 s for a 1 MB page of
    20,000 paragraphs, minutes for a 31 MB one, a probe's worker frozen meanwhile (no log
    line, no Ctrl-C). And lxml's tree, not ``response.xpath()``: parsel wraps every text
    node in a Selector (4.7 of the 5.5 ms needs_js() took on a 100 KB page)."""
    root = response.selector.root
    parts: list[str] = []
    for body in root.iter("body"):
        _visible_text(body, parts)
        break
    return len(" ".join(" ".join(parts).split()))


_HIDDEN_TEXT = frozenset({"script", "style", "noscript", "template"})


def _visible_text(body: Any, parts: list[str]) -> None:
    """Append the text of ``body``'s elements, depth first, skipping hidden subtrees; an
    element's tail is its parent's text, so a skipped element's tail is kept."""
    stack = [body]
    while stack:
        element = stack.pop()
        if element is not body and element.tail:
            parts.append(element.tail)  # pushed in reverse: order does not change a length
        if not isinstance(element.tag, str) or element.tag in _HIDDEN_TEXT:
            continue  # a comment's or a processing instruction's text is no text
        if element.text:
            parts.append(element.text)
        stack.extend(element)


def judgeable(response: Response) -> bool:
    """Only a successful HTML page can tell whether it needed JavaScript."""
    if response.status != 200 or not has_anchors(response):
        return False
    content_type = response.headers.get(b"Content-Type", b"").decode("latin-1").lower()
    return "html" in content_type or not content_type


EMPTY_ROOT = "empty app root"  # the sign's reason, as escalated pages carry it


def empty_root_of(reason: object) -> str | None:
    """The id of the empty app root a page was escalated for (``"empty app root #app"``),
    else None."""
    text = str(reason or "")
    if not text.startswith(EMPTY_ROOT + " #"):
        return None
    root = text[len(EMPTY_ROOT) + 2:]
    return root if root in APP_ROOT_IDS else None


def needs_js(response: Response, check: RenderCheck = None, min_text: int = 50,
             rendered: bool = False, root_misleads: bool = False) -> str | None:
    """Why ``response`` (a plain HTTP fetch) is not the page a browser would show, or None.

    A spider's ``check`` (a CSS selector the page must match, or a callable that
    says whether the page is complete) replaces the built-in signs, which are:
    an empty app root (``<div id="app"></div>``), a ``<noscript>`` asking for
    JavaScript on a page with little text, and almost no visible text on a page
    that has scripts. Only successful HTML pages are judged. ``rendered``: the
    page came from a browser, which leaves ``<noscript>`` in the DOM. ``root_misleads``:
    the browser added nothing to a page of this host with an empty app root (a widget's
    mount point beside server-rendered text), so an empty root on a page with plenty of
    text (five times ``min_text``) is no sign here.
    """
    if not judgeable(response):
        return None
    assert isinstance(response, TextResponse)
    if check is not None:
        if isinstance(check, str):
            return None if response.css(check) else f"render_check {check!r} not found"
        return None if check(response) else "render_check() is false"
    empty_root = response.xpath(_EMPTY_ROOT_XPATH).get()
    if empty_root and not (root_misleads and visible_text_length(response) >= 5 * min_text):
        return f"{EMPTY_ROOT} #{empty_root}"
    text = visible_text_length(response)
    if text < 5 * min_text and not rendered:
        noscript = " ".join(response.xpath("//noscript//text()").getall())
        if _NOSCRIPT_JS.search(noscript):
            return "noscript asks for JavaScript"
    if text < min_text and response.xpath(_CODE_XPATH).get() is not None:
        return f"almost no visible text ({text} characters)"
    return None


def rendering_helped(rendered: Response, check: RenderCheck, http_text: int) -> bool:
    """Did the browser give more than the HTTP fetch had? With a spider's check: does the
    rendered page pass it; otherwise: does it show more visible text."""
    if not judgeable(rendered):
        return True  # nothing to judge (an error page, a download): not the ladder's call
    if check is not None:
        return needs_js(rendered, check, rendered=True) is None
    assert isinstance(rendered, TextResponse)
    return visible_text_length(rendered) > http_text
