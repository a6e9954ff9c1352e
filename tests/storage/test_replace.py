"""Overwriting a local store: the old one set aside, kept whole until the new one is
complete and removed after it, or put back when the new write fails."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid

import dask
import fsspec
import numpy as np
import pytest

import pipeline
from pipeline.errors import IncompleteStoreError, StoreError
from pipeline.storage import inflight, replace, write, writer
from pipeline.storage.replace import ASIDE_INFIX, make_way, wait_for_removals
from tests.conftest import file_size_limit, in_process_cluster


def _siblings(path) -> list[str]:
    wait_for_removals()  # what an overwrite set aside is removed by a thread, joined at exit
    return sorted(os.listdir(path.parent))


def _files(path) -> dict[str, bytes]:
    """Every file under ``path`` with its bytes (the independent record of a store)."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_an_overwrite_replaces_the_store_and_leaves_nothing_aside(tmp_path):
    x = np.arange(300, dtype=np.float32).reshape(100, 3)
    write(tmp_path / "f.zarr", {"x": x, "y": x[:, 0]}, chunk_samples=16, progress=False)
    (tmp_path / "f.zarr" / "stray-file").write_bytes(b"old")  # anything the old directory held
    write(tmp_path / "f.zarr", {"x": -x[:50], "y": x[:50, 1]}, chunk_samples=8, overwrite=True, progress=False)
    got = pipeline.open(tmp_path / "f.zarr")
    np.testing.assert_array_equal(np.concatenate([got[s]["x"][:] for s in got.splits]), -x[:50])
    assert not (tmp_path / "f.zarr" / "stray-file").exists()
    assert _siblings(tmp_path / "f.zarr") == ["f.zarr"]


def test_the_old_store_is_kept_whole_until_the_new_one_is_complete(tmp_path, monkeypatch):
    x = np.arange(128, dtype=np.float32).reshape(64, 2)
    write(tmp_path / "f.zarr", {"x": x, "y": x[:, 0]}, chunk_samples=16, progress=False)
    before = _files(tmp_path / "f.zarr")
    seen = []
    real_write_into = pipeline.storage.writer._write_into

    def write_into(*args, **kwargs):
        # While the new store is written, the old one lies aside, every byte as it was.
        aside = [p for p in tmp_path.iterdir() if p.name.startswith(".f.zarr" + ASIDE_INFIX)]
        seen.append([_files(p) == before for p in aside])
        real_write_into(*args, **kwargs)
        aside = [p for p in tmp_path.iterdir() if p.name.startswith(".f.zarr" + ASIDE_INFIX)]
        seen.append([_files(p) == before for p in aside])

    monkeypatch.setattr(pipeline.storage.writer, "_write_into", write_into)
    write(tmp_path / "f.zarr", {"x": 2 * x, "y": x[:, 0]}, chunk_samples=16, overwrite=True, progress=False)
    assert seen == [[True], [True]]  # before and after the new store's last chunk and complete flag
    assert _siblings(tmp_path / "f.zarr") == ["f.zarr"]
    np.testing.assert_array_equal(pipeline.open(tmp_path / "f.zarr")["train"]["x"][:], 2 * x)



def test_a_failed_overwrite_puts_the_old_store_back_and_says_so(tmp_path):
    store = tmp_path / "f.zarr"
    x = np.arange(400, dtype=np.float32).reshape(200, 2)
    write(store, {"x": x, "y": x[:, 0]}, chunk_samples=20, progress=False)
    before = _files(store)
    # The new store's chunks are larger than a file may grow here: its write fails
    # part way, as on a full disk.
    big = np.random.default_rng(0).random((256, 512), dtype=np.float32)
    with file_size_limit(200_000), pytest.raises(StoreError) as info:
        write(store, {"x": big, "y": big[:, 0]}, chunk_samples=128, codec="none", overwrite=True, progress=False)
    message = str(info.value)
    assert message.startswith(f"{store}: cannot write (File too large); the previous store is back in place")
    assert "rerun to write the new one again from the start" in message and "\n" not in message
    assert "resume" not in message  # the partial write is gone: nothing to resume
    assert _files(store) == before and _siblings(store) == ["f.zarr"]
    np.testing.assert_array_equal(pipeline.open(store)["train"]["x"][:], x)
    # The rerun writes the new store from the start, then removes the old one.
    write(store, {"x": big, "y": big[:, 0]}, chunk_samples=128, codec="none", overwrite=True, progress=False)
    np.testing.assert_array_equal(pipeline.open(store)["train"]["x"][:], big)
    assert _siblings(store) == ["f.zarr"]


