"""``pipeline run`` on a store that already holds a build of the same config: append.

When the config's files now include files the store has not read, and every file it
read is unchanged, the new files' sessions are built on their own and appended as the
store's next version (:mod:`pipeline.storage.append`), equal to a build of every file.
Everything that would make the result differ from that build is refused before
anything is read or written, naming the file and ``--rebuild``: a changed or missing
stored file, fraction splits (they would move stored samples between splits), a new
instrument, and new data that does not come after every stored session.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable, Mapping

import numpy as np

from pipeline.config import Config, config_fingerprint
from pipeline.errors import StoreError

__all__ = ["new_files", "stored_build"]


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
            why = "not read by it" if path not in sizes else f"its size was {sizes[path]}, is {size}"
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


def build_append(config: Config, meta: dict[str, Any], files: list[str], *, say: Callable[[str], None],
                 progress: bool, source_kwargs: dict[str, Any], block_windows: Callable[[int], int]) -> dict[str, Any]:
    """Build the new files' sessions after the stored ones and append them.

    Returns
    -------
    dict
        ``rows`` read and sessions ``added``.
    """
    from pipeline.features import build_training_set
    from pipeline.features.history import check_new_columns, continue_sessions, merge_attrs, prior_from_attrs
    from pipeline.features.sessions import SegmentTable
    from pipeline.features.splits import is_dated
    from pipeline.loaders.provenance import with_hashes
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
    source = open_segmented(files, sessions=spec, instrument=src_cfg.instrument, storage_options=so,
                            **source_kwargs)
    check_new_columns(source.columns, [f.path for f in source.files], config.features.steps, config.labels)
    latest = versions_of(meta)[-1]
    stored = attrs_at(meta, latest)
    stored.pop("version", None)
    base_sessions = None
    if out.folds is not None:
        base = next(iter(out.splits))
        group = open_store_group(out.path, mode="r", storage_options=out.storage_options or None)
        base_sessions = np.asarray(pinned_array(group[f"{base}/session"], latest.samples[base])[:], dtype=np.int64)
    prior = prior_from_attrs(stored, latest.samples, base_sessions)
    segs = source.segments
    codes = _codes(source, stored)
    sessions = continue_sessions(prior, codes, segs.labels, source.first_times, spec.mode, spec.gap_ns,
                                 keys=source.session_keys, tz=zone_of(source, spec))
    table = SegmentTable(segs.starts, segs.stops, codes, sessions.astype(np.int32), prior.segments.instruments,
                         segs.labels)
    rows = int(source.array.shape[0])
    say(f"append: {len(files)} new file(s), {rows:,} rows, {len(segs)} new session(s) after version "
        f"{latest.number}")
    tset = build_training_set(
        source.array, columns=source.columns, features=config.features.steps, size=config.windows.size,
        stride=config.windows.stride, scales=config.windows.scales, label=config.labels,
        splits=splits_in_zone(out.splits, source),
        normalize=config.features.normalize, nan=config.features.nan, fill_value=config.features.fill_value,
        progress=progress, materialize=config.windows.materialize, block_windows=block_windows, segments=table,
        timestamps=source.timestamps, folds=out.folds, prior=prior)
    attrs = merge_attrs(prior, tset.attrs)
    new_sources = with_hashes(source.metadata(), so)
    attrs["sources"] = {**stored.get("sources", {}), "files": list(stored.get("sources", {}).get("files") or [])
                        + new_sources["files"], "shape": [prior.rows + rows, int(source.array.shape[1])]}
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
    append(out.path, tset.splits, attrs=attrs, token=token, shared=tset.shared or None, folds=tset.folds or None,
           added=list(segs.labels), storage_options=out.storage_options or None, progress=progress)
    return {"rows": rows, "added": len(segs)}


def splits_in_zone(splits: Mapping[str, Any] | None, source: Any) -> Mapping[str, Any] | None:
    """``output.splits`` with each date taken in the zone of the data's timestamps
    (:func:`~pipeline.features.splits.localize_splits`); fraction splits unchanged."""
    from pipeline.features.splits import is_dated, localize_splits

    return localize_splits(splits, source.time_zone) if splits and is_dated(splits) else splits
