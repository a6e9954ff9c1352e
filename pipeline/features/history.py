"""What a stored build fixes for an append, and how an append's figures join the stored ones.

An append computes only the new sessions: their windows, labels, placement and folds.
Everything else is the stored build's, read from the store's attributes, never from the
old raw files: the segment table (so new session numbers and row offsets continue it),
the normalization statistics (frozen at the first build; trailing normalization also
keeps every session's moments, so a new session is scaled by the sessions before it
without reading them), the sample counts, and the session of every sample of the first
split (walk-forward folds gain the new ones).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from pipeline.errors import MissingColumnError, WindowError
from pipeline.features.sessions import SegmentTable, SessionSpec, session_days
from pipeline.features.splits import duration_text

__all__ = ["Prior", "check_new_columns", "continue_folds", "continue_sessions", "merge_attrs", "prior_from_attrs",
           "stored_segments"]

#: Attributes an append adds its new figures to, key by key.
_SUMMED = ("window_counts", "nan_windows_dropped")


@dataclass(frozen=True, slots=True)
class Prior:
    """The stored build an append continues.

    Attributes
    ----------
    samples
        Stored samples per split, in split order.
    rows
        Stored source rows: the first new row's number (virtual windows' ends count
        from the first stored row).
    segments
        The stored segment table.
    stats
        The normalization statistics as stored (frozen).
    base_sessions
        Session number of each stored sample of the first split (folds only).
    attrs
        Every stored attribute.
    """

    samples: dict[str, int]
    rows: int
    segments: SegmentTable
    stats: dict[str, Any]
    base_sessions: np.ndarray | None = None
    attrs: dict[str, Any] = field(default_factory=dict)

    def moments(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per stored segment, the ``(count, mean, m2)`` of its usable rows (trailing
        normalization only)."""
        m = self.stats.get("moments")
        if not isinstance(m, Mapping):
            raise WindowError("append: the store's trailing normalization has no per-session moments (it was "
                              "written by an older version); rebuild it once with --rebuild")
        return [(np.asarray(c, float), np.asarray(a, float), np.asarray(b, float))
                for c, a, b in zip(m["count"], m["mean"], m["m2"])]


def stored_segments(attrs: Mapping[str, Any]) -> SegmentTable:
    """The segment table of a store's ``sessions`` attribute.

    Raises
    ------
    WindowError
        When the store records no session table (written before sessions were).
    """
    rows = attrs.get("sessions")
    if not isinstance(rows, list) or not rows:
        raise WindowError("append: the store records no session table; rebuild it once with --rebuild")
    names = tuple(attrs.get("instruments") or ("",))
    code = {n: i for i, n in enumerate(names)}
    starts = np.array([r["rows"][0] for r in rows], dtype=np.int64)
    stops = np.array([r["rows"][1] for r in rows], dtype=np.int64)
    return SegmentTable(starts, stops, np.array([code[r["instrument"]] for r in rows], dtype=np.int32),
                        np.array([r["session"] for r in rows], dtype=np.int32), names,
                        tuple(str(r.get("label", "")) for r in rows))


def prior_from_attrs(attrs: Mapping[str, Any], samples: Mapping[str, int],
                     base_sessions: np.ndarray | None = None) -> Prior:
    """The :class:`Prior` of a store, from its attributes and its version's counts."""
    segs = stored_segments(attrs)
    return Prior(samples=dict(samples), rows=segs.rows, segments=segs, stats=dict(attrs.get("normalization") or {}),
                 base_sessions=base_sessions, attrs=dict(attrs))


def _summed_left_out(old: Any, new: Any) -> dict[str, Any]:
    """``split_left_out`` of the stored build and of an append, added: ``outside``
    (windows outside every split's time), ``across`` (windows over a cut between splits)
    and ``embargo`` (per split)."""
    old, new = dict(old or {}), dict(new or {})
    out: dict[str, Any] = {}
    for key in ("outside", "across"):
        if key in old or key in new:
            out[key] = int(old.get(key, 0)) + int(new.get(key, 0))
    if "embargo" in old or "embargo" in new:
        a, b = dict(old.get("embargo") or {}), dict(new.get("embargo") or {})
        out["embargo"] = {k: int(a.get(k, 0)) + int(b.get(k, 0)) for k in dict.fromkeys([*a, *b])}
    return out


