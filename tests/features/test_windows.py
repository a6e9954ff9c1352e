"""Windows and window arithmetic against a plain-numpy loop, over random chunkings."""

from __future__ import annotations

import tempfile
from pathlib import Path

import dask.array as da
import h5py
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import WindowError
from pipeline.features import windows
from pipeline.features.windows import window_end_rows
from pipeline.loaders import load as pipeline_load
from pipeline.loaders import open_source
from pipeline.features.geometry import (
    aligned_window_chunks,
    input_chunks_for_windows,
    block_window_counts,
    halo,
    merge_short_chunks,
    rows_per_block,
    split_gap_windows,
    split_ranges,
    window_count,
    window_ends,
)


def reference(x: np.ndarray, size: int, stride: int, scales: tuple[int, ...]) -> np.ndarray:
    """The design's definition, literally: one window per end step."""
    first_end = (size - 1) * max(scales)
    out = []
    e = first_end
    while e <= len(x) - 1:
        out.append(np.concatenate([x[[e - s * (size - 1 - j) for j in range(size)]] for s in scales], axis=1))
        e += stride
    return np.stack(out) if out else np.empty((0, size, x.shape[1] * len(scales)), x.dtype)


#: Window scales: one to three distinct sampling intervals.
SCALES = st.lists(st.integers(1, 4), min_size=1, max_size=3, unique=True)


@st.composite
def cases(draw):
    size = draw(st.integers(1, 9))
    scales = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3, unique=True)))
    stride = draw(st.integers(1, 6))
    need = (size - 1) * max(scales) + 1
    T = draw(st.integers(need, need + 120))
    F = draw(st.integers(1, 3))
    chunks = []
    left = T
    while left:
        c = draw(st.integers(1, max(1, min(left, 40))))
        chunks.append(c)
        left -= c
    return T, F, size, stride, scales, tuple(chunks)


@settings(max_examples=120, deadline=None)
@given(cases())
def test_windows_equal_the_numpy_definition_for_any_chunking(case):
    T, F, size, stride, scales, chunks = case
    x = np.random.default_rng(T * 31 + F).standard_normal((T, F)).astype(np.float32)
    got = windows(da.from_array(x, chunks=(chunks, F)), size=size, stride=stride, scales=scales)
    ref = reference(x, size, stride, scales)
    assert got.shape == ref.shape
    np.testing.assert_array_equal(got.compute(scheduler="sync"), ref)


