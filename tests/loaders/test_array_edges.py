"""Edge cases of array files (npy, HDF5, images, manifests), each against numpy, h5py or
Pillow read directly: dtypes of joined files, 0-d arrays, shapes that cannot be fitted,
HDF5 dataset choice, manifest paths and the messages of damaged files; dtype= and nan=
checked as values are read, options of other formats, files listed twice, and many small
files read several to a task."""

from __future__ import annotations

import io
import os
import re

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

import pipeline
from pipeline.errors import ConfigError, FormatMismatchError, InvalidValueError, LoaderError, ShapeMismatchError
from pipeline.loaders import open_source


# -- dtypes of joined files --------------------------------------------------------------


@pytest.mark.parametrize("first, second", [
    (np.array([1, 2, 3], np.int8), np.array([1000.5, -3.75])),
    (np.array([1, 2], np.uint8), np.array([300.7, -1.5], np.float32)),
    (np.array([-5, 7], np.int16), np.array([60000, 2], np.uint16)),
])
def test_npy_concat_reads_in_the_common_dtype(tmp_path, first, second):
    np.save(tmp_path / "a.npy", first)
    np.save(tmp_path / "b.npy", second)
    arr = pipeline.load(str(tmp_path / "*.npy"), combine="concat")
    expected = np.concatenate([np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")])
    assert arr.dtype == expected.dtype
    got = arr.compute()
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_hdf5_concat_reads_in_the_common_dtype(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = np.array([[1], [2]], np.uint8)
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["x"] = np.array([[300.7], [-1.5]])
    parts = []
    for name in ("a.h5", "b.h5"):
        with h5py.File(tmp_path / name, "r") as f:
            parts.append(f["x"][()])
    expected = np.concatenate(parts)
    got = pipeline.load(str(tmp_path / "*.h5"), dataset="x", combine="concat", chunk_rows=1).compute()
    assert got.dtype == expected.dtype == np.float64
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("combine", ["stack", "concat"])
def test_strings_beside_numbers_are_refused_naming_both_files(tmp_path, combine):
    np.save(tmp_path / "s1.npy", np.array(["ab", "c"]))
    np.save(tmp_path / "s2.npy", np.array([1.5, 2.0]))
    assert np.load(tmp_path / "s1.npy").dtype.kind == "U"  # numpy would promote to strings
    with pytest.raises(LoaderError, match=r"s1\.npy: holds <U2 values, but .*s2\.npy holds float64: strings and "
                                          r"numbers cannot be combined"):
        pipeline.load(str(tmp_path / "s*.npy"), combine=combine)


def test_strings_alone_still_stack(tmp_path):
    np.save(tmp_path / "s1.npy", np.array(["ab", "c"]))
    np.save(tmp_path / "s2.npy", np.array(["xyz", "w"]))
    expected = np.stack([np.load(tmp_path / "s1.npy"), np.load(tmp_path / "s2.npy")])
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "s*.npy")).compute(), expected)


def test_dtypes_without_a_common_one_are_refused(tmp_path):
    np.save(tmp_path / "a.npy", np.array(["2020-01-01"], "datetime64[ns]"))
    np.save(tmp_path / "b.npy", np.array([1.5]))
    with pytest.raises(LoaderError, match=r"a\.npy: holds datetime64\[ns\] values, but .*b\.npy holds float64, and "
                                          r"numpy has no common dtype"):
        pipeline.load(str(tmp_path / "*.npy"), combine="concat")


# -- 0-d arrays and shapes that cannot be fitted -------------------------------------------


def test_zero_d_npy_and_hdf5_cannot_be_concatenated(tmp_path):
    for i in range(2):
        np.save(tmp_path / f"z{i}.npy", np.float32(i))
    assert np.load(tmp_path / "z0.npy").ndim == 0
    with pytest.raises(ShapeMismatchError, match=r"z0\.npy: is a 0-d array .*cannot be joined along axis 0; use "
                                                 r"combine='stack'"):
        pipeline.load(str(tmp_path / "*.npy"), combine="concat")
    stacked = pipeline.load(str(tmp_path / "*.npy")).compute()  # stacking them is fine
    np.testing.assert_array_equal(stacked, np.stack([np.load(tmp_path / f"z{i}.npy") for i in range(2)]))
    with h5py.File(tmp_path / "s.h5", "w") as f:
        f["v"] = 3.5
    with h5py.File(tmp_path / "s.h5", "r") as f:
        assert f["v"].shape == ()
    with pytest.raises(ShapeMismatchError, match=r"s\.h5: is a 0-d array"):
        pipeline.load(str(tmp_path / "s.h5"), dataset="v", combine="concat")


