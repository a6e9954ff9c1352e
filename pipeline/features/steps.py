"""Per-step features of a ``(T, C)`` order-book table, computed blockwise with a halo.

Every feature at step ``t`` depends on steps ``t - lookback .. t`` only. Each block borrows
``lookback`` steps from its left neighbour (backward-only ``overlap``), computes in
float64 and drops the borrowed rows, so results are identical whatever the chunking.
Steps ``0 .. lookback-1`` of the whole series have incomplete history and hold NaN.

A source read with ``nan: fill`` holds its fill value where a price was empty (LOBSTER's
dummy prices, Databento's ``INT64_MAX``, a one-sided book). Given that value
(``empty``), the features made from the level-1 prices (:func:`top_price_features`)
are NaN at a row whose ``bid_price_1`` or ``ask_price_1`` holds it, as the labels leave
out a window that reads one (:mod:`pipeline.features.labels`): a mid price of half the
other side is no price. ``features.nan`` then decides. Raw columns (``book``,
``column``) and size features keep the filled values: a deep empty level is normal.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import dask.array as da
import numpy as np

from pipeline.errors import FeatureError
from pipeline.features.blockwise import map_with_halo
from pipeline.features.specs import FeatureSpec, LabelSpec

__all__ = ["TOP_PRICES", "FeatureFrame", "columns_read", "compute_features", "empty_prices_message",
           "empty_top_prices", "feature_lookback", "features_numpy", "missing_column", "top_price_features"]


@dataclass(frozen=True, slots=True)
class FeatureFrame:
    """Per-step features: ``array`` is ``(T, F)`` float32; rows before ``lookback`` are NaN."""

    array: da.Array
    names: tuple[str, ...]
    lookback: int


#: Source columns a missing-column error lists (a LOBSTER or crypto table has 150).
_COLUMNS_SHOWN = 20


def missing_column(reader: str, name: str, columns: Sequence[Any]) -> FeatureError:
    """The error for a source column that ``reader`` (a feature or the labels) needs and
    the source lacks: what needs it, the source's first columns, and the usual cause (a
    file that names the column otherwise)."""
    names = [str(c) for c in columns]
    shown = ", ".join(names[:_COLUMNS_SHOWN]) + (f", ... ({len(names)} columns)" if len(names) > _COLUMNS_SHOWN
                                                  else "")
    return FeatureError(
        f"{reader} reads column {name!r}, which is not in the source (columns: {shown}); if the files name it "
        f"otherwise, map it with source.rename: {{{name}: <the files' name>}}")


def _col(columns: Sequence[str], name: str, reader: str = "feature input") -> int:
    try:
        return list(columns).index(name)
    except ValueError:
        raise missing_column(reader, name, columns) from None


def _required_columns(spec: FeatureSpec) -> list[str]:
    if spec.name == "column":
        return [spec.column]
    if spec.name == "book":
        # The book's output columns are its source columns, under the same names.
        return list(spec.labels)
    if spec.name == "custom":
        return []
    if spec.name == "imbalance" or (spec.name.startswith("rolling_") and spec.of == "imbalance"):
        k = spec.levels if spec.name == "imbalance" else 1
        return [f"{side}_size_{i}" for side in ("bid", "ask") for i in range(1, k + 1)]
    return ["bid_price_1", "ask_price_1"]


#: The level-1 prices: a feature computed from them is NaN where one is empty.
TOP_PRICES = ("bid_price_1", "ask_price_1")
#: Features (or the input of a rolling one) computed from :data:`TOP_PRICES`.
_FROM_TOP_PRICES = ("mid_price", "spread", "log_return")


def top_price_features(specs: Sequence[FeatureSpec]) -> tuple[str, ...]:
    """Names (:attr:`~pipeline.features.specs.FeatureSpec.label`) of the features of
    ``specs`` computed from the level-1 prices, in order: ``mid_price``, ``spread``,
    ``log_return`` and the rolling features of these. ``book`` and ``column`` give raw
    values; ``imbalance`` reads sizes; a ``custom`` function's inputs are its own."""
    return tuple(spec.label for spec in specs
                 if (spec.of if spec.name.startswith("rolling_") else spec.name) in _FROM_TOP_PRICES)


