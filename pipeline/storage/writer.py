"""Writing splits of aligned arrays into one zarr 3 store: aligned, resumable, checked.

Rules this module enforces (DESIGN.md, "Rules that protect data"):

- every dask array is rechunked to blocks of whole write units (a unit is a chunk, or a
  shard when sharded; a block up to :data:`~pipeline.storage.layout.TASK_BYTES`) before
  writing, one task per block, so no two tasks ever write the same zarr chunk;
- a write unit is recorded as done (a small marker holding the CRC32 of each array's
  decoded block) only after all its arrays are written; a unit's chunk files are
  written one by one (zarr's local store writes each through a temporary file and a
  rename), so an interrupted write leaves some of them, and a unit without its marker is
  rewritten on resume;
- the root's ``complete`` flag is set only after every marker is present and the fold
  index arrays (``folds/<name>``, rewritten whole by a resumed write) are written;
  readers refuse an incomplete store;
- time splits leave a gap between them that no window, lookback or label crosses:
  given, or derived from the windows' geometry; a gap it cannot know is refused, never
  taken as 0;
- a store written from a different fingerprint (config hash) is refused before anything
  is written.
"""

from __future__ import annotations

import contextvars
import datetime as _dt
import functools
import json
import os
import platform
import re
import shutil
import uuid
import zipfile
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Literal, Mapping, Sequence

import dask.array as da
import fsspec
import numpy as np
import zarr
from zarr.codecs import TransposeCodec

from pipeline.errors import StoreConflictError, StoreError
from pipeline.progress import compute
from pipeline.storage import inflight
from pipeline.storage.arraysource import as_blocks
from pipeline.storage.codecs import CodecSpec
from pipeline.storage.lock import write_lock
from pipeline.storage.layout import (
    DEFAULT_CHUNK_BYTES,
    last_of_blocks,
    time_split_ranges,
    unit_chunks,
    task_block,
    unit_samples,
)
from pipeline.storage.replace import make_way
from pipeline.storage.store import (
    ATTRS_KEY,
    FOLDS,
    is_remote,
    is_zip,
    open_store_group,
    store_root_attrs,
    zip_staging,
)
from pipeline.storage.units import SHARED, WRITTEN, write_blocks, write_units, written_units
from pipeline.storage.versions import HISTORY, record

__all__ = ["SHARED", "WRITTEN", "split_at_times", "split_gap_from_arrays", "write", "written_units"]

FORMAT_VERSION = 1

#: Bytes per write task of the shared features: they are compressed with blosc-zstd
#: (:func:`_codec_for`), about ten times the CPU per byte of the windows' lz4, so the
#: windows' task size (:data:`~pipeline.storage.layout.TASK_BYTES`) made a few tasks
#: that ran on one core each after everything else (benchmarks/README.md).
SHARED_TASK_BYTES = 4 * 2**20
#: Sample indices per chunk of a fold's index array (8 MiB of int64).
FOLD_CHUNK = 2**20
#: One part of a fold's name (``fold0/train`` has two): a zarr node name of its own.
_FOLD_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


#: Distributions whose versions a store records: what computed and encoded it, and the
#: readers that decode raw tables (pandas, pyarrow), whose parsing a new release can
#: change. Read from the installed metadata: nothing is imported for it, and one not
#: installed is left out.
VERSIONED = ("pipeline", "dask", "distributed", "zarr", "numcodecs", "numpy", "pandas", "pyarrow")


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def _sample_bytes(arrs: Mapping[str, Any]) -> int:
    """Bytes of one sample of ``x`` (or the first array): what sizes a split's chunks."""
    probe = arrs.get("x", next(iter(arrs.values())))
    return int(np.prod(probe.shape[1:], dtype=np.int64)) * np.dtype(probe.dtype).itemsize


@dataclass(frozen=True)
class _Layout:
    """The options that size write units and write tasks (see :func:`write`)."""

    chunk_samples: int | None
    target_chunk_bytes: int
    shard_chunks: int | None
    shared_chunk_rows: int | None

    def unit(self, split: str, arrs: Mapping[str, Any], *, sharded: bool = True) -> int:
        """Samples per write unit of a split (per chunk, with ``sharded=False``)."""
        explicit = self.shared_chunk_rows if split == SHARED else self.chunk_samples
        shards = self.shard_chunks if sharded and split != SHARED else None
        return unit_samples(_sample_bytes(arrs), explicit, shards, self.target_chunk_bytes)

    def block(self, split: str, arrs: Mapping[str, Any]) -> int:
        """Samples one write task writes, in whole units (:func:`task_block`)."""
        return task_block(self.unit(split, arrs), _sample_bytes(arrs),
                          SHARED_TASK_BYTES if split == SHARED else None)


def split_gap_from_arrays(arrays: Mapping[str, Any], horizon: int | None = None) -> int | None:
    """Samples to leave between time splits so that no two splits share a step, from
    the window geometry the arrays carry, or None when none carries it.

    :func:`pipeline.windows` sets ``x.attrs["windows"] = {"size", "stride", "scales",
    "halo"}``: windows ``i < j`` share a step when ``(j - i) * stride <= halo``, so
    ``halo // stride`` windows are left out, plus the label horizon and the features'
    lookback when the attributes give them (``"horizon"``, ``"lookback"``, in the
    geometry or beside it), see
    :func:`~pipeline.features.geometry.split_gap_windows`. Attributes are read from the
    arrays as passed: dask drops them on slicing and rechunking.
    """
    from pipeline.features.geometry import split_gap_windows

    gaps = []
    reach: dict[str, int | None] = {"horizon": horizon, "lookback": 0}
    for name, a in arrays.items():
        attrs = getattr(a, "attrs", None)
        if not isinstance(attrs, Mapping):
            continue
        geometry = attrs.get("windows")
        geometry = geometry if isinstance(geometry, Mapping) else {}
        for key in reach:
            value = geometry.get(key, attrs.get(key))
            if value is not None and not (key == "horizon" and horizon is not None):
                reach[key] = max(reach[key] or 0, int(value))
        if geometry:
            try:
                gaps.append((int(geometry["size"]), tuple(int(v) for v in geometry["scales"]),
                             int(geometry["stride"])))
            except (KeyError, TypeError, ValueError) as exc:
                raise StoreError(f"write: array {name!r}: attrs['windows'] = {dict(geometry)} lacks a window "
                                 f"geometry (expected integer 'size', 'stride' and 'scales'; {exc!r})") from None
    if not gaps:
        return None
    if reach["horizon"] is None:
        overlap = max(split_gap_windows(size, scales, stride, 0, 0) for size, scales, stride in gaps)
        raise StoreError(
            f"write: the windows' geometry gives their overlap ({overlap} windows between splits), but not how "
            "many steps the labels read after a window's last step; pass horizon= (0 when a label reads "
            "nothing after its window) or gap=")
    return max(split_gap_windows(size, scales, stride, int(reach["horizon"]), int(reach["lookback"] or 0))
               for size, scales, stride in gaps)


def content_fingerprint(groups: Mapping[str, Mapping[str, da.Array]], *options: Any) -> str:
    """The identity of an API write that names no fingerprint: its arrays' dask names
    (which hash an in-memory array's bytes, and a graph's inputs and operations) with
    the options that shape the store.

    Before, such writes all had the fingerprint ``None``, so writing new arrays to the
    path of a complete store returned at once and kept the old data, silently. Now the
    same write again keeps (or resumes) the store, and different arrays are refused
    unless ``overwrite``. What dask cannot see is not in it: raw files changed in place
    under the same names and the same graph.
    """
    from dask.base import tokenize

    names = {split: {name: (a.name, a.shape, a.dtype.str) for name, a in sorted(arrs.items())}
             for split, arrs in sorted(groups.items())}
    return "write-" + tokenize(names, *options)


