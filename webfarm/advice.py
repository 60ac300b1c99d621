"""What a worker tells the user where a Scrapy habit works differently here.

Kept out of the scheduler, which only decides when to say it.
"""

from __future__ import annotations

import ipaddress
import logging
import time

from scrapy import Request
from scrapy.statscollectors import StatsCollector

from webfarm.config import mask_credentials
from webfarm.frontier import Frontier
from webfarm.hostmemory import RecentHosts
from webfarm.redisconn import REDIS_ERRORS
from webfarm.urls import bare_host

logger = logging.getLogger("webfarm.scheduler")  # where these lines always came from


def cookies_not_sent(request: Request) -> None:
    """A spider's ``cookies=...`` under ``COOKIES_ENABLED=False`` (webfarm's default, unlike
    Scrapy's): not sent, which was not said."""
    logger.warning(
        "%s carries cookies=..., which are not sent: COOKIES_ENABLED is False here "
        "(crawls are anonymous); set COOKIES_ENABLED=True in the spider's custom_settings "
        "to send them (said once)", request)


def slot_not_used(request: Request, host: str) -> bool:
    """A spider's own ``meta["download_slot"]`` (a slot that groups hosts, in Scrapy):
    the frontier paces each host for all workers and the meta key is not queued, so the
    group was silently gone. Says so, and returns True, unless the slot is one Scrapy's
    downloader set on a request it fetched (the host's name, or its address under
    ``CONCURRENT_REQUESTS_PER_IP``), which a retry, a redirect to another host, or a
    ``meta=response.meta`` copy carries on."""
    meta = request.meta
    slot = meta.get("download_slot")
    if (not slot or "redirect_urls" in meta or "download_latency" in meta
            or slot == bare_host(host) or _is_address(slot)):  # cheapest first: per request
        return False
    logger.warning(
        "%s has meta['download_slot']=%r, which is not used: the frontier paces each host "
        "itself, for all workers (WEBFARM_HOST_DELAY, robots.txt Crawl-delay, a "
        "DOWNLOAD_SLOTS entry per host name); to slow the hosts of that group, give each "
        "of them a DOWNLOAD_SLOTS entry (said once)", request, slot)
    return True


def post_queued(request: Request, cookies: bool) -> None:
    """A POST a spider yields goes to the shared frontier like any request: its body (a
    login form's password too) is kept in Redis, another worker may send it, and with
    cookies off the session a login sets is not sent on: the textbook
    ``FormRequest.from_response`` login failed with a "redirect loop" and no other word.
    Said once a worker."""
    logger.warning(
        "%s is a POST queued to the shared frontier: its body (a login form's password "
        "too) is kept in Redis and may be sent by another worker, without this worker's "
        "session%s. Send a login with meta={'webfarm_local': True} and COOKIES_ENABLED=True "
        "(README: Logins and other requests of one worker); said once", request,
        "" if cookies else "; and COOKIES_ENABLED is False: the session cookie it sets "
        "is not sent with the next requests")


def shorter_default_delay(own: float, fleet: dict[str, float], prefix: str) -> None:
    """This worker runs with a shorter default host delay than another worker of its
    frontier: the frontier keeps the longest, and says why this worker is slower than its
    settings."""
    longest = max(fleet.values(), default=0.0)
    if longest > own:
        worker = max(fleet, key=lambda w: fleet[w])
        logger.warning(
            "This worker's default host delay (WEBFARM_HOST_DELAY, or a longer "
            "DOWNLOAD_DELAY) is %gs, but worker %s of %s runs with %gs: the frontier spaces "
            "every host by the longest, for every worker. Give the workers one setting",
            own, worker, prefix, longest)


