"""``pipeline run`` on a store that already holds a build of the same config: append.

When the config's files now include files the store has not read, and every file it
read is unchanged, the new files' sessions are built on their own and appended as the
store's next version (:mod:`pipeline.storage.append`), equal to a build of every file.
Everything that would make the result differ from that build is refused before
anything is read or written, naming the file and ``--rebuild``: a changed or missing
stored file, fraction splits (they would move stored samples between splits), a new
instrument, new data that does not come after every stored session, and new files
that a build of every file would refuse beside the stored ones (a naive timestamp among
time-zone-aware ones, a timestamp type beside epoch numbers, another time zone where
dates need one, prices in another unit), checked against what the store records of its
files (:func:`check_new_types`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pipeline.config import Config, config_fingerprint
from pipeline.errors import EmptyInputError, StoreError, WindowError

__all__ = ["check_new_types", "new_files", "partial_day_text", "skipped_by_build", "skipped_refusal", "stored_build"]


def stored_build(config: Config) -> dict[str, Any] | None:
    """The attributes of a complete store of this config at its output path, or None
    (no store, an incomplete one, which the build resumes, or another config's, which
    the build refuses)."""
    from pipeline.storage.store import open_store_group, store_root_attrs

    out = config.output
    try:
        meta = store_root_attrs(open_store_group(out.path, mode="r", storage_options=out.storage_options or None))
    except StoreError:
        return None
    if not meta.get("complete") or meta.get("fingerprint") != config_fingerprint(config):
        return None
    return meta


def check_resume_files(config: Config) -> None:
    """Before the cluster starts: refuse to resume an interrupted build whose source files
    changed size, or were added, since it began (the writer checks rows and content
    hashes too, once they are known: :func:`pipeline.storage.writer.check_resume`).

    Raises
    ------
    StoreConflictError
        Naming the first such file, and ``--rebuild``.
    """
    from pipeline.errors import StoreConflictError
    from pipeline.loaders import _stat, expand_paths
    from pipeline.storage.store import open_store_group, store_root_attrs
    from pipeline.storage.writer import RESUME_KEY

    out = config.output
    try:
        meta = store_root_attrs(open_store_group(out.path, mode="r", storage_options=out.storage_options or None))
    except StoreError:
        return
    recorded = meta.get(RESUME_KEY)
    if meta.get("complete") or meta.get("fingerprint") != config_fingerprint(config) or not recorded:
        return
    so = config.source.storage_options or {}
    sizes = {row[0]: row[1] for row in recorded}
    for path in expand_paths(config.source.paths, so):
        size = _stat(path, so)[0]
        if sizes.get(path) != size:
            why = "not read by it" if path not in sizes else f"its size was {sizes[path]:,} bytes, is {size:,}"
            raise StoreConflictError(
                f"{out.path}: {path}: changed since the interrupted build began ({why}); the units written from the "
                "old input cannot be resumed: rerun with --rebuild to build again from the files as they are")


def new_files(config: Config, meta: dict[str, Any]) -> list[str]:
    """The files the config matches that the store has not read, in path order.

    Raises
    ------
    StoreError
        Naming the file: a stored file that changed or is missing.
    """
    from pipeline.loaders import _stat, expand_paths
    from pipeline.loaders.provenance import compare_files, recorded_files

    so = config.source.storage_options or {}
    files = expand_paths(config.source.paths, so)
    changes = compare_files(recorded_files(meta.get("sources")), files, lambda p: _stat(p, so), so)
    if changes.changed:
        path, why = changes.changed[0]
        raise StoreError(f"{path}: changed since the store was built ({why}); its windows are stored as they were. "
                         "Rerun with --rebuild to build everything again")
    if changes.missing:
        raise StoreError(f"{changes.missing[0]}: read by the store's build, but no longer there (or no longer "
                         "matched by source.paths); rerun with --rebuild to build without it")
    return list(changes.new)


def _session_spec(config: Config, meta: dict[str, Any]) -> Any:
    """The session mode of the stored build, as an append must use it.

    Raises
    ------
    StoreError
        For one continuous session, which new files cannot follow as new sessions.
    """
    from pipeline.features.sessions import SessionSpec

    spec = config.source.sessions
    if spec is None:
        # The default is one session per file once there are several files; a store
        # built from one file with one session is the same.
        return SessionSpec(mode="file")
    if spec.mode == "none":
        raise StoreError("append: source.sessions: none makes one continuous session, which new files cannot be "
                         "added to as new sessions; use sessions: file, date or a gap, or rerun with --rebuild")
    return spec


def _codes(source: Any, meta: dict[str, Any]) -> np.ndarray:
    """The stored instrument code of each new segment.

    Raises
    ------
    StoreError
        For an instrument the store does not hold.
    """
    stored = list(meta.get("instruments") or [""])
    names = source.segments.instruments
    unknown = [n for n in names if n not in stored]
    if unknown:
        raise StoreError(f"append: instrument {unknown[0]!r} is not in the store (it holds {stored}); adding an "
                         "instrument needs a rebuild: rerun with --rebuild")
    return np.array([stored.index(names[int(c)]) for c in source.segments.instrument], dtype=np.int32)


def skipped_by_build(meta: Mapping[str, Any], files: Sequence[str]) -> list[tuple[str, str]]:
    """The new files that ``source.on_error: skip`` left out of the stored build (the
    store's ``skipped`` attribute), with the reason it recorded, in ``files``' order."""
    why = {str(row[0]): str(row[1]) for row in meta.get("skipped") or () if len(row) >= 2}
    return [(str(f), why[str(f)]) for f in files if str(f) in why]


def skipped_refusal(refusal: str, left: Sequence[tuple[str, str]]) -> str:
    """An append's ordering refusal, told in terms of the file the stored build skipped.

    Parameters
    ----------
    refusal
        The refusal's message (a new session falls before or among the stored ones).
    left
        ``(path, reason)`` of the new files the stored build skipped
        (:func:`skipped_by_build`), not empty.

    Returns
    -------
    str
        Naming the skipped file the refusal names (else the refusal, then the first
        skipped file), its recorded reason, and ``--rebuild``.
    """
    named = [(path, why) for path, why in left if path in refusal]
    if named:
        path, why = named[0]
        return (f"append: {path} was left out of the stored build by source.on_error: skip ({why}); its data "
                "falls among the stored sessions, which were built without it, and an append only adds after "
                "every stored session: rerun with --rebuild to build every file, this one included")
    path, why = left[0]
    return (f"{refusal} ({path}, a new file, is one the stored build left out by source.on_error: skip ({why}): "
            "--rebuild includes it)")


def build_append(config: Config, meta: dict[str, Any], files: list[str], *, say: Callable[[str], None],
                 progress: bool, source_kwargs: dict[str, Any], block_windows: Callable[[int], int],
                 client: Any) -> dict[str, Any]:
    """Build the new files' sessions after the stored ones and append them.

    ``client``: the run's ``distributed.Client``, whose workers read the new files'
    digests while the sessions are built (:func:`~pipeline.loaders.provenance.hashes_on`).

    Returns
    -------
    dict
        ``rows`` read and sessions ``added``.
    """
    from pipeline.features import build_training_set
    from pipeline.features.history import check_new_columns, continue_sessions, merge_attrs, prior_from_attrs
    from pipeline.features.sessions import SegmentTable
    from pipeline.features.splits import is_dated
    from pipeline.loaders.provenance import hashes_on
    from pipeline.loaders.segments import open_segmented, zone_of
    from pipeline.storage.append import append
    from pipeline.storage.store import open_store_group
    from pipeline.storage.versions import attrs_at, pinned_array, versions_of

    out, src_cfg = config.output, config.source
    if len(out.splits) > 1 and not is_dated(out.splits):
        raise StoreError("append: fraction splits would move stored samples from one split to another as data "
                         "grows; split by dates (output.splits: {train: {until: ...}, ...}) to append, or rerun "
                         "with --rebuild")
    spec = _session_spec(config, meta)
    so = src_cfg.storage_options or None
    types = check_new_types(config, meta, files, source_kwargs, dated=bool(out.splits) and is_dated(out.splits))
    latest = versions_of(meta)[-1]
    stored = attrs_at(meta, latest)
    stored.pop("version", None)
    try:
        source = open_segmented(files, sessions=spec, instrument=src_cfg.instrument, storage_options=so,
                                **source_kwargs)
    except EmptyInputError as exc:
        if not exc.files_without_rows:
            raise
        # Only files with a header and no rows (a holiday's empty CSV), as below.
        new = hashes_on(client, {"files": exc.files_without_rows}, so)()
        return _record_files(config, stored, new, types, say=say, progress=progress)
    check_new_columns(source.columns, [f.path for f in source.files], config.features.steps, config.labels)
    hashes = hashes_on(client, source.metadata(), so)  # read by the workers meanwhile
    if not int(source.array.shape[0]):
        # Only files without rows (a holiday's empty file): a build of every file makes
        # nothing of them either. They are recorded as read, so the next run is up to date.
        return _record_files(config, stored, hashes(), types, say=say, progress=progress)
    base_sessions = None
    if out.folds is not None:
        base = next(iter(out.splits))
        group = open_store_group(out.path, mode="r", storage_options=out.storage_options or None)
        base_sessions = np.asarray(pinned_array(group[f"{base}/session"], latest.samples[base])[:], dtype=np.int64)
    prior = prior_from_attrs(stored, latest.samples, base_sessions)
    segs = source.segments
    codes = _codes(source, stored)
    try:
        check_instrument_days(prior, codes, [str(x) for x in segs.labels], source.first_times,
                              tz=zone_of(source, spec), spec=spec, on_partial_day=out.on_partial_day)
        sessions = continue_sessions(prior, codes, segs.labels, source.first_times, spec.mode, spec.gap_ns,
                                     keys=source.session_keys, tz=zone_of(source, spec), calendar=spec.calendar)
    except WindowError as exc:
        # A file the stored build skipped, now readable, sits among the stored sessions:
        # "falls before the stored sessions" alone sends its user looking for a date
        # mistake, when the store's own record says why it is not there.
        left = skipped_by_build(stored, files)
        if not left:
            raise
        raise WindowError(skipped_refusal(str(exc), left)) from None
    labels = gap_labels(prior.segments.instrument, codes, segs.labels) if spec.mode == "gap" else segs.labels
    table = SegmentTable(segs.starts, segs.stops, codes, sessions.astype(np.int32), prior.segments.instruments,
                         labels)
    rows = int(source.array.shape[0])
    from pipeline.job import dropped_text

    say(f"append: {len(files)} new file(s), {rows:,} rows, {len(segs)} new session(s) after version "
        f"{latest.number}" + dropped_text(source.dropped, src_cfg))
    tset = build_training_set(
        source.array, columns=source.columns, features=config.features.steps, size=config.windows.size,
        stride=config.windows.stride, scales=config.windows.scales, label=config.labels,
        splits=splits_in_zone(out.splits, source),
        normalize=config.features.normalize, nan=config.features.nan, fill_value=config.features.fill_value,
        progress=progress, materialize=config.windows.materialize, block_windows=block_windows, segments=table,
        timestamps=source.timestamps, folds=out.folds, prior=prior,
        source_fill=src_cfg.fill_value if src_cfg.nan == "fill" else None)  # as a build: no label reads a fill
    attrs = merge_attrs(prior, tset.attrs)
    new_sources = hashes()
    attrs["sources"] = {**stored.get("sources", {}), "files": list(stored.get("sources", {}).get("files") or [])
                        + new_sources["files"], "shape": [prior.rows + rows, int(source.array.shape[1])]}
    if types is not None:
        attrs["sources"]["types"] = types
    attrs["rows_read"] = int(stored.get("rows_read") or prior.rows) + rows
    if tset.folds:
        base_name = (stored.get("folds") or {}).get("base", next(iter(out.splits)))
        attrs["folds"] = {**tset.attrs["folds"], "base": base_name, "names": sorted(tset.folds),
                          "counts": {name: int(idx.size) for name, idx in sorted(tset.folds.items())}}
    if "session_keys" in stored:
        attrs["session_keys"] = list(stored["session_keys"]) + list(source.session_keys)
    token = hashlib.blake2b(json.dumps(new_sources["files"], sort_keys=True, default=str).encode(),
                            digest_size=16).hexdigest()
    say("appending " + ", ".join(f"{k}: {next(iter(v.values())).shape[0]:,} windows" for k, v in tset.splits.items()))
    warn_frozen_fit(stored.get("normalization") or {}, {k: next(iter(v.values())).shape[0]
                                                       for k, v in tset.splits.items()})
    append(out.path, tset.splits, attrs=attrs, token=token, shared=tset.shared or None, folds=tset.folds or None,
           added=list(segs.labels), storage_options=out.storage_options or None, progress=progress)
    return {"rows": rows, "added": len(segs)}


def gap_labels(stored_codes: np.ndarray, codes: np.ndarray, labels: Sequence[str]) -> list[str]:
    """The labels of new ``sessions: {gap: ...}`` sessions, numbered on from each
    instrument's stored ones as a build of every file numbers them (``#0``, ``#1``, ...
    per instrument): the new files alone number theirs from ``#0``."""
    stored = np.bincount(np.asarray(stored_codes, dtype=np.int64), minlength=int(np.max(codes, initial=-1)) + 1)
    seen: dict[int, int] = {}
    out = []
    for code, label in zip(np.asarray(codes, dtype=np.int64).tolist(), labels):
        if not str(label).startswith("#"):
            out.append(str(label))
            continue
        k = seen.get(code, 0)
        seen[code] = k + 1
        out.append(f"#{int(stored[code]) + k if code < stored.size else k}")
    return out


