"""Stores keep their bytes: every file a write stores is the same, bit for bit, as the
writer stored before its fast path (each unit through ``zarr.Array.__setitem__``).

Two references, for small stores of each kind (materialized windows, sharded, virtual
windows with shared features, zstd and uncompressed, all-zero chunks zarr leaves out,
partial last units, a resumed write):

- the writer of before, kept here (:func:`reference_write_units`): the same write with
  it in place of the fast path stores the same files, whatever the library versions;
- the SHA-256 of every file the writer of before stored, committed beside this file in
  ``build_bytes.json`` with the zarr and numcodecs versions that made them: the bytes
  themselves, checked where those versions are installed.

Regenerate the hashes (only when the bytes are meant to change) with
``python -m tests.storage.test_build_bytes``.
"""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import dask
import dask.array as da
import numpy as np
import pytest
import zarr

import pipeline
import pipeline.storage.layout as layout
import pipeline.storage.units as units
import pipeline.storage.writer as writer
from pipeline.storage import write
from pipeline.storage.writer import WRITTEN, written_units

DATA = Path(__file__).parent / "build_bytes.json"


def reference_write_units(location: str, storage_options: dict | None, split: str, units: list, block_start: int,
                          blocks: dict[str, np.ndarray], token: str) -> int:
    """The writer's unit loop before its fast path: zarr's ``__setitem__`` per array
    and unit, then the unit's ``_written`` row."""
    group = zarr.open_group(location, mode="r+")
    arrays = {name: group[f"{split}/{name}"] for name in blocks}
    written = group[f"{split}/{WRITTEN}"]
    for unit, start, stop in units:
        crcs = []
        for name, block in blocks.items():
            arr = arrays[name]
            part = np.ascontiguousarray(block[start - block_start : stop - block_start], dtype=arr.dtype)
            arr[start:stop] = part
            crcs.append(zlib.crc32(part.reshape(-1).view(np.uint8)))
        written[unit] = np.array([1, *crcs], dtype=np.uint64)
    return len(units)


