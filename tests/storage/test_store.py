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
    with pytest.raises(StoreError, match=r"repo: no zarr group found .*; it is an icechunk repository: open it "
                       r"with icechunk and pass its group"):
        open_store_group(tmp_path / "repo")
    zarr.create_array(str(tmp_path / "bare.zarr"), data=np.arange(10.0))
    with pytest.raises(StoreError, match=r"bare.zarr: not a readable zarr 3 group .*; its root is one array, not a "
                       r"group: pass the arrays themselves"):
        pipeline.stream(tmp_path / "bare.zarr", batch_size=2)
    zarr.open_group(str(tmp_path / "plain.zarr"), mode="w").create_array("x", data=np.arange(10.0))
    with pytest.raises(StoreError, match=r"plain.zarr: not a pipeline store .*pipeline.stream\(path\)"):
        pipeline.open(tmp_path / "plain.zarr")
    with pytest.raises(StoreError, match=r"nothing.zarr: no such store$"):
        open_store_group(tmp_path / "nothing.zarr")
