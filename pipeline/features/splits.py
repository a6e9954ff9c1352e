"""Splits and walk-forward folds: which windows go where, with no time step shared.

Every window reaches from ``e - back`` (its oldest step's feature history, or its
label's history) to ``e + fwd`` (its label's last step). A split is a set of time
spans: fractions and ``until`` dates cut time into consecutive intervals ``[lo, hi)``,
``from`` leaves a warm-up out, a list of dates (or a file assigning dates to splits, as
published splits come) gives each of its days. A window belongs to a split when its
whole reach lies in one of its spans. A window that straddles a cut belongs to no
split: that is the leakage gap. Where a cut falls on a session boundary no window
straddles it (windows never span sessions), so date splits on daily sessions lose
nothing. An embargo leaves out, on top, a split's windows that end within a duration
of the next split's first step.

"Time" is the timestamp where there is one and the row number otherwise (one
instrument's rows are in time order). Pure arithmetic, but for the split file
:func:`read_split_file` reads: no dask.
"""

from __future__ import annotations

import datetime as _dt
import warnings
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from pipeline.errors import ConfigError, WindowError
from pipeline.features.sessions import UTC_NAMES

_DAY_NS = 86_400 * 10**9
#: The keys of a dated split.
_BOUND_KEYS = ("from", "until", "dates", "embargo")

__all__ = [
    "FoldSpec",
    "NormalizeSpec",
    "ORDER_WARNING",
    "as_splits",
    "assign_splits",
    "calendar_splits",
    "duration_text",
    "embargo_mask",
    "embargoes",
    "fold_sessions",
    "fraction_cuts",
    "fraction_order_problem",
    "has_dates",
    "lacking_dates",
    "localize_splits",
    "outside_splits",
    "parse_splits",
    "place_windows",
    "read_split_file",
    "split_spans",
    "splits_value",
    "to_ns",
    "warn_fraction_order",
]


def to_ns(value: Any, path: str) -> int:
    """A date or datetime (``2026-01-08``, ``20260108``, ``2026-01-08T12:00``) as int64 ns since the epoch."""
    if isinstance(value, np.datetime64) and not np.isnat(value):
        return int(value.astype("datetime64[ns]").astype(np.int64))
    if isinstance(value, _dt.datetime):
        value = value.replace(tzinfo=None).isoformat()
    elif isinstance(value, _dt.date):
        value = value.isoformat()
    if not isinstance(value, str):
        raise ConfigError(path, "a date such as '2026-01-08' or a datetime '2026-01-08T12:00'", value)
    text = value.strip()
    if len(text) == 8 and text.isascii() and text.isdigit():
        # YYYYMMDD, as source.date takes it: numpy would read the 8 digits as a year
        # (20260108 overflows to a time in 1873). Only a date of the calendar is one.
        try:
            text = _dt.date(int(text[:4]), int(text[4:6]), int(text[6:])).isoformat()
        except ValueError:
            raise ConfigError(path, "a date such as '2026-01-08' or a datetime '2026-01-08T12:00'", value) from None
    try:
        return int(np.datetime64(text.replace(" ", "T"), "ns").astype(np.int64))
    except ValueError:
        raise ConfigError(path, "a date such as '2026-01-08' or a datetime '2026-01-08T12:00'", value) from None


