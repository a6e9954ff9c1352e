"""Store helpers: the bytes an array's files take, as zarr counts them."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.storage import MemoryStore

from pipeline.storage.store import stored_bytes


def test_stored_bytes_equal_zarrs_count_for_directory_and_other_stores(tmp_path):
    """Walked on disk for a directory store (chunks, shards, metadata, nested groups),
    zarr's own ``nbytes_stored`` elsewhere: the same numbers."""
    rng = np.random.default_rng(0)
    for store in (str(tmp_path / "s.zarr"), MemoryStore()):
        group = zarr.open_group(store, mode="w")
        plain = group.create_array("a/x", shape=(1000, 7), dtype="float32", chunks=(64, 7))
        plain[:] = rng.standard_normal((1000, 7))
        sharded = group.create_array("b", shape=(999,), dtype="int64", chunks=(10,), shards=(100,))
        sharded[:500] = np.arange(500)  # half written: missing shards take no bytes
        empty = group.create_array("c", shape=(50,), dtype="uint8", chunks=(10,))
        for arr in (plain, sharded, empty):
            assert stored_bytes(arr) == arr.nbytes_stored() > 0


def test_paths_that_are_not_a_group_say_what_they_are(tmp_path):
    """An icechunk repository and a store whose root is one array are named as such,
    with what to pass instead; a store another tool wrote, given to pipeline.open, is
    pointed at pipeline.stream."""
    import icechunk

    import pipeline
    from pipeline.errors import StoreError
    from pipeline.storage.store import open_store_group

    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    session = repo.writable_session("main")
    zarr.open_group(session.store, mode="w").create_array("x", data=np.arange(10.0))
    session.commit("x")
    with pytest.raises(StoreError, match=r"repo: no zarr group found: it is an icechunk repository: open it "
                       r"with icechunk and pass its group"):
        open_store_group(tmp_path / "repo")
    zarr.create_array(str(tmp_path / "bare.zarr"), data=np.arange(10.0))
    with pytest.raises(StoreError, match=r"bare.zarr: not a zarr group: its root is one array; pass the arrays "
                       r"themselves, \(zarr.open_array\(path\), ...\)$"):
        pipeline.stream(tmp_path / "bare.zarr", batch_size=2)
    zarr.open_group(str(tmp_path / "plain.zarr"), mode="w").create_array("x", data=np.arange(10.0))
    with pytest.raises(StoreError, match=r"plain.zarr: not a pipeline store .*pipeline.stream\(path or group\)"):
        pipeline.open(tmp_path / "plain.zarr")
    # Passed as a zarr group, as pipeline.stream takes it (it was a bare TypeError).
    with pytest.raises(StoreError, match=r"plain.zarr: not a pipeline store"):
        pipeline.open(zarr.open_group(str(tmp_path / "plain.zarr"), mode="r"))
    with pytest.raises(StoreError, match=r"pipeline.open takes a store's path, URL or zarr group, got Array"):
        pipeline.open(zarr.open_array(str(tmp_path / "bare.zarr"), mode="r"))
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    pipeline.write(tmp_path / "ours.zarr", {"x": x, "y": x[:, 0]}, progress=False)
    ours = pipeline.open(zarr.open_group(str(tmp_path / "ours.zarr"), mode="r"))
    np.testing.assert_array_equal(ours["train"]["x"][:], x)
    with pytest.raises(StoreError, match=r"nothing.zarr: no such store$"):
        open_store_group(tmp_path / "nothing.zarr")


def test_an_arrays_directory_is_named_without_zarrs_words_and_its_group_offered(tmp_path):
    """zarr's "An array already exists in store ... at path ." described its own attempt,
    not the mistake; the group above the array streams it."""
    import pipeline
    from pipeline.errors import StoreError

    x = np.arange(40.0).reshape(10, 4)
    group = zarr.open_group(str(tmp_path / "s.zarr"), mode="w")
    group.create_array("x", data=x, chunks=(3, 4))
    with pytest.raises(StoreError) as info:
        pipeline.stream(tmp_path / "s.zarr" / "x", arrays=("x",), batch_size=2)
    assert str(info.value) == (
        f"{tmp_path / 's.zarr' / 'x'}: not a zarr group: its root is one array; pass the arrays themselves, "
        f"(zarr.open_array(path), ...), or the group that holds it, {tmp_path / 's.zarr'}, with arrays=('x', ...)")
    with pipeline.stream(tmp_path / "s.zarr", arrays=("x",), batch_size=2, shuffle=False) as s:
        np.testing.assert_array_equal(np.concatenate([b for (b,) in s]), x)


def zipped(folder, target, *, inside: bool):
    """``folder`` zipped as `zip -r` does: from its parent (members under the folder's
    name, directory entries too), or from inside it (``inside``: members at the root)."""
    import os
    import zipfile

    base = folder if inside else folder.parent
    with zipfile.ZipFile(target, "w") as zf:
        for root, dirs, files in os.walk(folder):
            for name in sorted(dirs) + sorted(files):
                full = os.path.join(root, name)
                zf.write(full, os.path.relpath(full, base))
    return target


def test_a_zip_holding_its_store_in_a_folder_names_the_folder_and_the_fix_that_works(tmp_path):
    import re

    import pipeline
    from pipeline.errors import StoreError

    x, y = np.arange(400.0).reshape(100, 4), np.arange(100)
    group = zarr.open_group(str(tmp_path / "store.zarr"), mode="w")
    group.create_array("x", data=x, chunks=(10, 4))
    group.create_array("y", data=y, chunks=(10,))
    bad = zipped(tmp_path / "store.zarr", tmp_path / "store.zip", inside=False)
    with pytest.raises(StoreError) as info:
        pipeline.stream(bad, batch_size=10)
    message = str(info.value)
    assert message.startswith(f"{bad}: no zarr group at the zip's root: it holds the store in the folder "
                              "'store.zarr/' ('store.zarr/zarr.json'), as `zip -r store.zip store.zarr` makes it")
    assert "No group found" not in message
    # The advice, followed: the folder's contents zipped from inside it, into the zip it names.
    fix = re.search(r"`cd store.zarr && zip -r -0 \.\./(\S+) \.`, and pass (\S+)$", message)
    assert fix and fix[1] == fix[2] == "store.zarr.zip", message
    good = zipped(tmp_path / "store.zarr", tmp_path / fix[1], inside=True)
    with pipeline.stream(good, batch_size=10) as s:
        xs, ys = zip(*[(xb.copy(), yb.copy()) for xb, yb in s])
    order = np.argsort(np.concatenate(ys))
    np.testing.assert_array_equal(np.concatenate(ys)[order], y)
    np.testing.assert_array_equal(np.concatenate(xs)[order], x)


def test_a_zip_of_no_zarr_store_says_so(tmp_path):
    import zipfile

    from pipeline.errors import StoreError
    from pipeline.storage.store import open_store_group

    with zipfile.ZipFile(tmp_path / "notes.zip", "w") as zf:
        zf.writestr("notes/readme.txt", "hello")
    with pytest.raises(StoreError, match=r"notes.zip: no zarr group found: the zip holds no zarr.json, .zgroup or "
                       r".zarray, at its root or in a folder: it is not a zarr store$"):
        open_store_group(tmp_path / "notes.zip")
