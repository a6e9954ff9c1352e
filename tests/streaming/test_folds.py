"""Walk-forward folds: index arrays into one base split, streamed by name exactly once.

Every store here holds ``y[i] = i`` (each sample's index in the base split) and, for
materialized stores, ``x[i] = i`` in every cell, so a batch says which samples it holds
and that its x and y rows belong together. Virtual stores hold window ends instead of
windows; their batches are compared with the windows built directly from the features.
"""

from __future__ import annotations

import collections
import os
import uuid

os.environ.setdefault("KERAS_BACKEND", "torch")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import zarr  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import pipeline  # noqa: E402
from pipeline.errors import CorruptChunkError, IncompleteStoreError, StoreError, StreamError  # noqa: E402
from pipeline.features.windows import windows_numpy_block  # noqa: E402
from pipeline.storage import inspect_store, format_report, write  # noqa: E402
from pipeline.storage import writer as writer_mod  # noqa: E402
from pipeline.streaming import blosc as blosc_mod  # noqa: E402
from pipeline.streaming import chunks as chunks_mod  # noqa: E402
from pipeline.streaming.chunks import ChunkReader, runs_index  # noqa: E402
from pipeline.streaming.plan import Piece  # noqa: E402
from pipeline.streaming.sources import ArraySource  # noqa: E402
from pipeline.streaming.subsets import SubsetSource, piece_runs, subset_layout  # noqa: E402

# Tests keep whole epochs of batches to count them, on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::pipeline.errors.KeptBatchesWarning")

N = 1000
CHUNK = 64
#: Session boundaries in the base split: one session of 10 samples, others long; none
#: aligned with the 64-sample chunks.
SESSIONS = [0, 130, 290, 300, 520, 777, N]
# Virtual windows: size 4 at scales (1, 2) reach 6 steps back.
SIZE, SCALES, HALO = 4, (1, 2), 6


def walk_forward(sessions: list[int]) -> dict[str, np.ndarray]:
    """Train on sessions 0..k, test on session k + 1; plus a ragged fold (every third
    sample of a stretch, and single samples) to exercise chunks of many runs."""
    out = {}
    for k in range(len(sessions) - 2):
        out[f"fold{k}/train"] = np.arange(0, sessions[k + 1])
        out[f"fold{k}/test"] = np.arange(sessions[k + 1], sessions[k + 2])
    n = sessions[-1]
    out["ragged/train"] = np.unique(np.r_[np.arange(100, 400, 3), [5, 63, 64, 700], np.arange(n - 20, n)])
    return out


FOLDS = walk_forward(SESSIONS)


def _materialized(path, folds=FOLDS, n=N, chunk=CHUNK, **kw):
    y = np.arange(n, dtype=np.int64)
    x = np.broadcast_to(y[:, None, None].astype(np.float32), (n, 4, 3)).copy()
    return write(path, {"all": {"x": x, "y": y}}, chunk_samples=chunk, folds=folds, progress=False, **kw)


def _virtual_data():
    """Features ``(T, 3)`` with ``F[t, 0] = t``; window ends inside sessions of steps."""
    steps = [0, 200, 400, 420, 700, 1000, 1300]  # steps of each session
    ends = np.concatenate([np.arange(a + HALO, b) for a, b in zip(steps, steps[1:]) if b - a > HALO])
    rng = np.random.default_rng(5)
    feats = np.c_[np.arange(steps[-1]), rng.standard_normal((steps[-1], 2))].astype(np.float32)
    return feats, ends.astype(np.int64)


def _virtual(path, folds):
    feats, ends = _virtual_data()
    return write(path, {"all": {"ends": ends, "y": np.arange(ends.size, dtype=np.int64)}}, shared={"features": feats},
                 shared_chunk_rows=50, chunk_samples=40, folds=folds, progress=False,
                 attrs={"virtual": {"size": SIZE, "stride": 1, "scales": list(SCALES), "halo": HALO}})


