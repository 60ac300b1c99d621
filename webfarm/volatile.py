"""Volatile fragments: what changes on every fetch of a page without meaning a change.

:func:`webfarm.content.normalise_html` masks what :data:`DEFAULT_VOLATILE_PATTERNS` (and
``WEBFARM_VOLATILE_PATTERNS``) match in a page's normalised text, each match replaced by
``~``: date-times and clock times with seconds, "3 minutes ago", "generated in 0.12 s",
session ids, CSRF tokens and nonces in URLs, cache-buster query values, per-request ids.
Bare dates are kept: a publication date is content. ``WEBFARM_VOLATILE_TIMES = False``
keeps times too (:data:`TIME_PATTERNS`), for sites where they are content.

Python's re costs 1-9 ms per pattern on a 100 KB page, so each built-in pattern has a
gate (a word it cannot match without) and the date-time ones run only on windows around
the page's clock times.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

__all__ = ["DEFAULT_VOLATILE_PATTERNS", "TIME_PATTERNS", "mask_volatile", "volatile_patterns"]

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
    # relative times: "3 minutes ago", "an hour ago", "a few seconds ago"
    (r"\b(?:\d+|an?|one|a\s+few)\s+(?:seconds?|secs?|minutes?|mins?|hours?|hrs?|days?)"
     r"\s+ago\b", "ago"),
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
#: The built-in patterns of times (date-times, clock times with seconds, "3 minutes ago"),
#: left out with ``WEBFARM_VOLATILE_TIMES = False``: on a timetable, a race result or an
#: event page a time is the content, and masked, its change is never stored.
TIME_PATTERNS: tuple[str, ...] = tuple(
    pattern for pattern, gate in _VOLATILE if gate is _CLOCK or gate == "ago")

_PLACEHOLDER = "~"


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


def mask_volatile(text: str, volatile: Sequence[str | re.Pattern[str]]) -> str:
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


def volatile_patterns(extra: Sequence[str] | str | None, times: bool = True
                      ) -> tuple[str, ...]:
    """The built-in patterns (without :data:`TIME_PATTERNS` unless ``times``) plus
    ``WEBFARM_VOLATILE_PATTERNS`` (a list, or one regex per line). Raises ValueError
    naming a pattern that does not compile."""
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
    builtin = DEFAULT_VOLATILE_PATTERNS if times else tuple(
        p for p in DEFAULT_VOLATILE_PATTERNS if p not in TIME_PATTERNS)
    return builtin + added
