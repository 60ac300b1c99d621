"""Near-duplicates: pages whose text differs only a little (a banner, a counter).

They are *recorded*, never merged: a page whose SimHash (64 bits, see
:func:`webfarm.content.simhash`) is within ``WEBFARM_NEARDUP_DISTANCE`` bits of
an earlier content gets ``near_duplicate_of`` (that content's first page) and
``near_duplicate_distance`` in ``pages``; it keeps its own content hash and blob.

Lookup is banded so it stays an index query at any size: the 64 bits are cut
into 4 bands of 16 bits, stored as ``contents.simhash_bands`` (multikey index)
as ``"<band>:<hex>"``. Two hashes within 3 bits differ in at most 3 bands, so
they share at least one band exactly (pigeonhole): a query for any of a page's
4 bands finds every content within distance 3, then the exact Hamming distance
is checked in Python. Distances above 3 still work for the candidates found,
but recall is no longer guaranteed.
"""

from __future__ import annotations

from typing import Any

from webfarm.content import hamming

BANDS = 4
BAND_BITS = 64 // BANDS
_MASK = (1 << BAND_BITS) - 1
GUARANTEED_DISTANCE = BANDS - 1


def bands(value: int) -> list[str]:
    """The 4 band keys of a 64-bit SimHash."""
    return [f"{i}:{(value >> (i * BAND_BITS)) & _MASK:04x}" for i in range(BANDS)]


def to_stored(value: int) -> str:
    """SimHash as 16 hex digits (Mongo ints are signed 64-bit; strings sort and read well)."""
    return f"{value:016x}"


def from_stored(value: str) -> int:
    return int(value, 16)


def nearest(
    value: int, candidates: list[dict[str, Any]], max_distance: int, exclude: set[str]
) -> tuple[dict[str, Any], int] | None:
    """The closest candidate ``contents`` doc within ``max_distance`` (not in ``exclude``)."""
    best: tuple[dict[str, Any], int] | None = None
    for doc in candidates:
        if doc["_id"] in exclude or not doc.get("simhash"):
            continue
        d = hamming(value, from_stored(doc["simhash"]))
        if d <= max_distance and (best is None or d < best[1]):
            best = (doc, d)
    return best