def _virtual_folds():
    n = _virtual_data()[1].size
    return walk_forward([0, 150, 300, 320, 560, 860, n])


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    d = tmp_path_factory.mktemp("folds")
    return {"materialized": (_materialized(d / "m.zarr"), FOLDS),
            "virtual": (_virtual(d / "v.zarr", _virtual_folds()), _virtual_folds())}


def _check_batch(kind, xb, yb):
    """x belongs to y: the same sample's values (materialized) or its window (virtual)."""
    xb, yb = np.asarray(xb), np.asarray(yb)
    if kind == "materialized":
        np.testing.assert_array_equal(xb[:, 0, 0].astype(np.int64), yb)
    else:
        feats, ends = _virtual_data()
        np.testing.assert_array_equal(xb, windows_numpy_block(feats, ends[yb], SIZE, SCALES))


def _count(kind, batches):
    counts = collections.Counter()
    for xb, yb in batches:
        _check_batch(kind, xb, yb)
        counts.update(np.asarray(yb).tolist())
    return counts


def _assert_exactly(counts, index):
    assert sorted(counts) == index.tolist() and set(counts.values()) == {1}


# -- the store ---------------------------------------------------------------------------


def test_folds_are_stored_listed_and_readable(stores):
    path, folds = stores["materialized"]
    ds = pipeline.open(path)
    assert ds.splits == ("all",) and list(ds) == ["all"]  # the folds group is no split
    assert ds.folds == tuple(sorted(folds))
    info = ds.attrs["folds"]
    assert info["base"] == "all" and info["names"] == sorted(folds)
    assert info["counts"] == {k: len(v) for k, v in folds.items()}
    for name, index in folds.items():
        np.testing.assert_array_equal(ds.group[f"folds/{name}"][:], index)
        fold = ds[name]
        assert fold.base == "all" and list(fold) == ["x", "y"]
        np.testing.assert_array_equal(np.asarray(fold["y"]), index)
        assert fold["x"].shape == (len(index), 4, 3)
        np.testing.assert_array_equal(fold["x"][2:5][:, 0, 0], index[2:5])
    with pytest.raises(KeyError, match="folds: fold0/test"):
        ds["fold9/train"]
    text = format_report(inspect_store(path))
    n_folds = len({name.split("/")[0] for name in folds})  # a fold is its train and test sets
    assert n_folds < len(folds) and f"folds: {n_folds}, sample indices into split 'all'" in text
    assert "  fold0/train: 130 samples" in text and "  ragged/train: 124 samples" in text
    assert "folds/" not in text  # the index arrays are no split's arrays


def test_caller_fold_attrs_are_merged(tmp_path):
    path = _materialized(tmp_path / "s.zarr", folds={"f/train": np.arange(10)},
                         attrs={"folds": {"sessions": {"f/train": ["2024-01-02"]}}})
    info = pipeline.open(path).attrs["folds"]
    assert info == {"sessions": {"f/train": ["2024-01-02"]}, "base": "all", "names": ["f/train"],
                    "counts": {"f/train": 10}}


@pytest.mark.parametrize("folds, match", [
    ({"f/train": np.array([3, 2, 5])}, "'f/train': sample indices must be sorted and unique, got 3 then 2"),
    ({"f/train": np.array([1, 2, 2])}, "'f/train': sample indices must be sorted and unique"),
    ({"f/test": np.array([0, N])}, rf"'f/test': sample indices must lie in 0..{N - 1}"),
    ({"f/test": np.array([-1, 4])}, "'f/test': sample indices must lie in"),
    ({"f/test": np.array([0.0, 1.0])}, "'f/test': expected a 1-D array of integer"),
    ({"f/test": np.zeros((2, 2), int)}, "'f/test': expected a 1-D array of integer"),
    ({"f/test": np.array([], int)}, "'f/test': holds no sample"),
    ({"f//test": np.arange(3)}, "expected a name of parts"),
    ({"../x": np.arange(3)}, "expected a name of parts"),
    ({"all": np.arange(3)}, "'all': a split has the same name"),
    ({"f": np.arange(3), "f/test": np.arange(3)}, "'f' is also the folder of other folds"),
])
def test_bad_folds_are_refused_before_anything_is_written(tmp_path, folds, match):
    with pytest.raises(StoreError, match=match):
        _materialized(tmp_path / "s.zarr", folds=folds)
    assert not (tmp_path / "s.zarr").exists()


