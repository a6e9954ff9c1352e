"""LOBSTER orderbook/message pairs: values, empty levels, timestamps, instruments, errors."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.demo import DemoSpec, generate_day, lobster_tables, write_demo_data
from pipeline.errors import FormatMismatchError, InvalidValueError, LoaderError
from pipeline.loaders import open_source

NAME = "AAPL_2012-06-21_34200000_57600000_{}_2.csv"

# Four events by hand, two levels: ask price, ask size, bid price, bid size per level.
BOOK = """\
5859400,200,5853300,18,5859500,100,5853000,50
5859400,150,5853300,18,9999999999,0,5853000,50
5859300,10,5853400,7,5859400,150,-9999999999,0
5859300,10,5853400,7,5859400,150,5853300,18
"""
# 34200.000000001 s: float truncation gives ...000 ns, the text says ...001.
MESSAGE = """\
34200.000000001,1,16120456,18,5859100,-1
34200.004241176,1,16113575,18,5853300,1
34200.201742999,3,16120456,18,5859100,-1
57599.999999999,4,16120480,10,5859300,-1
"""
NAN = float("nan")
# The same rows in dollars, by hand; an empty level is NaN in price and size.
EXPECTED = np.array([
    [585.94, 200, 585.33, 18, 585.95, 100, 585.30, 50],
    [585.94, 150, 585.33, 18, NAN, NAN, 585.30, 50],
    [585.93, 10, 585.34, 7, 585.94, 150, NAN, NAN],
    [585.93, 10, 585.34, 7, 585.94, 150, 585.33, 18],
], dtype=np.float32)
COLUMNS = ("ask_price_1", "ask_size_1", "bid_price_1", "bid_size_1",
           "ask_price_2", "ask_size_2", "bid_price_2", "bid_size_2")
MIDNIGHT_NS = 1_340_236_800 * 10**9  # 2012-06-21T00:00:00 UTC
TIMES_NS = [MIDNIGHT_NS + t for t in (34_200_000_000_001, 34_200_004_241_176, 34_200_201_742_999, 57_599_999_999_999)]


def write_pair(d, book: str = BOOK, message: str = MESSAGE, name: str = NAME):
    (d / name.format("orderbook")).write_text(book)
    if message is not None:
        (d / name.format("message")).write_text(message)
    return d / name.format("orderbook")


def test_hand_written_pair_every_value_and_timestamp(tmp_path):
    path = write_pair(tmp_path)
    src = open_source(str(path), format="lobster", nan="fill", fill_value=NAN)  # fill with NaN: see them all
    assert src.columns == COLUMNS
    np.testing.assert_array_equal(src.array.compute(), EXPECTED)
    assert src.timestamps.dtype == np.int64 and src.timestamps.chunks == src.array.chunks[:1]
    assert src.timestamps.compute().tolist() == TIMES_NS
    assert src.instruments == ("AAPL",) and src.instrument_codes.compute().tolist() == [0] * 4
    meta = src.metadata()
    assert meta["files"][0]["rows"] == 4
    assert meta["files"][0]["companion"]["path"] == str(tmp_path / NAME.format("message"))
    assert meta["instruments"] == ["AAPL"]


@pytest.mark.parametrize("chunk_rows", [1, 3])
def test_a_pair_read_in_parts_equals_the_hand_written_values(tmp_path, chunk_rows):
    # A day of a busy book has millions of rows: read in parts, the same lines of both files.
    path = write_pair(tmp_path)
    src = open_source(str(path), format="lobster", nan="fill", fill_value=NAN, chunk_rows=chunk_rows)
    assert src.array.chunks[0] == ((1, 1, 1, 1) if chunk_rows == 1 else (3, 1))
    np.testing.assert_array_equal(src.array.compute(), EXPECTED)
    assert src.timestamps.compute().tolist() == TIMES_NS
    assert src.metadata()["files"][0]["rows"] == 4
    assert src.metadata()["files"][0]["companion"]["rows"] == 4
    # Message times out of order across two parts' boundary: named by the file's lines.
    lines = MESSAGE.splitlines(keepends=True)
    swapped = write_pair(tmp_path / "edge", message="".join([lines[0], lines[2], lines[1], lines[3]])) \
        if (tmp_path / "edge").mkdir() is None else None
    with pytest.raises(LoaderError, match=r"message_2\.csv: timestamp column 'time': line 3 is at .*\(line 2\)"):
        open_source(str(swapped), format="lobster", chunk_rows=2 if chunk_rows == 3 else 1).timestamps.compute()
    # The first part to fail names its empty level by the file's line: 2 or 3, whatever the part.
    with pytest.raises(InvalidValueError, match=r"'(ask_price_2' at line 2|bid_price_2' at line 3);"):
        open_source(str(path), format="lobster", chunk_rows=chunk_rows).array.compute()


def test_nan_policies_on_empty_levels(tmp_path):
    path = write_pair(tmp_path)
    with pytest.raises(InvalidValueError, match=r"orderbook_2\.csv: NaN or inf .*dummy price.* in column "
                                                r"'ask_price_2' at line 2; set source.nan: drop or fill"):
        open_source(str(path), format="lobster").array.compute()
    filled = open_source(str(path), format="lobster", nan="fill", fill_value=-1).array.compute()
    assert filled[1, 4] == -1 and filled[1, 5] == -1 and filled[2, 6] == -1 and filled[2, 7] == -1
    np.testing.assert_array_equal(filled[[0, 3]], EXPECTED[[0, 3]])
    dropped = open_source(str(path), format="lobster", nan="drop")
    assert dropped.array.shape == (2, 8) and dropped.timestamps.chunks == dropped.array.chunks[:1]
    np.testing.assert_array_equal(dropped.array.compute(), EXPECTED[[0, 3]])
    assert dropped.timestamps.compute().tolist() == [TIMES_NS[0], TIMES_NS[3]]
    assert dropped.instrument_codes.compute().tolist() == [0, 0]


def test_a_size_alone_is_empty_where_its_price_is_the_dummy(tmp_path):
    path = write_pair(tmp_path)
    src = open_source(str(path), format="lobster", columns=["bid_size_2"], nan="drop")
    assert src.array.compute()[:, 0].tolist() == [50, 50, 18]
    assert src.timestamps.compute().tolist() == [TIMES_NS[0], TIMES_NS[1], TIMES_NS[3]]


def test_rename_applies_to_lobster_names(tmp_path):
    path = write_pair(tmp_path)
    src = open_source(str(path), format="lobster", rename={"best_ask": "ask_price_1"}, columns=["best_ask"])
    np.testing.assert_array_equal(src.array.compute()[:, 0], EXPECTED[:, 0])


def test_row_count_mismatch_names_both_files_and_counts(tmp_path):
    path = write_pair(tmp_path, message="".join(MESSAGE.splitlines(keepends=True)[:3]))
    with pytest.raises(LoaderError, match=r"orderbook_2\.csv: has 4 rows but its message file .*message_2\.csv "
                                          r"has 3"):
        open_source(str(path), format="lobster")


def test_message_times_out_of_order_name_the_message_file_and_line(tmp_path):
    lines = MESSAGE.splitlines(keepends=True)
    path = write_pair(tmp_path, message="".join([lines[0], lines[2], lines[1], lines[3]]))
    with pytest.raises(LoaderError, match=r"message_2\.csv: timestamp column 'time': line 3 is at "
                                          r"2012-06-21T09:30:00\.004241176, before the row above it \(line 2\) at "
                                          r"2012-06-21T09:30:00\.201742999"):
        open_source(str(path), format="lobster").timestamps.compute()


def test_missing_message_file_names_both(tmp_path):
    path = write_pair(tmp_path, message=None)
    with pytest.raises(LoaderError, match=r"orderbook_2\.csv: its message file .*AAPL_2012-06-21_34200000_57600000"
                                          r"_message_2\.csv cannot be read"):
        open_source(str(path), format="lobster")


@pytest.mark.parametrize(("name", "book", "message"), [
    ("AAPL_34200000_57600000_{}_2.csv", BOOK, r"AAPL_34200000_57600000_orderbook_2\.csv: expected a LOBSTER file "
                                              r"name with the ticker and the date"),
    ("AAPL_2012-13-40_1_2_{}_2.csv", BOOK, r"the date '2012-13-40' in the file name is not a calendar date"),
    (NAME, "1,2,3,4,5,6\n", r"orderbook_2\.csv: has 6 fields per line; a LOBSTER orderbook has 4 per level"),
    (NAME, "ask,size,bid,size\n1,2,3,4\n", r"orderbook_2\.csv: expected a headerless LOBSTER orderbook"),
])
def test_bad_orderbook_files_are_named(tmp_path, name, book, message):
    path = write_pair(tmp_path, book=book, message=MESSAGE, name=name)
    with pytest.raises(FormatMismatchError, match=message):
        open_source(str(path), format="lobster")


def test_a_message_file_in_paths_is_refused_with_the_fix(tmp_path):
    write_pair(tmp_path)
    with pytest.raises(FormatMismatchError, match=r"message_2\.csv: expected a LOBSTER orderbook file .* the "
                                                  r"\*_orderbook_\*\.csv files"):
        open_source(str(tmp_path / "*.csv"), format="lobster")


def test_options_that_do_not_apply_are_refused(tmp_path):
    path = write_pair(tmp_path)
    with pytest.raises(FormatMismatchError, match="leave source.instrument unset"):
        open_source(str(path), format="lobster", instrument_column="ticker")
    with pytest.raises(FormatMismatchError, match="leave source.timestamp unset"):
        open_source(str(path), format="lobster", timestamp="time")
    assert open_source(str(path), format="lobster", timestamp="timestamp").timestamps is not None


def test_demo_pairs_load_back_to_the_generator(tmp_path):
    spec = DemoSpec(days=2, rows_per_day=300, levels=3, seed=4, formats=("lobster",), instruments=("XY", "AB"),
                    empty_level_rate=0.2)
    write_demo_data(tmp_path, spec)
    src = open_source(str(tmp_path / "*_orderbook_3.csv"), format="lobster", nan="fill", fill_value=NAN)
    assert src.instruments == ("AB", "XY") and src.array.shape == (4 * 300, 12)
    # Files sort by ticker, then date; compare each with what the generator made.
    expected, times, codes = [], [], []
    for code, ticker in enumerate(("AB", "XY")):
        for day, date in enumerate(("2026-01-05", "2026-01-06")):
            book, _ = lobster_tables(ticker, day, date, spec)
            block = np.stack([book[c] for c in src.columns], axis=1).astype(np.float64)
            prices = np.array(["price" in c for c in src.columns])
            dummy = np.zeros_like(block, dtype=bool)
            for j, c in enumerate(src.columns):
                side, _, level = c.split("_")
                dummy[:, j] = book[f"{side}_price_{level}"] == (9999999999 if side == "ask" else -9999999999)
            block[:, prices] /= 10000
            block[dummy] = np.nan
            expected.append(block.astype(np.float32))
            times.append(generate_day(day, spec, ticker)["timestamp"].astype(np.int64))
            codes.append(np.full(300, code))
    got = src.array.compute()
    np.testing.assert_array_equal(got, np.concatenate(expected))
    assert np.isnan(got).any(), "the empty-level rate made no empty level"
    assert not np.isnan(got[:, :8]).any(), "only the deepest level may be empty"
    np.testing.assert_array_equal(src.timestamps.compute(), np.concatenate(times))
    np.testing.assert_array_equal(src.instrument_codes.compute(), np.concatenate(codes))


def test_demo_instruments_differ_in_data_and_price_level(tmp_path):
    spec = DemoSpec(days=1, rows_per_day=200, levels=2, formats=("lobster",), instruments=("AAA", "BBB"))
    write_demo_data(tmp_path, spec)
    src = open_source(str(tmp_path / "*_orderbook_2.csv"), format="lobster")  # no empty level: raise is fine
    x = src.array.compute()
    codes = src.instrument_codes.compute()
    mid = (x[:, 0] + x[:, 2]) / 2
    a, b = mid[codes == 0], mid[codes == 1]
    assert abs(a.mean() / b.mean() - 1) > 0.2
    ra, rb = np.diff(np.log(a)), np.diff(np.log(b))
    assert not np.allclose(ra, rb)


def test_a_compressed_pair_equals_the_hand_written_values(tmp_path):
    """LOBSTER's files as often shipped, both gzipped (the message file is found by the
    orderbook file's name, suffix included): one part, the same values and times."""
    import gzip

    plain = write_pair(tmp_path)
    for kind in ("orderbook", "message"):
        f = tmp_path / NAME.format(kind)
        (tmp_path / (f.name + ".gz")).write_bytes(gzip.compress(f.read_bytes()))
        f.unlink()
    src = open_source(str(tmp_path / (plain.name + ".gz")), format="lobster", nan="fill", fill_value=NAN, chunk_rows=1)
    assert src.array.chunks[0] == (4,)
    np.testing.assert_array_equal(src.array.compute(), EXPECTED)
    assert src.timestamps.compute().tolist() == TIMES_NS
    assert src.instruments == ("AAPL",)
