"""Elastic order (global_batch_size): the same global steps on every world size, and
resumes that change the world size and the DataLoader workers serve the rest exactly once.

References are computed here: the epoch's sample sequence from the chunk order (chunk
``c`` of the order holds samples ``starts[c]..starts[c + 1]-1``), a rank's stretch of it by
plain arithmetic, and the global steps of an uninterrupted run on one rank, one worker.
A DataLoader taking batches from its workers in turn is simulated by hand.
"""

from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

import pipeline
from pipeline.errors import StreamError
from pipeline.streaming.elastic import elastic_plan, elastic_served_order, epoch_lanes, lane_count
from pipeline.streaming.plan import chunk_order, worker_plan

GLOBAL_BATCHES = (4, 6, 8, 12, 16, 24, 40)


def world_sizes(global_batch: int) -> list[int]:
    """The world sizes the issue promises: 1 to 8, dividing the global batch."""
    return [w for w in range(1, 9) if global_batch % w == 0]


# -- the plan alone ----------------------------------------------------------------------------


def _rank_steps(lengths, lanes, *, seed, epoch, shuffle, rank, world):
    plan = elastic_plan(lengths, lanes, steps=np.arange(lanes.steps), seed=seed, epoch=epoch, shuffle=shuffle,
                        rank=rank, world_size=world)
    _, index = elastic_served_order(plan, lengths)
    bounds = np.concatenate([[0], np.cumsum(plan.batch_sizes)])
    return plan, [index[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=16),
    global_batch=st.sampled_from(GLOBAL_BATCHES),
    buffer=st.integers(1, 6),
    seed=st.integers(0, 50),
    epoch=st.integers(0, 3),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
)
def test_global_steps_hold_the_same_samples_on_every_world_size(lengths, global_batch, buffer, seed, epoch,
                                                                drop_last, shuffle):
    n = sum(lengths)
    try:
        lanes = epoch_lanes(n, global_batch_size=global_batch, drop_last=drop_last, longest_chunk=max(lengths),
                            buffer_chunks=buffer)
    except StreamError:
        assume(False)  # too few samples for the lanes without drop_last (tested apart)
    # The epoch's sample sequence, from the chunk order.
    starts = np.concatenate([[0], np.cumsum(lengths)])
    sequence = np.concatenate([np.arange(starts[c], starts[c + 1]) for c in chunk_order(len(lengths), seed, epoch,
                                                                                          shuffle)])
    reference = None
    for world in world_sizes(global_batch):
        try:
            lanes.check_world_size(world)
        except StreamError:
            assert not drop_last and world > n % global_batch
            continue  # a rank without a sample in the last step: refused (tested apart)
        steps = [set() for _ in range(lanes.steps)]
        for rank in range(world):
            plan, batches = _rank_steps(lengths, lanes, seed=seed, epoch=epoch, shuffle=shuffle, rank=rank,
                                        world=world)
            assert len(batches) == lanes.steps  # equal step counts on every rank
            per_rank = global_batch // world
            assert all(0 < len(b) <= per_rank for b in batches)
            if drop_last:
                assert all(len(b) == per_rank for b in batches)
            # a rank reads only its own stretch of the sequence: what it reads without global_batch_size
            stretch = set(sequence[n * rank // world : n * (rank + 1) // world].tolist())
            served = np.concatenate(batches + [np.empty(0, np.int64)])
            assert set(served.tolist()) <= stretch
            if not drop_last:
                plain = worker_plan(lengths, seed=seed, epoch=epoch, shuffle=shuffle, batch_size=per_rank,
                                    drop_last=False, rank=rank, world_size=world, worker=0, num_workers=1,
                                    buffer_chunks=buffer)
                assert {p.chunk for p in plan.pieces} == {p.chunk for p in plain.pieces}
            for j, b in enumerate(batches):
                assert not steps[j] & set(b.tolist())
                steps[j] |= set(b.tolist())
        flat = [i for s in steps for i in s]
        assert len(flat) == len(set(flat))  # never twice
        if not drop_last:
            assert sorted(flat) == list(range(n))  # every sample once
        else:
            assert all(len(s) == global_batch for s in steps)
        if reference is None:
            reference = steps
        assert steps == reference, f"world size {world} serves other global steps"


def test_lanes_of_common_global_batches():
    assert [lane_count(g) for g in (1, 2, 8, 256, 24, 48, 12, 60, 840)] == [1, 2, 8, 8, 24, 24, 12, 60, 840]


# -- streams: resumes across world sizes and DataLoader workers ----------------------------------


#: (samples, chunk) of the stores the resume tests draw from.
LAYOUTS = ((97, 7), (203, 13), (331, 29), (400, 64), (150, 150))


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    from tests.streaming.conftest import make_store

    root = tmp_path_factory.mktemp("elastic")
    return [make_store(root / f"{n}-{c}.zarr", n=n, chunk=c) for n, c in LAYOUTS]


def _run_loader(streams, workers: int, batches: int | None, torch0: bool = False):
    """What a loop over one DataLoader per rank takes in its first ``batches`` steps (all
    when None): per loop step, the labels every rank served. ``workers=0`` iterates the
    stream itself (``torch0``: through its torch dataset in this process, as
    ``DataLoader(num_workers=0)`` does); otherwise workers are simulated in this
    process, taking turns (``torch0``: they say how many they are, as the workers of a
    stream's torch dataset do before their first batch, so that the state can be saved
    without num_workers=)."""
    steps: list[list[np.ndarray]] = []
    per_rank = []
    for s in streams:
        if workers == 0:
            its = [iter(s.torch()) if torch0 else iter(s)]
        else:
            if torch0:
                s.torch()
                for _ in range(workers):
                    s.served_by(workers)
            its = [s.iter_resumed(k, workers) for k in range(workers)]
        out = []
        live = list(range(len(its)))
        turn = itertools.cycle(range(len(its)))
        while live and (batches is None or len(out) < batches):
            k = next(turn)
            if k not in live:
                continue
            got = next(its[k], None)
            if got is None:
                live.remove(k)
                continue
            got = tuple(g.numpy() if isinstance(g, torch.Tensor) else g for g in got)
            assert (np.asarray(got[0]).reshape(len(got[1]), -1)[:, 0] == got[1]).all()  # x and y aligned
            out.append(np.array(got[1]))
        for it in its:
            it.close()
        per_rank.append(out)
    assert len({len(o) for o in per_rank}) == 1, "ranks took different numbers of steps"
    for j in range(len(per_rank[0])):
        steps.append([o[j] for o in per_rank])
    return steps


# Simulated workers are several iterations of one stream in one process, sharing its buffer pool.
@pytest.mark.filterwarnings("ignore::pipeline.errors.KeptBatchesWarning")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(
    layout=st.integers(0, len(LAYOUTS) - 1),
    global_batch=st.sampled_from((8, 12, 16, 24)),
    buffer=st.integers(1, 4),
    phases=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 3), st.floats(0, 0.6), st.booleans()),
                    min_size=1, max_size=3),
    saver=st.integers(0, 7),
    drop_last=st.booleans(),
    seed=st.integers(0, 9),
)
# A state of DataLoader(num_workers=0) saved without num_workers=, resumed on 2 workers.
@example(layout=0, global_batch=8, buffer=1, phases=[(0, 0, 0.5, True), (0, 2, 0.3, False)], saver=0,
         drop_last=False, seed=0)
