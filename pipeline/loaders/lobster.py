"""LOBSTER order books: headerless orderbook/message CSV pairs, one per instrument and day.

LOBSTER (lobsterdata.com) delivers each instrument-day as two files of equal row count,
named ``TICKER_YYYY-MM-DD_START_END_orderbook_L.csv`` and ``..._message_L.csv`` (START and
END in milliseconds after midnight):

- the orderbook file has one row per event and ``4 * L`` integer fields, for level
  ``i = 1..L``: ask price, ask size, bid price, bid size. Prices are dollars times
  10000. An empty level holds the dummy price ``+9999999999`` (ask) or
  ``-9999999999`` (bid) and size 0;
- the message file has the event that led to that row: time (seconds after midnight,
  with decimals down to nanoseconds), event type, order id, size, price, direction.

With ``format="lobster"`` the ``paths`` name the orderbook files; each finds its message
file by replacing ``_orderbook_`` with ``_message_`` in its name. The loaded table has
the columns ``ask_price_1, ask_size_1, bid_price_1, bid_size_1, ..., bid_size_L`` (the
same names as the demo data and the features use), ``L`` from the field count:

- prices are divided by 10000 (dollars);
- an empty level is NaN in both its price and its size: the level has no quote, and a
  size of 0 beside a missing price is no observation either. The ``nan`` policy then
  applies as to any table: ``raise`` names the file, column and row, ``drop`` drops the
  row, ``fill`` puts ``fill_value`` in both (``fill_value=0`` gives back LOBSTER's sizes);
- the timestamps are the date in the file name plus the message time, as int64
  nanoseconds since the epoch. They are exchange wall-clock times (New York for
  NASDAQ), written as if they were UTC: no time zone is converted;
- the instrument of every row is the ticker in the file name.

Row counts come from newline counts of both files (one sequential read each); each pair
is one dask chunk.
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any, Sequence

import numpy as np

from pipeline.errors import FormatMismatchError, LoaderError
from pipeline.loaders.tables import TEXT_PART_ROWS, TablePart, part_rows_of, row_place
from pipeline.loaders.textfiles import (count_lines, is_number, open_text, read_range, require_pyarrow, split_fields,
                                        text_ranges)

__all__ = ["ASK_DUMMY", "BID_DUMMY", "PRICE_SCALE", "book_columns", "message_path", "parse_name",
           "probe_lobster", "read_book", "read_timestamps"]

#: LOBSTER prices are dollars times this.
PRICE_SCALE = 10_000
#: The prices LOBSTER writes for an empty level.
ASK_DUMMY = 9_999_999_999
BID_DUMMY = -9_999_999_999

_NAME = re.compile(r"^(?P<ticker>.+?)_(?P<date>\d{4}-\d{2}-\d{2})_.*_orderbook_(?P<levels>\d+)\.csv(\.(gz|bz2|xz))?$")
_COLUMN = re.compile(r"^(ask|bid)_(price|size)_(\d+)$")


def book_columns(levels: int) -> list[str]:
    """The orderbook file's fields in order: ``ask_price_i, ask_size_i, bid_price_i, bid_size_i`` per level."""
    fields = ("ask_price", "ask_size", "bid_price", "bid_size")
    return [f"{field}_{i}" for i in range(1, levels + 1) for field in fields]


def message_path(path: str) -> str:
    """The message file paired with orderbook file ``path``."""
    head, sep, base = path.rpartition("/")
    if "_orderbook_" not in base:
        raise FormatMismatchError(
            path, "expected a LOBSTER orderbook file named TICKER_YYYY-MM-DD_START_END_orderbook_L.csv; with "
            "format: lobster the paths name the *_orderbook_*.csv files (their message files are found from them)")
    stem, _, tail = base.rpartition("_orderbook_")
    return f"{head}{sep}{stem}_message_{tail}"


def parse_name(path: str) -> tuple[str, _dt.date]:
    """The ticker and the date in an orderbook file's name."""
    base = path.rpartition("/")[2]
    message_path(path)  # refuses names without _orderbook_
    m = _NAME.match(base)
    if m is None:
        raise FormatMismatchError(
            path, "expected a LOBSTER file name with the ticker and the date, TICKER_YYYY-MM-DD_START_END_"
            "orderbook_L.csv: the timestamps are the date in the name plus the message file's times")
    try:
        day = _dt.date.fromisoformat(m.group("date"))
    except ValueError:
        raise FormatMismatchError(
            path, f"the date {m.group('date')!r} in the file name is not a calendar date") from None
    return m.group("ticker"), day


