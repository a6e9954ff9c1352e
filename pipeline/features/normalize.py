"""Normalization statistics fitted without look-ahead, and their application blockwise.

- ``global``: each feature's mean and std over the rows of the training period (the
  windows of the split named ``train``, else of the first split; or of the first fold's
  training sessions): every row a fitted window holds, and every row between two
  consecutive windows of a session that are both fitted. A stride wider than a window
  therefore does not thin the rows out: the statistics are those of the period, as a
  scaler fitted on the training rows gives them, whatever the stride. Rows between two
  fitted windows with a window of another split (or of none) between them are not
  counted, so other splits never inform the statistics; nor are a session's first
  ``lookback`` rows. ``per: instrument`` fits one mean and std per instrument, on its
  own such rows.
- ``trailing``: each session z-scored with the pooled statistics of the ``N`` sessions of
  its instrument before it. A session whose ``N`` sessions before it hold fewer than
  :data:`MIN_HISTORY_ROWS` rows after the features' lookback (a short day) makes no
  window, as the first ``N`` sessions make none (:func:`trailing_history_rows`); one
  whose history holds enough rows but fewer finite values of a feature is refused.

Both are pooled from moments (count, mean, sum of squared deviations, in float64: prices
far from zero lose no digits, as a sum of squares would) combined with Chan et al.'s
update. The moments are taken over a fixed grid of cells, not over the source's chunks:
each segment's usable rows are cut into cells of :data:`CELL_ROWS` rows from its first
usable row, the features are rechunked so that no cell is split, and the cells' moments
are combined in row order. Floating-point sums depend on how the rows are grouped, so
this makes the statistics, and every stored window, the same bits whatever
``source.chunk_rows`` or the files' sizes are; and a segment's moments do not depend on
the rows before it, so an append's new sessions get the moments a full build gives them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import dask
import dask.array as da
import numpy as np

from pipeline.errors import WindowError
from pipeline.features.geometry import chunk_bounds
from pipeline.features.sessions import SegmentTable, WindowRuns
from pipeline.features.splits import NormalizeSpec

__all__ = ["CELL_ROWS", "MIN_HISTORY_ROWS", "RowScaler", "apply_normalization", "cell_edges", "combine_moments",
           "describe_segment", "fit_normalization", "row_scaler", "segment_moments",
           "trailing_history_rows"]

#: Rows of a cell of the grid moments are taken over (:func:`cell_edges`): large enough
#: that a cell's task costs little beside its rows, small enough to hold in a worker.
CELL_ROWS = 1 << 16

#: Fewest rows (and finite values of each feature) trailing statistics are fitted on.
#: A std needs two: statistics of no value would be 0 and 1, storing the session
#: unscaled beside z-scored ones, and one value's std of 0 taken as 1 only centres it.
MIN_HISTORY_ROWS = 2


def _intervals(runs: WindowRuns, halo: int) -> list[tuple[int, int]]:
    """Row intervals ``global`` statistics are fitted on, merged: each run of
    consecutive windows from its first window's first step to its last window's end
    (the rows between windows of a stride wider than a window included)."""
    out: list[list[int]] = []
    for first, count in zip(runs.first.tolist(), runs.count.tolist()):
        lo, hi = first - halo, first + (count - 1) * runs.stride + 1
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(a, b) for a, b in out]


def cell_edges(segments: SegmentTable, lookback: int, cell: int = CELL_ROWS) -> np.ndarray:
    """Row edges of the chunks that moments are taken in: every segment's usable rows
    (from ``start + lookback``) are cut every ``cell`` rows counted from its first usable
    row, and chunks end at a segment's end once they hold ``cell`` rows or more (short
    sessions share a chunk). A pure function of the segment table: the same grid for
    any chunking of the source.

    Returns
    -------
    numpy.ndarray
        Increasing int64 edges from 0 to ``segments.rows``.
    """
    edges = [0]
    for a, b in zip(segments.starts.tolist(), segments.stops.tolist()):
        edges.extend(range(a + lookback + cell, b, cell))
        if b - edges[-1] >= cell:
            edges.append(b)
    if edges[-1] != segments.rows:
        edges.append(segments.rows)
    return np.asarray(edges, dtype=np.int64)


def segment_moments(block: np.ndarray, lo: int, segments: SegmentTable, lookback: int,
                    keep: tuple[np.ndarray, np.ndarray] | None = None) -> list[tuple]:
    """``(segment, count, mean, m2)`` per feature for each segment's usable rows in a block
    that starts at row ``lo``; non-finite values are left out. ``keep``: the
    ``(starts, stops)`` of the only row intervals counted (sorted, disjoint)."""
    hi = lo + block.shape[0]
    out = []
    first = int(np.searchsorted(segments.stops, lo, side="right"))
    for s in range(first, len(segments)):
        a = max(lo, int(segments.starts[s]) + lookback)
        b = min(hi, int(segments.stops[s]))
        if int(segments.starts[s]) >= hi:
            break
        if b <= a:
            continue
        # C order whatever the block's: numpy's sums group the rows by layout.
        rows = np.asarray(block[a - lo : b - lo], dtype=np.float64, order="C")
        if keep is not None:
            steps = np.arange(a, b)
            j = np.searchsorted(keep[1], steps, side="right")
            inside = j < keep[0].size
            inside[inside] = keep[0][j[inside]] <= steps[inside]
            if not inside.any():
                continue
            rows = rows[inside]
        finite = np.isfinite(rows)
        n = finite.sum(axis=0)
        vals = np.where(finite, rows, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = vals.sum(axis=0) / n
            m2 = (np.where(finite, rows - mean, 0.0) ** 2).sum(axis=0)
        out.append((s, n.astype(np.float64), np.nan_to_num(mean), m2))
    return out


def combine_moments(parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], width: int
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pooled ``(count, mean, m2)`` of several parts (Chan et al.'s parallel update)."""
    n = np.zeros(width)
    mean = np.zeros(width)
    m2 = np.zeros(width)
    for nb, mb, m2b in parts:
        total = n + nb
        with np.errstate(invalid="ignore", divide="ignore"):
            delta = mb - mean
            mean = np.where(total > 0, mean + delta * nb / total, 0.0)
            m2 = np.where(total > 0, m2 + m2b + delta**2 * n * nb / total, 0.0)
        n = total
    return n, mean, m2


