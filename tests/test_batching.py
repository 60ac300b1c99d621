"""The write batcher that the index and item pipelines share (webfarm/batching.py), and
the item pipeline's batches when a write is retried."""

from __future__ import annotations

import asyncio
import datetime as dt

import pymongo
from scrapy import signals
from scrapy.http import HtmlResponse, Request
from scrapy.utils.test import get_crawler

from pipelines.items import ItemStorePipeline
from webfarm.batching import Batcher, recheck_on_responses
from webfarm.index import IndexStore
from webfarm.itemstore import ItemStore, make_entry
from webfarm.threads import StorageThreads


def idle_aware_batcher(crawler, written: list[list[str]], crawling: dict[str, bool]) -> Batcher:
    """A batcher whose batches land in ``written``, with a 10 s quiet period, idle while
    ``crawling["idle"]`` is True."""
    async def write(entries: list[str], retried: bool) -> list[str]:
        written.append(list(entries))
        return entries

    return Batcher(write, size=100, seconds=30, quiet=10, retry_seconds=1, what="test",
                   stats=crawler.stats, stat_prefix="t", idle=lambda: crawling["idle"])


def test_a_batch_does_not_wait_for_entries_that_cannot_come():
    """While the crawler has nothing in flight (the last response of a crawl was parsed, a
    lull) a batch goes a few ms after its last entry, not after its quiet period; the
    entries of one response still go together. A busy crawler's batch keeps waiting."""
    written: list[list[str]] = []
    crawler = get_crawler()
    crawling = {"idle": False}

    async def scenario() -> tuple[bool, list[str]]:
        batcher = idle_aware_batcher(crawler, written, crawling)
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


def test_a_batch_goes_when_the_last_response_in_flight_comes_back_without_entries():
    """Entries wait their quiet period while a request is in flight. When that request's
    response comes in (Scrapy's ``response_received``) nothing is in flight any more: the
    batch goes then, even though that response brings no entry of its own (an error page,
    a robots.txt), instead of after the quiet period."""
    written: list[list[str]] = []
    crawler = get_crawler()
    crawling = {"idle": False}

    async def scenario() -> tuple[bool, float]:
        batcher = idle_aware_batcher(crawler, written, crawling)
        recheck_on_responses(crawler, batcher)
        entry = asyncio.ensure_future(batcher.submit("a"))
        await asyncio.sleep(0.3)
        waited = not entry.done()
        crawling["idle"] = True  # the last request left the downloader
        request = Request("http://127.0.0.2/robots.txt")
        started = asyncio.get_running_loop().time()
        crawler.signals.send_catch_log(
            signals.response_received, request=request, spider=None,
            response=HtmlResponse(request.url, status=404, request=request))
        await asyncio.wait_for(entry, 5)
        return waited, asyncio.get_running_loop().time() - started

    waited, took = asyncio.run(scenario())
    assert waited
    assert took < 1  # not the quiet period of 10 s
    assert written == [["a"]]
    assert crawler.stats.get_value("t/idle_batches") == 1


def test_an_item_batch_retried_after_part_of_it_landed_counts_as_its_first_try(
        mongo_uri, mongo_db_name):
    """A connection lost between the insert and the update commands of one bulk write: the
    batcher retries the batch, which then finds its own inserts. The crawl's item counts
    stay those of a write that never failed."""
    crawler = get_crawler()
    index = IndexStore(mongo_uri, mongo_db_name)
    store = ItemStore(index.db)
    now = dt.datetime.now(dt.timezone.utc)
    entries = [make_entry({"_collection": "things", "_key": "k", "k": i}, None, "http://x/",
                          None, now) for i in range(3)]
    earlier = make_entry({"_collection": "things", "_key": "k", "k": 0}, None, "http://x/", None,
                         now - dt.timedelta(minutes=1))
    store.write_items([earlier])  # k=0 is stored (an update); k=1, 2 are new (inserts)
    admin = pymongo.MongoClient(mongo_uri).admin
    admin.command("configureFailPoint", "failCommand", mode={"times": 1},
                  data={"failCommands": ["update"], "closeConnection": True})
    pipeline = ItemStorePipeline(crawler, store, crawler.stats, StorageThreads(2), hasher=None,
                                 batch_size=3, batch_seconds=0.05, retry_seconds=30)

    async def submit() -> list[str]:
        return list(await asyncio.gather(*(pipeline.batcher.submit(e) for e in entries)))

    try:
        assert asyncio.run(submit()) == ["unchanged", "created", "created"]
        assert crawler.stats.get_value("webfarm/items/retries") == 1
    finally:
        admin.command("configureFailPoint", "failCommand", mode="off")
        index.client.drop_database(mongo_db_name)
        index.close()