def parse_splits(value: Any, path: str) -> dict[str, Any]:
    """Splits from their config value, checked.

    Fractions by time, in time order as listed (``{train: 0.8, val: 0.2}``: train the
    earliest 80% of the windows), or dated splits: each an interval
    (``{from: "2026-01-10", until: "2026-02-01"}``; ``from`` inclusive, default the
    previous interval split's ``until``; ``until`` exclusive, which only the last
    interval split may omit to take the rest), or a list of dates (``{dates:
    ["2026-01-05", "2026-01-12"]}``: every window whose reach lies in those days), or
    ``{file: splits.csv}``, a CSV file of ``date,split`` rows (:func:`read_split_file`).
    A dated split may add ``embargo: 1h``: its windows whose reach ends less than that
    before the next split's first step are left out (:func:`embargo_mask`); ``embargo:
    1h`` beside the splits (``{train: {until: ...}, test: {}, embargo: 1h}``, or ``{file:
    ..., embargo: 1h}``) gives every split that has none of its own the same.

    Returns
    -------
    dict
        Fractions as floats; or per split ``{"until": ns or None}`` (an interval split,
        with ``"from": ns`` when given) or ``{"dates": [[day, lo, hi], ...]}`` (each
        date's midnight and its span ``[lo, hi)``, all wall-clock ns), with
        ``"embargo": ns`` when given.

    Raises
    ------
    ConfigError
        Naming the key (``splits.val.dates[1]``, or the file and its row) and what was
        expected: a malformed value, bounds out of order, a date in two splits or
        inside an interval split, an embargo on fraction splits (``{path}.embargo``
        beside them, or fractions mixed with dated splits: both list the dated forms).

    Warns
    -----
    UserWarning
        Fractions are placed in time order as listed: when that order looks unintended
        (``train`` not first, or names sorted alphabetically out of their usual order:
        :func:`fraction_order_problem`), naming the order used and how to keep it.
    """
    if _is_file_form(value):
        value = read_split_file(value, path)
    if not isinstance(value, Mapping) or not value:
        raise ConfigError(path, "a mapping of split name to fraction, to {until: date}, to {dates: [...]}, "
                                "or {file: splits.csv}", value)
    value, embargo = _top_embargo(value, path)
    for name in value:
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"{path}.{name}", "a split name made of letters, digits and _", name)
    dated = [isinstance(v, Mapping) or v is None for v in value.values()]
    if any(dated) and not all(dated):
        raise ConfigError(path, f"fractions for every split, or dated splits for every split ({_DATED_FORMS}; "
                                f"an embargo needs dated splits)",
                          dict(value))
    if embargo is not None and not all(dated):
        raise ConfigError(f"{path}.embargo", "", detail=f"an embargo needs dated splits ({_DATED_FORMS}), "
                                                        "with embargo: 1h beside them or per split (train: {until: "
                                                        "date, embargo: 1h}): fractions have no time to measure it "
                                                        "in")
    if embargo is not None:
        # A split's own embargo wins: the top-level one is every other split's.
        value = {name: {"embargo": embargo, **(bound or {})} for name, bound in value.items()}
    if not all(dated):
        out: dict[str, Any] = {}
        for name, frac in value.items():
            if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 < frac <= 1:
                raise ConfigError(f"{path}.{name}", "a fraction in (0, 1]", frac)
            out[name] = float(frac)
        total = sum(out.values())
        if total > 1.0 + 1e-9:
            raise ConfigError(path, "fractions that sum to at most 1", f"a sum of {total:g}")
        warn_fraction_order(out)
        return _CheckedFractions(out)
    out = _parse_dated(value, path)
    _check_disjoint(out, path)
    return out


#: How the order warning begins: colon-free and the same for every key path, so that
#: ``PYTHONWARNINGS="ignore:fraction splits in time order as listed"`` (a prefix of the
#: message, where ``:`` separates fields) silences it for a deliberate order.
ORDER_WARNING = "fraction splits in time order as listed"
#: Conventional names in their usual time order (fit, then select, then evaluate).
_USUAL_RANK = {"train": 0, "training": 0, "val": 1, "valid": 1, "validation": 1, "dev": 1, "test": 2,
               "holdout": 2, "eval": 2}


def fraction_order_problem(names: Sequence[str]) -> str:
    """Why the time order of fraction splits listed as ``names`` looks unintended, or
    ``""``.

    Fractions are placed in time order as listed, so the order of a mapping is a
    decision: a YAML file written by ``yaml.safe_dump`` (keys sorted by default) turns
    ``{train, val, test}`` into ``{test, train, val}``, and test becomes the earliest
    period. Two signs: ``train`` (the split ``global`` statistics are fitted on) is
    not the earliest, or the names are sorted alphabetically while the usual ones
    among them (train, then val/valid/validation/dev, then test/holdout/eval) are not
    in their usual order.
    """
    names = list(names)
    if len(names) < 2:
        return ""
    if "train" in names and names[0] != "train":
        return (f"statistics (features.normalize: global) are fitted on 'train', which then lies after "
                f"{', '.join(repr(n) for n in names[:names.index('train')])}")
    ranks = [_USUAL_RANK[n.lower()] for n in names if n.lower() in _USUAL_RANK]
    if names == sorted(names) and ranks != sorted(ranks):
        return "the names are in alphabetical order, not in the usual train, val, test order"
    return ""


