"""What opening a source scans in its session column and its timestamps: the runs of a
``sessions: {column: NAME}`` column (a session wherever its value changes, refused when a
value comes back), and the steps inside sessions far longer than their typical step
(:class:`~pipeline.errors.SessionGapWarning`). One task per chunk each, their results
joined across chunks; :mod:`pipeline.loaders.segments` uses them.
"""

from __future__ import annotations

from typing import Any, Sequence

import dask
import dask.array as da
import numpy as np

from pipeline.errors import LoaderError
from pipeline.features.geometry import chunk_bounds
from pipeline.features.sessions import GAP_FACTOR, come_back, step_gaps, value_runs
from pipeline.loaders import Source

__all__ = ["column_runs", "column_session_numbers", "gap_report", "gap_tasks", "global_row", "reading_column",
           "session_column", "show_value", "where_in_files"]


def global_row(gap: tuple[int, int, int, int], start: int) -> tuple[int, int, int, int]:
    """A chunk's :func:`~pipeline.features.sessions.step_gaps` with its first gap's row
    counted from the series' start (``start``: the chunk's first row)."""
    return (*gap[:3], gap[3] + start if gap[3] >= 0 else -1)


#: Integers float32 holds exactly: beyond, two session ids could read as one.
_FLOAT32_EXACT = 2**24


def _value_block(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, float]:
    """:func:`~pipeline.features.sessions.value_runs` of one chunk of a session column,
    with its first NaN row (-1: none) and its largest magnitude."""
    b = np.asarray(b).reshape(-1)
    inner, values = value_runs(b)
    nan = np.flatnonzero(np.isnan(b)) if b.dtype.kind == "f" else np.zeros(0, np.int64)
    return inner, values, int(nan[0]) if nan.size else -1, float(np.abs(b).max()) if b.size else 0.0


def where_in_files(row: int, file_rows: Sequence[int], file_names: Sequence[str]) -> str:
    """``file, row n`` of an instrument's row (rows counted in each file from 0, as read)."""
    ends = np.cumsum(np.asarray(file_rows, dtype=np.int64))
    i = min(int(np.searchsorted(ends, row, side="right")), len(file_names) - 1)
    return f"{file_names[i]}: row {row - int(ends[i] - file_rows[i])}"