def merge_attrs(prior: Prior, new: Mapping[str, Any]) -> dict[str, Any]:
    """The attributes of the store after an append: the stored ones with the new
    sessions' rows, counts, statistics and folds joined in.

    ``new`` holds what the append computed (its session table counts rows from the
    first new row).
    """
    out = dict(prior.attrs)
    sessions = []
    for row in new.get("sessions") or []:
        row = dict(row)
        row["rows"] = [int(v) + prior.rows for v in row["rows"]]
        sessions.append(row)
    out["sessions"] = list(prior.attrs.get("sessions") or []) + sessions
    for key in _SUMMED:
        merged = dict(prior.attrs.get(key) or {})
        for k, v in dict(new.get(key) or {}).items():
            merged[k] = int(merged.get(k, 0)) + int(v)
        out[key] = merged
    left = _summed_left_out(prior.attrs.get("split_left_out"), new.get("split_left_out"))
    if left:
        out["split_left_out"] = left
    if "class_balance" in new:
        old = dict(prior.attrs.get("class_balance") or {})
        out["class_balance"] = {k: (np.asarray(old[k]) + np.asarray(v)).tolist() if k in old and len(old[k]) else v
                                for k, v in new["class_balance"].items()}
    steps = {k: list(v) for k, v in dict(prior.attrs.get("split_steps") or {}).items()}
    for k, (lo, hi) in dict(new.get("split_steps") or {}).items():
        lo, hi = int(lo) + prior.rows, int(hi) + prior.rows
        steps[k] = [steps[k][0], hi] if k in steps else [lo, hi]
    out["split_steps"] = steps
    stats = new.get("normalization") or {}
    if stats.get("kind") == "trailing":
        old = prior.stats
        joined = {k: list(old.get(k) or []) + list(stats.get(k) or []) for k in ("mean", "std")}
        moments = {k: list((old.get("moments") or {}).get(k) or []) + list(stats["moments"][k])
                   for k in ("count", "mean", "m2")}
        out["normalization"] = {**old, **joined, "moments": moments}
    if "folds" in new:
        out["folds"] = new["folds"]
    return out


