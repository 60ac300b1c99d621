"""``contents.url_count``: how many stored URLs hold each content, counted once each.

A content's first page is counted by the content's insert (most contents have one page,
and an update costs the server more than the insert). Every later move of a page to a
content (+1) or away from one (-1) is an ``$inc`` guarded by a tag of the fetch's id
(``contents.applied`` keeps the last :data:`APPLIED_KEEP`), so a retried batch or a
redelivered request counts once. A page remembers its move until it is counted
(``counts_pending``), so a worker killed between the page write and the count has the
move re-issued by the page's next write. :class:`webfarm.index.IndexStore` decides what
moved; this module writes the counts.
"""

from __future__ import annotations

from typing import Any

from pymongo import UpdateOne
from pymongo.collection import Collection

APPLIED_KEEP = 64  # recent fetch ids remembered per content (retried $inc are skipped)


def count_op(content: str, step: int, tag: str) -> UpdateOne:
    """One page's move to (+1) or from (-1) ``content``, applied once per ``tag``."""
    return UpdateOne({"_id": content, "applied": {"$ne": tag}},
                     {"$inc": {"url_count": step},
                      "$push": {"applied": {"$each": [tag], "$slice": -APPLIED_KEEP}}})


def count_ops(fetch_id: str, old: str | None, new: str | None) -> list[UpdateOne]:
    """The moves of a page fetched as ``fetch_id`` from content ``old`` to ``new``."""
    return [count_op(content, step, f"{'+' if step > 0 else '-'}{fetch_id}")
            for content, step in ((new, 1), (old, -1)) if content]


def counted_by_insert(b: dict[str, Any] | None, content: dict[str, Any] | None,
                      pid: str) -> bool:
    """The page holds its content first and had no document before: the content's
    insert counted it, so its move has nothing pending."""
    return b is None and (content or {}).get("first_page_id") == pid


class CountMoves:
    """The moves of one batch, with the re-issued moves of earlier writes (``pending``):
    moves of the batch to one content are one update."""

    def __init__(self, pending: list[UpdateOne]) -> None:
        self.pending = pending
        self.fresh: dict[tuple[str, int], list[str]] = {}
        self.moved: dict[str, str] = {}  # page id -> fetch id, for pages counted now

    def add(self, pid: str, fetch_id: str, old: str | None, new: str | None) -> None:
        self.moved[pid] = fetch_id
        for content, step in ((new, 1), (old, -1)):
            if content:
                self.fresh.setdefault((content, step), []).append(
                    f"{'+' if step > 0 else '-'}{fetch_id}")

    def write(self, contents: Collection, pages: Collection) -> None:
        """Count the moves, then let the pages forget them: a content shared by many URLs
        keeps only the last APPLIED_KEEP fetch ids, so a re-issue on every next write
        would count those pages twice."""
        counts = list(self.pending)
        for (content, step), tags in self.fresh.items():
            counts.append(UpdateOne(
                {"_id": content, "applied": {"$nin": tags}},
                {"$inc": {"url_count": step * len(tags)},
                 "$push": {"applied": {"$each": tags, "$slice": -APPLIED_KEEP}}},
            ))
        if counts:
            matched = contents.bulk_write(counts, ordered=False).matched_count
            if self.fresh and matched < len(counts):
                # A group's guard found one of its tags applied: another worker re-issued
                # that page's pending move between our page write and this count. The
                # group's other moves would be lost with it; each goes again on its own,
                # guarded by its tag.
                contents.bulk_write([count_op(content, step, tag)
                                     for (content, step), tags in self.fresh.items()
                                     for tag in tags], ordered=False)
        if self.moved:  # counted: the next write need not re-issue them
            pages.update_many(
                {"_id": {"$in": list(self.moved)},
                 "fetch_id": {"$in": list(self.moved.values())}},
                {"$set": {"counts_pending": False}})


def forget_orphans(contents: Collection, orphans: list[tuple[str, str]]) -> None:
    """Delete the contents (hash, page id) a batch inserted for pages the server then
    refused, so ``url_count`` does not count a page that is not stored. Only while no
    other page joined (``url_count`` 1); else its requeued page is counted by the insert."""
    if orphans:
        contents.delete_many({"$or": [{"_id": h, "first_page_id": pid, "url_count": 1}
                                      for h, pid in orphans]})
