"""CSV, Parquet, LOBSTER and FI-2010 tables joined along time into one lazy ``(rows, columns)`` array.

Values are float32 by default, float64 with ``dtype`` (``source.dtype``): float32 keeps
about 7 digits, less than a high-priced book's ticks need (:mod:`pipeline.loaders.precision`
checks each part read in float32 for that).

Parquet row counts and column names come from the file footer (no data read);
consecutive row groups become one dask chunk of up to ``chunk_rows`` rows (a larger row
group is a chunk alone). CSV has no footer: its rows are counted, and its parts of
``chunk_rows`` rows located, from a newline count of the raw bytes
(:mod:`pipeline.loaders.textfiles`); each part is a chunk.

Column names are the *canonical* names every other option uses (``columns``,
``timestamp``, ``instrument_column``, the features): a file's own names, the ``names``
of a headerless CSV, or LOBSTER's generated names, after ``rename``
(``{canonical: source_name}``). A :class:`TablePart` keeps both, so readers ask the file
for its own names.
"""

from __future__ import annotations

import functools
import io
import json
import re
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import dask.array as da
import fsspec
import numpy as np

from pipeline.errors import (
    ConfigError,
    FormatMismatchError,
    InvalidValueError,
    LoaderError,
    MissingColumnError,
)
from pipeline.loaders.registry import compression_of
from pipeline.loaders.textfiles import (
    count_lines,
    is_datum,
    looks_like_data,
    open_text,
    read_range,
    require_pyarrow,
    split_fields,
    text_ranges,
)

__all__ = ["LOBSTER_INTEGERS", "TEXT_PART_ROWS", "TablePart", "check_columns", "check_csv_marks", "check_exact_columns",
           "check_units", "group_parts",
           "inexact_integers", "is_header_line", "merged_groups", "part_rows_of", "part_specs", "parts_array", "probe_table",
           "project_columns", "read_columns", "repeated_header", "row_place", "table_array"]


def part_rows_of(path: str, part_rows: int) -> int:
    """Rows per part of a text file: a compressed stream cannot seek to a part's start
    without decompressing everything before it, so a compressed file is one part."""
    return part_rows if compression_of(path) is None else 2**62


#: Rows per part of a CSV or LOBSTER file (``source.chunk_rows`` overrides it): a part
#: is a dask chunk and the unit a task reads, so a day of a busy book (millions of rows,
#: gigabytes of text) is read in pieces of about 10 MB of values per column set rather
#: than as one chunk larger than a worker's memory.
TEXT_PART_ROWS = 1 << 18


@dataclass(frozen=True, slots=True)
class TablePart:
    """One chunk of the joined table: row group ``group`` (Parquet) or the whole file.

    Attributes
    ----------
    columns
        Canonical column names (after ``rename``).
    sources
        The file's own name of each of ``columns``, in the same order.
    header, names
        CSV: whether the first line is a header (decided per file under
        ``source.header: auto``), and the names given for the fields (``None``: the
        header's own).
    companion
        A second file read with this one (LOBSTER: the message file).
    day_ns
        LOBSTER, and files whose timestamps are ``times_of_day``: midnight of the file's
        date, in nanoseconds since the epoch.
    instrument
        LOBSTER: the ticker in the file name.
    """

    path: str
    fmt: str
    group: int
    rows: int
    columns: tuple[str, ...]
    first_ts: Any = None
    last_ts: Any = None
    sources: tuple[str, ...] = ()
    header: bool = True
    names: tuple[str, ...] | None = None
    companion: str | None = None
    day_ns: int = 0
    instrument: str | None = None
    #: The timestamp column holds times of day, ``day_ns`` the date (``source.date``).
    times_of_day: bool = False
    #: Parquet: the file's own names of columns that do not hold numbers (timestamps,
    #: text), left out of the default columns.
    non_numeric: tuple[str, ...] = ()
    #: CSV and LOBSTER files of more than :data:`TEXT_PART_ROWS` rows are read in parts:
    #: the bytes ``[start, stop)`` of the file's data lines (``stop`` None: to its end;
    #: ``data`` None: the whole file, header and all), ``companion_data`` the same lines
    #: of the companion, and ``row0`` the rows of the file before this part (so that
    #: errors name the file's own row and line numbers).
    data: tuple[int, int | None] | None = None
    companion_data: tuple[int, int | None] | None = None
    row0: int = 0
    #: Parquet: the time zone of the timestamp column's type, as the schema stores it
    #: (``""``: a naive timestamp type); ``None`` where no schema says (CSV, LOBSTER,
    #: a column of numbers or text).
    tz: str | None = None
    #: Parquet: per column of ``sources``, ``"i"`` for an integer type, ``"f"`` for a
    #: floating one, ``""`` for any other; and the largest magnitude of the column in
    #: the file's first row group (``None``: no statistics), to tell fixed-point
    #: integers from decimal prices across files (:func:`check_units`).
    kinds: tuple[str, ...] = ()
    magnitudes: tuple[float | None, ...] = ()
    #: Parquet: a part of several consecutive row groups (``group`` the first) holds
    #: the rows of each and their footer bounds ``(first_ts, last_ts)``, so that rows
    #: and row groups are still named, and row groups still ordered, one by one. Empty:
    #: the part is the one row group ``group``.
    group_rows: tuple[int, ...] = ()
    group_bounds: tuple[tuple[Any, Any], ...] = ()
    #: CSV: the field delimiter and the decimal mark (``source.delimiter``,
    #: ``source.decimal``).
    delimiter: str = ","
    decimal: str = "."
    #: CSV: ``(file's name, a value)`` of each text column whose first values all look
    #: like numbers with a decimal comma (``97121,65``) while ``decimal`` is ``.``.
    comma_numbers: tuple[tuple[str, str], ...] = ()
    #: CSV: ``(file's name, "i" or "f")`` of the columns pyarrow read as integers or
    #: floats in the file's first bytes: read with those types, pyarrow infers none (a
    #: third of a CSV's parse); a value that does not fit makes the part be read again,
    #: inferring, as before. ``"d9"``: read as a decimal of 9 fraction digits (a
    #: timestamp of decimal epoch seconds, taken as written:
    #: :func:`~pipeline.loaders.columns.to_ns`).
    csv_types: tuple[tuple[str, str], ...] = ()
    #: CSV: ``(file's name, median magnitude)`` of those columns in the file's first
    #: rows, beside :attr:`magnitudes` of a Parquet file's (for :func:`check_units`).
    csv_magnitudes: tuple[tuple[str, float], ...] = ()
    #: CSV: ``(file's name, row, value)`` of each text column: its first value that is no
    #: number and that value's row in the file, as the file's first bytes showed; none
    #: where every value there is a number or empty.
    text_samples: tuple[tuple[str, int, str], ...] = ()

    def __dask_tokenize__(self) -> tuple[str, str]:
        # Each task's part is in its graph's name (parts_array, part_specs): dask would
        # pickle every footer bound of a part one by one (seconds to open a source of
        # files of thousands of small row groups, once per array of it); the dataclass's
        # repr names every field's value as well, in one string.
        return ("TablePart", repr(self))

    @property
    def groups(self) -> tuple[int, ...]:
        """The Parquet row groups of the part, in file order."""
        return tuple(range(self.group, self.group + max(1, len(self.group_rows))))

    def source_of(self, column: str) -> str:
        """The file's own name of canonical ``column``."""
        return dict(zip(self.columns, self.sources)).get(column, column)


