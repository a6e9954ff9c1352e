"""3 ranks x 2 DataLoader workers over 5 epochs, each epoch interrupted at a random
point and resumed from the state: every sample exactly once per epoch."""

from __future__ import annotations

import collections
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import pipeline
from pipeline.streaming.plan import round_robin_consumed
from tests.streaming.conftest import make_store


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 20), min_size=1, max_size=4), frac=st.floats(0, 1))
def test_round_robin_consumption_matches_a_simulated_dataloader(counts, frac):
    served = int(frac * sum(counts))
    queues = [list(range(c)) for c in counts]
    order = []
    while any(queues):
        for k, q in enumerate(queues):
            if q:
                order.append((k, q.pop(0)))
    taken = collections.Counter(k for k, _ in order[:served])
    assert round_robin_consumed(counts, served) == [taken[k] for k in range(len(counts))]


def test_ranks_workers_epochs_with_resume_serve_each_sample_once(tmp_path):
    store = make_store(tmp_path / "s.zarr", n=900, chunk=40)
    rng = random.Random(5)
    for epoch in range(5):
        counts = collections.Counter()
        per_rank = []
        for rank in range(3):
            s = pipeline.stream(store, batch_size=32, rank=rank, world_size=3, seed=11)
            s.set_epoch(epoch)
            total = len(s)
            stop = rng.randrange(0, total)
            got = 0
            for _, yb in DataLoader(s.torch(), batch_size=None, num_workers=2):
                if got == stop:
                    break  # the job is interrupted here
                counts.update(yb.tolist())
                got += 1
            resumed = pipeline.stream(store, batch_size=32, rank=rank, world_size=3, seed=11)
            resumed.load_state_dict({"epoch": epoch, "batches_served": stop, "seed": 11, "rank": rank,
                                     "world_size": 3})
            rest = 0
            for _, yb in DataLoader(resumed.torch(), batch_size=None, num_workers=2):
                counts.update(yb.tolist())
                rest += 1
            assert stop + rest == total
            per_rank.append(total)
        assert len(set(per_rank)) == 1
        assert sorted(counts) == list(range(900)) and max(counts.values()) == 1, f"epoch {epoch}"
