"""Labels of every step of a ``(T, C)`` order-book table, and their final form.

Labels are made in two stages. :func:`label_steps` gives, for every step ``e`` of the
series, the *unfinalized* value of the label of a window ending at ``e`` (a log return,
a smoothed relative change, or a column's value) in float64, one column per horizon,
NaN where the label's reach leaves the series. The caller picks the windows' rows and
drops those that are not finite; :func:`finalize_labels` then applies ``scale``, the
classes and the output dtype. Keeping the unscaled float64 values until then lets a
non-finite label be seen before it becomes an arbitrary class number.

Every value depends on steps ``e - back .. e + fwd`` only (``LabelSpec.reach``); each
block borrows that many steps from its neighbours and sums in a fixed order, so the
values are bit-identical whatever the chunking.

A source read with ``nan: fill`` holds its fill value (0 by default) where a price was
empty (LOBSTER's dummy prices, a one-sided book): a mid price made of it is half the
other side, or 0, and a label read from it is a fabricated move of 69% or more.
:func:`label_gaps` says, for every step, whether the label of a window ending there
reads such a price, so that the build leaves those windows out.
"""

from __future__ import annotations

from typing import Sequence

import dask.array as da
import numpy as np

from pipeline.errors import FeatureError
from pipeline.features.blockwise import map_with_halo
from pipeline.features.specs import LabelSpec
from pipeline.features.steps import TOP_PRICES, missing_column
from pipeline.loaders.precision import boundary_message, near_boundaries

__all__ = ["class_balance", "finalize_labels", "gaps_message", "label_gaps", "label_gaps_numpy", "label_steps",
           "label_steps_numpy", "on_boundaries", "rounding_message"]


def _col(columns: Sequence[str], name: str) -> int:
    try:
        return list(columns).index(name)
    except ValueError:
        error = missing_column("labels", name, columns)
        if name in TOP_PRICES and not set(TOP_PRICES) & set(map(str, columns)):
            # A feed of mid prices only: renaming one column to both is refused (one
            # source column per name), so say what does label it.
            error = FeatureError(f"{error}; return, class and smoothed labels move with the mid price of "
                                 "bid_price_1 and ask_price_1, both source columns: a feed without a best bid and "
                                 "ask (a mid price only) can compute its label into a column of its files and use "
                                 "labels: {kind: column, column: <that column>}")
        raise error from None


def _ahead(values: np.ndarray, k: int) -> np.ndarray:
    """``values[e + k]`` at row ``e``; NaN where ``e + k`` is past the end."""
    out = np.full(values.shape, np.nan)
    if k < values.size:
        out[: values.size - k] = values[k:]
    return out


def _window_mean(values: np.ndarray, first: int, k: int) -> np.ndarray:
    """Mean of ``values[e + first .. e + first + k - 1]`` at row ``e``; NaN where any of
    those rows is outside ``values``.

    The sum runs term by term in one fixed order, so a row's value does not depend on
    where the block starts (a cumulative sum, or numpy's pairwise reduction over a
    sliding view, could round differently in another block).
    """
    n = values.size
    out = np.full(n, np.nan)
    lo = max(0, -first)  # first row whose window starts inside the block
    hi = n - (first + k - 1)  # one past the last row whose window ends inside it
    if hi <= lo:
        return out
    acc = values[lo + first : hi + first].copy()
    for j in range(1, k):
        acc += values[lo + first + j : hi + first + j]
    out[lo:hi] = acc / k
    return out


