"""Normalization applied to the features as a dask array and to any run of their rows
(as a block of windows scales the rows it reads) gives the same bits, equal to numpy."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import WindowError
from pipeline.features.normalize import apply_normalization, cell_edges, fit_normalization, row_scaler
from pipeline.features.sessions import SegmentTable, window_runs
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


# -- statistics independent of the chunking (fitted over a fixed grid of cells) ----------------------

def _fit(f: np.ndarray, chunk: int, spec: NormalizeSpec, table: SegmentTable, runs, cell: int) -> dict:
    tasks, finish = fit_normalization(da.from_array(f, chunks=(chunk, -1)), spec, table, runs, halo=3,
                                      lookback=2, cell=cell)
    return finish(dask.compute(*tasks, scheduler="sync"))


def _grid_case() -> tuple[np.ndarray, SegmentTable]:
    """Prices far from zero (a 42,000 and a 2,300 instrument) in float64, so that sums
    grouped differently differ in their last bits; NaN in each segment's lookback head
    (as a build holds its features) and a few inside."""
    rng = np.random.default_rng(11)
    lengths = [700, 45, 900, 650, 30, 800]
    table = SegmentTable.from_lengths(lengths, instrument=[0, 0, 0, 1, 1, 1], instruments=("BTC", "ETH"))
    level = np.where(np.repeat(table.instrument, lengths) == 0, 42_000.0, 2_300.0)[:, None]
    f = level * (1 + np.cumsum(rng.normal(0, 1e-4, (sum(lengths), 3)), axis=0)) + rng.normal(0, 0.5, (1, 3))
    f[table.head_mask(0, table.rows, 2)] = np.nan
    f[[100, 1500, 2400], [0, 1, 2]] = np.nan
    return f, table


@pytest.mark.parametrize("value", ["global", {"kind": "global", "per": "instrument"},
                                   {"kind": "trailing", "sessions": 1}])
def test_statistics_are_the_same_bits_for_any_chunking_and_equal_numpy(value):
    """source.chunk_rows 2,000 against 200,000 changed 1,008 stored values: dask's
    nanmean/nanstd summed chunk by chunk. Moments over a fixed grid of cells, combined in
    row order, are the same bits for any chunking; and they are numpy's mean and std."""
    f, table = _grid_case()
    spec = NormalizeSpec.from_value(value, "normalize")
    runs = window_runs(table, size=4, stride=3, scales=(1,), back=5, fwd=2)
    runs = runs.subset(np.arange(runs.n) % 5 < 3)  # gaps between the fitted rows too
    fits = [_fit(f, chunk, spec, table, runs, cell=64) for chunk in (7, 64, 100, 333, f.shape[0])]
    for other in fits[1:]:
        assert other == fits[0]  # every number, bit for bit
    got = fits[0]
    if spec.kind == "global":  # the rows of the fitted windows: [end - halo, end] of each
        ends = runs.ends()
        used = np.zeros(table.rows, bool)
        for e in ends:
            used[e - 3 : e + 1] = True
        groups = [np.repeat(table.instrument, np.diff(np.r_[table.starts, table.rows])) == c for c in (0, 1)]
        groups = groups if spec.per == "instrument" else [np.ones(table.rows, bool)]
        want_mean = [np.nanmean(f[used & g], axis=0) for g in groups]
        want_std = [np.nanstd(f[used & g], axis=0) for g in groups]
        mean, std = np.asarray(got["mean"]).reshape(len(groups), 3), np.asarray(got["std"]).reshape(len(groups), 3)
        np.testing.assert_allclose(mean, want_mean, rtol=1e-12)
        np.testing.assert_allclose(std, want_std, rtol=1e-7)
        if spec.per == "instrument":
            assert got["instruments"] == ["BTC", "ETH"]
    else:  # each segment's moments, from its rows after the lookback head
        for s in range(len(table)):
            rows = f[table.starts[s] + 2 : table.stops[s]]
            np.testing.assert_array_equal(got["moments"]["count"][s], np.isfinite(rows).sum(axis=0))
            np.testing.assert_allclose(got["moments"]["mean"][s], np.nanmean(rows, axis=0), rtol=1e-12)
            m2 = np.nansum((rows - np.nanmean(rows, axis=0)) ** 2, axis=0)
            np.testing.assert_allclose(got["moments"]["m2"][s], m2, rtol=1e-7)


def test_the_cell_grid_cuts_each_session_from_its_first_usable_row_and_nowhere_else():
    table = SegmentTable.from_lengths([10, 3, 4, 25, 2])
    edges = cell_edges(table, lookback=2, cell=8)
    # Session 0 (rows 0..9) ends a chunk of 10 >= 8 rows; the sessions of 3 and 4 rows
    # share the next one with the first cell of session 3 (rows 17..41, usable from 19:
    # cut at 27 and 35); its last 7 rows and session 4 make the last chunk.
    assert edges.tolist() == [0, 10, 27, 35, 44]
    for s in range(len(table)):  # no cell of a session is split between two chunks
        u, b = table.starts[s] + 2, table.stops[s]
        inner = edges[(edges > u) & (edges < b)]
        assert ((inner - u) % 8 == 0).all()


def test_per_instrument_statistics_scale_each_instrument_by_its_own():
    table = SegmentTable.from_lengths([5, 4, 6], instrument=[0, 1, 0], instruments=("BTC", "ETH"))
    stats = {"kind": "global", "per": "instrument", "instruments": ["ETH", "BTC"],  # another order than the table's
             "mean": [[2_300.0, 1.0], [42_000.0, 2.0]], "std": [[10.0, 0.5], [150.0, 0.25]]}
    spec = NormalizeSpec.from_value({"kind": "global", "per": "instrument"}, "normalize")
    f = np.arange(30, dtype=np.float64).reshape(15, 2) + 40_000
    mean = np.array([[42_000.0, 2.0]] * 5 + [[2_300.0, 1.0]] * 4 + [[42_000.0, 2.0]] * 6)
    std = np.array([[150.0, 0.25]] * 5 + [[10.0, 0.5]] * 4 + [[150.0, 0.25]] * 6)
    expected = ((f - mean) / std).astype(np.float32)
    np.testing.assert_array_equal(apply_normalization(da.from_array(f, chunks=(4, -1)), spec, stats, table).compute(),
                                  expected)
    np.testing.assert_array_equal(row_scaler(spec, stats, table)(f[3:11], 3), expected[3:11])
    with pytest.raises(WindowError, match="instrument 'BTC'"):
        row_scaler(spec, {**stats, "instruments": ["ETH", "SOL"]}, table)