def row_place(part: TablePart, i: int) -> str:
    """Where row ``i`` of a part is, for an error message: a Parquet row counted from 0
    in its row group; a text file's line, counted from 1 with the header (as editors
    and ``sed -n`` count), whichever part of the file holds it (LOBSTER's orderbook and
    message files share their line numbers)."""
    if part.fmt == "parquet":
        group, row = part.group, i
        for rows in part.group_rows:  # a part of several row groups: the one holding row i
            if row < rows:
                break
            group, row = group + 1, row - rows
        return f"row {row} of row group {group}"
    return f"line {part.row0 + i + 1 + int(part.fmt == 'csv' and part.header)}"


def _alternatives(source: str | Sequence[str]) -> tuple[str, ...]:
    """The source names a ``rename`` value allows: one name, or a list of them."""
    return (source,) if isinstance(source, str) else tuple(source)


def _first_present(source: str | Sequence[str] | None, file_columns: Sequence[str]) -> str | None:
    """Of a ``rename`` value's alternatives, the first the file has (else the first)."""
    if source is None:
        return None
    names = _alternatives(source)
    return next((n for n in names if n in file_columns), names[0])


def _renamed(path: str, file_columns: tuple[str, ...], rename: Mapping[str, str | Sequence[str]]
             ) -> tuple[str, ...]:
    """Canonical names of ``file_columns`` under ``rename`` (``{canonical: source}``,
    or ``{canonical: [source, ...]}``: alternative names, as a vendor renames a column
    from one day on; the first one the file has is read)."""
    missing = {canon: _alternatives(src) for canon, src in rename.items()
               if not any(s in file_columns for s in _alternatives(src))}
    if missing:
        def said(names: tuple[str, ...]) -> str:
            return f"source column {names[0]!r}" if len(names) == 1 else \
                f"any of the source columns {list(names)}"

        raise MissingColumnError(
            path, f"rename maps {', '.join(f'{c!r} to {said(s)}' for c, s in missing.items())}, "
            f"which the file lacks; the file has {list(file_columns)}")
    inverse = {_first_present(src, file_columns): canon for canon, src in rename.items()}
    out = tuple(inverse.get(c, c) for c in file_columns)
    dupes = sorted({c for c in out if out.count(c) > 1})
    if dupes:
        raise LoaderError(
            path, f"rename {dict(rename)} gives two columns the name(s) {dupes}: the file already has a column "
            "of that name; rename it too or choose another canonical name")
    return out


def _not_parquet(path: str, so: dict, exc: BaseException) -> FormatMismatchError:
    """The error for a file read as Parquet whose footer pyarrow cannot read: an Arrow
    IPC (Feather) file, told by its first bytes, is named as one (pyarrow's "Parquet magic
    bytes not found in footer" does not say what the file is)."""
    from pipeline.loaders.registry import ARROW_IPC_MAGIC, arrow_ipc_advice

    try:
        with fsspec.open(path, "rb", **so) as fh:
            head = fh.read(len(ARROW_IPC_MAGIC))
    except Exception:  # noqa: BLE001 - the footer's error below says enough
        head = b""
    if head == ARROW_IPC_MAGIC:
        return FormatMismatchError(path, arrow_ipc_advice("its first bytes are ARROW1"))
    return FormatMismatchError(path, f"expected a Parquet file, could not read its footer ({exc})")


def _parquet_parts(path: str, timestamp_source: str | Sequence[str] | None, so: dict,
                   part_rows: int = TEXT_PART_ROWS) -> list[TablePart]:
    """The parts of a Parquet file from its footer: consecutive row groups joined into
    parts of up to ``part_rows`` rows (:func:`merged_groups`)."""
    require_pyarrow()
    import pyarrow.parquet as pq

    try:
        with fsspec.open(path, "rb", **so) as fh:
            meta = pq.ParquetFile(fh).metadata
            schema = meta.schema.to_arrow_schema()
    except OSError as exc:
        if exc.errno is not None:
            # The operating system refused the read (permission, a directory, a file gone
            # or an I/O error): the file may well be Parquet, and calling it another format
            # would send its owner looking for the wrong fault. pyarrow's own "cannot
            # deserialize" errors are OSErrors without an errno: a damaged footer, below.
            raise LoaderError(path, f"cannot read the file: {exc.strerror or exc} (errno {exc.errno}); check that it "
                              "exists and that this user may read it") from None
        raise _not_parquet(path, so, exc) from None
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for bad files
        raise _not_parquet(path, so, exc) from None
    cols = tuple(schema.names)
    import pyarrow as pa

    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_boolean)
    text = tuple(f.name for f in schema if not any(test(f.type) for test in numeric))
    timestamp_source = _first_present(timestamp_source, cols)  # a rename may list alternatives
    ts_idx = cols.index(timestamp_source) if timestamp_source in cols else None
    tz = None
    if ts_idx is not None and pa.types.is_timestamp(schema.field(ts_idx).type):
        tz = schema.field(ts_idx).type.tz or ""
    kinds = tuple("i" if pa.types.is_integer(f.type) else "f" if pa.types.is_floating(f.type) else ""
                  for f in schema)
    magnitudes = _magnitudes(meta, kinds)
    rows, bounds = [], []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        first = last = None
        if ts_idx is not None:
            st = rg.column(ts_idx).statistics
            if st is not None and st.has_min_max:
                first, last = statistics_bounds(st)
        rows.append(rg.num_rows)
        bounds.append((first, last))
    parts = []
    for lo, hi in merged_groups(rows, part_rows):
        known = all(b[0] is not None and b[1] is not None for b in bounds[lo:hi])
        several = hi - lo > 1
        parts.append(TablePart(path, "parquet", lo, sum(rows[lo:hi]), cols,
                               bounds[lo][0] if known else None, bounds[hi - 1][1] if known else None,
                               sources=cols, non_numeric=text, tz=tz, kinds=kinds, magnitudes=magnitudes,
                               group_rows=tuple(rows[lo:hi]) if several else (),
                               group_bounds=tuple(bounds[lo:hi]) if several else ()))
    return parts


