"""From a raw order-book table to per-split windows and labels, lazily.

The steps, in order: per-step features (halo = lookback) -> drop the first ``lookback``
steps (incomplete history) -> window geometry and leakage-free split ranges (pure
arithmetic) -> normalization statistics from the train split's steps only (one
reduction) -> windows and labels -> NaN policy. Only the small reductions run here; the
windows themselves stay lazy until the writer stores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import dask.array as da
import numpy as np

from pipeline.errors import FeatureError, InvalidValueError, WindowError
from pipeline.features.geometry import (
    aligned_window_chunks,
    halo,
    split_gap_windows,
    split_ranges,
    window_count,
    window_ends,
)
from pipeline.features.specs import FeatureSpec, LabelSpec
from pipeline.features.steps import compute_features
from pipeline.features.windows import windows
from pipeline.progress import compute

__all__ = ["TrainingSet", "build_training_set"]


@dataclass(frozen=True, slots=True)
class TrainingSet:
    """Lazy arrays per split (``{"train": {"x": ..., "y": ...}}``) and their metadata."""

    splits: dict[str, dict[str, da.Array]]
    attrs: dict[str, Any] = field(default_factory=dict)
    #: Arrays every split points into: ``{"features": (T, F)}`` for virtual windows.
    shared: dict[str, da.Array] = field(default_factory=dict)


def _window_zscore(block: np.ndarray) -> np.ndarray:
    mean = block.mean(axis=1, keepdims=True, dtype=np.float64)
    std = block.std(axis=1, keepdims=True, dtype=np.float64)
    std[std == 0] = 1.0
    return ((block - mean) / std).astype(np.float32)


def build_training_set(
    x: da.Array,
    *,
    columns: Sequence[str],
    features: Sequence[FeatureSpec],
    size: int,
    stride: int = 1,
    scales: Sequence[int] = (1,),
    label: LabelSpec = LabelSpec(),
    splits: Mapping[str, float] | None = None,
    normalize: Literal["global", "window", "none"] = "global",
    nan: Literal["raise", "drop", "fill"] = "drop",
    fill_value: float = 0.0,
    progress: bool = False,
    materialize: bool = True,
    block_windows: int | Callable[[int], int] | None = None,
) -> TrainingSet:
    """Windows and labels per time split, with no step shared between splits.

    Parameters
    ----------
    x
        ``(T, C)`` raw table (time along axis 0) with the order-book columns.
    columns
        Column names of ``x``.
    features
        Per-step features, in output order.
    size, stride, scales
        Window geometry (see :func:`pipeline.features.windows.windows`).
    label
        Label definition; windows whose label would reach past the data are dropped.
    splits
        Fractions by time, in order (default ``{"train": 1.0}``). Between consecutive
        splits, :func:`~pipeline.features.geometry.split_gap_windows` windows are left
        out so no window, label or feature history of one split touches a step of
        another.
    normalize
        ``global``: z-score with mean and std of each feature over the first split's
        steps (no look-ahead into later splits); ``window``: per window and feature;
        ``none``.
    nan
        Windows or labels containing NaN/inf: ``drop`` them (counted in ``attrs``),
        ``fill`` NaN features with ``fill_value`` (labels cannot be filled: their windows
        are dropped), or ``raise``.
    progress
        Show a progress bar for the reductions computed here (statistics, NaN checks).
    materialize
        ``False`` returns, per split, the window end steps (``ends``) and labels instead
        of the windows, and the normalized per-step features in ``shared``: the streamer
        assembles the same windows from them (see :mod:`pipeline.streaming.virtual`).
    block_windows
        Windows per block of ``x``, counted from each split's start: the writer's unit
        (a count, or a function of one window's bytes). Each unit's windows are then
        made by one task, which the unit's write task reads whole: no rechunk, and no
        large block held in a worker while its pieces are written (default: blocks of
        up to 64 MiB, rechunked by the writer).

    Returns
    -------
    TrainingSet
    """
    splits = dict(splits or {"train": 1.0})
    scales = tuple(scales)
    frame = compute_features(x, columns=columns, specs=features)
    mid_frame = compute_features(x, columns=columns, specs=(FeatureSpec("mid_price"),), dtype="float64")
    L = frame.lookback
    f = frame.array[L:]
    logmid = da.log(mid_frame.array[L:, 0])
    T = int(f.shape[0])
    h = label.horizon
    n = window_count(T - h, size, stride, scales)
    if n == 0:
        raise WindowError(
            f"windows: {x.shape[0]} steps leave {T - h} usable steps after the feature lookback "
            f"({L}) and the label horizon ({h}); a window of size={size} at scales={scales} "
            f"needs {halo(size, scales) + 1}"
        )
    gap = split_gap_windows(size, scales, stride, h, L)
    ranges = split_ranges(n, splits, gap)
    ends = window_ends(n, size, stride, scales)
    H = halo(size, scales)

    if not materialize and normalize == "window":
        raise FeatureError("windows.materialize: false needs normalize: global or none (per-window "
                           "statistics depend on the assembled window)")
    first_name = next(iter(ranges))
    a, b = ranges[first_name]
    f_used = f
    if nan == "fill":
        f_used = da.where(da.isfinite(f_used), f_used, np.float32(fill_value))
    ret = (logmid[h:] - logmid[:-h]) * label.scale
    # A strided slice, not ret[ends]: a fancy index would embed the whole index array
    # (megabytes) in the graph.
    ret_w = ret[H : H + stride * (n - 1) + 1 : stride]

    # One pass over the features for everything computed before the write: the train
    # statistics, and whether any step or label is non-finite (normalizing with finite
    # statistics does not change that). Each pass re-reads and re-derives the features.
    reductions = [(~da.isfinite(f_used[: T - h])).any(axis=1).sum(), ~da.isfinite(ret_w)]
    if normalize == "global":
        rows = f_used[int(ends[a]) - H : int(ends[b - 1]) + 1]
        finite = da.where(da.isfinite(rows), rows, np.nan).astype(np.float64)
        reductions += [da.nanmean(finite, axis=0), da.nanstd(finite, axis=0)]
    results = compute(*reductions, desc="statistics and NaN check", progress=progress)
    bad_steps_n, bad_labels = int(results[0]), np.asarray(results[1], dtype=bool).copy()
    if normalize == "global":
        mean = np.nan_to_num(results[2])
        std = np.where(np.isfinite(results[3]) & (results[3] > 0), results[3], 1.0)
        f_used = ((f_used - mean.astype(np.float32)) / std.astype(np.float32)).astype(np.float32)
        stats: dict[str, Any] = {"kind": "global", "fit_on": first_name, "mean": mean.tolist(),
                                 "std": std.tolist(), "features": list(frame.names)}
    else:
        stats = {"kind": normalize}

    out_chunks = None
    if block_windows is not None and materialize:
        itemsize = 4 if normalize == "window" else f_used.dtype.itemsize  # as the writer sizes x
        window_bytes = size * int(f_used.shape[1]) * len(scales) * itemsize
        unit = block_windows(window_bytes) if callable(block_windows) else int(block_windows)
        out_chunks = aligned_window_chunks(n, ranges, unit)
    w = windows(f_used[: T - h], size=size, stride=stride, scales=scales, out_chunks=out_chunks)
    if normalize == "window":
        w = w.map_blocks(_window_zscore, dtype=np.float32)
    y_all = ret_w
    if label.kind == "class":
        thresholds = np.asarray(label.thresholds)
        y_all = y_all.map_blocks(lambda r: np.digitize(r, thresholds).astype(np.int64), dtype=np.int64)
    else:
        y_all = y_all.astype(np.float32)
    if out_chunks is not None:
        y_all = y_all.rechunk({0: w.chunks[0]})  # labels in the windows' blocks: one write unit each

    # Which windows hold a non-finite value? Only pay for a windowed pass when any exist.
    bad = bad_labels
    if bad_steps_n:
        flags = (~da.isfinite(f_used[: T - h])).any(axis=1, keepdims=True).astype(np.uint8)
        (flagged,) = compute(windows(flags, size=size, stride=stride, scales=scales).max(axis=(1, 2)),
                             desc="locating NaN windows", progress=progress)
        bad |= np.asarray(flagged, dtype=bool)
    if bad.any() and nan == "raise":
        i = int(np.flatnonzero(bad)[0])
        raise InvalidValueError(
            "features", f"window {i} (steps {int(ends[i]) - H + L}..{int(ends[i]) + L} of the source) "
            f"holds NaN or inf in its features or label; set features.nan: drop or fill"
        )

    out: dict[str, dict[str, da.Array]] = {}
    counts: dict[str, int] = {}
    dropped: dict[str, int] = {}
    for name, (lo, hi) in ranges.items():
        keep = np.flatnonzero(~bad[lo:hi]) + lo
        dropped[name] = int((hi - lo) - keep.size)
        if keep.size == 0:
            raise WindowError(f"split {name!r}: every window holds NaN or inf; nothing to write")
        if keep.size == hi - lo:
            xs, ys = w[lo:hi], y_all[lo:hi]
        else:
            xs, ys = w[keep], y_all[keep]
        if materialize:
            out[name] = {"x": xs, "y": ys}
        else:
            # int32 halves the index on disk; series past 2**31 steps keep int64.
            itype = np.int32 if T < 2**31 else np.int64
            idx = (da.arange(H + stride * lo, H + stride * hi, stride, chunks=1 << 20, dtype=itype)
                   if keep.size == hi - lo else da.from_array(ends[keep].astype(itype), chunks=1 << 20))
            out[name] = {"ends": idx, "y": ys}
        counts[name] = int(keep.size)

    attrs = {
        "features": list(frame.names),
        "lookback": L,
        "windows": {"size": size, "stride": stride, "scales": list(scales), "halo": H},
        "labels": {"kind": label.kind, "horizon": h, "thresholds": list(label.thresholds), "scale": label.scale},
        "normalization": stats,
        "split_windows": {k: list(v) for k, v in ranges.items()},
        "split_gap_windows": gap,
        "split_steps": {k: [int(ends[lo]) - H + L, int(ends[hi - 1]) + h + L] for k, (lo, hi) in ranges.items()},
        "nan_windows_dropped": dropped,
        "window_counts": counts,
    }
    shared: dict[str, da.Array] = {}
    if not materialize:
        shared = {"features": f_used[: T - h]}
        attrs["virtual"] = {"size": size, "stride": stride, "scales": list(scales), "halo": H}
    return TrainingSet(splits=out, attrs=attrs, shared=shared)
