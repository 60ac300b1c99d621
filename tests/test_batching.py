"""The write batcher that the index and item pipelines share (webfarm/batching.py)."""

from __future__ import annotations

import asyncio

from scrapy.utils.test import get_crawler

from webfarm.batching import Batcher


def test_a_batch_does_not_wait_for_entries_that_cannot_come():
    """While the crawler has nothing in flight (the last response of a crawl was parsed, a
    lull) a batch goes a few ms after its last entry, not after its quiet period; the
    entries of one response still go together. A busy crawler's batch keeps waiting."""
    written: list[list[str]] = []
    crawler = get_crawler()

    async def write(entries: list[str]) -> list[str]:
        written.append(list(entries))
        return entries

    crawling = {"idle": False}

    async def scenario() -> tuple[bool, list[str]]:
        batcher = Batcher(write, size=100, seconds=30, quiet=10, retry_seconds=1,
                          what="test", stats=crawler.stats, stat_prefix="t",
                          idle=lambda: crawling["idle"])
        first = asyncio.ensure_future(batcher.submit("a"))
        await asyncio.sleep(0.5)
        waited = not first.done()  # requests in flight: more entries may come
        crawling["idle"] = True  # the last response is in; its entries come now
        rest = [asyncio.ensure_future(batcher.submit(x)) for x in "bc"]
        return waited, await asyncio.wait_for(asyncio.gather(first, *rest), 5)

    waited, done = asyncio.run(scenario())
    assert waited
    assert done == ["a", "b", "c"]
    assert written == [["a", "b", "c"]]
    assert crawler.stats.get_value("t/idle_batches") == 1
