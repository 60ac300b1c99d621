"""Scrapy's item pipeline manager, noting at the head of each item's chain which page the
item came from.

The item store finds an item's page by the item object (:func:`webfarm.items.source_of`).
A project's pipeline that returns a new object (``dataclasses.replace``, a cleaned copy)
would leave the store without it: the item was stored with an empty ``source_url`` and no
``content_hash``. Scrapy awaits one item's pipelines one after the other in one coroutine,
so a context variable set here, before the first pipeline of any priority, is that chain's
own when the item store reads it. It is ``ITEM_PROCESSOR``.
"""

from __future__ import annotations

from typing import Any

from scrapy.pipelines import ItemPipelineManager

from webfarm.items import PageItem, enter_chain


class ItemChainManager(ItemPipelineManager):
    async def process_item_async(self, item: Any) -> Any:
        if not isinstance(item, PageItem):
            enter_chain(item)
        return await super().process_item_async(item)