@settings(max_examples=40, deadline=None)
@given(case=cases(), budget=st.integers(1, 4000))
def test_output_blocks_are_bounded_and_still_exact(case, budget):
    T, F, size, stride, scales, chunks = case
    x = np.random.default_rng(T).standard_normal((T, F)).astype(np.float32)
    w = windows(da.from_array(x, chunks=(chunks, F)), size=size, stride=stride, scales=scales,
                max_block_bytes=budget)
    window_bytes = size * F * len(scales) * 4
    H = (size - 1) * max(scales)
    # A piece of input is bounded by its windows' bytes and by its own rows (the rows
    # its task reads: with a large stride few windows cover many rows).
    piece = max(min(max(stride, (budget // window_bytes) * stride), rows_per_block(budget // (F * 4), H)), H)
    # A block is one piece plus at most two short remainders (< H each) merged into it.
    assert max(w.chunks[0]) <= (2 * H + piece) // stride + 1
    ends = window_ends(w.shape[0], size, stride, scales)
    edges = np.cumsum((0,) + w.chunks[0])
    for a, b in zip(edges[:-1], edges[1:]):
        if b > a:  # the rows of its windows: ends apart, and H before the first
            assert ends[b - 1] - ends[a] + 1 <= piece + 2 * H
    np.testing.assert_array_equal(w.compute(scheduler="sync"), reference(x, size, stride, scales))


@settings(max_examples=40, deadline=None)
@given(case=cases(), budget=st.integers(1, 4000), data=st.data())
def test_session_blocks_bound_their_windows_and_the_rows_they_read(case, budget, data):
    """With sessions each block holds at most the windows of ``budget`` bytes whose rows
    (ends and history) span at most ``budget`` bytes of input and no more than the
    longest input chunk, unless one window needs more."""
    T, F, size, stride, scales, chunks = case
    cuts = sorted(data.draw(st.lists(st.integers(0, T), max_size=3)))
    lengths = [b - a for a, b in zip([0] + cuts, cuts + [T])]
    x = np.random.default_rng(T).standard_normal((T, F)).astype(np.float32)
    H = (size - 1) * max(scales)
    parts = [reference(x[a:b], size, stride, scales) for a, b in zip(np.cumsum([0] + lengths), np.cumsum(lengths))]
    expect = np.concatenate(parts)
    if not len(expect):
        return
    ends = np.concatenate([a + H + stride * np.arange(len(p)) for a, p in zip(np.cumsum([0] + lengths), parts)])
    w = windows(da.from_array(x, chunks=(chunks, F)), size=size, stride=stride, scales=scales, sessions=lengths,
                max_block_bytes=budget)
    span = min(rows_per_block(budget // (F * 4), H), max(max(chunks), H, 1))
    edges = np.cumsum((0,) + w.chunks[0])
    for a, b in zip(edges[:-1], edges[1:]):
        assert b - a == 1 or (ends[b - 1] - ends[a] < span and b - a <= budget // (size * F * len(scales) * 4))
    np.testing.assert_array_equal(w.compute(scheduler="sync"), expect)


def block_rows(w: da.Array, ends: np.ndarray, h: int) -> list[int]:
    """Rows each block's task reads: from its first window's oldest step to its last end."""
    edges = np.cumsum((0,) + w.chunks[0])
    return [int(ends[b - 1] - ends[a] + h + 1) for a, b in zip(edges[:-1], edges[1:]) if b > a]


def test_strided_windows_over_sessions_read_a_block_of_rows_per_task_not_the_whole_source():
    """The user trial, scaled down: 420 windows of 4 steps, 50 rows apart, in three
    sessions of 16 float64 columns. Counted by output bytes alone, the 420 windows (215
    KB) were one block, whose task read all 21,000 rows (2.7 MB); each task now reads
    at most its share: an input chunk's rows or the byte budget's."""
    lengths = [7000, 9000, 5000]
    x = np.random.default_rng(5).standard_normal((sum(lengths), 16))
    parts = [reference(x[a:b], 4, 50, (1,)) for a, b in zip(np.cumsum([0] + lengths), np.cumsum(lengths))]
    ends = np.concatenate([a + 3 + 50 * np.arange(len(p)) for a, p in zip(np.cumsum([0] + lengths), parts)])
    w = windows(da.from_array(x, chunks=(2000, -1)), size=4, stride=50, sessions=lengths, max_block_bytes=2**20)
    rows = block_rows(w, ends, 3)
    assert len(w.chunks[0]) >= 10 and max(rows) <= 2000 + 3  # an input chunk's rows and the halo
    np.testing.assert_array_equal(w.compute(scheduler="sync"), np.concatenate(parts))
    one_chunk = windows(da.from_array(x, chunks=(-1, -1)), size=4, stride=50, sessions=lengths,
                        max_block_bytes=2**20)
    assert max(block_rows(one_chunk, ends, 3)) <= 2**20 // (16 * 8)  # the budget's rows, halo included
    np.testing.assert_array_equal(one_chunk.compute(scheduler="sync"), np.concatenate(parts))


def test_strided_windows_of_one_series_bound_the_rows_of_a_task_too():
    """Without sessions a long input chunk was split only by its windows' bytes: with a
    stride of 50 a block of 2,048 windows (1 MiB) covered 102,400 rows (13 MB)."""
    x = np.random.default_rng(6).standard_normal((21000, 16))
    w = windows(da.from_array(x, chunks=(-1, -1)), size=4, stride=50, sessions="none", max_block_bytes=2**20)
    ends = window_ends(w.shape[0], 4, 50, (1,))
    assert len(w.chunks[0]) >= 3 and max(block_rows(w, ends, 3)) <= 2**20 // (16 * 8)
    np.testing.assert_array_equal(w.compute(scheduler="sync"), reference(x, 4, 50, (1,)))


def test_scales_keep_the_given_order_not_sorted():
    x = np.arange(40, dtype=np.float32)[:, None]
    w = windows(x, size=3, scales=(4, 1)).compute()
    assert w[0, :, 0].tolist() == [0.0, 4.0, 8.0]  # scale 4 first
    assert w[0, :, 1].tolist() == [6.0, 7.0, 8.0]


def test_graph_layers_do_not_grow_with_the_number_of_chunks():
    few = windows(da.zeros((1000, 2), chunks=(500, 2)), size=8, scales=(1, 2))
    many = windows(da.zeros((1000, 2), chunks=(20, 2)), size=8, scales=(1, 2))
    assert len(few.dask.layers) == len(many.dask.layers)


def test_chunks_shorter_than_the_halo_are_merged_not_lost():
    x = np.arange(100, dtype=np.float32).reshape(50, 2)
    w = windows(da.from_array(x, chunks=(3, 2)), size=6, scales=(2,))  # halo 10 > chunk 3
    np.testing.assert_array_equal(w.compute(), reference(x, 6, 1, (2,)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 50}, "too short"),
        ({"size": 0}, "size must be a positive integer"),
        ({"size": 3, "stride": 0}, "stride must be a positive integer"),
        ({"size": 3, "scales": ()}, "scales must be positive integers"),
        ({"size": 3, "scales": (0,)}, "scales must be positive integers"),
    ],
)
def test_bad_window_parameters_are_clear_errors(kwargs, message):
    with pytest.raises(WindowError, match=message):
        windows(np.zeros((20, 2), np.float32), **kwargs)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda x: x[:, 0], r"expected a \(time, features\) array, got shape \(20,\)"),
        (lambda x: x[:, :, None], r"got shape \(20, 2, 1\)"),
        (lambda x: da.from_array(x, chunks=(5, 2))[da.from_array(x[:, 0] >= 0, chunks=5)], "length is unknown"),
    ],
)
def test_inputs_of_the_wrong_shape_or_unknown_length_are_window_errors(make, message):
    with pytest.raises(WindowError, match=message):
        windows(make(np.zeros((20, 2), np.float32)), size=3)


@pytest.mark.parametrize("sessions", [[10.5, 9.5], [-1, 21], ["10", 10], [float("nan"), 20]])
def test_session_lengths_that_are_not_whole_rows_are_refused_not_truncated(sessions):
    with pytest.raises(WindowError, match=r"sessions\[0\] must be a number of rows"):
        windows(np.zeros((20, 2), np.float32), size=3, sessions=sessions)
    w = windows(np.arange(40, dtype=np.float32).reshape(20, 2), size=3, sessions=[10.0, 10.0])  # whole floats fit
    assert w.shape[0] == 16


def test_feature_names_travel_in_the_attrs_once_beside_the_scales():
    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    w = windows(x, size=3, scales=(2, 1), names=["mid", "spread", "imbalance"])
    assert w.attrs["windows"]["features"] == ["mid", "spread", "imbalance"]
    assert w.attrs["windows"]["scales"] == [2, 1] and w.shape[-1] == 6  # names once, columns once per scale
    np.testing.assert_array_equal(w.compute(), reference(x, 3, 1, (2, 1)))  # names change no value
    split = windows(x, size=3, sessions=[10, 10], names=("a", "b", "c"))
    assert split.attrs["windows"]["features"] == ["a", "b", "c"] and split.attrs["windows"]["sessions"] == [10, 10]
    assert "features" not in windows(x, size=3).attrs["windows"]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["mid", "spread"], r"expected 3 names, one per column of x \(shape \(T, 3\)\), got 2"),
        (["a", "b", "c", "d"], "expected 3 names.*got 4"),
        ("abc", "sequence of 3 strings.*got the single string 'abc'"),
        (["a", 2, "c"], "names must be strings, got 2"),
    ],
)
def test_feature_names_of_the_wrong_count_or_type_are_refused(names, message):
    with pytest.raises(WindowError, match=message):
        windows(np.zeros((20, 3), np.float32), size=3, names=names)
    with pytest.raises(WindowError, match=message):
        windows(np.zeros((20, 3), np.float32), size=3, sessions=[20], names=names)


