"""A pipeline store's split in forked DataLoader workers: each worker opens the store
again, at the version the stream opened, whatever was appended since."""

from __future__ import annotations

import numpy as np
import zarr

import pipeline
from pipeline.storage.append import append
from tests.streaming.conftest import make_store


def test_forked_workers_read_the_version_the_stream_opened(tmp_path):
    """A reader keeps the version it opened: 90 samples appended after the stream was
    opened are not served by its workers (they served all 390, one epoch longer than
    ``len(s)`` said, before)."""
    from torch.utils.data import DataLoader

    grown = make_store(tmp_path / "g.zarr", n=300, chunk=64)
    s = pipeline.stream(grown, batch_size=32, seed=0)
    meta = dict(zarr.open_group(grown, mode="r").attrs["pipeline"])
    new = np.arange(300, 390, dtype=np.int64)
    append(grown, {"train": {"x": np.broadcast_to(new[:, None, None].astype(np.float32), (90, 4, 3)).copy(),
                             "y": new}}, attrs=meta, token="t1", progress=False)
    loader = DataLoader(s.torch(), batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=60)
    xs, ys = zip(*[(xb.numpy(), yb.numpy()) for xb, yb in loader])
    ids = np.concatenate(ys)
    assert sorted(ids.tolist()) == list(range(300))
    assert len(ys) == len(s)
    # conftest's store: x[i] = i in every cell
    np.testing.assert_array_equal(np.concatenate(xs), np.broadcast_to(ids[:, None, None], (300, 4, 3)))
