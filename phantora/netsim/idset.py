"""`IdSet`: a compact set of flow ids (a bitmap for small non-negative ids, a set for the rest)."""

from __future__ import annotations

from collections.abc import Iterable

DENSE_LIMIT = 1 << 28  # ids below this live in the bitmap (at most 32 MiB)


class IdSet:
    """Add-only set of ints; one bit per id for the dense ids engines allocate, 0..N-1."""

    __slots__ = ("_bits", "_other", "_len")

    def __init__(self) -> None:
        self._bits = bytearray()
        self._other: set[int] = set()
        self._len = 0

    def add(self, i: int) -> None:
        if 0 <= i < DENSE_LIMIT:
            byte, bit = i >> 3, 1 << (i & 7)
            if byte >= len(self._bits):
                self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))
            if not self._bits[byte] & bit:
                self._bits[byte] |= bit
                self._len += 1
        elif i not in self._other:
            self._other.add(i)
            self._len += 1

    def update(self, ids: Iterable[int]) -> None:
        """`add` of each id (its loop inline: a shard's completions, thousands a call)."""
        bits, other, n = self._bits, self._other, 0
        try:
            for i in ids:
                if 0 <= i < DENSE_LIMIT:
                    byte, bit = i >> 3, 1 << (i & 7)
                    if byte >= len(bits):
                        bits.extend(bytes(max(byte + 1 - len(bits), len(bits))))
                    if not bits[byte] & bit:
                        bits[byte] |= bit
                        n += 1
                elif i not in other:
                    other.add(i)
                    n += 1
        finally:
            self._len += n

    def __contains__(self, i: int) -> bool:  # type: ignore[override]
        if 0 <= i < DENSE_LIMIT:
            byte = i >> 3
            return byte < len(self._bits) and bool(self._bits[byte] >> (i & 7) & 1)
        return i in self._other

    def __len__(self) -> int:
        return self._len