@pytest.mark.parametrize("how", ["crop", "pad", "resize"])
def test_another_number_of_dimensions_is_refused_when_the_array_is_built(tmp_path, how):
    np.save(tmp_path / "a.npy", np.ones((3, 4)))
    np.save(tmp_path / "b.npy", np.ones((3,)))
    shapes = [np.load(tmp_path / n).shape for n in ("a.npy", "b.npy")]
    with pytest.raises(ShapeMismatchError, match=rf"b\.npy: has shape \(3,\) \(1-d\), but .*a\.npy has \(3, 4\) "
                                                 rf"\(2-d\): on_mismatch='{how}'"):
        pipeline.load(str(tmp_path / "*.npy"), on_mismatch=how)  # nothing computed
    assert shapes == [(3, 4), (3,)]


def test_a_trailing_axis_of_one_is_still_fitted(tmp_path):
    np.save(tmp_path / "a.npy", np.ones((3, 4, 1)))
    np.save(tmp_path / "b.npy", np.full((2, 4), 2.0))
    got = pipeline.load(str(tmp_path / "*.npy"), on_mismatch="pad").compute()
    expected = np.zeros((2, 3, 4, 1))
    expected[0] = np.load(tmp_path / "a.npy")
    expected[1, :2] = np.load(tmp_path / "b.npy")[..., None]
    np.testing.assert_array_equal(got, expected)


# -- HDF5: which dataset ----------------------------------------------------------------------


def test_hdf5_files_are_all_read_at_the_first_files_dataset(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["prices"] = np.ones((3, 2))
    with h5py.File(tmp_path / "b.h5", "w") as f:
        f["volumes"] = np.full((3, 2), 7.0)
    with h5py.File(tmp_path / "b.h5", "r") as f:
        assert "prices" not in f
    with pytest.raises(LoaderError, match=r"b\.h5: has no dataset 'prices' \(its datasets: \['volumes'\]\); 'prices' "
                                          r"is the only dataset of .*a\.h5, the first file"):
        pipeline.load(str(tmp_path / "*.h5"), combine="concat")
    src = open_source(str(tmp_path / "*.h5"), combine="concat", on_error="skip")
    assert [f.path for f in src.files] == [str(tmp_path / "a.h5")]
    assert "no dataset 'prices'" in src.skipped[0][1]


def test_hdf5_files_sharing_their_one_dataset_join_without_dataset(tmp_path):
    parts = []
    for i in range(2):
        with h5py.File(tmp_path / f"p{i}.h5", "w") as f:
            f["grp/x"] = np.arange(6.0).reshape(3, 2) + 10 * i
        with h5py.File(tmp_path / f"p{i}.h5", "r") as f:
            parts.append(f["grp/x"][()])
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "*.h5"), combine="concat").compute(),
                                  np.concatenate(parts))


def test_hdf5_dataset_naming_a_group_is_refused(tmp_path):
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["grp/sub/data"] = np.ones((4, 2))
        f["grp/sub/more"] = np.zeros(3)
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert isinstance(f["grp/sub"], h5py.Group)
    with pytest.raises(LoaderError, match=r"f\.h5: 'grp/sub' is a group, not a dataset \(datasets under it: "
                                          r"\['grp/sub/data', 'grp/sub/more'\]\)"):
        pipeline.load(str(tmp_path / "f.h5"), dataset="grp/sub")
    with pytest.raises(LoaderError, match=r"f\.h5: has no dataset 'nope' \(its datasets: \['grp/sub/data', "
                                          r"'grp/sub/more'\]\)"):
        pipeline.load(str(tmp_path / "f.h5"), dataset="nope")


def test_hdf5_without_dataset_lists_nested_datasets(tmp_path):
    with h5py.File(tmp_path / "f.h5", "w") as f:
        f["top"] = np.ones(2)
        f["grp/sub/data"] = np.ones((4, 2))
    names: list[str] = []
    with h5py.File(tmp_path / "f.h5", "r") as f:
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    with pytest.raises(LoaderError, match=r"f\.h5: holds datasets \[" + ", ".join(f"'{n}'" for n in names)
                       + r"\]; choose one with dataset:"):
        pipeline.load(str(tmp_path / "f.h5"))
    with h5py.File(tmp_path / "g.h5", "w") as f:
        f["grp/only"] = np.arange(4.0)
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "g.h5")).compute()[0], np.arange(4.0))


# -- manifests ----------------------------------------------------------------------------------