def url_not_queued(request: Request, why: Exception, said: RecentHosts[None]) -> None:
    """A link or start URL the downloader would fail on at every try (a bad port, a
    broken IPv6 literal, a ``user:password@``) is dropped; the first of each host is said,
    as a crawler trap's links are, since a hostile page can hold thousands."""
    # By hand: urlsplit() raises on some of these URLs (a broken IPv6 literal).
    netloc = request.url.partition("//")[2].partition("/")[0].rpartition("@")[2].lower()
    if netloc in said:
        return
    said.add(netloc)
    referer = request.headers.get("Referer")
    found = f" (found on {referer.decode('latin-1')})" if referer else ""
    logger.warning("Not queued %s%s: %s; further such URLs of %s are only counted "
                   "(webfarm/frontier/unfetchable)", mask_credentials(str(request)), found,
                   why, netloc)


def _is_address(text: object) -> bool:
    try:
        ipaddress.ip_address(str(text))
    except ValueError:
        return False
    return True


def _again(name: str, stores_pages: bool, then: str = "") -> str:
    """How to fetch a spider's pages again. ``scrapy recrawl`` takes the stored pages that
    are due; a spider not on WebfarmSpider stores none, and a CrawlSpider told to run it
    got "0 due"."""
    if stores_pages:
        return f"`scrapy recrawl {name}` (stored pages that are due), {then}"
    return ""


def explain_nothing_fetched(stats: StatsCollector | None, name: str,
                            frontier: Frontier | None, stores_pages: bool = True) -> None:
    """A crawl run again with the same start URLs fetches nothing: the frontier keeps
    every URL it saw, so that no worker fetches one twice. Without a word, that looked
    like a broken crawl (stats showed one 'duplicates')."""
    if stats is None or stats.get_value("webfarm/frontier/dequeued"):
        return
    seen = stats.get_value("webfarm/frontier/duplicates", 0)
    if not seen or stats.get_value("webfarm/frontier/enqueued"):
        return
    try:
        dead = frontier.counts()["dead"] if frontier is not None else 0
    except REDIS_ERRORS:
        dead = 0
    logger.warning(
        "This worker fetched nothing: the %d URL(s) it started from were seen before by "
        "%s's frontier, which never fetches a URL twice. To fetch them again: "
        "%s`scrapy seed %s --force URL ...`"
        "%s, or `scrapy frontier %s --reset --yes` to start this spider's crawl over",
        seen, name, _again(name, stores_pages), name,
        f", `scrapy dlq {name} --requeue` (the {dead} URL(s) that failed)" if dead else "",
        name)


def explain_at_close(stats: StatsCollector | None, name: str, frontier: Frontier | None,
                     idle_seconds: float, stores_pages: bool = True) -> None:
    """What a worker that stops because its frontier is idle says about it;
    ``stores_pages``: the spider stores its pages (a WebfarmSpider), which ``scrapy
    recrawl`` can fetch again."""
    scope = frontier.scope if frontier is not None else []
    logger.info("Frontier empty%s for %.0fs: closing this worker",
                f" for this worker's hosts ({_named(scope)})" if scope else "", idle_seconds)
    if name:
        explain_nothing_fetched(stats, name, frontier, stores_pages)
        explain_links_seen(stats, name, stores_pages)
        explain_other_hosts(stats, name, frontier)


def explain_links_seen(stats: StatsCollector | None, name: str,
                       stores_pages: bool = True) -> None:
    """A Scrapy-style spider run again fetches its start URLs (Scrapy's start requests are
    ``dont_filter``) and nothing else: every link on them was seen by the frontier in the
    run before. Without a word, that looked like a crawl that found no links."""
    if stats is None:
        return
    get = stats.get_value
    starts = get("webfarm/frontier/start_requests", 0)
    # Links the frontier knew already, not those this worker had just queued itself.
    known = get("webfarm/frontier/duplicates", 0) - get("webfarm/frontier/duplicates_local", 0)
    # It fetched its start URLs and no more: a worker that also took a recrawl's pages,
    # seeds or other workers' links was told to run the `scrapy recrawl` it had just run.
    if (not starts or not 0 < get("webfarm/frontier/dequeued", 0) <= starts or known <= 0
            or get("webfarm/frontier/enqueued", 0) > starts):
        return
    logger.warning(
        "This worker fetched its start URL(s) and nothing else: the %d link(s) found were "
        "seen before by %s's frontier, which never fetches a URL twice (the start URLs were "
        "fetched again because start requests are dont_filter, as in Scrapy). To fetch the "
        "site again: %s`scrapy frontier %s --reset --yes` to start this spider's crawl over",
        known, name, _again(name, stores_pages, "or "), name)


