"""A source split into instruments and sessions: rows in segment order, and the segment table.

Rows are arranged session after session (in time order), and within a session instrument
after instrument (in name order): the windows of a store are then in time order, so the
sessions of a new day come after every stored one and an append only adds at the end.
The table of segments (:class:`~pipeline.features.sessions.SegmentTable`) then tells the
feature stage where no window, feature lookback or label may cross.

Instruments come from the path (``data/{instrument}/*.parquet``: each instrument's files
are opened as a source of their own, so time order is checked per instrument) or from a
column (rows are picked out of every chunk by their instrument code, one task per chunk
and instrument, after one pass that counts them and checks each instrument's time order
across the files and parts holding it: files of one symbol each may interleave).
Sessions come from files (known from the file list), from calendar dates or from gaps
in time (one pass over the timestamps, each chunk compared with its neighbour for the
breaks between chunks), or from a column's value changes (``{column: time_id}``, one
pass over that column, compared alike). Where timestamps are read, steps inside a
session far longer than its typical step are counted in the same pass and reported
once (:class:`~pipeline.errors.SessionGapWarning`): windows and labels span them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import dask
import dask.array as da
import numpy as np

from pipeline.errors import ConfigError, LoaderError, SessionGapWarning
from pipeline.features.blockwise import take_rows
from pipeline.features.geometry import chunk_bounds
from pipeline.features.sessions import InstrumentSpec, SegmentTable, SessionSpec, session_days, step_gaps
from pipeline.loaders import Source, expand_paths, open_source
from pipeline.loaders.registry import format_of
from pipeline.loaders.sessionscan import (column_runs, column_session_numbers, gap_report, gap_tasks, global_row,
                                          reading_column, session_column, show_value)
from pipeline.loaders.timeorder import check_file_times, check_instrument_times, instrument_spans
from pipeline.progress import ordered_compute

__all__ = ["SegmentedSource", "file_groups", "file_types", "open_segmented", "session_major_order", "zone_of"]


@dataclass(frozen=True, slots=True)
class SegmentedSource:
    """Rows of every instrument and session, with the table that delimits them."""

    array: da.Array
    columns: tuple[str, ...]
    timestamps: da.Array | None
    segments: SegmentTable
    sources: tuple[Source, ...]
    #: The session mode (``source.sessions``: ``file``, ``date``, ``gap``, ``none``, ``calendar``).
    session_mode: str = "none"
    skipped: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    #: Per segment, what orders sessions without timestamps: the file name with the
    #: instrument left out (or the date, or ``""``).
    session_keys: tuple[str, ...] = ()
    #: Per segment, its first timestamp (ns), when there are timestamps and sessions.
    first_times: np.ndarray | None = None
    #: The distinct time zones the files' timestamp columns store (empty: naive
    #: timestamps, or none stored); each instrument's dates are taken in its own.
    time_zones: tuple[str, ...] = ()
    #: What the cross-file checks know of the files' columns, per instrument opened as
    #: a source of its own (:func:`file_types`), recorded in the store so that an
    #: append checks its new files against the stored ones without reading them.
    types: dict[str, Any] | None = None
    #: ``source.sessions: {calendar: NAME}``: the calendar, and how many rows the files
    #: hold outside its sessions, left out (not counting rows left out otherwise).
    calendar: str | None = None
    left_out: int = 0
    #: Rows left out otherwise: NaN or inf under ``source.nan: drop``, LOBSTER's halts.
    dropped: int = 0
    #: ``source.sessions: {column: NAME}``: the column whose value changes start sessions.
    session_column: str | None = None

    @property
    def sessions_text(self) -> str:
        """The session mode as a run states it: under a calendar, with the rows left out."""
        if self.session_column is not None:
            return f"column {self.session_column}"
        if self.calendar is None:
            return self.session_mode
        return f"calendar {self.calendar}: {self.left_out:,} row(s) outside its sessions left out"

    @property
    def time_zone(self) -> str | None:
        """The zone of the timestamps' calendar dates, which date splits take their dates
        in too (:func:`~pipeline.features.splits.localize_splits`): the files' one zone,
        or ``None`` for naive timestamps (their wall-clock dates).

        Raises
        ------
        LoaderError
            When the files store several zones: a date would not name one period.
        """
        if len(self.time_zones) > 1:
            raise LoaderError(self.files[0].path, f"the files' timestamps are in several time zones "
                              f"({', '.join(self.time_zones)}): a date (sessions: date, date splits) needs one; "
                              "store every file in one zone")
        return self.time_zones[0] if self.time_zones else None

    @property
    def files(self) -> tuple[Any, ...]:
        return tuple(f for s in self.sources for f in s.files)

    def metadata(self) -> dict[str, Any]:
        """Provenance of every file, the instruments and the session mode."""
        parts = [s.metadata() for s in self.sources]
        out = dict(parts[0])
        out["files"] = [f for p in parts for f in p["files"]]
        out["skipped"] = [s for p in parts for s in p["skipped"]]
        out["shape"] = list(self.array.shape)
        out["instruments"] = list(self.segments.instruments)
        out["sessions"] = self.session_mode
        if self.calendar is not None:
            out["calendar"] = {"name": self.calendar, "rows_left_out": self.left_out}
        if self.session_column is not None:
            out["session_column"] = self.session_column
        if self.types is not None:
            out["types"] = self.types
        return out


def _file_rows(src: Source) -> list[int]:
    """Rows of each file of a source, from how its chunks map to files."""
    chunks = [int(c) for c in src.array.chunks[0]]
    per_file = src.file_chunks
    if per_file is None and len(chunks) == len(src.files):
        per_file = (1,) * len(chunks)
    if per_file is not None:
        edges = np.concatenate([[0], np.cumsum(chunks)])
        idx = np.concatenate([[0], np.cumsum(per_file)])
        return [int(edges[b] - edges[a]) for a, b in zip(idx, idx[1:])]
    rows = [int(f.rows or 0) for f in src.files]
    if sum(rows) != sum(chunks):
        raise LoaderError(src.files[0].path, "cannot tell which rows belong to which file (rows were dropped); "
                          "use source.sessions: date or a gap instead of file")
    return rows


def _breaks(ts: da.Array, mode: str, gap_ns: int, tz: str | None = None, spec: SessionSpec | None = None
            ) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    """Rows (of ``ts``) where a new session starts, row 0 excluded (``tz``: the zone of
    the calendar dates, see :func:`~pipeline.features.sessions.calendar_days`; a
    calendar's sessions change with their trading date, ``spec``'s
    :func:`~pipeline.features.sessions.session_days`), and, date sessions' chunks being
    read here, each chunk's :func:`~pipeline.features.sessions.step_gaps` (its row of the
    first gap made a row of ``ts``): :func:`gap_report`."""
    if ts.shape[0] == 0:
        return np.zeros(0, np.int64), []
    gaps = mode == "date"

    def block(b: np.ndarray) -> tuple[int, int, np.ndarray, tuple[int, int, int, int]]:
        b = np.asarray(b, dtype=np.int64)
        if b.size == 0:
            return 0, 0, np.zeros(0, np.int64), (0, 0, 0, -1)
        if mode in ("date", "calendar"):
            key = session_days(b, tz, spec)
            inner = np.flatnonzero(key[1:] != key[:-1]) + 1
            # A chunk's first and last row stand for it by their dates.
            return int(key[0]), int(key[-1]), inner, step_gaps(b, inner) if gaps else (0, 0, 0, -1)
        inner = np.flatnonzero(np.diff(b) > gap_ns) + 1
        return int(b[0]), int(b[-1]), inner, (0, 0, 0, -1)

    parts = ordered_compute(*(dask.delayed(block)(b) for b in ts.to_delayed().ravel()))
    starts = chunk_bounds(ts.chunks[0])
    out: list[np.ndarray] = []
    prev_last = None
    stats = [global_row(p[3], int(starts[i])) for i, p in enumerate(parts)]
    for i, (first, last, inner, _) in enumerate(parts):
        if starts[i + 1] == starts[i]:
            continue
        if prev_last is not None:
            split = (first != prev_last) if mode in ("date", "calendar") else (first - prev_last > gap_ns)
            if split:
                out.append(np.array([starts[i]]))
        out.append(inner + starts[i])
        prev_last = last
    return (np.concatenate(out) if out else np.zeros(0, np.int64)), stats


def _day_label(day: int) -> str:
    return str(np.datetime64(int(day), "D"))


def _session_runs(rows: int, ts: da.Array | None, spec: SessionSpec, file_keys: Sequence[str],
                  file_rows: Sequence[int], tz: str | None = None
                  ) -> tuple[list[int], list[str], list[tuple[int, int, int, int]] | None]:
    """Row counts of one instrument's sessions, a key per session (equal keys across
    instruments are the same period: the same file name or date) and, where the
    timestamps were read for them (date sessions), each chunk's gaps (:func:`_breaks`;
    else ``None``). ``file_keys``: per file of the instrument, its name with the
    instrument replaced by ``{instrument}``, and ``file_rows`` its rows; ``tz``: the zone
    of the calendar dates."""
    if spec.mode == "none":
        return [rows], [""], None
    if spec.mode == "file":
        return list(file_rows), list(file_keys), None
    if ts is None:
        raise ConfigError("source.sessions", "", detail=f"{spec.mode} sessions need timestamps; set source.timestamp")
    cuts, gaps = _breaks(ts, spec.mode, spec.gap_ns, tz, spec)
    bounds = [0, *cuts.tolist(), rows]
    lengths = [b - a for a, b in zip(bounds, bounds[1:])]
    if spec.mode in ("date", "calendar"):
        if not rows:  # no row in any session (a holiday's file under a calendar): one empty segment, no date
            return [0], [""], gaps if spec.mode == "date" else None
        firsts = ordered_compute(ts[np.asarray(bounds[:-1], dtype=np.int64)])[0]
        keys = [_day_label(d) for d in session_days(np.asarray(firsts, dtype=np.int64), tz, spec)]
        return lengths, keys, gaps if spec.mode == "date" else None
    return lengths, [f"#{i}" for i in range(len(lengths))], None


def _by_code(src: Source) -> list[tuple[str, da.Array, da.Array | None, list[int], list[str]]]:
    """Each instrument's rows of a source whose rows carry instrument codes: its name, rows,
    timestamps, and the rows and session key of each file holding it (a file without
    its rows is none of its sessions: files of one symbol each hold one instrument).

    One pass over the codes and timestamps counts each instrument's rows per chunk and
    finds its first and last time there, for the time order of each instrument across
    files and parts (:func:`~pipeline.loaders.timeorder.check_instrument_times`),
    before anything is written.
    """
    codes = src.instrument_codes
    names = src.instruments
    x = src.array.rechunk({1: -1})
    c2 = codes.rechunk((x.chunks[0],))[:, None]
    t1 = None if src.timestamps is None else src.timestamps.rechunk((x.chunks[0],))
    code_blocks = c2.to_delayed().ravel()
    time_blocks = [None] * len(code_blocks) if t1 is None else t1.to_delayed().ravel()
    spans = np.stack(ordered_compute(*(dask.delayed(instrument_spans)(c, t, len(names))
                                    for c, t in zip(code_blocks, time_blocks))))
    counts = spans[:, 0, :]
    chunk_file = np.repeat(np.arange(len(src.files)), _chunks_per_file(src))
    paths = [f.path for f in src.files]
    if t1 is not None:
        check_instrument_times([paths[i] for i in chunk_file], names, spans)
    per_file = np.zeros((len(src.files), len(names)), dtype=np.int64)
    np.add.at(per_file, chunk_file, counts)
    alone = (per_file > 0).sum(axis=1) == 1  # files of one instrument
    out = []
    for k, name in enumerate(names):
        kc = tuple(int(v) for v in counts[:, k])

        def pick(b: np.ndarray, c: np.ndarray, k: int = k) -> np.ndarray:
            return b[c[:, 0] == k]

        xk = da.map_blocks(pick, x, c2, dtype=x.dtype, chunks=(kc, x.chunks[1]), token=f"instrument-{k}")
        tk = None
        if t1 is not None:
            t2 = t1[:, None]
            tk = da.map_blocks(pick, t2, c2, dtype=t2.dtype, chunks=(kc, (1,)), token=f"instrument-t-{k}")[:, 0]
        # Every file stays when none holds a row of it (all dropped): one empty segment each.
        held = np.flatnonzero(per_file[:, k] > 0) if per_file[:, k].any() else np.arange(len(src.files))
        keys = [_column_key(paths[i], str(name)) if alone[i] else paths[i].replace("\\", "/") for i in held]
        out.append((str(name), xk, tk, per_file[held, k].tolist(), keys))
    return out


def _column_key(path: str, name: str) -> str:
    """The session key of a file holding instrument ``name`` alone: its path with the
    name in the file's base name replaced by ``{instrument}``, where it appears once
    (``..._2024-03-01_{instrument}.csv.gz``), as a path pattern's files are keyed;
    else the path itself."""
    head, sep, base = path.replace("\\", "/").rpartition("/")
    if not name or base.count(name) != 1:
        return head + sep + base
    return head + sep + base.replace(name, "{instrument}")


def _chunks_per_file(src: Source) -> Sequence[int]:
    if src.file_chunks is not None:
        return src.file_chunks
    if len(src.array.chunks[0]) == len(src.files):
        return (1,) * len(src.files)
    rows = np.cumsum([int(f.rows or 0) for f in src.files])
    edges = np.cumsum(src.array.chunks[0])
    idx = np.searchsorted(edges, rows, side="left") + 1
    return np.diff(np.concatenate([[0], idx])).tolist()


def _first_times(lengths: Sequence[int], inst: Sequence[int], timestamps: da.Array, also: Sequence[Any] = ()
                 ) -> tuple[np.ndarray, tuple[Any, ...]]:
    """The first timestamp (ns) of each segment, read from the chunks holding them; an empty
    segment (every row dropped) takes its instrument's previous one, keeping its place.
    ``also``: dask collections computed in the same pass (:func:`gap_tasks`: the chunks
    both read are read once), their results returned beside."""
    lengths = np.asarray(lengths, dtype=np.int64)
    starts = chunk_bounds(lengths)[:-1]
    rows = starts[lengths > 0]
    out = np.zeros(lengths.size, dtype=np.int64)
    firsts, *rest = ordered_compute(take_rows(timestamps, rows) if rows.size else np.zeros(0, np.int64), *also)
    out[lengths > 0] = np.asarray(firsts)
    for k in range(1, lengths.size):
        if lengths[k] == 0 and inst[k] == inst[k - 1]:
            out[k] = out[k - 1]
    return out, tuple(rest)


def _session_numbers(keys: Sequence[str], inst: Sequence[int], first_day: np.ndarray | None,
                     spec: SessionSpec) -> np.ndarray:
    """Session numbers in time order, equal for the same period of different instruments.

    With timestamps a session's period is the calendar day it starts on and its rank
    among its instrument's sessions of that day: file names need not agree across
    instruments (LOBSTER's carry each ticker's own end time), and gap sessions have no
    name at all. Without timestamps, the file name with the instrument left out.
    ``first_day``: the calendar day each segment starts on (:func:`_first_times`, then
    :func:`~pipeline.features.sessions.calendar_days`), or None.
    """
    inst = np.asarray(inst)
    if first_day is None or spec.mode == "none":
        if spec.mode == "gap":
            return np.concatenate([np.arange(np.sum(inst == k)) for k in np.unique(inst)])
        return np.unique(np.asarray(keys, dtype=object).astype(str), return_inverse=True)[1]
    day = np.asarray(first_day, dtype=np.int64)
    ordinal = np.zeros(day.size, dtype=np.int64)
    for k in range(1, day.size):
        if inst[k] == inst[k - 1] and day[k] == day[k - 1]:
            ordinal[k] = ordinal[k - 1] + 1
    period = np.stack([day, ordinal], axis=1)
    return np.unique(period, axis=0, return_inverse=True)[1].reshape(-1)


def session_major_order(session: Sequence[int], instrument: Sequence[int]) -> np.ndarray:
    """The order of segments by session, then instrument (a stable sort): time order
    across instruments, each instrument's own sessions keeping their order."""
    return np.lexsort((np.asarray(instrument), np.asarray(session))).astype(np.int64)


