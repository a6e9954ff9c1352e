"""Columns as vendors' exports hold them: a price column of text, a column some files add,
the same columns in another order. A column a run reads that a file holds as text is named
with its first value that is no number and its line; a column no feature reads need not be
in every file; instruments whose files list the same columns in another order are read
by name."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.errors import LoaderError, MissingColumnError
from pipeline.loaders import open_source
from pipeline.loaders.segments import open_segmented

READ = ("ask_price_1", "bid_price_1")


def _frame(rows: int, seed: int = 0, day: str = "2026-03-05") -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    mid = 100 + np.cumsum(rng.integers(-2, 3, rows)) * 0.01
    return pd.DataFrame({
        "timestamp": pd.date_range(f"{day} 14:30", periods=rows, freq="1s").as_unit("ns").astype("int64"),
        "bid_price_1": np.round(mid - 0.01, 2), "ask_price_1": np.round(mid + 0.01, 2),
        "bid_size_1": rng.integers(1, 90, rows).astype(float), "ask_size_1": rng.integers(1, 90, rows).astype(float),
    })


@pytest.mark.parametrize("line", [2, 121])
def test_a_bad_cell_in_a_read_column_is_named_by_its_line_not_called_a_missing_column(tmp_path, line):
    """In the file's first bytes, the bad cell made the column text: it was left out of the
    default columns, and the feature reading it said it was not in the source."""
    lines = _frame(300).to_csv(index=False).splitlines(keepends=True)
    fields = lines[line - 1].split(",")
    fields[1] = "1OO.05"  # letters O for zeros
    lines[line - 1] = ",".join(fields)
    (tmp_path / "x.csv").write_text("".join(lines))
    with pytest.raises(LoaderError, match=rf"x\.csv: column 'bid_price_1': expected numbers, got text at line "
                                          rf"{line}: '1OO\.05'$"):
        open_source(str(tmp_path / "x.csv"), timestamp="timestamp", read=READ)
    # A column no feature reads may hold text: it is not read.
    assert open_source(str(tmp_path / "x.csv"), timestamp="timestamp", read=("ask_price_1",)).columns == (
        "ask_price_1",)


@pytest.mark.parametrize("text, delimiter, decimal, value", [
    ('"9,999.50"', ",", ".", "9,999.50"),
    ("99.995,00", ";", ",", "99.995,00"),
])
def test_prices_with_thousands_separators_are_named_with_the_fix(tmp_path, text, delimiter, decimal, value):
    """Every price of the file had them: the file gave no numeric column, and the error
    blamed source.paths."""
    rows = [delimiter.join(["timestamp", "bid_price_1", "ask_price_1"])]
    rows += [delimiter.join([str(1772721000000000000 + i), text, text]) for i in range(20)]
    (tmp_path / "x.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(LoaderError, match=rf"column 'ask_price_1': expected numbers, got text at line 2: "
                                          rf"'{value}'; it looks like a number with thousands separators"):
        open_source(str(tmp_path / "x.csv"), timestamp="timestamp", read=READ, delimiter=delimiter, decimal=decimal)


def test_a_parquet_price_column_stored_as_text_is_named(tmp_path):
    frame = _frame(50)
    frame["bid_price_1"] = frame["bid_price_1"].map("{:.2f}".format)
    frame.to_parquet(tmp_path / "x.parquet", index=False)
    with pytest.raises(LoaderError, match=r"x\.parquet: column 'bid_price_1': expected numbers, but the file's "
                                          r"schema stores it as text"):
        open_source(str(tmp_path / "x.parquet"), timestamp="timestamp", read=READ)


def test_a_column_no_feature_reads_need_not_be_in_every_file(tmp_path):
    """The first day's file adds a column (a vendor's sequence number): the second day's
    was refused as missing it, though nothing reads it."""
    _frame(100, 1, "2026-03-05").assign(venue_seq=np.arange(100.0)).to_csv(tmp_path / "2026-03-05.csv", index=False)
    _frame(100, 2, "2026-03-06").to_csv(tmp_path / "2026-03-06.csv", index=False)
    src = open_source(str(tmp_path / "*.csv"), timestamp="timestamp", read=READ)
    want = pd.concat([pd.read_csv(tmp_path / f"2026-03-0{d}.csv") for d in (5, 6)])[list(src.columns)]
    assert sorted(src.columns) == sorted(READ)
    np.testing.assert_array_equal(np.asarray(src.array), want.to_numpy(np.float32))
    # Every column read (no read given: a custom feature, nan: drop): still refused, naming it.
    with pytest.raises(MissingColumnError, match=r"2026-03-06\.csv: missing column\(s\) \['venue_seq'\]"):
        open_source(str(tmp_path / "*.csv"), timestamp="timestamp")


def test_instruments_whose_files_list_the_same_columns_in_another_order_are_read_by_name(tmp_path):
    """One instrument's export lists its columns in another order: the instruments were
    refused as differing ("this file differs;", naming nothing)."""
    for name, seed in (("AAA", 1), ("BBB", 2)):
        (tmp_path / name).mkdir()
        frame = _frame(60, seed)
        if name == "AAA":
            frame = frame[["ask_price_1", "bid_size_1", "timestamp", "ask_size_1", "bid_price_1"]]
        frame.to_csv(tmp_path / name / "2026-03-05.csv", index=False)
    instrument = {"path": str(tmp_path / "{instrument}" / "*.csv")}
    src = open_segmented(str(tmp_path / "*" / "*.csv"), instrument=instrument, timestamp="timestamp", read=READ,
                         dtype="float64")
    want = np.concatenate([pd.read_csv(tmp_path / n / "2026-03-05.csv")[list(src.columns)].to_numpy()
                           for n in ("AAA", "BBB")])
    np.testing.assert_array_equal(np.asarray(src.array), want)
    assert sorted(src.columns) == sorted(READ)
    # Handed every column in its order (no read given), the order is named as what differs.
    with pytest.raises(LoaderError, match=r"this file lists the same columns in another order \("):
        open_segmented(str(tmp_path / "*" / "*.csv"), instrument=instrument, timestamp="timestamp")


def test_a_header_with_spaces_after_its_commas_is_read_by_the_names_without_them(tmp_path):
    """`timestamp, bid_price_1, ...`: the source was opened by the stripped names, then
    pyarrow's reader, keeping ' bid_price_1', found no such column."""
    frame = _frame(40)
    (tmp_path / "x.csv").write_text(frame.to_csv(index=False, sep=",").replace(",", ", "))
    src = open_source(str(tmp_path / "x.csv"), timestamp="timestamp", read=READ, dtype="float64")
    np.testing.assert_array_equal(np.asarray(src.array), frame[list(src.columns)].to_numpy())
    np.testing.assert_array_equal(np.asarray(src.timestamps), frame["timestamp"].to_numpy())