def test_manifest_by_a_relative_path_gives_absolute_file_paths(tmp_path, monkeypatch):
    (tmp_path / "imgs").mkdir()
    pixels = np.arange(16, dtype=np.uint8).reshape(4, 4)
    Image.fromarray(pixels).save(tmp_path / "imgs" / "a.png")
    (tmp_path / "sub").mkdir()
    Image.fromarray(pixels[::-1].copy()).save(tmp_path / "sub" / "b.png")
    (tmp_path / "manifest.csv").write_text("path,label\nimgs/a.png,cat\nimgs/../sub/b.png,dog\n")
    monkeypatch.chdir(tmp_path)
    src = open_source(labels="manifest.csv")
    expected = [os.path.abspath(tmp_path / "imgs" / "a.png"), os.path.abspath(tmp_path / "sub" / "b.png")]
    assert [f.path for f in src.files] == expected and all(os.path.isabs(f.path) for f in src.files)
    monkeypatch.chdir(tmp_path / "imgs")  # a worker elsewhere still reads the same files
    np.testing.assert_array_equal(src.array.compute(), np.stack([np.asarray(Image.open(p)) for p in expected]))
    assert src.classes == ("cat", "dog") and src.labels.compute().tolist() == [0, 1]


def test_manifest_row_without_a_path_or_label_is_named_where_its_reader_finds_it(tmp_path):
    (tmp_path / "manifest.csv").write_text("path,label\na.png,cat\n,cat\n")
    with pytest.raises(LoaderError, match=r"manifest\.csv: line 3 \(the header is line 1\) has no path"):
        open_source(labels=str(tmp_path / "manifest.csv"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"path": ["a.png", "b.png"], "label": ["cat", None]}), tmp_path / "m.parquet")
    with pytest.raises(LoaderError, match=r"m\.parquet: row 2 \(counted from 1\) \(.*b.png\) has no label"):
        open_source(labels=str(tmp_path / "m.parquet"))


def test_manifest_row_of_a_missing_file_is_named_by_the_manifest_and_its_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    Image.fromarray(np.zeros((2, 2), np.uint8)).save(tmp_path / "a.png")
    assert not (tmp_path / "gone.png").exists()
    (tmp_path / "m.csv").write_text("path,label\na.png,cat\na.png,dog\ngone.png,cat\n")
    missing = re.escape(str(tmp_path / "gone.png"))
    with pytest.raises(LoaderError, match=rf"^{missing}: no such file; listed on line 4 \(the header is line 1\) of "
                                          rf"the manifest {re.escape(str(tmp_path / 'm.csv'))}$"):
        open_source(labels=str(tmp_path / "m.csv"))
    pq.write_table(pa.table({"path": ["gone.png", "a.png"], "label": [1, 0]}), tmp_path / "m.parquet")
    with pytest.raises(LoaderError, match=rf"^{missing}: no such file; listed on row 1 \(counted from 1\) of the "
                                          r"manifest .*m\.parquet$"):
        open_source(labels=str(tmp_path / "m.parquet"))
    src = open_source(labels=str(tmp_path / "m.csv"), on_error="skip")  # skipping still drops that row alone
    assert [p for p, _ in src.skipped] == [str(tmp_path / "gone.png")] and src.labels.compute().tolist() == [0, 1]


# -- messages of damaged files -------------------------------------------------------------------


@pytest.mark.parametrize("keep, said", [
    (8, r"truncated header: the file is 8 bytes, too short for an \.npy version 1 header"),
    (4, r"truncated: the file is 4 bytes, too short for an \.npy header"),
    (11, r"truncated header: its length field declares \d+ header bytes from byte 10, the file holds 1 of them"),
])
def test_npy_cut_inside_its_header_is_called_truncated(tmp_path, keep, said):
    np.save(tmp_path / "full.npy", np.zeros(10))
    (tmp_path / "cut.npy").write_bytes((tmp_path / "full.npy").read_bytes()[:keep])
    with pytest.raises(ValueError):  # numpy itself cannot read it either
        np.load(tmp_path / "cut.npy")
    with pytest.raises(FormatMismatchError, match=r"cut\.npy: " + said) as info:
        pipeline.load(str(tmp_path / "cut.npy"))
    assert "found b'\\x93NUMPY'" not in str(info.value)


def test_empty_npy_is_called_empty(tmp_path):
    (tmp_path / "e.npy").write_bytes(b"")
    with pytest.raises(FormatMismatchError, match=r"e\.npy: is empty \(0 bytes\)"):
        pipeline.load(str(tmp_path / "e.npy"))


