"""Store helpers: the bytes an array's files take, as zarr counts them."""

from __future__ import annotations

import numpy as np
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