def continue_folds(base_sessions: Sequence[int], spec: Any) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Every fold over a first split whose samples have the sessions ``base_sessions``
    (stored ones then new ones), as sample indices, and the folds' description.

    Folds only grow at the end as sessions are added (each fold is a fixed set of the
    sessions before its test sessions), so the stored folds come out the same."""
    from pipeline.features.splits import fold_sessions

    base_sessions = np.asarray(base_sessions, dtype=np.int64)
    periods = np.unique(base_sessions)
    index: dict[str, np.ndarray] = {}
    described = {}
    for i, (train_p, test_p) in enumerate(fold_sessions(int(periods.size), spec)):
        index[f"fold{i}/train"] = np.flatnonzero(np.isin(base_sessions, periods[train_p])).astype(np.int64)
        index[f"fold{i}/test"] = np.flatnonzero(np.isin(base_sessions, periods[test_p])).astype(np.int64)
        described[f"fold{i}"] = {"train": periods[train_p].tolist(), "test": periods[test_p].tolist()}
    info = {"kind": spec.kind, "test_sessions": spec.test_sessions, "min_train_sessions": spec.min_train_sessions,
            "train_sessions": spec.train_sessions, "count": len(described), "sessions": described}
    return index, info


def _stored_times(attrs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """First and last timestamp (ns) of every stored segment, or None without times."""
    rows = attrs.get("sessions") or []
    if not rows or any("start" not in r for r in rows):
        return None
    first = np.array([np.datetime64(r["start"], "ns").astype(np.int64) for r in rows], dtype=np.int64)
    last = np.array([np.datetime64(r["end"], "ns").astype(np.int64) for r in rows], dtype=np.int64)
    return first, last


def _periods(instrument: np.ndarray, days: np.ndarray, start: Mapping[tuple[int, int], int] | None = None
             ) -> np.ndarray:
    """``(day, rank that day)`` of each segment (in segment order), ranks counted per
    instrument after ``start`` (the stored segments' count per instrument and day)."""
    counts = dict(start or {})
    out = np.zeros((instrument.size, 2), dtype=np.int64)
    for k in range(instrument.size):
        key = (int(instrument[k]), int(days[k]))
        out[k] = key[1], counts.get(key, 0)
        counts[key] = counts.get(key, 0) + 1
    return out


def _segment_name(label: str, instrument: str, file: str | None = None) -> str:
    """A new segment as a user knows it: its file, or its label (a file or a date), with
    its instrument unless that is named already. A gap session's label (``#0``: its rank
    among the new data's sessions) means nothing to a user, who is told the instrument
    instead (and the file, when known); the caller adds when the segment starts."""
    name = file or ("the new data" if label.startswith("#") or not label else label)
    # A path of per-instrument folders or names (AAA/2026-01-05.parquet) names it already.
    if instrument and not re.search(rf"(?<![0-9A-Za-z]){re.escape(instrument)}(?![0-9A-Za-z])", name):
        name += f" of instrument {instrument!r}"
    return name


def _column_key_order(key: str) -> tuple[float, str]:
    """A ``{column: NAME}`` session's key (``time_id=16``) as a build orders it: by the
    column's value (``time_id=9`` comes before ``time_id=16``), not by its text."""
    name, _, value = str(key).rpartition("=")
    return float(value), name


def _cut_before_close(calendar: str, day: int, end: int) -> str:
    """What to say of a stored calendar session that a new file continues: files cut
    before the session's close (a futures session runs from the evening before, files
    often from midnight) store each session's first part alone, and every next file
    continues it."""
    from pipeline.features.calendars import calendar_close

    close = calendar_close(calendar, day)
    if close is None or end >= close:
        return ""
    return (f"; the stored files end before calendar {calendar} closes that session at "
            f"{np.datetime64(close, 'ns')} UTC, so it was stored in part: cut each file at a session's close to "
            "append file by file")


def continue_sessions(prior: Prior, instrument: np.ndarray, labels: Sequence[str], first_ns: np.ndarray | None,
                      mode: str, gap_ns: int = 0, keys: Sequence[str] | None = None, tz: str | None = None,
                      calendar: str | None = None, files: Sequence[str] | None = None) -> np.ndarray:
    """Session numbers for an append's new segments that continue the stored ones as a
    build of every file would number them.

    Parameters
    ----------
    prior
        The stored build.
    instrument, labels
        Per new segment (in segment order): the stored code of its instrument, and its
        label (file or date) for messages.
    first_ns
        Per new segment, its first timestamp (``None`` without timestamps: sessions are
        then ordered by ``keys``, the file names with the instrument left out, whose
        stored counterparts are ``prior``'s ``keys`` attribute).
    mode, gap_ns
        The session mode and, for ``gap``, the gap.
    tz
        The zone of the timestamps' calendar dates (the files' one zone; ``None`` for
        naive ones), as the build takes them (:func:`~pipeline.features.sessions.calendar_days`).
    calendar
        For ``mode="calendar"``: the exchange calendar, whose trading dates key the
        sessions (:func:`~pipeline.features.sessions.session_days`) as a build keys them.
    files
        Per new segment, the file its first row was read from, for messages (else a
        segment is named by its label, its instrument and when it starts).

    Raises
    ------
    WindowError
        Naming the segment (its file or label, its instrument and its first time): one
        that falls before or among the stored sessions, or that would continue a stored
        session (the same date, or within the gap).
    """
    stored = prior.segments
    names = [_segment_name(str(label), stored.instruments[int(code)], None if files is None else str(files[k]))
             for k, (code, label) in enumerate(zip(np.asarray(instrument).tolist(), labels))]
    top = int(stored.session.max())
    times = _stored_times(prior.attrs)
    if first_ns is None or times is None:
        old_keys = list(prior.attrs.get("session_keys") or [])
        if keys is None or len(old_keys) != len(stored):
            raise WindowError("append: new sessions cannot be placed after the stored ones without timestamps or "
                              "the stored session keys; set source.timestamp, or rebuild with --rebuild")
        order = _column_key_order if mode == "column" else str
        last = max(old_keys, key=order)
        for key, name in zip(keys, names):
            if order(key) == order(last):
                raise WindowError(f"append: {name} continues the last stored session ({last}); an append adds "
                                  "whole new sessions: new files must start after every stored one, or rebuild "
                                  "with --rebuild")
            if order(key) < order(last):
                raise WindowError(f"append: {name} falls before or among the stored sessions (the last stored is "
                                  f"{last}); new files must come after every stored one, or rebuild with --rebuild")
        ranked = sorted(set(keys), key=order)
        return top + 1 + np.array([ranked.index(k) for k in keys], dtype=np.int64)
    first, last = times
    spec = SessionSpec(mode="calendar", calendar=calendar) if mode == "calendar" else None
    stored_days, new_days = session_days(first, tz, spec), session_days(np.asarray(first_ns), tz, spec)
    seen: dict[tuple[int, int], int] = {}
    for code, day in zip(stored.instrument.tolist(), stored_days.tolist()):
        seen[(code, day)] = seen.get((code, day), 0) + 1
    old = _periods(stored.instrument, stored_days)
    new = _periods(np.asarray(instrument), new_days, seen)
    newest = max(map(tuple, old.tolist()))
    for k, name in enumerate(names):
        code = int(instrument[k])
        mine = np.flatnonzero(stored.instrument == code)
        if mine.size:
            end = int(last[mine].max())
            same_day = int(new_days[k]) == int(session_days(np.array([end]), tz, spec)[0])
            joins = (mode in ("date", "calendar") and same_day) or (
                mode == "gap" and int(first_ns[k]) - end <= gap_ns)
            if joins:
                after = int(first_ns[k]) - end
                why = ("on the same session date" if mode != "gap" else "it starts before that end" if after < 0
                       else f"{duration_text(after)} later, within source.sessions' gap of {duration_text(int(gap_ns))}")
                if mode == "calendar" and calendar is not None:
                    why += _cut_before_close(calendar, int(new_days[k]), end)
                raise WindowError(f"append: {name} (from {np.datetime64(int(first_ns[k]), 'ns')}) continues the "
                                  f"stored session of its instrument that ends at {np.datetime64(end, 'ns')} "
                                  f"({why}); an append adds whole new sessions: rebuild with --rebuild")
        if tuple(new[k].tolist()) <= newest:
            raise WindowError(f"append: {name} (from {np.datetime64(int(first_ns[k]), 'ns')}) falls before or among "
                              "the stored sessions; new data must come after every stored session, or rebuild with "
                              "--rebuild")
        if mine.size and int(first_ns[k]) < int(last[mine].max()):  # what a build refuses as files out of order
            end = int(last[mine].max())
            raise WindowError(f"append: {name} starts at {np.datetime64(int(first_ns[k]), 'ns')}, before the "
                              f"stored data of its instrument ends ({np.datetime64(end, 'ns')}): a day supplied "
                              "twice, or data overlapping the stored sessions; new data must start after every "
                              "stored session, or rebuild with --rebuild")
    return top + 1 + np.unique(new, axis=0, return_inverse=True)[1].reshape(-1)


def check_new_columns(columns: Sequence[str], files: Sequence[str], features: Sequence[Any], label: Any) -> None:
    """Refuse new files that lack a column the stored build's features or label read,
    before anything is computed or written: the feature code would name the column only,
    not the file that lacks it, nor which feature reads it.

    Parameters
    ----------
    columns
        The new files' columns (they share them: the loader checks each file).
    files
        The new files, named in the error.
    features, label
        The config's ``features.steps`` and ``labels`` (the stored build's: its
        fingerprint covers them). A ``custom`` feature reads whatever columns it likes,
        so it is not checked here.

    Raises
    ------
    MissingColumnError
        Naming the first new file (and how many more), the column, the feature
        (``features.steps[i]``) or label that reads it, and the columns there are.
    """
    from pipeline.features.steps import columns_read

    have = set(columns)
    readers = [(f"feature {spec.name!r} (features.steps[{i}])", columns_read([spec]) or ())
               for i, spec in enumerate(features)]
    readers.append((f"label kind {label.kind!r} (labels)", tuple(label.required_columns)))
    for who, needed in readers:
        missing = [c for c in needed if c not in have]
        if missing:
            more = f" (and the {len(files) - 1} other new file(s))" if len(files) > 1 else ""
            raise MissingColumnError(
                files[0], f"append: this new file{more} has no column {missing[0]!r}, which {who} reads (its "
                f"columns: {', '.join(columns)}); nothing was written. Give the new day the stored days' columns, "
                "or rebuild with --rebuild")
