"""Scrapy's memory-usage extension, reading this process's own peak, and once more as the
spider closes.

* ``memusage/max`` is sampled every ``MEMUSAGE_CHECK_INTERVAL_SECONDS`` (60 s): a crawl
  shorter than that reported its start-up size. A probe's 43 s crawl of 31 MB pages
  peaked at 3.9 GB and said 115 MB. The size read is a peak, so one last reading before
  the stats are dumped is the crawl's peak.
* Scrapy reads ``ru_maxrss``, which Linux carries over ``fork`` and ``exec``: a worker
  started by a 650 MB process (a test run, a big scheduler) began at "650 MB" and saw
  no growth below that. ``VmHWM`` in ``/proc/self/status`` is this program's own peak.
"""

from __future__ import annotations

from scrapy import signals
from scrapy.crawler import Crawler
from scrapy.extensions.memusage import MemoryUsage

_STATUS = "/proc/self/status"


class PeakMemoryUsage(MemoryUsage):
    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)  # NotConfigured unless MEMUSAGE_ENABLED, as Scrapy's
        crawler.signals.connect(self.update, signal=signals.spider_closed)

    def get_virtual_size(self) -> int:
        try:
            with open(_STATUS, "rb") as status:
                for line in status:
                    if line.startswith(b"VmHWM:"):
                        return int(line.split()[1]) * 1024  # kB
        except (OSError, ValueError, IndexError):
            pass
        return super().get_virtual_size()  # not Linux: getrusage's
