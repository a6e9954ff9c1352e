"""Feature and label specifications: frozen dataclasses parsed from YAML values.

Validation raises :class:`pipeline.errors.ConfigError` with the key path, so a config
mistake is reported as ``features.steps.2.window: expected a positive integer, got 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Mapping

from pipeline.errors import ConfigError

__all__ = ["FEATURE_NAMES", "FeatureSpec", "LabelSpec"]

#: Built-in per-step features and the parameters each accepts.
FEATURE_NAMES: dict[str, tuple[str, ...]] = {
    "mid_price": (),
    "spread": (),
    "imbalance": ("levels",),
    "log_return": (),
    "rolling_mean": ("window", "of"),
    "rolling_std": ("window", "of"),
    "column": ("column",),
    "custom": ("function", "lookback"),
}
_ROLLABLE = ("mid_price", "spread", "imbalance", "log_return")


def _positive_int(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(path, "a positive integer", value)
    return value


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """One per-step feature.

    Attributes
    ----------
    name
        One of :data:`FEATURE_NAMES`.
    levels
        Book levels summed by ``imbalance`` (top ``levels`` of each side).
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
    levels: int = 1
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
        if name not in FEATURE_NAMES:
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
            col = value.get("column")
            if not isinstance(col, str) or not col:
                raise ConfigError(f"{path}.column", "a column name", col)
            kwargs["column"] = col
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

    @property
    def label(self) -> str:
        """Column name of this feature in the output."""
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
    def lookback_steps(self) -> int:
        """Steps of history needed before each output step (the halo)."""
        if self.name == "log_return":
            return 1
        if self.name.startswith("rolling_"):
            return self.window - 1 + (1 if self.of == "log_return" else 0)
        if self.name == "custom":
            return self.lookback
        return 0


@dataclass(frozen=True, slots=True)
class LabelSpec:
    """What each window is labelled with.

    ``kind: return`` is the future log return of the mid price over ``horizon`` steps
    after the window's end; ``kind: class`` bins that return by ``thresholds``
    (ascending), giving classes ``0 .. len(thresholds)``. ``scale`` multiplies the return
    before thresholds apply (``10000`` gives basis points, which keeps regression targets
    near unit scale; log returns over a few steps are around 1e-4).
    """

    kind: Literal["return", "class"] = "return"
    horizon: int = 1
    thresholds: tuple[float, ...] = ()
    scale: float = 1.0

    @classmethod
    def from_mapping(cls, value: object, path: str) -> "LabelSpec":
        """Parse the ``labels`` section."""
        if value is None:
            value = {}
        if not isinstance(value, Mapping):
            raise ConfigError(path, "a mapping", value)
        for key in value:
            if key not in ("kind", "horizon", "thresholds", "scale"):
                raise ConfigError(f"{path}.{key}", "", detail="unknown key (expected one of: horizon, kind, scale, thresholds)")
        kind = value.get("kind", "return")
        if kind not in ("return", "class"):
            raise ConfigError(f"{path}.kind", "one of 'return', 'class'", kind)
        horizon = _positive_int(value.get("horizon", 1), f"{path}.horizon")
        raw = value.get("thresholds", [])
        if not isinstance(raw, (list, tuple)) or any(
            isinstance(t, bool) or not isinstance(t, (int, float)) for t in raw
        ):
            raise ConfigError(f"{path}.thresholds", "a list of numbers", raw)
        thresholds = tuple(float(t) for t in raw)
        if list(thresholds) != sorted(set(thresholds)):
            raise ConfigError(f"{path}.thresholds", "strictly ascending numbers", raw)
        if kind == "class" and not thresholds:
            raise ConfigError(f"{path}.thresholds", "", detail="missing required key for kind: class (a list of numbers)")
        scale = value.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
            raise ConfigError(f"{path}.scale", "a positive number", scale)
        return cls(kind=kind, horizon=horizon, thresholds=thresholds, scale=float(scale))