def test_fold_base_must_be_a_written_split(tmp_path):
    y = np.arange(100)
    with pytest.raises(StoreError, match="fold_base 'all' is not among the splits written \\(train\\)"):
        write(tmp_path / "s.zarr", {"x": y, "y": y}, folds={"f": np.arange(5)}, progress=False)
    assert not (tmp_path / "s.zarr").exists()
    path = write(tmp_path / "s.zarr", {"x": y, "y": y}, folds={"f": np.arange(5, 9)}, fold_base="train",
                 progress=False)
    assert sorted(np.concatenate([b for _, b in pipeline.stream(path, split="f", batch_size=3)])) == [5, 6, 7, 8]


def test_interrupted_fold_write_leaves_the_store_incomplete_and_resumes(tmp_path, monkeypatch):
    real = writer_mod._write_folds
    calls = []

    def crash(group, folds, codec):
        calls.append(1)
        real(group, {k: v for k, v in list(folds.items())[:1]}, codec)  # one fold written, then the crash
        raise OSError("killed")

    monkeypatch.setattr(writer_mod, "_write_folds", crash)
    with pytest.raises(StoreError, match="killed"):
        _materialized(tmp_path / "s.zarr", fingerprint="f")
    assert calls
    with pytest.raises(IncompleteStoreError):
        pipeline.open(tmp_path / "s.zarr")
    with pytest.raises(IncompleteStoreError):
        pipeline.stream(str(tmp_path / "s.zarr"), split="fold0/train", batch_size=8)
    monkeypatch.setattr(writer_mod, "_write_folds", real)
    _materialized(tmp_path / "s.zarr", fingerprint="f")
    ds = pipeline.open(tmp_path / "s.zarr")
    assert ds.folds == tuple(sorted(FOLDS))
    for name, index in FOLDS.items():
        np.testing.assert_array_equal(ds[name].index, index)


# -- streaming ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["materialized", "virtual"])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_fold_streams_exactly_its_samples_once(stores, kind, world):
    path, folds = stores[kind]
    for name, index in folds.items():
        counts = collections.Counter()
        lengths = set()
        for rank in range(world):
            s = pipeline.stream(path, split=name, batch_size=16, seed=world, buffer_chunks=2, rank=rank,
                                world_size=world)
            batches = list(s)
            assert len(batches) == len(s)
            lengths.add(len(s))
            counts += _count(kind, batches)
        assert len(lengths) == 1
        _assert_exactly(counts, index)


@pytest.mark.parametrize("kind", ["materialized", "virtual"])
@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_and_dataloader_workers_share_a_fold_exactly_once(stores, kind, workers, world):
    path, folds = stores[kind]
    for name in ("fold2/train", "ragged/train"):
        counts = collections.Counter()
        per_rank = []
        for rank in range(world):
            s = pipeline.stream(path, split=name, batch_size=24, rank=rank, world_size=world, seed=1)
            batches = [(xb.numpy(), yb.numpy()) for xb, yb in DataLoader(s.torch(), batch_size=None,
                                                                          num_workers=workers)]
            per_rank.append(len(batches))
            assert len(batches) == len(s)
            counts += _count(kind, batches)
        assert len(set(per_rank)) == 1
        _assert_exactly(counts, folds[name])


