"""Time order across a table's files and row groups: each file starts no earlier than the
one before it ends (from Parquet footers, or the rows of CSV and LOBSTER files), or,
with an instrument column, each instrument's rows in a file start no earlier than its
rows in the previous file holding it end; naive and time-zone-aware files are not
mixed, and a step back in time is explained where it has a likely cause (a repeated
daylight-saving hour, times of day without their date).

Pure checks over :class:`~pipeline.loaders.tables.TablePart` bounds and int64
nanoseconds: no file is read here.
"""

from __future__ import annotations

import re
from typing import Any, Collection, Iterator, Mapping, Sequence

import numpy as np

from pipeline.errors import LoaderError
from pipeline.loaders.tables import TablePart, group_parts

__all__ = ["DAY_NS", "check_file_times", "check_instrument_times", "check_time_kinds", "check_time_order",
           "check_time_zones", "epoch_numbers", "files_out_of_order", "files_overlap", "instrument_spans",
           "overlapping_file", "path_hint", "repeated_hour_advice", "time_kind", "time_kinds"]


def check_time_order(parts: Sequence[TablePart], instrument_column: str | None = None) -> None:
    """Files must join in time order: each file starts no earlier than the previous ends,
    and each Parquet row group no earlier than the one before it (from the footers'
    statistics; rows inside a part are checked as they are read).

    With an ``instrument_column`` nothing is compared here: a footer bounds every
    instrument of its file together, and time order holds per instrument (files of one
    symbol each overlap in time, as may a file's instruments one after another).
    :func:`~pipeline.loaders.segments.open_segmented` checks each instrument's rows
    across its files and parts (:func:`check_instrument_times`) once the instruments of
    each part are known."""
    if instrument_column is not None:
        return
    prev = None  # (part, row group, first, last) of the row group before
    for here in _row_group_bounds(parts):
        p, group, first, _ = here
        if first is None:
            continue
        if prev is not None and prev[3] is not None and first < prev[3]:
            q, prev_group, _, last = prev
            if p.path != q.path:
                span = _file_spans(group_parts(parts))
                # source.date joins files in date order: two that overlap share their date.
                dated = p.times_of_day and q.times_of_day and p.day_ns == q.day_ns
                raise files_out_of_order(p.path, first, q.path, last,
                                         times_of_day=_times_of_day(*span[p.path], *span[q.path]),
                                         day=_date_of(p.day_ns) if dated else None, dated=bool(dated))
            advice = repeated_hour_advice(_ns_between(first, last), p.tz)
            advice = advice or "rows must be in time order: sort the file by time"
            raise LoaderError(p.path, f"row group {group} starts at {_shown_time(first)}, before row group "
                              f"{prev_group} ends at {_shown_time(last)}; {advice}")
        prev = here


def _row_group_bounds(parts: Sequence[TablePart]) -> Iterator[tuple[TablePart, int, Any, Any]]:
    """``(part, row group, first, last)`` of each Parquet row group of ``parts`` from its
    footer (another part as one), without a part made per row group: a source of
    thousands of small row groups is checked in milliseconds."""
    for p in parts:
        if not p.group_rows:
            yield p, p.group, p.first_ts, p.last_ts
            continue
        for g, (lo, hi) in zip(p.groups, p.group_bounds):
            yield p, g, lo, hi


#: How far back naive wall-clock times step when a daylight-saving change repeats an
#: hour: up to one hour (the rows just before the change are at most an hour later than
#: the first rows after it), and more than half of one (Lord Howe's change is 30 minutes).
_REPEATED_HOUR_NS = (30 * 60 * 10**9, 3600 * 10**9)


def _ns_between(first: Any, last: Any) -> int:
    """Nanoseconds from ``first`` to ``last`` (footer statistics: datetime64 or integer
    ns), or 0 when they are not times (text, floats)."""
    try:
        return int((np.datetime64(last, "ns") - np.datetime64(first, "ns")).astype(np.int64))
    except (TypeError, ValueError):
        return 0


