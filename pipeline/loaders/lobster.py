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

The message file's other fields are columns too, decoded only when asked for by name
(``columns``, or a feature or label that reads them): they are not among the default
columns, so a table of LOBSTER files still has the book's ``4 * L`` columns unless one
of them is named. :data:`MESSAGE_COLUMNS`:

- ``event_type``: 1 new limit order, 2 partial cancellation, 3 deletion, 4 execution of
  a visible order, 5 execution of a hidden order, 6 cross trade, 7 trading halt;
- ``order_id``, ``event_size`` (shares), ``direction`` (-1 sell, 1 buy), as written;
- ``event_price``: dollars, as the book's prices; at a trading halt (type 7) LOBSTER's
  halt code as written (-1 halt, 0 quote, 1 resume), which is no price.

A trading halt's row repeats the book row before it: it is no book event. With
``halts="drop"`` (the default for LOBSTER; :func:`halts_option`) such rows are left out
of the table, its timestamps and instrument codes, found by one read of each message
file's type field when the source is opened (:func:`not_halted`); ``halts="keep"`` keeps
them.

Row counts come from newline counts of both files (one sequential read each); each pair
is one dask chunk.
"""

from __future__ import annotations

import datetime as _dt
import re
from typing import Any, Sequence

import numpy as np

from pipeline.errors import ConfigError, FormatMismatchError, InvalidValueError, LoaderError
from pipeline.loaders.tables import TEXT_PART_ROWS, TablePart, part_rows_of, row_place
from pipeline.loaders.textfiles import (count_lines, is_number, open_text, read_range, require_pyarrow, split_fields,
                                        text_ranges)

__all__ = ["ASK_DUMMY", "BID_DUMMY", "EVENT_TYPES", "EVERY_BOOK_COLUMN", "HALT", "MESSAGE_COLUMNS", "PRICE_SCALE",
           "book_columns",
           "halts_option", "message_path", "named_columns", "not_halted", "parse_name", "probe_lobster", "read_book",
           "read_timestamps"]

#: LOBSTER prices are dollars times this.
PRICE_SCALE = 10_000
#: The prices LOBSTER writes for an empty level.
ASK_DUMMY = 9_999_999_999
BID_DUMMY = -9_999_999_999

#: The message file's fields after the time, as columns, in the file's order.
MESSAGE_COLUMNS = ("event_type", "order_id", "event_size", "event_price", "direction")
#: In a ``read`` list: decode every book column beside the message columns it names
#: (``source.nan: drop`` drops a row by every book column, whichever a feature reads).
EVERY_BOOK_COLUMN = "*"
#: pyarrow's generated name of each message field (``f0`` is the time).
_MESSAGE_FIELDS = {name: f"f{i}" for i, name in enumerate(MESSAGE_COLUMNS, start=1)}
#: LOBSTER's event types: 1 to 7.
EVENT_TYPES = range(1, 8)
#: The event type of a trading halt message (its price field: -1 halt, 0 quote, 1 resume).
HALT = 7
#: The ``halts`` choices: leave type 7 rows out of the table, or keep them.
HALT_POLICIES = ("drop", "keep")

_NAME = re.compile(r"^(?P<ticker>.+?)_(?P<date>\d{4}-\d{2}-\d{2})_.*_orderbook_(?P<levels>\d+)\.csv(\.(gz|bz2|xz))?$")
_COLUMN = re.compile(r"^(ask|bid)_(price|size)_(\d+)$")


def book_columns(levels: int) -> list[str]:
    """The orderbook file's fields in order: ``ask_price_i, ask_size_i, bid_price_i, bid_size_i`` per level."""
    fields = ("ask_price", "ask_size", "bid_price", "bid_size")
    return [f"{field}_{i}" for i in range(1, levels + 1) for field in fields]


def _link(path: str) -> tuple[str, str]:
    """A chained URL's first link, the file itself (``zip://NAME.csv`` of
    ``zip://NAME.csv::/data/pair.zip``, LOBSTER's own sample downloads), and the rest of
    the chain (``::/data/pair.zip``; empty for a plain path)."""
    if "::" not in path:
        return path, ""
    inner, sep, rest = path.partition("::")
    return inner, sep + rest


def message_path(path: str) -> str:
    """The message file paired with orderbook file ``path`` (in the same archive, for a
    chained URL of an archive's member)."""
    path, chain = _link(path)
    head, sep, base = path.rpartition("/")
    if "_orderbook_" not in base:
        raise FormatMismatchError(
            path, "expected a LOBSTER orderbook file named TICKER_YYYY-MM-DD_START_END_orderbook_L.csv; with "
            "format: lobster the paths name the *_orderbook_*.csv files (their message files are found from them)")
    stem, _, tail = base.rpartition("_orderbook_")
    return f"{head}{sep}{stem}_message_{tail}{chain}"


