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


def test_a_pair_in_one_zip_archive_reads_through_a_chained_url(tmp_path):
    """LOBSTER's sample downloads are one .zip per ticker and day holding the orderbook
    and the message file. ``zip://*_orderbook_*.csv::ARCHIVE`` was refused as a file
    not named as an orderbook file (the archive's path was read as the name), and the
    archive itself pointed to ``zip://*.csv``, which names the message file too."""
    import zipfile

    (tmp_path / "files").mkdir()
    write_pair(tmp_path / "files")
    archive = tmp_path / "LOBSTER_SampleFile_AAPL_2012-06-21_2.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for kind in ("orderbook", "message"):
            z.write(tmp_path / "files" / NAME.format(kind), NAME.format(kind))
    src = open_source(f"zip://*_orderbook_*.csv::{archive}", format="lobster", nan="fill", fill_value=NAN)
    assert src.columns == COLUMNS
    np.testing.assert_array_equal(src.array.compute(), EXPECTED)
    assert src.timestamps.compute().tolist() == TIMES_NS
    assert src.instruments == ("AAPL",)
    with pytest.raises(LoaderError, match=r"holding 2 files .*'zip://\*_orderbook_\*\.csv::.*format: lobster finds"):
        open_source(str(archive), format="lobster")


# -- the message file's fields, and trading halts ----------------------------------------

MESSAGE_COLUMNS = ("event_type", "order_id", "event_size", "event_price", "direction")


def write_halted_day(d, ticker: str, date: str, n: int = 40, seed: int = 0, halt_at: int = 20):
    """A LOBSTER day of one level in the real layout, with a trading halt in it as LOBSTER
    writes one: three type 7 messages (price -1 halt, 0 quote, 1 resume; order id 0, size
    0, direction -1) whose book rows repeat the row before them. Returns the orderbook path."""
    rng = np.random.default_rng(seed)
    seconds = 34_200 + np.cumsum(rng.integers(1, 10**9, n)) / 1e9
    bid = 2_000_000 + np.cumsum(rng.integers(-1, 2, n)) * 100
    ask = bid + rng.integers(1, 4, n) * 100
    book = np.stack([ask, rng.integers(1, 500, n) * 100, bid, rng.integers(1, 500, n) * 100], axis=1)
    types = rng.choice([1, 2, 3, 4, 5], n)
    direction = rng.choice([-1, 1], n)
    message = np.stack([types, rng.integers(10**7, 10**8, n), rng.integers(1, 500, n),
                        np.where(direction == 1, bid, ask), direction], axis=1)
    for j, code in enumerate((-1, 0, 1)):
        message[halt_at + j] = (7, 0, 0, code, -1)
        book[halt_at + j] = book[halt_at - 1]
    stem = d / f"{ticker}_{date}_34200000_57600000"
    (d / f"{stem.name}_message_1.csv").write_text(
        "".join(f"{t:.9f}," + ",".join(map(str, m)) + "\n" for t, m in zip(seconds, message)))
    path = d / f"{stem.name}_orderbook_1.csv"
    path.write_text("".join(",".join(map(str, r)) + "\n" for r in book))
    return path


def pandas_day(path) -> tuple:
    """An independent reading of a pair: the book in dollars, the message columns (prices
    in dollars, a halt's price its code), the timestamps in ns, and the halt rows."""
    import pandas as pd

    book = pd.read_csv(path, header=None).to_numpy(np.float64)
    book[:, 0::2] /= 10_000
    msg = pd.read_csv(str(path).replace("_orderbook_", "_message_"), header=None,
                      names=["time", "type", "id", "size", "price", "direction"])
    halt = (msg["type"] == 7).to_numpy()
    price = np.where(halt, msg["price"], msg["price"] / 10_000)
    fields = np.stack([msg["type"], msg["id"], msg["size"], price, msg["direction"]], axis=1).astype(np.float64)
    date = pd.Timestamp(path.name.split("_")[1])
    times = (date + pd.to_timedelta(msg["time"].round(9), unit="s")).to_numpy().astype("datetime64[ns]")
    return book, fields, times.astype(np.int64), halt