def warn_frozen_fit(stats: dict[str, Any], windows: dict[str, int]) -> None:
    """Warn when new windows fall in the split the stored ``global`` statistics were
    fitted on (``fit_on``): frozen, they are the first build's, fitted without these rows,
    where a build of every file would fit them on these rows too; the store then differs
    from such a build until ``--refit``.

    Warns
    -----
    UserWarning
        Naming the split, the new windows and what to run.
    """
    import warnings

    fit_on = stats.get("fit_on")
    added = int(windows.get(fit_on, 0)) if fit_on else 0
    if added:
        warnings.warn(f"append: {added:,} new window(s) fall in split {fit_on!r}, on which the normalization "
                      "statistics were fitted: they are scaled by the first build's statistics, frozen, which "
                      "these rows do not change, where a build of every file would fit them on these rows too "
                      f"(the store now differs from such a build); `pipeline run --refit` refits them on every "
                      f"{fit_on!r} row. Date splits whose {fit_on!r} ends before the new days append without this",
                      UserWarning, stacklevel=3)


def _stored_starts(prior: Any) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray] | None:
    """Per stored segment: its instrument code, label, first and last timestamp (ns), from
    the store's ``sessions`` attribute, or ``None`` where it records no times."""
    rows = prior.attrs.get("sessions") or []
    if not rows or len(rows) != len(prior.segments) or any("start" not in r or "end" not in r for r in rows):
        return None
    first = np.array([np.datetime64(r["start"], "ns").astype(np.int64) for r in rows], dtype=np.int64)
    last = np.array([np.datetime64(r["end"], "ns").astype(np.int64) for r in rows], dtype=np.int64)
    return np.asarray(prior.segments.instrument), [str(r.get("label", "")) for r in rows], first, last


