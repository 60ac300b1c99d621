"""Batched blob writes: they travel to the storage process many at a time, the same key
in one batch is written once, and a batch whose writes partly fail retries only those."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from scrapy.utils.test import get_crawler

from pipelines.blobs import BlobStorePipeline
from webfarm.batching import StorageUnavailable
from webfarm.blobstore import FileBlobStore, blob_key
from webfarm.items import PageItem
from webfarm.storeworker import StorageProcess

HOST = "127.0.0.2:8081"


def page(i: int, content_hash: str) -> PageItem:
    url = f"http://{HOST}/p/{i}"
    return PageItem(url=url, final_url=url, host=HOST, spider="t", status=200,
                    body=b"<p>%d</p>" % i, content_type="text/html", fetched_at=time.time(),
                    content_hash=content_hash)


def run_pages(pipeline: BlobStorePipeline, items: list[PageItem], during=None):
    async def scenario():
        tasks = [asyncio.ensure_future(pipeline.process_item(i)) for i in items]
        if during is not None:
            await during(tasks)
        done = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        await pipeline.threads.close()
        return done

    return asyncio.run(scenario())


def test_blob_writes_go_to_the_storage_process_in_batches_once_per_key(tmp_path: Path):
    store = FileBlobStore(tmp_path / "blobs")
    crawler = get_crawler()
    pipeline = BlobStorePipeline(store, crawler.stats, StorageProcess(4), concurrency=4)
    hashes = [f"{i % 30:02x}" * 32 for i in range(40)]  # 10 pages repeat a content
    items = [page(i, h) for i, h in enumerate(hashes)]

    done = run_pages(pipeline, items)

    assert [i.blob_key for i in done] == [blob_key(h) for h in hashes]
    assert sorted(store.iter_keys()) == sorted({blob_key(h) for h in hashes})
    stats = crawler.stats.get_stats()
    assert stats["webfarm/blobs/written"] == 30 and stats["webfarm/blobs/existing"] == 10
    assert stats["webfarm/blobs/batches"] < 40 and stats["webfarm/blobs/max_batch"] > 1
    assert store.get(blob_key(hashes[3])) == b"<p>3</p>"


def test_a_batch_retries_only_its_failed_writes(tmp_path: Path):
    root = tmp_path / "blobs"
    (root / "raw").mkdir(parents=True)
    (root / "raw" / "ab").write_bytes(b"")  # a file where the folder must go: writes fail
    store = FileBlobStore(root)
    crawler = get_crawler()
    pipeline = BlobStorePipeline(store, crawler.stats, StorageProcess(4), concurrency=4,
                                 retry_seconds=60)
    items = [page(0, "ab" * 32), page(1, "cd" * 32), page(2, "ef" * 32)]

    async def during(tasks):
        deadline = time.monotonic() + 10
        while not crawler.stats.get_value("webfarm/blobs/retries"):
            assert time.monotonic() < deadline, "the failing write was never retried"
            await asyncio.sleep(0.05)
        assert not tasks[0].done()  # held until its write succeeds
        (root / "raw" / "ab").unlink()  # the store recovers

    done = run_pages(pipeline, items, during)

    assert [i.blob_key for i in done] == [blob_key(i.content_hash) for i in items]
    assert sorted(store.iter_keys()) == sorted(blob_key(i.content_hash) for i in items)
    # The writes that had succeeded were not repeated: all three count as written now.
    assert crawler.stats.get_value("webfarm/blobs/written") == 3
    assert crawler.stats.get_value("webfarm/blobs/existing") is None


def test_content_stored_lately_is_not_asked_of_the_store_again(tmp_path: Path):
    """A mirror's page (content this worker stored a moment ago) costs no trip to the
    storage process: no S3 HEAD, no copy of its body; with WEBFARM_RECENT_BLOBS=0 it does."""
    hashes = [f"{i:02x}" * 32 for i in range(5)]

    def crawl(recent: int) -> tuple[FileBlobStore, dict]:
        store = FileBlobStore(tmp_path / f"blobs-{recent}")
        crawler = get_crawler()
        pipeline = BlobStorePipeline(store, crawler.stats, StorageProcess(2), concurrency=2,
                                     recent=recent)

        async def scenario():
            for round_ in range(3):  # the same five contents, under new URLs each round
                items = [page(5 * round_ + i, h) for i, h in enumerate(hashes)]
                done = await asyncio.wait_for(
                    asyncio.gather(*(pipeline.process_item(i) for i in items)), 30)
                assert [i.blob_key for i in done] == [blob_key(h) for h in hashes]
            await pipeline.threads.close()

        asyncio.run(scenario())
        return store, crawler.stats.get_stats()

    store, stats = crawl(recent=100)
    assert sorted(store.iter_keys()) == sorted(blob_key(h) for h in hashes)
    assert store.get(blob_key(hashes[2])) == b"<p>2</p>"  # the first page's body, kept
    assert stats["webfarm/blobs/written"] == 5
    assert stats["webfarm/blobs/existing"] == stats["webfarm/blobs/recent"] == 10
    first_round_batches = stats["webfarm/blobs/batches"]

    store, stats = crawl(recent=0)
    assert sorted(store.iter_keys()) == sorted(blob_key(h) for h in hashes)
    assert stats["webfarm/blobs/written"] == 5 and stats["webfarm/blobs/existing"] == 10
    assert "webfarm/blobs/recent" not in stats
    assert stats["webfarm/blobs/batches"] > first_round_batches  # rounds 2 and 3 asked too


def test_a_bad_recent_blobs_value_stops_the_crawl_at_start():
    crawler = get_crawler(settings_dict={"WEBFARM_RECENT_BLOBS": "lots"})
    with pytest.raises(ValueError, match="WEBFARM_RECENT_BLOBS='lots' is not a whole number "
                                         "of keys; 0 means none remembered"):
        BlobStorePipeline.from_crawler(crawler)


def test_a_page_whose_content_is_being_written_waits_for_that_write(tmp_path: Path):
    """Ten pages of one content at once: one write, one batch; the other nine wait for it
    instead of going to the store in the next batch (a HEAD each on S3)."""
    store = FileBlobStore(tmp_path / "blobs")
    crawler = get_crawler()
    pipeline = BlobStorePipeline(store, crawler.stats, StorageProcess(2), concurrency=2)
    items = [page(i, "ab" * 32) for i in range(10)]

    async def during(tasks):
        await asyncio.sleep(0)  # the first page's write is out; the rest come now
        tasks.extend(asyncio.ensure_future(pipeline.process_item(i)) for i in items[1:])

    done = run_pages(pipeline, items[:1], during)
    stats = crawler.stats.get_stats()
    assert list(store.iter_keys()) == [blob_key("ab" * 32)]
    assert len(done) == 10 and all(i.blob_key == blob_key("ab" * 32) for i in items)
    assert stats["webfarm/blobs/written"] == 1 and stats["webfarm/blobs/batches"] == 1
    assert stats["webfarm/blobs/existing"] == stats["webfarm/blobs/recent"] == 9


def test_a_page_waiting_on_a_write_that_gave_up_is_not_taken_as_stored(tmp_path: Path):
    root = tmp_path / "blobs"
    (root / "raw").mkdir(parents=True)
    (root / "raw" / "ab").write_bytes(b"")  # a file where the folder must go: writes fail
    crawler = get_crawler()
    pipeline = BlobStorePipeline(FileBlobStore(root), crawler.stats, StorageProcess(2),
                                 concurrency=2, retry_seconds=0.5)
    items = [page(i, "ab" * 32) for i in range(3)]

    async def scenario():
        first = asyncio.ensure_future(pipeline.process_item(items[0]))
        await asyncio.sleep(0)  # its write is out; the other two wait for it
        rest = [asyncio.ensure_future(pipeline.process_item(i)) for i in items[1:]]
        results = await asyncio.wait_for(
            asyncio.gather(first, *rest, return_exceptions=True), 30)
        await pipeline.threads.close()
        return results

    results = asyncio.run(scenario())
    # Each page's request must go back to the frontier: none is done, none counted stored.
    assert len(results) == 3 and all(isinstance(r, StorageUnavailable) for r in results), results
    stats = crawler.stats.get_stats()
    assert "webfarm/blobs/existing" not in stats and "webfarm/blobs/written" not in stats


def test_a_custom_hasher_s_odd_length_hash_is_stored_and_remembered(tmp_path: Path):
    store = FileBlobStore(tmp_path / "blobs")
    crawler = get_crawler()
    pipeline = BlobStorePipeline(store, crawler.stats, StorageProcess(2), concurrency=2)
    done = run_pages(pipeline, [page(0, "abc123def"), page(1, "abc123def")])
    assert [i.blob_key for i in done] == [blob_key("abc123def")] * 2
    assert list(store.iter_keys()) == [blob_key("abc123def")]
    assert crawler.stats.get_value("webfarm/blobs/recent") == 1