def _check_splits(splits: Mapping[str, float] | None) -> None:
    """Refuse split fractions the arithmetic cannot take, before anything else."""
    from pipeline.errors import WindowError
    from pipeline.features.geometry import check_fractions

    if splits is None:
        return
    if not isinstance(splits, Mapping) or not splits:
        raise StoreError(f"write: splits must map split names to fractions, e.g. {{'train': 0.8, 'val': 0.2}}; "
                         f"got {splits!r}")
    try:
        check_fractions(splits)
    except WindowError as exc:
        raise StoreError(f"write: {exc}") from None


def _split_gap(arrays: Mapping[str, Any], splits: Mapping[str, float] | None, split_by: str,
               gap: int | None, horizon: int | None = None) -> int | None:
    """The gap in samples between time splits: ``gap`` if given, else from the arrays'
    window geometry; None when nothing is split by time.

    Raises
    ------
    StoreError
        A random split of windows that share steps (see :func:`_check_random_split`),
        or a gap that cannot be known.
    """
    if splits is None or (arrays and isinstance(next(iter(arrays.values())), Mapping)):
        return None
    if split_by == "random":
        _check_random_split(arrays, horizon)
        return None
    if gap is not None:
        if isinstance(gap, bool) or not isinstance(gap, (int, np.integer)) or gap < 0:
            raise StoreError(f"write: gap must be a number of samples, 0 or more, got {gap!r}")
        return int(gap)
    derived = split_gap_from_arrays(arrays, horizon)
    if derived is None:
        raise StoreError(
            f"write: splits={dict(splits)} split by time, but the gap between splits cannot be known: no array "
            "carries window geometry (x.attrs['windows'], set by pipeline.windows; dask drops attrs when an array is "
            "sliced, rechunked or computed on: copy them back, w2.attrs = w.attrs); pass gap= (samples left out "
            "between splits; gap=0 when samples share no time step)"
        )
    return derived


def _check_random_split(arrays: Mapping[str, Any], horizon: int | None) -> None:
    """Refuse a random split of windows that share steps, before anything is written.

    Windows ``i`` and ``i + d`` of one session share a step (through their own steps,
    the features' lookback or the label) for every ``d`` up to
    :func:`split_gap_from_arrays`' gap: shuffled into different splits, a validation
    window would hold what a training window holds (with ``stride=1`` nearly every
    validation window does), against the rule that splits share no time step. Samples
    that carry no window geometry (images, independent records) are not windows and
    split at random freely.

    Raises
    ------
    StoreError
        Naming the geometry, how many neighbours each window shares steps with, and
        what to do instead.
    """
    name, geometry = _window_geometry(arrays)
    if not geometry:
        return
    carried = [a.attrs for a in arrays.values() if isinstance(getattr(a, "attrs", None), Mapping)]
    if horizon is None and not any("horizon" in c or "horizon" in (c.get("windows") or {}) for c in carried):
        raise StoreError(
            f"write: split_by='random' over the windows of array {name!r} (attrs['windows']), but not how many steps "
            "a label reads after a window's last step: a label can share steps with the next windows, which a "
            "random split puts in another split; pass horizon= (0 when a label reads nothing after its window)"
        )
    reach = split_gap_from_arrays(arrays, horizon)
    if reach:
        shape = {k: geometry.get(k) for k in ("size", "stride", "scales")}
        shape["horizon"] = horizon if horizon is not None else geometry.get("horizon", "from attrs['horizon']")
        raise StoreError(
            f"write: split_by='random' over the windows of array {name!r} ({shape}): each window shares time steps "
            f"with the {reach} windows after it, so a random split would put steps of training windows into the other "
            "splits; split by time (split_by='time', the default, leaves the gap), or make windows that share no "
            "step (a stride larger than the window's reach), or pass arrays already split"
        )


def split_at_times(times: Any, sessions: np.ndarray, fractions: Mapping[str, float], gap: int
                   ) -> dict[str, np.ndarray]:
    """Sample indices per split, every session cut at the same instants.

    Samples are counted in time order: split ``k`` gets ``fractions[k]`` of them, and
    its cut is the time of the first sample of split ``k + 1``, the same for every
    session (instrument, file), as ``pipeline run`` cuts its instruments. Within a
    session the first ``gap`` samples after a cut are left out (its windows share
    steps with the last ones before it); a session that begins after the cut shares
    none with the sessions before (windows never span sessions) and loses nothing.

    Parameters
    ----------
    times
        ``(n,)`` time of each sample (its window's end): datetime64 or numbers,
        non-decreasing within each session.
    sessions
        ``(n,)`` session of each sample; a session's samples are consecutive.
    fractions
        Split name -> fraction, in time order.
    gap
        Samples left out after each cut, per session.

    Returns
    -------
    dict
        Split name -> sorted int64 sample indices.

    Raises
    ------
    StoreError
        Naming the sample: times that are not one number or instant per sample, or
        that go back in time within a session; a split left without a sample.
    """
    t = np.asarray(times)
    n = int(sessions.size)
    if t.shape != (n,):
        raise StoreError(f"write: times must hold one time per sample ({n},), got shape {t.shape}")
    if t.dtype.kind == "M":
        missing = np.isnat(t)
        t = t.astype("datetime64[ns]").astype(np.int64)
    elif t.dtype.kind in "iuf":
        missing = np.isnan(t) if t.dtype.kind == "f" else np.zeros(n, dtype=bool)
    else:
        raise StoreError(f"write: times must be datetime64 or numbers, one per sample, got dtype {t.dtype}")
    if missing.any():
        raise StoreError(f"write: times[{int(np.flatnonzero(missing)[0])}] is missing (NaT or NaN); "
                         "every sample needs its time to be placed in a split")
    back = np.flatnonzero((np.diff(t) < 0) & (sessions[1:] == sessions[:-1]))
    if back.size:
        i = int(back[0])
        raw = np.asarray(times)
        raise StoreError(f"write: times go back within session {int(sessions[i])}: times[{i}] = {raw[i]}, "
                         f"times[{i + 1}] = {raw[i + 1]}; expected each window's end time, in window order")
    order = np.argsort(t, kind="stable")
    ranges = list(time_split_ranges(n, fractions, 0).values())
    cuts = [t[order[lo]] for lo, _ in ranges[1:]]
    stop = ranges[-1][1]
    if stop < n:  # fractions summing to less than 1: the latest samples are left out
        cuts.append(t[order[stop]])
    split = np.searchsorted(np.asarray(cuts, dtype=t.dtype), t, side="right")
    keep = np.ones(n, dtype=bool)
    # Where a session passes from one split to the next, its next `gap` samples go.
    change = np.flatnonzero((np.diff(split) != 0) & (sessions[1:] == sessions[:-1])) + 1
    session_end = np.searchsorted(sessions, sessions, side="right") if n else sessions
    for b in change.tolist():
        keep[b:min(b + gap, int(session_end[b]))] = False
    out = {}
    for k, name in enumerate(fractions):
        index = np.flatnonzero((split == k) & keep).astype(np.int64)
        if index.size == 0:
            raise StoreError(f"write: split {name!r}: no sample left after cutting every session at the same "
                             f"instants ({n} samples, {gap} left out after each cut per session, fractions "
                             f"{dict(fractions)}); use more data or a larger fraction")
        out[name] = index
    return out


