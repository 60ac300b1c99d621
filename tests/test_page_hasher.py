"""Content hashing in helper processes: the same results as in-process, a killed helper is
replaced, a page the hash function rejects raises its own error, and a helper that cannot
start stops the crawl at open with what to do."""

from __future__ import annotations

import asyncio
import os
import re
import signal

import pytest

from pipelines.content import PageHasher
from webfarm.config import ConfigError
from webfarm.content import DEFAULT_VOLATILE_PATTERNS, fingerprint
from webfarm.items import PageItem
from webfarm.storeworker import StorageProcessDied
from webfarm.threads import StorageThreads

PAGE = (b"<html><body><h1>Garden chair</h1><p>Sturdy and light, in stock since "
        b"2024-05-01 12:00:03.</p><a href='/chair?sid=abc123'>more</a></body></html>")
EXPECTED = fingerprint(PAGE, "text/html", None, DEFAULT_VOLATILE_PATTERNS, True)


def page(body: bytes = PAGE) -> PageItem:
    return PageItem(url="http://127.0.0.2/chair", final_url="http://127.0.0.2/chair",
                    host="127.0.0.2", spider="t", status=200, body=body,
                    content_type="text/html")


def hasher(processes: int = 1, volatile: tuple[str, ...] = DEFAULT_VOLATILE_PATTERNS
           ) -> PageHasher:
    return PageHasher(StorageThreads(1), volatile, True, processes=processes)


def session(test, hashing: PageHasher):
    async def go():
        try:
            return await asyncio.wait_for(test(), 60)
        finally:
            await hashing.close()
    return asyncio.run(go())


def test_helpers_hash_like_the_crawler_process_and_outside_it():
    hashing = hasher(processes=2)

    async def test():
        await hashing.start()
        pages = [page() for _ in range(6)]
        await asyncio.gather(*(hashing.ensure(p) for p in pages))
        return {(p.content_hash, p.simhash) for p in pages}, hashing.pids()

    results, pids = session(test, hashing)
    assert results == {EXPECTED}
    assert len(pids) == 2 and os.getpid() not in pids
    assert hashing.pids() == []  # closed: no helper left running


def test_a_killed_helper_is_replaced_and_the_page_hashed_again(caplog):
    hashing = hasher()

    async def test():
        await hashing.start()
        [pid] = hashing.pids()
        os.kill(pid, signal.SIGKILL)
        again = page()
        await hashing.ensure(again)
        return pid, (again.content_hash, again.simhash), hashing.pids(), hashing.restarts

    pid, result, pids, restarts = session(test, hashing)
    assert result == EXPECTED
    assert restarts == 1 and pids and pids != [pid]
    # named for what it is: a killed hashing helper was logged as "the storage process"
    assert f"The hashing process (pid {pid}) died; starting a new one" in caplog.text


def test_a_page_the_hash_function_rejects_raises_its_own_error():
    hashing = hasher(volatile=("(unclosed",))

    async def test():
        with pytest.raises(re.error, match=r"missing \)"):
            await hashing.ensure(page())
        return hashing.restarts, hashing.pids()

    restarts, pids = session(test, hashing)
    assert restarts == 0 and pids  # the helper kept serving


def test_closed_helpers_refuse_work_with_a_clear_error():
    hashing = hasher()

    async def test():
        await hashing.start()
        await hashing.close()
        with pytest.raises(StorageProcessDied, match="closed"):
            await hashing.ensure(page())

    session(test, hashing)


def test_a_helper_that_cannot_start_stops_the_crawl_with_what_to_do(monkeypatch):
    """A Python that cannot run the helper fails at open, not on every page later."""
    hashing = hasher()
    monkeypatch.setattr("sys.executable", "/bin/false")  # exits at once: no helper
    with pytest.raises(ConfigError, match="WEBFARM_HASH_PROCESSES=0"):
        session(hashing.start, hashing)
