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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from pymongo.collection import Collection

BANDS = 4
BAND_BITS = 64 // BANDS
_MASK = (1 << BAND_BITS) - 1
GUARANTEED_DISTANCE = BANDS - 1


_WORD = re.compile(r"\w+")
_CHUNK = 1 << 16  # shingles voted at once
# ASCII bytes that \w does not match -> space; word bytes and every byte of a multi-byte
# UTF-8 character stay (they are split by _WORD itself, see _words).
_ASCII_SPLIT = bytes(
    c if c >= 0x80 or chr(c).isalnum() or c == ord("_") else 0x20 for c in range(256))


def _words(text: str) -> list[bytes]:
    """``_WORD.findall(text)``, UTF-8 encoded, at half its cost: ASCII non-word bytes
    become spaces and ``bytes.split`` cuts there (re walks every character in Python's
    engine, 1.5 ms on a 100 KB page). A piece holding non-ASCII bytes is split by
    ``_WORD`` itself, so every word is what re gives."""
    data = text.encode("utf-8", "surrogatepass")
    pieces = data.translate(_ASCII_SPLIT).split()
    if data.isascii():
        return pieces
    words: list[bytes] = []
    for piece in pieces:
        if piece.isascii():
            words.append(piece)
        else:
            words += [w.encode() for w in _WORD.findall(piece.decode("utf-8", "surrogatepass"))]
    return words


def simhash(text: str, bits: int = 64) -> int:
    """SimHash of ``text`` over word 3-shingles (lower-cased ``\\w+`` words).

    Stable across processes and machines (BLAKE2b, not ``hash()``), so values
    can be stored. Each distinct word is hashed once with BLAKE2b; a shingle's
    hash mixes its three words' hashes (rotated by position, then the
    SplitMix64 finaliser), and the per-bit vote runs in numpy: on a 100 KB page
    that is 2.2 ms where a BLAKE2b call per shingle took 7.3 ms, with the same
    spread of distances for near and unrelated texts. ``bits`` is a multiple of
    64 up to 512. Texts of fewer than three words are one shingle; an empty
    text is 0.
    """
    if bits % 64 or not 64 <= bits <= 512:
        raise ValueError(f"bits must be a multiple of 64 in 64..512, not {bits}")
    # Here, not at the top: numpy takes 0.1-0.2 s to import, and every `scrapy` command
    # imports this module (through webfarm.index), most of them to hash nothing.
    import numpy as np

    words = _words(text.lower())
    if not words:
        return 0
    lanes, size = bits // 64, bits // 8
    blake = hashlib.blake2b
    digests = {w: blake(w, digest_size=size).digest() for w in set(words)}
    table = np.frombuffer(b"".join([digests[w] for w in words]), dtype="<u8")
    table = table.reshape(len(words), lanes)
    if len(table) < 3:
        table = np.vstack([table, np.zeros((3 - len(table), lanes), dtype="<u8")])
    shingles = _mix(_rotl(table[:-2], 2) ^ _rotl(table[1:-1], 1) ^ table[2:])
    n = len(shingles)
    counts = np.zeros(bits, dtype=np.int64)
    for start in range(0, n, _CHUNK):  # bounded memory on huge pages (one byte a bit)
        part = np.ascontiguousarray(shingles[start:start + _CHUNK], dtype="<u8")
        unpacked = np.unpackbits(part.view(np.uint8).reshape(len(part), size), axis=1,
                                 bitorder="little")
        counts += unpacked.sum(axis=0, dtype=np.int64)
    return int.from_bytes(np.packbits(counts * 2 > n, bitorder="little").tobytes(), "little")


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    import numpy as np

    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: every input bit moves every output bit (mod 2**64)."""
    import numpy as np

    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


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


#: band keys per query. One ``$in`` of a whole batch's keys (800 for 200 pages) took the
#: embedded SecantusDB 0.97 s at 40,000 contents and seconds mid-crawl, growing faster
#: than the keys: the crawl fell from 200 to 40 pages/s as its index grew. In queries of
#: 20: 0.07 s (bench/bench_neardup.py).
QUERY_KEYS = 20


def near_pages(stored: Collection, distance: int, pages: list[dict[str, Any]],
               batch: list[tuple[int, str, dict[str, Any] | None]],
               contents: dict[str, dict[str, Any]]) -> dict[int, tuple[str, int]]:
    """For the pages of ``batch`` (index, page id, its stored document) that hold their
    content first (``contents``: hash -> document with ``first_page_id``): the closest
    earlier content in ``stored`` (the ``contents`` collection), as its first page's id
    and the distance; ``distance`` < 0: none looked up.

    Only when the content is new to the page: a page fetched again with the content it
    had keeps what it was found near then. Looked up again, the original of a mirror
    stored since found the mirror, and the two named each other. Two new contents of
    one batch: only the later may name the earlier."""
    if distance < 0:
        return {}
    found: dict[int, tuple[str, int]] = {}
    wanted: list[tuple[int, str]] = []
    for i, pid, b in batch:
        page = pages[i]
        if (page.get("simhash") is None or page.get("not_modified")
                or contents.get(page["content_hash"], {}).get("first_page_id") != pid):
            continue
        if b is not None and b.get("content_hash") == page["content_hash"]:
            if b.get("near_duplicate_of"):
                found[i] = (b["near_duplicate_of"], b.get("near_duplicate_distance"))
            continue
        wanted.append((i, pid))
    if not wanted:
        return found
    keys = sorted({b for i, _ in wanted for b in bands(pages[i]["simhash"])})
    by_id: dict[Any, dict[str, Any]] = {}
    for start in range(0, len(keys), QUERY_KEYS):
        for doc in stored.find({"simhash_bands": {"$in": keys[start:start + QUERY_KEYS]}},
                               {"simhash": 1, "first_page_id": 1}):
            by_id[doc["_id"]] = doc
    candidates = list(by_id.values())
    later = {pages[i]["content_hash"] for i, _ in wanted}
    for i, pid in wanted:
        later.discard(own := pages[i]["content_hash"])
        best = nearest(pages[i]["simhash"], candidates, distance, exclude={own} | later)
        if best is not None and best[0].get("first_page_id") != pid:
            found[i] = (best[0]["first_page_id"], best[1])
    return found
