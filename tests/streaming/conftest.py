"""Stores for streaming tests: y = sample index, x[i] = i in every cell (alignment checks)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.storage import write


def make_store(path, n: int = 1000, chunk: int = 64, codec: str = "blosc-lz4", shard_chunks=None):
    y = np.arange(n, dtype=np.int64)
    x = np.broadcast_to(y[:, None, None].astype(np.float32), (n, 4, 3)).copy()
    write(path, {"x": x, "y": y}, chunk_samples=chunk, codec=codec, shard_chunks=shard_chunks,
          progress=False)
    return str(path)


@pytest.fixture()
def store(tmp_path):
    return make_store(tmp_path / "s.zarr")


def in_turns(iterators):
    """``(k, item)`` as a DataLoader takes batches from its workers' iterators: one of
    each in turn from worker 0, a worker that is done skipped (torch's
    ``_MultiProcessingDataLoaderIter``)."""
    its = list(iterators)
    live = list(range(len(its)))
    while live:
        for k in list(live):
            got = next(its[k], None)
            if got is None:
                live.remove(k)
            else:
                yield k, got
