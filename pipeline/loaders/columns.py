"""Per-row side arrays of a table: timestamps and instrument codes.

Each is its own blockwise layer over the same parts as the values (so its chunks equal
the values' chunks), reading one column per part: cheap in Parquet, a single converted
column in CSV. Under ``nan="drop"`` the values' kept rows are applied to them with the
same per-block mask, so row ``i`` of every array describes the same snapshot.

Timestamps become int64 nanoseconds since the epoch: timestamp and date types are cast
(an aware one keeps its UTC instant), strings are parsed as ISO-8601, integers are taken
as nanoseconds and floats as seconds since the epoch, unless ``timestamp_unit`` names
their unit (``s``, ``ms``, ``us``, ``ns``). Without it, a numeric column whose first value
is no date of an order book (1990-2100) in the default unit but is one in another
(integer epoch milliseconds, the most common feed format, read as nanoseconds fall in
January 1970) is refused with the unit to set, rather than read as the wrong times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize

from pipeline.errors import LoaderError
from pipeline.loaders.tables import (
    TablePart,
    part_specs,
    parts_array,
    read_columns,
    row_place,
)
from pipeline.loaders.timeorder import DAY_NS, repeated_hour_advice

__all__ = ["TIMESTAMP_UNITS", "RowDates", "check_day_unit", "dated_parts", "dates_to_ns", "drop_rows",
           "instrument_array", "instrument_names", "keep_mask", "row_dates", "timestamp_array", "to_ns"]

#: Nanoseconds per unit of numeric timestamps (``source.timestamp_unit``).
TIMESTAMP_UNITS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
#: Epoch nanoseconds of the dates an order book can have: 1990-01-01 to 2100-01-01. Only
#: used to tell the units apart: their ranges do not overlap (epoch seconds of those
#: dates are about 6e8 to 4e9, milliseconds 6e11 to 4e12, and so on).
_PLAUSIBLE_NS = (631_152_000 * 10**9, 4_102_444_800 * 10**9)
#: One day in microseconds. Integer times of day all below it, read as nanoseconds (their
#: default), would put a whole file in the first 86.4 s after midnight: no trading day
#: is that short, so they are taken for another unit and refused, naming it.
_DAY_US = 86_400 * 10**6


def _first_null(col: Any) -> int:
    import pyarrow.compute as pc

    return int(np.flatnonzero(pc.is_null(col).to_numpy(zero_copy_only=False))[0])


def _at_row(i: int) -> str:
    return f"row {i}"


def _check_unit(first: float, default: str, path: str, name: str, *, given: bool = False) -> None:
    """Refuse a numeric timestamp column read in its ``default`` unit when its first value
    is then no plausible date but is one in another unit, naming that unit. ``given``:
    the unit is ``source.timestamp_unit``'s, which holds for every file, so the file is
    one of another unit among them (a vendor's switch: Binance's spot files went from
    milliseconds to microseconds on 2025-01-01, and read in ms they are in 1970)."""
    lo, hi = _PLAUSIBLE_NS
    ns = first * TIMESTAMP_UNITS[default]
    if lo <= ns < hi:
        return
    # Shown to the second: enough to see which reading is a date.
    as_default = str(np.datetime64(int(ns // 10**9), "s")) if abs(ns) < 9.2e18 else "past the year 2262"
    for unit, per in TIMESTAMP_UNITS.items():
        if unit != default and lo <= first * per < hi:
            date = np.datetime64(int(first * per // 10**9), "s")
            if given:
                raise LoaderError(path, f"timestamp column {name!r}: its first value {first:.17g} read as "
                                  f"{default} (source.timestamp_unit) is {as_default}, but as epoch {unit} it is "
                                  f"{date}: this file's times are in {unit}; one timestamp_unit holds for every "
                                  f"file, so convert the files of the other unit first (or build them separately)")
            kind = "integers as nanoseconds" if default == "ns" else "floats as seconds"
            raise LoaderError(path, f"timestamp column {name!r}: its first value {first:.17g} read as {default} "
                              f"(numeric timestamps default to {kind}) is {as_default}, but as epoch {unit} it is "
                              f"{date}: set source.timestamp_unit: {unit} (timestamp_unit={unit!r} in pipeline.load)")


def _ns_digits(unit: str | None) -> int:
    """Decimal digits of a nanosecond in ``unit`` (default seconds): 9, 6, 3 or 0."""
    return len(str(TIMESTAMP_UNITS[unit or "s"])) - 1


def _decimal_ns(col: Any, path: str, name: str, unit: str | None) -> np.ndarray:
    """Decimal numbers of ``unit`` (default seconds) since the epoch as int64
    nanoseconds, exactly as written: ``1772721000.001000`` s is 14:30:00.001 (through a
    float64 it was 14:30:00.000999928; a float of today's epoch seconds resolves about
    0.2 microseconds). A CSV's decimal times are read so (:func:`_decimal_times`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if unit is None and len(arr):
        # Before the range check: epoch ms written as floats (1709562600000.0, as pandas
        # writes integers with a gap) read as seconds are past int64 ns, and the unit
        # that makes them a date is the advice, as for integers (to_ns).
        _check_unit(float(arr[0].as_py()), "s", path, name)
    # Scaled to nanoseconds, a decimal's 128-bit integer is the time in ns (exact, or
    # refused by the cast: a digit past the nanosecond).
    arr = pc.cast(arr, pa.decimal128(38, _ns_digits(unit)))
    words = np.frombuffer(arr.buffers()[1], dtype=np.int64, count=2 * (arr.offset + len(arr)))[2 * arr.offset:]
    low, high = words[0::2], words[1::2]
    if not (high == (low >> 63)).all():
        raise LoaderError(path, f"timestamp column {name!r}: a time past what int64 nanoseconds hold (the year 2262)")
    return low.copy()


