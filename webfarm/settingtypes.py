"""Setting values of the wrong type, refused in one line before a crawl starts.

``-s NAME=VALUE``, scrapyd's ``setting=NAME=VALUE`` and a spider's ``custom_settings``
give strings or any Python value, and Scrapy converts them where a component reads
them: ``-s WEBFARM_HOST_DELAY=abc`` ended the crawl with "Task exception was never
retrieved" and a ``ValueError`` traceback, and ``-s WEBFARM_IDLE_TIMEOUT=soon`` with
"Engine slot not assigned". :func:`check_types` reads every setting that has a number
or a boolean as its default (in this project's settings module, or in Scrapy's) the way
the code reads it, and names the first that does not read, with its default.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings, default_settings
from scrapy.utils.project import ENVVAR

#: What a setting must read as, by the type of its default.
BOOLEAN, WHOLE, NUMBER = "a boolean (True/False or 1/0)", "a whole number", "a number"
#: Counts where below 0 means nothing, with what 0 means: refused rather than guessed at
#: (read at start by :func:`webfarm.config.whole_number` or the frontier, a negative one
#: ended ``scrapy crawl`` in a traceback, or in "Engine slot not assigned").
NOT_NEGATIVE = {
    "WEBFARM_HOST_BUDGET": "no limit",
    "WEBFARM_HOST_MEMORY": "no limit",
    "WEBFARM_MAX_ENTRY_BYTES": "no limit",
    "WEBFARM_MAX_HEADER_BYTES": "no limit",
    "WEBFARM_MAX_LINKS_PER_PAGE": "no limit",
    "WEBFARM_RECENT_BLOBS": "none remembered",
    "WEBFARM_RECENT_FINGERPRINTS": "none remembered",
}

#: Numbers a component needs within bounds, with the bounds in words. Out of them, the
#: component raised as the crawl started and it ended in a traceback ("bloom_capacity must
#: be >= 1", "max_workers must be greater than 0"), a negative lease expired at once and
#: pages were fetched twice, and a negative DOWNLOAD_TIMEOUT or SCRAPER_SLOT_MAX_ACTIVE_SIZE
#: (Scrapy's) hung the worker.
BOUNDS: dict[str, tuple[str, Callable[[float], bool]]] = {
    "WEBFARM_BLOOM_CAPACITY": ("1 or more", lambda v: v >= 1),
    "WEBFARM_BLOOM_ERROR_RATE": ("above 0 and below 1", lambda v: 0 < v < 1),
    "WEBFARM_STORAGE_THREADS": ("1 or more", lambda v: v >= 1),
    "WEBFARM_METRICS_BUCKET": ("1 or more (seconds)", lambda v: v >= 1),
    "WEBFARM_REFETCH_MEMORY": ("1 or more", lambda v: v >= 1),
    "WEBFARM_FLUSH_INTERVAL": ("above 0 (seconds)", lambda v: v > 0),
    "WEBFARM_LEASE_SECONDS": ("above 0 (seconds)", lambda v: v > 0),
    "WEBFARM_ROBOTS_LOCK_SECONDS": ("1 or more (seconds)", lambda v: v >= 1),
    "WEBFARM_OFFSITE_WAIT": ("0 or more (seconds)", lambda v: v >= 0),
    # below 0 ran the worker for ever, as 0 does, without a word
    "WEBFARM_IDLE_TIMEOUT": ("0 or more (seconds; 0: never stop)", lambda v: v >= 0),
    "AUTOTHROTTLE_MAX_DELAY": ("0 or more (seconds)", lambda v: v >= 0),
    "DOWNLOAD_TIMEOUT": ("above 0 (seconds)", lambda v: v > 0),
    "SCRAPER_SLOT_MAX_ACTIVE_SIZE": ("1 or more (bytes)", lambda v: v >= 1),
    # below 0 dead-lettered every page as "body over DOWNLOAD_MAXSIZE (-1 B)", exit 0
    "DOWNLOAD_MAXSIZE": ("0 or more (bytes; 0: no limit)", lambda v: v >= 0),
    "DOWNLOAD_WARNSIZE": ("0 or more (bytes; 0: no warning)", lambda v: v >= 0),
    # 0 or below: no request ever left, and SIGTERM's graceful stop waited for ever.
    "CONCURRENT_REQUESTS_PER_DOMAIN": ("1 or more", lambda v: v >= 1),
    # Each of these below was taken in silence and read as something else: 0 attempts as
    # 1, a batch of 0 pages, a rate of 5 that no host ever reaches, port 99999 a traceback
    # from the metrics server with the crawl going on without it.
    "WEBFARM_RETRY_TIMES": ("1 or more (attempts)", lambda v: v >= 1),
    "RETRY_TIMES": ("0 or more", lambda v: v >= 0),
    "DOWNLOAD_DELAY": ("0 or more (seconds)", lambda v: v >= 0),
    "CONCURRENT_REQUESTS": ("1 or more", lambda v: v >= 1),
    "WEBFARM_INDEX_BATCH_SIZE": ("1 or more", lambda v: v >= 1),
    "WEBFARM_INDEX_WRITERS": ("1 or more", lambda v: v >= 1),
    "WEBFARM_BLOB_CONCURRENCY": ("1 or more", lambda v: v >= 1),
    "WEBFARM_S3_MAX_ATTEMPTS": ("1 or more", lambda v: v >= 1),
    "WEBFARM_RECRAWL_BATCH": ("1 or more", lambda v: v >= 1),
    "WEBFARM_NEARDUP_DISTANCE": ("0 to 64 (bits; WEBFARM_NEARDUP=False turns it off)",
                                 lambda v: 0 <= v <= 64),
    "WEBFARM_PROMETHEUS_PORT": ("0 to 65535 (0: no /metrics)", lambda v: 0 <= v <= 65535),
    "WEBFARM_MONITOR_INTERVAL": ("above 0 (seconds)", lambda v: v > 0),
    "WEBFARM_METRICS_FLUSH_INTERVAL": ("above 0 (seconds)", lambda v: v > 0),
    "WEBFARM_ALERT_SUCCESS_RATE": ("0 to 1 (a share of requests)", lambda v: 0 <= v <= 1),
    "WEBFARM_ALERT_SUCCESS_DROP": ("0 to 1 (a share of the rate before)",
                                   lambda v: 0 <= v <= 1),
    "WEBFARM_ALERT_SUCCESS_RECOVER": ("0 to 1 (a share of requests)", lambda v: 0 <= v <= 1),
    "WEBFARM_RENDER_PROBE_RATE": ("0 to 1 (a share of pages)", lambda v: 0 <= v <= 1),
    "WEBFARM_RENDER_HOST_SHARE": ("0 to 1 (a share of pages)", lambda v: 0 <= v <= 1),
    "PLAYWRIGHT_MAX_CONTEXTS": ("1 or more", lambda v: v >= 1),
    "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT": ("1 or more", lambda v: v >= 1),
}


#: Lists of HTTP statuses, read with ``int()`` as a component starts: ``abc`` in one ended
#: the crawl in a ``ValueError`` traceback (and, without proxies, was taken in silence).
STATUS_LISTS = ("WEBFARM_PROXY_BAN_STATUSES", "RETRY_HTTP_CODES", "HTTPERROR_ALLOWED_CODES")


def check_status_lists(settings: BaseSettings) -> None:
    """ValueError naming a status list with an entry that is no HTTP status (100-599)."""
    for name in STATUS_LISTS:
        if name not in settings:
            continue
        try:
            entries = settings.getlist(name)
        except (TypeError, ValueError):
            entries = [settings[name]]
        for entry in entries:
            try:
                ok = 100 <= int(str(entry).strip()) <= 599
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"{name}={settings[name]!r}: {entry!r} is not an HTTP status; "
                                 "give statuses from 100 to 599, e.g. 403,429, "
                                 f"in {_where_set(settings, name)}")


#: Scrapy's settings its code reads with ``getint``: ``-s DOWNLOAD_MAXSIZE=1e3`` or
#: ``CONCURRENT_REQUESTS_PER_DOMAIN=1.5`` passed as numbers and ended in a traceback.
SCRAPY_WHOLE = frozenset({
    "CLOSESPIDER_ERRORCOUNT", "CLOSESPIDER_ITEMCOUNT", "CLOSESPIDER_PAGECOUNT",
    "CLOSESPIDER_TIMEOUT_NO_ITEM", "CONCURRENT_ITEMS", "CONCURRENT_REQUESTS",
    "CONCURRENT_REQUESTS_PER_DOMAIN", "CONCURRENT_REQUESTS_PER_IP", "DEPTH_LIMIT",
    "DEPTH_PRIORITY", "DNSCACHE_SIZE", "DOWNLOAD_MAXSIZE", "DOWNLOAD_WARNSIZE",
    "FEED_EXPORT_BATCH_ITEM_COUNT", "METAREFRESH_MAXDELAY", "REACTOR_THREADPOOL_MAXSIZE",
    "REDIRECT_MAX_TIMES", "RETRY_TIMES", "SCRAPER_SLOT_MAX_ACTIVE_SIZE", "URLLENGTH_LIMIT",
})


def check_types(settings: BaseSettings) -> None:
    """ValueError naming the first setting whose value does not read as its default's
    type: a boolean, a whole number (webfarm's own counts, read with ``getint``) or a
    number (seconds, rates; Scrapy reads its own numbers as floats in places)."""
    for name, default, kind, source in _typed_defaults():
        if name not in settings:
            continue
        value = settings[name]
        if not _reads_as(settings, name, kind):
            raise ValueError(f"{name}={value!r} is not {kind} ({source}: {default!r}); fix "
                             f"{_where_set(settings, name)}")
        # webfarm's numbers are seconds, counts, sizes or shares: none means anything below 0
        # (WEBFARM_HOST_DELAY=-1 crawled with no delay, WEBFARM_RECRAWL_INTERVAL=-5 was off)
        if (kind != BOOLEAN and name.startswith("WEBFARM_") and name not in NOT_NEGATIVE
                and name not in BOUNDS and settings.getfloat(name) < 0):
            raise ValueError(f"{name}={value!r} is below 0; give 0 or more ({source}: "
                             f"{default!r}), in {_where_set(settings, name)}")
    for name, zero in NOT_NEGATIVE.items():
        if name in settings and settings.getint(name) < 0:
            raise ValueError(f"{name}={settings[name]!r} is below 0; give a number, or 0 for "
                             f"{zero}, in {_where_set(settings, name)}")
    for name, (wanted, fits) in BOUNDS.items():
        if name in settings and not fits(settings.getfloat(name)):
            raise ValueError(f"{name}={settings[name]!r} is out of range: give a number "
                             f"{wanted}, in {_where_set(settings, name)}")
    check_slots(settings)
    check_status_lists(settings)


def _where_set(settings: BaseSettings, name: str) -> str:
    """Where a setting's value came from, for the message that says to fix it."""
    variable = settings.getdict("WEBFARM_FROM_ENVIRONMENT").get(name)
    priority = settings.getpriority(name)
    if variable and priority == SETTINGS_PRIORITIES["project"]:
        return f"the environment variable {variable} that set it"
    if priority == SETTINGS_PRIORITIES["project"]:
        return f"the project's settings module ({os.environ.get(ENVVAR) or 'settings'})"
    if priority == SETTINGS_PRIORITIES["spider"]:
        return "the spider's custom_settings (or update_settings) that set it"
    return (f"the -s {name}=..., scrapyd's setting={name}=... or the spider's "
            "custom_settings that set it")


def check_slots(settings: BaseSettings) -> None:
    """ValueError unless ``DOWNLOAD_SLOTS`` maps slot names to dicts whose ``delay`` and
    ``concurrency`` are numbers (the frontier reads the delays at start)."""
    try:
        slots = settings.getdict("DOWNLOAD_SLOTS")
    except (TypeError, ValueError):
        slots = None
    example = '{"example.com": {"delay": 2.0, "concurrency": 1}}'
    if slots is None:
        raise ValueError(f"DOWNLOAD_SLOTS={settings['DOWNLOAD_SLOTS']!r} is not a dict of "
                         f"slots; write it as JSON, e.g. {example}")
    for name, slot in slots.items():
        fields = slot if isinstance(slot, dict) else {"": slot}
        for key, value in fields.items():
            if key == "" or (key in ("delay", "concurrency") and (
                    isinstance(value, bool) or not _number(value))):
                raise ValueError(f"DOWNLOAD_SLOTS[{name!r}] = {slot!r}: give a dict with a "
                                 f"number of seconds as 'delay', e.g. {example}")


def _number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def _reads_as(settings: BaseSettings, name: str, kind: str) -> bool:
    read = {BOOLEAN: settings.getbool, WHOLE: settings.getint, NUMBER: settings.getfloat}[kind]
    try:
        read(name)
    except (TypeError, ValueError):
        return False
    return True


def _typed_defaults() -> Iterator[tuple[str, Any, str, str]]:
    """``(name, default, kind, where the default is from)`` for the project's settings,
    then Scrapy's own."""
    seen: set[str] = set()
    for module, source in ((_project_module(), "the project's settings give"),
                           (default_settings, "Scrapy's default")):
        if module is None:
            continue
        for name, default in vars(module).items():
            if not name.isupper() or name in seen:
                continue
            seen.add(name)
            if isinstance(default, bool):
                yield name, default, BOOLEAN, source
            elif isinstance(default, int) and (name in SCRAPY_WHOLE or (
                    module is not default_settings and name.startswith("WEBFARM_"))):
                yield name, default, WHOLE, source
            elif isinstance(default, (int, float)):
                yield name, default, NUMBER, source


def _project_module() -> ModuleType | None:
    path = os.environ.get(ENVVAR)
    if not path:
        return None
    try:
        return importlib.import_module(path)
    except ImportError:  # Scrapy already loaded it, or will say why it cannot
        return None
