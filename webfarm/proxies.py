"""The proxy pool: parsing ``WEBFARM_PROXIES``, ids without secrets, health shared in Redis.

A proxy is known everywhere outside this module by its *id* (``host:port``, or
``host:port/2`` when several entries share an address, or the name given as a
URL fragment: ``http://u:p@gw:8000#eu-1``). The id never contains anything from
the userinfo, so it is safe in logs, stats, Redis and stored documents.

Health is shared by every worker through one Redis hash per proxy,
``webfarm:proxies:<id>`` (``failures``: consecutive incidents, ``cooldown_until``
and ``cooldown_from``: epoch seconds, ``retired``, counters). A failure is
recorded by one Lua script, so two workers never lose an increment. Requests
that were already in flight when an incident was recorded do not count again:
``n`` consecutive failures means ``n`` separate incidents, not one burst of
sixteen concurrent requests through a dead proxy. Each worker reads every
proxy's hash in one pipelined round trip at most every ``refresh`` seconds and
chooses locally, so the hot path costs no Redis call.

A ban answered by the site (not the proxy) must not burn the pool:
``webfarm:proxies:hosts:<host>`` remembers, per host, when each proxy last
fetched it fine; the middleware counts a ban against a proxy only when another
proxy fetched the same host fine recently.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import redis

from webfarm.config import ConfigError

logger = logging.getLogger(__name__)

KEY_PREFIX = "webfarm:proxies:"
STICKY_KEY = KEY_PREFIX + "sticky"
SCHEMES = ("http", "https")
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,99}$")


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


def _describe(raw: str) -> str:
    """What an unparseable entry can be called by: ``host:port`` at most, never userinfo."""
    rest = raw.split("://", 1)[-1].rsplit("@", 1)[-1]
    rest = rest.split("/", 1)[0].split("#", 1)[0]
    return rest if rest and re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+", rest) else "?"


def _parse_one(raw: str, index: int, source: str) -> tuple[Proxy, str | None]:
    text = raw if "://" in raw else f"http://{raw}"
    where = f"{source}: entry {index} ({_describe(raw)})"
    try:
        parts = urlsplit(text)
        port = parts.port
        host = parts.hostname
    except ValueError:
        raise ProxyConfigError(f"{where}: not a URL like http://user:pass@host:port") from None
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
            f"{where}: the name after '#' may hold only letters, digits and ._:/@+- "
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
    parsed = [_parse_one(raw, i, where) for i, raw in enumerate(entries, 1)]
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


# --- shared health ------------------------------------------------------------------------

# KEYS[1] proxy hash. ARGV: now, sent_at, base, cap, max_failures, ttl, reason, counter.
# An incident counts only if the failed request was sent after the current cooldown began.
_FAILURE_LUA = """
local now = tonumber(ARGV[1])
local sent = tonumber(ARGV[2])
redis.call('HINCRBY', KEYS[1], ARGV[8], 1)
local from = tonumber(redis.call('HGET', KEYS[1], 'cooldown_from') or '0') or 0
local n = tonumber(redis.call('HGET', KEYS[1], 'failures') or '0') or 0
local counted = 0
if sent >= from then
  n = redis.call('HINCRBY', KEYS[1], 'failures', 1)
  local delay = tonumber(ARGV[3]) * (2 ^ (n - 1))
  if delay > tonumber(ARGV[4]) then delay = tonumber(ARGV[4]) end
  redis.call('HSET', KEYS[1], 'cooldown_until', tostring(now + delay),
             'cooldown_from', tostring(now), 'last_reason', ARGV[7])
  redis.call('HINCRBY', KEYS[1], 'cooldowns', 1)
  if n >= tonumber(ARGV[5]) then redis.call('HSET', KEYS[1], 'retired', '1') end
  counted = 1
