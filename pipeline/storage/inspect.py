"""`pipeline inspect`: what a store holds, how it is chunked and compressed, where it came
from; with ``--plot``, sample windows, feature histograms and label distributions."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import yaml

from pipeline.storage.plot import PlotSample, feature_labels, plot_sample, plot_store, spread_chunks
from pipeline.storage.store import FOLDS, open_store_group, store_root_attrs, stored_bytes
from pipeline.storage.versions import PENDING, pinned_array, versions_of

__all__ = [
    "ArrayReport",
    "PlotSample",
    "StoreReport",
    "feature_labels",
    "fold_lines",
    "format_report",
    "inspect_store",
    "plot_sample",
    "plot_store",
    "spread_chunks",
    "verify_store",
]


@dataclass(frozen=True, slots=True)
class ArrayReport:
    """One array of one split."""

    split: str
    name: str
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[int, ...]
    shards: tuple[int, ...] | None
    codecs: str
    nbytes: int
    stored_bytes: int


@dataclass(frozen=True, slots=True)
class StoreReport:
    """Everything `pipeline inspect` prints."""

    location: str
    complete: bool
    arrays: tuple[ArrayReport, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    #: Written by another tool (no ``pipeline`` attributes): no completeness flag, no
    #: checksums; its arrays are listed wherever they are in the hierarchy.
    foreign: bool = False
    #: The codec line of a store whose attributes do not record one yet (an incomplete
    #: build records it last): read from its arrays, or why it cannot be.
    codec_note: str | None = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    @property
    def stored_bytes(self) -> int:
        return sum(a.stored_bytes for a in self.arrays)


def inspect_store(location: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> StoreReport:
    """Describe a store's newest version without reading its chunks (sizes come from the
    store listing)."""
    from pipeline.storage.store import ATTRS_KEY

    loc = os.fspath(location)
    group = open_store_group(loc, mode="r", storage_options=storage_options)
    if ATTRS_KEY not in group.attrs:
        arrays = tuple(_array_report(*path.rpartition("/")[::2], arr) for path, arr in _every_array(group))
        return StoreReport(location=loc, complete=False, arrays=arrays, foreign=True)
    attrs = store_root_attrs(group)
    newest = versions_of(attrs)[-1]
    arrays = []
    for split, sub in sorted(group.groups(), key=lambda kv: list(attrs.get("splits", {})).index(kv[0])
                             if kv[0] in attrs.get("splits", {}) else 1 << 30):
        if split == FOLDS and "_written" not in sub:  # fold indices: see fold_lines
            continue
        for name, arr in sorted(sub.arrays()):
            if name.startswith("_"):  # bookkeeping (write markers), not data
                continue
            if split in newest.samples and attrs.get("complete"):
                arr = pinned_array(arr, newest.samples[split])  # not an append in progress
            arrays.append(_array_report(split, name, arr))
    note = None if "codec" in attrs else _codec_from_arrays(group)
    return StoreReport(location=loc, complete=bool(attrs.get("complete")), arrays=tuple(arrays), attrs=attrs,
                       codec_note=note)


def describe_compressors(compressors: Any) -> str:
    """A zarr array's compressors in :meth:`pipeline.storage.codecs.CodecSpec.describe`'s
    words (``blosc(lz4, noshuffle, 5)``, ``zstd(3)``, ``none``); another codec by its name."""
    if not compressors:
        return "none"
    (c, *rest) = compressors
    kind = type(c).__name__.removesuffix("Codec").lower()
    if rest:
        return ", ".join(type(x).__name__.removesuffix("Codec").lower() for x in compressors)
    if kind == "blosc":
        value = lambda v: getattr(v, "value", v)  # noqa: E731 - zarr's enums, or plain strings
        return f"blosc({value(c.cname)}, {value(c.shuffle)}, {c.clevel})"
    if kind == "zstd":
        return f"zstd({c.level})"
    return kind


def _codec_from_arrays(group: Any) -> str:
    """The codec line for a pipeline store whose attributes lack ``codec``.

    The writer records the configured codec only when it marks the store complete. It
    creates every array first, and stores windows (arrays of 3 and more dimensions,
    outside ``_shared``) with exactly that codec; smaller arrays get a byte shuffle, and
    the per-step features of virtual windows blosc-zstd (:func:`pipeline.storage.writer
    ._codec_for`), so they do not tell it.
    """
    from pipeline.storage.writer import SHARED

    for split, sub in sorted(group.groups()):
        if split == SHARED:
            continue
        for name, arr in sorted(sub.arrays()):
            if not name.startswith("_") and arr.ndim >= 3:
                return (f"{describe_compressors(arr.compressors)} (read from {split}/{name}: the store records its "
                        f"codec once complete)")
    return ("not recorded yet (the store records its codec once complete, and it holds no array of windows to "
            "read it from: each array's compressor is listed below)")


def _array_report(split: str, name: str, arr: Any) -> ArrayReport:
    codecs = ", ".join(type(c).__name__.removesuffix("Codec").lower() for c in arr.compressors) or "none"
    return ArrayReport(split=split, name=name, shape=tuple(arr.shape), dtype=str(arr.dtype),
                       chunks=tuple(arr.chunks), shards=tuple(arr.shards) if arr.shards else None,
                       codecs=codecs, nbytes=int(arr.nbytes), stored_bytes=stored_bytes(arr))


def _every_array(group: Any) -> list[tuple[str, Any]]:
    """``(path, array)`` of every array under ``group``, at any depth, sorted by path: a
    store another tool wrote keeps its arrays at the root (xarray) or in groups."""
    found = [(path, member) for path, member in group.members(max_depth=None) if hasattr(member, "chunks")]
    return sorted(found, key=lambda item: item[0])


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def left_out_line(left_out: Mapping[str, Any]) -> str | None:
    """The line for the windows a build's splits left out (its ``split_left_out``:
    outside every split's time, across a cut between splits, and per split within an
    embargo of the next), or None."""
    parts = []
    if left_out.get("outside"):
        parts.append(f"{int(left_out['outside']):,} outside every split")
    if left_out.get("across"):
        parts.append(f"{int(left_out['across']):,} across a cut between splits")
    embargo = {k: int(v) for k, v in dict(left_out.get("embargo") or {}).items() if v}
    if embargo:
        parts.append("by the embargo: " + ", ".join(f"{k} {v:,}" for k, v in embargo.items()))
    return f"windows left out: {'; '.join(parts)}" if parts else None


def format_report(report: StoreReport) -> str:
    """Human-readable lines for a :class:`StoreReport`."""
    a = report.attrs
    ratio = report.nbytes / report.stored_bytes if report.stored_bytes else float("nan")
    lines = [f"store: {report.location}"]
    if report.foreign:
        lines.append("written by: another tool (no 'pipeline' attributes): no completeness flag and no checksums "
                     "(--verify decodes every chunk)")
    else:
        lines.append(f"complete: {'yes' if report.complete else 'NO (rerun the same pipeline run to finish it)'}")
    lines.append(f"size: {_mib(report.stored_bytes)} on disk, {_mib(report.nbytes)} uncompressed, ratio {ratio:.2f}x")
    if not report.foreign:
        lines.append(f"codec: {a['codec'] if 'codec' in a else report.codec_note}")
    for r in report.arrays:
        shard = f", shards {r.shards}" if r.shards else ""
        rr = r.nbytes / r.stored_bytes if r.stored_bytes else float("nan")
        where = f"{r.split}/{r.name}" if r.split else r.name
        lines.append(f"  {where}: {r.shape} {r.dtype}, chunks {r.chunks}{shard}, "
                     f"{r.codecs}, {_mib(r.stored_bytes)} ({rr:.2f}x)")
    lines += session_lines(a)
    lines += balance_lines(a)
    lines += fold_lines(a)
    if a.get("fingerprint"):
        lines.append(f"fingerprint: {a['fingerprint']}")
    for key in ("created", "rows_read", "lookback", "split_gap_windows"):
        if key in a:
            lines.append(f"{key}: {a[key]}")
    if "features" in a:
        lines.append(f"features: {', '.join(a['features'])}")
    if "windows" in a:
        lines.append(f"windows: {a['windows']}")
    if "labels" in a:
        lines.append(f"labels: {a['labels']}")
    norm = a.get("normalization") or {}
    if norm:
        per = ", per instrument" if norm.get("per") == "instrument" else ""
        fit = f" (fit on {norm['fit_on']})" if "fit_on" in norm else ""
        lines.append(f"normalization: {norm.get('kind')}{per}{fit}")
    left = left_out_line(a.get("split_left_out") or {})
    if left:
        lines.append(left)
    sources = a.get("sources") or {}
    files = sources.get("files", []) if isinstance(sources, dict) else []
    if files:
        total = sum(f.get("size", 0) for f in files)
        lines.append(f"sources: {len(files)} files, {_mib(total)}")
    if a.get("skipped"):
        lines.append(f"skipped files: {len(a['skipped'])}")
        lines += [f"  {p}: {why}" for p, why in a["skipped"][:10]]
    if a.get("history"):
        lines.append("store versions (pipeline.open(store, version=k)):")
        lines += [f"  {v.describe()}" for v in versions_of(a)]
    if isinstance(a.get(PENDING), dict):
        lines.append(f"append in progress (or interrupted) to version {a[PENDING].get('version')}: readers see "
                     "the versions above; rerun the same pipeline run to finish it")
    if a.get("versions"):
        lines.append("software: " + ", ".join(f"{k} {v}" for k, v in a["versions"].items()))
    if a.get("config"):
        cfg = yaml.safe_load(a["config"]) or {}
        lines.append(f"config sections: {', '.join(cfg)}")
    return "\n".join(lines)


def session_lines(attrs: dict[str, Any], limit: int = 40) -> list[str]:
    """The session table: per instrument and session its time span, rows and windows
    (the first ``limit`` sessions, then a count of the rest)."""
    table = attrs.get("sessions")
    if not isinstance(table, list) or not table:
        return []
    names = [n for n in attrs.get("instruments", []) if n]
    head = f"sessions: {len(table)}" + (f" over {len(names)} instruments ({', '.join(names)})" if names else "")
    lines = [head, "  instrument  session  start                          end                            "
                   "rows        windows"]
    for row in table[:limit]:
        lo, hi = row.get("rows", [0, 0])
        lines.append(f"  {row.get('instrument') or '-':<10}  {row.get('session', 0):>7}  {row.get('start', '-'):<29}  "
                     f"{row.get('end', '-'):<29}  {hi - lo:>10,}  {row.get('windows', 0):>9,}")
    if len(table) > limit:
        lines.append(f"  ... {len(table) - limit} more sessions")
    return lines


def balance_lines(attrs: dict[str, Any]) -> list[str]:
    """Class balance per split (and per horizon) for class-valued labels."""
    balance = attrs.get("class_balance")
    labels = attrs.get("labels") or {}
    if not isinstance(balance, dict) or not balance:
        return []
    classes = labels.get("classes") or []
    horizons = labels.get("horizons") or [labels.get("horizon")]
    lines = ["class balance" + (f" ({', '.join(map(str, classes))})" if classes else "") + ":"]
    for split, counts in balance.items():
        per = counts if counts and isinstance(counts[0], list) else [counts]
        for h, row in zip(horizons, per):
            total = sum(row) or 1
            shares = ", ".join(f"{c:,} ({c / total:.0%})" for c in row)
            lines.append(f"  {split}" + (f" k={h}" if len(per) > 1 else "") + f": {shares}")
    return lines


def fold_lines(attrs: dict[str, Any]) -> list[str]:
    """The folds a store holds, one line each with its sample count (none without folds)."""
    info = attrs.get("folds")
    if not isinstance(info, dict) or not info.get("names"):
        return []
    counts = info.get("counts") or {}
    folds = len({name.split("/")[0] for name in info["names"]})
    lines = [f"folds: {folds}, sample indices into split {info.get('base', '?')!r}"]
    lines += [f"  {name}: {counts[name]:,} samples" if name in counts else f"  {name}" for name in info["names"]]
    return lines


def verify_store(location: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> list[str]:
    """Check every written unit against the CRC32s recorded when it was written.

    A store another tool wrote records no checksums: every chunk of every array is
    decoded instead, which finds damaged chunks (a codec's own checks, a decoded size
    that does not fit) but not bytes that decode to other values.

    Returns
    -------
    list of str
        One line per problem, naming split, array and chunk (``train/x chunk 12:
        checksum mismatch``); empty when every chunk matches.
    """
    from pipeline.storage.checksum import crc32
    from pipeline.storage.store import ATTRS_KEY
    from pipeline.storage.writer import WRITTEN

    loc = os.fspath(location)
    group = open_store_group(loc, mode="r", storage_options=storage_options)
    if ATTRS_KEY not in group.attrs:
        return [line for path, arr in _every_array(group) for line in _decode_problems(path, arr)]
    problems: list[str] = []
    for split, sub in sorted(group.groups()):
        if WRITTEN not in sub:
            continue
        table = sub[WRITTEN][:]
        names = [n for n, _ in sub.arrays() if n != WRITTEN]
        for unit, row in enumerate(table):
            if row[0] != 1:
                problems.append(f"{split}: write unit {unit} was never completed")
                continue
            problems += _unit_problems(sub, split, names, unit, [int(v) for v in row[1:]], crc32)
    return problems


def _unit_problems(sub: Any, split: str, names: list[str], unit: int, recorded: list[int], crc32: Any) -> list[str]:
    """What is wrong with one write unit of a split's arrays, against its recorded CRC32s.

    A row of ``_written`` holds the CRCs in the order the arrays were written, which
    zarr does not keep (it lists them alphabetically). So the unit's CRCs, recomputed,
    must be the row's as a multiset: each array's among them, and no CRC more often than
    recorded. Membership alone would take one array's chunk copied over another's (two
    arrays of the unit then holding the same bytes) for intact.
    """
    problems, computed = [], {}
    for name in names:
        arr = sub[name]
        rows = arr.shards[0] if arr.shards else arr.chunks[0]
        lo = unit * rows
        try:
            computed[name] = (crc32(np.ascontiguousarray(arr[lo : lo + rows]).data), lo // arr.chunks[0])
        except Exception as exc:  # noqa: BLE001 - any decode failure is corruption
            problems.append(f"{split}/{name} chunk {lo // arr.chunks[0]}: cannot decode ({exc})")
    want, have = Counter(recorded), Counter(crc for crc, _ in computed.values())
    for name, (crc, chunk) in computed.items():
        if crc not in want:
            problems.append(f"{split}/{name} chunk {chunk}: checksum mismatch")
        elif have[crc] > want[crc]:
            same = [f"{split}/{n}" for n, (c, _) in computed.items() if c == crc and n != name]
            problems.append(f"{split}/{name} chunk {chunk}: checksum mismatch (it holds the same bytes as "
                            f"{', '.join(same)}, which the unit's checksums do not)")
    return problems


def _decode_problems(path: str, arr: Any) -> list[str]:
    """Chunks of ``arr`` (at ``path``) that do not decode, one line each, the chunk named
    by its grid position; read a row of chunks at a time."""
    import itertools

    grid = [range(-(-int(n) // int(c))) for n, c in zip(arr.shape, arr.chunks)]
    problems = []
    for position in itertools.product(*grid):
        box = tuple(slice(i * c, (i + 1) * c) for i, c in zip(position, arr.chunks))
        try:
            arr[box]
        except Exception as exc:  # noqa: BLE001 - any decode failure is corruption
            where = str(position[0]) if len(position) == 1 else str(position)
            problems.append(f"{path} chunk {where}: cannot decode ({exc})")
    return problems
