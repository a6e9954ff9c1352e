"""`pipeline inspect`: what a store holds, how it is chunked and compressed, where it came
from; with ``--plot``, sample windows, feature histograms and label distributions."""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import yaml

from pipeline.storage.plot import PlotSample, feature_labels, plot_sample, plot_store, spread_chunks
from pipeline.storage.store import (FOLDS, is_remote, is_zip, open_store_group, store_root_attrs, stored_bytes,
                                    zip_staging)
from pipeline.storage.versions import PENDING, Version, pinned_array, versions_of

__all__ = [
    "ArrayReport",
    "PlotSample",
    "StoreReport",
    "VerifyReport",
    "feature_labels",
    "fold_lines",
    "format_report",
    "inspect_store",
    "plot_sample",
    "plot_store",
    "spread_chunks",
    "verify_store",
    "written_samples",
]

#: Write units (a chunk of each array, or a chunk of another tool's array) that
#: :func:`verify_store` reads at once. Checked one after the other, a remote store's
#: verify paid a round trip per object, several times as long as fetching them all
#: concurrently; as many as a stream's cache keeps requests in flight
#: (:data:`pipeline.streaming.cache.FETCH_REQUESTS`). Each holds one unit's bytes.
VERIFY_UNITS = 16

#: Lines of a report in the making: lines known now, or a unit's check under way.
_Parts = list["list[str] | Future[list[str]]"]


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
    #: Uncompressed bytes of the write units on disk, which ``stored_bytes`` measures:
    #: ``nbytes`` once every unit is written; less in a store still being built, and
    #: more while an append writes past the version readers see. None: ``nbytes``.
    written_nbytes: int | None = None

    @property
    def held_nbytes(self) -> int:
        return self.nbytes if self.written_nbytes is None else self.written_nbytes


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
    #: The folder a ``.zarr.zip`` build writes before packing (``location`` does not
    #: exist yet): the store described is there, interrupted or still being written.
    staging: str | None = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays)

    @property
    def held_nbytes(self) -> int:
        """Uncompressed bytes of the write units on disk (what the ratio is over)."""
        return sum(a.held_nbytes for a in self.arrays)

    @property
    def stored_bytes(self) -> int:
        return sum(a.stored_bytes for a in self.arrays)


