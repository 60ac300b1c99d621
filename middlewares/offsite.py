"""Scrapy's offsite filter, except that a request taken from the frontier is given back.

Scrapy's ``OffsiteMiddleware`` drops a request to a host outside the spider's
``allowed_domains``, with a DEBUG line. That is right for a request the spider yields:
this middleware still drops it before it is queued, as Scrapy does. A request taken from
the shared frontier is another matter. Its lease was acknowledged and the URL was gone,
not fetched, not in the dead-letter queue, though the frontier would never hand it out
again. That happens to URLs from ``scrapy seed`` outside the worker's hosts. It also
happens to another crawl's pages when two ``scrapy crawl generic`` runs with different
``-a domains`` share the spider's frontier: each dropped the other's pages. (The
frontier now hands a worker another crawl's host only after ``WEBFARM_OFFSITE_WAIT``
with no worker of its own taking it: :meth:`webfarm.frontier.Frontier.keep_to`.)

Here such a request ends in :class:`~webfarm.exceptions.RetryLater`. The frontier hands
it out again with backoff, so a worker whose hosts include it fetches it. After
``WEBFARM_RETRY_TIMES`` tries it is dead-lettered with the reason ``offsite: ...``, where
``scrapy dlq SPIDER --requeue --reason offsite`` finds it. Said once per host, at WARNING;
Scrapy's ``offsite/filtered`` and ``offsite/domains`` stats count as before. Both
remember the last ``WEBFARM_HOST_MEMORY`` hosts they logged, not every one
(:mod:`webfarm.hostmemory`).
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from typing import NoReturn
from urllib.parse import urlsplit

from scrapy import Request, Spider
from scrapy.crawler import Crawler
from scrapy.downloadermiddlewares.offsite import OffsiteMiddleware
from scrapy.exceptions import IgnoreRequest
from scrapy.statscollectors import StatsCollector

from webfarm.exceptions import DeadLetter, RetryLater
from webfarm.hostmemory import DEFAULT_SIZE, RecentHosts, host_memory_size
from webfarm.netguard import NetGuard
from webfarm.queue import LEASE
from webfarm.urls import host_named, spider_scope

logger = logging.getLogger(__name__)


class FrontierOffsiteMiddleware(OffsiteMiddleware):
    """Drops offsite requests the spider yields; gives back those the frontier leased."""

    def __init__(self, stats: StatsCollector) -> None:
        super().__init__(stats)
        self._remember(DEFAULT_SIZE)
        # The spider's hosts and its test of a URL (ports kept: webfarm.urls.spider_scope),
        # read once the spider opens.
        self._scope: tuple[list[str], Callable[[str], bool] | None] = ([], None)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FrontierOffsiteMiddleware:
        o = super().from_crawler(crawler)
        o._remember(host_memory_size(crawler.settings))
        return o

    def _remember(self, hosts: int) -> None:
        # Scrapy's set of the hosts it logged grew by every offsite host that a crawl's
        # links named; both sets keep the hosts met last (a forgotten one is said again).
        self.domains_seen = RecentHosts[None](hosts)  # type: ignore[assignment]
        self._said: RecentHosts[None] = RecentHosts(hosts)  # hosts whose give-back was logged

    def spider_opened(self, spider: Spider) -> None:
        super().spider_opened(spider)
        self._scope = spider_scope(spider)

    def should_follow(self, request: Request, spider: Spider) -> bool:
        """Scrapy's test of the host's name, and a WebfarmSpider's ports (its ``hosts``
        keep one). Another port of its host was let through: a request the spider yielded
        there was queued, then given back by every worker until it was dead-lettered; a
        leased page of another crawl on that port was fetched as this one's and its links
        dropped (the spider follows its own ports only), and those pages never crawled."""
        if not super().should_follow(request, spider):
            return False
        within = self._scope[1]
        return within is None or within(request.url)

    def request_scheduled(self, request: Request, spider: Spider) -> None:
        # Yielded by this worker's spider (a redirect too): dropped before it is queued.
        super().process_request(request)

    def process_request(self, request: Request, spider: Spider | None = None) -> None:
        if LEASE not in request.meta:
            return super().process_request(request)
        own = self.crawler.spider
        assert own is not None
        try:  # Scrapy's check, its DEBUG line and its offsite/* stats
            return super().process_request(request)
        except IgnoreRequest:
            pass
        named = self._scope[0]
        host = host_named(request.url, named)  # with a port, it tells two crawls apart
        hosts = ", ".join(named) or "none"
        if host not in self._said:  # Scrapy's domains_seen holds hosts it dropped unsaid
            self._said.add(host)
            logger.warning(
                "%s: host %r is outside this worker's hosts (%s); the frontier hands it to "
                "another worker, and after WEBFARM_RETRY_TIMES tries keeps it as a dead "
                "letter: `scrapy dlq %s --requeue --reason offsite` once a worker whose "
                "hosts include it runs (said once per host)", request, host, hosts, own.name)
        raise RetryLater(f"offsite: {host} is outside the hosts of the worker that took it "
                         f"({hosts})")


class LeftTheHosts:
    """A fetch that ended outside the spider's hosts, from a URL inside them: a redirect
    there (``middlewares.limits``), or a page's script that sent the browser there
    (``middlewares.render``). Not followed or stored, as Scrapy's offsite filter drops
    such a redirect, but said once per host with how to keep it (a site that moved gave
    an empty crawl and no hint why); a start URL's is dead-lettered, to be requeued once
    the host is added. ``allow_offsite`` and start URLs outside the hosts pass."""

    def __init__(self, crawler: Crawler, what: str, verb: str, requeue: str = "") -> None:
        self.crawler = crawler
        self.what = what  # the dead letter's and IgnoreRequest's words: "redirect offsite"
        self.verb = verb  # "to {verb} it, add the host"
        self.requeue = requeue  # extra `scrapy dlq --requeue` arguments
        self.said: RecentHosts[None] = RecentHosts(host_memory_size(crawler.settings))
        self._scope: tuple[list[str], Callable[[str], bool] | None] | None = None
        self._guard: NetGuard | None = None

    def host(self, request: Request, target: str, allowed: bool) -> str | None:
        """``target``'s host if going there left the spider's hosts, else None. Ports
        count as the spider's links do (:func:`webfarm.urls.spider_scope`): a redirect to
        another port of its host was followed, and the frontier then gave the page back
        as another crawl's until it was dead-lettered."""
        named, within = self._spider_scope()
        if within is None or allowed or within(target) or not within(request.url):
            return None
        return host_named(target, named)

    def _spider_scope(self) -> tuple[list[str], Callable[[str], bool] | None]:
        if self._scope is None:  # the spider exists once a request is met
            self._scope = spider_scope(self.crawler.spider)
        return self._scope

    def _guard_refuses(self, target: str) -> str | None:
        """Why the SSRF guard refuses ``target``'s host, when that needs no lookup (an
        address, ``localhost``), else None."""
        name = (urlsplit(target).hostname or "").rstrip(".").lower()
        if name == "localhost" or name.endswith(".localhost"):
            name = "127.0.0.1"  # RFC 6761: loopback, whatever a resolver says
        if self._guard is None:
            self._guard = NetGuard.from_settings(self.crawler.settings)
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return None
        return self._guard.check_ip(name)

    def refuse(self, request: Request, target: str, host: str, chain: str,
               log: str) -> NoReturn:
        """DeadLetter for a start URL, else IgnoreRequest; ``log`` (with ``%s`` for the
        fix) is said the first time a host is met."""
        spider = self.crawler.spider
        assert spider is not None
        named = self._spider_scope()[0]
        fix = (f"to {self.verb} it, add {host} to the spider's hosts (-a domains=… or "
               f"allowed_domains; now {', '.join(named)})")
        if (guarded := self._guard_refuses(target)) is not None:
            # "add localhost to the spider's hosts" was the advice for a redirect to it
            fix = f"the SSRF guard refuses it too ({guarded}): there is nothing to {self.verb}"
        if request.meta.get("depth", 0) == 0:
            raise DeadLetter(f"{self.what}: {chain}; {fix}" + ("" if guarded else (
                f", then `scrapy dlq {spider.name} --requeue{self.requeue}`")))
        if host not in self.said:
            self.said.add(host)
            logger.warning("%s; %s (said once per host)", log, fix)
        raise IgnoreRequest(f"{self.what}: {target[:200]}")