def probe_lobster(path: str, so: dict, part_rows: int = TEXT_PART_ROWS) -> list[TablePart]:
    """The parts of an orderbook/message pair (one, or the same lines of both files per
    ``part_rows`` rows): levels from the field count, rows from both files' newline
    counts (which must agree)."""
    ticker, day = parse_name(path)
    msg = message_path(path)
    # Both files in the same parts: one part when either is compressed.
    part_rows = min(part_rows_of(path, part_rows), part_rows_of(msg, part_rows))
    first, rows, starts, _ = count_lines(path, so, every=part_rows)
    fields = split_fields(first, path)
    if not first.strip():
        raise FormatMismatchError(path, "expected LOBSTER orderbook rows, found an empty file")
    if not all(is_number(f) for f in fields):
        raise FormatMismatchError(
            path, f"expected a headerless LOBSTER orderbook file of integers; its first line has non-numeric "
            f"fields {[f for f in fields if not is_number(f)][:4]}")
    if len(fields) % 4:
        raise FormatMismatchError(
            path, f"has {len(fields)} fields per line; a LOBSTER orderbook has 4 per level (ask price, ask size, "
            "bid price, bid size)")
    try:
        msg_first, msg_rows, msg_starts, _ = count_lines(msg, so, every=part_rows)
    except LoaderError as exc:
        raise LoaderError(path, f"its message file {msg} cannot be read ({exc.problem}); LOBSTER pairs each "
                          "*_orderbook_* file with a *_message_* file of the same name") from None
    if not is_number(split_fields(msg_first, msg)[0]):
        raise FormatMismatchError(msg, "expected a headerless LOBSTER message file whose first field is the time "
                                  "in seconds after midnight")
    if msg_rows != rows:
        raise LoaderError(path, f"has {rows} rows but its message file {msg} has {msg_rows}; LOBSTER pairs hold "
                          "one message per orderbook row")
    cols = tuple(book_columns(len(fields) // 4))
    day_ns = int(np.datetime64(day.isoformat(), "ns").astype(np.int64))
    if rows <= part_rows:
        return [TablePart(path, "lobster", 0, rows, cols, sources=cols, header=False, companion=msg, day_ns=day_ns,
                          instrument=ticker)]
    books, messages = text_ranges(0, starts, rows, part_rows), text_ranges(0, msg_starts, rows, part_rows)
    return [TablePart(path, "lobster", k, min(part_rows, rows - row0), cols, sources=cols, header=False,
                      companion=msg, day_ns=day_ns, instrument=ticker, data=data, companion_data=m, row0=row0)
            for k, ((row0, data), (_, m)) in enumerate(zip(books, messages))]


def _read_csv(path: str, names: list[str] | None, include: list[str], types: dict, rows: int,
              so: dict, data: tuple[int, int | None] | None = None) -> Any:
    pa = require_pyarrow()
    import pyarrow.csv as pacsv

    read = pacsv.ReadOptions(column_names=names) if names else pacsv.ReadOptions(autogenerate_column_names=True)
    try:
        with open_text(path, so) as fh:
            table = pacsv.read_csv(fh if data is None else read_range(fh, data), read_options=read,
                                   convert_options=pacsv.ConvertOptions(include_columns=include, column_types=types))
    except (OSError, pa.ArrowException) as exc:
        raise LoaderError(path, f"cannot read LOBSTER data ({exc})") from None
    if table.num_rows != rows:
        raise LoaderError(path, f"expected {rows} rows (counted when the source was opened), read {table.num_rows}")
    return table


def read_book(part: TablePart, sources: Sequence[str], so: dict) -> np.ndarray:
    """``(rows, len(sources))`` float64: prices in dollars, sizes; NaN at empty levels."""
    pa = require_pyarrow()

    fields = [_COLUMN.match(s) for s in sources]
    # A size is NaN where its level's price is the dummy, so that price is read too.
    prices = sorted({f"{m.group(1)}_price_{m.group(3)}" for m in fields})
    include = sorted(set(sources) | set(prices))
    table = _read_csv(part.path, list(part.sources), include, {c: pa.int64() for c in include}, part.rows, so,
                      part.data)
    raw = {c: table.column(c).to_numpy() for c in include}
    out = np.empty((part.rows, len(sources)), dtype=np.float64)
    for j, (name, m) in enumerate(zip(sources, fields)):
        side, kind, level = m.groups()
        empty = raw[f"{side}_price_{level}"] == (ASK_DUMMY if side == "ask" else BID_DUMMY)
        values = raw[name] / PRICE_SCALE if kind == "price" else raw[name].astype(np.float64)
        out[:, j] = np.where(empty, np.nan, values)
    return out


def read_timestamps(part: TablePart, so: dict) -> np.ndarray:
    """``(rows,)`` int64 nanoseconds since the epoch: the file's date plus the message times."""
    pa = require_pyarrow()

    table = _read_csv(part.companion, None, ["f0"], {"f0": pa.float64()}, part.rows, so, part.companion_data)
    seconds = table.column("f0").to_numpy()
    if not np.isfinite(seconds).all():
        row = int(np.flatnonzero(~np.isfinite(seconds))[0])
        raise LoaderError(part.companion,
                          f"expected a time in seconds after midnight at {row_place(part, row)}, found {seconds[row]}")
    # Parsing is correctly rounded, so a time within a day (below 2**17 s) is within
    # 2**-37 s (0.007 ns) of its decimal text, and the product with 1e9 adds at most as
    # much again: rint gives the exact nanosecond for up to 9 decimals, where truncation
    # (astype) loses one whenever the product lands just below it (34200.000000001).
    return part.day_ns + np.rint(seconds * 1e9).astype(np.int64)
