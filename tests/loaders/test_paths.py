"""Path expansion: chained fsspec URLs, a .zip holding one file, data set directories."""

from __future__ import annotations

import gzip
import io
import os
import zipfile

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.errors import EmptyInputError, FormatMismatchError, LoaderError
from pipeline.features.sessions import InstrumentSpec
from pipeline.loaders import _stat, expand_paths, open_source
from pipeline.loaders.registry import compression_of, format_of


def book(day: int, n: int = 60) -> pd.DataFrame:
    """A Binance-like bookTicker day: millisecond times, best bid and ask."""
    rng = np.random.default_rng(day)
    t = 1704067200000 + day * 86_400_000 + np.arange(n) * 1000
    bid = 42000 + np.cumsum(rng.normal(0, 1, n)).round(1)
    return pd.DataFrame({"transaction_time": t, "best_bid_price": bid, "best_ask_price": bid + 0.1})


def write_zips(d, days: int = 2, extra: dict[str, bytes] | None = None) -> list[str]:
    """One zip per day holding one CSV (as data.binance.vision ships them)."""
    d.mkdir(exist_ok=True)
    out = []
    for day in range(days):
        path = d / f"BTCUSDT-bookTicker-2024-01-0{day + 1}.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr(f"BTCUSDT-bookTicker-2024-01-0{day + 1}.csv", book(day).to_csv(index=False))
            for name, data in (extra or {}).items():
                z.writestr(name, data)
        out.append(str(path))
    return out


def reference(zips: list[str]) -> np.ndarray:
    """The zips' rows as pandas reads a .zip holding one CSV."""
    frames = [pd.read_csv(z) for z in zips]
    return pd.concat(frames)[["best_bid_price", "best_ask_price"]].to_numpy()


def test_a_chained_zip_url_keeps_its_archive_and_reads_the_member(tmp_path, monkeypatch):
    """zip://NAME.csv::/abs/day.zip lost its ::target: the member was then opened with
    the working directory as the archive (IsADirectoryError blaming the cwd)."""
    zips = write_zips(tmp_path / "raw")
    monkeypatch.chdir(tmp_path)
    member = "BTCUSDT-bookTicker-2024-01-01.csv"
    assert expand_paths(f"zip://{member}::{zips[0]}") == [f"zip://{member}::{zips[0]}"]
    # A relative archive is made absolute (workers run elsewhere); a glob of archives
    # lists every archive's members, archives in path order.
    assert expand_paths(f"zip://{member}::raw/{os.path.basename(zips[0])}") == [f"zip://{member}::{zips[0]}"]
    listed = expand_paths("zip://*.csv::raw/*.zip")
    assert listed == [f"zip://{os.path.basename(z)[:-4]}.csv::{z}" for z in zips]
    src = open_source(listed, columns=["best_bid_price", "best_ask_price"], timestamp="transaction_time",
                      timestamp_unit="ms", dtype="float64", chunk_rows=25)  # parts seek inside the member
    np.testing.assert_array_equal(src.array.compute(), reference(zips))
    expected_ns = pd.concat([pd.read_csv(z) for z in zips])["transaction_time"].to_numpy() * 1_000_000
    np.testing.assert_array_equal(src.timestamps.compute(), expected_ns)


def test_a_zip_holding_one_csv_reads_as_that_csv(tmp_path):
    zips = write_zips(tmp_path / "raw", days=3)
    assert expand_paths(str(tmp_path / "raw" / "*.zip")) == [
        f"zip://{os.path.basename(z)[:-4]}.csv::{z}" for z in zips]
    # Named one by one, or beside macOS's __MACOSX entries, alike.
    more = write_zips(tmp_path / "mac", days=1, extra={"__MACOSX/._x.csv": b"\x00\x05"})
    assert expand_paths(more) == [f"zip://BTCUSDT-bookTicker-2024-01-01.csv::{more[0]}"]
    src = open_source(str(tmp_path / "raw" / "*.zip"), columns=["best_bid_price", "best_ask_price"],
                      dtype="float64")
    np.testing.assert_array_equal(src.array.compute(), reference(zips))


def test_a_zip_of_several_files_or_none_is_refused_naming_them(tmp_path):
    many = write_zips(tmp_path / "many", days=1, extra={"README.txt": b"hello"})
    with pytest.raises(LoaderError, match=r"holding 2 files \(BTCUSDT-bookTicker-2024-01-01\.csv, README\.txt\)"
                       r".*'zip://\*\.csv::.*many/BTCUSDT-bookTicker-2024-01-01\.zip'"):
        expand_paths(many)
    empty = tmp_path / "empty.zip"
    zipfile.ZipFile(empty, "w").close()
    with pytest.raises(LoaderError, match=r"empty\.zip: is a zip archive holding no file"):
        expand_paths(str(empty))
    (tmp_path / "fake.zip").write_text("a,b\n1,2\n")
    with pytest.raises(LoaderError, match=r"fake\.zip: expected a zip archive .*could not read one"):
        expand_paths(str(tmp_path / "fake.zip"))


def test_a_chained_url_whose_archive_cannot_be_opened_names_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text.zip").write_text("not a zip")
    (tmp_path / "adir").mkdir()
    for target, why in (("missing.zip", "no such file"), ("adir", "is a directory, not an archive"),
                        ("text.zip", "BadZipFile")):
        with pytest.raises(LoaderError) as info:
            expand_paths(f"zip://day.csv::{target}")
        assert info.value.path == str(tmp_path / target) and why in str(info.value)
        assert f"the chained URL 'zip://day.csv::{target}'" in str(info.value)
    with pytest.raises(EmptyInputError, match="matched no file"):
        expand_paths(f"zip://*.parquet::{write_zips(tmp_path / 'raw', days=1)[0]}")