def late_segments(stored_inst: np.ndarray, stored_days: np.ndarray, stored_last: np.ndarray, new_inst: np.ndarray,
                  new_days: np.ndarray, new_first: np.ndarray) -> list[tuple[int, int]]:
    """The new segments that come after every stored session of their own instrument
    (a later day, starting after its stored data ends) but not after every stored
    session: another instrument's stored data already reaches their day.

    A build orders sessions day by day, each day's instruments together
    (:func:`~pipeline.loaders.segments.session_major_order`), so such a segment belongs
    among the stored ones; an append only adds after them.

    Returns
    -------
    list of (int, int)
        ``(new segment, stored segment)``: the stored segment is the latest of another
        instrument on or after the new segment's day.
    """
    out = []
    for k in range(new_inst.size):
        mine = stored_inst == new_inst[k]
        if mine.any() and (stored_days[mine].max() >= new_days[k] or stored_last[mine].max() >= new_first[k]):
            continue  # among its own instrument's sessions: continue_sessions names that case
        later = np.flatnonzero(~mine & (stored_days >= new_days[k]))
        if later.size:
            out.append((k, int(later[np.argmax(stored_days[later])])))
    return out


def uncovered_days(stored_inst: np.ndarray, new_inst: np.ndarray, new_days: np.ndarray) -> list[tuple[int, list[int]]]:
    """Each day of the new segments with the stored instruments that have no new
    segment that day, in day order (days every stored instrument covers left out)."""
    held = sorted(set(np.asarray(stored_inst).tolist()))
    out = []
    for day in sorted(set(np.asarray(new_days).tolist())):
        have = set(np.asarray(new_inst)[np.asarray(new_days) == day].tolist())
        lacking = [c for c in held if c not in have]
        if lacking:
            out.append((int(day), lacking))
    return out