def test_an_overwrite_that_fails_otherwise_puts_the_old_store_back_with_a_warning(tmp_path):
    import dask.array as da

    store = tmp_path / "f.zarr"
    x = np.arange(80, dtype=np.float32).reshape(40, 2)
    write(store, {"x": x, "y": x[:, 0]}, chunk_samples=8, progress=False)
    before = _files(store)

    def fail_late(block, block_info=None):
        if block_info[0]["chunk-location"][0] == 3:  # after other chunks were written
            raise ValueError("a worker's own error")
        return block

    bad = da.from_array(-x, chunks=(8, 2)).map_blocks(fail_late, dtype=x.dtype)
    with pytest.warns(RuntimeWarning, match=r"f\.zarr: the new store was not completed; the previous store is back "
                                            r"in place, as it was before this run"):
        with pytest.raises(ValueError, match="a worker's own error"):
            write(store, {"x": bad, "y": x[:, 0]}, chunk_samples=8, overwrite=True, progress=False)
    assert _files(store) == before and _siblings(store) == ["f.zarr"]


def test_stores_a_killed_run_left_aside_are_removed_and_nothing_else(tmp_path):
    store = tmp_path / "f.zarr"
    x = np.ones((40, 2), np.float32)
    write(store, {"x": x, "y": x[:, 0]}, progress=False)
    left = tmp_path / (".f.zarr" + ASIDE_INFIX + "0123456789ab")
    (left / "train").mkdir(parents=True)
    (left / "train" / "chunk").write_bytes(b"left by a killed run")
    keep = [tmp_path / ".f.zarr.replaced", tmp_path / (".g.zarr" + ASIDE_INFIX + "aa"), tmp_path / "f.zarr.bak"]
    for k in keep:
        k.mkdir()
        (k / "data").write_bytes(b"not ours")
    write(store, {"x": x + 1, "y": x[:, 0]}, overwrite=True, progress=False)
    wait_for_removals()
    assert not left.exists()
    assert all((k / "data").read_bytes() == b"not ours" for k in keep)


def test_a_store_that_cannot_be_removed_is_named_in_a_warning(tmp_path, monkeypatch):
    real_rmtree = replace.rmtree
    store = tmp_path / "f.zarr"
    x = np.ones((40, 2), np.float32)
    write(store, {"x": x, "y": x[:, 0]}, progress=False)

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(replace, "rmtree", refuse)
    with pytest.warns(RuntimeWarning, match=r"\.f\.zarr\.replaced-[0-9a-f]{12}: the store this run replaced could "
                                            r"not be removed \(Permission denied\)"):
        write(store, {"x": x + 1, "y": x[:, 0]}, overwrite=True, progress=False)
        wait_for_removals()
    monkeypatch.undo()
    wait_for_removals()
    for left in tmp_path.glob(".f.zarr" + ASIDE_INFIX + "*"):  # what the refused removal left
        real_rmtree(left)
    np.testing.assert_array_equal(pipeline.open(store)["train"]["x"][:], x + 1)