def _rows_in_order(arrays: Sequence[da.Array], lengths: Sequence[int], inst: Sequence[int],
                   order: np.ndarray) -> da.Array:
    """The rows of every instrument's segments (``arrays[k]`` holds instrument ``k``'s
    segments one after another) concatenated in ``order``.

    Segments start on chunk edges when they are files, so the slices are whole chunks
    and the graph only relabels them; the order already is identity for one instrument.
    """
    if len(arrays) == 1 and np.array_equal(order, np.arange(order.size)):
        return arrays[0]
    lengths = np.asarray(lengths, dtype=np.int64)
    inst = np.asarray(inst)
    local = np.zeros(lengths.size, dtype=np.int64)
    for k in np.unique(inst):
        mine = np.flatnonzero(inst == k)
        local[mine] = np.concatenate([[0], np.cumsum(lengths[mine])[:-1]])
    spans = [(int(inst[s]), int(local[s]), int(local[s] + lengths[s])) for s in order if lengths[s] > 0]
    moved = _chunks_in_order(arrays, spans)
    if moved is not None:
        return moved
    parts = [arrays[k][lo:hi] for k, lo, hi in spans]
    return parts[0] if len(parts) == 1 else da.concatenate(parts) if parts else arrays[0][:0]


def _chunks_in_order(arrays: Sequence[da.Array], spans: Sequence[tuple[int, int, int]]) -> da.Array | None:
    """Rows ``[lo, hi)`` of ``arrays[k]`` for each ``(k, lo, hi)`` of ``spans``, one after
    another, as one layer of the arrays' own tasks under new keys, when every span is
    whole chunks and each of those chunks is a task of its own with no dependency (a
    file part's read, :func:`~pipeline.loaders.tables.parts_array`); ``None`` otherwise.

    Sliced and concatenated instead, the reads fused with the slices, and dask kept a
    task per chunk that only handed each read on under the concatenation's keys.
    """
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph
    from dask.task_spec import Task

    if not spans or any(n != 1 for a in arrays for n in a.numblocks[1:]):
        return None
    picked = []
    for k, lo, hi in spans:
        a = arrays[k]
        bounds = chunk_bounds(a.chunks[0])
        first, last = np.searchsorted(bounds, [lo, hi])
        if first >= bounds.size or last >= bounds.size or bounds[first] != lo or bounds[last] != hi:
            return None
        layer = a.dask.layers.get(a.name)
        rest = (0,) * (a.ndim - 1)
        for c in range(int(first), int(last)):
            task = layer.get((a.name, c, *rest)) if layer is not None else None
            if not isinstance(task, Task) or task.dependencies:
                return None
            picked.append((task, int(a.chunks[0][c])))
    a0 = arrays[0]
    if any(a.dtype != a0.dtype or a.shape[1:] != a0.shape[1:] for a in arrays):
        return None
    name = "rows-in-order-" + tokenize([a.name for a in arrays], list(spans))
    rest = (0,) * (a0.ndim - 1)
    layer = {(name, j, *rest): Task((name, j, *rest), t.func, *t.args, **t.kwargs) for j, (t, _) in enumerate(picked)}
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[])
    chunks = (tuple(n for _, n in picked),) + tuple((int(d),) for d in a0.shape[1:])
    return da.Array(graph, name, chunks=chunks, dtype=a0.dtype, meta=a0._meta)


