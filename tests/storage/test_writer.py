"""Writes: aligned to the write unit for any dask chunking, splits, codecs, conflicts,
resume after a crash, zip packing, incomplete stores, provenance."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import zipfile

import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline
from pipeline.errors import IncompleteStoreError, StoreConflictError, StoreError
from pipeline.storage import CodecSpec, write
from pipeline.storage.layout import last_of_blocks, task_block, time_split_ranges, unit_chunks, units_aligned
from pipeline.storage.writer import written_units
from tests.conftest import wait_until


@st.composite
def chunkings(draw):
    n = draw(st.integers(1, 400))
    chunks, left = [], n
    while left:
        c = draw(st.integers(1, left))
        chunks.append(c)
        left -= c
    return n, tuple(chunks)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=chunkings(), chunk=st.integers(1, 90), shard=st.sampled_from([None, 1, 2, 3]))
def test_read_back_equals_input_for_any_dask_chunking_and_shards(tmp_path_factory, case, chunk, shard):
    n, chunks = case
    x = np.random.default_rng(n).standard_normal((n, 3, 2)).astype(np.float32)
    y = np.arange(n)
    path = tmp_path_factory.mktemp("w") / "s.zarr"
    write(path, {"x": da.from_array(x, chunks=(chunks, 3, 2)), "y": da.from_array(y, chunks=(chunks,))},
          chunk_samples=chunk, shard_chunks=shard, progress=False)
    ds = pipeline.open(path)
    np.testing.assert_array_equal(ds["train"]["x"][:], x)
    np.testing.assert_array_equal(ds["train"]["y"][:], y)
    assert ds["train"]["x"].chunks[0] == min(chunk, n)
    assert written_units(ds.group, "train").all()


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 10_000), unit=st.integers(1, 500))
def test_unit_chunks_are_aligned(n, unit):
    chunks = unit_chunks(n, unit)
    assert sum(chunks) == n and units_aligned(chunks, unit)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 10_000), unit=st.integers(1, 500), sample_bytes=st.integers(1, 10_000),
       budget=st.integers(1, 4_000_000))
def test_task_blocks_are_whole_units_within_the_budget(n, unit, sample_bytes, budget):
    """A write task's block: whole units (a unit is never split between two tasks), as
    many as fit in the budget, at least one."""
    block = task_block(unit, sample_bytes, budget)
    assert block % unit == 0 and block >= unit
    assert block * sample_bytes <= budget or block == unit
    assert (block + unit) * sample_bytes > budget  # one more unit would not fit
    starts = np.cumsum((0,) + unit_chunks(n, block))[:-1]
    assert all(s % unit == 0 for s in starts)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(50, 5000), gap=st.integers(0, 10),
       fr=st.lists(st.floats(0.1, 0.5), min_size=1, max_size=3))
def test_time_split_ranges_are_ordered_disjoint_and_gapped(n, gap, fr):
    fractions = {f"s{i}": f / max(1.0, sum(fr)) for i, f in enumerate(fr)}
    ranges = list(time_split_ranges(n, fractions, gap).values())
    for (a0, a1), (b0, b1) in zip(ranges, ranges[1:]):
        assert a0 < a1 and b0 - a1 == gap and b1 <= n


def test_time_and_random_splits(tmp_path):
    x = np.arange(100, dtype=np.float32)[:, None]
    write(tmp_path / "t.zarr", {"x": x, "y": x[:, 0]}, splits={"train": 0.8, "val": 0.2}, gap=5, progress=False)
    ds = pipeline.open(tmp_path / "t.zarr")
    assert ds.splits == ("train", "val")
    np.testing.assert_array_equal(ds["train"]["y"][:], np.arange(76))
    np.testing.assert_array_equal(ds["val"]["y"][:], np.arange(81, 100))
    write(tmp_path / "r.zarr", {"x": x, "y": x[:, 0]}, splits={"a": 0.5, "b": 0.5}, split_by="random", seed=1,
          progress=False)
    r = pipeline.open(tmp_path / "r.zarr")
    both = np.concatenate([r["a"]["y"][:], r["b"]["y"][:]])
    assert sorted(both.tolist()) == list(range(100)) and not (r["a"]["y"][:] == np.arange(50)).all()


def _steps_per_split(path, features):
    """The time steps every split's windows hold (column 0 of each scale holds the step)."""
    ds = pipeline.open(path)
    return {name: set(np.unique(ds[name]["x"][:][:, :, ::features]).astype(int).tolist()) for name in ds.splits}


@pytest.mark.parametrize("size, stride, scales", [(8, 2, (1, 3)), (5, 1, (1,)), (4, 3, (2, 4)), (6, 7, (1,))])
def test_windows_split_by_time_share_no_step_without_a_gap_argument(tmp_path, size, stride, scales):
    steps = np.arange(300, dtype=np.float32)
    series = np.c_[steps, -steps]
    w = pipeline.windows(series, size=size, stride=stride, scales=scales)
    y = np.arange(w.shape[0])  # labels of the windows themselves: they read nothing after a window
    splits = {"train": .6, "val": .2, "test": .2}
    with pytest.raises(StoreError, match=r"not how many steps the labels read after a window's last step; pass "
                                         r"horizon="):
        write(tmp_path / "unknown.zarr", {"x": w, "y": y}, splits=splits, progress=False)
    assert not (tmp_path / "unknown.zarr").exists()
    path = write(tmp_path / "w.zarr", {"x": w, "y": y}, splits=splits, horizon=0, chunk_samples=16, progress=False)
    halo = (size - 1) * max(scales)
    assert pipeline.open(path).attrs["split_gap_samples"] == halo // stride
    seen = _steps_per_split(path, 2)
    assert not seen["train"] & seen["val"] and not seen["val"] & seen["test"]
    # The same windows without the gap share steps whenever windows overlap: the check above can fail.
    leaky = write(tmp_path / "leaky.zarr", {"x": w, "y": y}, splits=splits, gap=0, chunk_samples=16, progress=False)
    assert pipeline.open(leaky).attrs["split_gap_samples"] == 0
    seen = _steps_per_split(leaky, 2)
    assert bool(seen["train"] & seen["val"]) == (halo >= stride)