def _float_ns(col: Any, path: str, name: str, unit: str | None, where: Callable[[int], str]) -> np.ndarray:
    """Floats of ``unit`` (default seconds) since the epoch as int64 nanoseconds, each the
    nanosecond nearest its value."""
    values = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
    if not np.isfinite(values).all():
        raise LoaderError(path, f"timestamp column {name!r}: NaN or inf at "
                          f"{where(int(np.flatnonzero(~np.isfinite(values))[0]))}")
    if unit is None and values.size:
        _check_unit(float(values[0]), "s", path, name)
    # seconds * 1e9 would round to 256 ns at today's epoch seconds: scale only the
    # fraction (exact: v - floor(v) loses nothing), so each float becomes the
    # nanosecond nearest its exact value.
    per = TIMESTAMP_UNITS[unit or "s"]
    whole = np.floor(values)
    return whole.astype(np.int64) * per + np.rint((values - whole) * per).astype(np.int64)


#: An ISO time's UTC offset at its end (``Z``, ``-05:00``, ``+0100``).
_OFFSET = r"(Z|[+-]\d{2}:?\d{2})$"


def _unreadable_time(col: Any, path: str, name: str, where: Callable[[int], str]) -> LoaderError:
    """The error for a column of strings that are not all ISO-8601 times of one kind:
    the first value without the UTC offset the first value has (or with one it lacks),
    else the first value that is no time (a search over prefixes, each cast whole), with
    its line. pyarrow's own message quoted the last value it tried and told to call its
    ``assume_timezone``, which no option here does."""
    import pyarrow as pa
    import pyarrow.compute as pc

    offsets = pc.match_substring_regex(col, _OFFSET).to_numpy(zero_copy_only=False)
    if offsets.size and not (offsets == offsets[0]).all():
        i = int(np.flatnonzero(offsets != offsets[0])[0])
        has = "has no UTC offset, where" if offsets[0] else "has a UTC offset, where"
        return LoaderError(path, f"timestamp column {name!r}: {where(i)} {str(col[i].as_py())[:40]!r} {has} "
                           f"{where(0)} {str(col[0].as_py())[:40]!r} {'has' if offsets[0] else 'has none'}: a "
                           "column's times are either all UTC instants (each with its offset, or Z) or all "
                           "wall-clock times (none)")
    target = pa.timestamp("ns", tz="UTC") if offsets.size and offsets[0] else pa.timestamp("ns")
    lo, hi = 0, len(col)  # the first bad value lies in [lo, hi): col[:lo] casts
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            pc.cast(col.slice(0, mid), target)
            lo = mid
        except pa.ArrowInvalid:
            hi = mid
    i = lo if hi - lo == 1 else 0
    return LoaderError(path, f"timestamp column {name!r}: {where(i)} {str(col[i].as_py())[:40]!r} is no time: expected "
                       "ISO-8601 text, such as 2026-03-05T14:30:00.123456 (a wall-clock time) or "
                       "2026-03-05T09:30:00-05:00 (with its UTC offset, or Z); a zone's name (EST) is not read")


