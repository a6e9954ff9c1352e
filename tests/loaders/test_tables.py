"""CSV and Parquet tables: lazy, joined in time order, exact, with clear errors."""

from __future__ import annotations

import datetime as dt
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline
from pipeline.errors import (
    EmptyInputError,
    FormatMismatchError,
    InvalidValueError,
    LoaderError,
    MissingColumnError,
)
from pipeline.loaders import open_source, tables


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
        # Row groups of 20, 20 and 10 rows: one chunk per file under chunk_rows, known sizes, nothing read;
        # one per row group when chunk_rows is a row group's size.
        assert src.array.chunks[0] == (50,) * 4
        by_group = open_source(str(tmp_path / f"*.{fmt}"), timestamp="timestamp", columns=["b", "a"], chunk_rows=20)
        assert by_group.array.chunks[0] == (20, 20, 10) * 4
        np.testing.assert_array_equal(by_group.array.compute(), src.array.compute())
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
    assert len(calls) == 3  # a read per file: its three row groups are one part


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
    # Row 7 (from 0) is the row group's row 7, the CSV's line 9 (from 1, with the header).
    where = "row 7 of row group 0" if fmt == "parquet" else "line 9"
    with pytest.raises(InvalidValueError, match=r"x\.%s: NaN or inf in column 'a' at %s;" % (fmt, where)):
        pipeline.load(str(p), timestamp="timestamp").compute()
    filled = pipeline.load(str(p), timestamp="timestamp", nan="fill", fill_value=-1).compute()
    assert filled[7, 0] == -1
    dropped = pipeline.load(str(p), timestamp="timestamp", nan="drop")
    assert dropped.shape[0] == 49 and np.isfinite(dropped.compute()).all()


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_only_the_columns_read_are_decoded(tmp_path, fmt):
    """``read`` narrows the decoded columns: a NaN in a column not read is never seen,
    the columns read hold the file's values, and every column asked for is still
    required in every file."""
    t = table(0).to_pandas()
    t.loc[7, "a"] = np.nan
    p = tmp_path / f"x.{fmt}"
    (pq.write_table(pa.Table.from_pandas(t), p) if fmt == "parquet" else t.to_csv(p, index=False))
    src = open_source(str(p), timestamp="timestamp", read=["c", "b"])
    assert src.columns == ("b", "c") and src.array.shape == (50, 2)
    np.testing.assert_array_equal(src.array.compute(), t[["b", "c"]].to_numpy().astype(np.float32))
    with pytest.raises(InvalidValueError, match=r"NaN or inf in column 'a' at (row 7 of row group 0|line 9);"):
        open_source(str(p), timestamp="timestamp", read=["a", "b"]).array.compute()
    # A column read that the source lacks leaves every column (the step asking names it).
    assert open_source(str(p), timestamp="timestamp", read=["b", "zz"]).columns == ("a", "b", "c")
    with pytest.raises(MissingColumnError, match=r"missing column\(s\) \['zz'\]"):
        open_source(str(p), timestamp="timestamp", columns=["b", "zz"], read=["b"])


@given(columns=st.lists(st.sampled_from("abcdefgh"), unique=True, max_size=8),
       read=st.none() | st.lists(st.sampled_from("abcdefghij"), unique=True, max_size=10))
def test_projected_columns_keep_the_source_order(columns, read):
    from pipeline.loaders.tables import project_columns

    out = project_columns(columns, read)
    if read is None or not set(read) <= set(columns):
        assert out == tuple(columns)
    else:
        assert set(out) == set(read) and list(out) == [c for c in columns if c in read]


def test_files_out_of_time_order_are_named(tmp_path):
    pq.write_table(table(3), tmp_path / "a.parquet")
    pq.write_table(table(1), tmp_path / "b.parquet")
    with pytest.raises(LoaderError, match=r"b\.parquet: starts at .* before the previous file .*a\.parquet"):
        open_source(str(tmp_path / "*.parquet"), timestamp="timestamp")


@pytest.mark.parametrize("unit, tz", [("s", None), ("ms", "UTC"), ("us", "America/New_York"), ("ns", None)])
def test_row_group_time_bounds_are_the_stored_instants(tmp_path, unit, tz):
    # Independent reference: pyarrow's own boxed statistics (pandas Timestamps, UTC for
    # an aware column), and the column's values themselves.
    ts = np.array(["2026-01-05T09:30:00.123456789", "2026-01-05T15:59:59.5", "2026-01-05T12:00:00"],
                  dtype="datetime64[ns]").astype(f"datetime64[{unit}]")
    pq.write_table(pa.table({"t": pa.array(ts.astype(np.int64), pa.timestamp(unit, tz=tz))}), tmp_path / "t.parquet")
    st = pq.ParquetFile(tmp_path / "t.parquet").metadata.row_group(0).column(0).statistics
    lo, hi = tables.statistics_bounds(st)
    assert (lo, hi) == (ts.min(), ts.max())
    def instant(v):  # pyarrow's box: a pandas Timestamp (ns) or a datetime, UTC when aware
        if hasattr(v, "value"):
            return np.datetime64(v.value, "ns")
        return np.datetime64(v.astimezone(dt.timezone.utc).replace(tzinfo=None) if v.tzinfo else v)

    assert [instant(st.min), instant(st.max)] == [lo, hi]


def test_files_in_different_zones_are_ordered_by_instant(tmp_path):
    # 09:30 in New York is 14:30 UTC: a UTC file from 12:00 to 13:00 comes first, and
    # one from 14:00 to 15:00 overlaps it (a naive file among aware ones is refused:
    # test_a_naive_file_among_aware_ones_is_refused_naming_both_kinds).
    def write(name, start, tz):
        t = np.datetime64(start, "ns") + np.arange(10).astype("timedelta64[m]") * 6
        pq.write_table(pa.table({"t": pa.array(t.astype(np.int64), pa.timestamp("ns", tz=tz)), "v": np.arange(10.0)}),
                       tmp_path / name)
    write("a.parquet", "2026-01-05T12:00", "UTC")
    write("b.parquet", "2026-01-05T14:30", "America/New_York")
    src = open_source(str(tmp_path / "*.parquet"), timestamp="t")
    assert src.array.shape[0] == 20
    write("b.parquet", "2026-01-05T12:30", "America/New_York")
    with pytest.raises(LoaderError, match=r"b\.parquet: starts at 2026-01-05T12:30:00\.000000000, before the "
                                          r"previous file .*a\.parquet ends at 2026-01-05T12:54"):
        open_source(str(tmp_path / "*.parquet"), timestamp="t")


def test_reading_parquet_footers_imports_no_pandas(tmp_path):
    import subprocess
    import sys

    for day in range(4):  # nanosecond times, as order-book files hold them (pyarrow boxes those through pandas)
        t = np.datetime64("2026-01-05", "ns") + np.timedelta64(day, "D") + np.arange(50).astype("timedelta64[ms]")
        pq.write_table(pa.table({"timestamp": pa.array(t.astype(np.int64), pa.timestamp("ns")), "a": np.arange(50.0)}),
                       tmp_path / f"day{day}.parquet", row_group_size=20)
    # dask.array imported as a run imports it (pipeline.daskimport: without xarray).
    code = ("import sys, pipeline.daskimport; from pipeline.loaders import open_source; "
            f"s = open_source({str(tmp_path / '*.parquet')!r}, timestamp='timestamp'); "
            "assert s.array.shape[0] == 200; print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_rows_out_of_time_order_inside_a_file_are_named(tmp_path):
    t = np.datetime64("2026-01-05T09:30:00", "ns") + np.arange(30).astype("timedelta64[s]")
    t[[12, 13]] = t[[13, 12]]  # two rows swapped
    t[20] = t[19]  # equal times are many events at one instant: fine
    frame = pa.table({"timestamp": pa.array(t), "v": np.arange(30.0)})
    pacsv.write_csv(frame, tmp_path / "swapped.csv")
    with pytest.raises(LoaderError, match=r"swapped\.csv: timestamp column 'timestamp': line 15 is at "
                                          r"2026-01-05T09:30:12.*, before the row above it \(line 14\) at 2026-01-05T09:30:13"):
        open_source(str(tmp_path / "swapped.csv"), timestamp="timestamp").timestamps.compute()
    pq.write_table(frame, tmp_path / "swapped.parquet", row_group_size=10)
    with pytest.raises(LoaderError, match=r"swapped\.parquet: .* row 3 of row group 1 is at 2026-01-05T09:30:12"):
        open_source(str(tmp_path / "swapped.parquet"), timestamp="timestamp").timestamps.compute()
    # Row groups out of order are seen in the footers, before anything is read.
    late, early = frame.slice(10, 10), frame.slice(0, 10)
    pq.write_table(pa.concat_tables([late, early]), tmp_path / "groups.parquet", row_group_size=10)
    with pytest.raises(LoaderError, match=r"groups\.parquet: row group 1 starts at .* before row group 0 ends"):
        open_source(str(tmp_path / "groups.parquet"), timestamp="timestamp")
    # Epoch nanoseconds stored as integers are named as times too, not as raw integers.
    ints = pa.table({"timestamp": pa.array(t.astype(np.int64)), "v": np.arange(30.0)})
    pq.write_table(pa.concat_tables([ints.slice(10, 10), ints.slice(0, 10)]), tmp_path / "ints.parquet",
                   row_group_size=10)
    with pytest.raises(LoaderError, match=r"ints\.parquet: row group 1 starts at 2026-01-05T09:30:00\.000000000, "
                                          r"before row group 0 ends at 2026-01-05T09:30:19\.000000000;"):
        open_source(str(tmp_path / "ints.parquet"), timestamp="timestamp")
    t[[12, 13]] = t[[12, 13]][::-1]  # back in order, ties kept
    pq.write_table(pa.table({"timestamp": pa.array(t), "v": np.arange(30.0)}), tmp_path / "ok.parquet")
    np.testing.assert_array_equal(open_source(str(tmp_path / "ok.parquet"), timestamp="timestamp").timestamps.compute(),
                                  t.astype(np.int64))


@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=40), header=st.booleans(),
       final_newline=st.booleans(), crlf=st.booleans(), every=st.integers(1, 9), block=st.integers(1, 40))
def test_text_parts_are_the_data_lines_in_order(tmp_path_factory, lengths, header, final_newline, crlf, every, block):
    # Any line lengths and endings, read in blocks of any size (a line, a newline, a
    # part's start across a block's end): the parts' byte ranges hold the data lines,
    # each once, in order.
    import pipeline.loaders.textfiles as textfiles
    from pipeline.loaders.textfiles import count_lines, text_ranges

    end = b"\r\n" if crlf else b"\n"
    lines = [b"h" * 3] * header + [b"x" * n + str(i).encode() for i, n in enumerate(lengths)]
    blob = end.join(lines) + (end if final_newline else b"")
    path = tmp_path_factory.mktemp("t") / "f.csv"
    path.write_bytes(blob)
    saved, textfiles._READ_BLOCK = textfiles._READ_BLOCK, block
    try:
        first, count, starts, second = count_lines(str(path), {}, every=every, base=int(header))
    finally:
        textfiles._READ_BLOCK = saved
    assert count == len(lines) and first == lines[0] + (end if len(lines) > 1 or final_newline else b"")
    # The bytes after the first line: the second line whole, whatever the block size.
    assert second.split(b"\n", 1)[0].rstrip(b"\r") == (lines[1] if len(lines) > 1 else b"")
    rows = count - int(header)
    ranges = text_ranges(len(first) if header else 0, starts, rows, every)
    assert [r0 for r0, _ in ranges] == list(range(0, rows, every))
    data = lines[int(header):]
    for k, (r0, (a, b)) in enumerate(ranges):  # each part exactly its own lines
        last = k == len(ranges) - 1
        assert (b is None) == last
        assert blob[a:b] == end.join(data[r0 : r0 + every]) + (end if not last or final_newline else b"")