def label_steps_numpy(block: np.ndarray, columns: Sequence[str], spec: LabelSpec) -> np.ndarray:
    """Unfinalized label value of every step of one block.

    Parameters
    ----------
    block
        ``(rows, C)`` consecutive steps of the raw table.
    columns
        Names of ``block``'s columns.
    spec
        The label.

    Returns
    -------
    numpy.ndarray
        ``(rows, max(1, len(spec.horizon_list)))`` float64, one column per horizon: for
        ``return`` and ``class`` ``log(p[e+k]) - log(p[e])`` (not scaled); for
        ``smoothed`` ``l`` (not scaled); for ``column`` the column's value. NaN where
        the block does not hold the steps the label reads (its first ``back`` and last
        ``fwd`` rows, per horizon).
    """
    b = np.asarray(block)
    idx = [_col(columns, name) for name in spec.required_columns]
    if spec.kind == "column":
        return b[:, idx].astype(np.float64).reshape(b.shape[0], len(idx))
    # Prices are summed in float64 exactly as the mid_price feature does.
    mid = (b[:, idx[0]].astype(np.float64) + b[:, idx[1]].astype(np.float64)) / 2.0
    ks = spec.horizon_list
    out = np.empty((b.shape[0], len(ks)), dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        if spec.kind in ("return", "class"):
            logmid = np.log(mid)
            for j, k in enumerate(ks):
                # Difference of logs: the arithmetic of the stored labels of earlier
                # versions, kept so the same config gives bit-identical values.
                out[:, j] = _ahead(logmid, k) - logmid
        else:
            for j, k in enumerate(ks):
                m_plus = _window_mean(mid, 1, k)
                ref = mid if spec.reference == "current" else _window_mean(mid, -(k - 1), k)
                out[:, j] = (m_plus - ref) / ref
    return out


def label_steps(x: da.Array, *, columns: Sequence[str], spec: LabelSpec, cuts: Sequence[int] | None = None
                ) -> da.Array:
    """Unfinalized label value of every step of the series, blockwise.

    Parameters
    ----------
    x
        ``(T, C)`` raw table, time along axis 0.
    columns
        Names of ``x``'s columns.
    spec
        The label.
    cuts
        Rows where the series is cut into sessions: no block reads across one
        (:func:`~pipeline.features.blockwise.map_with_halo`); steps whose reach crosses
        one then differ from the uncut series (a build never uses them).

    Returns
    -------
    dask.array.Array
        ``(T, max(1, len(spec.horizon_list)))`` float64, chunked like ``x`` along time,
        equal to
        :func:`label_steps_numpy` over the whole series: steps whose reach leaves the
        series are NaN. The series is taken as one: a label that reaches across a
        session or instrument boundary is the caller's to leave out.

    Raises
    ------
    FeatureError
        Before anything is computed, when a column the label reads is missing.
    """
    cols = tuple(columns)
    idx = [_col(cols, name) for name in spec.required_columns]
    back, fwd = spec.reach
    needed = spec.required_columns
    # Only the columns the label reads reach its step, selected in the step's task.
    return map_with_halo(x, lambda block: label_steps_numpy(block, needed, spec), back=back, fwd=fwd,
                         width=spec.width, dtype=np.float64, token="label-steps", columns=idx, cuts=cuts)


def _any_within(flags: np.ndarray, first: int, last: int) -> np.ndarray:
    """Whether any of ``flags[e + first .. e + last]`` is set, at each row ``e``; rows
    outside ``flags`` count as unset (a label reaching them is NaN, and its window is
    never made)."""
    n = flags.size
    counts = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])  # integers: exact in any block
    e = np.arange(n)
    return counts[np.clip(e + last + 1, 0, n)] - counts[np.clip(e + first, 0, n)] > 0


