"""The decoded size a zstd frame declares equals the bytes it holds, for every width of
the header's size field (libzstd picks 1, 2, 4 or 8 bytes by the size)."""

from __future__ import annotations

import numcodecs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.streaming.zstdframe import content_size


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 65791, 65792, 1 << 20, (1 << 20) + 3])
@pytest.mark.parametrize("level", [1, 19])
def test_content_size_is_the_decoded_size(n, level):
    frame = numcodecs.Zstd(level=level).encode(bytes(range(256)) * (n // 256) + bytes(n % 256))
    assert content_size(frame) == n
    if n:  # numcodecs refuses to decode an empty frame
        assert len(numcodecs.Zstd().decode(frame)) == n


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=5000))
def test_content_size_of_any_payload(data):
    assert content_size(numcodecs.Zstd().encode(data)) == len(data)


@pytest.mark.parametrize("raw", [b"", b"\x28\xb5\x2f", b"not zstd at all", b"\x28\xb5\x2f\xfd\x00\x50"])
def test_no_size_where_none_is_declared(raw):
    assert content_size(raw) is None