@settings(max_examples=200, deadline=None)
@given(
    chunks=st.lists(st.integers(1, 30), min_size=1, max_size=12),
    size=st.integers(1, 8),
    stride=st.integers(1, 5),
    scales=SCALES,
)
def test_each_window_is_made_by_exactly_the_block_holding_its_end(chunks, size, stride, scales):
    T = sum(chunks)
    counts = block_window_counts(chunks, size, stride, scales)
    n = window_count(T, size, stride, scales)
    assert sum(counts) == n
    ends = window_ends(n, size, stride, scales)
    bounds = np.concatenate([[0], np.cumsum(chunks)])
    expected = [int(((ends >= lo) & (ends < hi)).sum()) for lo, hi in zip(bounds[:-1], bounds[1:])]
    assert list(counts) == expected
    assert (ends <= T - 1).all() and (n == 0 or ends[0] == halo(size, scales))


@settings(max_examples=200, deadline=None)
@given(chunks=st.lists(st.integers(1, 30), min_size=1, max_size=15), minimum=st.integers(1, 60))
def test_merged_chunks_keep_the_total_and_only_remove_boundaries(chunks, minimum):
    merged = merge_short_chunks(chunks, minimum)
    assert sum(merged) == sum(chunks)
    assert len(merged) == 1 or all(c >= minimum for c in merged)
    assert set(np.cumsum(merged)) <= set(np.cumsum(chunks))


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 20),
    scales=st.lists(st.integers(1, 8), min_size=1, max_size=3, unique=True),
    stride=st.integers(1, 10),
    horizon=st.integers(1, 30),
    lookback=st.integers(0, 50),
    fractions=st.lists(st.floats(0.05, 0.6), min_size=1, max_size=3),
    extra=st.integers(0, 3000),
)
def test_time_splits_never_share_a_raw_step(size, scales, stride, horizon, lookback, fractions, extra):
    """Last step split A touches (its last label) < first step split B touches (the
    oldest feature history of its first window)."""
    total = sum(fractions)
    fr = {f"s{i}": f / max(total, 1.0) for i, f in enumerate(fractions)}
    gap = split_gap_windows(size, scales, stride, horizon, lookback)
    n = int(2 * len(fr) * (gap + 1) / min(fr.values())) + extra
    ranges = split_ranges(n, fr, gap)
    ends = window_ends(n, size, stride, scales)
    H = halo(size, scales)
    spans = list(ranges.values())
    for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
        assert a0 < a1 <= b0 < b1 <= n
        assert ends[a1 - 1] + horizon < ends[b0] - H - lookback
        # and the gap is as small as it can be: one window fewer would leak
        assert ends[a1 - 1] + horizon >= ends[b0] - stride - H - lookback


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_the_window_kernel_equals_the_definition_for_any_ends_and_outputs(data):
    """The one kernel both the dask path and virtual streaming call: arbitrary (unsorted,
    repeated) ends, into a fresh, a given or a non-contiguous output, across its
    internal batches of windows."""
    from pipeline.features.windows import windows_numpy_block

    size = data.draw(st.integers(1, 8))
    scales = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3, unique=True)))
    F = data.draw(st.integers(1, 4))
    span = (size - 1) * max(scales)
    T = data.draw(st.integers(span + 1, span + 60))
    block = np.random.default_rng(T + F).standard_normal((T, F)).astype(np.float32)
    ends = np.array(data.draw(st.lists(st.integers(span, T - 1), min_size=0, max_size=40)), dtype=np.int64)
    want = np.stack([np.concatenate([block[[e - s * (size - 1 - j) for j in range(size)]] for s in scales], axis=1)
                     for e in ends]) if ends.size else np.empty((0, size, F * len(scales)), np.float32)
    np.testing.assert_array_equal(windows_numpy_block(block, ends, size, scales), want)
    out = np.full((ends.size, size, F * len(scales)), np.nan, np.float32)
    assert windows_numpy_block(block, ends, size, scales, out=out) is out
    np.testing.assert_array_equal(out, want)
    wide = np.full((ends.size, size, F * len(scales) + 1), -1.0, np.float32)
    windows_numpy_block(block, ends, size, scales, out=wide[:, :, 1:])  # not C-contiguous
    np.testing.assert_array_equal(wide[:, :, 1:], want)
    assert (wide[:, :, 0] == -1).all()


