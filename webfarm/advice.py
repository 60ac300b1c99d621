"""What a worker tells the user where a Scrapy habit works differently here.

Kept out of the scheduler, which only decides when to say it.
"""

from __future__ import annotations

import logging

from scrapy import Request
from scrapy.statscollectors import StatsCollector

from webfarm.frontier import Frontier
from webfarm.redisconn import REDIS_ERRORS

logger = logging.getLogger("webfarm.scheduler")  # where these lines always came from


def cookies_not_sent(request: Request) -> None:
    """A spider's ``cookies=...`` under ``COOKIES_ENABLED=False`` (webfarm's default, unlike
    Scrapy's): not sent, which was not said."""
    logger.warning(
        "%s carries cookies=..., which are not sent: COOKIES_ENABLED is False here "
        "(crawls are anonymous); set COOKIES_ENABLED=True in the spider's custom_settings "
        "to send them (said once)", request)


def explain_nothing_fetched(stats: StatsCollector | None, name: str,
                            frontier: Frontier | None) -> None:
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
        "`scrapy recrawl %s` (stored pages that are due), `scrapy seed %s --force URL ...`"
        "%s, or `scrapy frontier %s --reset --yes` to start this spider's crawl over",
        seen, name, name, name,
        f", `scrapy dlq {name} --requeue` (the {dead} URL(s) that failed)" if dead else "",
        name)
