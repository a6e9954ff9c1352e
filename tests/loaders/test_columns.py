"""Per-row timestamps (pipeline.loaders.columns): what a file of rows going back in time is told."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.errors import LoaderError, MissingColumnError
from pipeline.loaders import open_source

#: 09:30:00 to 09:30:04 as nanoseconds since midnight (NASDAQ ITCH's times of day).
TOD = (34_200 + np.arange(5, dtype=np.int64)) * 10**9


def _days_in_one_file(path, dates=(20231228, 20231229)) -> pd.DataFrame:
    """A vendor's quotes: several days in one file, a date column beside the times of day."""
    frame = pd.concat([pd.DataFrame({"date": d, "timestamp": TOD, "bid_price_1": 190.0 + np.arange(5)})
                       for d in dates])
    frame.to_csv(path, index=False)
    return frame


def test_times_of_day_of_several_days_in_one_file_are_not_told_to_sort(tmp_path):
    # The second day's first row goes back to 09:30 of 1970-01-01: sorting the file by
    # time, the usual advice, would interleave the two days.
    frame = _days_in_one_file(tmp_path / "quotes.csv")
    back = int(np.flatnonzero(np.diff(frame["timestamp"].to_numpy()) < 0)[0]) + 1  # pandas' row of the new day
    with pytest.raises(LoaderError) as err:
        open_source(str(tmp_path / "quotes.csv"), timestamp="timestamp").timestamps.compute()
    msg = str(err.value)
    assert f"quotes.csv: timestamp column 'timestamp': line {back + 2} is at 1970-01-01T09:30:00" in msg
    assert "they look like times of day" in msg and "source.date" in msg and "sort the file" not in msg


def test_a_file_dated_by_its_path_that_holds_several_days_is_told_to_keep_one_day_per_file(tmp_path):
    _days_in_one_file(tmp_path / "20231228.csv")
    with pytest.raises(LoaderError, match=r"20231228\.csv: timestamp column 'timestamp': line 7 is at "
                       r"2023-12-28T09:30:00\.000000000, before .*2023-12-28T09:30:04.*source\.date gives a whole file "
                       r"one date.*keep one day per file"):
        open_source(str(tmp_path / "*.csv"), timestamp="timestamp",
                    date={"path": str(tmp_path / "{date}.csv"), "format": "%Y%m%d"}).timestamps.compute()


def test_whole_times_out_of_order_are_still_told_to_sort(tmp_path):
    t = pd.Timestamp("2024-01-02 09:30").value + np.array([0, 2, 1]) * 10**9 * 3600 * 2
    pd.DataFrame({"timestamp": t, "v": [1.0, 2.0, 3.0]}).to_csv(tmp_path / "q.csv", index=False)
    with pytest.raises(LoaderError, match=r"q\.csv: timestamp column 'timestamp': line 4 .*sort the file by time$"):
        open_source(str(tmp_path / "q.csv"), timestamp="timestamp").timestamps.compute()


# -- each row's date from a column (source.date: {column: ...}) -------------------------------

#: Three trading days; the second file continues on the third.
_DAYS = (20231228, 20231229, 20240102)


def _vendor_days(path, dates, rng, rows=40, fmt=None, parquet=False) -> pd.DataFrame:
    """An LSEG/TRTH-like export: a ``date`` column (``YYYYMMDD`` integers, or text in
    ``fmt``) beside nanoseconds since midnight, several days in one file, in time order."""
    frames = []
    for d in dates:
        tod = np.sort(rng.integers(34_200 * 10**9, 57_600 * 10**9, rows))
        date = d if fmt is None else pd.Timestamp(str(d)).strftime(fmt)
        frames.append(pd.DataFrame({"date": date, "timestamp": tod,
                                    "bid_price_1": np.round(190 + rng.normal(0, 1, rows), 2)}))
    frame = pd.concat(frames, ignore_index=True)
    frame["ask_price_1"] = frame["bid_price_1"] + 0.01
    if parquet:
        # Small row groups: the footers' times-of-day bounds go back at each midnight.
        frame.to_parquet(path, index=False, row_group_size=15)
    else:
        frame.to_csv(path, index=False)
    return frame


def _whole_times(frame: pd.DataFrame, fmt: str | None = None) -> np.ndarray:
    """The reference: pandas' date plus the time of day, as int64 ns."""
    day = pd.to_datetime(frame["date"].astype(str), format=fmt or "%Y%m%d")
    return (day + pd.to_timedelta(frame["timestamp"], unit="ns")).to_numpy().astype("datetime64[ns]").astype(np.int64)