def check_instrument_days(prior: Any, codes: np.ndarray, labels: Sequence[str], first_ns: np.ndarray | None, *,
                          tz: str | None, spec: Any, on_partial_day: str = "append") -> None:
    """Before the new sessions are numbered: refuse a new session of one instrument that
    a build would place among the stored ones because another instrument's stored data
    already reaches its day (its file came a night late), and warn when the new files
    leave out an instrument the store holds on a day they add.

    Parameters
    ----------
    prior
        The stored build.
    codes, labels, first_ns
        Per new segment: its stored instrument code, label (file or date) and first
        timestamp (``None`` without timestamps: nothing to compare).
    tz, spec
        The zone of the calendar dates and the session spec, as the build keys days.
    on_partial_day
        ``output.on_partial_day``: ``append`` warns of a day some instruments lack,
        ``refuse`` refuses the append.

    Raises
    ------
    WindowError
        Naming the new segment, the other instrument and its stored session, and
        ``--rebuild``.
    StoreError
        Under ``on_partial_day="refuse"``, naming the first such day, the instruments
        without a file for it, and to rerun once their files are there.

    Warns
    -----
    UserWarning
        Naming each new day and the stored instruments without a new file for it.
    """
    import warnings

    from pipeline.features.sessions import SessionSpec, session_days

    stored = _stored_starts(prior)
    if first_ns is None or stored is None or len(prior.segments.instruments) < 2:
        return
    inst, old_labels, first, last = stored
    day_spec = SessionSpec(mode="calendar", calendar=spec.calendar) if spec.mode == "calendar" else None
    old_days = session_days(first, tz, day_spec)
    new_first = np.asarray(first_ns, dtype=np.int64)
    new_days = session_days(new_first, tz, day_spec)
    codes = np.asarray(codes)
    names = prior.segments.instruments
    late = late_segments(inst, old_days, last, codes, new_days, new_first)
    if late:
        k, j = late[0]
        mine, theirs = names[int(codes[k])], names[int(inst[j])]
        day = np.datetime64(int(new_days[k]), "D")
        raise WindowError(
            f"append: {labels[k]} (instrument {mine!r}, from {np.datetime64(int(new_first[k]), 'ns')}) comes after "
            f"every stored session of {mine!r}, but the store already holds {theirs!r} up to {day} or later "
            f"({old_labels[j]}, from {np.datetime64(int(first[j]), 'ns')}): a build places each day's sessions of "
            f"every instrument together, so this session belongs among the stored ones, where an append cannot "
            f"insert it (that day of {theirs!r} was appended without the file of {mine!r}). Rerun with --rebuild "
            "to build every file; to append night by night, wait until every instrument's file of a day is there")
    for day, lacking in uncovered_days(inst, codes, new_days):
        have = sorted({names[int(c)] for c in codes[new_days == day]})
        text = partial_day_text(str(np.datetime64(day, "D")), have, [names[c] for c in lacking],
                                refuse=on_partial_day == "refuse")
        if on_partial_day == "refuse":
            raise StoreError(text)
        warnings.warn(text, UserWarning, stacklevel=3)


