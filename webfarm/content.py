"""What counts as the same content: one hash that the dedupe, the blob store and
the refetch policy all agree on.

Why hash normalised text, not the raw body: the raw bytes of most dynamic pages
change on every fetch (a fresh CSRF token, a nonce on an inline script, a
"generated at" comment, a session id in the links) while nothing a reader or an
extractor cares about changed. Hashing raw bytes would make every refetch look
like a change and every copy of a page look unique.

So :func:`normalise_html` keeps what makes a page *this* page:

* the visible text (title included), with whitespace collapsed, so
  re-indentation or minification is no change;
* the link targets (``href`` of ``<a>`` and ``<area>``), inline where they
  occur, because two pages with the same text but different navigation
  targets are different pages (a pager, a "next" link, a product link
  swapped behind the same label) and the crawl follows those links;

and drops what changes without meaning:

* ``<script>``, ``<style>``, ``<template>`` and ``<noscript>`` (JSON blobs,
  nonces, build hashes; ``<noscript>`` holds tracking pixels and "enable
  JavaScript" chrome, and it is not rendered by the browser rung, so dropping
  it keeps HTTP and browser fetches of one page comparable), comments and
  processing instructions, hidden ``<input>`` (CSRF tokens), all markup and
  attributes other than link targets (so ``<meta name=csrf-token>`` and
  cache-busted ``<link>``/``<img>`` URLs do not count);
* what :data:`DEFAULT_VOLATILE_PATTERNS` matches in the remaining text:
  date-times and clock times with seconds, "3 minutes ago", "generated in
  0.12 s", session ids, CSRF tokens and nonces in URLs, cache-buster query
  values, per-request ids. Bare dates are kept: a publication date is content.

Non-HTML bodies (PDF, images, JSON, feeds) are hashed as raw bytes: there is
no safe generic normalisation for them.

:func:`simhash` is for "nearly the same" (a banner added, a counter changed):
64-bit SimHash over word 3-shingles, compared with :func:`hamming`.
"""

from __future__ import annotations

import hashlib
import html
import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache

from lxml import etree
from w3lib.encoding import html_to_unicode, http_content_type_encoding

from webfarm.neardup import hamming, simhash  # the near-duplicate half, kept there

__all__ = [
    "DEFAULT_VOLATILE_PATTERNS",
    "content_hash",
    "fingerprint",
    "hamming",
    "is_html",
    "normalise_html",
    "simhash",
    "volatile_patterns",
]

_VALUE = r"(?P<v>[^?&;#\s<>\"']+)"
_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
_WDAY = r"(?:mon|tue|wed|thu|fri|sat|sun)[a-z]*\.?"

_CLOCK = re.compile(r"\d:\d\d")  # every date-time pattern below needs one
# A date-time match lies within this many characters before / after its clock time, so
# those patterns run on windows around the clock times only, not the whole page.
_CLOCK_BEFORE, _CLOCK_AFTER = 64, 100
_CLOCK_COLONS = 5000  # more colons than this: find clock times with re

_Gate = str | tuple[str, ...] | re.Pattern[str]


def _any_id(*words: str) -> tuple[str, ...]:
    return tuple(f"{w}{sep}id" for w in words for sep in ("", "-", "_", " "))