def _instrument_files(files: Sequence[str], instrument: InstrumentSpec | None, fmt: str | None
                      ) -> tuple[dict[str, list[str]] | None, Any]:
    """The files of each instrument named by the path (``None`` when no path names them)
    and ``key_of(file)``: the file's path with its instrument replaced by
    ``{instrument}``, which equals across instruments for the same period.

    LOBSTER names the ticker by itself: everything before the file name's date
    (:func:`~pipeline.loaders.lobster.parse_name`), so ``BRK_A`` stays one ticker and a
    compressed pair (``.csv.gz``) is one like any other.
    """
    def plain(f: str) -> str:
        return f.replace("\\", "/")

    if instrument is None and fmt == "lobster":
        from pipeline.loaders.lobster import parse_name

        tickers = {f: parse_name(plain(f))[0] for f in files}

        def lobster_key(f: str) -> str:
            inner, chain, rest = plain(f).partition("::")  # an archive's member: its own name
            head, sep, base = inner.rpartition("/")
            return (head + sep + "{instrument}" + base[len(tickers[f]):] + chain + rest if f in tickers
                    else plain(f))

        by_ticker: dict[str, list[str]] = {}
        for f in files:
            by_ticker.setdefault(tickers[f], []).append(f)
        return by_ticker, lobster_key
    if instrument is None or not instrument.path:
        return None, plain
    strip = instrument.path_regex()

    def path_key(f: str) -> str:
        name = plain(f)
        m = strip.match(name)
        return name[: m.start("instrument")] + "{instrument}" + name[m.end("instrument"):] if m else name

    by_name: dict[str, list[str]] = {}
    for f in files:
        name = instrument.instrument_of(f)
        if name is None:
            format_of(f, fmt)  # a folder given as a path (a hive partition) is refused as one, with a glob
            raise LoaderError(f, f"does not match source.instrument.path {instrument.path!r}")
        by_name.setdefault(name, []).append(f)
    return by_name, path_key