def label_gaps_numpy(block: np.ndarray, columns: Sequence[str], spec: LabelSpec, empty: float) -> np.ndarray:
    """Whether the label of a window ending at each step reads an empty price.

    Parameters
    ----------
    block
        ``(rows, C)`` consecutive steps of the raw table.
    columns
        Names of ``block``'s columns.
    spec
        The label (a mid-price kind: ``return``, ``class`` or ``smoothed``).
    empty
        The value the source wrote where a price was empty (``source.fill_value`` under
        ``source.nan: fill``), compared in ``block``'s dtype; NaN matches NaN.

    Returns
    -------
    numpy.ndarray
        ``(rows, len(spec.required_columns))`` bool, one column per price the label
        reads, in ``spec.required_columns`` order: set at row ``e`` when a row the label
        of a window ending at ``e`` reads, for any horizon, holds ``empty`` in that
        column. ``return`` and ``class`` read rows ``e`` and ``e + k``; ``smoothed``
        reads ``e + 1 .. e + k`` and ``e`` (``reference: current``) or ``e - k + 1 ..
        e`` (``past_mean``), as :func:`label_steps_numpy` does.
    """
    b = np.asarray(block)
    idx = [_col(columns, name) for name in spec.required_columns]
    target = np.asarray(empty, dtype=b.dtype)
    out = np.zeros((b.shape[0], len(idx)), dtype=bool)
    for j, c in enumerate(idx):
        flags = np.isnan(b[:, c]) if np.isnan(target) else b[:, c] == target
        if not flags.any():
            continue
        for k in spec.horizon_list:
            if spec.kind in ("return", "class"):
                out[:, j] |= flags | _any_within(flags, k, k)
            else:
                back = 0 if spec.reference == "current" else k - 1
                out[:, j] |= _any_within(flags, -back, k)
    return out


def label_gaps(x: da.Array, *, columns: Sequence[str], spec: LabelSpec, empty: float,
               cuts: Sequence[int] | None = None) -> da.Array:
    """:func:`label_gaps_numpy` over the whole series, blockwise.

    Parameters
    ----------
    x
        ``(T, C)`` raw table, time along axis 0.
    columns
        Names of ``x``'s columns.
    spec
        The label (a mid-price kind).
    empty
        The value the source wrote where a price was empty.
    cuts
        Rows where the series is cut into sessions: no block reads across one
        (:func:`~pipeline.features.blockwise.map_with_halo`); steps whose reach crosses
        one then differ from the uncut series (a build never uses them).

    Returns
    -------
    dask.array.Array
        ``(T, len(spec.required_columns))`` bool, chunked like ``x`` along time, equal
        to :func:`label_gaps_numpy` over the whole series whatever the chunking.

    Raises
    ------
    FeatureError
        Before anything is computed, for a ``column`` label (it reads no price), or
        when a column the label reads is missing.
    """
    if spec.kind == "column":
        raise FeatureError("labels: a column label reads no price; empty prices apply to return, class and "
                           "smoothed labels")
    cols = tuple(columns)
    idx = [_col(cols, name) for name in spec.required_columns]
    back, fwd = spec.reach
    needed = spec.required_columns
    return map_with_halo(x, lambda block: label_gaps_numpy(block, needed, spec, empty), back=back, fwd=fwd,
                         width=len(needed), dtype=bool, token="label-gaps", columns=idx, cuts=cuts)


def gaps_message(reads: np.ndarray, spec: LabelSpec) -> str | None:
    """The warning for windows left out because their label reads an empty price.

    Parameters
    ----------
    reads
        ``(n, len(spec.required_columns))`` bool: which prices each window's label reads
        empty (:func:`label_gaps` at the windows' ends).
    spec
        The label.

    Returns
    -------
    str or None
        How many windows, and which price column was empty (with each column's count
        when both were); ``None`` when no window reads one.
    """
    reads = np.asarray(reads, dtype=bool)
    reads = reads[:, None] if reads.ndim == 1 else reads
    n = int(reads.any(axis=1).sum())
    if not n:
        return None
    def windows(count: int) -> str:
        return f"{count:,} window{'' if count == 1 else 's'}"

    per_column = [(name, int(c)) for name, c in zip(spec.required_columns, reads.sum(axis=0)) if c]
    which = (per_column[0][0] if len(per_column) == 1
             else " or ".join(f"{name} ({windows(c)})" for name, c in per_column))
    return (f"labels: {windows(n)} left out: their label reads {which} where it was empty (source.nan: fill); "
            "their labels would be computed from the fill value, not a price")