def test_the_window_kernel_spans_several_internal_batches(monkeypatch):
    import importlib

    wmod = importlib.import_module("pipeline.features.windows")  # the module, not the function
    monkeypatch.setattr(wmod, "_TAKE_ROWS", 7 * 5 * 2)
    block = np.arange(300 * 2, dtype=np.float32).reshape(300, 2)
    ends = np.arange(40, 300, 3)
    want = wmod.windows_numpy_block(block, ends, 5, (1, 10))
    monkeypatch.setattr(wmod, "_TAKE_ROWS", 10**6)
    np.testing.assert_array_equal(wmod.windows_numpy_block(block, ends, 5, (1, 10)), want)
    np.testing.assert_array_equal(want[3, :, 2:], block[[ends[3] - 10 * (4 - j) for j in range(5)]])


@pytest.mark.parametrize("ends", [[3], [2, 40], [99, 100]])
def test_the_window_kernel_refuses_ends_outside_the_block(ends):
    """The kernel's unchecked fast copy must never clip a bad end to a wrong window."""
    from pipeline.features.windows import windows_numpy_block

    block = np.zeros((100, 3), np.float32)
    with pytest.raises(WindowError, match=r"do not fit a block of 100 rows"):
        windows_numpy_block(block, np.array(ends), 4, (1, 2))  # lookback 6


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 400),
    cuts=st.lists(st.integers(0, 400), min_size=1, max_size=6),
    unit=st.integers(1, 60),
)
def test_aligned_window_chunks_put_a_boundary_on_every_unit_of_every_split(n, cuts, unit):
    edges = sorted({min(c, n) for c in cuts})
    ranges = {f"s{i}": (a, b) for i, (a, b) in enumerate(zip(edges[::2], edges[1::2])) if b > a}
    chunks = aligned_window_chunks(n, ranges, unit)
    assert sum(chunks) == n and all(c > 0 for c in chunks)
    bounds = set(np.cumsum((0,) + chunks).tolist())
    for lo, hi in ranges.values():
        assert set(range(lo, hi, unit)) | {hi} <= bounds  # a split sliced out is exactly its units
        inside = sorted(b for b in bounds if lo <= b <= hi)
        assert all(b - a <= unit for a, b in zip(inside, inside[1:]))


@settings(max_examples=300, deadline=None)
@given(
    out=st.lists(st.integers(0, 25), min_size=1, max_size=10),
    size=st.integers(1, 6),
    stride=st.integers(1, 4),
    scales=SCALES,
    tail=st.integers(0, 3),
)
def test_input_chunks_make_the_requested_windows_per_block(out, size, stride, scales, tail):
    """The inverse of block_window_counts: each step block makes the windows of one or
    more consecutive requested chunks, and every block (but the last) can lend its halo."""
    n = sum(out)
    h = halo(size, scales)
    if n == 0:
        return
    T = h + (n - 1) * stride + 1 + min(tail, stride - 1)  # exactly n windows
    assert window_count(T, size, stride, scales) == n
    chunks = input_chunks_for_windows(out, T, size, stride, scales)
    assert sum(chunks) == T
    assert len(chunks) == 1 or min(chunks[:-1]) >= h
    made = block_window_counts(chunks, size, stride, scales)
    assert set(np.cumsum(made).tolist()) <= set(np.cumsum(out).tolist())  # only boundaries removed
    if all(c > 0 for c in out) and all(c * stride >= h for c in out[:-1]) and (out[-1] - 1) * stride + 1 >= h:
        assert made == tuple(out)  # every block spans at least the halo: exactly the requested blocks
    with pytest.raises(WindowError, match="do not add up"):
        input_chunks_for_windows(out + [1], T, size, stride, scales)


@pytest.mark.parametrize("stride", [1, 3])
def test_windows_in_requested_blocks_equal_the_definition(stride):
    x = np.random.default_rng(stride).standard_normal((700, 3)).astype(np.float32)
    want = reference(x, 5, stride, (1, 4))
    n = len(want)
    a, b = (0, 80), (100, 180)  # 20 windows of gap: at least the halo of 16 steps
    out = aligned_window_chunks(n, {"a": a, "b": b}, 40)
    got = windows(da.from_array(x, chunks=(123, -1)), size=5, stride=stride, scales=(1, 4), out_chunks=out)
    assert got.chunks[0] == out
    assert got[b[0] : b[1]].chunks[0] == (40, 40)  # a split sliced out is exactly its units
    np.testing.assert_array_equal(got.compute(), want)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=4), data=st.data())
def test_windows_at_equal_numpy_for_any_input_chunks_and_blocks(lengths, data):
    """Windows at the ends of sessions' runs, for any chunking of the series (chunks
    shorter than the halo included) and any blocks of windows (empty ones included):
    each block's task slices its rows from the chunks that hold them."""
    from pipeline.features.sessions import SegmentTable, window_runs
    from pipeline.features.windows import windows_at

    size, stride, scales = 3, data.draw(st.integers(1, 3)), (1, 2)
    h = (size - 1) * max(scales)
    total = sum(lengths)
    if total == 0:
        return
    x = np.arange(total * 2, dtype=np.float32).reshape(total, 2)
    runs = window_runs(SegmentTable.from_lengths(lengths), size=size, stride=stride, scales=scales, back=h, fwd=0)
    cuts = data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=20))
    chunks, left = [], total
    for c in cuts:
        if left == 0:
            break
        chunks.append(min(c, left))
        left -= chunks[-1]
    if left:
        chunks.append(left)
    blocks = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=12))
    out, left = [], runs.n
    for b in blocks:
        out.append(min(b, left))
        left -= out[-1]
    out.append(left)
    got = windows_at(da.from_array(x, chunks=(tuple(chunks), -1)), runs, size=size, scales=scales, out_chunks=out)
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    want = [reference(x[a:b], size, stride, scales) for a, b in zip(starts, starts[1:]) if b - a > h]
    want = np.concatenate(want) if want else np.empty((0, size, 4), np.float32)
    if runs.n:  # no windows at all: one empty block
        assert got.chunks[0] == tuple(out)
    np.testing.assert_array_equal(got.compute(scheduler="sync"), want)


