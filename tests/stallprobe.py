"""A test extension: how long the reactor went without running a 10 ms timer.

Only gaps while pages are being fetched count (first response to last). The
result goes to the JSON file ``STALLPROBE_OUT`` names when the spider closes.
"""

from __future__ import annotations

import json
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

from scrapy import signals
from scrapy.crawler import Crawler
from twisted.internet.task import LoopingCall


class ReactorStalls:
    def __init__(self, out: str) -> None:
        self.out = out
        self.ticks: list[float] = []
        self.responses: list[float] = []
        self.loop = LoopingCall(lambda: self.ticks.append(time.monotonic()))

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ReactorStalls:
        probe = cls(crawler.settings["STALLPROBE_OUT"])
        crawler.signals.connect(probe.opened, signal=signals.spider_opened)
        crawler.signals.connect(probe.response, signal=signals.response_received)
        crawler.signals.connect(probe.closed, signal=signals.spider_closed)
        return probe

    def opened(self, spider: Any) -> None:
        self.loop.start(0.01)

    def response(self, **kwargs: Any) -> None:
        self.responses.append(time.monotonic())

    def closed(self, spider: Any, reason: str) -> None:
        self.loop.stop()
        first, last = self.responses[0], self.responses[-1]
        gaps = [b - a for a, b in pairwise(self.ticks) if first <= a and b <= last]
        Path(self.out).write_text(json.dumps({"responses": len(self.responses), "gaps": gaps}))
