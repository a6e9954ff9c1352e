"""Batch memory is reused only when no batch view of it is alive anywhere."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import pipeline
from pipeline.errors import KeptBatchesWarning
from pipeline.streaming.batches import BatchSlabs


def test_a_slab_is_reused_only_after_every_view_of_it_is_dropped():
    slabs = BatchSlabs((3,), np.float32, rows=8, max_slabs=2)
    a = slabs.take(8)
    a[:] = 1
    b = slabs.take(5)  # a is alive: another slab
    assert not np.shares_memory(a, b) and slabs.slabs == 2
    c = slabs.take(8)  # both alive and the cap reached: a plain new array
    assert not np.shares_memory(c, a) and not np.shares_memory(c, b) and slabs.slabs == 2
    view = a[2:4]
    del a
    d = slabs.take(8)  # a's slab is still held through a view of it
    assert not np.shares_memory(d, view)
    tensor = torch.from_numpy(b)  # a tensor sharing b's memory holds it too
    del b
    e = slabs.take(8)
    assert not np.shares_memory(e, tensor.numpy())
    del view, d, e
    gc.collect()
    f = slabs.take(4)
    assert f.shape == (4, 3) and slabs.slabs == 2  # a's slab, free again
    assert slabs.take(9).shape == (9, 3)  # larger than a slab: a plain new array


def test_batches_kept_by_the_loop_are_never_overwritten(tmp_path):
    """Keep every batch of two epochs without copying: each must still hold what it
    held when served (x = y in every cell, every sample once per epoch)."""
    from tests.streaming.conftest import make_store

    s = pipeline.stream(make_store(tmp_path / "s.zarr"), batch_size=32, seed=5, buffer_chunks=2)
    kept = []
    with pytest.warns(KeptBatchesWarning):  # the stream says why it makes more buffers
        for epoch in range(2):
            s.set_epoch(epoch)
            kept.append(list(s))
    for batches in kept:
        ys = np.concatenate([yb for _, yb in batches])
        assert sorted(ys.tolist()) == list(range(1000))
        assert all((xb == yb[:, None, None]).all() for xb, yb in batches)


def test_batches_dropped_by_the_loop_are_served_from_a_few_slabs(tmp_path, monkeypatch):
    from pipeline.streaming.groups import BufferPool
    from tests.streaming.conftest import make_store

    # A batch spanning groups whose buffers do not follow one another in the ring is
    # copied into a slab: make every spanning batch one.
    monkeypatch.setattr(BufferPool, "span", lambda self, name, parts: None)
    s = pipeline.stream(make_store(tmp_path / "s.zarr"), batch_size=24, seed=5)
    seen = []
    for xb, yb in s:  # 42 batches, each dropped when the next arrives
        assert (xb == yb[:, None, None]).all()
        seen.append(yb.tolist())
    assert sorted(v for b in seen for v in b) == list(range(1000))
    assert 0 < s._slabs["x"].slabs < s.prefetch_batches + s.threads + 6


def test_unviewed_sees_views_and_tensors_whatever_the_interpreter_counts():
    from pipeline.streaming.batches import unviewed

    held = {"x": np.zeros((4, 3)), "y": np.zeros(4)}
    assert unviewed(held.values())
    view = held["x"][1:3][0]  # a view of a view: numpy keeps the base it owns
    assert not unviewed(held.values())
    del view
    assert unviewed(held.values())
    t = torch.from_numpy(held["y"][2:])
    assert not unviewed(held.values())
    del t
    assert unviewed(held.values())


def test_large_batches_queue_fewer_views(tmp_path, monkeypatch):
    """Queued batches keep their groups' buffers alive: beyond QUEUE_BYTES of batches the
    queue holds two, and every sample is still served once."""
    from pipeline.streaming import streamer
    from tests.streaming.conftest import make_store

    store = make_store(tmp_path / "q.zarr", n=1000, chunk=64)
    sample = 4 * 3 * 4 + 8  # x (4, 3) float32, y int64
    assert pipeline.stream(store, batch_size=100, seed=0).prefetch_batches == 4
    monkeypatch.setattr(streamer, "QUEUE_BYTES", 100 * sample * 3)
    s = pipeline.stream(store, batch_size=100, seed=0)
    assert s.prefetch_batches == 3
    monkeypatch.setattr(streamer, "QUEUE_BYTES", 100 * sample)
    s = pipeline.stream(store, batch_size=100, seed=0)
    assert s.prefetch_batches == 2
    ids = np.concatenate([yb.copy() for _, yb in s])
    assert np.array_equal(np.sort(ids), np.arange(1000))