@pytest.mark.parametrize("chunk_rows", [None, 7])
def test_message_columns_equal_a_pandas_reading_and_halts_are_kept_when_asked(tmp_path, chunk_rows):
    path = write_halted_day(tmp_path, "AAPL", "2012-06-21")
    book, fields, times, halt = pandas_day(path)
    assert halt.sum() == 3
    src = open_source(str(path), format="lobster", columns=["bid_price_1", *MESSAGE_COLUMNS], halts="keep",
                      dtype="float64", chunk_rows=chunk_rows)
    assert src.columns == ("bid_price_1", *MESSAGE_COLUMNS)
    got = src.array.compute()
    np.testing.assert_array_equal(got[:, 0], book[:, 2])
    np.testing.assert_array_equal(got[:, 1:], fields)
    assert got[halt, 4].tolist() == [-1, 0, 1]  # the halt codes, as written
    np.testing.assert_array_equal(src.timestamps.compute(), times)


@pytest.mark.parametrize("chunk_rows", [None, 7])
def test_halt_rows_are_left_out_by_default(tmp_path, chunk_rows):
    paths = [write_halted_day(tmp_path, "AAPL", date, seed=k, halt_at=5 + 10 * k)
             for k, date in enumerate(("2012-06-21", "2012-06-22"))]
    days = [pandas_day(p) for p in paths]
    src = open_source(str(tmp_path / "*_orderbook_1.csv"), format="lobster", chunk_rows=chunk_rows,
                      columns=["ask_price_1", "bid_price_1", "event_type", "event_price"], dtype="float64")
    kept = [~halt for *_, halt in days]
    np.testing.assert_array_equal(src.array.compute(), np.concatenate(
        [np.column_stack([b[:, [0, 2]], f[:, [0, 3]]])[k] for (b, f, _, _), k in zip(days, kept)]))
    np.testing.assert_array_equal(src.timestamps.compute(), np.concatenate([t[k] for (_, _, t, _), k in zip(days, kept)]))
    assert src.instrument_codes.compute().tolist() == [0] * (2 * 40 - 6)
    assert src.timestamps.chunks == src.array.chunks[:1] == src.instrument_codes.chunks
    # The default columns are still the book's, whatever the halts.
    assert open_source(str(paths[0]), format="lobster").columns == ("ask_price_1", "ask_size_1", "bid_price_1",
                                                                    "bid_size_1")
    assert open_source(str(paths[0]), format="lobster", halts="keep").array.shape == (40, 4)


def test_calendar_sessions_of_lobster_count_only_the_rows_outside_them(tmp_path):
    """Calendar sessions on LOBSTER, its timestamp left unset as its recipe says (they
    were refused until source.timestamp named a column LOBSTER's files do not have): the
    halts the loader drops are not counted as rows outside the sessions (3 were, in a day
    wholly inside them), and a row after the close is."""
    pytest.importorskip("exchange_calendars")
    from pipeline.config import parse_config
    from pipeline.features.sessions import SessionSpec
    from pipeline.loaders.segments import open_segmented

    path = write_halted_day(tmp_path, "AAPL", "2012-06-21", n=40, halt_at=20)
    src = open_segmented(str(path), format="lobster", sessions=SessionSpec.from_value({"calendar": "XNAS"}, "s"),
                         dtype="float64")
    book, _, times, halt = pandas_day(path)
    assert src.array.shape[0] == 40 - 3 and halt.sum() == 3
    assert src.sessions_text == "calendar XNAS: 0 row(s) outside its sessions left out"
    assert src.metadata()["calendar"] == {"name": "XNAS", "rows_left_out": 0}
    # The last row moved past 16:00: one row outside, the halts still not counted.
    message = path.with_name(path.name.replace("_orderbook_", "_message_"))
    lines = message.read_text().splitlines(keepends=True)
    lines[-1] = "57700.000000000" + lines[-1][lines[-1].index(","):]
    message.write_text("".join(lines))
    src = open_segmented(str(path), format="lobster", sessions=SessionSpec.from_value({"calendar": "XNAS"}, "s"),
                         dtype="float64")
    assert src.array.shape[0] == 40 - 3 - 1
    assert src.sessions_text == "calendar XNAS: 1 row(s) outside its sessions left out"
    np.testing.assert_array_equal(np.asarray(src.array)[:, 0], book[:-1][~halt[:-1], 0])
    # A config may leave source.timestamp unset for LOBSTER under a calendar, and not for CSV.
    cfg = {"source": {"paths": str(path), "format": "lobster", "sessions": {"calendar": "XNAS"}},
           "windows": {"size": 4}, "labels": {"kind": "return", "horizon": 1},
           "output": {"path": str(tmp_path / "o.zarr")}}
    assert parse_config(cfg).source.sessions.calendar == "XNAS"
    cfg["source"]["format"] = "csv"
    with pytest.raises(Exception, match="set source.timestamp to the timestamp column"):
        parse_config(cfg)


