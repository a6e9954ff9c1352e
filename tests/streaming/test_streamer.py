"""The stream: exactly once, aligned, deterministic, resumable, across ranks."""

from __future__ import annotations

import collections

import dask.array as da
import numpy as np
import pytest
import zarr

import pipeline
from pipeline.errors import IncompleteStoreError, StreamError
from tests.streaming.conftest import make_store


def epoch_ids(s) -> list[np.ndarray]:
    out = []
    for xb, yb in s:
        assert (xb[:, 0, 0] == yb).all() and (xb == yb[:, None, None]).all()  # x and y aligned
        out.append(yb.copy())
    return out


def test_one_epoch_serves_every_sample_once(store):
    s = pipeline.stream(store, batch_size=50, seed=0, buffer_chunks=3)
    batches = epoch_ids(s)
    assert len(batches) == len(s) == 20
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))


def test_same_seed_same_batches_new_epoch_new_order(store):
    a = epoch_ids(pipeline.stream(store, batch_size=64, seed=3))
    b = epoch_ids(pipeline.stream(store, batch_size=64, seed=3))
    assert all((x == y).all() for x, y in zip(a, b))
    s = pipeline.stream(store, batch_size=64, seed=3)
    s.set_epoch(1)
    c = epoch_ids(s)
    assert not all((x == y).all() for x, y in zip(a, c))
    assert sorted(np.concatenate(c).tolist()) == list(range(1000))


@pytest.mark.parametrize("stop_after", [0, 1, 7, 15])
def test_resume_mid_epoch_yields_exactly_the_remaining_batches(store, stop_after):
    full = epoch_ids(pipeline.stream(store, batch_size=64, seed=5, buffer_chunks=2))
    s = pipeline.stream(store, batch_size=64, seed=5, buffer_chunks=2)
    it = iter(s)
    for _ in range(stop_after):
        next(it)
    state = s.state_dict()
    assert state["batches_served"] == stop_after
    resumed = pipeline.stream(store, batch_size=64, seed=5, buffer_chunks=2)
    resumed.load_state_dict(state)
    rest = epoch_ids(resumed)
    assert len(rest) == len(full) - stop_after
    assert all((x == y).all() for x, y in zip(rest, full[stop_after:]))


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_ranks_share_the_epoch_exactly_once_with_equal_batch_counts(store, world, drop_last):
    counts = collections.Counter()
    lens = set()
    for rank in range(world):
        s = pipeline.stream(store, batch_size=48, rank=rank, world_size=world, drop_last=drop_last)
        batches = epoch_ids(s)
        assert len(batches) == len(s)
        lens.add(len(batches))
        counts.update(np.concatenate(batches).tolist())
    assert len(lens) == 1
    assert max(counts.values()) == 1
    if not drop_last:
        assert len(counts) == 1000


def test_no_shuffle_is_in_order(store):
    ids = np.concatenate(epoch_ids(pipeline.stream(store, batch_size=100, shuffle=False)))
    assert (ids == np.arange(1000)).all()


def test_quality_report_tracks_mixing(store):
    s = pipeline.stream(store, batch_size=32, buffer_chunks=4)
    epoch_ids(s)
    q = s.quality()
    assert q["mean_distinct_chunks_per_batch"] > 2.5
    assert abs(q["spearman_position_vs_index"]) < 0.3
    ordered = pipeline.stream(store, batch_size=32, shuffle=False)
    epoch_ids(ordered)
    assert ordered.quality()["spearman_position_vs_index"] > 0.99


def test_in_memory_and_dask_sources():
    y = np.arange(500)
    x = np.broadcast_to(y[:, None, None].astype(np.float32), (500, 4, 3)).copy()
    for source in ({"x": x, "y": y}, {"x": da.from_array(x, chunks=70), "y": da.from_array(y, chunks=70)}):
        ids = np.concatenate(epoch_ids(pipeline.stream(source, batch_size=32)))
        assert sorted(ids.tolist()) == list(range(500))


def test_incomplete_store_is_refused_unless_partial(store):
    g = zarr.open_group(store, mode="r+")
    meta = dict(g.attrs["pipeline"])
    meta["complete"] = False
    g.attrs["pipeline"] = meta
    with pytest.raises(IncompleteStoreError, match="incomplete"):
        pipeline.stream(store, batch_size=10)
    assert len(pipeline.stream(store, batch_size=10, partial=True)) == 100


def test_bad_arguments(store, tmp_path):
    with pytest.raises(StreamError, match="batch_size"):
        pipeline.stream(store, batch_size=0)
    with pytest.raises(StreamError, match="rank 3 is outside"):
        pipeline.stream(store, batch_size=4, rank=3, world_size=2)
    with pytest.raises(StreamError, match="no split 'nope'"):
        pipeline.stream(store, split="nope", batch_size=4)
    with pytest.raises(StreamError, match="has no array 'w'"):
        pipeline.stream(store, arrays=("x", "w"), batch_size=4)


@pytest.mark.parametrize("codec", ["blosc-lz4", "zstd", "none"])
@pytest.mark.parametrize("shard_chunks", [None, 3])
def test_every_codec_and_sharding_streams_the_same_data(tmp_path, codec, shard_chunks):
    path = make_store(tmp_path / "c.zarr", n=700, chunk=50, codec=codec, shard_chunks=shard_chunks)
    ids = np.concatenate(epoch_ids(pipeline.stream(path, batch_size=33)))
    assert sorted(ids.tolist()) == list(range(700))