def fit_normalization(f: da.Array, spec: NormalizeSpec, segments: SegmentTable, fit_runs: WindowRuns,
                      halo: int, lookback: int = 0, prior: tuple[SegmentTable, Sequence[Any]] | None = None,
                      cell: int = CELL_ROWS, serves: np.ndarray | None = None, features: Sequence[str] = ()
                      ) -> tuple[list[Any], Callable[[Sequence[Any]], dict[str, Any]]]:
    """The dask objects that compute ``spec``'s statistics, and a function that turns
    their results into the statistics recorded in the store's metadata.

    The caller computes them together with its other reductions: one pass over the data.
    Moments are taken over the grid of :func:`cell_edges` (``cell`` rows) and combined
    in row order, so the statistics are the same bits for any chunking of ``f``.
    ``global`` statistics come from the rows :func:`_intervals` gives for ``fit_runs``
    (with ``halo``: each run of consecutive windows from its first window's first step
    to its last window's end; ``per: instrument``: ``mean`` and ``std`` hold a row per
    instrument of ``segments``, in its order, named by ``instruments``; an instrument
    without such rows gets 0 and 1). Trailing statistics record each segment's moments
    too (``moments``), so that an append scales its new sessions by the stored ones
    before them: ``prior`` is the stored segment table and its moments, and the
    statistics returned are then the new segments' only. ``serves``: whether each
    segment makes windows (default: every one with ``spec.sessions`` sessions before
    it); ``features``: the features' names, for the refusal below.

    Raises
    ------
    WindowError
        From the returned function, for ``trailing``: a segment that ``serves`` windows
        and whose history holds fewer than :data:`MIN_HISTORY_ROWS` finite values of a
        feature, naming the session, its instrument and the feature.
    """
    if spec.kind not in ("global", "trailing"):
        return [], lambda res: {"kind": spec.kind}
    width = int(f.shape[1])
    edges = cell_edges(segments, lookback, cell)
    grid = f.rechunk((tuple(np.diff(edges).tolist()), f.chunks[1])).to_delayed().ravel()
    keep = None
    cells = np.arange(edges.size - 1)
    if spec.kind == "global":
        spans = np.asarray(_intervals(fit_runs, halo), dtype=np.int64).reshape(-1, 2)
        keep = (spans[:, 0], spans[:, 1])
        # Only the cells that hold fitted rows: the others are never read for this.
        touched = np.searchsorted(spans[:, 1], edges[:-1], side="right")
        inside = touched < len(spans)
        inside[inside] = spans[touched[inside], 0] < edges[1:][inside]
        cells = cells[inside]
    tasks = [dask.delayed(segment_moments)(grid[i], int(edges[i]), segments, lookback, keep) for i in cells]

    def per_segment(res: Sequence[Any]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        per: dict[int, list] = {}
        for parts in res:  # cells in row order: one order of combination for any chunking
            for s, n, m, m2 in parts:
                per.setdefault(s, []).append((n, m, m2))
        return [combine_moments(per.get(s, []), width) for s in range(len(segments))]

    if spec.kind == "global":

        def finish_global(res: Sequence[Any]) -> dict[str, Any]:
            moments = per_segment(res)
            if spec.per == "instrument":
                groups = [np.flatnonzero(segments.instrument == c) for c in range(len(segments.instruments))]
            else:
                groups = [np.arange(len(segments))]
            pooled = [_mean_std(combine_moments([moments[s] for s in g], width)) for g in groups]
            mean, std = np.stack([m for m, _ in pooled]), np.stack([d for _, d in pooled])
            if spec.per == "instrument":
                return {"kind": "global", "per": "instrument", "instruments": list(segments.instruments),
                        "mean": mean.tolist(), "std": std.tolist()}
            return {"kind": "global", "mean": mean[0].tolist(), "std": std[0].tolist()}

        return tasks, finish_global

    def finish_trailing(res: Sequence[Any]) -> dict[str, Any]:
        moments = per_segment(res)
        mean, std = _trailing(segments, moments, spec.sessions, width, prior, serves, features)
        return {"kind": "trailing", "sessions": spec.sessions, "mean": mean.tolist(), "std": std.tolist(),
                "moments": {k: [m[i].tolist() for m in moments] for i, k in enumerate(("count", "mean", "m2"))}}

    return tasks, finish_trailing


def _mean_std(moments: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The mean and (population) std of pooled moments: 0 and 1 where no value was
    counted, and a std of 1 where the feature did not vary (centred, never divided by 0)."""
    n, m, m2 = moments
    with np.errstate(invalid="ignore", divide="ignore"):
        sd = np.sqrt(m2 / n)
    return np.nan_to_num(m), np.where(np.isfinite(sd) & (sd > 0), sd, 1.0)


def _history(inst: np.ndarray, sess: np.ndarray, k: int, sessions: int) -> np.ndarray:
    """Indices of the ``sessions`` sessions of segment ``k``'s instrument just before it
    (fewer when it has fewer before it), in time order."""
    mine = np.flatnonzero(inst == inst[k])
    before = mine[sess[mine] < sess[k]]
    return before[np.argsort(sess[before], kind="stable")][-sessions:]


def trailing_history_rows(segments: SegmentTable, lookback: int, sessions: int,
                          prior: SegmentTable | None = None) -> np.ndarray:
    """Per segment, how many rows trailing statistics would be fitted on: the rows after
    the features' ``lookback`` of the ``sessions`` sessions of its instrument before it
    (stored ones of ``prior`` included, with the same lookback); ``-1`` for a segment
    with fewer sessions before it. A pure function of the segment tables, so a build
    and an append leave out the same sessions (those under :data:`MIN_HISTORY_ROWS`).

    Returns
    -------
    numpy.ndarray
        int64, one per segment of ``segments``.
    """
    tables = [segments] if prior is None else [prior, segments]
    inst = np.concatenate([t.instrument for t in tables])
    sess = np.concatenate([t.session for t in tables])
    usable = np.concatenate([np.maximum(t.stops - t.starts - lookback, 0) for t in tables]).astype(np.int64)
    skip = inst.size - len(segments)
    out = np.full(len(segments), -1, dtype=np.int64)
    for s in range(len(segments)):
        before = _history(inst, sess, skip + s, sessions)
        if before.size == sessions:
            out[s] = int(usable[before].sum())
    return out


def _trailing(segments: SegmentTable, moments: Sequence[Any], sessions: int, width: int,
              prior: tuple[SegmentTable, Sequence[Any]] | None, serves: np.ndarray | None = None,
              features: Sequence[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Per segment, the mean and std pooled over the ``sessions`` sessions of its
    instrument before it (stored ones of ``prior`` included); 0 and 1 for a segment
    with fewer before it, or whose history holds fewer than :data:`MIN_HISTORY_ROWS`
    values of a feature (for that feature): such a segment makes no window, and one that
    ``serves`` windows is refused rather than stored unscaled.

    Raises
    ------
    WindowError
        A segment that ``serves`` windows over too thin a history, naming it.
    """
    inst, sess, pool = segments.instrument, segments.session, list(moments)
    if prior is not None:
        inst = np.concatenate([prior[0].instrument, inst])
        sess = np.concatenate([prior[0].session, sess])
        pool = list(prior[1]) + pool
    skip = len(pool) - len(segments)
    mean = np.zeros((len(segments), width))
    std = np.ones((len(segments), width))
    for s in range(len(segments)):
        before = _history(inst, sess, skip + s, sessions)
        if before.size < sessions:
            continue  # makes no window: it only serves as history
        n, m, m2 = combine_moments([pool[b] for b in before], width)
        thin = n < MIN_HISTORY_ROWS
        if thin.any() and (serves is None or bool(serves[s])):
            _refuse_thin(segments, s, int(np.argmax(thin)), int(n[thin][0]), sessions, features)
        mean[s], std[s] = _mean_std((n, m, m2))
        mean[s][thin], std[s][thin] = 0.0, 1.0
    return mean, std


def _refuse_thin(segments: SegmentTable, s: int, column: int, count: int, sessions: int,
                 features: Sequence[str]) -> None:
    """Raise for segment ``s``, whose trailing history holds ``count`` finite values of
    feature ``column``.

    Raises
    ------
    WindowError
        Naming the session (its label: the file or date), its instrument, the feature
        and the count.
    """
    name = features[column] if column < len(features) else f"column {column}"
    before = "session" if sessions == 1 else f"{sessions} sessions"
    raise WindowError(
        f"normalize: trailing: {describe_segment(segments, s)} would be scaled by statistics of the {before} of "
        f"its instrument before it, which hold {count} finite value(s) of feature {name!r} (a std needs "
        f"at least {MIN_HISTORY_ROWS}); give those sessions data, use more "
        "sessions (normalize: {kind: trailing, sessions: N}), or normalize: global")


def describe_segment(segments: SegmentTable, s: int) -> str:
    """Segment ``s`` for a message: its session number, its label (the file or date)
    when the table has one, and its instrument when it is named."""
    label = segments.labels[s] if s < len(segments.labels) and segments.labels[s] else ""
    name = segments.instruments[int(segments.instrument[s])]
    return (f"session {int(segments.session[s])}" + (f" ({label})" if label else "")
            + (f" of instrument {name!r}" if name else ""))


@dataclass(frozen=True, eq=False)
class RowScaler:
    """A build's z-score as a function of rows: ``scaler(rows, first)`` z-scores rows
    ``first, first + 1, ...`` of the features, with one mean and std (``global``) or
    the ones of each row's segment (``trailing``: ``stops`` are the segments' ends),
    in the rows' precision (float64 rows with float64 statistics, float32 rows with
    float32 ones); the result is float32, as windows are stored.

    The one definition of the arithmetic, for the features as a dask array
    (:func:`apply_normalization`) and for the rows a block of windows reads, scaled
    inside the task that makes the block: the same operations on the same values, so
    the same bits either way."""

    mean: np.ndarray
    std: np.ndarray
    stops: np.ndarray | None = None

    def __call__(self, rows: np.ndarray, first: int) -> np.ndarray:
        mean, std = _in_dtype_of(rows, self.mean), _in_dtype_of(rows, self.std)
        if self.stops is None:
            return ((rows - mean) / std).astype(np.float32)
        seg = np.searchsorted(self.stops, np.arange(first, first + rows.shape[0]), side="right")
        seg = np.minimum(seg, len(self.stops) - 1)
        return ((rows - mean[seg]) / std[seg]).astype(np.float32)


def _in_dtype_of(rows: np.ndarray, stats: np.ndarray) -> np.ndarray:
    """``stats`` (float64, as fitted and stored) in the dtype the rows are scaled in:
    float64 for float64 features (``source.dtype: float64``), whose prices float32
    would round (near 97,000 by up to 0.004, more than a 0.01-wide spread's std),
    else float32, the arithmetic of float32 features, bit for bit as before."""
    return stats if rows.dtype == np.float64 else stats.astype(np.float32)


def row_scaler(spec: NormalizeSpec, stats: dict[str, Any], segments: SegmentTable) -> RowScaler | None:
    """The :class:`RowScaler` of a ``global`` or ``trailing`` normalization with
    ``stats``; ``None`` for the others (``window`` z-scores each window when it is made,
    ``none`` leaves the features as they are). Statistics recorded ``per: instrument``
    scale each segment by its instrument's row (named in ``stats["instruments"]``).

    Raises
    ------
    WindowError
        When per-instrument statistics have none for an instrument of ``segments``.
    """
    if spec.kind not in ("global", "trailing"):
        return None
    # Kept in float64: each call scales in its rows' dtype (:func:`_in_dtype_of`).
    mean = np.asarray(stats["mean"], dtype=np.float64)
    std = np.asarray(stats["std"], dtype=np.float64)
    if spec.kind == "global" and stats.get("per") == "instrument":
        # What the store recorded decides, not the spec: an append scales as the build did.
        row = _instrument_rows(list(stats.get("instruments") or []), segments)
        return RowScaler(mean[row], std[row], np.asarray(segments.stops))
    return RowScaler(mean, std, np.asarray(segments.stops) if spec.kind == "trailing" else None)


def _instrument_rows(names: list[str], segments: SegmentTable) -> np.ndarray:
    """Per segment, the row of per-instrument statistics fitted on ``names``."""
    out = np.empty(len(segments), dtype=np.int64)
    for code, name in enumerate(segments.instruments):
        if name not in names:
            if not (segments.instrument == code).any():
                continue
            raise WindowError(f"normalize: the per-instrument statistics hold none for instrument {name!r} "
                              f"(they were fitted on {names}); rebuild with --refit")
        out[segments.instrument == code] = names.index(name)
    return out


def apply_normalization(f: da.Array, spec: NormalizeSpec, stats: dict[str, Any], segments: SegmentTable) -> da.Array:
    """``f`` z-scored with ``stats`` (global: one mean and std; trailing: per segment),
    as float32 (``none`` and ``window``: ``f`` as it is, in float32)."""
    scaler = row_scaler(spec, stats, segments)
    if scaler is None:
        # Stored windows are float32 whatever the features were computed in.
        return f if f.dtype == np.float32 else f.astype(np.float32)
    starts = chunk_bounds(f.chunks[0])

    def block(b: np.ndarray, block_id: tuple[int, ...] = (0, 0)) -> np.ndarray:
        return scaler(b, int(starts[block_id[0]]))

    return f.map_blocks(block, dtype=np.float32, token=f"{spec.kind}-zscore")
