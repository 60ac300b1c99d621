"""What counts as the same URL, the same request and the same host.

Every stage keys on these functions: the frontier's dupefilter (request
fingerprints), the index (`pages._id` is :func:`url_fingerprint`) and
politeness (:func:`host_of`). They must agree, so they all start from one
:func:`canonical_url`.

Canonicalisation is :func:`w3lib.url.canonicalize_url` (query sorted, fragment
dropped, percent-encoding normalised, host lower-cased, IDN to punycode) plus
what it leaves alone but crawls need:

* the default port is dropped (``http://h:80/`` is ``http://h/``);
* tracking and session parameters are dropped from the query, and session
  path parameters (``/cart;jsessionid=...``) from the path, because they make
  one page look like millions and do not change what the server returns.

Parameter patterns (:data:`DEFAULT_TRACKING_PARAMS`, or the
``WEBFARM_STRIP_PARAMS`` setting) match parameter names case-insensitively. A
pattern ending in ``*`` or ``_`` is a prefix: ``utm_`` matches ``utm_source``,
``aspsessionid*`` matches ``ASPSESSIONIDQSCTRBDA``; any other pattern must
match the whole name. A pattern ending in ``=token`` drops the parameter only
when its value looks like a session token (16 or more letters, digits, ``-``
or ``_``), as Heritrix does for ``sid``: ``sid=token`` is a default, since on
some sites ``sid`` is a session and on others an article's id (PHP-Nuke's
``article.php?sid=2``, whose articles were all one URL while ``sid`` was dropped
whatever its value). ``ref`` is deliberately not a default: on many sites it
selects content (a referral programme, a git ref).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit
from weakref import WeakKeyDictionary

from w3lib.url import canonicalize_url

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler

__all__ = [
    "DEFAULT_TRACKING_PARAMS",
    "RequestFingerprinter",
    "canonical_url",
    "host_of",
    "request_fingerprint",
    "unfetchable",
    "url_fingerprint",
]

DEFAULT_TRACKING_PARAMS: tuple[str, ...] = (
    # analytics and ad-click identifiers
    "utm_",
    "gclid",
    "gclsrc",
    "dclid",
    "gbraid",
    "wbraid",
    "fbclid",
    "msclkid",
    "yclid",
    "twclid",
    "ttclid",
    "igshid",
    "mc_cid",
    "mc_eid",
    "_ga",
    "_gl",
    "_hsenc",
    "_hsmi",
    "mkt_tok",
    # session ids (query or ;path parameters)
    "jsessionid",
    "phpsessid",
    "sid=token",  # only a token: on some sites it is an article's id
    "sessionid",
    "aspsessionid*",
)

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}


_TOKEN_SUFFIX = "=token"
_TOKEN = re.compile(r"[0-9A-Za-z_-]{16,}")  # what a session id looks like


class _Matcher:
    """Name patterns compiled: those always dropped, and those dropped for a token only."""

    def __init__(self, always: re.Pattern[str] | None, tokens: re.Pattern[str] | None
                 ) -> None:
        self.always = always
        self.tokens = tokens

    def drops(self, param: str) -> bool:
        """Whether the encoded ``name=value`` is dropped."""
        encoded_name, _, value = param.partition("=")
        name = unquote(encoded_name.replace("+", " "))
        if self.always is not None and self.always.fullmatch(name) is not None:
            return True
        return (self.tokens is not None and self.tokens.fullmatch(name) is not None
                and _TOKEN.fullmatch(unquote(value)) is not None)


def _alternatives(patterns: list[str]) -> re.Pattern[str] | None:
    """One case-insensitive full-match regex of name patterns (``*``, ``_``: prefixes)."""
    alternatives = []
    for pattern in patterns:
        if pattern.endswith("*"):
            alternatives.append(re.escape(pattern[:-1]) + ".*")
        elif pattern.endswith("_"):
            alternatives.append(re.escape(pattern) + ".*")
        else:
            alternatives.append(re.escape(pattern))
    if not alternatives:
        return None
    return re.compile("(?:" + "|".join(alternatives) + ")", re.IGNORECASE | re.DOTALL)


@lru_cache(maxsize=64)
def _matcher(patterns: tuple[str, ...]) -> _Matcher | None:
    """Compile the parameter patterns; None when there are none."""
    names = [p.strip() for p in patterns if p.strip()]
    tokens = [p[: -len(_TOKEN_SUFFIX)] for p in names if p.lower().endswith(_TOKEN_SUFFIX)]
    always = [p for p in names if not p.lower().endswith(_TOKEN_SUFFIX)]
    if not names:
        return None
    return _Matcher(_alternatives(always), _alternatives(tokens))


def _strip_path_params(path: str, matcher: _Matcher) -> str:
    """Drop ``;name=value`` path parameters whose name matches, in every segment."""
    if ";" not in path:
        return path
    segments = []
    for segment in path.split("/"):
        if ";" in segment:
            head, *params = segment.split(";")
            kept = [p for p in params if not matcher.drops(p)]
            segment = ";".join([head, *kept])
        segments.append(segment)
    return "/".join(segments)


def _strip_query(query: str, matcher: _Matcher) -> str:
    return "&".join(p for p in query.split("&") if not matcher.drops(p))


def _drop_default_port(scheme: str, netloc: str) -> str:
    userinfo, at, hostport = netloc.rpartition("@")
    host, colon, port = hostport.rpartition(":")
    # "[::1]" has colons but no port; a port never contains "]".
    if not colon or "]" in port:
        return netloc
    if port == "" or (port.isdigit() and int(port) == _DEFAULT_PORTS.get(scheme)):
        return f"{userinfo}{at}{host}"
    return netloc


def _patterns(strip_params: Iterable[str]) -> tuple[str, ...]:
    return strip_params if isinstance(strip_params, tuple) else tuple(strip_params)


def strip_tracking(url: str, strip_params: Iterable[str] = DEFAULT_TRACKING_PARAMS) -> str:
    """``url``, absolute or relative, without the query and ``;`` path parameters
    :func:`canonical_url` drops, and otherwise as written: the spelling a page's links are
    hashed in (:mod:`webfarm.content`). A site adding ``utm_source`` per visit to its
    links made each fetch a new content, a new blob and a counted change."""
    if "?" not in url and ";" not in url:
        return url
    matcher = _matcher(_patterns(strip_params))
    if matcher is None:
        return url
    rest, hash_, fragment = url.partition("#")
    path, mark, query = rest.partition("?")
    path = _strip_path_params(path, matcher)
    query = _strip_query(query, matcher) if mark else ""
    return path + ("?" + query if query else "") + hash_ + fragment


def canonical_url(url: str, strip_params: Iterable[str] = DEFAULT_TRACKING_PARAMS) -> str:
    """Return the one spelling of ``url`` that every stage keys on.

    Raises ``ValueError`` for a URL that cannot be parsed (e.g. a bad IPv6 host).
    Cached: one URL is canonicalised by the dupefilter, the frontier, the index
    and every item of its page, at ~20 µs a time.
    """
    return _canonical(url, _patterns(strip_params))


@lru_cache(maxsize=16384)
def _canonical(url: str, strip_params: tuple[str, ...]) -> str:
    canonical = canonicalize_url(url)
    parts = urlsplit(canonical)
    scheme, netloc, path, query = parts.scheme, parts.netloc, parts.path, parts.query
    netloc = _drop_default_port(scheme, netloc)
    matcher = _matcher(strip_params)
    if matcher is not None:
        path = _strip_path_params(path, matcher)
        if query:
            query = _strip_query(query, matcher)
    # w3lib already sorted the query; filtering keeps that order.
    return urlunsplit(SplitResult(scheme, netloc, path, query, ""))


def url_fingerprint(url: str, strip_params: Iterable[str] = DEFAULT_TRACKING_PARAMS) -> str:
    """Hex SHA-1 of :func:`canonical_url`: the ``_id`` of a document in ``pages``."""
    return hashlib.sha1(canonical_url(url, strip_params).encode()).hexdigest()  # noqa: S324


def request_fingerprint(
    method: str,
    url: str,
    body: bytes = b"",
    strip_params: Iterable[str] = DEFAULT_TRACKING_PARAMS,
) -> bytes:
    """20-byte SHA-1 over method, canonical URL and body.

    Headers and meta are left out on purpose: a page re-requested through the
    browser rung, or with another proxy or cookie, is still the same request.
    """
    digest = hashlib.sha1(method.upper().encode("ascii", "replace"))  # noqa: S324
    digest.update(b" ")
    digest.update(canonical_url(url, strip_params).encode())
    # The canonical URL is percent-encoded, so it never holds a raw newline:
    # the separator makes (url, body) pairs unambiguous.
    digest.update(b"\n")
    digest.update(body or b"")
    return digest.digest()


def host_of(url: str) -> str:
    """Lower-case ``host[:port]`` with the scheme's default port dropped.

    This is the politeness key: ``127.0.0.2:8081`` and ``127.0.0.2:8082`` are
    different hosts, ``Example.com:443`` over https is ``example.com``.
    """
    parts = urlsplit(url.strip())
    hostport = parts.netloc.rpartition("@")[2]
    if not hostport.isascii() or "[" in hostport:
        # Same spelling as canonical_url (punycode, normalised IPv6), so the keys agree.
        return urlsplit(canonical_url(url, ())).netloc.rpartition("@")[2]
    return _drop_default_port(parts.scheme.lower(), hostport.lower())


def unfetchable(url: str) -> str | None:
    """Why Scrapy's HTTP download handler fails on the http(s) ``url`` at every try, or
    None (other schemes are their handlers' business).

    A port past 65535, a broken IPv6 literal or a ``user:password@`` raised ValueError at
    each download, so a link or a redirect to one was retried ``WEBFARM_RETRY_TIMES``
    times, with a traceback, before it reached the dead letters. Scrapy never sends a
    URL's credentials; its ``HTTPAUTH_*`` settings are its way."""
    try:
        parts = urlsplit(url.strip())
        if parts.scheme.lower() not in ("http", "https"):
            return None
        port = parts.port
    except ValueError as exc:
        return str(exc).lower()  # "port out of range 0-65535", "invalid ipv6 url"
    if "@" in parts.netloc:
        return ("a user:password@ in the URL, which Scrapy does not send; set HTTPAUTH_USER, "
                "HTTPAUTH_PASS and HTTPAUTH_DOMAIN")
    if not parts.hostname:
        return "no host"
    if port == 0:
        return "port 0"
    return None


def bare_host(host: str) -> str:
    """The name of a :func:`host_of` key without its port (``127.0.0.2:8081`` is
    ``127.0.0.2``): what Scrapy's ``DOWNLOAD_SLOTS`` and offsite filter compare."""
    return urlsplit(f"//{host}").hostname or host


_HOST_NAME = re.compile(r"[a-z0-9_.-]+")


def scope_host(value: str) -> str:
    """One host a spider stays inside, as a user gives it (``host``, ``host:port`` or a
    site's root URL), spelled as :func:`host_of` spells the hosts of URLs: lower case,
    IDN as punycode. ValueError says what to give instead.

    Why: a spider's hosts are compared with the hosts of the links it finds, which are
    always spelled that way. ``Example.com``, ``bücher.de`` or ``https://example.com/``
    kept as given matched no link, and the crawl ended after its start pages, silently.
    """
    text = str(value).strip()
    if "://" in text:
        parts = urlsplit(text)
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not a host; give one such as example.com")
        if parts.path.strip("/") or parts.query or parts.fragment:
            raise ValueError(f"{value!r} is a URL with a path; give its host, "
                             f"{host_of(text)!r}: links are followed anywhere on a host")
        text = host_of(text)
    if text.startswith((".", "*.")):
        raise ValueError(f"{value!r}: give {text.lstrip('*.')!r}, which covers its subdomains")
    if text.count(":") > 1 and "[" not in text:  # a bare IPv6 address: no port
        text = f"[{text}]"
    try:
        parts = urlsplit(f"//{text}")  # ValueError for a bracketed name that is no IPv6
    except ValueError:
        parts = urlsplit("//")
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"{value!r}: a port is a number from 1 to 65535")
    name = (parts.hostname or "").rstrip(".")
    if ":" in name:  # IPv6, as the user wrote it: Scrapy's offsite check compares spellings
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            name = ""
        else:
            name = f"[{name}]"
    elif not name.isascii():  # IDN: punycode, as canonical_url spells it
        name = urlsplit(canonical_url(f"http://{name}/", ())).hostname or ""
    if (not name.startswith("[") and not _HOST_NAME.fullmatch(name)) or parts.path \
            or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"{value!r} is not a host; give host or host:port, such as "
                         "example.com or 127.0.0.1:8080")
    return f"{name}:{port}" if port is not None else name