def write_recordings(folder: Path, lengths: list[int], F: int = 2, seed: int = 0) -> list[np.ndarray]:
    """One HDF5 file per recording, ``rec{i}.h5`` (dataset ``x``), and the arrays written."""
    rng = np.random.default_rng(seed)
    parts = [rng.standard_normal((n, F)) + 1000 * i for i, n in enumerate(lengths)]  # thousands: the file
    for i, part in enumerate(parts):
        with h5py.File(folder / f"rec{i}.h5", "w") as f:
            f["x"] = part
    return parts


def per_session(parts: list[np.ndarray], size: int, stride: int, scales: tuple[int, ...]
                ) -> tuple[np.ndarray, np.ndarray]:
    """Windows of each part on its own, joined, and their end rows in the joined array."""
    h = (size - 1) * max(scales)
    starts = np.cumsum([0] + [len(p) for p in parts])
    wins = [reference(p, size, stride, scales) for p in parts]
    ends = [s + h + stride * np.arange(len(w), dtype=np.int64) for s, w in zip(starts, wins)]
    return np.concatenate(wins), np.concatenate(ends)


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=2, max_size=4),
    size=st.integers(1, 5),
    stride=st.integers(1, 4),
    scales=SCALES,
    chunk=st.integers(1, 50),
)
def test_files_joined_along_time_are_sessions_by_default(lengths, size, stride, scales, chunk):
    """open_source(combine="concat") of several recordings: by default no window spans
    two files (each file's windows as numpy makes them from that file alone), and
    window_end_rows names each window's end row; sessions="none" joins them."""
    scales = tuple(scales)
    with tempfile.TemporaryDirectory() as d:
        parts = write_recordings(Path(d), lengths, seed=sum(lengths))
        src = open_source(f"{d}/rec*.h5", combine="concat", chunk_rows=chunk)
        expect, ends = per_session(parts, size, stride, scales)
        joined = np.concatenate(parts)
        if not len(expect):
            with pytest.raises(WindowError, match="no session of .*the sessions are the files x was read from"):
                windows(src.array, size=size, stride=stride, scales=scales)
        else:
            got = windows(src.array, size=size, stride=stride, scales=scales)
            assert got.attrs["windows"]["sessions"] == lengths
            np.testing.assert_array_equal(got.compute(scheduler="sync"), expect)
            np.testing.assert_array_equal(window_end_rows(src.array, size=size, stride=stride, scales=scales), ends)
            np.testing.assert_array_equal(joined[ends], expect[:, -1, : joined.shape[1]])  # a window ends at its row
        whole = reference(joined, size, stride, scales)
        if len(whole):
            np.testing.assert_array_equal(
                windows(src.array, size=size, stride=stride, scales=scales, sessions="none").compute(), whole)
            np.testing.assert_array_equal(
                window_end_rows(src.array, size=size, stride=stride, scales=scales, sessions="none"),
                window_ends(len(whole), size, stride, scales))


def test_window_end_rows_align_per_step_labels_kept_in_other_files(tmp_path):
    """Labels of each step, one .npy per recording beside the HDF5 features: the label of
    window i is the label of its end row, as a plain loop over each file finds it."""
    lengths = [37, 120, 64]
    parts = write_recordings(tmp_path, lengths)
    labels = [np.arange(n) * 10 + i for i, n in enumerate(lengths)]  # step t of file i: 10 t + i
    for i, lab in enumerate(labels):
        np.save(tmp_path / f"lab{i}.npy", lab)
    x = open_source(f"{tmp_path}/rec*.h5", combine="concat").array
    y = pipeline_load(f"{tmp_path}/lab*.npy", combine="concat")
    ends = window_end_rows(x, size=10, stride=3, scales=(1, 2))
    want = [lab[e] for lab in labels for e in range(18, len(lab), 3)]  # halo 18, in each file alone
    np.testing.assert_array_equal(y.compute()[ends], want)
    w = windows(x, size=10, stride=3, scales=(1, 2)).compute()
    assert len(w) == len(want) and not any(len(np.unique(np.round(win / 1000))) > 1 for win in w)  # none mixes files


def test_an_explicit_session_list_wins_over_the_files(tmp_path):
    parts = write_recordings(tmp_path, [30, 50])
    x = open_source(f"{tmp_path}/rec*.h5", combine="concat").array
    joined = np.concatenate(parts)
    got = windows(x, size=4, sessions=[20, 60])
    np.testing.assert_array_equal(got.compute(), np.concatenate([reference(joined[:20], 4, 1, (1,)),
                                                                 reference(joined[20:], 4, 1, (1,))]))
    np.testing.assert_array_equal(windows(x, size=4, sessions="file").compute(), per_session(parts, 4, 1, (1,))[0])


def test_tables_read_from_several_files_are_sessions_by_their_rows(tmp_path):
    frames = [pd.DataFrame({"a": np.arange(n, dtype=float) + 1000 * i, "b": np.ones(n)})
              for i, n in enumerate([25, 40])]
    for i, df in enumerate(frames):
        df.to_csv(tmp_path / f"day{i}.csv", index=False)
    x = pipeline_load(f"{tmp_path}/day*.csv")
    expect, _ = per_session([df.to_numpy() for df in frames], 5, 2, (1,))
    np.testing.assert_array_equal(windows(x, size=5, stride=2).compute(), expect)