end
redis.call('EXPIRE', KEYS[1], ARGV[6])
return counted
"""

# KEYS[1] proxy hash. ARGV: sent_at, ttl. A success resets the count only if it was sent
# after the last incident: an old in-flight request proves nothing about recovery.
_SUCCESS_LUA = """
local from = tonumber(redis.call('HGET', KEYS[1], 'cooldown_from') or '0') or 0
if tonumber(ARGV[1]) >= from and redis.call('HEXISTS', KEYS[1], 'retired') == 0 then
  redis.call('HSET', KEYS[1], 'failures', '0')
  redis.call('EXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_FIELDS = ("failures", "cooldown_until", "cooldown_from", "retired", "last_reason")


@dataclass
class ProxyState:
    """What every worker agrees on about one proxy (as of the last refresh)."""

    failures: int = 0
    cooldown_until: float = 0.0
    cooldown_from: float = 0.0
    retired: bool = False
    last_reason: str = ""

    def healthy(self, now: float) -> bool:
        return not self.retired and self.cooldown_until <= now

    @classmethod
    def from_redis(cls, values: Sequence[bytes | None]) -> ProxyState:
        failures, until, since, retired, reason = values

        def num(v: bytes | None) -> float:
            try:
                return float(v) if v is not None else 0.0
            except ValueError:
                return 0.0

        return cls(int(num(failures)), num(until), num(since), retired not in (None, b"0", b""),
                   (reason or b"").decode("utf-8", "replace"))


class ProxyPool:
    """Chooses a healthy proxy per request and records outcomes in Redis.

    ``base``/``cap``: cooldown after the n-th consecutive incident is
    ``min(cap, base * 2**(n-1))`` seconds; ``max_failures`` incidents retire the
    proxy (until its Redis hash expires after ``ttl`` seconds without news, or an
    operator deletes it). ``host_window``: how recent another proxy's success
    on a host must be to blame a ban on this one.
    """

    def __init__(
        self, proxies: Sequence[Proxy], client: redis.Redis, *, base: float = 30.0,
        cap: float = 3600.0, max_failures: int = 5, refresh: float = 1.0,
        ttl: float = 86400.0, host_window: float = 600.0, sticky: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not proxies:
            raise ValueError("ProxyPool needs at least one proxy")
        self.proxies = {p.id: p for p in proxies}
        self.order = [p.id for p in proxies]
        self.redis = client
        self.base, self.cap, self.max_failures = base, cap, max(1, max_failures)
        self.refresh_interval, self.ttl = refresh, int(max(ttl, 1))
        self.host_window, self.sticky = host_window, sticky
        self.clock = clock
        self.state: dict[str, ProxyState] = {pid: ProxyState() for pid in self.order}
        self._refreshed_at = float("-inf")
        self._last_used: dict[str, float] = dict.fromkeys(self.order, 0.0)
        self._use_seq = 0
        self._sticky: dict[str, str] = {}
        # host -> proxy id -> epoch of the last success we know of (ours or, read lazily, others')
        self._host_ok: dict[str, dict[str, float]] = {}
        self._host_ok_written: dict[tuple[str, str], float] = {}
        self._failure_script = client.register_script(_FAILURE_LUA)
        self._success_script = client.register_script(_SUCCESS_LUA)

    @staticmethod
    def key(pid: str) -> str:
        return f"{KEY_PREFIX}{pid}"

    @staticmethod
    def host_key(host: str) -> str:
        return f"{KEY_PREFIX}hosts:{host}"

    # -- reading ---------------------------------------------------------------------------

    def refresh(self, force: bool = False) -> bool:
        """Re-read every proxy's state in one round trip, at most every ``refresh`` s.

        Returns True when it read. A Redis error keeps the last known state: a
        hiccup must not stop a crawl that has healthy proxies.
        """
        mono = time.monotonic()
        if not force and mono - self._refreshed_at < self.refresh_interval:
            return False
        self._refreshed_at = mono
        try:
            pipe = self.redis.pipeline(transaction=False)
            for pid in self.order:
                pipe.hmget(self.key(pid), _FIELDS)
            rows = pipe.execute()
        except redis.RedisError as exc:
            logger.warning("proxy health: Redis read failed, keeping the last state: %s", exc)
            return False
        for pid, row in zip(self.order, rows, strict=True):
            self.state[pid] = ProxyState.from_redis(row)
        return True

    def healthy_ids(self, now: float | None = None) -> list[str]:
        self.refresh()
        now = self.clock() if now is None else now
        return [pid for pid in self.order if self.state[pid].healthy(now)]

    def retired_ids(self) -> list[str]:
        return [pid for pid in self.order if self.state[pid].retired]

    def next_available(self) -> float | None:
        """Epoch when the first proxy in cooldown comes back, None if all are retired."""
        times = [s.cooldown_until for s in self.state.values() if not s.retired]
        return min(times) if times else None

    # -- choosing --------------------------------------------------------------------------

    def pick(self, host: str, exclude: Iterable[str] = ()) -> Proxy | None:
        """A healthy proxy for ``host``, not one of ``exclude``; None if there is none.

        Least recently used among the healthy ones (round-robin under steady
        load), or the host's sticky proxy while it stays healthy.
        """
        excluded = set(exclude)
        healthy = [pid for pid in self.healthy_ids() if pid not in excluded]
        if not healthy:
            return None
        chosen: str | None = None
        if self.sticky:
            chosen = self._sticky_choice(host, healthy, bool(excluded))
        if chosen is None:
            chosen = min(healthy, key=lambda pid: self._last_used[pid])
            if self.sticky and not excluded:
                self._set_sticky(host, chosen)
        self._use_seq += 1
        self._last_used[chosen] = self._use_seq
        return self.proxies[chosen]

    def _sticky_choice(self, host: str, healthy: list[str], retrying: bool) -> str | None:
        current = self._sticky.get(host)
        if current in healthy:
            return current
        if retrying:
            return None
        try:
            shared = self.redis.hget(STICKY_KEY, host)
        except redis.RedisError:
            shared = None
        pid = shared.decode() if shared else None
        if pid in healthy:
            self._sticky[host] = pid
            return pid
        return None

    def _set_sticky(self, host: str, pid: str) -> None:
        self._sticky[host] = pid
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hset(STICKY_KEY, host, pid)
            pipe.expire(STICKY_KEY, self.ttl)
            pipe.execute()
        except redis.RedisError as exc:
            logger.warning("proxy sticky map: Redis write failed: %s", exc)

    # -- outcomes --------------------------------------------------------------------------

    def record_success(self, pid: str, host: str, sent_at: float) -> None:
        """The proxy fetched ``host`` fine. Costs a Redis write only when news."""
        now = self.clock()
        self._host_ok.setdefault(host, {})[pid] = now
        key = (host, pid)
        written = self._host_ok_written.get(key, 0.0)
        try:
            if now - written > min(30.0, self.host_window / 4):
                self._host_ok_written[key] = now
                pipe = self.redis.pipeline(transaction=False)
                pipe.hset(self.host_key(host), pid, f"{now:.3f}")
                pipe.expire(self.host_key(host), int(max(self.host_window, 1)))
                pipe.execute()
            state = self.state[pid]
            recovered = state.failures and sent_at >= state.cooldown_from and not state.retired
            if recovered and self._success_script(keys=[self.key(pid)], args=[sent_at, self.ttl]):
                state.failures = 0
        except redis.RedisError as exc:
            logger.warning("proxy health: Redis write failed: %s", exc)

    def host_ok_elsewhere(self, host: str, pid: str) -> bool:
        """Did another proxy fetch ``host`` fine within ``host_window`` seconds?"""
        since = self.clock() - self.host_window
        local = self._host_ok.get(host, {})
        if any(other != pid and ts >= since for other, ts in local.items()):
            return True
        try:
            shared = self.redis.hgetall(self.host_key(host))
        except redis.RedisError:
            return False
        for other, ts in shared.items():
            other_id = other.decode()
            try:
                when = float(ts)
            except ValueError:
                continue
            if other_id != pid and when >= since:
                local[other_id] = max(when, local.get(other_id, 0.0))
                self._host_ok[host] = local
                return True
        return False

    def record_failure(self, pid: str, reason: str, sent_at: float, counter: str = "bans"
                       ) -> tuple[bool, ProxyState]:
        """Count an incident against ``pid``: cooldown with growing backoff, maybe retire.

        Returns (counted, state): ``counted`` is False when the request was sent
        before the proxy's current cooldown began (same incident, already
        counted). ``reason`` must not hold secrets; it is stored in Redis.
        """
        now = self.clock()
        try:
            counted = bool(self._failure_script(
                keys=[self.key(pid)],
                args=[now, sent_at, self.base, self.cap, self.max_failures, self.ttl,
                      reason[:200], counter],
            ))
            row = self.redis.hmget(self.key(pid), _FIELDS)
            self.state[pid] = ProxyState.from_redis(row)
        except redis.RedisError as exc:
            logger.warning("proxy health: Redis write failed, cooling %s down locally: %s",
                           pid, exc)
            state = self.state[pid]
            counted = sent_at >= state.cooldown_from
            if counted:
                state.failures += 1
                state.cooldown_from = now
                state.cooldown_until = now + min(self.cap,
                                                 self.base * 2 ** (state.failures - 1))
                state.retired = state.failures >= self.max_failures
        return counted, self.state[pid]