def spider_scope(spider: Any) -> tuple[list[str], Callable[[str], bool] | None]:
    """The hosts a spider keeps to, and the test of a URL against them; ``[]``, None for
    every host. A WebfarmSpider's ``hosts`` keep a port (``host:port``: that port only),
    and its ``in_scope`` is the test its links pass; other spiders' ``allowed_domains``
    are bare names, any port, as Scrapy's offsite filter judges them."""
    hosts = getattr(spider, "hosts", None)
    in_scope = getattr(spider, "in_scope", None)
    if hosts and callable(in_scope) and all(isinstance(h, str) for h in hosts):
        return list(hosts), in_scope
    domains = list(getattr(spider, "allowed_domains", None) or ())
    return domains, within_domains(domains)


def host_named(url: str, hosts: Iterable[str]) -> str:
    """``url``'s host as a spider's ``hosts`` would name it: ``host:port``
    (:func:`host_of`) when they carry ports, as a WebfarmSpider's do, else the bare name."""
    if any(":" in name for name in hosts):
        return host_of(url)
    return urlsplit(url).hostname or ""


def within_domains(domains: Iterable[str]) -> Callable[[str], bool] | None:
    """Is a URL's host one of ``domains`` or a subdomain of one, as Scrapy's offsite filter
    judges ``allowed_domains`` (bare names: any port) and a WebfarmSpider its ``hosts``
    (``host:port``: that port only; ``WebfarmSpider.in_scope``); None when there are none
    (every host). An IPv6 address matches in any spelling, an IDN as its punycode."""
    names = [_name_port(d.lower()) for d in domains if d]
    if not names:
        return None

    def within(url: str) -> bool:
        parts = urlsplit(url)
        name = _ip6(parts.hostname or "")
        if not name.isascii():  # links are punycode already; a URL of the spider's may not be
            name = urlsplit("//" + host_of(url)).hostname or name
        try:
            port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
        except ValueError:
            return False
        return any((name == d or name.endswith("." + d)) and want in (None, port)
                   for d, want in names)

    return within