@pytest.mark.parametrize("parquet", [False, True])
def test_a_date_column_dates_the_times_of_day_of_a_file_of_several_days(tmp_path, parquet):
    name = "quotes.parquet" if parquet else "quotes.csv"
    frame = _vendor_days(tmp_path / name, _DAYS, np.random.default_rng(1), parquet=parquet)
    src = open_source(str(tmp_path / name), timestamp="timestamp", date={"column": "date"}, chunk_rows=25)
    np.testing.assert_array_equal(src.timestamps.compute(), _whole_times(frame))
    # The date column is read, not a feature.
    assert list(src.columns) == ["bid_price_1", "ask_price_1"]
    np.testing.assert_array_equal(src.array.compute(),
                                  frame[["bid_price_1", "ask_price_1"]].to_numpy(np.float32))


@pytest.mark.parametrize("parquet", [False, True])
def test_files_of_several_days_join_by_their_rows_dated_times_and_date_sessions_follow_the_column(tmp_path, parquet):
    from pipeline.features.sessions import SessionSpec
    from pipeline.loaders.segments import open_segmented

    rng = np.random.default_rng(2)
    suffix = "parquet" if parquet else "csv"
    frames = [_vendor_days(tmp_path / f"part-{k}.{suffix}", days, rng, parquet=parquet)
              for k, days in enumerate((_DAYS[:2], _DAYS[2:]))]
    frame = pd.concat(frames, ignore_index=True)
    src = open_segmented(str(tmp_path / f"*.{suffix}"), timestamp="timestamp", date={"column": "date"},
                         sessions=SessionSpec(mode="date"))
    np.testing.assert_array_equal(src.timestamps.compute(), _whole_times(frame))
    per_day = frame.groupby("date", sort=True).size()
    assert (src.segments.stops - src.segments.starts).tolist() == per_day.tolist()
    assert src.segments.session.tolist() == [0, 1, 2]


def test_files_whose_dated_rows_overlap_are_refused_naming_both(tmp_path):
    from pipeline.loaders.segments import open_segmented

    rng = np.random.default_rng(3)
    _vendor_days(tmp_path / "a.csv", _DAYS[1:], rng)
    _vendor_days(tmp_path / "b.csv", _DAYS[:1], rng)  # earlier days, later name
    with pytest.raises(LoaderError, match=r"b\.csv: starts at 2023-12-28T.*before the previous file .*a\.csv ends "
                       r"at 2024-01-02T"):
        open_segmented(str(tmp_path / "*.csv"), timestamp="timestamp", date={"column": "date"})


@pytest.mark.parametrize(("fmt", "given"), [(None, None), ("%Y%m%d", "%Y%m%d"), ("%Y-%m-%d", None),
                                            ("%Y-%m-%d", "%Y-%m-%d"), ("%d/%m/%Y", "%d/%m/%Y")])
def test_a_date_column_of_integers_or_text_reads_in_its_format(tmp_path, fmt, given):
    frame = _vendor_days(tmp_path / "q.csv", _DAYS, np.random.default_rng(4), fmt=fmt)
    date = {"column": "date"} if given is None else {"column": "date", "format": given}
    src = open_source(str(tmp_path / "q.csv"), timestamp="timestamp", date=date)
    np.testing.assert_array_equal(src.timestamps.compute(), _whole_times(frame, fmt))


def test_a_parquet_date_type_needs_no_format(tmp_path):
    frame = _vendor_days(tmp_path / "q.csv", _DAYS, np.random.default_rng(5))
    table = pa.Table.from_pandas(frame.assign(date=pd.to_datetime(frame["date"].astype(str)).dt.date),
                                 preserve_index=False)
    assert pa.types.is_date(table.schema.field("date").type)
    pq.write_table(table, tmp_path / "q.parquet")
    src = open_source(str(tmp_path / "q.parquet"), timestamp="timestamp", date={"column": "date"})
    np.testing.assert_array_equal(src.timestamps.compute(), _whole_times(frame))


