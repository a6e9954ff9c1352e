"""npy, npz, images and HDF5: header-only probes, stacking, labels, clear errors."""

from __future__ import annotations

import re

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from PIL import Image

import pipeline
from pipeline.errors import EmptyInputError, FormatMismatchError, LoaderError, ShapeMismatchError
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
    with pytest.raises(ShapeMismatchError,
                       match=r"a\.npy: has shape \(4, 4\), but 1 file\(s\) differ .*b\.npy: \(3, 5\)") as e:
        pipeline.load(str(tmp_path / "*.npy"))
    assert "combine='concat'" not in str(e.value)  # b differs along axis 1 too: joining them is no fix
    assert re.search(r"pad \(zeros .*largest length along it among the files, \(4, 5\) here; it never cuts\), crop "
                     r"\(each file cut to the first file's shape, .*; it would drop 3 values here\)", str(e.value))
    padded = pipeline.load(str(tmp_path / "*.npy"), on_mismatch="pad").compute()
    files = [np.load(tmp_path / n) for n in ("a.npy", "b.npy", "c.npy")]
    np.testing.assert_array_equal(padded, np.stack([np.pad(f, ((0, 4 - f.shape[0]), (0, 5 - f.shape[1])))
                                                    for f in files]))
    cropped = pipeline.load(str(tmp_path / "*.npy"), on_mismatch="crop").compute()
    assert cropped.shape == (3, 4, 4) and cropped[1].sum() == 3 * 4  # cut to 4 columns, zeros to 4 rows
    resized = pipeline.load(str(tmp_path / "*.npy"), on_mismatch="resize").compute()
    assert resized.shape == (3, 4, 4) and (resized == 1).all()


def write_token_shards(folder, lengths) -> list[np.ndarray]:
    """1-D uint16 token shards (GPT-2 ids), one ``shard_NNNNNN.npy`` per length, in order."""
    rng = np.random.default_rng(0)
    raw = [rng.integers(0, 50257, n, dtype=np.uint16) for n in lengths]
    for i, r in enumerate(raw):
        np.save(folder / f"shard_{i:06d}.npy", r)
    return raw


def test_token_shards_of_other_lengths_are_told_to_concat_and_concat_keeps_every_token(tmp_path):
    """1-D shards of other lengths: the error named pad, crop and resize only, each of which
    changes tokens; combine='concat' joins them whole."""
    raw = write_token_shards(tmp_path, [1000, 1503, 817])
    with pytest.raises(ShapeMismatchError, match=r"shard_000000\.npy: has shape \(1000,\), but 2 file\(s\) differ "
                                                 r".*along axis 0 only .*combine='concat' joins them along it.* "
                                                 r"on_mismatch: pad .*\(1503,\) here; it never cuts\), crop .*drop "
                                                 r"503 values here\) or resize .*nearest-neighbour resampling, which "
                                                 r"changes values"):
        pipeline.load(str(tmp_path / "*.npy"))
    joined = pipeline.load(str(tmp_path / "*.npy"), combine="concat")
    assert joined.dtype == np.uint16
    np.testing.assert_array_equal(joined.compute(), np.concatenate(raw))


def _padded(arrays, shape) -> np.ndarray:
    """The numpy reference: each array padded with zeros at the end of each axis to ``shape``."""
    return np.stack([np.pad(a, [(0, t - n) for n, t in zip(a.shape, shape)]) for a in arrays])


def test_pad_pads_every_shard_to_the_longest_and_crop_still_cuts_to_the_first(tmp_path):
    """on_mismatch='pad' padded to the first file's length and refused a longer file:
    shards sorted shortest first could not be padded at all. Pad now pads to the
    longest (as torch's pad_sequence), never cutting; crop keeps the first's length."""
    raw = write_token_shards(tmp_path, [1000, 1503, 817, 1200])
    padded = pipeline.load(str(tmp_path / "*.npy"), on_mismatch="pad")
    assert padded.shape == (4, 1503)  # from the headers, nothing read
    np.testing.assert_array_equal(padded.compute(), _padded(raw, (1503,)))
    expected = np.zeros((4, 1000), np.uint16)
    for i, r in enumerate(raw):
        expected[i, : min(1000, r.size)] = r[:1000]
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "*.npy"), on_mismatch="crop").compute(), expected)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_pad_pads_to_the_largest_shape_whatever_the_files_order(tmp_path, order):
    """The user's files: (4, 5) and (5, 6) loaded as (2, 5, 6) larger first, and were
    refused smaller first (the sorted-glob order)."""
    arrays = [np.arange(20, dtype=np.float32).reshape(4, 5) + 1, np.arange(30, dtype=np.float32).reshape(5, 6) + 1]
    for name, a in zip(("a_small.npy", "b_big.npy"), arrays):
        np.save(tmp_path / name, a)
    paths = [str(tmp_path / ("a_small.npy", "b_big.npy")[i]) for i in order]
    got = pipeline.load(paths, on_mismatch="pad")
    assert got.shape == (2, 5, 6)
    np.testing.assert_array_equal(got.compute(), _padded([arrays[i] for i in order], (5, 6)))


def test_pad_takes_each_axis_longest_from_any_file_and_a_trailing_axis_of_one(tmp_path):
    """The largest length of each axis may come from a different file; a file with a
    trailing axis of length 1 more than the first counts without it."""
    arrays = [np.full((2, 4), 1.0), np.full((3, 2, 1), 2.0), np.full((1, 5), 3.0)]
    for i, a in enumerate(arrays):
        np.save(tmp_path / f"f{i}.npy", a)
    got = pipeline.load(str(tmp_path / "*.npy"), on_mismatch="pad").compute()
    np.testing.assert_array_equal(got, _padded([a.reshape(a.shape[:2]) for a in arrays], (3, 5)))