def test_epochs_reshuffle_a_fold_and_keep_its_samples(stores):
    path, folds = stores["materialized"]
    s = pipeline.stream(path, split="fold3/train", batch_size=32, seed=0)
    orders = []
    for epoch in range(2):
        s.set_epoch(epoch)
        orders.append(np.concatenate([yb for _, yb in s]))
    assert not np.array_equal(orders[0], orders[1])
    for order in orders:
        np.testing.assert_array_equal(np.sort(order), folds["fold3/train"])
    assert s.quality()["spearman_position_vs_index"] < 0.9


@pytest.mark.parametrize("kind", ["materialized", "virtual"])
@pytest.mark.parametrize("world", [1, 2])
def test_unshuffled_fold_is_served_in_index_order(stores, kind, world):
    path, folds = stores[kind]
    for name in ("fold1/test", "ragged/train", "fold4/train"):
        served = []
        for rank in range(world):
            s = pipeline.stream(path, split=name, batch_size=10, shuffle=False, rank=rank, world_size=world)
            batches = list(s)
            _count(kind, batches)
            served += [yb for _, yb in batches]
        np.testing.assert_array_equal(np.concatenate(served), folds[name])


@pytest.mark.parametrize("kind", ["materialized", "virtual"])
def test_resume_mid_epoch_yields_exactly_the_rest(stores, kind):
    path, folds = stores[kind]
    kw = dict(split="ragged/train", batch_size=8, seed=4, buffer_chunks=2, rank=1, world_size=2)
    ref = pipeline.stream(path, **kw)
    ref.set_epoch(3)
    full = [yb.copy() for _, yb in ref]
    for consumed in (1, 5, len(full) - 1):
        s = pipeline.stream(path, **kw)
        s.set_epoch(3)
        it = iter(s)
        for _ in range(consumed):
            next(it)
        state = s.state_dict()
        it.close()
        resumed = pipeline.stream(path, **kw)
        resumed.load_state_dict(state)
        rest = list(resumed)
        _count(kind, rest)
        assert len(rest) == len(full) - consumed
        for a, (_, b) in zip(full[consumed:], rest):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_through_the_dataloader_yields_exactly_the_remaining_samples(stores, workers):
    path, folds = stores["materialized"]
    kw = dict(split="fold3/train", batch_size=16, seed=3, buffer_chunks=2, rank=0, world_size=2)
    ref = pipeline.stream(path, **kw)
    ref.set_epoch(1)
    full = [yb.numpy().copy() for _, yb in DataLoader(ref.torch(), batch_size=None, num_workers=workers)]
    for consumed in (1, 4, len(full) - 1):
        s = pipeline.stream(path, **kw)
        s.load_state_dict({"epoch": 1, "batches_served": consumed})
        rest = [yb.numpy().copy() for _, yb in DataLoader(s.torch(), batch_size=None, num_workers=workers)]
        assert len(rest) == len(full) - consumed
        assert sorted(map(tuple, map(list, rest))) == sorted(map(tuple, map(list, full[consumed:])))


def test_keras_dataset_serves_a_fold_once_per_epoch(stores):
    pytest.importorskip("keras")
    path, folds = stores["materialized"]
    ds = pipeline.stream(path, split="fold1/train", batch_size=40, seed=0).keras()
    for _ in range(2):
        ids = np.concatenate([ds[i][1] for i in range(len(ds))])
        np.testing.assert_array_equal(np.sort(ids), folds["fold1/train"])
        ds.on_epoch_end()


