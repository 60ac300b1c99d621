"""Store calls in the storage process: the stores' own results from another process, a
killed helper fails its calls as retryable and is replaced, errors come back as themselves
(or as a stand-in that says what they were), and what cannot go there says what to do."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time

import pymongo
import pytest

from webfarm.batching import TRANSIENT
from webfarm.blobstore import BlobMissing, FileBlobStore
from webfarm.config import ConfigError
from webfarm.index import IndexStore
from webfarm.items import PageItem
from webfarm.itemstore import ItemStore
from webfarm.storeworker import RemoteStoreError, StorageProcess, StorageProcessDied


class Unpicklable(Exception):
    """Its constructor does not take its args back, so unpickling it fails."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")


class UnpicklableDown(ConnectionError):
    def __init__(self, host: str, port: int) -> None:
        super().__init__(f"{host}:{port} refused")


def raise_unpicklable() -> None:
    raise Unpicklable("shelf", "broken")


def raise_unpicklable_down() -> None:
    raise UnpicklableDown("127.0.0.1", 9)


def session(test):
    """Run ``test(process)`` on a fresh loop with a helper of its own, then close it."""
    async def go():
        process = StorageProcess(4)
        try:
            return await asyncio.wait_for(test(process), 60)
        finally:
            await process.close(timeout=10)
    return asyncio.run(go())


def page(url: str, body: bytes) -> dict:
    item = PageItem(url=url, final_url=url, host="127.0.0.2:80", spider="t", status=200,
                    body=body, content_type="text/html", fetched_at=time.time(),
                    content_hash="a" * 64, blob_key="raw/aa/" + "a" * 64)
    return {**vars(item), "body": b"", "body_size": len(body)}


def test_store_calls_run_in_the_helper_and_return_what_the_store_returns(
        tmp_path, mongo_uri, mongo_db_name):
    blobs = FileBlobStore(tmp_path / "blobs")
    index = IndexStore(mongo_uri, mongo_db_name)

    async def test(process):
        pid = await process.run(os.getpid)
        await process.run(index.ensure_indexes)
        written = await asyncio.gather(*(process.run(blobs.put_once, "raw/ab/k", b"body",
                                                     {"url": "u"}) for _ in range(3)))
        records = await process.run(index.record_pages, [page("http://127.0.0.2/a", b"x" * 10)])
        return pid, written, records

    try:
        pid, written, records = session(test)
        assert pid != os.getpid()
        assert sorted(written) == [False, False, True]  # written once, by one of the three
        assert blobs.get("raw/ab/k") == b"body"  # a file this process reads back
        assert records[0].new_page and records[0].new_content
        assert index.pages.count_documents({}) == 1
        assert index.contents.find_one()["size"] == 10  # the size came, the body did not
    finally:
        index.close()


def test_the_crawlers_stores_leave_mongodb_to_the_helper(own_mongo):
    """A crawler's pipelines hold their stores only to send them to the helper: the
    stores open no connection in the crawler (each used to hold 2 idle ones, and 3
    threads) until something calls them there."""
    server = own_mongo
    with contextlib.ExitStack() as stack:
        # Polled monitoring: a streaming monitor opens a third connection of its own
        # at an unknown moment, which a loaded machine showed here as a false change.
        admin = stack.enter_context(pymongo.MongoClient(server.url, serverMonitoringMode="poll"))

        def connections() -> int:
            return admin.admin.command("serverStatus")["connections"]["current"]

        base = connections()
        index = IndexStore(server.url, "t")
        stack.callback(index.close)
        stack.callback(ItemStore.open(server.url, "t").close)
        deadline = time.monotonic() + 1.0  # a connected client opens its own in ms
        while time.monotonic() < deadline:
            assert connections() == base
            time.sleep(0.1)

        async def test(process):
            await process.run(index.ensure_indexes)
            return await process.run(index.record_pages, [page("http://127.0.0.2/a", b"x")])

        assert session(test)[0].new_page  # the helper opened its own client and wrote
        deadline = time.monotonic() + 10.0  # and closed it when it ended (the server
        while connections() != base and time.monotonic() < deadline:  # sees that soon)
            time.sleep(0.05)
        assert connections() == base
        assert index.pages.count_documents({}) == 1  # a call here connects here
        assert connections() > base


def test_a_killed_helper_fails_calls_in_flight_as_retryable_and_is_replaced(tmp_path):
    blobs = FileBlobStore(tmp_path / "blobs")

    async def test(process):
        first = await process.run(os.getpid)
        await process.run(blobs.put_once, "raw/aa/one", b"1", {})
        in_flight = asyncio.ensure_future(process.run(time.sleep, 30))
        await asyncio.sleep(0.3)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(StorageProcessDied, match="died with the call in flight") as died:
            await in_flight
        assert isinstance(died.value, TRANSIENT)  # the pipelines retry it with backoff
        # The next call starts a new helper, which is sent the store again.
        assert await process.run(blobs.put_once, "raw/aa/two", b"2", {}) is True
        return first, await process.run(os.getpid), process.restarts

    first, second, restarts = session(test)
    assert second != first and restarts == 1
    assert blobs.get("raw/aa/two") == b"2"