# States of 3 and 2 workers saved without num_workers=, resumed on 2 workers, then 0.
@example(layout=1, global_batch=12, buffer=2, phases=[(0, 3, 0.3, True), (1, 2, 0.4, True)], saver=1,
         drop_last=False, seed=3)
def test_resumes_on_other_world_sizes_and_workers_serve_the_rest_once_as_the_same_steps(
        layouts, layout, global_batch, buffer, phases, saver, drop_last, seed):
    source = layouts[layout]
    kw = dict(global_batch_size=global_batch, seed=seed, buffer_chunks=buffer, drop_last=drop_last, threads=2)
    sizes = world_sizes(global_batch)
    ref_stream = pipeline.stream(source, rank=0, world_size=1, **kw)
    ref_stream.set_epoch(1)
    reference = [set(b[0].tolist()) for b in _run_loader([ref_stream], 0, None)]
    assert len(reference) == len(ref_stream)
    served = collections.Counter()
    state = None
    done = 0
    for i, (w, workers, share, torch0) in enumerate(phases + [(0, 0, 1.0, False)]):
        world = sizes[w % len(sizes)]
        try:
            streams = [pipeline.stream(source, rank=r, world_size=world, **kw) for r in range(world)]
        except StreamError:
            continue  # a rank of one lane with an empty step: this world size is refused (tested apart)
        for s in streams:
            s.set_epoch(1)
            if state is not None:
                s.load_state_dict(state)
        last = i == len(phases)
        take = None if last else int(share * (len(reference) - done))
        steps = _run_loader(streams, workers, take, torch0)
        for ranks in steps:
            union = set(np.concatenate(ranks).tolist())
            assert sum(len(r) for r in ranks) == len(union)
            assert union in reference, "a loop step is not one of the uninterrupted run's global steps"
            served[reference.index(union)] += 1
        done += len(steps)
        saving = streams[saver % world]
        # A loop in this process (plain, or DataLoader(num_workers=0) saving the loop's
        # count without num_workers) records who served by itself, and so does a loader
        # whose workers said how many they are (torch0 with workers).
        state = (saving.state_dict(batches_served=done) if torch0 else saving.state_dict()
                 if workers == 0 else saving.state_dict(batches_served=done, num_workers=workers))
        assert last or state["batches_served"] == done  # (a finished epoch starts afresh)
    assert sorted(served) == list(range(len(reference))) and max(served.values()) == 1


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine, on purpose
@pytest.mark.parametrize("first, then", [((2, 2), (3, 1)), ((4, 0), (2, 3)), ((1, 3), (6, 2))])
def test_dataloader_workers_resume_on_another_world_size(store, first, then):
    """Real DataLoader worker processes: 3 and 5 loop steps on one world size, the rest on another."""
    kw = dict(global_batch_size=24, seed=4, buffer_chunks=3)
    ref = pipeline.stream(store, rank=0, world_size=1, **kw)
    reference = [set(y.tolist()) for _, y in ref]
    served = collections.Counter()
    state = None
    done = 0
    for (world, workers), take in ((first, 5), (then, None)):
        per_rank = []
        for rank in range(world):
            s = pipeline.stream(store, rank=rank, world_size=world, **kw)
            if state is not None:
                s.load_state_dict(state)
            loader = DataLoader(s.torch(), batch_size=None, num_workers=workers)
            out = []
            for xb, yb in loader:
                assert torch.equal(xb[:, 0, 0].long(), yb)
                out.append(set(yb.tolist()))
                if take is not None and len(out) == take:
                    break
            per_rank.append(out)
            saved = s.state_dict(batches_served=done + len(out), num_workers=workers)
        assert len({len(o) for o in per_rank}) == 1
        for j in range(len(per_rank[0])):
            union = set().union(*(o[j] for o in per_rank))
            assert union in reference
            served[reference.index(union)] += 1
        done += len(per_rank[0])
        state = saved
    assert sorted(served) == list(range(len(reference))) and max(served.values()) == 1