def test_verify_checks_the_base_chunks_a_fold_reads(tmp_path):
    path = _materialized(tmp_path / "s.zarr", codec="none")
    index = FOLDS["fold0/test"]  # samples 130..289: chunks 2..4
    for name in ("fold0/test", "ragged/train"):
        got = np.concatenate([yb for _, yb in pipeline.stream(path, split=name, batch_size=50, verify=True)])
        np.testing.assert_array_equal(np.sort(got), FOLDS[name])
    # One value of chunk 3 of x changed: it still decodes, only its checksum tells.
    chunk_file = tmp_path / "s.zarr" / "all" / "x" / "c" / "3" / "0" / "0"
    raw = bytearray(chunk_file.read_bytes())
    raw[:4] = np.float32(-7).tobytes()
    chunk_file.write_bytes(bytes(raw))
    with pytest.raises(CorruptChunkError, match="all/x chunk 3: checksum mismatch"):
        list(pipeline.stream(path, split="fold0/test", batch_size=50, verify=True))
    got = np.concatenate([yb for _, yb in pipeline.stream(path, split="fold0/test", batch_size=50)])
    np.testing.assert_array_equal(np.sort(got), index)  # without verify, nothing checks
    # A fold that never reads chunk 3 is not affected.
    got = np.concatenate([yb for _, yb in pipeline.stream(path, split="fold4/test", batch_size=50, verify=True)])
    np.testing.assert_array_equal(np.sort(got), FOLDS["fold4/test"])


def test_unknown_names_list_the_splits_and_folds(stores, tmp_path):
    path, _ = stores["materialized"]
    for name in ("fold9/train", "folds", "folds/fold0/train", "train"):
        with pytest.raises(StreamError, match=r"no split '.*'; splits: all; folds: fold0/test, fold0/train"):
            pipeline.stream(path, split=name, batch_size=8)
    y = np.arange(50)
    plain = write(tmp_path / "plain.zarr", {"x": y, "y": y}, progress=False)
    with pytest.raises(StreamError, match="no split 'fold0/train'; splits: train; folds: none"):
        pipeline.stream(plain, split="fold0/train", batch_size=8)


def test_damaged_fold_index_is_refused(tmp_path):
    path = _materialized(tmp_path / "s.zarr", folds={"f/train": np.arange(10, 40)})
    group = zarr.open_group(str(path), mode="r+")
    group["folds/f/train"][3] = 2  # no longer sorted
    with pytest.raises(StoreError, match="fold 'f/train'.*sorted and unique.*damaged"):
        pipeline.stream(path, split="f/train", batch_size=8)


# -- arithmetic and reads, over random folds ----------------------------------------------


@st.composite
def run_unions(draw, max_n=600):
    """A base length, chunk lengths over it, and a sorted union of runs inside it."""
    n = draw(st.integers(1, max_n))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=12))) if n > 1 else []
    lengths = np.diff([0, *cuts, n]).tolist()
    starts = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=8)))
    index = np.unique(np.concatenate([np.arange(a, min(n, a + draw(st.integers(1, 80)))) for a in starts]))
    return n, lengths, index


@given(run_unions(), st.data())
@settings(max_examples=200, deadline=None)
def test_layout_pieces_give_back_the_index(case, data):
    n, lengths, index = case
    layout = subset_layout(index, lengths)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    assert sum(layout.lengths) == index.size and min(layout.lengths) > 0
    got = []
    for c, length in enumerate(layout.lengths):
        cut = sorted(data.draw(st.sets(st.integers(1, max(1, length - 1)), max_size=3)) if length > 1 else [])
        for lo, hi in zip([0, *cut], [*cut, length]):
            starts, stops = piece_runs(layout, c, lo, hi)
            assert (stops > starts).all() and (starts[1:] > stops[:-1]).all()  # disjoint, increasing runs
            base = int(layout.chunks[c])
            assert stops.max() <= lengths[base]
            got.append(bounds[base] + runs_index(starts, stops))
            assert got[-1].size == hi - lo
    np.testing.assert_array_equal(np.concatenate(got), index)