def test_errors_come_back_as_themselves_or_as_a_stand_in_of_their_kind(tmp_path):
    blobs = FileBlobStore(tmp_path / "blobs")

    async def test(process):
        with pytest.raises(BlobMissing, match="no blob raw/zz/missing"):  # the store's own
            await process.run(blobs.get, "raw/zz/missing")
        with pytest.raises(RemoteStoreError, match=r"Unpicklable: shelf: broken"):
            await process.run(raise_unpicklable)
        with pytest.raises(StorageProcessDied, match=r"UnpicklableDown: 127.0.0.1:9 refused"):
            await process.run(raise_unpicklable_down)  # transient, so still retried
        return process.restarts, await process.run(os.getpid)

    restarts, pid = session(test)
    assert restarts == 0 and pid != os.getpid()  # the helper kept serving


def test_what_cannot_go_to_the_helper_is_a_config_error_saying_what_to_do():
    async def test(process):
        with pytest.raises(ConfigError, match="WEBFARM_STORAGE_PROCESS=False"):
            await process.run(lambda: 1)
        return await process.run(os.getpid)

    assert session(test) != os.getpid()


def test_a_helper_that_cannot_start_is_a_config_error(monkeypatch):
    monkeypatch.setattr("sys.executable", "/bin/false")  # exits at once: no helper

    async def test(process):
        with pytest.raises(ConfigError, match="does not start.*WEBFARM_STORAGE_PROCESS=False"):
            await process.run(os.getpid)

    session(test)


def test_a_closed_helper_refuses_calls_and_is_gone(tmp_path):
    async def go():
        process = StorageProcess(1)
        pid = await process.run(os.getpid)
        await process.close(timeout=10)
        with pytest.raises(StorageProcessDied, match="closed"):
            await process.run(os.getpid)
        return pid

    pid = asyncio.run(asyncio.wait_for(go(), 60))
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_closed_helpers_are_reaped_by_asyncio_with_their_own_exit_code(caplog):
    """Killing a helper whose output had ended reaped it behind asyncio's child watcher:
    "Unknown child process pid ..., will report returncode 255" at 19 of 20 closes."""
    async def go():
        codes = []
        for _ in range(5):
            process = StorageProcess(1)
            await process.run(os.getpid)
            await process.close(timeout=10)
            codes.append(process._proc.returncode)
        return codes

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        codes = asyncio.run(asyncio.wait_for(go(), 60))
    assert codes == [0] * 5
    assert not [r for r in caplog.records if "child process" in r.getMessage()]


def test_the_pipe_to_the_helper_holds_several_pages():
    """Bodies go to the helpers through a pipe; Linux's default 64 KiB held less than one
    100 KB page, so the crawler's event loop kept queuing and re-copying them (a 100 KB
    crawl ran 100 pages/s with it, 118 with 1 MiB)."""
    import fcntl
    from pathlib import Path

    want = min(1 << 20, int(Path("/proc/sys/fs/pipe-max-size").read_text()))

    async def test(process):
        body = os.urandom(300_000)
        assert await process.run(len, body) == len(body)
        pipe = process._proc.stdin.transport.get_extra_info("pipe")
        return fcntl.fcntl(pipe.fileno(), fcntl.F_GETPIPE_SZ)

    assert session(test) >= want


@pytest.mark.parametrize(("sched_batch", "policy"), [(True, os.SCHED_BATCH),
                                                     (False, os.SCHED_OTHER)])
def test_helpers_run_under_sched_batch_unless_told_not_to(sched_batch, policy):
    """Under SCHED_BATCH a helper's wakeups do not preempt the crawler on its CPU; every
    thread of the helper (the pool's threads start after the policy is set) has it."""
    async def go():
        process = StorageProcess(4, sched_batch=sched_batch)
        try:
            # calls at once, so that several of the pool's threads answer
            threads = await asyncio.gather(*(process.run(os.sched_getscheduler, 0)
                                             for _ in range(8)))
            return threads, os.sched_getscheduler(process.pid)
        finally:
            await process.close(timeout=10)

    threads, main_thread = asyncio.run(asyncio.wait_for(go(), 60))
    assert set(threads) == {policy}
    assert main_thread == policy
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the crawler's own is left alone


def test_the_setting_reaches_the_storage_and_hashing_helpers():
    from scrapy.utils.test import get_crawler

    from pipelines.content import PageHasher
    from webfarm.threads import storage_calls, storage_threads

    for value, want in ((None, True), (False, False)):
        settings = {} if value is None else {"WEBFARM_HELPER_SCHED_BATCH": value}
        crawler = get_crawler(settings_dict=settings)
        hasher = PageHasher.from_settings(crawler.settings, storage_threads(crawler))
        assert storage_calls(crawler).sched_batch is want
        assert all(h.sched_batch is want for h in hasher._ensure_helpers())


def test_a_refused_sched_batch_says_so_and_the_helper_keeps_serving(monkeypatch, capsys):
    from webfarm import storeworker

    def refuse(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    storeworker._batch_scheduling()  # no exception: the helper goes on under the old policy
    err = capsys.readouterr().err
    assert "SCHED_BATCH refused (" in err and "Operation not permitted" in err
    assert "Set WEBFARM_HELPER_SCHED_BATCH=False" in err
