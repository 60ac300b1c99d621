"""The Python half of the frontier's scalable Bloom filter (the bit work is in Lua).

Python derives two 32-bit hashes from a fingerprint; the script computes the k bit
positions of each layer by enhanced double hashing, ``(h1 + i*h2 + (i^3-i)/6) mod m``,
which stays exact in Lua's doubles. Layer ``i`` holds ``capacity * 2**i`` fingerprints
at error rate ``error_rate / 2**i`` (RedisBloom's scaling rule), so the compound false
positive rate stays below ``2 * error_rate`` however far the filter grows, and a filter
that never grows is at ``error_rate``. The formulas are mirrored here for tests, the
benchmark and ``scrapy frontier``.
"""

from __future__ import annotations

import hashlib
import math

MAX_BITS = 2**32  # largest Redis string (512 MB) in bits


def hash_pair(fingerprint: bytes) -> tuple[int, int]:
    """Two independent 32-bit hashes of ``fingerprint`` (re-hashed: any fingerprint works)."""
    digest = hashlib.blake2b(fingerprint, digest_size=8).digest()
    return int.from_bytes(digest[:4], "big"), int.from_bytes(digest[4:], "big")


def layer_params(i: int, capacity: int, error_rate: float) -> tuple[int, int, int]:
    """``(bits, hashes, capacity)`` of layer ``i``, as the Lua script computes them."""
    p = error_rate * 0.5**i
    cap = capacity * 2**i
    bits = math.ceil(cap * -math.log(p) / math.log(2) ** 2)
    if bits > MAX_BITS:
        bits = MAX_BITS
        cap = math.floor(bits * math.log(2) ** 2 / -math.log(p))
    return bits, math.ceil(-math.log(p) / math.log(2)), cap


def bytes_per_item(error_rate: float) -> float:
    """Bytes per fingerprint of a full, optimally sized layer (1.80 at 0.1 %)."""
    return -math.log(error_rate) / math.log(2) ** 2 / 8