def rounding_message(values: np.ndarray, spec: LabelSpec) -> str | None:
    """The warning for class labels computed from float32 prices that lie so near a class
    boundary that exact prices could put them in the other class.

    Parameters
    ----------
    values
        Unfinalized label values (:func:`label_steps`) of the stored windows, computed
        from prices read as float32.
    spec
        The label.

    Returns
    -------
    str or None
        How many labels are that near (:func:`~pipeline.loaders.precision.near_boundaries`),
        the boundaries and the fix; ``None`` when none is, or the labels are not classes
        of a mid price (``return``, ``smoothed`` without ``alpha``, ``column``).
    """
    if spec.class_names is None or spec.kind == "column":
        return None
    if spec.kind == "class":
        bounds, what = tuple(spec.thresholds), "thresholds " + ", ".join(f"{t:g}" for t in spec.thresholds)
    else:
        bounds, what = (-spec.alpha, spec.alpha), f"alpha {spec.alpha:g}"
    near = int(near_boundaries(values, bounds, spec.scale).sum())
    return boundary_message(near, int(np.asarray(values).size), what) if near else None


def finalize_labels(values: np.ndarray, spec: LabelSpec) -> np.ndarray:
    """Labels in their stored form, from the values of :func:`label_steps`.

    Parameters
    ----------
    values
        ``(n, max(1, len(spec.horizon_list)))`` float64 (a 1-D ``(n,)`` is taken as one
        column), the rows of the labelled windows.
    spec
        The label.

    Returns
    -------
    numpy.ndarray
        ``(n, H)`` when ``spec.multi``, else ``(n,)``, of ``spec.out_dtype``: ``return``
        and ``smoothed`` without ``alpha`` are the value times ``scale`` as float32 (NaN
        stays NaN); ``class`` is ``numpy.digitize`` of the scaled value by
        ``thresholds``; ``smoothed`` with ``alpha`` is 0 = down (scaled value
        ``< -alpha``), 1 = stationary, 2 = up (``> alpha``); ``column`` is the value
        cast to its ``dtype``. Class numbers of non-finite values are arbitrary: drop
        those rows first.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 1:
        v = v[:, None]
    width = spec.width
    if v.ndim != 2 or (v.shape[0] and v.shape[1] != width):
        what = f"{width} columns" if spec.kind == "column" else f"{len(spec.horizon_list)} horizons"
        raise FeatureError(f"labels: expected values of shape (n, {width}) for {what}, got {v.shape}")
    if spec.kind == "column":
        if spec.map:
            v = mapped(v, spec)
        with np.errstate(invalid="ignore"):
            out = v.astype(spec.out_dtype)
    else:
        scaled = v * spec.scale
        if spec.kind == "class":
            scaled = on_boundaries(v, scaled, spec.thresholds, spec)
            out = np.digitize(scaled, np.asarray(spec.thresholds)).astype(np.int64)
        elif spec.kind == "smoothed" and spec.alpha is not None:
            scaled = on_boundaries(v, scaled, (-spec.alpha, spec.alpha), spec)
            out = np.ones(scaled.shape, dtype=np.int64)
            out[scaled < -spec.alpha] = 0
            out[scaled > spec.alpha] = 2
        else:
            out = on_boundaries(v, scaled, (0.0,), spec).astype(np.float32)
    return out if spec.multi else out.reshape(-1)


#: How far, in units of 2**-52 times ``1 + |value|``, a label computed in float64 from
#: decimal prices may lie from the value the decimal prices give exactly, besides one
#: unit per price of a horizon's mean. A decimal price (100.006, LOBSTER's 1000060 / 10000)
#: is rounded to float64 once, a mid price and a mean of k of them k + 2 times more, a
#: ratio or a difference of logs a few times (a log of a price up to 1e8 within 4 units);
#: 64 leaves room to spare. Two mid prices that differ at all differ by a tick, which
#: moves a label by 1e-10 or more at any real price: far outside this room.
TIE_ROUNDING = 64


def on_boundaries(values: np.ndarray, scaled: np.ndarray, boundaries: Sequence[float], spec: LabelSpec
                  ) -> np.ndarray:
    """``scaled`` with every value that lies within float64's rounding of a boundary
    put on it, so that a label whose exact value ties with a boundary is classed as the
    tie, and a mid price that did not move gives exactly 0.

    Tick prices make ties common: LOBSTER's prices are integers over 10,000, and a return
    that equals ``alpha`` exactly (a mid of 100.0000 followed by 100.0060, ``alpha``
    6e-05) came out of float64 as 6.000000000000227e-05 and was classed up. Equal mid
    prices made of other bid and ask prices (100.01 + 100.03 against 100.00 + 100.04)
    gave returns of +-1e-16 rather than 0.

    Parameters
    ----------
    values
        ``(n, H)`` unscaled float64 label values, one column per horizon.
    scaled
        ``values * spec.scale``.
    boundaries
        Class boundaries on the scaled values (``thresholds``; ``-alpha, alpha``), or 0.
    spec
        The label: its horizons bound the rounding of their means.

    Returns
    -------
    numpy.ndarray
        A copy of ``scaled`` where any value was moved, else ``scaled`` itself.
    """
    ks = np.asarray(spec.horizon_list, dtype=np.float64)  # one per column of ``values``
    room = abs(spec.scale) * (TIE_ROUNDING + ks) * 2.0**-52 * (1.0 + np.abs(values))
    out = scaled
    with np.errstate(invalid="ignore"):
        for b in boundaries:
            near = (np.abs(scaled - b) <= room) & (scaled != b)
            if near.any():
                out = out.copy() if out is scaled else out
                out[near] = b
    return out


def mapped(values: np.ndarray, spec: LabelSpec) -> np.ndarray:
    """``values`` (float64) with each replaced by its image under ``spec.map``;
    NaN stays NaN.

    Raises
    ------
    FeatureError
        Naming the first value the map does not name, and the map.
    """
    keys = np.array([k for k, _ in spec.map])
    images = np.array([v for _, v in spec.map])
    at = np.clip(np.searchsorted(keys, values), 0, keys.size - 1)
    known = keys[at] == values
    unknown = ~known & ~np.isnan(values)
    if unknown.any():
        row, col = np.argwhere(unknown.reshape(unknown.shape[0], -1))[0]
        name = spec.label_columns[col] if col < len(spec.label_columns) else spec.column
        raise FeatureError(f"labels.map: column {name!r} holds {values.reshape(unknown.shape[0], -1)[row, col]:g}, "
                           f"which the map does not name (it maps {', '.join(f'{k:g}' for k in keys)})")
    return np.where(known, images[at], values)


def class_balance(y: np.ndarray, spec: LabelSpec) -> list:
    """Number of labels of each class, for a store's metadata.

    Parameters
    ----------
    y
        Finalized labels (:func:`finalize_labels`).
    spec
        The label.

    Returns
    -------
    list
        ``[count of class 0, class 1, ...]`` as ints (classes named by
        ``spec.class_names``); with ``spec.multi`` one such list per horizon, in
        horizon order; zeros for no labels (a split still empty). ``[]`` for labels that
        are not classes.

    Raises
    ------
    FeatureError
        When ``y`` does not hold one label per horizon (``spec.multi``).
    """
    names = spec.class_names
    if names is None:
        return []
    y = np.asarray(y)
    if spec.multi and (y.ndim == 0 or y.size != y.shape[0] * spec.width):
        raise FeatureError(f"labels: expected class labels of shape (n, {spec.width}) for "
                           f"{spec.width} horizons, got {y.shape}")
    # The width from the spec, not inferred (-1): an empty split's labels, (0, H), cannot
    # tell numpy how many horizons they have.
    per_column = y.reshape(y.shape[0], spec.width) if spec.multi else y.reshape(-1, 1)
    counts = [np.bincount(per_column[:, j], minlength=len(names)).tolist() for j in range(per_column.shape[1])]
    return counts if spec.multi else counts[0]