def test_a_missing_or_unreadable_date_is_refused_naming_the_file_and_line(tmp_path):
    frame = _vendor_days(tmp_path / "q.csv", _DAYS, np.random.default_rng(6), fmt="%Y-%m-%d")
    frame.loc[45, "date"] = None  # pandas' row 45 is the file's line 47 (header, from 1)
    frame.to_csv(tmp_path / "q.csv", index=False)
    with pytest.raises(LoaderError, match=r"q\.csv: date column 'date': missing value at line 47"):
        open_source(str(tmp_path / "q.csv"), timestamp="timestamp", date={"column": "date"}).timestamps.compute()
    frame.loc[45, "date"] = "2023-12-32"
    frame.to_csv(tmp_path / "q.csv", index=False)
    with pytest.raises(LoaderError, match=r"q\.csv: date column 'date': line 47 holds '2023-12-32', not a date in "
                       r"the format YYYY-MM-DD or YYYYMMDD"):
        open_source(str(tmp_path / "q.csv"), timestamp="timestamp", date={"column": "date"}).timestamps.compute()
    with pytest.raises(MissingColumnError, match=r"q\.csv: missing date column 'day'"):
        open_source(str(tmp_path / "q.csv"), timestamp="timestamp", date={"column": "day"})


def test_rows_out_of_order_by_date_and_time_are_told_to_sort_by_both(tmp_path):
    frame = _vendor_days(tmp_path / "q.csv", _DAYS, np.random.default_rng(7))
    # The last day's rows first: each day is in order, the days are not.
    frame = pd.concat([frame[frame["date"] == _DAYS[2]], frame[frame["date"] != _DAYS[2]]], ignore_index=True)
    frame.to_csv(tmp_path / "q.csv", index=False)
    with pytest.raises(LoaderError, match=r"q\.csv: timestamp column 'timestamp': line 42 is at 2023-12-28T.*before "
                       r"the row above it \(line 41\) at 2024-01-02T.*sort the file by 'date', then by time$"):
        open_source(str(tmp_path / "q.csv"), timestamp="timestamp", date={"column": "date"},
                    chunk_rows=25).timestamps.compute()


def test_the_unit_of_times_of_day_dated_by_a_column_is_checked_per_file_not_per_row_group(tmp_path):
    # A 24-hour market: the row group holding the first minute after midnight alone
    # looks like another unit; the file's footers, which reach 23:59, say ns.
    tod = np.array([10, 20, 80, 3_600, 86_000], dtype=np.int64) * 10**9
    frame = pd.DataFrame({"date": np.repeat([20240102, 20240103], 5), "timestamp": np.tile(tod, 2),
                          "bid_price_1": np.arange(10.0)})
    frame.to_parquet(tmp_path / "fx.parquet", index=False, row_group_size=3)
    src = open_source(str(tmp_path / "fx.parquet"), timestamp="timestamp", date={"column": "date"}, chunk_rows=3)
    assert src.timestamps.numblocks[0] > 1  # the row groups read apart
    np.testing.assert_array_equal(src.timestamps.compute(), _whole_times(frame))
    # Milliseconds since midnight read as ns would put each day in its first 86.4 s.
    frame.assign(timestamp=frame["timestamp"] // 10**6).to_parquet(tmp_path / "ms.parquet", index=False)
    with pytest.raises(LoaderError, match=r"ms\.parquet: timestamp column 'timestamp': times of day up to 86000000.*"
                       r"source\.timestamp_unit: ms"):
        open_source(str(tmp_path / "ms.parquet"), timestamp="timestamp", date={"column": "date"})


@pytest.mark.parametrize("unit", ["ms", "us"])
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_epoch_milliseconds_written_as_floats_are_told_their_unit_not_the_year_2262(tmp_path, fmt, unit):
    """pandas writes an integer column with a gap as floats (``1709562600000.0``): read as
    seconds (floats' default) they are past int64 nanoseconds, as integers read as ns
    would be, and the advice is the same, the unit that makes them a date. A CSV's are
    read as decimals, a Parquet file's as float64."""
    per = {"ms": 10**3, "us": 10**6}[unit]
    frame = pd.DataFrame({"timestamp": (1_709_562_600 + np.arange(5)) * float(per), "bid_price_1": 100.0})
    path = tmp_path / f"day.{fmt}"
    frame.to_csv(path, index=False) if fmt == "csv" else frame.to_parquet(path)
    assert fmt == "parquet" or path.read_text().splitlines()[1].startswith(f"{1_709_562_600 * per}.0,")
    with pytest.raises(LoaderError, match=rf"day\.{fmt}: timestamp column 'timestamp': its first value "
                                          rf"{1_709_562_600 * per} read as s .* is past the year 2262, but as epoch "
                                          rf"{unit} it is 2024-03-04T14:30:00: set source.timestamp_unit: {unit}"):
        open_source(str(path), timestamp="timestamp").timestamps.compute()
    got = open_source(str(path), timestamp="timestamp", timestamp_unit=unit).timestamps.compute()
    np.testing.assert_array_equal(got, (1_709_562_600 + np.arange(5)) * 10**9)