def _time_split_index(arrays: Mapping[str, Any], splits: Mapping[str, float] | None, split_by: str, gap: int,
                      times: Any) -> dict[str, np.ndarray] | None:
    """Sample indices per split when samples are placed by ``times``; ``None`` where a
    time split cuts by position (one session), or nothing is split by time.

    Raises
    ------
    StoreError
        ``times`` where nothing is split by time; a time split of windows from several
        sessions without ``times`` (cut by position, one file's late windows would
        train while another file's earlier ones validate); times that do not fit.
    """
    from pipeline.errors import WindowError
    from pipeline.features.windows import window_sessions

    presplit = bool(arrays) and isinstance(next(iter(arrays.values())), Mapping)
    if splits is None or split_by == "random" or presplit:
        if times is not None:
            raise StoreError("write: times= places samples in time splits (splits={...}, split_by='time'); this "
                             "write has " + ("arrays already split" if presplit else "no splits" if splits is None
                                             else "split_by='random'"))
        return None
    name, geometry = _window_geometry(arrays)
    n = int(next(iter(arrays.values())).shape[0])
    try:
        sessions = window_sessions(geometry, n) if geometry else np.zeros(n, dtype=np.int64)
    except WindowError as exc:
        raise StoreError(f"write: array {name!r}: {exc}") from None
    if times is None:
        count = int(np.unique(sessions).size)
        if count > 1:
            raise StoreError(
                f"write: splits={dict(splits)} by time over windows of {count} sessions (array {name!r}, "
                "attrs['windows']['sessions']: the files x was joined from, or sessions=): cut by position, the "
                "first split would hold the later windows of the first files while the next split holds earlier "
                "ones of the last files (files of several instruments or stations). Pass times= (each window's end "
                "time, e.g. timestamps[pipeline.window_end_rows(x, size=...)]) to cut every session at the same "
                "instant, or pass arrays already split ({'train': {'x': ..., 'y': ...}, ...})")
        return None
    return split_at_times(times, sessions, splits, gap)


