"""Content hashing in helper processes: same results as in-process, a killed helper is
replaced, a failing page raises a clear error, and a crawl hashes outside its own process."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from webfarm.content import DEFAULT_VOLATILE_PATTERNS, fingerprint
from webfarm.hashworker import HashError, HashWorkerDied, HashWorkers

PAGE = (b"<html><body><h1>Garden chair</h1><p>Sturdy and light, in stock since "
        b"2024-05-01 12:00:03.</p><a href='/chair?sid=abc123'>more</a></body></html>")
ARGS = (PAGE, "text/html", None, DEFAULT_VOLATILE_PATTERNS, True)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_helpers_hash_like_the_crawler_process_and_outside_it():
    workers = HashWorkers(2)

    async def go():
        return await asyncio.gather(*(workers.fingerprint(*ARGS) for _ in range(6)))

    try:
        results = run(go())
        pids = workers.pids()
    finally:
        workers.close()
    assert set(results) == {fingerprint(*ARGS)}
    assert pids and os.getpid() not in pids and len(pids) <= 2
    assert workers.pids() == []  # closed: no helper left running


def test_a_killed_helper_is_replaced_and_the_page_hashed_again():
    workers = HashWorkers(1)
    try:
        first = run(workers.fingerprint(*ARGS))
        [pid] = workers.pids()
        os.kill(pid, signal.SIGKILL)
        again = run(workers.fingerprint(*ARGS))
        assert again == first
        assert workers.restarts == 1 and workers.pids() != [pid]
    finally:
        workers.close()


def test_a_page_the_hash_function_rejects_raises_with_its_reason():
    workers = HashWorkers(1)
    try:
        with pytest.raises(HashError, match=r"error: missing \)"):
            run(workers.fingerprint(PAGE, "text/html", None, ("(unclosed",), False))
        assert run(workers.fingerprint(*ARGS)) == fingerprint(*ARGS)  # still serving
        assert workers.restarts == 0
    finally:
        workers.close()


def test_closed_helpers_refuse_work_with_a_clear_error():
    workers = HashWorkers(1)
    workers.close()
    with pytest.raises(HashWorkerDied, match="closed"):
        run(workers.fingerprint(*ARGS))


def test_a_helper_that_cannot_start_stops_the_crawl_with_what_to_do(monkeypatch):
    """A Python that cannot run the helper fails at open, not on every page later."""
    from pipelines.content import PageHasher
    from webfarm.config import ConfigError
    from webfarm.threads import StorageThreads

    hasher = PageHasher(StorageThreads(1), DEFAULT_VOLATILE_PATTERNS, True, processes=1)
    monkeypatch.setattr("sys.executable", "/bin/false")  # exits at once: no helper
    with pytest.raises(ConfigError, match="WEBFARM_HASH_PROCESSES=0"):
        run(hasher.start())