def parse_name(path: str) -> tuple[str, _dt.date]:
    """The ticker and the date in an orderbook file's name."""
    base = _link(path)[0].rpartition("/")[2]
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
    _check_message_line(msg, split_fields(msg_first, msg))
    if msg_rows != rows:
        raise LoaderError(path, f"has {rows} rows but its message file {msg} has {msg_rows}; LOBSTER pairs hold "
                          "one message per orderbook row")
    cols = tuple(book_columns(len(fields) // 4)) + MESSAGE_COLUMNS
    day_ns = int(np.datetime64(day.isoformat(), "ns").astype(np.int64))
    # The message columns are read only when named: kept out of the default columns as
    # a Parquet file's text columns are, so that a LOBSTER table without `columns` is
    # still the book's 4 * L columns.
    common = dict(sources=cols, header=False, companion=msg, day_ns=day_ns, instrument=ticker,
                  non_numeric=MESSAGE_COLUMNS)
    if rows <= part_rows:
        return [TablePart(path, "lobster", 0, rows, cols, **common)]
    books, messages = text_ranges(0, starts, rows, part_rows), text_ranges(0, msg_starts, rows, part_rows)
    return [TablePart(path, "lobster", k, min(part_rows, rows - row0), cols, data=data, companion_data=m, row0=row0,
                      **common)
            for k, ((row0, data), (_, m)) in enumerate(zip(books, messages))]


def _check_message_line(msg: str, fields: Sequence[str]) -> None:
    """Refuse a message file whose first line is not LOBSTER's six numeric fields (time,
    event type, order id, size, price, direction), naming it: read as one, a file of
    another layout would give event types and prices from the wrong fields."""
    if not fields or not is_number(fields[0]):
        raise FormatMismatchError(msg, "expected a headerless LOBSTER message file whose first field is the time "
                                  "in seconds after midnight")
    if len(fields) < 1 + len(MESSAGE_COLUMNS) or not all(is_number(f) for f in fields[:1 + len(MESSAGE_COLUMNS)]):
        raise FormatMismatchError(msg, f"expected a LOBSTER message file of 6 numeric fields per line (time, event "
                                  f"type, order id, size, price, direction); its first line has {list(fields)[:8]}")


def halts_option(halts: str | None, fmt: str | None) -> str | None:
    """The trading-halt policy a source is read with (``source.halts``).

    Parameters
    ----------
    halts
        ``"drop"`` (type 7 rows left out), ``"keep"``, or ``None``: ``"drop"`` for LOBSTER.
    fmt
        The source's ``format``: halts are LOBSTER's messages, and LOBSTER is chosen by
        name only.

    Returns
    -------
    str or None
        ``"drop"`` or ``"keep"`` for LOBSTER, ``None`` for other formats.

    Raises
    ------
    ConfigError
        For another value, or a value given for a format other than ``lobster`` (it
        would change nothing, and leave its author believing it did).
    """
    if halts is not None and halts not in HALT_POLICIES:
        raise ConfigError("source.halts", "drop or keep (LOBSTER's trading-halt rows, event type 7), or null", halts)
    if fmt != "lobster":
        if halts is not None:
            given = f"format {fmt!r}" if fmt else "a format chosen by suffix"
            raise ConfigError("source.halts", f"null for {given}: halts are the trading-halt messages (event type 7) "
                              "of LOBSTER files, read with format: lobster", halts)
        return None
    return halts or "drop"


def named_columns(part: TablePart, read: Sequence[str] | None) -> tuple[str, ...] | None:
    """The columns a LOBSTER table is checked for when none are given: the book's, and
    the message columns ``read`` names (those a build's features and label read);
    ``None`` (the default columns, the book's) when ``read`` names none."""
    wanted = set(read or ())
    extra = tuple(c for c in part.columns if part.source_of(c) in MESSAGE_COLUMNS and c in wanted)
    if not extra:
        return None
    # With EVERY_BOOK_COLUMN in ``read`` (``nan: drop``, which judges a row by every
    # book column), ``tables.project_columns`` decodes all of these: it names none.
    return tuple(c for c in part.columns if part.source_of(c) not in MESSAGE_COLUMNS) + extra


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
    """``(rows, len(sources))`` float64 of the book's and the message's columns (each
    file read only for the columns it holds): prices in dollars, sizes; NaN at empty
    levels; message fields as :func:`read_messages` gives them."""
    out = np.empty((part.rows, len(sources)), dtype=np.float64)
    book = [j for j, s in enumerate(sources) if s not in _MESSAGE_FIELDS]
    if book:
        out[:, book] = _book_values(part, [sources[j] for j in book], so)
    message = [j for j, s in enumerate(sources) if s in _MESSAGE_FIELDS]
    if message:
        values = read_messages(part, [sources[j] for j in message], so)
        for j in message:
            out[:, j] = values[sources[j]]
    return out


def _book_values(part: TablePart, sources: Sequence[str], so: dict) -> np.ndarray:
    """``(rows, len(sources))`` float64 of orderbook columns: prices in dollars, sizes;
    NaN at empty levels."""
    pa = require_pyarrow()

    fields = [_COLUMN.match(s) for s in sources]
    # A size is NaN where its level's price is the dummy, so that price is read too.
    prices = sorted({f"{m.group(1)}_price_{m.group(3)}" for m in fields})
    include = sorted(set(sources) | set(prices))
    book = [c for c in part.sources if c not in _MESSAGE_FIELDS]
    table = _read_csv(part.path, book, include, {c: pa.int64() for c in include}, part.rows, so, part.data)
    raw = {c: table.column(c).to_numpy() for c in include}
    out = np.empty((part.rows, len(sources)), dtype=np.float64)
    for j, (name, m) in enumerate(zip(sources, fields)):
        side, kind, level = m.groups()
        empty = raw[f"{side}_price_{level}"] == (ASK_DUMMY if side == "ask" else BID_DUMMY)
        values = raw[name] / PRICE_SCALE if kind == "price" else raw[name].astype(np.float64)
        out[:, j] = np.where(empty, np.nan, values)
    return out


def read_messages(part: TablePart, names: Sequence[str], so: dict) -> dict[str, np.ndarray]:
    """Message columns ``names`` (of :data:`MESSAGE_COLUMNS`) of a part, float64 by name:
    ``event_price`` in dollars but at trading halts (type 7), where it is the halt code
    as written (-1 halt, 0 quote, 1 resume); the other fields as written.

    Raises
    ------
    LoaderError
        For a field that is not an integer, or an event type outside 1 to 7, naming the
        message file and the line.
    """
    fields = sorted({_MESSAGE_FIELDS[n] for n in names} | {"f1"})  # the type tells halts' codes from prices
    raw = _message_fields(part, fields, so)
    types = raw["f1"]
    out = {}
    for name in names:
        values = raw[_MESSAGE_FIELDS[name]]
        out[name] = np.where(types == HALT, values, values / PRICE_SCALE) if name == "event_price" else \
            values.astype(np.float64)
    return out


def not_halted(part: TablePart, so: dict) -> np.ndarray:
    """``(rows,)`` bool: the rows of a part whose message is not a trading halt (event
    type 7), the rows ``halts="drop"`` keeps; the message file's type field alone is
    converted."""
    return _message_fields(part, ["f1"], so)["f1"] != HALT


def _message_fields(part: TablePart, fields: Sequence[str], so: dict) -> dict[str, np.ndarray]:
    """Integer fields of a part's message file by pyarrow's names (``f1`` the event type,
    which is checked to be 1 to 7), as int64."""
    pa = require_pyarrow()

    table = _read_csv(part.companion, None, list(fields), {f: pa.int64() for f in fields}, part.rows, so,
                      part.companion_data)
    out = {}
    for f in fields:
        col = table.column(f)
        if col.null_count:
            row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            what = MESSAGE_COLUMNS[int(f[1:]) - 1]
            raise LoaderError(part.companion, f"expected an integer {what} (field {f[1:]}) at "
                              f"{row_place(part, row)}, found an empty field")
        out[f] = col.to_numpy()
    if "f1" in out:
        _check_event_types(part, out["f1"])
    return out


def _check_event_types(part: TablePart, types: np.ndarray) -> None:
    """Refuse an event type outside LOBSTER's 1 to 7, naming the message file and line:
    fields in another order (another vendor's messages) would be read as the wrong ones."""
    bad = np.flatnonzero((types < EVENT_TYPES.start) | (types >= EVENT_TYPES.stop))
    if bad.size:
        row = int(bad[0])
        raise InvalidValueError(part.companion, f"expected an event type 1 to 7 (field 2 of a LOBSTER message) at "
                                f"{row_place(part, row)}, found {int(types[row])}")


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