def partial_day_text(day: str, have: Sequence[str], lacking: Sequence[str], *, refuse: bool) -> str:
    """What an append says of a new day some stored instruments have no file for: the
    warning (``refuse=False``: the day is appended) or the refusal of
    ``output.on_partial_day: refuse``.

    Each says what its reader can do: the warning runs on and commits in the same run,
    so it names the option that refuses instead; the refusal, that a rerun once the
    files are there appends the whole day.
    """
    gone = ", ".join(lacking)
    head = (f"append: the new files hold {day} for instrument(s) {', '.join(have)} only; the store also holds "
            f"{gone}, with no new file for that day")
    if refuse:
        return (f"{head}. output.on_partial_day: refuse refuses such an append, and nothing was written: rerun once "
                f"the file(s) of {gone} for {day} are there (if {gone} did not trade that day, rerun once with "
                "--set output.on_partial_day=append)")
    return (f"{head}. Appended now, a file of {gone} for that day arriving later cannot be appended (only --rebuild "
            "takes it); for a job that cannot wait for it, output.on_partial_day: refuse refuses such an append "
            "until every instrument's file of the day is there (for an instrument that did not trade that day, "
            "nothing is to be done)")


def check_new_types(config: Config, meta: Mapping[str, Any], files: list[str], source_kwargs: Mapping[str, Any],
                    *, dated: bool) -> dict[str, Any] | None:
    """Refuse new files that a build of every file would refuse beside the stored ones,
    with the build's message naming the new file, before anything is read or written:
    the checks a build makes across files (:func:`~pipeline.loaders.timeorder.check_time_kinds`,
    :func:`~pipeline.loaders.tables.check_units`, one time zone for dates), over what the
    store records of its files and the new files' footers.

    Parameters
    ----------
    config, meta
        The run's config and the store's attributes.
    files
        The new files.
    source_kwargs
        The loader options the build opens the files with.
    dated
        Whether the splits are dates, which need the files' one time zone.

    Returns
    -------
    dict or None
        The record of every file's types after the append (``sources.types``), or
        ``None`` without one (no timestamp column, or a store whose record and files
        are gone).

    Raises
    ------
    LoaderError
        Naming the new file.
    """
    from pipeline.loaders.segments import file_groups, file_types

    timestamp, fmt = source_kwargs.get("timestamp"), source_kwargs.get("format")
    if not timestamp or fmt in ("lobster", "fi2010"):
        return None
    src_cfg = config.source
    so = src_cfg.storage_options or None
    stored = _stored_types(meta, timestamp, src_cfg.instrument, fmt, so, source_kwargs.get("rename"))
    if stored is None:
        return None
    groups = dict(stored["groups"])
    columns = source_kwargs.get("columns")
    by_date = src_cfg.sessions is not None and src_cfg.sessions.mode == "date"
    for name, paths in file_groups(files, src_cfg.instrument, fmt).items():
        new = file_types(paths, timestamp=timestamp, storage_options=so, rename=source_kwargs.get("rename"),
                         format=fmt)
        old = groups.get(name) or {"time": {}, "units": {}, "zones": []}
        merged = merge_types(old, new)
        _check_types(merged, timestamp, set(files), columns)
        if by_date:  # each instrument's dates in its one zone
            _check_one_zone(old, merged, new, paths)
        groups[name] = merged
    if dated:
        every = {"zones": sorted({z for g in groups.values() for z in g["zones"]})}
        _check_one_zone({"zones": sorted({z for g in stored["groups"].values() for z in g["zones"]})}, every,
                        {"time": {k: v for g in groups.values() for k, v in g["time"].items()}}, files)
    return {"timestamp": timestamp, "groups": groups}