def test_gap_adds_the_label_horizon_and_feature_lookback_the_attrs_give(tmp_path):
    w = pipeline.windows(np.zeros((200, 2), np.float32), size=4, stride=2, scales=(1, 2))  # halo 6
    w.attrs["windows"]["horizon"] = 5
    y = da.zeros(w.shape[0], chunks=20)
    y.attrs = {"lookback": 4}
    path = write(tmp_path / "g.zarr", {"x": w, "y": y}, splits={"train": .5, "val": .5}, progress=False)
    assert pipeline.open(path).attrs["split_gap_samples"] == (6 + 5 + 4) // 2
    n = w.shape[0]
    ds = pipeline.open(path)
    assert ds["train"]["y"].shape[0] + ds["val"]["y"].shape[0] == n - 7
    # horizon= given to write takes the place of the attrs' horizon.
    again = write(tmp_path / "h.zarr", {"x": w, "y": y}, splits={"train": .5, "val": .5}, horizon=9, progress=False)
    assert pipeline.open(again).attrs["split_gap_samples"] == (6 + 9 + 4) // 2


def test_time_splits_without_geometry_or_gap_are_refused_before_writing(tmp_path):
    x = np.arange(100, dtype=np.float32)[:, None]
    w = pipeline.windows(np.zeros((100, 2), np.float32), size=4)
    for arrays in ({"x": x, "y": x[:, 0]}, {"x": w[:50], "y": np.arange(50)}):  # a slice loses the geometry
        with pytest.raises(StoreError, match=r"gap between splits cannot be known.*pass gap=.*gap=0 when samples"):
            write(tmp_path / "t.zarr", arrays, splits={"train": .8, "val": .2}, progress=False)
        assert not (tmp_path / "t.zarr").exists()
    with pytest.raises(StoreError, match="gap must be a number of samples, 0 or more, got -1"):
        write(tmp_path / "t.zarr", {"x": x}, splits={"train": .8, "val": .2}, gap=-1, progress=False)
    # Explicit gap=0, random splits and one split need no geometry; only time splits record a gap.
    write(tmp_path / "z.zarr", {"x": x}, splits={"train": .8, "val": .2}, gap=0, progress=False)
    assert pipeline.open(tmp_path / "z.zarr").attrs["split_gap_samples"] == 0
    np.testing.assert_array_equal(pipeline.open(tmp_path / "z.zarr")["val"]["x"][:, 0], np.arange(80, 100))
    write(tmp_path / "r.zarr", {"x": x}, splits={"a": .5, "b": .5}, split_by="random", progress=False)
    write(tmp_path / "one.zarr", {"x": x}, progress=False)
    for name in ("r.zarr", "one.zarr"):
        assert "split_gap_samples" not in pipeline.open(tmp_path / name).attrs


@pytest.mark.parametrize(
    ("codec", "name"),
    [("blosc-lz4", "blosc"), ("zstd", "zstd"), ("none", None), ({"name": "blosc", "cname": "zstd", "shuffle": "bitshuffle"}, "blosc")],
)
def test_codecs_reach_the_array_metadata(tmp_path, codec, name):
    x = np.zeros((64, 8), np.float32)
    write(tmp_path / "c.zarr", {"x": x, "y": x[:, 0]}, codec=codec, progress=False)
    codecs = [c["name"] for c in zarr.open_array(str(tmp_path / "c.zarr" / "train" / "x")).metadata.to_dict()["codecs"]]
    assert codecs == ["bytes"] + ([name] if name else [])
    assert CodecSpec.from_mapping(codec, "codec").name == (name or "none")


def test_unequal_lengths_and_unknown_codecs_fail_before_writing(tmp_path):
    with pytest.raises(StoreError, match="same length"):
        write(tmp_path / "u.zarr", {"x": np.zeros(5), "y": np.zeros(6)}, progress=False)
    assert not (tmp_path / "u.zarr").exists()
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="codec.cname"):
        CodecSpec.from_mapping({"cname": "snappyy"}, "codec")
    # zarr refused an object array only after the store's metadata was written (naming
    # no array), and the corrected rewrite was then refused as another write's store.
    import dask.array as da

    for y in (np.array([{"a": 1}] * 5, dtype=object), da.from_array(np.array([None] * 5, dtype=object), chunks=2)):
        with pytest.raises(StoreError, match=r"write: array 'y' has dtype object \(Python objects\), which zarr does "
                                              r"not store"):
            write(tmp_path / "o.zarr", {"x": np.zeros((5, 2)), "y": y}, progress=False)
        assert not (tmp_path / "o.zarr").exists()
    write(tmp_path / "o.zarr", {"x": np.zeros((5, 2)), "y": np.arange(5)}, progress=False)


def test_another_fingerprint_is_refused_and_nothing_changes(tmp_path):
    x = np.arange(40, dtype=np.float32)[:, None]
    write(tmp_path / "f.zarr", {"x": x, "y": x[:, 0]}, fingerprint="aaa", progress=False)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "f.zarr").rglob("*"))
    with pytest.raises(StoreConflictError, match="aaa.*bbb"):
        write(tmp_path / "f.zarr", {"x": x + 1, "y": x[:, 0]}, fingerprint="bbb", progress=False)
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "f.zarr").rglob("*")) == before
    np.testing.assert_array_equal(pipeline.open(tmp_path / "f.zarr")["train"]["x"][:], x)
    write(tmp_path / "f.zarr", {"x": x + 1, "y": x[:, 0]}, fingerprint="bbb", overwrite=True, progress=False)
    np.testing.assert_array_equal(pipeline.open(tmp_path / "f.zarr")["train"]["x"][:], x + 1)


def test_a_refused_write_of_other_arrays_or_options_says_what_differs(tmp_path):
    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    path = tmp_path / "d.zarr"
    write(path, {"x": x}, progress=False)
    cases = [
        (dict(arrays={"x": x}, chunk_samples=3), r"What differs: train/x: 10 samples per chunk in the store, "
                                                  r"chunk_samples=3 here$"),
        (dict(arrays={"x": x, "y": np.arange(10)}), r"What differs: split 'train': the store's arrays \['x'\], this "
                                                    r"write's \['x', 'y'\]$"),
        (dict(arrays={"x": x[:, :2]}), r"What differs: train/x: the store's \(10, 4\) float32, this write's "
                                       r"\(10, 2\) float32$"),
        (dict(arrays={"x": x}, codec="none"), r"What differs: codec: the store's .*, this write's .*none"),
        (dict(arrays={"x": x + 1}), r"What differs: the arrays' values \(their dask names differ"),
        (dict(arrays={"train": {"x": x[:5]}, "val": {"x": x[5:]}}), r"What differs: splits: the store's \['train'\], "
                                                                    r"this write's \['train', 'val'\]"),
    ]
    for kwargs, said in cases:
        with pytest.raises(StoreConflictError, match=r"written from fingerprint write-\w+, the current run's is "
                                                     r"write-\w+; .*overwrite=True in pipeline.write\). " + said):
            write(path, progress=False, **kwargs)
    np.testing.assert_array_equal(pipeline.open(path)["train"]["x"][:], x)  # kept


