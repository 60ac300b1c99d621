"""``WEBFARM_PROXIES``: parsing proxy URLs into :class:`Proxy`, with ids free of secrets.

A proxy is known everywhere outside this module by its *id* (``host:port``, or
``host:port/2`` when several entries share an address, or the name given as a
URL fragment: ``http://u:p@gw:8000#eu-1``). The id never contains anything from
the userinfo, so it is safe in logs, stats, Redis and stored documents. A wrong
entry raises :class:`ProxyConfigError` naming it by id, never by its password.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from webfarm.config import ConfigError

SCHEMES = ("http", "https")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/+-]{0,99}$")


class ProxyConfigError(ConfigError):
    """``WEBFARM_PROXIES`` is wrong; the message names the entry by id, never its password."""


@dataclass(frozen=True)
class Proxy:
    """One configured proxy. ``repr`` and ``str`` show the id only."""

    id: str
    scheme: str
    host: str
    port: int
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return self.id

    @property
    def server(self) -> str:
        """``scheme://host:port``, without credentials."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The URL for ``request.meta["proxy"]``, userinfo still percent-encoded.

        Scrapy's ``HttpProxyMiddleware`` turns the userinfo into a
        ``Proxy-Authorization`` header and rewrites ``meta["proxy"]`` without it.
        """
        if self.username is None:
            return self.server
        userinfo = self._raw_userinfo
        return f"{self.scheme}://{userinfo}@{self.server.split('://', 1)[1]}"

    # The userinfo exactly as configured (percent-encoded), so the URL round-trips.
    _raw_userinfo: str = field(default="", repr=False, compare=False)

    def playwright_proxy(self, bypass: str = "") -> dict[str, str]:
        """The ``proxy`` argument of Playwright's ``browser.new_context()``."""
        proxy = {"server": self.server}
        if self.username is not None:
            proxy["username"] = self.username
            proxy["password"] = self.password or ""
        if bypass:
            proxy["bypass"] = bypass
        return proxy


def _entries(value: str | Sequence[str] | None, source: str) -> tuple[list[str], str]:
    """Split the setting into raw entries; a path to a file means "one per line"."""
    if value is None:
        return [], source
    if not isinstance(value, str):
        return [str(v).strip() for v in value if str(v).strip()], source
    text = value.strip()
    if not text:
        return [], source
    looks_like_path = (
        "://" not in text and "@" not in text and "," not in text and not any(
            c.isspace() for c in text)
        and (text.startswith(("/", "./", "../", "~")) or Path(text).suffix in (".txt", ".list"))
    )
    if text.startswith("file://"):
        text, looks_like_path = unquote(urlsplit(text).path), True
    if looks_like_path or (Path(text).is_file() and "://" not in text):
        path = Path(text).expanduser()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ProxyConfigError(
                f"{source}: cannot read the proxy file {str(path)!r}: {exc.strerror or exc}"
            ) from None
        entries = []
        for line in lines:
            # "# comment" lines and " # trailing comments"; "url#name" (no space) is a name.
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                entries.append(line)
        return entries, f"{source} file {path}"
    return [e for e in re.split(r"[,\s]+", text) if e], source


def _describe(raw: str, secrets: bool = False) -> str:
    """What an unparseable entry can be called by: ``host:port`` at most, never userinfo.
    With ``secrets`` (the setting holds a password somewhere), an entry without ``@`` may
    be a piece of one (a ``,`` or a space in it split the entry): it is not shown."""
    if secrets and "@" not in raw:
        return "?"
    rest = raw.split("://", 1)[-1].rsplit("@", 1)[-1]
    rest = rest.split("/", 1)[0].split("#", 1)[0]
    return rest if rest and re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+", rest) else "?"


_ENCODE_HINT = ("; in a user name or password write ',' as %2C, a space as %20, '#' as %23 "
                "and '@' as %40")