def repeated_hour_advice(step: int, tz: str | None) -> str | None:
    """What to do about times that go back by ``step`` ns from one row to the next,
    when they look like naive local times across a daylight-saving fall-back (a step
    back of half an hour to an hour, in a column that stores no zone: ``tz`` ``""`` or
    unknown; an aware column's instants never repeat), else ``None``.

    Sorting such rows, the usual advice, would interleave two real hours."""
    lo, hi = _REPEATED_HOUR_NS
    if tz or not lo <= step <= hi:
        return None
    return (f"the time steps back {_duration(step)}, as naive local wall-clock times do when a daylight-saving "
            "change repeats an hour (sorting would interleave two real hours): store the times with their zone "
            "(a Parquet timestamp type with a time zone, or ISO times with their UTC offset in the CSV, "
            "2024-11-03T01:30:00-04:00) or in UTC")


def _duration(ns: int) -> str:
    """``ns`` as minutes and seconds (``59 min 30 s``), for a message."""
    minutes, seconds = divmod(ns / 1e9, 60)
    return f"{int(minutes)} min" + (f" {seconds:.3g} s" if seconds else "")


#: Nanoseconds in a day: times below it are within the epoch's first day.
DAY_NS = 86_400 * 10**9
#: Epoch nanoseconds of 1990-01-01 and 2100-01-01, the dates an order book can have.
_PLAUSIBLE_NS = (631_152_000 * 10**9, 4_102_444_800 * 10**9)


def _as_ns(value: Any) -> int | None:
    """A footer statistic or a row's time as int ns: a datetime64, or an integer (taken
    as ns, the default unit); ``None`` for anything else (text, floats)."""
    if isinstance(value, np.datetime64):
        return int(value.astype("datetime64[ns]").astype(np.int64))
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    return None


def _shown_time(value: Any) -> str:
    """A time for a message: ISO, from an integer too when it is a date of an order book
    in ns or a time within the epoch's first day (a time of day); otherwise as it is
    (an integer in another unit would show a wrong ISO time)."""
    ns = _as_ns(value)
    if ns is None or isinstance(value, np.datetime64):
        return str(value)
    lo, hi = _PLAUSIBLE_NS
    return str(np.datetime64(ns, "ns")) if lo <= ns < hi or 0 <= ns < DAY_NS else str(value)


def _file_spans(parts: Sequence[TablePart]) -> dict[str, tuple[int | None, int | None]]:
    """Each file's earliest and latest time in ns from its row groups' footers (``None``
    where a footer has none, or not a time)."""
    out: dict[str, tuple[int | None, int | None]] = {}
    for p in parts:
        lo, hi = _as_ns(p.first_ts), _as_ns(p.last_ts)
        old_lo, old_hi = out.get(p.path, (lo, hi))
        out[p.path] = (None if lo is None or old_lo is None else min(lo, old_lo),
                       None if hi is None or old_hi is None else max(hi, old_hi))
    return out


def _times_of_day(*bounds: int | None) -> bool:
    """Whether every one of ``bounds`` (files' first and last times, ns) is within the
    epoch's first day: times of day without their date (NASDAQ ITCH's nanoseconds since
    midnight), which make every file 1970-01-01."""
    return all(b is not None and 0 <= b < DAY_NS for b in bounds)


