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
* the link targets (``href`` of ``<a>`` and ``<area>``, without the tracking and
  session parameters the frontier drops from URLs: ``utm_*``, ``gclid``, ``fbclid``, …),
  inline where they occur, because two pages with the same text but different navigation
  targets are different pages (a pager, a "next" link, a product link
  swapped behind the same label) and the crawl follows those links;
* JSON-LD (``<script type="application/ld+json">``): structured data written
  for machines, which extractors read first (a product's price, its
  availability); a change there is a change even where the visible text kept
  its words;
* the other structured data, for the same reason (:func:`_machine_value`): a
  microdata or RDFa property's value held in an attribute (``<meta
  itemprop=price content=…>``, ``<link itemprop=availability href=…>``, an
  ``<img itemprop=image src=…>``, a ``<time datetime=…>``), and ``<meta>``
  data: OpenGraph and Twitter cards, ``description``, ``keywords``,
  ``author``, citation and Dublin Core fields. Before, two product pages that
  differed only there were one content, and a re-parse of the second read the
  first one's body (even another host's);

and drops what changes without meaning:

* other ``<script>``, ``<style>``, ``<template>`` and ``<noscript>`` (JSON blobs,
  nonces, build hashes; ``<noscript>`` holds tracking pixels and "enable
  JavaScript" chrome, and it is not rendered by the browser rung, so dropping
  it keeps HTTP and browser fetches of one page comparable), comments and
  processing instructions, hidden ``<input>`` (CSRF tokens), all markup and
  attributes other than those above (so ``<meta name=csrf-token>``, ``data-*``
  attributes and cache-busted ``<link>``/``<img>`` URLs do not count);
* what :data:`DEFAULT_VOLATILE_PATTERNS` matches in the remaining text:
  date-times and clock times with seconds, "3 minutes ago", "generated in
  0.12 s", session ids, CSRF tokens and nonces in URLs, cache-buster query
  values, per-request ids. Bare dates are kept: a publication date is content.
  (The patterns and their masking: :mod:`webfarm.volatile`.)

An HTML page with no visible text and no links (a script-only shell the
browser did not fill, a page of images) is hashed on its whole markup instead,
whitespace collapsed and volatile fragments masked: by the rule above all such
pages would share the empty hash, and a re-parse of one would read another's body
(the first stored, often an empty page). Such a page gets no SimHash.

Non-HTML bodies (PDF, images, JSON, feeds) are hashed as raw bytes: there is
no safe generic normalisation for them.

:func:`simhash` is for "nearly the same" (a banner added, a counter changed):
64-bit SimHash over word 3-shingles, compared with :func:`hamming`.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Sequence

from lxml import etree
from w3lib.encoding import html_to_unicode, http_content_type_encoding

from webfarm.neardup import hamming, simhash  # the near-duplicate half, kept there
from webfarm.urls import strip_tracking
from webfarm.volatile import DEFAULT_VOLATILE_PATTERNS, mask_volatile, volatile_patterns

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

#: Bodies whose :func:`fingerprint` is remembered (about 0.5 KB each), per process.
FINGERPRINT_CACHE = 20_000
_CACHE: OrderedDict[tuple[object, ...], tuple[str, int | None]] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_VOLATILES: dict[tuple[str | re.Pattern[str], ...], tuple[str | re.Pattern[str], ...]] = {}
_DROP_TAGS = frozenset({"script", "style", "noscript", "template"})
_LINK_TAGS = frozenset({"a", "area"})
#: where a microdata/RDFa property without ``content`` keeps its value (HTML's microdata
#: rules); other elements' value is their text, which is kept anyway
_PROPERTY_ATTR = {"audio": "src", "embed": "src", "iframe": "src", "img": "src",
                  "source": "src", "track": "src", "video": "src", "a": "href", "area": "href",
                  "link": "href", "object": "data", "data": "value", "meter": "value",
                  "time": "datetime"}
#: ``<meta name=…>`` that carry a page's data (others: viewport, csrf-token, generator, …)
_META_NAMES = frozenset({"description", "keywords", "author", "title"})
_META_PREFIXES = ("og:", "twitter:", "article:", "product:", "book:", "profile:", "music:",
                  "video:", "citation_", "dc.", "dcterms.")
_HTML_SNIFF = re.compile(rb"<!doctype\s+html|<html[\s>]|<head[\s>]|<body[\s>]", re.IGNORECASE)


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
    props = "itemprop" in text or "property" in text  # else no element's attributes are read
    walker = etree.iterwalk(root, events=("start", "end"))
    for event, el in walker:
        tag = el.tag if isinstance(el.tag, str) else ""
        if event == "start":
            if tag in _DROP_TAGS or (
                tag == "input" and (el.get("type") or "").strip().lower() == "hidden"
            ):
                if tag == "script" and el.text and _is_json_ld(el.get("type")):
                    pieces.append(_json_ld(el.text))
                walker.skip_subtree()
                continue
            if tag in _LINK_TAGS:
                href = el.get("href")
                if href is not None and href.strip():
                    pieces.append(f"<{strip_tracking(href.strip())}>")
            if tag == "meta" or (props and (el.get("itemprop") or el.get("property"))):
                value = _machine_value(tag, el.get)
                if value:
                    pieces.append(value)
            if el.text:
                pieces.append(el.text)
        elif el.tail:
            pieces.append(el.tail)
    return pieces


