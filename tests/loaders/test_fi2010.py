"""FI-2010 text files (``format: fi2010``): values against np.loadtxt, layouts, sessions, errors, a run."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.config import parse_config
from pipeline.errors import FormatMismatchError, InvalidValueError, LoaderError
from pipeline.loaders import open_source
from pipeline.loaders import fi2010

NAME = "{}_Dst_NoAuction_ZScore_CF_{}.txt"


def matrix(events: int, seed: int = 0) -> np.ndarray:
    """A 149 x events matrix as published: a book around 10, features, labels 1/2/3."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(149, events))
    mid = 10 + 0.01 * np.cumsum(rng.integers(-1, 2, events))  # ticks of 0.01, which float32 keeps
    a[0], a[2] = mid + 0.005, mid - 0.005  # ask and bid price 1
    a[144:] = rng.integers(1, 4, size=(5, events))
    return a


def write(path: Path, a: np.ndarray, *, newline: str = "\n", final: bool = True) -> Path:
    """The published layout: '  %.7e' fields (two spaces before each), one matrix row per line."""
    lines = ["".join(f"  {v:.7e}" for v in row) for row in a]
    text = newline.join(lines) + (newline if final else "")
    path.write_bytes(text.encode())
    return path


def reference(*paths: Path) -> np.ndarray:
    """The plain-numpy reading: each file's matrix transposed, files one after another."""
    return np.concatenate([np.loadtxt(p).T for p in paths])


def test_columns_values_and_one_chunk_per_file_equal_loadtxt(tmp_path):
    a = write(tmp_path / NAME.format("Train", 1), matrix(40, 1))
    b = write(tmp_path / NAME.format("Test", 1), matrix(25, 2))
    src = open_source([str(a), str(b)], format="fi2010")
    assert src.columns[:4] == ("ask_price_1", "ask_size_1", "bid_price_1", "bid_size_1")
    assert src.columns[36:40] == ("ask_price_10", "ask_size_10", "bid_price_10", "bid_size_10")
    assert src.columns[40] == "f41" and src.columns[143] == "f144"
    assert src.columns[144:] == ("label_1", "label_2", "label_3", "label_5", "label_10")
    assert src.array.shape == (65, 149) and src.array.chunks[0] == (40, 25)
    assert src.array.dtype == np.float32 and src.timestamps is None and src.instruments is None
    ref = reference(a, b)
    np.testing.assert_array_equal(src.array.compute(), ref.astype(np.float32))
    assert [f["rows"] for f in src.metadata()["files"]] == [40, 25]


def test_float64_through_source_dtype_is_loadtxt_exactly(tmp_path):
    a = write(tmp_path / NAME.format("Train", 1), matrix(30, 3))
    src = open_source(str(a), format="fi2010", dtype="float64")
    assert src.array.dtype == np.float64
    np.testing.assert_array_equal(src.array.compute(), reference(a))
    # A 9-digit price that float32 cannot hold, read exactly in float64.
    m = matrix(30, 3)
    m[0] = 97123.45 + 0.01 * np.arange(30)
    exact = write(tmp_path / "exact" / NAME.format("Train", 1), m) if (tmp_path / "exact").mkdir() is None else None
    got = open_source(str(exact), format="fi2010", dtype="float64", columns=["ask_price_1"]).array.compute()
    np.testing.assert_array_equal(got[:, 0], np.loadtxt(exact)[0])
    # Read in float32 (the default), the file's ticks are lost, and a warning says so.
    from pipeline.errors import PriceResolutionWarning

    with pytest.warns(PriceResolutionWarning, match=r"CF_1\.txt: column 'ask_price_1' holds prices as little as 0\.01 apart"):
        open_source(str(exact), format="fi2010", columns=["ask_price_1"]).array.compute()


@pytest.mark.parametrize("layout", ["no final newline", "crlf", "crlf without final", "blank lines at the end",
                                    "gzip", "byte-order mark"])