def _check_file_order(sources: Sequence[Source]) -> None:
    """Refuse files of a source that do not follow one another in time, from their
    first and last timestamps, read where no footer gave them (CSV, LOBSTER): one task
    per file part holding them, all in one compute, before anything is written.

    Each source is one instrument's files, or every file of no instrument; with an
    instrument column :func:`_by_code` checks each instrument's rows instead.
    """
    checks = []
    for src in sources:
        if src.timestamps is None or src.times_from_metadata or len(src.files) < 2:
            continue
        rows = np.asarray(_file_rows(src), dtype=np.int64)
        ends = np.cumsum(rows)
        held = np.flatnonzero(rows > 0)  # a file without rows has no time to compare
        if held.size < 2:
            continue
        picks = np.stack([ends[held] - rows[held], ends[held] - 1], axis=1).reshape(-1)
        checks.append(([src.files[i].path for i in held], take_rows(src.timestamps, picks)))
    if not checks:
        return
    bounds = ordered_compute(*(t for _, t in checks))
    for (paths, _), b in zip(checks, bounds):
        b = np.asarray(b, dtype=np.int64).reshape(-1, 2)
        check_file_times(paths, b[:, 0], b[:, 1])


def _zones(sources: Sequence[Source]) -> tuple[str, ...]:
    return tuple(sorted({z for src in sources for z in src.time_zones}))


