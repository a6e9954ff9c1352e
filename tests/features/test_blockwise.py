"""One blockwise step with a halo: the rows a block reads from the input's chunks, and
the step's values against numpy for any chunking, one task per chunk."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from dask.utils import key_split
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.features.blockwise import map_with_halo
from pipeline.features.geometry import chunk_bounds, row_pieces


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.integers(1, 9), min_size=1, max_size=12), data=st.data())
def test_row_pieces_hold_exactly_the_rows_asked_for(chunks, data):
    bounds = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int64)
    total = int(bounds[-1])
    lo = data.draw(st.integers(0, total - 1))
    hi = data.draw(st.integers(lo + 1, total))
    rows = np.arange(total)
    parts = [rows[bounds[c] : bounds[c + 1]] for c in range(len(chunks))]
    pieces = row_pieces(bounds, lo, hi)
    got = np.concatenate([parts[c][a:b] for c, a, b in pieces])
    np.testing.assert_array_equal(got, rows[lo:hi])
    assert all(b > a for _, a, b in pieces)  # no empty slice: each piece is a chunk it needs
    assert [c for c, _, _ in pieces] == sorted({c for c, _, _ in pieces})
    got_bounds = chunk_bounds(chunks)
    assert got_bounds.dtype == np.int64 and got_bounds.tolist() == [sum(chunks[:i]) for i in range(len(chunks) + 1)]


@pytest.mark.parametrize("lo, hi", [(-1, 3), (2, 2), (0, 11)])
def test_row_pieces_refuse_rows_outside_the_chunks(lo, hi):
    with pytest.raises(ValueError, match="outside"):
        row_pieces(np.array([0, 4, 10]), lo, hi)


def _trailing_and_leading(block: np.ndarray) -> np.ndarray:
    """Per row: the sum of column 0 over the 3 rows before it and itself, and column 1
    two rows ahead (NaN where the reach leaves the block)."""
    out = np.full((block.shape[0], 2), np.nan)
    c = np.concatenate([[0.0], np.cumsum(block[:, 0])])
    out[3:, 0] = c[4:] - c[:-4]
    out[:-2, 1] = block[2:, 1]
    return out


@settings(max_examples=60, deadline=None)
@given(chunks=st.lists(st.integers(1, 9), min_size=1, max_size=10))
def test_a_step_with_a_halo_equals_it_over_the_whole_series_for_any_chunking(chunks):
    """Chunks shorter than the halo included: a block reads its rows from as many
    chunks as hold them."""
    total = sum(chunks)
    x = np.random.default_rng(total).standard_normal((total, 4))
    a = da.from_array(x, chunks=(tuple(chunks), -1))
    out = map_with_halo(a, _trailing_and_leading, back=3, fwd=2, width=2, dtype=np.float32, token="t",
                        columns=[2, 0])
    with dask.config.set(scheduler="sync"):
        got = out.compute()
    want = _trailing_and_leading(x[:, [2, 0]]).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    assert out.chunks[0] == tuple(chunks) and got.dtype == np.float32
    # One task per chunk beside the input's own: no overlap or concatenation layers.
    keys = [key_split(k) for k in dict(out.__dask_graph__())]
    assert keys.count("t") == len(chunks) and len(keys) == 2 * len(chunks)


@settings(max_examples=150, deadline=None)
@given(chunks=st.lists(st.integers(1, 9), min_size=1, max_size=8), data=st.data())
def test_take_rows_equals_numpys_index_and_computes_only_the_chunks_holding_them(chunks, data):
    import dask

    from pipeline.features.blockwise import take_rows

    n = sum(chunks)
    values = np.arange(n * 2, dtype=np.int64).reshape(n, 2) * 3
    rows = data.draw(st.lists(st.integers(-n, n - 1), max_size=12))
    computed: list[int] = []

    def chunk(i: int, lo: int, hi: int) -> np.ndarray:
        computed.append(i)
        return values[lo:hi]

    bounds = np.concatenate([[0], np.cumsum(chunks)])
    x = da.concatenate([da.from_delayed(dask.delayed(chunk)(i, int(a), int(b)), shape=(int(b - a), 2), dtype=np.int64)
                        for i, (a, b) in enumerate(zip(bounds, bounds[1:]))])
    got = take_rows(x, rows).compute(scheduler="sync")
    np.testing.assert_array_equal(got, values[np.asarray(rows, dtype=np.int64)].reshape(-1, 2))
    holding = {int(np.searchsorted(bounds, r % n, side="right")) - 1 for r in rows}
    assert sorted(computed) == sorted(holding)
    with pytest.raises(IndexError):
        take_rows(x, [n])
    # Chunked along the columns too: dask's own index, the same rows.
    np.testing.assert_array_equal(take_rows(x.rechunk({1: 1}), rows).compute(scheduler="sync"),
                                  values[np.asarray(rows, dtype=np.int64)].reshape(-1, 2))


@settings(max_examples=80, deadline=None)
@given(chunks=st.lists(st.integers(1, 9), min_size=1, max_size=10), data=st.data())
def test_a_step_with_cuts_equals_it_over_each_session_and_reads_no_other_sessions_chunk(chunks, data):
    """With ``cuts`` every row whose reach stays inside its session comes out as the
    step over that session alone (the reference: numpy over each session on its own),
    and a block's halo stops at the cuts around it: a block that starts and ends on
    cuts reads its own chunk alone."""
    total = sum(chunks)
    x = np.random.default_rng(total).standard_normal((total, 4))
    inner = data.draw(st.lists(st.integers(1, max(1, total - 1)), max_size=4, unique=True)) if total > 1 else []
    cuts = np.unique([0, total, *inner])
    a = da.from_array(x, chunks=(tuple(chunks), -1))
    out = map_with_halo(a, _trailing_and_leading, back=3, fwd=2, width=2, dtype=np.float64, token="t",
                        columns=[2, 0], cuts=cuts)
    with dask.config.set(scheduler="sync"):
        got = out.compute()
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        want = _trailing_and_leading(x[lo:hi][:, [2, 0]])
        # Rows whose reach stays in the session (3 back for column 0, 2 ahead for
        # column 1): the others may read another session (inside one block) or not.
        # (A sum of cumulative sums: its rounding depends on where the block starts.)
        np.testing.assert_allclose(got[lo + 3 : hi, 0], want[3:, 0], rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(got[lo : max(lo, hi - 2), 1], want[: max(0, hi - lo - 2), 1])
    bounds = chunk_bounds(chunks)
    graph = dict(out.__dask_graph__())
    for i in range(len(chunks)):
        task = graph[(out.name, i, 0)]
        read = {dep[1] for dep in task.dependencies}
        start, stop = int(bounds[i]), int(bounds[i + 1])
        lo = max(max(0, start - 3), int(cuts[cuts <= start].max()))
        hi = min(min(total, stop + 2), int(cuts[cuts >= stop].min()))
        assert read == {c for c in range(len(chunks)) if bounds[c] < hi and bounds[c + 1] > lo}