def test_the_line_above_a_part_is_found_however_long(tmp_path):
    from pipeline.loaders.textfiles import previous_line

    lines = [b"a" * n for n in (10, 20_000, 5, 70_000, 0, 3)]
    (tmp_path / "long.csv").write_bytes(b"\n".join(lines) + b"\n")
    starts = np.cumsum([0] + [len(x) + 1 for x in lines])
    for above, start in zip(starts[:-2], starts[1:-1]):
        assert previous_line(str(tmp_path / "long.csv"), int(start), {}) == above


@pytest.mark.parametrize("header", [True, False])
def test_a_large_csv_is_read_in_parts_that_equal_the_file(tmp_path, header):
    n = 1000
    t = np.datetime64("2026-01-05T09:30:00", "ns") + np.arange(n).astype("timedelta64[s]")
    frame = pa.table({"timestamp": pa.array(t), "a": np.arange(n, dtype=np.float64), "b": np.arange(n) * 0.5})
    pacsv.write_csv(frame, tmp_path / "day.csv", write_options=pacsv.WriteOptions(include_header=header))
    names = {} if header else {"header": False, "names": ["timestamp", "a", "b"]}
    whole = open_source(str(tmp_path / "day.csv"), timestamp="timestamp", **names)
    parts = open_source(str(tmp_path / "day.csv"), timestamp="timestamp", chunk_rows=64, **names)
    assert whole.array.chunks[0] == (n,) and parts.array.chunks[0] == (64,) * 15 + (40,)
    np.testing.assert_array_equal(parts.array.compute(), whole.array.compute())
    np.testing.assert_array_equal(parts.timestamps.compute(), t.astype(np.int64))
    # Errors name the file's own line and row, not the part's.
    bad = frame.set_column(1, "a", pa.array(np.where(np.arange(n) == 700, np.nan, np.arange(n, dtype=np.float64))))
    pacsv.write_csv(bad, tmp_path / "nan.csv", write_options=pacsv.WriteOptions(include_header=header))
    with pytest.raises(InvalidValueError, match=r"nan\.csv: NaN or inf in column 'a' at line %d;" % (701 + header)):
        open_source(str(tmp_path / "nan.csv"), timestamp="timestamp", chunk_rows=64, **names).array.compute()
    # Rows i and i + 1 swapped inside a part (700) and across two parts' boundary (127,
    # the last row of one part, and 128, the first of the next).
    for i in (700, 127):
        swapped = np.array(t)
        swapped[[i, i + 1]] = swapped[[i + 1, i]]
        pacsv.write_csv(frame.set_column(0, "timestamp", pa.array(swapped)), tmp_path / f"order{i}.csv",
                        write_options=pacsv.WriteOptions(include_header=header))
        with pytest.raises(LoaderError, match=rf"order{i}\.csv: timestamp column 'timestamp': line {i + 2 + header} "
                                              rf"is at .*\(line {i + 1 + header}\)"):
            open_source(str(tmp_path / f"order{i}.csv"), timestamp="timestamp", chunk_rows=64,
                        **names).timestamps.compute()


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


# -- header, names, rename ----------------------------------------------------------------


def test_a_headerless_file_is_refused_with_the_fix(tmp_path):
    p = tmp_path / "book.csv"
    p.write_text("5859400,200,5853300,18\n5859300,100,5853200,10\n")
    with pytest.raises(FormatMismatchError, match=r"book\.csv: its first line '5859400,200,5853300,18' looks like "
                                                  r"data, not a header .*set source\.header: false and "
                                                  r"source\.names: \[\.\.\.\]"):
        open_source(str(p))


def test_headerless_csv_with_names_counts_the_first_line_as_data(tmp_path):
    p = tmp_path / "book.csv"
    p.write_text("5859400,200,5853300\n5859300,100,5853200\n5859200,50,5853100")  # no final newline
    src = open_source(str(p), header=False, names=["ask", "size", "bid"])
    assert src.columns == ("ask", "size", "bid") and src.array.shape == (3, 3) and src.files[0].rows == 3
    np.testing.assert_array_equal(src.array.compute(), np.array(
        [[5859400, 200, 5853300], [5859300, 100, 5853200], [5859200, 50, 5853100]], np.float32))
    cols = open_source(str(p), header=False, names=["ask", "size", "bid"], columns=["bid"]).array.compute()
    assert cols[:, 0].tolist() == [5853300, 5853200, 5853100]


BOOK_TICKER = ["update_id", "best_bid_price", "best_bid_qty", "transaction_time"]


