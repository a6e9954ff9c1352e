"""Exchange calendars (``source.sessions: {calendar: XNYS}``): which session of a
calendar holds each timestamp, from the calendar's own opens and closes (half days,
holidays, futures sessions that open the evening before), by ``exchange_calendars``
(the ``calendars`` extra), imported only when a calendar is asked for.

Pure arithmetic over a cached schedule: the loader's keep mask (rows outside every
session are left out), the sessions' trading dates, and where a date split cuts.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from pipeline.errors import ConfigError, LoaderError, MissingDependencyError
from pipeline.features.sessions import _DAY_NS

__all__ = ["OUTSIDE", "calendar_opens", "calendar_sessions", "calendar_zone", "check_calendar_name", "in_sessions"]


def _exchange_calendars() -> Any:
    """The exchange_calendars module, imported only when a calendar is asked for."""
    try:
        import exchange_calendars
    except ImportError:
        raise MissingDependencyError("source.sessions: {calendar: ...}", "exchange-calendars", "calendars") from None
    return exchange_calendars


def check_calendar_name(name: Any, path: str) -> str:
    """``name`` when exchange_calendars knows it (aliases such as ``NYSE`` included).

    Raises
    ------
    ConfigError
        Naming ``path`` and a few valid names.
    """
    xcals = _exchange_calendars()
    names = xcals.get_calendar_names(include_aliases=True)
    if not isinstance(name, str) or name not in names:
        shown = ", ".join(n for n in ("XNYS", "XNAS", "CMES", "us_futures", "XLON", "XTKS") if n in names)
        raise ConfigError(path, f"an exchange calendar name such as {shown} (exchange_calendars."
                          f"get_calendar_names() lists all {len(names)})", name)
    return name


@lru_cache(maxsize=16)
def _schedule(name: str, first_year: int, last_year: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """Opens and closes (UTC ns), session labels (days since 1970-01-01) of calendar
    ``name`` over whole years, and its zone. Cached: every block of a build asks again."""
    import warnings

    xcals = _exchange_calendars()
    with warnings.catch_warnings():
        # exchange_calendars' own use of pandas (Series.values of aware times) warns
        # under newer pandas; nothing the user can act on.
        warnings.simplefilter("ignore")
        return _built(xcals, name, first_year, last_year)


def _built(xcals: Any, name: str, first_year: int, last_year: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """:func:`_schedule`'s work."""
    import pandas as pd

    cls = type(xcals.get_calendar(name))
    # A calendar is built for a range; whole years (within its bounds) serve every block.
    lo, hi = pd.Timestamp(f"{first_year}-01-01"), pd.Timestamp(f"{last_year}-12-31")
    low, high = cls.bound_min(), cls.bound_max()
    lo = lo if low is None else max(lo, low.tz_localize(None))
    hi = hi if high is None else min(hi, high.tz_localize(None))
    cal = xcals.get_calendar(name, start=lo.strftime("%Y-%m-%d"), end=hi.strftime("%Y-%m-%d"))
    sched = cal.schedule
    opens = pd.DatetimeIndex(sched["open"]).as_unit("ns").asi8  # UTC instants
    closes = pd.DatetimeIndex(sched["close"]).as_unit("ns").asi8
    days = pd.DatetimeIndex(sched.index).as_unit("ns").asi8 // _DAY_NS
    return opens, closes, days, str(cal.tz)


#: The session of a row outside every session of a calendar.
OUTSIDE = np.iinfo(np.int64).min


def _years(ns: np.ndarray) -> tuple[int, int]:
    # A day's margin each way: a futures session opens the evening before its date,
    # and naive wall clocks are up to a day off their instants.
    lo, hi = np.array([ns.min() - _DAY_NS, ns.max() + _DAY_NS], dtype="datetime64[ns]").astype("datetime64[Y]")
    return int(lo.astype(np.int64)) + 1970, int(hi.astype(np.int64)) + 1970


