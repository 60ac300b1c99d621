"""Links into crawler traps are not followed: paths that repeat themselves or run too deep.

A relative link on a page that the server answers at any path (``<a href="shop/">`` on a
site that maps every unknown path to the same page) gives ``/shop/shop/``, then
``/shop/shop/shop/``, without end; a calendar or a file browser can do the same with
several segments (``/a/b/a/b/a/b/``). Each URL is new to the dupefilter, so a crawl of
such a site never ends: it spends the host's politeness budget, Redis memory and the
index on copies of one page (content dedupe stores no new blob, but every copy is
fetched). Scrapy's own defences (``DEPTH_LIMIT``, off by default; ``URLLENGTH_LIMIT``,
2083 characters: about 300 levels of ``shop/``) do not stop it in time.

Two rules, as Heritrix's ``PathologicalPathDecideRule`` and
``TooManyPathSegmentsDecideRule`` apply them, for links found on pages (start URLs are
the user's own and always go):

* ``WEBFARM_MAX_PATH_REPEATS`` (2): a run of path segments repeated more than this many
  times in a row (``/a/a/a``, ``/a/b/a/b/a/b``);
* ``WEBFARM_MAX_PATH_SEGMENTS`` (20): more path segments than this.

0 turns a rule off. A dropped link is counted (``webfarm/traps/repeated_path``,
``webfarm/traps/deep_path``); the first one of each host is logged with the rule.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

from scrapy import Request
from scrapy.crawler import Crawler
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.spidermiddlewares.base import BaseSpiderMiddleware

from webfarm.hostmemory import RecentHosts, host_memory_size
from webfarm.urls import host_of

logger = logging.getLogger(__name__)

PREFIX = "webfarm/traps"


def path_segments(url: str) -> list[str]:
    """The URL's non-empty path segments (``/a//b/`` has two: an empty one repeats too)."""
    return [s for s in urlsplit(url).path.split("/") if s]


def repeats_more_than(segments: list[str], times: int) -> bool:
    """Whether some run of one or more segments comes more than ``times`` times in a row.

    A block of ``p`` segments repeated ``times + 1`` times in a row is ``times * p``
    positions in a row where a segment equals the one ``p`` before it, so each period is
    one pass over the path.
    """
    n = len(segments)
    for period in range(1, n // (times + 1) + 1):
        run = 0
        for i in range(period, n):
            if segments[i] == segments[i - period]:
                run += 1
                if run >= times * period:
                    return True
            else:
                run = 0
    return False


class PathTrapMiddleware(BaseSpiderMiddleware):
    """Spider middleware; see the module docstring."""

    def __init__(self, crawler: Crawler, max_repeats: int, max_segments: int) -> None:
        super().__init__(crawler)
        assert crawler.stats is not None
        self.stats = crawler.stats
        self.max_repeats = max_repeats
        self.max_segments = max_segments
        # hosts whose first dropped link was logged (the last WEBFARM_HOST_MEMORY of them)
        self._said: RecentHosts[None] = RecentHosts(host_memory_size(crawler.settings))

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> PathTrapMiddleware:
        settings = crawler.settings
        max_repeats = max(0, settings.getint("WEBFARM_MAX_PATH_REPEATS", 2))
        max_segments = max(0, settings.getint("WEBFARM_MAX_PATH_SEGMENTS", 20))
        if not max_repeats and not max_segments:
            raise NotConfigured
        return cls(crawler, max_repeats, max_segments)

    def get_processed_request(self, request: Request, response: Response | None
                              ) -> Request | None:
        if response is None:  # a start request: the user asked for it
            return request
        segments = path_segments(request.url)
        if self.max_segments and len(segments) > self.max_segments:
            self._drop(request, response, "deep_path",
                       f"more than {self.max_segments} path segments "
                       "(WEBFARM_MAX_PATH_SEGMENTS)")
            return None
        if self.max_repeats and len(segments) > self.max_repeats and repeats_more_than(
                segments, self.max_repeats):
            self._drop(request, response, "repeated_path",
                       f"path segments repeated more than {self.max_repeats} times in a row "
                       "(WEBFARM_MAX_PATH_REPEATS)")
            return None
        return request

    def _drop(self, request: Request, response: Response, rule: str, why: str) -> None:
        self.stats.inc_value(f"{PREFIX}/{rule}")
        host = host_of(request.url)
        if host in self._said:
            return
        self._said.add(host)
        logger.info("Not following %s, found on %s: %s, a crawler trap; further such links "
                    "of %s are only counted (%s/%s); raise or set 0 to follow them",
                    request.url, response.url, why, host, PREFIX, rule)
