"""Normalization applied to the features as a dask array and to any run of their rows
(as a block of windows scales the rows it reads) gives the same bits, equal to numpy."""

from __future__ import annotations

import dask.array as da
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.features.normalize import apply_normalization, row_scaler
from pipeline.features.sessions import SegmentTable
from pipeline.features.splits import NormalizeSpec


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=4), chunk=st.integers(1, 50),
       kind=st.sampled_from(["global", "trailing"]), data=st.data())
def test_rows_scaled_anywhere_equal_the_normalized_features_bit_for_bit(lengths, chunk, kind, data):
    n, segments = sum(lengths), len(lengths)
    rng = np.random.default_rng(n * 7 + segments)
    f = (rng.standard_normal((n, 3)) * 50 + 100).astype(np.float32)
    shape = (3,) if kind == "global" else (segments, 3)
    stats = {"mean": rng.standard_normal(shape) * 100, "std": rng.uniform(0.5, 20, shape)}
    spec = NormalizeSpec.from_value("global" if kind == "global" else {"kind": "trailing", "sessions": 1}, "normalize")
    table = SegmentTable.from_lengths(lengths)

    mean, std = np.float32(stats["mean"]), np.float32(stats["std"])
    if kind == "trailing":  # each row with its own segment's statistics
        seg = np.repeat(np.arange(segments), lengths)
        mean, std = mean[seg], std[seg]
    expected = ((f - mean) / std).astype(np.float32)

    whole = apply_normalization(da.from_array(f, chunks=(chunk, -1)), spec, stats, table).compute()
    np.testing.assert_array_equal(whole.view(np.uint32), expected.view(np.uint32))
    a = data.draw(st.integers(0, n - 1))
    b = data.draw(st.integers(a + 1, n))
    rows = row_scaler(spec, stats, table)(f[a:b], a)
    assert rows.dtype == np.float32
    np.testing.assert_array_equal(rows.view(np.uint32), expected[a:b].view(np.uint32))


def test_window_and_no_normalization_have_no_row_scaler():
    table = SegmentTable.from_lengths([4])
    for value in ("window", "none"):
        assert row_scaler(NormalizeSpec.from_value(value, "normalize"), {}, table) is None