def _is_empty(values: np.ndarray, empty: float) -> np.ndarray:
    """Where ``values`` hold ``empty``, compared in their own dtype (as the source wrote
    it; the labels compare the same way); NaN matches NaN."""
    target = np.asarray(empty, dtype=values.dtype)
    return np.isnan(values) if np.isnan(target) else values == target


def empty_top_prices(block: np.ndarray, columns: Sequence[str], empty: float) -> np.ndarray:
    """Which rows hold an empty level-1 price.

    Parameters
    ----------
    block
        ``(rows, C)`` steps of the raw table.
    columns
        Names of ``block``'s columns; they hold :data:`TOP_PRICES`.
    empty
        The value the source wrote where a price was empty (``source.fill_value`` under
        ``source.nan: fill``), compared in ``block``'s dtype.

    Returns
    -------
    numpy.ndarray
        ``(rows, 2)`` bool: ``bid_price_1``, ``ask_price_1`` empty.
    """
    return np.stack([_is_empty(np.asarray(block[:, _col(columns, name)]), empty) for name in TOP_PRICES], axis=1)


#: Windows reduced per numpy call in :func:`_rolling`: ``std`` makes temporaries of
#: ``rows x window`` values, a few MB here instead of ``steps x window`` (80 MB for a
#: block of 100k steps and a window of 100, faulted in again by every task; many times
#: slower for the same values, see benchmarks/README.md).
_ROLL_ROWS = 2048


def _rolling(values: np.ndarray, window: int, stat: str) -> np.ndarray:
    """Trailing mean or population std over ``window`` steps, current step included;
    NaN where the window is incomplete or holds a NaN."""
    out = np.full(values.shape, np.nan)
    if window > values.size:
        return out
    # A sliding view costs no copy. NaN propagates only to the windows that contain it
    # (a cumulative sum would carry one NaN to every later step, and a running variance
    # loses digits on prices far from their mean).
    view = np.lib.stride_tricks.sliding_window_view(values, window)
    dest = out[window - 1 :]
    for a in range(0, view.shape[0], _ROLL_ROWS):
        rows = view[a : a + _ROLL_ROWS]
        # A window holding NaN (an empty level-1 price under source.nan: fill) is NaN, as
        # documented; numpy's vector loops may flag it as invalid on the way.
        with np.errstate(invalid="ignore"):
            dest[a : a + _ROLL_ROWS] = rows.mean(axis=1) if stat == "mean" else rows.std(axis=1)
    return out


def _load_custom(function: str) -> Callable[..., np.ndarray]:
    module, _, attr = function.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise FeatureError(f"custom feature {function!r}: cannot import it ({exc})") from exc


#: Rows whose features are computed at once. Every feature reads at most its lookback
#: rows back, so a block's rows come out the same when computed in pieces that each
#: start ``lookback`` rows early; a whole block's float64 columns and temporaries were
#: about 25 times its output (120 MB per task for the demo's blocks of 131,072 rows).
_PIECE_ROWS = 16384


def features_numpy(
    block: np.ndarray, columns: Sequence[str], specs: Sequence[FeatureSpec], *, empty: float | None = None
) -> np.ndarray:
    """All features of one block, NaN where history is short.

    Parameters
    ----------
    block
        ``(t, C)`` rows of the raw table: float32, or float64 for prices float32 cannot
        hold (``source.dtype: float64``). Each column a feature reads is taken to
        float64 first, so the features of float64 rows are those of the exact prices; a
        ``custom`` feature gets the block as it is.
    columns
        Names of ``block``'s columns.
    specs
        The features, in output order.
    empty
        The value the source wrote where a price was empty (``source.fill_value``
        under ``source.nan: fill``), or ``None``: the features of
        :func:`top_price_features` are NaN at a row whose ``bid_price_1`` or
        ``ask_price_1`` holds it (compared in ``block``'s dtype), and wherever their
        lookback reads such a row (``log_return`` the row after, a rolling feature its
        window).

    Returns
    -------
    numpy.ndarray
        ``(t, sum(spec.width for spec in specs))`` float64: each feature's
        :attr:`~pipeline.features.specs.FeatureSpec.labels` columns, in order.
    """
    rows = block.shape[0]
    lookback = max((s.lookback_steps for s in specs), default=0)
    if rows <= _PIECE_ROWS + lookback:
        return _features_of_rows(block, columns, specs, empty)
    out = np.empty((rows, sum(spec.width for spec in specs)), dtype=np.float64)
    for a in range(0, rows, _PIECE_ROWS):
        lo = max(0, a - lookback)  # each piece with the history its first row reads
        out[a : a + _PIECE_ROWS] = _features_of_rows(block[lo : a + _PIECE_ROWS], columns, specs, empty)[a - lo :]
    return out


