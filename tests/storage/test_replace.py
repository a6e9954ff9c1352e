"""Overwriting a local store: the old one set aside and removed while the new is written."""

from __future__ import annotations

import os
import threading

import fsspec
import numpy as np
import pytest

import pipeline
from pipeline.errors import StoreError
from pipeline.storage import replace, write
from pipeline.storage.replace import ASIDE_INFIX, make_way


def _siblings(path) -> list[str]:
    return sorted(os.listdir(path.parent))


def test_an_overwrite_replaces_the_store_and_leaves_nothing_aside(tmp_path):
    x = np.arange(300, dtype=np.float32).reshape(100, 3)
    write(tmp_path / "f.zarr", {"x": x, "y": x[:, 0]}, chunk_samples=16, progress=False)
    (tmp_path / "f.zarr" / "stray-file").write_bytes(b"old")  # anything the old directory held
    write(tmp_path / "f.zarr", {"x": -x[:50], "y": x[:50, 1]}, chunk_samples=8, overwrite=True, progress=False)
    got = pipeline.open(tmp_path / "f.zarr")
    np.testing.assert_array_equal(np.concatenate([got[s]["x"][:] for s in got.splits]), -x[:50])
    assert not (tmp_path / "f.zarr" / "stray-file").exists()
    assert _siblings(tmp_path / "f.zarr") == ["f.zarr"]


def test_the_old_store_is_removed_while_the_new_one_is_written(tmp_path, monkeypatch):
    x = np.ones((64, 2), np.float32)
    write(tmp_path / "f.zarr", {"x": x, "y": x[:, 0]}, chunk_samples=16, progress=False)
    # The removal is held until the new store's metadata exists: an overwrite that
    # removed the old store first would never get there and the test would hang, so
    # the event has a timeout and the order is asserted.
    new_written = threading.Event()
    order = []
    real_rmtree = replace.rmtree

    def slow_rmtree(path, *args, **kwargs):
        new_written.wait(timeout=30)
        order.append(("removed", os.path.basename(path), new_written.is_set()))
        real_rmtree(path, *args, **kwargs)

    real_write_into = pipeline.storage.writer._write_into

    def write_into(*args, **kwargs):
        real_write_into(*args, **kwargs)
        order.append(("written", (tmp_path / "f.zarr" / "zarr.json").exists()))
        new_written.set()

    monkeypatch.setattr(replace, "rmtree", slow_rmtree)
    monkeypatch.setattr(pipeline.storage.writer, "_write_into", write_into)
    write(tmp_path / "f.zarr", {"x": 2 * x, "y": x[:, 0]}, chunk_samples=16, overwrite=True, progress=False)
    assert order[0] == ("written", True)
    assert order[1][0] == "removed" and order[1][1].startswith(".f.zarr" + ASIDE_INFIX) and order[1][2]
    assert _siblings(tmp_path / "f.zarr") == ["f.zarr"]  # waited for before write returned
    np.testing.assert_array_equal(pipeline.open(tmp_path / "f.zarr")["train"]["x"][:], 2 * x)


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
    assert not left.exists()
    assert all((k / "data").read_bytes() == b"not ours" for k in keep)


def test_a_store_that_cannot_be_removed_is_named_in_a_warning(tmp_path, monkeypatch):
    store = tmp_path / "f.zarr"
    x = np.ones((40, 2), np.float32)
    write(store, {"x": x, "y": x[:, 0]}, progress=False)

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(replace, "rmtree", refuse)
    with pytest.warns(RuntimeWarning, match=r"\.f\.zarr\.replaced-[0-9a-f]{12}: the store this run replaced could "
                                            r"not be removed \(Permission denied\)"):
        write(store, {"x": x + 1, "y": x[:, 0]}, overwrite=True, progress=False)
    np.testing.assert_array_equal(pipeline.open(store)["train"]["x"][:], x + 1)


def test_make_way_renames_at_once_and_removes_in_the_background(tmp_path):
    store = tmp_path / "s.zarr"
    (store / "a" / "b").mkdir(parents=True)
    (store / "a" / "b" / "c").write_bytes(b"x" * 100)
    removal = make_way(fsspec.filesystem("file"), str(store), replace=True)
    assert not store.exists()  # the path is free for the new store as soon as it returns
    removal.wait()
    assert os.listdir(tmp_path) == []


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
    assert not left.exists() and _siblings(store) == ["f.zarr"]
    np.testing.assert_array_equal(pipeline.open(store)["train"]["x"][:], x)