def test_a_chained_member_is_dated_by_its_archive_and_named_by_its_own_suffix(tmp_path):
    """A member's 2-second zip date survives a rewrite that keeps it; the archive's
    time moves. Its format and compression come from the member's name, not .zip."""
    z = tmp_path / "day.zip"
    data = gzip.compress(book(0).to_csv(index=False).encode())
    with zipfile.ZipFile(z, "w") as archive:
        archive.writestr("day.csv.gz", data)
    os.utime(z, (1_700_000_000, 1_700_000_000))
    url = expand_paths(str(z))[0]
    assert url == f"zip://day.csv.gz::{z}"
    assert _stat(url, {}) == (len(data), 1_700_000_000.0)
    assert (format_of(url, None), compression_of(url)) == ("csv", "gzip")
    src = open_source(url, columns=["best_bid_price"], dtype="float64")
    np.testing.assert_array_equal(src.array.compute()[:, 0], pd.read_csv(io.BytesIO(gzip.decompress(data)))
                                  ["best_bid_price"].to_numpy())


def hive(root, stocks=(0, 1, 10)) -> dict[int, pd.DataFrame]:
    """A pandas/Spark-style data set directory: book.parquet/stock_id=N/part.parquet,
    with the marker and checksum files Spark writes beside them."""
    frames = {}
    for s in stocks:
        df = pd.DataFrame({"time_id": np.repeat([5, 11], 4), "bid_price1": np.arange(8) + s * 100.0,
                           "ask_price1": np.arange(8) + s * 100.0 + 0.5})
        d = root / "book.parquet" / f"stock_id={s}"
        d.mkdir(parents=True)
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), d / "part-0.snappy.parquet")
        (d / ".part-0.snappy.parquet.crc").write_bytes(b"crc")
        frames[s] = df
    (root / "book.parquet" / "_SUCCESS").write_bytes(b"")
    (root / "book.parquet" / "_temporary").mkdir()
    (root / "book.parquet" / "_temporary" / "x.parquet").write_bytes(b"partial")
    return frames


def test_a_parquet_data_set_directory_reads_its_files_in_path_order(tmp_path):
    """book_train.parquet/ (a directory) was opened as a Parquet file: 'could not read
    its footer ([Errno 21] Is a directory)'."""
    frames = hive(tmp_path)
    root = tmp_path / "book.parquet"
    files = expand_paths(str(root))
    # Path order: stock_id=10 sorts before stock_id=2 would, as a glob sorts them.
    assert files == [str(root / f"stock_id={s}" / "part-0.snappy.parquet") for s in sorted(map(str, frames))]
    src = open_source(str(root), columns=["bid_price1", "ask_price1"], dtype="float64")
    expected = pd.concat([frames[int(s)] for s in sorted(map(str, frames))])[["bid_price1", "ask_price1"]]
    np.testing.assert_array_equal(src.array.compute(), expected.to_numpy())
    # The partition value names each file's instrument through a path pattern.
    spec = InstrumentSpec(path="book.parquet/stock_id={instrument}/*.parquet")
    assert [spec.instrument_of(f) for f in files] == ["0", "1", "10"]
    # A recursive glob reaches the files both inside the directory and alone: once each
    # (and what it matches by name itself, as a glob does, _temporary's file too).
    partial = str(root / "_temporary" / "x.parquet")
    assert expand_paths(str(tmp_path / "**" / "*.parquet")) == sorted([*files, partial])


def test_a_directory_is_refused_before_its_suffix_is_read(tmp_path):
    (tmp_path / "x.npy").mkdir()
    np.save(tmp_path / "x.npy" / "a.npy", np.zeros(3))
    with pytest.raises(FormatMismatchError, match=r"x\.npy: is a directory, not a file; give a glob of its files, "
                       r"such as '.*x\.npy/\*\.npy'"):
        open_source(str(tmp_path / "x.npy"))
    with pytest.raises(FormatMismatchError, match="is a directory, not a file"):
        format_of(str(tmp_path / "x.npy"), "npy")
    (tmp_path / "none.parquet").mkdir()
    (tmp_path / "none.parquet" / "_SUCCESS").write_bytes(b"")
    with pytest.raises(EmptyInputError, match=r"none\.parquet: is a data set directory .* holding no data file"):
        expand_paths(str(tmp_path / "none.parquet"))


def test_a_caching_chain_lists_its_target_files_keeping_the_chain(tmp_path):
    """simplecache::URL globs the target's files; each keeps the cache link."""
    for name, rows in (("a.csv", "x,y\n1,2\n3,4\n"), ("b.csv", "x,y\n5,6\n")):
        (tmp_path / name).write_text(rows)
    urls = expand_paths(f"simplecache::file://{tmp_path}/*.csv")
    assert urls == [f"simplecache::file://{tmp_path}/a.csv", f"simplecache::file://{tmp_path}/b.csv"]
    expected = pd.concat([pd.read_csv(tmp_path / "a.csv"), pd.read_csv(tmp_path / "b.csv")]).to_numpy()
    np.testing.assert_array_equal(open_source(urls, dtype="float64").array.compute(), expected)