def test_state_round_trip_and_what_it_records(store):
    s = pipeline.stream(store, global_batch_size=16, rank=1, world_size=2, seed=2, buffer_chunks=2)
    it = iter(s)
    for _ in range(3):
        next(it)
    state = s.state_dict()
    assert state == {"epoch": 0, "batches_served": 3, "seed": 2, "rank": 1, "world_size": 2, "global_batch_size": 16,
                     "buffer_chunks": 2, "steps_per_epoch": math.ceil(1000 / 16), "elastic_layout": 2, "done": [],
                     "num_workers": 1,
                     "version": 0, "batch_size": 8, "shuffle": True, "drop_last": False, "n_samples": 1000}
    it.close()
    # after a resume on 4 ranks with 2 workers that took 5 more batches: the first 3 steps,
    # then 3 from the first worker's share and 2 from the second's
    t = pipeline.stream(store, global_batch_size=16, rank=3, world_size=4, seed=2, buffer_chunks=2)
    t.load_state_dict(state)
    later = t.state_dict(batches_served=8, num_workers=2)
    assert later["done"] == [[0, 3]] and later["num_workers"] == 2 and later["batches_served"] == 8
    u = pipeline.stream(store, global_batch_size=16, seed=2, buffer_chunks=2)
    u.load_state_dict(later)
    # Kept as saved: a loader of 2 workers goes on with those workers' turns.
    assert {k: u.state_dict()[k] for k in ("done", "batches_served", "num_workers")} == \
        {"done": [[0, 3]], "batches_served": 8, "num_workers": 2}
    # A loader of 3 workers shares anew what is left after the steps the 2 took. Steps
    # 3..62 were left; groups of ceil(2 * 64 / 16) = 8 steps: the even split (step 33)
    # moves to the group boundary at step 32, where the second worker started.
    assert u.state_dict(num_workers=3)["done"] == [[0, 6], [32, 34]]


