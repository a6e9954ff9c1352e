"""CSV and Parquet tables: lazy, joined in time order, exact, with clear errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import pipeline
from pipeline.errors import (
    EmptyInputError,
    FormatMismatchError,
    InvalidValueError,
    LoaderError,
    MissingColumnError,
)
from pipeline.loaders import open_source


def table(day: int, n: int = 50) -> pa.Table:
    ts = np.datetime64("2026-01-05") + np.timedelta64(day, "D") + np.arange(n).astype("timedelta64[s]")
    rng = np.random.default_rng(day)
    return pa.table({"timestamp": ts, "a": rng.standard_normal(n), "b": np.arange(n, dtype=np.int32) + 100 * day,
                     "c": rng.random(n)})


def write_days(d, fmt: str, days: int = 4, n: int = 50):
    out = []
    for day in range(days):
        p = d / f"day{day}.{fmt}"
        (pq.write_table(table(day, n), p, row_group_size=20) if fmt == "parquet" else pacsv.write_csv(table(day, n), p))
        out.append(table(day, n))
    return out


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_tables_join_in_sorted_order_and_equal_the_files(tmp_path, fmt):
    tables = write_days(tmp_path, fmt)
    src = open_source(str(tmp_path / f"*.{fmt}"), timestamp="timestamp", columns=["b", "a"])
    assert src.columns == ("b", "a") and src.array.dtype == np.float32
    expected = np.concatenate([np.stack([t.column("b").to_numpy(), t.column("a").to_numpy()], 1) for t in tables])
    np.testing.assert_allclose(src.array.compute(), expected.astype(np.float32))
    assert [f.rows for f in src.files] == [50] * 4
    if fmt == "parquet":
        assert src.array.numblocks[0] == 4 * 3  # one chunk per row group, known sizes, nothing read
    meta = src.metadata()
    assert meta["files"][0]["size"] > 0 and meta["files"][0]["mtime"] > 0


def test_building_reads_no_data(tmp_path, monkeypatch):
    write_days(tmp_path, "parquet", days=3)
    import pipeline.loaders.tables as tables

    calls = []
    original = tables._read_part
    monkeypatch.setattr(tables, "_read_part", lambda *a, **k: calls.append(1) or original(*a, **k))
    arr = pipeline.load(str(tmp_path / "*.parquet"), timestamp="timestamp")
    assert calls == [] and arr.shape == (150, 3)
    arr.compute(scheduler="sync")
    assert len(calls) == 9


def test_graph_layers_do_not_grow_with_files(tmp_path):
    for k in (3, 30):
        d = tmp_path / str(k)
        d.mkdir()
        for day in range(k):
            pq.write_table(table(day, 5), d / f"d{day:03d}.parquet")
    few = pipeline.load(str(tmp_path / "3" / "*.parquet"), timestamp="timestamp")
    many = pipeline.load(str(tmp_path / "30" / "*.parquet"), timestamp="timestamp")
    assert len(few.dask.layers) == len(many.dask.layers) <= 3


def test_missing_column_names_file_and_column(tmp_path):
    write_days(tmp_path, "parquet", days=2)
    with pytest.raises(MissingColumnError, match=r"day0\.parquet: missing column\(s\) \['zz'\]"):
        open_source(str(tmp_path / "*.parquet"), columns=["a", "zz"])


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_nan_policies(tmp_path, fmt):
    t = table(0).to_pandas()
    t.loc[7, "a"] = np.nan
    p = tmp_path / f"x.{fmt}"
    (pq.write_table(pa.Table.from_pandas(t), p) if fmt == "parquet" else t.to_csv(p, index=False))
    with pytest.raises(InvalidValueError, match=r"x\.%s: NaN or inf in column 'a' at row 7" % fmt):
        pipeline.load(str(p), timestamp="timestamp").compute()
    filled = pipeline.load(str(p), timestamp="timestamp", nan="fill", fill_value=-1).compute()
    assert filled[7, 0] == -1
    dropped = pipeline.load(str(p), timestamp="timestamp", nan="drop")
    assert dropped.shape[0] == 49 and np.isfinite(dropped.compute()).all()


def test_files_out_of_time_order_are_named(tmp_path):
    pq.write_table(table(3), tmp_path / "a.parquet")
    pq.write_table(table(1), tmp_path / "b.parquet")
    with pytest.raises(LoaderError, match=r"b\.parquet: starts at .* before the previous file .*a\.parquet"):
        open_source(str(tmp_path / "*.parquet"), timestamp="timestamp")


def test_bad_inputs(tmp_path):
    with pytest.raises(EmptyInputError, match="matched no file"):
        open_source(str(tmp_path / "*.parquet"))
    (tmp_path / "x.txt").write_text("hello")
    with pytest.raises(FormatMismatchError, match=r"x\.txt: unknown suffix '\.txt'"):
        open_source(str(tmp_path / "x.txt"))
    (tmp_path / "fake.parquet").write_text("this,is,csv\n1,2,3\n")
    with pytest.raises(FormatMismatchError, match=r"fake\.parquet: expected a Parquet file"):
        open_source(str(tmp_path / "fake.parquet"))
    (tmp_path / "latin.csv").write_bytes("caf\xe9,b\n1,2\n".encode("latin-1"))
    with pytest.raises(FormatMismatchError, match=r"latin\.csv: expected UTF-8"):
        open_source(str(tmp_path / "latin.csv"))


def test_on_error_skip_records_each_bad_file(tmp_path):
    write_days(tmp_path, "parquet", days=2)
    (tmp_path / "z_broken.parquet").write_bytes(b"PAR1 garbage")
    src = open_source(str(tmp_path / "*.parquet"), timestamp="timestamp", on_error="skip")
    assert src.array.shape == (100, 3)
    assert len(src.skipped) == 1 and src.skipped[0][0].endswith("z_broken.parquet")
    assert "Parquet" in src.skipped[0][1]