def merged_groups(rows: Sequence[int], part_rows: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges of consecutive row groups (of ``rows`` rows each): a row group
    of at least a quarter of ``part_rows`` rows is a part alone, as every row group was
    (files written with the usual row groups keep their chunks, and a build its tasks);
    smaller ones next to each other are joined until a part holds that quarter (never more
    than ``part_rows`` rows). A row group is never split.

    Streaming writers write row groups of a few rows: one part (a dask task) per row
    group, each reading the file's footer (which grows with the row groups), made a
    read cost the square of their number."""
    alone = max(1, part_rows // 4)
    out: list[tuple[int, int]] = []
    lo, total = 0, 0
    for g, n in enumerate(rows):
        if g > lo and (n >= alone or total >= alone or total + n > part_rows):
            out.append((lo, g))
            lo, total = g, 0
        total += n
    if len(rows) > lo:
        out.append((lo, len(rows)))
    return out


def group_parts(parts: Sequence[TablePart]) -> list[TablePart]:
    """Each Parquet row group of ``parts`` as a part of its own with its footer bounds
    (other parts as they are), for checks made row group by row group."""
    out: list[TablePart] = []
    for p in parts:
        if not p.group_rows:
            out.append(p)
            continue
        out += [replace(p, group=g, rows=n, first_ts=lo, last_ts=hi, group_rows=(), group_bounds=())
                for g, n, (lo, hi) in zip(p.groups, p.group_rows, p.group_bounds)]
    return out


def _magnitudes(meta: Any, kinds: Sequence[str]) -> tuple[float | None, ...]:
    """The largest magnitude of each integer or floating column in the first row group
    of a Parquet file, from its statistics (``None`` without them, or for other types)."""
    out: list[float | None] = [None] * len(kinds)
    if meta.num_row_groups == 0:
        return tuple(out)
    rg = meta.row_group(0)
    for j, kind in enumerate(kinds):
        st = rg.column(j).statistics if kind else None
        if st is not None and st.has_min_max:
            try:
                out[j] = max(abs(float(st.min)), abs(float(st.max)))
            except (TypeError, ValueError):
                pass
    return tuple(out)


#: Parquet's time units as numpy's.
_PARQUET_UNITS = {"milliseconds": "ms", "microseconds": "us", "nanoseconds": "ns"}


@functools.lru_cache(maxsize=64)
def _timestamp_unit(logical: str) -> str | None:
    """numpy's unit of a Parquet timestamp's logical type (its JSON), parsed once per
    kind rather than once per row group."""
    return _PARQUET_UNITS.get(json.loads(logical).get("timeUnit", ""))


def statistics_bounds(st: Any) -> tuple[Any, Any]:
    """The min and max of a Parquet column chunk's statistics; a timestamp's as numpy
    ``datetime64`` in the file's own unit, from the stored integers.

    pyarrow boxes nanosecond timestamp statistics as pandas ``Timestamp`` objects,
    importing pandas into a process that may not otherwise need it (the run's own, with
    a remote cluster), and a time zone's as aware ones, which a naive bound cannot be
    compared with. ``datetime64`` values compare across units and time zones alike (a
    UTC-adjusted timestamp is stored as UTC)."""
    logical = st.logical_type
    if st.physical_type == "INT64" and getattr(logical, "type", None) == "TIMESTAMP":
        unit = _timestamp_unit(logical.to_json())
        if unit is not None:
            return np.datetime64(st.min_raw, unit), np.datetime64(st.max_raw, unit)
    return st.min, st.max


def _csv_parts(path: str, so: dict, header: bool | str, names: Sequence[str] | None,
               part_rows: int = TEXT_PART_ROWS, timestamp: str | Sequence[str] | None = None,
               delimiter: str = ",", decimal: str = ".") -> list[TablePart]:
    """The parts of a CSV file (a newline count), with ``tz`` from the first row's time in
    column ``timestamp`` (see :func:`_csv_time_kind`) and the columns that do not hold
    numbers (:func:`_csv_text_columns`). ``header="auto"`` decides from the file's first
    two lines whether it has a header (:func:`_auto_header`)."""
    part_rows = part_rows_of(path, part_rows)
    auto = header == "auto"
    if auto:
        # Decided before the count: the parts' line offsets depend on it.
        header, names = _auto_header(path, so, names, delimiter, decimal)
    first, lines, starts, head = count_lines(path, so, every=part_rows, base=int(header))
    second = head.split(b"\n", 1)[0]
    fields = split_fields(first, path, delimiter)
    if not first.strip():
        raise FormatMismatchError(path, f"expected a CSV {'header' if header else 'data'} line, found an empty file")
    _check_delimiter(path, fields, first, second, delimiter)
    if not header and is_header_line(fields, split_fields(second, path, delimiter) if second.strip() else [],
                                     names, decimal):
        # Read as data, its names would reach the timestamp parser or the float cast,
        # which would blame the values ("cannot read string values as times").
        raise FormatMismatchError(
            path, f"line 1 {_shown(first)!r} holds column names (a header), but source.header is false, which reads "
                  "it as data; set source.header: auto where some files have a header and some do not (each file's "
                  "first line is then a header when it equals source.names, or holds no number where the line "
                  "below does), or true if every file has one")
    if header and looks_like_data([f.replace(decimal, ".") for f in fields]):
        raise FormatMismatchError(
            path, f"its first line {_shown(first)!r} looks like data, not a header (most fields are numbers or times); if the file "
            f"has no header, set source.header: false and source.names: [...] ({len(fields)} names); auto where "
            "only some files have one")
    if not header and names is None:
        raise FormatMismatchError(
            path, f"source.header is {'auto and line 1 is no header' if auto else 'false'} but no column names "
                  "were given; set source.names: [...] "
            f"({len(fields)} names, one per field of the first line)")
    if names is not None and len(names) != len(fields):
        raise FormatMismatchError(
            path, f"expected {len(names)} fields per line (one per name in source.names), found {len(fields)} "
            "in its first line")
    cols = tuple(names) if names is not None else tuple(fields)
    rows = lines - 1 if header else lines
    given = tuple(names) if names is not None else None
    if rows == 0:
        # A header and no data (a day without trades): no part, as a Parquet file of no
        # row group has none. Read, it would give columns of pyarrow's null type.
        return []
    timestamp = _first_present(timestamp, cols)  # a rename may list alternatives
    tz = _csv_time_kind(path, second if header else first, cols, timestamp, delimiter) if timestamp else None
    base = TablePart(path, "csv", 0, rows, cols, sources=cols, header=header, names=given, tz=tz,
                     delimiter=delimiter, decimal=decimal)
    text, commas, types, samples, sizes = _csv_text_columns(base, first + head)
    base = replace(base, non_numeric=text, comma_numbers=commas, csv_types=types, text_samples=samples,
                   csv_magnitudes=sizes)
    if rows <= part_rows:
        return [base]
    ranges = text_ranges(len(first) if header else 0, starts, rows, part_rows)
    return [replace(base, group=k, rows=min(part_rows, rows - row0), data=data, row0=row0)
            for k, (row0, data) in enumerate(ranges)]


def _shown(line: bytes) -> str:
    """A file's line for an error message: decoded, without its line end, cut to 60
    characters."""
    text = line.decode("utf-8", "replace").rstrip("\r\n")
    return text if len(text) <= 60 else text[:57] + "..."


def is_header_line(fields: Sequence[str], below: Sequence[str], names: Sequence[str] | None,
                   decimal: str = ".") -> bool:
    """Whether a CSV file's first line (its ``fields``) is a header.

    It is when it equals ``names`` (the names expected, ``source.names``), or when it
    holds no value (number, date, time) in any column where the line ``below`` does,
    and a name in at least one of them: column names are rarely numbers, and a data
    line with a missing value still has values in its other columns. Without a line
    below (a file of one line), a line that does not look like data
    (:func:`~pipeline.loaders.textfiles.looks_like_data`) is a header.

    Parameters
    ----------
    fields, below
        The first and second lines' fields (``below`` empty: no second line).
    names
        The column names expected, or ``None``.
    decimal
        The decimal mark of the file's numbers.
    """
    if names is not None and list(fields) == list(names):
        return True

    def value(field: str) -> bool:
        return is_datum(field.replace(decimal, "."))

    if not below:
        return bool(fields) and not looks_like_data([f.replace(decimal, ".") for f in fields])
    top = [fields[j] for j, f in enumerate(below) if j < len(fields) and value(f)]
    return bool(top) and not any(value(f) for f in top) and any(f for f in top)


def _auto_header(path: str, so: dict, names: Sequence[str] | None, delimiter: str, decimal: str
                 ) -> tuple[bool, Sequence[str] | None]:
    """``source.header: auto`` for one file: whether its first line is a header
    (:func:`is_header_line`), and the names to read it by. A header naming the columns
    of ``names`` in another order is read by its own names (each column by name); one
    naming other columns is refused, as reading it by ``names`` would give its columns
    names by position that are not theirs.

    Raises
    ------
    FormatMismatchError
        Naming the file, its header and ``source.names``.
    """
    with open_text(path, so) as fh:
        first, second = fh.readline(), fh.readline()
    if not first.strip():
        return True, names  # an empty file: refused by the caller, as with a header
    fields = split_fields(first, path, delimiter)
    below = split_fields(second, path, delimiter) if second.strip() else []
    if not is_header_line(fields, below, names, decimal):
        return False, names
    if names is None or list(fields) == list(names):
        return True, names
    if sorted(fields) == sorted(names):
        return True, None
    raise FormatMismatchError(
        path, f"source.header is auto and line 1 is a header naming {fields}, not the columns of source.names "
              f"{list(names)}: files with a header must name the same columns as source.names (in any order); "
              "read the files of another layout as a source of their own")


#: Delimiters a CSV file of one field per line is likely to use instead of the one set.
_OTHER_DELIMITERS = (";", "\t", "|")


def _check_delimiter(path: str, fields: Sequence[str], first: bytes, second: bytes, delimiter: str) -> None:
    """Refuse a file read as one field per line whose first two lines split into the
    same number of fields by another common delimiter (``;``, where the decimal mark is
    a comma; a tab; ``|``): read so, every column would be one of text."""
    if len(fields) != 1:
        return
    for other in _OTHER_DELIMITERS:
        if other == delimiter:
            continue
        n = len(split_fields(first, path, other))
        if n > 1 and (not second or len(split_fields(second, path, other)) == n):
            raise FormatMismatchError(
                path, f"its first line has one field split by {delimiter!r} but {n} split by {other!r}: it looks "
                f"{other!r}-delimited; set source.delimiter: {_yaml_string(other)} (pipeline.load(..., "
                f"delimiter={other!r})), and source.decimal: \",\" if its numbers have a decimal comma")


def _yaml_string(text: str) -> str:
    """``text`` as a double-quoted YAML string that reads back as ``text``: a tab as
    ``"\\t"`` (in single quotes YAML keeps the backslash, two characters)."""
    return json.dumps(text)


#: A number written with a decimal comma (``97121,65``, ``-0,5``), as a whole field.
_COMMA_NUMBER = r"^\s*[+-]?(\d+,\d*|,\d+)([eE][+-]?\d+)?\s*$"
#: A whole number in groups of thousands (``1,234``, ``12,500,000``): as likely a
#: thousands separator as a decimal comma, so no evidence of either.
_THOUSANDS = r"^\s*[+-]?\d{1,3}(,\d{3})+\s*$"


def _csv_text_columns(part: TablePart, block: bytes) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...],
                                                               tuple[tuple[str, str], ...],
                                                               tuple[tuple[str, int, str], ...],
                                                               tuple[tuple[str, float], ...]]:
    """The file's own names of a CSV file's columns that do not hold numbers (text,
    times), from the types pyarrow infers on ``block`` (its first bytes, cut at a line's
    end), as Parquet's schema tells them: left out of the default columns. And, with
    ``decimal`` ``.``, those of them whose values all look like numbers with a decimal
    comma, each with its first value (:func:`check_columns` refuses them). And the
    integer (``"i"``) and floating (``"f"``) columns (:attr:`TablePart.csv_types`). And
    where each text column first holds a value that is no number
    (:attr:`TablePart.text_samples`, for :func:`check_numbers_read`). And the typical
    magnitude of each integer or floating column there (:attr:`TablePart.csv_magnitudes`)."""
    pa = require_pyarrow()
    import pyarrow.csv as pacsv

    cut = block.rfind(b"\n")
    block = block[: cut + 1] if cut >= 0 else block
    try:
        table = pacsv.read_csv(io.BytesIO(block), read_options=_read_options(part),
                               parse_options=pacsv.ParseOptions(delimiter=part.delimiter),
                               convert_options=pacsv.ConvertOptions(decimal_point=part.decimal))
    except (pa.ArrowException, ValueError):  # a quoted newline cut, say: the read itself will say what is wrong
        return (), (), (), (), ()
    _check_no_header_rows(part, table, table.column_names)  # else its columns would seem to hold text
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal, pa.types.is_boolean,
               pa.types.is_null)  # null: empty in the first rows, numbers (or NaN) as far as is known
    text = tuple(f.name for f in table.schema if not any(test(f.type) for test in numeric))
    types = tuple((f.name, "i" if pa.types.is_integer(f.type) or _overflowed(table.column(f.name)) else "f")
                  for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type))
    samples = tuple((name, *found) for name in text if (found := _first_non_number(part, table.column(name))))
    return (text, (_comma_numbers(table, text) if part.decimal == "." else ()), types, samples,
            _typical_sizes(table, [name for name, _ in types]))


def _typical_sizes(table: Any, names: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """``(name, size)`` of the columns ``names`` of ``table``: the median magnitude of
    their first rows, which a vendor's sentinel in a few of them (INT64_MAX for an empty
    level) does not move, as a maximum would. All columns in one numpy array, one median:
    a CSV source's open reads every file's first bytes."""
    if not names or not table.num_rows:
        return ()
    head = table.slice(0, 256)
    values = np.abs(np.column_stack([head.column(n).to_numpy().astype(np.float64, copy=False) for n in names]))
    finite = np.isfinite(values)
    values[~finite] = np.inf  # sorted last, past each column's finite values
    counts = finite.sum(axis=0)
    # The middle finite value of each column (np.nanmedian loops over columns: 25x slower).
    sizes = np.sort(values, axis=0)[counts // 2, np.arange(len(names))]
    return tuple((n, float(v)) for n, v, c in zip(names, sizes, counts) if c)


def _rounded(values: np.ndarray) -> np.ndarray:
    """Where float64 ``values`` are whole numbers past 2**53: integers a double holds
    only rounded."""
    return np.isfinite(values) & (values == np.floor(values)) & \
        (np.abs(values) >= _EXACT_INTEGERS[np.dtype(np.float64)])


def _overflowed(col: Any) -> bool:
    """Whether a column pyarrow read as doubles holds only whole numbers, one past 2**53:
    integers past int64 (a vendor's sentinel), rounded (:func:`_refuse_rounded_integers`)."""
    import pyarrow as pa

    if not pa.types.is_floating(col.type) or not len(col):
        return False
    values = np.asarray(col.drop_null().to_numpy(zero_copy_only=False), dtype=np.float64)
    finite = values[np.isfinite(values)]
    return bool(finite.size and np.all(finite == np.floor(finite)) and _rounded(finite).any())


def _comma_numbers(table: Any, names: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Of ``names`` (text columns of ``table``), those whose values (some, none missing
    but empty fields) all look like numbers with a decimal comma, each with its first.
    A column whose every value could be thousands (``1,234``) is text, as pandas reads
    it: a decimal comma there would be a guess."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = []
    for name in names:
        col = table.column(name)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            continue
        values = pc.drop_null(col)
        if not len(values) or not pc.all(pc.match_substring_regex(values, _COMMA_NUMBER)).as_py():
            continue
        decimal = pc.invert(pc.match_substring_regex(values, _THOUSANDS))
        if pc.any(decimal).as_py():
            out.append((name, pc.filter(values, decimal)[0].as_py()))
    return tuple(out)


def _read_options(part: TablePart) -> Any:
    """pyarrow's ``ReadOptions`` for a CSV part: the header's names, or the names given
    (the header, if any, skipped), or, for a part after the first, the file's names."""
    import pyarrow.csv as pacsv

    if part.data is not None:  # a part's lines, without the header: named by the file's names
        return pacsv.ReadOptions(column_names=list(part.sources))
    if part.names is not None:  # names given: the header, if any, is skipped, not read
        return pacsv.ReadOptions(column_names=list(part.names), skip_rows=1 if part.header else 0)
    if part.sources:
        # The header's names as the probe read them, each stripped: pyarrow's own keep the
        # spaces of `timestamp, bid_price_1, ...` (' bid_price_1'), and the columns the
        # probe named were then not found.
        return pacsv.ReadOptions(column_names=list(part.sources), skip_rows=1)
    return pacsv.ReadOptions()


#: An ISO time that names its offset from UTC (``Z``, ``+11:00``, ``-0500``) at its end.
_OFFSET = re.compile(r"(Z|[+-]\d{2}:?\d{2})$")
#: An ISO date and time (a date alone is a wall-clock time too).
_ISO_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}")


def _csv_time_kind(path: str, line: bytes, columns: Sequence[str], column: str, delimiter: str = ","
                   ) -> str | None:
    """Whether a CSV file's times are instants, from its first data ``line``: ``"UTC"``
    when the time in ``column`` names an offset (pyarrow reads such times as UTC
    instants), ``""`` when it is an ISO wall-clock time without one (naive), ``None``
    when it cannot say (a number, no such column), as a Parquet schema tells it for
    :func:`check_time_zones`: a naive file among aware ones would be read hours from
    its true instants."""
    if column not in columns:
        return None
    fields = split_fields(line, path, delimiter)
    at = list(columns).index(column)
    value = fields[at] if at < len(fields) else ""
    if not _ISO_TIME.match(value):
        return None
    return "UTC" if _OFFSET.search(value) else ""


def probe_table(path: str, fmt: str, timestamp: str | None, so: dict, *, header: bool | str = True,
                names: Sequence[str] | None = None, rename: Mapping[str, str | Sequence[str]] | None = None,
                part_rows: int | None = None, delimiter: str = ",", decimal: str = ".") -> list[TablePart]:
    """Row counts and column names of one file, from metadata only (Parquet) or a
    newline count (CSV, LOBSTER), with canonical names after ``rename`` (a value may
    list alternative source names: the first the file has is read). Text files of
    more than ``part_rows`` rows (default :data:`TEXT_PART_ROWS`) come in parts;
    Parquet row groups are joined into parts of up to as many. A CSV file's fields are
    split by ``delimiter``, its numbers read with the decimal mark ``decimal``; its first
    line is a header with ``header`` true, data with false, and with ``"auto"`` whichever
    the file's first two lines show (:func:`is_header_line`)."""
    check_csv_marks(delimiter, decimal)
    if fmt != "csv" and (delimiter, decimal) != (",", "."):
        # Ignored, they would leave the user believing they applied.
        given = [key for key, value, default in (("source.delimiter", delimiter, ","), ("source.decimal", decimal, "."))
                 if value != default]
        raise FormatMismatchError(path, f"{' and '.join(given)} {'are' if len(given) > 1 else 'is'} for CSV "
                                  f"files, not {fmt} ones: leave {'them' if len(given) > 1 else 'it'} unset")
    part_rows = part_rows or TEXT_PART_ROWS
    rename = dict(rename or {})
    if fmt == "parquet":
        parts = _parquet_parts(path, rename.get(timestamp, timestamp) if timestamp else None, so, part_rows)
    elif fmt == "lobster":
        from pipeline.loaders.lobster import probe_lobster

        parts = probe_lobster(path, so, part_rows)
    elif fmt == "fi2010":
        from pipeline.loaders.fi2010 import probe_fi2010

        parts = probe_fi2010(path, so)  # one part per file: its events run along each line
    else:
        parts = _csv_parts(path, so, header, names, part_rows, rename.get(timestamp, timestamp) if timestamp else None,
                           delimiter, decimal)
    if not rename or not parts:
        return parts
    cols = _renamed(path, parts[0].sources, rename)
    return [replace(p, columns=cols) for p in parts]


def check_csv_marks(delimiter: str, decimal: str) -> None:
    """Refuse a CSV delimiter that is not one character (a newline, a quote or the
    decimal mark among them) and a decimal mark other than ``.`` and ``,``.

    Raises
    ------
    ConfigError
        Naming ``delimiter`` or ``decimal`` (``source.delimiter``, ``source.decimal``).
    """
    if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in "\r\n\"":
        # A tab written '\t' in YAML (single quotes) arrives as a backslash and a "t".
        tab = ' (a tab is "\\t" in double quotes in YAML; in single quotes the backslash stays)' \
            if delimiter in ("\\t", "\\\\t") else ""
        raise ConfigError("source.delimiter", f'one character (not a newline or a quote), such as "," or ";"{tab}',
                          delimiter)
    if decimal not in (".", ","):
        raise ConfigError("source.decimal", '"." or ","', decimal)
    if decimal == delimiter:
        raise ConfigError("source.decimal", f"a mark other than the delimiter {delimiter!r} (set source.delimiter: "
                          '";" for numbers with a decimal comma)', decimal)


def read_columns(part: TablePart, columns: Sequence[str], so: dict) -> dict[str, Any]:
    """Canonical ``columns`` of one CSV or Parquet part, as pyarrow arrays by canonical name."""
    require_pyarrow()
    sources = [part.source_of(c) for c in columns]
    try:
        if part.fmt == "parquet":
            import pyarrow.parquet as pq

            with fsspec.open(part.path, "rb", **so) as fh:
                # One read of the footer per part, however many row groups it holds.
                table = pq.ParquetFile(fh).read_row_groups(list(part.groups), columns=sources)
        else:
            table = _read_csv(part, sources, so)
    except LoaderError:
        raise
    except Exception as exc:  # noqa: BLE001
        line = repeated_header(part, so) if part.fmt == "csv" else None
        if line is not None:
            raise _header_again(part, line) from None
        ragged = ragged_line(part, so) if part.fmt == "csv" and "columns, got" in str(exc) else None
        if ragged is not None:
            line, got, want, blank = ragged
            what = "a line of spaces only: remove it" if blank else "a row cut short or a field too many"
            raise LoaderError(part.path, f"line {line} has {got} fields, expected {want} (as in line 1): {what}; "
                              f"cannot read csv data ({exc})") from None
        raise LoaderError(part.path, f"cannot read {part.fmt} data ({exc})") from None
    if part.fmt == "csv":
        _check_no_header_rows(part, table, sources)
    if table.num_rows != part.rows:
        if part.fmt == "parquet":
            raise LoaderError(part.path, f"expected {part.rows} rows from its metadata, read {table.num_rows}")
        raise LoaderError(part.path, f"expected {part.rows} rows (its lines, counted when the source was opened), "
                          f"read {table.num_rows}: a blank line inside the file, a quoted field holding a newline, "
                          "or the file changed since")
    return {c: table.column(s) for c, s in zip(columns, sources)}


def _read_csv(part: TablePart, sources: Sequence[str], so: dict) -> Any:
    """Columns ``sources`` of a CSV part as a pyarrow table: with the types its first
    bytes showed (:attr:`TablePart.csv_types`), and inferred again where a value does not
    fit them (an integer column with a fraction further down), as without them."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    known = dict(part.csv_types)
    kinds = {"i": pa.int64(), "f": pa.float64()}
    types = {s: kinds.get(known[s]) or pa.decimal128(38, int(known[s][1:])) for s in sources if s in known}

    def read(column_types: dict) -> Any:
        with open_text(part.path, so) as fh:
            return pacsv.read_csv(fh if part.data is None else read_range(fh, part.data),
                                  read_options=_read_options(part),
                                  parse_options=pacsv.ParseOptions(delimiter=part.delimiter),
                                  convert_options=pacsv.ConvertOptions(include_columns=sources, column_types=column_types,
                                                                       decimal_point=part.decimal))

    if types:
        try:
            return read(types)
        except pa.ArrowInvalid:
            pass  # a value the first bytes' types do not hold: read as before
    table = read({})
    for s in sources:
        if known.get(s) == "i" and pa.types.is_floating(table.column(s).type):
            _refuse_rounded_integers(part, s, table.column(s))
    return table


def _refuse_rounded_integers(part: TablePart, source: str, col: Any) -> None:
    """A column of integers (by the file's first bytes) that pyarrow read as doubles
    further down, because a number there does not fit int64: a whole value past 2**53
    was rounded (a vendor's sentinel past int64, a fixed-point price of too many digits):
    refused, naming it and its row. Fractions (``2.5``) and smaller whole numbers are
    held exactly."""
    import pyarrow.compute as pc

    values = np.asarray(pc.fill_null(col, 0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
    big = np.flatnonzero(_rounded(values))
    if big.size:
        r = int(big[0])
        raise LoaderError(part.path, f"column {source!r}: the integer at {row_place(part, r)} (about "
                          f"{values[r]:.6g}) does not fit int64, and no float holds it exactly; if it is a vendor's "
                          "\"no value\" sentinel, list it in source.missing, else store the column in a unit that fits")


def _header_again(part: TablePart, line: int) -> LoaderError:
    """The error for a CSV file whose header appears again at ``line`` (from 1)."""
    return LoaderError(part.path, f"line {line} repeats the header (line 1): files joined with their headers "
                       "(cat a.csv b.csv)? Keep the first header only")


def _check_no_header_rows(part: TablePart, table: Any, sources: Sequence[str]) -> None:
    """Refuse a CSV part holding its header again as a row: a column of text whose value
    is the column's own name (two files joined with their headers) would otherwise be
    read as a column of text, and refused as that."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not part.header:
        return
    for name in sources:
        col = table.column(name)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            at = pc.index(col, pa.scalar(name, col.type)).as_py()
            if at is not None and at >= 0:
                raise _header_again(part, part.row0 + at + 2)  # from 1, the header line counted


def repeated_header(part: TablePart, so: dict) -> int | None:
    """The line (from 1) where a CSV file's header appears again, or None: read line by
    line, only to explain a part that failed to read."""
    if not part.header:
        return None
    try:
        with open_text(part.path, so) as fh:
            header = fh.readline().lstrip(b"\xef\xbb\xbf").rstrip(b"\r\n")
            for k, line in enumerate(fh, start=2):
                if line.rstrip(b"\r\n") == header:
                    return k
    except OSError:
        return None
    return None


def _first_non_number(part: TablePart, col: Any) -> tuple[int, str] | None:
    """The row and value (its first 40 characters) of a column read as text where it
    first holds a value that is no number, or None."""
    for i, value in enumerate(col.to_pylist()):
        if value is None:
            continue
        try:
            float(str(value).replace(part.decimal, ".") if part.fmt == "csv" else value)
        except (TypeError, ValueError):
            return i, str(value)[:40]
    return None


def _first_text(part: TablePart, col: Any) -> str:
    """Where a column read as text first holds a value that is no number (`` at line 15002:
    'abc'``), or nothing: the cast's own message names the value, not its row."""
    found = _first_non_number(part, col)
    return f" at {row_place(part, found[0])}: {found[1]!r}" if found else ""


def ragged_line(part: TablePart, so: dict) -> tuple[int, int, int, bool] | None:
    """The first line (from 1) of a CSV file whose field count differs from its first
    line's, with both counts and whether it holds only spaces, or None: read line by
    line, only to explain a part that pyarrow refused ("Expected 13 columns, got 11",
    which names the row's text, not its line)."""
    delimiter = part.delimiter.encode()
    try:
        with open_text(part.path, so) as fh:
            want = fh.readline().count(delimiter) + 1
            for k, line in enumerate(fh, start=2):
                got = line.count(delimiter) + 1
                # An empty line is skipped by the reader; one of spaces only is a row.
                if got != want and line.strip(b"\r\n"):
                    return k, got, want, not line.strip()
    except OSError:
        return None
    return None


#: LOBSTER message fields of whole numbers: read in float32 only while it holds them
#: exactly. Order ids run past 2**24 = 16,777,216 (8 digits and more), beyond which
#: float32 rounds integers, so that two orders would share an id silently.
LOBSTER_INTEGERS = ("event_type", "order_id", "event_size", "direction")


def check_exact_columns(part: TablePart, columns: Sequence[str], values: np.ndarray, dtype: Any) -> None:
    """Refuse LOBSTER's whole-number message fields (:data:`LOBSTER_INTEGERS`) in
    ``values`` (float64, as read) that ``dtype`` cannot hold exactly: the tables' rule
    for integers (:func:`inexact_integers`), which ``source.dtype: float32`` refuses for
    ``order_id`` when a config is read, applied to ``pipeline.load`` and ``open_source``.

    Raises
    ------
    LoaderError
        Naming the file, the column, the first such value, its line and ``dtype='float64'``.
    """
    dtype = np.dtype(dtype)
    if part.fmt != "lobster" or dtype == np.float64:
        return
    limit = _EXACT_INTEGERS[dtype]
    for j, name in enumerate(columns):
        if part.source_of(name) not in LOBSTER_INTEGERS:
            continue
        bad = np.flatnonzero(np.abs(values[:, j]) > limit)  # NaN compares False
        if bad.size:
            r = int(bad[0])
            why = ": two order ids would read as one" if part.source_of(name) == "order_id" else ""
            raise LoaderError(part.path, f"column {name!r}: the value {int(values[r, j])} at {row_place(part, r)} of "
                              f"its message file does not fit {dtype} exactly ({dtype} holds integers exactly up to "
                              f"{limit:,}{why}); pass dtype='float64' (source.dtype: float64)")


def _read_values(part: TablePart, columns: tuple[str, ...], so: dict, dtype: Any = np.float32,
                 guard: Any = None, rules: Any = None) -> np.ndarray:
    """``(rows, len(columns))`` values of one part in ``dtype`` (float32 or float64), NaN
    kept. In float32, ``guard`` (a :class:`~pipeline.loaders.precision.PriceGuard`)
    checks that the prices keep their ticks (:func:`~pipeline.loaders.precision.check_prices`).
    ``rules`` (:class:`~pipeline.loaders.conversions.ValueRules`) scale fixed-point
    integers and read sentinels as NaN, before either."""
    from pipeline.loaders import precision

    exact = np.dtype(dtype) == np.float64
    checked = precision.price_columns(columns) if not exact and precision.pending(guard) else ()
    if part.fmt == "lobster":
        from pipeline.loaders.lobster import read_book

        values = read_book(part, [part.source_of(c) for c in columns], so)  # float64
        check_exact_columns(part, columns, values, dtype)
        if checked:
            precision.check_prices(part.path, {c: values[:, columns.index(c)] for c in checked}, guard)
        return values if exact else values.astype(np.float32)
    if part.fmt == "fi2010":
        from pipeline.loaders.fi2010 import read_values

        # Parsed in float64 and cast as each line is stored, as np.loadtxt(...).astype would.
        return read_values(part, [part.source_of(c) for c in columns], so, np.float64 if exact else np.float32,
                           [part.source_of(c) for c in checked], guard)
    pa = require_pyarrow()
    import pyarrow.compute as pc

    table = dict(read_columns(part, columns, so))
    target = pa.float64() if exact else pa.float32()
    out = np.empty((part.rows, len(columns)), dtype=np.float64 if exact else np.float32)
    scaled: dict[str, np.ndarray] = {}
    if rules:
        from pipeline.loaders.conversions import convert_column

        for name in columns:
            converted = convert_column(table[name], name, rules, part.path, part.source_of(name),
                                       functools.partial(row_place, part))
            if isinstance(converted, np.ndarray):
                scaled[name] = converted  # exact float64, in units
            elif converted is not None:
                table[name] = converted  # sentinels made null
    for j, name in enumerate(columns):
        if name in scaled:
            out[:, j] = scaled[name]
            continue
        col = table[name]
        if pa.types.is_unsigned_integer(col.type) and len(col) and \
                (pc.max(col).as_py() or 0) > _EXACT_INTEGERS[out.dtype]:  # a safe cast rounds these
            raise inexact_integers(part, name, col, out.dtype)
        try:
            out[:, j] = pc.cast(col, target).to_numpy(zero_copy_only=False)
        except Exception as exc:  # noqa: BLE001
            if pa.types.is_integer(col.type):
                raise inexact_integers(part, name, col, out.dtype) from None
            raise LoaderError(part.path, f"column {name!r}: expected numbers, got {col.type}{_first_text(part, col)} "
                              f"({exc})") from None
    # A column the file stores as float32 loses nothing; a float64 one is read as it is
    # stored, without a copy.
    prices = {c: scaled[c][: precision.CHECK_ROWS] if c in scaled else
              pc.cast(table[c].slice(0, precision.CHECK_ROWS), pa.float64()).to_numpy(zero_copy_only=False)
              for c in checked
              if c in scaled or not (pa.types.is_float32(table[c].type) or pa.types.is_float16(table[c].type))}
    if prices:
        precision.check_prices(part.path, prices, guard)
    return out


#: The largest integer magnitude below which every integer is a float of each dtype
#: (the significand's bits): pyarrow's safe cast refuses integers past it.
_EXACT_INTEGERS = {np.dtype(np.float32): 2**24, np.dtype(np.float64): 2**53}


def inexact_integers(part: TablePart, name: str, col: Any, dtype: Any) -> LoaderError:
    """The error for integer column ``name`` holding a value that ``dtype`` cannot hold
    exactly, naming the first such value and its row, and what to set.

    Integers are read only when the float holds them exactly: a rounded price would be
    another tick, silently. Such integers are usually a vendor's fixed-point prices
    (Databento: units of 1e-9: ``source.scale``), past float64's 2**53 a "no value"
    sentinel (the largest int64, for an empty book level: ``source.missing``; see
    :mod:`pipeline.loaders.conversions`), or a column read only because ``source.nan:
    drop`` reads every column (a second timestamp, an id: ``source.columns``). Which
    one it looks like decides the hint (:func:`~pipeline.loaders.precision.integer_hint`).
    """
    from pipeline.loaders import precision

    dtype = np.dtype(dtype)
    limit = _EXACT_INTEGERS[dtype]
    values = col.to_numpy(zero_copy_only=False) if not col.null_count else \
        np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False))
    # uint64 past int64 would wrap in a signed comparison: compare as Python ints.
    bad = np.flatnonzero([abs(int(v)) > limit for v in values]) if values.dtype == np.uint64 else \
        np.flatnonzero(np.abs(values.astype(np.int64)) > limit)
    r = int(bad[0]) if bad.size else 0
    value = int(values[r])
    own = _own_name(part, name)
    hint = precision.integer_hint(name, part.source_of(name), value, str(col.type), dtype)
    return LoaderError(part.path, f"column {name!r}{own}: the {col.type} value {value} at {row_place(part, r)} "
                       f"does not fit {dtype} exactly ({dtype} holds integers exactly up to {limit:,}); {hint}")


def _own_name(part: TablePart, name: str) -> str:
    """`` (the file's 'X')`` when canonical column ``name`` has another name in the file
    (``source.rename``, LOBSTER's generated names), else nothing: an error names the
    column as the config does and as the file does, so that either can be searched for."""
    source = part.source_of(name)
    return f" (the file's {source!r})" if source != name else ""


def _read_part(part: TablePart, columns: tuple[str, ...], timestamp: str | None, nan: str,
               fill_value: float, so: dict, dtype: Any = np.float32, guard: Any = None,
               rules: Any = None) -> np.ndarray:
    out = _read_values(part, columns, so, dtype, guard, rules)
    if nan != "drop":
        bad = ~np.isfinite(out)
        if bad.any():
            if nan == "raise":
                r, c = np.argwhere(bad)[0]
                why = " (LOBSTER's dummy price of an empty level)" if part.fmt == "lobster" else ""
                where = row_place(part, int(r))
                if part.fmt == "fi2010":  # an event is a field of every line
                    from pipeline.loaders.fi2010 import line_of

                    where = f"event {int(r)} (field {int(r) + 1} of line {line_of(part.source_of(columns[c]))})"
                raise InvalidValueError(
                    part.path, f"NaN or inf{why} in column {columns[c]!r}{_own_name(part, columns[c])} at {where}; "
                    "set source.nan: drop or fill")
            out[bad] = fill_value
    return out


def part_specs(parts: Sequence[TablePart], name: str) -> da.Array:
    """The parts as a 1-D object dask array, one part per chunk, named by content."""
    from dask.base import tokenize

    specs = np.empty(len(parts), dtype=object)
    for i, p in enumerate(parts):
        specs[i] = p
    # Name the layer by its content: a fixed name would make two sources share keys.
    return da.from_array(specs, chunks=1, name=f"{name}-{tokenize(list(parts))}")


def parts_array(parts: Sequence[TablePart], read: Any, *args: Any, token: str, dtype: Any,
                width: int | None = None) -> da.Array:
    """One task per part, ``read(part, *args)`` giving its rows: each part's chunk
    along axis 0 (``width`` columns, or 1-D without). The part is an argument of its
    task, not a task of its own, so a part's chunk is one task with no dependency, which
    the session ordering (:mod:`pipeline.loaders.segments`) can take as it is."""
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
    from dask.task_spec import Task

    name = f"{token}-{tokenize(list(parts), read, args, width)}"
    rest = (0,) if width is not None else ()
    layer = {(name, i, *rest): Task((name, i, *rest), read, p, *args) for i, p in enumerate(parts)}
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[])
    chunks = (tuple(p.rows for p in parts),) + (((int(width),),) if width is not None else ())
    return da.Array(graph, name, chunks=chunks, dtype=dtype, meta=np.empty((0,) * len(chunks), dtype=dtype))


