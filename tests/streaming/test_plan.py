"""Epoch plans: every sample exactly once across ranks and workers, equal batch counts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import StreamError
from pipeline.streaming.plan import (
    Piece,
    batch_sizes,
    batches_per_rank,
    check_batch_counts,
    chunk_order,
    group_permutation,
    pieces_for_range,
    rank_range,
    resumed_share,
    round_robin_consumed,
    served_order,
    shuffle_quality,
    worker_plan,
)
from tests.streaming.conftest import in_turns


def _impossible(total, batch, world, drop_last):
    """Configurations worker_plan refuses by construction (tested separately)."""
    return total < world or (batch == 1 and total % world and not drop_last)


def _plans(lengths, *, seed, epoch, shuffle, batch, drop_last, world, workers, buffer):
    return {
        (rank, w): worker_plan(lengths, seed=seed, epoch=epoch, shuffle=shuffle, batch_size=batch,
                               drop_last=drop_last, rank=rank, world_size=world, worker=w,
                               num_workers=workers, buffer_chunks=buffer)
        for rank in range(world) for w in range(workers)
    }


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), min_size=1, max_size=20),
    batch=st.integers(1, 40),
    world=st.integers(1, 4),
    workers=st.integers(1, 3),
    buffer=st.integers(1, 5),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
)
def test_plans_cover_each_sample_once_with_equal_batches_per_rank(lengths, batch, world, workers, buffer, seed,
                                                                  epoch, drop_last, shuffle):
    total = sum(lengths)
    if _impossible(total, batch, world, drop_last):
        return
    plans = _plans(lengths, seed=seed, epoch=epoch, shuffle=shuffle, batch=batch, drop_last=drop_last,
                   world=world, workers=workers, buffer=buffer)
    expected = batches_per_rank(total, world, batch, drop_last)
    seen = []
    for rank in range(world):
        n_batches = 0
        for w in range(workers):
            plan = plans[rank, w]
            # no empty batch, none above batch_size, drop_last batches are all full
            assert all(0 < s <= batch for s in plan.batch_sizes)
            if drop_last:
                assert all(s == batch for s in plan.batch_sizes)
            # the pieces hold exactly the samples of the batches
            assert sum(plan.batch_sizes) == sum(p.hi - p.lo for p in plan.pieces)
            for p in plan.pieces:
                assert 0 <= p.chunk < len(lengths)
                assert 0 <= p.lo < p.hi <= lengths[p.chunk]
            # buffer groups partition the pieces contiguously, at most buffer_chunks each
            flat = [i for a, b in plan.groups for i in range(a, b)]
            assert flat == list(range(len(plan.pieces)))
            assert all(0 < b - a <= buffer for a, b in plan.groups)
            n_batches += len(plan.batch_sizes)
            seen += [(p.chunk, i) for p in plan.pieces for i in range(p.lo, p.hi)]
        assert n_batches == expected
    assert len(seen) == len(set(seen))  # never twice
    if not drop_last:
        assert len(seen) == total  # and, without drop_last, every sample
        # ranks then workers, in order, walk the epoch's sequence of chunks in chunk_order
        order = chunk_order(len(lengths), seed, epoch, shuffle)
        assert seen == [(int(c), i) for c in order for i in range(lengths[c])]
    else:
        assert len(seen) == world * expected * batch


@settings(max_examples=200, deadline=None)
@given(
    n_samples=st.integers(1, 2000),
    world=st.integers(1, 4),
    batch=st.integers(1, 64),
    drop_last=st.booleans(),
)
def test_rank_ranges_and_batch_sizes(n_samples, world, batch, drop_last):
    if _impossible(n_samples, batch, world, drop_last):
        return
    ranges = [rank_range(n_samples, r, world) for r in range(world)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n_samples
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, no gap or overlap
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1
    n_batches = batches_per_rank(n_samples, world, batch, drop_last)
    for n_rank in sizes:
        bs = batch_sizes(n_rank, n_batches, batch, drop_last)
        assert len(bs) == n_batches
        assert all(0 < s <= batch for s in bs)
        if drop_last:
            assert sum(bs) == n_batches * batch <= n_rank
            assert n_rank - sum(bs) <= batch  # at most the incomplete last batch (plus one sample) dropped
        else:
            assert sum(bs) == n_rank


@pytest.mark.parametrize(
    "n_rank, n_batches, batch, drop_last, expected",
    [
        (10, 3, 4, False, (4, 4, 2)),
        (12, 3, 4, False, (4, 4, 4)),
        (8, 3, 4, False, (4, 3, 1)),  # one sample short of the largest rank: taken from the batch before
        (10, 2, 4, True, (4, 4)),
        (0, 0, 4, False, ()),
        (5, 5, 1, False, (1, 1, 1, 1, 1)),
    ],
)
def test_batch_sizes_examples(n_rank, n_batches, batch, drop_last, expected):
    assert batch_sizes(n_rank, n_batches, batch, drop_last) == expected


def test_batches_per_rank_examples():
    assert batches_per_rank(1000, 1, 64, False) == 16
    assert batches_per_rank(1000, 1, 64, True) == 15
    assert batches_per_rank(1000, 3, 48, False) == 7  # largest rank 334 -> 7 batches
    assert batches_per_rank(1000, 3, 48, True) == 6  # smallest rank 333 -> 6 full batches
    assert batches_per_rank(10, 4, 100, True) == 0


@settings(max_examples=100, deadline=None)
@given(n=st.integers(0, 200), seed=st.integers(0, 10**6), epoch=st.integers(0, 100))
def test_chunk_order_is_a_deterministic_permutation(n, seed, epoch):
    a = chunk_order(n, seed, epoch, True)
    assert a.dtype == np.int64
    assert sorted(a.tolist()) == list(range(n))
    assert np.array_equal(a, chunk_order(n, seed, epoch, True))
    assert np.array_equal(chunk_order(n, seed, epoch, False), np.arange(n))


def test_chunk_order_is_a_permutation_seeded_by_seed_and_epoch():
    a = chunk_order(50, seed=1, epoch=0, shuffle=True)
    assert sorted(a.tolist()) == list(range(50))
    assert (a == chunk_order(50, seed=1, epoch=0, shuffle=True)).all()
    assert not (a == chunk_order(50, seed=1, epoch=1, shuffle=True)).all()
    assert not (a == chunk_order(50, seed=2, epoch=0, shuffle=True)).all()
    assert (chunk_order(5, seed=1, epoch=0, shuffle=False) == np.arange(5)).all()
    # every (seed, epoch) pair among a few gives its own order
    orders = {tuple(chunk_order(40, s, e, True)) for s in range(4) for e in range(4)}
    assert len(orders) == 16


def test_group_permutation_is_deterministic_and_keyed_by_every_coordinate():
    base = dict(seed=1, epoch=2, rank=0, worker=1, group=3, shuffle=True)
    p = group_permutation(100, **base)
    assert sorted(p.tolist()) == list(range(100))
    assert np.array_equal(p, group_permutation(100, **base))
    for key in ("seed", "epoch", "rank", "worker", "group"):
        other = group_permutation(100, **{**base, key: base[key] + 1})
        assert not np.array_equal(p, other), key
    assert np.array_equal(group_permutation(7, **{**base, "shuffle": False}), np.arange(7))


def test_pieces_for_range_examples():
    lengths = [5, 3, 4]
    order = [2, 0, 1]  # sequence: chunk 2 (4), chunk 0 (5), chunk 1 (3) -> 12 samples
    assert pieces_for_range(order, lengths, 0, 12) == [Piece(2, 0, 4), Piece(0, 0, 5), Piece(1, 0, 3)]
    assert pieces_for_range(order, lengths, 2, 7) == [Piece(2, 2, 4), Piece(0, 0, 3)]
    assert pieces_for_range(order, lengths, 9, 12) == [Piece(1, 0, 3)]
    assert pieces_for_range(order, lengths, 5, 5) == []


def _simulate_round_robin(counts, served):
    taken = [0] * len(counts)
    live = itertools.cycle(range(len(counts)))
    while served:
        k = next(live)
        if taken[k] < counts[k]:
            taken[k] += 1
            served -= 1
    return taken


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 12), min_size=1, max_size=4), data=st.data())
def test_round_robin_consumed_matches_a_dataloader_taking_turns(counts, data):
    served = data.draw(st.integers(0, sum(counts)))
    assert round_robin_consumed(counts, served) == _simulate_round_robin(counts, served)


def _turns(shares):
    """What a DataLoader hands the loop from workers serving ``shares`` (lists): one
    batch of each in turn, from worker 0, a worker whose share is done skipped."""
    return [got for _, got in in_turns(iter(s) for s in shares)]


@settings(max_examples=300, deadline=None)
@given(counts=st.lists(st.integers(0, 9), min_size=1, max_size=4), data=st.data())
def test_resumed_shares_go_on_in_the_turns_of_the_interrupted_loop(counts, data):
    # The uninterrupted loop, batch (worker, k); a fresh loader's worker w serves the
    # share resumed_share names, from the batch it names.
    full = _turns([[(w, k) for k in range(c)] for w, c in enumerate(counts)])
    served = data.draw(st.integers(0, len(full)))
    taken = _simulate_round_robin(counts, served)
    shares = []
    for w in range(len(counts)):
        share, skip = resumed_share(counts, served, w)
        assert skip == taken[share]
        shares.append([(share, k) for k in range(skip, counts[share])])
    assert sorted(resumed_share(counts, served, w)[0] for w in range(len(counts))) == list(range(len(counts)))
    assert _turns(shares) == full[served:]


def test_round_robin_consumed_refuses_more_than_there_is():
    with pytest.raises(StreamError, match="only have 5"):
        round_robin_consumed([3, 2], 6)


def test_impossible_equal_batch_counts_are_a_clear_error():
    with pytest.raises(StreamError, match="drop_last=True or a batch_size above 1"):
        worker_plan([3], seed=0, epoch=0, shuffle=True, batch_size=1, drop_last=False, rank=0, world_size=2,
                    worker=0, num_workers=1, buffer_chunks=1)
    # drop_last makes the same split possible
    plan = worker_plan([3], seed=0, epoch=0, shuffle=True, batch_size=1, drop_last=True, rank=1, world_size=2,
                       worker=0, num_workers=1, buffer_chunks=1)
    assert plan.batch_sizes == (1,)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 80), world=st.integers(1, 5), batch=st.integers(1, 4), drop_last=st.booleans())
def test_batch_counts_are_refused_up_front_exactly_when_a_rank_could_not_serve_them(n, world, batch, drop_last):
    """The check a stream makes when it is created refuses exactly what some rank's plan
    would refuse at its first batch."""
    if n < world:
        return
    failing = []
    for rank in range(world):
        try:
            worker_plan([n], seed=0, epoch=0, shuffle=False, batch_size=batch, drop_last=drop_last, rank=rank,
                        world_size=world, worker=0, num_workers=1, buffer_chunks=1)
        except StreamError:
            failing.append(rank)
    try:
        check_batch_counts(n, world, batch, drop_last)
        refused = False
    except StreamError as exc:
        refused = True
        assert "use drop_last=True or a batch_size above 1" in str(exc)
    assert refused == bool(failing)


def test_bad_rank_and_too_few_samples_are_errors():
    kw = dict(seed=0, epoch=0, shuffle=True, batch_size=4, drop_last=False, worker=0, num_workers=1,
              buffer_chunks=1)
    with pytest.raises(StreamError, match="rank 2 is outside 0..1"):
        worker_plan([10], rank=2, world_size=2, **kw)
    with pytest.raises(StreamError, match="rank -1 is outside"):
        worker_plan([10], rank=-1, world_size=2, **kw)
    with pytest.raises(StreamError, match="3 samples cannot be shared among 4 ranks"):
        worker_plan([1, 2], rank=0, world_size=4, **kw)


def test_more_workers_than_batches_leaves_some_workers_idle():
    plans = _plans([10], seed=0, epoch=0, shuffle=True, batch=8, drop_last=False, world=1, workers=3, buffer=2)
    counts = [len(p.batch_sizes) for p in plans.values()]
    assert sum(counts) == 2 and counts.count(0) == 1
    idle = [p for p in plans.values() if not p.batch_sizes][0]
    assert idle.pieces == () and idle.groups == ()


def _quality_reference(chunk_ids, sample_index, sizes):
    """Per batch with np.unique, and Spearman's closed form for distinct values."""
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    distinct = [len(np.unique(chunk_ids[a:b])) for a, b in zip(bounds[:-1], bounds[1:])]
    n = sample_index.size
    rank = np.argsort(np.argsort(sample_index))
    d = rank - np.arange(n)
    rho = 1 - 6 * float(np.sum(d.astype(np.float64) ** 2)) / (n * (n * n - 1)) if n > 1 else 1.0
    return np.mean(distinct), rho


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=12),
    batch=st.integers(2, 30),
    buffer=st.integers(1, 5),
    seed=st.integers(0, 1000),
    shuffle=st.booleans(),
)
def test_shuffle_quality_matches_a_per_batch_reference(lengths, batch, buffer, seed, shuffle):
    plan = worker_plan(lengths, seed=seed, epoch=1, shuffle=shuffle, batch_size=batch, drop_last=False, rank=0,
                       world_size=1, worker=0, num_workers=1, buffer_chunks=buffer)
    chunks, index = served_order(plan, lengths, seed=seed, epoch=1, rank=0, worker=0, shuffle=shuffle)
    assert sorted(index.tolist()) == list(range(sum(lengths)))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    assert (np.searchsorted(starts, index, side="right") - 1 == chunks).all()  # each index in its own chunk
    q = shuffle_quality(chunks, index, plan.batch_sizes)
    mean, rho = _quality_reference(chunks, index, plan.batch_sizes)
    assert q["mean_distinct_chunks_per_batch"] == pytest.approx(mean)
    if index.size > 1:
        assert q["spearman_position_vs_index"] == pytest.approx(rho, abs=1e-9)
    if not shuffle:
        assert q["spearman_position_vs_index"] == pytest.approx(1.0)


def test_shuffle_quality_of_nothing_is_empty():
    assert shuffle_quality(np.empty(0, np.int64), np.empty(0, np.int64), ()) == {}
