"""Feature and label specifications: frozen dataclasses parsed from YAML values.

Validation raises :class:`pipeline.errors.ConfigError` with the key path, so a config
mistake is reported as ``features.steps.2.window: expected a positive integer, got 0``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping

import numpy as np

from pipeline.errors import ConfigError

__all__ = ["BOOK_FIELDS", "FEATURE_NAMES", "LABEL_KINDS", "FeatureSpec", "LabelSpec"]

#: Built-in per-step features and the parameters each accepts.
FEATURE_NAMES: dict[str, tuple[str, ...]] = {
    "mid_price": (),
    "spread": (),
    "book": ("levels",),
    "imbalance": ("levels",),
    "log_return": (),
    "rolling_mean": ("window", "of"),
    "rolling_std": ("window", "of"),
    "column": ("column",),
    "custom": ("function", "lookback"),
}
_ROLLABLE = ("mid_price", "spread", "imbalance", "log_return")
#: ``levels`` of a feature that does not give it: DeepLOB's 10 levels for ``book``.
_DEFAULT_LEVELS = {"book": 10}
#: Column order of the ``book`` feature within each level, as DeepLOB stacks them.
BOOK_FIELDS = ("ask_price", "ask_size", "bid_price", "bid_size")


def _positive_int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(path, "a positive integer", value)
    return value



def column_names(col: Any, path: str) -> str | tuple[str, ...]:
    """A ``column`` key: one column name, or a non-empty list of distinct names (kept as
    a tuple).

    Raises
    ------
    ConfigError
        Naming ``path``.
    """
    names = [col] if isinstance(col, str) else col if isinstance(col, (list, tuple)) else None
    if not names or not all(isinstance(c, str) and c for c in names):
        raise ConfigError(path, "a column name or a non-empty list of column names", col)
    if len(set(names)) != len(names):
        raise ConfigError(path, "distinct column names", col)
    return col if isinstance(col, str) else tuple(col)

@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """One per-step feature.

    Attributes
    ----------
    name
        One of :data:`FEATURE_NAMES`.
    levels
        Book levels summed by ``imbalance`` (top ``levels`` of each side), or given raw
        by ``book``: ``ask_price_i, ask_size_i, bid_price_i, bid_size_i`` for
        ``i = 1 .. levels`` (DeepLOB's order), ``4 * levels`` output columns. ``0``
        stands for the feature's default: 10 for ``book``, 1 otherwise.
    window
        Lookback of ``rolling_mean`` / ``rolling_std``, in steps, current step included.
    of
        Input of a rolling feature: ``mid_price``, ``spread``, ``imbalance`` (top level)
        or ``log_return`` (the default).
    column
        Raw column passed through by ``column``.
    function
        ``module:function`` of a ``custom`` feature, called on a numpy block
        ``(steps, columns)`` with the tuple of column names; it returns ``(steps,)``.
        Imported only when a config names it: configs are code-trusted.
    lookback
        Steps of history a ``custom`` feature needs before each output step.
    """

    name: str
    levels: int = 0
    window: int = 1
    of: str = "log_return"
    column: str = ""
    function: str = ""
    lookback: int = 0

    @classmethod
    def from_mapping(cls, value: object, path: str) -> "FeatureSpec":
        """Parse ``"mid_price"`` or ``{name: rolling_std, window: 20}``."""
        if isinstance(value, str):
            value = {"name": value}
        if not isinstance(value, Mapping):
            raise ConfigError(path, "a feature name or a mapping with a name", value)
        name = value.get("name")
        if not isinstance(name, str) or name not in FEATURE_NAMES:
            raise ConfigError(f"{path}.name", "one of " + ", ".join(FEATURE_NAMES), name)
        allowed = FEATURE_NAMES[name]
        for key in value:
            if key != "name" and key not in allowed:
                expected = ", ".join(allowed) if allowed else "no parameters"
                raise ConfigError(f"{path}.{key}", "", detail=f"unknown key for {name} (expected {expected})")
        kwargs: dict[str, Any] = {"name": name}
        if "levels" in value:
            kwargs["levels"] = _positive_int(value["levels"], f"{path}.levels")
        if name.startswith("rolling_"):
            if "window" not in value:
                raise ConfigError(f"{path}.window", "", detail="missing required key (a positive integer)")
            kwargs["window"] = _positive_int(value["window"], f"{path}.window")
            of = value.get("of", "log_return")
            if of not in _ROLLABLE:
                raise ConfigError(f"{path}.of", "one of " + ", ".join(_ROLLABLE), of)
            kwargs["of"] = of
        if name == "column":
            kwargs["column"] = column_names(value.get("column"), f"{path}.column")
        if name == "custom":
            fn = value.get("function")
            if not isinstance(fn, str) or fn.count(":") != 1 or not all(fn.split(":")):
                raise ConfigError(f"{path}.function", "'module:function'", fn)
            lb = value.get("lookback", 0)
            if isinstance(lb, bool) or not isinstance(lb, int) or lb < 0:
                raise ConfigError(f"{path}.lookback", "a non-negative integer", lb)
            kwargs["function"] = fn
            kwargs["lookback"] = lb
        return cls(**kwargs)

    def __post_init__(self) -> None:
        if self.levels == 0:
            # A frozen dataclass: the resolved default is set once, at construction, so
            # FeatureSpec("book") and the parsed ``{name: book}`` compare equal.
            object.__setattr__(self, "levels", _DEFAULT_LEVELS.get(self.name, 1))

    def to_value(self) -> Any:
        """The YAML value that parses back to this spec (``--print-config``)."""
        params = {k: getattr(self, k) for k in FEATURE_NAMES[self.name]}
        return {"name": self.name, **params} if params else self.name

    @property
    def label(self) -> str:
        """Name of this feature: its output column's name, or ``book_<levels>`` for the
        ``book`` feature, whose columns are :attr:`labels`."""
        if self.name == "book":
            return f"book_{self.levels}"
        if self.name == "imbalance":
            return f"imbalance_{self.levels}"
        if self.name.startswith("rolling_"):
            return f"{self.name}_{self.of}_{self.window}"
        if self.name == "column":
            return self.column
        if self.name == "custom":
            return self.function.rsplit(":", 1)[1]
        return self.name

    @property
    def labels(self) -> tuple[str, ...]:
        """Names of this feature's output columns, in output order (one for every feature
        but ``book``)."""
        if self.name == "book":
            return tuple(f"{field}_{i}" for i in range(1, self.levels + 1) for field in BOOK_FIELDS)
        return (self.label,)

    @property
    def width(self) -> int:
        """Number of output columns: ``len(self.labels)``."""
        return 4 * self.levels if self.name == "book" else 1

    @property
    def lookback_steps(self) -> int:
        """Steps of history needed before each output step (the halo)."""
        if self.name == "log_return":
            return 1
        if self.name.startswith("rolling_"):
            return self.window - 1 + (1 if self.of == "log_return" else 0)
        if self.name == "custom":
            return self.lookback
        return 0


#: Label kinds and the keys each accepts besides ``kind``.
LABEL_KINDS: dict[str, tuple[str, ...]] = {
    "return": ("horizon", "horizons", "scale"),
    "class": ("horizon", "horizons", "thresholds", "scale"),
    "smoothed": ("horizon", "horizons", "reference", "alpha", "scale"),
    "column": ("column", "dtype", "map"),
}
_LABEL_KEYS = ("kind",) + tuple(sorted({k for keys in LABEL_KINDS.values() for k in keys}))


def _map(value: Any, path: str) -> tuple[tuple[float, float], ...]:
    """``labels.map``: finite numbers to finite numbers, sorted by value (none: empty)."""
    if value is None:
        return ()
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(path, "a mapping of column values to stored values, such as {1: 2, 2: 1, 3: 0}", value)
    pairs = []
    for k, v in value.items():
        key = _number_from(k)  # a key may come as text (a JSON config, --set): "1"
        if key is None or not _number(v):
            raise ConfigError(f"{path}.{k}", "a number mapped to a number", v)
        pairs.append((key, float(v)))
    return tuple(sorted(pairs))


def _number_from(value: Any) -> float | None:
    """A finite number, or the text of one, as a float; else None."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    return float(value) if _number(value) else None