def table_array(parts: Sequence[TablePart], columns: tuple[str, ...], timestamp: str | None, nan: str,
                fill_value: float, so: dict, dtype: Any = np.float32, guard: Any = None,
                rules: Any = None) -> da.Array:
    """One task per part: each part is one chunk of the joined table, in ``dtype``
    (float32, or float64 for prices that float32 cannot hold); in float32, ``guard``
    checks each part's prices (:mod:`pipeline.loaders.precision`)."""
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"table_array: dtype must be float32 or float64, got {dtype}")  # a caller's bug
    if rules:  # only when given: the graph (and its key names) of every other source stays as it was
        return parts_array(parts, _read_part, columns, timestamp, nan, fill_value, so, dtype, guard, rules,
                           token="read-table", dtype=dtype, width=len(columns))
    return parts_array(parts, _read_part, columns, timestamp, nan, fill_value, so, dtype, guard, token="read-table",
                       dtype=dtype, width=len(columns))


def check_columns(parts: Sequence[TablePart], columns: Sequence[str] | None, timestamp: str | None,
                  instrument: str | None = None, read: Sequence[str] | None = None, rules: Any = None
                  ) -> tuple[str, ...]:
    """The columns to read: the requested ones (each present in every file) or every
    numeric column but the timestamp and the instrument column (and but a column without
    a name: the index pandas' ``to_csv`` writes, which is no feature). Of those, only
    the ones ``read`` names when it names some of them only: a column no feature reads
    need not be in every file (a vendor's extra field in some days' files)."""
    first = parts[0]
    wanted = tuple(columns) if columns else tuple(
        c for c in first.columns
        if c not in (timestamp, instrument, "") and first.source_of(c) not in first.non_numeric)
    if not columns and read is not None and set(read) <= set(wanted):
        wanted = tuple(c for c in wanted if c in set(read))
    _check_comma_numbers(parts, wanted if columns else tuple(c for c in first.columns if c not in
                                                                 (timestamp, instrument, "")))
    for p in parts:
        missing = [c for c in wanted if c not in p.columns]
        if missing:
            raise MissingColumnError(p.path, f"missing column(s) {missing}; the file has {list(p.columns)}")
        for what, name in (("timestamp", timestamp), ("instrument", instrument)):
            if name and name not in p.columns:
                raise MissingColumnError(p.path, f"missing {what} column {name!r}; the file has {list(p.columns)}")
    check_units(parts, wanted, rules)
    return wanted


