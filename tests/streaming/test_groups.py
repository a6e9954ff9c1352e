"""Group loading: reads queued per group, no group waiting for another's slowest chunk."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import pipeline
from pipeline.errors import CorruptChunkError
from pipeline.streaming.groups import GroupLoader


def _loader(store, *, prefetch, threads=2):
    s = pipeline.stream(store, batch_size=50, seed=4, buffer_chunks=2, threads=threads, prefetch=prefetch)
    return s, s._loader(s.plan(), s.epoch, 0)


def _expected_ids(s, loader, g):
    """The sample ids of group ``g``, its pieces in plan order (y = sample index)."""
    a, b = loader.plan.groups[g]
    starts = np.concatenate([[0], np.cumsum(s.source.lengths)])
    return np.concatenate([np.arange(starts[p.chunk] + p.lo, starts[p.chunk] + p.hi) for p in loader.plan.pieces[a:b]])


def test_a_slow_chunk_does_not_hold_back_the_next_groups_reads(store, monkeypatch):
    s, loader = _loader(store, prefetch=2)
    slow = loader.plan.pieces[loader.plan.groups[1][0]].chunk  # group 1's first chunk
    released = threading.Event()
    read = s.source.read

    def slow_read(name, chunk, out=None):
        if chunk == slow and name == "x":
            released.wait(20)
        return read(name, chunk, out)

    monkeypatch.setattr(s.source, "read", slow_read)
    watchdog = threading.Timer(10, released.set)  # only if group 2 never loads
    watchdog.start()
    try:
        loader.want(1, 2)
        group2 = loader.take(2)  # the other read thread went on to group 2's chunks
        assert not released.is_set(), "group 2 was ready only once group 1's slow chunk was"
        np.testing.assert_array_equal(group2.arrays["y"], _expected_ids(s, loader, 2))
        np.testing.assert_array_equal(group2.arrays["x"][:, 0, 0], _expected_ids(s, loader, 2))
        released.set()
        group1 = loader.take(1)
        np.testing.assert_array_equal(group1.arrays["y"], _expected_ids(s, loader, 1))
        np.testing.assert_array_equal(group1.arrays["x"][:, 0, 0], _expected_ids(s, loader, 1))
    finally:
        released.set()
        watchdog.cancel()
        loader.close()


def test_a_failed_read_reaches_take_and_gives_the_buffer_back(store, monkeypatch):
    s, loader = _loader(store, prefetch=1)
    bad = loader.plan.pieces[loader.plan.groups[0][0]].chunk
    read = s.source.read

    def failing_read(name, chunk, out=None):
        if chunk == bad and name == "y":
            raise CorruptChunkError(store, "train", "y", chunk, "cannot decode (test)")
        return read(name, chunk, out)

    monkeypatch.setattr(s.source, "read", failing_read)
    try:
        with pytest.raises(CorruptChunkError, match=f"chunk {bad}"):
            loader.take(0)
        assert loader.pool.idle == 1  # the failed group's buffer, once its other reads were done
    finally:
        loader.close()


def test_close_cancels_queued_reads_and_returns_every_buffer(store, monkeypatch):
    s, loader = _loader(store, prefetch=3, threads=1)
    started = threading.Event()
    release = threading.Event()
    reads = []
    read = s.source.read

    def gated_read(name, chunk, out=None):
        reads.append((name, chunk))
        started.set()
        release.wait(10)
        return read(name, chunk, out)

    monkeypatch.setattr(s.source, "read", gated_read)
    loader.want(0, 3)  # 3 groups of 2 chunks x 2 arrays queued on one thread
    assert started.wait(10)
    threading.Timer(0.2, release.set).start()
    loader.close()  # waits for the read in progress, cancels the 11 queued behind it
    assert len(reads) == 1
    assert loader.pool.idle == 3
    release.set()


def test_a_group_without_stored_arrays_is_ready_at_once(store):
    s = pipeline.stream(store, batch_size=50, seed=4, buffer_chunks=2, arrays=("y",))
    loader = GroupLoader(s.source, (), s.plan(), pool=s._buffer_pool(), threads=1, prefetch=1, seed=4,
                         epoch=0, rank=0, worker=0, shuffle=True)
    try:
        group = loader.take(0)
        assert group.arrays == {} and group.perm.size == loader.group_sizes[0]
    finally:
        loader.close()
