"""Versions of a store: each build or append adds one, and a reader keeps the one it opened.

A store grows only at the end of its arrays: an append writes the new sessions' samples
after the stored ones (rewriting the last, partly filled write unit whole, by a temporary
file and a rename, so a reader sees its old or its new bytes and the same stored samples
either way), then adds a record to ``history`` in the root's attributes. That record is
the commit: a version is its sample count per split (and row count of shared features),
so a reader that slices every array to its version's counts sees exactly that version,
whatever an append writes meanwhile, and a killed append leaves only bytes past those
counts, which the next append rewrites. The measured comparison with icechunk that chose
this scheme is in ``benchmarks/README.md``.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pipeline.errors import StoreError

if TYPE_CHECKING:  # pragma: no cover
    import zarr

__all__ = ["HISTORY", "IN_PROGRESS", "PENDING", "Version", "attrs_at", "pinned_array", "record", "select_version",
           "versions_of"]

#: Key of the version records in the store's ``pipeline`` attributes.
HISTORY = "history"
#: Key of the append in progress (what it adds), removed by the commit.
PENDING = "pending_append"
#: Root attribute (beside the ``pipeline`` attributes) of an append in progress, for
#: readers that do not slice arrays to a version (plain zarr, xarray): its ``samples``
#: per split are the complete version's, and the arrays may be longer. Written with
#: :data:`PENDING`, removed by the commit.
IN_PROGRESS = "append_in_progress"
#: Attributes that describe one version (recomputed per version, kept in its record).
_PER_VERSION = ("class_balance", "window_counts", "nan_windows_dropped", "split_steps", "rows_read")


@dataclass(frozen=True, slots=True)
class Version:
    """One version of a store.

    Attributes
    ----------
    number
        0 for the first build, then one more per append.
    created
        When it was committed (UTC, ISO 8601).
    kind
        ``"build"`` or ``"append"``.
    samples
        Samples per split.
    shared_rows
        Rows of the shared per-step features (virtual windows), else ``None``.
    sessions
        Rows of the session table (instrument x session segments) it holds.
    added
        Labels of the sessions it added (files or dates).
    folds
        Fold names it holds.
    extra
        Per-version attributes (class balance, window counts...).
    tails
        Per split (and ``_shared``), the checksum row of its last write unit when that
        unit is partly filled: a later append rewrites that unit whole, and a reader of
        this version verifies its own samples against this row.
    """

    number: int
    created: str
    kind: str
    samples: dict[str, int]
    shared_rows: int | None = None
    sessions: int | None = None
    added: tuple[str, ...] = ()
    folds: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict)
    tails: dict[str, list[int]] = field(default_factory=dict)

    def to_attrs(self) -> dict[str, Any]:
        return {"version": self.number, "created": self.created, "kind": self.kind, "samples": dict(self.samples),
                "shared_rows": self.shared_rows, "sessions": self.sessions, "added": list(self.added),
                "folds": list(self.folds), "extra": dict(self.extra), "tails": dict(self.tails)}

    @classmethod
    def from_attrs(cls, value: Mapping[str, Any]) -> "Version":
        return cls(int(value["version"]), str(value.get("created", "")), str(value.get("kind", "build")),
                   {str(k): int(v) for k, v in dict(value.get("samples") or {}).items()},
                   None if value.get("shared_rows") is None else int(value["shared_rows"]),
                   None if value.get("sessions") is None else int(value["sessions"]),
                   tuple(value.get("added") or ()), tuple(value.get("folds") or ()), dict(value.get("extra") or {}),
                   {str(k): [int(x) for x in v] for k, v in dict(value.get("tails") or {}).items()})

    def describe(self) -> str:
        """One line for ``pipeline inspect``."""
        counts = ", ".join(f"{k} {v:,}" for k, v in self.samples.items())
        added = f"; added {len(self.added)} session(s)" if self.added and self.kind == "append" else ""
        return f"v{self.number} {self.kind} {self.created}: {counts}{added}"


def record(meta: Mapping[str, Any], *, kind: str, samples: Mapping[str, int], shared_rows: int | None,
           added: Sequence[str] = (), group: zarr.Group | None = None) -> list[dict[str, Any]]:
    """The history with one more version, for the attributes ``meta`` is about to commit
    (``group``, the store's root, gives the checksums of partly filled last units)."""
    history = [v.to_attrs() for v in versions_of(meta)] if kind == "append" else []
    sessions = meta.get("sessions")
    folds = meta.get("folds")
    version = Version(
        number=len(history), kind=kind, samples={str(k): int(v) for k, v in samples.items()},
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), shared_rows=shared_rows,
        sessions=len(sessions) if isinstance(sessions, list) else None, added=tuple(str(a) for a in added),
        folds=tuple(folds.get("names") or ()) if isinstance(folds, Mapping) else (),
        extra={k: meta[k] for k in _PER_VERSION if k in meta},
        tails={} if group is None else _tail_sums(group, {**samples, **({SHARED: shared_rows} if shared_rows else {})}))
    return [*history, version.to_attrs()]


