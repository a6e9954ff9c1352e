"""Multi-scale windows over a ``(T, F)`` series, computed blockwise.

Each input block borrows ``halo`` steps from its left neighbour
(``dask.array.overlap.overlap`` with a backward-only depth) and makes exactly the windows
whose end step it holds, so windows crossing chunk boundaries are right and no window is
made twice. A block takes its windows' rows with ``np.take`` into the output, a bounded
batch of windows at a time: memory per task is the output chunk plus a few hundred KB of
row indices, not a ``sliding_window_view`` copy of the block per scale.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import Task

from pipeline.errors import WindowError
from pipeline.features.filesessions import file_sessions, series_length as _length, session_rows
from pipeline.features.blockwise import rows_task
from pipeline.features.sessions import SegmentTable, WindowRuns, window_runs
from pipeline.features.geometry import (
    block_window_counts,
    bounded_window_chunks,
    chunk_bounds,
    halo,
    input_chunks_for_windows,
    merge_short_chunks,
    rows_per_block,
    split_long_chunks,
    window_count,
    window_ends,
)
from pipeline.storage.arraysource import as_blocks, file_rows

__all__ = [
    "as_series",
    "check_window_ends",
    "file_sessions",
    "row_offsets",
    "session_rows",
    "window_end_rows",
    "window_sessions",
    "windows",
    "windows_at",
    "windows_numpy_block",
]


def _validate(size: int, stride: int, scales: Sequence[int], horizon: int | None = None) -> tuple[int, ...]:
    for name, value in (("size", size), ("stride", stride)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise WindowError(f"windows: {name} must be a positive integer, got {value!r}")
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer))
                                or horizon < 0):
        raise WindowError(f"windows: horizon must be a number of steps, 0 or more (or None), got {horizon!r}")
    scales = tuple(scales)
    if not scales or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s <= 0 for s in scales):
        raise WindowError(f"windows: scales must be positive integers, got {scales!r}")
    return tuple(int(s) for s in scales)


#: Rows per block of a numpy series made a dask array (before the windows' own re-cut).
_SERIES_ROWS = 1 << 16


def as_series(x: da.Array | np.ndarray) -> da.Array:
    """``x`` as a 2-D dask array of known length, in blocks of :data:`_SERIES_ROWS` rows.

    A memory-mapped file (``np.memmap``, ``np.load(path, mmap_mode="r")``, or a view or
    reshape of one) is read by each task from the file, by path and position, as
    :func:`pipeline.write` reads one (:func:`~pipeline.storage.arraysource.as_blocks`):
    a token file larger than memory can be windowed. ``da.from_array`` copies a numpy
    array's every block into the graph when it is built (all of the file, before
    anything is computed), and a map handed to a worker is pickled with its data. Any
    other array is cut into blocks in memory, as before.

    Raises
    ------
    WindowError
        For another number of dimensions, or an unknown length (a boolean mask's).
    """
    _length(x)  # before from_array, whose chunks are for two axes
    if isinstance(x, da.Array):
        return x
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    if file_rows(a) is not None:
        return as_blocks(a, _SERIES_ROWS)
    return da.from_array(a, chunks=(_SERIES_ROWS, -1))


#: Output rows assembled per ``np.take``: bounds the row-index array (int64 per row) to
#: 512 KiB, so it stays in cache beside the output rows. Counted in rows, not windows:
#: a batch of 1,024 one-row windows (labels, times) made a thousand calls per block, and
#: each call releases the GIL and must win it back, which on a busy dask worker (its
#: event loop holding the GIL) cost milliseconds a call: seconds for a block.
_TAKE_ROWS = 1 << 16


def windows_numpy_block(
    block: np.ndarray, local_ends: np.ndarray, size: int, scales: Sequence[int], out: np.ndarray | None = None
) -> np.ndarray:
    """Windows ending at ``local_ends`` (indices into ``block``), scales side by side.

    The one place windows are assembled: the blockwise dask path and the streamer's
    virtual windows both call it, so both give the same bytes.

    Row ``t`` of a window ending at ``e`` is, scale after scale, rows
    ``e - s * (size - 1 - t)`` of ``block``; viewed as ``(n * size * len(scales), F)``
    the output is exactly those rows in order. One ``np.take`` of whole feature rows
    then writes every output byte once, in order, where a fancy index per scale into a
    strided slice would copy each row twice.

    Raises
    ------
    WindowError
        When a window would reach before the block's first row or past its last.
    """
    n, width = local_ends.size, block.shape[1]
    n_scales = len(scales)
    if out is None:
        out = np.empty((n, size, width * n_scales), dtype=block.dtype)
    if n == 0:
        return out
    if not out.flags.c_contiguous:  # the flat view below must alias out
        out[...] = windows_numpy_block(block, local_ends, size, scales)
        return out
    block = np.ascontiguousarray(block)
    ends = np.asarray(local_ends, dtype=np.int64)
    check_window_ends(ends, block.shape[0], size, scales)
    offsets = row_offsets(size, tuple(scales))
    flat = out.reshape(n * size * n_scales, width)
    per = size * n_scales
    batch = max(1, _TAKE_ROWS // per)
    for a in range(0, n, batch):
        b = min(n, a + batch)
        rows = np.add(ends[a:b, None], offsets).reshape(-1)
        np.take(block, rows, axis=0, out=flat[a * per : b * per], mode="clip")
    return out


@functools.lru_cache(maxsize=64)
def row_offsets(size: int, scales: tuple[int, ...]) -> np.ndarray:
    """Where each output row of a window sits relative to its end, scale after scale.

    A read-only ``(size * len(scales),)`` int64 array: the window ending at ``e`` is
    the block's rows ``e + row_offsets(size, scales)``, in output order (every value is
    ``<= 0``). Cached: the streamer assembles every batch of virtual windows with it.
    """
    back = (size - 1 - np.arange(size, dtype=np.int64))[:, None] * np.asarray(scales, dtype=np.int64)[None, :]
    offsets = -back.reshape(-1)
    offsets.flags.writeable = False
    return offsets


def check_window_ends(ends: np.ndarray, rows: int, size: int, scales: Sequence[int]) -> None:
    """Refuse window ends whose windows do not lie inside ``rows`` rows.

    Windows are gathered with ``np.take(mode="clip")`` (unbuffered, fast): a bad end
    would clip silently to a wrong window instead of failing, so callers check first.

    Raises
    ------
    WindowError
        When a window would reach before row 0 or past the last row.
    """
    if ends.size == 0:
        return
    lookback = (size - 1) * max(scales)
    lo, hi = int(ends.min()), int(ends.max())
    if lo < lookback or hi >= rows:
        raise WindowError(
            f"windows: ends {lo}..{hi} with a lookback of {lookback} steps do not fit a block of {rows} rows"
        )


#: Largest output block: a task holds about three of them at its peak (the block, one
#: scale's gather, the halo'd input), so 64 MiB keeps tasks well inside 1 GiB workers.
MAX_BLOCK_BYTES = 64 * 2**20


def _one_series_windows(x: da.Array, size: int, stride: int, scales: Sequence[int],
                        out_chunks: Sequence[int] | None, max_block_bytes: int) -> da.Array:
    """:func:`windows` of one continuous series: one block of windows per block of rows
    (re-cut to ``out_chunks`` or to ``max_block_bytes``), each reading its rows and the
    halo before them."""
    T, F = x.shape
    h = halo(size, scales)
    x = x.rechunk({1: -1})
    if out_chunks is not None:
        chunks = input_chunks_for_windows(out_chunks, T, size, stride, scales)
    else:
        window_bytes = size * F * len(scales) * x.dtype.itemsize
        # Bounded by the rows a block reads as well as by its output: with a stride
        # larger than the window, few output bytes cover many input rows.
        max_steps = min(max(stride, (max_block_bytes // max(1, window_bytes)) * stride),
                        rows_per_block(max_block_bytes // max(1, F * x.dtype.itemsize), h))
        chunks = split_long_chunks(x.chunks[0], max(max_steps, h))
        if h > 0:
            chunks = merge_short_chunks(chunks, h)
    if chunks != x.chunks[0]:
        x = x.rechunk({0: chunks})
    in_chunks = x.chunks[0]
    counts = block_window_counts(in_chunks, size, stride, scales)
    starts = np.concatenate([[0], np.cumsum(in_chunks)[:-1]]).astype(np.int64)
    overlapped = da.overlap.overlap(x, depth={0: (h, 0), 1: 0}, boundary="none") if h > 0 else x

    def block_fn(block: np.ndarray, block_id: tuple[int, ...] = (0, 0)) -> np.ndarray:
        j = block_id[0]
        if counts[j] == 0:
            return np.empty((0, size, F * len(scales)), dtype=block.dtype)
        start = int(starts[j])
        left = min(h, start)  # the first block has no left neighbour to borrow from
        first = max(0, -(-(start - h) // stride))
        ends = h + stride * (first + np.arange(counts[j], dtype=np.int64))
        return windows_numpy_block(block, ends - (start - left), size, scales)

    out = da.map_blocks(
        block_fn,
        overlapped,
        dtype=x.dtype,
        chunks=(counts, (size,), (F * len(scales),)),
        new_axis=2,
        token="windows",
        meta=np.empty((0, 0, 0), dtype=x.dtype),
    )
    return out


def windows(
    x: da.Array | np.ndarray,
    *,
    size: int,
    stride: int = 1,
    scales: Sequence[int] = (1,),
    max_block_bytes: int = MAX_BLOCK_BYTES,
    out_chunks: Sequence[int] | None = None,
    sessions: Sequence[int] | str | None = None,
    names: Sequence[str] | None = None,
    horizon: int | None = None,
) -> da.Array:
    """Windows of a ``(T, F)`` series: ``(n, size, F * len(scales))``, lazily.

    Window ``i`` ends at step ``e_i = (size-1)*max(scales) + i*stride``; at scale ``s``
    it holds steps ``e_i - s*(size-1), ..., e_i - s, e_i``; scales are concatenated along
    the last axis in the order given.

    Parameters
    ----------
    x
        A 2-D dask or numpy array, time along axis 0.
    size
        Steps per window.
    stride
        Steps between consecutive window ends.
    scales
        Sampling intervals, one block of ``F`` columns each, in the order given.
    max_block_bytes
        Blocks of windows are cut so that neither a block nor the rows its task reads
        (its windows' steps and their history, at least the rows one window needs)
        exceed this.
    out_chunks
        Windows per output block, instead of ``max_block_bytes`` (for example the
        writer's units: see :func:`~pipeline.features.geometry.aligned_window_chunks`).
        A chunk whose steps are fewer than the halo is merged with a neighbour.
    sessions
        Rows per session (summing to ``T``): windows are then made within each session
        only, with ends counted from each session's start, and sessions too short for
        a window make none. ``None`` (the default): the files ``x`` was joined from when
        it carries them (an array of several files from :func:`pipeline.load` or
        ``open_source(...).array`` with ``combine="concat"``, or one computed from it
        row for row, such as ``x * 2`` or ``x[:, :2]``; see :func:`file_sessions`),
        otherwise one series. ``"file"``: the files, refused
        for an array that carries none; ``"none"``: one continuous series, across files.
    names
        One name per column of ``x`` (``["mid", "spread", ...]``), recorded once (the
        last axis holds them once per scale) in ``attrs["windows"]["features"]``, from
        where :func:`pipeline.write` stores them.
    horizon
        Steps a label reads after a window's last step (a forecast ``k`` steps
        ahead: ``target[window_end_rows(x, ..., horizon=k) + k]``). Windows whose end
        plus ``horizon`` would leave their session (or the series) are left out, so
        no label is read from the next file. Recorded in ``attrs["windows"]``, from
        where :func:`pipeline.write` takes it for the gap between time splits.
        ``None`` (the default): every window that fits is made, and nothing is
        recorded (the write then asks for ``horizon=``).

    Returns
    -------
    dask.array.Array
        Chunked along windows: one chunk per input block (possibly empty), or per
        span of rows within the sessions. Its ``attrs["windows"]`` holds the geometry
        (``size``, ``stride``, ``scales``, ``halo``, the ``sessions`` used, the
        ``horizon`` when given) and, when given, the feature names.
        :func:`window_end_rows` gives each window's end row.

    Raises
    ------
    WindowError
        When ``x`` is not 2-D, no window fits in ``T`` steps (or in any session),
        ``sessions`` do not add up to ``T``, ``names`` are not one string per
        column of ``x``, or ``horizon`` is not a count of steps; by default, also
        when ``x`` was computed from an array of several files but has other rows
        (``x[5:]``), so that where one file ends is not known.
    """
    scales = _validate(size, stride, scales, horizon)
    lengths, runs, _ = _plan(x, size, stride, scales, sessions, horizon or 0)
    x = as_series(x)
    F = x.shape[1]
    features = _feature_names(names, F)
    h = halo(size, scales)
    geometry: dict[str, Any] = {"size": int(size), "stride": int(stride), "scales": list(scales), "halo": int(h)}
    if lengths is not None:
        geometry["sessions"] = lengths
    if horizon is not None:
        geometry["horizon"] = int(horizon)
    if runs is not None:
        out = windows_at(x, runs, size=size, scales=scales, out_chunks=out_chunks, max_block_bytes=max_block_bytes)
        out.attrs = {"windows": {**geometry, **features}}
        return out
    out = _one_series_windows(x, size, stride, scales, out_chunks, max_block_bytes)
    # The geometry travels with the array, so that pipeline.write can leave the
    # leakage-free gap between time splits by itself.
    out.attrs = {"windows": {**geometry, **features}}
    return out


def _plan(x: Any, size: int, stride: int, scales: tuple[int, ...], sessions: Sequence[int] | str | None,
          horizon: int = 0) -> tuple[list[int] | None, WindowRuns | None, int]:
    """The sessions of ``x`` (``None``: one series), their windows' runs (``None`` for
    one series without a horizon, whose windows the blockwise path makes) and the
    number of windows, for :func:`windows` and :func:`window_end_rows` alike.

    Raises
    ------
    WindowError
        For another shape than ``(T, F)``, bad sessions, or when no window fits.
    """
    T = _length(x)
    h = halo(size, scales)
    lengths = session_rows(x, sessions)
    need = f"{h + 1} steps" + (f", and {horizon} after for the label" if horizon else "")
    if lengths is None and not horizon:
        n = window_count(T, size, stride, scales)
        if n == 0:
            raise WindowError(
                f"windows: a series of {T} steps is too short for size={size} and scales={scales}: "
                f"the first window needs {h + 1} steps"
            )
        return None, None, n
    # A label horizon is a reach forward within the session: the same arithmetic as
    # the sessions' (one session of T rows for a single series).
    table = SegmentTable.from_lengths([T] if lengths is None else lengths)
    runs = window_runs(table, size=size, stride=stride, scales=scales, back=h, fwd=int(horizon))
    if runs.n == 0:
        if lengths is None:
            raise WindowError(f"windows: a series of {T} steps is too short for size={size}, scales={scales} and "
                              f"horizon={horizon}: the first window needs {need}")
        whose = ("; the sessions are the files x was read from (sessions='none' makes one series of them)"
                 if sessions is None else "")
        raise WindowError(f"windows: no session of {max(lengths)} steps or fewer fits a window of "
                          f"size={size} at scales={scales} ({need}){whose}")
    return lengths, runs, runs.n


def window_end_rows(
    x: Any,
    *,
    size: int,
    stride: int = 1,
    scales: Sequence[int] = (1,),
    sessions: Sequence[int] | str | None = None,
    horizon: int | None = None,
) -> np.ndarray:
    """The row of ``x`` each window of ``windows(x, ...)`` ends at, with the same
    arguments: ``(n,)`` int64, in the windows' order. Arithmetic only: nothing is read.

    A per-step label kept apart from ``x`` (a file of its own, one row per step of
    ``x``) aligns with the windows as ``labels[window_end_rows(x, ...)]``; within a
    session the ends are ``start + (size-1)*max(scales) + i*stride``.

    Parameters
    ----------
    x
        The ``(T, F)`` array given to :func:`windows` (its length and, for the default
        ``sessions``, the files it carries).
    size
        Steps per window, as for :func:`windows`.
    stride
        Steps between consecutive window ends, as for :func:`windows`.
    scales
        Sampling intervals, as for :func:`windows`.
    sessions
        Rows per session, ``"file"``, ``"none"`` or ``None``, as for :func:`windows`.
    horizon
        Steps a label reads after a window's end, as for :func:`windows`: windows
        whose ``end + horizon`` would leave their session are left out, so
        ``target[window_end_rows(x, ..., horizon=k) + k]`` never reads the next file.

    Returns
    -------
    numpy.ndarray
        One end row per window, counted from ``x``'s first row.

    Raises
    ------
    WindowError
        As :func:`windows` does for the same arguments.
    """
    scales = _validate(size, stride, scales, horizon)
    _, runs, n = _plan(x, size, stride, scales, sessions, horizon or 0)
    return window_ends(n, size, stride, scales) if runs is None else runs.ends()


def window_sessions(geometry: Mapping[str, Any], n: int) -> np.ndarray:
    """The session of each of ``n`` windows, from the geometry :func:`windows` records
    in ``attrs["windows"]`` (its ``sessions``, ``size``, ``stride``, ``scales`` and
    ``horizon``): ``(n,)`` int64, all 0 for windows of one series. Arithmetic only.

    Raises
    ------
    WindowError
        When the geometry's windows are not ``n`` (the array was sliced or the
        attributes belong to another array), or the geometry lacks a key.
    """
    try:
        size, stride = int(geometry["size"]), int(geometry["stride"])
        scales = tuple(int(v) for v in geometry["scales"])
        horizon = int(geometry.get("horizon") or 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise WindowError(f"windows: attrs['windows'] = {dict(geometry)} lacks a window geometry "
                          f"(expected integer 'size', 'stride' and 'scales'; {exc!r})") from None
    lengths = geometry.get("sessions")
    if not lengths:
        return np.zeros(n, dtype=np.int64)
    runs = window_runs(SegmentTable.from_lengths(lengths), size=size, stride=stride, scales=scales,
                       back=halo(size, scales), fwd=horizon)
    if runs.n != n:
        raise WindowError(f"windows: attrs['windows'] describe {runs.n} windows over sessions of {list(lengths)} "
                          f"rows, the array holds {n} (sliced after pipeline.windows, or another array's attrs)")
    return runs.segments_of().astype(np.int64)


def _feature_names(names: Sequence[str] | None, width: int) -> dict[str, list[str]]:
    """``{"features": [...]}`` for the windows' attrs, or ``{}`` without names.

    Raises
    ------
    WindowError
        When ``names`` is not one string per column.
    """
    if names is None:
        return {}
    # A single string would pass as a sequence of one-letter names.
    if isinstance(names, (str, bytes)):
        raise WindowError(f"windows: names must be a sequence of {width} strings, one per column of x, "
                          f"got the single string {names!r}")
    names = list(names)
    if len(names) != width:
        raise WindowError(f"windows: expected {width} names, one per column of x (shape (T, {width})), "
                          f"got {len(names)}: {names!r}")
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise WindowError(f"windows: names must be strings, got {bad[0]!r} ({type(bad[0]).__name__})")
    return {"features": names}


def windows_at(
    x: da.Array,
    runs: WindowRuns,
    *,
    size: int,
    scales: Sequence[int] = (1,),
    out_chunks: Sequence[int] | None = None,
    max_block_bytes: int = MAX_BLOCK_BYTES,
) -> da.Array:
    """Windows ending at the rows ``runs`` describes: ``(runs.n, size, F * len(scales))``.

    The general form of :func:`windows`: ends need not be evenly spaced over the whole
    series (sessions, instruments, splits, dropped windows), and the graph holds only
    the runs (a few integers per session), never an index per window.

    Parameters
    ----------
    x
        ``(T, F)`` dask array.
    runs
        The windows' end rows, in increasing order.
    size, scales
        Window geometry.
    out_chunks
        Windows per output block (the writer's units); by default blocks of up to
        ``max_block_bytes``.

    Returns
    -------
    dask.array.Array
        Chunked as ``out_chunks`` along windows: one task per block, which slices the
        rows its windows span straight from ``x``'s chunks. By default a block holds
        at most ``max_block_bytes`` of windows whose rows (steps and history) span at
        most ``max_block_bytes`` of ``x`` and no more than ``x``'s longest chunk (or
        one window's rows), as :func:`windows` cuts a series without sessions.
    """
    scales = tuple(int(s) for s in scales)
    T, F = (int(v) for v in x.shape)
    h = halo(size, scales)
    n = runs.n
    width = F * len(scales)
    if out_chunks is None:
        out_chunks = _default_blocks(x, runs, h, size * width * x.dtype.itemsize, max_block_bytes)
    counts = tuple(int(c) for c in out_chunks)
    if sum(counts) != n:
        raise WindowError(f"windows: blocks of {sum(counts)} windows for {n} windows")
    if n == 0:
        return da.zeros((0, size, width), dtype=x.dtype, chunks=((0,), (size,), (width,)))
    x = x.rechunk({1: -1})
    bounds = chunk_bounds(x.chunks[0])
    starts = chunk_bounds(counts)
    name = f"windows-at-{tokenize(x.name, runs, counts, size, scales)}"
    layer = {}
    for j in range(len(counts)):
        sub = runs.slice(int(starts[j]), int(starts[j + 1]))
        key = (name, j, 0, 0)
        if sub.n == 0:
            layer[key] = Task(key, np.empty, [0, size, width], x.dtype)
            continue
        first, last = sub.span()
        lo, hi = first - h, last + 1
        # Each task gets its own windows' runs, relative to its rows: a few integers,
        # not an index per window, and not every session's runs.
        layer[key] = Task(key, _windows_of_rows, rows_task(x, bounds, lo, hi), sub.shifted(-lo), size, scales)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    return da.Array(graph, name, chunks=(counts, (size,), (width,)), dtype=x.dtype,
                    meta=np.empty((0, 0, 0), dtype=x.dtype))


def _default_blocks(x: da.Array, runs: WindowRuns, h: int, window_bytes: int, max_block_bytes: int
                    ) -> tuple[int, ...]:
    """Windows per block, bounded by output bytes and by the rows each task reads.

    A task's rows are sliced from whole chunks of ``x``: keeping its window ends
    within the span of ``x``'s longest chunk keeps its input near what a task of one
    series holds (its chunk and the halo borrowed from its neighbour).
    """
    row_bytes = max(1, int(x.shape[1]) * x.dtype.itemsize)
    span = min(rows_per_block(max_block_bytes // row_bytes, h), max(max(x.chunks[0], default=1), h, 1))
    return bounded_window_chunks(runs.first, runs.count, runs.stride, span=span,
                                 max_windows=max_block_bytes // max(1, window_bytes))


def _windows_of_rows(rows: np.ndarray, local: WindowRuns, size: int, scales: tuple[int, ...]) -> np.ndarray:
    return windows_numpy_block(rows, local.ends(), size, scales)


def gather_rows(x: da.Array, runs: WindowRuns, out_chunks: Sequence[int]) -> da.Array:
    """Row ``e`` of ``x`` (``(T,)`` or ``(T, k)``) for every window end ``e`` of ``runs``,
    in blocks of ``out_chunks``: labels and timestamps of the windows."""
    flat = x.ndim == 1
    x2 = x[:, None] if flat else x
    out = windows_at(x2, runs, size=1, scales=(1,), out_chunks=out_chunks)[:, 0, :]
    return out[:, 0] if flat else out
