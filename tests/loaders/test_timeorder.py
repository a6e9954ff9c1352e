"""Time order across files and parts, per instrument: the pure checks of
pipeline.loaders.timeorder against pandas, and Parquet footers of files of one symbol
each (written with pyarrow) that overlap in time across instruments."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import LoaderError
from pipeline.loaders.tables import probe_table
from pipeline.loaders.timeorder import check_file_times, check_instrument_times, check_time_order, instrument_spans

DAY = np.datetime64("2024-03-01", "ns").astype(np.int64)
NS = 10**9


@settings(max_examples=60, deadline=None)
@given(codes=st.lists(st.integers(0, 3), max_size=40), n=st.integers(4, 6), timed=st.booleans())
def test_instrument_spans_equal_pandas_count_first_last(codes, n, timed):
    codes = np.asarray(codes, dtype=np.int32)
    ns = DAY + np.arange(codes.size, dtype=np.int64) * 7 if timed else None
    got = instrument_spans(codes, ns, n)
    frame = pd.DataFrame({"code": codes, "t": ns if timed else np.zeros(codes.size, np.int64)})
    grouped = frame.groupby("code")["t"]
    want = np.zeros((3, n), dtype=np.int64)
    for code, count in grouped.count().items():
        want[0, code] = count
        if timed:
            want[1, code], want[2, code] = grouped.first()[code], grouped.last()[code]
    np.testing.assert_array_equal(got, want)


def _spans(rows: list[tuple[str, np.ndarray]]) -> np.ndarray:
    """Per chunk ``(instrument names, times)``: its instrument_spans over BTC, ETH."""
    names = ["BTC", "ETH"]
    return np.stack([instrument_spans(np.array([names.index(s) for s in syms], dtype=np.int32), t, 2)
                     for syms, t in rows])


def test_files_of_one_instrument_each_interleave_in_name_order():
    """Tardis's layout: day after day, BTC's file then ETH's, each a whole day."""
    paths, chunks = [], []
    for d in range(2):
        for sym in ("BTC", "ETH"):
            paths.append(f"book_2024-03-0{1 + d}_{sym}.csv.gz")
            chunks.append(([sym] * 3, DAY + d * 86_400 * NS + np.array([10, 40_000, 86_000]) * NS))
    check_instrument_times(paths, ["BTC", "ETH"], _spans(chunks))
    with pytest.raises(LoaderError, match=r"ETH\.csv\.gz: starts at .* before the previous file .*BTC\.csv\.gz"):
        # The same files as one series (no instrument): refused, as before.
        check_file_times(paths, [int(t[0]) for _, t in chunks], [int(t[-1]) for _, t in chunks])


def test_a_day_of_one_instrument_given_twice_is_refused_naming_both_files_and_the_instrument():
    day = DAY + np.array([10, 40_000, 86_000]) * NS
    paths = ["a_BTC.csv", "a_ETH.csv", "b_BTC.csv", "b_ETH.csv"]
    chunks = [(["BTC"] * 3, day), (["ETH"] * 3, day), (["BTC"] * 3, day + 86_400 * NS), (["ETH"] * 3, day + NS)]
    with pytest.raises(LoaderError, match=r"b_ETH\.csv: rows of instrument 'ETH' start at 2024-03-01T00:00:11\.0+, "
                                          r"before its rows in the previous file holding it, a_ETH\.csv, end at "
                                          r"2024-03-01T23:53:20\.0+; each instrument's files must be in time order when "
                                          r"sorted by name .*both hold times of 2024-03-01 \(a day supplied twice\?\)"):
        check_instrument_times(paths, ["BTC", "ETH"], _spans(chunks))


def test_an_instruments_rows_back_in_time_between_parts_of_one_file_are_refused():
    t = DAY + np.arange(6) * NS
    chunks = [(["BTC", "ETH", "BTC"], t[[2, 3, 4]]), (["ETH", "BTC"], t[[4, 3]])]  # BTC: 4 s, then 3 s
    with pytest.raises(LoaderError, match=r"mixed\.parquet: rows of instrument 'BTC' go back in time inside the file: "
                                          r"a row at 2024-03-01T00:00:03\.000000000 follows one at "
                                          r"2024-03-01T00:00:04\.000000000 in an earlier part"):
        check_instrument_times(["mixed.parquet"] * 2, ["BTC", "ETH"], _spans(chunks))
    # ETH's rows alone, and an empty chunk, are fine.
    check_instrument_times(["mixed.parquet"] * 3, ["BTC", "ETH"],
                           _spans([(["ETH"], t[[2]]), ([], t[:0]), (["ETH", "BTC"], t[[2, 1]])]))


