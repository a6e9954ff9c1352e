"""Streaming a subset of a split: the samples of a fold, served from the base split's chunks.

A walk-forward fold stores no windows, only the sorted indices of its samples in one
base split (``folds/fold2/train`` in the store, see :func:`pipeline.storage.write`). Its
indices are unions of long contiguous runs (sessions, days), so the subset is served as
pieces of base chunks rather than sample by sample: chunk ``c`` of the subset is the
fold's samples inside one base chunk, kept as runs ``[lo, hi)`` of that chunk. The
streamer plans, shards among ranks and workers, mixes and resumes over the subset's
chunk lengths exactly as over a plain split's; a piece of a subset chunk reads its runs
of the base chunk:

- one run (the common case: a fold's chunk lies within one session) is the plain
  split's read of a piece, :meth:`~pipeline.streaming.chunks.ChunkReader.scatter`
  (for large blosc chunks only the blocks holding the run are decoded);
- several runs (a session boundary inside the chunk) decode the base chunk once and
  gather the runs' rows with one fancy index
  (:meth:`~pipeline.streaming.chunks.ChunkReader.scatter_runs`), a few runs of a large
  blosc chunk by blocks, run by run.

So a fold reads each base chunk it touches once per epoch, as a plain split does; only
chunks at the ends of its runs are decoded for part of their samples.

:func:`subset_layout` and :func:`piece_runs` are the pure arithmetic; :class:`SubsetSource`
wraps any source (a store split, arrays) and :class:`FoldSource` opens a store's fold.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from pipeline.errors import StoreError, StreamError
from pipeline.streaming.chunks import runs_index
from pipeline.streaming.localstore import open_root
from pipeline.streaming.plan import Piece

__all__ = ["FoldSource", "SubsetLayout", "SubsetSource", "check_subset_index", "open_store_source", "piece_runs",
           "subset_layout"]


@dataclass(frozen=True, slots=True)
class SubsetLayout:
    """A subset of a chunked sequence, as chunks of runs.

    Subset chunk ``c`` holds the subset's samples inside base chunk ``chunks[c]``: the
    runs ``k`` in ``[first[c], first[c + 1])``, each the base chunk's offsets
    ``[lo[k], hi[k])``, placed from ``pos[k]`` on in the subset chunk.
    """

    chunks: np.ndarray
    lengths: tuple[int, ...]
    first: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    pos: np.ndarray


def check_subset_index(index: Any, n: int, where: str) -> np.ndarray:
    """``index`` as int64 if it is a 1-D, strictly increasing array of integers in
    ``[0, n)``.

    Raises
    ------
    StreamError
        Naming ``where`` and what the index breaks.
    """
    a = np.asarray(index)
    if a.ndim != 1 or not (a.dtype.kind in "iu" or a.size == 0):
        raise StreamError(f"{where}: expected a 1-D array of integer sample indices, got {a.dtype} of shape {a.shape}")
    a = a.astype(np.int64, copy=False)
    if a.size and (int(a[0]) < 0 or int(a[-1]) >= n):
        raise StreamError(f"{where}: sample indices must lie in 0..{n - 1}, got {int(a.min())}..{int(a.max())}")
    bad = np.flatnonzero(np.diff(a) <= 0)
    if bad.size:
        k = int(bad[0])
        raise StreamError(f"{where}: sample indices must be sorted and unique, got {int(a[k])} then "
                          f"{int(a[k + 1])} at positions {k}, {k + 1}")
    return a


def subset_layout(index: np.ndarray, lengths: Sequence[int]) -> SubsetLayout:
    """The chunks of runs of the sorted, unique sample ``index`` over chunks of ``lengths``."""
    index = np.asarray(index, dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64))])
    if index.size == 0:
        empty = np.empty(0, np.int64)
        return SubsetLayout(empty, (), np.zeros(1, np.int64), empty, empty, empty)
    # Runs of consecutive indices, then each run cut where it crosses a chunk boundary.
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    run_lo = index[np.concatenate([[0], breaks])]
    run_hi = index[np.concatenate([breaks - 1, [index.size - 1]])] + 1
    c0 = np.searchsorted(bounds, run_lo, side="right") - 1
    c1 = np.searchsorted(bounds, run_hi - 1, side="right") - 1
    parts = c1 - c0 + 1
    run = np.repeat(np.arange(run_lo.size), parts)
    chunk = c0[run] + np.arange(run.size) - np.repeat(np.cumsum(parts) - parts, parts)
    lo = np.maximum(run_lo[run], bounds[chunk]) - bounds[chunk]
    hi = np.minimum(run_hi[run], bounds[chunk + 1]) - bounds[chunk]
    chunks, first = np.unique(chunk, return_index=True)
    first = np.concatenate([first, [chunk.size]]).astype(np.int64)
    sizes = hi - lo
    counts = np.add.reduceat(sizes, first[:-1])
    pos = np.cumsum(sizes) - sizes - np.repeat(np.cumsum(counts) - counts, np.diff(first))
    return SubsetLayout(chunks.astype(np.int64), tuple(int(c) for c in counts), first, lo, hi, pos)


def piece_runs(layout: SubsetLayout, chunk: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Samples ``[lo, hi)`` of subset chunk ``chunk``, as runs ``[starts, stops)`` of
    its base chunk."""
    a, b = int(layout.first[chunk]), int(layout.first[chunk + 1])
    pos, rlo, rhi = layout.pos[a:b], layout.lo[a:b], layout.hi[a:b]
    k0 = int(np.searchsorted(pos, lo, side="right")) - 1
    k1 = int(np.searchsorted(pos, hi, side="left"))
    starts = rlo[k0:k1] + np.maximum(lo - pos[k0:k1], 0)
    stops = rlo[k0:k1] + np.minimum(hi - pos[k0:k1], rhi[k0:k1] - rlo[k0:k1])
    return starts, stops


