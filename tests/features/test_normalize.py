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
from pipeline.features.normalize import (apply_normalization, cell_edges, fit_normalization, row_scaler,
                                         trailing_history_rows)
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


# -- which rows statistics are fitted on ---------------------------------------------------------------

def test_global_statistics_count_every_row_between_consecutive_fitted_windows_and_no_other():
    """A stride wider than a window (size 1, stride 10): the statistics are those of the
    training period, every row from a run's first window's first step to its last
    window's end, not only the rows the windows sample; rows between two runs (a window
    of another split between them) and rows of another session are not counted."""
    rng = np.random.default_rng(3)
    table = SegmentTable.from_lengths([200, 130])
    f = rng.standard_normal((330, 2)) + np.arange(330)[:, None] % 10  # the row's phase mod 10 shows
    runs = window_runs(table, size=1, stride=10, scales=(1,), back=2, fwd=1)
    keep = np.ones(runs.n, bool)
    keep[[5, 6]] = False  # two windows of session 0 in another split: a hole between two runs
    keep[runs.n - 3 :] = False  # and session 1's last ones
    fitted = runs.subset(keep)
    spec = NormalizeSpec.from_value("global", "normalize")
    tasks, finish = fit_normalization(da.from_array(f, chunks=(37, -1)), spec, table, fitted, halo=0, lookback=2,
                                      cell=64)
    got = finish(dask.compute(*tasks, scheduler="sync"))
    # Independently: the runs of kept windows, by their end rows, each from first to last.
    ends = runs.ends()
    rows = np.zeros(330, bool)
    session = np.searchsorted(table.stops, ends, side="right")
    k = 0
    while k < ends.size:
        if not keep[k]:
            k += 1
            continue
        j = k
        while j + 1 < ends.size and keep[j + 1] and session[j + 1] == session[k]:
            j += 1
        rows[ends[k] : ends[j] + 1] = True
        k = j + 1
    assert 0 < rows.sum() < 330 and not rows[ends[4] + 1 : ends[7]].any()
    np.testing.assert_allclose(got["mean"], f[rows].mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(got["std"], f[rows].std(axis=0), rtol=1e-9)
    assert not np.allclose(got["mean"], f[ends[keep]].mean(axis=0), rtol=1e-3)  # not the sampled rows only


# -- trailing statistics over a thin history ---------------------------------------------------------

def _history_reference(lengths, instrument, lookback, sessions):
    """Per segment, the rows after ``lookback`` of the ``sessions`` segments of its
    instrument before it, by a plain loop; -1 with fewer before it."""
    out = []
    for k, code in enumerate(instrument):
        before = [j for j in range(k) if instrument[j] == code][-sessions:] if sessions else []
        ok = len(before) == sessions
        out.append(sum(max(0, lengths[j] - lookback) for j in before) if ok else -1)
    return out


@pytest.mark.parametrize("sessions", [1, 2])
def test_trailing_history_rows_count_the_usable_rows_of_the_sessions_before_and_continue_a_prior(sessions):
    lengths, instrument = [50, 3, 40, 1, 60, 7, 30], [0, 0, 1, 0, 1, 0, 1]
    table = SegmentTable.from_lengths(lengths, instrument=instrument, instruments=("A", "B"))
    want = _history_reference(lengths, instrument, lookback=4, sessions=sessions)
    assert trailing_history_rows(table, 4, sessions).tolist() == want
    # An append: the stored segments first, the new ones numbered after them.
    stored = SegmentTable.from_lengths(lengths[:4], instrument=instrument[:4], instruments=("A", "B"))
    new = SegmentTable(table.starts[4:], table.stops[4:], table.instrument[4:], table.session[4:], ("A", "B"))
    assert trailing_history_rows(new, 4, sessions, prior=stored).tolist() == want[4:]


def test_trailing_statistics_over_a_history_without_finite_values_are_refused_naming_the_session():
    """A history of enough rows but NaN in one feature (a price missing all day): its
    statistics were 0 and 1, the session stored unscaled. A session that makes windows
    is refused, naming it and the feature; one that makes none gets 0 and 1."""
    table = SegmentTable.from_lengths([40, 30, 35], labels=("d1.parquet", "d2.parquet", "d3.parquet"),
                                      instruments=("ES",), instrument=[0, 0, 0])
    f = np.random.default_rng(0).standard_normal((105, 2))
    f[40:70, 1] = np.nan
    f[41, 1] = 5.0  # one finite value: a std of 0, once only centred
    spec = NormalizeSpec.from_value({"kind": "trailing", "sessions": 1}, "normalize")
    runs = window_runs(table, size=2, stride=1, scales=(1,), back=2, fwd=1)

    def fit(serves):
        tasks, finish = fit_normalization(da.from_array(f, chunks=(16, -1)), spec, table, runs, halo=1, lookback=1,
                                          serves=serves, features=("mid_price", "spread"))
        return finish(dask.compute(*tasks, scheduler="sync"))

    with pytest.raises(WindowError, match=r"normalize: trailing: session 2 \(d3.parquet\) of instrument 'ES' would "
                                          r"be scaled by .* which hold 1 finite value\(s\) of feature 'spread'"):
        fit(None)
    got = fit(np.array([False, True, False]))
    history = f[41:70, 0]
    np.testing.assert_allclose(got["mean"][2], [history.mean(), 0.0], rtol=1e-12)
    np.testing.assert_allclose(got["std"][2], [history.std(), 1.0], rtol=1e-9)
