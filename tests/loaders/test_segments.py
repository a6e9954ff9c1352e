"""A source divided into instruments and sessions: rows in segment order and the table
that delimits them, against what the files say (read back with pyarrow)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.demo import DemoSpec, write_demo_data
from pipeline.errors import ConfigError, LoaderError
from pipeline.features.sessions import InstrumentSpec, SessionSpec
from pipeline.loaders.segments import _chunks_in_order, _rows_in_order, open_segmented
from pipeline.loaders.tables import parts_array

NS = 10**9
DAY_NS_2024 = np.datetime64("2024-03-01", "ns").astype(np.int64)


def _rows(path: Path, columns: list[str]) -> np.ndarray:
    t = pq.read_table(path)
    return np.stack([t.column(c).to_numpy().astype(np.float32) for c in columns], axis=1)


def test_path_instruments_with_file_sessions(tmp_path):
    write_demo_data(tmp_path / "raw", DemoSpec(days=2, rows_per_day=500, levels=2, formats=("parquet",),
                                               per_instrument=True, instruments=("BBB", "AAA")))
    src = open_segmented(str(tmp_path / "raw" / "*" / "*.parquet"), timestamp="timestamp",
                         instrument=InstrumentSpec(path="raw/{instrument}/*.parquet"))
    seg = src.segments
    assert seg.instruments == ("AAA", "BBB")
    # Session after session (time order), instrument after instrument within one.
    assert seg.instrument.tolist() == [0, 1, 0, 1]
    assert seg.session.tolist() == [0, 0, 1, 1]  # the same day is the same session number
    assert (seg.stops - seg.starts).tolist() == [500] * 4
    files = [tmp_path / "raw" / i / f"2026-01-0{d}.parquet" for d in (5, 6) for i in ("AAA", "BBB")]
    cols = list(src.columns)
    np.testing.assert_array_equal(src.array.compute(), np.concatenate([_rows(f, cols) for f in files]))
    stamps = np.concatenate([pq.read_table(f).column("timestamp").cast("int64").to_numpy() for f in files])
    np.testing.assert_array_equal(src.timestamps.compute(), stamps)
    assert seg.labels[1].endswith("raw/BBB/2026-01-05.parquet")


def test_sessions_and_instruments_in_the_configs_spelling_equal_their_specs(tmp_path):
    write_demo_data(tmp_path / "raw", DemoSpec(days=2, rows_per_day=300, levels=1, formats=("parquet",),
                                               per_instrument=True, instruments=("BBB", "AAA")))
    paths = str(tmp_path / "raw" / "*" / "*.parquet")
    spelled = open_segmented(paths, timestamp="timestamp", sessions="file",
                             instrument={"path": "raw/{instrument}/*.parquet"})
    specs = open_segmented(paths, timestamp="timestamp", sessions=SessionSpec(mode="file"),
                           instrument=InstrumentSpec(path="raw/{instrument}/*.parquet"))
    assert spelled.segments.instruments == specs.segments.instruments == ("AAA", "BBB")
    np.testing.assert_array_equal(spelled.segments.starts, specs.segments.starts)
    np.testing.assert_array_equal(spelled.segments.instrument, specs.segments.instrument)
    with pytest.raises(ConfigError, match="sessions"):
        open_segmented(paths, sessions="weekly")


def test_a_file_outside_the_instrument_pattern_is_named(tmp_path):
    write_demo_data(tmp_path / "raw", DemoSpec(days=1, rows_per_day=50, levels=1, formats=("parquet",)))
    with pytest.raises(LoaderError, match=r"2026-01-05.parquet: does not match source.instrument.path"):
        open_segmented(str(tmp_path / "raw" / "*.parquet"), instrument=InstrumentSpec(path="x/{instrument}/*.parquet"))


def test_a_partition_folder_given_as_a_path_is_refused_as_a_folder_not_as_off_the_pattern(tmp_path):
    """paths: book_train.parquet/stock_id=0 (a hive partition) beside an instrument
    pattern over stock_id={instrument}: the folder is the cause, not the pattern."""
    part = tmp_path / "book_train.parquet" / "stock_id=0"
    write_demo_data(part, DemoSpec(days=1, rows_per_day=50, levels=1, formats=("parquet",)))
    pattern = InstrumentSpec(path=str(tmp_path / "book_train.parquet" / "stock_id={instrument}" / "*.parquet"))
    with pytest.raises(LoaderError, match=r"stock_id=0: is a directory, not a file; give a glob of its files"):
        open_segmented(str(part), instrument=pattern)


def _interleaved(tmp_path: Path, days: int = 2, n: int = 300) -> list[Path]:
    """Files per day with two symbols interleaved at random, timestamps increasing."""
    rng = np.random.default_rng(1)
    paths = []
    for d in range(days):
        t0 = np.datetime64("2026-01-05T09:30", "ns").astype(np.int64) + d * 86_400 * NS
        sym = rng.choice(["ES", "NQ"], size=n)
        table = pa.table({
            "timestamp": pa.array(t0 + np.arange(n) * NS, pa.timestamp("ns")),
            "symbol": sym,
            "bid_price_1": rng.normal(100, 1, n), "ask_price_1": rng.normal(101, 1, n),
        })
        path = tmp_path / f"2026-01-0{5 + d}.parquet"
        pq.write_table(table, path, row_group_size=70)  # chunks cut across both symbols
        paths.append(path)
    return paths


def test_column_instruments_pick_each_instruments_rows_in_time_order(tmp_path):
    paths = _interleaved(tmp_path)
    src = open_segmented(str(tmp_path / "*.parquet"), timestamp="timestamp", instrument=InstrumentSpec(column="symbol"))
    seg = src.segments
    assert seg.instruments == ("ES", "NQ")
    tables = [pq.read_table(p) for p in paths]
    expect_x, expect_t, lengths = [], [], []
    for t in tables:
        for name in ("ES", "NQ"):
            mask = t.column("symbol").to_numpy(zero_copy_only=False) == name
            expect_x.append(np.stack([t.column(c).to_numpy()[mask] for c in src.columns], axis=1))
            expect_t.append(t.column("timestamp").cast("int64").to_numpy()[mask])
            lengths.append(int(mask.sum()))
    assert list(src.columns) == ["bid_price_1", "ask_price_1"]
    np.testing.assert_allclose(src.array.compute(), np.concatenate(expect_x).astype(np.float32))
    np.testing.assert_array_equal(src.timestamps.compute(), np.concatenate(expect_t))
    assert (seg.stops - seg.starts).tolist() == lengths
    assert seg.instrument.tolist() == [0, 1, 0, 1] and seg.session.tolist() == [0, 0, 1, 1]


def test_instruments_one_after_another_in_a_file_each_in_time_order(tmp_path):
    # A day file holding ES's rows, then NQ's: each in time order, the two overlapping.
    n = 100
    t0 = np.datetime64("2026-01-05T09:30", "ns").astype(np.int64)
    stamps = np.concatenate([t0 + np.arange(n) * NS, t0 + np.arange(n) * NS + NS // 2])
    sym = ["ES"] * n + ["NQ"] * n
    table = pa.table({"timestamp": pa.array(stamps, pa.timestamp("ns")), "symbol": sym,
                      "bid_price_1": np.arange(2 * n, dtype=float), "ask_price_1": np.arange(2 * n, dtype=float) + 1})
    pq.write_table(table, tmp_path / "day.parquet", row_group_size=30)  # row groups overlap in time across symbols
    src = open_segmented(str(tmp_path / "day.parquet"), timestamp="timestamp",
                         instrument=InstrumentSpec(column="symbol"))
    np.testing.assert_array_equal(src.timestamps.compute(), stamps)
    assert (src.segments.stops - src.segments.starts).tolist() == [n, n]
    # One of NQ's rows back in time against NQ's row above it: refused, both lines named.
    stamps[n + 41], stamps[n + 42] = stamps[n + 42], stamps[n + 41]
    pacsv.write_csv(table.set_column(0, "timestamp", pa.array(stamps, pa.timestamp("ns"))), tmp_path / "day.csv")
    with pytest.raises(LoaderError, match=r"day\.csv: timestamp column 'timestamp': line 144 is at .*, before the "
                                          r"row above it of the same instrument \(line 143\)"):
        open_segmented(str(tmp_path / "day.csv"), timestamp="timestamp",
                       instrument=InstrumentSpec(column="symbol")).timestamps.compute()


def _one_file(tmp_path: Path, stamps: np.ndarray) -> Path:
    n = stamps.size
    table = pa.table({"timestamp": pa.array(stamps, pa.timestamp("ns")), "bid_price_1": np.arange(n, dtype=float),
                      "ask_price_1": np.arange(n, dtype=float) + 1})
    path = tmp_path / "all.parquet"
    pq.write_table(table, path, row_group_size=7)
    return path


def test_date_sessions_break_where_the_calendar_date_changes(tmp_path):
    base = np.datetime64("2026-01-05T22:00", "ns").astype(np.int64)
    # 3 days: rows every 37 minutes from 22:00 on the 5th: midnight falls inside row groups
    # and, once, exactly on a row group boundary.
    stamps = base + np.arange(80) * 37 * 60 * NS
    _one_file(tmp_path, stamps)
    src = open_segmented(str(tmp_path / "all.parquet"), timestamp="timestamp", sessions=SessionSpec(mode="date"))
    days = stamps // (86_400 * NS)
    expect = np.bincount(days - days[0]).tolist()
    assert (src.segments.stops - src.segments.starts).tolist() == expect
    assert src.segments.labels[0] == "2026-01-05" and src.segments.session.tolist() == list(range(len(expect)))


def test_gap_sessions_break_where_time_jumps(tmp_path):
    base = np.datetime64("2026-01-05T09:30", "ns").astype(np.int64)
    steps = np.full(60, 60 * NS)
    steps[[13, 14, 40]] = 3 * 3600 * NS  # two breaks in a row, one later
    stamps = base + np.cumsum(steps)
    _one_file(tmp_path, stamps)
    src = open_segmented(str(tmp_path / "all.parquet"), timestamp="timestamp",
                         sessions=SessionSpec(mode="gap", gap_ns=30 * 60 * NS))
    assert (src.segments.stops - src.segments.starts).tolist() == [13, 1, 26, 20]


def test_time_sessions_without_timestamps_are_refused(tmp_path):
    _one_file(tmp_path, np.arange(10) * NS)
    with pytest.raises(ConfigError, match="source.sessions: date sessions need timestamps; set source.timestamp"):
        open_segmented(str(tmp_path / "all.parquet"), columns=["bid_price_1"], sessions=SessionSpec(mode="date"))


def test_file_sessions_after_dropped_rows_follow_the_files(tmp_path):
    """Parquet row groups are chunks: after ``nan: drop`` each file's rows are still told
    apart by the chunks it made."""
    for d, bad in ((5, [3, 20]), (6, [0])):
        n = 30
        bid = np.arange(n, dtype=float)
        bid[bad] = np.nan
        table = pa.table({"timestamp": pa.array(np.arange(n) * NS + d * 86_400 * NS, pa.timestamp("ns")),
                          "bid_price_1": bid, "ask_price_1": bid + 1})
        pq.write_table(table, tmp_path / f"2026-01-0{d}.parquet", row_group_size=8)
    src = open_segmented(str(tmp_path / "*.parquet"), timestamp="timestamp", nan="drop")
    assert (src.segments.stops - src.segments.starts).tolist() == [28, 29]
    assert src.session_mode == "file"


def test_lobster_files_take_their_ticker_as_instrument(tmp_path):
    write_demo_data(tmp_path, DemoSpec(days=2, rows_per_day=200, levels=2, formats=("lobster",),
                                       instruments=("XYZ", "ABC")))
    src = open_segmented(str(tmp_path / "*_orderbook_2.csv"), format="lobster")
    seg = src.segments
    assert seg.instruments == ("ABC", "XYZ") and seg.instrument.tolist() == [0, 1, 0, 1]
    assert seg.session.tolist() == [0, 0, 1, 1]  # the same day, whatever the ticker
    assert src.timestamps is not None and int(src.array.shape[0]) == 800


def test_sessions_of_instruments_align_by_day_whatever_their_file_names(tmp_path):
    """LOBSTER names carry each ticker's own end time: the same day must still be the
    same session number (walk-forward folds test one period on every instrument)."""
    write_demo_data(tmp_path, DemoSpec(days=3, rows_per_day=100, levels=1, formats=("lobster",),
                                       instruments=("AAA", "BBB")))
    for kind in ("orderbook", "message"):
        old = tmp_path / f"BBB_2026-01-06_34200000_57600000_{kind}_1.csv"
        old.rename(tmp_path / f"BBB_2026-01-06_34200000_57612345_{kind}_1.csv")
    src = open_segmented(str(tmp_path / "*_orderbook_1.csv"), format="lobster")
    assert src.segments.instrument.tolist() == [0, 1, 0, 1, 0, 1]
    assert src.segments.session.tolist() == [0, 0, 1, 1, 2, 2]


def test_gap_sessions_of_two_instruments_are_numbered_by_day_and_order(tmp_path):
    day = 86_400 * NS
    base = np.datetime64("2026-01-05T09:30", "ns").astype(np.int64)
    rows = []
    # A: two sessions on day 0 (a lunch break), one on day 1; B: one on day 0, one on day 1.
    for sym, offsets in (("A", [0, 4 * 3600 * NS, day]), ("B", [0, day])):
        for off in offsets:
            rows += [(base + off + i * NS, sym) for i in range(5)]
    rows.sort()
    table = pa.table({"timestamp": pa.array(np.array([r[0] for r in rows], dtype="datetime64[ns]")),
                      "symbol": [r[1] for r in rows], "bid_price_1": np.ones(len(rows)),
                      "ask_price_1": np.ones(len(rows)) + 1})
    pq.write_table(table, tmp_path / "all.parquet")
    src = open_segmented(str(tmp_path / "all.parquet"), timestamp="timestamp",
                         sessions=SessionSpec(mode="gap", gap_ns=3600 * NS), instrument=InstrumentSpec(column="symbol"))
    # periods: (day 0, 1st), (day 0, 2nd), (day 1, 1st) -> 0, 1, 2; B's day-1 session is A's.
    assert src.segments.instrument.tolist() == [0, 1, 0, 0, 1]
    assert src.segments.session.tolist() == [0, 0, 1, 2, 2]


@dataclass(frozen=True)
class _Part:
    """A stand-in file part: ``rows`` rows whose values start at ``first``."""

    first: int
    rows: int


def _read(part: _Part, width: int) -> np.ndarray:
    return np.arange(part.first, part.first + part.rows * width, dtype=np.float32).reshape(part.rows, width)


@settings(max_examples=60, deadline=None)
@given(data=st.data(), instruments=st.integers(1, 3))
def test_rows_in_session_order_equal_numpy_whether_or_not_segments_are_whole_parts(data, instruments):
    arrays, truth, lengths, inst = [], [], [], []
    first = 0
    for k in range(instruments):
        sizes = data.draw(st.lists(st.integers(1, 30), min_size=1, max_size=4))
        parts = [_Part(first + 1000 * j, n) for j, n in enumerate(sizes)]
        first += 100_000
        arrays.append(parts_array(parts, _read, 3, token=f"read-{k}", dtype=np.float32, width=3))
        truth.append(np.concatenate([_read(p, 3) for p in parts]))
        # Segments: whole parts, or cut anywhere (then the slices are not whole chunks).
        if data.draw(st.booleans()):
            segs = sizes
        else:
            total, segs = sum(sizes), []
            while total:
                segs.append(data.draw(st.integers(1, total)))
                total -= segs[-1]
        lengths += segs
        inst += [k] * len(segs)
    order = np.asarray(data.draw(st.permutations(range(len(lengths)))), dtype=np.int64)
    out = _rows_in_order(arrays, lengths, inst, order)
    starts = {}
    for k in range(instruments):
        mine = [s for s in range(len(lengths)) if inst[s] == k]
        starts.update({s: int(sum(lengths[m] for m in mine if m < s)) for s in mine})
    expected = np.concatenate([truth[inst[s]][starts[s] : starts[s] + lengths[s]] for s in order])
    np.testing.assert_array_equal(out.compute(scheduler="sync"), expected)
    if len(arrays) > 1 or not np.array_equal(order, np.arange(order.size)):
        whole = _chunks_in_order(arrays, [(inst[s], starts[s], starts[s] + lengths[s]) for s in order])
        if whole is not None:  # whole parts: each chunk is a part's own read, no other task
            assert len(dict(out.__dask_graph__())) == out.numblocks[0]


def _zoned_days(tmp_path: Path, tz: str | None, days: tuple[str, ...] = ("2026-01-05", "2026-01-06"),
                n: int = 40, fmt: str = "parquet") -> list[Path]:
    """A file per day of rows from 10:00 to 16:00 local time in ``tz`` (naive: that
    wall clock, no zone): in Sydney (UTC+11) the UTC date changes at 11:00, mid-session."""
    import pandas as pd

    paths = []
    for day in days:
        local = pd.date_range(f"{day} 10:00", f"{day} 16:00", periods=n)
        stamps = local.tz_localize(tz) if tz else local
        frame = pd.DataFrame({"timestamp": stamps, "bid_price_1": np.arange(n, dtype=float),
                              "ask_price_1": np.arange(n, dtype=float) + 1})
        path = tmp_path / f"{day}.{fmt}"
        frame.to_parquet(path, index=False) if fmt == "parquet" else frame.to_csv(path, index=False)
        paths.append(path)
    return paths


@pytest.mark.parametrize("tz", ["Australia/Sydney", "America/New_York", None])
def test_date_sessions_take_the_calendar_date_of_the_files_own_zone(tmp_path, tz):
    """An aware column's date is the one of the zone it stores (pandas' tz_convert
    dates); a naive one keeps its wall-clock date."""
    import pandas as pd

    paths = _zoned_days(tmp_path, tz)
    src = open_segmented(str(tmp_path / "*.parquet"), timestamp="timestamp", sessions=SessionSpec(mode="date"))
    stamps = pd.concat([pd.read_parquet(p)["timestamp"] for p in paths], ignore_index=True)
    dates = stamps.dt.date  # pandas: the date in the column's own zone
    expect = dates.value_counts(sort=False).sort_index()
    assert (src.segments.stops - src.segments.starts).tolist() == expect.tolist()
    assert list(src.segments.labels) == [str(d) for d in expect.index]
    assert src.time_zone == tz
    utc = pd.DatetimeIndex(stamps).as_unit("ns").asi8  # instants (UTC) for aware, the wall clock for naive
    np.testing.assert_array_equal(src.timestamps.compute(), utc)


def test_file_sessions_of_aware_timestamps_number_the_same_local_day_alike(tmp_path):
    """Two instruments' files of the same Sydney day are one session (their first rows
    fall on different UTC dates: 10:30 and 11:30 local)."""
    import pandas as pd

    for sym, start in (("AAA", "10:30"), ("BBB", "11:30")):
        (tmp_path / sym).mkdir()
        for day in ("2026-01-05", "2026-01-06"):
            t = pd.date_range(f"{day} {start}", periods=20, freq="min").tz_localize("Australia/Sydney")
            pd.DataFrame({"timestamp": t, "bid_price_1": np.arange(20.0)}).to_parquet(tmp_path / sym / f"{day}.parquet")
    src = open_segmented(str(tmp_path / "*" / "*.parquet"), timestamp="timestamp",
                         instrument=InstrumentSpec(path="{instrument}/*.parquet"))
    assert src.segments.instrument.tolist() == [0, 1, 0, 1]
    assert src.segments.session.tolist() == [0, 0, 1, 1]


def test_date_sessions_of_files_in_several_zones_are_refused_naming_them(tmp_path):
    _zoned_days(tmp_path, "Australia/Sydney", days=("2026-01-05",))
    _zoned_days(tmp_path, "America/New_York", days=("2026-01-06",))
    with pytest.raises(LoaderError, match=r"several time zones \(America/New_York, Australia/Sydney\)"):
        open_segmented(str(tmp_path / "*.parquet"), timestamp="timestamp", sessions=SessionSpec(mode="date"))


def _csv_day(path: Path, stamps: np.ndarray) -> None:
    import pandas as pd

    pd.DataFrame({"timestamp": stamps.astype("datetime64[ns]"), "bid_price_1": np.arange(stamps.size, dtype=float),
                  "ask_price_1": np.arange(stamps.size, dtype=float) + 1}).to_csv(path, index=False)


@pytest.mark.parametrize("case", ["misnamed", "twice"])
def test_csv_files_out_of_time_order_are_refused_naming_both(tmp_path, case):
    """As Parquet's footers are: a day whose name sorts after a later day's, or a day
    supplied twice, is refused once its timestamps are read (in open_segmented, which
    the run calls before writing anything)."""
    import pandas as pd

    day = np.timedelta64(1, "D")
    base = np.datetime64("2026-01-05T09:30", "ns") + np.arange(50) * np.timedelta64(1, "m")
    names = {"misnamed": ["2026-01-10.csv", "2026-01-06.csv"], "twice": ["2026-01-05.csv", "2026-01-05b.csv"]}[case]
    starts = {"misnamed": [base, base + day], "twice": [base, base]}[case]
    for name, stamps in zip(names, starts):
        _csv_day(tmp_path / name, stamps)
    first, second = sorted(names)
    read = {n: pd.to_datetime(pd.read_csv(tmp_path / n)["timestamp"]) for n in names}
    starts_at, ends_at = read[second].iloc[0], read[first].iloc[-1]
    assert starts_at < ends_at  # the reference says they overlap
    pattern = (rf"{second}: starts at {np.datetime64(starts_at, 'ns')}, before the previous file .*{first} ends at "
               rf"{np.datetime64(ends_at, 'ns')}; files must be in time order when sorted by name")
    for sessions in (None, SessionSpec(mode="gap", gap_ns=1800 * NS), SessionSpec(mode="date")):
        with pytest.raises(LoaderError, match=pattern):
            open_segmented(str(tmp_path / "*.csv"), timestamp="timestamp", sessions=sessions)


def test_csv_files_in_time_order_pass_per_instrument_and_equal_pandas(tmp_path):
    """Each instrument's files are ordered by themselves: AAA's days may overlap BBB's."""
    import pandas as pd

    day = np.timedelta64(1, "D")
    base = np.datetime64("2026-01-05T09:30", "ns") + np.arange(30) * np.timedelta64(1, "m")
    for sym, shift in (("AAA", 0), ("BBB", 7)):
        (tmp_path / sym).mkdir()
        for d in range(2):
            _csv_day(tmp_path / sym / f"2026-01-0{5 + d}.csv", base + d * day + np.timedelta64(shift, "m"))
    src = open_segmented(str(tmp_path / "*" / "*.csv"), timestamp="timestamp",
                         instrument=InstrumentSpec(path="{instrument}/*.csv"))
    files = [tmp_path / s / f"2026-01-0{5 + d}.csv" for d in range(2) for s in ("AAA", "BBB")]
    expect = pd.DatetimeIndex(pd.concat([pd.to_datetime(pd.read_csv(f)["timestamp"]) for f in files])).as_unit("ns").asi8
    np.testing.assert_array_equal(src.timestamps.compute(), expect)