def test_refusals(store):
    with pytest.raises(StreamError, match="world sizes dividing its 8 lanes"):
        pipeline.stream(store, global_batch_size=16, rank=0, world_size=3)
    with pytest.raises(StreamError, match="disagree"):
        pipeline.stream(store, global_batch_size=16, batch_size=4, rank=0, world_size=2)
    with pytest.raises(StreamError, match="batch_size .* or global_batch_size"):
        pipeline.stream(store)
    plain = pipeline.stream(store, batch_size=8, rank=0, world_size=2)
    elastic = pipeline.stream(store, global_batch_size=16, rank=0, world_size=2)
    served = {"epoch": 0, "batches_served": 2}
    with pytest.raises(StreamError, match="without global_batch_size"):
        elastic.load_state_dict({**plain.state_dict(), **served})
    with pytest.raises(StreamError, match="with global_batch_size=16"):
        plain.load_state_dict({**elastic.state_dict(), **served})
    for key, value in (("seed", 1), ("global_batch_size", 32), ("buffer_chunks", 9), ("steps_per_epoch", 3)):
        with pytest.raises(StreamError, match=f"saved with {key}={value}"):
            elastic.load_state_dict({**elastic.state_dict(), **served, key: value})
    with pytest.raises(StreamError, match="batches_served=1, but 2 steps are done"):
        elastic.load_state_dict({**served, "batches_served": 1, "done": [[0, 2]]})
    # a stream without global_batch_size resumes only on the DataLoader workers that served it
    plain.load_state_dict(plain.state_dict(batches_served=3, num_workers=2))
    with pytest.raises(StreamError, match="saved while 2 DataLoader workers served, here 3 DataLoader workers serve"):
        next(plain.iter_resumed(0, 3))
    with pytest.raises(StreamError, match=r"saved while 2 DataLoader workers served, here one server does \(a loop in "
                                          r"one process, DataLoader num_workers=0, or one DataLoader worker\)"):
        next(iter(plain))  # a plain loop: it said "this loader has 1"
    # 1003 = 125 * 8 + 3: the last step's 3 samples leave a rank of 4 or 8 without one
    odd = {"x": np.zeros((1003, 2), np.float32), "y": np.arange(1003)}
    for world in (4, 8):
        with pytest.raises(StreamError, match=f"^stream: the arrays passed hold 1003 samples: global steps of "
                                              f"global_batch_size=8 leave 3 for the epoch's last step, fewer than "
                                              f"world_size={world}"):
            pipeline.stream(odd, global_batch_size=8, rank=0, world_size=world)
        assert len(pipeline.stream(odd, global_batch_size=8, rank=0, world_size=world, drop_last=True)) == 125
    assert len(pipeline.stream(odd, global_batch_size=8, rank=0, world_size=2)) == 126


def test_a_mix_of_elastic_streams_resumes_on_another_world_size(tmp_path):
    from tests.streaming.test_mix import store

    a = store(tmp_path / "a.zarr", 0, n=400, shape=(2,), chunk=32)
    b = store(tmp_path / "b.zarr", 1, n=200, shape=(2,), chunk=32)
    kw = dict(weights=[2, 1], global_batch_size=8, seed=5, buffer_chunks=2)
    reference = [set(y.tolist()) for _, y in pipeline.mix([a, b], rank=0, world_size=1, **kw)]
    served = []
    first = [pipeline.mix([a, b], rank=r, world_size=2, **kw) for r in range(2)]
    its = [iter(m) for m in first]
    for _ in range(7):
        served.append(set(np.concatenate([next(it)[1] for it in its]).tolist()))
    for it in its:
        it.close()
    state = first[1].state_dict()
    rest = [pipeline.mix([a, b], rank=r, world_size=4, **kw) for r in range(4)]
    for m in rest:
        m.load_state_dict(state)
    for ys in zip(*([np.array(y) for _, y in m] for m in rest)):
        served.append(set(np.concatenate(ys).tolist()))
    assert served == reference
    rest[0].load_state_dict(rest[0].state_dict(batches_served=2, num_workers=2))
    with pytest.raises(StreamError, match="resume a mix on as many workers"):
        next(rest[0].iter_resumed(0, 3))