def test_halts_and_nan_drop_leave_out_the_rows_of_either(tmp_path):
    path = write_halted_day(tmp_path, "AAPL", "2012-06-21")
    book_text = path.read_text().splitlines(keepends=True)
    row = book_text[3].split(",")
    book_text[3] = ",".join(["9999999999", "0", *row[2:]])  # an empty best ask at line 4
    path.write_text("".join(book_text))
    book, _, times, halt = pandas_day(path)
    src = open_source(str(path), format="lobster", nan="drop", dtype="float64")
    keep = ~halt & (np.arange(40) != 3)
    book[3, :2] = np.nan
    np.testing.assert_array_equal(src.array.compute(), book[keep])
    np.testing.assert_array_equal(src.timestamps.compute(), times[keep])


def test_the_halts_option_is_refused_where_it_does_not_apply(tmp_path):
    from pipeline.errors import ConfigError

    path = write_halted_day(tmp_path, "AAPL", "2012-06-21")
    with pytest.raises(ConfigError, match=r"source.halts: expected drop or keep .*got 'skip'"):
        open_source(str(path), format="lobster", halts="skip")
    (tmp_path / "t.csv").write_text("timestamp,x\n1,2\n")
    with pytest.raises(ConfigError, match=r"source.halts: expected null for a format chosen by suffix: halts are "
                                          r"the trading-halt messages \(event type 7\) of LOBSTER files"):
        open_source(str(tmp_path / "t.csv"), halts="keep")


@pytest.mark.parametrize(("line", "error", "match"), [
    ("34200.5,9,1,1,5859100,1\n", InvalidValueError,
     r"message_2\.csv: expected an event type 1 to 7 \(field 2 of a LOBSTER message\) at line 3, found 9"),
    ("34200.5,1,,1,5859100,1\n", LoaderError, r"message_2\.csv: expected an integer order_id \(field 2\) at line 3"),
])
def test_bad_message_fields_are_named_by_file_and_line(tmp_path, line, error, match):
    lines = MESSAGE.splitlines(keepends=True)
    path = write_pair(tmp_path, message="".join([lines[0], lines[1], line, lines[3]]))
    with pytest.raises(error, match=match):
        open_source(str(path), format="lobster", nan="fill", columns=["order_id"]).array.compute()


def test_a_message_file_of_another_layout_is_refused_when_opened(tmp_path):
    path = write_pair(tmp_path, message="".join(f"{line.split(',')[0]}\n" for line in MESSAGE.splitlines()))
    with pytest.raises(FormatMismatchError, match=r"message_2\.csv: expected a LOBSTER message file of 6 numeric "
                                                  r"fields per line .*its first line has \['34200\.000000001'\]"):
        open_source(str(path), format="lobster")