def merge_types(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """Two :func:`~pipeline.loaders.segments.file_types` records joined as one of the
    files of both (``old``'s first): each kind's first file, and the files counted."""
    time = {k: list(v) for k, v in (old.get("time") or {}).items()}
    for kind, (path, n) in (new.get("time") or {}).items():
        time[kind] = [time[kind][0], int(time[kind][1]) + int(n)] if kind in time else [path, int(n)]
    units = {c: dict(v) for c, v in (old.get("units") or {}).items()}
    for column, kinds in (new.get("units") or {}).items():
        for kind, entry in kinds.items():
            units.setdefault(column, {}).setdefault(kind, list(entry))
    return {"time": time, "units": units, "zones": sorted(set(old.get("zones") or ()) | set(new.get("zones") or ()))}


def _check_types(merged: Mapping[str, Any], timestamp: str, new: set[str], columns: Any) -> None:
    """The build's checks across files over a merged record."""
    from pipeline.loaders.tables import TablePart, check_units
    from pipeline.loaders.timeorder import check_time_kinds

    check_time_kinds(merged["time"], timestamp, new=new)
    for column, kinds in merged["units"].items():
        if columns and column not in columns:
            continue
        # One stand-in part per recorded first file of each kind: check_units compares
        # the first integer file with the first float one, as a build of every file does.
        parts = [TablePart(path, "parquet", 0, 0, (column,), sources=(column,), kinds=(kind,), magnitudes=(size,))
                 for kind, (path, size) in kinds.items()]
        check_units(parts, [column])


def _check_one_zone(old: Mapping[str, Any], merged: Mapping[str, Any], new: Mapping[str, Any],
                    paths: list[str]) -> None:
    """Refuse files that make dates need one zone of several, naming a new file of the
    zone the stored files lack, in the build's words."""
    from pipeline.errors import LoaderError

    zones = merged["zones"]
    if len(zones) < 2:
        return
    odd = next((v[0] for k, v in (new.get("time") or {}).items()
                if k.startswith("aware:") and k[6:] not in (old.get("zones") or ()) and v[0] in paths), paths[0])
    raise LoaderError(odd, f"the files' timestamps are in several time zones ({', '.join(zones)}): a date "
                      "(sessions: date, date splits) needs one; store every file in one zone (the stored files "
                      f"are in {', '.join(old.get('zones') or ()) or 'none'})")


def _stored_types(meta: Mapping[str, Any], timestamp: str, instrument: Any, fmt: str | None, so: Any,
                  rename: Any) -> dict[str, Any] | None:
    """What the store records of its files' types (``sources.types``, since the build
    records it); for a store written before, the same read from the footer of each
    instrument's last stored file holding rows (the build refused files of mixed kinds,
    so it stands for them all); ``None`` when that file cannot be read."""
    from pipeline.errors import LoaderError
    from pipeline.loaders.segments import file_groups, file_types

    sources = meta.get("sources") or {}
    recorded = sources.get("types")
    if isinstance(recorded, Mapping) and recorded.get("timestamp") == timestamp:
        return {"timestamp": timestamp, "groups": dict(recorded.get("groups") or {})}
    entries = [f for f in sources.get("files") or [] if isinstance(f, Mapping) and f.get("path")]
    rows = {str(f["path"]): int(f.get("rows") or 0) for f in entries}
    groups = {}
    try:
        for name, paths in file_groups(list(rows), instrument, fmt).items():
            last = next((p for p in reversed(paths) if rows[p]), paths[-1])
            groups[name] = file_types([last], timestamp=timestamp, storage_options=so, rename=rename, format=fmt,
                                      files_read=len(paths))
    except (LoaderError, OSError):
        return None
    return {"timestamp": timestamp, "groups": groups}


def _record_files(config: Config, stored: dict[str, Any], new_sources: dict[str, Any],
                  types: dict[str, Any] | None, *, say: Callable[[str], None], progress: bool) -> dict[str, Any]:
    """Append a version that adds no sample, only new files without rows (``new_sources``,
    with their digests) to the store's record of the files it read."""
    from pipeline.storage.append import append

    out = config.output
    attrs = dict(stored)
    attrs["sources"] = {**stored.get("sources", {}),
                        "files": list(stored.get("sources", {}).get("files") or []) + new_sources["files"]}
    if types is not None:
        attrs["sources"]["types"] = types
    token = hashlib.blake2b(json.dumps(new_sources["files"], sort_keys=True, default=str).encode(),
                            digest_size=16).hexdigest()
    say(f"append: {len(new_sources['files'])} new file(s) without rows: no session to add; recorded as read")
    append(out.path, {}, attrs=attrs, token=token, storage_options=out.storage_options or None, progress=progress)
    return {"rows": 0, "added": 0}


def splits_in_zone(splits: Mapping[str, Any] | None, source: Any) -> Mapping[str, Any] | None:
    """``output.splits`` with each date taken in the zone of the data's timestamps
    (:func:`~pipeline.features.splits.localize_splits`), or, under an exchange calendar,
    at the open of that trading date's session (:func:`~pipeline.features.splits.calendar_splits`);
    fraction splits unchanged."""
    from pipeline.features.splits import calendar_splits, is_dated, localize_splits

    if not splits or not is_dated(splits):
        return splits
    calendar = getattr(source, "calendar", None)
    if calendar is not None:
        return calendar_splits(splits, calendar, aware=bool(source.time_zones))
    return localize_splits(splits, source.time_zone)