def _ticker_rows(t0: int, n: int = 4) -> tuple[str, np.ndarray]:
    """Binance bookTicker lines (no header) and their values, as numpy holds them."""
    rows = np.array([[t0 // 1000 + i, 42000 + i / 10, 1.5, t0 + i * 1000] for i in range(n)])
    return "".join(f"{int(a)},{b:.1f},{c},{int(d)}\n" for a, b, c, d in rows), rows


def test_a_header_read_as_data_is_named_as_a_header(tmp_path):
    # data.binance.vision: older days without a header, newer ones with one. Read with
    # header: false, the header used to reach the timestamp parser, which blamed the times.
    text, _ = _ticker_rows(1704067200000)
    p = tmp_path / "BTCUSDT-bookTicker-2024-01-01.csv"
    p.write_text(",".join(BOOK_TICKER) + "\n" + text)
    with pytest.raises(FormatMismatchError, match=r"2024-01-01\.csv: line 1 'update_id,best_bid_price,.*' holds column "
                       r"names \(a header\), but source\.header is false.*set source\.header: auto"):
        open_source(str(p), header=False, names=BOOK_TICKER, timestamp="transaction_time", timestamp_unit="ms")
    # Names other than those given, too: no number where the line below has one.
    q = tmp_path / "other.csv"
    q.write_text("id,bid,qty,time\n" + text)
    with pytest.raises(FormatMismatchError, match=r"other\.csv: line 1 'id,bid,qty,time' holds column names"):
        open_source(str(q), header=False, names=BOOK_TICKER)


def test_header_auto_reads_a_folder_mixing_files_with_and_without_a_header(tmp_path):
    old, old_rows = _ticker_rows(1703980800000)
    new, new_rows = _ticker_rows(1704067200000)
    (tmp_path / "d-2023-12-31.csv").write_text(old)  # no header
    (tmp_path / "d-2024-01-01.csv").write_text(",".join(BOOK_TICKER) + "\n" + new)
    # Its columns named in another order: read by name.
    order = [2, 0, 3, 1]
    (tmp_path / "d-2024-01-02.csv").write_text(
        ",".join(BOOK_TICKER[j] for j in order) + "\n" + "".join(
            ",".join(line.split(",")[j] for j in order) + "\n" for line in _ticker_rows(1704153600000)[0].splitlines()))
    src = open_source(str(tmp_path / "*.csv"), header="auto", names=BOOK_TICKER, timestamp="transaction_time",
                      timestamp_unit="ms", dtype="float64")
    want = np.concatenate([old_rows, new_rows, _ticker_rows(1704153600000)[1]])
    assert src.columns == ("update_id", "best_bid_price", "best_bid_qty")
    np.testing.assert_array_equal(src.array.compute(), want[:, :3])
    np.testing.assert_array_equal(src.timestamps.compute(), want[:, 3].astype(np.int64) * 10**6)


def test_header_auto_refuses_a_header_of_other_columns_and_headerless_files_without_names(tmp_path):
    text, _ = _ticker_rows(1704067200000)
    p = tmp_path / "x.csv"
    p.write_text("id,bid,qty,time\n" + text)
    with pytest.raises(FormatMismatchError, match=r"x\.csv: source\.header is auto and line 1 is a header naming "
                       r"\['id', 'bid', 'qty', 'time'\], not the columns of source\.names"):
        open_source(str(p), header="auto", names=BOOK_TICKER)
    (tmp_path / "y.csv").write_text(text)
    with pytest.raises(FormatMismatchError, match=r"y\.csv: source\.header is auto and line 1 is no header but no "
                       r"column names were given"):
        open_source(str(tmp_path / "y.csv"), header="auto")


@pytest.mark.parametrize("fields, below, names, decimal, want", [
    (["a", "b"], ["1", "2"], None, ".", True),
    (["1", "2"], ["3", "4"], None, ".", False),
    (["", "2"], ["1", "2"], None, ".", False),  # a data line with a missing value
    (["", "price"], ["0", "1.5"], None, ".", True),  # pandas' index column: no name
    (["BTC", "1.5"], ["BTC", "1.6"], None, ".", False),  # a text column is no header
    (["a", "b"], [], ["a", "b"], ".", True),  # a header alone
    (["3", "4"], [], None, ".", False),
    (["a", "1,5"], ["b", "2,5"], None, ",", False),  # decimal commas are numbers
    (["2024", "x"], ["1", "2"], ["2024", "x"], ".", True),  # the names given, digits and all
])
def test_header_lines_are_told_from_data_lines(fields, below, names, decimal, want):
    assert tables.is_header_line(fields, below, names, decimal) is want


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.lists(st.one_of(st.integers(-10**15, 10**15).map(str),
                                        st.floats(allow_nan=False, allow_infinity=False).map(repr),
                                        st.just("")), min_size=3, max_size=3), min_size=2, max_size=2),
       words=st.lists(st.from_regex(r"[a-z_][a-z_ ]{0,8}", fullmatch=True).filter(
           lambda w: w.strip().lower() not in ("nan", "inf", "infinity")), min_size=3, max_size=3))
def test_data_lines_are_never_headers_and_names_over_them_are(rows, words):
    # A line of numbers (some missing) is data however the line below looks; names over
    # a line with at least one number are a header, given as source.names or not.
    assert not tables.is_header_line(rows[0], rows[1], None)
    if any(rows[1]):
        assert tables.is_header_line(words, rows[1], None) and tables.is_header_line(words, [], words)


def test_names_replace_a_header(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text("x,y\n1,2\n3,4\n")
    src = open_source(str(p), names=["a", "b"])
    assert src.columns == ("a", "b") and src.array.compute().tolist() == [[1, 2], [3, 4]]


def test_headerless_needs_names_of_the_right_count(tmp_path):
    p = tmp_path / "book.csv"
    p.write_text("1,2,3,4\n5,6,7,8\n")
    with pytest.raises(FormatMismatchError, match=r"book\.csv: source\.header is false but no column names .*"
                                                  r"source\.names: \[\.\.\.\] \(4 names"):
        open_source(str(p), header=False)
    with pytest.raises(FormatMismatchError, match=r"book\.csv: expected 3 fields per line .*found 4"):
        open_source(str(p), header=False, names=["a", "b", "c"])
    pq.write_table(table(0), tmp_path / "t.parquet")
    with pytest.raises(FormatMismatchError, match=r"t\.parquet: source\.names applies to headerless CSV"):
        open_source(str(tmp_path / "t.parquet"), names=["a"])


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_rename_exposes_source_columns_under_canonical_names(tmp_path, fmt):
    t = pa.table({"ts_event": table(0).column("timestamp"), "bids[0].price": np.arange(50.0),
                  "asks[0].price": np.arange(50.0) + 0.5, "other": np.ones(50)})
    p = tmp_path / f"feed.{fmt}"
    (pq.write_table(t, p, row_group_size=20) if fmt == "parquet" else pacsv.write_csv(t, p))
    rename = {"bid_price_1": "bids[0].price", "ask_price_1": "asks[0].price", "timestamp": "ts_event"}
    src = open_source(str(p), rename=rename, timestamp="timestamp")
    assert src.columns == ("bid_price_1", "ask_price_1", "other")
    np.testing.assert_array_equal(src.array.compute(), np.stack([np.arange(50.0), np.arange(50.0) + 0.5,
                                                                 np.ones(50)], 1).astype(np.float32))
    expected_ns = t.column("ts_event").to_numpy().astype("datetime64[ns]").astype(np.int64)
    np.testing.assert_array_equal(src.timestamps.compute(), expected_ns)
    picked = open_source(str(p), rename=rename, timestamp="timestamp", columns=["ask_price_1"]).array.compute()
    np.testing.assert_array_equal(picked[:, 0], np.arange(50.0, dtype=np.float32) + 0.5)
    with pytest.raises(MissingColumnError, match=r"feed\.%s: rename maps 'bid_price_2' to source column "
                                                 r"'bids\[1\]\.price', which the file lacks" % fmt):
        open_source(str(p), rename={**rename, "bid_price_2": "bids[1].price"})
    with pytest.raises(LoaderError, match=r"feed\.%s: rename .* gives two columns the name\(s\) \['other'\]" % fmt):
        open_source(str(p), rename={"other": "bids[0].price"})


# -- timestamps -----------------------------------------------------------------------------


def _ns(values) -> list[int]:
    """ISO strings or datetimes as integer ns since the epoch, computed by numpy, not pyarrow."""
    return [int(np.datetime64(v, "ns").astype(np.int64)) for v in values]


def test_timestamps_from_parquet_timestamp_types(tmp_path):
    ts = np.datetime64("2026-01-05T09:30:00") + np.arange(40).astype("timedelta64[ms]") * 1500
    for unit in ("s", "ms", "us", "ns"):
        typ = pa.timestamp(unit, tz="UTC" if unit == "us" else None)
        t = pa.table({"t": pa.array(ts.astype(f"datetime64[{unit}]"), typ), "v": np.arange(40.0)})
        pq.write_table(t, tmp_path / f"{unit}.parquet", row_group_size=16)
        src = open_source(str(tmp_path / f"{unit}.parquet"), timestamp="t", chunk_rows=16)
        assert src.timestamps.dtype == np.int64 and src.timestamps.chunks == src.array.chunks[:1] == ((16, 16, 8),)
        expected = ts.astype(f"datetime64[{unit}]").astype("datetime64[ns]").astype(np.int64)
        np.testing.assert_array_equal(src.timestamps.compute(), expected)
    assert open_source(str(tmp_path / "ns.parquet")).timestamps is None


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_timestamps_from_iso_strings_integers_and_float_seconds(tmp_path, fmt):
    iso = ["2026-01-05T09:30:00.123456789", "2026-01-05T09:30:01", "2026-01-05T10:00:00.5"]
    cases = {
        "iso": (pa.array(iso), _ns(iso)),
        "utc": (pa.array(["2026-01-05T09:30:00Z", "2026-01-05T10:30:00+01:00", "2026-01-05T09:30:02.25Z"]),
                _ns(["2026-01-05T09:30:00", "2026-01-05T09:30:00", "2026-01-05T09:30:02.25"])),
        "int_ns": (pa.array([1_767_605_400_000_000_001, 1_767_605_400_000_000_002, 1_767_605_401_000_000_000]),
                   [1_767_605_400_000_000_001, 1_767_605_400_000_000_002, 1_767_605_401_000_000_000]),
        "float_s": (pa.array([1_767_605_400.25, 1_767_605_400.5, 1_767_605_401.0]),
                    [1_767_605_400_250_000_000, 1_767_605_400_500_000_000, 1_767_605_401_000_000_000]),
    }
    for name, (col, expected) in cases.items():
        t = pa.table({"when": col, "v": [1.0, 2.0, 3.0]})
        p = tmp_path / f"{name}.{fmt}"
        (pq.write_table(t, p) if fmt == "parquet" else pacsv.write_csv(t, p))
        src = open_source(str(p), timestamp="when")
        assert src.columns == ("v",), name
        assert src.timestamps.compute().tolist() == expected, name


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_numeric_timestamps_in_a_named_unit(tmp_path, fmt):
    iso = ["2024-01-02T09:30:00", "2024-01-02T09:30:00.001", "2024-01-02T09:30:01.5"]
    ns = np.array(_ns(iso), dtype=np.int64)
    cases = {  # unit -> the column as a feed writes it
        "s": pa.array((ns // 10**9).tolist()),
        "ms": pa.array((ns // 10**6).tolist()),
        "us": pa.array((ns // 10**3).tolist()),
        "ns": pa.array(ns.tolist()),
    }
    per = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
    for unit, col in cases.items():
        p = tmp_path / f"{unit}.{fmt}"
        t = pa.table({"when": col, "v": [1.0, 2.0, 3.0]})
        (pq.write_table(t, p) if fmt == "parquet" else pacsv.write_csv(t, p))
        got = open_source(str(p), timestamp="when", timestamp_unit=unit).timestamps.compute()
        np.testing.assert_array_equal(got, ns // per[unit] * per[unit])
    # Float milliseconds (pandas' epoch ms as float): each the nanosecond nearest its value.
    p = tmp_path / f"float_ms.{fmt}"
    t = pa.table({"when": pa.array([1_704_187_800_000.25, 1_704_187_800_001.5, 1_704_187_801_500.0]), "v": [1.0] * 3})
    (pq.write_table(t, p) if fmt == "parquet" else pacsv.write_csv(t, p))
    got = open_source(str(p), timestamp="when", timestamp_unit="ms").timestamps.compute()
    assert got.tolist() == [1_704_187_800_000_250_000, 1_704_187_800_001_500_000, 1_704_187_801_500_000_000]


@pytest.mark.parametrize("values, unit, why", [
    ([1_704_187_800_000, 1_704_187_800_001], "ms", "integers as nanoseconds"),   # epoch ms, a common feed
    ([1_704_187_800, 1_704_187_801], "s", "integers as nanoseconds"),
    ([1_704_187_800_000_000, 1_704_187_800_000_001], "us", "integers as nanoseconds"),
    ([1_704_187_800_000.5, 1_704_187_800_001.0], "ms", "floats as seconds"),
])
def test_numeric_timestamps_that_are_dates_only_in_another_unit_are_refused_naming_it(tmp_path, values, unit, why):
    p = tmp_path / "feed.parquet"
    pq.write_table(pa.table({"when": pa.array(values), "v": [1.0, 2.0]}), p)
    with pytest.raises(LoaderError, match=rf"feed\.parquet: timestamp column 'when': its first value .*default to "
                                          rf"{why}\) is (19[67]\d-\S*|past the year 2262), but as epoch {unit} it "
                                          rf"is 2024-01-02T09:30:00: set source\.timestamp_unit: {unit}"):
        open_source(str(p), timestamp="when").timestamps.compute()
    # Naming the default unit refuses them too: one timestamp_unit holds for every file,
    # and a file that is a date only in another unit is one of that unit among them (a
    # vendor's switch of unit, as Binance's from ms to us in 2025), read decades off.
    default = "ns" if isinstance(values[0], int) else "s"
    with pytest.raises(LoaderError, match=rf"feed\.parquet: timestamp column 'when': its first value .* read as "
                                          rf"{default} \(source\.timestamp_unit\) is .*, but as epoch {unit} it is "
                                          rf"2024-01-02T09:30:00: this file's times are in {unit}; one timestamp_unit "
                                          r"holds for every file, so convert the files of the other unit first"):
        open_source(str(p), timestamp="when", timestamp_unit=default).timestamps.compute()


def test_a_file_of_another_unit_among_those_of_the_set_unit_is_refused_naming_its_unit(tmp_path):
    """Binance's spot files are in epoch ms until 2024-12-31 and in us from 2025-01-01:
    under timestamp_unit: us the December file was read as January 1970, silently."""
    days = {"2024-12-31": 10**3, "2025-01-01": 1}  # the us multiple of each day's stamps
    for day, scale in days.items():
        first_us = int(np.datetime64(day, "us").astype(np.int64))
        pacsv.write_csv(pa.table({"when": pa.array([(first_us + i * 10**6) // scale for i in range(3)]),
                                  "v": [1.0] * 3}), tmp_path / f"BTCUSDT-{day}.csv")
    with pytest.raises(LoaderError, match=r"BTCUSDT-2024-12-31\.csv: .* read as us \(source\.timestamp_unit\) is "
                                          r"1970-01-21T02:06:43, but as epoch ms it is 2024-12-31T00:00:00"):
        open_source(str(tmp_path / "*.csv"), timestamp="when", timestamp_unit="us").timestamps.compute()
    with pytest.raises(LoaderError, match=r"BTCUSDT-2025-01-01\.csv: .* read as ms \(source\.timestamp_unit\) is "
                                          r"past the year 2262, but as epoch us it is 2025-01-01T00:00:00"):
        open_source(str(tmp_path / "*.csv"), timestamp="when", timestamp_unit="ms").timestamps.compute()
    (tmp_path / "BTCUSDT-2024-12-31.csv").unlink()  # one unit: read
    got = open_source(str(tmp_path / "*.csv"), timestamp="when", timestamp_unit="us").timestamps.compute()
    assert got[0] == np.datetime64("2025-01-01", "ns").astype(np.int64)


def test_numeric_times_that_are_no_date_in_any_unit_are_read_as_before(tmp_path):
    # Counters and times since the start of a simulation: no unit makes them a date.
    p = tmp_path / "sim.parquet"
    pq.write_table(pa.table({"step": pa.array([0, 1, 5]), "secs": pa.array([0.5, 1.25, 2.0]), "v": [1.0] * 3}), p)
    assert open_source(str(p), timestamp="step").timestamps.compute().tolist() == [0, 1, 5]
    assert open_source(str(p), timestamp="secs").timestamps.compute().tolist() == [500_000_000, 1_250_000_000,
                                                                                   2_000_000_000]
    with pytest.raises(pipeline.errors.ConfigError, match="timestamp_unit.*s or ms or us or ns"):
        open_source(str(p), timestamp="step", timestamp_unit="minutes")


def test_timestamps_follow_the_rows_that_nan_drop_keeps(tmp_path):
    tables_ = write_days(tmp_path, "parquet", days=3)
    frames = []
    for i, t in enumerate(tables_):
        a = t.column("a").to_numpy().copy()
        a[[3 + i, 20, 21 + i]] = np.nan  # rows dropped in different row groups of each file
        frames.append(t.set_column(1, "a", pa.array(a)))
        pq.write_table(frames[-1], tmp_path / f"day{i}.parquet", row_group_size=20)
    src = open_source(str(tmp_path / "*.parquet"), timestamp="timestamp", nan="drop")
    a = np.concatenate([f.column("a").to_numpy() for f in frames])
    ts = np.concatenate([f.column("timestamp").to_numpy().astype("datetime64[ns]").astype(np.int64) for f in frames])
    keep = np.isfinite(a)
    assert src.array.shape[0] == keep.sum() == 150 - 9
    assert src.timestamps.chunks == src.array.chunks[:1]
    np.testing.assert_array_equal(src.timestamps.compute(), ts[keep])
    np.testing.assert_array_equal(src.array.compute()[:, 0], a[keep].astype(np.float32))


def test_timestamps_are_their_own_layer(tmp_path, monkeypatch):
    write_days(tmp_path, "parquet", days=2)
    import pipeline.loaders.tables as tables

    calls = []
    original = tables._read_part
    monkeypatch.setattr(tables, "_read_part", lambda *a, **k: calls.append(1) or original(*a, **k))
    src = open_source(str(tmp_path / "*.parquet"), timestamp="timestamp")
    src.timestamps.compute(scheduler="sync")
    assert calls == []  # the values were not read to get the times


def test_bad_timestamp_values_name_the_file(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"when": pa.array([1.0, None, 3.0]), "v": [1.0, 2.0, 3.0]}), p)
    with pytest.raises(LoaderError, match=r"t\.parquet: timestamp column 'when': missing value at row 1 of row group 0"):
        open_source(str(p), timestamp="when").timestamps.compute()
    pq.write_table(pa.table({"when": ["not a time", "x", "y"], "v": [1.0, 2.0, 3.0]}), p)
    with pytest.raises(LoaderError, match=r"t\.parquet: timestamp column 'when': row 0 of row group 0 'not a time' "
                                          r"is no time: expected ISO-8601 text"):
        open_source(str(p), timestamp="when").timestamps.compute()


# -- instruments ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_instrument_codes_and_names(tmp_path, fmt):
    names = [np.array(["MSFT", "AAPL", "MSFT", "ZZ", "AAPL"] * 6), np.array(["MSFT", "IBM", "MSFT"] * 10)]
    values = []
    for i, inst in enumerate(names):
        v = np.arange(30.0) + 100 * i
        v[[2, 7]] = np.nan
        values.append(v)
        t = pa.table({"sym": inst, "timestamp": table(i, 30).column("timestamp"), "v": v, "w": v * 2})
        p = tmp_path / f"d{i}.{fmt}"
        (pq.write_table(t, p, row_group_size=10) if fmt == "parquet" else pacsv.write_csv(t, p))
    src = open_source(str(tmp_path / f"*.{fmt}"), timestamp="timestamp", instrument_column="sym", nan="drop")
    assert src.columns == ("v", "w")  # neither the instrument nor the timestamp column
    assert src.instruments == ("AAPL", "IBM", "MSFT", "ZZ")
    assert src.instrument_codes.dtype == np.int32 and src.instrument_codes.chunks == src.array.chunks[:1]
    v = np.concatenate(values)
    keep = np.isfinite(v)
    codes = src.instrument_codes.compute()
    assert [src.instruments[c] for c in codes] == np.concatenate(names)[keep].tolist()
    np.testing.assert_array_equal(src.array.compute()[:, 0], v[keep].astype(np.float32))
    assert src.metadata()["instruments"] == ["AAPL", "IBM", "MSFT", "ZZ"]


def test_integer_instrument_column_gives_string_names(tmp_path):
    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"inst": np.array([10, 9, 10, 2], np.int64), "v": np.arange(4.0)}), p)
    src = open_source(str(p), instrument_column="inst")
    assert src.instruments == ("10", "2", "9") and src.columns == ("v",)
    assert src.instrument_codes.compute().tolist() == [0, 2, 0, 1]
    with pytest.raises(MissingColumnError, match=r"t\.parquet: missing instrument column 'sym'"):
        open_source(str(p), instrument_column="sym")


@pytest.mark.parametrize("first", ["2026-01-05 09:30:00.123,390.98,12,391.02", "09:30:00.5,390.98,12,391.02",
                                   "2026-01-05T09:30:00Z,390.98,12,x"])
def test_a_headerless_file_starting_with_a_time_is_refused_too(tmp_path, first):
    """A text timestamp first: the line is still data (most fields are values)."""
    p = tmp_path / "feed.csv"
    p.write_text(first + "\n" + first + "\n")
    with pytest.raises(FormatMismatchError, match=r"feed\.csv: its first line .* looks like data"):
        open_source(str(p))


def test_a_header_naming_columns_with_digits_is_a_header(tmp_path):
    p = tmp_path / "ok.csv"
    p.write_text("timestamp,bid_price_1,ask_price_1,2\n2026-01-05T09:30:00,1.5,2.5,3\n")
    src = open_source(str(p), timestamp="timestamp")
    assert src.columns == ("bid_price_1", "ask_price_1", "2")
    np.testing.assert_allclose(src.array.compute(), [[1.5, 2.5, 3.0]])


def _compress(path, suffix: str):
    """``path`` compressed beside itself as ``path + suffix``, the way shippers do."""
    import bz2
    import gzip
    import lzma

    opener = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}[suffix]
    target = path.with_name(path.name + suffix)
    with opener(target, "wb") as out:
        out.write(path.read_bytes())
    return target


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_compressed_csv_reads_as_the_plain_file(tmp_path, suffix):
    plain, packed = tmp_path / "plain", tmp_path / "packed"
    plain.mkdir(), packed.mkdir()
    write_days(plain, "csv", days=3, n=700)
    for f in sorted(plain.glob("*.csv")):
        _compress(f, suffix).rename(packed / (f.name + suffix))
    ref = open_source(str(plain / "*.csv"), timestamp="timestamp", chunk_rows=256)
    got = open_source(str(packed / f"*.csv{suffix}"), timestamp="timestamp", chunk_rows=256)
    assert ref.array.chunks[0] == (256, 256, 188) * 3  # plain files in parts
    assert got.array.chunks[0] == (700,) * 3  # a compressed file is one part
    np.testing.assert_array_equal(got.array.compute(), ref.array.compute())
    np.testing.assert_array_equal(got.timestamps.compute(), ref.timestamps.compute())
    assert [f.rows for f in got.files] == [700] * 3
    # Errors name the compressed file and its (decompressed) line.
    t = np.datetime64("2026-01-05T09:30:00", "ns") + np.arange(30).astype("timedelta64[s]")
    t[[12, 13]] = t[[13, 12]]
    pacsv.write_csv(pa.table({"timestamp": pa.array(t), "v": np.arange(30.0)}), tmp_path / "swapped.csv")
    bad = _compress(tmp_path / "swapped.csv", suffix)
    with pytest.raises(LoaderError, match=rf"swapped\.csv\{suffix}: timestamp column 'timestamp': line 15 is at"):
        open_source(str(bad), timestamp="timestamp").timestamps.compute()


def test_compressed_files_of_other_formats_are_refused_naming_them(tmp_path):
    np.save(tmp_path / "a.npy", np.zeros(3))
    _compress(tmp_path / "a.npy", ".gz")
    with pytest.raises(FormatMismatchError, match=r"a\.npy\.gz: a \.gz file is read as compressed text .*\.npy inside"):
        open_source(str(tmp_path / "a.npy.gz"))
    (tmp_path / "b.csv.lz4").write_bytes(b"\x04\x22\x4d\x18")
    with pytest.raises(FormatMismatchError, match=r"unknown suffix '\.lz4'.*\.csv\.gz, .*\.csv\.zst"):
        open_source(str(tmp_path / "b.csv.lz4"))


def test_a_naive_file_among_aware_ones_is_refused_naming_both_kinds(tmp_path):
    """A day written without its zone would be read as UTC, hours from its true time
    (pandas: 09:30 in New York is 14:30 UTC, the naive file says 09:30)."""
    import pandas as pd

    for day in ("2026-01-05", "2026-01-06", "2026-01-07"):
        t = pd.date_range(f"{day} 09:30", periods=10, freq="min")
        t = t if day == "2026-01-07" else t.tz_localize("America/New_York")
        pd.DataFrame({"timestamp": t, "v": np.arange(10.0)}).to_parquet(tmp_path / f"{day}.parquet")
    kinds = {p.name: pq.read_schema(p).field("timestamp").type.tz for p in sorted(tmp_path.glob("*.parquet"))}
    assert kinds == {"2026-01-05.parquet": "America/New_York", "2026-01-06.parquet": "America/New_York",
                     "2026-01-07.parquet": None}
    with pytest.raises(LoaderError, match=r"2026-01-07\.parquet: timestamp column 'timestamp' is naive \(no time "
                                          r"zone\); the files mix both, time-zone-aware: 2 file\(s\) \(first .*2026-01-05\.parquet, "
                                          r"America/New_York\), naive: 1 file\(s\)"):
        open_source(str(tmp_path / "*.parquet"), timestamp="timestamp")
    # Without timestamps, the zones do not matter.
    assert open_source(str(tmp_path / "*.parquet"), columns=["v"]).array.shape == (30, 1)


def test_a_naive_csv_among_csvs_with_utc_offsets_is_refused_naming_it(tmp_path):
    """A CSV stores no zone, but a time that names its offset is an instant (pyarrow reads
    it as UTC) and one that does not is a wall-clock time read as UTC: hours apart."""
    import pandas as pd

    for day in ("2026-01-05", "2026-01-06", "2026-01-07"):
        t = pd.date_range(f"{day} 09:30", periods=10, freq="min", tz="Australia/Sydney")
        text = t.strftime("%Y-%m-%dT%H:%M:%S%z") if day != "2026-01-07" else t.strftime("%Y-%m-%d %H:%M:%S")
        pd.DataFrame({"timestamp": text, "v": np.arange(10.0)}).to_csv(tmp_path / f"{day}.csv", index=False)
    with pytest.raises(LoaderError, match=r"2026-01-07\.csv: timestamp column 'timestamp' is naive \(no time zone\); "
                                          r"the files mix both, time-zone-aware: 2 file\(s\)"):
        open_source(str(tmp_path / "*.csv"), timestamp="timestamp")
    (tmp_path / "2026-01-07.csv").unlink()
    src = open_source(str(tmp_path / "*.csv"), timestamp="timestamp")
    # Instants, as pandas reads them: 09:30 in Sydney is 22:30 UTC the day before.
    want = pd.to_datetime(pd.concat([pd.read_csv(f)["timestamp"] for f in sorted(tmp_path.glob("*.csv"))]), utc=True)
    np.testing.assert_array_equal(src.timestamps.compute(),
                                  want.dt.tz_localize(None).to_numpy().astype("datetime64[ns]").view(np.int64))


def test_a_header_only_csv_day_is_skipped_like_an_empty_parquet_day(tmp_path):
    """A day without rows: no chunk, its file still listed with 0 rows, the others as
    pandas reads them."""
    import pandas as pd

    days = write_days(tmp_path, "csv", days=3)
    empty = tmp_path / "day1.csv"
    empty.write_text(empty.read_text().splitlines()[0] + "\n")
    pq.write_table(days[1].slice(0, 0), tmp_path / "day1.parquet")
    for fmt in ("csv", "parquet"):
        if fmt == "parquet":
            for d in (0, 2):
                pq.write_table(days[d], tmp_path / f"day{d}.parquet")
        src = open_source(str(tmp_path / f"*.{fmt}"), timestamp="timestamp", columns=["a", "b"])
        assert [f.rows for f in src.files] == [50, 0, 50]
        ref = pd.concat([pd.read_csv(tmp_path / f"day{d}.csv") for d in (0, 2)])
        np.testing.assert_allclose(src.array.compute(), ref[["a", "b"]].to_numpy(np.float32))
        times = pd.DatetimeIndex(pd.to_datetime(ref["timestamp"])).as_unit("ns").asi8
        np.testing.assert_array_equal(src.timestamps.compute(), times)


def test_a_relative_glob_expands_to_absolute_paths(tmp_path, monkeypatch):
    """Workers of a remote cluster do not share this process's working directory."""
    import os

    from pipeline.loaders import expand_paths

    (tmp_path / "raw").mkdir()
    write_days(tmp_path / "raw", "csv", days=2)
    monkeypatch.chdir(tmp_path)
    expect = sorted(os.path.join(str(tmp_path), "raw", f) for f in os.listdir(tmp_path / "raw"))
    assert expand_paths("raw/*.csv") == expect
    assert expand_paths(["raw/day1.csv", "./raw/../raw/day0.csv"]) == [expect[1], expect[0]]
    assert expand_paths("file://" + str(tmp_path / "raw" / "day0.csv")) == ["file://" + expect[0]]
    assert [f.path for f in open_source("raw/*.csv", timestamp="timestamp").files] == expect
    monkeypatch.setenv("HOME", str(tmp_path))  # ~ is the home directory, not a directory named ~
    assert expand_paths("~/raw/*.csv") == expect and expand_paths("~/raw/day0.csv") == [expect[0]]


def test_a_store_recorded_relative_paths_compares_them_as_absolute(tmp_path, monkeypatch):
    """Stores built before paths were made absolute recorded relative ones: an append
    must still find those files, not take them for missing and every file for new."""
    import os

    from pipeline.loaders import expand_paths
    from pipeline.loaders.provenance import compare_files, recorded_files

    (tmp_path / "raw").mkdir()
    write_days(tmp_path / "raw", "csv", days=2)
    monkeypatch.chdir(tmp_path)
    st0 = os.stat("raw/day0.csv")
    recorded = recorded_files({"files": [{"path": "raw/day0.csv", "size": st0.st_size, "mtime": st0.st_mtime}]})
    changes = compare_files(recorded, expand_paths("raw/*.csv"), lambda p: (os.stat(p).st_size, os.stat(p).st_mtime))
    assert changes.new == (str(tmp_path / "raw" / "day1.csv"),) and not changes.missing and not changes.changed


@pytest.mark.parametrize("dtype, value, hint", [
    ("float32", 5_100_125_000_000,  # Databento fixed-point, 1e-9 units
     "set source.dtype: float64 (exact up to 2**53); if they are fixed-point prices, source.scale gives their unit"),
    ("float64", np.iinfo(np.int64).max,  # its empty level
     "sentinel for no value (an empty level): list it in source.missing ({bid_price_1: [9223372036854775807]}"),
])
def test_integers_a_float_cannot_hold_exactly_are_refused_saying_so(tmp_path, dtype, value, hint):
    px = np.full(6, 5_100_125_000_000, np.int64)
    px[3] = value if value != px[0] else px[0] + 1
    pq.write_table(pa.table({"bid_px_00": px, "bid_sz_00": np.arange(6, dtype=np.int64)}), tmp_path / "d.parquet")
    src = open_source(str(tmp_path / "d.parquet"), rename={"bid_price_1": "bid_px_00"}, dtype=dtype)
    with pytest.raises(LoaderError) as err:
        src.array.compute()
    msg = str(err.value)
    bad = int(np.flatnonzero(np.abs(px.astype(float)) > (2**24 if dtype == "float32" else 2**53))[0])
    assert f"column 'bid_price_1' (the file's 'bid_px_00'): the int64 value {px[bad]} at row {bad} " in msg
    assert f"does not fit {dtype} exactly" in msg and hint in msg and "expected numbers" not in msg


def test_integer_sizes_past_float32_name_float64_and_no_price_scale(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("bid_size_1,ask_size_1\n5,16777217\n")
    with pytest.raises(LoaderError, match=r"'ask_size_1': the int64 value 16777217 at line 2 does not fit float32 "
                       r"exactly .*set source.dtype: float64 \(exact up to 2\*\*53\); or, if no feature or label "
                       r"reads 'ask_size_1', leave it out: source.columns"):
        open_source(str(p)).array.compute()
    # float64 holds them exactly, as numpy does
    got = open_source(str(p), dtype="float64").array.compute()
    np.testing.assert_array_equal(got, np.array([[5, 16777217]], dtype=np.float64))


def test_an_id_column_past_float32_under_nan_drop_points_to_source_columns(tmp_path):
    # Binance's bookTicker: update_id (about 3.9e12) is read only because nan: drop reads
    # every column; the refusal names source.columns, which leaves it out.
    p = tmp_path / "bt.csv"
    ids = np.arange(3_900_000_000_000, 3_900_000_000_004, dtype=np.int64)
    bid = np.array([42000.5, 42000.6, np.nan, 42000.8])
    p.write_text("update_id,best_bid_price\n" + "".join(
        f"{i},{'' if np.isnan(b) else b}\n" for i, b in zip(ids, bid)))
    rename = {"bid_price_1": "best_bid_price"}
    with pytest.raises(LoaderError, match=r"bt\.csv: column 'update_id': the int64 value 3900000000000 at line 2 .*"
                       r"leave it out: source\.columns lists the columns read"):
        open_source(str(p), rename=rename, nan="drop").array.compute()
    got = open_source(str(p), rename=rename, nan="drop", columns=["bid_price_1"]).array.compute()
    np.testing.assert_array_equal(got[:, 0], bid[np.isfinite(bid)].astype(np.float32))


def test_a_second_timestamp_read_under_nan_drop_points_to_source_columns_not_to_a_price_scale(tmp_path):
    """Databento MBP-10 with timestamp ts_recv: source.nan: drop reads every column, so
    ts_event (int64 ns, past 2**53) too. Scaling it, the fix for fixed-point prices,
    would make a time a feature: the refusal says it looks like a time and names
    source.columns, which leaves it out (and then reads the same prices as pandas)."""
    import pandas as pd

    recv = 1_704_205_800_000_000_000 + np.arange(5, dtype=np.int64) * 1_000_000
    ref = pd.DataFrame({"ts_recv": recv, "ts_event": recv - 2_515_140 * np.arange(1, 6),
                        "bid_px_00": [42_000.5, 42_000.6, np.nan, 42_000.8, 42_000.9]})
    p = tmp_path / "glbx-mdp3-20240102.mbp-10.csv"
    ref.to_csv(p, index=False)
    kw = dict(timestamp="ts_recv", dtype="float64", nan="drop", rename={"bid_price_1": "bid_px_00"})
    with pytest.raises(LoaderError) as err:
        open_source(str(p), **kw).array.compute()
    msg, event = str(err.value), int(pd.read_csv(p)["ts_event"].iloc[0])
    when = str(pd.Timestamp(event, unit="ns").to_datetime64())
    assert msg.startswith(f"{p}: column 'ts_event': the int64 value {event} at line 2 does not fit float64 exactly")
    assert msg.endswith(f"'ts_event' looks like a timestamp ({when} as epoch ns), not a value to compute features "
                        "from: if no feature or label reads 'ts_event', leave it out: source.columns lists the "
                        "columns read (source.nan: drop reads every column unless source.columns names them)")
    assert "source.scale" not in msg
    got = open_source(str(p), columns=["bid_price_1"], **kw).array.compute()
    np.testing.assert_array_equal(got[:, 0], ref["bid_px_00"].dropna().to_numpy())


def test_nan_errors_name_the_column_as_the_config_and_the_file_do(tmp_path):
    p = tmp_path / "q.csv"
    p.write_text("Bid Price,Ask Price\n1.5,1.6\n,1.7\n")
    with pytest.raises(InvalidValueError, match=r"q\.csv: NaN or inf in column 'bid_price_1' \(the file's "
                       r"'Bid Price'\) at line 3; set source\.nan"):
        open_source(str(p), rename={"bid_price_1": "Bid Price", "ask_price_1": "Ask Price"}).array.compute()


def _fall_back_day(minutes: int = 7):
    import pandas as pd

    return pd.date_range(pd.Timestamp("2024-11-03", tz="America/New_York"),
                         pd.Timestamp("2024-11-04", tz="America/New_York"), freq=f"{minutes}min",
                         inclusive="left").as_unit("ns")


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_naive_local_times_repeating_an_hour_are_not_told_to_sort(tmp_path, fmt):
    ts = _fall_back_day()
    wall = ts.tz_localize(None)
    back = int(np.flatnonzero(np.diff(wall.asi8) < 0)[0]) + 1  # pandas: where the wall clock steps back
    frame = pa.table({"timestamp": pa.array(wall.asi8, pa.timestamp("ns")), "v": np.arange(len(ts), dtype=float)})
    p = tmp_path / f"d.{fmt}"
    if fmt == "parquet":
        pq.write_table(frame, p)
    else:
        p.write_text("timestamp,v\n" + "".join(f"{t.isoformat()},{i}\n" for i, t in enumerate(wall)))
    src = open_source(str(p), timestamp="timestamp")
    with pytest.raises(LoaderError) as err:
        src.timestamps.compute()
    msg = str(err.value)
    minutes = (wall.asi8[back - 1] - wall.asi8[back]) // 60 // 10**9
    where = f"row {back} of row group 0" if fmt == "parquet" else f"line {back + 2}"
    assert f"{where} is at {wall[back].isoformat()}" in msg and f"steps back {minutes} min" in msg
    assert "daylight-saving" in msg and "with their zone" in msg and "sort the file" not in msg
    # With their zone the same instants are in order, and read as pandas reads them
    aware = tmp_path / "aware.parquet"
    pq.write_table(pa.table({"timestamp": pa.array(ts.asi8, pa.timestamp("ns", tz="America/New_York")),
                             "v": np.arange(len(ts), dtype=float)}), aware)
    np.testing.assert_array_equal(open_source(str(aware), timestamp="timestamp").timestamps.compute(), ts.asi8)


def test_rows_out_of_order_by_more_than_an_hour_are_still_told_to_sort(tmp_path):
    p = tmp_path / "d.csv"
    p.write_text("timestamp,v\n2024-01-02T10:00:00,1\n2024-01-02T08:00:00,2\n2024-01-02T08:30:00,3\n"
                 "2024-01-02T08:29:59,4\n")
    with pytest.raises(LoaderError, match="line 3 .*; rows must be in time order: sort the file by time"):
        open_source(str(p), timestamp="timestamp").timestamps.compute()


def test_row_groups_of_naive_times_repeating_an_hour_are_not_told_to_sort(tmp_path):
    wall = _fall_back_day().tz_localize(None)
    back = int(np.flatnonzero(np.diff(wall.asi8) < 0)[0]) + 1
    pq.write_table(pa.table({"timestamp": pa.array(wall.asi8, pa.timestamp("ns")), "v": np.zeros(len(wall))}),
                   tmp_path / "d.parquet", row_group_size=back)  # the repeated hour starts row group 1
    with pytest.raises(LoaderError, match=r"row group 1 starts at .*, before row group 0 ends at .*; the time steps "
                       rf"back {(wall.asi8[back - 1] - wall.asi8[back]) // 60 // 10**9} min, .*daylight-saving"):
        open_source(str(tmp_path / "d.parquet"), timestamp="timestamp")


def _units_day(d, name, prices, day):
    ts = np.datetime64("2024-03-08", "ns") + np.timedelta64(day, "D") + np.arange(len(prices)).astype("timedelta64[s]")
    pq.write_table(pa.table({"timestamp": ts, "bid_price_1": prices, "bid_size_1": np.full(len(prices), 5)}),
                   d / name)


def test_prices_as_fixed_point_integers_in_one_file_and_floats_in_another_are_refused(tmp_path):
    dollars = 5100 + 0.25 * (np.arange(10) % 5)
    _units_day(tmp_path, "a.parquet", np.round(dollars * 1e9).astype(np.int64), 0)  # Databento raw: 1e-9 units
    _units_day(tmp_path, "b.parquet", dollars, 1)                                     # its "pretty" export
    with pytest.raises(LoaderError) as err:
        open_source(str(tmp_path / "*.parquet"), timestamp="timestamp", dtype="float64")
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'a.parquet'}: column 'bid_price_1' holds integers up to "
                          f"{np.round(dollars.max() * 1e9):.6g}, but {tmp_path / 'b.parquet'} holds floats up to "
                          f"{dollars.max():.6g} (a factor of about 1e+09)")


def test_an_integer_price_column_stored_as_floats_on_a_day_with_a_gap_is_joined(tmp_path):
    ticks = np.array([1_650_000, 1_650_100, 1_650_200, 1_650_100], np.int64)  # ITCH: 1e-4 dollars
    with_gap = ticks.astype(float)
    with_gap[2] = np.nan  # pandas writes such a day's integer column as floats
    _units_day(tmp_path, "a.parquet", ticks, 0)
    _units_day(tmp_path, "b.parquet", with_gap, 1)
    got = open_source(str(tmp_path / "*.parquet"), timestamp="timestamp", columns=["bid_price_1"], dtype="float64",
                      nan="fill", fill_value=-1.0).array.compute()
    np.testing.assert_array_equal(got[:, 0], np.where(np.isnan(np.r_[ticks, with_gap]), -1, np.r_[ticks, with_gap]))


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_rename_alternatives_read_the_first_name_each_file_has(tmp_path, fmt):
    import pandas as pd

    frames = []
    for k, day in enumerate(["2023-05-01", "2023-05-02"]):  # the vendor renamed its columns on day 2
        df = pd.DataFrame({"transaction_time": pd.Timestamp(day).value + np.arange(6) * 10**9,
                           "best_bid_price": 0.5 + np.arange(6) * 1e-4, "best_ask_price": 0.5001 + k + np.arange(6)})
        if k == 1:
            df = df.rename(columns={"best_bid_price": "bidPrice", "best_ask_price": "askPrice",
                                    "transaction_time": "T"})
        (df.to_parquet if fmt == "parquet" else df.to_csv)(tmp_path / f"{day}.{fmt}", index=False)
        frames.append(df.to_numpy())
    rename = {"bid_price_1": ["best_bid_price", "bidPrice"], "ask_price_1": ["best_ask_price", "askPrice"],
              "timestamp": ["transaction_time", "T"]}
    src = open_source(str(tmp_path / f"*.{fmt}"), rename=rename, timestamp="timestamp", dtype="float64")
    assert src.columns == ("bid_price_1", "ask_price_1")
    np.testing.assert_array_equal(src.array.compute(), np.concatenate(frames)[:, 1:])  # pandas' values, in order
    np.testing.assert_array_equal(src.timestamps.compute(), np.concatenate(frames)[:, 0].astype(np.int64))
    with pytest.raises(MissingColumnError, match=r"2023-05-01\.%s: rename maps 'ask_price_1' to any of the source "
                       r"columns \['ask', 'askP'\], which the file lacks; the file has" % fmt):
        open_source(str(tmp_path / f"*.{fmt}"), rename={**rename, "ask_price_1": ["ask", "askP"]})



def _small_groups(path, n: int = 600, group: int = 10, start: str = "2026-01-05T09:30:00") -> "pd.DataFrame":
    """A Parquet file of ``n`` rows in row groups of ``group`` rows, as streaming writers make them."""
    import pandas as pd

    df = pd.DataFrame({"timestamp": pd.date_range(start, periods=n, freq="s", tz="UTC"),
                       "bid_price_1": np.round(100 + np.arange(n) * 0.01, 2), "size": np.arange(n, dtype=np.int64)})
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), path, row_group_size=group)
    return df


def test_many_small_row_groups_are_read_as_few_parts_each_parsing_the_footer_once(tmp_path, monkeypatch):
    import dask
    import pandas as pd

    p = tmp_path / "stream.parquet"
    ref = _small_groups(p)
    assert pq.ParquetFile(p).num_row_groups == 60
    footers = []
    original = pq.ParquetFile.__init__

    def counted(self, *a, **k):
        footers.append(1)
        original(self, *a, **k)

    # Row groups of 10 rows joined until a part holds a quarter of chunk_rows (250 rows):
    # 25, 25 and 10 row groups; a row group is never split.
    src = open_source(str(p), timestamp="timestamp", dtype="float64", chunk_rows=1000)
    assert src.array.chunks[0] == (250, 250, 100)
    monkeypatch.setattr(pq.ParquetFile, "__init__", counted)
    got, ns = dask.compute(src.array, src.timestamps, scheduler="sync")
    assert len(footers) == 2 * 3  # values and times, once per part (each row group's read parsed it: 120)
    ref = pd.read_parquet(p)
    np.testing.assert_array_equal(got, ref[["bid_price_1", "size"]].to_numpy(np.float64))
    np.testing.assert_array_equal(ns, ref["timestamp"].dt.tz_convert(None).to_numpy().astype("datetime64[ns]").astype(np.int64))
    whole = open_source(str(p), timestamp="timestamp", dtype="float64")  # default chunk_rows: one part
    assert whole.array.chunks[0] == (600,)


def test_merged_row_groups_still_name_rows_and_order_row_groups(tmp_path):
    p = tmp_path / "nan.parquet"
    df = _small_groups(p, n=60)
    df.loc[37, "bid_price_1"] = np.nan  # row 7 of row group 3, in the file's one part
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), p, row_group_size=10)
    with pytest.raises(InvalidValueError, match=r"nan\.parquet: NaN or inf in column 'bid_price_1' at row 7 of "
                       r"row group 3;"):
        open_source(str(p), timestamp="timestamp").array.compute()
    swapped = df.assign(bid_price_1=100.0)
    swapped.loc[[43, 44], "timestamp"] = swapped.loc[[44, 43], "timestamp"].to_numpy()  # inside row group 4
    pq.write_table(pa.Table.from_pandas(swapped, preserve_index=False), p, row_group_size=10)
    with pytest.raises(LoaderError, match=r"row 4 of row group 4 is at 2026-01-05T09:30:43.*before the row above it "
                       r"\(row 3 of row group 4\)"):
        open_source(str(p), timestamp="timestamp").timestamps.compute()
    # Row groups out of order are still seen one by one in the footer, before anything is read.
    late = pa.Table.from_pandas(df.iloc[30:].assign(bid_price_1=1.0), preserve_index=False)
    early = pa.Table.from_pandas(df.iloc[:30].assign(bid_price_1=1.0), preserve_index=False)
    pq.write_table(pa.concat_tables([late, early]), p, row_group_size=10)
    src_parts = tables.probe_table(str(p), "parquet", "timestamp", {})
    assert len(src_parts) == 1 and src_parts[0].groups == tuple(range(6))
    with pytest.raises(LoaderError, match=r"nan\.parquet: row group 3 starts at .* before row group 2 ends"):
        open_source(str(p), timestamp="timestamp")


