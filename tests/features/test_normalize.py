"""Normalization applied to the features as a dask array and to any run of their rows
(as a block of windows scales the rows it reads) gives the same bits, equal to numpy."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
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


@pytest.mark.parametrize("kind", ["global", "trailing"])
def test_float64_features_are_scaled_with_float64_statistics_as_numpy(kind):
    """source.dtype: float64 prices near 97,000 with a std of a few hundredths: the
    statistics rounded to float32 moved the mean by up to 0.004, a tenth of a std."""
    rng = np.random.default_rng(5)
    lengths = [30, 25]
    f = 97_123.45 + np.round(rng.standard_normal((55, 2)) * 3) * 0.01  # float64 ticks of 0.01
    shape = (2,) if kind == "global" else (2, 2)
    stats = {"mean": 97_123.45 + rng.standard_normal(shape) * 0.003, "std": rng.uniform(0.02, 0.04, shape)}
    spec = NormalizeSpec.from_value("global" if kind == "global" else {"kind": "trailing", "sessions": 1}, "normalize")
    table = SegmentTable.from_lengths(lengths)
    mean, std = np.asarray(stats["mean"]), np.asarray(stats["std"])
    if kind == "trailing":
        seg = np.repeat(np.arange(2), lengths)
        mean, std = mean[seg], std[seg]
    expected = ((f - mean) / std).astype(np.float32)  # numpy, all in float64, stored as float32

    whole = apply_normalization(da.from_array(f, chunks=(7, -1)), spec, stats, table).compute()
    np.testing.assert_array_equal(whole, expected)
    np.testing.assert_array_equal(row_scaler(spec, stats, table)(f[10:40], 10), expected[10:40])