def zone_of(src: Any, spec: SessionSpec) -> str | None:
    """The zone of a source's calendar dates (a file source, or a
    :class:`SegmentedSource` as an append numbers its sessions): date sessions refuse
    files of several zones (its ``time_zone``); other modes only number sessions by
    day, in the one zone if there is one."""
    if spec.mode == "date":
        return src.time_zone
    if spec.mode == "calendar":
        # A calendar compares aware timestamps as instants (files of several zones
        # alike: its sessions are instants too), naive ones (None) as wall-clock times
        # in its own zone.
        return src.time_zones[0] if src.time_zones else None
    return src.time_zones[0] if len(src.time_zones) == 1 else None


def file_groups(files: Sequence[str], instrument: InstrumentSpec | None, fmt: str | None) -> dict[str, list[str]]:
    """The files opened together as one source, by instrument name when the path names
    it (LOBSTER: the ticker), else every file under ``""``: the sets whose files a
    build checks against each other (time zones, timestamp types, price units)."""
    by_name, _ = _instrument_files(files, instrument, fmt)
    return by_name if by_name is not None else {"": list(files)}


def file_types(files: Sequence[str], *, timestamp: str | None, storage_options: dict | None = None,
               rename: Any = None, format: str | None = None, files_read: int | None = None,
               zones: Sequence[str] = ()) -> dict[str, Any]:
    """What the loader's cross-file checks compare, of the Parquet ``files`` (their
    footers are read; other formats store no types): how each stores its timestamp
    column (:func:`~pipeline.loaders.timeorder.time_kinds`) and, per price column, the
    first file storing it as integers and as floats with its magnitude
    (:func:`~pipeline.loaders.tables.check_units`).

    Parameters
    ----------
    files
        The files to read the footers of.
    timestamp, storage_options, rename, format
        As the source opens them.
    files_read
        How many files ``files`` stand for, when they are a sample (a build's first and
        last files; its checks refused files of mixed kinds, so one kind found is
        every file's).
    zones
        The zones every file stores (the source's ``time_zones``).

    Returns
    -------
    dict
        ``{"time": {kind: [first file, files]}, "units": {column: {"i" or "f": [file,
        magnitude]}}, "zones": [...]}``, JSON-able.
    """
    from pipeline.loaders.registry import format_of
    from pipeline.loaders.tables import probe_table
    from pipeline.loaders.timeorder import time_kinds

    so = dict(storage_options or {})
    parquet = [f for f in files if format_of(f, format) == "parquet"]
    parts = [p for f in parquet for p in probe_table(f, "parquet", timestamp, so, rename=rename)[:1]]
    kinds = time_kinds(parts, timestamp) if timestamp else {}
    if files_read is not None and len(kinds) == 1:
        next(iter(kinds.values()))[1] = int(files_read)
    units: dict[str, dict[str, list[Any]]] = {}
    for p in parts:
        for name, kind, size in zip(p.columns, p.kinds, p.magnitudes):
            if "price" in name.lower() and kind in ("i", "f") and size is not None and size > 0:
                units.setdefault(name, {}).setdefault(kind, [p.path, float(size)])
    zones = sorted(set(zones) | {k[6:] for k in kinds if k.startswith("aware:")})
    return {"time": kinds, "units": units, "zones": zones}


