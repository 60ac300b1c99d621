"""Which network addresses a crawler may talk to (the SSRF guard's core).

A crawler follows links and redirects chosen by strangers. Without a guard a
page can point it at ``http://169.254.169.254/`` (cloud credentials),
``http://localhost:6379/`` (the frontier itself) or any host of the private
network. :class:`NetGuard` refuses loopback, private, link-local, multicast,
reserved, unspecified and other non-global addresses (IPv4 and IPv6, including
IPv4-mapped, 6to4 and Teredo forms) unless ``WEBFARM_ALLOWED_NETWORKS`` lists a
network that contains them. Host names are judged by what they RESOLVE to, every
address of them, not by their spelling.

Used by :class:`middlewares.ssrf.SSRFGuardMiddleware` for every request (redirect
hops included, since they come back through the scheduler) and by the browser
rung for navigations and subresources::

    guard = NetGuard.from_settings(crawler.settings)
    reason = await guard.check_url(url)   # None: allowed; else why not
    reason = guard.check_ip("10.0.0.1")

DNS rebinding: a name may resolve to a public address when checked and to a
private one when connected. With Scrapy's default caching resolver the guard
pins: the address it checked is written into Scrapy's DNS cache (or the cached
address is the one checked), so the HTTP client connects to exactly that
address. Other resolvers, proxies (which resolve for themselves) and the browser
(Chromium resolves on its own) are not pinned; there the short cache
(``WEBFARM_SSRF_DNS_CACHE``) narrows, but does not close, the window.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from scrapy.settings import BaseSettings

from webfarm.hostmemory import RecentHosts

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Schemes that reach a host over the network: their host is checked.
NETWORK_SCHEMES = frozenset({"http", "https", "ws", "wss", "ftp"})
# Schemes that never leave the process (browser subresources): always allowed.
LOCAL_SCHEMES = frozenset({"data", "blob", "about"})
# How a reason for a name that does not resolve starts: a DNS failure may pass, so the
# middleware retries such requests later instead of dead-lettering them at once.
UNRESOLVED = "cannot resolve"
_CACHE_SIZE = 4096
_SCRAPY_PINNING_RESOLVER = "scrapy.resolver.CachingThreadedResolver"


class NetGuardError(ValueError):
    """A setting of the guard is unusable (the message says how to fix it)."""


def parse_networks(value: str | Iterable[str] | None) -> list[IPNetwork]:
    """``"127.0.0.0/8, 10.1.2.3"`` (or a list) as networks; a bad entry raises
    :class:`NetGuardError` naming it."""
    if value is None:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    networks: list[IPNetwork] = []
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        try:
            networks.append(ipaddress.ip_network(text, strict=False))
        except ValueError:
            raise NetGuardError(
                f"WEBFARM_ALLOWED_NETWORKS entry {text!r} is not a network; "
                "use comma-separated CIDRs such as 127.0.0.0/8,10.0.0.0/8"
            ) from None
    return networks


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, Teredo), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    return None


def classify(ip: IPAddress) -> str | None:
    """What kind of non-public address ``ip`` is, or None for a global unicast one."""
    if isinstance(ip, ipaddress.IPv6Address):
        inner = _embedded_ipv4(ip)
        if inner is not None:
            kind = classify(inner)
            return f"{kind} (embedded in IPv6)" if kind else None
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private:
        return "private"
    if not ip.is_global:
        return "non-global"
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    return True


class NetGuard:
    """Decides whether an address or URL may be fetched; caches resolutions briefly."""

    def __init__(
        self,
        allowed: Iterable[IPNetwork] = (),
        *,
        enabled: bool = True,
        cache_seconds: float = 30.0,
        resolve_timeout: float = 10.0,
        pin_scrapy_dns: bool = False,
    ) -> None:
        self.allowed = list(allowed)
        self.enabled = enabled
        self.cache_seconds = cache_seconds
        self.resolve_timeout = resolve_timeout
        self.pin_scrapy_dns = pin_scrapy_dns
        self._cache: RecentHosts[tuple[float, list[str]]] = RecentHosts(_CACHE_SIZE)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> NetGuard:
        """Reads ``WEBFARM_SSRF_GUARD``, ``WEBFARM_ALLOWED_NETWORKS``,
        ``WEBFARM_SSRF_DNS_CACHE``, ``DNS_TIMEOUT`` and whether Scrapy's caching
        resolver is in use (then resolutions are pinned in its cache)."""
        resolver = settings.get("TWISTED_DNS_RESOLVER") or settings.get("DNS_RESOLVER") or ""
        return cls(
            parse_networks(settings.get("WEBFARM_ALLOWED_NETWORKS")),
            enabled=settings.getbool("WEBFARM_SSRF_GUARD", True),
            cache_seconds=settings.getfloat("WEBFARM_SSRF_DNS_CACHE", 30.0),
            resolve_timeout=settings.getfloat("DNS_TIMEOUT", 60.0),
            pin_scrapy_dns=(settings.getbool("DNSCACHE_ENABLED", True)
                            and resolver == _SCRAPY_PINNING_RESOLVER),
        )

    # -- addresses -----------------------------------------------------------
    def check_ip(self, ip: str) -> str | None:
        """Why ``ip`` is refused, or None when it may be fetched."""
        try:
            addr = ipaddress.ip_address(str(ip).split("%", 1)[0].strip("[]"))
        except ValueError:
            return f"not an IP address: {str(ip)[:100]!r}"
        if not self.enabled:
            return None
        kind = classify(addr)
        if kind is None or self.is_allowed(addr):
            return None
        return f"{kind} address {addr} (not in WEBFARM_ALLOWED_NETWORKS)"

    def is_allowed(self, addr: IPAddress) -> bool:
        """Whether the allow-list names ``addr`` (or the IPv4 address it embeds)."""
        candidates: list[IPAddress] = [addr]
        if isinstance(addr, ipaddress.IPv6Address):
            inner = _embedded_ipv4(addr)
            if inner is not None:
                candidates.append(inner)
        return any(a in net for a in candidates for net in self.allowed
                   if a.version == net.version)

    # -- URLs ----------------------------------------------------------------
    async def check_url(self, url: str) -> str | None:
        """Why ``url`` is refused, or None. Resolves the host off the event loop;
        never raises: a malformed URL or a name that does not resolve is a reason."""
        try:
            return await self._check_url(url)
        except Exception as exc:  # noqa: BLE001 - the contract is "never raises"
            return f"cannot check {str(url)[:200]!r}: {type(exc).__name__}: {exc}"

    async def _check_url(self, url: str) -> str | None:
        if not self.enabled:
            return None
        try:
            parts = urlsplit(str(url).strip())
            host = parts.hostname
            parts.port  # noqa: B018 - raises ValueError for a bad port
        except ValueError as exc:
            return f"malformed URL {str(url)[:200]!r}: {exc}"
        scheme = parts.scheme.lower()
        if scheme in LOCAL_SCHEMES:
            return None
        if scheme not in NETWORK_SCHEMES:
            return f"scheme {scheme or '(none)'!r} is not fetched: {str(url)[:200]!r}"
        if not host:
            return f"malformed URL {str(url)[:200]!r}: no host"
        try:
            addresses = await self.resolve(host)
        except (OSError, UnicodeError, asyncio.TimeoutError) as exc:  # idna rejects bad labels
            return f"{UNRESOLVED} {host!r}: {exc or type(exc).__name__}"
        if not addresses:
            return f"{UNRESOLVED} {host!r}: no address"
        literal = _is_ip(host)
        for ip in addresses:
            reason = self.check_ip(ip)
            if reason is not None:
                return reason if literal else f"{host} resolves to {reason}"
        return None

    async def resolve(self, host: str) -> list[str]:
        """Every address of ``host`` (an IP literal is itself), cached for
        ``cache_seconds``; raises ``OSError`` (or ``UnicodeError`` for a name IDNA
        rejects) when it does not resolve."""
        host = host.strip("[]").lower()
        try:
            return [str(ipaddress.ip_address(host.split("%", 1)[0]))]
        except ValueError:
            pass
        now = time.monotonic()
        hit = self._cache.get(host)
        if hit is not None and hit[0] > now:
            return hit[1]
        if self.pin_scrapy_dns:
            from scrapy.resolver import dnscache

            pinned = dnscache.get(host)
            if isinstance(pinned, str):
                # The address Scrapy's HTTP client will connect to: judge exactly it.
                return [pinned]
        infos = await self._getaddrinfo(host)
        addresses = list(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos))
        self._cache[host] = (now + self.cache_seconds, addresses)
        if self.pin_scrapy_dns and addresses:
            self._pin(host, addresses)
        return addresses

    def _pin(self, host: str, addresses: list[str]) -> None:
        """Make Scrapy's resolver hand out the IPv4 address checked here."""
        from scrapy.resolver import dnscache

        v4 = [a for a in addresses if ":" not in a]
        if v4 and dnscache.limit:
            dnscache[host] = v4[0]

    async def _getaddrinfo(self, host: str) -> list[Any]:
        """``socket.getaddrinfo`` in a thread: asyncio's executor when an asyncio
        loop runs (the asyncio reactor, Playwright), Twisted's thread pool otherwise."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not None:
            return await asyncio.wait_for(
                loop.getaddrinfo(host, None, type=socket.SOCK_STREAM), self.resolve_timeout
            )
        from twisted.internet.threads import deferToThread

        return await deferToThread(socket.getaddrinfo, host, None, type=socket.SOCK_STREAM)
