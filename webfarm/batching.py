"""Batched, retried storage writes that an item pipeline can await.

Why the awaiting matters: the frontier acknowledges a request's lease only
when every item of its response went through the pipelines. So an item's
``process_item`` must not return before the batch holding it was written —
otherwise a ``kill -9`` between the two would lose an acknowledged page. Each
:meth:`Batcher.submit` returns only when its batch is stored, and raises if it
could not be (the request then goes back to the frontier, see
:meth:`webfarm.leaseends.LeaseEnds.item_error`).

A batch is written when it holds ``size`` entries, its oldest entry waited
``seconds``, or no entry came for ``quiet`` seconds (nothing more is on its way:
the end of a crawl, a lull; waiting longer would only delay the acks), or for
``IDLE_QUIET_SECONDS`` while the crawler has nothing in flight (``idle``, see
:func:`engine_idle`: no entry can come before a request goes out and its response
is parsed, so the batch goes once the items of the responses being parsed are in,
not 50 ms later; measured at the end of a crawl of the test web: 0.10 s from the
last response to the last item stored became 0.07 s; each response that comes in
checks again, see :func:`recheck_on_responses`); up to
``writers`` batches are written at once (the index's writes are safe in any
order), and while they are busy the next batch fills (group commit). A failing
store is retried with exponential backoff (full jitter) for up to
``retry_seconds``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from scrapy import signals
from scrapy.crawler import Crawler
from scrapy.settings import BaseSettings
from scrapy.statscollectors import StatsCollector

from webfarm.exceptions import ItemError

logger = logging.getLogger(__name__)

E = TypeVar("E")
R = TypeVar("R")

# Defaults of the batched pipelines (settings/base.py holds the same values).
BATCH_SIZE = 200
BATCH_SECONDS = 0.2
BATCH_WRITERS = 2
QUIET_SECONDS = 0.05  # a crawl at speed sends a page every few ms; 50 ms without one is a lull
IDLE_QUIET_SECONDS = 0.005  # nothing in flight: a response's items come within a turn or two
RETRY_SECONDS = 300.0


def batch_options(settings: BaseSettings) -> dict[str, Any]:
    """The ``WEBFARM_INDEX_BATCH_*`` / ``WEBFARM_STORAGE_RETRY_SECONDS`` settings as the
    keyword arguments the page and item pipelines take (they batch alike)."""
    return {
        "batch_size": settings.getint("WEBFARM_INDEX_BATCH_SIZE", BATCH_SIZE),
        "batch_seconds": settings.getfloat("WEBFARM_INDEX_BATCH_SECONDS", BATCH_SECONDS),
        "retry_seconds": settings.getfloat("WEBFARM_STORAGE_RETRY_SECONDS", RETRY_SECONDS),
        "writers": settings.getint("WEBFARM_INDEX_WRITERS", BATCH_WRITERS),
    }


class StorageUnavailable(Exception):
    """A store kept failing for longer than ``WEBFARM_STORAGE_RETRY_SECONDS``."""


class StoreHung(TimeoutError):
    """A store call that did not answer within the retry window left."""


class StorageErrorLines(logging.Filter):
    """Scrapy's "Error processing {item}" for an item refused for good, made one line
    without the item or a traceback; and for an item whose store stayed down past
    ``WEBFARM_STORAGE_RETRY_SECONDS``, made one WARNING line a minute without a traceback
    (the others DEBUG): the outage is said by the store's own lines, and the request goes
    back to the frontier. A probe's 20 s MongoDB outage wrote 156 ERRORs and 624
    tracebacks."""

    EVERY = 60.0

    def __init__(self) -> None:
        super().__init__()
        self._said = float("-inf")
        self._since = 0  # items not said since

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, ItemError):
            # An item refused for good (no key, 17 MB, a Decimal): its message says what
            # to fix. Scrapy's line held the whole item (a 17 MB log line) and a traceback.
            record.exc_info, record.exc_text = None, None
            record.msg, record.args = "Item not stored: %s", (error,)
            return True
        if not isinstance(error, StorageUnavailable):
            return True
        record.exc_info, record.exc_text = None, None
        now = time.monotonic()
        if now - self._said < self.EVERY:
            self._since += 1
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.msg, record.args = "Item not stored, its request goes back: %s", (error,)
            return True
        more = f" (and {self._since} more items since the last such line)" if self._since else ""
        self._said, self._since = now, 0
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg = ("Items not stored, their requests go back to the frontier to be fetched "
                      "and stored again: %s%s")
        record.args = (error, more)
        return True


def quiet_storage_errors() -> None:
    """Install :class:`StorageErrorLines` on Scrapy's scraper logger, once a process."""
    scraper = logging.getLogger("scrapy.core.scraper")
    if not any(isinstance(f, StorageErrorLines) for f in scraper.filters):
        scraper.addFilter(StorageErrorLines())


