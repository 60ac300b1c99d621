"""Names webfarm reads from spider and item classes, and slips of them, said once a class.

A spider or item declares how it is crawled and stored with class attributes webfarm
reads if present (``render_check``, ``extractor_version``; ``key_fields``,
``item_collection``). Python has no word for an attribute nothing reads, so a slip was
silent: ``key_field = ("sku",)`` stored one record per page, mirrors as duplicates, and
``render_chek`` or a method ``extact`` left the spider on defaults. A name of the class's
own (not its base's) that nothing reads and is close to one that is read is said once a
class, at WARNING, with the name meant.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from functools import lru_cache
from typing import Any

logger = logging.getLogger(__name__)

#: How alike a name must be to a read one to be taken for a slip of it (difflib's ratio:
#: key_field to key_fields is 0.95, render_chek to render_check 0.96, price to pages 0.4).
CLOSE = 0.85
#: What the item store reads from an item's class, and from a dict item's keys.
ITEM_NAMES = ("key_fields", "item_collection")
DICT_KEYS = ("_key", "_collection")
#: What webfarm reads from a spider if it has it (besides the base class's own names).
SPIDER_NAMES = ("render", "render_check", "extractor_version", "extract", "item_collection",
                "item_key_fields", "refetch_rules", "max_pages", "check_crawl_arguments")


def close_name(name: str, read: tuple[str, ...] | set[str] | list[str]) -> str | None:
    """The read name ``name`` looks like a slip of, if any (None for a read name)."""
    if name in read or name.startswith("__"):
        return None
    close = difflib.get_close_matches(name, sorted(read), n=1, cutoff=CLOSE)
    return close[0] if close else None


@lru_cache(maxsize=1024)
def item_class_slips(cls: type) -> tuple[tuple[str, str], ...]:
    """``(name, meant)`` for the item class's own attributes that look like slips of
    ``key_fields``/``item_collection``; said once a class."""
    if cls is dict or issubclass(cls, dict) and not hasattr(cls, "fields"):
        return ()
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    fields |= set(getattr(cls, "fields", None) or ())  # a scrapy.Item's
    slips = []
    for klass in cls.__mro__[:-1]:
        for name in vars(klass):
            meant = None if name in fields else close_name(name, ITEM_NAMES)
            if meant is not None and not hasattr(cls, meant):
                slips.append((name, meant))
    for name, meant in slips:
        logger.warning("%s.%s is no name the item store reads; did you mean %s? Without "
                       "%s, %s", cls.__name__, name, meant, meant,
                       "its items are stored one per page, keyed on the page's URL"
                       if meant == "key_fields" else "they go to a collection named after "
                       "the class")
    return tuple(slips)


_said_keys: set[str] = set()


def dict_key_slips(item: dict[str, Any]) -> None:
    """Say a dict item's ``_``-key that looks like a slip of ``_key`` or ``_collection``,
    once a name (``_keys``: the item was stored keyed on its page)."""
    for name in item:
        if (isinstance(name, str) and name.startswith("_") and name not in DICT_KEYS
                and name not in _said_keys):
            meant = close_name(name, DICT_KEYS)
            if meant is not None and meant not in item:
                _said_keys.add(name)
                logger.warning("a dict item's key %r is no name the item store reads; did "
                               "you mean %r?", name, meant)


def spider_slips(spidercls: type, base: type) -> list[tuple[str, str]]:
    """``(name, meant)`` for the spider class's own attributes and methods (not
    ``base``'s) that look like slips of a name webfarm reads."""
    read = set(SPIDER_NAMES) | {n for n in dir(base) if not n.startswith("_")}
    slips = []
    for klass in spidercls.__mro__:
        if klass is base or issubclass(base, klass):
            break
        for name in vars(klass):
            if name.startswith("_") or hasattr(base, name) or name in SPIDER_NAMES:
                continue
            meant = close_name(name, read)
            if meant is not None and not any(meant in vars(k) for k in spidercls.__mro__
                                             if not issubclass(base, k) and k is not base):
                slips.append((name, meant))
    return slips