@pytest.fixture(scope="module")
def fold_stores(tmp_path_factory):
    from tests.streaming.test_folds import FOLDS, _materialized, _virtual, _virtual_folds

    d = tmp_path_factory.mktemp("elastic-folds")
    return {"materialized": (_materialized(d / "m.zarr"), FOLDS),
            "virtual": (_virtual(d / "v.zarr", _virtual_folds()), _virtual_folds())}


@pytest.mark.parametrize("kind", ["materialized", "virtual"])
def test_folds_and_virtual_windows_keep_their_global_steps_on_every_world_size(fold_stores, kind):
    """A fold's chunks are runs of its base chunks, and virtual windows are assembled from
    feature rows: both read in pieces of chunks, in the elastic buffer layout."""
    from tests.streaming.test_folds import _check_batch

    path, folds = fold_stores[kind]
    for name in ("fold2/train", "ragged/train"):
        reference = None
        for world in (1, 2, 3, 6):
            steps: list[set] = []
            for rank in range(world):
                try:
                    s = pipeline.stream(path, split=name, global_batch_size=12, seed=3, buffer_chunks=2, rank=rank,
                                        world_size=world)
                except StreamError:
                    assert world > folds[name].size % 12  # a rank without a sample in the last step (tested apart)
                    break
                batches = [(np.array(x), np.array(y)) for x, y in s]
                assert len(batches) == len(s)
                steps = steps or [set() for _ in batches]
                for j, (xb, yb) in enumerate(batches):
                    _check_batch(kind, xb, yb)
                    steps[j] |= set(yb.tolist())
            else:
                assert sorted(i for st_ in steps for i in st_) == folds[name].tolist()
                reference = reference or steps
                assert steps == reference


