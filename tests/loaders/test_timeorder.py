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
from pipeline.features.sessions import InstrumentSpec
from pipeline.loaders.segments import open_segmented
from pipeline.loaders.tables import probe_table
from pipeline.loaders.timeorder import (
    check_file_times,
    check_instrument_times,
    check_time_order,
    instrument_spans,
    path_hint,
)

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
                                          r"2024-03-01T23:53:20\.0+: both files hold its rows from "
                                          r"2024-03-01T00:00:11\.0+ to 2024-03-01T23:53:20\.0+, "
                                          r".*a day supplied twice\? A day supplied twice: keep one file"):
        check_instrument_times(paths, ["BTC", "ETH"], _spans(chunks))


def _tardis_csv(path, exchange: str, day: str, seconds: np.ndarray, price: float) -> pd.DataFrame:
    """A Tardis book_snapshot-like CSV (gzip): exchange, symbol, integer us times, top level."""
    ts = pd.Timestamp(day).value // 1000 + seconds * 1_000_000
    bid = price + np.arange(seconds.size) * 0.5
    frame = pd.DataFrame({"exchange": exchange, "symbol": "BTCUSDT", "timestamp": ts,
                          "asks[0].price": bid + 0.1, "bids[0].price": bid})
    frame.to_csv(path, index=False, compression="gzip")
    return frame


TARDIS = dict(timestamp="timestamp", timestamp_unit="us", dtype="float64",
              rename={"ask_price_1": "asks[0].price", "bid_price_1": "bids[0].price"})


def test_one_symbol_on_two_exchanges_is_refused_as_two_feeds_over_the_same_time_not_as_file_order(tmp_path):
    """binance and binance-futures BTCUSDT by {column: symbol}: the spot file of a day
    sorts after the futures file of the next day, and its rows overlap the futures file
    of its own day, an earlier one. No order of the files joins them: the refusal names
    the overlapping files and span, and a path pattern that, given, reads them apart."""
    frames = {}
    for exchange in ("binance-futures", "binance"):
        for d, day in enumerate(("2024-01-02", "2024-01-03")):
            name = f"{exchange}_book_snapshot_5_{day}_BTCUSDT.csv.gz"
            frames[name] = _tardis_csv(tmp_path / name, exchange, day, np.arange(0, 600, 20) + (exchange == "binance"),
                                       42_000.0 + d)
    spot, futures = (str(tmp_path / f"{x}_book_snapshot_5_2024-01-02_BTCUSDT.csv.gz") for x in ("binance",
                                                                                                 "binance-futures"))
    a, b = frames[spot.rsplit("/", 1)[1]]["timestamp"], frames[futures.rsplit("/", 1)[1]]["timestamp"]
    def iso(us: int) -> str:
        return str(pd.Timestamp(int(us) * 1000, unit="ns").to_datetime64())  # datetime64[ns], as the message

    start, end = iso(max(a.min(), b.min())), iso(min(a.max(), b.max()))  # the overlap, by pandas
    with pytest.raises(LoaderError) as err:
        open_segmented(str(tmp_path / "*.csv.gz"), instrument=InstrumentSpec(column="symbol"), **TARDIS)
    msg = str(err.value)
    assert msg.startswith(f"{spot}: rows of instrument 'BTCUSDT' start at {iso(a.min())}, "
                          f"before its rows in an earlier file holding it, {futures}, end at ")
    assert f"both files hold its rows from {start} to {end}" in msg
    assert "two feeds sharing a symbol" in msg and "time order when sorted by name" not in msg
    pattern = msg.split('source.instrument: {path: "')[1].split('"}')[0]
    assert pattern == str(tmp_path / "{instrument}_book_snapshot_5_*_BTCUSDT.csv.gz")
    # The hint's pattern is real syntax: it reads the two exchanges as two instruments,
    # each with its own rows, as pandas holds them.
    got = open_segmented(str(tmp_path / "*.csv.gz"), instrument=InstrumentSpec(path=pattern),
                         columns=["bid_price_1"], **TARDIS)
    x, seg = got.array.compute()[:, 0], got.segments
    assert sorted(seg.instruments) == ["binance", "binance-futures"]
    for code, name in enumerate(seg.instruments):
        rows = np.concatenate([x[a:b] for a, b, c in zip(seg.starts, seg.stops, seg.instrument) if c == code])
        want = pd.concat([f for n, f in sorted(frames.items()) if n.startswith(name + "_")])["bids[0].price"]
        np.testing.assert_array_equal(rows, want.to_numpy(), err_msg=name)


def test_files_merely_out_of_order_keep_the_order_message_and_the_hint_fits_the_names():
    """Days named out of order share no time: the order is what is wrong. Overlapping
    files whose names differ in a dated field get the general path form."""
    days = [DAY + 86_400 * NS * d + np.array([10, 80_000]) * NS for d in (1, 0)]
    paths = ["x_2024-03-01_ETH.csv", "x_2024-02-29_ETH.csv"]  # day 2, then day 1
    with pytest.raises(LoaderError, match=r"x_2024-02-29_ETH\.csv: rows of instrument 'ETH' start at .*before its "
                                          r"rows in the previous file holding it.*each instrument's files must be "
                                          r"in time order when sorted by name$"):
        check_instrument_times(paths, ["BTC", "ETH"], _spans([(["ETH"] * 2, t) for t in days]))
    assert path_hint("d/2024-03-01a_ETH.csv", "d/2024-03-01_ETH.csv").startswith(
        "source.instrument: {path: PATTERN}; {instrument} is one part")
    assert path_hint("raw/binance/20240102_BTC.parquet", "raw/okx/20240102_BTC.parquet").startswith(
        'source.instrument: {path: "raw/{instrument}/*_BTC.parquet"} makes \'binance\' and \'okx\'')


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
    with pytest.raises(LoaderError, match=rf"^{paths[3]}: timestamp column 'timestamp' is naive \(no time zone\); "
                                          rf"the files mix both, time-zone-aware: 3 file\(s\) \(first {paths[0]}, America/New_York\)"):
        check_time_kinds(want, "timestamp")
    # An append's new file is the one named, though the stored files are the fewer.
    with pytest.raises(LoaderError, match=rf"^{paths[0]}: timestamp column 'timestamp' is time-zone-aware "):
        check_time_kinds({"naive": [str(paths[3]), 1], "aware:America/New_York": [str(paths[0]), 1]}, "timestamp",
                         new={str(paths[0])})
