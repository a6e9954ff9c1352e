"""The stream: exactly once, aligned, deterministic, resumable, across ranks."""

from __future__ import annotations

import collections
import itertools

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


# -- more: odd sizes, resume everywhere, sources, errors ----------------------------------------------------


@pytest.fixture(scope="module")
def odd_store(tmp_path_factory):
    """1003 samples in chunks of 37 (a short last chunk of 4)."""
    return make_store(tmp_path_factory.mktemp("odd") / "o.zarr", n=1003, chunk=37)


@pytest.mark.filterwarnings("ignore::pipeline.errors.KeptBatchesWarning")  # keeps every batch, on purpose
@pytest.mark.parametrize("batch, buffer, prefetch", [(1 + 0, 1, 1), (29, 1, 0), (37, 2, 1), (64, 7, 2), (2000, 3, 1)])
def test_odd_sizes_serve_every_sample_once_in_the_promised_batch_sizes(odd_store, batch, buffer, prefetch):
    s = pipeline.stream(odd_store, batch_size=batch, seed=11, buffer_chunks=buffer, prefetch=prefetch, threads=2)
    batches = epoch_ids(s)
    assert len(batches) == len(s) == -(-1003 // batch)
    sizes = [len(b) for b in batches]
    assert sizes[:-1] == [batch] * (len(sizes) - 1) and 0 < sizes[-1] <= batch
    assert sorted(np.concatenate(batches).tolist()) == list(range(1003))


def test_drop_last_serves_only_full_batches_without_repeats(odd_store):
    s = pipeline.stream(odd_store, batch_size=64, drop_last=True, seed=2)
    batches = epoch_ids(s)
    assert len(batches) == len(s) == 1003 // 64
    assert all(len(b) == 64 for b in batches)
    ids = np.concatenate(batches)
    assert len(np.unique(ids)) == ids.size == 64 * (1003 // 64)


def test_iterating_twice_at_one_epoch_repeats_it_and_set_epoch_changes_it(odd_store):
    s = pipeline.stream(odd_store, batch_size=100, seed=4)
    first, again = epoch_ids(s), epoch_ids(s)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    s.set_epoch(1)
    second = epoch_ids(s)
    assert not all(np.array_equal(a, b) for a, b in zip(first, second))
    s.set_epoch(0)
    assert all(np.array_equal(a, b) for a, b in zip(first, epoch_ids(s)))
    other_seed = epoch_ids(pipeline.stream(odd_store, batch_size=100, seed=5))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other_seed))


def test_a_finished_shuffled_epoch_iterated_again_is_said_once(odd_store, recwarn):
    """A loop ``for epoch in range(3): for xb, yb in s`` without set_epoch trains every
    epoch on the one order: said once (a RuntimeWarning), not after set_epoch or
    load_state_dict, and never without shuffling (whose order is the same anyway)."""
    s = pipeline.stream(odd_store, batch_size=100, seed=4)
    first = np.concatenate(epoch_ids(s))
    with pytest.warns(RuntimeWarning, match=r"serves epoch 0 again, in the same order .* call set_epoch\(1\)"):
        again = np.concatenate(epoch_ids(s))
    np.testing.assert_array_equal(first, again)  # what the warning says: the same order
    np.testing.assert_array_equal(np.sort(first), np.arange(1003))
    epoch_ids(s)  # once per stream
    s.set_epoch(0)
    epoch_ids(t := pipeline.stream(odd_store, batch_size=100, seed=4))
    with pytest.warns(RuntimeWarning, match="after epoch 0 was served whole"):  # its start, as said
        state = t.state_dict()
    t.load_state_dict(state)
    epoch_ids(t)
    plain = pipeline.stream(odd_store, batch_size=100, shuffle=False)
    epoch_ids(plain), epoch_ids(plain)
    assert not [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)]


def _take(s, n):
    out = []
    for _, yb in s:
        out.append(yb.copy())
        if len(out) == n:
            break
    return out


def test_an_interrupted_iteration_continues_where_it_stopped_and_says_so(odd_store):
    full = epoch_ids(pipeline.stream(odd_store, batch_size=50, seed=3))
    s = pipeline.stream(odd_store, batch_size=50, seed=3)
    head = _take(s, 5)
    assert s.state_dict()["batches_served"] == 5
    with pytest.warns(RuntimeWarning, match=r"continues epoch 0, which an earlier iteration left after 5 of its 21 "
                                            r"batches: this pass serves the 16 left. For a whole pass call set_epoch"):
        rest = epoch_ids(s)
    assert all(np.array_equal(a, b) for a, b in zip(head + rest, full)) and len(head + rest) == len(full)
    assert s.state_dict()["batches_served"] == 0  # the epoch finished