def _lobster_day(d: Path, ticker: str, date: str, end: str = "57600000", n: int = 20, gz: str = "") -> Path:
    rng = np.random.default_rng(len(ticker) + int(end) % 7)
    seconds = 34_200 + np.sort(rng.uniform(0, 23_400, n))
    book = np.tile(np.array([1_000_100, 5, 999_900, 7]), (n, 1)) + rng.integers(0, 50, (n, 4)) * 100
    stem = d / f"{ticker}_{date}_34200000_{end}"
    msg = "".join(f"{t:.9f},1,1,1,1,1\n" for t in seconds)
    text = "".join(",".join(str(v) for v in row) + "\n" for row in book)
    for kind, body in (("orderbook", text), ("message", msg)):
        path = Path(f"{stem}_{kind}_1.csv{gz}")
        if gz:
            import gzip

            path.write_bytes(gzip.compress(body.encode()))
        else:
            path.write_text(body)
    return Path(f"{stem}_orderbook_1.csv{gz}")


def _pandas_lobster(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The book in dollars and the times in ns, read by pandas (no empty level here)."""
    import pandas as pd

    book = pd.read_csv(path, header=None).to_numpy().astype(np.float64)
    book[:, 0::2] /= 10_000
    msg = pd.read_csv(str(path).replace("_orderbook_", "_message_"), header=None)
    date = path.name.split("_")[-5] if path.name.count("_") > 5 else path.name.split("_")[1]
    times = np.datetime64(date, "ns").astype(np.int64) + np.rint(msg[0].to_numpy() * 1e9).astype(np.int64)
    return book.astype(np.float32), times


def test_a_lobster_day_supplied_twice_is_refused_naming_both_files(tmp_path):
    _lobster_day(tmp_path, "AAPL", "2012-06-21")
    _lobster_day(tmp_path, "AAPL", "2012-06-21", end="57600001")  # a re-download, another END
    _lobster_day(tmp_path, "MSFT", "2012-06-21")
    first, second = sorted(tmp_path.glob("AAPL_*_orderbook_1.csv"))
    _, t1 = _pandas_lobster(first)
    _, t2 = _pandas_lobster(second)
    with pytest.raises(LoaderError, match=rf"{second.name}: starts at {np.datetime64(int(t2[0]), 'ns')}, before the "
                                          rf"previous file .*{first.name} ends at {np.datetime64(int(t1[-1]), 'ns')}"):
        open_segmented(str(tmp_path / "*_orderbook_1.csv"), format="lobster")


def test_lobster_tickers_with_underscores_are_instruments_of_their_own(tmp_path):
    """BRK_A and BRK_B: the ticker is everything before the date, as parse_name reads it."""
    paths = [_lobster_day(tmp_path, t, d) for t in ("BRK_A", "BRK_B") for d in ("2012-06-21", "2012-06-22")]
    src = open_segmented(str(tmp_path / "*_orderbook_1.csv"), format="lobster")
    assert src.segments.instruments == ("BRK_A", "BRK_B")
    assert src.segments.instrument.tolist() == [0, 1, 0, 1] and src.segments.session.tolist() == [0, 0, 1, 1]
    order = [paths[0], paths[2], paths[1], paths[3]]  # day after day, instrument after instrument
    books, times = zip(*(_pandas_lobster(p) for p in order))
    np.testing.assert_array_equal(src.array.compute(), np.concatenate(books))
    np.testing.assert_array_equal(src.timestamps.compute(), np.concatenate(times))
    assert [lab.rpartition("/")[2] for lab in src.segments.labels] == [p.name for p in order]


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_compressed_lobster_pairs_are_segmented_like_plain_ones(tmp_path, suffix):
    import bz2
    import lzma

    plain = [_lobster_day(tmp_path, t, "2012-06-21") for t in ("AAPL", "MSFT")]
    expect = [_pandas_lobster(p) for p in plain]
    pack = {".gz": __import__("gzip").compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix]
    for f in list(tmp_path.glob("*.csv")):
        (tmp_path / (f.name + suffix)).write_bytes(pack(f.read_bytes()))
        f.unlink()
    src = open_segmented(str(tmp_path / f"*_orderbook_1.csv{suffix}"), format="lobster")
    assert src.segments.instruments == ("AAPL", "MSFT")
    np.testing.assert_array_equal(src.array.compute(), np.concatenate([b for b, _ in expect]))
    np.testing.assert_array_equal(src.timestamps.compute(), np.concatenate([t for _, t in expect]))


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_times_of_day_without_their_date_are_named_as_such_not_as_files_out_of_order(tmp_path, fmt):
    # NASDAQ ITCH books: ns since midnight, the date only in the file name
    t = 34_200 * 10**9 + np.arange(20, dtype=np.int64) * 10**9
    for day in ("20190130", "20190131"):
        frame = pa.table({"timestamp": pa.array(t.astype(np.uint64)), "bid_price_1": np.full(20, 165.0)})
        (pq.write_table if fmt == "parquet" else pacsv.write_csv)(frame, tmp_path / f"{day}.itch.{fmt}")
    with pytest.raises(LoaderError) as err:
        open_segmented(str(tmp_path / f"*.{fmt}"), timestamp="timestamp")
    msg = str(err.value)
    iso = np.datetime64(int(t[0]), "ns"), np.datetime64(int(t[-1]), "ns")  # numpy: 1970-01-01T09:30 and 09:30:19
    assert f"20190131.itch.{fmt}: starts at {iso[0]}, before the previous file" in msg
    assert f"ends at {iso[1]}" in msg and "look like times of day" in msg and "1970-01-01" in msg
    assert "files must be in time order" not in msg and "34200000000000" not in msg


def test_files_out_of_order_show_their_integer_times_as_iso(tmp_path):
    t = np.datetime64("2024-03-08T14:00", "ns").astype(np.int64) + np.arange(5, dtype=np.int64)
    for name, shift in (("a", 10), ("b", 0)):
        pq.write_table(pa.table({"timestamp": t + shift, "v": np.zeros(5)}), tmp_path / f"{name}.parquet")
    with pytest.raises(LoaderError, match=r"b.parquet: starts at 2024-03-08T14:00:00.000000000, before the previous "
                       r"file .*a.parquet ends at 2024-03-08T14:00:00.000000014; files must be in time order"):
        open_segmented(str(tmp_path / "*.parquet"), timestamp="timestamp")


# -- times of day, dated by the file's path (source.date) -----------------------------------

_ITCH_DAYS = ("12312018", "01022019", "01032019")  # MMDDYYYY: name order is not time order


def _itch_files(d: Path, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """ITCH-like files, one a day, times of day in the ``kind`` the feed uses; the
    values and the whole times in date order, by pandas, as the reference."""
    import pandas as pd

    rng = np.random.default_rng(3)
    values, stamps = [], []
    d.mkdir(parents=True, exist_ok=True)
    for name in sorted(_ITCH_DAYS, key=lambda s: s[4:] + s[:4]):  # in date order
        tod = np.sort(rng.integers(34_200, 57_600, 50)) * NS + rng.integers(0, 1000, 50) * 10**6  # to the ms
        bid = np.round(100 + np.cumsum(rng.integers(-2, 3, 50)) * 0.01, 2)
        table = {"bid_price_1": bid, "ask_price_1": bid + 0.01}
        if kind == "ns":
            pacsv.write_csv(pa.table({"timestamp": tod, **table}), d / f"{name}.csv")
        elif kind == "text":
            text = [str(np.datetime64(int(t), "ns")).split("T")[1] for t in tod]
            pacsv.write_csv(pa.table({"timestamp": text, **table}), d / f"{name}.csv")
        else:  # Parquet's time type, in microseconds
            col = pa.array(tod // 1000, pa.int64()).cast(pa.time64("us"))
            pq.write_table(pa.table({"timestamp": col, **table}), d / f"{name}.parquet", row_group_size=20)
        stamps.append(pd.Timestamp(pd.to_datetime(name, format="%m%d%Y")).value + tod)
        values.append(np.stack([table["bid_price_1"], table["ask_price_1"]], axis=1).astype(np.float32))
    return np.concatenate(values), np.concatenate(stamps)


@pytest.mark.parametrize("kind", ["ns", "text", "time64"])
def test_times_of_day_take_the_date_in_the_file_name_and_join_in_date_order(tmp_path, kind):
    values, stamps = _itch_files(tmp_path / "itch", kind)
    suffix = "parquet" if kind == "time64" else "csv"
    src = open_segmented(str(tmp_path / "itch" / f"*.{suffix}"), timestamp="timestamp",
                         date={"path": f"itch/{{date}}.{suffix}", "format": "%m%d%Y"},
                         sessions=SessionSpec(mode="date"))
    np.testing.assert_array_equal(src.timestamps.compute(), stamps)
    np.testing.assert_array_equal(src.array.compute(), values)
    assert [Path(f.path).stem for f in src.sources[0].files] == ["12312018", "01022019", "01032019"]
    assert src.segments.session.tolist() == [0, 1, 2] and (src.segments.stops - src.segments.starts).tolist() == [50] * 3


def test_times_of_day_that_do_not_fit_their_day_or_path_are_named(tmp_path):
    d = tmp_path / "itch"
    _itch_files(d, "ns")
    opts = dict(timestamp="timestamp", date={"path": "itch/{date}.csv", "format": "%m%d%Y"})
    (d / "notes.csv").write_bytes((d / "01022019.csv").read_bytes())
    with pytest.raises(LoaderError, match=r"notes\.csv: the date 'notes' in its path is not a date in the format "
                       "'%m%d%Y'"):
        open_segmented(str(d / "*.csv"), **opts)
    (d / "notes.csv").unlink()
    (tmp_path / "01022019.csv").write_bytes((d / "01022019.csv").read_bytes())
    with pytest.raises(LoaderError, match=r"01022019\.csv: does not match source.date.path 'itch/\{date\}.csv'"):
        open_segmented([str(tmp_path / "01022019.csv")], **opts)
    # Whole times (epoch ns) where times of day were said: named, with their line.
    t = pacsv.read_csv(d / "01022019.csv")
    whole = pc_add(t.column("timestamp"), int(np.datetime64("2019-01-02", "ns").astype(np.int64)))
    pacsv.write_csv(t.set_column(0, "timestamp", whole), d / "01022019.csv")
    with pytest.raises(LoaderError, match=r"01022019\.csv.*line 2.*outside one day"):
        open_segmented(str(d / "*.csv"), **opts).timestamps.compute()
    # A timestamp type has its date already.
    pq.write_table(pa.table({"timestamp": pa.array([1, 2], pa.timestamp("ns")), "bid_price_1": [1.0, 2.0],
                             "ask_price_1": [1.5, 2.5]}), tmp_path / "01022019.parquet")
    with pytest.raises(LoaderError, match=r"01022019\.parquet.*timestamp type.*leave source.date unset"):
        open_segmented(str(tmp_path / "*.parquet"), timestamp="timestamp", date={"path": "{date}.parquet",
                                                                               "format": "%m%d%Y"})


def pc_add(col, n: int):
    import pyarrow.compute as pc

    return pc.add(col, n)


def test_other_placeholders_in_the_instrument_path_match_one_component(tmp_path):
    # A hive layout: date={date}/instrument={instrument}/part-0.parquet; {date} is no
    # instrument and matches like *, within one path component.
    import pandas as pd

    frames = {}
    for k, (day, name) in enumerate([("2024-01-02", "X"), ("2024-01-02", "Y"), ("2024-01-03", "X"),
                                     ("2024-01-03", "Y")]):
        d = tmp_path / "hive" / f"date={day}" / f"instrument={name}"
        d.mkdir(parents=True)
        df = pd.DataFrame({"timestamp": pd.date_range(f"{day} 14:30", periods=5, freq="s"),
                           "bid_price_1": 100.0 + k + np.arange(5)})
        df.to_parquet(d / "part-0.parquet", index=False)
        frames[(day, name)] = df
    pattern = str(tmp_path / "hive" / "date={date}" / "instrument={instrument}" / "part-0.parquet")
    src = open_segmented(str(tmp_path / "hive" / "*" / "*" / "*.parquet"), timestamp="timestamp",
                         instrument=InstrumentSpec(path=pattern), sessions=SessionSpec(mode="date"), dtype="float64")
    assert src.segments.instruments == ("X", "Y")
    want = np.concatenate([frames[(day, name)]["bid_price_1"].to_numpy() for day in ("2024-01-02", "2024-01-03")
                           for name in ("X", "Y")])  # session after session, instrument after instrument
    np.testing.assert_array_equal(src.array.compute()[:, 0], want)
    assert InstrumentSpec(path="data/{venue}/{instrument}.csv").instrument_of("data/a/b/X.csv") is None  # one component


def _tod_day(path: Path, values: np.ndarray, fmt: str, **kw) -> None:
    table = pa.table({"timestamp": values, "bid_price_1": np.arange(values.size, dtype=float) + 100.0})
    (pq.write_table(table, path, **kw) if fmt == "parquet" else pacsv.write_csv(table, path))


@pytest.mark.parametrize("fmt", ["parquet", "parquet-no-statistics", "csv"])
@pytest.mark.parametrize("unit", ["s", "ms", "us"])
def test_integer_times_of_day_below_a_day_in_us_are_refused_naming_their_unit(tmp_path, fmt, unit):
    """Without source.timestamp_unit, integers are nanoseconds: times of day in s, ms or
    us would put the whole day in its first 86.4 s. Refused from Parquet's footers at
    open, or from the rows as read, naming the unit; set, they equal pandas' times."""
    import pandas as pd

    per = {"s": 1, "ms": 10**3, "us": 10**6}[unit]
    days = ["2026-01-05", "2026-01-06"]
    raw = {d: np.arange(9 * 3600, 16 * 3600, 600, dtype=np.int64) * per + k for k, d in enumerate(days)}
    suffix = "csv" if fmt == "csv" else "parquet"
    for d in days:
        _tod_day(tmp_path / f"{d}.{suffix}", raw[d], fmt.split("-")[0],
                 **({"write_statistics": False} if fmt == "parquet-no-statistics" else {}))
    opts = dict(timestamp="timestamp", date={"path": f"{{date}}.{suffix}"})
    # Either file may be read first: each is named with its own latest time.
    largest = "|".join(str(raw[d].max()) for d in days)
    with pytest.raises(LoaderError, match=rf"2026-01-0[56]\.{suffix}: timestamp column 'timestamp': times of day up "
                       rf"to ({largest}), read as nanoseconds.*set source\.timestamp_unit: {unit} "):
        open_segmented(str(tmp_path / f"*.{suffix}"), **opts).timestamps.compute()
    want = np.concatenate([(pd.Timestamp(d) + pd.to_timedelta(raw[d], unit=unit)).as_unit("ns").asi8 for d in days])
    got = open_segmented(str(tmp_path / f"*.{suffix}"), timestamp_unit=unit, **opts).timestamps.compute()
    np.testing.assert_array_equal(got, want)
    # ns said explicitly: taken as it is, the day's first 86.4 s.
    as_ns = open_segmented(str(tmp_path / f"*.{suffix}"), timestamp_unit="ns", **opts).timestamps.compute()
    np.testing.assert_array_equal(as_ns, np.concatenate([pd.Timestamp(d).value + raw[d] for d in days]))


def test_a_csv_part_of_the_first_seconds_after_midnight_is_not_taken_for_another_unit(tmp_path):
    # A 24-hour market's file read in parts: its first part may end within 86.4 s of
    # midnight; only the file's last part (its latest times) decides the unit.
    import pandas as pd

    ns = np.concatenate([np.arange(40) * 10**9, 3600 * 10**9 + np.arange(40) * 10**9])
    _tod_day(tmp_path / "2026-01-05.csv", ns, "csv")
    src = open_segmented(str(tmp_path / "*.csv"), timestamp="timestamp", date={"path": "{date}.csv"}, chunk_rows=40)
    assert src.sources[0].array.chunks[0] == (40, 40)
    np.testing.assert_array_equal(src.timestamps.compute(), pd.Timestamp("2026-01-05").value + ns)


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_date_carried_by_two_files_under_source_date_is_named(tmp_path, fmt):
    """Two files of one date that overlap: a day supplied twice, named so, not as a name
    order that source.date does not use. One date's files in time order (a day written
    in parts) are joined."""
    import pandas as pd

    tod = np.arange(9 * 3600, 9 * 3600 + 50, dtype=np.int64) * 10**9
    _tod_day(tmp_path / f"2026-01-05.{fmt}", tod, fmt)
    _tod_day(tmp_path / f"20260105.{fmt}", tod, fmt)
    opts = dict(timestamp="timestamp", date={"path": f"{{date}}.{fmt}"})
    with pytest.raises(LoaderError, match=r"2026-01-05\.%s.*: both (carry the date|hold times of) 2026-01-05 \(a "
                       r"day supplied twice\?\)" % fmt):
        open_segmented(str(tmp_path / f"*.{fmt}"), **opts)
    (tmp_path / f"20260105.{fmt}").unlink()
    (tmp_path / "parts").mkdir()
    for k in range(2):  # a day in two parts, in time order
        (tmp_path / "parts" / f"date=2026-01-05").mkdir(exist_ok=True)
        _tod_day(tmp_path / "parts" / "date=2026-01-05" / f"part-{k}.{fmt}", tod + k * 3600 * 10**9, fmt)
    src = open_segmented(str(tmp_path / "parts" / "*" / f"*.{fmt}"), timestamp="timestamp",
                         date={"path": f"date={{date}}/*.{fmt}"})
    want = np.concatenate([pd.Timestamp("2026-01-05").value + tod + k * 3600 * 10**9 for k in range(2)])
    np.testing.assert_array_equal(src.timestamps.compute(), want)


def test_times_of_day_with_a_single_digit_hour_parse_as_pandas_reads_them(tmp_path):
    # "9:59:35.827201005" is text to pyarrow; "09:59:35" a time32 it infers: both dated.
    import pandas as pd

    for name, text in (("2026-01-05", ["9:59:35.827201005", "10:00:01.000000001", "10:00:01.5"]),
                       ("2026-01-06", ["09:59:35", "9:59:36", "10:00:01"]), ("2026-01-07", ["09:59:35", "10:00:01"])):
        (tmp_path / f"{name}.csv").write_text("timestamp,bid_price_1\n" + "".join(f"{t},1.5\n" for t in text))
    inferred = pacsv.read_csv(tmp_path / "2026-01-07.csv").schema.field("timestamp").type
    assert pa.types.is_time(inferred)  # the time-type path is taken for that file
    src = open_segmented(str(tmp_path / "*.csv"), timestamp="timestamp", date={"path": "{date}.csv"})
    want = np.concatenate([(pd.Timestamp(n) + pd.to_timedelta(pd.read_csv(tmp_path / f"{n}.csv")["timestamp"]))
                           .to_numpy().astype("datetime64[ns]").astype(np.int64)
                           for n in ("2026-01-05", "2026-01-06", "2026-01-07")])
    np.testing.assert_array_equal(src.timestamps.compute(), want)


SYMBOLS = (("BTCUSDT", 97_000.0), ("ETHUSDT", 3_400.0))
DAYS = ("2024-03-01", "2024-03-02")


def _tardis_days(n: int = 60, seed: int = 0) -> dict[tuple[str, str], pd.DataFrame]:
    """Per (symbol, day) a Tardis book snapshot: a ``symbol`` column, integer us times
    anywhere in the day (the symbols' days overlap), and the top level."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    out = {}
    for sym, price in SYMBOLS:
        for day in DAYS:
            ts = pd.Timestamp(day).value // 1000 + np.sort(rng.integers(0, 86_400_000_000, n))
            bid = price + np.cumsum(rng.integers(-3, 4, n)) * 0.01
            out[sym, day] = pd.DataFrame({"exchange": "binance-futures", "symbol": sym, "timestamp": ts,
                                          "asks[0].price": (bid + 0.01).round(2), "bids[0].price": bid.round(2)})
    return out


def _write(frame: pd.DataFrame, path: Path) -> None:
    frame.to_parquet(path, index=False) if path.suffix == ".parquet" else frame.to_csv(path, index=False)


TARDIS = dict(timestamp="timestamp", timestamp_unit="us", dtype="float64",
              rename={"ask_price_1": "asks[0].price", "bid_price_1": "bids[0].price"})


@pytest.mark.parametrize("suffix", [".csv.gz", ".parquet"])
@pytest.mark.parametrize("symbol_first", [False, True])
def test_files_of_one_symbol_each_with_an_instrument_column_equal_one_interleaved_file(tmp_path, suffix,
                                                                                       symbol_first):
    """Tardis/Binance files, one per symbol and day (date first, or symbol first): the
    same rows, timestamps and segments as the one file holding both symbols interleaved
    in time, and as the files given by {path: ...}; each symbol's rows in time order."""
    import pandas as pd

    days = _tardis_days()
    (tmp_path / "files").mkdir()
    for (sym, day), frame in days.items():
        name = f"{sym}_{day}" if symbol_first else f"binance-futures_book_snapshot_25_{day}_{sym}"
        _write(frame, tmp_path / "files" / f"{name}{suffix}")
    mixed = pd.concat(days.values()).sort_values("timestamp", kind="stable")
    _write(mixed, tmp_path / f"mixed{suffix}")
    by_column = InstrumentSpec(column="symbol")
    by_path = InstrumentSpec(path=str(tmp_path / "files" / ("{instrument}_*" if symbol_first else "*_{instrument}")
                                      ) + suffix)
    files = str(tmp_path / "files" / f"*{suffix}")
    # Independent reference: each symbol's days one after another, session after session.
    want = pd.concat([days[sym, day] for sym, _ in SYMBOLS for day in DAYS])
    for mode in ("none", "date"):
        spec = SessionSpec(mode=mode)
        got = open_segmented(files, instrument=by_column, sessions=spec, **TARDIS)
        one = open_segmented(str(tmp_path / f"mixed{suffix}"), instrument=by_column, sessions=spec, **TARDIS)
        x, t = got.array.compute(), got.timestamps.compute()
        np.testing.assert_array_equal(x, one.array.compute())
        np.testing.assert_array_equal(t, one.timestamps.compute())
        for a in ("starts", "stops", "instrument", "session"):
            np.testing.assert_array_equal(getattr(got.segments, a), getattr(one.segments, a))
        if mode == "none":
            np.testing.assert_array_equal(x, want[["asks[0].price", "bids[0].price"]].to_numpy())
            np.testing.assert_array_equal(t, want["timestamp"].to_numpy() * 1000)
    # One session per file, as the path pattern makes them: the same segments, labels too.
    got = open_segmented(files, instrument=by_column, sessions=SessionSpec(mode="file"), **TARDIS)
    ref = open_segmented(files, instrument=by_path, sessions=SessionSpec(mode="file"), **TARDIS)
    np.testing.assert_array_equal(got.array.compute(), ref.array.compute())
    np.testing.assert_array_equal(got.timestamps.compute(), ref.timestamps.compute())
    assert got.segments.instrument.tolist() == [0, 1, 0, 1] and got.segments.session.tolist() == [0, 0, 1, 1]
    for a in ("starts", "stops", "instrument", "session", "labels"):
        np.testing.assert_array_equal(getattr(got.segments, a), getattr(ref.segments, a))
    assert got.session_keys == ref.session_keys


@pytest.mark.parametrize("suffix", [".csv.gz", ".parquet"])
def test_a_symbols_day_given_twice_or_out_of_name_order_is_refused_naming_both_files_and_the_symbol(tmp_path,
                                                                                                     suffix):
    days = _tardis_days()
    for (sym, day), frame in days.items():
        _write(frame, tmp_path / f"{day}_{sym}{suffix}")
    again = tmp_path / f"2024-03-01a_ETHUSDT{suffix}"  # a re-download, sorting after the first
    _write(days["ETHUSDT", "2024-03-01"], again)
    ends = days["ETHUSDT", "2024-03-01"]["timestamp"].to_numpy() * 1000
    with pytest.raises(LoaderError, match=rf"2024-03-01a_ETHUSDT{re.escape(suffix)}: rows of instrument 'ETHUSDT' "
                                          rf"start at {np.datetime64(int(ends[0]), 'ns')}, before its rows in the "
                                          rf"previous file holding it, .*2024-03-01_ETHUSDT{re.escape(suffix)}, end at "
                                          rf"{np.datetime64(int(ends[-1]), 'ns')}.*a day supplied twice"):
        open_segmented(str(tmp_path / f"*{suffix}"), instrument=InstrumentSpec(column="symbol"), **TARDIS)
    again.unlink()
    (tmp_path / f"2024-03-02_BTCUSDT{suffix}").rename(tmp_path / f"2024-02-29_BTCUSDT{suffix}")  # named out of order
    with pytest.raises(LoaderError, match=rf"2024-03-01_BTCUSDT{re.escape(suffix)}: rows of instrument 'BTCUSDT' "
                                          rf"start at .*before its rows in the previous file holding it, "
                                          rf".*2024-02-29_BTCUSDT{re.escape(suffix)}, end at"):
        open_segmented(str(tmp_path / f"*{suffix}"), instrument=InstrumentSpec(column="symbol"), **TARDIS)


def test_a_symbol_going_back_between_row_groups_of_a_mixed_parquet_file_is_refused(tmp_path):
    """A file of both symbols read in parts (row groups): each symbol's rows are compared
    across the parts too, not only within each."""
    n = 40
    stamps = DAY_NS_2024 + np.arange(n, dtype=np.int64) * NS
    sym = np.where(np.arange(n) % 2 == 0, "BTC", "ETH")
    stamps[20] = stamps[18] - NS // 2  # BTC's first row of row group 1 is before its last of row group 0
    table = pa.table({"timestamp": pa.array(stamps, pa.timestamp("ns")), "symbol": sym,
                      "bid_price_1": np.arange(n, dtype=float)})
    pq.write_table(table, tmp_path / "mixed.parquet", row_group_size=20)
    with pytest.raises(LoaderError, match=r"mixed\.parquet: rows of instrument 'BTC' go back in time inside the file: "
                                          r"a row at 2024-03-01T00:00:17\.5.* follows one at "
                                          r"2024-03-01T00:00:18\.0+ in an earlier part"):
        open_segmented(str(tmp_path / "mixed.parquet"), timestamp="timestamp", chunk_rows=40,
                       instrument=InstrumentSpec(column="symbol"))


def test_files_of_one_symbol_each_without_timestamps_number_sessions_as_a_path_pattern(tmp_path):
    days = _tardis_days(n=10)
    for (sym, day), frame in days.items():
        _write(frame.drop(columns="timestamp"), tmp_path / f"{day}_{sym}.csv")
    opts = dict(rename=TARDIS["rename"], sessions=SessionSpec(mode="file"), dtype="float64")
    got = open_segmented(str(tmp_path / "*.csv"), instrument=InstrumentSpec(column="symbol"), **opts)
    ref = open_segmented(str(tmp_path / "*.csv"), instrument=InstrumentSpec(path="*_{instrument}.csv"), **opts)
    assert got.segments.session.tolist() == ref.segments.session.tolist() == [0, 0, 1, 1]
    np.testing.assert_array_equal(got.array.compute(), ref.array.compute())


def test_a_build_of_files_of_one_symbol_each_equals_one_interleaved_file_the_path_build_and_pandas(tmp_path):
    """`pipeline run` over Tardis's per-symbol days with {column: symbol}: the store of
    the same rows in one interleaved file, and of {path: ...}, value for value; each
    window and label equal to pandas over each symbol's rows alone."""
    import zarr

    from pipeline.cluster import cluster
    from pipeline.config import parse_config
    from pipeline.job import run

    size, horizon = 6, 3
    days = _tardis_days(n=30)
    (tmp_path / "files").mkdir()
    for (sym, day), frame in days.items():
        frame.to_csv(tmp_path / "files" / f"binance-futures_book_snapshot_25_{day}_{sym}.csv.gz", index=False)
    pd.concat(days.values()).sort_values("timestamp", kind="stable").to_csv(tmp_path / "mixed.csv.gz", index=False)
    files = str(tmp_path / "files" / "*.csv.gz")
    stores = {}
    # One cluster for the three builds (a LocalCluster started per run costs seconds).
    with cluster(n_workers=1, processes=False, dashboard_address=None, log=None) as client:
        for name, paths, inst in (("column", files, {"column": "symbol"}),
                                  ("mixed", str(tmp_path / "mixed.csv.gz"), {"column": "symbol"}),
                                  ("path", files, {"path": files.replace("*.csv", "*_{instrument}.csv")})):
            stores[name] = tmp_path / f"{name}.zarr"
            run(parse_config({"cluster": {"address": client.scheduler.address},
                              "source": {"paths": paths, "instrument": inst, "sessions": "none", **TARDIS},
                              "features": {"steps": ["mid_price"], "normalize": "none"},
                              "windows": {"size": size}, "labels": {"kind": "return", "horizon": horizon},
                              "output": {"path": str(stores[name])}}), log=None, progress=False)
    got = {name: {a: zarr.open_group(str(p), mode="r")["train"][a][:] for a in ("x", "y", "t", "instrument")}
           for name, p in stores.items()}
    for other in ("mixed", "path"):
        for a in ("x", "y", "t", "instrument"):
            np.testing.assert_array_equal(got["column"][a], got[other][a], err_msg=f"{other} {a}")
    # Pandas: each symbol's days one after another, windows and labels over its rows alone.
    x, y, t, inst = [], [], [], []
    for k, (sym, _) in enumerate(SYMBOLS):
        rows = pd.concat([days[sym, day] for day in DAYS])
        mid = ((rows["asks[0].price"] + rows["bids[0].price"]) / 2).to_numpy()
        for e in range(size - 1, len(rows) - horizon):
            x.append(mid[e - size + 1:e + 1])
            y.append(np.log(mid[e + horizon]) - np.log(mid[e]))
            t.append(rows["timestamp"].iloc[e] * 1000)
            inst.append(k)
    store = got["column"]
    order = np.lexsort((store["t"], store["instrument"]))
    np.testing.assert_array_equal(store["instrument"][order], inst)
    np.testing.assert_array_equal(store["t"][order], t)
    np.testing.assert_allclose(store["x"][order][..., 0], np.asarray(x, np.float32), rtol=1e-7)
    np.testing.assert_allclose(store["y"][order].reshape(-1), np.asarray(y), rtol=1e-5, atol=1e-9)


def _aware_day(day: str, rows: int, seed: int) -> pd.DataFrame:
    """A New York session of a one-level book, as a vendor's pandas writes it."""
    rng = np.random.default_rng(seed)
    t = pd.Timestamp(f"{day} 09:30", tz="America/New_York") + pd.to_timedelta(np.arange(rows) * 10**8, unit="ns")
    mid = 100 + np.cumsum(rng.choice([-0.01, 0.0, 0.01], rows))
    return pd.DataFrame({"timestamp": t, "bid_price_1": mid - 0.01, "ask_price_1": mid + 0.01,
                         "bid_size_1": rng.integers(1, 99, rows).astype(float)})


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
@pytest.mark.parametrize("empty", [0, 1, 3])
def test_an_empty_day_file_is_no_session_wherever_it_comes(tmp_path, fmt, empty):
    """A holiday written as a 0-row Parquet file or a header-only CSV: last, it left a
    0-row segment at the end that crashed the build (IndexError in _fit_and_check); first,
    a session of 1970. Wherever it comes, the source is that of the other files."""
    days = ["2024-11-26", "2024-11-27", "2024-11-28", "2024-11-29"]
    frames = {d: _aware_day(d, 50 + 10 * k, k) for k, d in enumerate(days)}
    frames[days[empty]] = frames[days[empty]].iloc[:0]
    for name in ("with", "without"):
        (tmp_path / name).mkdir()
    for d, df in frames.items():
        for name in ("with", "without") if len(df) else ("with",):
            path = tmp_path / name / f"{d}.{fmt}"
            df.to_parquet(path, index=False) if fmt == "parquet" else df.to_csv(path, index=False)
    cols = ["bid_price_1", "ask_price_1", "bid_size_1"]
    got, want = (open_segmented(str(tmp_path / name / f"*.{fmt}"), timestamp="timestamp", columns=cols,
                                dtype="float64", sessions=SessionSpec(mode="file")) for name in ("with", "without"))
    held = [df for df in frames.values() if len(df)]
    assert (got.segments.stops - got.segments.starts).tolist() == [len(df) for df in held]
    assert got.segments.session.tolist() == [0, 1, 2]
    assert [Path(lb).name for lb in got.segments.labels] == [Path(lb).name for lb in want.segments.labels]
    np.testing.assert_array_equal(got.array.compute(), pd.concat(held)[cols].to_numpy())
    np.testing.assert_array_equal(got.timestamps.compute(), pd.concat(held)["timestamp"].astype("int64").to_numpy())
    np.testing.assert_array_equal(got.first_times, [int(df["timestamp"].iloc[0].value) for df in held])


def test_the_store_record_of_file_types_names_each_kinds_first_file(tmp_path):
    """What the build records for an append's checks: per instrument, how its files
    store the timestamp column and each price column's first file of each type, equal
    to what pyarrow's schemas and pandas' maxima say."""
    for sym, k in (("AAA", 0), ("BBB", 1)):
        (tmp_path / sym).mkdir()
        for d, day in enumerate(["2024-11-26", "2024-11-27", "2024-11-28"]):
            df = _aware_day(day, 40, 10 * k + d)
            if sym == "BBB":
                df["timestamp"] = df["timestamp"].dt.tz_convert("Europe/London")
            df.to_parquet(tmp_path / sym / f"{day}.parquet", index=False)
    src = open_segmented(str(tmp_path / "*" / "*.parquet"), timestamp="timestamp",
                         instrument=InstrumentSpec(path=str(tmp_path / "{instrument}" / "*.parquet")))
    types = src.metadata()["types"]
    assert types["timestamp"] == "timestamp" and sorted(types["groups"]) == ["AAA", "BBB"]
    for sym in ("AAA", "BBB"):
        first = tmp_path / sym / "2024-11-26.parquet"
        zone = str(pq.read_schema(first).field("timestamp").type.tz)
        group = types["groups"][sym]
        assert group["time"] == {f"aware:{zone}": [str(first), 3]} and group["zones"] == [zone]
        frame = pd.read_parquet(first)
        assert group["units"]["bid_price_1"] == {"f": [str(first), float(frame["bid_price_1"].abs().max())]}


@pytest.mark.filterwarnings("ignore:Series.values")  # pandas' own, comparing aware Series
def test_calendar_sessions_leave_out_rows_outside_them_and_key_each_by_its_trading_date(tmp_path):
    """NYSE days 04:00-20:00 New York (naive wall clock): the rows kept are those
    pandas finds inside exchange_calendars' sessions, one segment per trading date, and
    the rows left out are counted."""
    xcals = pytest.importorskip("exchange_calendars")
    import warnings

    frames = []
    for i, day in enumerate(["2024-03-08", "2024-03-11", "2024-11-28", "2024-11-29"]):
        t = pd.date_range(f"{day} 04:00", f"{day} 20:00", freq="7min").as_unit("ns")
        df = pd.DataFrame({"timestamp": t, "bid_price_1": np.arange(t.size) + 100.0 * i,
                           "ask_price_1": np.arange(t.size) + 100.0 * i + 1})
        df.to_parquet(tmp_path / f"{day}.parquet", index=False)
        frames.append(df)
    src = open_segmented(str(tmp_path / "*.parquet"), sessions=SessionSpec.from_value({"calendar": "XNYS"}, "s"),
                         timestamp="timestamp", dtype="float64")
    every = pd.concat(frames, ignore_index=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sched = xcals.get_calendar("XNYS", start="2024-03-01", end="2024-12-31").schedule
    local = every.timestamp.dt.tz_localize("America/New_York")
    label = pd.Series(pd.NaT, index=every.index, dtype="datetime64[ns]")
    for day, row in sched.iterrows():
        label[(local >= row["open"]) & (local < row["close"])] = day
    kept = every[label.notna()]
    np.testing.assert_array_equal(np.asarray(src.array), kept[["bid_price_1", "ask_price_1"]].to_numpy())
    np.testing.assert_array_equal(np.asarray(src.timestamps), kept.timestamp.astype("int64").to_numpy())
    per_day = label[label.notna()].value_counts().sort_index()
    assert list(src.segments.labels) == [d.strftime("%Y-%m-%d") for d in per_day.index]
    assert (src.segments.stops - src.segments.starts).tolist() == per_day.tolist()
    assert src.session_mode == "calendar"
    assert src.sessions_text == f"calendar XNYS: {int(label.isna().sum()):,} row(s) outside its sessions left out"
    assert src.metadata()["calendar"] == {"name": "XNYS", "rows_left_out": int(label.isna().sum())}


def test_calendar_sessions_compare_aware_files_of_several_zones_as_instants(tmp_path):
    """One day stored in New York time, the next in UTC: the same instants, so the
    same sessions and rows as if both were stored in one zone."""
    pytest.importorskip("exchange_calendars")
    days = {"2024-03-08": "America/New_York", "2024-03-11": "UTC"}
    want = []
    for day, zone in days.items():
        t = pd.date_range(f"{day} 04:00", f"{day} 20:00", freq="5min", tz="America/New_York").as_unit("ns")
        df = pd.DataFrame({"timestamp": t.tz_convert(zone), "bid_price_1": 1.0, "ask_price_1": 2.0})
        df.to_parquet(tmp_path / f"{day}.parquet", index=False)
        inside = (t >= pd.Timestamp(f"{day} 09:30", tz="America/New_York")) & (
            t < pd.Timestamp(f"{day} 16:00", tz="America/New_York"))
        want.append(int(inside.sum()))
    src = open_segmented(str(tmp_path / "*.parquet"), sessions=SessionSpec.from_value({"calendar": "XNYS"}, "s"),
                         timestamp="timestamp")
    assert list(src.segments.labels) == list(days)
    assert (src.segments.stops - src.segments.starts).tolist() == want


def _optiver(root: Path, stocks=(0, 1), time_ids=(5, 11, 16, 31, 62), rows=40, seed=0) -> Path:
    """Optiver Realized Volatility's layout: ``book_train.parquet/stock_id=N/<file>.parquet``,
    rows grouped by ``time_id`` (int16), ``seconds_in_bucket`` restarting in each, no
    timestamps."""
    rng = np.random.default_rng(seed)
    for stock in stocks:
        frames = []
        for tid in time_ids:
            n = int(rng.integers(rows // 2, rows))
            mid = 1.0 + np.cumsum(rng.normal(0, 1e-4, n)) + stock * 0.01 + tid * 1e-3
            frames.append(pd.DataFrame({
                "time_id": np.full(n, tid, np.int16),
                "seconds_in_bucket": np.sort(rng.choice(600, n, replace=False)).astype(np.int16),
                "bid_price_1": mid - 1e-4, "ask_price_1": mid + 1e-4,
                "bid_size_1": rng.integers(1, 500, n).astype(np.int32),
                "ask_size_1": rng.integers(1, 500, n).astype(np.int32)}))
        d = root / "book_train.parquet" / f"stock_id={stock}"
        d.mkdir(parents=True)
        pd.concat(frames, ignore_index=True).to_parquet(d / "c439ef22282f412ba39e9137a3fdabac.parquet", index=False)
    return root / "book_train.parquet"


def test_column_sessions_keep_windows_and_labels_inside_each_time_id_as_a_pandas_groupby(tmp_path):
    """Optiver's book files: a session per (stock, time_id); windows and labels equal a
    pandas groupby computing each bucket on its own, and the column is no feature."""
    from pipeline.features import FeatureSpec, LabelSpec, build_training_set

    book = _optiver(tmp_path)
    size, stride, h = 4, 2, 3
    src = open_segmented(str(book / "*" / "*.parquet"), sessions=SessionSpec(mode="column", column="time_id"),
                         instrument=InstrumentSpec(path="book_train.parquet/stock_id={instrument}/*.parquet"),
                         read=("ask_price_1", "bid_price_1"), dtype="float64")
    assert src.columns == ("bid_price_1", "ask_price_1")  # time_id read for the sessions, then left out
    assert src.sessions_text == "column time_id" and src.metadata()["session_column"] == "time_id"
    specs = [FeatureSpec.from_mapping(v, "f") for v in ("mid_price", "log_return")]
    ts = build_training_set(src.array.rechunk((17, -1)), columns=src.columns, features=specs, size=size,
                            stride=stride, label=LabelSpec(horizon=h), normalize="none", segments=src.segments)

    df = pd.concat([pd.read_parquet(f).assign(stock=int(f.parent.name.split("=")[1]))
                    for f in sorted(book.glob("*/*.parquet"))])
    xs, ys, sizes = [], [], []
    # Sessions in time order (time_id), stock after stock within one.
    for (_, _), g in df.groupby(["time_id", "stock"], sort=True):
        mid = (g["bid_price_1"].to_numpy() + g["ask_price_1"].to_numpy()) / 2
        feats = np.stack([mid, np.log(mid) - np.log(np.roll(mid, 1))], axis=1)[1:]  # lookback 1
        sizes.append(len(g))
        for e in range(size - 1, len(feats) - h, stride):
            xs.append(feats[e - size + 1 : e + 1])
            ys.append(np.log(mid[e + 1 + h]) - np.log(mid[e + 1]))
    assert (src.segments.stops - src.segments.starts).tolist() == sizes
    assert list(src.segments.labels[:2]) == ["time_id=5", "time_id=5"]
    assert src.segments.session.tolist() == np.repeat(np.arange(5), 2).tolist()
    np.testing.assert_allclose(ts.splits["train"]["x"].compute(), np.asarray(xs, np.float32), rtol=1e-6)
    np.testing.assert_allclose(ts.splits["train"]["y"].compute(), np.asarray(ys, np.float32), rtol=1e-5, atol=1e-9)
    # Without timestamps, folds are the splits of several instruments: whole time_ids.
    from pipeline.features.splits import FoldSpec

    folded = build_training_set(src.array, columns=src.columns, features=specs, size=size, stride=stride,
                                label=LabelSpec(horizon=h), normalize="none", segments=src.segments,
                                folds=FoldSpec.from_value({"kind": "anchored", "test_sessions": 1,
                                                           "min_train_sessions": 2}, "output.folds"))
    session = folded.splits["train"]["session"].compute()
    per_window = np.repeat(np.arange(len(sizes)) // 2, [len(range(size - 1, n - 1 - h, stride)) for n in sizes])
    np.testing.assert_array_equal(session, per_window)  # the time_id's rank of each window
    for i in range(3):
        test, train = folded.folds[f"fold{i}/test"], folded.folds[f"fold{i}/train"]
        assert set(session[test]) == {i + 2} and set(session[train]) == set(range(i + 2))


def test_column_sessions_keep_the_column_a_feature_reads_and_follow_an_instrument_column(tmp_path):
    book = _optiver(tmp_path, stocks=(0,), rows=30)
    df = pd.read_parquet(next(book.glob("*/*.parquet")))
    # Two symbols in one file, rows interleaved within each time_id: an instrument column.
    two = pd.concat([df.assign(symbol="A"), df.assign(symbol="B")]).sort_values(["time_id", "seconds_in_bucket"],
                                                                                 kind="stable")
    two.to_parquet(tmp_path / "two.parquet", index=False)
    src = open_segmented(str(tmp_path / "two.parquet"), sessions=SessionSpec(mode="column", column="time_id"),
                         instrument=InstrumentSpec(column="symbol"), read=("ask_price_1", "time_id"), dtype="float64")
    assert set(src.columns) == {"ask_price_1", "time_id"}  # read by a feature: kept
    got = src.array.compute()[:, [src.columns.index("ask_price_1"), src.columns.index("time_id")]]
    seg = src.segments
    ref = two.groupby(["time_id", "symbol"], sort=True)
    assert (seg.stops - seg.starts).tolist() == ref.size().tolist()
    for k, ((tid, sym), g) in enumerate(ref):
        assert seg.instruments[seg.instrument[k]] == sym
        np.testing.assert_array_equal(got[seg.starts[k] : seg.stops[k], 1], float(tid))
        np.testing.assert_array_equal(got[seg.starts[k] : seg.stops[k], 0], g["ask_price_1"].to_numpy())


def test_a_session_value_that_comes_back_after_another_is_refused_naming_file_and_row(tmp_path):
    book = _optiver(tmp_path, stocks=(0,), time_ids=(5, 11), rows=20)
    path = next(book.glob("*/*.parquet"))
    df = pd.read_parquet(path)
    back = pd.concat([df, df[df.time_id == 5].head(3)], ignore_index=True)  # time_id 5 again at the end
    pq.write_table(pa.Table.from_pandas(back, preserve_index=False), path, row_group_size=7)
    first_back = len(df)
    with pytest.raises(LoaderError, match=(rf"{re.escape(str(path))}: row {first_back}: source.sessions column "
                                           r"'time_id' has the value 5 again after 11 \(first seen at .*: row 0\)")):
        open_segmented(str(book / "*" / "*.parquet"), sessions=SessionSpec(mode="column", column="time_id"),
                       read=("ask_price_1",))
    with pytest.raises(LoaderError, match=r"source.sessions column 'symbol' is not among the numeric columns"):
        open_segmented(str(book / "*" / "*.parquet"), sessions=SessionSpec(mode="column", column="symbol"))


def _hourly(root: Path, hole: bool, name: str = "ST_B") -> Path:
    t = pd.date_range("2026-01-01", periods=24 * 10, freq="h", unit="ns")
    load = 100 + np.cumsum(np.random.default_rng(0).normal(0, 1, t.size))
    df = pd.DataFrame({"timestamp": t, "bid_price_1": load, "ask_price_1": load + 0.5})
    if hole:
        df = df[~((df.timestamp >= "2026-01-05 06:00") & (df.timestamp < "2026-01-05 18:00"))]
    df.to_parquet(root / f"{name}.parquet", index=False)
    return root / f"{name}.parquet"


@pytest.mark.parametrize("sessions", [None, "date", "none"])
def test_a_gap_inside_a_session_is_warned_once_with_its_count_file_and_row(tmp_path, sessions):
    import warnings

    from pipeline.errors import SessionGapWarning

    _hourly(tmp_path, hole=False, name="ST_A")
    path = _hourly(tmp_path, hole=True)
    ts = pd.read_parquet(path).timestamp
    steps = ts.diff().dt.total_seconds().to_numpy()[1:]
    if sessions == "date":  # steps onto a new day start a session: not inside one
        steps = steps[(ts.dt.date.to_numpy()[1:] == ts.dt.date.to_numpy()[:-1])]
    expected = int((steps > 10 * np.quantile(steps, 0.9, method="lower")).sum())
    assert expected == 1
    spec = None if sessions is None else SessionSpec(mode=sessions)
    with pytest.warns(SessionGapWarning) as caught:
        open_segmented(str(tmp_path / "*.parquet"), timestamp="timestamp", sessions=spec,
                       instrument=InstrumentSpec(path="{instrument}.parquet"), read=("ask_price_1",))
    msgs = [str(w.message) for w in caught if issubclass(w.category, SessionGapWarning)]
    row = int(np.flatnonzero(ts.to_numpy() == np.datetime64("2026-01-05T18:00"))[0])
    assert len(msgs) == 1
    assert msgs[0].startswith(f"{expected} step(s) inside sessions are more than 10x the typical step")
    assert f"(1 h; the largest 13 h; the first before {path}: row {row} of ST_B)" in msgs[0]
    assert "source.sessions: {gap: <duration>}" in msgs[0]
    # Split there, or without the outage: nothing to say.
    with warnings.catch_warnings():
        warnings.simplefilter("error", SessionGapWarning)
        open_segmented(str(tmp_path / "*.parquet"), timestamp="timestamp", sessions=SessionSpec(mode="gap",
                       gap_ns=6 * 3600 * NS), instrument=InstrumentSpec(path="{instrument}.parquet"))
        open_segmented(str(tmp_path / "ST_A.parquet"), timestamp="timestamp", sessions=spec)


def _one_day_per_instrument(root: Path, names: tuple[str, ...]) -> dict[str, Path]:
    """One demo day per instrument, each in its own folder."""
    write_demo_data(root, DemoSpec(days=1, rows_per_day=200, levels=2, formats=("parquet",),
                                   per_instrument=True, instruments=names))
    return {n: next((root / n).glob("*.parquet")) for n in names}


def _schema_difference(odd: Path, ref: Path) -> tuple[list[str], list[str]]:
    """The reference: the columns ``ref`` has that ``odd`` lacks, and those it adds (pyarrow)."""
    a, b = pq.read_schema(odd).names, pq.read_schema(ref).names
    return [c for c in b if c not in a], [c for c in a if c not in b]


@pytest.mark.parametrize("read", [("bid_price_1", "ask_price_1"), None])
def test_column_mismatch_names_the_odd_file_and_its_columns(tmp_path, read):
    # AAA sorts first, so the old message named the healthy BBB file as the odd one.
    files = _one_day_per_instrument(tmp_path / "raw", ("AAA", "BBB", "CCC"))
    pq.write_table(pq.read_table(files["AAA"]).rename_columns(
        ["ask_px_1" if c == "ask_price_1" else c for c in pq.read_schema(files["AAA"]).names]), files["AAA"])
    missing, extra = _schema_difference(files["AAA"], files["BBB"])
    assert (missing, extra) == (["ask_price_1"], ["ask_px_1"])
    with pytest.raises(LoaderError) as info:
        open_segmented(str(tmp_path / "raw" / "*" / "*.parquet"), timestamp="timestamp",
                       instrument=InstrumentSpec(path="raw/{instrument}/*.parquet"), read=read)
    assert info.value.path == str(files["AAA"])
    problem = info.value.problem
    assert problem.startswith(f"the columns of instrument 'AAA' differ from those of {files['BBB']} (instrument 'BBB'")
    assert f"lacks column(s) {missing[0]!r}; adds column(s) {extra[0]!r} that file lacks" in problem


def test_column_mismatch_of_two_instruments_blames_the_one_lacking_a_read_column(tmp_path):
    # Two instruments make no majority: the file that lacks a column the build reads
    # (or holds it as text) is the odd one, whichever sorts first.
    files = _one_day_per_instrument(tmp_path / "raw", ("AAA", "BBB"))
    table = pq.read_table(files["AAA"])
    text = pa.array([f"{v:.2f}" for v in table.column("bid_price_1").to_pylist()])
    pq.write_table(table.set_column(table.schema.get_field_index("bid_price_1"), "bid_price_1", text), files["AAA"])
    kinds = {p: pq.read_schema(files[p]).field("bid_price_1").type for p in ("AAA", "BBB")}
    with pytest.raises(LoaderError) as info:
        open_segmented(str(tmp_path / "raw" / "*" / "*.parquet"), timestamp="timestamp",
                       instrument=InstrumentSpec(path="raw/{instrument}/*.parquet"),
                       read=("bid_price_1", "ask_price_1", "bid_size_1"))
    # A column the build reads, held as text: named as such before the instruments are compared.
    assert info.value.path == str(files["AAA"])
    assert info.value.problem == ("column 'bid_price_1': expected numbers, but the file's schema stores it as text; "
                                  "write it as a number type")
    with pytest.raises(LoaderError) as info:  # every column read: the instruments' columns differ
        open_segmented(str(tmp_path / "raw" / "*" / "*.parquet"), timestamp="timestamp",
                       instrument=InstrumentSpec(path="raw/{instrument}/*.parquet"))
    assert "no majority tells which of the two is right" in info.value.problem
    odd, other = ("AAA", "BBB") if info.value.path == str(files["AAA"]) else ("BBB", "AAA")
    assert (f"stores column 'bid_price_1' as {kinds[odd]}, where that file has {kinds[other]}"
            in info.value.problem)
    assert "lacks" not in info.value.problem and "adds" not in info.value.problem
