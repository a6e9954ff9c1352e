"""CRC-32 of a byte string from the CRCs of its pieces, read in any order.

A zip member's CRC covers all of its bytes, but a member's blocks are read in whatever
order dask runs their tasks. Each block's CRC is taken as it is read
(``zlib.crc32``) and joined to its neighbours' with :func:`crc32_combine` (zlib's
``crc32_combine``, which Python's ``zlib`` does not expose): once the pieces cover the
member, their CRC is the member's, without holding or reading any byte twice.
"""

from __future__ import annotations

import bisect

__all__ = ["CrcSpans", "crc32_combine"]

#: The CRC-32 polynomial, reflected (zlib's ``POLY``).
_POLY = 0xEDB88320


def _multmodp(a: int, b: int) -> int:
    """``a * b`` modulo the CRC polynomial (zlib's ``multmodp``; bit 31 is x^0)."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _x2n_table() -> tuple[int, ...]:
    """``x^(2^n)`` modulo the polynomial for n = 0..31 (zlib's ``x2n_table``)."""
    p, out = 1 << 30, []  # x^1
    for _ in range(32):
        out.append(p)
        p = _multmodp(p, p)
    return tuple(out)


_X2N = _x2n_table()


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc1 = crc32(A)``, ``crc2 = crc32(B)`` and
    ``len2 = len(B)``: ``crc1`` shifted past ``len2`` bytes (``x^(8 * len2)``), XOR ``crc2``
    (zlib's ``crc32_combine``)."""
    p, n, k = 1 << 31, len2, 3  # x^0; bytes are 2^3 bits
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ (crc2 & 0xFFFFFFFF)


class CrcSpans:
    """Disjoint spans ``[start, end)`` of one byte string with their CRCs, adjacent
    spans joined as they are added. Not thread-safe: the caller holds a lock."""

    __slots__ = ("_crcs", "_ends", "_starts")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._crcs: list[int] = []

    def add(self, start: int, end: int, crc: int) -> tuple[int, int, int]:
        """Add the span ``[start, end)`` of CRC ``crc`` (a span already covered, read
        again, is ignored) and return the joined span that holds it."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i >= 0 and self._ends[i] >= end:  # read before
            return self._starts[i], self._ends[i], self._crcs[i]
        if i >= 0 and self._ends[i] > start or i + 1 < len(self._starts) and self._starts[i + 1] < end:
            return start, end, crc  # overlaps another span partly: not joined (blocks of one size never do)
        if i >= 0 and self._ends[i] == start:  # joins the span before it
            start, crc = self._starts[i], crc32_combine(self._crcs[i], crc, end - start)
            del self._starts[i], self._ends[i], self._crcs[i]
        else:
            i += 1
        if i < len(self._starts) and self._starts[i] == end:  # and the span after it
            end, crc = self._ends[i], crc32_combine(crc, self._crcs[i], self._ends[i] - end)
            del self._starts[i], self._ends[i], self._crcs[i]
        self._starts.insert(i, start)
        self._ends.insert(i, end)
        self._crcs.insert(i, crc)
        return start, end, crc
