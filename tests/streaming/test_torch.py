"""PyTorch DataLoader over stream.torch(): workers and ranks share each epoch exactly once."""

from __future__ import annotations

import collections
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import pipeline


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sample_once_across_ranks_and_workers(store, workers, world):
    counts = collections.Counter()
    per_rank = []
    for rank in range(world):
        s = pipeline.stream(store, batch_size=40, rank=rank, world_size=world, seed=1)
        loader = DataLoader(s.torch(), batch_size=None, num_workers=workers)
        n = 0
        for xb, yb in loader:
            assert isinstance(xb, torch.Tensor)
            assert torch.equal(xb[:, 0, 0].long(), yb)
            counts.update(yb.tolist())
            n += 1
        per_rank.append(n)
        assert n == len(s)
    assert len(set(per_rank)) == 1
    assert len(counts) == 1000 and max(counts.values()) == 1


def test_workers_after_the_parent_already_streamed_do_not_hang(store, tmp_path):
    """Fork safety: the parent has live reader threads and zarr's event loop before the
    DataLoader forks; the workers must still run (checked with a timeout)."""
    script = textwrap.dedent(f"""
        import pipeline
        from torch.utils.data import DataLoader
        s = pipeline.stream({store!r}, batch_size=50)
        for _ in s: pass
        n = sum(len(y) for _, y in DataLoader(s.torch(), batch_size=None, num_workers=2))
        assert n == 1000, n
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_set_epoch_reaches_the_workers(store):
    s = pipeline.stream(store, batch_size=100, seed=0)
    firsts = []
    for epoch in range(2):
        s.set_epoch(epoch)
        firsts.append(next(iter(DataLoader(s.torch(), batch_size=None, num_workers=1)))[1].numpy())
    assert not np.array_equal(firsts[0], firsts[1])
