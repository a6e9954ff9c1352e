"""npy, npz, images and HDF5: header-only probes, stacking, labels, clear errors."""

from __future__ import annotations

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from PIL import Image

import pipeline
from pipeline.errors import FormatMismatchError, LoaderError, ShapeMismatchError
from pipeline.loaders import open_source


def test_npy_stack_equals_np_stack_and_reads_lazily(tmp_path):
    arrays = [np.full((4, 3), i, np.float32) for i in range(10)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"s{i:02d}.npy", a)
    arr = pipeline.load(str(tmp_path / "*.npy"), files_per_chunk=3)
    assert arr.shape == (10, 4, 3) and arr.numblocks[0] == 4
    np.testing.assert_array_equal(arr.compute(), np.stack(arrays))


def test_shape_mismatch_lists_offenders_unless_fixed(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((4, 4), np.float32))
    np.save(tmp_path / "b.npy", np.ones((3, 5), np.float32))
    np.save(tmp_path / "c.npy", np.ones((4, 4), np.float32))
    with pytest.raises(ShapeMismatchError, match=r"a\.npy: has shape \(4, 4\), but 1 file\(s\) differ .*b\.npy: \(3, 5\)"):
        pipeline.load(str(tmp_path / "*.npy"))
    padded = pipeline.load(str(tmp_path / "*.npy"), on_mismatch="pad").compute()
    assert padded.shape == (3, 4, 4) and padded[1].sum() == 3 * 4  # cropped to 4 columns, padded to 4 rows
    resized = pipeline.load(str(tmp_path / "*.npy"), on_mismatch="resize").compute()
    assert resized.shape == (3, 4, 4) and (resized == 1).all()