def test_files_whose_rows_do_not_add_up_are_refused_not_joined(tmp_path):
    """nan="drop" left out a row: which rows came from which file is not known from the
    files' row counts, so windows refuse rather than guess; sessions= resolves it."""
    for i, n in enumerate([25, 40]):
        df = pd.DataFrame({"a": np.arange(n, dtype=float), "b": np.ones(n)})
        df.loc[3, "a"] = np.nan
        df.to_csv(tmp_path / f"day{i}.csv", index=False)
    x = pipeline_load(f"{tmp_path}/day*.csv", nan="drop")
    assert x.shape[0] == 63
    with pytest.raises(WindowError, match=r"day0\.csv\), whose rows add up to 65, not x's 63.*sessions='none'"):
        windows(x, size=5)
    with pytest.raises(WindowError, match="add up to 65"):
        window_end_rows(x, size=5)
    assert windows(x, size=5, sessions=[24, 39]).shape[0] == 20 + 35
    assert windows(x, size=5, sessions="none").shape[0] == 59


def test_files_stacked_one_sample_each_stay_one_series(tmp_path):
    """combine="stack" of 1-D files: each row is a file, and windows run across them."""
    rows = np.arange(24, dtype=np.float64).reshape(8, 3)
    for i, r in enumerate(rows):
        np.save(tmp_path / f"v{i}.npy", r)
    x = pipeline_load(f"{tmp_path}/v*.npy")
    assert x.shape == (8, 3)
    np.testing.assert_array_equal(windows(x, size=3).compute(), reference(rows, 3, 1, (1,)))


@pytest.mark.parametrize(
    ("sessions", "message"),
    [
        ("file", r"sessions='file' needs an array joined from several files"),
        ("daily", r"sessions must be rows per session, one of \('file', 'none'\) or None, got 'daily'"),
        ([10, 5], "sessions of 15 rows in all for a series of 20 steps"),
    ],
)
def test_session_rules_that_do_not_fit_the_array_are_refused(sessions, message):
    with pytest.raises(WindowError, match=message):
        windows(np.zeros((20, 2)), size=3, sessions=sessions)
    with pytest.raises(WindowError, match=message):
        window_end_rows(np.zeros((20, 2)), size=3, sessions=sessions)


def test_window_end_rows_of_one_series_are_the_design_formula():
    np.testing.assert_array_equal(window_end_rows(np.zeros((30, 1)), size=4, stride=5, scales=(1, 3)),
                                  [9 + 5 * i for i in range(5)])  # e_i = (size-1)*max(scales) + i*stride <= 29


def forecast_reference(part: np.ndarray, size: int, stride: int, scales: tuple[int, ...], k: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Windows of one part whose label, ``k`` steps after the end, is still in the part,
    and those labels' rows, by a plain loop over end steps."""
    h = (size - 1) * max(scales)
    ends = list(range(h, len(part) - k, stride))
    wins = [np.concatenate([part[[e - s * (size - 1 - j) for j in range(size)]] for s in scales], axis=1)
            for e in ends]
    out = np.stack(wins) if wins else np.empty((0, size, part.shape[1] * len(scales)), part.dtype)
    return out, np.asarray(ends, dtype=np.int64) + k


@settings(max_examples=15, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=2, max_size=4),
    size=st.integers(1, 5),
    stride=st.integers(1, 4),
    scales=SCALES,
    k=st.integers(0, 7),
    chunk=st.integers(1, 50),
)
def test_a_horizon_leaves_out_the_windows_whose_label_would_read_the_next_file(lengths, size, stride, scales, k,
                                                                               chunk):
    """windows(..., horizon=k) and window_end_rows(..., horizon=k) of recordings joined
    from files: exactly the windows whose step end + k lies in their own file, as a
    numpy loop over each file finds them, and `target[ends + k]` reads only that file."""
    scales = tuple(scales)
    with tempfile.TemporaryDirectory() as d:
        parts = write_recordings(Path(d), lengths, seed=sum(lengths) + k)
        x = open_source(f"{d}/rec*.h5", combine="concat", chunk_rows=chunk).array
        starts = np.cumsum([0] + lengths)
        refs = [forecast_reference(p, size, stride, scales, k) for p in parts]
        expect = np.concatenate([w for w, _ in refs])
        label_rows = np.concatenate([s + r for s, (_, r) in zip(starts, refs)])
        if not len(expect):
            with pytest.raises(WindowError, match=f"no session .*and {k} after for the label" if k else "no session"):
                windows(x, size=size, stride=stride, scales=scales, horizon=k)
            return
        got = windows(x, size=size, stride=stride, scales=scales, horizon=k)
        assert got.attrs["windows"]["horizon"] == k and got.attrs["windows"]["sessions"] == lengths
        np.testing.assert_array_equal(got.compute(scheduler="sync"), expect)
        ends = window_end_rows(x, size=size, stride=stride, scales=scales, horizon=k)
        np.testing.assert_array_equal(ends + k, label_rows)
        file_of = np.searchsorted(starts, np.arange(starts[-1]), side="right") - 1
        assert (file_of[ends] == file_of[ends + k]).all()  # no label from the next file