@pytest.mark.parametrize("nan,halts", [(None, None), ("drop", None), ("drop", "keep"), (None, "keep")])
def test_a_built_store_holds_the_message_columns_without_the_halts(tmp_path, nan, halts):
    """`pipeline run` over days with a trading halt: the `column` feature stores the
    message fields as pandas reads them, and the windows, labels and times are those of
    a pandas computation on each day's rows without its halt rows (with them, under
    ``source.halts: keep``; ``nan: drop`` reads every book column, and the message
    columns the features name beside them)."""
    import pipeline
    from pipeline.config import parse_config
    from pipeline.job import run

    size, stride, horizon = 4, 3, 2
    paths = [write_halted_day(tmp_path, "AAPL", date, n=30, seed=k, halt_at=8 + 6 * k)
             for k, date in enumerate(("2012-06-21", "2012-06-22"))]
    config = parse_config({
        "cluster": {"n_workers": 1, "threads_per_worker": 1},
        "source": {"paths": str(tmp_path / "*_orderbook_1.csv"), "format": "lobster", "dtype": "float64",
                   "chunk_rows": 8, **({"nan": nan} if nan else {}), **({"halts": halts} if halts else {})},
        "features": {"steps": ["mid_price", *({"name": "column", "column": c} for c in
                                               ("event_type", "event_size", "event_price", "direction"))],
                     "normalize": "none"},
        "windows": {"size": size, "stride": stride},
        "labels": {"kind": "return", "horizon": horizon},
        "output": {"path": str(tmp_path / "set.zarr")},
    })
    run(config, log=None, progress=False)
    xs, ys, ts = [], [], []
    for path in paths:
        book, fields, times, halt = pandas_day(path)
        if halts == "keep":
            halt = np.zeros_like(halt)
        mid = (book[~halt, 0] + book[~halt, 2]) / 2
        feats = np.column_stack([mid, fields[~halt][:, [0, 2, 3, 4]]])
        ends = np.arange(size - 1, len(mid) - horizon, stride)
        xs.append(np.stack([feats[e - size + 1: e + 1] for e in ends]))
        ys.append(np.log(mid[ends + horizon]) - np.log(mid[ends]))
        ts.append(times[~halt][ends])
    train = pipeline.open(str(tmp_path / "set.zarr"))["train"]
    np.testing.assert_array_equal(train["x"][:], np.concatenate(xs).astype(np.float32))
    np.testing.assert_allclose(train["y"][:].ravel(), np.concatenate(ys), rtol=1e-6)
    np.testing.assert_array_equal(train["t"][:], np.concatenate(ts))
    assert (7 in train["x"][:][..., 1]) == (halts == "keep")


def test_pipeline_run_leaves_out_windows_whose_label_reads_an_empty_ask_under_nan_fill(tmp_path):
    """`pipeline run` with ``source.nan: fill``: an empty best ask (LOBSTER's dummy price)
    is filled with 0, but no label reads it and no price feature is made of it: the
    windows whose return label starts or ends on such a row are left out, with a warning
    naming the column, so are those holding such a row (their mid_price is NaN, and
    ``features.nan: drop``), and the rest equal a pandas computation."""
    import pipeline
    from pipeline.config import parse_config
    from pipeline.job import run

    size, horizon = 4, 2
    path = write_halted_day(tmp_path, "AAPL", "2012-06-21", n=40, halt_at=30)
    lines = path.read_text().splitlines()
    empty = [12, 13, 20]
    for r in empty:  # the ask side empty: dummy price, size 0
        fields = lines[r].split(",")
        lines[r] = ",".join(["9999999999", "0", *fields[2:]])
    path.write_text("\n".join(lines) + "\n")
    config = parse_config({
        "cluster": {"n_workers": 1, "threads_per_worker": 1},
        "source": {"paths": str(path), "format": "lobster", "dtype": "float64", "nan": "fill", "halts": "keep"},
        "features": {"steps": ["mid_price"], "normalize": "none"},
        "windows": {"size": size, "stride": 1},
        "labels": {"kind": "return", "horizon": horizon},
        "output": {"path": str(tmp_path / "set.zarr")},
    })
    with pytest.warns(UserWarning, match=r"labels: 6 windows left out: their label reads ask_price_1 where it was "
                                         r"empty \(source.nan: fill\)"):
        run(config, log=None, progress=False)
    book, _, times, _ = pandas_day(path)
    mid = (book[:, 0] + book[:, 2]) / 2  # the rows kept never read an empty ask
    label_ok = [e for e in range(size - 1, len(mid) - horizon) if e not in empty and e + horizon not in empty]
    assert len(label_ok) == len(mid) - horizon - (size - 1) - 6  # ends 12, 13, 20 and 10, 11, 18
    ends = np.array([e for e in label_ok if not any(e - size < r <= e for r in empty)])
    assert len(ends) == len(label_ok) - 6  # and those holding row 12, 13 or 20: ends 14, 15, 16, 21, 22, 23
    train = pipeline.open(str(tmp_path / "set.zarr"))["train"]
    np.testing.assert_array_equal(train["x"][:][..., 0],
                                  np.stack([mid[e - size + 1: e + 1] for e in ends]).astype(np.float32))
    np.testing.assert_allclose(train["y"][:].ravel(), np.log(mid[ends + horizon]) - np.log(mid[ends]), rtol=1e-6)
    np.testing.assert_array_equal(train["t"][:], times[ends])