def _labels_of(instants: np.ndarray, opens: np.ndarray, closes: np.ndarray, days: np.ndarray) -> np.ndarray:
    """The session label (day) of each instant with open <= t < close, else OUTSIDE."""
    k = np.searchsorted(opens, instants, side="right") - 1
    inside = (k >= 0) & (instants < closes[np.maximum(k, 0)])
    return np.where(inside, days[np.maximum(k, 0)], OUTSIDE)


def calendar_sessions(ns: np.ndarray, tz: str | None, name: str) -> np.ndarray:
    """The trading date (days since 1970-01-01) of the session of calendar ``name`` that
    holds each timestamp, or :data:`OUTSIDE` for one outside every session.

    Parameters
    ----------
    ns
        Timestamps, int64 nanoseconds: instants (UTC) when ``tz`` is given (the zone the
        column stores), wall-clock times in the calendar's own zone when ``None``.
    tz
        As for :func:`~pipeline.features.sessions.calendar_days`.
    name
        The calendar (``XNYS``, ``CMES``, ...).

    Raises
    ------
    LoaderError
        For a naive timestamp that a DST change makes ambiguous (a wall-clock hour that
        occurs twice) or nonexistent (skipped), when its two readings fall in different
        sessions or one of them in none: which one was meant cannot be told.
    """
    ns = np.asarray(ns, dtype=np.int64)
    if ns.size == 0:
        return np.zeros(0, np.int64)
    opens, closes, days, cal_tz = _schedule(name, *_years(ns))
    if tz is not None:
        return _labels_of(ns, opens, closes, days)
    import pandas as pd

    wall = pd.DatetimeIndex(ns.view("datetime64[ns]"))
    # Both readings of each wall clock: they differ only on a DST change, and the row
    # is placed when both fall in the same session, or both outside every session.
    early = wall.tz_localize(cal_tz, ambiguous=np.ones(ns.size, bool), nonexistent="shift_backward")
    late = wall.tz_localize(cal_tz, ambiguous=np.zeros(ns.size, bool), nonexistent="shift_forward")
    a = _labels_of(early.asi8, opens, closes, days)
    b = _labels_of(late.asi8, opens, closes, days)
    bad = np.flatnonzero(a != b)
    if bad.size:
        at = str(wall[bad[0]])
        raise LoaderError("source.timestamp", f"the naive timestamp {at} is a wall-clock time a DST change in "
                          f"{cal_tz} makes ambiguous or skips, and its readings fall in different sessions of "
                          f"calendar {name} ({bad.size} such row(s)); store time-zone-aware timestamps")
    return a


def in_sessions(ns: np.ndarray, name: str, tz: str | None) -> np.ndarray:
    """Whether each timestamp lies in a session of calendar ``name`` (a block's keep
    mask: rows outside every session are left out, as ``nan: drop`` leaves rows out)."""
    return calendar_sessions(ns, tz, name) != OUTSIDE


def calendar_zone(name: str) -> str:
    """The time zone of calendar ``name`` (where naive timestamps are read)."""
    import datetime as _dt

    year = _dt.date.today().year
    return _schedule(name, year, year)[3]


def calendar_opens(name: str, days: np.ndarray) -> np.ndarray:
    """The open (UTC ns) of the first session of calendar ``name`` on or after each day
    (days since 1970-01-01): where a date split on a trading date cuts."""
    days = np.asarray(days, dtype=np.int64)
    ns = days * _DAY_NS
    opens, _, labels, _ = _schedule(name, *_years(np.concatenate([ns, ns + 10 * _DAY_NS])))
    k = np.searchsorted(labels, days, side="left")
    if (k >= labels.size).any():
        raise ConfigError("output.splits", f"a date within calendar {name}'s sessions",
                          str(np.datetime64(int(days[k >= labels.size][0]), "D")))
    return opens[k]


def calendar_close(name: str, day: int) -> int | None:
    """The close (UTC ns) of calendar ``name``'s session of trading date ``day`` (days
    since 1970-01-01), or None when it has no session that day."""
    ns = np.array([int(day) * _DAY_NS], dtype=np.int64)
    _, closes, labels, _ = _schedule(name, *_years(ns))
    k = int(np.searchsorted(labels, day))
    return int(closes[k]) if k < labels.size and int(labels[k]) == int(day) else None