def _window_geometry(arrays: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The name and ``attrs["windows"]`` of the first array (as passed, split or not)
    that carries one; ``("", {})`` when none does."""
    for name, a in arrays.items():
        if isinstance(a, Mapping):
            found_name, found = _window_geometry(a)
        else:
            attrs = getattr(a, "attrs", None)
            found_name, found = str(name), attrs.get("windows") if isinstance(attrs, Mapping) else None
        if isinstance(found, Mapping) and found:
            return found_name, dict(found)
    return "", {}


def _feature_names(features: Sequence[str] | None, arrays: Mapping[str, Any],
                   groups: Mapping[str, Mapping[str, da.Array]], attrs: Mapping[str, Any]
                   ) -> tuple[list[str] | None, dict[str, Any]]:
    """The feature names to store (``None``: none given nor carried) and the window
    geometry they come with, checked against the features ``x`` holds.

    Raises
    ------
    StoreError
        When the names are not one string per feature: ``x``'s last axis divided by
        the number of window scales, or the columns of the shared per-step features.
    """
    carrier, geometry = _window_geometry(arrays)
    where = "write: features"
    if features is None:
        features = geometry.get("features")
        if features is None:
            return None, {}
        where = f"write: the feature names array {carrier!r} carries (attrs['windows']['features'])"
    if isinstance(features, (str, bytes)):
        raise StoreError(f"{where}: expected a sequence of names, got the single string {features!r}")
    names = list(features)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise StoreError(f"{where}: expected strings, got {bad[0]!r} ({type(bad[0]).__name__})")
    geometry.pop("features", None)
    given = [attrs.get(key) for key in ("windows", "virtual")]
    scales = next((list(g["scales"]) for g in (geometry, *given) if isinstance(g, Mapping) and g.get("scales")), [1])
    split = next((g for k, g in groups.items() if k != SHARED and "x" in g), None)
    if split is not None:
        x = split["x"]
        width = int(x.shape[-1]) if x.ndim > 1 else 1
        if width % len(scales):
            raise StoreError(f"{where}: x's last axis of {width} cannot hold features once per scale of "
                             f"{list(scales)}, so no {len(names)} names fit it")
        if width // len(scales) != len(names):
            raise StoreError(f"{where}: expected {width // len(scales)} names (x's last axis of {width} holds the "
                             f"features once per scale, scales {list(scales)}), got {len(names)}")
    elif SHARED in groups and "features" in groups[SHARED]:
        width = int(groups[SHARED]["features"].shape[-1])
        if width != len(names):
            raise StoreError(f"{where}: expected {width} names, one per column of shared['features'] (shape "
                             f"{tuple(groups[SHARED]['features'].shape)}), got {len(names)}")
    return names, geometry


def _check_folds(folds: Mapping[str, Any] | None, base: str, groups: Mapping[str, Mapping[str, da.Array]],
                 attrs: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    """Fold index arrays, checked before anything is written.

    Raises
    ------
    StoreError
        Naming the fold: a name that is no path of parts, a base that is not among the
        splits written, indices that are not sorted, unique integers inside the base.
    """
    if not folds:
        return {}
    splits = [k for k in groups if k != SHARED]
    if base not in splits:
        raise StoreError(f"write: fold_base {base!r} is not among the splits written ({', '.join(splits)})")
    if FOLDS in splits:
        raise StoreError(f"write: a split named {FOLDS!r} cannot be written with folds (their group has that name)")
    if attrs is not None and "folds" in attrs and not isinstance(attrs["folds"], Mapping):
        raise StoreError(f"write: attrs['folds'] must be a mapping to merge the folds into, "
                         f"got {type(attrs['folds']).__name__}")
    n = int(next(iter(groups[base].values())).shape[0])
    out: dict[str, np.ndarray] = {}
    for name, index in folds.items():
        where = f"write: fold {name!r}"
        if not isinstance(name, str) or not all(_FOLD_PART.fullmatch(p) for p in name.split("/")):
            raise StoreError(f"{where}: expected a name of parts such as 'fold0/train' (letters, digits, "
                             "'_', '.', '-'), separated by '/'")
        if name in splits:
            raise StoreError(f"{where}: a split has the same name; streams would not know which to serve")
        a = np.asarray(index)
        if a.ndim != 1 or a.dtype.kind not in "iu":
            raise StoreError(f"{where}: expected a 1-D array of integer sample indices into split {base!r}, "
                             f"got {a.dtype} of shape {a.shape}")
        if a.size == 0:
            raise StoreError(f"{where}: holds no sample")
        if int(a.min()) < 0 or int(a.max()) >= n:
            raise StoreError(f"{where}: sample indices must lie in 0..{n - 1} (split {base!r} holds {n}), "
                             f"got {int(a.min())}..{int(a.max())}")
        bad = np.flatnonzero(np.diff(a) <= 0)
        if bad.size:
            k = int(bad[0])
            raise StoreError(f"{where}: sample indices must be sorted and unique, got {int(a[k])} then "
                             f"{int(a[k + 1])} at positions {k}, {k + 1}")
        out[name] = a.astype(np.int64)
    for name in out:
        if any(other.startswith(name + "/") for other in out):
            raise StoreError(f"write: fold {name!r} is also the folder of other folds; name it {name}/all, say")
    return out


def _write_folds(group: zarr.Group, folds: Mapping[str, np.ndarray], codec: CodecSpec) -> None:
    """Write the fold index arrays under ``folds/``, replacing any a previous attempt
    left (a resumed write rewrites them whole)."""
    if FOLDS in group and WRITTEN not in group[FOLDS]:  # never a split of that name
        del group[FOLDS]
    if folds:
        write_fold_arrays(group, folds, _codec_for(codec, 1, shared=False).zarr_compressors())


def write_fold_arrays(group: zarr.Group, folds: Mapping[str, np.ndarray], compressors: Any) -> None:
    """Write each fold's index array at ``folds/<name>``, replacing an array of that
    name (the first build's writes, and an append's new folds, both go through here)."""
    root = group.require_group(FOLDS)
    for name, index in sorted(folds.items()):
        *parents, leaf = name.split("/")
        node = root
        for part in parents:
            node = node.require_group(part)
        if leaf in node:
            del node[leaf]
        arr = node.create_array(leaf, shape=index.shape, dtype="int64", chunks=(max(1, min(index.size, FOLD_CHUNK)),),
                                compressors=compressors, fill_value=0)
        arr[:] = index


def _normalize(arrays: Mapping[str, Any], splits: Mapping[str, float] | None, split_by: str,
               gap: int, seed: int, picked: Mapping[str, np.ndarray] | None = None, *,
               layout: _Layout) -> dict[str, dict[str, da.Array]]:
    """:func:`write`'s arrays as dask arrays per split; numpy arrays in blocks of the
    split's write tasks (``layout``), cut after the split is chosen (:func:`~pipeline.storage.arraysource.as_blocks`)."""
    if not arrays:
        raise StoreError("write: no arrays given")
    first = next(iter(arrays.values()))
    if isinstance(first, Mapping):
        if splits is not None:
            raise StoreError("write: arrays are already split; leave splits=None")
        given = {str(k): _with_samples({str(n): a for n, a in v.items()}, f"split {k!r}: ") for k, v in arrays.items()}
        out = {k: {n: as_blocks(a, layout.block(k, v)) for n, a in v.items()} for k, v in given.items()}
    else:
        flat = _with_samples({str(n): a for n, a in arrays.items()}, "")
        n = {name: a.shape[0] for name, a in flat.items()}
        if len(set(n.values())) != 1:
            raise StoreError(f"write: arrays must have the same length on axis 0, got {n}")
        total = next(iter(n.values()))
        # Every split's samples are the same size: one task block for all of them.
        block = layout.block("train", flat)
        if splits is None:
            chosen: dict[str, slice | np.ndarray | None] = {"train": None}
        elif picked is not None:
            chosen = dict(picked)
        elif split_by == "random":
            perm = np.random.default_rng(seed).permutation(total)
            chosen = {name: np.sort(perm[lo:hi]) for name, (lo, hi) in time_split_ranges(total, splits, 0).items()}
        else:
            chosen = {name: slice(lo, hi) for name, (lo, hi) in time_split_ranges(total, splits, gap).items()}
        out = {name: {k: as_blocks(a, block, rows) for k, a in flat.items()} for name, rows in chosen.items()}
    for split, group in out.items():
        lengths = {k: a.shape[0] for k, a in group.items()}
        if len(set(lengths.values())) != 1:
            raise StoreError(f"write: split {split!r}: arrays must have the same length, got {lengths}")
        if any(np.isnan(a.shape[0]) for a in group.values()):
            raise StoreError(f"write: split {split!r}: arrays of unknown length; call compute_chunk_sizes()")
    return out


def _with_samples(arrs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Each array as a dask or numpy array (a memory map stays one), refusing one
    without a sample axis."""
    out = {name: a if isinstance(a, (da.Array, np.ndarray)) else np.asarray(a) for name, a in arrs.items()}
    for name, a in out.items():
        if a.ndim == 0:
            raise StoreError(f"write: {where}array {name!r} is 0-d (a single value); expected samples along axis 0")
        if a.dtype == object:  # zarr refuses it only once the store's metadata is written, naming no array
            raise StoreError(f"write: {where}array {name!r} has dtype object (Python objects), which zarr does not "
                             "store; convert it to numbers, fixed-width strings (dtype 'U<n>') or bytes first")
    return out


def _fs_and_root(location: str, storage_options: dict | None) -> tuple[Any, str]:
    fs, root = fsspec.core.url_to_fs(location, **(storage_options or {}))
    return fs, root


def _write_units(location: str, storage_options: dict | None, split: str, units: list[tuple[int, int]],
                 block_start: int, blocks: dict[str, np.ndarray], token: str) -> int:
    """Write units of every array of a split from one block, each followed by its row
    of ``_written``. Runs on a worker.

    ``units`` are ``(unit, start, stop)`` sample ranges inside the block (which starts
    at sample ``block_start``); units already written are not among them. ``token`` is
    unique to one ``write`` call: the arrays it opens are cached under it (opening one
    reads and parses its metadata, a noticeable share of a unit's time), and a later write
    that recreates them at the same location gets fresh ones.
    """
    with inflight.running(token) as go:
        if not go:  # the write call was stopped (it failed or was interrupted): write nothing
            return 0
        options = json.dumps(storage_options or {}, sort_keys=True, default=str)
        arrays = {name: _cached_array(location, options, f"{split}/{name}", token) for name in blocks}
        written = _cached_array(location, options, f"{split}/{WRITTEN}", token)
        return write_units(arrays, written, units, block_start, blocks, stopped=lambda: inflight.stopped(token))


def _codec_for(codec: CodecSpec, ndim: int, *, shared: bool) -> CodecSpec:
    """The codec an array is stored with.

    The configured codec applies to windows (3-D and up), where unshuffled lz4 finds the
    steps that overlapping windows repeat. Labels, window ends and other 1-D or 2-D
    arrays repeat nothing but have slowly varying high bytes: byte shuffle compresses
    them (window ends, consecutive integers, to almost nothing). The per-step features
    of virtual windows are read ``size`` times less than windows would be, so they take
    the denser blosc-zstd with shuffle (ratios in benchmarks/README.md).
    """
    if codec.name != "blosc":
        return codec
    if shared:
        return CodecSpec(name="blosc", cname="zstd", clevel=codec.clevel, shuffle="shuffle")
    if ndim < 3 and codec.shuffle == "noshuffle":
        return codec.with_shuffle("shuffle")
    return codec


_GROUPS: dict[tuple[str, str], zarr.Group] = {}


def _cached_group(location: str, options: str) -> zarr.Group:
    """One open group per worker process and store: opening reads metadata, which would
    otherwise cost more than writing a small unit."""
    key = (location, options)
    if key not in _GROUPS:
        if len(_GROUPS) > 16:
            _GROUPS.clear()
        _GROUPS[key] = open_store_group(location, mode="r+", storage_options=json.loads(options) or None)
    return _GROUPS[key]


_ARRAYS: dict[tuple[str, str, str, str], zarr.Array] = {}


def _cached_array(location: str, options: str, path: str, token: str) -> zarr.Array:
    """One open array per worker process, store, path and write call."""
    key = (location, options, path, token)
    if key not in _ARRAYS:
        if len(_ARRAYS) > 256:
            _ARRAYS.clear()
        _ARRAYS[key] = _cached_group(location, options)[path]
    return _ARRAYS[key]


def _made_block(arrs: Mapping[str, da.Array], unit: int) -> int | None:
    """The samples per block that every array of a split already comes in, when those
    blocks are whole write units (all but the last the same size): a job makes its
    arrays in the blocks its write tasks write, and they are written as made. Sized by
    bytes instead, a split of small per-window arrays only (a virtual store's window
    ends, labels and times) would be one block, written by one task on one core."""
    chunks = {a.chunks[0] for a in arrs.values()}
    if len(chunks) != 1:
        return None
    (given,) = chunks
    first = int(given[0]) if given else 0
    if len(given) < 2 or first <= 0 or first % unit or any(int(c) != first for c in given[:-1]) or given[-1] > first:
        return None
    return first


def _confirm_written(group: zarr.Group, split: str, done: np.ndarray, reported: int, per_block: int) -> np.ndarray:
    """The units of a split written once this call's tasks have returned, from what
    they report, with the marker each block's task wrote last read back.

    A task returns the count of units it wrote, each marker after its data, and raises
    on any failure; so when the counts add up, every planned unit is written. Reading
    one marker per block back checks that the workers wrote where this process reads
    (a remote cluster's workers with another disk at the same path), without reading
    the thousand markers of a large build. Anything else is settled by reading every
    marker."""
    todo = np.flatnonzero(~done)
    if reported == todo.size and written_units(group, split, last_of_blocks(todo, per_block)).all():
        return np.ones_like(done)
    return written_units(group, split)


def _write_attrs(attrs: Mapping[str, Any] | None, features: Sequence[str] | None, arrays: Mapping[str, Any],
                 groups: Mapping[str, Any], used_gap: int | None, fold_index: Mapping[str, np.ndarray],
                 fold_base: str) -> dict[str, Any]:
    """The caller's attributes with what this write records: feature names (given, or
    carried by the windows), the split gap used and the folds."""
    attrs = dict(attrs or {})
    names, geometry = _feature_names(features, arrays, groups, attrs)
    if names is not None:
        attrs["features"] = names
        if geometry and "windows" not in attrs:
            attrs["windows"] = geometry
    if used_gap is not None:
        attrs["split_gap_samples"] = used_gap
    if fold_index:
        attrs["folds"] = {**dict(attrs.get("folds") or {}), "base": fold_base, "names": sorted(fold_index),
                          "counts": {name: int(idx.size) for name, idx in sorted(fold_index.items())}}
    return attrs


def _with_provenance(attrs: dict[str, Any], arrays: Mapping[str, Any]) -> dict[str, Any]:
    """``attrs`` with the provenance the first array carries (``x.attrs`` from
    :func:`pipeline.load` or :func:`pipeline.loaders.open_source`: files, columns,
    classes, skipped files) under its own keys, unless ``attrs`` records files already:
    a store of labelled images keeps its class names without the caller passing them."""
    if "files" in attrs:
        return attrs
    for value in arrays.values():
        for a in value.values() if isinstance(value, Mapping) else (value,):
            carried = getattr(a, "attrs", None)
            if isinstance(carried, Mapping) and "files" in carried:
                return {**json.loads(json.dumps(dict(carried), default=str)), **attrs}
    return attrs


def _write_zip(location: str, overwrite: bool, write_dir: Callable[[str, dict[str, Any] | None], None]) -> str:
    """A ``.zarr.zip`` store: written as a directory beside it (``write_dir``), then
    packed. An existing zip (checked by :func:`check_target`: one this package wrote, of
    this fingerprint unless ``overwrite``) is complete, since it is packed last: kept,
    or replaced with ``overwrite``.

    Raises
    ------
    StoreError
        For a remote zip path.
    """
    if is_remote(location):
        raise StoreError(f"{location}: zip stores are written locally; write a directory to object storage")
    staging = zip_staging(location)
    if overwrite and os.path.exists(location):
        os.remove(location)
    if os.path.exists(location):  # complete, and of this fingerprint (check_target): kept
        return location
    with write_lock(location):
        write_dir(staging, None)
        _pack_zip(staging, location)
        shutil.rmtree(staging)
    return location


def write(
    target: str | os.PathLike[str],
    arrays: Mapping[str, Any],
    *,
    splits: Mapping[str, float] | None = None,
    split_by: Literal["time", "random"] = "time",
    gap: int | None = None,
    horizon: int | None = None,
    times: Any = None,
    seed: int = 0,
    chunk_samples: int | None = None,
    target_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    shard_chunks: int | None = None,
    codec: CodecSpec | str | Mapping[str, Any] = "blosc-lz4",
    attrs: Mapping[str, Any] | None = None,
    fingerprint: str | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    progress: bool = True,
    shared: Mapping[str, Any] | None = None,
    shared_chunk_rows: int | None = None,
    folds: Mapping[str, np.ndarray] | None = None,
    fold_base: str = "all",
    features: Sequence[str] | None = None,
) -> str:
    """Write arrays, per split, into a zarr 3 store; resume an interrupted write.

    Parameters
    ----------
    target
        A directory, a ``.zarr.zip`` file (written as a directory beside it, then packed),
        or an fsspec URL such as ``s3://bucket/set.zarr``.
    arrays
        ``{"x": a, "y": b}`` (then ``splits`` divides them along axis 0) or already split
        ``{"train": {"x": ..., "y": ...}, "val": {...}}``. numpy or dask arrays. A
        memory-mapped file (``np.load(path, mmap_mode="r")``, ``np.memmap``, or a view
        of one) is read from the file by each write task, a block at a time: nothing of
        it is read by this process or put in the graph, so a file larger than memory
        writes. The workers must see the file at the same path, unchanged until the
        write ends (a file changed meanwhile is refused, naming it). Other numpy arrays
        (and copy-on-write maps, ``mmap_mode="c"``) go into the graph cut into the
        blocks the write tasks write.
    splits
        ``None`` writes one split named ``train``; fractions split by time in the given
        order with ``gap`` samples left between splits (in array order for one series;
        windows of several sessions need ``times``), or by a seeded permutation.
    split_by
        ``"time"`` (the default) or ``"random"``: refused for windows that share steps
        (it would put training windows' steps into the other splits); samples without
        window geometry (images, independent records) split freely.
    gap
        Samples left out between consecutive time splits, so that no two splits share a
        step through a window, its lookback or its label (``split_gap_samples``).
        ``None``: derived from the geometry an array carries and ``horizon``; what
        cannot be known is refused, not assumed (:func:`split_gap_from_arrays`).
    horizon
        The steps a label reads after its window, for the derived ``gap`` (default the
        ``horizon`` an array carries, from ``pipeline.windows`` or ``attrs``).
    times
        ``(n,)`` time of each sample (its window's end: datetime64 or numbers): every
        session is cut at the same instants, as ``pipeline run`` cuts instruments
        (:func:`split_at_times`).
    chunk_samples
        Samples per chunk (default from ``target_chunk_bytes`` of ``x`` or the first array).
    shard_chunks
        Chunks per shard along the sample axis (``None``: no sharding).
    codec
        Compression: a :class:`CodecSpec`, ``"blosc-lz4"``, ``"zstd"``, ``"none"``...
    attrs
        Extra provenance merged into the store's ``pipeline`` attributes.
    fingerprint
        The identity of what is written (the config hash): a store with another is
        refused, with the same one the write resumes. ``None``: the arrays' dask names
        and the options (:func:`content_fingerprint`): other arrays are refused.
    overwrite
        Delete an existing store first.
    progress
        Show a progress bar.
    shared
        Arrays of no split, in the ``_shared`` group (virtual windows' per-step features).
    shared_chunk_rows
        Rows per chunk of ``shared`` (virtual windows: the steps one chunk of windows spans).
    folds
        Walk-forward folds ``{"fold0/train": idx, ...}``: sorted, unique sample indices
        into split ``fold_base``, stored as ``folds/<name>`` before the store is marked
        complete and streamed by name (``pipeline.stream(store, split="fold0/train")``).
    fold_base
        The split the folds' indices point into.
    features
        One name per feature of ``x`` (its last axis holds them once per scale; virtual
        windows: the columns of ``shared["features"]``), the ``features`` attribute.
        ``None``: the names an array carries from ``pipeline.windows(..., names=)``.

    Returns
    -------
    str
        The store location.

    Raises
    ------
    StoreError
        Before anything is written: a gap that cannot be known, windows of several
        sessions split by time without ``times``, a random split of windows sharing
        steps, folds that do not fit (naming the fold), arrays of different lengths,
        feature names that are not one string per feature.
    """
    location = local_absolute(os.fspath(target))
    codec = CodecSpec.from_mapping(codec, "codec")
    layout = _Layout(chunk_samples, target_chunk_bytes, shard_chunks, shared_chunk_rows)
    groups, fold_index, attrs = _split_groups(arrays, splits, split_by, gap, horizon, times, seed, shared, folds,
                                              fold_base, attrs, features, layout)
    differences = None if fingerprint else functools.partial(write_differences, location, storage_options, groups,
                                                             codec, chunk_samples, shard_chunks)
    fingerprint = fingerprint or content_fingerprint(groups, fold_index, attrs, codec, chunk_samples,
                                                     target_chunk_bytes, shard_chunks, shared_chunk_rows)
    attrs = _with_provenance(attrs, arrays)  # after the fingerprint: a file touched is the same write

    def write_dir(path: str, options: dict[str, Any] | None) -> None:
        _write_dir(path, groups, chunk_samples, target_chunk_bytes, shard_chunks, codec, attrs, fingerprint,
                   overwrite, options, progress, shared_chunk_rows, fold_index)
    return _write_at(location, write_dir, storage_options, fingerprint, overwrite, differences)


def write_differences(location: str, storage_options: dict[str, Any] | None,
                      groups: Mapping[str, Mapping[str, da.Array]], codec: CodecSpec, chunk_samples: int | None,
                      shard_chunks: int | None) -> str:
    """What differs between the store at ``location`` and a :func:`write` of ``groups``
    with these options, for the refusal of a write of another fingerprint: splits,
    arrays, shapes, dtypes, the codec, samples per chunk; else the arrays' values (their
    dask names differ: other data, or another computation of it)."""
    try:
        group = open_store_group(location, mode="r", storage_options=storage_options)
    except StoreError:
        return ""
    meta = store_root_attrs(group)
    stored = {name: {n: a for n, a in sub.arrays() if n != WRITTEN} for name, sub in group.groups()
              if WRITTEN in sub}
    diffs = []
    if set(stored) != set(groups):
        diffs.append(f"splits: the store's {sorted(stored)}, this write's {sorted(groups)}")
    for split in sorted(set(stored) & set(groups)):
        have, want = stored[split], groups[split]
        if set(have) != set(want):
            diffs.append(f"split {split!r}: the store's arrays {sorted(have)}, this write's {sorted(want)}")
        for name in sorted(set(have) & set(want)):
            a, b = have[name], want[name]
            if tuple(a.shape) != tuple(b.shape) or np.dtype(a.dtype) != np.dtype(b.dtype):
                diffs.append(f"{split}/{name}: the store's {tuple(a.shape)} {np.dtype(a.dtype)}, this write's "
                             f"{tuple(b.shape)} {np.dtype(b.dtype)}")
            elif chunk_samples is not None and int(a.chunks[0]) != min(int(chunk_samples), max(1, int(a.shape[0]))):
                diffs.append(f"{split}/{name}: {a.chunks[0]} samples per chunk in the store, chunk_samples="
                             f"{chunk_samples} here")
    if meta.get("codec") is not None and meta.get("codec") != codec.describe():
        diffs.append(f"codec: the store's {meta.get('codec')}, this write's {codec.describe()}")
    if meta.get("complete") and meta.get("shard_chunks") != shard_chunks:
        diffs.append(f"shard_chunks: the store's {meta.get('shard_chunks')}, this write's {shard_chunks}")
    state = "" if meta.get("complete") else "The store there is an incomplete write (it failed or was stopped). "
    if not diffs:
        return (f"{state}What differs: the arrays' values (their dask names differ: other data, or another "
                "computation of it), or options that shape the store")
    return f"{state}What differs: " + "; ".join(diffs[:6]) + ("; ..." if len(diffs) > 6 else "")


def _write_at(location: str, write_dir: Callable[[str, dict[str, Any] | None], None],
              storage_options: dict[str, Any] | None, fingerprint: str, overwrite: bool,
              differences: Callable[[], str] | None = None) -> str:
    """:func:`write`'s store written at ``location`` by ``write_dir``: a zip built
    beside it and packed, or a directory or object store under its write lock. A store
    of another fingerprint is refused saying what ``differences`` finds (two hashes alone
    sent the user guessing what changed)."""
    try:
        if is_zip(location):
            check_target(location, fingerprint, overwrite)
            return _write_zip(location, overwrite, write_dir)
        try:
            with write_lock(location):
                write_dir(location, storage_options)
        except OSError as exc:  # creating the store or its lock: read-only, full, no permission
            raise StoreError(f"{location}: cannot write ({exc.strerror or exc})") from exc
    except StoreConflictError as exc:
        if differences is None or "written from fingerprint" not in str(exc):
            raise
        raise StoreConflictError(f"{exc}. {differences()}") from None
    return location


def _split_groups(arrays: Mapping[str, Any], splits: Mapping[str, float] | None, split_by: str, gap: int | None,
                  horizon: int | None, times: Any, seed: int, shared: Mapping[str, Any] | None,
                  folds: Mapping[str, np.ndarray] | None, fold_base: str, attrs: Mapping[str, Any] | None,
                  features: Sequence[str] | None, layout: _Layout
                  ) -> tuple[dict[str, dict[str, da.Array]], Any, dict[str, Any]]:
    """:func:`write`'s groups (split -> name -> dask array, ``_shared`` beside them), its
    checked fold indices and the store's attributes, every refusal before anything is
    written; numpy arrays in the blocks that ``layout`` gives each split's write tasks."""
    _check_splits(splits)
    used_gap = _split_gap(arrays, splits, split_by, gap, horizon)
    picked = _time_split_index(arrays, splits, split_by, used_gap or 0, times)
    groups = _normalize(arrays, splits, split_by, used_gap or 0, seed, picked, layout=layout)
    if shared:
        given = _with_samples({str(k): v for k, v in shared.items()}, f"{SHARED}: ")
        block = layout.block(SHARED, given)
        groups[SHARED] = {k: as_blocks(v, block) for k, v in given.items()}
    fold_index = _check_folds(folds, fold_base, groups, attrs)
    return groups, fold_index, _write_attrs(attrs, features, arrays, groups, used_gap, fold_index, fold_base)


def _pack_zip(directory: str, target: str) -> None:
    tmp = target + ".tmp"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for dirpath, dirnames, filenames in os.walk(directory):
            dirnames[:] = sorted(dirnames)
            for fn in sorted(filenames):
                full = os.path.join(dirpath, fn)
                zf.write(full, os.path.relpath(full, directory).replace(os.sep, "/"))
    os.replace(tmp, target)  # the zip appears whole or not at all


def local_absolute(location: str) -> str:
    """A local path made absolute, ``~`` expanded (URLs unchanged): the workers of a
    remote cluster resolve a relative path in their own working directory, not the
    client's, and a literal ``~`` directory would be a trap."""
    return location if "://" in location else os.path.abspath(os.path.expanduser(location))


def check_target(location: str, fingerprint: str | None, overwrite: bool,
                 storage_options: dict[str, Any] | None = None) -> None:
    """Refuse a target that a write would damage, before anything is computed or written.

    Only a store this package wrote is ever replaced: with ``overwrite``, or resumed when
    it was written from ``fingerprint``. Anything else at the path (a directory of
    files, a zarr store another tool wrote, a zip file that is not such a store) is
    refused whatever ``overwrite`` says: writing there would delete it. An empty
    directory takes a new store.

    Raises
    ------
    StoreConflictError
        A store written from another fingerprint (without ``overwrite``), or something
        at the path that is not a store this package wrote.
    StoreError
        A file where a directory store goes, or a directory where a zip goes.
    """
    if is_zip(location):
        _check_zip_target(location, fingerprint, overwrite)
        return
    fs, root = _fs_and_root(location, storage_options)
    if fs.exists(f"{root}/zarr.json"):
        _check_own_store(location, open_store_group(location, storage_options=storage_options), fingerprint,
                         overwrite)
        return
    if not fs.exists(root):
        return
    if not fs.isdir(root):
        raise StoreError(f"{location}: exists and is not a directory; choose another output path")
    entries = sorted(fs.ls(root, detail=False))
    if entries:
        names = {os.path.basename(str(e).rstrip("/")) for e in entries}
        if names & {".zgroup", ".zarray", ".zattrs"}:  # zarr format 2 (xarray's default)
            what = "a zarr format 2 store (.zgroup/.zarray/.zattrs) that pipeline did not write"
        elif {"refs", "snapshots"} <= names:
            what = "an icechunk repository (refs/, snapshots/)"
        else:
            what = (f"a directory that is not a zarr store (no zarr.json) and holds {len(entries)} entries, such "
                    f"as {os.path.basename(str(entries[0]).rstrip('/'))!r}")
        raise StoreConflictError(
            f"{location}: {what}; a store written there would delete its files, with or without "
            "output.overwrite. Choose a new or empty directory"
        )


def _check_own_store(location: str, group: zarr.Group, fingerprint: str | None, overwrite: bool, *,
                     zip_file: bool = False) -> None:
    """Refuse a zarr store this package did not write, and (without ``overwrite``) one of
    another fingerprint: a zip, complete once it exists, is kept as it is by a write that
    names no fingerprint or when it records none (as :func:`_write_zip` keeps it)."""
    if ATTRS_KEY not in group.attrs:
        raise StoreConflictError(
            f"{location}: a zarr store that pipeline did not write (no {ATTRS_KEY!r} attribute); a build would "
            "delete it, with or without output.overwrite. Choose another output path"
        )
    stored = store_root_attrs(group).get("fingerprint")
    same = stored == fingerprint or (zip_file and None in (stored, fingerprint))
    if not overwrite and not same:
        raise StoreConflictError(
            f"{location}: this store was written from fingerprint {stored}, "
            f"the current run's is {fingerprint}; choose another output path or set output.overwrite "
            "(overwrite=True in pipeline.write)"
        )


def _check_zip_target(location: str, fingerprint: str | None, overwrite: bool) -> None:
    """:func:`check_target` for a ``.zip`` path: nothing there, or a zip store this
    package wrote (of this fingerprint, unless ``overwrite``)."""
    if not os.path.lexists(location):
        return
    if os.path.isdir(location):
        raise StoreError(f"{location}: a directory, where a zip store goes; choose another output path")
    try:
        group = open_store_group(location)
    except StoreError as exc:
        raise StoreConflictError(
            f"{location}: a file that is not a zip store pipeline wrote ({exc}); a build would replace it, with or "
            "without output.overwrite. Choose another output path"
        ) from exc
    _check_own_store(location, group, fingerprint, overwrite, zip_file=True)


def _write_dir(location, groups, chunk_samples, target_chunk_bytes, shard_chunks, codec, attrs,
               fingerprint, overwrite, storage_options, progress, shared_chunk_rows=None, folds=None) -> None:
    check_target(location, fingerprint, overwrite, storage_options)
    fs, root = _fs_and_root(location, storage_options)
    exists = fs.exists(f"{root}/zarr.json")
    # An old store to overwrite is renamed out of the way and removed while the new one
    # is written (removing thousands of files first took seconds of the run's wall time).
    removal = make_way(fs, root, replace=exists and overwrite)
    exists = exists and not overwrite
    token = uuid.uuid4().hex  # this write call: its arrays cached on the workers, its tasks counted
    settled = True
    try:
        _write_into(location, exists, groups, chunk_samples, target_chunk_bytes, shard_chunks, codec, attrs,
                    fingerprint, storage_options, progress, shared_chunk_rows, folds, token=token)
    except BaseException:
        # Write tasks already running outlive the failed wait for them, and write by
        # path: none may be left running when the replaced store is put back in its place.
        settled = False
        settled = inflight.settle(token)
        raise
    finally:
        if removal is not None:
            removal.wait(settled=settled)


#: Called once every unit of a write is written, just before the store is marked
#: complete (``pipeline run`` checks there that no raw file changed while the workers
#: read it): raising leaves the store incomplete, and an overwrite puts back the store
#: it replaces. Set by the caller around :func:`write` (a context variable: per thread).
BEFORE_COMPLETE: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "pipeline_before_complete", default=None)


#: The incomplete store's record of what its write read (see :func:`_check_resume`).
RESUME_KEY = "resume_sources"


def _resume_record(attrs: Mapping[str, Any]) -> list[list[Any]]:
    """``[path, size, rows, hash, crc32]`` of every source file (and companion) a build
    read, from its ``sources`` attribute (``hash``: its first and last MiB; ``crc32``:
    every byte, so that a same-size correction inside a file is told); empty for writes
    of arrays."""
    sources = attrs.get("sources") if isinstance(attrs.get("sources"), Mapping) else {}
    out = []
    for entry in sources.get("files") or []:
        for item in (entry, entry.get("companion")):
            if isinstance(item, Mapping):
                out.append([str(item.get(k)) if k == "path" else item.get(k)
                            for k in ("path", "size", "rows", "hash", "crc32")])
    return out


def _check_resume(location: str, root: Mapping[str, Any], attrs: Mapping[str, Any],
                  groups: Mapping[str, Mapping[str, da.Array]], storage_options: dict[str, Any] | None) -> None:
    """Refuse to resume an interrupted write whose input changed since it began: the
    units written then would sit beside units of the new input, silently (raw files
    corrected, or delivered again shorter, between the killed run and the rerun; the
    config, and so the fingerprint, the same).

    Raises
    ------
    StoreConflictError
        Naming the first file that changed, or the array whose shape did, and
        ``--rebuild``.
    """
    fix = ("; the units written from the old input cannot be resumed: rerun with --rebuild (output.overwrite, "
           "overwrite=True in pipeline.write) to write it again from the files as they are")
    recorded = root.get(RESUME_KEY)
    if isinstance(recorded, list) and recorded:
        then = {row[0]: row for row in recorded}
        now = {row[0]: row for row in _resume_record(attrs)}
        for path in sorted(set(then) | set(now)):
            a, b = then.get(path), now.get(path)
            if a is not None and b is not None and len(a) != len(b):
                a, b = a[:4], b[:4]  # begun by a version that recorded no crc32: what both record
            if a == b:
                continue
            if a is None or b is None:
                why = "read now, but not by the interrupted build" if a is None else "read by the interrupted " \
                    "build, but not now"
            else:
                fields = ("size", "rows", "content hash", "content CRC-32")
                why = "its " + ", ".join(f"{f} was {x}, is {y}" for f, x, y in zip(fields, a[1:], b[1:]) if x != y)
            raise StoreConflictError(f"{location}: {path}: changed since the interrupted build began ({why}){fix}")
    group = open_store_group(location, mode="r", storage_options=storage_options)
    for split, arrs in groups.items():
        for name, a in arrs.items():
            key = f"{split}/{name}"
            if key in group and tuple(group[key].shape) != tuple(a.shape):
                raise StoreConflictError(f"{location}: {key} was begun with shape {tuple(group[key].shape)}, this "
                                         f"write's is {tuple(a.shape)}: the input changed since{fix}")


def _write_into(location, exists, groups, chunk_samples, target_chunk_bytes, shard_chunks, codec, attrs,
                fingerprint, storage_options, progress, shared_chunk_rows, folds, *, token: str) -> None:
    """:func:`_write_dir` once an old store to overwrite is out of the way: a new store,
    or the rest of one with this fingerprint (``exists``)."""
    if exists:  # written from this fingerprint (check_target): resume it, unless complete
        root = store_root_attrs(open_store_group(location, storage_options=storage_options))
        if root.get("complete"):
            return
        _check_resume(location, root, attrs, groups, storage_options)
    # Samples per chunk come from x's sample size (or the first array's); arrays shared by
    # every split (the per-step features of virtual windows) get their own, by row size.
    layout = _Layout(chunk_samples, target_chunk_bytes, shard_chunks, shared_chunk_rows)
    per_chunks = {split: layout.unit(split, arrs, sharded=False) for split, arrs in groups.items()}
    units = {split: layout.unit(split, arrs) for split, arrs in groups.items()}
    per_chunk = next((c for k, c in per_chunks.items() if k != SHARED), 0)

    group = open_store_group(location, mode="a" if exists else "w", storage_options=storage_options)
    if not exists:
        # What the resume of an interrupted write checks (_check_resume); dropped when
        # the store is marked complete, so that its bytes do not depend on it.
        group.attrs[ATTRS_KEY] = {"format_version": FORMAT_VERSION, "complete": False, "fingerprint": fingerprint,
                                  RESUME_KEY: _resume_record(attrs)}
    for split, arrs in groups.items():
        sub = group.require_group(split)
        unit = units[split]
        for name, a in arrs.items():
            compressors = _codec_for(codec, a.ndim, shared=split == SHARED).zarr_compressors()
            # Per-step features compress better column by column (each column is one
            # homogeneous series) than row-major (ratios in benchmarks/README.md).
            filters = [TransposeCodec(order=(1, 0))] if split == SHARED and a.ndim == 2 and compressors else []
            if name in sub:
                continue
            n = int(a.shape[0])
            # An empty split (a date split after the data, for appends to fill) gets the
            # chunks a full one would: appended samples keep the array's chunks.
            chunks = (min(per_chunks[split], n) if n else per_chunks[split],) + tuple(a.shape[1:])
            shards = None
            if shard_chunks and split != SHARED:
                shards = (chunks[0] * int(shard_chunks),) + tuple(a.shape[1:])
            sub.create_array(name, shape=a.shape, dtype=a.dtype, chunks=chunks, shards=shards,
                             filters=filters, compressors=compressors, fill_value=0)
        if WRITTEN not in sub:
            n = int(next(iter(arrs.values())).shape[0])
            n_units = len(unit_chunks(n, unit)) if n else 0
            sub.create_array(WRITTEN, shape=(n_units, 1 + len(arrs)), dtype="uint64",
                             chunks=(1, 1 + len(arrs)), compressors=[], fill_value=0)

    tasks = []
    known: dict[str, np.ndarray] = {}  # per split, the units known to be written
    for split, arrs in groups.items():
        n = int(next(iter(arrs.values())).shape[0])
        if not n:
            continue
        unit = units[split]
        # One task writes a block of whole units: arrays chunked that way already (the
        # windows of a job are made in these blocks) are not rechunked at all, and the
        # write fuses with the blockwise layers that make them (see storage.units).
        block = _made_block(arrs, unit) or layout.block(split, arrs)
        # A store created by this call holds no unit yet: its markers need no reading.
        done = np.zeros(len(unit_chunks(n, unit)), dtype=bool) if not exists else written_units(group, split)
        known[split] = done
        writes = write_blocks(_write_units, location, storage_options, split, arrs, unit=unit, block=block,
                              done=done, token=token)
        if writes is not None:
            tasks.append((split, writes, block // unit))
    if tasks:
        try:
            reports = compute(*(w for _, w, _ in tasks), desc="writing chunks", progress=progress)
        except OSError as exc:
            # Disk full, read-only, permission: every unit written so far is recorded,
            # so the same write resumes once the cause is fixed.
            raise StoreError(
                f"{location}: cannot write ({exc.strerror or exc}); the units written so far are kept "
                "and recorded: fix the cause and rerun the same write to resume"
            ) from exc
        for (split, _, per_block), count in zip(tasks, reports):
            known[split] = _confirm_written(group, split, known[split], int(np.sum(count)), per_block)

    # Completeness: every unit has its marker; only then is the store marked complete.
    counts = {}
    for split, arrs in groups.items():
        n = int(next(iter(arrs.values())).shape[0])
        missing = np.flatnonzero(~known[split]).tolist() if n else []
        if missing:
            raise StoreError(f"{location}: split {split!r}: write units {missing[:5]} were not written")
        if split != SHARED:
            counts[split] = n
    check = BEFORE_COMPLETE.get()
    if check is not None:
        check()
    # Before the store is marked complete: a crash leaves it incomplete, and the
    # resumed write comes here again and rewrites them.
    _write_folds(group, folds or {}, codec)
    meta = dict(store_root_attrs(group))
    meta.pop(RESUME_KEY, None)  # only for the resume of an incomplete store
    meta.update(dict(attrs or {}))
    meta.update({
        "format_version": FORMAT_VERSION,
        "fingerprint": fingerprint,
        "splits": counts,
        "chunk_samples": per_chunk,
        "shard_chunks": shard_chunks,
        "codec": codec.describe(),
        "versions": _versions(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "complete": True,
    })
    shared_rows = int(next(iter(groups[SHARED].values())).shape[0]) if SHARED in groups else None
    meta[HISTORY] = record(meta, kind="build", samples=counts, shared_rows=shared_rows, group=group)
    group.attrs[ATTRS_KEY] = json.loads(json.dumps(meta, default=str))