def test_no_shuffle_is_store_order_lane_by_lane(store):
    """shuffle=False with global_batch_size, as stream()'s docstring says: not store
    order overall, but each of the L lanes (consecutive stretches, lane i starting at
    sample i * n // L) in store order, every step taking its next G / L samples of each."""
    n, global_batch = 1000, 16
    lanes = lane_count(global_batch)
    starts = [i * n // lanes for i in range(lanes + 1)]
    per_lane = global_batch // lanes
    s = pipeline.stream(store, global_batch_size=global_batch, shuffle=False)
    served = [np.asarray(y) for _, y in s]
    np.testing.assert_array_equal(np.sort(np.concatenate(served)), np.arange(n))
    assert not np.array_equal(np.concatenate(served), np.arange(n))
    for j, batch in enumerate(served[:10]):
        expected = np.concatenate([np.arange(a + j * per_lane, a + (j + 1) * per_lane) for a in starts[:-1]])
        np.testing.assert_array_equal(np.sort(batch), expected)


# -- the epoch's last step -------------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [w for w in range(1, n + 1) if n % w == 0]


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=20),
    global_batch=st.sampled_from((2, 3, 4, 6, 8, 12, 16, 24, 40, 48)),
    buffer=st.integers(1, 4),
    seed=st.integers(0, 50),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
)
def test_an_epoch_ends_with_one_short_step_split_evenly_over_the_ranks(lengths, global_batch, buffer, seed, shuffle,
                                                                       drop_last):
    """As batch_size= does: every global step full but the last, which holds N mod G
    samples, and on every world size the ranks' shares of it differ by one at most (DDP
    averages each rank's loss over its share); a world size above N mod G is refused."""
    n = sum(lengths)
    rest = 0 if drop_last else n % global_batch
    expected = [global_batch] * (n // global_batch) + ([rest] if rest else [])
    lanes = epoch_lanes(n, global_batch_size=global_batch, drop_last=drop_last, longest_chunk=max(lengths),
                        buffer_chunks=buffer)
    assert lanes.steps == len(expected)
    for world in _divisors(lane_count(global_batch)):
        if rest and world > rest:
            with pytest.raises(StreamError, match=f"leave {rest} for the epoch's last step"):
                lanes.check_world_size(world)
            continue
        lanes.check_world_size(world)
        sizes = np.array([[len(b) for b in _rank_steps(lengths, lanes, seed=seed, epoch=0, shuffle=shuffle,
                                                       rank=rank, world=world)[1]]
                          for rank in range(world)]).reshape(world, len(expected))
        assert sizes.sum(axis=0).tolist() == expected
        full = sizes[:, : n // global_batch]
        assert (full == global_batch // world).all()
        if rest:
            last = sizes[:, -1]
            assert last.min() >= 1 and last.max() - last.min() <= 1


def _id_store(path, n: int, chunk: int) -> str:
    """A plain zarr 3 store, as another tool writes one: x[i] = i in every cell, y[i] = i."""
    import zarr

    group = zarr.open_group(str(path), mode="w", zarr_format=3).create_group("train")
    ids = np.arange(n, dtype=np.int64)
    group.create_array("x", shape=(n, 2), chunks=(chunk, 2), dtype="float32")[:] = np.repeat(ids[:, None], 2, 1)
    group.create_array("y", shape=(n,), chunks=(chunk,), dtype="int64")[:] = ids
    return str(path)


@pytest.mark.parametrize("n, chunk, global_batch", [(100, 10, 24), (5003, 97, 24), (130, 7, 8)])
def test_streams_end_with_one_short_step_on_every_world_size(tmp_path, n, chunk, global_batch):
    """The user trial's stores: global steps 24, 24, 24, 24, 4 on 100 samples (they were
    ..., 16, 12), each rank's share of the last one within a sample of the others'."""
    path = _id_store(tmp_path / "s.zarr", n, chunk)
    rest = n % global_batch
    reference = None
    for world in world_sizes(global_batch):
        kw = dict(global_batch_size=global_batch, seed=0, buffer_chunks=2, world_size=world)
        if world > rest:
            with pytest.raises(StreamError, match=f"leave {rest} for the epoch's last step, fewer than "
                                                  f"world_size={world}"):
                pipeline.stream(path, rank=0, **kw)
            continue
        per_rank = []
        for rank in range(world):
            with pipeline.stream(path, rank=rank, **kw) as s:
                per_rank.append([np.array(y) for _, y in s])
        sizes = np.array([[len(y) for y in batches] for batches in per_rank])
        assert sizes.sum(axis=0).tolist() == [global_batch] * (n // global_batch) + [rest]
        assert sorted(sizes[:, -1].tolist()) == sorted(len(a) for a in np.array_split(np.arange(rest), world))
        steps = [set(np.concatenate([b[j] for b in per_rank]).tolist()) for j in range(sizes.shape[1])]
        assert sorted(i for step in steps for i in step) == list(range(n))
        reference = reference or steps
        assert steps == reference


def test_states_of_the_earlier_layout_resume_only_where_their_steps_are_the_same(tmp_path):
    """A state saved before the one-short-step layout (no elastic_layout) names steps by
    number: those of the last group (here the last two steps) now hold other samples,
    so a state that served one of them is refused; one that served only earlier steps
    resumes exactly. States of this layout resume anywhere in the epoch."""
    path = _id_store(tmp_path / "s.zarr", 100, 10)
    kw = dict(global_batch_size=24, seed=0, buffer_chunks=2)
    reference = [set(y.tolist()) for _, y in pipeline.stream(path, **kw)]
    assert [len(r) for r in reference] == [24, 24, 24, 24, 4]
    for served in (2, 4):
        s = pipeline.stream(path, **kw)
        it = iter(s)
        for _ in range(served):
            next(it)
        it.close()
        state = s.state_dict()
        legacy = {k: v for k, v in state.items() if k != "elastic_layout"}
        for saved in (state, legacy):
            t = pipeline.stream(path, rank=1, world_size=2, **kw)
            if saved is legacy and served == 4:
                with pytest.raises(StreamError, match="earlier pipeline .* last 2 global steps of this epoch"):
                    t.load_state_dict(saved)
                continue
            t.load_state_dict(saved)
            u = pipeline.stream(path, rank=0, world_size=2, **kw)
            u.load_state_dict(saved)
            rest = [set(np.concatenate([a, b]).tolist()) for (_, a), (_, b) in zip(u, t)]
            assert rest == reference[served:]
