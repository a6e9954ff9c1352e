"""The common block readers of array files: every block is checked against what the
file's header said when the array was built (a file rewritten shorter, or in another
dtype, is refused naming it, never stored as zeros or cast back), and row blocks
follow a file's row alignment (an HDF5 dataset's chunk rows)."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline
from pipeline.errors import LoaderError, ShapeMismatchError
from pipeline.loaders.blocks import concat_array, pad_shape, row_blocks, row_step
from pipeline.loaders.hdf5 import probe_hdf5, read_hdf5
from pipeline.loaders.npy import read_npy


def _rows(n, start=1):
    return np.arange(start, start + 2 * n, dtype="f4").reshape(n, 2)


def _read(path):
    if path.suffix == ".h5":
        with h5py.File(path, "r") as f:
            return f["x"][()]
    return np.load(path)


def _write(path, a):
    if path.suffix == ".h5":
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=a)
    else:
        np.save(path, a)


@pytest.mark.parametrize("suffix", [".npy", ".h5"])
def test_a_file_rewritten_shorter_is_refused_naming_it(tmp_path, suffix):
    a, b = tmp_path / f"a{suffix}", tmp_path / f"b{suffix}"
    _write(a, _rows(100))
    _write(b, _rows(100))
    x = pipeline.load([str(a), str(b)], combine="concat", chunk_rows=30)
    _write(b, _rows(45))  # the producer re-exports b shorter before the build reads it
    assert np.concatenate([_read(a), _read(b)]).shape == (145, 2)  # what would be stored, padded
    with pytest.raises(ShapeMismatchError, match=rf"b{suffix}: its header said shape \(100, 2\) float32 when the array "
                       r"was built, but rows \d+:\d+ now read as shape \((15|0), 2\)"):
        x.compute(scheduler="sync")
    # a's blocks still equal the file: only b is blamed
    np.testing.assert_array_equal(x[:100].compute(scheduler="sync"), _read(a))


@pytest.mark.parametrize("suffix", [".npy", ".h5"])
def test_a_file_rewritten_wider_is_refused_not_cast_back(tmp_path, suffix):
    a = tmp_path / f"a{suffix}"
    _write(a, _rows(10))
    x = pipeline.load([str(a)], combine="concat")
    assert x.dtype == np.float32
    _write(a, _rows(10).astype("f8") + 0.1)  # values float32 cannot hold
    with pytest.raises(LoaderError, match=rf"a{suffix}: .*float32.* rows 0:10 now read as float64"):
        x.compute(scheduler="sync")


def test_probed_dtypes_catch_a_change_that_still_casts(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(6.0, dtype="f8").reshape(3, 2))
    np.save(tmp_path / "b.npy", np.arange(6.0, dtype="f4").reshape(3, 2))
    probed = [((3, 2), np.dtype("f8")), ((3, 2), np.dtype("f4"))]
    np.save(tmp_path / "b.npy", np.arange(6, dtype="i2").reshape(3, 2))  # casts to f8 safely, still not b's data
    paths = [str(tmp_path / "a.npy"), str(tmp_path / "b.npy")]
    x = concat_array(paths, [3, 3], (2,), np.dtype("f8"), lambda p, lo, hi: read_npy(p, {})[lo:hi], probed=probed)
    with pytest.raises(LoaderError, match=r"b\.npy: its header said shape \(3, 2\) float32 .* now read as int16"):
        x.compute(scheduler="sync")


def test_unchanged_files_read_as_numpy_reads_them(tmp_path):
    parts = [_rows(7), _rows(0), _rows(5, 100)]
    for i, p in enumerate(parts):
        np.save(tmp_path / f"{i}.npy", p)
    paths = [str(tmp_path / f"{i}.npy") for i in range(3)]
    probed = [(p.shape, p.dtype) for p in parts]
    x = concat_array(paths, [7, 0, 5], (2,), np.dtype("f4"), lambda p, lo, hi: read_npy(p, {})[lo:hi],
                     rows_per_chunk=3, probed=probed)
    np.testing.assert_array_equal(x.compute(scheduler="sync"), np.concatenate(parts))


# -- row blocks aligned to a file's chunks ------------------------------------------------


def test_row_step_is_a_multiple_of_the_alignment_near_the_target():
    assert row_step(64) == (32 << 20) // 64
    assert row_step(64, 250_000) == 500_000  # 524,288 rows of target: two chunks
    assert row_step(64, 1000) % 1000 == 0 and abs(row_step(64, 1000) - (32 << 20) // 64) <= 500
    assert row_step(64, 1_000_000) == 1_000_000  # a chunk over the target: one chunk a block
    assert row_step(64, 10_000_000) == (32 << 20) // 64  # past the limit: memory bound kept
    assert row_blocks(7, 3) == [(0, 3), (3, 6), (6, 7)]


def test_aligned_blocks_start_on_chunk_edges_and_read_as_h5py(tmp_path):
    data = np.random.default_rng(0).standard_normal((1000, 4)).astype("f4")
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f.create_dataset("x", data=data, chunks=(64, 1), compression="gzip")
    with h5py.File(tmp_path / "c.h5") as f:
        expected, chunk_rows = f["x"][()], f["x"].chunks[0]
    shape, dtype, align = probe_hdf5(str(tmp_path / "c.h5"), {}, dataset="x", layout=True)
    assert (shape, dtype, align) == (expected.shape, expected.dtype, chunk_rows)
    x = concat_array([str(tmp_path / "c.h5")], [1000], (4,), dtype,
                     lambda p, lo, hi: read_hdf5(p, {}, dataset="x", rows=slice(lo, hi)), row_align=[align],
                     block_bytes=150 * 16)  # 150 rows: rounded to 128, two chunks
    assert x.chunks[0] == (128,) * 7 + (104,)
    starts = np.cumsum((0,) + x.chunks[0][:-1])
    assert all(s % chunk_rows == 0 for s in starts)
    np.testing.assert_array_equal(x.compute(scheduler="sync"), expected)


def test_a_stacked_file_rewritten_wider_is_refused_not_cast_back(tmp_path):
    for name in ("a", "b"):
        np.save(tmp_path / f"{name}.npy", np.arange(4, dtype="i2"))
    x = pipeline.load(str(tmp_path / "*.npy"), combine="stack")
    np.save(tmp_path / "b.npy", np.array([1, 2, 3, 70000], dtype="i4"))  # 70000 does not fit int16
    assert np.load(tmp_path / "b.npy").astype("i2")[3] != 70000  # what a cast would store
    with pytest.raises(LoaderError, match=r"b\.npy: read as int32, which the array's dtype int16"):
        x.compute(scheduler="sync")


@given(st.lists(st.lists(st.integers(0, 6), min_size=3, max_size=3), min_size=1, max_size=6),
       st.lists(st.booleans(), min_size=6, max_size=6))
@settings(max_examples=60, deadline=None)
def test_pad_shape_is_the_largest_length_of_each_axis_and_never_cuts(lengths, trailing):
    """pad_shape against numpy: the maximum of the shapes along each axis (a trailing
    axis of length 1 added to some files, as stacked files may have), into which
    np.pad fits every file without cutting, whatever the files' order."""
    first = (*lengths[0], 1)
    shapes = [(*n, 1) if t else tuple(n) for n, t in zip(lengths, trailing)]
    reference = (*np.max(np.array(lengths), axis=0), 1)
    assert pad_shape(shapes, first) == tuple(int(r) for r in reference)
    assert pad_shape(shapes[::-1], first) == pad_shape(shapes, first)
    for n in lengths:
        padded = np.pad(np.ones(n), [(0, r - k) for k, r in zip(n, reference)])  # negative widths would raise
        assert padded.sum() == np.prod(n)