def _ip6(name: str) -> str:
    """An IPv6 address in one spelling (``::ffff:127.0.0.3`` is ``::ffff:7f00:3``)."""
    if ":" not in name:
        return name
    try:
        return ipaddress.IPv6Address(name).compressed
    except ValueError:
        return name


def _name_port(host: str) -> tuple[str, int | None]:
    """``host`` or ``host:port`` as (name, port or None)."""
    parts = urlsplit(f"//{host}")
    try:
        return _ip6(parts.hostname or host), parts.port
    except ValueError:
        return host, None


class RequestFingerprinter:
    """Scrapy ``REQUEST_FINGERPRINTER_CLASS`` that uses :func:`request_fingerprint`.

    Reads ``WEBFARM_STRIP_PARAMS`` once (empty: :data:`DEFAULT_TRACKING_PARAMS`).
    Unlike Scrapy's default it ignores ``meta`` entirely (``verbatim_url``
    included), so a request keeps its identity whatever rung fetches it.
    """

    def __init__(self, strip_params: Iterable[str] | None = None) -> None:
        params = tuple(strip_params or ())
        self.strip_params: tuple[str, ...] = params or DEFAULT_TRACKING_PARAMS
        self._cache: WeakKeyDictionary[Request, bytes] = WeakKeyDictionary()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RequestFingerprinter:
        return cls(crawler.settings.getlist("WEBFARM_STRIP_PARAMS"))

    def fingerprint(self, request: Request) -> bytes:
        try:
            return self._cache[request]
        except KeyError:
            fp = request_fingerprint(request.method, request.url, request.body, self.strip_params)
            self._cache[request] = fp
            return fp