def to_ns(col: Any, path: str, name: str, unit: str | None = None, where: Callable[[int], str] = _at_row,
          *, epoch: bool = True) -> np.ndarray:
    """A pyarrow column as int64 nanoseconds since the epoch.

    Timestamp and date types are cast to nanoseconds (time-zone-aware ones keep their
    UTC instant); strings are parsed as ISO-8601 (with or without a UTC offset, one
    kind per column); integers and floats are counts of ``unit`` since the epoch
    (``s``, ``ms``, ``us``, ``ns``), by default integers nanoseconds and floats seconds.
    A float becomes the nanosecond nearest its value (a float64 of today's epoch
    seconds resolves about 0.2 microseconds); a decimal (a CSV's ``1772721000.001000``,
    read so: :func:`_decimal_times`) becomes the instant it writes. Without ``unit``, a
    first value that is
    a date of an order book only in another unit is refused, naming that unit; so is one
    with ``unit`` given, for times since the epoch (``epoch``; not times of day).
    ``where(i)`` says where row ``i`` is in an error (a file's line: :func:`row_place`).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if col.null_count:
        raise LoaderError(path, f"timestamp column {name!r}: missing value at {where(_first_null(col))}")
    t = col.type
    if unit is not None and epoch and len(col) and (
            pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)):
        _check_unit(float(col[0].as_py()), unit, path, name, given=True)
    try:
        if pa.types.is_timestamp(t):
            ns = pc.cast(col, pa.timestamp("ns", tz=t.tz))
        elif pa.types.is_date(t):
            ns = pc.cast(col, pa.timestamp("ns"))
        elif pa.types.is_decimal(t):
            return _decimal_ns(col, path, name, unit)
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            try:
                ns = pc.cast(col, pa.timestamp("ns"))
            except pa.ArrowInvalid:  # strings with a UTC offset ("Z", "+01:00") parse only as aware
                try:
                    ns = pc.cast(col, pa.timestamp("ns", tz="UTC"))
                except pa.ArrowInvalid:
                    raise _unreadable_time(col, path, name, where) from None
        elif pa.types.is_integer(t):
            ints = pc.cast(col, pa.int64()).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
            if unit is None and ints.size:
                _check_unit(float(ints[0]), "ns", path, name)
            per = TIMESTAMP_UNITS[unit or "ns"]
            if per > 1 and ints.size and int(np.abs(ints).max()) > np.iinfo(np.int64).max // per:
                raise LoaderError(path, f"timestamp column {name!r}: {int(np.abs(ints).max())} {unit} is past what "
                                  "int64 nanoseconds hold (the year 2262)")
            return ints if per == 1 else ints * per
        elif pa.types.is_floating(t):
            return _float_ns(col, path, name, unit, where)
        else:
            raise LoaderError(path, f"timestamp column {name!r}: expected a timestamp, ISO-8601 strings, or "
                              f"integers or floats since the epoch, got {t}")
    except pa.ArrowException as exc:
        raise LoaderError(path, f"timestamp column {name!r}: cannot read {t} values as times ({exc})") from None
    return pc.cast(ns, pa.int64()).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def check_day_unit(largest: Any, path: str, name: str) -> None:
    """Refuse integer times of day read as nanoseconds (no ``source.timestamp_unit``)
    whose ``largest`` value is below one day in microseconds: a file's whole day would
    fit in its first 86.4 s. Names the unit the value's range suggests (below 86,400:
    seconds; below 86,400,000: milliseconds; else microseconds) and what it is then."""
    if isinstance(largest, bool) or not isinstance(largest, (int, np.integer)) or not 0 < int(largest) < _DAY_US:
        return
    largest = int(largest)
    unit = "s" if largest < 86_400 else "ms" if largest < 86_400_000 else "us"
    clock = str(np.datetime64(largest * TIMESTAMP_UNITS[unit], "ns"))[11:]
    raise LoaderError(path, f"timestamp column {name!r}: times of day up to {largest}, read as nanoseconds since "
                      f"midnight (integers default to ns, as NASDAQ ITCH's), would put the file's whole day in its first "
                      f"{largest / 1e9:.3g} s; as {unit} since midnight the last is {clock}: set "
                      f"source.timestamp_unit: {unit} (timestamp_unit={unit!r} in pipeline.load), or ns to keep ns")


def times_of_day_to_ns(col: Any, path: str, name: str, unit: str | None = None,
                       where: Callable[[int], str] = _at_row, check_unit: bool = True) -> np.ndarray:
    """A pyarrow column of times of day as int64 nanoseconds since midnight.

    Time types (Parquet's ``time32``/``time64``) are cast; strings are ``HH:MM:SS``
    (or ``H:MM:SS``) with any fraction; integers are counts of ``unit`` since midnight
    (default nanoseconds, NASDAQ ITCH's), floats of ``unit`` (default seconds). Without
    ``unit``, integers all below one day in microseconds are refused, naming the unit
    they look like (:func:`check_day_unit`; ``check_unit=False`` leaves that to a check
    over the whole file). A value outside the day (negative, or 24:00 and after) is
    refused, naming its row: a whole time there would be read as a time of day, its
    date added twice.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    t = col.type
    if col.null_count:
        raise LoaderError(path, f"timestamp column {name!r}: missing value at {where(_first_null(col))}")
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        raise LoaderError(path, f"timestamp column {name!r} is {t}, a time with its date: source.date is for "
                          "columns of times of day; leave source.date unset")
    try:
        if pa.types.is_time(t):
            ns = pc.cast(pc.cast(col, pa.time64("ns")), pa.int64()).to_numpy(zero_copy_only=False)
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            # A single-digit hour (9:30:00.5, as many feeds and pandas' to_timedelta write
            # it) padded: ISO parsing wants two digits.
            padded = pc.replace_substring_regex(pc.cast(col, pa.string()), pattern=r"^(\d):", replacement=r"0\1:")
            stamped = pc.binary_join_element_wise("1970-01-01T", padded, "")
            ns = pc.cast(pc.cast(stamped, pa.timestamp("ns")), pa.int64()).to_numpy(zero_copy_only=False)
        elif pa.types.is_integer(t) or pa.types.is_floating(t):
            if unit is None and check_unit and pa.types.is_integer(t) and len(col):
                check_day_unit(pc.max(col).as_py(), path, name)
            ns = to_ns(col, path, name, unit or ("ns" if pa.types.is_integer(t) else "s"), where, epoch=False)
        else:
            raise LoaderError(path, f"timestamp column {name!r}: expected times of day (a time type, HH:MM:SS "
                              f"strings, or numbers since midnight), got {t}")
    except pa.ArrowException as exc:
        raise LoaderError(path, f"timestamp column {name!r}: cannot read {t} values as times of day (expected "
                          f"HH:MM:SS with any fraction; {exc})") from None
    ns = np.asarray(ns, dtype=np.int64)
    out = np.flatnonzero((ns < 0) | (ns >= DAY_NS))
    if out.size:
        r = int(out[0])
        raise LoaderError(path, f"timestamp column {name!r}: {where(r)} holds {col[r].as_py()!r}, "
                          f"{ns[r] / 1e9:.9g} s from midnight, outside one day; source.date reads the column as "
                          f"times of day{'' if unit else ' (set source.timestamp_unit if this is another unit)'}")
    return ns


def footer_time_of_day(value: Any, unit: str | None) -> int | None:
    """A Parquet footer's bound of a times-of-day column in ns since midnight, or
    ``None`` when it is none (or outside the day: the rows' own check names it)."""
    import datetime as _dt

    if isinstance(value, _dt.time):
        ns = ((value.hour * 60 + value.minute) * 60 + value.second) * 10**9 + value.microsecond * 1000
    elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        ns = int(value) * TIMESTAMP_UNITS[unit or "ns"]
    elif isinstance(value, (float, np.floating)) and np.isfinite(value):
        ns = int(round(float(value) * TIMESTAMP_UNITS[unit or "s"]))
    else:
        return None
    return ns if 0 <= ns < DAY_NS else None


def dates_to_ns(col: Any, path: str, name: str, fmt: str | None = None,
                where: Callable[[int], str] = _at_row) -> np.ndarray:
    """A pyarrow column of dates as int64 nanoseconds since the epoch of each row's
    midnight (naive, as :meth:`~pipeline.features.sessions.DateSpec.day_ns` gives a
    path's date).

    Date types are cast, as are naive timestamp types at midnight (pandas writes dates
    so); text and integers (``20231228``) are parsed with the ``strptime`` format
    ``fmt``, by default ``YYYY-MM-DD`` or ``YYYYMMDD`` (each value by whichever parses).

    Raises
    ------
    LoaderError
        Naming the file, the column and the row (``where(i)``: a file's line) of a
        missing value, of a value that is no date in the format, or of a time that is
        not midnight; and a column of another type.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.features.sessions import DATE_FORMATS

    if col.null_count:
        raise LoaderError(path, f"date column {name!r}: missing value at {where(_first_null(col))}; "
                          "source.date: {column: ...} dates every row by it")
    t = col.type
    if pa.types.is_date(t) or (pa.types.is_timestamp(t) and not t.tz):
        ns = pc.cast(pc.cast(col, pa.timestamp("ns")), pa.int64()).to_numpy(zero_copy_only=False)
    elif pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
        text = pc.cast(col, pa.string())
        parsed = None
        for f in (fmt,) if fmt else DATE_FORMATS:
            # Each value by the first format that reads it: YYYY-MM-DD and YYYYMMDD
            # never both read one text, so the order decides nothing.
            one = pc.strptime(text, format=f, unit="s", error_is_null=True)
            parsed = one if parsed is None else pc.coalesce(parsed, one)
        if parsed.null_count:
            r = _first_null(parsed)
            shown = repr(fmt) if fmt else "YYYY-MM-DD or YYYYMMDD (set source.date.format)"
            raise LoaderError(path, f"date column {name!r}: {where(r)} holds {col[r].as_py()!r}, not a date in the "
                              f"format {shown}")
        ns = pc.cast(pc.cast(parsed, pa.timestamp("ns")), pa.int64()).to_numpy(zero_copy_only=False)
    else:
        raise LoaderError(path, f"date column {name!r}: expected dates (a date type, text or YYYYMMDD integers), "
                          f"got {t}")
    ns = np.asarray(ns, dtype=np.int64)
    # A time of day in the date column would be added to the timestamp's own: twice.
    timed = np.flatnonzero(ns % DAY_NS)
    if timed.size:
        r = int(timed[0])
        raise LoaderError(path, f"date column {name!r}: {where(r)} holds {col[r].as_py()!r}, a time past midnight; "
                          "expected a date only (each row's time of day is the timestamp column's)")
    return ns


@dataclass(frozen=True, slots=True)
class RowDates:
    """How the rows of parts are dated from a column (``source.date: {column: NAME}``).

    Attributes
    ----------
    column
        The column of dates.
    format
        Its ``strptime`` format, or ``None`` (see :func:`dates_to_ns`).
    checked
        Files whose times-of-day unit their Parquet footers checked (:func:`dated_parts`):
        their row groups are not checked again one by one, as one holding only the
        first minutes after midnight would look like another unit.
    """

    column: str
    format: str | None = None
    checked: frozenset[str] = frozenset()


def row_dates(parts: Sequence[TablePart], spec: Any) -> RowDates | None:
    """The :class:`RowDates` of a ``source.date`` ``spec`` that names a column (``None``
    for a path's date), from the parts before :func:`dated_parts`."""
    if getattr(spec, "column", None) is None:
        return None
    return RowDates(spec.column, spec.format, frozenset(_files_largest(parts)))


def dated_parts(parts: Sequence[TablePart], spec: Any, timestamp: str | None, unit: str | None
                ) -> list[TablePart]:
    """Parts whose timestamp column holds times of day, each given the date of its
    file's path (``spec``, a :class:`~pipeline.features.sessions.DateSpec`) and its
    footer bounds as whole times, so that files are ordered and sessions dated.

    With ``spec.column`` each row is dated by that column as it is read (:class:`RowDates`):
    the parts get no date and no footer bounds (those of times of day bound no whole
    time once a file holds several days), so files are checked against each other from
    their first and last rows' whole times, as CSV files are.

    Raises
    ------
    LoaderError
        Naming a file whose path does not match the pattern, or whose date does not
        parse, or whose timestamp column is a timestamp type (it has its date).
    MissingColumnError
        Naming a file without the date column.
    FormatMismatchError
        For LOBSTER and FI-2010 files, and without a timestamp column.
    """
    from dataclasses import replace

    from pipeline.errors import FormatMismatchError

    first = parts[0]
    if first.fmt in ("lobster", "fi2010"):
        raise FormatMismatchError(first.path, f"{first.fmt} files date their rows themselves; leave source.date "
                                  "unset")
    if timestamp is None:
        raise FormatMismatchError(first.path, "source.date dates a timestamp column of times of day: set "
                                  "source.timestamp")
    days: dict[str, int] = {}
    largest = _files_largest(parts)
    out = []
    for p in parts:
        if p.tz is not None:
            raise LoaderError(p.path, f"timestamp column {timestamp!r} is a timestamp type, a time with its date: "
                              "source.date is for columns of times of day; leave source.date unset")
        if spec.column is not None:
            out.append(_column_dated(p, spec.column, timestamp, None if unit else largest.get(p.path)))
            continue
        if p.path not in days:
            try:
                days[p.path] = spec.day_ns(p.path)
            except ValueError as exc:
                raise LoaderError(p.path, str(exc)) from None
            if unit is None:  # from the footers, before anything is read
                check_day_unit(largest.get(p.path), p.path, timestamp)
        day = days[p.path]
        first, last = _dated_bounds(p.first_ts, p.last_ts, day, unit)
        out.append(replace(p, day_ns=day, times_of_day=True, first_ts=first, last_ts=last,
                           group_bounds=tuple(_dated_bounds(a, b, day, unit) for a, b in p.group_bounds)))
    return out


def _column_dated(part: TablePart, column: str, timestamp: str, largest: int | None) -> TablePart:
    """A part of times of day dated row by row from ``column``: no day of its own and
    no footer bounds (``largest``: its file's largest time of day from the footers,
    checked for the unit here, before anything is read)."""
    from dataclasses import replace

    from pipeline.errors import MissingColumnError

    if column not in part.columns:
        raise MissingColumnError(part.path, f"missing date column {column!r} (source.date.column); the file has "
                                 f"{list(part.columns)}")
    if column == timestamp:
        raise LoaderError(part.path, f"source.date.column {column!r} is the timestamp column itself; name the "
                          "column of dates beside the times of day")
    check_day_unit(largest, part.path, timestamp)
    return replace(part, day_ns=0, times_of_day=True, first_ts=None, last_ts=None,
                   group_bounds=tuple((None, None) for _ in part.group_bounds))


def _files_largest(parts: Sequence[TablePart]) -> dict[str, int]:
    """Each file's largest integer time of day from its row groups' footers; a file is
    left out when a footer has no bound or one that is no integer (a time type, a
    float), its rows then checked as they are read."""
    largest: dict[str, int] = {}
    unknown: set[str] = set()
    for p in parts:
        for _, last in p.group_bounds or ((p.first_ts, p.last_ts),):
            if isinstance(last, bool) or not isinstance(last, (int, np.integer)):
                unknown.add(p.path)
            else:
                largest[p.path] = max(largest.get(p.path, int(last)), int(last))
    return {path: n for path, n in largest.items() if path not in unknown}


def _dated_bounds(first: Any, last: Any, day: int, unit: str | None) -> tuple[Any, Any]:
    """Footer bounds of times of day as whole times on ``day`` (ns), or ``None``s."""
    lo, hi = footer_time_of_day(first, unit), footer_time_of_day(last, unit)
    if lo is None or hi is None:
        return None, None
    return np.datetime64(day + lo, "ns"), np.datetime64(day + hi, "ns")


def check_rows_in_order(ns: np.ndarray, part: TablePart, name: str, codes: np.ndarray | None = None,
                        date_column: str | None = None) -> None:
    """Refuse a part whose timestamps go back in time from one row to the next of the
    same instrument (``codes``: each row's instrument, when a column names it; equal
    times are fine: many book events share a timestamp). Windows, labels and sessions
    take each instrument's rows in file order as time order; files are checked against
    each other by :func:`~pipeline.loaders.timeorder.check_time_order`. ``date_column``:
    the times are each row's date from that column plus its time of day."""
    if codes is None:
        rows = np.arange(ns.size)
    else:  # each instrument's rows in file order, one instrument after another
        rows = np.argsort(codes, kind="stable")
    t = ns[rows]
    back = np.flatnonzero(t[1:] < t[:-1])
    if codes is not None:
        back = back[codes[rows[back]] == codes[rows[back + 1]]]
    if back.size:
        r, above = int(rows[back[0] + 1]), int(rows[back[0]])

        def where(i: int) -> str:
            return row_place(part, i)  # LOBSTER's times are its message file's, line for line

        more = f" (and {back.size - 1} more such rows)" if back.size > 1 else ""
        same = " of the same instrument" if codes is not None else ""
        path = part.companion if part.fmt == "lobster" else part.path
        advice = repeated_hour_advice(int(ns[above]) - int(ns[r]), part.tz) or _days_advice(ns, part, date_column) or \
            "rows must be in time order: sort the file by time"
        raise LoaderError(path, f"timestamp column {name!r}: {where(r)} is at {np.datetime64(int(ns[r]), 'ns')}, "
                          f"before the row above it{same} ({where(above)}) at {np.datetime64(int(ns[above]), 'ns')}"
                          f"{more}; {advice}")



def _days_advice(ns: np.ndarray, part: TablePart, date_column: str | None = None) -> str | None:
    """Why rows go back in time when the cause is several days' times of day in one
    file, else ``None``: sorting such a file by time, the usual advice, would mix its
    days. Either every time is within the epoch's first day (times of day read as
    whole times: each day's rows start again at 1970-01-01), or ``source.date`` gave
    the whole file one date (its times of day go back at each midnight). Rows dated
    by a ``date_column`` are told to sort by both columns: by time alone would mix
    the days again."""
    if date_column is not None:
        return (f"each row's time is its date (column {date_column!r}, source.date) plus its time of day, and rows "
                f"must be in time order by both: sort the file by {date_column!r}, then by time")
    if part.times_of_day:
        return ("source.date gives a whole file one date, from its path, so a file holding several days' times of "
                "day goes back at each midnight: keep one day per file, or, if it has a date column, date each row "
                "by it with source.date ({column: date})")
    if ns.size and int(ns.min()) >= 0 and int(ns.max()) < DAY_NS:
        return ("every time here is within a day of 1970-01-01T00:00: they look like times of day (nanoseconds "
                "since midnight, as NASDAQ ITCH gives them) without their date, and a row going back is likely the "
                "next day's first; sorting would mix the days. Store whole times in the timestamp column (each "
                "row's date added, from a date column if the file has one), or keep one day per file and take each "
                "file's date from its path with source.date ({path: 'data/{date}.csv'}), or each row's from a date "
                "column with source.date ({column: date})")
    return None


def _part_times(part: TablePart, timestamp: str | None, so: dict, unit: str | None,
                instrument_column: str | None, dates: RowDates | None = None) -> tuple[np.ndarray, Any]:
    """A part's int64 nanoseconds and, with an instrument column, its rows' instruments
    (``dates``: each row dated by a column, :class:`RowDates`)."""
    if part.fmt == "lobster":  # one instrument per file, named by it
        from pipeline.loaders.lobster import read_timestamps

        return read_timestamps(part, so), None
    per_row = instrument_column is not None and part.instrument is None
    # Every column in one read: a CSV part is parsed once, not once per column.
    wanted = [timestamp] + ([dates.column] if dates is not None else []) + ([instrument_column] if per_row else [])
    cols = read_columns(_decimal_times(part, timestamp, unit, dates), wanted, so)
    if dates is not None:  # source.date: {column: ...}: each row's date plus its time of day
        where = lambda i: row_place(part, i)  # noqa: E731
        check = part.fmt != "parquet" and _ends_unchecked_file(part) or \
            part.fmt == "parquet" and part.path not in dates.checked
        ns = dates_to_ns(cols[dates.column], part.path, dates.column, dates.format, where) + \
            times_of_day_to_ns(cols[timestamp], part.path, timestamp, unit, where, check)
    elif part.times_of_day:  # source.date: the file's date plus each row's time of day
        ns = part.day_ns + times_of_day_to_ns(cols[timestamp], part.path, timestamp, unit,
                                              lambda i: row_place(part, i), _ends_unchecked_file(part))
    else:
        ns = to_ns(cols[timestamp], part.path, timestamp, unit, lambda i: row_place(part, i))
    if not per_row:
        return ns, None
    labels = _labels(part, instrument_column, so, cols[instrument_column])
    return ns, labels.combine_chunks() if hasattr(labels, "combine_chunks") else labels


def _decimal_times(part: TablePart, timestamp: str | None, unit: str | None, dates: RowDates | None) -> TablePart:
    """``part``, its timestamp column read as decimals scaled to nanoseconds where a CSV
    holds decimal numbers there (pyarrow found floats in its first bytes), so that
    :func:`to_ns` takes each time as written (:func:`_decimal_ns`), not through a
    float64. A value the decimal does not hold (a digit past the nanosecond) makes the
    part be read with floats, as before."""
    if part.fmt != "csv" or timestamp is None or dates is not None or part.times_of_day:
        return part
    from dataclasses import replace

    source = part.source_of(timestamp)
    if dict(part.csv_types).get(source) != "f":
        return part
    return replace(part, csv_types=tuple((n, f"d{_ns_digits(unit)}" if n == source else k) for n, k in part.csv_types))


def _ends_unchecked_file(part: TablePart) -> bool:
    """Whether a part's own times of day decide their unit (:func:`check_day_unit`):
    the last part of a text file, which holds the file's latest times (an earlier part
    of a 24-hour market's day may all be just after midnight); a Parquet part only
    without footer bounds, as :func:`dated_parts` checked the whole file from them."""
    if part.fmt == "parquet":
        return part.first_ts is None
    return part.data is None or part.data[1] is None


def _row_above(part: TablePart, so: dict) -> TablePart | None:
    """The row just above a part of a text file that is not its first, as a part of one
    row (so that order is checked across the parts' boundary too), or None."""
    from dataclasses import replace

    from pipeline.loaders.textfiles import previous_line

    if part.data is None or part.row0 == 0:
        return None
    if part.fmt == "lobster":  # its times are the message file's
        start = part.companion_data[0]
        return replace(part, rows=1, row0=part.row0 - 1,
                       companion_data=(previous_line(part.companion, start, so), start))
    start = part.data[0]
    return replace(part, rows=1, row0=part.row0 - 1, data=(previous_line(part.path, start, so), start))


def _read_timestamps(part: TablePart, timestamp: str | None, so: dict, unit: str | None = None,
                     instrument_column: str | None = None, dates: RowDates | None = None) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    ns, labels = _part_times(part, timestamp, so, unit, instrument_column, dates)
    above = _row_above(part, so)
    checked, first = (ns, part)
    if above is not None:
        above_ns, above_labels = _part_times(above, timestamp, so, unit, instrument_column, dates)
        checked, first = np.concatenate([above_ns, ns]), above
        labels = None if labels is None else pa.concat_arrays([above_labels, labels])
    # Several instruments in one file may come one after another, each in time order.
    codes = None if labels is None else pc.dictionary_encode(labels).indices.to_numpy(zero_copy_only=False)
    check_rows_in_order(checked, first, timestamp or "time", codes, dates.column if dates is not None else None)
    return ns


def timestamp_array(parts: Sequence[TablePart], timestamp: str | None, so: dict, unit: str | None = None,
                    instrument_column: str | None = None, dates: RowDates | None = None) -> da.Array:
    """``(rows,)`` int64 nanoseconds since the epoch, one chunk per part (``unit``: of a
    numeric column, see :func:`to_ns`), each instrument's rows checked to be in time
    order (``instrument_column``: the column naming them, if any; ``dates``: times of
    day dated row by row from a column, :class:`RowDates`)."""
    if dates is None:  # the graph (and its key names) of every other source stays as it was
        return parts_array(parts, _read_timestamps, timestamp, so, unit, instrument_column, token="read-timestamps",
                           dtype=np.int64)
    return parts_array(parts, _read_timestamps, timestamp, so, unit, instrument_column, dates,
                       token="read-timestamps", dtype=np.int64)


def _labels(part: TablePart, column: str | None, so: dict, col: Any = None) -> Any:
    """The instrument of each row of ``part`` as a pyarrow string array (``col``: the
    instrument column, when already read)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if part.instrument is not None:  # a format that names the instrument per file
        return pa.repeat(pa.scalar(part.instrument, pa.string()), part.rows)
    if col is None:
        col = read_columns(part, [column], so)[column]
    if col.null_count:
        raise LoaderError(part.path, f"instrument column {column!r}: missing value at "
                          f"{row_place(part, _first_null(col))}")
    try:
        return pc.cast(col, pa.string())
    except pa.ArrowException as exc:
        raise LoaderError(part.path, f"instrument column {column!r}: cannot read {col.type} values as names "
                          f"({exc})") from None


def instrument_names(parts: Sequence[TablePart], column: str | None, so: dict) -> tuple[str, ...]:
    """The sorted distinct instruments: one small pass over the instrument column, on the
    active dask client when there is one."""
    if all(p.instrument is not None for p in parts):
        return tuple(sorted({p.instrument for p in parts}))  # from file names: nothing to read
    specs = part_specs(parts, "table-parts")

    def distinct(block: np.ndarray) -> np.ndarray:
        import pyarrow.compute as pc

        values = pc.unique(_labels(block[0], column, so))
        return np.asarray(values.to_pylist(), dtype=object)

    uniques = specs.map_blocks(distinct, dtype=object, chunks=((np.nan,) * len(parts),),
                               name=f"distinct-instruments-{tokenize(specs.name, column)}",
                               meta=np.empty((0,), dtype=object))
    (values,) = dask.compute(uniques)
    return tuple(sorted(set(values.tolist())))


def instrument_array(parts: Sequence[TablePart], column: str | None, names: Sequence[str], so: dict) -> da.Array:
    """``(rows,)`` int32 codes: each row's index into ``names``."""
    specs = part_specs(parts, "table-parts")
    names = tuple(names)

    def codes(block: np.ndarray) -> np.ndarray:
        import pyarrow as pa
        import pyarrow.compute as pc

        part = block[0]
        if part.instrument is not None:  # one instrument per file: no column to read
            return np.full(part.rows, names.index(part.instrument), dtype=np.int32)
        found = pc.index_in(_labels(part, column, so), value_set=pa.array(names, pa.string()))
        if found.null_count:  # a value that the distinct pass did not see: the file changed since
            row = _first_null(found)
            raise LoaderError(part.path, f"instrument at {row_place(part, row)} is not one of {list(names)} found "
                              "when the source was opened; did the file change?")
        return found.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)

    return specs.map_blocks(codes, dtype=np.int32, chunks=(tuple(p.rows for p in parts),),
                            name=f"instrument-codes-{tokenize(specs.name, column, names)}",
                            meta=np.empty((0,), dtype=np.int32))


def keep_mask(values: da.Array) -> da.Array:
    """``(rows,)`` bool: the rows of ``values`` without NaN or inf (the rows ``nan="drop"`` keeps)."""
    return values.map_blocks(lambda b: np.isfinite(b).all(axis=1), drop_axis=1, dtype=bool,
                             name=f"keep-rows-{tokenize(values.name)}", meta=np.empty((0,), dtype=bool))


def drop_rows(arr: da.Array, keep: da.Array, kept: tuple[int, ...]) -> da.Array:
    """The rows of ``arr`` (1-D or 2-D, chunked like ``keep`` along rows) where ``keep``
    holds; ``kept`` is each block's count of kept rows."""
    index = "ij"[: arr.ndim]
    return da.blockwise(lambda a, k: a[k], index, arr, index, keep, "i", dtype=arr.dtype,
                        adjust_chunks={"i": tuple(kept)}, name=f"drop-rows-{tokenize(arr.name, keep.name)}",
                        meta=np.empty((0,) * arr.ndim, dtype=arr.dtype))