@given(run_unions(), st.integers(2, 40), st.integers(1, 3), st.integers(1, 3), st.booleans(), st.data())
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_folds_stream_exactly_once(tmp_path, case, batch, buffer, world, sharded, data):
    """Real stores with random chunk sizes and folds of random runs: every rank's batches
    together hold the fold's samples once, x aligned with y; a resume mid-epoch serves
    exactly the rest."""
    n, _, index = case
    # Not much under 24 chunks: each write unit is a task and a marker, and tiny ones
    # only slow the test down (the layout test covers any chunking).
    chunk = data.draw(st.integers(max(1, n // 24), max(1, n // 2)))
    seed = data.draw(st.integers(0, 3))
    path = str(tmp_path / f"{uuid.uuid4().hex}.zarr")
    _materialized(path, folds={"f/x": index}, n=n, chunk=chunk, shard_chunks=2 if sharded else None)
    if index.size < world:
        with pytest.raises(StreamError, match="cannot be shared"):
            pipeline.stream(path, split="f/x", batch_size=batch, world_size=world, rank=0)
        return
    counts = collections.Counter()
    for rank in range(world):
        s = pipeline.stream(path, split="f/x", batch_size=batch, buffer_chunks=buffer, rank=rank, world_size=world,
                            seed=seed)
        batches = [(xb.copy(), yb.copy()) for xb, yb in s]
        assert len(batches) == len(s)
        counts += _count("materialized", batches)
        if len(batches) > 1:
            k = data.draw(st.integers(1, len(batches) - 1))
            resumed = pipeline.stream(path, split="f/x", batch_size=batch, buffer_chunks=buffer, rank=rank,
                                      world_size=world, seed=seed)
            resumed.load_state_dict({"epoch": 0, "batches_served": k})
            rest = [yb.copy() for _, yb in resumed]
            assert [b.tolist() for b in rest] == [yb.tolist() for _, yb in batches[k:]]
    _assert_exactly(counts, index)


@pytest.mark.parametrize("blockwise_runs", [0, 4, 100])
@given(case=run_unions(max_n=200), seed=st.integers(0, 100))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_scatter_runs_equals_fancy_indexing(tmp_path_factory, monkeypatch, blockwise_runs, case, seed):
    """ChunkReader.scatter_runs, decoded by blocks run by run (up to BLOCKWISE_RUNS runs)
    or whole and gathered, puts exactly the runs' rows at their places."""
    monkeypatch.setattr(blosc_mod, "BLOCKWISE_ABOVE", 0)  # the block path for small chunks too
    monkeypatch.setattr(chunks_mod, "BLOCKWISE_RUNS", blockwise_runs)
    n, _, index = case
    d = tmp_path_factory.mktemp("runs")
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n, 5, 3)).astype(np.float32)
    arr = zarr.create_array(str(d / "a.zarr"), shape=data.shape, chunks=data.shape, dtype="float32",
                            compressors=[zarr.codecs.BloscCodec(cname="lz4", shuffle="shuffle", blocksize=256)])
    arr[:] = data
    reader = ChunkReader(arr, ("a.zarr", "all", "x"))
    layout = subset_layout(index, [n])
    starts, stops = piece_runs(layout, 0, 0, index.size)
    out = np.full((index.size + 3, 5, 3), -1, np.float32)
    rows = rng.permutation(index.size + 3)[: index.size]
    reader.scatter_runs(0, starts, stops, out, rows)
    want = np.full_like(out, -1)
    want[rows] = data[index]
    np.testing.assert_array_equal(out, want)


def test_subset_of_arrays_in_memory(tmp_path):
    """SubsetSource over any source: arrays in memory, read whole and indexed."""
    y = np.arange(10_000)
    base = ArraySource({"x": y * 2, "y": y}, ("x", "y"))
    index = np.r_[5:20, 4090:4100, 9000:9003]
    src = SubsetSource(base, index)
    assert src.lengths == (21, 4, 3)  # of the chunks of 4096 samples
    out = np.zeros(21, np.int64)
    src.scatter("y", Piece(0, 10, 21), out, np.arange(11)[::-1])
    np.testing.assert_array_equal(out[:11][::-1], index[10:21])
    np.testing.assert_array_equal(src.read("x", 1), index[21:25] * 2)
    np.testing.assert_array_equal(src.read("x", 2), index[25:] * 2)
    with pytest.raises(StreamError, match="sorted and unique"):
        SubsetSource(base, [3, 3])