@pytest.mark.parametrize("fmt, suffix, keep", [("JPEG", "jpg", 300), ("PNG", "png", 20)])
def test_image_cut_inside_its_header_is_called_damaged_with_pillows_reason(tmp_path, fmt, suffix, keep):
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(buf, fmt)
    (tmp_path / f"cut.{suffix}").write_bytes(buf.getvalue()[:keep])
    with pytest.raises(Exception) as pillow:  # Pillow's own reason, the reference
        Image.open(tmp_path / f"cut.{suffix}")
    with pytest.raises(FormatMismatchError) as info:
        pipeline.load(str(tmp_path / f"cut.{suffix}"))
    msg = str(info.value)
    assert f"cut.{suffix}: is a truncated or damaged {fmt} image" in msg and str(pillow.value) in msg
    assert "expected an image" not in msg


# -- empty inputs and directories ----------------------------------------------------------------


def test_npy_files_of_no_rows_concatenate_to_an_empty_array(tmp_path):
    parts = [np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32)]
    for i, a in enumerate(parts):
        np.save(tmp_path / f"e{i}.npy", a)
    got = pipeline.load(str(tmp_path / "*.npy"), combine="concat").compute()
    expected = np.concatenate(parts)
    assert got.shape == expected.shape and got.dtype == expected.dtype


def test_a_directory_is_named_with_a_glob_of_its_files(tmp_path):
    (tmp_path / "flat").mkdir()
    for name in ("a.png", "b.png", "c.npy"):
        (tmp_path / "flat" / name).write_bytes(b"")
    (tmp_path / "classes" / "cats").mkdir(parents=True)
    (tmp_path / "classes" / "cats" / "0.jpg").write_bytes(b"")
    with pytest.raises(FormatMismatchError, match=r"flat: is a directory, not a file; give a glob of its files, "
                                                  r"such as '.*/flat/\*\.png'"):
        pipeline.load(str(tmp_path / "flat"))
    with pytest.raises(FormatMismatchError, match=r"classes: is a directory.*'.*/classes/\*/\*\.jpg'"):
        pipeline.load(str(tmp_path / "classes") + "/")


# -- fitting images: height and width only ------------------------------------------------------


@pytest.mark.parametrize("how", ["pad", "crop", "resize"])
def test_fit_shape_with_axes_fits_the_leading_axes_and_keeps_the_channels(how):
    from pipeline.loaders.blocks import fit_shape

    a = np.arange(4 * 5 * 3).reshape(4, 5, 3)
    got = fit_shape(a, (6, 3, 3), how, axes=2)
    if how == "resize":
        expected = a[np.arange(6) * 4 // 6][:, np.arange(3) * 5 // 3]
    else:
        expected = np.zeros((6, 3, 3), a.dtype)
        expected[:4] = a[:, :3]
    np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match=r"only its first 2 axes are fitted"):
        fit_shape(a, (4, 5, 4), how, axes=2)  # RGB into RGBA: never


# -- dtypes that would round: int64 beside uint64 or float32 -------------------------------------

# Nanosecond timestamps of 2026: beyond 2**53, where float64 holds every other integer or fewer.
TS = 1_767_225_600_000_000_000 + np.arange(10, dtype=np.int64) * 1001


def _as_ints(a) -> list[int]:
    return [int(v) for v in np.asarray(a).ravel()]


