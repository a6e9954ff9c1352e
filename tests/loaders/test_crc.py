"""CRC-32 joined from pieces: equal to zlib's CRC of the whole, in any order of pieces."""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.loaders.crc import CrcSpans, crc32_combine


@given(st.binary(max_size=300), st.binary(max_size=300))
def test_combine_equals_the_crc_of_the_concatenation(a, b):
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


def test_combine_past_a_long_second_part():
    a, b = b"head", bytes(range(256)) * 4099  # a length with many bits set
    assert crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) == zlib.crc32(a + b)


@settings(max_examples=200)
@given(st.binary(min_size=1, max_size=400), st.lists(st.integers(1, 399), max_size=12, unique=True), st.randoms())
def test_spans_added_in_any_order_give_the_whole_crc_once_they_cover_it(data, cuts, rnd):
    edges = sorted({0, len(data), *(c for c in cuts if c < len(data))})
    pieces = list(zip(edges, edges[1:]))
    rnd.shuffle(pieces)
    spans = CrcSpans()
    for k, (lo, hi) in enumerate(pieces):
        first, last, crc = spans.add(lo, hi, zlib.crc32(data[lo:hi]))
        assert first <= lo and hi <= last
        assert crc == zlib.crc32(data[first:last])  # a joined span's CRC is its bytes'
        if k < len(pieces) - 1:
            assert (first, last) != (0, len(data))
    assert (first, last, crc) == (0, len(data), zlib.crc32(data))
    lo, hi = pieces[0]
    assert spans.add(lo, hi, zlib.crc32(data[lo:hi])) == (0, len(data), zlib.crc32(data))  # read again
