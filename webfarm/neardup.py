"""Near-duplicates: pages whose text differs only a little (a banner, a counter).

They are *recorded*, never merged: a page whose SimHash (64 bits, see
:func:`simhash`) is within ``WEBFARM_NEARDUP_DISTANCE`` bits of
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

import hashlib
import re
from typing import Any

BANDS = 4
BAND_BITS = 64 // BANDS
_MASK = (1 << BAND_BITS) - 1
GUARANTEED_DISTANCE = BANDS - 1


_WORD = re.compile(r"\w+")


def simhash(text: str, bits: int = 64) -> int:
    """SimHash of ``text`` over word 3-shingles (lower-cased ``\\w+`` words).

    Stable across processes and machines (BLAKE2b, not ``hash()``), so values
    can be stored. ``bits`` is a multiple of 8 up to 512. Texts of fewer than
    three words are one shingle; an empty text is 0.
    """
    if bits % 8 or not 8 <= bits <= 512:
        raise ValueError(f"bits must be a multiple of 8 in 8..512, not {bits}")
    words = _WORD.findall(text.lower())
    if not words:
        return 0
    if len(words) < 3:
        shingles = [" ".join(words)]
    else:
        shingles = [f"{a} {b} {c}" for a, b, c in zip(words, words[1:], words[2:], strict=False)]
    size = bits // 8
    blake = hashlib.blake2b
    digests = b"".join([blake(s.encode(), digest_size=size).digest() for s in shingles])
    n = len(shingles)
    # Per-bit vote without a Python loop over shingles: byte j of every digest, as one
    # big integer of n bytes; bit k of each of them is (column >> k) & ones, counted by
    # popcount (bit 8j+k of the little-endian digest).
    ones = int.from_bytes(b"\x01" * n, "little")
    result = 0
    for j in range(size):
        column = int.from_bytes(digests[j::size], "little")
        for k in range(8):
            if ((column >> k) & ones).bit_count() * 2 > n:
                result |= 1 << (8 * j + k)
    return result


def hamming(a: int, b: int) -> int:
    """Number of differing bits between two simhashes."""
    return (a ^ b).bit_count()


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