def test_int64_beside_uint64_is_refused_rather_than_rounded_through_float64(tmp_path):
    np.save(tmp_path / "a.npy", TS[:, None])
    np.save(tmp_path / "b.npy", TS[:, None].astype(np.uint64))
    joined = np.concatenate([np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")])
    assert joined.dtype == np.float64 and _as_ints(joined) != _as_ints(np.concatenate([TS, TS]))  # numpy rounds
    with pytest.raises(LoaderError, match=r"a\.npy: holds int64 values, but .*b\.npy holds uint64: their common dtype "
                                          r"float64 holds integers exactly only up to 2\*\*53, .*dtype='int64' or "
                                          r"'uint64'"):
        pipeline.load(str(tmp_path / "*.npy"), combine="concat")
    got = pipeline.load(str(tmp_path / "*.npy"), combine="concat", dtype="int64").compute()  # chosen: checked
    assert got.dtype == np.int64 and _as_ints(got) == _as_ints(np.concatenate([TS, TS]))
    np.save(tmp_path / "c.npy", np.array([[2**63]], np.uint64))  # beyond int64
    with pytest.raises(LoaderError, match=r"c\.npy: holds 9223372036854775808 at index \(0, 0\), which "
                                          r"dtype='int64' cannot hold"):
        pipeline.load(str(tmp_path / "*.npy"), combine="concat", dtype="int64").compute()


def test_int64_beside_float32_hdf5_is_refused_and_float64_checks_each_value(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = TS[:, None]
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f["x"] = np.zeros((2, 1), np.float32)
    with pytest.raises(LoaderError, match=r"a\.h5: holds int64 values, but .*c\.h5 holds float32: their common "
                                          r"dtype float64 .*dtype='float64' reads them with each integer checked"):
        pipeline.load(str(tmp_path / "*.h5"), combine="concat")
    first = int(np.flatnonzero([int(float(v)) != int(v) for v in TS])[0])  # float64 rounds it: the first refused
    with pytest.raises(LoaderError, match=rf"a\.h5: holds {TS[first]} at index \({first}, 0\), which dtype='float64' "
                                          rf"cannot hold \(it would read as {re.escape(repr(float(TS[first])))}\)"):
        pipeline.load(str(tmp_path / "*.h5"), combine="concat", dtype="float64").compute()
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["x"] = np.arange(5, dtype=np.int64)[:, None]  # small integers: float64 holds them
    got = pipeline.load(str(tmp_path / "*.h5"), combine="concat", dtype="float64").compute()
    expected = np.concatenate([np.arange(5)[:, None], np.zeros((2, 1), np.float32)]).astype(np.float64)
    np.testing.assert_array_equal(got, expected)


def test_int32_beside_float32_still_joins_in_float64_which_holds_both(tmp_path):
    np.save(tmp_path / "a.npy", np.array([2**31 - 1, -(2**31)], np.int32))
    np.save(tmp_path / "b.npy", np.array([0.1], np.float32))
    expected = np.concatenate([np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")])
    got = pipeline.load(str(tmp_path / "*.npy"), combine="concat").compute()
    assert got.dtype == expected.dtype == np.float64
    np.testing.assert_array_equal(got, expected)


# -- dtype=: checked, not wrapped or rounded --------------------------------------------------------


@pytest.mark.parametrize("dtype, index, value, became", [
    ("int8", "(0, 0)", 16777217, 1), ("uint8", "(0, 0)", 16777217, 1), ("int16", "(0, 0)", 16777217, 1),
    ("float32", "(0, 0)", 16777217, 16777216.0),
])
def test_a_dtype_that_cannot_hold_a_value_is_refused_naming_file_index_and_value(tmp_path, dtype, index, value,
                                                                                  became):
    a = np.array([[16777217, 300, -129]], np.int64)
    np.save(tmp_path / "i.npy", a)
    with np.errstate(over="ignore"):
        assert a.astype(dtype)[0, 0] == became  # what numpy's cast would store
    with pytest.raises(LoaderError, match=rf"i\.npy: holds {value} at index {re.escape(index)}, which "
                                          rf"dtype='{dtype}' cannot hold \(it would read as {became!r}\)"):
        pipeline.load(str(tmp_path / "i.npy"), combine="concat", dtype=dtype).compute()


def test_a_dtype_that_holds_the_values_reads_them_as_numpy_casts_them(tmp_path):
    a = np.array([[70000, 300, -129]], np.int64)
    np.save(tmp_path / "i.npy", a)
    for dtype in ("int32", "float32", "float64", "int64"):
        got = pipeline.load(str(tmp_path / "i.npy"), combine="concat", dtype=dtype).compute()
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, a.astype(dtype))
    f = np.array([0.1, 1e30, -np.inf, np.nan])  # float64 to float32 rounds; inf and NaN stay
    np.save(tmp_path / "f.npy", f)
    got = pipeline.load(str(tmp_path / "f.npy"), combine="concat", dtype="float32").compute()
    np.testing.assert_array_equal(got, f.astype(np.float32))
    np.save(tmp_path / "f.npy", np.array([1.0, 1e39]))  # but a finite value that overflows is refused
    with pytest.raises(LoaderError, match=r"f\.npy: holds 1e\+39 at index \(1,\), which dtype='float32' cannot hold "
                                          r"\(it would read as inf\)"):
        pipeline.load(str(tmp_path / "f.npy"), combine="concat", dtype="float32").compute()


def test_a_stacked_file_whose_values_a_dtype_cannot_hold_is_named(tmp_path):
    np.save(tmp_path / "a.npy", np.array([1, 2, 3], np.int64))
    np.save(tmp_path / "b.npy", np.array([4, 500, 6], np.int64))
    with pytest.raises(LoaderError, match=r"b\.npy: holds 500 at index \(1,\), which dtype='uint8' cannot hold"):
        pipeline.load(str(tmp_path / "*.npy"), dtype="uint8").compute()
    np.save(tmp_path / "b.npy", np.array([4, 255, 6], np.int64))
    got = pipeline.load(str(tmp_path / "*.npy"), dtype="uint8").compute()
    np.testing.assert_array_equal(got, np.stack([np.load(tmp_path / n) for n in ("a.npy", "b.npy")]).astype(np.uint8))


def test_floats_read_as_integers_are_refused_before_reading(tmp_path):
    np.save(tmp_path / "f.npy", np.array([1.5, 2.0]))
    with pytest.raises(LoaderError, match=r"f\.npy: holds float64 values, which dtype='int64' cannot hold \(fractions "
                                          r"and NaN have no integer value"):
        pipeline.load(str(tmp_path / "f.npy"), dtype="int64")
    with pytest.raises(LoaderError, match=r"f\.npy: holds float64 values, which dtype='bool' cannot hold"):
        pipeline.load(str(tmp_path / "f.npy"), dtype=bool)


@pytest.mark.parametrize("dtype", ["bogus", "object", "U5", "datetime64[ns]"])
def test_a_dtype_that_is_not_a_numpy_number_type_is_refused_naming_the_option(tmp_path, dtype):
    np.save(tmp_path / "i.npy", np.zeros(3))
    with pytest.raises(ConfigError, match=rf"^dtype: expected a numpy dtype of numbers, .*got '{re.escape(dtype)}'"):
        pipeline.load(str(tmp_path / "i.npy"), dtype=dtype)


def test_tables_take_float32_or_float64_only(tmp_path):
    (tmp_path / "t.csv").write_text("a,b\n1,2\n3,4\n")
    with pytest.raises(ConfigError, match=r"^dtype: expected float32 or float64 for tables"):
        pipeline.load(str(tmp_path / "t.csv"), dtype="int8")
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "t.csv"), dtype="float64").compute(),
                                  np.array([[1, 2], [3, 4]], np.float64))


# -- nan= for array files ------------------------------------------------------------------------


def _nan_file(path):
    with h5py.File(path, "w") as f:
        f["x"] = np.array([[1.0, 2.0], [np.nan, 1.0], [np.inf, 2.0]], np.float32)
    with h5py.File(path, "r") as f:
        return f["x"][()]


def test_nan_raise_names_the_file_and_the_index_of_the_first_nan(tmp_path):
    ref = _nan_file(tmp_path / "n.h5")
    first = tuple(int(i) for i in np.argwhere(~np.isfinite(ref))[0])
    with pytest.raises(InvalidValueError, match=rf"n\.h5: NaN or inf at index {re.escape(str(first))}"):
        pipeline.load(str(tmp_path / "n.h5"), combine="concat", nan="raise").compute()
    np.save(tmp_path / "ok.npy", np.ones((2, 2), np.float32))
    np.save(tmp_path / "z.npy", ref)
    with pytest.raises(InvalidValueError, match=r"z\.npy: NaN or inf at index \(1, 0\)"):  # the stacked file named
        pipeline.load(str(tmp_path / "*.npy"), nan="raise", on_mismatch="crop").compute()


def test_nan_fill_replaces_nan_and_inf_and_unset_keeps_them(tmp_path):
    ref = _nan_file(tmp_path / "n.h5")
    got = pipeline.load(str(tmp_path / "n.h5"), combine="concat", nan="fill", fill_value=-1.0).compute()
    np.testing.assert_array_equal(got, np.where(np.isfinite(ref), ref, np.float32(-1)))
    kept = pipeline.load(str(tmp_path / "n.h5"), combine="concat").compute()
    np.testing.assert_array_equal(kept, ref)  # NaN compares equal here: as stored


@pytest.mark.parametrize("fill, dtype, expected", [
    (1e300, "float32", r"a value float32 holds \(at most 3\.40282e\+38 in magnitude\), got 1e\+300"),
    (-70000.0, "float16", r"a value float16 holds \(at most 65504 in magnitude\), got -70000\.0"),
])
def test_a_fill_value_the_dtype_cannot_hold_is_refused_by_name(tmp_path, fill, dtype, expected):
    """Refused before any file is read, naming fill_value: 1e300 in float32 was blamed
    on the file (``a.npy: holds 1e+300 at index (0, 1)``), which held a NaN there."""
    np.save(tmp_path / "a.npy", np.array([[1.0, np.nan]]))
    with pytest.raises(ConfigError, match=r"^fill_value: expected " + expected):
        pipeline.load(str(tmp_path / "a.npy"), combine="concat", nan="fill", fill_value=fill, dtype=dtype)
    held = pipeline.load(str(tmp_path / "a.npy"), combine="concat", nan="fill", fill_value=-1, dtype=dtype)
    np.testing.assert_array_equal(held.compute(), np.array([[1, -1]], dtype=dtype))


def test_a_table_fill_value_beyond_float32_is_refused_not_made_inf(tmp_path):
    (tmp_path / "t.csv").write_text("a,b\n1.0,\n2.0,3.0\n")
    with pytest.raises(ConfigError, match=r"^fill_value: expected a value float32 holds"):
        pipeline.load(str(tmp_path / "t.csv"), nan="fill", fill_value=1e300)
    got = pipeline.load(str(tmp_path / "t.csv"), nan="fill", fill_value=1e300, dtype="float64").compute()
    np.testing.assert_array_equal(got, [[1.0, 1e300], [2.0, 3.0]])


def test_raw_bytes_are_refused_when_the_array_is_built(tmp_path):
    np.save(tmp_path / "v.npy", np.zeros(3, "V4"))
    with pytest.raises(LoaderError, match=r"v\.npy: holds raw bytes \(dtype '\|V4', no fields\)"):
        pipeline.load(str(tmp_path / "v.npy"), combine="concat")


def test_nan_drop_is_refused_for_array_files(tmp_path):
    _nan_file(tmp_path / "n.h5")
    with pytest.raises(FormatMismatchError, match=r"n\.h5: nan='drop' drops table rows with their timestamps; hdf5 "
                                                  r"files are refused it"):
        pipeline.load(str(tmp_path / "n.h5"), combine="concat", nan="drop")


# -- options of other formats ---------------------------------------------------------------------


@pytest.mark.parametrize("option, does", [
    (dict(dataset="prices"), "names the dataset read from each HDF5 file"),
    (dict(key="x"), r"names the member read from each \.npz file"),
    (dict(columns=["a"]), "names the table columns read"),
    (dict(shape=(8, 8)), "resizes images"),
    (dict(mode="L"), "converts images to a Pillow mode"),
    (dict(timestamp_unit="ms"), "is the unit of a table's timestamp column"),
    (dict(instrument_column="sym"), "names a table column of instruments"),
])
def test_an_option_of_another_format_is_refused_for_npy_files(tmp_path, option, does):
    np.save(tmp_path / "i.npy", np.zeros((4, 2)))
    name, value = next(iter(option.items()))
    with pytest.raises(FormatMismatchError, match=rf"i\.npy: {name}={re.escape(repr(value))} {does}; npy files take "
                                                  rf"no {name}=: leave it unset"):
        pipeline.load(str(tmp_path / "i.npy"), combine="concat", **option)


def test_options_of_the_other_combine_and_of_arrays_for_tables_are_refused(tmp_path):
    np.save(tmp_path / "i.npy", np.zeros((4, 2)))
    with pytest.raises(FormatMismatchError, match=r"chunk_rows=2 sets the rows per chunk of files joined along axis 0 "
                                                  r".*npy files joined with combine='stack' take no chunk_rows="):
        pipeline.load(str(tmp_path / "i.npy"), chunk_rows=2)
    for option in (dict(files_per_chunk=2), dict(on_mismatch="pad")):
        with pytest.raises(FormatMismatchError, match=r"combine='concat' take no"):
            pipeline.load(str(tmp_path / "i.npy"), combine="concat", **option)
    (tmp_path / "t.csv").write_text("a,b\n1,2\n")
    with pytest.raises(FormatMismatchError, match=r"t\.csv: dataset='x' names the dataset read from each HDF5 file; "
                                                  r"csv files take no dataset="):
        pipeline.load(str(tmp_path / "t.csv"), dataset="x")
    # The options that apply are taken as before.
    assert pipeline.load(str(tmp_path / "i.npy"), combine="concat", chunk_rows=2).chunks[0] == (2, 2)
    assert pipeline.load(str(tmp_path / "i.npy"), files_per_chunk=1, on_mismatch="pad").shape == (1, 4, 2)


# -- a file listed twice ---------------------------------------------------------------------------


def test_a_file_listed_twice_is_refused_naming_it(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros((3, 2)))
    np.save(tmp_path / "b.npy", np.ones((3, 2)))
    a, b = str(tmp_path / "a.npy"), str(tmp_path / "b.npy")
    for combine in ("stack", "concat"):
        with pytest.raises(LoaderError, match=r"a\.npy: is listed twice in paths: list each file once"):
            pipeline.load([a, b, a], combine=combine)
    with pytest.raises(LoaderError, match=r"a\.npy: is listed twice in paths \(as '.*/a\.npy' and '.*/\./a\.npy'\)"):
        open_source([a, f"{tmp_path}/./a.npy"], combine="stack")
    with pytest.raises(LoaderError, match=r"a\.npy: is listed twice in paths \(as '.*\*\.npy' and '.*/a\.npy'\)"):
        pipeline.load([str(tmp_path / "*.npy"), a])  # a glob, and the file again
    os.symlink(a, tmp_path / "link.npy")
    with pytest.raises(LoaderError, match=r"link\.npy: is listed twice in paths \(as '.*/a\.npy' and '.*/link\.npy'\)"):
        pipeline.load([a, str(tmp_path / "link.npy")])
    got = pipeline.load([b, a], combine="stack").compute()  # each once, in the order given
    np.testing.assert_array_equal(got, np.stack([np.load(b), np.load(a)]))


# -- many small files: several to a task -----------------------------------------------------------


def test_many_short_files_join_several_to_a_chunk_and_equal_numpy(tmp_path):
    lengths = np.random.default_rng(0).integers(0, 40, 300)
    for i, n in enumerate(lengths):
        np.save(tmp_path / f"f{i:03d}.npy", np.full((n, 3), i, np.float32) + np.arange(n)[:, None])
    paths = sorted(str(p) for p in tmp_path.glob("*.npy"))
    expected = np.concatenate([np.load(p) for p in paths])
    x = pipeline.load(str(tmp_path / "*.npy"), combine="concat")
    assert len(x.chunks[0]) == 1  # 36 KiB: one task, not one per file
    np.testing.assert_array_equal(x.compute(), expected)
    assert [f["shape"][0] for f in x.attrs["files"]] == lengths.tolist()  # each file still known: windows' sessions
    y = pipeline.load(str(tmp_path / "*.npy"), combine="concat", chunk_rows=200)
    assert max(y.chunks[0]) <= 200 and len(y.chunks[0]) < len(paths) / 2  # runs of at least 50 rows (a quarter)
    np.testing.assert_array_equal(y.compute(), expected)


@given(rows=st.lists(st.integers(0, 50), min_size=1, max_size=40), limit=st.integers(1, 60))
@settings(max_examples=200, deadline=None)
def test_file_runs_cover_every_file_once_in_order_within_the_limit(rows, limit):
    from pipeline.loaders.arrays import file_runs

    runs = file_runs(rows, limit)
    assert [i for a, b in runs for i in range(a, b)] == list(range(len(rows)))
    quarter = max(1, limit // 4)
    for a, b in runs:
        if b - a > 1:
            assert sum(rows[a:b]) <= limit and all(n < quarter for n in rows[a:b])


def test_a_file_of_a_run_rewritten_shorter_or_wider_is_named_not_the_run(tmp_path):
    for i in range(5):
        np.save(tmp_path / f"f{i}.npy", np.full((4, 2), i, np.float32))
    x = pipeline.load(str(tmp_path / "*.npy"), combine="concat")
    assert len(x.chunks[0]) == 1
    np.save(tmp_path / "f3.npy", np.zeros((2, 2), np.float32))
    with pytest.raises(ShapeMismatchError, match=r"f3\.npy: its header said shape \(4, 2\) float32 when the array was "
                                                 r"built, but rows 0:4 now read as shape \(2, 2\)"):
        x.compute(scheduler="sync")
    np.save(tmp_path / "f3.npy", np.zeros((4, 2), np.float64))
    with pytest.raises(LoaderError, match=r"f3\.npy: its header said shape \(4, 2\) float32 .* now read as float64"):
        x.compute(scheduler="sync")


def test_a_file_read_alone_rewritten_in_a_dtype_that_still_casts_is_named(tmp_path):
    # Two files read one to a task (chunk_rows=4 makes each at least a quarter of a chunk):
    # b.npy rewritten from float32 to int16 still casts safely into the float64 array,
    # but is not the file the array was built from.
    np.save(tmp_path / "a.npy", np.arange(8.0).reshape(4, 2))
    np.save(tmp_path / "b.npy", np.arange(8.0, dtype=np.float32).reshape(4, 2))
    x = pipeline.load(str(tmp_path / "*.npy"), combine="concat", chunk_rows=4)
    assert len(x.chunks[0]) == 2 and x.dtype == np.float64
    np.testing.assert_array_equal(x.compute(scheduler="sync"),
                                  np.concatenate([np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")]))
    np.save(tmp_path / "b.npy", np.arange(8, dtype=np.int16).reshape(4, 2))
    assert np.can_cast(np.load(tmp_path / "b.npy").dtype, x.dtype, "safe")
    with pytest.raises(LoaderError, match=r"b\.npy: its header said shape \(4, 2\) float32 when the array was built, "
                                          r"but rows 0:4 now read as int16"):
        x.compute(scheduler="sync")