def test_merged_row_groups_of_times_of_day_are_dated_and_ordered(tmp_path):
    import pandas as pd

    d = tmp_path / "itch"
    d.mkdir()
    tod = (np.arange(40, dtype=np.int64) + 34_200) * 10**9  # 09:30:00 on, ns since midnight
    for day in ("01022024", "01032024"):
        pq.write_table(pa.table({"t": tod, "v": np.arange(40.0)}), d / f"{day}.parquet", row_group_size=8)
    src = open_source(str(d / "*.parquet"), timestamp="t", date={"path": str(d / "{date}.parquet"),
                                                                  "format": "%m%d%Y"})
    assert src.array.chunks[0] == (40, 40)
    want = np.concatenate([pd.Timestamp(day).value + tod for day in ("2024-01-02", "2024-01-03")])
    np.testing.assert_array_equal(src.timestamps.compute(), want)
    back = np.r_[tod[16:24], tod[:16], tod[24:]]  # row group 2 before row groups 0 and 1
    pq.write_table(pa.table({"t": back, "v": np.arange(40.0)}), d / "01032024.parquet", row_group_size=8)
    with pytest.raises(LoaderError, match=r"01032024\.parquet: row group 1 starts at 2024-01-03T09:30:00.* before "
                       r"row group 0 ends at 2024-01-03T09:30:23"):
        open_source(str(d / "*.parquet"), timestamp="t", date={"path": str(d / "{date}.parquet"), "format": "%m%d%Y"})


