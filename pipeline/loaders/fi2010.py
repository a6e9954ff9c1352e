"""FI-2010 benchmark text files: one 149 x N matrix per file, time along the columns.

The FI-2010 limit order book benchmark (Ntakaris et al. 2018) is published as text files
(``BenchmarkDatasets/NoAuction/1.NoAuction_Zscore/.../Train_Dst_NoAuction_ZScore_CF_7.txt``)
of whitespace-separated numbers (``  9.6248629e+00  9.6071740e+00 ...``), one line per
*row* of a ``149 x N`` matrix whose ``N`` columns are events in time order:

- lines 1-40: 10 levels of ask price, ask volume, bid price, bid volume, level by level;
- lines 41-144: the 104 hand-crafted features;
- lines 145-149: the labels for horizons of 1, 2, 3, 5 and 10 events, as published
  1 = up, 2 = stationary, 3 = down.

With ``format="fi2010"`` the loaded table has one row per event and the columns
``ask_price_1, ask_size_1, bid_price_1, bid_size_1, ..., bid_size_10`` (the names the
``book``, ``mid_price`` and ``spread`` features read), ``f41 .. f144`` (the feature of
line ``i`` is ``f{i}``) and ``label_1, label_2, label_3, label_5, label_10``. A file has
no timestamps and no instrument; each file is one session, the files in path order.

When the source is opened, a file's number of events is its first line's field count,
and its lines are counted (one sequential read, no parsing). Each file is one part: an
event range would need every line's bytes, so a read task parses the whole file once,
line by line, and only the lines of the columns it is asked for (a 10-level book and one
label: 41 of 149). A line whose field count differs from the first line's, or a field
that is not a number, is named by its line and field.

Fold files follow the published anchored folds: ``Train_..._CF_k`` holds days ``1..k``,
``Test_..._CF_k`` day ``k + 1``. Files so named are checked to follow one another in
time without overlap, with one normalization, before anything is read.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from pipeline.errors import FormatMismatchError, LoaderError
from pipeline.loaders.lobster import book_columns
from pipeline.loaders.tables import TablePart
from pipeline.loaders.textfiles import open_text

__all__ = ["COLUMNS", "HORIZONS", "ROWS", "check_fold_files", "fold_days", "line_of", "probe_fi2010",
           "read_values"]

#: Rows of the published matrix: lines per file.
ROWS = 149
#: The label horizons (events) of the last five lines.
HORIZONS = (1, 2, 3, 5, 10)
#: The table's columns, line by line.
COLUMNS: tuple[str, ...] = (*book_columns(10), *(f"f{i}" for i in range(41, 145)),
                            *(f"label_{k}" for k in HORIZONS))

#: Whitespace as line breaks: pyarrow then reads a line's fields as one column (empty
#: lines skipped), correctly rounded as ``np.loadtxt`` is.
_FIELDS_AS_LINES = bytes.maketrans(b" \t\r\v\f", b"\n\n\n\n\n")
#: The text MATLAB writes for NaN; pyarrow's other default nulls (NA, NULL, ...) are no
#: number of this format.
_NAN = ["NaN", "nan", "-NaN", "-nan", "NAN"]

_NAME = re.compile(r"^(?P<kind>Train|Test)_Dst_(?P<variant>\w+?)_CF_(?P<fold>\d+)\.txt(\.(gz|bz2|xz))?$")


def line_of(source: str) -> int:
    """The line (from 1) of the file that holds column ``source`` (a name of :data:`COLUMNS`)."""
    return COLUMNS.index(source) + 1


def _content_lines(path: str, so: dict) -> tuple[bytes, int]:
    """The first line and the number of lines up to the last one holding more than
    whitespace (blank lines at the end are no rows), from one sequential read."""
    try:
        with open_text(path, so) as fh:
            first = fh.readline()
            newlines = first.count(b"\n")
            last = 1 if first.strip() else 0
            while True:
                block = fh.read(1 << 24)
                if not block:
                    break
                kept = block.rstrip()
                if kept:
                    last = newlines + kept.count(b"\n") + 1
                newlines += block.count(b"\n")
    except FileNotFoundError:
        raise LoaderError(path, "no such file") from None
    except (OSError, EOFError) as exc:
        raise LoaderError(path, f"cannot read ({exc})") from None
    return first, last


def probe_fi2010(path: str, so: dict) -> list[TablePart]:
    """The one part of an FI-2010 file: its events from the first line's field count,
    its 149 lines counted (nothing parsed)."""
    first, lines = _content_lines(path, so)
    if lines == 0:
        raise FormatMismatchError(path, f"expected an FI-2010 matrix of {ROWS} lines, found an empty file")
    if not first.strip():
        raise FormatMismatchError(path, "line 1 is blank; an FI-2010 file holds one matrix row per line, from "
                                  "the first")
    # A byte-order mark (a file saved by some Windows editors) is not a field: pyarrow
    # skips it when the line is read, so the count must too.
    events = len(first.removeprefix(b"\xef\xbb\xbf").split())
    if lines != ROWS:
        hint = ""
        if events == ROWS:
            hint = (f"; its lines have {ROWS} fields each: it looks transposed (one event per line), which is a "
                    "table: read it as CSV")
        raise FormatMismatchError(
            path, f"has {lines} lines, expected {ROWS}: an FI-2010 file holds one row of the 149 x N matrix per "
            f"line (40 book rows, 104 features, 5 labels), events along the line{hint}")
    return [TablePart(path, "fi2010", 0, events, COLUMNS, sources=COLUMNS, header=False)]


def _bad_field(text: bytes, path: str, lineno: int) -> LoaderError:
    """The error for a line that pyarrow could not read as numbers: its first field that
    is none (found the slow way, only when reading failed)."""
    for i, token in enumerate(text.split()):
        try:
            float(token)
        except ValueError:
            shown = token.decode("utf-8", "replace")
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return LoaderError(path, f"line {lineno} ({COLUMNS[lineno - 1]}), field {i + 1}: expected a number, "
                               f"found {shown!r}")
    return LoaderError(path, f"line {lineno} ({COLUMNS[lineno - 1]}): cannot read its fields as numbers")


def _parse_line(text: bytes, path: str, lineno: int, events: int) -> np.ndarray:
    """One line's fields as float64 (NaN for ``NaN``), exactly ``events`` of them."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    if not text.strip():
        values = np.zeros(0)
    else:
        try:
            table = pacsv.read_csv(
                pa.py_buffer(text.translate(_FIELDS_AS_LINES)),
                read_options=pacsv.ReadOptions(column_names=["v"], use_threads=False, block_size=1 << 26),
                convert_options=pacsv.ConvertOptions(column_types={"v": pa.float64()}, null_values=_NAN))
        except pa.ArrowInvalid:
            raise _bad_field(text, path, lineno) from None
        values = table.column(0).to_numpy(zero_copy_only=False)
    if values.size != events:
        raise LoaderError(path, f"line {lineno} ({COLUMNS[lineno - 1]}) has {values.size} fields, but line 1 has "
                          f"{events}: every line of an FI-2010 file holds one value per event")
    return values


