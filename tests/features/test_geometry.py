"""Pure block arithmetic of windows against plain-numpy end rows (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.features.geometry import bounded_window_chunks, rows_per_block


def ends_of_sessions(lengths: list[int], reach: int, stride: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every window end row of sessions ``lengths``, by a loop, and the same ends as
    runs (first end and count per session that has one)."""
    ends, first, count, start = [], [], [], 0
    for n in lengths:
        mine = list(range(start + reach, start + n, stride))
        if mine:
            first.append(mine[0])
            count.append(len(mine))
        ends += mine
        start += n
    return np.array(ends, dtype=np.int64), np.array(first, dtype=np.int64), np.array(count, dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 400), min_size=1, max_size=6),
    reach=st.integers(0, 30),
    stride=st.integers(1, 60),
    span=st.integers(1, 500),
    max_windows=st.integers(1, 50),
)
def test_bounded_blocks_hold_every_window_once_within_both_bounds(lengths, reach, stride, span, max_windows):
    """Blocks cover the windows in order; each holds at most max_windows windows whose
    ends lie within span rows (a block of one window whatever the bounds), and each but
    the last stops only because one more window would break a bound."""
    ends, first, count = ends_of_sessions(lengths, reach, stride)
    blocks = bounded_window_chunks(first, count, stride, span=span, max_windows=max_windows)
    assert sum(blocks) == ends.size and all(b > 0 for b in blocks)
    edges = np.concatenate([[0], np.cumsum(blocks, dtype=np.int64)])
    for k, (a, b) in enumerate(zip(edges[:-1], edges[1:])):
        assert b - a == 1 or (b - a <= max_windows and ends[b - 1] - ends[a] < span)
        if b < ends.size:  # greedy: the next window did not fit
            assert b - a + 1 > max_windows or ends[b] - ends[a] >= span


def test_bounded_blocks_of_a_strided_source_read_a_bounded_span_not_the_whole_source():
    """The user trial's shape: 42,000 windows of 4 steps, 50 rows apart, in three
    sessions; a count bound alone (131,072 windows) put them all in one block spanning
    2.1M rows."""
    ends, first, count = ends_of_sessions([700_000, 900_000, 500_000], 3, 50)
    blocks = bounded_window_chunks(first, count, 50, span=233_017, max_windows=131_072)
    edges = np.concatenate([[0], np.cumsum(blocks)])
    spans = [ends[b - 1] - ends[a] + 1 for a, b in zip(edges[:-1], edges[1:])]
    assert sum(blocks) == ends.size == 42_000
    assert len(blocks) == 10 and max(spans) <= 233_017


def test_empty_runs_make_no_block():
    assert bounded_window_chunks([], [], 3, span=10, max_windows=5) == ()
    assert bounded_window_chunks([5, 9], [0, 0], 3, span=10, max_windows=5) == ()


@settings(max_examples=200, deadline=None)
@given(budget=st.integers(0, 10_000), reach=st.integers(0, 10_000))
def test_rows_per_block_leave_room_for_the_reach_and_always_progress(budget, reach):
    rows = rows_per_block(budget, reach)
    assert rows >= 1 and rows >= reach
    assert rows + reach <= max(budget, 2 * reach, reach + 1)  # a block reads its ends' rows and the reach


@given(start=st.integers(0, 60), length=st.integers(1, 40), back=st.integers(0, 30), fwd=st.integers(0, 30),
       cuts=st.lists(st.integers(0, 120), max_size=6))
def test_a_halo_holds_its_block_and_never_crosses_a_cut_outside_it(start, length, back, fwd, cuts):
    from pipeline.features.geometry import halo_span

    n = start + length + 20
    stop = start + length
    edges = np.unique(np.asarray([c for c in cuts if c <= n], dtype=np.int64))
    lo, hi = halo_span(start, stop, back, fwd, n, edges)
    assert lo <= start and hi >= stop  # the block itself, always
    assert lo == max(0, start - back) if not edges.size else lo >= max(0, start - back)
    outside = [c for c in edges if lo < c < start or stop < c < hi]
    assert not outside  # no cut strictly inside the halo beyond the block's own rows
    # As wide as allowed: widened by one row more, it would cross a cut or the bounds.
    if lo > max(0, start - back):
        assert lo in edges.tolist()
    if hi < min(n, stop + fwd):
        assert hi in edges.tolist()
    assert halo_span(start, stop, back, fwd, n) == (max(0, start - back), min(n, stop + fwd))