#: A number written with thousands separators (``9,999.50``, ``99.995,00``): text to a
#: CSV reader, whichever decimal mark is set.
_GROUPED = re.compile(r"^\s*[+-]?\d{1,3}([,.' ]\d{3})+([.,]\d+)?\s*$")


def check_numbers_read(parts: Sequence[TablePart], read: Sequence[str] | None, timestamp: str | None,
                       instrument: str | None = None) -> None:
    """Refuse a column the run reads (a feature's or a label's input) that a CSV or
    Parquet file holds as text, naming its first value that is no number and where.

    Left to the default columns, such a column was left out as text, and the feature
    reading it said the column was not in the source, pointing at ``source.rename``; a
    file whose every price had thousands separators gave no column at all, and the
    error blamed ``source.paths``.

    Raises
    ------
    LoaderError
        Naming the file, the column, the value and its line (a CSV's first bytes), or
        that the file's schema stores it as text (Parquet).
    """
    if not read:
        return
    seen: set[str] = set()
    for p in parts:
        if p.fmt not in ("csv", "parquet") or p.path in seen:
            continue
        seen.add(p.path)
        commas = {source for source, _ in p.comma_numbers}  # _check_comma_numbers names their fix
        for name in read:
            source = p.source_of(name) if name in p.columns else None
            if source is None or name in (timestamp, instrument) or source not in p.non_numeric or source in commas:
                continue
            if p.fmt == "parquet":
                raise LoaderError(p.path, f"column {name!r}: expected numbers, but the file's schema stores it as "
                                  "text; write it as a number type")
            row, value = next(((r, v) for s, r, v in p.text_samples if s == source), (None, ""))
            where = f" at {row_place(p, row)}: {value!r}" if row is not None else ""
            hint = ("; it looks like a number with thousands separators, which a CSV reader takes for text: write "
                    "the file without them" if _GROUPED.match(value) else "")
            raise LoaderError(p.path, f"column {name!r}: expected numbers, got text{where}{hint}")


