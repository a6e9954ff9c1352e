"""From a raw order-book table to per-split windows and labels, lazily.

The steps, in order: per-step features (halo = lookback) -> where windows fit: inside one
segment (instrument x session) with their history and label (pure arithmetic,
:mod:`pipeline.features.sessions`) -> which split each window falls in, by the time its
reach covers (:mod:`pipeline.features.splits`) -> normalization statistics from the
train split's steps only (:func:`fit_split`), or per session from the sessions before
it -> windows, labels, timestamps, session and instrument of each window -> NaN policy.
Only small reductions run here; the windows stay lazy until the writer stores them.

A window is left out of every split, as one whose label runs past its segment is, when
its label reads a price the source filled in (``source.nan: fill``: an empty level,
such as a one-sided book): that label would be a fabricated move. The build warns how
many windows it left out and which price column was empty. The features made from the
level-1 prices are NaN where one was empty (:func:`~pipeline.features.steps.features_numpy`),
so that ``nan`` decides the windows holding them as it does any NaN; the build warns how
many rows held an empty level-1 price and which features they made NaN. Raw columns
(``book``) and sizes keep the filled values.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import dask.array as da
import numpy as np

from pipeline.errors import FeatureError, InvalidValueError, PriceResolutionWarning, WindowError
from pipeline.features.blockwise import take_rows
from pipeline.features.geometry import chunk_bounds, halo, split_gap_windows, split_ranges
from pipeline.features.history import Prior, continue_folds
from pipeline.features.labels import (class_balance, finalize_labels, gaps_message, label_gaps, label_steps,
                                      rounding_message)
from pipeline.features.normalize import (MIN_HISTORY_ROWS, apply_normalization, describe_segment,
                                         fit_normalization, row_scaler, trailing_history_rows)
from pipeline.features.sessions import SegmentTable, WindowRuns, window_runs
from pipeline.features.specs import FeatureSpec, LabelSpec
from pipeline.features.splitblocks import split_arrays
from pipeline.features.splits import (FoldSpec, NormalizeSpec, as_splits, assign_splits, duration_text,
                                      embargo_mask, embargoes, fold_sessions, fraction_cuts, has_dates, is_dated,
                                      lacking_dates, outside_splits, place_windows, split_spans)
from pipeline.features.steps import (TOP_PRICES, FeatureFrame, compute_features, empty_prices_message,
                                     empty_top_prices, feature_lookback, top_price_features)
from pipeline.features.filesessions import file_sessions
from pipeline.features.windows import as_series, gather_rows, windows_at
from pipeline.progress import compute
from pipeline.storage.layout import unit_chunks

__all__ = ["TrainingSet", "build_training_set", "fit_split"]


@dataclass(frozen=True, slots=True)
class TrainingSet:
    """Lazy arrays per split (``{"train": {"x": ..., "y": ...}}``) and their metadata."""

    splits: dict[str, dict[str, da.Array]]
    attrs: dict[str, Any] = field(default_factory=dict)
    #: Arrays every split points into: ``{"features": (T, F)}`` for virtual windows.
    shared: dict[str, da.Array] = field(default_factory=dict)
    #: Walk-forward folds: ``{"fold0/train": sample indices into the first split, ...}``.
    folds: dict[str, np.ndarray] = field(default_factory=dict)


#: The share of the cluster's worker memory that the arrays every pass reads (the
#: per-step features, label values and timestamps) may take when held between passes;
#: above it they are computed again in each pass, as out-of-core data needs.
HOLD_FRACTION = 0.25


def _memory_budget() -> int | None:
    """Bytes :func:`hold` may keep on the cluster: :data:`HOLD_FRACTION` of its
    workers' memory limits; ``None`` without a distributed client, or when a worker
    has no limit to count against."""
    try:
        from distributed import default_client

        client = default_client()
        workers = client.scheduler_info(n_workers=-1).get("workers", {}).values()
    except (ImportError, ValueError):  # no distributed, or no client: threads, nothing to hold on
        return None
    limits = [int(w.get("memory_limit") or 0) for w in workers]
    if not limits or not all(limits):
        return None
    return int(sum(limits) * HOLD_FRACTION)


def hold(*arrays: da.Array | None) -> tuple[da.Array | None, ...]:
    """``arrays`` computed once and kept in the cluster's memory (``dask.persist``, which
    returns at once) when together they fit :func:`_memory_budget`; else as given.
    ``None`` entries stay ``None``."""
    present = [a for a in arrays if a is not None]
    budget = _memory_budget()
    if not present or budget is None or sum(int(a.nbytes) for a in present) > budget:
        return arrays
    import dask

    held = iter(dask.persist(*present))
    return tuple(None if a is None else next(held) for a in arrays)


def _finish_rows(block: np.ndarray, start: int, *, segments: SegmentTable, lookback: int,
                 fill: float | None) -> np.ndarray:
    """A block of features from row ``start`` as a build holds them: NaN in the first
    ``lookback`` rows of every segment (their features borrowed history from another
    session, or lacked some: the first segment's), so the shared features of virtual
    windows are the same whichever segments a build starts with (an append starts with
    its new sessions); then, with ``fill``, every NaN or inf replaced by it."""
    out = block
    if lookback:
        heads = segments.head_mask(start, start + block.shape[0], lookback)
        if heads.any():
            out = block.copy()
            out[heads] = np.nan
    if fill is not None:
        out = np.where(np.isfinite(out), out, np.float32(fill))
    return out


def _file_segments(x: da.Array) -> SegmentTable:
    """One segment per file an array was joined from (no window, lookback or label
    spans two recordings), or one for an array that carries no files."""
    lengths = file_sessions(x)
    return SegmentTable.from_lengths(lengths) if lengths else SegmentTable.single(int(x.shape[0]))


def _finisher(segments: SegmentTable, lookback: int,
              fill: float | None) -> Callable[[np.ndarray, int], np.ndarray] | None:
    """:func:`_finish_rows` for the features' blocks, done in the task that computes
    each (as separate layers, dask fused them with it and kept a task per block that
    only handed the result on); ``None`` when there is nothing to do."""
    if not lookback and fill is None:
        return None
    return functools.partial(_finish_rows, segments=segments, lookback=lookback, fill=fill)


def _reach_keys(runs: WindowRuns, back: int, fwd: int, timestamps: da.Array | None, need_time: bool,
                progress: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """Each window's reach ``[lo, hi]`` and end, as timestamps (ns) or as rows.

    Rows serve when there is one instrument and no date to compare with: one
    instrument's rows are in time order, and rows need no pass over the data.
    """
    ends = runs.ends()
    if not need_time:
        return ends - back, ends + fwd, ends, "row"
    if timestamps is None:
        raise WindowError("splits: date splits, and time splits of several instruments, need timestamps; "
                          "set source.timestamp to the timestamp column; data without times (sessions by a "
                          "column such as time_id) can be split by whole sessions: splits: {train: 1.0} with "
                          "output.folds")
    if 3 * runs.n >= int(timestamps.shape[0]):
        # Every row's time is no more to bring here than three per window (windows at
        # stride 1 or 2): one compute of the series, indexed here, where gathering on
        # the workers took a task per chunk and per million windows, and their aliases.
        (times,) = compute(timestamps, desc="window times", progress=progress)
        times = np.asarray(times)
        return times[ends - back], times[ends + fwd], times[ends], "time"
    shifted = [WindowRuns(runs.first + d, runs.count, runs.segment, runs.stride) for d in (-back, fwd, 0)]
    chunks = (max(1, 1 << 20),) * (runs.n >> 20) + ((runs.n % (1 << 20),) if runs.n % (1 << 20) else ())
    lo, hi, end = compute(*(gather_rows(timestamps, r, chunks) for r in shifted),
                          desc="window times", progress=progress)
    return np.asarray(lo), np.asarray(hi), np.asarray(end), "time"


def _fitted(f: da.Array, runs: WindowRuns, where: np.ndarray, splits: Sequence[str], fold_sets: Any,
            names: Sequence[str], labels_steps: da.Array, timestamps: da.Array | None, segs: SegmentTable,
            norm: NormalizeSpec, prior: Prior | None, **kw: Any) -> tuple:
    """:func:`_fit_and_check` over the windows statistics are fitted on (the split named
    ``train``, else the first; or the first fold's training part), with ``global``
    statistics' fit checked first and recorded after (``fit_on``, the feature ``names``)."""
    fit_on = fit_split(splits) if fold_sets is None else "fold0/train"
    fit_runs = runs.subset(where == list(splits).index(fit_on)) if fold_sets is None else runs.subset(
        fold_sets[0][0][0])
    fresh_global = norm.kind == "global" and prior is None
    if fresh_global:
        _check_fit_windows(runs, fit_runs, segs, norm, fit_on)
    # Trailing statistics too thin to scale by are refused only for sessions whose windows are stored.
    serves = runs.subset(where >= 0).per_segment(len(segs)) > 0
    out = _fit_and_check(f, runs, fit_runs, labels_steps, timestamps, segs, norm, prior=prior, features=names,
                         serves=serves, **kw)
    if fresh_global:
        out[1].update(fit_on=fit_on, features=list(names))
    return out


def build_training_set(
    x: da.Array, *, columns: Sequence[str], features: Sequence[FeatureSpec], size: int, stride: int = 1,
    scales: Sequence[int] = (1,), label: LabelSpec = LabelSpec(), splits: Mapping[str, Any] | None = None,
    normalize: NormalizeSpec | Literal["global", "window", "none"] = "global",
    nan: Literal["raise", "drop", "fill"] = "drop", fill_value: float = 0.0, progress: bool = False,
    materialize: bool = True, block_windows: int | Callable[[int], int] | None = None,
    segments: SegmentTable | None = None, timestamps: da.Array | None = None, folds: FoldSpec | None = None,
    prior: Prior | None = None, source_fill: float | None = None,
) -> TrainingSet:
    """Windows and labels per split; no step shared between splits, sessions or instruments.

    Parameters
    ----------
    x
        ``(T, C)`` raw table, time along axis 0 within each segment (dask, numpy, or a
        memory-mapped file read by each task from the file).
    columns
        The names of ``x``'s columns.
    features
        Per-step features in output order.
    label
        The label (none reaches past its segment).
    size
        Steps per window (:func:`~pipeline.features.windows.windows`), per segment.
    stride
        Steps between consecutive window ends.
    scales
        Sampling intervals, one block of features each.
    splits
        Fractions by time (default ``{"train": 1.0}``) or dates (``{"train": {"until":
        "2026-01-08"}, "test": {}}``): a window goes to the split holding its whole reach.
    normalize
        ``global`` (fitted on ``train``, else the first split or fold's training part;
        ``per: instrument``), ``trailing`` (by the instrument's sessions before; too short
        a history makes no window), ``window`` or ``none`` (:class:`NormalizeSpec`).
    nan
        Windows or labels holding NaN/inf: ``drop`` (counted), ``fill`` or ``raise``.
    fill_value
        The value ``nan="fill"`` writes.
    progress
        A progress bar for the reductions computed here.
    materialize
        ``False``: per split the window end rows (``ends``), the normalized features in
        ``shared`` (:mod:`pipeline.streaming.virtual`).
    block_windows
        Windows per block: the writer's unit (or a function of a window's bytes).
    segments
        The source's segments (sessions of instruments); default: each file of an array
        joined from several, else one series.
    timestamps
        ``(T,)`` int64 ns times: each window's ``t``; date splits and instruments need them.
    folds
        Walk-forward folds over the first split's sessions.
    prior
        Append: ``x`` holds only new sessions after this stored build (its statistics).
    source_fill
        What ``source.nan: fill`` wrote for empty values: windows whose mid-price label
        reads it are left out, and features of level-1 prices (``mid_price``, ``spread``,
        ``log_return``, their rolling ones) are NaN where it is, for ``nan``; warned.

    Returns
    -------
    TrainingSet

    Raises
    ------
    ConfigError
        ``splits`` or ``normalize`` malformed, naming the key.
    InvalidValueError
        ``nan="raise"`` and a window holds NaN or inf, naming it, the feature and row.
    WindowError
        A split without windows, or none to fit ``global`` statistics on (per instrument);
        a trailing history without two finite values of a feature.

    Warns
    -----
    UserWarning
        What ``source_fill``, or trailing normalization's short histories, left out.
    PriceResolutionWarning
        Float32 class labels near a class boundary (``labels.rounding_message``).
    """
    splits, norm = as_splits(splits or {"train": 1.0}, "splits"), NormalizeSpec.from_value(normalize, "normalize")
    x = as_series(x)  # a numpy array, or a memory-mapped file read by path and block
    scales, segs = tuple(scales), segments if segments is not None else _file_segments(x)
    _check_inputs(x, segs, norm, materialize)
    frame, f, labels_steps, timestamps, gaps, empties = _step_arrays(
        x, columns, features, label, segs, norm, timestamps, fill=fill_value if nan == "fill" else None,
        source_fill=source_fill)
    L, H = frame.lookback, halo(size, scales)
    back, fwd = max(H + L, label.reach[0]), label.reach[1]
    runs = _windows_that_fit(segs, norm, size=size, stride=stride, scales=scales, back=back, fwd=fwd, lookback=L,
                             prior=None if prior is None else prior.segments)
    # -- which split each window falls in ---------------------------------------------
    names = list(splits)
    where, cuts, key_kind, gap, left_out = _place(
        runs, segs, splits, timestamps, back=back, fwd=fwd, gap=split_gap_windows(size, scales, stride, fwd, back - H),
        progress=progress, prior=prior)
    fold_sets = _folds(segs, runs, where, folds) if folds is not None and prior is None else None
    future = _future_splits(where, splits)
    if prior is None:
        _check_splits_hold_windows(runs, where, splits, norm, future)
    # -- normalization fitted without look-ahead, and the NaN check: one pass ----------
    f, stats, bad, y_values, seg_times, empty_reads, empty_rows = _fitted(
        f, runs, where, names, fold_sets, frame.names, labels_steps, timestamps, segs, norm, size=size, scales=scales,
        lookback=L, progress=progress, prior=prior, gaps=gaps, empties=empties)
    where_nan = functools.partial(_nan_in_window, f, frame.names, runs, x, columns, size=size, scales=scales,
                                  lookback=L, source_fill=source_fill, top=top_price_features(features))
    bad, dropped = _left_out(bad, empty_reads, where, y_values, runs, label, nan=nan, rounded=x.dtype == np.float32,
                             halo=H, fwd=fwd, empty_rows=empty_message(empty_rows, features, nan, fill_value),
                             where_nan=where_nan)
    per_split = _split_runs(runs, where, dropped, splits, norm, empty_ok=prior is not None, future=future)
    out = _split_outputs(f, per_split, labels_steps, timestamps, segs, norm, stats, label=label, size=size,
                         scales=scales, halo=H, materialize=materialize, block_windows=block_windows, prior=prior)
    geometry = {"size": size, "stride": stride, "scales": list(scales), "halo": H, "back": back, "fwd": fwd}
    attrs = _metadata(frame.names, L, label, stats, segs, per_split, where, bad, y_values, seg_times,
                      windows=geometry, splits={**_split_attrs(per_split, key_kind, cuts, gap, H, fwd), **left_out},
                      dropped=dropped)
    shared = {} if materialize else {"features": apply_normalization(f, norm, stats, segs)}
    attrs.update({} if materialize else {"virtual": {k: geometry[k] for k in ("size", "stride", "scales", "halo")}})
    fold_index = {} if folds is None else _fold_output(fold_sets, where, dropped, folds, segs, per_split, prior, attrs)
    return TrainingSet(splits=out, attrs=attrs, shared=shared, folds=fold_index)


def fit_split(names: Sequence[str]) -> str:
    """The split ``global`` statistics are fitted on: the one named ``train`` wherever it
    is listed (a held-out period may come first in time), else the first one listed."""
    return "train" if "train" in names else names[0]


def _check_fit_windows(runs: WindowRuns, fit_runs: WindowRuns, segs: SegmentTable, norm: NormalizeSpec,
                       fit_on: str) -> None:
    """Refuse, before the pass over the data, ``global`` statistics with nothing to fit
    on: no window in ``fit_on`` (a date split after the data), or, ``per: instrument``,
    an instrument with windows elsewhere but none there (its rows would go unscaled).

    Raises
    ------
    WindowError
        Naming the split, and the instrument.
    """
    if fit_runs.n == 0:
        raise WindowError(f"normalize: global fits its statistics on split {fit_on!r}, which holds no window "
                          f"({runs.n} windows in all); give it data, or use normalize: trailing or none")
    if norm.per != "instrument":
        return
    has = np.zeros(len(segs.instruments), dtype=bool)
    has[np.unique(segs.instrument[runs.segments_of()])] = True
    fitted = np.zeros_like(has)
    fitted[np.unique(segs.instrument[fit_runs.segments_of()])] = True
    missing = [segs.instruments[c] for c in np.flatnonzero(has & ~fitted)]
    if missing:
        raise WindowError(f"normalize: {{kind: global, per: instrument}}: instrument {missing[0]!r} has windows "
                          f"but none in split {fit_on!r} to fit its statistics on; move the split's bounds, or "
                          "use normalize: global")


def _left_out(bad: np.ndarray, empty_reads: np.ndarray, where: np.ndarray, y_values: np.ndarray, runs: WindowRuns,
              label: LabelSpec, *, nan: str, rounded: bool, halo: int, fwd: int, empty_rows: str | None = None,
              where_nan: Callable[[int], str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The windows holding NaN/inf (refused under ``nan="raise"``, naming what
    ``where_nan`` finds in the first) and every window left out (those and the ones whose
    label reads an empty price), warning of the latter, of the rows whose level-1 price
    was empty (``empty_rows``, the text) and of float32 class labels near a boundary
    (``rounded``)."""
    unlabelled = empty_reads.any(axis=1)
    bad = bad & ~unlabelled  # left out for its label, whatever else it holds: not a NaN window
    if bad.any() and nan == "raise":
        _refuse_bad(bad, runs, halo, fwd, where_nan)
    dropped = bad | unlabelled
    for text, category in ((gaps_message(empty_reads[where >= 0], label), UserWarning), (empty_rows, UserWarning),
                           (rounding_message(y_values[(where >= 0) & ~dropped], label) if rounded else None,
                            PriceResolutionWarning)):
        if text is not None:
            warnings.warn(text, category, stacklevel=3)  # the build's caller
    return bad, dropped


def _step_arrays(x: da.Array, columns: Sequence[str], features: Sequence[FeatureSpec], label: LabelSpec,
                 segs: SegmentTable, norm: NormalizeSpec, timestamps: da.Array | None, *, fill: float | None,
                 source_fill: float | None) -> tuple[FeatureFrame, da.Array, da.Array, da.Array | None,
                                                     da.Array | None, da.Array | None]:
    """What every pass of a build reads, held when it fits (:func:`hold`: the raw files
    are decoded once): the feature frame and its array, the label values per step, the
    times and, with ``source_fill``, which prices each label reads empty and how many
    rows of each chunk hold an empty level-1 price (:func:`_empty_counts`, when a
    feature reads one)."""
    # No halo reaches across a session: values that would read another session are
    # never used, and a block starting or ending on one needs no neighbour's chunk.
    edges = np.union1d(segs.starts, segs.stops)
    frame = _feature_frame(x, columns, features, norm, _finisher(segs, feature_lookback(features), fill), edges,
                           empty=source_fill)
    gaps = (label_gaps(x, columns=columns, spec=label, empty=source_fill, cuts=edges)
            if source_fill is not None and label.kind != "column" else None)
    empties = (_empty_counts(x, columns, source_fill)
               if source_fill is not None and top_price_features(features) else None)
    f, labels_steps, timestamps, gaps, empties = hold(
        frame.array, label_steps(x, columns=columns, spec=label, cuts=edges), timestamps, gaps, empties)
    return frame, f, labels_steps, timestamps, gaps, empties


def _empty_counts(x: da.Array, columns: Sequence[str], empty: float) -> da.Array:
    """Per chunk of ``x``, how many rows hold an empty ``bid_price_1``, an empty
    ``ask_price_1``, and either (:func:`~pipeline.features.steps.empty_top_prices`):
    ``(chunks, 3)`` int64, a few numbers to hold rather than a flag per row."""
    cols = tuple(columns)

    def count(block: np.ndarray) -> np.ndarray:
        flags = empty_top_prices(block, cols, empty)
        return np.array([[*np.count_nonzero(flags, axis=0), np.count_nonzero(flags.any(axis=1))]], dtype=np.int64)

    # The features' own rechunk of x (map_with_halo's): the same keys, so a pass that
    # computes both decodes each raw chunk once.
    xr = x.rechunk({1: -1})
    return xr.map_blocks(count, dtype=np.int64, chunks=((1,) * len(xr.chunks[0]), (3,)), token="empty-top-prices")


def empty_message(counts: np.ndarray | None, features: Sequence[FeatureSpec], nan: str,
                  fill_value: float) -> str | None:
    """:func:`~pipeline.features.steps.empty_prices_message` of the summed per-chunk
    ``counts`` (``None``: no ``source_fill``, or no feature reads a level-1 price)."""
    if counts is None:
        return None
    return empty_prices_message(np.asarray(counts).reshape(-1, 3).sum(axis=0), top_price_features(features),
                                nan=nan, fill_value=fill_value)


def _feature_frame(x: da.Array, columns: Sequence[str], features: Sequence[FeatureSpec], norm: NormalizeSpec,
                   finish: Callable[[np.ndarray, int], np.ndarray] | None, cuts: np.ndarray,
                   empty: float | None = None) -> FeatureFrame:
    """The per-step features of ``x``. Float64 sources keep float64 features until they
    are normalized: a 97,000-level price rounded to float32 first (0.0078 apart) moves
    its z-score by that over a small std. Unnormalized features are float32, as stored."""
    exact = x.dtype == np.float64 and norm.kind != "none"
    return compute_features(x, columns=columns, specs=features, post=finish, dtype="float64" if exact else "float32",
                            cuts=cuts, empty=empty)


def _split_outputs(f: da.Array, per_split: Mapping[str, WindowRuns], labels_steps: da.Array,
                   timestamps: da.Array | None, segs: SegmentTable, norm: NormalizeSpec, stats: dict[str, Any], *,
                   label: LabelSpec, size: int, scales: Sequence[int], halo: int, materialize: bool,
                   block_windows: int | Callable[[int], int] | None, prior: Prior | None) -> dict[str, Any]:
    """The arrays of each split (:func:`~pipeline.features.splitblocks.split_arrays`), in
    blocks of the writer's unit. Materialized windows z-score the feature rows they read
    in the task that makes their block (no normalized copy of the features is held
    beside the raw ones); virtual stores write the normalized features themselves."""
    scaler = row_scaler(norm, stats, segs)
    itemsize = 4 if norm.kind == "window" or scaler is not None else f.dtype.itemsize
    window_bytes = size * int(f.shape[1]) * len(scales) * itemsize
    unit = block_windows(window_bytes) if callable(block_windows) else block_windows
    return {name: split_arrays(f, r, _blocks(r.n, unit, window_bytes, prior, name), labels_steps, timestamps, segs,
                               label=label, size=size, scales=scales, halo=halo, zscore=norm.kind == "window",
                               scaler=scaler, materialize=materialize, row_offset=0 if prior is None else prior.rows)
            for name, r in per_split.items()}


def _split_attrs(per_split: Mapping[str, WindowRuns], key_kind: str, cuts: Sequence[int], gap: int, h: int,
                 fwd: int) -> dict[str, Any]:
    """How the splits were cut, and the steps each split's windows reach (first to last)."""
    steps = {name: [int(r.ends(0, 1)[0]) - h, int(r.ends(r.n - 1, r.n)[0]) + fwd] for name, r in per_split.items()
             if r.n}
    return {"split_key": key_kind, "split_cuts": [int(c) for c in cuts], "split_gap_windows": gap,
            "split_steps": steps}


def _refuse_bad(bad: np.ndarray, runs: WindowRuns, h: int, fwd: int,
                where_nan: Callable[[int], str] | None = None) -> None:
    """Raise for the first window that holds NaN or inf.

    Raises
    ------
    InvalidValueError
        Naming the window and the steps it covers, and what ``where_nan`` says of it
        (the feature and row: :func:`_nan_in_window`).
    """
    i = int(np.flatnonzero(bad)[0])
    e = int(runs.ends(i, i + 1)[0])
    found = where_nan(i) if where_nan is not None else ""
    raise InvalidValueError(
        "features", f"window {i} (steps {e - h}..{e} of the source, label to step {e + fwd}) holds NaN or inf "
        f"in its features or label{': ' + found if found else ''}; set features.nan: drop or fill")


def _nan_in_window(f: da.Array, names: Sequence[str], runs: WindowRuns, x: da.Array, columns: Sequence[str],
                   i: int, *, size: int, scales: Sequence[int], lookback: int, source_fill: float | None,
                   top: Sequence[str] = ()) -> str:
    """Where window ``i`` holds its first NaN or inf feature: the feature and the source
    row, and, with ``source_fill``, the empty level-1 price that made it (at that row, or
    in the feature's lookback before it, for the features ``top`` names). ``""`` when its features are finite (its label
    is not). Computed only for the refusal: a few rows of each array."""
    e = int(runs.ends(i, i + 1)[0])
    rows = np.unique(np.concatenate([e - s * np.arange(size) for s in scales]))
    vals = np.asarray(take_rows(f, rows).compute())
    bad = ~np.isfinite(vals)
    if not bad.any():
        return ""
    r, c = np.argwhere(bad)[0]  # the earliest row, its first feature
    row, name = int(rows[r]), names[int(c)]
    text = f"feature {name} is {vals[r, c]} at row {row} of the source"
    if source_fill is None or name not in top:
        return text
    back = np.arange(max(0, row - lookback), row + 1)
    idx = [list(columns).index(p) for p in TOP_PRICES]
    flags = empty_top_prices(np.asarray(take_rows(x, back).compute())[:, idx], TOP_PRICES, source_fill)
    hit = np.argwhere(flags)
    if not hit.size:
        return text
    at, side = hit[-1]
    return (f"{text}, as {TOP_PRICES[side]} was empty at row {int(back[at])} (source.nan: fill wrote "
            f"{source_fill:g} there, which is no price)")


def _blocks(n: int, unit: int | None, window_bytes: int, prior: Prior | None, split: str) -> tuple[int, ...]:
    """Windows per block of a split: the writer's blocks (``unit``), continuing the
    stored ones for an append (the first new block ends on a block edge), or blocks
    of about 64 MiB."""
    if not unit:
        return _chunks(n, (64 << 20) // window_bytes)
    first = 0 if prior is None else (-prior.samples.get(split, 0)) % int(unit)
    return _continued_chunks(n, int(unit), first)


def _fold_output(fold_sets: Any, where: np.ndarray, bad: np.ndarray, spec: FoldSpec, segs: SegmentTable,
                 per_split: Mapping[str, WindowRuns], prior: Prior | None, attrs: dict[str, Any]
                 ) -> dict[str, np.ndarray]:
    """The folds' sample indices, their description put in ``attrs["folds"]``: from this
    build's windows, or, for an append, over the stored samples' sessions and the new
    ones'."""
    if prior is None:
        index, attrs["folds"] = _fold_index(fold_sets[0], fold_sets[1], where, bad, spec)
        return index
    first = per_split[next(iter(per_split))]
    new_sessions = segs.session[first.segments_of()] if first.n else np.zeros(0, np.int64)
    index, attrs["folds"] = continue_folds(np.concatenate([prior.base_sessions, new_sessions]), spec)
    return index


def _continued_chunks(n: int, unit: int, first: int) -> tuple[int, ...]:
    """Blocks of ``unit`` windows, the first ``first`` long when ``first`` is not 0 (an
    append's windows after a stored write unit that they complete)."""
    if first <= 0 or n <= first:
        return unit_chunks(n, unit) if first <= 0 else (n,)
    return (first,) + unit_chunks(n - first, unit)


def _metadata(features: Sequence[str], lookback: int, label: LabelSpec, stats: dict[str, Any], segs: SegmentTable,
              per_split: Mapping[str, WindowRuns], where: np.ndarray, bad: np.ndarray, y_values: np.ndarray,
              seg_times: np.ndarray | None, *, windows: dict[str, Any], splits: dict[str, Any],
              dropped: np.ndarray | None = None) -> dict[str, Any]:
    """What the store records about how its windows were made: geometry, labels and their
    class balance, normalization, the splits, and the session table. ``bad``: the
    windows left out for NaN; ``dropped``: every window left out (default ``bad``)."""
    names = list(per_split)
    kept = ~(bad if dropped is None else dropped)
    attrs: dict[str, Any] = {
        "features": list(features),
        "lookback": lookback,
        "windows": windows,
        "labels": _label_attrs(label),
        "normalization": stats,
        **splits,
        "nan_windows_dropped": {name: int(((where == k) & bad).sum()) for k, name in enumerate(names)},
        "window_counts": {name: r.n for name, r in per_split.items()},
        "instruments": list(segs.instruments),
        "sessions": segs.describe(windows=_windows_per_segment(per_split, len(segs)), times=seg_times),
    }
    if label.class_names is not None:
        attrs["class_balance"] = {n: class_balance(finalize_labels(y_values[(where == k) & kept], label), label)
                                  for k, n in enumerate(names)}
    elif label.map:  # a value the map does not name is refused now, before anything is written
        finalize_labels(y_values[(where >= 0) & kept], label)
    return attrs


def _check_inputs(x: da.Array, segs: SegmentTable, norm: NormalizeSpec, materialize: bool) -> None:
    if segs.rows != int(x.shape[0]):
        raise WindowError(f"sessions: segments of {segs.rows} rows for a source of {int(x.shape[0])} rows")
    if not materialize and norm.kind == "window":
        raise FeatureError("windows.materialize: false needs normalize: global, trailing or none (per-window "
                           "statistics depend on the assembled window)")


def _windows_that_fit(segs: SegmentTable, norm: NormalizeSpec, *, size: int, stride: int, scales: Sequence[int],
                      back: int, fwd: int, lookback: int, prior: SegmentTable | None = None) -> WindowRuns:
    """Every window that fits in a segment with its reach; under trailing normalization,
    none from each instrument's first sessions (they have no history to be scaled by).

    Raises
    ------
    WindowError
        When no window fits anywhere.
    """
    runs = window_runs(segs, size=size, stride=stride, scales=scales, back=back, fwd=fwd)
    if norm.kind == "trailing":
        first = _first_sessions(segs, norm.sessions, prior)[runs.segment]
        runs = runs.subset(np.repeat(segs.session[runs.segment] >= first, runs.count))
        runs = _without_thin_histories(runs, segs, norm.sessions, lookback, prior)
    if runs.n == 0 and prior is None:
        longest = int((segs.stops - segs.starts).max())
        raise WindowError(
            f"windows: no session leaves room for a window: the longest has {longest} steps, and a window of "
            f"size={size} at scales={tuple(scales)} with a feature lookback of {lookback} and a label reaching "
            f"{fwd} ahead needs {back + fwd + 1}"
            + (f" (and trailing normalization skips the first {norm.sessions} sessions, and those whose "
               f"sessions before them hold fewer than {MIN_HISTORY_ROWS} rows after the lookback)"
               if norm.kind == "trailing" else ""))
    return runs


def _without_thin_histories(runs: WindowRuns, segs: SegmentTable, sessions: int, lookback: int,
                            prior: SegmentTable | None) -> WindowRuns:
    """``runs`` without the windows of sessions whose trailing history holds fewer than
    :data:`~pipeline.features.normalize.MIN_HISTORY_ROWS` rows after the lookback (a
    short day before them): like an instrument's first sessions, they make no window.
    Scaled, they would be stored unscaled (statistics of no row are 0 and 1) or only
    centred (one row's std of 0 is taken as 1) beside z-scored sessions.

    Warns
    -----
    UserWarning
        How many sessions and windows were left out, naming the first sessions.
    """
    rows = trailing_history_rows(segs, lookback, sessions, prior)
    thin = (rows >= 0) & (rows < MIN_HISTORY_ROWS)
    lost = thin[runs.segment] & (runs.count > 0)
    if not lost.any():
        return runs
    named = np.unique(runs.segment[lost])
    shown = "; ".join(describe_segment(segs, int(k)) for k in named[:5]) + ("; ..." if named.size > 5 else "")
    before = "session" if sessions == 1 else f"{sessions} sessions"
    warnings.warn(f"normalize: trailing: {named.size} session(s) make no window ({int(runs.count[lost].sum()):,} "
                  f"windows left out): the {before} of their instrument before them "
                  f"hold{'s' if sessions == 1 else ''} fewer than "
                  f"{MIN_HISTORY_ROWS} rows after the features' lookback of {lookback} to fit statistics on: "
                  f"{shown}; remove such short sessions' files, or use more sessions "
                  f"(normalize: {{kind: trailing, sessions: {sessions + 1}}})", UserWarning, stacklevel=4)
    return runs.subset(np.repeat(~thin[runs.segment], runs.count))


def _split_runs(runs: WindowRuns, where: np.ndarray, bad: np.ndarray,
                splits: Mapping[str, Any], norm: NormalizeSpec, empty_ok: bool = False,
                future: frozenset[str] = frozenset()) -> dict[str, WindowRuns]:
    """The windows of each split, NaN ones left out.

    Raises
    ------
    WindowError
        When a split gets no window (unless ``empty_ok``: an append's new sessions;
        or it is one of the ``future`` splits).
    """
    out = {}
    for k, name in enumerate(splits):
        mine = where == k
        out[name] = runs.subset(mine & ~bad)
        if out[name].n == 0 and not empty_ok and name not in future:
            _refuse_empty(name, runs.n, int(mine.sum()), splits, norm,
                          across_cuts=0 if mine.any() else int((where < 0).sum()))
    return out


def _future_splits(where: np.ndarray, splits: Mapping[str, Any]) -> frozenset[str]:
    """Date splits after the data: every one after the first that no window reaches,
    nor any split after it (a daily store set up before its validation or test days
    exist; appended days fill them). An empty split between two that hold windows is
    a mistake, and stays refused."""
    if not is_dated(splits):
        return frozenset()
    names = list(splits)
    last = int(where.max()) if where.size and where.max() >= 0 else -1
    return frozenset(names[max(last + 1, 1):])


def _check_splits_hold_windows(runs: WindowRuns, where: np.ndarray, splits: Mapping[str, Any],
                               norm: NormalizeSpec, future: frozenset[str] = frozenset()) -> None:
    """Refuse a split that no window falls in, from the counts alone (before the pass
    that fits the normalization on the train split: an empty one has nothing to fit),
    but for ``future`` splits (:func:`_future_splits`)."""
    per_split = np.bincount(np.asarray(where[where >= 0], dtype=np.int64), minlength=len(splits))
    for k, name in enumerate(splits):
        if not per_split[k] and name not in future:
            _refuse_empty(name, runs.n, 0, splits, norm, across_cuts=int((where < 0).sum()))


def _refuse_empty(name: str, total: int, before_nan: int, splits: Mapping[str, Any], norm: NormalizeSpec,
                  across_cuts: int = 0) -> None:
    # Trailing normalization serves no window of an instrument's first sessions: with
    # date splits that alone can leave the first split empty, which the counts hide.
    first = "first session" if norm.sessions == 1 else f"first {norm.sessions} sessions"
    skipped = (f"; trailing normalization serves no window of each instrument's {first}"
               if norm.kind == "trailing" else "")
    if across_cuts:
        # None fell in the split at all: a split narrower than what each cut leaves out
        # (the windows whose history or label spans it), not NaN, emptied it.
        held = (f"0 in this split; {across_cuts} left out across the cuts between splits, as a window whose "
                "history or label spans a cut is")
    else:
        held = (f"{before_nan} in this split before those holding NaN, or whose label reads an empty price, were "
                "left out")
    raise WindowError(
        f"split {name!r}: no window left ({total} windows in all, {held}, splits {_describe_splits(splits)}"
        f"{skipped}); use more data, another split point, or a smaller window, horizon or stride")


def _fit_and_check(f: da.Array, runs: WindowRuns, fit_runs: WindowRuns, labels_steps: da.Array,
                   timestamps: da.Array | None, segs: SegmentTable, norm: NormalizeSpec, *, size: int,
                   scales: Sequence[int], lookback: int, progress: bool, prior: Prior | None = None,
                   gaps: da.Array | None = None, features: Sequence[str] = (), serves: np.ndarray | None = None,
                   empties: da.Array | None = None
                   ) -> tuple[da.Array, dict[str, Any], np.ndarray, np.ndarray, np.ndarray | None, np.ndarray,
                              np.ndarray | None]:
    """One pass over the data for everything needed before the write: the normalization
    statistics, every window's label values and whether any row a window uses is not
    finite, each segment's first and last time, and (with ``gaps``, from
    :func:`~pipeline.features.labels.label_gaps`) which prices each window's label reads
    empty. Returns the features (as given: :func:`~pipeline.features.normalize.row_scaler`
    applies the statistics), the statistics, which windows hold NaN or inf, the label
    values, the times, and ``(n, columns)`` bool empty reads (``(n, 0)`` without ``gaps``).
    ``features`` (their names) and ``serves`` (whether each segment's windows are stored)
    go to trailing statistics, which refuse to scale such a segment over too thin a
    history (:func:`~pipeline.features.normalize.fit_normalization`). ``empties`` (per
    chunk counts of empty level-1 prices, :func:`_empty_counts`) are computed in the same
    pass and returned last (``None`` without them)."""
    # The label values themselves (a few numbers per window) rather than only whether
    # they are finite: the class balance then needs no second pass over the data.
    reductions = [_bad_row_counts(f, segs, lookback), gather_rows(labels_steps, runs, _chunks(runs.n))]
    if timestamps is not None:
        reductions.append(take_rows(timestamps, np.stack([segs.starts, segs.stops - 1], axis=1).reshape(-1)))
    if gaps is not None:
        reductions.append(gather_rows(gaps, runs, _chunks(runs.n)))
    if prior is not None and norm.kind == "global":
        # Frozen at the first build: an append scales new sessions as the stored ones.
        stats_tasks, finish = [], lambda res: dict(prior.stats)
    else:
        stats_tasks, finish = fit_normalization(f, norm, segs, fit_runs, halo(size, scales), lookback,
                                                prior=None if prior is None or norm.kind != "trailing"
                                                else (prior.segments, prior.moments()),
                                                serves=serves, features=features)
    # The counts go right after the other arrays: dask 2026.7's compute returns the
    # arrays' results before the delayed statistics, whatever order they are passed in.
    extra = [] if empties is None else [empties]
    results = compute(*reductions, *extra, *stats_tasks, desc="statistics and NaN check", progress=progress)
    empty_counts = np.asarray(results[len(reductions)]) if extra else None
    results = results[: len(reductions)] + results[len(reductions) + len(extra):]
    bad_steps_n, y_values = int(np.sum(results[0])), np.asarray(results[1])
    bad = ~np.isfinite(y_values).all(axis=1)
    seg_times = np.asarray(results[2]).reshape(-1, 2) if timestamps is not None else None
    empty_reads = (np.asarray(results[len(reductions) - 1], dtype=bool).reshape(runs.n, int(gaps.shape[1]))
                   if gaps is not None else np.zeros((runs.n, 0), dtype=bool))
    stats = finish(results[len(reductions):])
    if bad_steps_n:
        # Only now pay for a windowed pass: which windows hold one of the bad rows.
        flags = _bad_rows(f, segs, lookback).astype(np.uint8)[:, None]
        (flagged,) = compute(windows_at(flags, runs, size=size, scales=scales).max(axis=(1, 2)),
                             desc="locating NaN windows", progress=progress)
        bad |= np.asarray(flagged, dtype=bool)
    return f, stats, bad, y_values, seg_times, empty_reads, empty_counts


def _place(runs: WindowRuns, segs: SegmentTable, splits: Mapping[str, Any], timestamps: da.Array | None, *,
           back: int, fwd: int, gap: int, progress: bool, prior: Prior | None = None
           ) -> tuple[np.ndarray, list[int], str, int, dict[str, Any]]:
    """The split of every window (``-1``: none), the cuts between splits, whether they
    are times or rows, the gap, and what the placement left out (``split_left_out``:
    ``outside`` every split's time, ``across`` a cut (their reach crosses from one
    split's time into another's, or past a split's end), and per split taken by its
    ``embargo``; with the windows stored, they add up to the windows made).

    Fraction cuts are placed where :func:`~pipeline.features.geometry.split_ranges`
    would start each split among the windows in time order (with the gap of one
    series), then every window is placed by its reach, so a cut that falls inside a
    session leaves out exactly the windows that straddle it. Dated splits place each
    window in the split whose spans (:func:`~pipeline.features.splits.split_spans`)
    hold its reach; then each split's embargo leaves out its windows that end too
    close to the next split.

    Raises
    ------
    WindowError
        A listed date that no window of its split reaches into (not for an append
        (``prior``), which holds only new days); an append whose new windows start
        within a stored split's embargo (:func:`_check_append_embargo`).

    Warns
    -----
    UserWarning
        How many windows lie on dates no split lists (date-list splits only).
    """
    names = list(splits)
    dated = is_dated(splits)
    several = len(np.unique(segs.instrument)) > 1
    lo_key, hi_key, end_key, key_kind = _reach_keys(runs, back, fwd, timestamps, dated or (several and len(names) > 1),
                                                    progress)
    order = np.argsort(end_key, kind="stable")
    left_out: dict[str, Any] = {}
    if dated:
        spans = split_spans(splits)
        where = place_windows(lo_key, hi_key, spans)
        cuts = [b["until"] for b in splits.values() if "dates" not in b and b.get("until") is not None]
        outside = outside_splits(lo_key, spans)
        if outside.any() or has_dates(splits):  # a warm-up before a from, days no split lists
            left_out["outside"] = int(outside.sum())
        left_out["across"] = _across(where, outside)
        if has_dates(splits):
            _check_listed_dates(lo_key, hi_key, where, splits, append=prior is not None)
            if outside.any():
                first = np.datetime64(int(lo_key[outside].min()), "ns")
                warnings.warn(f"splits: {int(outside.sum())} of {runs.n} windows start on dates no split lists "
                              f"(the first at {first}); they are left out of every split", UserWarning,
                              stacklevel=3)
        embargo = embargoes(splits)
        if any(embargo):
            embargoed = embargo_mask(lo_key, hi_key, where, embargo)
            left_out["embargo"] = {name: int((embargoed & (where == k)).sum()) for k, name in enumerate(names)
                                   if embargo[k]}
            where[embargoed] = -1
            if prior is not None:
                _check_append_embargo(lo_key, where, splits, prior)
    elif len(names) > 1:
        cuts = fraction_cuts(lo_key, order, splits, gap)
        where = assign_splits(lo_key, hi_key, cuts, names)
        left_out["across"] = _across(where, np.zeros(where.shape, dtype=bool))
    else:
        cuts = []
        where = assign_splits(lo_key, hi_key, cuts, names)
    if not dated and len(names) > 1 and sum(splits.values()) < 1.0 - 1e-9:
        # Fractions summing below 1 leave the latest windows out, as the count of the
        # last split says: outside every split's share of time.
        last_hi = list(split_ranges(runs.n, splits, gap).values())[-1][1]
        tail = np.zeros(where.shape, dtype=bool)
        tail[order[last_hi:]] = True
        left_out["across"] -= int((tail & (where < 0)).sum())
        left_out["outside"] = int(tail.sum())
        where[tail] = -1
    return where, cuts, key_kind, gap, ({"split_left_out": left_out} if left_out else {})


def _across(where: np.ndarray, outside: np.ndarray) -> int:
    """How many windows the placement left out because their reach crosses a cut (from
    one split's time into the next one's, or past a split's end), as opposed to those
    starting outside every split's time (``outside``): in no split, and not outside."""
    return int(((where < 0) & ~outside).sum())


def _check_append_embargo(lo_key: np.ndarray, where: np.ndarray, splits: Mapping[str, Any], prior: Prior) -> None:
    """Refuse an append whose new windows of one split start within another split's
    embargo of the stored data's last step, while that split holds stored samples:
    those were placed before the next split's first step existed, and a build of every
    file would leave some of them out (stored samples are never taken back).

    Raises
    ------
    WindowError
        Naming both splits, the embargo and the fix (a rebuild).
    """
    ends = [np.datetime64(str(r["end"]), "ns").astype(np.int64) for r in prior.attrs.get("sessions") or []
            if isinstance(r, Mapping) and r.get("end")]
    if not ends:
        return
    last = int(max(ends))
    names = list(splits)
    for k, gap in enumerate(embargoes(splits)):
        if not gap or not prior.samples.get(names[k]):
            continue
        others = (where >= 0) & (where != k)
        if others.any() and int(lo_key[others].min()) - last < gap:
            first = names[int(where[others][np.argmin(lo_key[others])])]
            raise WindowError(
                f"append: split {names[k]!r} has an embargo of {duration_text(gap)}, and the new files' first "
                f"window of split {first!r} starts at {np.datetime64(int(lo_key[others].min()), 'ns')}, within it "
                f"of the stored data's last step ({np.datetime64(last, 'ns')}); {names[k]!r}'s stored samples were "
                "placed before that step existed and are never taken back: rebuild the store "
                "(pipeline run --rebuild) to apply the embargo")


def _check_listed_dates(lo_key: np.ndarray, hi_key: np.ndarray, where: np.ndarray, splits: Mapping[str, Any], *,
                        append: bool) -> None:
    """Refuse a listed date, inside the data's time, that no window of its split reaches
    into (:func:`~pipeline.features.splits.lacking_dates`): a published split naming a
    day the data lacks would otherwise be reproduced without it, silently.

    Raises
    ------
    WindowError
        Naming the split, the first dates and how many.
    """
    missing = [] if append else lacking_dates(lo_key, hi_key, where, splits)
    if missing:
        name = missing[0][0]
        days = [str(np.datetime64(d // 86_400_000_000_000, "D")) for n, d in missing if n == name]
        raise WindowError(
            f"splits: split {name!r} lists {len(days)} date(s) that none of its windows reaches into: "
            f"{', '.join(days[:5])}{', ...' if len(days) > 5 else ''} ({len(missing)} such dates in all splits; "
            f"the data's windows run from {np.datetime64(int(lo_key.min()), 'ns')} to "
            f"{np.datetime64(int(hi_key.max()), 'ns')}): the data has no session that day, or no window's reach "
            "(history to label) fits in the split's days; add those days' files, remove the dates, or use "
            "sessions within a day and shorter windows")


def _chunks(n: int, per: int = 1 << 20) -> tuple[int, ...]:
    per = max(1, int(per))
    return (per,) * (n // per) + ((n % per,) if n % per else ()) or (0,)


def _describe_splits(splits: Mapping[str, Any]) -> str:
    parts = []
    for k, v in splits.items():
        if isinstance(v, Mapping) and v.get("dates"):
            parts.append(f"{k} on {len(v['dates'])} listed date(s)")
        elif isinstance(v, Mapping):
            u, f = v.get("until"), v.get("from")
            since = f" from {np.datetime64(int(f), 'ns')}" if f is not None else ""
            parts.append(f"{k}{since} until {np.datetime64(int(u), 'ns')}" if u is not None
                         else f"{k}{since} the rest" if not since else f"{k}{since} on")
        else:
            parts.append(f"{k} {v:g}")
    return ", ".join(parts)


def _row_flags(block: np.ndarray, lo: int, segs: SegmentTable, lookback: int) -> np.ndarray:
    """Which rows of a block starting at row ``lo`` hold NaN or inf where a window may
    use them (rows of a segment's lookback head, which no window uses as a step, are
    not flagged)."""
    bad = ~np.isfinite(block).all(axis=1)
    return bad & ~segs.head_mask(lo, lo + block.shape[0], lookback)


def _bad_rows(f: da.Array, segs: SegmentTable, lookback: int) -> da.Array:
    """Rows a window may use that hold NaN or inf (:func:`_row_flags`)."""
    starts = chunk_bounds(f.chunks[0])

    def flag(block: np.ndarray, block_id: tuple[int, ...] = (0, 0)) -> np.ndarray:
        return _row_flags(block, int(starts[block_id[0]]), segs, lookback)

    return f.map_blocks(flag, dtype=bool, drop_axis=1, token="bad-rows")


def _bad_row_counts(f: da.Array, segs: SegmentTable, lookback: int) -> da.Array:
    """How many rows of each chunk :func:`_bad_rows` flags: one task per chunk, summed
    by the caller (dask's ``sum`` of the flags took two tasks per chunk and a tree)."""
    starts = chunk_bounds(f.chunks[0])

    def count(block: np.ndarray, block_id: tuple[int, ...] = (0, 0)) -> np.ndarray:
        return np.array([np.count_nonzero(_row_flags(block, int(starts[block_id[0]]), segs, lookback))])

    return f.map_blocks(count, dtype=np.int64, drop_axis=1, chunks=((1,) * len(f.chunks[0]),),
                        token="bad-row-counts")


def _first_sessions(segs: SegmentTable, n: int, prior: SegmentTable | None = None) -> np.ndarray:
    """Per segment, the session number from which its instrument's windows are made
    under trailing normalization: its ``n``-th session (counted in time order, the
    stored sessions of ``prior`` first)."""
    out = np.zeros(len(segs), dtype=np.int64)
    for code in np.unique(segs.instrument):
        mine = np.flatnonzero(segs.instrument == code)
        before = np.zeros(0, np.int64) if prior is None else prior.session[prior.instrument == code]
        order = np.sort(np.concatenate([before, segs.session[mine]]))
        out[mine] = order[n] if n < order.size else np.iinfo(np.int64).max
    return out


def _windows_per_segment(split_runs: Mapping[str, WindowRuns], n_segments: int) -> np.ndarray:
    total = np.zeros(n_segments, dtype=np.int64)
    for r in split_runs.values():
        total += r.per_segment(n_segments)
    return total


def _label_attrs(label: LabelSpec) -> dict[str, Any]:
    out = label.describe()
    out["reach"] = list(label.reach)
    return out


def _folds(segs: SegmentTable, runs: WindowRuns, where: np.ndarray,
           spec: FoldSpec) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[tuple[list[int], list[int]]]]:
    """Per fold, which windows of the first split train and test (a boolean per window),
    and the session numbers of each."""
    in_base = where == 0
    window_period = np.repeat(segs.session[runs.segment], runs.count)
    periods = np.unique(window_period[in_base])
    masks, sessions = [], []
    for train_p, test_p in fold_sessions(int(periods.size), spec):
        masks.append((np.isin(window_period, periods[train_p]) & in_base,
                      np.isin(window_period, periods[test_p]) & in_base))
        sessions.append((periods[train_p].tolist(), periods[test_p].tolist()))
    return masks, sessions


def _fold_index(sets: list[tuple[np.ndarray, np.ndarray]], sessions: list[tuple[list[int], list[int]]],
                where: np.ndarray, bad: np.ndarray, spec: FoldSpec) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Sample indices into the first split (its windows left after dropping NaN ones)."""
    kept = (where == 0) & ~bad
    position = np.cumsum(kept) - 1  # sample number of each kept window in the first split
    out: dict[str, np.ndarray] = {}
    for i, (train, test) in enumerate(sets):
        out[f"fold{i}/train"] = position[train & kept].astype(np.int64)
        out[f"fold{i}/test"] = position[test & kept].astype(np.int64)
    info = {"kind": spec.kind, "test_sessions": spec.test_sessions, "min_train_sessions": spec.min_train_sessions,
            "train_sessions": spec.train_sessions, "count": len(sets),
            "sessions": {f"fold{i}": {"train": tr, "test": te} for i, (tr, te) in enumerate(sessions)}}
    return out, info