def _date_of(ns: int) -> str:
    """The calendar date of int64 ``ns`` (a naive time), ``YYYY-MM-DD``."""
    return str(np.datetime64(int(ns) // DAY_NS, "D"))


def files_out_of_order(path: str, first: Any, previous: str, last: Any, *, times_of_day: bool = False,
                       day: str | None = None, dated: bool | None = False,
                       instrument: str | None = None) -> LoaderError:
    """The error for file ``path`` that starts (at ``first``) before the ``previous``
    file ends (at ``last``): one message whether the times came from Parquet footers or
    from the rows (CSV, LOBSTER). ``times_of_day``: every time of both files is within
    the epoch's first day, which the message explains instead of the file order.
    ``day``: both files hold that date (``YYYY-MM-DD``), a day supplied twice, likely;
    ``dated``: their dates came from their paths (``source.date``), which ordered them
    (``None``: not known). ``instrument``: the times are that instrument's rows in the
    two files (an instrument column), which are compared with no other instrument's."""
    if instrument is None:
        where = (f"starts at {_shown_time(first)}, before the previous file {previous} ends at "
                 f"{_shown_time(last)}")
        order = "files must be in time order when sorted by name"
    else:
        where = (f"rows of instrument {instrument!r} start at {_shown_time(first)}, before its rows in the "
                 f"previous file holding it, {previous}, end at {_shown_time(last)}")
        order = "each instrument's files must be in time order when sorted by name"
    if day is not None and dated:
        return LoaderError(path, f"{where}: both carry the date {day} (a day supplied twice?); source.date joins "
                           "files in the order of the dates in their paths, one date's files in name order, each "
                           "starting no earlier than the one before it ends: keep one file per day, or name a "
                           "day's files in time order")
    if day is not None:  # from the rows: whether source.date ordered them is not known here
        return LoaderError(path, f"{where}; {order} (by their dates under source.date): both hold "
                           f"times of {day} (a day supplied twice?)")
    if times_of_day:
        return LoaderError(path, f"{where}; every timestamp of both files is within a day of 1970-01-01T00:00: they "
                           "look like times of day (nanoseconds since midnight, as NASDAQ ITCH gives them) without "
                           "their date, so every file is read as 1970-01-01. Store whole times in the timestamp "
                           "column (the file's date added: ns since the epoch, or a timestamp type), or take each "
                           "file's date from its path with source.date ({path: 'data/{date}.parquet'})")
    return LoaderError(path, f"{where}; {order}")


def check_file_times(paths: Sequence[str], first: Sequence[int], last: Sequence[int], *,
                     instrument: str | None = None) -> None:
    """Refuse files that do not follow one another in time: ``first[i]`` and ``last[i]``
    are file ``paths[i]``'s first and last timestamps (int64 ns), files in name order
    (``instrument``: the times are that instrument's rows in each file).

    Parquet files are checked from their footers (:func:`check_time_order`); a CSV or
    LOBSTER file has no footer, so its bounds are read from its rows. A file may start
    at the instant the one before it ends (events share timestamps), not earlier: a day
    supplied twice, or a name that sorts out of time order, would put windows across
    it back in time. An instrument's rows in two files over the same time
    (:func:`overlapping_file`) are refused as that (:func:`files_overlap`), not as an
    order: no order of the files can join them.
    """
    for k in range(1, len(paths)):
        if int(first[k]) < int(last[k - 1]):
            j = overlapping_file(first, last, k) if instrument is not None else None
            if j is not None:
                raise files_overlap(paths[k], int(first[k]), int(last[k]), paths[j], int(first[j]), int(last[j]),
                                    instrument=instrument or "", previous=j == k - 1)
            # Both files' times on one date (source.date's dated times of day among them).
            days = {int(t) // DAY_NS for t in (first[k - 1], last[k - 1], first[k], last[k])}
            day = _date_of(int(first[k])) if len(days) == 1 else None
            raise files_out_of_order(paths[k], np.datetime64(int(first[k]), "ns"), paths[k - 1],
                                     np.datetime64(int(last[k - 1]), "ns"),
                                     times_of_day=_times_of_day(first[k - 1], last[k - 1], first[k], last[k]),
                                     day=day if not _times_of_day(first[k], last[k - 1]) else None, dated=None,
                                     instrument=instrument)


def overlapping_file(first: Sequence[int], last: Sequence[int], k: int) -> int | None:
    """The latest file before file ``k`` whose time span (``first[j]`` to ``last[j]``,
    int64 ns) overlaps file ``k``'s by more than an instant, or ``None``: files that are
    merely out of order (the next day's named first) share none."""
    lo, hi = int(first[k]), int(last[k])
    return next((j for j in range(k - 1, -1, -1) if lo < int(last[j]) and int(first[j]) < hi), None)


def files_overlap(path: str, first: int, last: int, other: str, other_first: int, other_last: int, *,
                  instrument: str, previous: bool = True) -> LoaderError:
    """The error for file ``path`` whose rows of ``instrument`` (``first`` to ``last``,
    int64 ns) overlap in time its rows in the earlier file ``other`` (``previous``: the
    one just before it that holds the instrument).

    Two files holding one instrument over the same time are two feeds (the same
    symbol on two exchanges, spot and futures) or a day supplied twice: renaming them
    cannot help, so the message says how to tell them apart (a column, or a part of
    the path: :func:`path_hint`) or to keep one.
    """
    which = "the previous file holding it" if previous else "an earlier file holding it"
    start, end = max(first, other_first), min(last, other_last)
    return LoaderError(path, f"rows of instrument {instrument!r} start at {np.datetime64(first, 'ns')}, before its "
                       f"rows in {which}, {other}, end at {np.datetime64(other_last, 'ns')}: both files hold its "
                       f"rows from {np.datetime64(start, 'ns')} to {np.datetime64(end, 'ns')}, which no order of the "
                       "files joins: two feeds sharing a symbol (two exchanges, spot and futures), or a day "
                       "supplied twice? A day supplied twice: keep one file. Two feeds: give each its own "
                       "instrument, by a column whose values tell them apart (source.instrument: {column: NAME}) "
                       f"or by a part of the path ({path_hint(path, other)}), or read each feed as a source of "
                       "its own")


#: A date or a number of 4 digits or more in a file name (``2024-01-02``, ``20240102``):
#: what differs from one day's file to the next, ``*`` in a pattern.
_DATED = re.compile(r"\d{4}[\d:-]*")


def path_hint(path: str, other: str) -> str:
    """How ``source.instrument: {path: ...}`` would tell files ``path`` and ``other``
    apart, for a message: when their paths differ in one ``_``- or ``/``-separated field
    that holds no date (Tardis's ``binance_book_snapshot_5_2024-01-02_BTCUSDT.csv.gz``
    beside ``binance-futures_...``), the path with ``{instrument}`` there and dates in
    the file's name as ``*``; else the general form. Either way it says that
    ``{instrument}`` is one part of one folder or file name."""
    a, b = re.split(r"([/_])", path), re.split(r"([/_])", other)
    differ = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    several = ("{instrument} is one part of one folder or file name, so feeds of several symbols need a folder "
               'per feed and symbol, {path: "data/{instrument}/*.csv.gz"}')
    if len(a) != len(b) or len(differ) != 1 or _DATED.search(a[differ[0]] + b[differ[0]]):
        return f"source.instrument: {{path: PATTERN}}; {several}"
    name = max(i for i, field in enumerate(a) if field == "/") + 1 if "/" in a else 0
    pattern = "".join("{instrument}" if i == differ[0] else _DATED.sub("*", field) if i >= name else field
                      for i, field in enumerate(a))
    return (f'source.instrument: {{path: "{pattern}"}} makes {a[differ[0]]!r} and {b[differ[0]]!r} the '
            f"instruments; {several}")


def instrument_spans(codes: np.ndarray, ns: np.ndarray | None, n: int) -> np.ndarray:
    """``(3, n)`` int64: per instrument code ``0 .. n-1``, its rows in a chunk, and the
    timestamps (``ns``, int64) of its first and last of them (0 where it has none, or
    without ``ns``): all a chunk tells of an instrument's time order across chunks, as
    its rows within the chunk are checked when read."""
    codes = np.asarray(codes).reshape(-1).astype(np.int64, copy=False)
    out = np.zeros((3, n), dtype=np.int64)
    out[0] = np.bincount(codes, minlength=n)[:n]
    if ns is not None and codes.size:
        ns = np.asarray(ns, dtype=np.int64).reshape(-1)
        # A code's first row is where it first appears; its last, where it first appears
        # in the reversed rows.
        present, at = np.unique(codes, return_index=True)
        out[1, present] = ns[at]
        present, back = np.unique(codes[::-1], return_index=True)
        out[2, present] = ns[::-1][back]
    return out


def check_instrument_times(paths: Sequence[str], names: Sequence[str], spans: np.ndarray) -> None:
    """Refuse an instrument whose rows go back in time from one chunk holding it to the
    next: ``paths[i]`` is the file of chunk ``i`` (chunks in file order, a file's chunks
    one after another), ``spans[i]`` the chunk's :func:`instrument_spans` over the
    instrument ``names``.

    Each instrument is compared with itself only, so files of one instrument each (a
    vendor's file per symbol and day), or of several, may come in any name order that
    keeps each instrument's own files in time order; a file of an instrument that
    starts before the previous one holding it ends (a day supplied twice, a name out of
    order) is refused naming both files and the instrument, as are its rows going back
    from one part of a file to the next (a file's parts are read apart).
    """
    spans = np.asarray(spans, dtype=np.int64).reshape(len(paths), 3, len(names))
    for k, name in enumerate(names):
        files: list[str] = []
        lo: list[int] = []
        hi: list[int] = []
        for i in np.flatnonzero(spans[:, 0, k] > 0):
            first, last = int(spans[i, 1, k]), int(spans[i, 2, k])
            if files and files[-1] == paths[i]:
                if first < hi[-1]:
                    advice = repeated_hour_advice(hi[-1] - first, None) or \
                        "rows must be in time order: sort the file by time"
                    raise LoaderError(paths[i], f"rows of instrument {name!r} go back in time inside the file: a row at "
                                      f"{np.datetime64(first, 'ns')} follows one at {np.datetime64(hi[-1], 'ns')} "
                                      f"in an earlier part of the file (its row groups or lines are read in parts); "
                                      f"{advice}")
                hi[-1] = last
                continue
            files.append(paths[i])
            lo.append(first)
            hi.append(last)
        check_file_times(files, lo, hi, instrument=name)


def time_kind(part: TablePart, timestamp: str) -> str | None:
    """How a file stores its timestamp column, from its schema: ``"naive"`` (a timestamp
    type without a zone), ``"aware:<zone>"`` (with one), ``"integer"`` or ``"float"``
    (numbers, read in ``source.timestamp_unit``); ``None`` where no schema says (CSV,
    LOBSTER) or for text."""
    if part.tz is not None:
        return f"aware:{part.tz}" if part.tz else "naive"
    if not part.kinds or timestamp not in part.columns:
        return None
    return {"i": "integer", "f": "float"}.get(part.kinds[part.columns.index(timestamp)])


def time_kinds(parts: Sequence[TablePart], timestamp: str) -> dict[str, list[Any]]:
    """``{kind: [first file, files]}`` of the files' :func:`time_kind` (files without
    one left out), in the order the kinds first appear: what the cross-file checks of
    :func:`check_time_kinds` need, and what a store records of its files for an append
    (``pipeline.update``), whose new files are checked against it."""
    seen: dict[str, str] = {}
    for p in parts:
        kind = time_kind(p, timestamp)
        if kind is not None:
            seen.setdefault(p.path, kind)
    out: dict[str, list[Any]] = {}
    for path, kind in seen.items():
        out.setdefault(kind, [path, 0])[1] += 1
    return out


def _said(kind: str) -> str:
    return "naive (no time zone)" if kind == "naive" else f"time-zone-aware ({kind[6:]})"


def check_time_kinds(kinds: Mapping[str, Sequence[Any]], timestamp: str | None,
                     new: Collection[str] = ()) -> None:
    """Refuse files whose timestamp columns cannot be joined by instant: naive beside
    time-zone-aware ones, and a timestamp type beside numbers.

    An aware timestamp is an instant; a naive one is a wall-clock time, which would be
    read as UTC: beside files of another zone it lands hours from its true time. Epoch
    numbers are instants only in the unit ``source.timestamp_unit`` says, and a vendor
    that changes a column's type from a timestamp to numbers has likely changed more
    (unit, zone, precision): the files are refused, as pyarrow refuses to join two
    schemas, rather than joined by a guess.

    Parameters
    ----------
    kinds
        :func:`time_kinds` of the files (of a store's files and an append's, merged).
    timestamp
        The column, for the message.
    new
        Files to name as the odd one out (an append's), before the minority kind.

    Raises
    ------
    LoaderError
        Naming a file of the odd kind, a file of each kind and how many files each has.
    """
    naive = [(k, v) for k, v in kinds.items() if k == "naive"]
    aware = [(k, v) for k, v in kinds.items() if k.startswith("aware:")]
    numbers = [(k, v) for k, v in kinds.items() if k in ("integer", "float")]
    if naive and aware:
        odd_kind, odd = _odd_one_out(naive, aware, new)
        (zone, (first_aware, _)), (naive_first, n_naive) = aware[0], naive[0][1]
        raise LoaderError(odd, f"timestamp column {timestamp!r} is {_said(odd_kind)}; the files mix both, "
                          f"time-zone-aware: {_files(aware)} file(s) (first {first_aware}, {zone[6:]}), naive: "
                          f"{n_naive} file(s) (first {naive_first}); a naive time would be read as UTC, hours from "
                          "its true instant. Store every file's timestamps with their time zone, or every one naive")
    typed = naive + aware
    if typed and numbers:
        odd_kind, odd = _odd_one_out(numbers, typed, new)
        other_kind, (other, _) = (typed if odd_kind in dict(numbers) else numbers)[0]
        n_odd, n_other = (_files(numbers), _files(typed)) if odd_kind in dict(numbers) else \
            (_files(typed), _files(numbers))
        raise LoaderError(odd, f"timestamp column {timestamp!r} holds {_type(odd_kind)} in {n_odd} file(s), but "
                          f"{_type(other_kind)} in {n_other} file(s) (first {other}): a timestamp type and epoch "
                          "numbers are not joined (the numbers' unit and zone would be a guess). Write every file's "
                          "timestamps in one type (the numbers as a timestamp type, for example with "
                          "pd.to_datetime(values, unit='ns', utc=True)), or read each set as a source of its own")


def _type(kind: str) -> str:
    """A :func:`time_kind` as a storage type, for a message."""
    if kind in ("integer", "float"):
        return f"{kind}s (epoch times, read in source.timestamp_unit)"
    return "a naive timestamp type" if kind == "naive" else f"a timestamp type in {kind[6:]}"


def _files(group: Sequence[tuple[str, Sequence[Any]]]) -> int:
    return sum(int(v[1]) for _, v in group)


def _odd_one_out(a: Sequence[tuple[str, Sequence[Any]]], b: Sequence[tuple[str, Sequence[Any]]],
                 new: Collection[str]) -> tuple[str, str]:
    """``(kind, file)`` to name of two groups of kinds that conflict: a new file's (an
    append's, which brought the conflict), else the first file of the smaller group
    (``a`` on a tie), usually the odd one out."""
    for kind, (path, _) in [*a, *b]:
        if path in new:
            return kind, path
    kind, (path, _) = (a if _files(a) <= _files(b) else b)[0]
    return kind, path


def check_time_zones(parts: Sequence[TablePart], timestamp: str | None, *, epochs_utc: bool = False
                     ) -> tuple[str, ...]:
    """The distinct time zones of the files' timestamp columns (sorted; empty when the
    schemas name none), refusing columns that cannot be joined by instant
    (:func:`check_time_kinds`: naive beside time-zone-aware, a timestamp type beside
    numbers).

    With ``epochs_utc`` (an exchange calendar places the rows), epoch numbers are
    instants, counted from 1970-01-01 UTC: ``("UTC",)`` where the files hold numbers
    (:func:`epoch_numbers`), so that they are not read as the exchange's wall clock, as
    naive times of day are (LOBSTER's, ISO text without an offset).

    Raises
    ------
    LoaderError
        Naming the odd file out (the minority kind), and a file of each kind; with
        ``epochs_utc``, a CSV file of text times among files of epoch numbers.
    """
    kinds = time_kinds(parts, timestamp) if timestamp else {}
    check_time_kinds(kinds, timestamp)
    zones = tuple(sorted({k[6:] for k in kinds if k.startswith("aware:") and k[6:]}))
    if not epochs_utc or zones or not timestamp:
        return zones
    said = {p.path: epoch_numbers(p, timestamp) for p in parts}
    numbers = [path for path, n in said.items() if n]
    text = [path for path, n in said.items() if n is False]
    if numbers and text:
        raise LoaderError(text[0], f"timestamp column {timestamp!r} holds text times, but {numbers[0]} holds epoch "
                          f"numbers ({len(numbers)} file(s)): under an exchange calendar numbers are instants (UTC) "
                          "and text without an offset is the exchange's wall clock; write every file's times one way")
    return ("UTC",) if numbers else ()


def epoch_numbers(part: TablePart, timestamp: str) -> bool | None:
    """Whether a CSV or Parquet file's timestamp column holds numbers (True) or text or
    a timestamp type (False), from its schema or its first rows; None where they do not
    say."""
    if part.fmt not in ("csv", "parquet"):
        return None
    own = part.source_of(timestamp)
    if part.fmt == "parquet":
        kind = time_kind(part, timestamp)
        return None if kind is None and own not in part.non_numeric else kind in ("integer", "float")
    if own in dict(part.csv_types):
        return True
    return False if own in part.non_numeric else None