def _sampled_types(src: Source, timestamp: str | None, options: dict[str, Any],
                   storage_options: dict | None) -> dict[str, Any]:
    """:func:`file_types` of a source's first file and first and last files holding
    rows: a footer read or three, whatever the number of files (the source's own
    checks compared every file, so these stand for all)."""
    infos = src.files
    held = [f.path for f in infos if f.rows]
    sample = list(dict.fromkeys([infos[0].path, *held[:1], *held[-1:]]))
    return file_types(sample, timestamp=timestamp, storage_options=storage_options, rename=options.get("rename"),
                      format=options.get("format"), files_read=len(infos), zones=src.time_zones)


def _non_empty(lengths: list[int], inst: list[int], keys: list[str]) -> tuple[list[int], list[int], list[str]]:
    """The segments that hold rows. A file without rows (a holiday written as a 0-row
    Parquet file or a header-only CSV, or every row dropped) is no session, wherever it
    comes, as a build without the file would make: it has no time to place it by, and
    no window, feature or label to give. With no rows at all, the first segment stays."""
    keep = [i for i, n in enumerate(lengths) if n > 0] or [0]
    return [lengths[i] for i in keep], [inst[i] for i in keep], [keys[i] for i in keep]


def _left_out(sources: Sequence[Source]) -> int:
    """Rows the files hold outside a calendar's sessions, left out (those left out
    otherwise, LOBSTER's halts or NaN under ``nan: drop``, are not counted)."""
    return sum(int(src.outside_calendar) for src in sources)

def _group_sessions(groups: Sequence[tuple], spec: SessionSpec, columns: Sequence[str], first: Source
                    ) -> tuple[list[int], list[int], list[str], dict[int, list], dict[int, list]]:
    """Every instrument's sessions: their row counts, instrument codes and keys (the
    segments holding rows, :func:`_non_empty`), and per instrument with timestamps its
    chunks' gaps, counted already (date sessions), or else the tasks that count them."""
    lengths: list[int] = []
    inst: list[int] = []
    keys: list[str] = []
    gaps: dict[int, list] = {}
    tasks: dict[int, list] = {}
    for k, (name, xk, tk, per_file, file_keys, tz) in enumerate(groups):
        counted = None
        if spec.mode == "column":
            col = session_column(columns, spec.column or "", first)
            rows, vals = column_runs(xk[:, col], spec.column or "", per_file,
                                      [f.replace("{instrument}", name) for f in file_keys])
            ks = [f"{spec.column}={show_value(v)}" for v in vals]
        else:
            rows, ks, counted = _session_runs(int(xk.shape[0]), tk, spec, file_keys, per_file, tz)
        if counted is not None:
            gaps[k] = counted
        elif tk is not None and spec.mode in ("file", "none", "column"):
            tasks[k] = gap_tasks(tk, rows)
        lengths += rows
        inst += [k] * len(rows)
        keys += ks
    return (*_non_empty(lengths, inst, keys), gaps, tasks)


def _per_instrument(by_name: dict[str, list[str]], options: dict[str, Any], so: dict | None) -> list[Source]:
    """A source per instrument (in name order) of its files, each with the same columns
    in the same order.

    Raises
    ------
    LoaderError
        When the instruments' files give different columns (:func:`column_mismatch`).
    """
    sources = [open_source(by_name[name], storage_options=so, **options) for name in sorted(by_name)]
    cols = {s.columns for s in sources}
    if len(cols) > 1 and options.get("read") is not None and len({frozenset(c or ()) for c in cols}) == 1:
        # The same columns in another order (a vendor's export of one instrument): the
        # features read them by name, so each instrument's array takes the first's order.
        return [_in_order(src, sources[0].columns or ()) for src in sources]
    if len(cols) > 1:
        raise column_mismatch(sources, sorted(by_name), options, so)
    return sources


def _in_order(src: Source, columns: Sequence[str]) -> Source:
    """``src`` with its array's columns in the order of ``columns`` (the same names)."""
    from pipeline.loaders import _carrying

    if tuple(src.columns or ()) == tuple(columns):
        return src
    index = [list(src.columns or ()).index(c) for c in columns]
    return _carrying(replace(src, array=src.array[:, index], columns=tuple(columns)))


def _reference_columns(sources: Sequence[Source], asked: set[str]) -> tuple[str, ...]:
    """The columns most instruments' files give; between as many, those holding every
    column the build asks for (``asked``): a file lacking one, or holding it as text,
    gives every numeric column it has instead (:func:`~pipeline.loaders.tables.project_columns`),
    so it is the odd one, even where two instruments make no majority."""
    sets = [s.columns or () for s in sources]
    return max(sets, key=lambda c: (sets.count(c), bool(asked) and asked <= set(c)))  # first of the best


def _file_schema(path: str, options: dict[str, Any], so: dict | None) -> dict[str, str]:
    """Each column of a file (canonical names, after ``rename``) and its type as the
    file stores it: Parquet's own type name, else ``numbers`` or ``text``."""
    from pipeline.loaders.tables import probe_table

    fmt = format_of(path, options.get("format"))
    keys = ("header", "names", "rename", "delimiter", "decimal")
    part = probe_table(path, fmt, options.get("timestamp"), dict(so or {}),
                       **{k: options[k] for k in keys if options.get(k) is not None})[0]
    types = {part.source_of(c): "text" if part.source_of(c) in part.non_numeric else "numbers" for c in part.columns}
    if fmt == "parquet":
        import fsspec
        import pyarrow.parquet as pq

        with fsspec.open(path, "rb", **(so or {})) as fh:
            types.update((f.name, str(f.type)) for f in pq.read_schema(fh))
    return {c: types[part.source_of(c)] for c in part.columns}