def _series(rows: int = 2400, width: int = 5, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    f = np.cumsum(rng.standard_normal((rows, width)), axis=0).astype(np.float32)
    f[600:900] = 0.0  # windows of zeros only: whole chunks equal the fill value, which zarr does not store
    return f


def _windows_arrays(chunks: int = 173) -> dict[str, Any]:
    f = _series()
    x = pipeline.windows(da.from_array(f, chunks=(chunks, -1)), size=8, stride=1, scales=(1, 3))
    n = int(x.shape[0])
    y = da.from_array(np.sin(np.arange(n, dtype=np.float32) / 7), chunks=chunks)
    t = da.from_array(np.arange(n, dtype=np.int64) * 1_000_000 + 1_767_225_600 * 10**9, chunks=chunks)
    session = da.from_array((np.arange(n) // 900).astype(np.int32), chunks=chunks)  # zeros: not stored
    y2 = da.from_array(np.stack([np.cos(np.arange(n) / 5), np.arange(n) % 3], axis=1).astype(np.float32),
                       chunks=(chunks, -1))
    return {"x": x, "y": y, "y2": y2, "t": t, "session": session}


def _case_windows(path: Path, **kwargs: Any) -> None:
    write(path, _windows_arrays(), splits={"train": 0.7, "val": 0.2, "test": 0.1}, horizon=0,
          chunk_samples=kwargs.pop("chunk_samples", 61), progress=False, **kwargs)


def _case_virtual(path: Path) -> None:
    f = _series()
    ends = np.arange(40, f.shape[0], dtype=np.int32)
    n = ends.size
    arrays = {"train": {"ends": da.from_array(ends[: n // 2], chunks=97),
                        "y": da.from_array(f[ends[: n // 2], 0], chunks=97)},
              "val": {"ends": da.from_array(ends[n // 2 + 50 :], chunks=97),
                      "y": da.from_array(f[ends[n // 2 + 50 :], 0], chunks=97)}}
    write(path, arrays, shared={"features": da.from_array(f, chunks=(500, -1))}, shared_chunk_rows=211,
          chunk_samples=83, codec={"name": "blosc", "cname": "lz4", "clevel": 5, "shuffle": "noshuffle"},
          attrs={"virtual": {"size": 8, "stride": 1, "scales": [1, 3], "halo": 21}}, progress=False)


def _case_resumed(path: Path) -> None:
    """A write whose first attempt stored every other unit (with its marker), resumed."""
    _case_windows(path, chunk_samples=61)
    group = zarr.open_group(str(path), mode="r+")
    for split in ("train", "val", "test"):
        table = group[f"{split}/{WRITTEN}"]
        rows = np.asarray(table[:])
        rows[1::2] = 0
        table[:] = rows
    attrs = dict(group.attrs["pipeline"])
    attrs["complete"] = False
    group.attrs["pipeline"] = attrs
    _case_windows(path, chunk_samples=61)


def _case_small_tasks(path: Path) -> None:
    """Tasks of two units each: many blocks per split, the last one short."""
    with mock.patch.object(layout, "TASK_BYTES", 2 * 61 * 8 * 10 * 4):
        _case_windows(path, chunk_samples=61)


def _case_event_loop(path: Path) -> None:
    """The unit writer's path for stores without synchronous writes (object stores):
    zarr's codec pipeline and ``set`` on its event loop."""
    with mock.patch.object(units, "_sync_codecs", lambda arr: None):
        _case_windows(path, chunk_samples=61)


CASES: dict[str, Callable[[Path], None]] = {
    "windows": _case_windows,
    "windows_small_tasks": _case_small_tasks,
    "windows_event_loop": _case_event_loop,
    "windows_sharded": lambda p: _case_windows(p, shard_chunks=3),
    "windows_zstd": lambda p: _case_windows(p, codec="zstd"),
    "windows_none": lambda p: _case_windows(p, codec="none"),
    "windows_one_unit_per_task": lambda p: _case_windows(p, chunk_samples=4096),
    "virtual": _case_virtual,
    "resumed": _case_resumed,
}


def store_files(path: Path) -> dict[str, bytes]:
    """Every file of a store by its path inside it, the root's ``zarr.json`` (whose
    attributes record when and with which versions the store was made) left out."""
    out = {}
    for dirpath, _, files in os.walk(path):
        for name in files:
            full = Path(dirpath) / name
            rel = full.relative_to(path).as_posix()
            if rel != "zarr.json":
                out[rel] = full.read_bytes()
    return out


def _root_attrs(path: Path) -> dict[str, Any]:
    attrs = dict(zarr.open_group(str(path), mode="r").attrs["pipeline"])
    for key in ("created", "history"):
        attrs.pop(key, None)
    return attrs


def _versions() -> dict[str, str]:
    return {name: version(name) for name in ("zarr", "numcodecs")}


def _hashes(root: Path) -> dict[str, dict[str, str]]:
    return {name: {rel: hashlib.sha256(b).hexdigest() for rel, b in sorted(store_files(root / f"{name}.zarr").items())}
            for name in CASES}


def make_hashes(root: Path) -> dict[str, Any]:
    """SHA-256 of every file of every case, written under ``root`` by the writer of before."""
    with dask.config.set(scheduler="threads"), mock.patch.object(writer, "_write_units", reference_write_units):
        for name, make in CASES.items():
            make(root / f"{name}.zarr")
    return {"versions": _versions(), "cases": _hashes(root)}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case, written by the writer as it is."""
    root = tmp_path_factory.mktemp("build_bytes")
    with dask.config.set(scheduler="threads"):
        for name, make in CASES.items():
            make(root / f"{name}.zarr")
    return root


@pytest.mark.parametrize("case", sorted(CASES))
def test_stores_equal_the_writer_of_before_bit_for_bit(stores, tmp_path, case):
    with dask.config.set(scheduler="threads"), mock.patch.object(writer, "_write_units", reference_write_units):
        CASES[case](tmp_path / "ref.zarr")
    new, ref = store_files(stores / f"{case}.zarr"), store_files(tmp_path / "ref.zarr")
    assert sorted(new) == sorted(ref)
    different = [rel for rel in ref if new[rel] != ref[rel]]
    assert not different, f"{len(different)} files differ, first {different[:3]}"
    assert _root_attrs(stores / f"{case}.zarr") == _root_attrs(tmp_path / "ref.zarr")


def test_stores_hold_the_committed_bytes(stores):
    expected = json.loads(DATA.read_text())
    if expected["versions"] != _versions():
        pytest.skip(f"hashes made with {expected['versions']}, installed {_versions()}: blosc's bytes may differ")
    got = _hashes(stores)
    for name, files in expected["cases"].items():
        assert sorted(got[name]) == sorted(files), name
        different = [rel for rel in files if got[name][rel] != files[rel]]
        assert not different, f"{name}: {len(different)} files differ, first {different[:3]}"
    # Neither how many tasks write a store nor the way the bytes reach it changes a byte.
    assert got["windows_small_tasks"] == got["windows"] == got["windows_event_loop"]


def test_stores_read_back_with_plain_zarr(stores):
    """Every case opens with zarr alone and holds what was written; chunks equal to the
    fill value are not stored and read as it."""
    for name in CASES:
        group = zarr.open_group(str(stores / f"{name}.zarr"), mode="r")
        for split in ("train", "val", "test"):
            if split in group:
                assert written_units(group, split).all()
    group = zarr.open_group(str(stores / "windows.zarr"), mode="r")
    arrays = _windows_arrays()
    n_train = group["train/x"].shape[0]
    np.testing.assert_array_equal(group["train/x"][:], arrays["x"][:n_train].compute())
    np.testing.assert_array_equal(group["train/session"][:], arrays["session"][:n_train].compute())
    assert not (stores / "windows.zarr" / "train" / "session" / "c" / "0").exists()
    assert not (stores / "windows.zarr" / "train" / "x" / "c" / "10" / "0" / "0").exists()
    virtual = zarr.open_group(str(stores / "virtual.zarr"), mode="r")
    np.testing.assert_array_equal(virtual["_shared/features"][:], _series())


if __name__ == "__main__":  # regenerate the committed hashes
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        DATA.write_text(json.dumps(make_hashes(Path(tmp)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {DATA}")