def _features_of_rows(block: np.ndarray, columns: Sequence[str], specs: Sequence[FeatureSpec],
                      empty: float | None = None) -> np.ndarray:
    """:func:`features_numpy` of rows computed at once."""
    rows = block.shape[0]
    cols = list(columns)
    converted: dict[int, np.ndarray] = {}

    def c(name: str) -> np.ndarray:
        # Only the columns the features read, each converted once: the whole block in
        # float64 was the largest allocation of a feature task (the demo's features read
        # 22 of its 40 columns). Elementwise arithmetic gives the same values either way.
        j = _col(cols, name)
        if j not in converted:
            converted[j] = np.asarray(block[:, j], dtype=np.float64)
        return converted[j]

    def price(name: str) -> np.ndarray:
        # A level-1 price as the price features read it: NaN where the source wrote its
        # fill value for an empty level (``c`` keeps it, for ``book`` and ``column``).
        if empty is None:
            return c(name)
        key = f"price:{name}"
        if key not in cache:
            gone = _is_empty(np.asarray(block[:, _col(cols, name)]), empty)
            cache[key] = np.where(gone, np.nan, c(name)) if gone.any() else c(name)
        return cache[key]

    cache: dict[str, np.ndarray] = {}

    def base(name: str, levels: int = 1) -> np.ndarray:
        key = f"{name}{levels}"
        if key in cache:
            return cache[key]
        if name == "mid_price":
            v = (price("bid_price_1") + price("ask_price_1")) / 2.0
        elif name == "spread":
            v = price("ask_price_1") - price("bid_price_1")
        elif name == "imbalance":
            bid = sum(c(f"bid_size_{i}") for i in range(1, levels + 1))
            ask = sum(c(f"ask_size_{i}") for i in range(1, levels + 1))
            with np.errstate(invalid="ignore", divide="ignore"):
                v = (bid - ask) / (bid + ask)
        elif name == "log_return":
            with np.errstate(invalid="ignore", divide="ignore"):
                lm = np.log(base("mid_price"))
            v = np.full_like(lm, np.nan)
            v[1:] = lm[1:] - lm[:-1]
        else:  # pragma: no cover - specs are validated
            raise FeatureError(f"unknown feature {name!r}")
        cache[key] = v
        return v

    out = np.empty((rows, sum(spec.width for spec in specs)), dtype=np.float64)
    j = 0
    for spec in specs:
        if spec.name == "book":
            for k, name in enumerate(spec.labels):
                out[:, j + k] = c(name)
            j += spec.width
            continue
        if spec.name in ("mid_price", "spread", "log_return"):
            out[:, j] = base(spec.name)
        elif spec.name == "imbalance":
            out[:, j] = base("imbalance", spec.levels)
        elif spec.name.startswith("rolling_"):
            out[:, j] = _rolling(base(spec.of), spec.window, spec.name.removeprefix("rolling_"))
        elif spec.name == "column":
            out[:, j] = c(spec.column)
        else:
            result = np.asarray(_load_custom(spec.function)(block, tuple(cols)), dtype=np.float64)
            if result.shape != (rows,):
                raise FeatureError(
                    f"custom feature {spec.function!r}: expected an array of shape ({rows},), "
                    f"got {result.shape}"
                )
            out[:, j] = result
            out[: spec.lookback, j] = np.nan
        j += 1
    # ``base`` calls itself, so it and its closure form a reference cycle, which only the
    # cyclic collector frees: emptied here, the columns and features it holds go now,
    # not at the next full collection (a block's worth of float64 columns per task).
    cache.clear()
    converted.clear()
    return out


def columns_read(specs: Sequence[FeatureSpec], label: LabelSpec | None = None) -> tuple[str, ...] | None:
    """The source columns ``specs`` (and ``label``) read, sorted; ``None`` when a
    custom feature is among them (its function is handed every column)."""
    if any(spec.name == "custom" for spec in specs):
        return None
    names = {name for spec in specs for name in _required_columns(spec)}
    if label is not None:
        names.update(label.required_columns)
    return tuple(sorted(names))


