"""Appending samples to a complete store, as a new version (see :mod:`~pipeline.storage.versions`).

The order of an append, and why each step is safe to interrupt at any point:

1. the append is recorded as pending (what it adds, from which version): readers ignore
   it, and a rerun of the same append knows which of its units are already written;
2. every array grows to its new length (metadata only: readers slice to their version);
3. the write units from the one holding the last stored sample are written, each
   followed by its marker, exactly as :func:`~pipeline.storage.writer.write` writes.
   The unit holding the last stored samples is rewritten whole (its stored samples
   read back first) through zarr's store, whose local writes replace a file by a
   rename and whose object-store writes are single PUTs: a reader sees the old unit or
   the new one, and the stored samples are the same in both;
4. new fold index arrays are written (a fold's indices never change once written);
5. the root attributes gain the new version's record: the commit. Until then every
   reader opens the previous version, complete and unchanged.

The pending record of step 1 is written together with a root attribute of its own,
``append_in_progress`` (:data:`~pipeline.storage.versions.IN_PROGRESS`), beside the
``pipeline`` attributes, and the commit removes both in one write: the store's rule,
completeness last. pipeline's readers slice every array to the version they open, and
need neither. A plain zarr reader does not: while that attribute is there, arrays are
longer than the complete version, their samples past its counts (``samples`` in the
attribute, ``splits`` in the ``pipeline`` attributes) not written yet, or zeros.

A write that fails (a full disk, a read-only store) stops the append before its commit
with one line, :class:`~pipeline.errors.StoreError`: the previous version is intact, and
the units written so far are kept for the rerun to resume from.

A zip store is unpacked beside itself, appended to, repacked and swapped in whole by a
rename: readers that have the old file open keep reading it.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
import warnings
import zipfile
from typing import Any, Mapping, Sequence

import dask
import dask.array as da
import numpy as np

from pipeline.errors import StoreError
from pipeline.progress import compute
from pipeline.storage import inflight
from pipeline.storage.layout import task_block
from pipeline.storage.lock import write_lock
from pipeline.storage.store import ATTRS_KEY, FOLDS, is_remote, is_zip, open_store_group, store_root_attrs
from pipeline.storage.versions import HISTORY, IN_PROGRESS, PENDING, Version, pinned_array, record, versions_of
from pipeline.storage.writer import SHARED, WRITTEN, _pack_zip, _write_units, write_fold_arrays, written_units

__all__ = ["append", "cannot_write", "in_progress"]


def append(
    target: str | os.PathLike[str],
    splits: Mapping[str, Mapping[str, Any]],
    *,
    attrs: Mapping[str, Any],
    token: str,
    shared: Mapping[str, Any] | None = None,
    folds: Mapping[str, np.ndarray] | None = None,
    added: Sequence[str] = (),
    storage_options: dict[str, Any] | None = None,
    progress: bool = True,
) -> str:
    """Add samples after the stored ones of each split, as the store's next version.

    Parameters
    ----------
    target
        A complete store (directory, ``.zarr.zip`` or fsspec URL).
    splits
        ``{"train": {"x": ..., "y": ...}, ...}``: the new samples of each split (numpy or
        dask arrays), with exactly the arrays the store holds in that split, of the same
        dtypes and sample shapes. A split may be left out, or have 0 new samples.
    attrs
        The store's attributes after the append (sample counts and versions are set
        here).
    token
        Identifies what this append adds (for example a hash of its files): a rerun with
        the same token resumes an interrupted append; another token starts it over.
    shared
        New rows of the shared arrays (virtual windows' per-step features).
    folds
        Fold index arrays to add (``{"fold5/train": indices}``); stored folds are kept.
    added
        Labels of the sessions added, for the version's record.
    storage_options, progress
        fsspec options; show a progress bar.

    Returns
    -------
    str
        The store location.

    Raises
    ------
    StoreError
        Before anything is written: a store that is not complete, a split or array the
        store does not hold, or one whose dtype or sample shape differs.
    """
    location = os.fspath(target)
    if is_zip(location):
        return _append_zip(location, splits, attrs=attrs, token=token, shared=shared, folds=folds, added=added,
                           progress=progress)
    with write_lock(location):
        _append_dir(location, splits, attrs, token, shared, folds, added, storage_options, progress)
    return location


def cannot_write(label: str, exc: OSError, *, resumes: bool = True) -> str:
    """The one line that says a write of an append failed (``exc``: a full disk, a
    read-only store, no permission) and what is left of the store ``label``.

    An append writes nothing readers see before its commit, so the previous version is
    intact; a directory store keeps the units written (their markers say which) for the
    rerun to resume from, where a zip store's unpacked copy is dropped by the rerun.
    """
    rerun = ("rerun the same run: the append resumes where it stopped" if resumes else
             "rerun the same run to append again")
    return (f"{label}: cannot write ({exc.strerror or exc}); the append stopped before its commit: the store's "
            f"previous version is intact and readers keep seeing it; fix the cause and {rerun}")


def _append_zip(location: str, splits: Mapping[str, Any], **kwargs: Any) -> str:
    if is_remote(location):
        raise StoreError(f"{location}: zip stores are local; append to a directory store on object storage")
    staging = location + ".append.zarr"
    with write_lock(location):
        if os.path.exists(staging):
            shutil.rmtree(staging)  # an interrupted append's unpacking: the zip is intact
        try:
            with zipfile.ZipFile(location) as zf:
                zf.extractall(staging)
            _append_dir(staging, splits, kwargs["attrs"], kwargs["token"], kwargs["shared"], kwargs["folds"],
                        kwargs["added"], None, kwargs["progress"], label=location, resumes=False)
            _pack_zip(staging, location)
        except OSError as exc:  # the folder beside the zip is full or read-only: the zip is untouched
            raise StoreError(cannot_write(location, exc, resumes=False)) from exc
        shutil.rmtree(staging)
    return location


def _checked(group: Any, location: str, splits: Mapping[str, Mapping[str, Any]],
             shared: Mapping[str, Any] | None) -> dict[str, dict[str, da.Array]]:
    """The new arrays per group of the store (``_shared`` included), checked against
    what the store holds."""
    out: dict[str, dict[str, da.Array]] = {}
    for split, arrays in [*splits.items(), *([(SHARED, shared)] if shared else [])]:
        if split not in group:
            raise StoreError(f"{location}: no split {split!r} to append to")
        stored = {name: a for name, a in group[split].arrays() if not name.startswith("_") or split == SHARED}
        stored.pop(WRITTEN, None)
        given = {str(k): v if isinstance(v, da.Array) else da.from_array(np.asarray(v), chunks=-1)
                 for k, v in arrays.items()}
        if set(given) != set(stored):
            raise StoreError(f"{location}: split {split!r} holds arrays {sorted(stored)}, the append brings "
                             f"{sorted(given)}")
        lengths = {k: int(a.shape[0]) for k, a in given.items()}
        if len(set(lengths.values())) > 1:
            raise StoreError(f"{location}: split {split!r}: new arrays of different lengths {lengths}")
        for name, a in given.items():
            want = (stored[name].dtype, tuple(stored[name].shape[1:]))
            if (np.dtype(a.dtype), tuple(a.shape[1:])) != want:
                raise StoreError(f"{location}: {split}/{name}: the store holds {want[0]} samples of shape "
                                 f"{want[1]}, the append brings {a.dtype} of shape {tuple(a.shape[1:])}")
        out[split] = given
    return out


def _append_dir(location: str, splits: Mapping[str, Mapping[str, Any]], attrs: Mapping[str, Any], token: str,
                shared: Mapping[str, Any] | None, folds: Mapping[str, np.ndarray] | None, added: Sequence[str],
                storage_options: dict[str, Any] | None, progress: bool, *, label: str | None = None,
                resumes: bool = True) -> None:
    """:func:`append` into the directory (or object) store ``location``; errors name
    ``label`` (the zip a staging directory is packed into), and an ``OSError`` of any
    write, here or on a worker, is one :class:`~pipeline.errors.StoreError`."""
    said = {"label": label or location, "resumes": resumes}
    group = open_store_group(location, mode="r+", storage_options=storage_options)
    meta = store_root_attrs(group)
    if not meta.get("complete"):
        raise StoreError(f"{location}: the store is incomplete; finish its build (rerun the same run) before "
                         "appending to it")
    arrays = _checked(group, location, splits, shared)
    latest = versions_of(meta)[-1]
    base = {split: int(latest.samples.get(split, 0)) for split in arrays if split != SHARED}
    if SHARED in arrays:
        base[SHARED] = int(latest.shared_rows if latest.shared_rows is not None
                           else group[f"{SHARED}/features"].shape[0])
    pending = meta.get(PENDING)
    resume = isinstance(pending, Mapping) and pending.get("token") == token and pending.get("base") == base
    meta[PENDING] = {"token": token, "base": base, "version": latest.number + 1}
    try:
        _write(group, location, storage_options, arrays, meta, latest, base, resume, attrs, folds, added, progress,
               said)
    except OSError as exc:  # the client's own writes: the pending record, metadata, folds, the commit
        raise StoreError(cannot_write(said["label"], exc, resumes=resumes)) from exc


def _write(group: Any, location: str, storage_options: dict[str, Any] | None, arrays: Mapping[str, Any],
           meta: dict[str, Any], latest: Version, base: Mapping[str, int], resume: bool, attrs: Mapping[str, Any],
           folds: Mapping[str, np.ndarray] | None, added: Sequence[str], progress: bool,
           said: Mapping[str, Any]) -> None:
    """Steps 1 to 5 of an append (see the module's docstring), once its input is checked."""
    # One write: the pending record and the root attribute that tells plain zarr readers
    # an append is under way (they do not slice arrays to the version they read).
    group.update_attributes({ATTRS_KEY: json.loads(json.dumps(meta, default=str)),
                             IN_PROGRESS: in_progress(latest, latest.number + 1)})

    tasks = []
    call = uuid.uuid4().hex
    for split, new in arrays.items():
        tasks += _grow(group, location, storage_options, split, new, base[split], resume, call, said)
    if tasks:
        try:
            compute(*tasks, desc="appending chunks", progress=progress)
        except BaseException:
            # Tasks already running outlive the failed wait for them: none may still write
            # units once the store's lock is let go, or a rerun with other files would
            # find them written over its own (see pipeline.storage.inflight).
            if not inflight.settle(call):
                warnings.warn(f"{said['label']}: tasks of the stopped append may still be running on workers that "
                              "did not answer; wait until they have ended before appending again",
                              RuntimeWarning, stacklevel=2)
            raise
    for split, new in arrays.items():
        if not int(next(iter(new.values())).shape[0]):
            continue
        n = base[split] + int(next(iter(new.values())).shape[0])
        probe = group[split][next(iter(new))]
        units = -(-n // int((probe.shards or probe.chunks)[0]))
        missing = np.flatnonzero(~written_units(group, split)[:units]).tolist()
        if missing:
            raise StoreError(f"{location}: split {split!r}: write units {missing[:5]} were not written")
    if folds:
        _add_folds(group, folds, meta)

    out = dict(attrs)
    counts = {split: base.get(split, int(latest.samples.get(split, 0))) for split in latest.samples}
    for split, new in arrays.items():
        if split != SHARED:
            counts[split] = base[split] + int(next(iter(new.values())).shape[0])
    shared_rows = (base[SHARED] + int(arrays[SHARED]["features"].shape[0])) if SHARED in arrays else latest.shared_rows
    out.update({"splits": counts, "complete": True})
    out[HISTORY] = record({**meta, **out}, kind="append", samples=counts, shared_rows=shared_rows, added=added,
                          group=group)
    out.pop(PENDING, None)
    # The commit, in one write: the new version's record in, the in-progress mark out.
    rest = {k: v for k, v in group.attrs.asdict().items() if k not in (ATTRS_KEY, IN_PROGRESS)}
    group.attrs.put({**rest, ATTRS_KEY: json.loads(json.dumps(out, default=str))})


def in_progress(latest: Version, version: int) -> dict[str, Any]:
    """The root attribute :data:`~pipeline.storage.versions.IN_PROGRESS` of an append to
    ``version`` after ``latest``: the version a plain reader should read, and its sample
    counts per split (rows of the shared features under ``_shared``)."""
    samples = dict(latest.samples)
    if latest.shared_rows is not None:
        samples[SHARED] = int(latest.shared_rows)
    return {"version": int(version), "complete_version": int(latest.number), "samples": samples}


def _grow(group: Any, location: str, storage_options: dict[str, Any] | None, split: str,
          new: Mapping[str, da.Array], n0: int, resume: bool, call: str, said: Mapping[str, Any]) -> list[Any]:
    """Grow one split's arrays by the new samples and return the tasks that write them:
    from the unit holding sample ``n0`` (its stored samples read back) to the end."""
    m = int(next(iter(new.values())).shape[0])
    if m == 0:
        return []  # nothing to add: the stored units stay as they are
    n1 = n0 + m
    sub = group[split]
    probe = sub[next(iter(new))]
    unit = int((probe.shards or probe.chunks)[0])
    for name in new:
        if sub[name].shape[0] != n1:
            sub[name].resize((n1, *sub[name].shape[1:]))
    table = sub[WRITTEN]
    n_units = -(-n1 // unit)
    if table.shape[0] != n_units:
        table.resize((n_units, table.shape[1]))
    u0 = n0 // unit
    if not resume and n_units > u0:
        table[u0:n_units] = 0  # units past the stored samples: rewritten from scratch
    start = u0 * unit
    options = json.dumps(storage_options or {}, sort_keys=True, default=str)
    data = {}
    for name, a in new.items():
        if start < n0:
            stored = pinned_array(sub[name], n0)
            tail = da.from_delayed(dask.delayed(_read_rows)(location, options, f"{split}/{name}", start, n0),
                                   shape=(n0 - start, *stored.shape[1:]), dtype=stored.dtype)
            a = da.concatenate([tail, a.astype(stored.dtype)])
        data[name] = a
    sample_bytes = max(int(np.prod(a.shape[1:], dtype=np.int64)) * a.dtype.itemsize for a in data.values())
    block = task_block(unit, sample_bytes)
    # Blocks end on multiples of ``block`` counted from sample 0, as the first build's.
    edges = [start, *range((start // block + 1) * block, n1, block), n1]
    chunks = tuple(int(b - a) for a, b in zip(edges, edges[1:]))
    blocks = {k: a.rechunk({0: chunks, **{i: -1 for i in range(1, a.ndim)}}).to_delayed().ravel()
              for k, a in data.items()}
    done = written_units(group, split)
    if start < n0:
        # The unit holding the last stored samples: its marker may still be the stored
        # version's (an attempt stopped before clearing it), so every attempt rewrites it.
        done[u0] = False
    tasks = []
    for b, (lo, hi) in enumerate(zip(edges, edges[1:])):
        todo = [(u, max(lo, u * unit), min(hi, (u + 1) * unit)) for u in range(lo // unit, -(-hi // unit))
                if not done[u]]
        if todo:
            tasks.append(dask.delayed(_write_block)(location, storage_options, split, todo, lo,
                                                    {k: blk[b] for k, blk in blocks.items()}, call, said))
    return tasks


def _write_block(location: str, storage_options: dict[str, Any] | None, split: str, todo: list[tuple[int, int, int]],
                 start: int, blocks: dict[str, np.ndarray], call: str, said: Mapping[str, Any]) -> int:
    """The writer's ``_write_units`` for one block, on a worker, with an ``OSError`` (a
    full disk, a read-only store) made the append's one-line error here: a
    :class:`~pipeline.errors.StoreError`, which the workers do not log as a failed task
    with its traceback (:mod:`pipeline.workerlog`), and which the client raises as it is."""
    try:
        return _write_units(location, storage_options, split, todo, start, blocks, call)
    except OSError as exc:
        raise StoreError(cannot_write(said["label"], exc, resumes=said["resumes"])) from exc


def _read_rows(location: str, options: str, path: str, lo: int, hi: int) -> np.ndarray:
    """Stored samples ``[lo, hi)`` of an array (a unit's stored part, read back to be
    rewritten with the new samples after it). Runs on a worker."""
    group = open_store_group(location, mode="r", storage_options=json.loads(options) or None)
    return np.asarray(group[path][lo:hi])


def _add_folds(group: Any, folds: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
    """Write the folds the store does not hold yet. A fold's indices never change once
    written (folds only grow at the end), so stored ones are left as they are: readers
    may be using them."""
    info = meta.get("folds") or {}
    stored = list(info.get("names") or [])
    new = {name: idx for name, idx in folds.items() if name not in set(stored)}
    if not new:
        return
    # The stored folds' codec (1-D integers, as the first build wrote them). A new
    # fold left by an interrupted attempt is not listed yet, so no reader uses it.
    like = group[f"{FOLDS}/{stored[0]}"] if stored else group[f"{info.get('base', 'train')}/session"]
    write_fold_arrays(group, new, like.compressors)