def warn_fraction_order(fractions: Mapping[str, float]) -> None:
    """Warn when fraction splits are listed in an order that looks unintended
    (:func:`fraction_order_problem`), naming the order used and how to keep it.

    Warns
    -----
    UserWarning
        Starting with :data:`ORDER_WARNING`, so that a deliberate order can be kept
        without it.
    """
    problem = fraction_order_problem(list(fractions))
    if not problem:
        return
    names = list(fractions)
    shares = [f"{name} {fractions[name]:.0%}" for name in names]
    order = ", ".join([f"{shares[0]} (earliest)", *shares[1:-1], f"{shares[-1]} (latest)"])
    # One text whatever the key path: one PYTHONWARNINGS prefix silences the config's
    # warning and the Python API's alike.
    warnings.warn(f"{ORDER_WARNING} (output.splits): {order}; {problem}. List the splits in the time order "
                  f"you mean (yaml.safe_dump sorts keys: pass sort_keys=False); to keep this order, set "
                  f"PYTHONWARNINGS=\"ignore:{ORDER_WARNING}\"", UserWarning, stacklevel=1)


class _CheckedFractions(dict):
    """Fraction splits as :func:`parse_splits` returned them, their order warned about
    already: a run parses its config, then its build parses the same splits again
    (:func:`as_splits`), and a second warning would only repeat the first (Python's
    once-per-place filter is reset whenever a library restores its warning filters)."""


#: The dated forms, as the messages about them list them.
_DATED_FORMS = "{until: date}, {from: date, until: date}, {dates: [date, ...]}, or {file: splits.csv}"


def _top_embargo(value: Mapping[str, Any], path: str) -> tuple[Mapping[str, Any], str | None]:
    """The splits without a top-level ``embargo`` key, and that embargo checked, as
    ``"<n>ns"`` (None: none given).

    ``embargo`` beside the splits is a duration for every split, never a split's name.

    Raises
    ------
    ConfigError
        ``{path}.embargo`` not a duration; no split beside it.
    """
    if "embargo" not in value:
        return value, None
    ns = _parse_embargo(value["embargo"], f"{path}.embargo")
    rest = {k: v for k, v in value.items() if k != "embargo"}
    if not rest:
        raise ConfigError(path, "splits beside embargo, such as {train: {until: date}, test: {}, embargo: 1h}",
                          dict(value))
    return rest, f"{ns}ns"