async def _bounded(call: Callable[[], Awaitable[R]], limit: float | None) -> R:
    if limit is None:
        return await call()
    began = time.monotonic()
    try:
        return await asyncio.wait_for(call(), limit)
    except TimeoutError as exc:
        if time.monotonic() - began < limit:
            raise  # the call's own timeout
        raise StoreHung(f"no answer in {limit:.1f}s (a server stopped, or a network "
                        "dropping packets?)") from exc


def transient_errors() -> tuple[type[BaseException], ...]:
    """Errors worth retrying: the store is down, slow or refusing for now."""
    errors: list[type[BaseException]] = [OSError, TimeoutError]
    try:
        from pymongo.errors import PyMongoError

        errors.append(PyMongoError)
    except ImportError:  # pragma: no cover
        pass
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        errors += [BotoCoreError, ClientError]
    except ImportError:  # pragma: no cover
        pass
    return tuple(errors)


TRANSIENT = transient_errors()


def backoff_delay(attempt: int, base: float = 0.25, cap: float = 10.0) -> float:
    """Seconds to wait before retry ``attempt`` (0 first): full jitter, growing to ``cap``,
    so workers that failed together do not come back together."""
    return random.uniform(0, min(cap, base * 2 ** attempt))


class Outage:
    """One store failing for a while: how long to wait before each retry (full jitter,
    growing to ``cap``), and when to give up: ``retry_seconds`` after the first failure
    (:class:`StorageUnavailable`). It logs once when it starts and once when a call
    succeeds again. Shared by the crawl's awaited writes (:func:`retrying`) and
    re-parse's blocking calls (:class:`webfarm.reparse.Reparser`), so both wait and
    say it alike."""

    def __init__(self, what: str, retry_seconds: float, base: float = 0.25,
                 cap: float = 10.0) -> None:
        self.what = what
        self.retry_seconds = retry_seconds
        self.base = base
        self.cap = cap
        self.started: float | None = None
        self.attempt = 0  # retries in this outage

    def time_left(self, now: float) -> float | None:
        """How long the next attempt may take: what is left of the retry window (all of
        it outside an outage); None for no limit (``retry_seconds`` 0: no retry)."""
        if self.retry_seconds <= 0:
            return None
        if self.started is None:
            return self.retry_seconds
        # The last attempt gets a second at least: cut at 0.01 s it "hung", and that was
        # what the dead letter and the WARNING said instead of the store's own error
        # (NoSuchBucket, refused).
        return max(self.retry_seconds - (now - self.started), min(1.0, self.retry_seconds))

    def failed(self, exc: BaseException, since: float | None = None) -> float:
        """Seconds to wait before the next attempt; past the limit, StorageUnavailable.
        ``since``: when the failed attempt began, for one that hung until its limit."""
        now = time.monotonic()
        if self.started is None:
            self.started = now if since is None else since
        if self.attempt == 0 and now - self.started < self.retry_seconds:  # else it gives up
            logger.warning("%s failed (%s: %s); retrying with backoff for up to %gs "
                           "(WEBFARM_STORAGE_RETRY_SECONDS)", self.what, type(exc).__name__,
                           str(exc)[:300], self.retry_seconds)
        elapsed = now - self.started
        if elapsed >= self.retry_seconds:
            raise StorageUnavailable(
                f"{self.what} failed for {elapsed:.1f}s (WEBFARM_STORAGE_RETRY_SECONDS="
                f"{self.retry_seconds:g}): {type(exc).__name__}: {str(exc)[:300]}") from exc
        delay = backoff_delay(self.attempt, self.base, self.cap)
        self.attempt += 1
        return min(delay, self.retry_seconds - elapsed) + 0.01

    def ended(self) -> None:
        """A call succeeded: the outage, if there was one, is over."""
        if self.started is not None:
            logger.info("%s works again after %d retries (%.1fs)", self.what, self.attempt,
                        time.monotonic() - self.started)
            self.started, self.attempt = None, 0