def feature_lookback(specs: Sequence[FeatureSpec]) -> int:
    """Rows of history the features need: the largest lookback of ``specs`` (0 for none)."""
    return max((s.lookback_steps for s in specs), default=0)


def compute_features(
    x: da.Array, *, columns: Sequence[str], specs: Sequence[FeatureSpec], dtype: str = "float32",
    post: Callable[[np.ndarray, int], np.ndarray] | None = None, cuts: Sequence[int] | None = None,
    empty: float | None = None,
) -> FeatureFrame:
    """Per-step features, blockwise with a halo equal to the largest lookback.

    Parameters
    ----------
    x
        ``(T, C)`` raw table, time along axis 0.
    columns
        Names of ``x``'s columns.
    specs
        The features, in output order.
    dtype
        Output dtype; features are computed in float64 either way.
    post
        ``post(block, start)`` finishes each block of features in the task that
        computes it (``start``: its first row); see
        :func:`~pipeline.features.blockwise.map_with_halo`.
    cuts
        Rows where the series is cut into sessions: no block reads history across one.
        Only for a ``post`` that NaNs each session's first ``lookback`` rows (a build's),
        the one place where the history before a cut is read.
    empty
        The value the source wrote where a price was empty (``source.nan: fill``), or
        ``None``: the features made from the level-1 prices are NaN where one holds it
        (:func:`features_numpy`).

    Returns
    -------
    FeatureFrame
        ``array`` has ``sum(spec.width)`` columns, named by the specs' concatenated
        :attr:`~pipeline.features.specs.FeatureSpec.labels`.

    Raises
    ------
    FeatureError
        Before anything is computed, when a source column a feature reads is missing or
        a custom feature's function cannot be imported.
    """
    specs = tuple(specs)
    if not specs:
        raise FeatureError("features: at least one feature is needed")
    for i, spec in enumerate(specs):
        for name in _required_columns(spec):
            _col(columns, name, f"feature {spec.name} (features.steps[{i}])")
        if spec.name == "custom":
            _load_custom(spec.function)  # fail before any computation, naming the hook
    lookback = feature_lookback(specs)
    cols = tuple(columns)
    arr = map_with_halo(x, lambda block: features_numpy(block, cols, specs, empty=empty), back=lookback, fwd=0,
                        width=sum(s.width for s in specs), dtype=dtype, token="features", post=post, cuts=cuts)
    return FeatureFrame(array=arr, names=tuple(name for s in specs for name in s.labels), lookback=lookback)


def empty_prices_message(counts: Sequence[int], names: Sequence[str], *, nan: str,
                         fill_value: float = 0.0) -> str | None:
    """The warning for rows whose level-1 price was empty, and the features they made NaN.

    Parameters
    ----------
    counts
        Rows with an empty ``bid_price_1``, with an empty ``ask_price_1``, and with
        either (:func:`empty_top_prices`, summed).
    names
        The features computed from the level-1 prices (:func:`top_price_features`).
    nan
        ``features.nan``, which decides what becomes of those NaN values.
    fill_value
        ``features.fill_value``, written in their place under ``nan="fill"``.

    Returns
    -------
    str or None
        ``None`` when no row holds one, or no feature reads them.
    """
    bid, ask, rows = (int(c) for c in counts)
    if not rows or not names:
        return None
    sides = [(name, n) for name, n in zip(TOP_PRICES, (bid, ask)) if n]
    # Each side's count only when both were empty somewhere, as the labels' warning does.
    which = sides[0][0] if len(sides) == 1 else " or ".join(f"{name} ({n:,})" for name, n in sides)
    fate = {"drop": "the windows holding them are left out, counted with the NaN windows",
            "fill": f"features.nan: fill writes {fill_value:g} in their place",
            "raise": "no stored window holds one"}[nan]
    held = "1 row holds" if rows == 1 else f"{rows:,} rows hold"
    return (f"features: {held} an empty {which} (source.nan: fill); {', '.join(names)} "
            f"{'is' if len(names) == 1 else 'are'} NaN there (and where "
            f"their lookback reads one) rather than computed from the fill value; {fate}")