@pytest.mark.parametrize("name", ["f.zarr", "f.zarr.zip"])
def test_other_arrays_to_a_written_path_without_a_fingerprint_are_refused_and_the_same_are_kept(tmp_path, name):
    """A notebook cell rerun with changed arrays: the write used to return at once and
    keep the old store (both fingerprints None), silently."""
    x = np.arange(250 * 4, dtype=np.float32).reshape(250, 4)
    target = tmp_path / name
    write(target, {"x": x, "y": x[:, 0]}, progress=False)
    before = {p: p.read_bytes() for p in sorted(target.rglob("*")) if p.is_file()} if target.is_dir() else \
        target.read_bytes()
    with pytest.raises(StoreConflictError, match="overwrite=True"):
        write(target, {"x": -x[:100], "y": -x[:100, 0]}, progress=False)
    with pytest.raises(StoreConflictError):  # the same arrays, other options: another store
        write(target, {"x": x, "y": x[:, 0]}, codec="zstd", progress=False)
    after = {p: p.read_bytes() for p in sorted(target.rglob("*")) if p.is_file()} if target.is_dir() else \
        target.read_bytes()
    assert after == before
    write(target, {"x": x.copy(), "y": x[:, 0].copy()}, progress=False)  # equal bytes: the same write, kept
    np.testing.assert_array_equal(pipeline.open(target)["train"]["x"][:], x)
    write(target, {"x": -x[:100], "y": -x[:100, 0]}, overwrite=True, progress=False)
    np.testing.assert_array_equal(pipeline.open(target)["train"]["x"][:], -x[:100])


@pytest.mark.parametrize(
    ("splits", "message"),
    [
        ({"train": 0.5, "val": 0.7}, r"sum to 1.2; they must sum to at most 1"),
        ({"train": "0.8", "val": 0.2}, r"split 'train': expected a fraction, a number in \(0, 1\], got '0.8'"),
        ({"train": {"until": "2026-01-08"}, "test": {}}, r"split 'train'.*is a date split"),
        ({"train": 1.2, "val": -0.2}, r"split 'train': expected a fraction in \(0, 1\], got 1.2"),
        ({"train": True}, r"expected a fraction, a number"),
        ([0.8, 0.2], r"splits must map split names to fractions"),
    ],
)
def test_split_fractions_the_arithmetic_cannot_take_are_refused_before_writing(tmp_path, splits, message):
    x = np.arange(400, dtype=np.float32)[:, None]
    with pytest.raises(StoreError, match=message):
        write(tmp_path / "s.zarr", {"x": x, "y": x[:, 0]}, splits=splits, gap=0, progress=False)
    with pytest.raises(StoreError, match=message):  # the date split is named before the missing gap
        write(tmp_path / "s.zarr", {"x": x, "y": x[:, 0]}, splits=splits, progress=False)
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_directory_that_is_not_a_store_is_refused_and_kept_whole(tmp_path, overwrite):
    victim = tmp_path / "notes"
    (victim / "sub").mkdir(parents=True)
    (victim / "thesis.txt").write_text("my notes")
    (victim / "sub" / "day.parquet").write_bytes(b"PAR1")
    x = np.arange(40, dtype=np.float32)[:, None]
    with pytest.raises(StoreConflictError, match=r"notes: a directory that is not a zarr store .* 2 entries"):
        write(victim, {"x": x, "y": x[:, 0]}, overwrite=overwrite, progress=False)
    assert sorted(str(p.relative_to(victim)) for p in victim.rglob("*")) == ["sub", "sub/day.parquet", "thesis.txt"]
    assert (victim / "thesis.txt").read_text() == "my notes"


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_zarr_store_another_tool_wrote_is_refused_and_kept(tmp_path, overwrite):
    theirs = zarr.open_group(tmp_path / "theirs.zarr", mode="w")
    theirs.create_array("a", data=np.arange(10.0))
    x = np.arange(40, dtype=np.float32)[:, None]
    with pytest.raises(StoreConflictError, match="theirs.zarr: a zarr store that pipeline did not write"):
        write(tmp_path / "theirs.zarr", {"x": x, "y": x[:, 0]}, overwrite=overwrite, progress=False)
    np.testing.assert_array_equal(zarr.open_group(tmp_path / "theirs.zarr", mode="r")["a"][:], np.arange(10.0))


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_zarr_2_store_and_an_icechunk_repository_are_refused_by_name_and_kept(tmp_path, overwrite):
    import icechunk

    v2 = zarr.open_group(tmp_path / "xr.zarr", mode="w", zarr_format=2)
    v2.create_array("a", data=np.arange(10.0))
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    session = repo.writable_session("main")
    zarr.open_group(session.store, mode="w").create_array("a", data=np.arange(10.0))
    session.commit("a")
    x = np.arange(40, dtype=np.float32)[:, None]
    for name, what in (("xr.zarr", r"a zarr format 2 store \(.zgroup/.zarray/.zattrs\) that pipeline did not "
                                    "write"), ("repo", r"an icechunk repository \(refs/, snapshots/\)")):
        before = {p: p.read_bytes() for p in sorted((tmp_path / name).rglob("*")) if p.is_file()}
        with pytest.raises(StoreConflictError, match=f"{name}: {what}; a store written there would delete"):
            write(tmp_path / name, {"x": x, "y": x[:, 0]}, overwrite=overwrite, progress=False)
        assert {p: p.read_bytes() for p in sorted((tmp_path / name).rglob("*")) if p.is_file()} == before