_RX_DROP = re.compile(
    r"<!--.*?(?:-->|$)|<\?.*?(?:>|$)"
    r"|<(script|style|noscript|template)\b([^>]*)>?(.*?)(?:</\1\s*>|$)",
    re.IGNORECASE | re.DOTALL,
)
_RX_TYPE = re.compile(r"""\btype\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.IGNORECASE)


def _machine_value(tag: str, get: Callable[[str], str | None]) -> str | None:
    """``[property=value]`` for an element's structured data held in an attribute, or
    None: a microdata (``itemprop``) or RDFa (``property``) value, or a data ``<meta>``."""
    prop = get("itemprop") or get("property")
    if prop and prop.strip():
        value = get("content")
        if value is None and tag in _PROPERTY_ATTR:
            value = get(_PROPERTY_ATTR[tag])
    elif tag == "meta":
        prop = get("name")
        if not prop:
            return None
        low = prop.strip().lower()
        if low not in _META_NAMES and not low.startswith(_META_PREFIXES):
            return None
        value = get("content")
    else:
        return None
    if value is None or not value.strip():
        return None
    return f"[{prop.strip()}={value.strip()}]"


def _is_json_ld(media: str | None) -> bool:
    return (media or "").strip().lower() == "application/ld+json"


def _dropped(match: re.Match[str]) -> str:
    """A comment, a PI or a script-like element: a space, or a JSON-LD script's text."""
    tag, attrs, inner = match.group(1, 2, 3)
    if tag and tag.lower() == "script" and attrs:
        media = _RX_TYPE.search(attrs)
        if media and _is_json_ld(next(g for g in media.groups() if g is not None)):
            return f" {_json_ld(inner)} "
    return " "


def _json_ld(text: str) -> str:
    """JSON-LD in one spelling (keys sorted, no spaces), so a re-indented or reordered
    block is no change; as it is when it does not parse."""
    try:
        return json.dumps(json.loads(text), sort_keys=True, ensure_ascii=False,
                          separators=(",", ":"))
    except (ValueError, RecursionError):
        return text
_RX_TAG = re.compile(r"<(/?)([a-zA-Z][^\s/>]*)([^>]*)>?")
_RX_HREF = re.compile(r"""\bhref\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.IGNORECASE)
_RX_ATTR = re.compile(r"""([^\s=/>"']+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""")


def _pieces_regex(text: str) -> list[str]:
    """Fallback for documents libxml2 cannot build a whole tree for."""
    text = _RX_DROP.sub(_dropped, text)
    pieces: list[str] = []
    pos = 0
    for m in _RX_TAG.finditer(text):
        pieces.append(html.unescape(text[pos : m.start()]))
        pos = m.end()
        closing, name, attrs = m.groups()
        if closing:
            continue
        tag = name.lower()
        if tag in _LINK_TAGS:
            h = _RX_HREF.search(attrs)
            if h:
                href = html.unescape(next(g for g in h.groups() if g is not None)).strip()
                if href:
                    pieces.append(f"<{strip_tracking(href)}>")
        if tag == "meta" or "prop" in attrs.lower():
            found: dict[str, str] = {}
            for a in _RX_ATTR.finditer(attrs):
                found.setdefault(a.group(1).lower(), html.unescape(
                    next((g for g in a.group(2, 3, 4) if g is not None), "")))
            value = _machine_value(tag, found.get)
            if value:
                pieces.append(value)
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
        masked = mask_volatile(joined, volatile)
        if masked != joined:  # most pages have nothing volatile: no second pass
            joined = " ".join(masked.split())
    return joined


_TAG_GAP = re.compile(r">\s+<")  # indentation between tags


def _markup_only(
    body: bytes, encoding: str | None, volatile: Sequence[str | re.Pattern[str]]
) -> str:
    """What a page with no visible text and no links is hashed on: its whole markup,
    whitespace between tags dropped, the rest collapsed, volatile fragments masked;
    ``""`` for a blank body. The NUL in front keeps it apart from any visible text
    (``_decode`` drops NULs)."""
    joined = " ".join(_TAG_GAP.sub("><", _decode(body, encoding)).split())
    if not joined:
        return ""
    if volatile:
        joined = mask_volatile(joined, volatile)
    return "\x00markup " + unicodedata.normalize("NFC", joined)


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
    """SHA-256 hex (64 chars) of :func:`normalise_html` for HTML (of the markup when
    that is empty), of the raw bytes otherwise.

    ``encoding`` defaults to the charset in ``content_type``.
    """
    body = body or b""
    if not is_html(body, content_type):
        return hashlib.sha256(body).hexdigest()
    return _html_fingerprint(body, content_type, encoding, volatile, False)[0]


def _html_fingerprint(
    body: bytes, content_type: str | bytes | None, encoding: str | None,
    volatile: Sequence[str | re.Pattern[str]], with_simhash: bool,
) -> tuple[str, int | None]:
    """The hash (and SimHash) of an HTML body, computed: :func:`content_hash`'s and
    :func:`fingerprint`'s one rule."""
    if encoding is None and content_type:
        if isinstance(content_type, bytes):
            content_type = content_type.decode("latin-1")
        encoding = http_content_type_encoding(content_type)
    text = normalise_html(body, encoding, volatile)
    if text:
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        return digest, simhash(text) if with_simhash else None
    # nothing visible: the markup, and nothing to compare for "nearly the same"
    markup = _markup_only(body, encoding, volatile)
    return hashlib.sha256(markup.encode("utf-8")).hexdigest(), None


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
    result = _html_fingerprint(body, content_type, encoding, volatile, with_simhash)
    with _CACHE_LOCK:
        _CACHE[key] = result
        while len(_CACHE) > FINGERPRINT_CACHE:
            _CACHE.popitem(last=False)
        if len(_VOLATILES) > 64:  # only a handful of pattern lists exist in one process
            _VOLATILES.clear()
    return result
