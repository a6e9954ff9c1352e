"""Chunks an elastic plan reads in several pieces: decoded once, into reused arrays."""

from __future__ import annotations

import collections

import numpy as np

import pipeline
from pipeline.streaming import chunks


def test_a_chunk_read_in_pieces_is_decoded_once_into_memory_reused_across_epochs(store, monkeypatch):
    fetched = []
    original = chunks.ChunkReader._fetch
    monkeypatch.setattr(chunks.ChunkReader, "_fetch",
                        lambda self, i: fetched.append((self.where[2], i)) or original(self, i))
    s = pipeline.stream(store, global_batch_size=48, seed=3, buffer_chunks=2)
    s.stop_read_ahead()
    n_chunks = len(s.source.lengths)
    pieces = collections.Counter(p.chunk for p in s.plan().pieces)
    assert max(pieces.values()) > 1  # the plan cuts chunks for several groups
    made = []
    for epoch in range(3):
        s.set_epoch(epoch)
        fetched.clear()
        ids = [yb.copy() for xb, yb in s.iter_worker(0, 1) if (xb == yb[:, None, None]).all()]
        assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(1000))  # every sample once, whole
        # Each chunk decoded once per array (the next epoch's read-ahead is off).
        assert sorted(fetched) == sorted((n, c) for n in ("x", "y") for c in range(n_chunks))
        made.append(s._shared_arrays.made)
    assert made[0] > 0 and made[2] == made[1] == made[0]  # later epochs decode into the same arrays