def _frame(n: int = 100):
    import pandas as pd

    return pd.DataFrame({"timestamp": pd.date_range("2024-01-02 14:30", periods=n, freq="s").strftime("%Y-%m-%dT%H:%M:%SZ"),
                         "bid_price_1": np.round(100 + np.arange(n) * 0.01, 2),
                         "ask_price_1": np.round(100.02 + np.arange(n) * 0.01, 2)})


@pytest.mark.parametrize("end", ["\n", "\r\n"])
@pytest.mark.parametrize("blank", [1, 3])
def test_csv_blank_lines_at_the_end_are_no_rows(tmp_path, end, blank):
    import pandas as pd

    p = tmp_path / "trail.csv"
    p.write_bytes((_frame().to_csv(index=False, lineterminator=end) + end * blank).encode())
    ref = pd.read_csv(p)
    assert len(ref) == 100
    for chunk_rows in (None, 30):  # one part, and parts (the last one ending in the blank lines)
        src = open_source(str(p), timestamp="timestamp", dtype="float64", chunk_rows=chunk_rows)
        assert src.array.shape == (100, 2) and [f.rows for f in src.files] == [100]
        np.testing.assert_array_equal(src.array.compute(), ref[["bid_price_1", "ask_price_1"]].to_numpy())
        np.testing.assert_array_equal(src.timestamps.compute(), pd.to_datetime(ref["timestamp"]).dt.tz_convert(None)
                                      .to_numpy().astype("datetime64[ns]").astype(np.int64))