class SubsetSource:
    """The samples ``index`` of a source (sorted, unique), as a source of its own.

    Chunk ``c`` is the subset's samples in one base chunk (:func:`subset_layout`); reads
    go to the base source's chunks. The base is a
    :class:`~pipeline.streaming.sources.StoreSource` (reads of several runs decode the
    base chunk once) or any source with ``read`` and ``scatter`` (they then read the
    base chunk and index it).
    """

    def __init__(self, base: Any, index: Any, where: str = "subset"):
        self.base = base
        self.names = tuple(base.names)
        self.index = check_subset_index(index, int(sum(base.lengths)), where)
        self.layout = subset_layout(self.index, base.lengths)
        self.lengths = self.layout.lengths

    @property
    def lazy(self) -> bool:
        """Whether reading a chunk computes it (see ``ArraySource.lazy``)."""
        return bool(getattr(self.base, "lazy", False))

    def _runs(self, chunk: int, lo: int, hi: int) -> tuple[int, np.ndarray, np.ndarray]:
        starts, stops = piece_runs(self.layout, chunk, lo, hi)
        return int(self.layout.chunks[chunk]), starts, stops

    def read(self, name: str, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        n = self.lengths[chunk]
        base, starts, stops = self._runs(chunk, 0, n)
        if starts.size == 1 and starts[0] == 0 and stops[0] == self.base.lengths[base]:
            return self.base.read(name, base, out)  # the whole base chunk
        if out is None:
            tail, dtype = self.sample_shape(name)
            out = np.empty((n,) + tuple(tail), dtype=dtype)
        self._scatter(name, base, starts, stops, out, np.arange(n))
        return out

    def scatter(self, name: str, piece: Piece, out: np.ndarray, rows: np.ndarray) -> None:
        """Samples ``[piece.lo, piece.hi)`` of subset chunk ``piece.chunk`` to ``out[rows]``."""
        base, starts, stops = self._runs(piece.chunk, piece.lo, piece.hi)
        self._scatter(name, base, starts, stops, out, rows)

    def _scatter(self, name: str, base: int, starts: np.ndarray, stops: np.ndarray, out: np.ndarray,
                 rows: np.ndarray) -> None:
        if starts.size == 1:  # one run: the plain split's read of a piece
            self.base.scatter(name, Piece(base, int(starts[0]), int(stops[0])), out, rows)
        elif hasattr(self.base, "scatter_runs"):
            self.base.scatter_runs(name, base, starts, stops, out, rows)
        else:
            out[rows] = self.base.read(name, base)[runs_index(starts, stops)]

    def read_rows(self, name: str, chunk: int, lo: int, hi: int) -> Any:
        """Samples ``[lo, hi)`` of subset chunk ``chunk`` of an assembled array (virtual
        windows), as a :class:`~pipeline.streaming.virtual.WindowRows`."""
        base, starts, stops = self._runs(chunk, lo, hi)
        if starts.size == 1:
            return self.base.read_rows(name, base, int(starts[0]), int(stops[0]))
        return self.base.read_rows_runs(name, base, starts, stops)

    def assembled(self, name: str) -> bool:
        return self.base.assembled(name)

    def sample_shape(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        return self.base.sample_shape(name)

    def will_read(self, chunks: Sequence[int], epoch: int) -> None:
        """The base chunks an epoch reads next, in order (see ``StoreSource.will_read``)."""
        will_read = getattr(self.base, "will_read", None)
        if will_read is not None:
            will_read([int(self.layout.chunks[c]) for c in chunks], epoch)

    def advise(self, chunks: Sequence[int]) -> None:
        """The base chunks to be read soon, in order (see ``StoreSource.advise``)."""
        advise = getattr(self.base, "advise", None)
        if advise is not None:
            advise(list(dict.fromkeys(int(self.layout.chunks[c]) for c in chunks)))

    def check_intact(self) -> None:
        """Refuse to go on when the base's store was replaced (see ``StoreSource.check_intact``)."""
        check = getattr(self.base, "check_intact", None)
        if check is not None:
            check()

    def release(self) -> None:
        """Give back what the base source keeps between epochs (mapped chunk files)."""
        release = getattr(self.base, "release", None)
        if release is not None:
            release()

    def _reopen(self) -> None:
        """After a fork, let the base source open its store again (see ``StoreSource``)."""
        reopen = getattr(self.base, "_reopen", None)
        if reopen is not None:
            reopen()


def fold_names(meta: Mapping[str, Any]) -> tuple[str, ...]:
    """The folds a store's ``pipeline`` attributes list (none when absent)."""
    info = meta.get("folds")
    return tuple(info.get("names") or ()) if isinstance(info, Mapping) else ()


class FoldSource(SubsetSource):
    """A fold of a store: its index array, over the base split's chunks.

    Only the store's location travels to DataLoader workers (as for a
    :class:`~pipeline.streaming.sources.StoreSource`); each reads the fold's indices
    again, rather than receiving a copy of a possibly long index array.

    Raises
    ------
    StoreError
        When the stored index is not what the writer wrote (not sorted and unique, out
        of its base split, or of another length than recorded).
    """

    def __init__(self, location: Any, fold: str, names: Sequence[str], partial: bool,
                 storage_options: dict | None, verify: bool = False, version: int | None = None,
                 cache: Any = None, identity: Any = None, keep_mapped: int | None = None):
        from pipeline.storage.store import FOLDS, store_root_attrs
        from pipeline.storage.versions import attrs_at, select_version
        from pipeline.streaming.sources import StoreSource
        from pipeline.streaming.storeid import StoreGuard, local_store_dir

        self.location, self.fold, self.partial = location, fold, partial
        self.storage_options, self.verify = storage_options, verify
        label = location if isinstance(location, (str, os.PathLike)) else "<group>"
        # The directory whose fold index is read below: the base split must be read from
        # the same one (see StoreSource).
        directory = local_store_dir(location)
        if directory is not None:
            identity = StoreGuard(directory, str(label), identity).identity
        group = open_root(location, storage_options)
        meta = store_root_attrs(group)
        self.version = select_version(meta, version, str(label)).number
        info = attrs_at(meta, select_version(meta, self.version, str(label)))["folds"]
        if fold not in (info.get("names") or ()):
            raise StreamError(f"{label}: version {self.version} has no fold {fold!r} (it was appended later); "
                              f"folds: {', '.join(info.get('names') or ()) or 'none'}")
        where = f"{label}: fold {fold!r} ({FOLDS}/{fold})"
        try:
            index = group[f"{FOLDS}/{fold}"][:]
        except KeyError as exc:
            raise StoreError(f"{where}: listed in the store's attributes, but its index array is missing") from exc
        base = StoreSource(location, info["base"], names, partial, storage_options, verify, self.version,
                           cache=cache, identity=identity, keep_mapped=keep_mapped)
        expected = (info.get("counts") or {}).get(fold)
        if expected is not None and int(index.size) != int(expected):
            raise StoreError(f"{where}: {index.size} sample indices stored, {expected} recorded")
        try:
            super().__init__(base, index, where)
        except StreamError as exc:
            raise StoreError(f"{exc} (the store is damaged: write it again)") from None

    def at_version(self, version: int | None) -> "FoldSource":
        """The same fold at another version of the store (``None``: the newest)."""
        return FoldSource(self.location, self.fold, self.names, self.partial, self.storage_options, self.verify,
                          version, cache=self.base.cache_spec, identity=self.base.identity,
                          keep_mapped=self.base.keep_mapped)

    def __getstate__(self) -> dict:
        if not isinstance(self.location, (str, os.PathLike)):
            raise StreamError("a stream over an open zarr group cannot be sent to worker processes; pass its path")
        return {"location": self.location, "fold": self.fold, "names": self.names, "partial": self.partial,
                "storage_options": self.storage_options, "verify": self.verify, "version": self.version,
                "cache": self.base.cache_spec, "identity": self.base.identity,
                "keep_mapped": self.base.keep_mapped}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["location"], state["fold"], state["names"], state["partial"], state["storage_options"],
                      state["verify"], state.get("version"), cache=state.get("cache"), identity=state.get("identity"),
                      keep_mapped=state.get("keep_mapped"))


def open_store_source(location: Any, split: str, names: Sequence[str], partial: bool,
                      storage_options: dict | None, verify: bool = False, version: int | None = None,
                      cache: Any = None, keep_mapped: int | None = None) -> Any:
    """The source of ``split`` of a store: a split, or a fold named in its attributes,
    keeping up to ``keep_mapped`` bytes of chunk files mapped (see
    :func:`~pipeline.streaming.sources.map_budget`).

    Raises
    ------
    StreamError
        When ``split`` is neither, listing the store's splits and folds.
    """
    from pipeline.storage.store import store_root_attrs
    from pipeline.streaming.sources import StoreSource

    meta = store_root_attrs(open_root(location, storage_options))
    if split in fold_names(meta):
        return FoldSource(location, split, names, partial, storage_options, verify, version, cache=cache,
                          keep_mapped=keep_mapped)
    return StoreSource(location, split, names, partial, storage_options, verify, version, cache=cache,
                       keep_mapped=keep_mapped)