def _plain(v: float) -> float | int:
    """A number as JSON has it: ``2`` rather than ``2.0`` for a whole one."""
    return int(v) if float(v).is_integer() else v


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _bound(t: float) -> str:
    """A threshold as written in a config: ``2`` rather than ``2.0``."""
    text = repr(float(t))
    return text[:-2] if text.endswith(".0") else text


@dataclass(frozen=True, slots=True)
class LabelSpec:
    """What each window is labelled with; ``e`` is the window's last step.

    Kinds
    -----
    ``return``
        Future log return of the mid price ``p`` (``(bid_price_1 + ask_price_1) / 2``,
        in float64) over ``k`` steps: ``log(p[e+k]) - log(p[e])``, times ``scale``,
        float32. ``scale`` is applied before ``thresholds`` (``10000`` gives basis
        points, which keeps regression targets near unit scale; log returns over a few
        steps are around 1e-4).
    ``class``
        That scaled return binned by ascending ``thresholds`` ``t_0 < ... < t_m-1``:
        class 0 is ``< t_0``, class ``j`` is ``[t_j-1, t_j)``, class ``m`` is ``>= t_m-1``
        (``numpy.digitize``), int64.
    ``smoothed``
        The smoothed mid-price label of FI-2010 and DeepLOB. With ``m_plus`` the mean of
        the next ``k`` mid prices (steps ``e+1 .. e+k``): ``reference: current`` gives
        ``l = (m_plus - p[e]) / p[e]`` (FI-2010); ``reference: past_mean`` gives
        ``l = (m_plus - m_minus) / m_minus`` with ``m_minus`` the mean of the ``k`` mid
        prices up to and including the current one (steps ``e-k+1 .. e``). DeepLOB's
        printed formula for ``m_minus`` sums ``k+1`` terms (``i = 0 .. k``) and divides
        by ``k``; the common implementations average ``k`` terms, as done here. ``l`` is
        multiplied by ``scale`` (default 1). Without ``alpha`` the label is that value,
        float32; with ``alpha`` it is one of three classes, int64, in ascending order
        like ``class``: 0 = down (``l < -alpha``), 1 = stationary, 2 = up
        (``l > alpha``). ``alpha`` applies to the scaled value, as ``thresholds`` do.
        FI-2010 numbers the same classes 1 = up, 2 = stationary, 3 = down.
    ``column``
        The value of source column ``column`` at step ``e``, cast to ``dtype``
        (``float32`` or ``int64``; an int64 column should hold whole numbers). No
        horizon. ``map`` (``{1: 2, 2: 1, 3: 0}``: FI-2010's published 1 up, 2 stationary,
        3 down as this package's 0 down, 1 stationary, 2 up) replaces each value by its
        image first; a value it does not name is refused (NaN stays NaN). A list of
        columns (FI-2010's five horizons, ``[label_1, label_2, label_3, label_5,
        label_10]``) gives labels of shape ``(n, len(column))``, one per column in the
        order given, ``map`` applied to each.

    ``horizon`` (one ``k``, labels of shape ``(n,)``) or ``horizons`` (several, labels
    of shape ``(n, len(horizons))``, one column per horizon in the order given) set the
    horizons of the mid-price kinds. With ``horizons``, ``horizon`` is their largest;
    for ``column`` it is 0.
    """

    kind: Literal["return", "class", "smoothed", "column"] = "return"
    horizon: int = 1
    thresholds: tuple[float, ...] = ()
    scale: float = 1.0
    horizons: tuple[int, ...] = ()
    reference: Literal["current", "past_mean"] = "current"
    alpha: float | None = None
    # column: one source column (labels (n,)) or a tuple of them ((n, k)); map: its values
    # and what each is stored as, in ascending order of value (see docs/config_notes.yml).
    column: str | tuple[str, ...] = ""
    dtype: Literal["float32", "int64"] = "float32"
    map: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        # Normalized once at construction (frozen): a list of horizons becomes a hashable
        # tuple, and ``horizon`` always holds the furthest step a label looks ahead.
        horizons = tuple(int(k) for k in self.horizons)
        object.__setattr__(self, "horizons", horizons)
        object.__setattr__(self, "thresholds", tuple(float(t) for t in self.thresholds))
        if self.kind == "column":
            object.__setattr__(self, "horizon", 0)
            if not isinstance(self.column, str):  # a list of columns becomes a hashable tuple
                object.__setattr__(self, "column", tuple(self.column))
        elif horizons:
            object.__setattr__(self, "horizon", max(horizons))

    @classmethod
    def from_mapping(cls, value: object, path: str) -> "LabelSpec":
        """Parse the ``labels`` section.

        Examples: ``{kind: return, horizon: 20, scale: 10000}``, ``{kind: class,
        horizons: [10, 50], thresholds: [-2, 2], scale: 10000}``, ``{kind: smoothed,
        horizons: [10, 20, 50, 100], reference: past_mean, alpha: 0.002}``, ``{kind:
        column, column: label, dtype: int64}``.
        """
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(path, "a mapping", value)
        for key in value:
            if key not in _LABEL_KEYS:
                raise ConfigError(f"{path}.{key}", "",
                                  detail=f"unknown key (expected one of: {', '.join(_LABEL_KEYS)})")
        kind = value.get("kind", "return")
        if not isinstance(kind, str) or kind not in LABEL_KINDS:
            raise ConfigError(f"{path}.kind", "one of " + ", ".join(repr(k) for k in LABEL_KINDS), kind)
        allowed = LABEL_KINDS[kind]
        for key in value:
            if key != "kind" and key not in allowed:
                raise ConfigError(f"{path}.{key}", "",
                                  detail=f"not used by kind: {kind} (its keys: {', '.join(allowed)})")
        if kind == "column":
            col = value.get("column")
            if col is None:
                raise ConfigError(f"{path}.column", "", detail="missing required key for kind: column (a column name)")
            col = column_names(col, f"{path}.column")
            dtype = value.get("dtype", "float32")
            if dtype not in ("float32", "int64"):
                raise ConfigError(f"{path}.dtype", "one of 'float32', 'int64'", dtype)
            return cls(kind="column", column=col, dtype=dtype, map=_map(value.get("map"), f"{path}.map"))

        kwargs: dict[str, Any] = {"kind": kind}
        if "horizons" in value:
            raw = value["horizons"]
            # Checked first: an empty list beside a horizon is a list to fix, not a clash.
            if isinstance(raw, (str, bytes)) or not isinstance(raw, (list, tuple)) or not raw:
                raise ConfigError(f"{path}.horizons", "a non-empty list of positive integers", raw)
            if "horizon" in value:
                raise ConfigError(f"{path}.horizons", "",
                                  detail="give either horizon (one) or horizons (a list), not both")
            ks = tuple(_positive_int(k, f"{path}.horizons.{i}") for i, k in enumerate(raw))
            if len(set(ks)) != len(ks):
                raise ConfigError(f"{path}.horizons", "distinct positive integers", raw)
            kwargs["horizons"] = ks
        else:
            kwargs["horizon"] = _positive_int(value.get("horizon", 1), f"{path}.horizon")
        scale = value.get("scale", 1.0)
        if not _number(scale) or not scale > 0:
            raise ConfigError(f"{path}.scale", "a positive number", scale)
        kwargs["scale"] = float(scale)
        if kind == "class":
            if "thresholds" not in value:
                raise ConfigError(f"{path}.thresholds", "",
                                  detail="missing required key for kind: class (a list of numbers)")
            raw = value["thresholds"]
            if not isinstance(raw, (list, tuple)) or not all(_number(t) for t in raw):
                raise ConfigError(f"{path}.thresholds", "a list of numbers", raw)
            thresholds = tuple(float(t) for t in raw)
            if not thresholds:
                raise ConfigError(f"{path}.thresholds", "a non-empty list of numbers", raw)
            if list(thresholds) != sorted(set(thresholds)):
                raise ConfigError(f"{path}.thresholds", "strictly ascending numbers", raw)
            kwargs["thresholds"] = thresholds
        if kind == "smoothed":
            reference = value.get("reference", "current")
            if reference not in ("current", "past_mean"):
                raise ConfigError(f"{path}.reference", "one of 'current', 'past_mean'", reference)
            kwargs["reference"] = reference
            if "alpha" in value:
                alpha = value["alpha"]
                if not _number(alpha) or alpha < 0:
                    raise ConfigError(f"{path}.alpha", "a non-negative number", alpha)
                kwargs["alpha"] = float(alpha)
        return cls(**kwargs)

    @property
    def horizon_list(self) -> tuple[int, ...]:
        """The horizons ``k``, in output order; ``()`` for ``column``."""
        if self.kind == "column":
            return ()
        return self.horizons or (self.horizon,)

    @property
    def multi(self) -> bool:
        """Whether labels are 2-D, ``(n, width)``: ``horizons`` was given, or a list of
        columns."""
        if self.kind == "column":
            return not isinstance(self.column, str)
        return bool(self.horizons)

    @property
    def label_columns(self) -> tuple[str, ...]:
        """``column``'s source columns, in output order; ``()`` for the other kinds."""
        if self.kind != "column":
            return ()
        return (self.column,) if isinstance(self.column, str) else tuple(self.column)

    @property
    def width(self) -> int:
        """Label values per window: one per horizon, or per column of ``column``."""
        if self.kind == "column":
            return len(self.label_columns)
        return max(1, len(self.horizon_list))

    @property
    def reach(self) -> tuple[int, int]:
        """``(back, fwd)``: steps a label reads before and after the window's end step."""
        if self.kind == "column":
            return (0, 0)
        k = max(self.horizon_list)
        if self.kind == "smoothed" and self.reference == "past_mean":
            return (k - 1, k)
        return (0, k)

    @property
    def required_columns(self) -> tuple[str, ...]:
        """Source columns the label reads."""
        if self.kind == "column":
            return self.label_columns
        return ("bid_price_1", "ask_price_1")

    @property
    def class_names(self) -> tuple[str, ...] | None:
        """Names of the classes, by class number, for class-valued labels; else None."""
        if self.kind == "class":
            t = [_bound(v) for v in self.thresholds]
            if not t:  # only a directly built spec: from_mapping requires thresholds
                return ("all",)
            middle = [f"[{a}, {b})" for a, b in zip(t, t[1:])]
            return (f"< {t[0]}", *middle, f">= {t[-1]}")
        if self.kind == "smoothed" and self.alpha is not None:
            return ("down", "stationary", "up")
        return None

    @property
    def out_dtype(self) -> np.dtype:
        """dtype of the finalized labels."""
        if self.class_names is not None:
            return np.dtype(np.int64)
        if self.kind == "column":
            return np.dtype(self.dtype)
        return np.dtype(np.float32)

    def to_value(self) -> dict[str, Any]:
        """The ``labels`` section that parses back to this spec (``--print-config``)."""
        out = {k: v for k, v in self.describe().items() if v is not None and k != "classes"}
        if "horizons" in out:
            out.pop("horizon")
        if self.kind != "class":
            out.pop("thresholds", None)
        if "map" in out:  # the metadata's pairs, as the mapping the key takes
            out["map"] = {a: b for a, b in out["map"]}
        return out

    def describe(self) -> dict[str, Any]:
        """The label definition as plain JSON values, for a store's metadata."""
        if self.kind == "column":
            out = {"kind": "column", "column": self.column if isinstance(self.column, str) else list(self.column),
                   "dtype": self.dtype}
            if self.map:
                out["map"] = [[_plain(a), _plain(b)] for a, b in self.map]
            return out
        out: dict[str, Any] = {"kind": self.kind, "horizon": self.horizon}
        if self.multi:
            out["horizons"] = list(self.horizons)
        if self.kind in ("return", "class"):
            out["thresholds"] = list(self.thresholds)
        out["scale"] = self.scale
        if self.kind == "smoothed":
            out["reference"] = self.reference
            out["alpha"] = self.alpha
        if self.class_names is not None:
            out["classes"] = list(self.class_names)
        return out