def test_csv_blank_line_inside_the_file_is_not_called_metadata(tmp_path):
    text = _frame(10).to_csv(index=False).splitlines(keepends=True)
    (tmp_path / "gap.csv").write_text("".join(text[:5] + ["\n"] + text[5:]))
    with pytest.raises(LoaderError, match=r"gap\.csv: expected 11 rows \(its lines, counted when the source was "
                       r"opened\), read 10: a blank line inside the file") as err:
        open_source(str(tmp_path / "gap.csv"), timestamp="timestamp").array.compute()
    assert "metadata" not in str(err.value)


def test_csv_byte_order_mark_is_no_part_of_the_first_name(tmp_path):
    import pandas as pd

    df = _frame()
    df.to_csv(tmp_path / "bom.csv", index=False, encoding="utf-8-sig")  # as Excel writes it
    df.drop(columns="timestamp").to_csv(tmp_path / "bom2.csv", index=False, encoding="utf-8-sig")
    assert (tmp_path / "bom.csv").read_bytes()[:3] == b"\xef\xbb\xbf"
    src = open_source(str(tmp_path / "bom.csv"), timestamp="timestamp", dtype="float64")
    ref = pd.read_csv(tmp_path / "bom.csv", encoding="utf-8-sig")
    assert src.columns == ("bid_price_1", "ask_price_1")
    np.testing.assert_array_equal(src.array.compute(), ref[list(src.columns)].to_numpy())
    assert src.timestamps.compute()[0] == pd.Timestamp("2024-01-02T14:30:00").value
    src = open_source(str(tmp_path / "bom2.csv"), dtype="float64")
    assert src.columns == ("bid_price_1", "ask_price_1")
    np.testing.assert_array_equal(src.array.compute(), ref[list(src.columns)].to_numpy())


