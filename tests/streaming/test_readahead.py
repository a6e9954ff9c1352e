"""Read ahead of chunk files not in the page cache: what is named, in which order, what is
probed, and that a cold store streams exactly what a warm one does."""

from __future__ import annotations

import ctypes
import mmap
import multiprocessing
import os

import numpy as np
import pytest

import pipeline
from pipeline.streaming import readahead
from pipeline.streaming.readahead import PROBE_EVERY, ReadAhead, in_page_cache

from .conftest import make_store



def _drop(path) -> None:
    """Drop every file under ``path`` from the page cache."""
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _resident(fd: int) -> bool:
    """Whether any page of the open file ``fd`` is in the page cache, by ``mincore`` of
    a mapping of it (which, unlike a read, starts no read ahead)."""
    size = os.fstat(fd).st_size
    m = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    try:
        view = np.frombuffer(m, dtype=np.uint8)
        vec = (ctypes.c_ubyte * (-(-size // mmap.PAGESIZE)))()
        libc = ctypes.CDLL(None, use_errno=True)
        failed = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size), vec)
        del view
        if failed:
            raise OSError(ctypes.get_errno(), "mincore failed")
        return any(v & 1 for v in vec)
    finally:
        m.close()


def _droppable(tmp_path) -> bool:
    """Whether this file system drops clean pages when asked (tmpfs keeps its pages: they
    are the file) and non-blocking reads can tell."""
    probe = tmp_path / "probe.bin"
    probe.write_bytes(os.urandom(1 << 20))
    fd = os.open(probe, os.O_RDONLY)
    try:
        _make_cold(tmp_path, fd)
        return not _resident(fd) and in_page_cache(fd) is False
    finally:
        os.close(fd)
        probe.unlink()


def _make_cold(folder, fd: int) -> None:
    """Drop ``folder``'s files from the page cache until no page of the open file ``fd``
    is in it: a page just read may sit in another core's list of pages on their way to
    the page cache's lists, which the drop does not reach, so ask again, briefly."""
    for _ in range(500):
        _drop(folder)
        if not _resident(fd):
            return
        os.sched_yield()


def _make_store_cold(store) -> None:
    """Drop a store's files from the page cache, checked on its first chunk file of x."""
    first = next(os.path.join(root, f) for root, _, files in sorted(os.walk(os.path.join(store, "")))
                 for f in sorted(files) if "/x/c" in root.replace(os.sep, "/"))
    fd = os.open(first, os.O_RDONLY)
    try:
        _make_cold(store, fd)
    finally:
        os.close(fd)


@pytest.fixture()
def droppable(tmp_path):
    if not _droppable(tmp_path):
        pytest.skip("this file system keeps files in memory or cannot tell what is cached")


def test_in_page_cache_tells_a_read_file_from_a_dropped_one(tmp_path, droppable):
    f = tmp_path / "chunk"
    f.write_bytes(os.urandom(1 << 20))
    f.read_bytes()
    fd = os.open(f, os.O_RDONLY)
    try:
        assert in_page_cache(fd) is True
        _make_cold(tmp_path, fd)
        assert in_page_cache(fd) is False
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        os.read(fd, 1 << 20)  # waits for the disk, then the page is there
        assert in_page_cache(fd) is True
    finally:
        os.close(fd)


def _ids(store, **kwargs) -> list[np.ndarray]:
    with pipeline.stream(store, batch_size=40, seed=3, buffer_chunks=2, **kwargs) as s:
        batches = [y.copy() for _, y in s]
        stats = (s.source.readahead.probed, s.source.readahead.advised)
    return batches, stats


def test_a_cold_store_is_read_ahead_and_streams_exactly_what_was_written(tmp_path, droppable):
    store = make_store(tmp_path / "s.zarr", n=3000, chunk=64)
    _make_store_cold(store)
    cold, (probed, advised) = _ids(store)
    # Every file of the store was cold: those probed were asked for, but for a few the
    # read threads had read already (the first group's reads start with the probes).
    assert advised > 0 and advised >= probed // 2
    seen = np.concatenate(cold)
    np.testing.assert_array_equal(np.sort(seen), np.arange(3000))  # each sample once
    warm, (_, advised_warm) = _ids(store)
    assert advised_warm == 0
    for a, b in zip(cold, warm, strict=True):  # the same order: reading ahead changes no byte
        np.testing.assert_array_equal(a, b)


def test_a_warm_store_is_probed_sparsely_and_kept_maps_not_at_all(tmp_path):
    store = make_store(tmp_path / "s.zarr", n=64 * 400, chunk=64)  # 400 chunks, 800 files
    with pipeline.stream(store, batch_size=64, seed=0, buffer_chunks=2) as s:
        for _ in s:
            pass
        ra = s.source.readahead
        first = ra.probed
        assert ra.advised == 0
        # 32 files found cached, then one chunk (two files) in PROBE_EVERY.
        assert first <= 32 + 2 * (400 // PROBE_EVERY + 1)
        s.set_epoch(1)
        for _ in s:
            pass
        # Every file is kept mapped from the first epoch: the second probes none.
        assert ra.probed == first


class _Recording:
    """A source that records what the loader names ahead and what it reads, in order."""

    def __init__(self, source):
        self._source = source
        self.events: list[tuple[str, int]] = []

    def __getattr__(self, attr):
        return getattr(self._source, attr)

    def advise(self, chunks):
        self.events.extend(("advise", int(c)) for c in chunks)

    def scatter(self, name, piece, out, rows):
        if name == "y":
            self.events.append(("read", int(piece.chunk)))
        self._source.scatter(name, piece, out, rows)


@pytest.mark.parametrize("ahead_bytes, ahead_groups", [(1, 1), (20_000, 3), (10**9, None)])
def test_each_group_is_named_in_plan_order_before_its_reads_and_only_so_far_ahead(store, monkeypatch,
                                                                                   ahead_bytes, ahead_groups):
    from pipeline.streaming import groups

    monkeypatch.setattr(groups, "READAHEAD_BYTES", ahead_bytes)
    s = pipeline.stream(store, batch_size=50, seed=4, buffer_chunks=2, prefetch=2)
    rec = _Recording(s.source)
    loader = groups.GroupLoader(rec, s.names, s.plan(), pool=s._buffer_pool(), threads=2, prefetch=2, seed=4,
                                epoch=0, rank=0, worker=0, shuffle=True)
    n = len(loader.plan.groups)
    # A group is 2 chunks of 64 samples of x (4 x 3 float32) and y (int64): 7168 bytes.
    ahead = n if ahead_groups is None else ahead_groups
    try:
        for g in range(n):
            loader.take(g)
            loader.want(g + 1)  # as the streamer does once a group's first batch is out
            named = [c for kind, c in rec.events if kind == "advise"]
            # Named through the groups wanted (g + 1 and the prefetch after it) and
            # ``ahead`` groups more.
            through = min(g + 1 + 2 + ahead, n)
            assert len(named) == loader.plan.groups[through - 1][1]
        assert named == [p.chunk for p in loader.plan.pieces]  # each chunk once, in the order read
        first_named: dict[int, int] = {}
        for k, (kind, c) in enumerate(rec.events):
            if kind == "advise":
                first_named.setdefault(c, k)
            else:
                assert first_named.get(c, len(rec.events)) < k, f"chunk {c} was read before it was named"
    finally:
        loader.close()
        s.close()


def _settle(ra: ReadAhead) -> None:
    """Wait until the read-ahead thread has looked at everything queued and ended."""
    t = ra._thread
    if t is not None:
        t.join(30)


@pytest.fixture()
def quick_idle(monkeypatch):
    monkeypatch.setattr(readahead, "_IDLE_S", 0.05)


def _advise_in_child(path: str, conn) -> None:
    ra = _SHARED["ra"]
    ra.advise([0])
    _settle(ra)
    conn.send(ra.advised)


_SHARED: dict = {}


def test_a_forked_child_reads_ahead_with_a_thread_of_its_own(tmp_path, droppable, quick_idle):
    f = tmp_path / "c0"
    f.write_bytes(os.urandom(1 << 20))
    ra = ReadAhead(lambda c: [str(f)])
    ra.advise([0])  # the parent's thread: the file is cached, nothing asked
    _settle(ra)
    assert (ra.probed, ra.advised) == (1, 0)
    fd = os.open(f, os.O_RDONLY)
    try:
        _make_cold(tmp_path, fd)
    finally:
        os.close(fd)
    _SHARED["ra"] = ra
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_advise_in_child, args=(str(f), child))
    p.start()
    try:
        assert parent.poll(30), "the child's read ahead never finished"
        assert parent.recv() == ra.advised + 1  # the child asked for the dropped file
    finally:
        p.join(30)
        if p.is_alive():  # stuck: do not leave it for the interpreter's exit to wait on
            p.kill()
        _SHARED.clear()


def test_files_that_are_missing_are_passed_over(tmp_path, quick_idle):
    ra = ReadAhead(lambda c: [str(tmp_path / f"missing-{c}")])
    ra.advise(range(5))
    _settle(ra)
    assert ra.probed == 0 and ra.advised == 0


def test_a_cold_foreign_store_is_read_ahead_on_its_grid(tmp_path, droppable):
    import zarr

    y = np.arange(4000, dtype=np.int64)
    x = np.repeat(y.astype(np.float32)[:, None], 6, axis=1)
    g = zarr.open_group(tmp_path / "plain.zarr", mode="w")
    g.create_array("x", data=x, chunks=(100, 6))
    g.create_array("y", data=y, chunks=(100,))
    _make_store_cold(str(tmp_path / "plain.zarr"))
    with pipeline.stream(str(tmp_path / "plain.zarr"), arrays=("x", "y"), batch_size=64, buffer_chunks=2) as s:
        batches = [(xb.copy(), yb.copy()) for xb, yb in s]
        assert s.source.readahead.advised > 0
    ids = np.concatenate([b for _, b in batches])
    np.testing.assert_array_equal(np.sort(ids), y)
    np.testing.assert_array_equal(np.concatenate([a for a, _ in batches])[:, 0], ids.astype(np.float32))


def _advise_once(conn) -> None:
    ra = _SHARED["ra"]
    ra.advise([0])
    _settle(ra)
    conn.send(ra.probed)


def test_a_child_forked_while_the_thread_held_its_lock_does_not_wait_for_it(tmp_path, quick_idle):
    f = tmp_path / "c0"
    f.write_bytes(b"x" * 4096)
    ra = ReadAhead(lambda c: [str(f)])
    _SHARED["ra"] = ra
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    with ra._cond:  # as the parent's thread holds it while it takes the queue
        p = ctx.Process(target=_advise_once, args=(child,))
        p.start()
    try:
        assert parent.poll(30), "the child waited for a lock only the parent's thread could release"
        assert parent.recv() == 1  # its own thread probed the file
    finally:
        p.join(30)
        if p.is_alive():  # stuck: do not leave it for the interpreter's exit to wait on
            p.kill()
        _SHARED.clear()