def _check_comma_numbers(parts: Sequence[TablePart], columns: Sequence[str]) -> None:
    """Refuse a CSV column of ``columns`` that holds numbers written with a decimal comma
    while ``source.decimal`` is ``.``: read so, they are text, left out of the default
    columns (a file of such prices gave an array of no column) or refused as no numbers.

    Raises
    ------
    LoaderError
        Naming the file, the column, a value and ``source.decimal: ","``.
    """
    for p in parts:
        for source, value in p.comma_numbers:
            name = next((c for c in columns if p.source_of(c) == source), None)
            if name is None:
                continue
            fix = ('set source.decimal: "," (decimal="," in pipeline.load)' if p.delimiter != "," else
                   'write the file with another delimiter (";") and set source.delimiter: ";" and source.decimal: ","')
            raise LoaderError(p.path, f"column {name!r} holds numbers with a decimal comma, such as {value!r}, read "
                              f"as text with the decimal mark '.': {fix}")


#: Price magnitudes that differ by this factor or more, between a file that stores a
#: column as integers and one that stores it as floats, are two units: fixed-point
#: integers (cents: 100, LOBSTER and ITCH: 10,000, Databento: 1e9) beside decimal
#: prices. A day's prices vary far less; an integer column that a day with a missing
#: value stored as floats keeps its magnitude.
_UNIT_FACTOR = 50.0