def _iso_file(tmp_path, times: list[str]) -> str:
    rows = ["timestamp,bid_price_1,ask_price_1"] + [f"{t},99.99,100.01" for t in times]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    return str(tmp_path / "t.csv")


def test_times_whose_offsets_stop_partway_are_named_by_the_first_line_without_one(tmp_path):
    """pyarrow's message quoted the last value and told to call its assume_timezone."""
    times = [f"2026-03-05T14:30:{s:02d}+00:00" for s in range(30)] + [f"2026-03-05T14:31:{s:02d}" for s in range(30)]
    with pytest.raises(LoaderError, match=r"t\.csv: timestamp column 'timestamp': line 32 '2026-03-05T14:31:00' has "
                                          r"no UTC offset, where line 2 '2026-03-05T14:30:00\+00:00' has: a column's "
                                          r"times are either all UTC instants"):
        np.asarray(open_source(_iso_file(tmp_path, times), timestamp="timestamp", read=READ).timestamps)


@pytest.mark.parametrize("bad, at", [("2026-03-05 09:30:07 EST", 9), ("yesterday", 2)])
def test_a_time_that_is_no_iso_time_is_named_by_its_line(tmp_path, bad, at):
    times = [f"2026-03-05 09:30:{s:02d}" for s in range(40)]
    times[at - 2] = bad
    with pytest.raises(LoaderError, match=rf"timestamp column 'timestamp': line {at} '{bad}' is no time: expected "
                                          r"ISO-8601 text"):
        np.asarray(open_source(_iso_file(tmp_path, times), timestamp="timestamp", read=READ).timestamps)


def test_a_last_line_of_spaces_only_is_named_by_its_line(tmp_path):
    text = _frame(30).to_csv(index=False) + "   \n"
    (tmp_path / "x.csv").write_text(text)
    with pytest.raises(LoaderError, match=r"x\.csv: line 32 has 1 fields, expected 5 \(as in line 1\): a line of "
                                          r"spaces only: remove it"):
        np.asarray(open_source(str(tmp_path / "x.csv"), timestamp="timestamp", read=READ).array)
    (tmp_path / "x.csv").write_text(_frame(30).to_csv(index=False) + "\n\r\n")  # empty lines: skipped
    assert np.asarray(open_source(str(tmp_path / "x.csv"), timestamp="timestamp", read=READ).array).shape == (30, 2)


@pytest.mark.parametrize("unit, per", [(None, 10**9), ("ms", 10**6)])
def test_decimal_epoch_times_in_a_csv_are_the_instants_written(tmp_path, unit, per):
    """``1772721000.001000`` s was read through a float64: 14:30:00.000999928, up to 118
    ns off the written microseconds. Each time is now the instant written, checked
    against exact decimal arithmetic."""
    from decimal import Decimal

    rng = np.random.default_rng(3)
    whole = 1772721000 * (10**9 // per) + np.sort(rng.integers(0, 50_000, 300))
    written = [f"{w}.{f:06d}" for w, f in zip(whole, rng.integers(0, 10**6, 300))]
    written[6] = f"{whole[6]}"  # no fraction
    rows = ["timestamp,bid_price_1,ask_price_1"] + [f"{t},99.99,100.01" for t in written]
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    src = open_source(str(tmp_path / "t.csv"), timestamp="timestamp", timestamp_unit=unit, read=READ)
    want = [int(Decimal(t) * per) for t in written]
    assert np.asarray(src.timestamps).tolist() == want
    # A digit past the nanosecond: the file is read through floats, as before (the
    # nanosecond nearest each float).
    rows[6] = rows[6].replace(written[5], f"{whole[5]}.0000000005")
    (tmp_path / "t.csv").write_text("\n".join(rows) + "\n")
    got = np.asarray(open_source(str(tmp_path / "t.csv"), timestamp="timestamp", timestamp_unit=unit,
                                 read=READ).timestamps)
    near = np.array(want[:5] + [int(whole[5]) * per] + want[6:])
    assert 0 < np.abs(got - near).max() <= 256  # a float64's resolution at these values
    # In exponent notation, as decimals too.
    (tmp_path / "t.csv").write_text("\n".join(rows[:1] + [f"{float(t):.16e},99.99,100.01" for t in written[:3]])
                                    + "\n")
    got = np.asarray(open_source(str(tmp_path / "t.csv"), timestamp="timestamp", timestamp_unit=unit,
                                 read=READ).timestamps)
    assert np.abs(got - np.array(want[:3])).max() <= 256  # a float64's resolution at these values