def _holds_numbers(kind: str) -> bool:
    """Whether a :func:`_file_schema` type holds numbers a feature reads."""
    return kind == "numbers" or kind.startswith(("int", "uint", "float", "double", "halffloat", "decimal"))


def _listed(names: Sequence[str], most: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def column_mismatch(sources: Sequence[Source], names: Sequence[str], options: dict[str, Any],
                    so: dict | None) -> LoaderError:
    """The error for instruments whose files give different columns: it names the odd
    file (its instrument's columns differ from most instruments', or lack a column the
    build reads where the others have it), the file it was compared with, the columns
    it lacks and adds, and a column it stores as another type (both types), from the
    two files' schemas.

    Parameters
    ----------
    sources
        One source per instrument, in ``names``' order; their columns differ.
    names
        The instruments.
    options
        The loader options the sources were opened with (``read``, ``columns``,
        ``format``, ``timestamp``, header options, ``rename``).
    so
        Storage options.
    """
    asked = set(options.get("read") or ()) | set(options.get("columns") or ())
    ref_cols = _reference_columns(sources, asked)
    odd_at = next(i for i, s in enumerate(sources) if (s.columns or ()) != ref_cols)
    ref_at = next(i for i, s in enumerate(sources) if (s.columns or ()) == ref_cols)
    odd, ref = sources[odd_at].files[0].path, sources[ref_at].files[0].path
    agree = sum((s.columns or ()) == ref_cols for s in sources)
    try:
        mine, theirs = _file_schema(odd, options, so), _file_schema(ref, options, so)
    except (LoaderError, OSError, ValueError):  # the files were read a moment ago; the sources' columns then
        mine = dict.fromkeys(sources[odd_at].columns or (), "numbers")
        theirs = dict.fromkeys(ref_cols, "numbers")
    missing = [c for c in theirs if c not in mine]
    extra = [c for c in mine if c not in theirs]
    # Only a type that changes whether the column holds numbers changes the columns read
    # (integers beside floats are one kind: check_units judges their units).
    typed = [c for c in theirs if c in mine and _holds_numbers(mine[c]) != _holds_numbers(theirs[c])]
    if not (missing or extra or typed):  # the difference lies in a later file: the columns each reads
        missing = [c for c in ref_cols if c not in (sources[odd_at].columns or ())]
        extra = [c for c in (sources[odd_at].columns or ()) if c not in ref_cols]
    what = []
    if missing:
        what.append(f"lacks column(s) {_listed(missing)}")
    if extra:
        what.append(f"adds column(s) {_listed(extra)} that file lacks")
    what += [f"stores column {c!r} as {mine[c]}, where that file has {theirs[c]}" for c in typed]
    if not what and set(sources[odd_at].columns or ()) == set(ref_cols):
        # Features read by name, but a custom feature (or nan: drop) is handed the columns
        # in their order, which then differs between instruments.
        what.append(f"lists the same columns in another order ({', '.join(sources[odd_at].columns or ())})")
    basis = (f"whose columns {agree} of the {len(sources)} instruments share" if agree > 1 and agree * 2 > len(sources)
             else "which holds every column the build reads" if asked and asked <= set(ref_cols) else
             "no majority tells which of the two is right")
    from pipeline.loaders.registry import format_of

    fix = ("LOBSTER files of fewer levels hold fewer columns: read the levels every file has (features' levels, "
           "book levels), or each depth as a source of its own" if format_of(odd, options.get("format")) == "lobster"
           else "fix this file, or give source.rename the other name of a renamed column")
    return LoaderError(odd, f"the columns of instrument {names[odd_at]!r} differ from those of {ref} (instrument "
                       f"{names[ref_at]!r}, {basis}): this file {'; '.join(what) or 'differs'}; every instrument "
                       f"needs the same columns, of the same kinds: {fix}")


def open_segmented(paths: Any, *, sessions: SessionSpec | str | dict | None = None,
                   instrument: InstrumentSpec | dict | None = None,
                   storage_options: dict | None = None, **options: Any) -> SegmentedSource:
    """Open a table source and divide it into instruments and sessions.

    Parameters
    ----------
    paths
        As for :func:`pipeline.loaders.open_source`.
    sessions
        How rows divide into sessions, as :class:`SessionSpec` or in the config's
        spelling (``"file"``, ``{"gap": "30min"}``, ...; default: ``file`` when there are
        several files, else one session).
    instrument
        Where each row's instrument comes from, as :class:`InstrumentSpec` or in the
        config's spelling (``{"column": "symbol"}``; default: one instrument).
    storage_options, options
        Passed to :func:`pipeline.loaders.open_source`.
    """
    if sessions is not None and not isinstance(sessions, SessionSpec):
        sessions = SessionSpec.from_value(sessions, "sessions")
    if instrument is not None and not isinstance(instrument, InstrumentSpec):
        instrument = InstrumentSpec.from_value(instrument, "instrument")
    so = storage_options
    files = expand_paths(paths, so)
    spec = sessions or SessionSpec(mode="file" if len(files) > 1 else "none")
    if spec.mode == "calendar":
        # Rows outside the calendar's sessions are left out by the loader, beside nan: drop.
        options = {**options, "calendar": spec.calendar}
    kept = True
    if spec.mode == "column":
        options, kept = reading_column(options, spec.column or "")
    by_name, key_of = _instrument_files(files, instrument, options.get("format"))
    groups: list[tuple[str, da.Array, da.Array | None, list[int], list[str], str | None]] = []
    sources: list[Source] = []
    checked = False  # whether the files' time order was checked per instrument already
    if by_name is not None:
        sources = _per_instrument(by_name, options, so)
        groups = [(name, src.array, src.timestamps, _file_rows(src), [key_of(f.path) for f in src.files],
                   zone_of(src, spec)) for name, src in zip(sorted(by_name), sources)]
    elif instrument is not None and instrument.column:
        src = open_source(files, storage_options=so, instrument_column=instrument.column, **options)
        sources.append(src)
        for name, xk, tk, per_file, file_keys in _by_code(src):  # time order checked per instrument
            groups.append((name, xk, tk, per_file, file_keys, zone_of(src, spec)))
        checked = True
    else:
        src = open_source(files, storage_options=so, **options)
        sources.append(src)
        groups.append(("", src.array, src.timestamps, _file_rows(src), [key_of(f.path) for f in src.files],
                       zone_of(src, spec)))
    if not checked:
        _check_file_order(sources)
    timestamp = options.get("timestamp")
    types = None
    if timestamp and options.get("format") not in ("lobster", "fi2010"):
        names = sorted(by_name) if by_name is not None else [""]
        types = {"timestamp": timestamp,
                 "groups": {n: _sampled_types(src, timestamp, options, so) for n, src in zip(names, sources)}}

    columns = tuple(sources[0].columns or ())
    lengths, inst, keys, gaps, tasks = _group_sessions(groups, spec, columns, sources[0])
    stamps = [g[2] for g in groups]
    timestamps = None
    if all(t is not None for t in stamps):
        timestamps = stamps[0] if len(stamps) == 1 else da.concatenate(stamps)
    # Gaps inside sessions are counted where the timestamps are read: with date
    # sessions' breaks, else in the pass reading each session's first time (its chunks
    # read once for both); gap sessions split at them, a calendar's sessions are its own.
    first_ns = None
    if timestamps is not None and spec.mode != "none":
        first_ns, counted = _first_times(lengths, inst, timestamps, list(tasks.values()))
        gaps.update(zip(tasks, counted))
    elif tasks:
        gaps.update(zip(tasks, ordered_compute(*tasks.values())))
    first_day = None
    if first_ns is not None:  # each segment's day in its instrument's zone
        first_day = np.zeros_like(first_ns)
        for k, g in enumerate(groups):
            mine = np.asarray(inst) == k
            first_day[mine] = session_days(first_ns[mine], g[5], spec)
    session = (column_session_numbers([float(k.rpartition("=")[2]) for k in keys]) if spec.mode == "column"
               else _session_numbers(keys, inst, first_day, spec))
    if options.get("format") == "fi2010" and spec.mode == "file" and len(groups) == 1:
        # No timestamps, and names that do not sort in time order (Train_ after Test_):
        # the files are the sessions in path order (published fold names are checked to
        # follow one another, pipeline.loaders.fi2010.check_fold_files).
        session = np.arange(len(keys))
    labels = [k.replace("{instrument}", groups[i][0]) for k, i in zip(keys, inst)]
    order = session_major_order(session, inst)
    array = _rows_in_order([g[1] for g in groups], lengths, inst, order)
    if timestamps is not None:
        timestamps = _rows_in_order(stamps, lengths, inst, order)
    table = SegmentTable.from_lengths(np.asarray(lengths)[order], instrument=np.asarray(inst)[order],
                                      session=np.asarray(session)[order], instruments=[g[0] for g in groups],
                                      labels=[labels[i] for i in order])
    if not kept:  # the session column was read for its sessions only, not as a feature
        col = columns.index(spec.column)
        array = array[:, [i for i in range(len(columns)) if i != col]]
        columns = columns[:col] + columns[col + 1:]
    report = gap_report([(g[0], gaps[k], g[3], [f.replace("{instrument}", g[0]) for f in g[4]])
                          for k, g in enumerate(groups) if k in gaps])
    if report is not None:
        warnings.warn(SessionGapWarning(report), stacklevel=2)
    return SegmentedSource(array=array, columns=columns, timestamps=timestamps,
                           segments=table, sources=tuple(sources), session_mode=spec.mode,
                           session_keys=tuple(keys[i] for i in order),
                           first_times=None if first_ns is None else first_ns[order],
                           skipped=tuple(s for src in sources for s in src.skipped), time_zones=_zones(sources),
                           types=types, calendar=spec.calendar if spec.mode == "calendar" else None,
                           left_out=_left_out(sources) if spec.mode == "calendar" else 0,
                           dropped=sum(int(src.rows_dropped) for src in sources),
                           session_column=spec.column if spec.mode == "column" else None)
