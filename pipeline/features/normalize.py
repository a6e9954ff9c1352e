"""Normalization statistics fitted without look-ahead, and their application blockwise.

- ``global``: each feature's mean and std over the steps of the windows it is fitted on
  (the first split, or the first fold's training sessions): later splits never inform it.
- ``trailing``: each session z-scored with the pooled statistics of the ``N`` sessions of
  its instrument before it. Per-session moments (count, mean, sum of squared deviations)
  are computed once per block and combined exactly (Chan et al.), in float64: prices
  far from zero lose no digits, as a sum of squares would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import dask
import dask.array as da
import numpy as np

from pipeline.features.geometry import chunk_bounds
from pipeline.features.sessions import SegmentTable, WindowRuns
from pipeline.features.splits import NormalizeSpec

__all__ = ["RowScaler", "apply_normalization", "combine_moments", "fit_normalization", "row_scaler",
           "segment_moments"]


def _intervals(runs: WindowRuns, halo: int) -> list[tuple[int, int]]:
    """Row intervals covered by the windows of ``runs`` (their steps), merged."""
    out: list[list[int]] = []
    for first, count in zip(runs.first.tolist(), runs.count.tolist()):
        lo, hi = first - halo, first + (count - 1) * runs.stride + 1
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(a, b) for a, b in out]


def segment_moments(block: np.ndarray, lo: int, segments: SegmentTable, lookback: int) -> list[tuple]:
    """``(segment, count, mean, m2)`` per feature for each segment's usable rows in a block
    that starts at row ``lo``; non-finite values are left out."""
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
        rows = block[a - lo : b - lo].astype(np.float64)
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
                      halo: int, lookback: int = 0, prior: tuple[SegmentTable, Sequence[Any]] | None = None
                      ) -> tuple[list[Any], Callable[[Sequence[Any]], dict[str, Any]]]:
    """The dask objects that compute ``spec``'s statistics, and a function that turns
    their results into the statistics recorded in the store's metadata.

    The caller computes them together with its other reductions: one pass over the data.
    Trailing statistics record each segment's moments too (``moments``), so that an
    append scales its new sessions by the stored ones before them: ``prior`` is the
    stored segment table and its moments, and the statistics returned are then the new
    segments' only.
    """
    if spec.kind == "global":
        intervals = _intervals(fit_runs, halo)
        rows = da.concatenate([f[a:b] for a, b in intervals]) if len(intervals) > 1 else f[slice(*intervals[0])]
        finite = da.where(da.isfinite(rows), rows, np.nan).astype(np.float64)

        def finish_global(res: Sequence[Any]) -> dict[str, Any]:
            mean = np.nan_to_num(res[0])
            std = np.where(np.isfinite(res[1]) & (res[1] > 0), res[1], 1.0)
            return {"kind": "global", "mean": mean.tolist(), "std": std.tolist()}

        return [da.nanmean(finite, axis=0), da.nanstd(finite, axis=0)], finish_global
    if spec.kind == "trailing":
        starts = chunk_bounds(f.chunks[0])
        blocks = f.to_delayed().ravel()
        tasks = [dask.delayed(segment_moments)(b, int(starts[i]), segments, lookback) for i, b in enumerate(blocks)]
        width = int(f.shape[1])

        def finish_trailing(res: Sequence[Any]) -> dict[str, Any]:
            per: dict[int, list] = {}
            for parts in res:
                for s, n, m, m2 in parts:
                    per.setdefault(s, []).append((n, m, m2))
            moments = [combine_moments(per.get(s, []), width) for s in range(len(segments))]
            mean, std = _trailing(segments, moments, spec.sessions, width, prior)
            return {"kind": "trailing", "sessions": spec.sessions, "mean": mean.tolist(), "std": std.tolist(),
                    "moments": {k: [m[i].tolist() for m in moments] for i, k in enumerate(("count", "mean", "m2"))}}

        return tasks, finish_trailing
    return [], lambda res: {"kind": spec.kind}


def _trailing(segments: SegmentTable, moments: Sequence[Any], sessions: int, width: int,
              prior: tuple[SegmentTable, Sequence[Any]] | None) -> tuple[np.ndarray, np.ndarray]:
    """Per segment, the mean and std pooled over the ``sessions`` sessions of its
    instrument before it (stored ones of ``prior`` included); 0 and 1 for a segment
    with fewer before it, which makes no window."""
    inst, sess, pool = segments.instrument, segments.session, list(moments)
    if prior is not None:
        inst = np.concatenate([prior[0].instrument, inst])
        sess = np.concatenate([prior[0].session, sess])
        pool = list(prior[1]) + pool
    skip = len(pool) - len(segments)
    mean = np.zeros((len(segments), width))
    std = np.ones((len(segments), width))
    for s in range(len(segments)):
        k = skip + s
        mine = np.flatnonzero(inst == inst[k])
        before = mine[sess[mine] < sess[k]]
        before = before[np.argsort(sess[before], kind="stable")][-sessions:]
        if before.size < sessions:
            continue  # makes no window: it only serves as history
        n, m, m2 = combine_moments([pool[b] for b in before], width)
        with np.errstate(invalid="ignore", divide="ignore"):
            sd = np.sqrt(m2 / n)
        mean[s] = np.nan_to_num(m)
        std[s] = np.where(np.isfinite(sd) & (sd > 0), sd, 1.0)
    return mean, std


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
    ``none`` leaves the features as they are)."""
    if spec.kind not in ("global", "trailing"):
        return None
    # Kept in float64: each call scales in its rows' dtype (:func:`_in_dtype_of`).
    mean = np.asarray(stats["mean"], dtype=np.float64)
    std = np.asarray(stats["std"], dtype=np.float64)
    return RowScaler(mean, std, np.asarray(segments.stops) if spec.kind == "trailing" else None)


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
