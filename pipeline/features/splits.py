"""Splits and walk-forward folds: which windows go where, with no time step shared.

Every window reaches from ``e - back`` (its oldest step's feature history, or its
label's history) to ``e + fwd`` (its label's last step). A split is an interval of time
``[lo, hi)``; a window belongs to it when its whole reach lies inside. A window that
straddles a cut belongs to no split: that is the leakage gap. Where a cut falls on a
session boundary no window straddles it (windows never span sessions), so date splits
on daily sessions lose nothing.

"Time" is the timestamp where there is one and the row number otherwise (one
instrument's rows are in time order). Pure arithmetic: no dask, no I/O.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any, Literal, Mapping

import numpy as np

from pipeline.errors import ConfigError, WindowError
from pipeline.features.sessions import UTC_NAMES

__all__ = [
    "FoldSpec",
    "NormalizeSpec",
    "as_splits",
    "assign_splits",
    "fold_sessions",
    "fraction_cuts",
    "calendar_splits",
    "localize_splits",
    "parse_splits",
    "to_ns",
]


def to_ns(value: Any, path: str) -> int:
    """A date or datetime (``2026-01-08``, ``2026-01-08T12:00``) as int64 ns since the epoch."""
    if isinstance(value, np.datetime64) and not np.isnat(value):
        return int(value.astype("datetime64[ns]").astype(np.int64))
    if isinstance(value, _dt.datetime):
        value = value.replace(tzinfo=None).isoformat()
    elif isinstance(value, _dt.date):
        value = value.isoformat()
    if not isinstance(value, str):
        raise ConfigError(path, "a date such as '2026-01-08' or a datetime '2026-01-08T12:00'", value)
    try:
        return int(np.datetime64(value.strip().replace(" ", "T"), "ns").astype(np.int64))
    except ValueError:
        raise ConfigError(path, "a date such as '2026-01-08' or a datetime '2026-01-08T12:00'", value) from None


def parse_splits(value: Any, path: str) -> dict[str, Any]:
    """``{train: 0.8, val: 0.2}`` (fractions by time) or ``{train: {until: "2026-01-08"},
    test: {}}`` (dates; ``until`` exclusive; the last split may omit it and take the rest).

    Returns the mapping with fractions as floats, or date bounds as ``{"until": ns}``
    (``None`` for an open end).
    """
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(path, "a mapping of split name to fraction or to {until: date}", value)
    for name in value:
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"{path}.{name}", "a split name made of letters, digits and _", name)
    dated = [isinstance(v, Mapping) or v is None for v in value.values()]
    if any(dated) and not all(dated):
        raise ConfigError(path, "fractions for every split, or {until: date} for every split", dict(value))
    if not all(dated):
        out: dict[str, Any] = {}
        for name, frac in value.items():
            if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
                raise ConfigError(f"{path}.{name}", "a fraction in (0, 1]", frac)
            out[name] = float(frac)
        total = sum(out.values())
        if total > 1.0 + 1e-9:
            raise ConfigError(path, "fractions that sum to at most 1", f"a sum of {total:g}")
        return out
    out = {}
    names = list(value)
    previous = None
    for i, name in enumerate(names):
        bound = value[name] or {}
        unknown = [k for k in bound if k != "until"]
        if unknown:
            raise ConfigError(f"{path}.{name}.{unknown[0]}", "", detail="unknown key (expected: until)")
        if "until" not in bound or bound["until"] is None:
            if i != len(names) - 1:
                raise ConfigError(f"{path}.{name}.until", "", detail="missing: every split but the last needs until")
            out[name] = {"until": None}
            continue
        ns = to_ns(bound["until"], f"{path}.{name}.until")
        if previous is not None and ns <= previous:
            raise ConfigError(f"{path}.{name}.until", "a date after the previous split's", bound["until"])
        previous = ns
        out[name] = {"until": ns}
    return out


def as_splits(value: Any, path: str = "splits") -> dict[str, Any]:
    """Splits given in any form :func:`parse_splits` reads (fractions; ``until`` as
    text, a ``datetime.date`` or ``datetime``, a pandas ``Timestamp`` or a numpy
    ``datetime64``; ``{}``, ``{until: None}`` or ``None`` for the last split's open end),
    or as it returns them (``until`` in int ns, as a run passes them on), parsed and
    checked as a config's are.

    An int ``until`` is taken as ns since the epoch here only, where the parsed form
    arrives: in a config file a number is refused, never read as a date.

    Raises
    ------
    ConfigError
        Naming the split (``splits.train.until``), what was expected and what arrived.
    """
    if isinstance(value, Mapping):
        value = {name: ({**bound, "until": np.datetime64(int(bound["until"]), "ns")}
                        if isinstance(bound, Mapping) and _is_ns(bound.get("until")) else bound)
                 for name, bound in value.items()}
    return parse_splits(value, path)


def _is_ns(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def localize_splits(splits: Mapping[str, Any], tz: str | None) -> dict[str, Any]:
    """Date splits with each ``until`` taken in time zone ``tz``: the instant (UTC ns)
    its wall-clock time has there.

    :func:`parse_splits` reads ``until: "2026-01-09"`` as a wall-clock time, since the
    zone of the data is not known from the config. For time-zone-aware timestamps
    (instants) the date is the one of the zone the files store, as the sessions' dates
    are (:func:`~pipeline.features.sessions.calendar_days`): Sydney's 2026-01-09 starts
    at 13:00 UTC on the 8th. ``tz`` ``None`` (naive timestamps, compared with the
    wall-clock value as it is) or ``"UTC"`` returns the splits unchanged; fraction
    splits are returned unchanged. A midnight that a DST change skips is taken as the
    first instant after it; one that occurs twice, as the first.
    """
    if tz is None or tz in UTC_NAMES or not is_dated(splits):
        return dict(splits)
    import pyarrow as pa
    import pyarrow.compute as pc

    out: dict[str, Any] = {}
    for name, bound in splits.items():
        until = bound.get("until")
        if until is not None:
            wall = pa.array(np.array([until], dtype=np.int64), pa.timestamp("ns"))
            instant = pc.assume_timezone(wall, timezone=tz, ambiguous="earliest", nonexistent="latest")
            until = int(instant.cast(pa.int64()).to_numpy()[0])
        out[name] = {**bound, "until": until}
    return out


def calendar_splits(splits: Mapping[str, Any], calendar: str, *, aware: bool) -> dict[str, Any]:
    """Date splits cut at trading dates of an exchange calendar: each ``until`` (its
    date; a time of day in it is not used) becomes the open of the calendar's first
    session on or after that date, so that a futures session opening the evening before
    its date, or any session, falls whole in one split.

    Parameters
    ----------
    splits
        As :func:`parse_splits` returns them (``until``: wall-clock ns).
    calendar
        The exchange calendar's name (``source.sessions.calendar``).
    aware
        Whether the timestamps are instants (aware): the cut is then the open's
        instant; else the open's wall-clock time in the calendar's zone, as naive
        timestamps are read there.
    """
    from pipeline.features.calendars import calendar_opens, calendar_zone
    from pipeline.features.sessions import _DAY_NS

    out: dict[str, Any] = {}
    for name, bound in splits.items():
        until = bound.get("until") if isinstance(bound, Mapping) else None
        if until is not None:
            until = int(calendar_opens(calendar, np.array([int(until) // _DAY_NS]))[0])
            if not aware:
                import pandas as pd

                wall = pd.Timestamp(until, tz="UTC").tz_convert(calendar_zone(calendar)).tz_localize(None)
                until = int(wall.as_unit("ns").value)
        out[name] = {**bound, "until": until} if isinstance(bound, Mapping) else bound
    return out


def splits_value(splits: Mapping[str, Any]) -> dict[str, Any]:
    """The ``output.splits`` value that parses back to ``splits`` (dates as ISO text)."""
    def until(ns: int | None) -> dict[str, str]:
        return {} if ns is None else {"until": str(np.datetime64(int(ns), "ns"))}

    return {k: until(v["until"]) if isinstance(v, Mapping) else v for k, v in splits.items()}


def is_dated(splits: Mapping[str, Any]) -> bool:
    return any(isinstance(v, Mapping) for v in splits.values())


@dataclass(frozen=True, slots=True)
class NormalizeSpec:
    """Feature normalization (``features.normalize``).

    ``global``: z-score with the statistics of the split named ``train`` (of the first
    split listed when none is so named, or of the first fold's training sessions);
    ``window``: per window and feature; ``none``; ``trailing``: each session z-scored
    with the statistics of the ``sessions`` sessions of its instrument before it (no
    look-ahead). The first ``sessions`` sessions of each instrument have no such
    history: they make no window and serve only as history for the ones after.
    """

    kind: Literal["global", "window", "none", "trailing"] = "global"
    sessions: int = 0
    #: ``global`` only: ``all`` fits one mean and std over every instrument's train rows;
    #: ``instrument`` (``{kind: global, per: instrument}``) fits each instrument's own
    #: on its train rows and scales each instrument's rows by them, for instruments
    #: whose levels differ (a 42,000 and a 2,300 price).
    per: Literal["all", "instrument"] = "all"

    def to_value(self) -> Any:
        """The ``features.normalize`` value that parses back to this spec."""
        if self.kind == "trailing":
            return {"kind": "trailing", "sessions": self.sessions}
        return {"kind": "global", "per": self.per} if self.per != "all" else self.kind

    @classmethod
    def from_value(cls, value: Any, path: str) -> "NormalizeSpec":
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value in ("global", "window", "none"):
            return cls(kind=value)
        if isinstance(value, Mapping) and value.get("kind") == "trailing":
            unknown = [k for k in value if k not in ("kind", "sessions")]
            if unknown:
                raise ConfigError(f"{path}.{unknown[0]}", "", detail="unknown key (expected: kind, sessions)")
            n = value.get("sessions")
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ConfigError(f"{path}.sessions", "a positive integer", n)
            return cls(kind="trailing", sessions=n)
        if isinstance(value, Mapping) and value.get("kind") == "global":
            unknown = [k for k in value if k not in ("kind", "per")]
            if unknown:
                raise ConfigError(f"{path}.{unknown[0]}", "", detail="unknown key (expected: kind, per)")
            per = value.get("per", "all")
            if per not in ("all", "instrument"):
                raise ConfigError(f"{path}.per", "one of 'all', 'instrument'", per)
            return cls(kind="global", per=per)
        raise ConfigError(path, "global, window, none, {kind: global, per: instrument} or "
                                "{kind: trailing, sessions: N}", value)


@dataclass(frozen=True, slots=True)
class FoldSpec:
    """Walk-forward folds over sessions (``output.folds``).

    Fold ``k`` tests on ``test_sessions`` sessions and trains on the sessions before
    them: all of them (``anchored``) or the last ``train_sessions`` (``rolling``,
    default ``min_train_sessions``). The first fold has ``min_train_sessions`` sessions
    to train on; folds step forward by ``test_sessions``.
    """

    kind: Literal["anchored", "rolling"] = "anchored"
    test_sessions: int = 1
    min_train_sessions: int = 1
    train_sessions: int | None = None

    def to_value(self) -> dict[str, Any]:
        """The ``output.folds`` value that parses back to this spec."""
        out = {"kind": self.kind, "test_sessions": self.test_sessions, "min_train_sessions": self.min_train_sessions}
        return out if self.train_sessions is None else {**out, "train_sessions": self.train_sessions}

    @classmethod
    def from_value(cls, value: Any, path: str) -> "FoldSpec | None":
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ConfigError(path, "a mapping {kind, test_sessions, min_train_sessions}", value)
        allowed = ("kind", "test_sessions", "min_train_sessions", "train_sessions")
        for key in value:
            if key not in allowed:
                raise ConfigError(f"{path}.{key}", "", detail=f"unknown key (expected one of: {', '.join(allowed)})")
        kind = value.get("kind", "anchored")
        if kind not in ("anchored", "rolling"):
            raise ConfigError(f"{path}.kind", "one of 'anchored', 'rolling'", kind)
        ints = {}
        for key, default in (("test_sessions", 1), ("min_train_sessions", 1), ("train_sessions", None)):
            v = value.get(key, default)
            if v is None:
                ints[key] = None
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ConfigError(f"{path}.{key}", "a positive integer", v)
            ints[key] = v
        return cls(kind=kind, **ints)


def fraction_cuts(keys_lo: np.ndarray, order: np.ndarray, fractions: Mapping[str, float], gap: int) -> list[int]:
    """Cut points between fraction splits, in the units of ``keys_lo``.

    Windows are counted in time order (``order`` sorts them by end time); split ``k``
    gets ``fractions[k]`` of them as :func:`~pipeline.features.geometry.split_ranges`
    counts them with ``gap`` windows between splits, and the cut before split ``k + 1``
    is the reach start of its first window. Returns one cut per boundary.
    """
    from pipeline.features.geometry import split_ranges

    ranges = list(split_ranges(int(order.size), fractions, gap).values())
    return [int(keys_lo[order[lo]]) for lo, _ in ranges[1:]]


def assign_splits(keys_lo: np.ndarray, keys_hi: np.ndarray, cuts: list[int | None],
                  names: list[str]) -> np.ndarray:
    """Split of each window (``-1``: none, it straddles a cut), given its reach
    ``[keys_lo, keys_hi]`` and the cuts between consecutive splits (``len(names) - 1``
    of them, increasing; a last ``until`` may follow, past which windows are left out).

    Split ``k`` holds the windows with ``cut[k-1] <= keys_lo`` and ``keys_hi < cut[k]``.
    """
    bounds = [None, *cuts]
    if len(bounds) == len(names):
        bounds.append(None)
    out = np.full(keys_lo.shape, -1, dtype=np.int32)
    for k in range(len(names)):
        lo, hi = bounds[k], bounds[k + 1]
        inside = np.ones(keys_lo.shape, dtype=bool)
        if lo is not None:
            inside &= keys_lo >= lo
        if hi is not None:
            inside &= keys_hi < hi
        out[inside & (out < 0)] = k
    return out


def fold_sessions(periods: int, spec: FoldSpec) -> list[tuple[np.ndarray, np.ndarray]]:
    """Train and test periods (session numbers in time order) of every fold.

    Raises
    ------
    WindowError
        When there are too few sessions for one fold.
    """
    out = []
    test_start = spec.min_train_sessions
    train_len = spec.train_sessions or spec.min_train_sessions
    while test_start + spec.test_sessions <= periods:
        test = np.arange(test_start, test_start + spec.test_sessions)
        lo = 0 if spec.kind == "anchored" else max(0, test_start - train_len)
        out.append((np.arange(lo, test_start), test))
        test_start += spec.test_sessions
    if not out:
        raise WindowError(
            f"folds: {periods} sessions are too few for one fold of {spec.min_train_sessions} train and "
            f"{spec.test_sessions} test sessions; use more data or smaller folds"
        )
    return out