def test_text_layouts_read_the_same_values(tmp_path, layout):
    m = matrix(12, 4)
    plain = write(tmp_path / "plain.txt", m)
    path = tmp_path / "variant.txt"
    if layout == "no final newline":
        write(path, m, final=False)
    elif layout.startswith("crlf"):
        write(path, m, newline="\r\n", final=layout == "crlf")
    elif layout == "blank lines at the end":
        path.write_bytes(plain.read_bytes() + b"\n  \n\n")
    elif layout == "byte-order mark":  # as some Windows editors save text
        path.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    else:
        path = tmp_path / "variant.txt.gz"
        path.write_bytes(gzip.compress(plain.read_bytes()))
    src = open_source(str(path), format="fi2010", dtype="float64")
    assert src.array.shape == (12, 149)
    np.testing.assert_array_equal(src.array.compute(), reference(plain))


def test_opening_parses_nothing_and_a_read_parses_only_the_lines_asked_for(tmp_path, monkeypatch):
    path = write(tmp_path / NAME.format("Train", 1), matrix(20, 5))
    parsed: list[int] = []
    real = fi2010._parse_line

    def spy(text, where, lineno, events):
        parsed.append(lineno)
        return real(text, where, lineno, events)

    monkeypatch.setattr(fi2010, "_parse_line", spy)
    src = open_source(str(path), format="fi2010", read=["bid_price_1", "label_10"])
    assert src.array.shape == (20, 2) and parsed == []
    got = src.array.compute()
    assert parsed == [3, 149]
    m = np.loadtxt(path)
    np.testing.assert_array_equal(got, np.stack([m[2], m[148]], axis=1).astype(np.float32))


# -- errors, each naming the file --------------------------------------------------------------------


def lines_of(m: np.ndarray) -> list[str]:
    return ["".join(f"  {v:.7e}" for v in row) for row in m]


