"""Loaders over fsspec URLs: Parquet files in an S3 bucket served on loopback."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import s3fs

from pipeline.errors import EmptyInputError, LoaderError
from pipeline.loaders import open_source


def test_s3_glob_is_sorted_lazy_and_exact(s3, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    fs = s3fs.S3FileSystem(key=s3["key"], secret=s3["secret"], client_kwargs={"endpoint_url": s3["endpoint_url"]})
    tables = []
    for day in (2, 0, 1):  # uploaded out of order: the glob must sort
        t = pa.table({"timestamp": np.datetime64("2026-01-05") + np.arange(10).astype("timedelta64[s]") + np.timedelta64(day, "D"),
                      "v": np.arange(10, dtype=np.float64) + 10 * day})
        with fs.open(f"training/raw/day{day}.parquet", "wb") as fh:
            pq.write_table(t, fh)
        tables.append((day, t))
    src = open_source("s3://training/raw/*.parquet", timestamp="timestamp", storage_options=s3)
    assert [f.path for f in src.files] == [f"s3://training/raw/day{d}.parquet" for d in (0, 1, 2)]
    np.testing.assert_array_equal(src.array.compute()[:, 0], np.arange(30, dtype=np.float32))
    with pytest.raises(EmptyInputError, match="matched no file"):
        open_source("s3://training/none/*.parquet", storage_options=s3)


def test_an_empty_list_of_paths_says_so():
    with pytest.raises(EmptyInputError, match=r"^paths: no path given \(an empty list\)$"):
        open_source([])


def test_an_unreadable_path_is_named(tmp_path):
    (tmp_path / "d.npy").mkdir()  # a directory where a file is expected
    with pytest.raises(LoaderError, match=r"d\.npy: is a directory, not a file"):
        open_source([str(tmp_path / "d.npy")])