def test_make_way_renames_at_once_and_puts_back_what_no_complete_store_replaced(tmp_path):
    store = tmp_path / "s.zarr"
    (store / "a" / "b").mkdir(parents=True)
    (store / "a" / "b" / "c").write_bytes(b"x" * 100)
    removal = make_way(fsspec.filesystem("file"), str(store), replace=True)
    assert not store.exists()  # the path is free for the new store as soon as it returns
    (store / "a").mkdir(parents=True)  # a write that stopped before its store was complete
    with pytest.warns(RuntimeWarning, match="the new store was not completed"):
        removal.wait()
    assert (store / "a" / "b" / "c").read_bytes() == b"x" * 100
    assert _siblings(store) == ["s.zarr"]


def test_a_bad_write_with_overwrite_keeps_the_old_store(tmp_path):
    store = tmp_path / "f.zarr"
    x = np.arange(40, dtype=np.float32)[:, None]
    write(store, {"x": x, "y": x[:, 0]}, progress=False)
    before = sorted(p.relative_to(tmp_path) for p in store.rglob("*"))
    with pytest.raises(StoreError, match="same length"):
        write(store, {"x": x, "y": x[:30, 0]}, overwrite=True, progress=False)
    assert sorted(p.relative_to(tmp_path) for p in store.rglob("*")) == before
    assert _siblings(store) == ["f.zarr"]


def test_an_overwrite_through_a_link_replaces_the_link_and_keeps_the_store_it_led_to(tmp_path):
    # As before stores were set aside: the link is removed (never the directory it
    # leads to) and the new store written in its place.
    (tmp_path / "disk").mkdir()
    real, link = tmp_path / "disk" / "f.zarr", tmp_path / "f.zarr"
    x = np.arange(80, dtype=np.float32).reshape(40, 2)
    write(real, {"x": x, "y": x[:, 0]}, progress=False)
    link.symlink_to(real, target_is_directory=True)
    before = sorted(p.relative_to(tmp_path) for p in real.rglob("*"))
    write(link, {"x": -x, "y": x[:, 0]}, overwrite=True, progress=False)
    wait_for_removals()
    assert not link.is_symlink()
    np.testing.assert_array_equal(pipeline.open(link)["train"]["x"][:], -x)
    assert sorted(p.relative_to(tmp_path) for p in real.rglob("*")) == before
    np.testing.assert_array_equal(pipeline.open(real)["train"]["x"][:], x)
    assert _siblings(real) == ["f.zarr"] and sorted(os.listdir(tmp_path)) == ["disk", "f.zarr"]


def test_a_resumed_write_removes_what_a_killed_overwrite_left_aside(tmp_path):
    store = tmp_path / "f.zarr"
    x = np.ones((40, 2), np.float32)
    left = tmp_path / (".f.zarr" + ASIDE_INFIX + "0123456789ab")
    (left / "train").mkdir(parents=True)
    (left / "train" / "chunk").write_bytes(b"the old store, half removed when the run was killed")
    write(store, {"x": x, "y": x[:, 0]}, progress=False)  # no overwrite: a new store, or the resumed one
    wait_for_removals()
    assert not left.exists() and _siblings(store) == ["f.zarr"]
    np.testing.assert_array_equal(pipeline.open(store)["train"]["x"][:], x)


#: Events the failing block waits on, by name (a cluster's task finds them here: the
#: graph is pickled, an event is not).
_EVENTS: dict[str, threading.Event] = {}


def _fail_second(block: np.ndarray, event: str, block_info=None) -> np.ndarray:
    if block_info[0]["chunk-location"][0] == 1:
        _EVENTS[event].wait(30)
        raise ValueError("a worker's own error")
    return block


def _failing_overwrite(x: np.ndarray, entered: threading.Event) -> dict:
    """Arrays ``-x`` and its first column in blocks of 8 samples (a write task each), x's
    block 1 failing once another block's write task has begun writing (``entered``)."""
    import dask.array as da

    name = uuid.uuid4().hex
    _EVENTS[name] = entered
    return {"x": da.from_array(-x, chunks=(8, 2)).map_blocks(_fail_second, event=name, dtype=x.dtype),
            "y": da.from_array(x[:, 0], chunks=8)}


