"""Epoch plans: every sample exactly once across ranks and workers, equal batch counts."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.streaming.plan import batches_per_rank, chunk_order, worker_plan


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
)
def test_plans_cover_each_sample_once_with_equal_batches_per_rank(lengths, batch, world, workers, buffer, seed,
                                                                  epoch, drop_last):
    total = sum(lengths)
    if total < world or (batch == 1 and total % world and not drop_last):
        return  # impossible by construction; worker_plan raises (tested below)
    seen = []
    expected = batches_per_rank(total, world, batch, drop_last)
    for rank in range(world):
        n_batches = 0
        for w in range(workers):
            plan = worker_plan(lengths, seed=seed, epoch=epoch, shuffle=True, batch_size=batch,
                               drop_last=drop_last, rank=rank, world_size=world, worker=w,
                               num_workers=workers, buffer_chunks=buffer)
            assert all(0 < s <= batch for s in plan.batch_sizes)
            assert sum(plan.batch_sizes) == sum(p.hi - p.lo for p in plan.pieces)
            n_batches += len(plan.batch_sizes)
            seen += [(p.chunk, i) for p in plan.pieces for i in range(p.lo, p.hi)]
        assert n_batches == expected
    assert len(seen) == len(set(seen))  # never twice
    if not drop_last:
        assert len(seen) == total  # and, without drop_last, every sample
    else:
        assert len(seen) == world * expected * batch


def test_chunk_order_is_a_permutation_seeded_by_seed_and_epoch():
    a = chunk_order(50, seed=1, epoch=0, shuffle=True)
    assert sorted(a.tolist()) == list(range(50))
    assert (a == chunk_order(50, seed=1, epoch=0, shuffle=True)).all()
    assert not (a == chunk_order(50, seed=1, epoch=1, shuffle=True)).all()
    assert not (a == chunk_order(50, seed=2, epoch=0, shuffle=True)).all()
    assert (chunk_order(5, seed=1, epoch=0, shuffle=False) == np.arange(5)).all()


def test_impossible_equal_batch_counts_are_a_clear_error():
    import pytest

    from pipeline.errors import StreamError

    with pytest.raises(StreamError, match="drop_last=True or a batch_size above 1"):
        worker_plan([3], seed=0, epoch=0, shuffle=True, batch_size=1, drop_last=False, rank=0, world_size=2,
                    worker=0, num_workers=1, buffer_chunks=1)