def read_values(part: TablePart, sources: Sequence[str], so: dict, dtype: Any = np.float32,
                checked: Sequence[str] = (), guard: Any = None) -> np.ndarray:
    """``(events, len(sources))`` values of one FI-2010 file in ``dtype``, parsed once:
    only the lines of ``sources``. ``checked``: price columns whose float64 values are
    handed to :func:`~pipeline.loaders.precision.check_prices` before the cast."""
    from pipeline.loaders import precision

    wanted: dict[int, list[int]] = {}
    for j, s in enumerate(sources):
        wanted.setdefault(line_of(s), []).append(j)
    out = np.empty((part.rows, len(sources)), dtype=dtype)
    last = max(wanted, default=0)
    found = 0
    try:
        with open_text(part.path, so) as fh:
            for lineno, text in enumerate(fh, start=1):
                found = lineno
                if lineno in wanted:
                    values = _parse_line(text, part.path, lineno, part.rows)
                    if COLUMNS[lineno - 1] in checked:
                        precision.check_prices(part.path, {COLUMNS[lineno - 1]: values}, guard)
                    for j in wanted[lineno]:
                        out[:, j] = values
                if lineno >= last:
                    break
    except (OSError, EOFError) as exc:
        raise LoaderError(part.path, f"cannot read ({exc})") from None
    if found < last:
        raise LoaderError(part.path, f"has {found} lines, expected {ROWS} (counted when the source was opened); "
                          "did the file change?")
    return out


def fold_days(path: str) -> tuple[str, int, int] | None:
    """``(variant, first day, last day)`` of a file named as published (``Train_Dst_
    NoAuction_ZScore_CF_7.txt``: ``("NoAuction_ZScore", 1, 7)``; ``Test_..._CF_7``: day
    8), or ``None`` for another name."""
    m = _NAME.match(path.replace("\\", "/").rpartition("/")[2])
    if m is None:
        return None
    k = int(m.group("fold"))
    first, last = (1, k) if m.group("kind") == "Train" else (k + 1, k + 1)
    return m.group("variant"), first, last


def check_fold_files(paths: Sequence[str]) -> None:
    """Refuse published fold files (:func:`fold_days`) that, in path order, do not follow
    one another in time (a day twice: ``Train_CF_7`` with ``Train_CF_8`` or
    ``Test_CF_6``; or out of order: a glob puts ``Test_`` before ``Train_``), or mix
    normalizations: sessions are the files in path order."""
    named = [(p, fold_days(p)) for p in paths]
    named = [(p, d) for p, d in named if d is not None]
    for (prev, (pv, pa, pb)), (path, (v, a, b)) in zip(named, named[1:]):
        if v != pv:
            raise LoaderError(path, f"is FI-2010's {v} data, but {prev} is its {pv} data: one source takes one "
                              "normalization")
        if a <= pb:
            what = "a day supplied twice" if b >= pa else "files out of time order"
            raise LoaderError(path, f"holds day(s) {a}-{b} of FI-2010, but the file before it, {prev}, holds day(s) "
                              f"{pa}-{pb} ({what}): the files are sessions in path order; list the Train file of one "
                              "fold first, then the Test files of that fold and the later ones (Train_..._CF_7, "
                              "Test_..._CF_7, Test_..._CF_8, Test_..._CF_9)")
