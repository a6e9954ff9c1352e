"""Group loading: reads queued per group, no group waiting for another's slowest chunk."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import pipeline
from pipeline.errors import CorruptChunkError, StreamError
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


linux_only = pytest.mark.skipif(sys.platform != "linux", reason="threads have their own nice value on Linux only")


def _read_priorities(store, monkeypatch, **kw):
    """Stream one epoch; the nice value of every thread that read a chunk, and of the
    threads that did not (the consumer's and the one mixing batches)."""
    s = pipeline.stream(store, batch_size=50, seed=4, buffer_chunks=2, **kw)
    seen: dict[str, set[int]] = {"read": set(), "batch": set()}
    read, gather = s.source.read, s._gather

    def spy_read(*a, **k):
        seen["read"].add(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return read(*a, **k)

    def spy_gather(*a, **k):
        seen["batch"].add(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return gather(*a, **k)

    monkeypatch.setattr(s.source, "read", spy_read)
    monkeypatch.setattr(s, "_gather", spy_gather)
    n = sum(len(yb) for _, yb in s)
    s.close()
    assert n == 1000
    return seen


@linux_only
def test_read_threads_run_nicer_than_the_threads_that_mix_and_consume(store, monkeypatch):
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    seen = _read_priorities(store, monkeypatch, read_niceness=5)
    assert seen["read"] == {min(19, base + 5)}
    assert seen["batch"] == {base}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # the consumer untouched


@linux_only
def test_read_niceness_0_keeps_reads_at_the_process_priority(store, monkeypatch):
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    assert _read_priorities(store, monkeypatch, read_niceness=0)["read"] == {base}


@linux_only
def test_read_niceness_counts_from_the_process_priority_and_stops_at_19(store):
    # In a child process: a nice value once raised cannot be lowered again unprivileged.
    code = (
        "import os, threading, pipeline\n"
        "from pipeline.streaming.groups import lower_thread_priority\n"
        "os.setpriority(os.PRIO_PROCESS, os.getpid(), 16)\n"
        "got = []\n"
        "for k in (2, 5):\n"
        "    t = threading.Thread(target=lambda k=k: (lower_thread_priority(k),"
        " got.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))))\n"
        "    t.start(); t.join()\n"
        "print(got)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[18, 19]"


@pytest.mark.parametrize("bad", [-1, 20, 2.5, True, "5"])
def test_a_bad_read_niceness_is_refused(store, bad):
    with pytest.raises(StreamError, match=r"read_niceness must be an integer from 0 to 19, got"):
        pipeline.stream(store, batch_size=50, read_niceness=bad)
