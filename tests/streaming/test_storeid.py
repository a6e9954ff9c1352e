"""A local store overwritten while a stream reads it: refused loudly, never a mix of the
old and new store's chunks, in the process that opened it and in DataLoader workers.
(Appends, which add versions inside the same directory, keep streaming the version
opened: tests/storage/test_append_concurrent.py.)"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import pipeline
from pipeline.errors import StreamError
from pipeline.storage import write
from pipeline.streaming.sources import StoreSource

N, CHUNK = 2000, 50


def build(path, sign: int) -> str:
    """x[i] = i in every column; y[i] = sign * i: the two builds differ in y only, with
    the same shapes and chunks, as a rebuild with another label scale does."""
    ids = np.arange(N)
    x = np.repeat(ids[:, None].astype(np.float32), 4, axis=1)
    return write(path, {"x": x, "y": (sign * ids).astype(np.int64)}, chunk_samples=CHUNK, overwrite=True,
                 progress=False)


def check_pairs(xb: np.ndarray, yb: np.ndarray) -> None:
    """Every served sample pairs x with the opened (first) store's y."""
    np.testing.assert_array_equal(yb, xb[:, 0].astype(np.int64))


def test_an_overwrite_under_a_stream_is_refused_and_nothing_mixed_is_served(tmp_path):
    path = build(tmp_path / "s.zarr", 1)
    # Groups of 8 chunks, one read ahead: most of the epoch is still unread when the
    # store is replaced.
    s = pipeline.stream(path, batch_size=50, seed=0, buffer_chunks=8, prefetch=1)
    it = iter(s)
    served = [0]

    def serve(batches) -> None:
        for xb, yb in batches:
            check_pairs(xb, yb)  # what was read before the overwrite is the old store's, whole
            served[0] += len(yb)

    serve([next(it)])
    build(path, -1)
    with pytest.raises(StreamError) as err:
        serve(it)
    assert served[0] < N
    message = str(err.value)
    assert path in message and "replaced" in message and "Open the stream again" in message
    # A new epoch does not go on with the new store either.
    s.set_epoch(1)
    with pytest.raises(StreamError, match="replaced"):
        list(s)
    # Opened again, the new store streams whole.
    ys = np.concatenate([yb.copy() for _, yb in pipeline.stream(path, batch_size=50, seed=0)])
    assert sorted(ys.tolist()) == sorted((-np.arange(N)).tolist())


def test_a_worker_that_opens_the_store_again_refuses_another_directory(tmp_path):
    path = build(tmp_path / "s.zarr", 1)
    source = StoreSource(path, "train", ("x", "y"), False, None)
    sent = pickle.dumps(source)  # as a spawned DataLoader worker receives it
    source.check_intact()
    build(path, -1)
    with pytest.raises(StreamError, match="replaced"):
        source.check_intact()
    with pytest.raises(StreamError, match="replaced"):
        pickle.loads(sent)
    with pytest.raises(StreamError, match="replaced"):
        source.at_version(None)  # follow=True: an overwrite is not a newer version


def test_forked_dataloader_workers_refuse_a_replaced_store(tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    path = build(tmp_path / "s.zarr", 1)
    s = pipeline.stream(path, batch_size=50, seed=0, buffer_chunks=8, prefetch=1)
    check_pairs(*next(iter(s)))  # the parent has read (and mapped) some chunks
    build(path, -1)
    loader = DataLoader(s.torch(), batch_size=None, num_workers=2, multiprocessing_context="fork")
    with pytest.raises(StreamError, match="replaced"):
        for xb, yb in loader:
            check_pairs(xb.numpy(), yb.numpy())
    del torch