@pytest.mark.parametrize("size, stride, scales, k", [(4, 1, (1,), 3), (3, 2, (1, 3), 5), (5, 3, (2,), 0)])
def test_a_horizon_on_one_series_stops_the_windows_k_steps_before_its_end(size, stride, scales, k):
    x = np.random.default_rng(k).standard_normal((57, 3))
    expect, label_rows = forecast_reference(x, size, stride, scales, k)
    got = windows(da.from_array(x, chunks=(7, 3)), size=size, stride=stride, scales=scales, horizon=k)
    np.testing.assert_array_equal(got.compute(scheduler="sync"), expect)
    np.testing.assert_array_equal(window_end_rows(x, size=size, stride=stride, scales=scales, horizon=k) + k,
                                  label_rows)
    assert label_rows.max() <= len(x) - 1
    assert "sessions" not in got.attrs["windows"] and got.attrs["windows"]["horizon"] == k
    assert "horizon" not in windows(x, size=size, stride=stride, scales=scales).attrs["windows"]


def test_a_horizon_that_is_no_count_of_steps_or_leaves_no_window_is_refused():
    x = np.zeros((10, 2))
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(WindowError, match="horizon must be a number of steps, 0 or more"):
            windows(x, size=3, horizon=bad)
        with pytest.raises(WindowError, match="horizon must be a number of steps, 0 or more"):
            window_end_rows(x, size=3, horizon=bad)
    with pytest.raises(WindowError, match=r"series of 10 steps is too short .*horizon=8.*3 steps, and 8 after"):
        windows(x, size=3, horizon=8)


def write_npy_recordings(folder: Path, lengths: list[int], F: int = 3,
                         seed: int = 7) -> tuple[list[np.ndarray], list[str]]:
    """One ``.npy`` per recording (values in the thousands of its index) and their paths."""
    rng = np.random.default_rng(seed)
    parts = [rng.standard_normal((n, F)) + 1000 * i for i, n in enumerate(lengths)]
    paths = [str(folder / f"rec{i}.npy") for i in range(len(parts))]
    for path, part in zip(paths, parts):
        np.save(path, part)
    return parts, paths


def per_file_with_horizon(parts: list[np.ndarray], size: int, stride: int, scales: tuple[int, ...], k: int
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Each file's windows on its own whose end is ``k`` rows before the file's end (the
    windows of the file without its last ``k`` rows), and their end rows in the join."""
    h = (size - 1) * max(scales)
    wins, ends, start = [], [], 0
    for p in parts:
        w = reference(p[: len(p) - k], size, stride, scales)
        wins.append(w)
        ends.append(start + h + stride * np.arange(len(w), dtype=np.int64))
        start += len(p)
    return np.concatenate(wins), np.concatenate(ends)


DERIVED = {
    "arithmetic": (lambda x: x * 2 - 1, lambda a: a * 2 - 1),
    "columns": (lambda x: x[:, [2, 0]], lambda a: a[:, [2, 0]]),
    "map_blocks": (lambda x: x.map_blocks(lambda b: np.cumsum(b, axis=1), dtype=x.dtype),
                   lambda a: np.cumsum(a, axis=1)),
    "joined_columns": (lambda x: da.concatenate([x, np.log(np.abs(x) + 1)], axis=1),
                       lambda a: np.concatenate([a, np.log(np.abs(a) + 1)], axis=1)),
}


@pytest.mark.parametrize("derive", list(DERIVED))
def test_features_computed_from_loaded_files_keep_the_files_as_sessions(tmp_path, derive):
    """f = x * 2 (dask drops x.attrs) of two recordings joined along time: its windows
    and horizon labels stay inside each file, as numpy makes them from each file of f
    alone, though the loaded array itself is gone."""
    on_dask, on_numpy = DERIVED[derive]
    lengths = [40, 30]
    parts, paths = write_npy_recordings(tmp_path, lengths)
    f = on_dask(pipeline_load(paths, combine="concat", chunk_rows=16))
    assert "files" not in (getattr(f, "attrs", None) or {})  # what dask leaves: nothing to read the files from
    expect, ends = per_file_with_horizon([on_numpy(p) for p in parts], 5, 2, (1, 2), 3)
    got = windows(f, size=5, stride=2, scales=(1, 2), horizon=3)
    assert got.attrs["windows"]["sessions"] == lengths
    np.testing.assert_allclose(got.compute(scheduler="sync"), expect)
    np.testing.assert_array_equal(window_end_rows(f, size=5, stride=2, scales=(1, 2), horizon=3), ends)
    np.testing.assert_array_equal(windows(f, size=5, stride=2, scales=(1, 2), sessions="file").shape[0],
                                  len(per_session([on_numpy(p) for p in parts], 5, 2, (1, 2))[0]))


def test_the_trial_of_a_derived_array_makes_no_window_across_the_files(tmp_path):
    """The user trial: 40 + 30 rows, f = x * 2, size 8, horizon 3: 30 + 20 windows
    (not 60, 10 of them reading the next file)."""
    parts, paths = write_npy_recordings(tmp_path, [40, 30], F=2)
    f = pipeline_load(paths, combine="concat") * 2
    e = window_end_rows(f, size=8, horizon=3)
    assert len(e) == 30 + 20 and not np.any((e - 7 < 40) & (e + 3 >= 40))
    np.testing.assert_array_equal(windows(f, size=8, horizon=3).compute(),
                                  per_file_with_horizon([p * 2 for p in parts], 8, 1, (1,), 3)[0])


@pytest.mark.parametrize("derive", [lambda x: x[5:], lambda x: x[1:] - x[:-1], lambda x: da.concatenate([x, x])],
                         ids=["row_slice", "lag", "joined_rows"])
def test_an_array_of_other_rows_than_its_files_is_refused_not_guessed(tmp_path, derive):
    """A row slice, a lag or a join along time of loaded files: where each file ends in
    it is not known, so windows refuse (naming the first file and both lengths) rather
    than take the files' bounds; sessions= resolves it."""
    parts, paths = write_npy_recordings(tmp_path, [40, 30])
    f = derive(pipeline_load(paths, combine="concat", chunk_rows=16))
    T = f.shape[0]
    with pytest.raises(WindowError, match=rf"rec0\.npy\) of 70 rows, but has {T} rows.*sessions=\[rows per file\]"):
        windows(f, size=4)
    with pytest.raises(WindowError, match=rf"but has {T} rows"):
        window_end_rows(f, size=4, horizon=2)
    lengths = [T - 30, 30]  # e.g. x[5:]: the first file's last 35 rows, then the second file
    got = windows(f, size=4, sessions=lengths).compute()
    joined = f.compute()
    np.testing.assert_array_equal(got, per_session([joined[: T - 30], joined[T - 30:]], 4, 1, (1,))[0])
    np.testing.assert_array_equal(windows(f, size=4, sessions="none").compute(), reference(joined, 4, 1, (1,)))


def test_columns_joined_from_files_that_end_at_different_rows_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, first = write_npy_recordings(tmp_path / "a", [40, 30])
    _, second = write_npy_recordings(tmp_path / "b", [30, 40])
    f = da.concatenate([pipeline_load(first, combine="concat"), pipeline_load(second, combine="concat")], axis=1)
    with pytest.raises(WindowError, match=r"computed from 2 arrays .*\[30, 40\] and \[40, 30\] rows per file"):
        windows(f, size=4)
    assert windows(f, size=4, sessions="none").shape == (67, 4, 6)


def test_an_array_computed_from_files_whose_rows_do_not_add_up_is_refused_as_they_are(tmp_path):
    for i, n in enumerate([25, 40]):
        df = pd.DataFrame({"a": np.arange(n, dtype=float), "b": np.ones(n)})
        df.loc[3, "a"] = np.nan
        df.to_csv(tmp_path / f"day{i}.csv", index=False)
    f = pipeline_load(f"{tmp_path}/day*.csv", nan="drop")[:, :1] * 2
    with pytest.raises(WindowError, match=r"computed from an array of 2 files .*day0\.csv\), whose rows add up to 65, "
                                          r"not x's 63"):
        windows(f, size=5)
    assert windows(f, size=5, sessions=[24, 39]).shape[0] == 20 + 35


def write_token_file(path: Path, n: int) -> np.ndarray:
    """An llm.c / fineweb ``.bin`` shard: a 256-int32 header, then ``n`` uint16 tokens."""
    tokens = (np.arange(n, dtype=np.int64) * 7919 % 50257).astype(np.uint16)
    header = np.zeros(256, np.int32)
    header[:3] = [20240520, 1, n]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())
    return tokens