SHARED = "_shared"


def _tail_sums(group: zarr.Group, counts: Mapping[str, int]) -> dict[str, list[int]]:
    """The ``_written`` row of each group's last unit when ``counts`` leave it partly
    filled (no row for groups without markers)."""
    out = {}
    for split, n in counts.items():
        if not n or split not in group or "_written" not in group[split]:
            continue
        arrays = [a for name, a in group[split].arrays() if not name.startswith("_")]
        if not arrays:
            continue
        unit = int((arrays[0].shards or arrays[0].chunks)[0])
        if n % unit:
            out[split] = [int(v) for v in group[f"{split}/_written"][(n - 1) // unit]]
    return out


def verified_sums(group: zarr.Group, split: str, version: Version | None, rows: int | None) -> Any:
    """The checksum rows a reader of ``version`` verifies ``split``'s units against: the
    stored rows of its units, with its own row for a last unit a later append rewrote."""
    table = group[f"{split}/_written"]
    sums = table[:]
    if version is None or rows is None:
        return sums
    probe = next((a for name, a in group[split].arrays() if not name.startswith("_")), None)
    unit = int((probe.shards or probe.chunks)[0]) if probe is not None else 1
    sums = sums[: -(-int(rows) // unit)].copy()
    if split in version.tails and len(sums):
        sums[-1] = version.tails[split]
    return sums


def versions_of(meta: Mapping[str, Any]) -> list[Version]:
    """Every version of a store, oldest first. A store written before versions were
    recorded is one version: what its attributes say."""
    history = meta.get(HISTORY)
    if isinstance(history, list) and history:
        return [Version.from_attrs(v) for v in history]
    samples = {str(k): int(v) for k, v in dict(meta.get("splits") or {}).items()}
    folds = meta.get("folds")
    return [Version(0, str(meta.get("created", "")), "build", samples,
                    folds=tuple(folds.get("names") or ()) if isinstance(folds, Mapping) else ())]


def select_version(meta: Mapping[str, Any], version: int | None, location: str) -> Version:
    """Version ``version`` (negative counts from the newest), or the newest for ``None``.

    Raises
    ------
    StoreError
        When the store has no such version, naming the ones it has.
    """
    versions = versions_of(meta)
    if version is None:
        return versions[-1]
    if isinstance(version, bool) or not isinstance(version, int) or not -len(versions) <= version < len(versions):
        raise StoreError(f"{location}: no version {version!r}; the store has versions 0..{len(versions) - 1}")
    return versions[version]


def attrs_at(meta: Mapping[str, Any], version: Version) -> dict[str, Any]:
    """The store's attributes as they were at ``version``: its sample counts, sessions,
    folds and per-version figures."""
    out = dict(meta)
    out.pop(PENDING, None)
    out["splits"] = dict(version.samples)
    out.update(version.extra)
    if version.sessions is not None and isinstance(meta.get("sessions"), list):
        out["sessions"] = meta["sessions"][: version.sessions]
    folds = meta.get("folds")
    if isinstance(folds, Mapping) and folds.get("names") is not None:
        keep = set(version.folds)
        out["folds"] = {**folds, "names": [n for n in folds["names"] if n in keep],
                        "counts": {k: v for k, v in dict(folds.get("counts") or {}).items() if k in keep}}
        if "count" in folds:
            out["folds"]["count"] = len({n.split("/")[0] for n in out["folds"]["names"]})
    out["version"] = version.number
    return out


def pinned_array(array: zarr.Array, rows: int) -> zarr.Array:
    """``array`` seen with only its first ``rows`` samples: reads, chunk counts and
    shapes stop there, whatever has been appended after them.

    The metadata is changed in memory only; nothing is written.

    Raises
    ------
    StoreError
        When the array holds fewer samples than its version says (a store damaged or
        replaced under the reader).
    """
    have = int(array.shape[0])
    if have == rows:
        return array
    if have < rows:
        raise StoreError(f"{array.store_path}: holds {have} samples, its version records {rows}")
    if hasattr(type(array), "with_rows"):  # read without zarr (pipeline.streaming.localstore)
        return array.with_rows(rows)
    # Imported here: a stream of a local store never needs it (see above).
    import zarr
    from zarr.core.array import AsyncArray

    aa = array.async_array
    meta = aa.metadata.update_shape((int(rows), *array.shape[1:]))
    return zarr.Array(AsyncArray(metadata=meta, store_path=aa.store_path, config=aa.config))