def inspect_store(location: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> StoreReport:
    """Describe a store's newest version without reading its chunks (sizes come from the
    store listing, what is written from the write markers).

    A ``.zarr.zip`` path that does not exist yet, beside the folder its build writes
    (:func:`pipeline.storage.store.zip_staging`), is described from that folder: a build
    interrupted or still running, not a missing store.
    """
    from pipeline.storage.store import ATTRS_KEY
    from pipeline.storage.units import WRITTEN, written_units

    loc = os.fspath(location)
    where, staging = _located(loc)
    group = open_store_group(where, mode="r", storage_options=storage_options)
    if ATTRS_KEY not in group.attrs:
        arrays = tuple(_array_report(*path.rpartition("/")[::2], arr) for path, arr in _every_array(group))
        return StoreReport(location=loc, complete=False, arrays=arrays, foreign=True)
    attrs = store_root_attrs(group)
    newest = versions_of(attrs)[-1] if attrs.get("complete") else None
    arrays = []
    for split, sub in sorted(group.groups(), key=lambda kv: list(attrs.get("splits", {})).index(kv[0])
                             if kv[0] in attrs.get("splits", {}) else 1 << 30):
        if split == FOLDS and WRITTEN not in sub:  # fold indices: see fold_lines
            continue
        done = written_units(group, split) if WRITTEN in sub else None
        for name, arr in sorted(sub.arrays()):
            if name.startswith("_"):  # bookkeeping (write markers), not data
                continue
            committed = _committed_rows(newest, split, int(arr.shape[0]))
            held = None
            if done is not None:
                unit = _unit_rows(arr)
                per_sample = arr.nbytes // arr.shape[0] if arr.shape[0] else 0
                held = written_samples(done, unit, int(arr.shape[0]), committed) * per_sample
            if newest is not None and committed < arr.shape[0]:
                arr = pinned_array(arr, committed)  # what readers see, not an append in progress
            arrays.append(_array_report(split, name, arr, held))
    note = None if "codec" in attrs else _codec_from_arrays(group)
    return StoreReport(location=loc, complete=bool(attrs.get("complete")), arrays=tuple(arrays), attrs=attrs,
                       codec_note=note, staging=staging)


def _located(location: str) -> tuple[str, str | None]:
    """Where to read the store at ``location``, and the build folder it is read from
    when that is not ``location``: a ``.zarr.zip`` is written as a folder beside it and
    packed last, so before then only the folder exists."""
    path = location[len("file://"):] if location.startswith("file://") else location
    if is_zip(path) and not is_remote(path) and not os.path.exists(path) and os.path.isdir(zip_staging(path)):
        return zip_staging(path), zip_staging(path)
    return location, None


def _unit_rows(arr: Any) -> int:
    """Samples per write unit of ``arr``: a shard when sharded, else a chunk."""
    return int((arr.shards or arr.chunks)[0])


def _committed_rows(newest: Version | None, split: str, rows: int) -> int:
    """Samples of ``split`` in the version readers see (``newest``; None: a build not
    finished, no version yet) of an array holding ``rows``: an append in progress
    writes past them."""
    from pipeline.storage.units import SHARED

    if newest is None:
        return 0
    if split == SHARED:
        return rows if newest.shared_rows is None else min(rows, newest.shared_rows)
    return min(rows, newest.samples.get(split, rows))


def written_samples(done: np.ndarray, unit: int, rows: int, committed: int) -> int:
    """Samples on disk in the write units of an array of ``rows`` samples.

    Parameters
    ----------
    done
        Per write unit, whether its marker is set (``_written``).
    unit
        Samples per write unit.
    rows
        The array's length now (an append in progress has grown it).
    committed
        Samples of the version readers see (0 before a build finishes): their units are
        on disk even when unmarked, since an append clears the marker of the partly
        filled last unit before it rewrites that unit whole.

    Returns
    -------
    int
        Samples a marked unit holds of ``rows``, plus those an unmarked unit holds of
        ``committed``.
    """
    starts = np.arange(len(done), dtype=np.int64) * int(unit)
    now = np.clip(int(rows) - starts, 0, unit)
    then = np.clip(int(committed) - starts, 0, unit)
    return int(np.where(np.asarray(done, dtype=bool), now, then).sum())


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
    from pipeline.storage.units import SHARED

    for split, sub in sorted(group.groups()):
        if split == SHARED:
            continue
        for name, arr in sorted(sub.arrays()):
            if not name.startswith("_") and arr.ndim >= 3:
                return (f"{describe_compressors(arr.compressors)} (read from {split}/{name}: the store records its "
                        f"codec once complete)")
    return ("not recorded yet (the store records its codec once complete, and it holds no array of windows to "
            "read it from: each array's compressor is listed below)")


def _codec_name(codec: Any) -> str:
    return str(getattr(codec, "codec_id", None) or type(codec).__name__.removesuffix("Codec").lower())


def codec_chain(arr: Any) -> str:
    """How an array is stored, in order: its filters (``transpose``, ``fixedscaleoffset``),
    a serializer other than little-endian bytes (``bytes(big)``, a sharding one), then
    its compressors (``none`` when it has none)."""
    parts = [_codec_name(f) for f in getattr(arr, "filters", None) or ()]
    serializer = getattr(arr, "serializer", None)
    if serializer is not None:
        endian = getattr(getattr(serializer, "endian", None), "value", getattr(serializer, "endian", None))
        kind = _codec_name(serializer)
        if kind != "bytes":
            parts.append(kind)
        elif endian not in (None, "little"):
            parts.append(f"bytes({endian})")
    parts += [_codec_name(c) for c in arr.compressors or ()] or ["none"]
    return ", ".join(parts)


def _array_report(split: str, name: str, arr: Any, held: int | None = None) -> ArrayReport:
    codecs = codec_chain(arr)
    return ArrayReport(split=split, name=name, shape=tuple(arr.shape), dtype=str(arr.dtype),
                       chunks=tuple(arr.chunks), shards=tuple(arr.shards) if arr.shards else None,
                       codecs=codecs, nbytes=int(arr.nbytes), stored_bytes=stored_bytes(arr),
                       written_nbytes=None if held is None or held == arr.nbytes else int(held))


def _every_array(group: Any) -> list[tuple[str, Any]]:
    """``(path, array)`` of every array under ``group``, at any depth, sorted by path: a
    store another tool wrote keeps its arrays at the root (xarray) or in groups."""
    found = [(path, member) for path, member in group.members(max_depth=None) if hasattr(member, "chunks")]
    return sorted(found, key=lambda item: item[0])


def _mib(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _ratio(held: int, stored: int) -> str:
    """A compression ratio, or why it is not known: nothing written yet."""
    return f"{held / stored:.2f}x" if held and stored else "not known yet (nothing written)"


def size_line(report: StoreReport) -> str:
    """The ``size:`` line: bytes on disk against the uncompressed bytes of the same
    write units. While a build runs those are fewer than its arrays will hold, and while
    an append runs more than the version readers see: both are said."""
    stored, whole, held = report.stored_bytes, report.nbytes, report.held_nbytes
    ratio = _ratio(held, stored)
    if held == whole:
        return f"size: {_mib(stored)} on disk, {_mib(whole)} uncompressed, ratio {ratio}"
    if not report.complete:
        return (f"size: {_mib(stored)} on disk so far, holding {_mib(held)} uncompressed (ratio {ratio}); "
                f"{_mib(whole)} uncompressed once complete")
    return (f"size: {_mib(stored)} on disk, holding {_mib(held)} uncompressed (ratio {ratio}), of which readers see "
            f"{_mib(whole)}: the rest is an unfinished append's")


def complete_line(report: StoreReport) -> str:
    """The ``complete:`` line of a store pipeline wrote."""
    if report.complete:
        return "complete: yes"
    if report.staging:
        return (f"complete: NO: the build was interrupted (or is still running) in {report.staging}, which is packed "
                f"into {report.location} once complete; rerun the same pipeline run to finish it")
    return "complete: NO (rerun the same pipeline run to finish it)"


def left_out_line(left_out: Mapping[str, Any], nan: Mapping[str, Any] | None = None) -> str | None:
    """The line for the windows a build left out (its ``split_left_out``: outside every
    split's time, across a cut between splits, and per split within an embargo of the
    next; and per split its ``nan_windows_dropped``: windows holding NaN, or whose label
    reads an empty price), or None."""
    parts = []
    dropped = {k: int(v) for k, v in dict(nan or {}).items() if v}
    if dropped:
        parts.append("holding NaN or a label on an empty price: " + ", ".join(f"{k} {v:,}" for k, v in dropped.items()))
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
    lines = [f"store: {report.location}"]
    if report.foreign:
        lines.append("written by: another tool (no 'pipeline' attributes): no completeness flag and no checksums "
                     "(--verify decodes every chunk)")
    else:
        lines.append(complete_line(report))
    lines.append(size_line(report))
    if not report.foreign:
        lines.append(f"codec: {a['codec'] if 'codec' in a else report.codec_note}")
    for r in report.arrays:
        shard = f", shards {r.shards}" if r.shards else ""
        rr = f"{r.held_nbytes / r.stored_bytes:.2f}x" if r.held_nbytes and r.stored_bytes else "nothing written"
        where = f"{r.split}/{r.name}" if r.split else r.name
        lines.append(f"  {where}: {r.shape} {r.dtype}, chunks {r.chunks}{shard}, "
                     f"{r.codecs}, {_mib(r.stored_bytes)} ({rr})")
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
    left = left_out_line(a.get("split_left_out") or {}, a.get("nan_windows_dropped"))
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


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What :func:`verify_store` found.

    Iterating it, ``len`` and truth look at ``problems`` only: units not written yet are
    no damage, so ``if report:`` means "something is damaged".

    Attributes
    ----------
    problems
        Damage, one line each naming split, array and chunk (``train/x chunk 12:
        checksum mismatch``): a chunk that does not decode or does not match the CRC32
        recorded when it was written, a lost marker of a committed unit.
    pending
        Units not written yet, one line for the store (``incomplete: 3 of 8 write units
        not written yet ...`` for a build; the same for an append, whose store readers
        see whole at its previous version): no damage, a rerun of the same pipeline run
        writes them.
    checked
        Write units checked against their checksums (chunks decoded, for a store another
        tool wrote).
    version
        The newest version readers see, checked with every older one (None: a build
        not finished, or a store another tool wrote).
    foreign
        A store another tool wrote: no checksums, every chunk decoded instead.
    """

    problems: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    checked: int = 0
    version: int | None = None
    foreign: bool = False

    def __iter__(self) -> Iterator[str]:
        return iter(self.problems)

    def __len__(self) -> int:
        return len(self.problems)

    def __bool__(self) -> bool:
        return bool(self.problems)

    @property
    def summary(self) -> str:
        """The closing line of ``pipeline inspect --verify``, after ``verify: ``."""
        if self.problems:
            return f"{len(self.problems)} problem(s)"
        if self.foreign:
            return "no checksums recorded (a store pipeline did not write): every chunk decodes"
        if not self.pending:
            return "every chunk matches its checksum"
        if self.version is None:
            return (f"every written chunk matches its checksum ({self.checked} write units); the store is "
                    "incomplete, not damaged")
        return (f"every chunk readers see (version {self.version} and older) matches its checksum, as do any the "
                "unfinished append has written")


def verify_store(location: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> VerifyReport:
    """Check every written unit against the CRC32s recorded when it was written.

    What readers see is checked whole: every unit of the newest committed version,
    with the last samples of each older one against their own checksums. Units an
    append in progress (or interrupted) has written are checked too, since a rerun
    keeps them; those a build or an append has not written yet are counted in
    ``pending``, not reported as damage. A ``.zarr.zip`` not packed yet is checked in
    the folder its build writes.

    A store another tool wrote records no checksums: every chunk of every array is
    decoded instead, which finds damaged chunks (a codec's own checks, a decoded size
    that does not fit) but not bytes that decode to other values.

    Returns
    -------
    VerifyReport
        ``problems`` (damage, one line each: ``train/x chunk 12: checksum mismatch``;
        none when every chunk matches) apart from ``pending`` (units not written yet).
    """
    from pipeline.storage.checksum import crc32
    from pipeline.storage.store import ATTRS_KEY

    loc, staging = _located(os.fspath(location))
    group = open_store_group(loc, mode="r", storage_options=storage_options)
    # Units are checked on a pool, their lines put back in the order they were asked
    # for: the report is the one a check unit after unit gives.
    with ThreadPoolExecutor(VERIFY_UNITS, thread_name_prefix="pipeline-verify") as pool:
        try:
            if ATTRS_KEY not in group.attrs:
                found = [(path, arr) for path, arr in _every_array(group)]
                problems = _in_order([part for path, arr in found for part in _decode_problems(path, arr, pool.submit)])
                chunks = sum(int(np.prod([-(-int(n) // int(c)) for n, c in zip(a.shape, a.chunks)])) for _, a in found)
                return VerifyReport(problems=tuple(problems), checked=chunks, foreign=True)
            return _verify_group(group, staging, crc32, pool.submit)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)  # no unit read on after a failure
            raise


def _verify_group(group: Any, staging: str | None, crc32: Any, submit: Callable[..., Future]) -> VerifyReport:
    """:func:`verify_store` of a store pipeline wrote (``group``), its units checked
    through ``submit`` (a pool's)."""
    from pipeline.storage.units import WRITTEN

    attrs = store_root_attrs(group)
    versions = versions_of(attrs) if attrs.get("complete") else []
    newest = versions[-1] if versions else None
    parts: _Parts = []
    unwritten: dict[str, tuple[int, int]] = {}  # per split: units not written, of those to write
    checked = 0
    # Every split's markers are read at once: each table is an object per unit.
    splits = [(split, sub, submit(_marker_rows, sub[WRITTEN])) for split, sub in sorted(group.groups())
              if WRITTEN in sub]
    for split, sub, marked in splits:
        arrays = {n: a for n, a in sub.arrays() if n != WRITTEN}
        if not arrays:
            continue
        rows, torn = marked.result()
        probe = next(iter(arrays.values()))
        unit, total = _unit_rows(probe), int(probe.shape[0])
        committed = _committed_rows(newest, split, total)
        for version in reversed(versions):  # the newest first: what a reader opens by default
            found, n = _version_problems(split, arrays, version, rows, torn, unit, newest=version is newest,
                                         crc32=crc32, submit=submit)
            parts += found
            checked += n
        if total > committed:  # a build not finished, or an append past the version readers see
            todo = range(committed // unit, -(-total // unit))
            note = "" if newest is None else f" (written by the unfinished append to version {newest.number + 1})"
            done = [u for u in todo if u < len(rows) and u not in torn and rows[u][0] == 1]
            for u in done:
                parts.append(submit(_unit_problems, arrays, split, u, [int(v) for v in rows[u][1:]], crc32, note))
            checked += len(done)
            unwritten[split] = (len(todo) - len(done), len(todo))
    pending = _pending_lines(unwritten, newest, attrs, staging)
    return VerifyReport(problems=tuple(_in_order(parts)), pending=pending, checked=checked,
                        version=None if newest is None else newest.number)


def _in_order(parts: _Parts) -> list[str]:
    """The lines of ``parts`` in their order, each unit's check waited for in turn."""
    return [line for part in parts for line in (part.result() if isinstance(part, Future) else part)]


def _marker_rows(table: Any) -> tuple[np.ndarray, frozenset[int]]:
    """A split's ``_written`` rows, and the units whose row cannot be read (a marker
    file torn by a crash mid-write: not written, unless a version says otherwise)."""
    try:
        return np.asarray(table[:]), frozenset()
    except Exception:  # noqa: BLE001 - read the rows one by one, as writer.written_units does
        rows, torn = np.zeros(table.shape, dtype=np.uint64), set()
        for u in range(table.shape[0]):
            try:
                rows[u] = table[u]
            except Exception:  # noqa: BLE001
                torn.add(u)
        return rows, frozenset(torn)


def _version_problems(split: str, arrays: Mapping[str, Any], version: Version, rows: np.ndarray,
                      torn: frozenset[int], unit: int, *, newest: bool, crc32: Any,
                      submit: Callable[..., Future]) -> tuple[_Parts, int]:
    """What is wrong with ``split`` as a reader of ``version`` sees it, and the units
    checked: every unit for the newest version; for an older one only its partly filled
    last unit, against the checksum it recorded (a later append rewrote that unit with
    more samples; the units before it are the newest version's). Each unit's check is
    started through ``submit``, in unit order: see :func:`_in_order`."""
    from pipeline.storage.units import SHARED

    n = (version.shared_rows if split == SHARED else version.samples.get(split))
    n = int(next(iter(arrays.values())).shape[0]) if n is None else int(n)
    units = -(-n // unit)
    tail = version.tails.get(split)
    todo = range(units) if newest else [units - 1] if tail is not None and units else []
    if not todo:
        return [], 0
    try:
        seen = {name: pinned_array(a, n) for name, a in arrays.items()}
    except Exception as exc:  # noqa: BLE001 - pinned_array's StoreError: fewer samples than recorded
        return [[f"{split}: version {version.number} records {n} samples ({exc})"]], 0
    note = "" if newest else f" (the last samples of version {version.number})"
    problems: _Parts = []
    for u in todo:
        row = tail if tail is not None and u == units - 1 else None
        if row is None:
            if u >= len(rows) or u in torn or rows[u][0] != 1:
                # A store recorded before versions kept their last unit's checksum, while
                # an append rewrites that unit: nothing to check it against until then.
                if not (u == units - 1 and n % unit and len(rows) > units):
                    problems.append([f"{split}: write unit {u} of version {version.number} has lost its marker "
                                     "(its checksums)"])
                continue
            row = [int(v) for v in rows[u]]
        problems.append(submit(_unit_problems, seen, split, u, [int(v) for v in row[1:]], crc32, note))
    return problems, len(todo)


def _pending_lines(unwritten: Mapping[str, tuple[int, int]], newest: Version | None, attrs: Mapping[str, Any],
                   staging: str | None) -> tuple[str, ...]:
    """The line saying what a build or an append still has to write (none when
    nothing: a store whose newest version is committed and no append under way)."""
    pending = attrs.get(PENDING)
    if newest is not None and not unwritten and not isinstance(pending, Mapping):
        return ()
    new = "" if newest is None else "new "
    missing = sum(m for m, _ in unwritten.values())
    total = sum(t for _, t in unwritten.values())
    per = ", ".join(f"{split} {m} of {t}" for split, (m, t) in unwritten.items() if m)
    counted = (f"{missing} of {total} {new}write units not written yet ({per})" if missing else
               f"every {new}write unit written ({total}), not committed yet" if total else
               f"no {new}write unit begun yet")
    if newest is None:
        where = f" in {staging}" if staging else ""
        return (f"incomplete{where}: {counted}; rerun the same pipeline run to resume",)
    to = pending.get("version") if isinstance(pending, Mapping) else newest.number + 1
    return (f"append to version {to} in progress (or interrupted): {counted}; readers see version "
            f"{newest.number}; rerun the same pipeline run to finish it",)


def _unit_problems(arrays: Mapping[str, Any], split: str, unit: int, recorded: list[int], crc32: Any,
                   note: str = "") -> list[str]:
    """What is wrong with one write unit of a split's arrays, against its recorded CRC32s.

    A row of ``_written`` holds the CRCs in the order the arrays were written, which
    zarr does not keep (it lists them alphabetically). So the unit's CRCs, recomputed,
    must be the row's as a multiset: each array's among them, and no CRC more often than
    recorded. Membership alone would take one array's chunk copied over another's (two
    arrays of the unit then holding the same bytes) for intact. ``arrays`` may be
    pinned to a version: a unit then holds that version's samples only, as its CRC does.
    """
    problems, computed = [], {}
    for name in sorted(arrays):
        arr = arrays[name]
        rows = _unit_rows(arr)
        lo = unit * rows
        try:
            computed[name] = (crc32(np.ascontiguousarray(arr[lo : lo + rows]).data), lo // arr.chunks[0])
        except Exception as exc:  # noqa: BLE001 - any decode failure is corruption
            problems.append(f"{split}/{name} chunk {lo // arr.chunks[0]}: cannot decode ({exc}){note}")
    want, have = Counter(recorded), Counter(crc for crc, _ in computed.values())
    for name, (crc, chunk) in computed.items():
        if crc not in want:
            gone = " (its chunk file is missing: the store was copied or synced in part)" if _absent(
                arrays[name], chunk) else ""
            problems.append(f"{split}/{name} chunk {chunk}: checksum mismatch{gone}{note}")
        elif have[crc] > want[crc]:
            same = [f"{split}/{n}" for n, (c, _) in computed.items() if c == crc and n != name]
            problems.append(f"{split}/{name} chunk {chunk}: checksum mismatch (it holds the same bytes as "
                            f"{', '.join(same)}, which the unit's checksums do not){note}")
    return problems


def _absent(arr: Any, chunk: int) -> bool:
    """Whether chunk ``chunk`` (along the samples) of zarr array ``arr`` has no object in
    its store (zarr reads such a chunk as the fill value); False where it cannot tell
    (a sharded or pinned array)."""
    try:
        from zarr.core.sync import sync

        key = arr.metadata.encode_chunk_key((chunk,) + (0,) * (arr.ndim - 1))
        return arr.shards is None and not sync(arr.store.exists(f"{arr.path}/{key}"))
    except Exception:  # noqa: BLE001 - a wrapper without a store or metadata: cannot tell
        return False


def _decode_problems(path: str, arr: Any, submit: Callable[..., Future]) -> _Parts:
    """Chunks of ``arr`` (at ``path``) that do not decode, one line each (in the order
    of their grid positions, by which they are named): each chunk's read started
    through ``submit``."""
    import itertools

    grid = [range(-(-int(n) // int(c))) for n, c in zip(arr.shape, arr.chunks)]
    return [submit(_chunk_decode_problems, path, arr, position) for position in itertools.product(*grid)]


def _chunk_decode_problems(path: str, arr: Any, position: Sequence[int]) -> list[str]:
    """The line for the chunk of ``arr`` at grid ``position`` if it does not decode."""
    box = tuple(slice(i * c, (i + 1) * c) for i, c in zip(position, arr.chunks))
    try:
        arr[box]
    except Exception as exc:  # noqa: BLE001 - any decode failure is corruption
        where = str(position[0]) if len(position) == 1 else str(position)
        return [f"{path} chunk {where}: cannot decode ({exc})"]
    return []