def test_csv_default_columns_are_the_numeric_ones_as_parquet_s(tmp_path):
    import pandas as pd

    df = _frame().assign(symbol="AAPL", size=np.arange(100))
    df.to_csv(tmp_path / "sym.csv")  # with pandas' index: a first column without a name
    df.to_parquet(tmp_path / "sym.parquet", index=False)
    ref = pd.read_csv(tmp_path / "sym.csv", index_col=0)
    numeric = [c for c in ref.select_dtypes("number").columns]  # pandas' own idea of the numeric columns
    assert numeric == ["bid_price_1", "ask_price_1", "size"]
    for name in ("sym.csv", "sym.parquet"):
        src = open_source(str(tmp_path / name), timestamp="timestamp", dtype="float64")
        assert src.columns == tuple(numeric), name
        np.testing.assert_array_equal(src.array.compute(), ref[numeric].to_numpy(np.float64))
    # Without timestamp=, the ISO times are text too.
    assert open_source(str(tmp_path / "sym.csv")).columns == tuple(numeric)


def test_csv_semicolons_and_decimal_commas(tmp_path):
    import pandas as pd

    p = tmp_path / "semi.csv"
    _frame().to_csv(p, index=False, sep=";", decimal=",")
    ref = pd.read_csv(p, sep=";", decimal=",")
    src = open_source(str(p), timestamp="timestamp", delimiter=";", decimal=",", dtype="float64", chunk_rows=40)
    assert src.columns == ("bid_price_1", "ask_price_1")
    np.testing.assert_array_equal(src.array.compute(), ref[list(src.columns)].to_numpy())
    np.testing.assert_array_equal(src.timestamps.compute(), pd.to_datetime(ref["timestamp"]).dt.tz_convert(None)
                                  .to_numpy().astype("datetime64[ns]").astype(np.int64))
    with pytest.raises(FormatMismatchError, match=r"semi\.csv: its first line has one field split by ',' but 3 split "
                       r"by ';': it looks ';'-delimited; set source\.delimiter: \";\""):
        open_source(str(p), timestamp="timestamp")
    from pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="delimiter"):
        open_source(str(p), delimiter=";;")
    with pytest.raises(ConfigError, match="decimal"):
        open_source(str(p), decimal=",")  # the default delimiter is a comma too


def test_csv_zst_is_read_like_csv_gz_and_compressed_bytes_are_named(tmp_path):
    import gzip

    import pandas as pd

    text = _frame().to_csv(index=False).encode()
    with pa.CompressedOutputStream(str(tmp_path / "z.csv.zst"), "zstd") as f:
        f.write(text)
    ref = pd.read_csv(tmp_path / "z.csv.zst", compression="zstd") if _has_zstandard() else pd.read_csv(
        pa.input_stream(str(tmp_path / "z.csv.zst"), compression="zstd"))
    for fmt in (None, "csv"):
        src = open_source(str(tmp_path / "z.csv.zst"), format=fmt, timestamp="timestamp", dtype="float64")
        np.testing.assert_array_equal(src.array.compute(), ref[["bid_price_1", "ask_price_1"]].to_numpy())
    (tmp_path / "g.csv").write_bytes(gzip.compress(text))  # compressed, without the suffix that says so
    with pytest.raises(FormatMismatchError, match=r"g\.csv: expected CSV text, found gzip-compressed bytes .*"
                       r"\(\.csv\.gz\)"):
        open_source(str(tmp_path / "g.csv"), timestamp="timestamp")


def _has_zstandard() -> bool:
    try:
        import zstandard  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("rows", [20, 5000])
def test_a_header_repeated_inside_a_csv_is_named_by_its_line(tmp_path, rows):
    # Two exports joined with their headers; in a long file the second header is past the
    # block pyarrow infers the types from, and fails to convert instead.
    df = _frame(rows + 30)
    (tmp_path / "rep.csv").write_text(df.iloc[:rows].to_csv(index=False) + df.iloc[rows:].to_csv(index=False))
    lines = (tmp_path / "rep.csv").read_text().splitlines()
    line = lines.index(lines[0], 1) + 1  # from 1, as editors count
    assert line == rows + 2
    with pytest.raises(LoaderError, match=rf"rep\.csv: line {line} repeats the header \(line 1\)"):
        open_source(str(tmp_path / "rep.csv"), timestamp="timestamp").array.compute()
    with pytest.raises(LoaderError, match=rf"rep\.csv: line {line} repeats the header"):
        open_source(str(tmp_path / "rep.csv"), timestamp="timestamp").timestamps.compute()