class WaitingNotice:
    """Says why a worker fetches nothing while its frontier holds work for it: retries
    wait (a refused connection, a 503), a host waits out its delay or an unreadable
    robots.txt. Scrapy retries at once and gives up in seconds; here a retry may be
    minutes away, and the log said only "Crawled 0 pages" meanwhile. Said once the worker
    fetched nothing for ``every`` seconds (``LOGSTATS_INTERVAL``), then every five times
    that while it still fetches nothing."""

    def __init__(self, every: float) -> None:
        self.every = max(every, 1.0)
        self._since: float | None = None  # idle with work waiting, since
        self._said = float("-inf")  # when this stretch was last said
        self._dequeued: object = None

    def idle_with_work(self, stats: StatsCollector | None, name: str,
                       ready_in: float | None, now: float | None = None) -> bool:
        """The worker is idle and its frontier is not; True when this said why."""
        now = time.monotonic() if now is None else now
        dequeued = stats.get_value("webfarm/frontier/dequeued") if stats is not None else 0
        if self._since is None or dequeued != self._dequeued:  # fetched since: start over
            self._since, self._dequeued, self._said = now, dequeued, float("-inf")
            return False
        quiet = now - self._since
        if quiet < self.every or now - self._said < 5 * self.every:
            return False
        self._said = now
        when = f"; the next may be ready in {_duration(ready_in)}" if ready_in else ""
        logger.info(
            "Nothing fetched for %s, though %s's frontier holds work for this worker: it "
            "waits for a retry (a refused connection, a 5xx), a host's delay, an "
            "unreadable robots.txt, or a lease another worker holds (one that died gives "
            "it back after WEBFARM_LEASE_SECONDS)%s. `scrapy frontier %s` shows what waits; "
            "what fails for good goes to `scrapy dlq %s`%s", _duration(quiet), name, when,
            name, name, _proxies_down(stats))
        return True


def _proxies_down(stats: StatsCollector | None) -> str:
    """With proxy rotation on and no proxy healthy, the first thing to say (requests wait
    for one: a retired proxy never comes back on its own)."""
    healthy = stats.get_value("webfarm/proxies/healthy") if stats is not None else None
    if healthy is None or healthy:
        return ""
    retired = stats.get_value("webfarm/proxies/retired") if stats is not None else None
    if retired:
        return (f". No proxy is healthy: {', '.join(retired)} retired (WEBFARM_PROXIES); "
                "fix or replace them, then delete their webfarm:proxies:<id> keys")
    return ". No proxy is healthy: every one of WEBFARM_PROXIES is cooling down"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _named(hosts: list[str]) -> str:
    return ", ".join(hosts[:5]) + (", ..." if len(hosts) > 5 else "")


def explain_other_hosts(stats: StatsCollector | None, name: str,
                        frontier: Frontier | None) -> None:
    """A worker kept to its hosts stops when they are done, and leaves the requests of
    other hosts queued for their own workers. Before, it took them, gave them back and
    said so once per host; a worker whose ``-a domains`` missed the seeded hosts now
    stops having fetched nothing, and this says why."""
    if frontier is None or not frontier.scope or not frontier.others_waiting:
        return  # counted by the idle check: no Redis call on the reactor's thread here
    waiting = frontier.others_waiting
    where = (f"{waiting} request(s) of other hosts stay in {name}'s frontier for a worker "
             "whose hosts include them (-a domains=, or the spider's allowed_domains); "
             f"`scrapy frontier {name}` lists them by host")
    if stats is not None and stats.get_value("webfarm/frontier/dequeued"):
        logger.info("This worker's hosts are done; %s", where)
    else:
        logger.warning("This worker fetched nothing: its hosts (%s) have nothing queued; %s",
                       _named(frontier.scope), where)