def _symbol_file(path, sym: str, t: np.ndarray) -> None:
    pq.write_table(pa.table({"timestamp": pa.array(t, pa.timestamp("ns")), "symbol": [sym] * t.size,
                             "bid_price_1": np.arange(t.size, dtype=float)}), path)


def test_parquet_footers_of_two_symbols_overlapping_are_left_to_the_per_instrument_check(tmp_path):
    t = DAY + np.arange(5) * NS
    _symbol_file(tmp_path / "d1_BTC.parquet", "BTC", t)
    _symbol_file(tmp_path / "d1_ETH.parquet", "ETH", t)
    parts = [p for f in sorted(tmp_path.glob("*.parquet")) for p in probe_table(str(f), "parquet", "timestamp", {})]
    footers = [(p.first_ts, p.last_ts) for p in parts]
    assert footers[1][0] < footers[0][1]  # the footers overlap across the two files
    check_time_order(parts, "symbol")
    with pytest.raises(LoaderError, match=r"d1_ETH\.parquet: starts at .* before the previous file .*d1_BTC\.parquet"):
        check_time_order(parts, None)  # no instruments: one series, refused as before


def _ny_day(path, day: str, rows: int = 30, as_int: bool = False, naive: bool = False) -> None:
    t = pd.Timestamp(f"{day} 09:30", tz="America/New_York") + pd.to_timedelta(np.arange(rows) * NS, unit="ns")
    frame = pd.DataFrame({"timestamp": t, "bid_price_1": 100.0 + np.arange(rows) * 0.01})
    if naive:
        frame["timestamp"] = frame["timestamp"].dt.tz_convert("UTC").dt.tz_localize(None)
    if as_int:
        frame["timestamp"] = frame["timestamp"].astype("int64")  # the same instants, as epoch ns
    frame.to_parquet(path, index=False)


@pytest.mark.parametrize("naive", [False, True])
def test_a_timestamp_type_beside_epoch_integers_is_refused_naming_the_file_and_both_types(tmp_path, naive):
    """A vendor switching the column to int64 ns: the time order compared a datetime64
    footer bound with an integer (numpy's UFuncNoLoopError), naming no file."""
    from pipeline.loaders import open_source

    paths = [tmp_path / f"2024-12-0{2 + d}.parquet" for d in range(3)]
    for d, path in enumerate(paths):
        _ny_day(path, f"2024-12-0{2 + d}", as_int=d == 2, naive=naive)
    stored = {str(p): str(pd.read_parquet(p)["timestamp"].dtype) for p in paths}  # what pandas reads
    assert stored[str(paths[2])] == "int64" and stored[str(paths[0])].startswith("datetime64[ns")
    typed = "a naive timestamp type" if naive else "a timestamp type in America/New_York"
    with pytest.raises(LoaderError, match=rf"^{paths[2]}: timestamp column 'timestamp' holds integers \(epoch times, "
                                          rf"read in source\.timestamp_unit\) in 1 file\(s\), but {typed} in 2 "
                                          rf"file\(s\) \(first {paths[0]}\)"):
        open_source(str(tmp_path / "*.parquet"), timestamp="timestamp")


def test_time_kinds_count_each_files_type_as_pyarrow_reads_it(tmp_path):
    from pipeline.loaders.timeorder import check_time_kinds, time_kinds

    paths = [tmp_path / f"{k}.parquet" for k in range(4)]
    for k, path in enumerate(paths):
        _ny_day(path, "2024-12-02", naive=k == 3)
    parts = [p for path in paths for p in probe_table(str(path), "parquet", "timestamp", {})]
    want: dict[str, list] = {}
    for path in paths:
        tz = pq.read_schema(path).field("timestamp").type.tz
        want.setdefault(f"aware:{tz}" if tz else "naive", [str(path), 0])[1] += 1
    assert time_kinds(parts, "timestamp") == want
    with pytest.raises(LoaderError, match=rf"^{paths[3]}: timestamp column 'timestamp' is naive \(no time zone\), "
                                          rf"but time-zone-aware: 3 file\(s\) \(first {paths[0]}, America/New_York\)"):
        check_time_kinds(want, "timestamp")
    # An append's new file is the one named, though the stored files are the fewer.
    with pytest.raises(LoaderError, match=rf"^{paths[0]}: timestamp column 'timestamp' is time-zone-aware "):
        check_time_kinds({"naive": [str(paths[3]), 1], "aware:America/New_York": [str(paths[0]), 1]}, "timestamp",
                         new={str(paths[0])})