# (pattern, gate): a pattern runs only if its gate (a str, or any str of a tuple) is in
# the lower-cased text; the _CLOCK gate runs it on windows around clock times instead.
# Python's re costs 1-9 ms per pattern on a 100 KB page; the gates skip most of them on
# pages that cannot match. A gate is tested once, on the text before any masking: a "~"
# put in never makes one.
_VOLATILE: tuple[tuple[str, _Gate], ...] = (
    # ISO 8601 / SQL date-times: 2024-05-01T12:00:03.123+02:00, 2024-05-01 12:00
    (
        r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
        r"(?:\s?(?:Z|UTC|GMT|[+-]\d{2}:?\d{2})\b)?",
        _CLOCK,
    ),
    # HTTP / RFC 2822 / JS Date.toString(): Wed, 01 May 2024 12:00:03 GMT
    (
        rf"\b(?:{_WDAY},?\s+)?(?:\d{{1,2}}\s+{_MONTH}|{_MONTH}\s+\d{{1,2}}),?\s+\d{{4}},?"
        r"\s+\d{1,2}:\d{2}(?::\d{2})?(?:\s?[ap]\.?m\.?)?(?:\s?(?:GMT|UTC)(?:[+-]\d{4})?)?"
        r"(?:\s?\([^)]{0,40}\))?",
        _CLOCK,
    ),
    # numeric date followed by a time: 01/05/2024 12:00 pm, 1.5.2024, 12:00
    (
        r"\b\d{1,4}[/.-]\d{1,2}[/.-]\d{2,4},?\s+\d{1,2}:\d{2}(?::\d{2})?"
        r"(?:\s?[ap]\.?m\.?)?",
        _CLOCK,
    ),
    # a clock time with seconds on its own: 12:00:03, 12:00:03.5
    (r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b", _CLOCK),
    # relative times: "3 minutes ago"
    (r"\b\d+\s+(?:seconds?|secs?|minutes?|mins?|hours?|hrs?|days?)\s+ago\b", "ago"),
    # render timings: "generated in 0.123 seconds"
    (
        r"\b(?:generated|rendered|served|processed|built|took|loaded)\s+in\s+\d+(?:[.,]\d+)?"
        r"\s*(?:ms|msec|milliseconds?|s|secs?|seconds?)\b",
        tuple(f"{verb} in " for verb in (
            "generated", "rendered", "served", "processed", "built", "took", "loaded")),
    ),
    # session ids in URLs (query or ;path parameter) and text
    (
        r"\b(?:jsessionid|phpsessid|sessionid|session_id|sid|aspsessionid\w*|cfid|cftoken)="
        + _VALUE,
        ("sessid", "sessionid", "session_id", "sid=", "cfid=", "cftoken="),
    ),
    # CSRF tokens and nonces in URLs
    (
        r"\b(?:csrf[-_]?token|csrfmiddlewaretoken|_csrf|csrf|xsrf[-_]?token|_token"
        r"|authenticity_token|__requestverificationtoken|_wpnonce|nonce)=" + _VALUE,
        ("token=", "csrf=", "nonce="),
    ),
    # cache-busters
    (
        r"[?&](?:_|cb|cachebust(?:er)?|cache_buster|nocache|rnd|rand|random|timestamp|ts)="
        + _VALUE,
        "=",
    ),
    # Cloudflare email obfuscation: a new random hex per request
    (r"/cdn-cgi/l/email-protection#(?P<v>[0-9a-f]+)", "email-protection"),
    # per-request ids shown on pages: "Request ID: 3f2a...", "Ray ID: 8a1b..."
    (
        r"\b(?:request|trace|correlation|incident|ray)[-_ ]?id\s*[:#=]?\s*"
        r"(?P<v>[0-9a-z][0-9a-z-]{7,})",
        ("request", "trace", "correlation", "incident", *_any_id("ray")),
    ),
)

#: Regexes (strings are compiled case-insensitively) applied in order to the
#: normalised text. A match is replaced by ``~``; if the pattern has a group
#: named ``v``, only that group is replaced (so ``sid=abc`` becomes ``sid=~``).
DEFAULT_VOLATILE_PATTERNS: tuple[str, ...] = tuple(pattern for pattern, _ in _VOLATILE)
_GATES: dict[str, _Gate] = dict(_VOLATILE)

_PLACEHOLDER = "~"
#: Bodies whose :func:`fingerprint` is remembered (about 0.5 KB each), per process.
FINGERPRINT_CACHE = 20_000
_CACHE: OrderedDict[tuple[object, ...], tuple[str, int | None]] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_VOLATILES: dict[tuple[str | re.Pattern[str], ...], tuple[str | re.Pattern[str], ...]] = {}
_DROP_TAGS = frozenset({"script", "style", "noscript", "template"})
_LINK_TAGS = frozenset({"a", "area"})
_HTML_SNIFF = re.compile(rb"<!doctype\s+html|<html[\s>]|<head[\s>]|<body[\s>]", re.IGNORECASE)


@lru_cache(maxsize=32)
def _compile(
    patterns: tuple[str | re.Pattern[str], ...],
) -> tuple[tuple[re.Pattern[str], _Gate | None], ...]:
    return tuple(
        (p, None) if isinstance(p, re.Pattern) else (re.compile(p, re.IGNORECASE), _GATES.get(p))
        for p in patterns
    )


def _replace_group(match: re.Match[str]) -> str:
    start, end = match.span("v")
    if start < 0:
        return match.group(0)
    base = match.start()
    whole = match.group(0)
    return whole[: start - base] + _PLACEHOLDER + whole[end - base :]


def _mask(pattern: re.Pattern[str], text: str) -> str:
    return pattern.sub(_replace_group if "v" in pattern.groupindex else _PLACEHOLDER, text)


def _clocks(text: str) -> list[tuple[int, int]]:
    """Spans of what ``_CLOCK.finditer`` finds (``\\d:\\d\\d``, not overlapping).

    re scans every character (0.43 ms on a 100 KB page); most pages have few colons,
    so looking at each one is cheaper. Many colons (hostile or odd text): re."""
    if text.count(":") > _CLOCK_COLONS:
        return [m.span() for m in _CLOCK.finditer(text)]
    spans: list[tuple[int, int]] = []
    pos = text.find(":", 1)
    while pos >= 0:
        digits = text[pos + 1:pos + 3]
        if len(digits) == 2 and digits.isdecimal() and text[pos - 1].isdecimal():
            spans.append((pos - 1, pos + 3))
            pos = text.find(":", pos + 4)  # the next match starts after this one
        else:
            pos = text.find(":", pos + 1)
    return spans


def _clock_windows(text: str, clocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merged spans around the clock times, widened to spaces (so ``\\b`` at their
    edges means what it means in the whole text)."""
    spans: list[tuple[int, int]] = []
    for clock_start, clock_end in clocks:
        start = text.rfind(" ", 0, max(0, clock_start - _CLOCK_BEFORE)) + 1
        end = text.find(" ", min(len(text), clock_end + _CLOCK_AFTER))
        end = len(text) if end < 0 else end
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(end, spans[-1][1]))
        else:
            spans.append((start, end))
    return spans


def _mask_volatile(text: str, volatile: Sequence[str | re.Pattern[str]]) -> str:
    lowered = text.lower()
    compiled = _compile(tuple(volatile))
    clock = [p for p, gate in compiled if gate is _CLOCK]
    clocks = _clocks(text) if clock else []
    if clocks:  # date-times: near clock times only
        pieces, pos = [], 0
        for start, end in _clock_windows(text, clocks):
            window = text[start:end]
            for pattern in clock:
                window = _mask(pattern, window)
            pieces += [text[pos:start], window]
            pos = end
        text = "".join(pieces) + text[pos:]
    for pattern, gate in compiled:
        if gate is _CLOCK:
            continue
        if isinstance(gate, str) and gate not in lowered:
            continue
        if isinstance(gate, tuple) and not any(g in lowered for g in gate):
            continue
        text = _mask(pattern, text)
    return text


def _decode(body: bytes, encoding: str | None) -> str:
    """BOM, then the given encoding, then <meta charset>, then UTF-8; never raises."""
    header = f"text/html; charset={encoding}" if encoding else None
    try:
        _, text = html_to_unicode(header, body)
    except (LookupError, ValueError):  # pragma: no cover - w3lib guards most of these
        text = body.decode("utf-8", "replace")
    # NUL and lone surrogates upset libxml2 and .encode(); they are never content.
    return text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")


def _pieces_lxml(text: str) -> list[str] | None:
    """Visible text and link targets in document order; None if libxml2 gave up."""
    # etree's parser, not lxml.html's: that one calls a Python class lookup for every
    # element (about 1.5 ms of a 100 KB page), for methods this walk never uses.
    parser = etree.HTMLParser(
        encoding="utf-8", remove_comments=True, remove_pis=True, huge_tree=True
    )
    try:
        root = etree.fromstring(text.encode("utf-8"), parser)
    except (etree.LxmlError, ValueError):
        return None
    if any(e.level_name == "FATAL" for e in parser.error_log):
        return None  # e.g. nesting too deep: the tree would be truncated
    if root is None:
        return []
    pieces: list[str] = []
    walker = etree.iterwalk(root, events=("start", "end"))
    for event, el in walker:
        tag = el.tag if isinstance(el.tag, str) else ""
        if event == "start":
            if tag in _DROP_TAGS or (
                tag == "input" and (el.get("type") or "").strip().lower() == "hidden"
            ):
                walker.skip_subtree()
                continue
            if tag in _LINK_TAGS:
                href = el.get("href")
                if href is not None and href.strip():
                    pieces.append(f"<{href.strip()}>")
            if el.text:
                pieces.append(el.text)
        elif el.tail:
            pieces.append(el.tail)
    return pieces


_RX_DROP = re.compile(
    r"<!--.*?(?:-->|$)|<\?.*?(?:>|$)"
    r"|<(script|style|noscript|template)\b.*?(?:</\1\s*>|$)",
    re.IGNORECASE | re.DOTALL,
)
_RX_TAG = re.compile(r"<(/?)([a-zA-Z][^\s/>]*)([^>]*)>?")
_RX_HREF = re.compile(r"""\bhref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.IGNORECASE)


def _pieces_regex(text: str) -> list[str]:
    """Fallback for documents libxml2 cannot build a whole tree for."""
    text = _RX_DROP.sub(" ", text)
    pieces: list[str] = []
    pos = 0
    for m in _RX_TAG.finditer(text):
        pieces.append(html.unescape(text[pos : m.start()]))
        pos = m.end()
        closing, name, attrs = m.groups()
        if not closing and name.lower() in _LINK_TAGS:
            h = _RX_HREF.search(attrs)
            if h:
                href = html.unescape(next(g for g in h.groups() if g is not None)).strip()
                if href:
                    pieces.append(f"<{href}>")
    pieces.append(html.unescape(text[pos:]))
    return pieces


def normalise_html(
    body: bytes,
    encoding: str | None = None,
    volatile: Sequence[str | re.Pattern[str]] = DEFAULT_VOLATILE_PATTERNS,
) -> str:
    """Visible text and link targets of an HTML body, normalised for hashing.

    ``encoding`` is the HTTP charset if known (a BOM still wins, as in
    browsers); an unknown or wrong one falls back to ``<meta charset>`` and then
    UTF-8 with replacement characters. Broken markup and empty bodies never
    raise: an empty or markup-only body gives ``""``.
    """
    if not body:
        return ""
    text = _decode(body, encoding)
    if not text.strip():
        return ""
    pieces = _pieces_lxml(text)
    if pieces is None:
        pieces = _pieces_regex(text)
    # Every element boundary becomes a space, so indentation never matters. str.split()
    # splits on exactly what re's \s matches, at a third of re.sub's cost on big pages.
    joined = " ".join(" ".join(pieces).split())
    joined = unicodedata.normalize("NFC", joined)
    if volatile:
        masked = _mask_volatile(joined, volatile)
        if masked != joined:  # most pages have nothing volatile: no second pass
            joined = " ".join(masked.split())
    return joined


def is_html(body: bytes, content_type: str | bytes | None = None) -> bool:
    """By media type when there is one; by sniffing the first KiB when there is not."""
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media:
        return "html" in media
    return _HTML_SNIFF.search(body[:1024]) is not None


def content_hash(
    body: bytes,
    content_type: str | bytes | None = None,
    encoding: str | None = None,
    volatile: Sequence[str | re.Pattern[str]] = DEFAULT_VOLATILE_PATTERNS,
) -> str:
    """SHA-256 hex (64 chars) of :func:`normalise_html` for HTML, of the raw bytes otherwise.

    ``encoding`` defaults to the charset in ``content_type``.
    """
    body = body or b""
    if not is_html(body, content_type):
        return hashlib.sha256(body).hexdigest()
    if encoding is None and content_type:
        if isinstance(content_type, bytes):
            content_type = content_type.decode("latin-1")
        encoding = http_content_type_encoding(content_type)
    text = normalise_html(body, encoding, volatile)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fingerprint(
    body: bytes,
    content_type: str | bytes | None = None,
    encoding: str | None = None,
    volatile: Sequence[str | re.Pattern[str]] = DEFAULT_VOLATILE_PATTERNS,
    with_simhash: bool = False,
) -> tuple[str, int | None]:
    """:func:`content_hash` and, if asked, the :func:`simhash` of the same normalised text
    (HTML only; None otherwise), normalising the page once for both.

    A body met before with the same arguments is answered from memory (the last
    :data:`FINGERPRINT_CACHE` bodies, by their SHA-256): mirrors, tracking-parameter
    variants and looping pagination serve the same bytes under many URLs, and
    normalising a 100 KB page takes ms where hashing its bytes takes 0.07 ms."""
    body = body or b""
    raw = hashlib.sha256(body)
    if not is_html(body, content_type):
        return raw.hexdigest(), None
    volatile = tuple(volatile)
    with _CACHE_LOCK:
        # One copy of the patterns for all keys (each call from a helper unpickles its own).
        volatile = _VOLATILES.setdefault(volatile, volatile)
        key = (raw.digest(), content_type, encoding, volatile, with_simhash)
        known = _CACHE.get(key)
        if known is not None:
            _CACHE.move_to_end(key)
            return known
    if encoding is None and content_type:
        if isinstance(content_type, bytes):
            content_type = content_type.decode("latin-1")
        encoding = http_content_type_encoding(content_type)
    text = normalise_html(body, encoding, volatile)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    result = digest, simhash(text) if with_simhash else None
    with _CACHE_LOCK:
        _CACHE[key] = result
        while len(_CACHE) > FINGERPRINT_CACHE:
            _CACHE.popitem(last=False)
        if len(_VOLATILES) > 64:  # only a handful of pattern lists exist in one process
            _VOLATILES.clear()
    return result


def volatile_patterns(extra: Sequence[str] | str | None) -> tuple[str, ...]:
    """The built-in patterns plus ``WEBFARM_VOLATILE_PATTERNS`` (a list, or one regex per
    line). Raises ValueError naming a pattern that does not compile."""
    if isinstance(extra, str):
        extra = [line for line in extra.splitlines() if line.strip()]
    added = tuple(p.strip() for p in extra or () if p and p.strip())
    for pattern in added:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(
                f"WEBFARM_VOLATILE_PATTERNS: {pattern!r} is not a valid regex ({exc}); fix it"
            ) from None
    return DEFAULT_VOLATILE_PATTERNS + added