def test_pickled_truncated_and_impostor_npy(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(FormatMismatchError, match=r"obj\.npy: holds Python objects .*pickle"):
        pipeline.load(str(tmp_path / "obj.npy"))
    np.save(tmp_path / "big.npy", np.zeros((100, 100), np.float32))
    data = (tmp_path / "big.npy").read_bytes()
    (tmp_path / "big.npy").write_bytes(data[:500])
    with pytest.raises(LoaderError, match=r"big\.npy: truncated: the header declares \(100, 100\)"):
        pipeline.load(str(tmp_path / "big.npy"))
    Image.new("RGB", (4, 4)).save(tmp_path / "photo.jpg")
    (tmp_path / "photo.jpg").rename(tmp_path / "photo.npy")
    with pytest.raises(FormatMismatchError, match=r"photo\.npy: expected an \.npy file"):
        pipeline.load(str(tmp_path / "photo.npy"))


def test_images_with_folder_labels_resize_and_mode(tmp_path):
    rng = np.random.default_rng(0)
    for cls in ("dog", "cat"):
        (tmp_path / cls).mkdir()
        for i in range(3):
            Image.fromarray(rng.integers(0, 255, (10 + i, 12, 3), dtype=np.uint8)).save(tmp_path / cls / f"{i}.png")
    src = open_source(str(tmp_path / "**" / "*.png"), labels="folder", shape=(8, 8), mode="L")
    assert src.array.shape == (6, 8, 8) and src.array.dtype == np.uint8
    assert src.classes == ("cat", "dog")
    np.testing.assert_array_equal(src.labels.compute(), [0, 0, 0, 1, 1, 1])
    first = np.asarray(Image.open(tmp_path / "cat" / "0.png").convert("L").resize((8, 8), Image.Resampling.BILINEAR))
    np.testing.assert_array_equal(src.array[0].compute(), first)
    with pytest.raises(ShapeMismatchError, match="differ"):
        open_source(str(tmp_path / "**" / "*.png"))  # 10, 11, 12 rows without a target shape
    # One label per file cannot follow files joined row by row, and load has no labels to return.
    with pytest.raises(LoaderError, match=r"labels='folder' gives one label per file, but combine='concat'"):
        open_source(str(tmp_path / "**" / "*.png"), labels="folder", shape=(8, 8), mode="L", combine="concat")
    with pytest.raises(LoaderError, match=r"returns the samples only; for their labels use .*open_source"):
        pipeline.load(str(tmp_path / "**" / "*.png"), labels="folder", shape=(8, 8), mode="L")


def test_a_jpg_that_is_not_an_image(tmp_path):
    np.save(tmp_path / "x.npy", np.zeros(3))
    (tmp_path / "x.npy").rename(tmp_path / "x.jpg")
    with pytest.raises(FormatMismatchError, match=r"x\.jpg: expected an image \(jpg, png, tiff\), found an \.npy array"):
        pipeline.load(str(tmp_path / "x.jpg"))
    Image.new("RGB", (4, 4)).save(tmp_path / "real.png")
    (tmp_path / "real.png").rename(tmp_path / "real.jpg")
    with pytest.raises(FormatMismatchError, match=r"real\.jpg: expected a JPEG image from its suffix, found PNG"):
        pipeline.load(str(tmp_path / "real.jpg"))


def test_manifest_labels_choose_and_order_files(tmp_path):
    for i in range(4):
        Image.new("L", (5, 5), color=i * 10).save(tmp_path / f"im{i}.png")
    pacsv.write_csv(pa.table({"path": ["im3.png", "im0.png", "im2.png"], "label": ["b", "a", "b"], "w": [1, 2, 3]}),
                    tmp_path / "manifest.csv")
    src = open_source(labels=str(tmp_path / "manifest.csv"))
    assert src.array.shape == (3, 5, 5) and src.classes == ("a", "b")
    np.testing.assert_array_equal(src.array[:, 0, 0].compute(), [30, 0, 20])
    np.testing.assert_array_equal(src.labels.compute(), [1, 0, 1])


def test_hdf5_concat_reads_by_block(tmp_path):
    for i in range(2):
        with h5py.File(tmp_path / f"p{i}.h5", "w") as f:
            f["grp/data"] = np.arange(60, dtype=np.float32).reshape(30, 2) + 100 * i
    arr = pipeline.load(str(tmp_path / "*.h5"), combine="concat", dataset="grp/data", chunk_rows=8)
    assert arr.chunks[0] == (8, 8, 8, 6, 8, 8, 8, 6)
    expected = np.concatenate([np.arange(60).reshape(30, 2) + 100 * i for i in range(2)])
    np.testing.assert_array_equal(arr.compute(), expected)
    with pytest.raises(LoaderError, match=r"p0\.h5: has no dataset 'nope'"):
        pipeline.load(str(tmp_path / "*.h5"), dataset="nope")


def test_npz_member(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.ones((2, 2)), y=np.zeros(3))
    with pytest.raises(LoaderError, match=r"a\.npz: holds arrays \['x', 'y'\]; choose one with key"):
        pipeline.load(str(tmp_path / "a.npz"))
    assert pipeline.load(str(tmp_path / "a.npz"), key="x").compute().sum() == 4


def test_a_symlink_loop_in_a_recursive_glob_is_named_not_read_many_times(tmp_path):
    (tmp_path / "a").mkdir()
    np.save(tmp_path / "a" / "x.npy", np.zeros(3))
    (tmp_path / "a" / "up").symlink_to("..")
    with pytest.raises(LoaderError, match=r"a/x\.npy: is the same file as .* symlink loop"):
        pipeline.load(str(tmp_path / "**" / "*.npy"))


def test_a_huge_declared_shape_in_a_tiny_file_is_refused_before_reading(tmp_path):
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1, np.float32))
    header["shape"] = (10**9, 10**3)
    with open(tmp_path / "huge.npy", "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, header)
        fh.write(b"\x00" * 64)
    with pytest.raises(LoaderError, match=r"huge\.npy: truncated: the header declares \(1000000000, 1000\)"):
        pipeline.load(str(tmp_path / "huge.npy"))


def test_timestamp_for_files_without_columns_is_refused(tmp_path):
    # npy, HDF5 and images have no columns: a timestamp column was ignored silently.
    np.save(tmp_path / "x.npy", np.zeros((5, 2)))
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["x"] = np.zeros((5, 2))
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "x.png")
    for name, kind in (("x.npy", "npy"), ("x.h5", "hdf5"), ("x.png", "image")):
        with pytest.raises(FormatMismatchError, match=rf"x\.{name[2:]}: timestamp='timestamp' names a column of a "
                           rf"table \(CSV, Parquet\); {kind} files have no columns"):
            open_source(str(tmp_path / name), combine="concat" if kind != "image" else None, timestamp="timestamp")
    assert open_source(str(tmp_path / "x.h5"), combine="concat").array.shape == (5, 2)  # without it, read as before