def with_field(path: Path, lines: list[str], line: int, field: int, text: str) -> Path:
    """``lines`` written to ``path`` in the published layout, field ``field`` of line
    ``line`` (both from 0) replaced by ``text``."""
    fields = lines[line].split()
    fields[field] = text
    lines = [*lines[:line], "".join(f"  {f}" for f in fields), *lines[line + 1:]]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_empty_file_is_refused(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    with pytest.raises(FormatMismatchError, match=r"empty\.txt: expected an FI-2010 matrix of 149 lines, found an "
                                                   r"empty file"):
        open_source(str(path), format="fi2010")


@pytest.mark.parametrize("rows", [148, 150])
def test_another_number_of_lines_is_refused_when_opened(tmp_path, rows):
    path = tmp_path / "short.txt"
    path.write_text("\n".join(lines_of(np.ones((rows, 6)))) + "\n")
    with pytest.raises(FormatMismatchError, match=rf"short\.txt: has {rows} lines, expected 149"):
        open_source(str(path), format="fi2010")


def test_a_transposed_file_is_named_as_such(tmp_path):
    path = tmp_path / "events.txt"
    path.write_text("\n".join(lines_of(np.ones((30, 149)))) + "\n")
    with pytest.raises(FormatMismatchError, match=r"has 30 lines, expected 149.*looks transposed"):
        open_source(str(path), format="fi2010")


def test_a_line_of_another_field_count_names_the_line_and_both_counts(tmp_path):
    lines = lines_of(matrix(5, 6))
    lines[6] = lines[6][: lines[6].rindex("  ")]  # line 7 (bid_price_2) loses its last field
    path = tmp_path / "ragged.txt"
    path.write_text("\n".join(lines) + "\n")
    src = open_source(str(path), format="fi2010")
    assert src.array.shape == (5, 149)  # from the first line
    with pytest.raises(LoaderError, match=r"ragged\.txt: line 7 \(bid_price_2\) has 4 fields, but line 1 has 5"):
        src.array.compute()


def test_a_field_that_is_not_a_number_names_the_line_and_field(tmp_path):
    path = with_field(tmp_path / "text.txt", lines_of(matrix(5, 7)), 2, 1, "1.2.3e+00")
    with pytest.raises(LoaderError, match=r"text\.txt: line 3 \(bid_price_1\), field 2: expected a number, found "
                                          r"'1\.2\.3e\+00'"):
        open_source(str(path), format="fi2010").array.compute()


def test_nan_follows_the_nan_policy_naming_event_line_and_column(tmp_path):
    path = with_field(tmp_path / "nan.txt", lines_of(matrix(5, 8)), 40, 3, "NaN")  # MATLAB's NaN: f41, event 3
    with pytest.raises(InvalidValueError, match=r"nan\.txt: NaN or inf in column 'f41' at event 3 \(field 4 of "
                                                r"line 41\)"):
        open_source(str(path), format="fi2010").array.compute()
    got = open_source(str(path), format="fi2010", nan="fill", fill_value=-1.0).array.compute()
    assert got[3, 40] == -1.0


def test_timestamps_and_instrument_columns_are_refused(tmp_path):
    path = write(tmp_path / NAME.format("Train", 1), matrix(5, 9))
    with pytest.raises(FormatMismatchError, match="FI-2010 files have no timestamps"):
        open_source(str(path), format="fi2010", timestamp="t")
    with pytest.raises(FormatMismatchError, match="FI-2010 files have no timestamps"):
        open_source(str(path), format="fi2010", instrument_column="label_1")


# -- fold files and sessions -------------------------------------------------------------------------


@pytest.mark.parametrize("names, bad, why", [
    ([("Test", 7), ("Train", 7)], NAME.format("Train", 7), "files out of time order"),
    ([("Train", 7), ("Train", 8)], NAME.format("Train", 8), "a day supplied twice"),
    ([("Train", 7), ("Test", 6)], NAME.format("Test", 6), "a day supplied twice"),
])
def test_published_fold_files_must_follow_one_another(tmp_path, names, bad, why):
    paths = [str(write(tmp_path / NAME.format(kind, k), matrix(5, k))) for kind, k in names]
    with pytest.raises(LoaderError, match=rf"{bad}: holds day\(s\) .* \({why}\)"):
        open_source(paths, format="fi2010")


def test_two_normalizations_in_one_source_are_refused(tmp_path):
    a = write(tmp_path / NAME.format("Train", 7), matrix(5, 1))
    b = write(tmp_path / "Test_Dst_NoAuction_MinMax_CF_7.txt", matrix(5, 2))
    with pytest.raises(LoaderError, match=r"MinMax_CF_7\.txt: is FI-2010's NoAuction_MinMax data, but .* is its "
                                          r"NoAuction_ZScore data"):
        open_source([str(a), str(b)], format="fi2010")


def test_sessions_are_the_files_in_path_order(tmp_path):
    """Train_ sorts after Test_: the sessions follow the list, not the names."""
    from pipeline.loaders.segments import open_segmented

    paths = [write(tmp_path / NAME.format("Train", 7), matrix(30, 1)),
             *(write(tmp_path / NAME.format("Test", k), matrix(10 + k, k)) for k in (7, 8, 9))]
    seg = open_segmented([str(p) for p in paths], format="fi2010")
    assert seg.session_mode == "file" and seg.timestamps is None
    assert (seg.segments.stops - seg.segments.starts).tolist() == [30, 17, 18, 19]
    assert seg.segments.session.tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(seg.array.compute(), reference(*paths).astype(np.float32))


# -- a pipeline run ----------------------------------------------------------------------------------

SIZE = 10


def run_config(paths: list[Path], out: Path) -> dict:
    return {
        "cluster": {"n_workers": 1, "threads_per_worker": 2, "memory_limit": "1GiB"},
        "source": {"paths": [str(p) for p in paths], "format": "fi2010"},
        "features": {"steps": [{"name": "book", "levels": 10}], "normalize": "none"},
        "windows": {"size": SIZE},
        "labels": {"kind": "column", "column": "label_10", "dtype": "int64"},
        "output": {"path": str(out), "folds": {"kind": "anchored", "test_sessions": 3, "min_train_sessions": 1}},
    }


@pytest.fixture(scope="module")
def fold_files(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("fi2010")
    return [write(d / NAME.format("Train", 7), matrix(70, 11)),
            *(write(d / NAME.format("Test", k), matrix(20 + k, k)) for k in (7, 8, 9))]


def test_a_run_stores_the_windows_and_published_labels_of_loadtxt(fold_files, tmp_path):
    from pipeline.job import run

    out = tmp_path / "fi2010.zarr"
    run(parse_config(run_config(fold_files, out)), log=None, progress=False)
    xs, ys, sessions = [], [], []
    for k, path in enumerate(fold_files):  # each file on its own: no window spans two
        m = np.loadtxt(path).T
        for e in range(SIZE - 1, len(m)):
            xs.append(m[e - SIZE + 1:e + 1, :40])
            ys.append(m[e, 148])
            sessions.append(k)
    x, y = np.asarray(xs, dtype=np.float32), np.asarray(ys).astype(np.int64)
    n_train = 70 - SIZE + 1
    ds = pipeline.open(out)
    train, test = ds["fold0/train"], ds["fold0/test"]
    assert train["x"].shape == (n_train, SIZE, 40) and test["x"].shape == (len(x) - n_train, SIZE, 40)
    np.testing.assert_array_equal(train["x"][:], x[:n_train])
    np.testing.assert_array_equal(test["x"][:], x[n_train:])
    np.testing.assert_array_equal(train["y"][:], y[:n_train])
    np.testing.assert_array_equal(test["y"][:], y[n_train:])
    assert set(np.unique(y)) <= {1, 2, 3}  # the published classes, as they are
    np.testing.assert_array_equal(np.concatenate([train["session"][:], test["session"][:]]), sessions)
    assert "t" not in ds["train"]


def test_a_bad_field_stops_a_run_before_anything_is_written(fold_files, tmp_path):
    from pipeline.job import run

    bad = with_field(tmp_path / NAME.format("Test", 8), fold_files[2].read_text().splitlines(), 37, 5, "x")
    out = tmp_path / "bad.zarr"
    with pytest.raises(LoaderError, match=r"Test_Dst_NoAuction_ZScore_CF_8\.txt: line 38 \(ask_size_10\), field 6: "
                                          r"expected a number, found 'x'"):
        run(parse_config(run_config([fold_files[0], fold_files[1], bad, fold_files[3]], out)), log=None,
            progress=False)
    assert not out.exists()


def test_a_label_map_stores_the_published_classes_as_this_packages_and_refuses_a_value_it_lacks(fold_files, tmp_path):
    """``labels.map`` turns FI-2010's 1 up, 2 stationary, 3 down into 0 down, 1 stationary,
    2 up; a map that leaves out a class present in the data stops the run before anything
    is written."""
    from pipeline.errors import FeatureError
    from pipeline.job import run

    cfg = run_config(fold_files, tmp_path / "mapped.zarr")
    cfg["labels"]["map"] = {1: 2, 2: 1, 3: 0}
    run(parse_config(cfg), log=None, progress=False)
    plain = run_config(fold_files, tmp_path / "plain.zarr")
    run(parse_config(plain), log=None, progress=False)
    for split in ("fold0/train", "fold0/test"):
        np.testing.assert_array_equal(pipeline.open(tmp_path / "mapped.zarr")[split]["y"][:],
                                      3 - pipeline.open(tmp_path / "plain.zarr")[split]["y"][:])
    cfg = run_config(fold_files, tmp_path / "partial.zarr")
    cfg["labels"]["map"] = {1: 2, 2: 1}
    with pytest.raises(FeatureError, match="column 'label_10' holds 3, which the map does not name"):
        run(parse_config(cfg), log=None, progress=False)
    assert not (tmp_path / "partial.zarr").exists()