def token_windows(tokens: np.ndarray, size: int, stride: int) -> np.ndarray:
    """Windows of a 1-D token array by plain numpy slicing: window ``i`` is
    ``tokens[i * stride : i * stride + size]``, as ``(n, size, 1)``."""
    return np.lib.stride_tricks.sliding_window_view(tokens, size)[::stride][..., None]


@pytest.mark.parametrize("opened", ["memmap", "npy"])
def test_windows_over_a_memory_mapped_token_file_read_it_lazily_not_into_memory(tmp_path, opened):
    """Building the windows of a memmap copied the whole file into memory (``da.from_array``
    of it as a numpy array): a token file larger than RAM could not be windowed. Each task
    now reads its rows from the file, as ``pipeline.write`` reads a memmap."""
    import tracemalloc

    n = 3_000_000  # 6 MB of tokens
    if opened == "memmap":
        tokens = write_token_file(tmp_path / "shard.bin", n)
        m = np.memmap(tmp_path / "shard.bin", np.uint16, "r", offset=1024, shape=(n,)).reshape(-1, 1)
    else:
        tokens = (np.arange(n, dtype=np.int64) * 7919 % 50257).astype(np.uint16)
        np.save(tmp_path / "shard.npy", tokens[:, None])
        m = np.load(tmp_path / "shard.npy", mmap_mode="r")
    tracemalloc.start()
    try:
        w = windows(m, size=1025, stride=1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < tokens.nbytes // 6, f"building lazy windows allocated {peak} bytes for a {tokens.nbytes}-byte file"
    np.testing.assert_array_equal(w.compute(scheduler="threads"), token_windows(tokens, 1025, 1024))


def test_windows_over_a_strided_view_of_a_memmap_and_with_a_horizon_equal_numpy(tmp_path):
    """A view of a map (every other column, rows from 3) is read from the file too; the
    path that makes windows per run (``horizon=``) reads it the same way."""
    x = np.random.default_rng(3).standard_normal((4000, 4)).astype(np.float32)
    x.tofile(tmp_path / "series.f32")
    view = np.memmap(tmp_path / "series.f32", np.float32, "r", shape=(4000, 4))[3:, 1::2]
    expect = np.asarray(view).copy()
    got = windows(view, size=5, stride=3, scales=(1, 2))
    assert not any(isinstance(v, np.ndarray) and v.nbytes > 4096 for v in dict(got.dask).values())
    np.testing.assert_array_equal(got.compute(scheduler="sync"), reference(expect, 5, 3, (1, 2)))
    ahead = windows(view, size=5, stride=3, scales=(1, 2), horizon=4)
    ends = window_end_rows(expect, size=5, stride=3, scales=(1, 2), horizon=4)
    np.testing.assert_array_equal(ahead.compute(scheduler="sync"), reference(expect, 5, 3, (1, 2))[: ends.size])
    assert ends[-1] + 4 <= len(expect) - 1