def test_an_append_leaves_out_the_windows_a_build_leaves_out_under_nan_fill(tmp_path):
    """An append of a LOBSTER day with an empty best ask under ``source.nan: fill``
    equals a fresh build of both days: the new day's windows whose label reads the
    filled ask are left out there too."""
    import shutil

    import zarr

    from pipeline.config import parse_config
    from pipeline.job import run

    raw, all_raw = tmp_path / "raw", tmp_path / "all"
    raw.mkdir()
    all_raw.mkdir()
    days = [write_halted_day(all_raw, "AAPL", date, n=40, seed=k, halt_at=30)
            for k, date in enumerate(("2012-06-21", "2012-06-22"))]
    lines = days[1].read_text().splitlines()
    for r in (12, 20):  # the second day's ask side empty there
        lines[r] = ",".join(["9999999999", "0", *lines[r].split(",")[2:]])
    days[1].write_text("\n".join(lines) + "\n")

    def config(paths, out: str):
        return parse_config({
            "cluster": {"n_workers": 1, "threads_per_worker": 1},
            "source": {"paths": str(paths / "*_orderbook_1.csv"), "format": "lobster", "dtype": "float64",
                       "nan": "fill", "sessions": "file"},
            "features": {"steps": ["mid_price"], "normalize": "none"},
            "windows": {"size": 4, "stride": 1},
            "labels": {"kind": "return", "horizon": 2},
            "output": {"path": str(tmp_path / out), "splits": {"train": {"until": "2012-06-22"}, "test": None}},
        })

    for name in (days[0].name, days[0].name.replace("_orderbook_", "_message_")):
        shutil.copy(all_raw / name, raw / name)
    run(config(raw, "appended.zarr"), log=None, progress=False)
    for name in (days[1].name, days[1].name.replace("_orderbook_", "_message_")):
        shutil.copy(all_raw / name, raw / name)
    with pytest.warns(UserWarning, match=r"labels: 4 windows left out: their label reads ask_price_1"):
        run(config(raw, "appended.zarr"), log=None, progress=False)
    with pytest.warns(UserWarning, match=r"labels: 4 windows left out"):
        run(config(all_raw, "fresh.zarr"), log=None, progress=False)
    appended, fresh = (zarr.open_group(str(tmp_path / n), mode="r") for n in ("appended.zarr", "fresh.zarr"))
    for split in ("train", "test"):
        for name in ("x", "y", "t"):
            np.testing.assert_array_equal(appended[f"{split}/{name}"][:], fresh[f"{split}/{name}"][:])
    # halts, horizon, history, labels reading an empty ask (ends 10, 12, 18, 20), windows
    # holding one (its mid_price NaN: ends 13-15, 21-23)
    assert fresh["test/x"].shape[0] == 40 - 3 - 2 - 3 - 4 - 6


def test_pairs_of_other_depths_are_told_to_read_the_levels_every_file_has(tmp_path):
    """A 1-level file beside 2-level ones: refused naming the columns it lacks, with the
    fix that applies to LOBSTER (source.rename does not: its names are built in)."""
    from pipeline.loaders.segments import open_segmented

    write_pair(tmp_path)
    one = "\n".join(",".join(line.split(",")[:4]) for line in BOOK.strip().splitlines()) + "\n"
    write_pair(tmp_path, book=one, name="MSFT_2012-06-21_34200000_57600000_{}_1.csv")
    with pytest.raises(LoaderError, match=r"MSFT_.*_orderbook_1.csv: the columns of instrument 'MSFT' differ .*"
                                          r"lacks column\(s\) 'ask_price_2'.*LOBSTER files of fewer levels hold "
                                          r"fewer columns: read the levels every file has"):
        open_segmented(str(tmp_path / "*_orderbook_*.csv"), format="lobster", nan="fill")
