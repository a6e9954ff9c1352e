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


@pytest.fixture()
def own_mappings(monkeypatch):
    """A count of this test's chunk-file mappings not unmapped yet.

    Each mapping the chunk reader makes from now on is watched until it is unmapped. The
    process's own count (``live_mappings``) also moves when an earlier test's stream,
    collected or stopped meanwhile, lets its mappings go: a CI run counted 10 fewer
    during one test than before it.
    """
    import weakref

    from pipeline.streaming import chunks as chunks_module

    made: list[weakref.ref] = []
    real = chunks_module.map_file

    def watched(*args: object, **kwargs: object) -> np.ndarray:
        mapped = real(*args, **kwargs)
        made.append(weakref.ref(mapped.base))  # the owner of the region: unmapped when it goes
        return mapped

    monkeypatch.setattr(chunks_module, "map_file", watched)

    def live() -> int:
        return sum(r() is not None for r in made)

    live.made = made  # type: ignore[attr-defined]
    return live
