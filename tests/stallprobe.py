"""A test extension: when the reactor stalls, and in which code.

A 10 ms timer marks the reactor alive; a watchdog thread that sees no mark for
100 ms records the files and functions on the reactor thread's stack (once per
stall). Only stalls while pages are being fetched count (first response to
last); those after the last response (the idle wait, the close) are listed
apart. The result goes to the JSON file ``STALLPROBE_OUT`` names when the
spider closes.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from scrapy import signals
from scrapy.crawler import Crawler
from twisted.internet.task import LoopingCall

STALL = 0.1


class ReactorStalls:
    def __init__(self, out: str) -> None:
        self.out = out
        self.last = time.monotonic()
        self.stalls: list[dict[str, Any]] = []
        self.responses: list[float] = []
        self.loop = LoopingCall(self._tick)
        self._done = threading.Event()
        self._reactor_thread = threading.get_ident()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ReactorStalls:
        probe = cls(crawler.settings["STALLPROBE_OUT"])
        crawler.signals.connect(probe.opened, signal=signals.spider_opened)
        crawler.signals.connect(probe.response, signal=signals.response_received)
        crawler.signals.connect(probe.closed, signal=signals.spider_closed)
        return probe

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self.last > STALL and self.stalls and self.stalls[-1]["start"] == self.last:
            self.stalls[-1]["seconds"] = now - self.last
        self.last = now

    def _watch(self) -> None:
        while not self._done.wait(0.02):
            last = self.last
            if time.monotonic() - last <= STALL:
                continue
            if self.stalls and self.stalls[-1]["start"] == last:
                continue  # this stall is recorded
            frame = sys._current_frames().get(self._reactor_thread)
            stack = traceback.extract_stack(frame) if frame else []
            self.stalls.append({"start": last, "seconds": None,
                                "files": sorted({f.filename for f in stack}),
                                "functions": sorted({f.name for f in stack})})

    def opened(self, spider: Any) -> None:
        self.loop.start(0.01)
        threading.Thread(target=self._watch, daemon=True).start()

    def response(self, **kwargs: Any) -> None:
        self.responses.append(time.monotonic())

    def closed(self, spider: Any, reason: str) -> None:
        self._done.set()
        self.loop.stop()
        first, last = self.responses[0], self.responses[-1]
        stalls = [s for s in self.stalls if first <= s["start"] <= last]
        after = [s for s in self.stalls if s["start"] > last]  # waiting idle, then closing
        Path(self.out).write_text(json.dumps({"responses": len(self.responses),
                                              "stalls": stalls, "after": after}))