@pytest.mark.parametrize("overwrite", [False, True])
def test_a_zip_path_holding_anything_but_a_pipeline_zip_is_refused_and_kept(tmp_path, overwrite):
    x = np.arange(40, dtype=np.float32)[:, None]
    arrays = {"x": x, "y": x[:, 0]}
    (tmp_path / "notes.zarr.zip").write_text("my notes")
    with pytest.raises(StoreConflictError, match="notes.zarr.zip: a file that is not a zip store pipeline wrote"):
        write(tmp_path / "notes.zarr.zip", arrays, overwrite=overwrite, progress=False)
    assert (tmp_path / "notes.zarr.zip").read_text() == "my notes"
    with zarr.storage.ZipStore(tmp_path / "theirs.zarr.zip", mode="w") as zs:
        zarr.open_group(zs, mode="w").create_array("a", data=np.arange(10.0))
    before = (tmp_path / "theirs.zarr.zip").read_bytes()
    with pytest.raises(StoreConflictError, match="theirs.zarr.zip: a zarr store that pipeline did not write"):
        write(tmp_path / "theirs.zarr.zip", arrays, overwrite=overwrite, progress=False)
    assert (tmp_path / "theirs.zarr.zip").read_bytes() == before
    (tmp_path / "dir.zarr.zip").mkdir()
    with pytest.raises(StoreError, match="dir.zarr.zip: a directory, where a zip store goes"):
        write(tmp_path / "dir.zarr.zip", arrays, overwrite=overwrite, progress=False)
    write(tmp_path / "ours.zarr.zip", arrays, fingerprint="aaa", progress=False)
    if overwrite:  # a zip this package wrote is replaced
        write(tmp_path / "ours.zarr.zip", {"x": x + 1, "y": x[:, 0]}, fingerprint="bbb", overwrite=True, progress=False)
        np.testing.assert_array_equal(pipeline.open(tmp_path / "ours.zarr.zip")["train"]["x"][:], x + 1)
    else:
        with pytest.raises(StoreConflictError, match="fingerprint aaa, the current run's is bbb"):
            write(tmp_path / "ours.zarr.zip", arrays, fingerprint="bbb", progress=False)


def test_a_home_relative_path_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    x = np.arange(40, dtype=np.float32)[:, None]
    assert write("~/h.zarr", {"x": x, "y": x[:, 0]}, progress=False) == str(tmp_path / "home" / "h.zarr")
    assert not (tmp_path / "~").exists()