def _parse_one(raw: str, index: int, source: str, secrets: bool = False
               ) -> tuple[Proxy, str | None]:
    text = raw if "://" in raw else f"http://{raw}"
    where = f"{source}: entry {index} ({_describe(raw, secrets)})"
    hint = _ENCODE_HINT if secrets else ""
    try:
        parts = urlsplit(text)
        port = parts.port
        host = parts.hostname
    except ValueError:
        raise ProxyConfigError(f"{where}: not a URL like http://user:pass@host:port{hint}"
                               ) from None
    if "@" in parts.fragment:  # "http://u:pa#ss@host": the password's '#' began a name
        raise ProxyConfigError(f"{where}: a '#' in a user name or password began the "
                               f"proxy's name{_ENCODE_HINT}")
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        hint = " (SOCKS is not supported by Scrapy's HTTP client)" if "socks" in scheme else ""
        raise ProxyConfigError(f"{where}: scheme {scheme!r} is not http or https{hint}")
    if not host:
        raise ProxyConfigError(f"{where}: no host; expected http://user:pass@host:port")
    if parts.path not in ("", "/") or parts.query:
        raise ProxyConfigError(f"{where}: a proxy URL has no path or query")
    if port is None:
        port = 443 if scheme == "https" else 80
    username = password = None
    raw_userinfo = ""
    if "@" in parts.netloc:
        raw_userinfo = parts.netloc.rsplit("@", 1)[0]
        user, sep, pwd = raw_userinfo.partition(":")
        if not user:
            raise ProxyConfigError(f"{where}: userinfo without a user name")
        username, password = unquote(user), unquote(pwd) if sep else ""
    name = parts.fragment or None
    if name is not None and not _ID_RE.match(name):
        raise ProxyConfigError(
            f"{where}: the name after '#' may hold only letters, digits and ._:/+- "
            "(at most 100)"
        )
    proxy = Proxy("", scheme, host.lower(), port, username, password, raw_userinfo)
    return proxy, name


def parse_proxies(value: str | Sequence[str] | None, source: str = "WEBFARM_PROXIES"
                  ) -> list[Proxy]:
    """Parse a list (comma/whitespace separated, or a sequence) or a file of proxy URLs.

    Raises :class:`ProxyConfigError` naming the bad entry by position and
    ``host:port`` (never its userinfo). Duplicate entries are an error too: they
    would share health but count twice in rotation.
    """
    entries, where = _entries(value, source)
    secrets = any("@" in raw for raw in entries)
    parsed = [_parse_one(raw, i, where, secrets) for i, raw in enumerate(entries, 1)]
    by_addr: dict[tuple[str, int], int] = {}
    for proxy, _ in parsed:
        key = (proxy.host, proxy.port)
        by_addr[key] = by_addr.get(key, 0) + 1
    seen_addr: dict[tuple[str, int], int] = {}
    proxies: list[Proxy] = []
    seen_ids: dict[str, int] = {}
    seen_urls: set[tuple[str, str]] = set()
    for i, (proxy, name) in enumerate(parsed, 1):
        key = (proxy.host, proxy.port)
        seen_addr[key] = seen_addr.get(key, 0) + 1
        hostport = proxy.server.split("://", 1)[1]
        pid = name or (hostport if by_addr[key] == 1 else f"{hostport}/{seen_addr[key]}")
        if pid in seen_ids:
            raise ProxyConfigError(
                f"{where}: entry {i} ({pid}) has the same id as entry {seen_ids[pid]}; "
                "give one a name with #NAME"
            )
        url_key = (proxy.server, proxy.url)
        if url_key in seen_urls:
            raise ProxyConfigError(f"{where}: entry {i} ({pid}) is listed twice")
        seen_ids[pid] = i
        seen_urls.add(url_key)
        proxies.append(Proxy(pid, proxy.scheme, proxy.host, proxy.port, proxy.username,
                             proxy.password, proxy._raw_userinfo))
    return proxies


def proxies_from_settings(settings: Any) -> list[Proxy]:
    """``WEBFARM_PROXIES`` from the settings, else from the environment (before the
    lead's settings module reads it)."""
    value = settings.get("WEBFARM_PROXIES") if settings is not None else None
    if not value:
        value = os.environ.get("WEBFARM_PROXIES", "")
    return parse_proxies(value)
