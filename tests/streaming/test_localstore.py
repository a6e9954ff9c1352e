"""A local pipeline store opened from its zarr.json files (``pipeline.streaming.localstore``)
says what zarr says of it, streams the same batches, and leaves every other store to zarr."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeline
from pipeline.errors import StoreError
from pipeline.storage import write
from pipeline.storage.append import append
from pipeline.storage.versions import pinned_array
from pipeline.streaming import localstore
from pipeline.streaming.localstore import LocalArray, LocalGroup, _fill_value, open_local
from tests.streaming.conftest import make_store

ARRAYS = ("x", "y")


def _walk(group: zarr.Group, prefix: str = ""):
    for name, node in group.members():
        path = f"{prefix}{name}"
        yield path, node
        if isinstance(node, zarr.Group):
            yield from _walk(node, path + "/")


def _plain(value):
    """A metadata value as JSON would hold it (zarr's dicts hold tuples and its own types)."""
    return json.loads(json.dumps(value, default=lambda v: v.to_dict() if hasattr(v, "to_dict") else str(v)))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Stores of the layouts the writer makes: blosc and zstd, sharded, virtual windows
    (shared features), folds, and a store with an append (two versions)."""
    d = tmp_path_factory.mktemp("local")
    out = {
        "lz4": make_store(d / "lz4.zarr", n=900, chunk=64),
        "zstd": make_store(d / "zstd.zarr", n=500, chunk=50, codec="blosc-zstd"),
        "sharded": make_store(d / "sharded.zarr", n=700, chunk=32, shard_chunks=4),
    }
    rng = np.random.default_rng(3)
    n = 400
    x = rng.normal(size=(n, 6, 2)).astype(np.float32)
    x[5, 0, 0] = np.nan
    write(d / "split.zarr", {"x": x, "y": np.arange(n, dtype=np.int64), "ok": np.arange(n) % 3 == 0},
          splits={"train": 0.75, "test": 0.25}, gap=0, chunk_samples=40, progress=False)
    out["split"] = str(d / "split.zarr")
    grown = d / "grown.zarr"
    make_store(grown, n=300, chunk=64)
    meta = dict(zarr.open_group(str(grown), mode="r").attrs["pipeline"])
    y = np.arange(300, 390, dtype=np.int64)
    append(grown, {"train": {"x": np.broadcast_to(y[:, None, None].astype(np.float32), (90, 4, 3)).copy(), "y": y}},
           attrs=meta, token="t1", progress=False)
    out["grown"] = str(grown)
    return out


@pytest.mark.parametrize("kind", ["lz4", "zstd", "sharded", "split", "grown"])
def test_every_node_reads_as_zarr_reads_it(stores, kind):
    ref = zarr.open_group(stores[kind], mode="r")
    local = open_local(stores[kind])
    assert isinstance(local, LocalGroup)
    assert local.attrs == dict(ref.attrs)
    assert sorted(n for n, _ in local.groups()) == sorted(n for n, _ in ref.groups())
    seen = 0
    for path, node in _walk(ref):
        mine = local[path]
        assert path in local
        if isinstance(node, zarr.Group):
            assert isinstance(mine, LocalGroup) and mine.attrs == dict(node.attrs)
            continue
        seen += 1
        assert isinstance(mine, LocalArray), path
        assert (mine.shape, mine.chunks, mine.shards, mine.dtype, mine.ndim) == \
            (node.shape, node.chunks, node.shards, node.dtype, node.ndim), path
        for key in ("codecs", "chunk_key_encoding", "chunk_grid", "shape", "data_type"):
            assert _plain(mine.metadata.to_dict()[key]) == _plain(node.metadata.to_dict()[key]), (path, key)
        fill, theirs = mine.fill_value, node.fill_value
        assert type(fill) is type(theirs) and (fill == theirs or (math.isnan(fill) and math.isnan(theirs)))
        assert mine.attrs == dict(node.attrs)
        assert mine.local_dir == f"{stores[kind]}/{path}"
        # Values come from zarr's own read of the same array.
        assert np.array_equal(mine[:], node[:], equal_nan=True)
    assert seen >= 3
    assert "nothing" not in local and local.get("nothing") is None
    with pytest.raises(KeyError):
        local["nothing"]


def test_a_pinned_array_is_the_version_s_length_for_reads_through_zarr_too(stores):
    ref = zarr.open_group(stores["grown"], mode="r")["train/x"]
    local = open_local(stores["grown"])["train/x"]
    assert local.shape[0] == 390
    pinned = pinned_array(local, 300)
    assert isinstance(pinned, LocalArray) and pinned.shape == (300, 4, 3)
    assert np.array_equal(pinned[:], ref[:300])
    assert pinned.zarr().shape == (300, 4, 3)
    with pytest.raises(StoreError, match="holds 390 samples, its version records 400"):
        pinned_array(local, 400)


@pytest.mark.parametrize("kind", ["lz4", "zstd", "sharded", "split", "grown"])
@pytest.mark.parametrize("how", [dict(), dict(verify=True), dict(version=0), dict(world_size=2, rank=1)],
                         ids=["plain", "verify", "version0", "rank1of2"])
def test_batches_are_those_of_the_store_opened_by_zarr(stores, kind, how, monkeypatch):
    split = "test" if kind == "split" else "train"

    def epoch():
        with pipeline.stream(stores[kind], split=split, arrays=ARRAYS, batch_size=16, seed=5, **how) as s:
            return [tuple(np.array(a) for a in b) for b in s]

    mine = epoch()
    monkeypatch.setattr(localstore, "open_local", lambda location: None)
    theirs = epoch()
    assert len(mine) == len(theirs) > 0
    for a, b in zip(mine, theirs):
        for u, v in zip(a, b):
            assert np.array_equal(u, v, equal_nan=True)
    # An independent count: every sample of the split (this rank's share) once, x aligned.
    ys = np.concatenate([b[1] for b in mine])
    assert len(set(ys.tolist())) == len(ys)
    if kind != "split":
        for x, y in mine:
            assert np.array_equal(x[:, 0, 0], y.astype(np.float32))
        total = 300 if (kind == "grown" and "version" in how) else zarr.open_group(stores[kind])["train/y"].shape[0]
        if "rank" in how:  # a rank's share: half the batches, one short batch at most between them
            assert abs(len(ys) - total / 2) <= 16, (len(ys), total)
        else:
            assert len(ys) == total


def test_other_stores_are_left_to_zarr(tmp_path, stores):
    """A foreign group, zarr 2, a zip, a URL, a directory without zarr.json: None."""
    foreign = zarr.open_group(str(tmp_path / "foreign.zarr"), mode="w")
    foreign.create_array("x", shape=(10, 2), dtype="float32")
    v2 = zarr.open_group(str(tmp_path / "v2.zarr"), mode="w", zarr_format=2)
    v2.attrs["pipeline"] = {"complete": True}
    zipped = tmp_path / "s.zarr.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.write(f"{stores['lz4']}/zarr.json", "zarr.json")
    (tmp_path / "empty").mkdir()
    for location in (tmp_path / "foreign.zarr", tmp_path / "v2.zarr", zipped, tmp_path / "empty",
                     tmp_path / "missing", "s3://bucket/s.zarr", 42):
        assert open_local(location) is None, location
    assert isinstance(open_local(f"file://{stores['lz4']}"), LocalGroup)


def test_a_damaged_array_metadata_is_named(tmp_path, stores):
    path = tmp_path / "s.zarr"
    shutil.copytree(stores["lz4"], path)
    (path / "train" / "y" / "zarr.json").write_text("{not json")
    with pytest.raises(StoreError, match=r"train/y/zarr\.json: not readable zarr metadata"):
        pipeline.stream(path, batch_size=8)
    (path / "train" / "y" / "zarr.json").write_text(json.dumps({"zarr_format": 2}))
    with pytest.raises(StoreError, match=r"train/y/zarr\.json: not the metadata of a zarr 3"):
        pipeline.stream(path, batch_size=8)


@pytest.mark.parametrize("key, value", [("fill_value", "0x00000000"), ("data_type", {"name": "float32"}),
                                        ("chunk_grid", {"name": "rectilinear"}), ("storage_transformers", [{}])])
def test_an_array_in_a_spelling_this_module_does_not_read_goes_to_zarr(tmp_path, stores, key, value, monkeypatch):
    """A fill value in zarr 3's hex spelling, a dtype or grid named another way, a storage
    transformer: the array is zarr's own, which streams it or says what it cannot read."""
    path = tmp_path / "s.zarr"
    shutil.copytree(stores["lz4"], path)
    meta_path = path / "train" / "x" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta[key] = value
    meta_path.write_text(json.dumps(meta))
    asked = []
    real = LocalGroup.zarr
    monkeypatch.setattr(LocalGroup, "zarr", lambda self: asked.append(self.path) or real(self))
    try:
        node = open_local(path)["train/x"]
    except Exception:  # noqa: BLE001 - zarr refusing it: its own error, not a wrong read
        assert asked == [""] and key in ("data_type", "chunk_grid")
        return
    assert isinstance(node, zarr.Array) and asked == [""]
    with pipeline.stream(path, batch_size=100, seed=1) as s:
        ys = np.concatenate([np.array(b[1]) for b in s])
    assert sorted(ys.tolist()) == list(range(900))


@pytest.mark.parametrize("value, dtype, expected", [
    (0.0, "float32", np.float32(0)), ("NaN", "float64", np.float64("nan")), ("Infinity", "float32", np.float32("inf")),
    ("-Infinity", "float64", -np.inf), (0, "int64", np.int64(0)), (False, "bool", np.False_), (7, "uint8", np.uint8(7)),
])
def test_fill_values(value, dtype, expected):
    got = _fill_value(value, np.dtype(dtype))
    assert got.dtype == np.dtype(dtype)
    assert got == expected or (np.isnan(got) and np.isnan(expected))


@pytest.mark.parametrize("value, dtype", [("0x7fc00000", "float32"), ("NaN", "int64"), (None, "float32"),
                                          ([1, 2], "complex64")])
def test_fill_values_this_module_does_not_read(value, dtype):
    with pytest.raises(ValueError):
        _fill_value(value, np.dtype(dtype))


def test_a_fresh_process_streams_a_local_store_without_importing_zarr(stores):
    code = (f"import sys, pipeline\ns = pipeline.stream({stores['split']!r}, split='train', batch_size=32)\n"
            "b = next(iter(s))\nprint(len(b[0]), sorted(m for m in ('zarr', 'dask', 'pandas', 'torch') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split(maxsplit=1) == ["32", "[]\n"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 300), chunk=st.integers(1, 80), shards=st.sampled_from([None, 2, 3]),
       codec=st.sampled_from(["blosc-lz4", "blosc-zstd", "zstd", "none"]),
       ydtype=st.sampled_from(["int64", "int32", "float64", "bool", "uint8"]), tail=st.sampled_from([(), (3,), (2, 5)]))
def test_any_written_store_reads_as_zarr_reads_it(tmp_path_factory, n, chunk, shards, codec, ydtype, tail):
    """Whatever the writer's settings, every array opened here has zarr's shape, chunks,
    shards, dtype, fill value and codecs, and a stream serves each sample once."""
    path = tmp_path_factory.mktemp("any") / "s.zarr"
    y = (np.arange(n) % 2 == 0) if ydtype == "bool" else np.arange(n).astype(ydtype)
    x = np.broadcast_to(np.arange(n, dtype=np.float32).reshape((n,) + (1,) * len(tail)), (n, *tail)).copy()
    write(path, {"x": x, "y": y}, chunk_samples=chunk, shard_chunks=shards, codec=codec, progress=False)
    ref = zarr.open_group(str(path), mode="r")
    local = open_local(path)
    for name in ("train/x", "train/y", "train/_written"):
        mine, node = local[name], ref[name]
        assert isinstance(mine, LocalArray), name
        assert (mine.shape, mine.chunks, mine.shards, mine.dtype) == (node.shape, node.chunks, node.shards, node.dtype)
        assert mine.fill_value == node.fill_value and type(mine.fill_value) is type(node.fill_value)
        assert _plain(mine.metadata.to_dict()["codecs"]) == _plain(node.metadata.to_dict()["codecs"])
    with pipeline.stream(path, batch_size=7, seed=2) as s:
        xs = np.concatenate([np.array(b[0]).reshape(len(b[0]), -1)[:, 0] if tail else np.array(b[0]) for b in s])
    assert sorted(xs.tolist()) == list(range(n))


def test_opening_a_stream_reads_each_metadata_document_once(tmp_path, monkeypatch):
    """The root's and the split's ``zarr.json`` are read once per opened stream (it was
    three times and once per array), and a later open reads them again, so a store
    written anew in between is seen."""
    path = make_store(tmp_path / "s.zarr", n=300)
    import builtins

    reads = []
    real = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: (str(f).endswith("zarr.json") and reads.append(f))
                        or real(f, *a, **k))
    s = pipeline.stream(path, split="train", batch_size=50, seed=0)
    assert sorted(reads) == sorted({*reads}) and len(reads) == 4  # the root, the split, x and y
    assert sorted(int(v) for _, yb in s for v in yb) == list(range(300))
    y = np.arange(310)
    write(path, {"x": np.zeros((310, 4, 3), np.float32), "y": y}, chunk_samples=64, overwrite=True, progress=False)
    reads.clear()
    assert len(pipeline.stream(path, split="train", batch_size=50, seed=0)) == 7  # 310 samples: read anew
    assert len(reads) == 4


def test_a_remote_store_is_opened_once_per_stream(s3, monkeypatch):
    """An object store's root group is opened once per stream (each open is requests)."""
    import pipeline.storage.store as store_mod

    url = "s3://training/opened-once/set.zarr"
    write(url, {"x": np.zeros((200, 2), np.float32), "y": np.arange(200)}, chunk_samples=50, progress=False,
          storage_options=s3, overwrite=True)
    import s3fs

    opened, gets = [], []
    real = store_mod.open_store_group
    monkeypatch.setattr(store_mod, "open_store_group", lambda *a, **k: opened.append(a[0]) or real(*a, **k))
    real_call = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *args, **kwargs):
        if method == "get_object":
            gets.append(kwargs.get("Key", "").removeprefix("opened-once/set.zarr/"))
        return await real_call(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    s = pipeline.stream(url, split="train", batch_size=50, seed=0, storage_options=s3)
    assert opened == [url]
    # Each node's metadata fetched once (the split's was fetched three times, each array's twice).
    assert sorted(gets) == ["train/x/zarr.json", "train/y/zarr.json", "train/zarr.json", "zarr.json"]
    assert sorted(int(v) for _, yb in s for v in yb) == list(range(200))