def _late_writer(monkeypatch, entered: threading.Event, log: list):
    """The writer's ``write_units``, its first call slowed: it begins, waits until its
    write call is stopped, and then writes its units all the same (as a task already
    writing when the write failed finishes the unit it is in); later calls as they are."""
    real = writer.write_units

    def write_units(arrays, written, units, block_start, blocks, *, stopped=None):
        if entered.is_set():
            return real(arrays, written, units, block_start, blocks, stopped=stopped)
        entered.set()
        deadline = time.monotonic() + 10
        while not (stopped is not None and stopped()) and time.monotonic() < deadline:
            threading.Event().wait(0.005)
        count = real(arrays, written, units, block_start, blocks)
        log.append("late units written")
        return count

    monkeypatch.setattr(writer, "write_units", write_units)


@pytest.mark.parametrize("where", ["threads", "cluster"])
def test_an_overwrite_that_fails_while_a_task_writes_puts_the_old_store_back_only_once_it_ended(
        tmp_path, monkeypatch, where):
    # A failed wait does not end the tasks already running: one that wrote after the
    # old store was put back wrote its units, with their markers, into that store,
    # complete and mixed (a user's Ctrl-C did this to a dask-threads write).
    store = tmp_path / "f.zarr"
    x = np.arange(80, dtype=np.float32).reshape(40, 2)
    write(store, {"x": x, "y": x[:, 0]}, chunk_samples=8, progress=False)
    before = _files(store)
    entered, log = threading.Event(), []
    _late_writer(monkeypatch, entered, log)
    bad = _failing_overwrite(x, entered)
    with contextlib.ExitStack() as stack:
        if where == "threads":
            stack.enter_context(dask.config.set(scheduler="threads", num_workers=4))
        else:
            from distributed import Client

            cluster = stack.enter_context(in_process_cluster(n_workers=1, threads_per_worker=4,
                                                             dashboard_address=None))
            stack.enter_context(Client(cluster))
        with pytest.warns(RuntimeWarning, match="the previous store is back in place"):
            with pytest.raises(ValueError, match="a worker's own error"):
                write(store, bad, chunk_samples=8, overwrite=True, progress=False)
        assert log == ["late units written"]  # the late task ended before write() returned
    assert _files(store) == before and _siblings(store) == ["f.zarr"]
    np.testing.assert_array_equal(pipeline.open(store)["train"]["x"][:], x)


def test_an_overwrite_whose_tasks_cannot_be_confirmed_ended_leaves_the_old_store_aside_and_names_it(
        tmp_path, monkeypatch):
    store = tmp_path / "f.zarr"
    x = np.arange(80, dtype=np.float32).reshape(40, 2)
    write(store, {"x": x, "y": x[:, 0]}, chunk_samples=8, progress=False)
    before = _files(store)
    monkeypatch.setattr(inflight, "settle", lambda token, **kw: False)  # a worker that did not answer
    now = threading.Event()
    now.set()  # block 1 fails at once: no other task need be writing first
    bad = _failing_overwrite(x, now)
    with pytest.warns(RuntimeWarning, match=r"f\.zarr: the new store was not completed; tasks of its write may still "
                                            r"be running, so the previous store is left whole at .*\.f\.zarr\.replaced-"
                                            r"[0-9a-f]{12}: once they have ended, move it back to .*f\.zarr") as said:
        with pytest.raises(ValueError, match="a worker's own error"):
            write(store, bad, chunk_samples=8, overwrite=True, progress=False)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(".f.zarr" + ASIDE_INFIX)]
    assert len(aside) == 1 and str(aside[0]) in str(said[0].message)
    assert _files(aside[0]) == before  # every byte of the old store, where the warning says
    with pytest.raises(IncompleteStoreError, match=r"the store is incomplete; rerun the same `pipeline run` \(or "
                                                   r"`pipeline.write` call\) to finish it"):
        pipeline.open(store)  # the partial new store is never taken for a complete one
