"""Group loading: reads queued per group, no group waiting for another's slowest chunk."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline
from pipeline.errors import CorruptChunkError, KeptBatchesWarning, StreamError
from pipeline.streaming.groups import GroupLoader


def _loader(store, *, prefetch, threads=2):
    s = pipeline.stream(store, batch_size=50, seed=4, buffer_chunks=2, threads=threads, prefetch=prefetch)
    return s, s._loader(s.plan(), s.epoch, 0)


def _expected_ids(s, loader, g, perm):
    """The sample ids of group ``g`` in its mixed order (y = sample index): its pieces
    in plan order, then mixed by ``perm``."""
    a, b = loader.plan.groups[g]
    starts = np.concatenate([[0], np.cumsum(s.source.lengths)])
    ids = np.concatenate([np.arange(starts[p.chunk] + p.lo, starts[p.chunk] + p.hi) for p in loader.plan.pieces[a:b]])
    return ids[perm]


def test_a_slow_chunk_does_not_hold_back_the_next_groups_reads(store, monkeypatch):
    s, loader = _loader(store, prefetch=2)
    slow = loader.plan.pieces[loader.plan.groups[1][0]].chunk  # group 1's first chunk
    released = threading.Event()
    read = s.source.scatter

    def slow_read(name, piece, out, rows):
        if piece.chunk == slow and name == "x":
            released.wait(20)
        return read(name, piece, out, rows)

    monkeypatch.setattr(s.source, "scatter", slow_read)
    watchdog = threading.Timer(10, released.set)  # only if group 2 never loads
    watchdog.start()
    try:
        loader.want(1, 2)
        group2 = loader.take(2)  # the other read thread went on to group 2's chunks
        assert not released.is_set(), "group 2 was ready only once group 1's slow chunk was"
        assert not np.array_equal(group2.perm, np.arange(group2.perm.size))  # mixed
        np.testing.assert_array_equal(group2.arrays["y"], _expected_ids(s, loader, 2, group2.perm))
        np.testing.assert_array_equal(group2.arrays["x"][:, 0, 0], _expected_ids(s, loader, 2, group2.perm))
        released.set()
        group1 = loader.take(1)
        np.testing.assert_array_equal(group1.arrays["y"], _expected_ids(s, loader, 1, group1.perm))
        np.testing.assert_array_equal(group1.arrays["x"][:, 0, 0], _expected_ids(s, loader, 1, group1.perm))
    finally:
        released.set()
        watchdog.cancel()
        loader.close()


def test_a_failed_read_reaches_take_and_gives_the_buffer_back(store, monkeypatch):
    s, loader = _loader(store, prefetch=1)
    bad = loader.plan.pieces[loader.plan.groups[0][0]].chunk
    read = s.source.scatter

    def failing_read(name, piece, out, rows):
        if piece.chunk == bad and name == "y":
            raise CorruptChunkError(store, "train", "y", piece.chunk, "cannot decode (test)")
        return read(name, piece, out, rows)

    monkeypatch.setattr(s.source, "scatter", failing_read)
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
    read = s.source.scatter

    def gated_read(name, piece, out, rows):
        reads.append((name, piece.chunk))
        started.set()
        release.wait(10)
        return read(name, piece, out, rows)

    monkeypatch.setattr(s.source, "scatter", gated_read)
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
    read, gather = s.source.scatter, s._gather

    def spy_read(*a, **k):
        seen["read"].add(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return read(*a, **k)

    def spy_gather(*a, **k):
        seen["batch"].add(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return gather(*a, **k)

    monkeypatch.setattr(s.source, "scatter", spy_read)
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


# -- batches are views of group buffers: nothing held is overwritten, dropped ones recycle ---------------


def test_batches_held_by_the_loop_are_never_overwritten(tmp_path):
    from tests.streaming.conftest import make_store

    path = make_store(tmp_path / "h.zarr", n=1000, chunk=64)
    s = pipeline.stream(path, batch_size=50, seed=4, buffer_chunks=2, prefetch=1)
    held = []
    with pytest.warns(KeptBatchesWarning, match=r"group buffers \(.* MiB\) are held by batches kept by the training"):
        for epoch in range(3):  # later epochs would reuse the buffers if views did not hold them
            s.set_epoch(epoch)
            held += list(s)
    assert len(held) == 3 * len(s)
    for xb, yb in held:  # x[i] = i in every cell: each batch still holds its own samples
        np.testing.assert_array_equal(xb, np.broadcast_to(yb[:, None, None].astype(np.float32), xb.shape))
    ids = np.concatenate([yb for _, yb in held])
    assert np.array_equal(np.sort(ids), np.repeat(np.arange(1000), 3))
    assert any(xb.base is not None for xb, _ in held)  # served as views, not copies


def test_a_batch_kept_as_a_torch_tensor_keeps_its_buffer_out_of_use(store):
    torch = pytest.importorskip("torch")
    s = pipeline.stream(store, batch_size=50, seed=4, buffer_chunks=2, prefetch=1)
    kept = None
    for k, (xb, yb) in enumerate(s.torch()):
        if k == 0:
            kept, want = xb, torch.from_numpy(np.broadcast_to(yb.numpy()[:, None, None].astype(np.float32),
                                                              tuple(xb.shape)).copy())
    for epoch in (1, 2):
        s.set_epoch(epoch)
        for _ in s:
            pass
    assert torch.equal(kept, want)


def test_batches_dropped_by_the_loop_recycle_a_few_group_buffers(store):
    s = pipeline.stream(store, batch_size=50, seed=4, buffer_chunks=2, prefetch=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KeptBatchesWarning)  # nothing kept: no warning
        for epoch in range(4):
            s.set_epoch(epoch)
            for _ in s:
                pass
    # the group served, the one before it (its last batches still queued), two loading
    # ahead and the next epoch's first: made once, then reused every epoch
    assert s._pool.made <= s.prefetch + 3


# -- batches spanning groups: views of consecutive ring regions, every chunk read once ---------------


def _counting_fetches(monkeypatch) -> list:
    from pipeline.streaming import chunks

    reads = []
    original = chunks.ChunkReader._fetch
    monkeypatch.setattr(chunks.ChunkReader, "_fetch", lambda self, i: reads.append((self.where[2], i)) or original(self, i))
    return reads


@pytest.mark.parametrize("batch_size", [100, 300])
def test_batches_spanning_groups_are_views_of_the_ring_and_each_chunk_is_read_once(store, monkeypatch, batch_size):
    """Groups of 128 samples (2 chunks of 64): a batch of 100 spans two groups at most
    group ends, one of 300 spans three or four. Each is one view of consecutive ring
    regions, no copy, and every chunk is read once per epoch (a batch that took the next
    group at once used to make that group load a second time)."""
    reads = _counting_fetches(monkeypatch)
    s = pipeline.stream(store, batch_size=batch_size, seed=4, buffer_chunks=2, prefetch=2)
    s.stop_read_ahead()  # no read-ahead of the next epoch: every read below is this epoch's
    n_chunks = len(s.source.lengths)
    ids, views = [], 0
    for xb, yb in s.iter_worker(0, 1):
        assert (xb == yb[:, None, None]).all()  # x and y of the same samples, whole
        views += np.shares_memory(xb, s._pool._ring["x"]) and np.shares_memory(yb, s._pool._ring["y"])
        ids.append(yb.copy())
        del xb, yb
    assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(1000))
    assert views == len(ids) == len(s)  # the ring holds the whole epoch here: no batch copied
    assert "x" not in s._slabs
    assert sorted(reads) == sorted((n, c) for n in ("x", "y") for c in range(n_chunks))


@settings(max_examples=30, deadline=None)
@given(batch_size=st.integers(1, 400), buffer_chunks=st.integers(1, 5), prefetch=st.integers(1, 3),
       keep_every=st.integers(0, 5), epochs=st.integers(1, 3))
def test_any_batch_size_serves_each_sample_once_and_kept_batches_stay_whole(spans_store, batch_size, buffer_chunks,
                                                                           prefetch, keep_every, epochs):
    """Batches of any size against groups of any size: each epoch serves every sample once,
    batches are whole (x and y of the same samples), and batches the loop keeps (every
    ``keep_every``-th) still hold their samples after later epochs reused the ring."""
    s = pipeline.stream(spans_store, batch_size=batch_size, seed=batch_size, buffer_chunks=buffer_chunks,
                        prefetch=prefetch)
    kept = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KeptBatchesWarning)
        for epoch in range(epochs):
            s.set_epoch(epoch)
            ids = []
            for k, (xb, yb) in enumerate(s):
                assert (xb == yb[:, None, None]).all()
                ids.append(yb.copy())
                if keep_every and k % keep_every == 0:
                    kept.append((xb, yb, yb.copy()))
            assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(700))
    for xb, yb, want in kept:  # views still holding what they were served with
        assert np.array_equal(yb, want) and (xb == want[:, None, None]).all()
    s.close()


@pytest.fixture(scope="module")
def spans_store(tmp_path_factory):
    from tests.streaming.conftest import make_store

    return make_store(tmp_path_factory.mktemp("spans") / "s.zarr", n=700, chunk=48)


def test_batches_of_several_groups_are_read_further_ahead(store):
    from pipeline.streaming.streamer import groups_ahead

    assert groups_ahead(2, 4) == 2 and groups_ahead(2, 2) == 4 and groups_ahead(0, 2, 3) == 0
    assert groups_ahead(2, 4, 3) == 4 and groups_ahead(2, 2, 3) == 6  # two more for a batch of three groups
    # Groups of 128 samples (2 chunks of 64): a batch of 300 takes three at once.
    assert pipeline.stream(store, batch_size=300, buffer_chunks=2).prefetch == groups_ahead(2, 2) + 2
    assert pipeline.stream(store, batch_size=128, buffer_chunks=2).prefetch == groups_ahead(2, 2)
    # An elastic plan's groups hold whole batches: nothing more.
    assert pipeline.stream(store, global_batch_size=300, buffer_chunks=2).prefetch == groups_ahead(2, 2)


def test_groups_read_ahead_are_bounded_in_bytes_too():
    """Small groups and large batches add groups ahead; in bytes, not beyond AHEAD_BYTES
    (never below ``prefetch`` groups or one batch's groups)."""
    from pipeline.streaming.streamer import AHEAD_BYTES, groups_ahead

    mib = 1 << 20
    assert groups_ahead(2, 1, 1, group_bytes=4 * mib) == 8  # 32 MiB ahead: as before
    assert groups_ahead(2, 1, 1, group_bytes=128 * mib) == max(2, AHEAD_BYTES // (128 * mib))
    assert groups_ahead(2, 1, 100, group_bytes=4 * mib) == 100  # one batch's groups, not 107
    assert groups_ahead(2, 4, 1, group_bytes=4 << 30) == 2  # prefetch groups, however large


def test_a_split_of_one_group_is_held_once(store):
    """With the whole split in one group the ring holds the split, and the next epoch's
    first group is not read into new memory while the epoch still holds it; every epoch
    still serves every sample once."""
    s = pipeline.stream(store, batch_size=128, seed=4, buffer_chunks=16)
    for epoch in range(3):
        s.set_epoch(epoch)
        ids = np.concatenate([yb.copy() for _, yb in s])
        assert np.array_equal(np.sort(ids), np.arange(1000))
    assert s._pool.rows == 1000  # not (prefetch + 3) groups of 1024
    assert s._ahead is None and s._pool.made == 1


def test_a_loop_holding_its_last_batch_into_the_next_epoch_reuses_one_buffer_of_its_own(store):
    """A training loop's last batch lives until the next one replaces it: the next
    epoch's first groups then find the ring (the whole split here) still viewed and take
    a buffer of their own. That buffer is kept for the next such epoch rather than
    allocated (and faulted in) again every time; every epoch serves every sample once."""
    s = pipeline.stream(store, batch_size=100, seed=4, buffer_chunks=8)  # two groups of 512
    for epoch in range(8):
        s.set_epoch(epoch)
        ids = []
        for batch in s:  # the loop's variable holds the last batch into the next epoch
            ids.append(batch[1].copy())
        assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(1000))
    assert s._pool.rows == 1000
    assert s._pool.own_made == 1
