"""robots.txt per RFC 9309: what a fetch outcome means, and the rules it yields.

No I/O here; :mod:`middlewares.robots` fetches, shares and enforces. The rule
table (RFC 9309 section 2.3.1):

========================  ===============================================================
outcome of the fetch      meaning
========================  ===============================================================
2xx                       parse the first :data:`MAX_BYTES` (500 KiB); bytes beyond are
                          ignored, as section 2.5 allows
3xx with Location         follow, at most :data:`MAX_REDIRECTS` (5) in a row, across hosts
                          too; the rules found apply to the *first* origin
more than 5 redirects     "unavailable" (section 2.3.1.2 MAY): allow all
4xx except 429            "unavailable": allow all
429, 5xx, other statuses  "unreachable": disallow all and fetch it again later
network error, timeout    "unreachable" (same)
========================  ===============================================================

429 is a rate limit, not an absent file, so it counts as unreachable (Google does
the same); the RFC names 4xx only as an example of "unavailable".

Lines that are not valid robots.txt are ignored (section 2.2): binary garbage
parses as "no rules" (allow all), invalid UTF-8 is replaced, a BOM is dropped.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from protego import Protego
from scrapy.exceptions import IgnoreRequest
from scrapy.settings import BaseSettings

from webfarm.exceptions import DeadLetter
from webfarm.urls import host_of

logger = logging.getLogger(__name__)

MAX_BYTES = 500 * 1024
MAX_REDIRECTS = 5
#: meta key marking webfarm's own robots.txt requests (the monitor tells them from pages)
META = "webfarm_robots"

Kind = Literal["parse", "redirect", "allow", "unreachable"]
State = Literal["parsed", "allow", "unreachable"]

_TOKEN = re.compile(r"[A-Za-z_-]+")
_placeholder_warned = False


class RobotsDisallowed(IgnoreRequest):
    """robots.txt forbids this URL: a normal end, acknowledged by the frontier (not
    dead-lettered: a user did not lose anything; ``webfarm/robots/disallowed`` counts them)."""


def warn_placeholder_user_agent(settings: BaseSettings) -> None:
    """Log once per process when the crawler would introduce itself with the placeholder."""
    global _placeholder_warned
    agent = settings.get("USER_AGENT") or ""
    placeholder = settings.get("WEBFARM_USER_AGENT_PLACEHOLDER") or "example.invalid"
    if _placeholder_warned or (agent != placeholder and "example.invalid" not in agent):
        return
    _placeholder_warned = True
    what = "is the placeholder" if agent == placeholder else (
        "gives the placeholder's contact URL (example.invalid, a name that never resolves)")
    logger.warning(
        "USER_AGENT %r %s: set WEBFARM_USER_AGENT to your crawler's name and a contact URL "
        "a site's operator can reach, e.g. WEBFARM_USER_AGENT='acmebot/1.0 "
        "(+https://acme.example/bot)'", agent, what,
    )


def robots_agent(settings: BaseSettings) -> str:
    """The product token robots.txt groups are matched against."""
    explicit = (settings.get("WEBFARM_ROBOTS_AGENT") or settings.get("ROBOTSTXT_USER_AGENT")
                or "").strip()
    return product_token(explicit or settings.get("USER_AGENT") or "")


def classify(status: int) -> Kind:
    """What an HTTP status of a robots.txt fetch means (see the module's table)."""
    if 200 <= status < 300:
        return "parse"
    if 300 <= status < 400:
        return "redirect"
    if 400 <= status < 500 and status != 429:
        return "allow"
    return "unreachable"


def product_token(user_agent: str, default: str = "webfarm") -> str:
    """The RFC 9309 product token of a User-Agent: ``webfarm/0.1 (+https://…)`` -> ``webfarm``.

    Only ``[A-Za-z_-]`` may appear in a token (section 2.2.1), so matching stops at the
    first other character.
    """
    match = _TOKEN.match(user_agent.strip())
    return match.group(0).lower() if match else default


def origin_of(url: str) -> str:
    """``scheme://host[:port]``: a robots.txt speaks for one scheme, host and port."""
    return f"{urlsplit(url).scheme.lower()}://{host_of(url)}"


def robots_text(body: bytes) -> tuple[str, bool]:
    """The text to parse from a body, and whether it was cut at :data:`MAX_BYTES`."""
    truncated = len(body) > MAX_BYTES
    data = body[:MAX_BYTES]
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return data.decode("utf-8", "replace").replace("\x00", ""), truncated


def sane_delay(value: float | None) -> float | None:
    """A Crawl-delay worth obeying: finite and > 0, else None."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


@dataclass(frozen=True)
class RobotsRules:
    """What one origin's robots.txt allows. ``parser`` None means allow (or disallow) all."""

    allow_all: bool
    parser: Protego | None = field(default=None, compare=False)
    note: str = ""

    @classmethod
    def parse(cls, body: bytes) -> RobotsRules:
        text, truncated = robots_text(body)
        note = f"cut at {MAX_BYTES} bytes" if truncated else ""
        try:
            parser = Protego.parse(text)
        except Exception as exc:  # a parser bug must not stop the crawl; invalid lines are ignored
            logger.warning("robots.txt could not be parsed (%s: %s); treated as having no "
                           "rules", type(exc).__name__, exc)
            return cls(allow_all=True, note="unparseable")
        return cls(allow_all=False, parser=parser, note=note)

    def allowed(self, url: str, agent: str) -> bool:
        if self.parser is None:
            return self.allow_all
        try:
            return bool(self.parser.can_fetch(url, agent))
        except Exception:  # a URL Protego chokes on: robots.txt cannot speak for it
            logger.debug("robots.txt matching failed for %s", url, exc_info=True)
            return True

    def crawl_delay(self, agent: str) -> float | None:
        if self.parser is None:
            return None
        try:
            return sane_delay(self.parser.crawl_delay(agent))
        except Exception:
            return None


ALLOW_ALL = RobotsRules(allow_all=True)
DISALLOW_ALL = RobotsRules(allow_all=False)


@dataclass
class Record:
    """One origin's robots.txt as shared in Redis: plain fields and the raw text, never
    anything executable. Times are epoch seconds.

    ``state`` is the last fetch's outcome; ``good``/``body``/``good_at`` keep the last
    usable copy ("parsed" with its text, or "allow"), so an unreachable robots.txt can
    fall back on it (RFC 9309 section 2.4). ``since`` is when the current outage began.
    """

    state: State
    expires: float
    fetched: float
    status: int = 0
    error: str = ""
    good: str = ""
    body: bytes = b""
    good_at: float = 0.0
    since: float = 0.0
    absent: bool = False  # unreachable: the host did not answer at all (refused, no name)

    def to_mapping(self) -> dict[str, bytes | str]:
        return {
            "state": self.state, "expires": repr(self.expires), "fetched": repr(self.fetched),
            "status": str(self.status), "error": self.error[:500], "good": self.good,
            "body": self.body[:MAX_BYTES], "good_at": repr(self.good_at),
            "since": repr(self.since), "absent": "1" if self.absent else "",
        }

    @classmethod
    def from_mapping(cls, raw: dict[bytes, bytes]) -> Record | None:
        """A record from a Redis hash; None for anything that is not one of ours."""
        def text(name: str) -> str:
            return raw.get(name.encode(), b"").decode("utf-8", "replace")

        def number(name: str) -> float:
            value = float(text(name) or 0)
            if not math.isfinite(value):
                raise ValueError(name)
            return value

        state = text("state")
        if state not in ("parsed", "allow", "unreachable"):
            return None
        try:
            return cls(state=state, expires=number("expires"),  # type: ignore[arg-type]
                       fetched=number("fetched"), status=int(number("status")),
                       error=text("error"), good=text("good"),
                       body=raw.get(b"body", b"")[:MAX_BYTES], good_at=number("good_at"),
                       since=number("since"), absent=text("absent") == "1")
        except ValueError:
            return None


@dataclass
class Fetched:
    """The outcome of fetching one robots.txt (redirects followed)."""

    kind: str  # "parse", "allow", "unreachable", "refused" (a middleware dead-lettered it)
    status: int = 0
    body: bytes = b""
    error: str = ""
    retry_after: float | None = None
    dead: DeadLetter | None = None  # with "refused": what to dead-letter the pages with
    #: "allow" from an answer that may be a proxy's, not the site's: kept as long as an
    #: unreachable file, not a day
    brief: bool = False
    absent: bool = False  # "unreachable": the host refused the connection or has no name


def next_record(fetched: Fetched, previous: Record | None, now: float, fresh_for: float,
                retry_in: float) -> Record:
    """The shared record after a fetch. An unreachable file keeps the last good copy and
    the start of the outage; it is tried again in ``retry_in`` seconds."""
    if fetched.kind == "parse":
        return Record("parsed", now + fresh_for, now, fetched.status, good="parsed",
                      body=fetched.body[:MAX_BYTES], good_at=now)
    if fetched.kind == "allow":
        return Record("allow", now + (retry_in if fetched.brief else fresh_for), now,
                      fetched.status, error=fetched.error, good="allow", good_at=now)
    prev = previous or Record("unreachable", 0.0, 0.0)
    since = prev.since if prev.state == "unreachable" and prev.since else now
    if fetched.absent:  # its pages spend their attempts at this pace (see the middleware)
        retry_in = min(retry_in, ABSENT_RETRY)
    return Record("unreachable", now + retry_in, now, fetched.status, error=fetched.error,
                  good=prev.good, body=prev.body, good_at=prev.good_at, since=since,
                  absent=fetched.absent)


#: seconds between robots.txt tries of a host that does not answer at all: its pages are
#: retried (an attempt each) at this pace, then dead-lettered
ABSENT_RETRY = 30.0

Verdict = Literal["parsed", "allow", "stale", "outage-allow", "unreachable"]


def verdict(record: Record, now: float, keep_for: float, outage_allow: float) -> Verdict:
    """How to treat requests under ``record``.

    ``stale``: unreachable now, but a good copy younger than ``keep_for`` is used (RFC
    9309 2.4); ``outage-allow``: unreachable with no copy for ``outage_allow`` seconds
    (> 0), so "unavailable" (2.3.1.4 MAY); ``unreachable``: disallow all for now.
    """
    if record.state != "unreachable":
        return record.state
    if record.good and record.good_at + keep_for > now:
        return "stale"
    if outage_allow > 0 and now - record.since >= outage_allow:
        return "outage-allow"
    return "unreachable"