def test_row_groups_of_a_quarter_part_or_more_stay_parts_of_their_own():
    """Files written with the usual row groups (the demo's 131,072 + 68,928 rows) keep a
    chunk per row group, so builds keep their tasks; only small row groups are joined."""
    from pipeline.loaders.tables import merged_groups

    assert merged_groups([131_072, 68_928], 262_144) == [(0, 1), (1, 2)]
    assert merged_groups([5, 5, 100, 5, 5], 40) == [(0, 2), (2, 3), (3, 5)]
    assert merged_groups([10] * 2000, 262_144) == [(0, 2000)]
    for rows, part in (([7] * 300, 100), ([3, 90, 1, 1, 200, 2], 120)):
        got = merged_groups(rows, part)
        assert [g for lo, hi in got for g in range(lo, hi)] == list(range(len(rows)))  # each once, in order
        assert all(hi - lo == 1 or sum(rows[lo:hi]) <= part for lo, hi in got)
        assert all(hi - lo == 1 for lo, hi in got if max(rows[lo:hi]) >= part // 4)


def test_the_tab_hint_is_a_yaml_value_that_reads_the_file_and_bad_marks_name_their_key(tmp_path):
    import pandas as pd
    import yaml

    from pipeline.errors import ConfigError

    p = tmp_path / "tab.csv"
    _frame().to_csv(p, index=False, sep="\t")
    with pytest.raises(FormatMismatchError, match=r'set source\.delimiter: "\\t"') as info:
        open_source(str(p), timestamp="timestamp")
    hint = str(info.value).split("set source.delimiter: ")[1].split(" (")[0]
    delimiter = yaml.safe_load(f"delimiter: {hint}")["delimiter"]  # pasted into a config as shown
    assert delimiter == "\t"
    ref = pd.read_csv(p, sep="\t")
    src = open_source(str(p), timestamp="timestamp", delimiter=delimiter, dtype="float64")
    np.testing.assert_array_equal(src.array.compute(), ref[["bid_price_1", "ask_price_1"]].to_numpy())
    single = yaml.safe_load("delimiter: '\\t'")["delimiter"]  # single quotes keep the backslash
    with pytest.raises(ConfigError, match=r'^source\.delimiter: expected one character.*a tab is "\\t" in double '
                       r"quotes"):
        open_source(str(p), delimiter=single)
    with pytest.raises(ConfigError, match=r"^source\.decimal: "):
        open_source(str(p), delimiter="\t", decimal=";")


@pytest.mark.parametrize("columns", [None, ["ask_price_1"]])
def test_decimal_comma_numbers_read_without_decimal_comma_are_refused_naming_column_and_value(tmp_path, columns):
    import pandas as pd

    p = tmp_path / "semi.csv"
    _frame().to_csv(p, index=False, sep=";", decimal=",")
    text = pd.read_csv(p, sep=";", dtype=str)  # pandas reads them as text without decimal=","
    name = columns[0] if columns else "bid_price_1"
    with pytest.raises(LoaderError, match=rf"semi\.csv: column '{name}' holds numbers with a decimal comma, such as "
                       rf"'{text[name][0]}'.*set source\.decimal: \",\""):
        open_source(str(p), timestamp="timestamp", delimiter=";", columns=columns)
    ref = pd.read_csv(p, sep=";", decimal=",")
    src = open_source(str(p), timestamp="timestamp", delimiter=";", decimal=",", columns=columns, dtype="float64")
    np.testing.assert_array_equal(src.array.compute(), ref[list(src.columns)].to_numpy())
    # A text column that is no number (a symbol) stays a text column left out.
    pd.DataFrame({"sym": ["A,B"] * 3, "bid_price_1": [1.5, 2.5, 3.5]}).to_csv(tmp_path / "sym.csv", sep=";", index=False)
    assert open_source(str(tmp_path / "sym.csv"), delimiter=";").columns == ("bid_price_1",)


def test_csv_marks_given_for_parquet_are_refused(tmp_path):
    _frame().to_parquet(tmp_path / "x.parquet")
    for kw, keys in (({"delimiter": ";"}, r"source\.delimiter is"),
                     ({"delimiter": ";", "decimal": ","}, r"source\.delimiter and source\.decimal are")):
        with pytest.raises(FormatMismatchError, match=rf"x\.parquet: {keys} for CSV files, not parquet ones"):
            open_source(str(tmp_path / "x.parquet"), timestamp="timestamp", **kw)


@pytest.mark.parametrize("name, codec, found", [("g.csv.zst", None, "gzip"), ("z.csv.gz", "zstd", "zstd"),
                                                ("t.csv.gz", "plain", None)])
def test_a_compressed_csv_of_another_codec_names_what_it_holds(tmp_path, name, codec, found):
    import gzip

    text = _frame().to_csv(index=False).encode()
    if codec == "zstd":
        with pa.CompressedOutputStream(str(tmp_path / name), "zstd") as f:
            f.write(text)
    else:
        (tmp_path / name).write_bytes(text if codec == "plain" else gzip.compress(text))
    if found == "gzip":  # what it holds, by gzip itself
        assert gzip.decompress((tmp_path / name).read_bytes()) == text
    what = rf"{found}-compressed bytes \(its first bytes are the {found} signature\)" if found else \
        "bytes that are not gzip-compressed"
    escaped = re.escape(name)
    with pytest.raises(FormatMismatchError, match=rf"{escaped}: its \.\w+ suffix says \w+, but it holds {what}"):
        open_source(str(tmp_path / name), timestamp="timestamp")


def test_a_folder_of_class_folders_beside_a_manifest_suggests_the_class_folder_glob(tmp_path):
    import os

    img = tmp_path / "img"
    for cls in ("cats", "dogs"):
        (img / cls).mkdir(parents=True)
        for k in range(2):
            (img / cls / f"{k}.jpg").write_bytes(b"")
    (img / "labels.csv").write_text("path,label\n")
    assert sorted(os.listdir(img)) == ["cats", "dogs", "labels.csv"]
    with pytest.raises(FormatMismatchError, match=r"img: is a directory.*such as '.*/img/\*/\*\.jpg'"):
        pipeline.load(str(img))


def test_parquet_parts_tokenize_by_their_content_and_open_without_a_cost_per_row_group(tmp_path):
    # Thousands of small row groups: each part's footer bounds tokenize as one string
    # (dask pickled each bound, seconds per source). Tokens still follow every bound.
    from dask.base import tokenize

    import pandas as pd

    n = 2000
    df = pd.DataFrame({"timestamp": pd.date_range("2024-01-02", periods=n, freq="s"), "bid_price_1": np.arange(n) / 8})
    for i in range(4):
        day = df.assign(timestamp=df.timestamp + pd.Timedelta(days=i))
        pq.write_table(pa.Table.from_pandas(day, preserve_index=False), tmp_path / f"d{i}.parquet", row_group_size=4)
    src = open_source(str(tmp_path / "*.parquet"), timestamp="timestamp", dtype="float64")
    ref = pd.concat([pd.read_parquet(tmp_path / f"d{i}.parquet") for i in range(4)])
    np.testing.assert_array_equal(src.array.compute()[:, 0], ref["bid_price_1"].to_numpy())
    np.testing.assert_array_equal(src.timestamps.compute(), ref["timestamp"].to_numpy().astype("datetime64[ns]").astype(np.int64))
    part = tables.probe_table(str(tmp_path / "d0.parquet"), "parquet", "timestamp", {})[0]
    assert len(part.group_bounds) == 500
    moved = tables.replace(part, group_bounds=part.group_bounds[:-1] + ((part.group_bounds[-1][0], None),))
    assert tokenize(part) == tokenize(tables.replace(part)) != tokenize(moved)


def test_csv_columns_read_with_their_first_bytes_types_fall_back_where_a_value_does_not_fit(tmp_path):
    """CSV parts are read with the types pyarrow saw in the file's first bytes (no type
    inference: a third of the parse); an integer column that holds a fraction, or a
    float column that holds a word for a missing value, further down is read again,
    inferring, and equals pandas."""
    import pandas as pd

    n = 30_000  # past the first 64 KiB the types are taken from
    size = np.arange(n, dtype=np.float64)
    size[-3] = 2.5  # integers first, a fraction near the end
    price = 100 + np.arange(n) * 0.01
    text = ["timestamp,bid_price_1,bid_size_1"] + [f"{1_767_600_000_000_000_000 + i},{price[i]:.2f},"
                                                   f"{size[i]:g}" for i in range(n)]
    text[n - 10] = text[n - 10].rsplit(",", 2)[0] + ",NaN," + text[n - 10].rsplit(",", 1)[1]  # a missing price
    (tmp_path / "day.csv").write_text("\n".join(text) + "\n")
    src = open_source(str(tmp_path / "day.csv"), timestamp="timestamp", dtype="float64", nan="fill", chunk_rows=12_000)
    assert src.files[0].path.endswith("day.csv") and src.array.numblocks[0] == 3
    ref = pd.read_csv(tmp_path / "day.csv")[["bid_price_1", "bid_size_1"]].fillna(0.0).to_numpy(np.float64)
    np.testing.assert_array_equal(src.array.compute(), ref)


@pytest.mark.parametrize("value", [2**63 + 5, 2**64 + 1])
@pytest.mark.parametrize("row", [2, 19_997])
def test_csv_integers_past_int64_are_refused_not_rounded(tmp_path, value, row):
    """pyarrow reads an integer past int64 as a double, rounded (pandas: uint64 or
    text): a vendor's sentinel read as a price. Refused naming its line, early in the
    file (the first bytes' types) or late (a part read again)."""
    import pandas as pd

    n = 20_000
    a = (np.arange(n) % 97).astype(object)
    a[row] = str(value)
    pd.DataFrame({"timestamp": np.arange(n) * 1000 + 10**18, "a": a}).to_csv(tmp_path / "big.csv", index=False)
    with pytest.raises(LoaderError, match=rf"big\.csv: column 'a': the integer at line {row + 2} .*does not fit "
                                          r"int64.*source\.missing"):
        open_source(str(tmp_path / "big.csv"), timestamp="timestamp", dtype="float64", chunk_rows=4096
                    ).array.compute()


def test_a_csv_column_of_thousands_is_text_not_a_decimal_comma(tmp_path):
    """'1,234' is as likely thousands as a decimal comma: such a column is text, left
    out of the default columns as pandas reads it (it was refused, with advice that would
    read it 1000 times too small); '97121,65' is still named as a decimal comma."""
    import pandas as pd

    df = pd.DataFrame({"timestamp": np.arange(50) + 10**18, "vol": [f"{1 + i % 9},{250 * (i % 4):03d}"
                                                                    for i in range(50)], "px": np.arange(50) / 4})
    df.to_csv(tmp_path / "t.csv", index=False)
    src = open_source(str(tmp_path / "t.csv"), timestamp="timestamp")
    assert list(src.columns) == ["px"]
    np.testing.assert_array_equal(src.array.compute()[:, 0], df["px"].to_numpy(np.float32))
    df["vol"] = [f"{97121 + i},{i % 100:02d}" for i in range(50)]
    df.to_csv(tmp_path / "t.csv", index=False)
    with pytest.raises(Exception, match=r"column 'vol' holds numbers with a decimal comma, such as '97121,00'"):
        open_source(str(tmp_path / "t.csv"), timestamp="timestamp")


def test_lobster_order_ids_float32_cannot_hold_are_refused_through_the_python_api(tmp_path):
    """The rule ``source.dtype: float32`` refuses in a config (order ids past 2**24 would
    read as one another), for pipeline.load and open_source: named by file, line and value."""
    name = "AAPL_2012-06-21_34200000_57600000_{}_1.csv"
    (tmp_path / name.format("orderbook")).write_text("5859400,200,5853300,18\n" * 3)
    ids = [16_777_216, 285_934_001, 285_934_002]  # 2**24 fits float32; the next two read as one
    (tmp_path / name.format("message")).write_text(
        "".join(f"3420{i}.5,1,{oid},18,5859100,-1\n" for i, oid in enumerate(ids)))
    path = str(tmp_path / name.format("orderbook"))
    assert np.float32(ids[1]) == np.float32(ids[2])  # what float32 would store
    with pytest.raises(LoaderError, match=r"orderbook_1\.csv: column 'order_id': the value 285934001 at line 2 of its "
                                          r"message file does not fit float32 exactly .*pass dtype='float64'"):
        pipeline.load(path, format="lobster", columns=["ask_price_1", "order_id"]).compute()
    got = open_source(path, format="lobster", columns=["order_id"], dtype="float64").array.compute()
    expected = np.loadtxt(tmp_path / name.format("message"), delimiter=",", usecols=2, dtype=np.int64)
    assert got.dtype == np.float64 and got[:, 0].astype(np.int64).tolist() == expected.tolist() == ids


def test_unreadable_parquet_says_cannot_read_not_another_format(tmp_path):
    # A file the operating system will not hand over is not a format problem: the
    # message carries the OS error (the reference: what open() itself raises), not
    # "expected a Parquet file". A directory and a vanished path stand for a permission
    # denied, which root (these tests' usual user in containers) never meets.
    folder = tmp_path / "day.parquet"
    folder.mkdir()
    gone = tmp_path / "gone.parquet"
    for path in (folder, gone):
        try:
            open(path, "rb").close()
        except OSError as exc:
            reference = exc
        with pytest.raises(LoaderError) as info:
            tables.probe_table(str(path), "parquet", None, {})
        assert not isinstance(info.value, FormatMismatchError)
        assert info.value.path == str(path)
        assert info.value.problem.startswith(f"cannot read the file: {reference.strerror} (errno {reference.errno})")
        assert "expected a Parquet file" not in str(info.value)
    # A damaged footer (pyarrow's OSError without an errno) is still a format problem.
    pq.write_table(pa.table({"a": [1.0, 2.0]}), tmp_path / "ok.parquet")
    data = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "bad.parquet").write_bytes(data[:-12] + b"\0" * 8 + b"PAR1")
    with pytest.raises(FormatMismatchError, match=r"bad\.parquet: expected a Parquet file, could not read its footer"):
        tables.probe_table(str(tmp_path / "bad.parquet"), "parquet", None, {})


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root reads any file")
def test_permission_denied_parquet_says_cannot_read(tmp_path):
    path = tmp_path / "locked.parquet"
    pq.write_table(pa.table({"a": [1.0, 2.0]}), path)
    path.chmod(0)
    with pytest.raises(LoaderError, match=r"locked\.parquet: cannot read the file: Permission denied \(errno 13\)"):
        open_source(str(path))


@pytest.mark.parametrize("rows", [20, 5000])
def test_a_cell_that_is_no_number_is_named_by_its_line_and_value(tmp_path, rows):
    # A 100k-line vendor file: the column alone left its user hunting for the cell.
    df = _frame(rows)
    text = df.to_csv(index=False).splitlines()
    k = rows - 3  # a data row near the end (lines from 1: the header is line 1)
    fields = text[k].split(",")
    fields[list(df.columns).index("ask_price_1")] = "abc"
    text[k] = ",".join(fields)
    (tmp_path / "bad.csv").write_text("\n".join(text) + "\n")
    with pytest.raises(LoaderError, match=rf"bad\.csv: column 'ask_price_1': expected numbers, got string at line "
                                          rf"{k + 1}: 'abc'"):
        open_source(str(tmp_path / "bad.csv"), timestamp="timestamp", columns=["bid_price_1", "ask_price_1"]
                    ).array.compute()


@pytest.mark.parametrize("rows", [20, 5000])
def test_a_row_cut_short_is_named_by_its_line(tmp_path, rows):
    df = _frame(rows)
    text = df.to_csv(index=False).splitlines()
    k = rows - 3
    text[k] = ",".join(text[k].split(",")[:-2])
    (tmp_path / "short.csv").write_text("\n".join(text) + "\n")
    n = len(df.columns)
    with pytest.raises(LoaderError, match=rf"short\.csv: line {k + 1} has {n - 2} fields, expected {n} \(as in line "
                                          r"1\): a row cut short or a field too many; cannot read csv data"):
        open_source(str(tmp_path / "short.csv"), timestamp="timestamp").array.compute()


def test_a_float_sentinel_past_2_53_is_refused_when_the_config_is_read_telling_to_write_the_integer(tmp_path):
    """``missing: {"*_px_*": [9.223372036854775807e18]}`` (INT64_MAX copied from a spec,
    read by YAML as a float) is 2**63, which no int64 cell holds: refused at once, naming
    the key, not advised later to list what the user did list."""
    from pipeline.config import parse_config
    from pipeline.errors import ConfigError

    def config(missing):
        return parse_config({"source": {"paths": "x/*.csv", "missing": missing}, "windows": {"size": 4},
                             "output": {"path": "o.zarr"}})

    with pytest.raises(ConfigError) as err:
        config({"*_px_*": [9.223372036854775807e18]})
    assert str(err.value) == (
        "source.missing.*_px_*: the float 9.223372036854776e+18 is 9223372036854775808 (2**63), not "
        "9223372036854775807 (INT64_MAX, an empty level's price): past 2**53 a float skips integers; write the "
        "sentinel as an integer (9223372036854775807), without a decimal point or exponent")
    with pytest.raises(ConfigError, match=r"^source\.missing: the float -1e\+17 is -100000000000000000: past 2\*\*53 "
                                          r"a float skips integers; write the sentinel as an integer"):
        config([-1, -1e17])
    with pytest.raises(ConfigError, match=r"^source\.missing\.\*_px_\*: the float"):  # the Python API's rules too
        open_source(str(tmp_path / "*.csv"), timestamp="ts", missing={"*_px_*": [9.223372036854775807e18]})
    # The integers, small floats and a float column's own huge sentinel (DBL_MAX, no integer) are taken.
    assert config({"*_px_*": [9223372036854775807, -1, -1.0, 2.0**53, 1.7976931348623157e308]})
