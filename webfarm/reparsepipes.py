"""The project's own item pipelines, run by ``scrapy reparse`` as a crawl runs them.

A crawl passes every item through ``ITEM_PIPELINES``, and a project's own pipelines
there (cleaning, validation, ``DropItem``) shape what the item store writes. Re-parse
has no engine, and without this it stored ``extract()``'s raw output: a field a
pipeline normalises in the crawl came back as the spider wrote it, and an item a
pipeline drops was stored. :class:`ProjectPipelines` runs, in priority order, the
pipelines a crawl runs *before* the item store, webfarm's own storage pipelines left
out (they are marked with a ``webfarm_stage`` class attribute; re-parse stores items
itself). Pipelines after the item store see stored items in a crawl (exports,
notifications); re-parse does not run them, and says which at the start.

``open_spider`` and ``close_spider`` are called around the run. A ``process_item``
may be a plain method, an ``async def`` (run on an event loop of its own, as there is
no reactor) or return a Deferred that has already fired; one that waits on Twisted's
reactor cannot work here and is refused with what to do.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Sequence
from typing import Any

from scrapy import Spider
from scrapy.crawler import Crawler
from scrapy.exceptions import DropItem, NotConfigured
from scrapy.utils.conf import build_component_list
from scrapy.utils.deprecate import argument_is_required
from scrapy.utils.misc import build_from_crawler, load_object
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

logger = logging.getLogger(__name__)

#: ``webfarm_stage`` of the storage pipeline whose place ends the ones re-parse runs.
ITEM_STORE_STAGE = "items"


class PipelineNeedsReactor(RuntimeError):
    """A pipeline returned a Deferred that only Twisted's reactor could fire."""


class ProjectPipelines:
    """The pipelines of ``ITEM_PIPELINES`` that come before the item store, webfarm's
    storage pipelines left out; ``process(item)`` is the item to store, or None if a
    pipeline dropped it."""

    def __init__(self, spider: Spider, pipelines: list[Any], after: Sequence[str] = (),
                 drop_level: str | int = "WARNING") -> None:
        self.spider = spider
        self.pipelines = pipelines
        self.after = list(after)  # names of the pipelines after the item store, not run
        self.drop_level = drop_level  # DEFAULT_DROPITEM_LOG_LEVEL, as a crawl logs drops
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler, spider: Spider) -> ProjectPipelines:
        """Load them from the crawler's ``ITEM_PIPELINES``, each through its own
        ``from_crawler`` (``crawler.spider`` is ``spider``)."""
        crawler.spider = spider
        before: list[Any] = []
        after: list[str] = []
        stored = False
        settings = crawler.settings
        for path in build_component_list(settings.get_component_priority_dict_with_base(
                "ITEM_PIPELINES")):
            pipecls = load_object(path)
            stage = getattr(pipecls, "webfarm_stage", None)
            if stage is not None:
                stored = stored or stage == ITEM_STORE_STAGE
            elif stored:
                after.append(f"{pipecls.__module__}.{pipecls.__qualname__}")
            else:
                try:
                    before.append(build_from_crawler(pipecls, crawler))
                except NotConfigured as exc:  # as Scrapy's managers skip it
                    if exc.args:
                        logger.warning("Disabled %s: %s", path, exc.args[0])
        return cls(spider, before, after, settings.get("DEFAULT_DROPITEM_LOG_LEVEL", "WARNING"))

    def open(self) -> None:
        if self.after:
            logger.info("reparse: not running %s: they come after the item store in "
                        "ITEM_PIPELINES (a crawl gives them stored items)",
                        ", ".join(self.after))
        for pipeline in self.pipelines:
            method = getattr(pipeline, "open_spider", None)
            if method is not None:
                self._call(method)

    def close(self) -> None:
        try:
            for pipeline in reversed(self.pipelines):
                method = getattr(pipeline, "close_spider", None)
                if method is not None:
                    self._call(method)
        finally:
            if self._loop is not None:
                self._loop.close()
                self._loop = None

    def process(self, item: Any, url: str) -> Any | None:
        """The item after every pipeline, or None if one raised DropItem (logged, as a
        crawl logs a dropped item). Any other exception propagates."""
        for pipeline in self.pipelines:
            method = getattr(pipeline, "process_item", None)
            if method is None:
                continue
            try:
                item = self._call(method, item)
            except DropItem as exc:
                level = getattr(exc, "log_level", None) or self.drop_level
                logger.log(getattr(logging, level) if isinstance(level, str) else level,
                           "reparse: Dropped: %s (%s, an item from %s)", exc,
                           type(pipeline).__name__, url)
                return None
        return item

    def _call(self, method: Any, *args: Any) -> Any:
        if argument_is_required(method, "spider"):  # the old signature, as Scrapy passes it
            args = (*args, self.spider)
        result = method(*args)
        if isinstance(result, Deferred):
            fired: list[Any] = []
            result.addBoth(fired.append)
            if not fired:
                raise PipelineNeedsReactor(
                    f"{method.__qualname__} returned a Deferred that did not fire: scrapy "
                    "reparse runs pipelines without Twisted's reactor. Make it a plain or "
                    "'async def' method, or move it after the item store in ITEM_PIPELINES")
            if isinstance(fired[0], Failure):
                fired[0].raiseException()
            return fired[0]
        if inspect.isawaitable(result):
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
            return self._loop.run_until_complete(result)
        return result