def test_what_is_said_of_an_iteration_after_a_break(odd_store, recwarn):
    s = pipeline.stream(odd_store, batch_size=50, seed=3)
    _take(s, 3)
    s.set_epoch(0)  # the same epoch keeps its position: still said
    with pytest.warns(RuntimeWarning, match="continues epoch 0"):
        _take(s, 3)
    s.set_epoch(1)  # a new epoch: a whole pass, nothing to say
    assert sum(len(b) for b in epoch_ids(s)) == 1003
    s.set_epoch(1)  # epoch 1 again, on purpose: no repeat to say
    _take(s, 3)
    s.load_state_dict(s.state_dict())  # continuing on purpose
    assert sum(len(b) for b in epoch_ids(s)) == 1003 - 150
    s.set_epoch(1)
    _take(s, 3)
    s.load_state_dict({"epoch": 1, "batches_served": 0})  # the epoch again, from its start
    assert sum(len(b) for b in epoch_ids(s)) == 1003
    resumed = pipeline.stream(odd_store, batch_size=50, seed=3)
    resumed.load_state_dict({"epoch": 0, "batches_served": 4})  # a resume is no break
    assert len(epoch_ids(resumed)) == 21 - 4
    assert not [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_set_epoch_inside_the_loop_stops_it_and_the_state_counts_the_new_epoch(odd_store):
    # It went on serving epoch 0 counted as epoch 1: a state saved then resumed left
    # 1,280 samples of epoch 1 unserved (a user's trial).
    s = pipeline.stream(odd_store, batch_size=50, seed=3)
    seen = []
    with pytest.raises(StreamError, match=r"^stream: this loop over epoch 0 was stopped after 5 of its 21 batches: "
                                          r"set_epoch\(1\) was called while it served; call set_epoch before each "
                                          r"epoch's loop, not inside it$"):
        for _, yb in s:
            seen.append(yb.copy())
            if len(seen) == 5:
                s.set_epoch(1)
    assert len(seen) == 5 and s.state_dict()["epoch"] == 1 and s.state_dict()["batches_served"] == 0
    fresh = pipeline.stream(odd_store, batch_size=50, seed=3)
    fresh.set_epoch(1)
    assert all(np.array_equal(a, b) for a, b in zip(epoch_ids(s), epoch_ids(fresh)))  # epoch 1 whole


def test_load_state_dict_inside_the_loop_stops_it(odd_store):
    s = pipeline.stream(odd_store, batch_size=50, seed=3)
    state = None
    with pytest.raises(StreamError, match="stopped after 3 of its 21 batches: load_state_dict was called while it "
                                          "served; load a state before the loop that resumes it"):
        for k, _ in enumerate(s):
            if k == 1:
                state = s.state_dict()
            if k == 2:
                s.load_state_dict(state)
    assert len(epoch_ids(s)) == 21 - 2  # the state's rest, whole


def test_two_loops_at_once_never_serve_a_batch_twice(odd_store):
    # zip(s, s) and a nested loop over the same stream served every batch of the
    # epoch twice, counted once.
    s = pipeline.stream(odd_store, batch_size=50, seed=3)
    with pytest.warns(RuntimeWarning, match="continues epoch 0"), \
            pytest.raises(StreamError, match=r"this loop over epoch 0 was stopped after 1 of its 21 batches: a later "
                                          r"loop over the same stream took the epoch over \(a stream serves one "
                                          r"loop at a time"):
        for _ in zip(s, s):
            pass
    s = pipeline.stream(odd_store, batch_size=50, seed=3)
    outer, inner = [], []
    with pytest.warns(RuntimeWarning, match="continues epoch 0"), pytest.raises(StreamError, match="took the epoch"):
        for _, yb in s:
            outer.append(yb.copy())
            for _, yb2 in s:  # the inner loop takes the epoch over where it stands
                inner.append(yb2.copy())
    ids = np.concatenate(outer + inner)
    assert len(outer) == 1 and np.array_equal(np.sort(ids), np.arange(1003))  # the epoch once, between the two


def test_an_iterator_left_open_is_taken_over_by_the_next_loop(odd_store, recwarn):
    full = epoch_ids(pipeline.stream(odd_store, batch_size=50, seed=3))
    s = pipeline.stream(odd_store, batch_size=50, seed=3)
    peek = iter(s)
    first = next(peek)[1].copy()  # a look at one batch, its iterator kept
    s.load_state_dict({"epoch": 0, "batches_served": 0})
    got = epoch_ids(s)
    assert np.array_equal(first, full[0]) and all(np.array_equal(a, b) for a, b in zip(got, full))
    assert len(got) == len(full)
    with pytest.raises(StreamError, match="stopped after 1 of its 21 batches: load_state_dict was called"):
        next(peek)
    s.set_epoch(0)  # epoch 0 again, on purpose
    last = iter(s)  # an iterator that served the epoch's last batch has finished it
    assert len([b for b in itertools.islice(last, 21)]) == 21
    s.set_epoch(1)
    assert sum(len(b) for b in epoch_ids(s)) == 1003
    assert not [str(w.message) for w in recwarn if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("world, drop_last", [(1, False), (2, False), (3, True)])
@pytest.mark.parametrize("epoch", [0, 2])
def test_resume_on_every_rank_and_epoch_matches_an_uninterrupted_run(odd_store, world, drop_last, epoch):
    kw = dict(batch_size=30, seed=9, buffer_chunks=3, world_size=world, drop_last=drop_last)
    for rank in range(world):
        ref = pipeline.stream(odd_store, rank=rank, **kw)
        ref.set_epoch(epoch)
        full = epoch_ids(ref)
        for stop_after in (1, len(full) // 2, len(full) - 1, len(full)):
            s = pipeline.stream(odd_store, rank=rank, **kw)
            s.set_epoch(epoch)
            it = iter(s)
            for _ in range(stop_after):
                next(it)
            state = s.state_dict()
            assert state == {"epoch": epoch, "batches_served": stop_after, "seed": 9, "rank": rank,
                             "world_size": world, "version": 0, "batch_size": 30, "buffer_chunks": 3,
                             "shuffle": True, "drop_last": drop_last, "n_samples": 1003,
                             "num_workers": 1}  # a plain loop: one server, whoever resumes it
            resumed = pipeline.stream(odd_store, rank=rank, **kw)
            resumed.load_state_dict(state)
            rest = epoch_ids(resumed)
            assert len(rest) == len(full) - stop_after
            assert all(np.array_equal(a, b) for a, b in zip(rest, full[stop_after:]))
            # the next iteration is a whole epoch again
            assert len(epoch_ids(resumed)) == len(full)


def test_load_state_dict_refuses_another_seed_rank_or_world(store):
    s = pipeline.stream(store, batch_size=10, seed=1, rank=0, world_size=2)
    for key, value in (("seed", 2), ("rank", 1), ("world_size", 3)):
        state = {**s.state_dict(), key: value}
        with pytest.raises(StreamError, match=f"saved with {key}={value}"):
            s.load_state_dict(state)
    s.load_state_dict({"epoch": 3, "batches_served": 2})  # the identity keys are optional
    assert s.state_dict()["epoch"] == 3 and s.state_dict()["batches_served"] == 2


def test_set_epoch_resets_the_position_only_for_another_epoch(store):
    s = pipeline.stream(store, batch_size=10)
    s.load_state_dict({"epoch": 1, "batches_served": 4})
    s.set_epoch(1)
    assert s.state_dict()["batches_served"] == 4
    s.set_epoch(2)
    assert s.state_dict()["batches_served"] == 0 and s.epoch == 2


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_with_odd_sizes_and_workers_plans_share_exactly_once(odd_store, world):
    counts = collections.Counter()
    lens = []
    for rank in range(world):
        s = pipeline.stream(odd_store, batch_size=16, rank=rank, world_size=world, seed=7, buffer_chunks=2)
        n = 0
        for w in range(3):  # what three DataLoader workers would serve
            for xb, yb in s.iter_worker(w, 3):
                assert (xb == yb[:, None, None]).all()
                counts.update(yb.tolist())
                n += 1
        lens.append(n)
        assert n == len(s)
    assert len(set(lens)) == 1
    assert len(counts) == 1003 and max(counts.values()) == 1


def test_no_shuffle_is_in_order_on_every_rank(odd_store):
    ids = []
    for rank in range(3):
        s = pipeline.stream(odd_store, batch_size=40, shuffle=False, rank=rank, world_size=3, buffer_chunks=3)
        ids.append(np.concatenate(epoch_ids(s)))
    assert np.array_equal(np.concatenate(ids), np.arange(1003))


def test_quality_grows_with_the_buffer(odd_store):
    means = []
    for buffer in (1, 2, 8):
        s = pipeline.stream(odd_store, batch_size=32, buffer_chunks=buffer, seed=0)
        epoch_ids(s)
        q = s.quality()
        means.append(q["mean_distinct_chunks_per_batch"])
        assert abs(q["spearman_position_vs_index"]) < 0.35
    assert means[0] < means[1] < means[2]
    assert means[0] <= 2.0 and means[2] > 3.0
    ordered = pipeline.stream(odd_store, batch_size=32, shuffle=False)
    epoch_ids(ordered)
    assert ordered.quality()["spearman_position_vs_index"] == pytest.approx(1.0)
    assert ordered.quality()["mean_distinct_chunks_per_batch"] < 2.0


def test_quality_is_empty_before_an_epoch(store):
    assert pipeline.stream(store, batch_size=10).quality() == {}


def test_shapes_describe_one_sample(store):
    s = pipeline.stream(store, batch_size=10)
    assert s.shapes == {"x": ((4, 3), np.dtype("float32")), "y": ((), np.dtype("int64"))}


def test_numpy_arrays_larger_than_one_virtual_chunk():
    n = 9000  # 4096 + 4096 + 808
    y = np.arange(n, dtype=np.int32)
    x = np.stack([y * 2.0, -y], axis=1)
    s = pipeline.stream({"x": x, "y": y}, batch_size=256, seed=1)
    assert s.source.lengths == (4096, 4096, 808)
    ids = []
    for xb, yb in s:
        assert (xb[:, 0] == yb * 2.0).all() and (xb[:, 1] == -yb).all()
        ids.append(yb)
    assert len(ids) == len(s)
    assert sorted(np.concatenate(ids).tolist()) == list(range(n))


def test_dask_arrays_with_different_chunks_stay_aligned():
    n = 777
    y = np.arange(n, dtype=np.int64)
    x = np.broadcast_to(y[:, None, None].astype(np.float32), (n, 4, 3)).copy()
    source = {"x": da.from_array(x, chunks=(50, 2, 3)), "y": da.from_array(y, chunks=81)}
    ids = []
    for rank in range(2):
        s = pipeline.stream(source, batch_size=32, seed=2, world_size=2, rank=rank)
        assert s.source.lengths == (50,) * 15 + (27,)  # the first array's chunks rule
        ids.append(np.concatenate(epoch_ids(s)))
    assert abs(len(ids[0]) - len(ids[1])) <= 1
    assert sorted(np.concatenate(ids).tolist()) == list(range(n))


def test_tuple_source_names_its_arrays():
    y = np.arange(300)
    s = pipeline.stream((y * 3, y), batch_size=64)
    assert s.names == ("a0", "a1")
    got = [(a.copy(), b.copy()) for a, b in s]
    assert all((a == b * 3).all() for a, b in got)
    assert sorted(np.concatenate([b for _, b in got]).tolist()) == list(range(300))


def test_zip_store_streams_every_sample_once(tmp_path):
    path = make_store(tmp_path / "z.zarr.zip", n=500, chunk=40)
    assert path.endswith(".zarr.zip")
    ids = np.concatenate(epoch_ids(pipeline.stream(path, batch_size=32, buffer_chunks=3)))
    assert sorted(ids.tolist()) == list(range(500))


def test_an_open_zarr_group_streams(store):
    g = zarr.open_group(store, mode="r")
    ids = np.concatenate(epoch_ids(pipeline.stream(g, batch_size=64)))
    assert sorted(ids.tolist()) == list(range(1000))


def test_incomplete_store_written_directly_with_zarr(tmp_path):
    path = str(tmp_path / "direct.zarr")
    n = 300
    y = np.arange(n, dtype=np.int64)
    x = np.broadcast_to(y[:, None, None].astype(np.float32), (n, 4, 3)).copy()
    root = zarr.open_group(path, mode="w")
    train = root.create_group("train")
    for name, a in (("x", x), ("y", y)):
        arr = train.create_array(name, shape=a.shape, dtype=a.dtype, chunks=(32,) + a.shape[1:],
                                 compressors=[zarr.codecs.BloscCodec(cname="zstd", shuffle="bitshuffle")])
        arr[:] = a
    root.attrs["pipeline"] = {"complete": False, "splits": {"train": n}}
    with pytest.raises(IncompleteStoreError):
        pipeline.stream(path, batch_size=10)
    ids = np.concatenate(epoch_ids(pipeline.stream(path, batch_size=10, partial=True)))
    assert sorted(ids.tolist()) == list(range(n))
    root.attrs["pipeline"] = {"complete": True, "splits": {"train": n}}
    ids = np.concatenate(epoch_ids(pipeline.stream(path, batch_size=10)))
    assert sorted(ids.tolist()) == list(range(n))
    del root.attrs["pipeline"]  # no pipeline metadata at all: a group another tool wrote
    ids = np.concatenate(epoch_ids(pipeline.stream(path, batch_size=10)))
    assert sorted(ids.tolist()) == list(range(n))


def test_more_bad_arguments(store):
    with pytest.raises(StreamError, match="buffer_chunks"):
        pipeline.stream(store, batch_size=4, buffer_chunks=0)
    with pytest.raises(StreamError, match="batch_size"):
        pipeline.stream(store, batch_size=True)
    with pytest.raises(StreamError, match="batch_size"):
        pipeline.stream(store, batch_size=2.0)
    with pytest.raises(StreamError, match="rank 0 is outside"):
        pipeline.stream(store, batch_size=4, rank=0, world_size=0)
    with pytest.raises(StreamError, match="cannot stream from int"):
        pipeline.stream(5, batch_size=4)
    with pytest.raises(StreamError, match="same length"):
        pipeline.stream({"x": np.zeros(5), "y": np.zeros(6)}, batch_size=2)
    with pytest.raises(StreamError, match=r"\['w'\]"):
        pipeline.stream({"x": np.zeros(5)}, arrays=("x", "w"), batch_size=2)
    with pytest.raises(StreamError, match="the arrays passed hold 3 samples, which cannot be shared among 4 ranks"):
        pipeline.stream({"x": np.zeros(3), "y": np.zeros(3)}, batch_size=2, rank=0, world_size=4)
    # batch_size 1 with samples not divisible by the ranks cannot give equal batch counts:
    # refused when the stream is made, not at its first batch
    with pytest.raises(StreamError, match="drop_last=True"):
        pipeline.stream({"x": np.zeros(5), "y": np.arange(5)}, batch_size=1, rank=0, world_size=2)


@pytest.mark.parametrize("n, world, drop_last", [(1000, 3, False), (1000, 3, True), (999, 3, False),
                                                 (7, 4, False), (8, 4, False)])
def test_len_never_promises_batches_that_iteration_refuses(n, world, drop_last):
    """batch_size=1: every rank serves len(stream) batches of the samples it holds, or
    every rank refuses when the stream is made (never a rank failing mid-run)."""
    arrays = {"x": np.zeros((n, 1), np.float32), "y": np.arange(n)}
    held = [n * (r + 1) // world - n * r // world for r in range(world)]  # each rank's contiguous share
    promised = min(held) if drop_last else max(held)
    if promised > min(held):
        for rank in range(world):
            with pytest.raises(StreamError, match=rf"{n} samples on {world} ranks in batches of 1: every rank must "
                                                  rf"serve len\(stream\) = {promised} batches, and a rank's "
                                                  rf"{min(held)} samples cannot fill"):
                pipeline.stream(arrays, batch_size=1, rank=rank, world_size=world, drop_last=drop_last)
        return
    for rank in range(world):
        s = pipeline.stream(arrays, batch_size=1, rank=rank, world_size=world, drop_last=drop_last)
        assert len(s) == promised == sum(1 for _ in s)


@pytest.mark.parametrize("kw", [dict(batch_size=512), dict(batch_size=200, rank=0, world_size=2),
                                dict(global_batch_size=1000, rank=1, world_size=2)])
def test_drop_last_with_no_whole_batch_is_refused_rather_than_serving_empty_epochs(kw):
    """300 samples, batches of 512 (or 200 per rank of 2, a global 1000) with drop_last:
    every epoch had no batch, silently (Keras then failed on a None input)."""
    ids = np.arange(300)
    arrays = (ids[:, None].astype(np.float32), ids)
    with pytest.raises(StreamError, match=r"the arrays passed hold 300 samples, which fill no whole batch: .*drop_last=True"):
        pipeline.stream(arrays, drop_last=True, **kw)
    assert len(pipeline.stream(arrays, drop_last=False, **kw)) == 1  # the remainder is one batch


def test_an_empty_split_is_named_with_its_store(tmp_path):
    path = str(tmp_path / "e.zarr")
    ids = np.arange(50)
    pipeline.write(path, {"train": {"x": ids[:, None].astype(np.float32), "y": ids},
                          "val": {"x": np.zeros((0, 1), np.float32), "y": np.zeros(0, np.int64)}},
                   chunk_samples=16, progress=False)
    for kw in (dict(batch_size=1), dict(batch_size=4, drop_last=True), dict(global_batch_size=8)):
        with pytest.raises(StreamError, match=f"split 'val' of {path} holds no samples"):
            pipeline.stream(path, split="val", **kw)
    with pytest.raises(StreamError, match="the arrays passed hold no samples"):
        pipeline.stream({"x": np.zeros((0, 2)), "y": np.zeros(0)}, batch_size=2)
    assert len(pipeline.stream(path, batch_size=8)) == 7  # the other split streams


@pytest.mark.parametrize("seed, message", [
    (None, "seed=None is refused: every rank and DataLoader worker must use the same seed"),
    (-1, r"seed must be an integer, 0 or more, got -1 \(int\)"),
    (1.5, r"got 1.5 \(float\)"),
    ("7", r"got '7' \(str\)"),
    (True, r"got True \(bool\)"),
])
def test_a_bad_seed_is_refused_when_the_stream_is_made(store, seed, message):
    with pytest.raises(StreamError, match=f"^stream: .*{message}"):
        pipeline.stream(store, batch_size=64, seed=seed)


def test_a_numpy_integer_seed_is_that_integer(store):
    s = pipeline.stream(store, batch_size=100, seed=np.int64(3))
    assert type(s.state_dict()["seed"]) is int and s.state_dict()["seed"] == 3
    assert all(np.array_equal(a, b) for a, b in zip(epoch_ids(s), epoch_ids(pipeline.stream(store, batch_size=100,
                                                                                           seed=3))))


_CALLS: list[int] = []


def _features(block):
    # A module-level function is pickled by reference: the in-process cluster's threads
    # append to this very list.
    _CALLS.append(block.shape[0])
    return block * 2


def test_dask_chunks_of_x_and_y_are_computed_together_on_the_active_client():
    from distributed import Client

    from tests.conftest import in_process_cluster

    _CALLS.clear()
    base = da.arange(600, chunks=100, dtype=np.int64)
    shared = base.map_blocks(_features, dtype=np.int64, meta=np.array((), np.int64))
    source = {"x": (shared[:, None] + da.zeros((600, 3), chunks=(100, 3), dtype=np.int64)), "y": shared // 2}
    with in_process_cluster(n_workers=1, threads_per_worker=2, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        s = pipeline.stream(source, batch_size=64, seed=4, buffer_chunks=2)
        ids = []
        for xb, yb in s:
            assert (xb == (yb * 2)[:, None]).all()
            ids.append(yb)
        assert sorted(np.concatenate(ids).tolist()) == list(range(600))
        assert client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.transition_log)) > 0
    assert sorted(_CALLS) == [100] * 6  # the shared upstream block computed once per chunk, not per array


def test_an_abandoned_dask_epoch_leaves_nothing_stale():
    y = np.arange(400)
    source = {"x": da.from_array(y * 10, chunks=50), "y": da.from_array(y, chunks=50)}
    s = pipeline.stream(source, batch_size=30, seed=1, buffer_chunks=2)
    for k, _ in enumerate(s):
        if k == 3:
            break
    s.set_epoch(0)
    s.load_state_dict({"epoch": 0, "batches_served": 0})
    for _ in range(2):
        got = [(xb, yb) for xb, yb in s]
        assert all((xb == yb * 10).all() for xb, yb in got)
        assert sorted(np.concatenate([yb for _, yb in got]).tolist()) == list(range(400))


@pytest.mark.filterwarnings("ignore::pipeline.errors.KeptBatchesWarning")  # keeps every batch, on purpose
@pytest.mark.parametrize("world, workers, drop_last", [(1, 1, False), (2, 3, False), (3, 2, True)])
def test_the_quality_report_describes_the_order_actually_served(odd_store, world, workers, drop_last):
    from pipeline.streaming.plan import served_order

    for rank in range(world):
        s = pipeline.stream(odd_store, batch_size=24, seed=7, buffer_chunks=3, world_size=world, rank=rank,
                            drop_last=drop_last)
        s.set_epoch(2)
        for w in range(workers):
            got = np.concatenate([yb for _, yb in s.iter_worker(w, workers)])  # y is the sample index
            _, index = served_order(s.plan(w, workers), s.source.lengths, seed=7, epoch=2, rank=rank, worker=w,
                                    shuffle=True)
            np.testing.assert_array_equal(got, index)


def test_quality_is_reported_only_for_a_whole_epoch(store):
    s = pipeline.stream(store, batch_size=32, seed=1)
    for k, _ in enumerate(s):
        if k == 2:
            break
    assert s.quality() == {}  # stopped mid-epoch
    with pytest.warns(RuntimeWarning, match="continues epoch 0"):
        for _ in s:  # the rest of it: a resumed epoch is not a whole one either
            pass
    assert s.quality() == {}
    s.set_epoch(1)
    epoch_ids(s)
    assert set(s.quality()) == {"mean_distinct_chunks_per_batch", "spearman_position_vs_index"}


@pytest.mark.parametrize("threads", [6, 9])
def test_parallel_gathers_serve_the_same_batches_as_one_thread(odd_store, threads):
    # threads // 3 > 1 gathers batches in a pool; group buffers are recycled meanwhile.
    for epoch in range(3):
        one = pipeline.stream(odd_store, batch_size=29, seed=5, buffer_chunks=2, threads=1, prefetch=2)
        many = pipeline.stream(odd_store, batch_size=29, seed=5, buffer_chunks=2, threads=threads, prefetch=2)
        one.set_epoch(epoch)
        many.set_epoch(epoch)
        got = epoch_ids(many)
        want = epoch_ids(one)
        assert len(got) == len(want) == len(many)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def _counting_reads(monkeypatch):
    from pipeline.streaming import chunks

    # Every chunk read, whole or scattered, fetches the chunk's bytes once.
    reads = []
    original = chunks.ChunkReader._fetch
    monkeypatch.setattr(chunks.ChunkReader, "_fetch", lambda self, i: reads.append((self.where[2], i)) or original(self, i))
    return reads


def _read_ahead_epoch(store, reads: list):
    """A stream of ``store`` and its epoch 0's batches, epoch 1's first group read ahead.

    The next epoch's first group is read ahead only where the ring has room for it when
    the epoch's last group is taken; a batch still queued for the loop may view that
    region (it is then read when the next epoch starts, as designed). Which happens
    depends on the gathering threads: fresh streams until one reads ahead (almost always
    the first), ``reads`` counting that stream's reads only."""
    for _ in range(5):
        reads.clear()
        s = pipeline.stream(store, batch_size=50, seed=2, buffer_chunks=4)
        first = epoch_ids(s)
        if s._ahead is not None:
            return s, first
        s.close()
    pytest.fail("no epoch's last group started reading the next epoch's first in 5 fresh streams")


def test_the_next_epochs_first_group_is_read_ahead_once_and_serves_the_same_batches(store, monkeypatch):
    reads = _counting_reads(monkeypatch)
    s, first = _read_ahead_epoch(store, reads)
    n_chunks = len(s.source.lengths)
    assert s._ahead is not None and s._ahead[0][0] == 1  # epoch 1's first group is being read
    s._ahead[1]._futures[0].result()
    assert len(reads) == 2 * (n_chunks + 4)  # x and y: the epoch, and 4 chunks ahead
    s.set_epoch(1)
    second = epoch_ids(s)
    s._ahead[1]._futures[0].result()  # epoch 2's read-ahead, in turn
    # Each chunk of both epochs read once (epoch 1's first 4 were not read again), plus
    # epoch 2's first 4 read ahead.
    assert len(reads) == 2 * (2 * n_chunks + 4)
    fresh = pipeline.stream(store, batch_size=50, seed=2, buffer_chunks=4)
    fresh.set_epoch(1)
    assert [b.tolist() for b in second] == [b.tolist() for b in epoch_ids(fresh)]
    assert not all(np.array_equal(a, b) for a, b in zip(first, second))


def test_a_wrong_guess_is_dropped_and_changes_nothing(store, monkeypatch):
    s = pipeline.stream(store, batch_size=64, seed=3, buffer_chunks=2)
    epoch_ids(s)
    guessed = s._ahead[1]
    s.set_epoch(5)  # not the epoch read ahead
    got = epoch_ids(s)
    assert guessed._futures == {}  # closed: its buffer went back to the pool
    fresh = pipeline.stream(store, batch_size=64, seed=3, buffer_chunks=2)
    fresh.set_epoch(5)
    assert [b.tolist() for b in got] == [b.tolist() for b in epoch_ids(fresh)]


def test_an_epoch_iterated_again_is_guessed_next_time(store):
    """A loop that never calls set_epoch repeats its epoch: after one repeat the read
    ahead follows it."""
    s = pipeline.stream(store, batch_size=64, seed=3)
    epoch_ids(s)
    assert s._ahead[0][0] == 1
    epoch_ids(s)
    assert s._ahead[0][0] == 0
    s.close()
    assert s._ahead is None
    assert sorted(np.concatenate(epoch_ids(s)).tolist()) == list(range(1000))


def test_stop_read_ahead_waits_keeps_the_buffers_and_the_next_epoch_reads_again(store, monkeypatch):
    reads = _counting_reads(monkeypatch)
    s, _ = _read_ahead_epoch(store, reads)
    n_chunks = len(s.source.lengths)
    loader = s._ahead[1]
    s.stop_read_ahead()
    assert s._ahead is None and loader._futures == {}  # stopped, after its read finished
    # Epoch 0 read every chunk of x and y once; of the next epoch's first group, the
    # reads in progress when it stopped finished and the rest were cancelled: at most
    # that group's 4 chunks again (how many is a race). The epoch after serves the same
    # batches as a fresh stream (below): a group stopped part way is never served.
    counts = collections.Counter(reads)
    assert set(counts) == {(a, i) for a in ("x", "y") for i in range(n_chunks)}
    again = [k for k, v in counts.items() if v > 1]
    assert max(counts.values()) <= 2 and len({i for _, i in again}) <= 4
    kept = s._pool
    s.set_epoch(1)
    second = epoch_ids(s)
    assert s._pool is kept  # the group buffers stayed with the stream
    assert len(reads) >= 2 * 2 * n_chunks  # epoch 1's first group read again, while iterated
    fresh = pipeline.stream(store, batch_size=50, seed=2, buffer_chunks=4)
    fresh.set_epoch(1)
    assert [b.tolist() for b in second] == [b.tolist() for b in epoch_ids(fresh)]


def test_resume_and_ranks_ignore_a_read_ahead_for_another_plan(store):
    s = pipeline.stream(store, batch_size=64, seed=1, rank=1, world_size=2)
    epoch_ids(s)
    s.set_epoch(1)
    s.load_state_dict({"epoch": 1, "batches_served": 3})  # mid-epoch: the read-ahead group is not what comes
    rest = epoch_ids(s)
    full = pipeline.stream(store, batch_size=64, seed=1, rank=1, world_size=2)
    full.set_epoch(1)
    assert [b.tolist() for b in rest] == [b.tolist() for b in epoch_ids(full)[3:]]


def test_a_stream_with_a_read_ahead_pending_forks_into_dataloader_workers(store):
    """A forked worker inherits the read-ahead loader but not its threads: it must not
    wait on it."""
    from torch.utils.data import DataLoader

    s = pipeline.stream(store, batch_size=50, seed=0)
    epoch_ids(s)
    assert s._ahead is not None
    s.set_epoch(1)
    loader = DataLoader(s.torch(), batch_size=None, num_workers=2, multiprocessing_context="fork")
    ids = [yb.numpy() for _, yb in loader]
    assert sorted(np.concatenate(ids).tolist()) == list(range(1000))


def test_opening_a_stream_imports_no_deep_learning_framework(store):
    """A numpy loop, or Keras on JAX, must not pay for importing torch (seconds) just to
    learn the rank: torch.distributed is asked only when torch is already imported."""
    import subprocess
    import sys

    code = ("import sys, pipeline\n"
            f"s = pipeline.stream({str(store)!r}, split='train', batch_size=64)\n"
            "xb, yb = next(iter(s))\n"
            "print(len(xb), sorted(m for m in ('torch', 'keras', 'jax', 'tensorflow') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["64", "[]"]


@pytest.mark.parametrize("as_group", [False, True])
def test_a_group_another_tool_wrote_streams_as_it_is(tmp_path, as_group):
    """No pipeline metadata: no completeness claim, no ``partial`` needed; every sample
    once. A pipeline store that is incomplete is still refused (test above)."""
    path = tmp_path / "foreign.zarr"
    g = zarr.open_group(path, mode="w")
    x = np.random.default_rng(0).standard_normal((1000, 4, 3)).astype(np.float32)
    g.create_array("train/x", data=x, chunks=(128, 4, 3))
    g.create_array("train/y", data=np.arange(1000, dtype=np.int64), chunks=(128,))
    source = zarr.open_group(path, mode="r") if as_group else str(path)
    s = pipeline.stream(source, split="train", batch_size=64, seed=1)
    seen = np.concatenate([yb for _, yb in s])
    np.testing.assert_array_equal(np.sort(seen), np.arange(1000))
    xb, yb = next(iter(pipeline.stream(source, split="train", batch_size=64, seed=1)))
    np.testing.assert_array_equal(xb, x[yb])


# -- memory: the bound stream()'s docstring states -------------------------------------------------


def _bound(path, *, batch_size, buffer_chunks, ahead, chunk, queued=4, threads=2):
    """stream()'s documented bound, from the store's own metadata (zarr) and the formula:
    ``(min(share, (ahead + 2 + viewed) * group) + 2 * batch + (threads + 1) * chunk) *
    sample_bytes``."""
    x, y = (zarr.open_array(f"{path}/train/{k}", mode="r") for k in ("x", "y"))
    sample = x.dtype.itemsize * int(np.prod(x.shape[1:])) + y.dtype.itemsize
    group = buffer_chunks * chunk
    viewed = max(1, -(-(queued + 2) * batch_size // group))
    decoding = (threads + 1) * chunk
    return (min(x.shape[0], (ahead + 2 + viewed) * group) + 2 * batch_size + decoding) * sample, sample


@pytest.mark.parametrize("batch_size, buffer_chunks", [(50, 2), (300, 1), (1000, 4), (64, 32), (700, 40)])
def test_peak_batch_memory_stays_within_the_documented_bound(tmp_path, batch_size, buffer_chunks):
    """Peak numpy allocations (tracemalloc, not RSS) over two epochs stay within the
    formula of stream()'s docstring (chunks being decoded included); a split
    of one or two groups costs about its own size, not the read-ahead window's."""
    import tracemalloc

    n, chunk = 2048, 64
    y = np.arange(n, dtype=np.int64)
    x = np.broadcast_to(y[:, None, None].astype(np.float32), (n, 64, 16)).copy()
    from pipeline.storage import write

    write(tmp_path / "m.zarr", {"x": x, "y": y}, chunk_samples=chunk, progress=False)
    path = str(tmp_path / "m.zarr")
    s = pipeline.stream(path, batch_size=batch_size, buffer_chunks=buffer_chunks, seed=1, threads=2)
    bound, sample = _bound(path, batch_size=batch_size, buffer_chunks=buffer_chunks, ahead=s.prefetch, chunk=chunk)
    assert s.memory_bound() == bound
    scratch = 4 * chunk * sample
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        seen = []
        for epoch in range(2):
            s.set_epoch(epoch)
            seen.append(np.sort(np.concatenate([b[1].copy() for b in s])))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
        s.close()
    assert all(np.array_equal(ids, y) for ids in seen)
    # the copied ids: what the test itself keeps, not the stream's memory
    assert peak <= bound + 2 * n * 8, (peak, bound)  # the bound counts the chunks being decoded
    assert s.peak_buffer_bytes() <= bound
    if buffer_chunks * chunk >= n:  # one group holds the whole split
        assert peak <= n * sample + 2 * batch_size * sample + scratch + 2 * n * 8


def test_too_few_samples_for_the_ranks_names_the_store(tmp_path):
    """A split of fewer samples than ranks: refused naming the split and its store."""
    path = make_store(tmp_path / "one.zarr", n=1, chunk=1)
    with pytest.raises(StreamError, match=f"stream: split 'train' of {path} holds 1 samples, which cannot be shared "
                                          "among 2 ranks"):
        pipeline.stream(path, batch_size=1, rank=1, world_size=2)


# -- memory of virtual windows (assembled while streaming) ------------------------------------------


def _traced_epoch(s) -> tuple[int, np.ndarray, tuple]:
    """Peak numpy allocations (tracemalloc) over one epoch, the labels served, and the
    first batch (copied)."""
    import tracemalloc

    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        seen, first = [], None
        for xb, yb in s:
            if first is None:
                first = (xb.copy(), yb.copy())
            seen.append(yb.copy())
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    return peak, np.concatenate(seen), first


@pytest.mark.parametrize("size, batch_size, chunk, threads", [
    (64, 64, 128, 2),      # small windows, chunks of ends
    (512, 256, 64, 2),     # long windows, short chunks
    (512, 256, 4096, 2),   # long windows, a group of 320 MiB of windows
    (512, 1024, 4096, 8),  # batches of 20 MiB, several threads assembling
    (2048, 32, 512, 2),    # windows of 80 KiB, features in chunks of a fourth of the lookback
])
def test_virtual_windows_stay_within_the_bound(tmp_path, size, batch_size, chunk, threads):
    """A virtual store's windows are assembled per batch: peak numpy allocations over an
    epoch stay within memory_bound(), which counts them (the stored arrays alone are
    kilobytes) and grows with the batch and the threads, not with the chunks of window
    ends (a group's windows, up to 320 MiB here, are never all in memory)."""
    from tests.streaming.virtualstore import make_virtual_store, windows_of

    F, scales, n = 5, (1, 4), 3000
    halo = (size - 1) * max(scales)
    path, f, ends = make_virtual_store(tmp_path / "v.zarr", steps=halo + n, features=F, size=size, scales=scales,
                                       chunk=chunk)
    window = size * F * len(scales) * 4
    batch = batch_size * window
    s = pipeline.stream(path, batch_size=batch_size, buffer_chunks=4, seed=1, threads=threads)
    # Queued batches count their windows: 4, or 2-3 for batches over 16 MiB.
    assert s.prefetch_batches == max(2, min(4, (64 << 20) // (batch_size * (window + 8))))
    bound = s.memory_bound()
    peak, seen, (xb, yb) = _traced_epoch(s)
    s.close()
    np.testing.assert_array_equal(np.sort(seen), np.arange(n))
    np.testing.assert_array_equal(xb, windows_of(f, ends[yb], size, scales))
    kept = xb.nbytes + yb.nbytes + 2 * n * 8  # what the test itself keeps: the first batch, the labels
    assert peak <= bound + kept, (peak, bound)
    # What is counted: at least the batches queued and held, and nothing per chunk of
    # ends: queued, held and in-flight batches (the most that assemble at once: two
    # each), the kept features (all of them here) and a few MiB of groups and scratch.
    gather = max(1, min(threads // 2, (64 << 20) // batch))
    alive = s.prefetch_batches + 3 + (2 * gather + 1 if gather > 1 else 0)
    assert (s.prefetch_batches + 2) * batch <= bound <= alive * batch + f.nbytes + (8 << 20), (bound, alive * batch)


def test_virtual_windows_of_global_steps_stay_within_the_bound(tmp_path):
    """With ``global_batch_size`` a group is laid out by steps, from pieces of many
    chunks: its windows are still assembled per batch and counted by memory_bound()."""
    from tests.streaming.virtualstore import make_virtual_store, windows_of

    size, scales, n = 512, (1, 4), 6000
    path, f, ends = make_virtual_store(tmp_path / "v.zarr", steps=(size - 1) * 4 + n, size=size, scales=scales,
                                       chunk=1024)
    s = pipeline.stream(path, global_batch_size=256, seed=3, threads=2)
    bound = s.memory_bound()
    peak, seen, (xb, yb) = _traced_epoch(s)
    s.close()
    np.testing.assert_array_equal(np.sort(seen), np.arange(n))
    np.testing.assert_array_equal(xb, windows_of(f, ends[yb], size, scales))
    assert peak <= bound + xb.nbytes + yb.nbytes + 2 * n * 8, (peak, bound)


def test_virtual_stream_anonymous_memory_stays_within_the_bound(tmp_path):
    """The process's anonymous memory (RssAnon, in a fresh interpreter, once a first
    stream has loaded the libraries streaming uses) grows by no more than
    memory_bound() plus the allocator's and threads' own few MiB, over groups of 8,192
    windows of 20 KiB (160 MiB of windows a group if assembled per group)."""
    import json
    import subprocess
    import sys

    from tests.streaming.virtualstore import make_virtual_store

    size, scales = 512, (1, 4)
    path, _, _ = make_virtual_store(tmp_path / "v.zarr", steps=(size - 1) * 4 + 40_000, size=size, scales=scales,
                                    chunk=2048)
    code = f"""
import gc, json, pipeline
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon"):
            return int(line.split()[1]) * 1024
warm = pipeline.stream({path!r}, batch_size=1, buffer_chunks=1, seed=0, threads=2)
next(iter(warm))
warm.close()
del warm
gc.collect()
a0, peak = anon(), 0
s = pipeline.stream({path!r}, batch_size=256, buffer_chunks=4, seed=0, threads=2)
for i, (xb, yb) in enumerate(s):
    peak = max(peak, anon() - a0)
    if i == 100:
        break
print(json.dumps({{"bound": s.memory_bound(), "grew": peak}}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                    cwd=tmp_path).stdout.splitlines()[-1])
    assert out["grew"] <= out["bound"] + (32 << 20), out


def test_default_threads_keep_requests_in_flight_for_a_remote_store_without_cache(s3, tmp_path):
    """A remote store streamed without the cache is read a request per chunk object,
    each waiting its round trip: by default it gets as many read threads as the cache
    keeps requests in flight; a local store or a cached one keeps one per core."""
    import os

    from pipeline.storage import write
    from pipeline.streaming.cache import FETCH_REQUESTS
    from pipeline.streaming.streamer import default_threads

    assert default_threads(2, False) == 2 and default_threads(64, False) == 32 and default_threads(None, False) == 2
    assert default_threads(2, True) == FETCH_REQUESTS and default_threads(64, True) == 32
    x = np.random.default_rng(7).standard_normal((120, 3)).astype(np.float32)
    url = "s3://training/streamer/threads.zarr"
    write(url, {"x": x, "y": np.arange(120)}, chunk_samples=10, storage_options=s3, progress=False)
    write(tmp_path / "l.zarr", {"x": x, "y": np.arange(120)}, chunk_samples=10, progress=False)
    cores = min(32, os.cpu_count() or 2)
    remote = pipeline.stream(url, batch_size=16, storage_options=s3)
    local = pipeline.stream(tmp_path / "l.zarr", batch_size=16)
    cached = pipeline.stream(url, batch_size=16, storage_options=s3, cache_dir=tmp_path / "cache", cache_bytes=1 << 24)
    given = pipeline.stream(url, batch_size=16, storage_options=s3, threads=3)
    try:
        assert (remote.threads, local.threads, cached.threads, given.threads) == (max(cores, 16), cores, cores, 3)
        batches = list(remote)
        got, ids = np.concatenate([xb for xb, _ in batches]), np.concatenate([yb for _, yb in batches])
        np.testing.assert_array_equal(got[np.argsort(ids)], x)
    finally:
        for s in (remote, local, cached, given):
            s.close()
