"""Which input files are new, and which stored ones changed, since a store was built.

A store records every file it read (path, size, modification time, and a content hash
of the file's first and last MiB). An append compares the files a config matches now
against that record, before it reads or writes anything:

- a file not in the record is new;
- a recorded file whose size differs, or whose modification time differs and whose
  content hash differs too, has changed: the stored windows no longer describe it;
- a recorded file that is gone is missing.

Comparing size and time first (as ``make`` and ``rsync`` do) keeps an append from
reading the old files; the hash is read only for a file whose time moved, so a file
copied or touched with the same bytes is not taken for a changed one.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import fsspec

from pipeline.errors import LoaderError

__all__ = ["FileChanges", "compare_files", "content_hash", "recorded_files", "with_hashes"]

#: Bytes hashed at each end of a file.
_HASH_BYTES = 1 << 20


def content_hash(path: str, size: int, storage_options: dict | None = None) -> str:
    """BLAKE2b (128 bits) of a file's size, first MiB and last MiB.

    Raises
    ------
    LoaderError
        When the file cannot be read, naming it.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(int(size).to_bytes(8, "little"))
    try:
        with fsspec.open(path, "rb", **(storage_options or {})) as f:
            h.update(f.read(_HASH_BYTES))
            if size > 2 * _HASH_BYTES:
                f.seek(size - _HASH_BYTES)
            h.update(f.read(_HASH_BYTES))
    except OSError as exc:
        raise LoaderError(path, f"cannot read ({exc})") from None
    return h.hexdigest()


def recorded_files(sources: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``{path: {"size", "mtime", "hash"}}`` of every file (and LOBSTER companion) a
    store's ``sources`` attribute records."""
    out: dict[str, dict[str, Any]] = {}
    for entry in (sources or {}).get("files") or []:
        path = _local_absolute(str(entry["path"]))
        out[path] = {k: entry.get(k) for k in ("size", "mtime", "hash")}
        comp = entry.get("companion")
        if isinstance(comp, Mapping) and comp.get("path"):
            out[_local_absolute(str(comp["path"]))] = {**{k: comp.get(k) for k in ("size", "mtime", "hash")},
                                                       "companion_of": path}
    return out


def _local_absolute(path: str) -> str:
    """A recorded local path as :func:`~pipeline.loaders.expand_paths` gives it now
    (absolute): stores built before it did so recorded relative ones, taken here as
    relative to this working directory (where their config's relative globs point)."""
    return path if "://" in path or os.path.isabs(path) else os.path.abspath(path)


def with_hashes(sources: Mapping[str, Any], storage_options: dict | None = None) -> dict[str, Any]:
    """A ``sources`` attribute with every file's (and companion's) content hash added."""
    out = dict(sources)
    files = []
    for entry in sources.get("files") or []:
        entry = dict(entry)
        entry["hash"] = content_hash(entry["path"], int(entry["size"]), storage_options)
        if isinstance(entry.get("companion"), Mapping):
            comp = dict(entry["companion"])
            comp["hash"] = content_hash(comp["path"], int(comp["size"]), storage_options)
            entry["companion"] = comp
        files.append(entry)
    out["files"] = files
    return out


@dataclass(frozen=True, slots=True)
class FileChanges:
    """New files (in path order), changed files with what changed, and missing files."""

    new: tuple[str, ...]
    changed: tuple[tuple[str, str], ...]
    missing: tuple[str, ...]


def compare_files(recorded: Mapping[str, Mapping[str, Any]], current: Iterable[str],
                  stat: Any, storage_options: dict | None = None) -> FileChanges:
    """What changed between the recorded files and the ``current`` ones.

    Parameters
    ----------
    recorded
        From :func:`recorded_files`.
    current
        The paths a config matches now (companions are looked up in ``recorded``).
    stat
        ``stat(path) -> (size, mtime)``.
    storage_options
        fsspec options for remote paths.
    """
    current = list(current)
    seen = set(current)
    new = tuple(p for p in current if p not in recorded)
    changed: list[tuple[str, str]] = []
    missing: list[str] = []
    for path, rec in recorded.items():
        if path not in seen and rec.get("companion_of") not in seen:
            if "companion_of" not in rec:
                missing.append(path)
            continue
        try:
            size, mtime = stat(path)
        except LoaderError:
            missing.append(path)
            continue
        if rec.get("size") is not None and int(rec["size"]) != int(size):
            changed.append((path, f"its size is {size:,} bytes, the store recorded {int(rec['size']):,}"))
        elif rec.get("mtime") is not None and float(rec["mtime"]) != float(mtime):
            if rec.get("hash") is None or content_hash(path, size, storage_options) != rec["hash"]:
                changed.append((path, "it was modified after the store was built (its modification time and "
                                      "content differ from the store's record)"))
    return FileChanges(new, tuple(changed), tuple(missing))