@pytest.mark.parametrize("shape, target", [((3, 5), (4, 4)), ((7,), (7,)), ((2, 9, 4), (3, 8, 4)), ((1,), (6,)),
                                           ((5, 6, 1), (4, 6)), ((5, 6), (4, 6, 1)), ((0, 3), (2, 2))])
def test_values_cut_counts_what_falls_outside_the_target(shape, target):
    from pipeline.loaders.arrays import values_cut

    a = np.ones(shape)
    a = a[..., None] if a.ndim < len(target) else a[..., 0] if a.ndim > len(target) else a
    kept = a[tuple(slice(0, t) for t in target)]
    assert values_cut(shape, target) == a.size - kept.size


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
    for marks in (dict(delimiter=";"), dict(decimal=",")):  # CSV's marks: ignored silently before
        with pytest.raises(FormatMismatchError, match=r"x\.npy: source\.delimiter and source\.decimal are for CSV"):
            open_source(str(tmp_path / "x.npy"), **marks)


def _split_tree(root) -> None:
    """train/ and val/ of 4 gray images each (pixel value = index + 10 * split), and one
    manifest for both splits, as many public data sets ship it."""
    for s, split in enumerate(("train", "val")):
        (root / split).mkdir()
        for i in range(4):
            Image.new("L", (3, 3), color=i + 10 * s).save(root / split / f"{i}.png")
    rows = [(f"{split}/{i}.png", "ab"[i % 2]) for split in ("val", "train") for i in (3, 2, 1, 0)]
    pacsv.write_csv(pa.table({"path": [p for p, _ in rows], "label": [y for _, y in rows]}), root / "labels.csv")


def test_paths_beside_a_manifest_choose_its_rows_in_manifest_order(tmp_path):
    _split_tree(tmp_path)
    manifest = pacsv.read_csv(tmp_path / "labels.csv").to_pandas()
    val = manifest[manifest.path.str.startswith("val/")]  # the reference: the manifest's val rows, its order
    for paths in (str(tmp_path / "val" / "*.png"), str(tmp_path / "val")):
        src = open_source(paths, labels=str(tmp_path / "labels.csv"))
        assert [f.path for f in src.files] == [str(tmp_path / p) for p in val.path]
        expected = np.stack([np.asarray(Image.open(tmp_path / p)) for p in val.path])
        np.testing.assert_array_equal(src.array.compute(), expected)
        assert src.classes == ("a", "b")
        assert [src.classes[i] for i in src.labels.compute()] == list(val.label)


def test_paths_beside_a_manifest_that_match_none_of_its_files_are_refused(tmp_path):
    _split_tree(tmp_path)
    manifest = str(tmp_path / "labels.csv")
    with pytest.raises(EmptyInputError, match=r"no_such_dir/\*\.png: matched no file"):
        open_source(str(tmp_path / "no_such_dir" / "*.png"), labels=manifest)
    (tmp_path / "test").mkdir()
    Image.new("L", (3, 3)).save(tmp_path / "test" / "0.png")
    with pytest.raises(EmptyInputError, match=r"test/\*\.png: matched 1 file\(s\) .*none of them listed in the "
                                              r"manifest .*labels\.csv"):
        open_source(str(tmp_path / "test" / "*.png"), labels=manifest)
    with pytest.raises(LoaderError, match=r"test/0\.png: is named in paths but not listed in the manifest"):
        open_source([str(tmp_path / "val" / "*.png"), str(tmp_path / "test" / "0.png")], labels=manifest)


@pytest.mark.parametrize("labels, dtype", [
    (["1.0", "2.0", "10.0", "2.5"], np.float64),  # regression targets: the numbers
    (["1.0", "2.0", "10.0", "3.0"], np.int64),  # integer classes a tool exported as floats
    (["1", "2", "10", "3"], np.int64),
])
@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_numeric_manifest_labels_are_kept_as_numbers(tmp_path, labels, dtype, suffix):
    import pandas as pd

    for i in range(4):
        Image.new("L", (2, 2), color=i).save(tmp_path / f"{i}.png")
    text = "path,label\n" + "".join(f"{i}.png,{y}\n" for i, y in enumerate(labels))
    (tmp_path / "m.csv").write_text(text)  # written by hand: "1.0" stays "1.0"
    expected = pd.read_csv(tmp_path / "m.csv")
    if suffix == "parquet":  # a float64 (or int64) column
        expected.to_parquet(tmp_path / "m.parquet")
    src = open_source(labels=str(tmp_path / f"m.{suffix}"))
    y = src.labels.compute()
    assert src.classes is None and y.dtype == dtype
    np.testing.assert_array_equal(y, expected.label.to_numpy())


def test_classes_pin_text_manifest_labels(tmp_path):
    _split_tree(tmp_path)
    src = open_source(labels=str(tmp_path / "labels.csv"), classes=["b", "c", "a"])
    manifest = pacsv.read_csv(tmp_path / "labels.csv").to_pandas()
    assert src.classes == ("b", "c", "a")
    np.testing.assert_array_equal(src.labels.compute(), [("b", "c", "a").index(y) for y in manifest.label])
    with pytest.raises(LoaderError, match=r"labels\.csv: line 2 \(the header is line 1\) \(.*val/3\.png\) has "
                                          r"label 'b', which classes=\['a'\] does not list"):
        open_source(labels=str(tmp_path / "labels.csv"), classes=["a"])