def check_units(parts: Sequence[TablePart], columns: Sequence[str], rules: Any = None) -> None:
    """Refuse price columns (named ``*price*``) that one file stores as integers and
    another as floats at magnitudes ``_UNIT_FACTOR`` or more apart (a Parquet file's
    first row group's statistics; a CSV file's first bytes, for a column ``source.scale``
    scales (``rules``): ``17800.0`` is a float as written, though whole, and would be
    scaled as fixed-point): joined, one day's prices would be a thousand or a billion
    times another's, and every normalized value nonsense. Unscaled CSV columns are not
    compared: pyarrow reads a file of whole prices as integers, beside another
    instrument's decimals at another price level.

    Raises
    ------
    LoaderError
        Naming the column, a file of each type, their types and magnitudes.
    """
    for name in (c for c in columns if "price" in c.lower()):
        seen: dict[str, tuple[TablePart, float]] = {}
        for p in parts:
            if p.group != 0:
                continue
            if p.fmt == "csv":  # from its first bytes: integers as written, or decimals
                own = p.source_of(name)
                if rules is None or rules.factor_of(name, own) is None:
                    continue
                kind, size = dict(p.csv_types).get(own, ""), dict(p.csv_magnitudes).get(own)
            elif p.kinds:
                j = p.sources.index(p.source_of(name))
                kind, size = p.kinds[j], p.magnitudes[j]
            else:
                continue
            if kind in ("i", "f") and size is not None and size > 0 and kind not in seen:
                seen[kind] = (p, size)
        if len(seen) < 2:
            continue
        (ip, isize), (fp, fsize) = seen["i"], seen["f"]
        factor = max(isize, fsize) / min(isize, fsize)
        if factor >= _UNIT_FACTOR:
            raise LoaderError(ip.path, f"column {name!r} holds integers up to {isize:.6g}, but {fp.path} holds "
                              f"floats up to {fsize:.6g} (a factor of about {factor:.3g}): the files store it in two "
                              "units (fixed-point integers beside decimal prices), which joined would make no sense; "
                              "convert one set of files to the other's unit, or read each set as a source of its own")


def project_columns(columns: Sequence[str], read: Sequence[str] | None) -> tuple[str, ...]:
    """Of ``columns``, those in ``read`` (in ``columns``' order): all of them when
    ``read`` is ``None`` or names a column outside ``columns``, which is then refused
    by whatever asked for it, naming the columns there are."""
    wanted = None if read is None else set(read)
    if wanted is None or not wanted <= set(columns):
        return tuple(columns)
    return tuple(c for c in columns if c in wanted)