async def retrying(
    call: Callable[[], Awaitable[R]], *, what: str, retry_seconds: float,
    stats: StatsCollector | None = None, stat_prefix: str = "webfarm/storage",
    base: float = 0.25, cap: float = 10.0,
) -> R:
    """Await ``call()`` until it succeeds; on transient errors wait and retry as
    :class:`Outage` says, then raise StorageUnavailable. An attempt that does not answer
    within what is left of the window counts as failed from when it began: a MongoDB
    that hangs (a stopped server, a network that drops packets; pymongo sets no socket
    timeout) held a write, and the leases waiting on it, until it woke up, for ever if it
    never did."""
    outage = Outage(what, retry_seconds, base, cap)
    while True:
        began = time.monotonic()
        try:
            result = await _bounded(call, outage.time_left(began))
        except TRANSIENT as exc:
            try:
                delay = outage.failed(exc, began if isinstance(exc, StoreHung) else None)
            except StorageUnavailable:
                if stats is not None:
                    stats.inc_value(f"{stat_prefix}/gave_up")
                raise
            if stats is not None:
                stats.inc_value(f"{stat_prefix}/retries")
            await asyncio.sleep(delay)
            continue
        outage.ended()
        return result


class Batcher(Generic[E, R]):
    """Collects entries and writes them in batches with ``write(entries, retried)`` (an
    async callable returning one result per entry; ``retried`` is True when an earlier
    attempt at these very entries failed, and may have landed in part)."""

    def __init__(
        self, write: Callable[[list[E], bool], Awaitable[list[R]]], *, size: int,
        seconds: float,
        retry_seconds: float, what: str, stats: StatsCollector | None = None,
        stat_prefix: str = "webfarm/storage", writers: int = 1,
        quiet: float = QUIET_SECONDS, idle: Callable[[], bool] | None = None,
    ) -> None:
        self.write = write
        self.size = max(1, size)
        self.seconds = max(0.0, seconds)
        self.retry_seconds = retry_seconds
        self.what = what
        self.stats = stats
        self.stat_prefix = stat_prefix
        self.writers = max(1, writers)
        self.quiet = min(max(0.0, quiet), self.seconds)
        self._pending: list[tuple[E, asyncio.Future[R], float]] = []
        self.idle = idle
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._active: set[asyncio.Future[None]] = set()

    async def submit(self, entry: E) -> R:
        """Returns the entry's result once its batch is stored; raises if it never was."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._pending.append((entry, future, time.monotonic()))
        self._kick()
        return await future

    def recheck(self, **_: Any) -> None:
        """See again whether the pending batch is due: the crawler may have nothing in flight
        now (a signal handler, see :func:`recheck_on_responses`)."""
        self._kick()

    async def flush(self) -> None:
        """Write everything pending now (closing)."""
        while self._pending or self._active:
            if self._pending and len(self._active) < self.writers:
                self._start()
                continue
            await asyncio.wait(set(self._active))

    def _due_at(self) -> tuple[float, float]:
        """When the pending batch is due by time: its window (its oldest entry's deadline,
        or sooner when entries stopped coming: the newest pending one is the newest
        submitted), and sooner still while no entry can come (the crawler has nothing in
        flight); returns ``(due, window)``."""
        last = self._pending[-1][2]
        window = min(self._pending[0][2] + self.seconds, last + self.quiet)
        if self.idle is not None and last + IDLE_QUIET_SECONDS < window and self.idle():
            return last + IDLE_QUIET_SECONDS, window
        return window, window

    def _kick(self) -> None:
        while self._pending and len(self._active) < self.writers:
            if len(self._pending) < self.size:
                due, window = self._due_at()
                now = time.monotonic()
                if now < due:
                    self._arm(due)
                    return
                if now < window and self.stats is not None:  # due only as nothing can come
                    self.stats.inc_value(f"{self.stat_prefix}/idle_batches")
            self._start()

    def _arm(self, due: float) -> None:
        """The timer that kicks again at ``due``; an armed one that is later is replaced
        (the crawler went idle since it was armed)."""
        if self._timer is not None and due < self._timer_at:
            self._timer.cancel()
            self._timer = None
        if self._timer is None:
            self._timer_at = due
            wait = max(0.0, due - time.monotonic())
            self._timer = asyncio.get_running_loop().call_later(wait, self._on_timer)

    def _start(self) -> None:
        """One batch to a writer (at most ``writers`` batches are written at once)."""
        batch, self._pending = self._pending[: self.size], self._pending[self.size:]
        task = asyncio.ensure_future(self._write_batch(batch))
        self._active.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[None]) -> None:
        self._active.discard(task)
        self._kick()

    def _on_timer(self) -> None:
        self._timer = None
        self._kick()

    async def _write_batch(self, batch: list[tuple[E, asyncio.Future[R], float]]) -> None:
        entries = [entry for entry, _, _ in batch]
        attempts = itertools.count()
        try:
            results = await retrying(
                lambda: self.write(entries, next(attempts) > 0),
                what=f"{self.what} ({len(entries)} {'entry' if len(entries) == 1 else 'entries'})",
                retry_seconds=self.retry_seconds, stats=self.stats,
                stat_prefix=self.stat_prefix,
            )
        except Exception as exc:  # every waiting item fails with it; the leases are retried
            for _, future, _ in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        if self.stats is not None:
            self.stats.inc_value(f"{self.stat_prefix}/batches")
            self.stats.max_value(f"{self.stat_prefix}/max_batch", len(entries))
        for (_, future, _), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)


def engine_idle(crawler: Crawler) -> Callable[[], bool]:
    """Whether ``crawler``'s downloader has no request in flight and no response waits
    to be parsed: then no new entry can come before a request goes out and comes back,
    and a batch that waits its ``quiet`` period for one only delays its write (and the
    acks of its requests). False outside a crawl (no engine)."""
    def idle() -> bool:
        try:
            engine = crawler.engine
        except RuntimeError:  # Scrapy 2.19 raises before the crawl has started
            return False
        if engine is None or engine.downloader.active:
            return False
        slot = engine.scraper.slot
        return slot is None or not slot.queue
    return idle


def recheck_on_responses(crawler: Crawler, batcher: Batcher[Any, Any]) -> None:
    """Re-check ``batcher`` each time a response comes in (Scrapy's ``response_received``,
    sent once its request left the downloader). Why: the entries pending from earlier
    responses wait their quiet period while a request is in flight; when the last one
    comes back they may go at once. Without this only a new entry checked again, so when
    the last response brought no entry (an error page, a robots.txt) the crawl's last
    batch, and the acks of its requests, waited 50 ms more."""
    crawler.signals.connect(batcher.recheck, signal=signals.response_received)