def show_value(value: float) -> str:
    """A session column's value as a message shows it (``16``, not ``16.0``)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def column_runs(values: da.Array, column: str, file_rows: Sequence[int], file_names: Sequence[str]
                 ) -> tuple[list[int], list[float]]:
    """Row counts and values of one instrument's sessions by ``column`` (``values``: its
    column, rows as read): one pass, each chunk's runs joined to the previous chunk's
    last when their values are equal.

    Raises
    ------
    LoaderError
        Naming the file and row: a value that comes back after another (rows not
        grouped by the column), a NaN, or, read in float32, a value too large for
        float32 to tell from its neighbours.
    """
    rows = int(values.shape[0])
    if rows == 0:
        return [0], [0.0]
    parts = dask.compute(*(dask.delayed(_value_block)(b) for b in values.to_delayed().ravel()))
    bounds = chunk_bounds(values.chunks[0])
    starts: list[int] = []
    run_values: list[float] = []
    for i, (inner, vals, nan, big) in enumerate(parts):
        if nan >= 0:
            raise LoaderError(where_in_files(int(bounds[i]) + nan, file_rows, file_names),
                              f"source.sessions column {column!r} is empty (NaN); every row needs its session")
        if values.dtype == np.float32 and big >= _FLOAT32_EXACT:
            raise LoaderError(file_names[0], f"source.sessions column {column!r} holds values up to {big:,.0f}, "
                              "beyond the integers float32 tells apart (2**24); set source.dtype: float64")
        if vals.size == 0:
            continue
        if run_values and vals[0] == run_values[-1]:
            inner, vals = inner, vals[1:]
        else:
            inner = np.concatenate([[0], inner])
        starts += (inner + int(bounds[i])).tolist()
        run_values += vals.tolist()
    again = come_back(np.asarray(run_values))
    if again is not None:
        first = run_values.index(run_values[again])
        raise LoaderError(where_in_files(starts[again], file_rows, file_names),
                          f"source.sessions column {column!r} has the value {show_value(run_values[again])} again "
                          f"after {show_value(run_values[again - 1])} (first seen at "
                          f"{where_in_files(starts[first], file_rows, file_names)}); rows must be grouped by the "
                          "column: each value in one run of rows, per instrument")
    lengths = np.diff(np.append(starts, rows)).tolist()
    return lengths, run_values


def reading_column(options: dict[str, Any], column: str) -> tuple[dict[str, Any], bool]:
    """The loader options with the session column read too, and whether the array keeps
    it: it does when the options read it anyway (a feature reads it, or every column
    is read), else it is taken out after its values are read."""
    read, columns = options.get("read"), options.get("columns")
    kept = (column in read) if read is not None else (columns is None or column in columns)
    out = dict(options)
    if read is not None and column not in read:
        out["read"] = (*read, column)
    if columns is not None and column not in columns:
        out["columns"] = (*columns, column)
    return out, kept


def session_column(columns: Sequence[str], column: str, src: Source) -> int:
    """The index of the session column among the columns read, or a refusal naming the
    columns there are (a text column, or the timestamp or instrument column, is not read
    as a number)."""
    if column not in columns:
        raise LoaderError(src.files[0].path, f"source.sessions column {column!r} is not among the numeric columns "
                          f"read ({', '.join(columns)}); name a numeric column (a session id or number)")
    return columns.index(column)


def column_session_numbers(values: Sequence[float]) -> np.ndarray:
    """Session numbers by value: equal values (of different instruments) are one period,
    numbered in value order (time order, when the column counts periods)."""
    return np.unique(np.asarray(values, dtype=np.float64), return_inverse=True)[1].reshape(-1)


def gap_tasks(ts: da.Array, lengths: Sequence[int]) -> list[Any]:
    """One task per chunk of an instrument's timestamps ``ts`` counting its gaps
    (:func:`~pipeline.features.sessions.step_gaps`), its sessions of ``lengths`` rows
    told to it: no step onto a session's first row counts, nor a step between chunks."""
    if ts.shape[0] == 0:
        return []
    bounds = chunk_bounds(ts.chunks[0])
    heads = chunk_bounds(np.asarray(lengths, dtype=np.int64))[:-1]
    tasks = []
    for i, b in enumerate(ts.to_delayed().ravel()):
        lo, hi = np.searchsorted(heads, [bounds[i], bounds[i + 1]])
        tasks.append(dask.delayed(_chunk_gaps)(b, heads[lo:hi] - bounds[i], int(bounds[i])))
    return tasks


def _chunk_gaps(b: np.ndarray, heads: np.ndarray, start: int) -> tuple[int, int, int, int]:
    """:func:`~pipeline.features.sessions.step_gaps` of a chunk starting at row ``start``."""
    return global_row(step_gaps(b, heads), start)


def gap_report(found: Sequence[tuple[str, Sequence[tuple[int, int, int, int]], Sequence[int], Sequence[str]]]
                ) -> str | None:
    """The :class:`~pipeline.errors.SessionGapWarning` message for the gaps found, or
    ``None`` without any. ``found``: per instrument, its name, its chunks'
    :func:`~pipeline.features.sessions.step_gaps` (rows of the instrument), and its files'
    rows and names, which name where the first gap is."""
    count = sum(g[0] for _, gaps, _, _ in found for g in gaps)
    if not count:
        return None
    largest = max(g[1] for _, gaps, _, _ in found for g in gaps)
    typical = min(g[2] for _, gaps, _, _ in found for g in gaps if g[0])
    name, gaps, file_rows, names = next(f for f in found if any(g[0] for g in f[1]))
    first = next(g[3] for g in gaps if g[0])
    where = where_in_files(first, file_rows, names)
    return (f"{count:,} step(s) inside sessions are more than {GAP_FACTOR}x the typical step of their part of "
            f"the data ({_duration(typical)}; the largest {_duration(largest)}; the first before {where}"
            f"{f' of {name}' if name else ''}): windows, features' lookback and labels span them. If they are "
            "outages, set source.sessions: {gap: <duration>} to start a new session at each (a duration between "
            "the typical step and the gaps)")


def _duration(ns: int) -> str:
    """``ns`` in its largest unit, to three digits (``13 h``), for a message."""
    for unit, size in (("d", 86_400 * 10**9), ("h", 3600 * 10**9), ("min", 60 * 10**9), ("s", 10**9),
                       ("ms", 10**6), ("us", 10**3)):
        if ns >= size:
            return f"{ns / size:.3g} {unit}"
    return f"{ns} ns"