def _parse_dated(value: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Each dated split's bounds, dates and embargo (:func:`parse_splits`)."""
    names = list(value)
    intervals = [n for n in names if "dates" not in (value[n] or {})]
    out: dict[str, Any] = {}
    previous = None  # the previous interval split's until: where the next one starts
    for name in names:
        bound, key = value[name] or {}, f"{path}.{name}"
        unknown = [k for k in bound if k not in _BOUND_KEYS]
        if unknown:
            raise ConfigError(f"{key}.{unknown[0]}", "", detail=f"unknown key (expected: {', '.join(_BOUND_KEYS)})")
        spec: dict[str, Any] = {}
        if "dates" in bound:
            both = [k for k in ("from", "until") if k in bound]
            if both:
                raise ConfigError(f"{key}.{both[0]}", "", detail="a split is given by dates or by from/until, "
                                                                 "not both")
            spec["dates"] = _parse_dates(bound["dates"], f"{key}.dates")
        else:
            if bound.get("until") is None and name != intervals[-1]:
                raise ConfigError(f"{key}.until", "", detail="missing: every interval split but the last needs "
                                                             "until")
            lo = None if bound.get("from") is None else to_ns(bound["from"], f"{key}.from")
            until = None if bound.get("until") is None else to_ns(bound["until"], f"{key}.until")
            if lo is not None and previous is not None and lo < previous:
                raise ConfigError(f"{key}.from", "a date on or after the previous split's until (splits share no "
                                                 "time)", bound["from"])
            if until is not None and lo is not None and until <= lo:
                raise ConfigError(f"{key}.until", "a date after this split's from", bound["until"])
            if until is not None and previous is not None and until <= previous:
                raise ConfigError(f"{key}.until", "a date after the previous split's", bound["until"])
            previous = until if until is not None else previous
            spec["until"] = until
            if lo is not None:
                spec["from"] = lo
        if bound.get("embargo") is not None:
            spec["embargo"] = _parse_embargo(bound["embargo"], f"{key}.embargo")
        out[name] = spec
    return out


def _parse_dates(value: Any, path: str) -> list[list[int]]:
    """``[2026-01-05, ...]`` as sorted ``[day, lo, hi]`` wall-clock ns (``lo = day``,
    ``hi`` the next midnight), or the triples :func:`as_splits` passes on as they are."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(path, "a list of dates such as ['2026-01-05', '2026-01-12']", value)
    out = []
    for i, d in enumerate(value):
        if isinstance(d, _Span):
            out.append([int(v) for v in d])
            continue
        # YAML reads 20260105 as an int: 8 digits are YYYYMMDD (to_ns checks it is a date);
        # any other number (a year, epoch seconds) stays a number, which to_ns refuses.
        ns = to_ns(str(d) if _is_ns(d) and 10**7 <= d < 10**8 else d, f"{path}[{i}]")
        if ns % _DAY_NS:
            raise ConfigError(f"{path}[{i}]", "a date without a time of day, such as '2026-01-05'", d)
        out.append([ns, ns, ns + _DAY_NS])
    out.sort()
    for a, b in zip(out, out[1:]):
        if a[0] == b[0]:
            raise ConfigError(path, "", detail=f"date {_day_text(a[0])} listed twice")
    return out


def _parse_embargo(value: Any, path: str) -> int:
    from pipeline.features.sessions import parse_duration

    return parse_duration(value, path)


def _check_disjoint(splits: Mapping[str, Any], path: str) -> None:
    """Refuse a date listed by two splits, or lying in an interval split's time: the
    two would share its windows. Compared in wall-clock time, as the config gives it."""
    spans = split_spans(splits, merge=False)
    owner = [(int(s[0]), int(s[1]), name) for name, sp in zip(splits, spans) for s in sp]
    owner.sort()
    for (lo_a, hi_a, a), (lo_b, hi_b, b) in zip(owner, owner[1:]):
        if lo_b < hi_a and a != b:
            clash = b if "dates" in splits[b] else a
            other = a if clash == b else b
            day = lo_b if clash == b else lo_a
            raise ConfigError(f"{path}.{clash}.dates", "", detail=f"date {_day_text(day)} is also in split "
                                                                  f"{other!r}'s time; a date belongs to one split")


def _is_file_form(value: Any) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("file"), str)


def read_split_file(value: Mapping[str, Any], path: str) -> dict[str, Any]:
    """``{file: splits.csv[, embargo: 1h]}`` as ``{split: {dates: [...]}}``, splits in
    the order of their first date.

    The file is CSV with a header holding ``date`` and ``split`` (other columns are
    ignored), one row per date: ``2026-01-05,train``; a relative path is taken from the
    working directory, as ``source.paths`` is.

    Raises
    ------
    ConfigError
        Naming the file and its row: no such file, no ``date`` or ``split`` column, a
        row whose date or split name is not one, a date given twice, no row.
    """
    import csv

    import fsspec

    key = f"{path}.file"
    unknown = [k for k in value if k not in ("file", "embargo")]
    if unknown:
        raise ConfigError(f"{path}.{unknown[0]}", "", detail="unknown key beside file (expected: file, embargo)")
    name = value["file"]
    try:
        # utf-8-sig: Excel's "CSV UTF-8" starts the file with a byte order mark, which
        # would otherwise stick to the header's first column ('\ufeffdate').
        with fsspec.open(name, "rt", newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(key, "", detail=f"cannot read split file {name!r}: {exc}") from None
    header = [c.strip().lower() for c in rows[0]] if rows else []
    if "date" not in header or "split" not in header:
        raise ConfigError(key, "", detail=f"{name}: expected a header row with columns date and split, got {header}")
    di, si = header.index("date"), header.index("split")
    dates: dict[str, list[Any]] = {}
    seen: dict[int, int] = {}
    for line, row in enumerate(rows[1:], start=2):
        if not any(c.strip() for c in row):
            continue
        where = f"{name} line {line}"
        if len(row) <= max(di, si):
            raise ConfigError(key, "", detail=f"{where}: expected a date and a split, got {row}")
        split, text = row[si].strip(), row[di].strip()
        if not split.isidentifier():
            raise ConfigError(key, "", detail=f"{where}: expected a split name made of letters, digits and _, "
                                              f"got {split!r}")
        ns = to_ns(text, f"{key} ({where}) date")
        if ns % _DAY_NS:
            raise ConfigError(key, "", detail=f"{where}: expected a date without a time of day, got {text!r}")
        if ns in seen:
            raise ConfigError(key, "", detail=f"{where}: date {text} is already assigned on line {seen[ns]}; a date "
                                              "belongs to one split")
        seen[ns] = line
        dates.setdefault(split, []).append(text)
    if not dates:
        raise ConfigError(key, "", detail=f"{name}: no date assigned (a header and no rows)")
    order = sorted(dates, key=lambda s: min(to_ns(d, key) for d in dates[s]))
    embargo = ({} if value.get("embargo") is None
               else {"embargo": f"{_parse_embargo(value['embargo'], f'{path}.embargo')}ns"})
    return {split: {"dates": dates[split], **embargo} for split in order}


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
    if isinstance(value, _CheckedFractions):
        return value
    if isinstance(value, Mapping) and not _is_file_form(value):
        value = {name: _unparsed(bound) for name, bound in value.items()}
    return parse_splits(value, path)


def _is_ns(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


class _Span(tuple):
    """A parsed date ``(day, lo, hi)`` in ns, as :func:`as_splits` hands it back to
    :func:`parse_splits` (a config's numbers are never read as dates)."""


def _unparsed(bound: Any) -> Any:
    """A split as :func:`parse_splits` returned it, in a form it reads again: ns
    bounds as ``datetime64``, dates as :class:`_Span`, the embargo as ``"<n>ns"``."""
    if not isinstance(bound, Mapping):
        return bound
    out = {k: (np.datetime64(int(v), "ns") if k in ("from", "until") and _is_ns(v) else v) for k, v in bound.items()}
    if isinstance(out.get("dates"), (list, tuple)):
        out["dates"] = [_Span(int(v) for v in d) if isinstance(d, (list, tuple)) and len(d) == 3
                        and all(_is_ns(v) for v in d) else d for d in out["dates"]]
    if _is_ns(out.get("embargo")):
        out["embargo"] = f"{int(out['embargo'])}ns"
    return out


def _day_text(ns: int) -> str:
    return str(np.datetime64(int(ns) // _DAY_NS, "D"))


def _map_times(splits: Mapping[str, Any], to_instant: Any) -> dict[str, Any]:
    """Dated splits with every bound (``from``, ``until``, each date's span) mapped by
    ``to_instant`` (an int64 array of wall-clock ns -> ns); a date keeps its day."""
    out: dict[str, Any] = {}
    for name, bound in splits.items():
        if not isinstance(bound, Mapping):
            out[name] = bound
            continue
        new = dict(bound)
        for key in ("from", "until"):
            if new.get(key) is not None:
                new[key] = int(to_instant(np.array([int(new[key])], dtype=np.int64))[0])
        if new.get("dates"):
            d = np.asarray(new["dates"], dtype=np.int64).reshape(-1, 3)
            lo, hi = to_instant(d[:, 1]), to_instant(d[:, 2])
            new["dates"] = [[int(a), int(b), int(c)] for a, b, c in zip(d[:, 0], lo, hi)]
        out[name] = new
    return out


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

    def to_instant(wall_ns: np.ndarray) -> np.ndarray:
        wall = pa.array(wall_ns.astype(np.int64), pa.timestamp("ns"))
        instant = pc.assume_timezone(wall, timezone=tz, ambiguous="earliest", nonexistent="latest")
        return instant.cast(pa.int64()).to_numpy(zero_copy_only=False)

    return _map_times(splits, to_instant)


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

    def to_open(wall_ns: np.ndarray) -> np.ndarray:
        opens = np.asarray(calendar_opens(calendar, np.floor_divide(wall_ns, _DAY_NS)), dtype=np.int64)
        if aware:
            return opens
        import pandas as pd

        wall = pd.DatetimeIndex(opens.astype("datetime64[ns]"), tz="UTC").tz_convert(calendar_zone(calendar))
        return wall.tz_localize(None).as_unit("ns").asi8

    return _map_times(splits, to_open)


def splits_value(splits: Mapping[str, Any]) -> dict[str, Any]:
    """The ``output.splits`` value that parses back to ``splits`` (dates as ISO text;
    a file's assignments as the date lists it gave)."""
    def one(bound: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in ("from", "until"):
            if bound.get(key) is not None:
                out[key] = str(np.datetime64(int(bound[key]), "ns"))
        if bound.get("dates"):
            out["dates"] = [_day_text(d[0]) for d in bound["dates"]]
        if bound.get("embargo"):
            out["embargo"] = duration_text(int(bound["embargo"]))
        return out

    return {k: one(v) if isinstance(v, Mapping) else v for k, v in splits.items()}


def duration_text(ns: int) -> str:
    """``3_600_000_000_000`` -> ``"1h"``: the largest unit that divides it, as a config
    spells a duration (``90min``; ``0ns``)."""
    for unit, size in (("d", 86_400 * 10**9), ("h", 3600 * 10**9), ("min", 60 * 10**9), ("s", 10**9),
                       ("ms", 10**6), ("us", 10**3)):
        if ns and ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns}ns"


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

    Windows are counted in time order (``order`` sorts them by end time; only their
    number is used here): split ``k`` gets ``fractions[k]`` of them as
    :func:`~pipeline.features.geometry.split_ranges` counts them with ``gap`` windows
    between splits. The cut before split ``k + 1`` is the ``b``-th smallest reach
    start, ``b`` the windows counted before split ``k + 1``: from that instant on start
    exactly the windows counted to split ``k + 1`` and the later ones (ties aside), so
    these hold their share, and split ``k`` gives up the windows whose reach holds the
    cut (``across``: about the gap's worth per instrument).

    The cut is a quantile of reach starts, not the reach start of the first window of
    split ``k + 1`` in end order: with several instruments that window may reach far
    back in time (a sparse day of an illiquid instrument), and a cut placed there
    moved every other instrument's windows of that whole period out of split ``k``.
    For one instrument the two are the same instant (its reach starts are in end
    order). Returns one cut per boundary, non-decreasing.
    """
    from pipeline.features.geometry import split_ranges

    ranges = list(split_ranges(int(order.size), fractions, gap).values())
    starts = np.sort(np.asarray(keys_lo), kind="stable")
    return [int(starts[lo]) for lo, _ in ranges[1:]]


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


_MIN, _MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def split_spans(splits: Mapping[str, Any], *, merge: bool = True) -> list[np.ndarray]:
    """The time of each dated split as sorted ``(m, 2)`` int64 spans ``[lo, hi)``, in
    the time its bounds are in (wall-clock as parsed; instants once localized).

    An interval split spans ``[from, until)``, ``from`` defaulting to the previous
    interval split's ``until``, open ends as the int64 extremes. A date-list split
    spans its dates, those touching merged (``merge``) so that a window over midnight
    between two of its dates is inside it; a date with no time (a calendar's holiday,
    once :func:`calendar_splits` has placed it) spans nothing.
    """
    out, previous = [], None
    for bound in splits.values():
        if "dates" in bound:
            s = np.asarray([d[1:] for d in bound["dates"]], dtype=np.int64).reshape(-1, 2)
            s = s[s[:, 0] < s[:, 1]]
            s = s[np.argsort(s[:, 0], kind="stable")]
            out.append(_merge(s) if merge else s)
            continue
        lo = bound.get("from", previous)
        hi = bound.get("until")
        out.append(np.array([[_MIN if lo is None else lo, _MAX if hi is None else hi]], dtype=np.int64))
        previous = hi if hi is not None else previous
    return out


def _merge(spans: np.ndarray) -> np.ndarray:
    keep: list[list[int]] = []
    for lo, hi in spans.tolist():
        if keep and lo <= keep[-1][1]:
            keep[-1][1] = max(keep[-1][1], hi)
        else:
            keep.append([lo, hi])
    return np.asarray(keep, dtype=np.int64).reshape(-1, 2)


def _inside(lo: np.ndarray, hi: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """Whether each reach ``[lo, hi]`` lies in one of ``spans`` (sorted, disjoint)."""
    if not len(spans):
        return np.zeros(lo.shape, dtype=bool)
    j = np.searchsorted(spans[:, 0], lo, side="right") - 1
    k = np.maximum(j, 0)
    return (j >= 0) & (lo < spans[k, 1]) & (hi < spans[k, 1])


def place_windows(keys_lo: np.ndarray, keys_hi: np.ndarray, spans: list[np.ndarray]) -> np.ndarray:
    """Split of each window (``-1``: none) whose reach ``[keys_lo, keys_hi]`` lies whole
    in one span of the split (:func:`split_spans`); a window over a cut, or outside
    every split's time (before a ``from``, on a date no split lists), is in none."""
    out = np.full(np.shape(keys_lo), -1, dtype=np.int32)
    for k, s in enumerate(spans):
        out[_inside(keys_lo, keys_hi, s) & (out < 0)] = k
    return out


def embargo_mask(keys_lo: np.ndarray, keys_hi: np.ndarray, where: np.ndarray,
                 embargo: Sequence[int]) -> np.ndarray:
    """Windows an embargo leaves out: those of split ``k`` whose reach ends less than
    ``embargo[k]`` before the next split's first step, that is before the earliest
    reach start (``keys_lo``) of a window of another split after the window's own
    start. Information that lingers past a window's last step (autocorrelated prices,
    overlapping labels) then cannot reach a window of the next split.
    """
    out = np.zeros(np.shape(keys_lo), dtype=bool)
    placed = where >= 0
    for k, gap in enumerate(embargo):
        mine = np.flatnonzero(where == k)
        if not gap or not mine.size:
            continue
        others = np.sort(keys_lo[placed & (where != k)])
        j = np.searchsorted(others, keys_lo[mine], side="right")
        has = j < others.size
        near = np.zeros(mine.size, dtype=bool)
        near[has] = others[j[has]] - keys_hi[mine[has]] < gap
        out[mine[near]] = True
    return out


def lacking_dates(keys_lo: np.ndarray, keys_hi: np.ndarray, where: np.ndarray,
                  splits: Mapping[str, Any]) -> list[tuple[str, int]]:
    """``(split, day)`` of every listed date that no window of its split (``where``)
    reaches into: the data has no session that day, or no window's reach fits in the
    split's days (a window longer than a day). Dates after every window's reach are
    not listed: days to come, for an append to fill."""
    if not np.size(keys_lo):
        return []
    last = int(np.max(keys_hi))
    out = []
    for k, (name, bound) in enumerate(splits.items()):
        mine = where == k
        order = np.argsort(keys_lo[mine], kind="stable")
        starts = keys_lo[mine][order]
        reach = np.maximum.accumulate(keys_hi[mine][order]) if order.size else order
        for day, lo, hi in bound.get("dates", ()):
            if lo > last:
                continue
            n = int(np.searchsorted(starts, hi, side="left"))  # windows starting before the date ends
            if n == 0 or reach[n - 1] < lo:
                out.append((name, int(day)))
    return out


def outside_splits(keys_lo: np.ndarray, spans: list[np.ndarray]) -> np.ndarray:
    """Windows that start outside every split's time (on a date no split lists,
    before a ``from``, after the last ``until``), as opposed to straddling a cut."""
    covered = np.zeros(np.shape(keys_lo), dtype=bool)
    for s in spans:
        covered |= _inside(keys_lo, keys_lo, s)
    return ~covered


def embargoes(splits: Mapping[str, Any]) -> list[int]:
    """Each split's embargo in ns (0: none)."""
    return [int(b.get("embargo") or 0) if isinstance(b, Mapping) else 0 for b in splits.values()]


def has_dates(splits: Mapping[str, Any]) -> bool:
    """Whether a split is given by dates (by a list, or by a file)."""
    return any(isinstance(b, Mapping) and "dates" in b for b in splits.values())


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
