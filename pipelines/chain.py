"""Scrapy's item pipeline manager, noting at the head of each item's chain which page the
item came from, and closing the pipelines only after the items still in them.

The item store finds an item's page by the item object (:func:`webfarm.items.source_of`).
A project's pipeline that returns a new object (``dataclasses.replace``, a cleaned copy)
would leave the store without it: the item was stored with an empty ``source_url`` and no
``content_hash``. Scrapy awaits one item's pipelines one after the other in one coroutine,
so a context variable set here, before the first pipeline of any priority, is that chain's
own when the item store reads it. It is ``ITEM_PROCESSOR``.

In a crawl, Scrapy closes the pipelines once no item is in them. ``scrapy parse
--pipelines`` does not wait: it starts each item's chain and lets the spider close, so an
item still in a slow pipeline reached the index after it had closed, and the page the
user asked to store was not stored, with no word said.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy.pipelines import ItemPipelineManager
from scrapy.utils.defer import maybe_deferred_to_future
from twisted.internet.defer import Deferred

from webfarm.items import PageItem, enter_chain

logger = logging.getLogger(__name__)


class ItemChainManager(ItemPipelineManager):
    def __init__(self, *middlewares: Any, **kwargs: Any) -> None:
        super().__init__(*middlewares, **kwargs)
        self._in_flight = 0
        self._drained: Deferred[None] | None = None

    async def process_item_async(self, item: Any) -> Any:
        if not isinstance(item, PageItem):
            enter_chain(item)
        self._in_flight += 1
        try:
            return await super().process_item_async(item)
        finally:
            self._in_flight -= 1
            if not self._in_flight and self._drained is not None:
                drained, self._drained = self._drained, None
                drained.callback(None)

    async def close_spider_async(self) -> None:
        if self._in_flight:
            logger.info("Waiting for %d item(s) still in the pipelines before closing them",
                        self._in_flight)
            self._drained = Deferred()
            await maybe_deferred_to_future(self._drained)
        await super().close_spider_async()