def test_an_empty_directory_takes_a_store_and_a_relative_path_is_made_absolute(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    x = np.arange(40, dtype=np.float32)[:, None]
    written = write("empty", {"x": x, "y": x[:, 0]}, progress=False)
    assert written == str(tmp_path / "empty")
    np.testing.assert_array_equal(pipeline.open(tmp_path / "empty")["train"]["x"][:], x)


def test_a_file_as_target_is_refused(tmp_path):
    (tmp_path / "f.zarr").write_text("not a store")
    x = np.arange(4, dtype=np.float32)[:, None]
    with pytest.raises(StoreError, match="f.zarr: exists and is not a directory"):
        write(tmp_path / "f.zarr", {"x": x, "y": x[:, 0]}, progress=False)
    assert (tmp_path / "f.zarr").read_text() == "not a store"


def unmark(path, split: str, units: list[int]) -> None:
    g = zarr.open_group(str(path), mode="r+")
    meta = dict(g.attrs["pipeline"])
    meta["complete"] = False
    g.attrs["pipeline"] = meta
    table = g[f"{split}/_written"]
    for u in units:
        table[u] = 0


def test_resume_rewrites_exactly_the_units_without_a_marker(tmp_path):
    x = np.random.default_rng(0).standard_normal((500, 6)).astype(np.float32)
    path = tmp_path / "r.zarr"
    write(path, {"x": x, "y": np.arange(500)}, chunk_samples=50, fingerprint="f", progress=False)
    # A crash: chunk 3 torn mid-write, chunk 7 never written, neither marked done.
    (path / "train" / "x" / "c" / "3" / "0").write_bytes(b"torn")
    (path / "train" / "x" / "c" / "7" / "0").unlink()
    unmark(path, "train", [3, 7])
    with pytest.raises(IncompleteStoreError):
        pipeline.open(path)
    assert pipeline.open(path, partial=True).attrs["complete"] is False
    mtime = (path / "train" / "x" / "c" / "0" / "0").stat().st_mtime_ns
    write(path, {"x": x, "y": np.arange(500)}, chunk_samples=50, fingerprint="f", progress=False)
    np.testing.assert_array_equal(pipeline.open(path)["train"]["x"][:], x)
    assert (path / "train" / "x" / "c" / "0" / "0").stat().st_mtime_ns == mtime  # done units untouched


@settings(max_examples=200, deadline=None)
@given(done=st.lists(st.booleans(), max_size=60), per_block=st.integers(1, 12))
def test_last_of_blocks_is_the_last_unit_each_block_writes(done, per_block):
    todo = np.flatnonzero(~np.array(done, dtype=bool))
    blocks = sorted({int(u) // per_block for u in todo})
    expected = [max(int(u) for u in todo if u // per_block == b) for b in blocks]
    assert last_of_blocks(todo, per_block).tolist() == expected


def test_units_reported_but_not_readable_here_fail_the_write(tmp_path, monkeypatch):
    """A task that reports its units written where this process cannot read them (a
    remote worker's own disk at the same path) leaves the store incomplete, and the
    error names the units."""
    import pipeline.storage.writer as writer

    real = writer._write_units

    def elsewhere(location, options, split, units, start, blocks, token):
        if any(u == 3 for u, _, _ in units):  # this block's units land on another disk
            return len(units)
        return real(location, options, split, units, start, blocks, token)

    monkeypatch.setattr(writer, "_write_units", elsewhere)
    x = np.random.default_rng(0).standard_normal((500, 6)).astype(np.float32)
    arrays = {"x": da.from_array(x, chunks=(100, 6)), "y": da.arange(500, chunks=100)}
    path = tmp_path / "e.zarr"
    with pytest.raises(StoreError, match=r"split 'train': write units \[2, 3\] were not written"):
        write(path, arrays, chunk_samples=50, progress=False)
    with pytest.raises(IncompleteStoreError):
        pipeline.open(path)
    monkeypatch.setattr(writer, "_write_units", real)
    write(path, arrays, chunk_samples=50, progress=False)  # the same write, resumed, completes it
    np.testing.assert_array_equal(pipeline.open(path)["train"]["x"][:], x)


def test_sigkill_halfway_then_rerun_equals_an_uninterrupted_write(tmp_path):
    script = textwrap.dedent("""
        import sys, threading
        import dask, dask.array as da, numpy as np
        from pipeline.storage import layout, write

        layout.TASK_BYTES = 1  # one unit per task: the held blocks hold only their own units

        HOLD = len(sys.argv) > 2  # the run to be killed: blocks from the 20th on never finish

        def held(b, block_info=None):
            if HOLD and block_info is not None and block_info[0]["chunk-location"][0] >= 20:
                threading.Event().wait()  # until the SIGKILL, whatever the machine's speed
            return b
        n = 40_000
        x = da.random.RandomState(0).standard_normal((n, 16, 8), chunks=(500, 16, 8)).astype("float32")
        x = x.map_blocks(held)
        y = da.arange(n, chunks=500)
        # Held blocks each keep a thread: enough threads that the others still run.
        with dask.config.set(scheduler="threads", num_workers=100 if HOLD else 2):
            write(sys.argv[1], {"x": x, "y": y}, chunk_samples=500, fingerprint="k", progress=False)
    """)
    (tmp_path / "w.py").write_text(script)
    killed = tmp_path / "killed.zarr"
    proc = subprocess.Popen([sys.executable, str(tmp_path / "w.py"), str(killed), "hold"])
    def some_units_written() -> bool:
        try:
            return written_units(zarr.open_group(str(killed), mode="r"), "train").sum() >= 10
        except Exception:  # noqa: BLE001 - the store is not created yet
            return False

    wait_until(some_units_written, timeout=120, watch=tmp_path, procs=[proc])
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = written_units(zarr.open_group(str(killed), mode="r"), "train")
    assert 10 <= partial.sum() < partial.size, "the kill must land halfway"
    with pytest.raises(IncompleteStoreError):
        pipeline.open(killed)
    subprocess.run([sys.executable, str(tmp_path / "w.py"), str(killed)], check=True, timeout=300)
    subprocess.run([sys.executable, str(tmp_path / "w.py"), str(tmp_path / "clean.zarr")], check=True, timeout=300)
    a, b = pipeline.open(killed), pipeline.open(tmp_path / "clean.zarr")
    for name in ("x", "y"):
        arr_a, arr_b = a["train"][name], b["train"][name]
        for i in range(0, arr_a.shape[0], 500):  # chunk by chunk
            np.testing.assert_array_equal(arr_a[i : i + 500], arr_b[i : i + 500])


def test_zip_target_holds_each_key_once_and_reads_back(tmp_path):
    x = np.random.default_rng(2).standard_normal((300, 4)).astype(np.float32)
    path = write(tmp_path / "one.zarr.zip", {"x": x, "y": np.arange(300)}, splits={"train": .5, "val": .5},
                 gap=0, chunk_samples=64, progress=False)
    names = zipfile.ZipFile(path).namelist()
    assert len(names) == len(set(names)) and "zarr.json" in names
    assert not os.path.exists(str(path) + ".partial.zarr")
    ds = pipeline.open(path)
    np.testing.assert_array_equal(np.concatenate([ds["train"]["x"][:], ds["val"]["x"][:]]), x)
    ids = np.concatenate([y for _, y in pipeline.stream(path, split="val", batch_size=32)])
    assert sorted(ids.tolist()) == list(range(150, 300))


def test_provenance_attributes(tmp_path):
    x = np.zeros((10, 2), np.float32)
    write(tmp_path / "p.zarr", {"x": x, "y": x[:, 0]}, attrs={"config": "a: 1", "sources": {"files": []}},
          fingerprint="abc", progress=False)
    attrs = pipeline.open(tmp_path / "p.zarr").attrs
    assert attrs["splits"] == {"train": 10} and attrs["fingerprint"] == "abc"
    assert attrs["config"] == "a: 1" and "zarr" in attrs["versions"] and attrs["created"]
    assert attrs["complete"] is True and attrs["codec"].startswith("blosc")


def test_a_second_writer_fails_naming_the_lock_holder(tmp_path):
    x = np.zeros((20, 2), np.float32)
    # A live process to name as the holder: it waits on its stdin until killed.
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (tmp_path / "l.zarr.lock").write_text(
            '{"host": "%s", "pid": %d, "since": "now"}' % (__import__("socket").gethostname(), holder.pid))
        from pipeline.errors import StoreLockedError

        with pytest.raises(StoreLockedError, match=f"pid {holder.pid}"):
            write(tmp_path / "l.zarr", {"x": x, "y": x[:, 0]}, progress=False)
        assert not (tmp_path / "l.zarr").exists()  # nothing written
    finally:
        holder.kill()
        holder.wait()
    # The holder is gone (as after a SIGKILL): its stale lock is taken over.
    write(tmp_path / "l.zarr", {"x": x, "y": x[:, 0]}, progress=False)
    assert pipeline.open(tmp_path / "l.zarr").attrs["complete"] and not (tmp_path / "l.zarr.lock").exists()


def test_feature_names_are_stored_given_or_carried_by_the_windows(tmp_path):
    f = np.arange(120, dtype=np.float32).reshape(40, 3)
    w = pipeline.windows(f, size=4, scales=(1, 2), names=["mid", "spread", "imbalance"])
    write(tmp_path / "carried.zarr", {"x": w, "y": np.arange(w.shape[0])}, progress=False)
    attrs = pipeline.open(tmp_path / "carried.zarr").attrs
    assert attrs["features"] == ["mid", "spread", "imbalance"]
    # The scales the names repeat over come with them, so readers can name every column.
    assert attrs["windows"]["scales"] == [1, 2] and "features" not in attrs["windows"]
    write(tmp_path / "given.zarr", {"x": w, "y": np.arange(w.shape[0])}, features=["a", "b", "c"],
          attrs={"windows": {"size": 4, "scales": [1, 2], "note": "kept"}}, progress=False)
    attrs = pipeline.open(tmp_path / "given.zarr").attrs
    assert attrs["features"] == ["a", "b", "c"] and attrs["windows"]["note"] == "kept"  # given wins, attrs kept
    rows = np.zeros((10, 2), np.float32)
    write(tmp_path / "rows.zarr", {"x": rows}, features=("bid", "ask"), progress=False)
    assert pipeline.open(tmp_path / "rows.zarr").attrs["features"] == ["bid", "ask"]


def test_feature_names_in_attrs_are_kept_when_none_are_given(tmp_path):
    x = np.zeros((10, 2), np.float32)
    write(tmp_path / "job.zarr", {"x": x}, attrs={"features": ["p", "q"]}, progress=False)  # as the job writes
    assert pipeline.open(tmp_path / "job.zarr").attrs["features"] == ["p", "q"]
    write(tmp_path / "none.zarr", {"x": x}, progress=False)
    assert "features" not in pipeline.open(tmp_path / "none.zarr").attrs
    # Virtual windows: the names count the shared per-step features' columns.
    feats = np.zeros((50, 3), np.float32)
    virtual = {"virtual": {"size": 4, "stride": 1, "scales": [1, 2], "halo": 6}}
    write(tmp_path / "v.zarr", {"train": {"ends": np.arange(6, 50), "y": np.zeros(44)}}, shared={"features": feats},
          features=["a", "b", "c"], attrs=virtual, progress=False)
    assert pipeline.open(tmp_path / "v.zarr").attrs["features"] == ["a", "b", "c"]


def test_shared_features_are_written_by_tasks_of_their_own_size(tmp_path, monkeypatch):
    """The shared features (blosc-zstd, costly per byte) are written in tasks of
    ``SHARED_TASK_BYTES``, not of the windows' ``TASK_BYTES``: blocks of whole units
    that together cover every unit once, and the stored features are the ones given."""
    import pipeline.storage.writer as writer

    real, calls = writer._write_units, []

    def counted(location, options, split, units, start, blocks, token):
        calls.append((split, [u for u, _, _ in units]))
        return real(location, options, split, units, start, blocks, token)

    monkeypatch.setattr(writer, "_write_units", counted)
    monkeypatch.setattr(writer, "SHARED_TASK_BYTES", 64 * 8 * 4 * 3)  # three units of 64 rows
    feats = np.random.default_rng(1).standard_normal((1000, 8)).astype(np.float32)
    virtual = {"virtual": {"size": 4, "stride": 1, "scales": [1], "halo": 3}}
    write(tmp_path / "v.zarr", {"train": {"ends": np.arange(3, 1000), "y": np.zeros(997)}},
          shared={"features": da.from_array(feats, chunks=250)}, shared_chunk_rows=64, attrs=virtual,
          progress=False)
    shared = sorted(units for split, units in calls if split == "_shared")
    assert [len(u) for u in shared] == [3] * 5 + [1]  # 16 units of 64 rows (the last of 40)
    assert sorted(u for block in shared for u in block) == list(range(16))
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "v.zarr"), mode="r")["_shared/features"][:], feats)


@pytest.mark.parametrize(
    ("case", "names", "message"),
    [
        ("rows", ["a", "b", "c"], r"write: features: expected 2 names \(x's last axis of 2 holds the features once "
                                  r"per scale, scales \[1\]\), got 3"),
        ("scales", ["a", "b", "c", "d", "e", "f"], r"expected 3 names \(x's last axis of 6 .*scales \[1, 2\]\), got 6"),
        ("odd", ["a", "b", "c"], r"x's last axis of 3 cannot hold features once per scale of \[1, 2\]"),
        ("virtual", ["a", "b"], r"expected 3 names, one per column of shared\['features'\] \(shape \(50, 3\)\), got 2"),
        ("rows", "ab", "expected a sequence of names, got the single string 'ab'"),
        ("rows", ["a", None], "expected strings, got None"),
    ],
)
def test_feature_names_that_do_not_fit_are_refused_before_writing(tmp_path, case, names, message):
    f = np.zeros((40, 3), np.float32)
    virtual = {"virtual": {"size": 4, "stride": 1, "scales": [1, 2], "halo": 6}}
    kwargs = {
        "rows": {"arrays": {"x": np.zeros((10, 2), np.float32)}},
        "scales": {"arrays": {"x": pipeline.windows(f, size=4, scales=(1, 2))}},
        "odd": {"arrays": {"x": np.zeros((10, 4, 3), np.float32)}, "attrs": {"windows": {"scales": [1, 2]}}},
        "virtual": {"arrays": {"train": {"ends": np.arange(6, 50), "y": np.zeros(44)}},
                    "shared": {"features": np.zeros((50, 3), np.float32)}, "attrs": virtual},
    }[case]
    with pytest.raises(StoreError, match=message):
        write(tmp_path / "s.zarr", kwargs.pop("arrays"), features=names, progress=False, **kwargs)
    assert not (tmp_path / "s.zarr").exists()


def test_carried_feature_names_that_do_not_fit_x_are_refused(tmp_path):
    names = pipeline.windows(np.zeros((20, 2), np.float32), size=3, names=["a", "b"])
    x = np.zeros((names.shape[0], 3, 4), np.float32)  # another x, beside the windows that carry names
    with pytest.raises(StoreError, match=r"the feature names array 'w' carries .* expected 4 names .*got 2"):
        write(tmp_path / "s.zarr", {"x": x, "w": names}, progress=False)
    assert not (tmp_path / "s.zarr").exists()


def _station_files(folder, stations=("ST_A", "ST_B"), hours=120):
    """One Parquet file per station over the same hours; the timestamps, in file order."""
    import pandas as pd

    rng = np.random.default_rng(3)
    paths, stamps = [], []
    for k, name in enumerate(stations):
        t = pd.date_range("2026-01-01", periods=hours, freq="h")
        pd.DataFrame({"timestamp": t, "load": 1000 * k + np.arange(hours, dtype=np.float64),
                      "temp": rng.normal(5, 1, hours)}).to_parquet(folder / f"{name}.parquet", index=False)
        paths.append(str(folder / f"{name}.parquet"))
        stamps.append(t.values)
    return paths, np.concatenate(stamps)


def test_windows_of_several_files_split_by_position_are_refused_before_writing(tmp_path):
    paths, _ = _station_files(tmp_path)
    x = pipeline.load(paths, columns=["load", "temp"])
    w = pipeline.windows(x, size=6, horizon=2)
    y = np.zeros(w.shape[0])
    with pytest.raises(StoreError, match=r"by time over windows of 2 sessions .*Pass times= "):
        write(tmp_path / "s.zarr", {"x": w, "y": y}, splits={"train": .8, "val": .2}, progress=False)
    assert not (tmp_path / "s.zarr").exists()
    # One file's windows are one series: array order is time order, as before.
    one = pipeline.windows(pipeline.load(paths[0], columns=["load", "temp"]), size=6, horizon=2)
    write(tmp_path / "one.zarr", {"x": one}, splits={"train": .8, "val": .2}, progress=False)


def test_times_cut_every_file_at_the_same_instant_with_the_gap_inside_each(tmp_path):
    """Two stations over the same hours: train and validation are the same period of
    both, and no raw row of a file is in two splits, as pandas computes it."""
    import pandas as pd

    paths, stamps = _station_files(tmp_path)
    x = pipeline.load(paths, columns=["load", "temp"])
    size, stride, k = 6, 1, 2
    w = pipeline.windows(x, size=size, stride=stride, horizon=k)
    ends = pipeline.window_end_rows(x, size=size, stride=stride, horizon=k)
    raw = np.concatenate([pd.read_parquet(p)["load"].to_numpy() for p in paths])
    path = write(tmp_path / "s.zarr", {"x": w, "y": raw[ends + k], "e": ends},
                 splits={"train": .7, "val": .3}, times=stamps[ends], chunk_samples=16, progress=False)
    ds = pipeline.open(path)
    gap = (size - 1 + k) // stride
    assert ds.attrs["split_gap_samples"] == gap

    # The reference: rank windows by end time, cut at the first validation one, then
    # drop each file's first `gap` windows after the cut.
    ref = pd.DataFrame({"e": ends, "t": stamps[ends], "file": np.repeat([0, 1], [120, 120])[ends]})
    cut = ref["t"].sort_values(kind="stable").iloc[int(np.floor(.7 * len(ref) + 1e-9))]
    ref["after"] = ref["t"] >= cut
    ref["rank"] = ref.groupby(["file", "after"]).cumcount()
    want_train = ref[~ref["after"]]["e"].to_numpy()
    want_val = ref[ref["after"] & (ref["rank"] >= gap)]["e"].to_numpy()
    np.testing.assert_array_equal(ds["train"]["e"][:], want_train)
    np.testing.assert_array_equal(ds["val"]["e"][:], want_val)
    np.testing.assert_array_equal(ds["val"]["y"][:], raw[want_val + k])
    np.testing.assert_array_equal(ds["val"]["x"][:][:, :, 0], raw[want_val[:, None] - np.arange(size)[::-1]])
    # The same instants for both stations; no row of a file both trained and validated.
    t_train, t_val = stamps[want_train], stamps[want_val]
    assert t_train.max() < cut <= t_val.min()
    for f in (0, 1):
        rows = {name: {r for e in ds[name]["e"][:] if ref.set_index("e").loc[e, "file"] == f
                       for r in range(e - (size - 1), e + k + 1)} for name in ("train", "val")}
        assert rows["train"] and rows["val"] and not rows["train"] & rows["val"]


def test_times_that_do_not_fit_are_refused_before_writing(tmp_path):
    paths, stamps = _station_files(tmp_path, hours=40)
    x = pipeline.load(paths, columns=["load", "temp"])
    w = pipeline.windows(x, size=4, horizon=0)
    t = stamps[pipeline.window_end_rows(x, size=4, horizon=0)]
    cases = [
        (t[:-1], r"times must hold one time per sample \(74,\), got shape \(73,\)"),
        (t[::-1], r"times go back within session 0: times\[0\]"),
        (np.where(np.arange(t.size) == 5, np.datetime64("NaT"), t), r"times\[5\] is missing"),
        (t.astype(str), "times must be datetime64 or numbers"),
    ]
    for bad, message in cases:
        with pytest.raises(StoreError, match=message):
            write(tmp_path / "s.zarr", {"x": w}, splits={"train": .5, "val": .5}, times=bad, progress=False)
    with pytest.raises(StoreError, match=r"times= places samples in time splits .*split_by='random'"):
        write(tmp_path / "s.zarr", {"x": np.zeros((74, 2))}, splits={"a": .5, "b": .5}, split_by="random",
              times=t, progress=False)
    assert not (tmp_path / "s.zarr").exists()


def test_a_random_split_of_windows_that_share_steps_is_refused_before_writing(tmp_path):
    series = np.arange(400, dtype=np.float32)[:, None]
    w = pipeline.windows(series, size=24)
    y = np.arange(w.shape[0])
    with pytest.raises(StoreError, match=r"split_by='random' .*not how many steps a label reads.*pass horizon="):
        write(tmp_path / "r.zarr", {"x": w, "y": y}, splits={"a": .8, "b": .2}, split_by="random", progress=False)
    with pytest.raises(StoreError, match=r"split_by='random' over the windows of array 'x' .*shares time steps with "
                                         r"the 29 windows after it"):
        write(tmp_path / "r.zarr", {"x": w, "y": y}, splits={"a": .8, "b": .2}, split_by="random", horizon=6,
              progress=False)
    assert not (tmp_path / "r.zarr").exists()
    # Windows that share no step (stride beyond the window and its label) split at random.
    apart = pipeline.windows(series, size=4, stride=6, horizon=2)
    path = write(tmp_path / "ok.zarr", {"x": apart}, splits={"a": .5, "b": .5}, split_by="random", progress=False)
    ds = pipeline.open(path)
    steps = {name: set(ds[name]["x"][:].ravel().tolist()) for name in ds.splits}
    assert not steps["a"] & steps["b"]
    assert sorted(steps["a"] | steps["b"]) == sorted(set(apart.compute().ravel().tolist()))


def test_versions_record_python_and_the_table_readers(tmp_path):
    import platform
    from importlib.metadata import version

    write(tmp_path / "v.zarr", {"x": np.zeros((4, 2))}, progress=False)
    versions = pipeline.open(tmp_path / "v.zarr").attrs["versions"]
    assert versions["python"] == platform.python_version()
    for name in ("pandas", "pyarrow", "numpy", "dask", "zarr"):
        assert versions[name] == version(name)


def _captured_writes(monkeypatch):
    """Make ``pipeline.write`` record the collections it computes (its write graphs)."""
    import pipeline.storage.writer as writer

    real, seen = writer.compute, []

    def compute(*collections, **kwargs):
        seen.extend(collections)
        return real(*collections, **kwargs)

    monkeypatch.setattr(writer, "compute", compute)
    return seen


def test_a_memmapped_npy_is_read_by_path_in_each_task_on_a_cluster(tmp_path, monkeypatch):
    """A memory-mapped ``.npy`` is read by each write task from the file, a block at a
    time, on the workers of a LocalCluster: the graph (pickled, as it goes to the
    scheduler of a cluster of processes) holds no array data (it held the whole array as
    one chunk: the client read it all, the worker that got it was killed), needs no
    rechunk, and the store equals the file as numpy reads it."""
    import cloudpickle
    from distributed import Client

    import pipeline.storage.layout as layout
    from tests.conftest import in_process_cluster

    rng = np.random.default_rng(5)
    np.save(tmp_path / "x.npy", rng.standard_normal((4000, 16, 8)).astype(np.float32))  # 2 MiB
    x = np.load(tmp_path / "x.npy", mmap_mode="r")
    reference = np.load(tmp_path / "x.npy")  # plain numpy, read whole
    y = np.arange(4000, dtype=np.int64)
    monkeypatch.setattr(layout, "TASK_BYTES", 2 * 250 * 16 * 8 * 4)  # two units of 250 samples per task
    seen = _captured_writes(monkeypatch)
    with in_process_cluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as cluster, Client(cluster):
        whole = write(tmp_path / "whole.zarr", {"x": x, "y": y}, chunk_samples=250, progress=False)
        # A view (rows and a feature range cut) and a random split (rows picked).
        parts = write(tmp_path / "parts.zarr", {"x": x[100:, :, 2:6], "y": y[100:]}, splits={"a": .7, "b": .3},
                      split_by="random", chunk_samples=250, progress=False)
    np.testing.assert_array_equal(pipeline.open(whole)["train"]["x"][:], reference)
    ds = pipeline.open(parts)
    for split in ("a", "b"):
        rows = ds[split]["y"][:]
        np.testing.assert_array_equal(ds[split]["x"][:], reference[rows][:, :, 2:6])
    assert sorted(np.concatenate([ds["a"]["y"][:], ds["b"]["y"][:]]).tolist()) == list(range(100, 4000))
    for collection in seen:
        graph = collection.__dask_graph__()
        pickled = cloudpickle.dumps(dict(graph))
        assert len(pickled) < 100_000  # the array is 2 MiB
        assert len(cloudpickle.loads(pickled)) == len(graph)  # and it is all there to ship
        assert not [name for name in graph.layers if name.startswith("rechunk")]


def test_an_in_memory_numpy_array_is_cut_into_the_write_tasks_blocks(tmp_path, monkeypatch):
    """An in-memory array goes into the graph in the blocks its write tasks write (it
    was one chunk, rechunked by the tasks), and is stored as given."""
    import pipeline.storage.layout as layout

    x = np.random.default_rng(6).standard_normal((1000, 4, 3)).astype(np.float32)
    monkeypatch.setattr(layout, "TASK_BYTES", 3 * 100 * 4 * 3 * 4)  # three units of 100 samples per task
    seen = _captured_writes(monkeypatch)
    for kwargs in ({}, {"splits": {"a": .5, "b": .5}, "gap": 0}, {"splits": {"a": .5, "b": .5}, "split_by": "random"}):
        path = write(tmp_path / f"s{len(seen)}.zarr", {"x": x, "y": np.arange(1000)}, chunk_samples=100,
                     progress=False, **kwargs)
        ds = pipeline.open(path)
        for split in ds.splits:
            np.testing.assert_array_equal(ds[split]["x"][:], x[ds[split]["y"][:]])
    for collection in seen:
        assert not [name for name in collection.__dask_graph__().layers if name.startswith("rechunk")]
    assert len(seen) == 5 and seen[0].numblocks[0] == 4  # 1000 samples: blocks of 300; then 2 + 2 splits


def test_a_memmapped_file_changed_during_the_write_is_refused_naming_it(tmp_path):
    """A task reading rows of a file that changed since the write began refuses, naming
    the file, rather than storing rows of another array."""
    from pipeline.errors import LoaderError
    from pipeline.storage.arraysource import file_rows

    np.save(tmp_path / "x.npy", np.zeros((100, 3), np.float32))
    source = file_rows(np.load(tmp_path / "x.npy", mmap_mode="r")[10:])
    np.testing.assert_array_equal(source.read(0, 5), np.zeros((5, 3), np.float32))
    np.save(tmp_path / "x.npy", np.ones((90, 3), np.float32))
    with pytest.raises(LoaderError, match=rf"{tmp_path}/x.npy: changed since pipeline.write began"):
        source.read(0, 5)
    assert file_rows(np.zeros((4, 2))) is None  # in memory: no file to read


def test_a_zip_store_is_built_in_the_staging_directory_the_store_module_names(tmp_path, monkeypatch):
    """The staging directory's name lives in ``pipeline.storage.store.zip_staging``
    (``inspect`` and readers look there for an unfinished build), not in the writer."""
    import pipeline.storage.writer as writer

    monkeypatch.setattr(writer, "zip_staging", lambda location: str(location) + ".staged")
    used = []
    real = writer._write_dir

    def write_dir(location, *args, **kwargs):
        used.append(location)
        return real(location, *args, **kwargs)

    monkeypatch.setattr(writer, "_write_dir", write_dir)
    path = write(tmp_path / "s.zarr.zip", {"x": np.zeros((10, 2))}, progress=False)
    assert used == [str(tmp_path / "s.zarr.zip.staged")]
    np.testing.assert_array_equal(pipeline.open(path)["train"]["x"][:], np.zeros((10, 2)))


def test_a_memmapped_file_written_again_resumes_and_a_changed_one_is_refused(tmp_path):
    """The identity of a write of a memory-mapped file is the file as it was (path, size,
    modification time) and where the array lies in it: the same write again keeps the
    store; the file rewritten is another write, refused without ``overwrite``."""
    np.save(tmp_path / "x.npy", np.arange(60, dtype=np.float32).reshape(20, 3))
    path = write(tmp_path / "s.zarr", {"x": np.load(tmp_path / "x.npy", mmap_mode="r")}, progress=False)
    write(tmp_path / "s.zarr", {"x": np.load(tmp_path / "x.npy", mmap_mode="r")}, progress=False)
    os.utime(tmp_path / "x.npy", ns=(0, 10**9))  # rewritten (in place, same size)
    with pytest.raises(StoreConflictError, match="written from fingerprint"):
        write(tmp_path / "s.zarr", {"x": np.load(tmp_path / "x.npy", mmap_mode="r")}, progress=False)
    np.testing.assert_array_equal(pipeline.open(path)["train"]["x"][:], np.arange(60, dtype=np.float32).reshape(20, 3))


@pytest.mark.parametrize("kind", ["raw", "npy-bytes", "fortran"])
def test_other_memory_maps_are_read_from_their_files_as_numpy_shows_them(tmp_path, kind):
    """A raw ``np.memmap`` (no header), a map of an ``.npy``'s bytes from its start (the
    header inside the map) and a Fortran-ordered ``.npy`` are stored as numpy shows them."""
    data = np.random.default_rng(7).standard_normal((300, 5, 2))
    if kind == "raw":
        data.tofile(tmp_path / "x.dat")
        x = np.memmap(tmp_path / "x.dat", dtype=data.dtype, mode="r", shape=data.shape)
    elif kind == "npy-bytes":
        np.save(tmp_path / "x.npy", data)
        raw = np.memmap(tmp_path / "x.npy", dtype=np.uint8, mode="r")
        x = raw[raw.size - data.nbytes:].view(data.dtype).reshape(data.shape)
    else:
        np.save(tmp_path / "x.npy", np.asfortranarray(data))
        x = np.load(tmp_path / "x.npy", mmap_mode="r")
    view = x[7:, ::2]
    assert view.flags.c_contiguous is False
    path = write(tmp_path / "s.zarr", {"x": view}, splits={"a": .5, "b": .5}, gap=0, chunk_samples=16,
                 target_chunk_bytes=1, progress=False)
    ds = pipeline.open(path)
    np.testing.assert_array_equal(np.concatenate([ds["a"]["x"][:], ds["b"]["x"][:]]), data[7:, ::2])
