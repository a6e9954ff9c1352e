"""Where a stream's chunks come from: a zarr store's split, or arrays in memory or dask.

A source knows its chunk lengths along axis 0 and reads chunk ``i`` of an array by name
(into a given buffer when it can). The streamer plans and mixes; sources only read.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from pipeline.errors import IncompleteStoreError, StreamError
from pipeline.storage.store import FOLDS
from pipeline.streaming.chunks import ChunkReader, native_dtype
from pipeline.streaming.localstore import is_group, open_root
from pipeline.streaming.maps import MapCache, default_map_budget
from pipeline.streaming.readahead import ReadAhead, local_files
from pipeline.streaming.storeid import DirIdentity, StoreGuard, local_store_dir
from pipeline.streaming.zarrmeta import cf_problem, chunk_reader

__all__ = ["ArraySource", "StoreSource", "available_splits", "is_split_group", "read_part"]

DEFAULT_ARRAY_CHUNK = 4096
_REOPEN_LOCK = threading.Lock()


def is_split_group(name: str, node: Any) -> bool:
    """Whether ``name`` at a store's root is a split: a group, and not the ``folds``
    group of fold indices (a split of that name has the writer's ``_written`` table)."""
    return is_group(node) and (name != FOLDS or "_written" in node)


def available_splits(group: Any, meta: Mapping[str, Any]) -> str:
    """What a store offers to stream, for error messages: its splits and its folds."""
    order = list(meta.get("splits") or {})
    present = [name for name, sub in group.groups() if not name.startswith("_") and is_split_group(name, sub)]
    splits = sorted(present, key=lambda n: (order.index(n) if n in order else len(order), n))
    info = meta.get("folds")
    folds = list(info.get("names") or []) if isinstance(info, Mapping) else []
    return f"splits: {', '.join(splits) or 'none'}; folds: {', '.join(folds) or 'none'}"


def map_budget(keep_mapped: int | None) -> int:
    """Bytes of chunk files a stream keeps mapped for ``keep_mapped`` asked (None: the
    default), at most :func:`~pipeline.streaming.maps.default_map_budget`: a quarter of
    the memory the process may use (its cgroup's limit where lower), at most 16 GiB."""
    budget = default_map_budget()
    return budget if keep_mapped is None else max(0, min(int(keep_mapped), budget))


def self_checked(array: Any) -> bool:
    """Whether every chunk of zarr array ``array`` carries a checksum that reading it
    checks: zarr's ``crc32c`` codec in its codecs, or in its shards' inner codecs (zarr 3),
    or among its filters (zarr 2). zarr checks those on every read, whether asked or not."""
    meta = getattr(getattr(array, "metadata", None), "to_dict", lambda: {})()
    if meta.get("zarr_format") == 2:
        steps = [*(meta.get("filters") or []), meta.get("compressor") or {}]
        return any(isinstance(f, Mapping) and f.get("id") == "crc32c" for f in steps)
    codecs = list(meta.get("codecs") or [])
    for codec in codecs:
        if isinstance(codec, Mapping) and codec.get("name") == "sharding_indexed":
            codecs += list((codec.get("configuration") or {}).get("codecs") or [])
    return any(isinstance(c, Mapping) and c.get("name") == "crc32c" for c in codecs)


def warn_unverifiable(label: str, arrays: Sequence[Any] = ()) -> None:
    """Warn that ``verify=True`` cannot verify ``label``, which holds no checksums of
    pipeline's: said, not silently skipped. Not where every zarr array of ``arrays``
    carries its own (:func:`self_checked`): zarr checks those on every read."""
    if arrays and all(self_checked(a) for a in arrays):
        return
    warnings.warn(f"verify=True: {label} holds no checksums (pipeline did not write it, and its arrays have no "
                  "crc32c codec); its chunks are decoded but cannot be verified", RuntimeWarning,
                  stacklevel=caller_stacklevel())


def caller_stacklevel() -> int:
    """The ``stacklevel`` of ``warnings.warn`` (called by the caller of this function)
    that names the first frame outside this package: the user's line, however deep the
    package's own calls run (Python 3.12's ``skip_file_prefixes``, by hand)."""
    import sys

    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(2), 2  # the function that warns is level 1, its caller 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


class StoreSource:
    """Chunks of the arrays of one split of a zarr store, at one version of the store
    (``version``: the newest when opened, kept however many appends follow)."""

    def __init__(self, location: Any, split: str, names: Sequence[str], partial: bool,
                 storage_options: dict | None, verify: bool = False, version: int | None = None,
                 cache: Any = None, identity: DirIdentity | None = None, opened: Mapping[str, Any] | None = None,
                 keep_mapped: int | None = None):
        from pipeline.storage.store import ATTRS_KEY, store_root_attrs
        from pipeline.streaming.cache import open_remote_cache
        from pipeline.storage.versions import pinned_array, select_version, verified_sums

        self.location, self.split, self.names = location, split, tuple(names)
        self.partial, self.storage_options, self.verify = partial, storage_options, verify
        label = location if isinstance(location, (str, os.PathLike)) else "<group>"
        # A local store's directory, opened before its metadata is read: an overwrite
        # that replaces it later is caught at the next group (storeid). ``identity`` is
        # the first opening's, for a DataLoader worker or another version opening again.
        directory = local_store_dir(location)
        self.guard = None if directory is None else StoreGuard(directory, str(label), identity)
        group = open_root(location, storage_options)
        meta = store_root_attrs(group)
        # A group another tool wrote makes no completeness claim and streams as it is; a
        # store this package writes is refused until its writer marks it complete.
        foreign = ATTRS_KEY not in group.attrs
        if not foreign and not meta.get("complete") and not partial:
            raise IncompleteStoreError(str(label))
        # The version is resolved to its number here, so that DataLoader workers, which
        # reopen the store, read the same one whatever was appended meanwhile.
        pinned = None if foreign else select_version(meta, version, str(label))
        self.version = None if pinned is None else pinned.number
        samples = None if pinned is None else pinned.samples.get(split)
        # Each node opened once: on an object store every open is requests.
        sub = group.get(split)
        if sub is None or not is_split_group(split, sub):
            raise StreamError(f"{label}: no split {split!r}; {available_splits(group, meta)}")
        arrays = {}
        virtual = meta.get("virtual")
        for n in self.names:
            node = sub.get(n)
            if n == "x" and virtual and node is None:
                node = sub.get("ends")  # windows are assembled from the features
            if node is None:
                raise StreamError(f"{label}: split {split!r} has no array {n!r}")
            arrays[n] = node
            # Another tool's encodings (xarray's scale_factor, time units) would make the
            # stored numbers wrong: refused by name rather than served.
            problem = cf_problem(arrays[n]) if foreign else None
            if problem is not None:
                raise StreamError(f"{label}: split {split!r}: variable {n!r}: {problem}")
        if samples is not None:
            arrays = {n: pinned_array(a, samples) for n, a in arrays.items()}
        if foreign and opened is not None:
            # Another tool's group has no versions: a DataLoader worker opening it again
            # serves the samples the stream opened with, whatever was appended since.
            from pipeline.streaming.foreign import as_opened

            arrays = as_opened(arrays, opened, f"{label}: split {split!r}")
        self._opened = None
        if foreign:
            from pipeline.streaming.foreign import array_layout

            self._opened = {"rows": int(next(iter(arrays.values())).shape[0]),
                            "layouts": {n: array_layout(a) for n, a in arrays.items()}}
        shapes = {n: (a.shape[0], a.chunks[0]) for n, a in arrays.items()}
        if len(set(shapes.values())) != 1:
            raise StreamError(f"{label}: split {split!r}: arrays differ in length or chunking: {shapes}")
        sums = None
        if verify and "_written" in group[split]:
            sums = verified_sums(group, split, pinned, samples)
        elif verify and opened is None:  # said once, where the stream is made, not in each DataLoader worker
            warn_unverifiable(f"{label} (split {split!r})", list(arrays.values()))
        # A store marked complete is no longer written: its chunk files can be mapped,
        # and up to map_budget(keep_mapped) bytes of them stay mapped from one epoch to
        # the next. Files of a foreign group may still be rewritten by their tool (a
        # mapped file truncated under us faults): read them.
        self.keep_mapped = None if keep_mapped is None else int(keep_mapped)
        self.maps = MapCache(map_budget(keep_mapped)) if meta.get("complete") and not partial else None
        # A remote store's chunk objects go through a node-local cache when one is asked for.
        self.cache_spec, self.cache = cache, open_remote_cache(cache, group, location, storage_options, meta)
        # A missing chunk file is checked against what the writer recorded for it.
        # Read only then (each node read is a request on an object store).
        recorded = None if foreign else functools.cache(
            lambda: sums if sums is not None else verified_sums(group, split, pinned, samples)
            if "_written" in group[split] else None)
        self.readers = {n: chunk_reader(a, (str(label), split, n), checksums=sums, maps=self.maps, cache=self.cache,
                                        recorded=recorded)
                        for n, a in arrays.items()}
        readers = self.readers  # not self: no cycle keeps a dropped stream's mappings alive
        self.readahead = ReadAhead(lambda c: local_files(readers.values(), (c,)),
                                   mapped=None if self.maps is None else self.maps.holds)
        self._assembled: frozenset[str] = frozenset()  # arrays built from stored rows, not read
        if "x" in self.readers and arrays["x"].path.endswith("/ends"):
            self._assembled = frozenset({"x"})
            from pipeline.streaming.virtual import VirtualWindowReader

            shared_sums = (verified_sums(group, "_shared", pinned, None if pinned is None else pinned.shared_rows)
                           if verify else None)
            features = group["_shared/features"]
            if pinned is not None and pinned.shared_rows is not None:
                features = pinned_array(features, pinned.shared_rows)
            feats = ChunkReader(features, (str(label), "_shared", "features"), shared_sums,
                                maps=self.maps, cache=self.cache, recorded=functools.cache(
                                    lambda: shared_sums if shared_sums is not None else verified_sums(
                                        group, "_shared", pinned, None if pinned is None else pinned.shared_rows)
                                    if "_written" in group["_shared"] else None))
            self.readers["x"] = VirtualWindowReader(self.readers["x"], feats, virtual["size"], virtual["scales"])
        first = self.readers[self.names[0]]
        self.lengths = tuple(first.length(i) for i in range(first.n_chunks))
        # Set last: other threads of a forked child read only once the readers are new.
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        # Only the location travels to DataLoader workers; each reopens the store itself.
        # An open group travels as its store's location (or, for a store that has none,
        # as the store pickled: foreign.store_state), and its path there.
        location = self.location
        if not isinstance(location, (str, os.PathLike)):
            location = _GroupAt(location, forked=False)
        return {"location": location, "split": self.split, "names": self.names,
                "partial": self.partial, "storage_options": self.storage_options, "verify": self.verify,
                "version": self.version, "cache": self.cache_spec, "identity": self.identity,
                "opened": self._opened, "keep_mapped": self.keep_mapped}

    def __setstate__(self, state: dict) -> None:
        location = state["location"]
        if isinstance(location, _GroupAt):
            location = location.open()
        self.__init__(location, state["split"], state["names"], state["partial"], state["storage_options"],
                      state.get("verify", False), state.get("version"), cache=state.get("cache"),
                      identity=state.get("identity"), opened=state.get("opened"),
                      keep_mapped=state.get("keep_mapped"))

    @property
    def identity(self) -> DirIdentity | None:
        """The local store's directory as this source opened it (None for other stores)."""
        return None if self.guard is None else self.guard.identity

    def check_intact(self) -> None:
        """Refuse to go on when the store's path names another directory than the one
        opened (an overwrite replaced it): called before and after each group's reads.

        Raises
        ------
        StreamError
            Naming the store, and saying to open the stream again.
        """
        if self.guard is not None:
            self.guard.check()

    def at_version(self, version: int | None) -> "StoreSource":
        """The same split at another version of the store (``None``: the newest); an
        overwritten store has no newer version, only another store (refused)."""
        return StoreSource(self.location, self.split, self.names, self.partial, self.storage_options, self.verify,
                           version, cache=self.cache_spec, identity=self.identity, keep_mapped=self.keep_mapped)

    def read(self, name: str, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        if self._pid != os.getpid():
            self._reopen()
        return self.readers[name].read(chunk, out)

    def scatter(self, name: str, piece: Any, out: np.ndarray, rows: np.ndarray) -> None:
        """Samples ``[piece.lo, piece.hi)`` of chunk ``piece.chunk`` to ``out[rows]``
        (see :meth:`~pipeline.streaming.chunks.ChunkReader.scatter`)."""
        if self._pid != os.getpid():
            self._reopen()
        self.readers[name].scatter(piece.chunk, piece.lo, piece.hi, out, rows)

    def scatter_runs(self, name: str, chunk: int, starts: Any, stops: Any, out: np.ndarray, rows: np.ndarray
                     ) -> None:
        """The runs ``[starts[k], stops[k])`` of chunk ``chunk``, in order, to
        ``out[rows]`` (see :meth:`~pipeline.streaming.chunks.ChunkReader.scatter_runs`)."""
        if self._pid != os.getpid():
            self._reopen()
        self.readers[name].scatter_runs(chunk, starts, stops, out, rows)

    def release(self) -> None:
        """Unmap the chunk files kept mapped (they are mapped again when read again)."""
        self.readahead.clear()
        if self.maps is not None:
            self.maps.clear()
        if self.cache is not None:
            self.cache.release()

    def will_read(self, chunks: Sequence[int], epoch: int) -> None:
        """The chunks an epoch reads next, in order: a remote store's cache fetches them ahead."""
        if self._pid != os.getpid():
            self._reopen()
        if self.cache is not None:
            self.cache.will_read(list(self.readers.values()), chunks, epoch)

    def advise(self, chunks: Sequence[int]) -> None:
        """The chunks to be read soon, in order: their local files not in the page cache
        are read ahead by the kernel (:mod:`~pipeline.streaming.readahead`)."""
        if self._pid != os.getpid():
            self._reopen()
        self.readahead.advise(chunks)

    def assembled(self, name: str) -> bool:
        """Whether ``name`` is assembled from stored rows (virtual windows) rather than read."""
        return name in self._assembled

    def read_rows(self, name: str, chunk: int, lo: int, hi: int) -> Any:
        """Samples ``[lo, hi)`` of chunk ``chunk`` of an assembled array, as a
        :class:`~pipeline.streaming.virtual.WindowRows`."""
        if self._pid != os.getpid():
            self._reopen()
        return self.readers[name].window_rows(chunk, lo, hi)

    def read_rows_runs(self, name: str, chunk: int, starts: Any, stops: Any) -> Any:
        """The runs ``[starts[k], stops[k])`` of chunk ``chunk`` of an assembled array,
        in order, as a :class:`~pipeline.streaming.virtual.WindowRows`."""
        if self._pid != os.getpid():
            self._reopen()
        return self.readers[name].window_rows_runs(chunk, starts, stops)

    def _reopen(self) -> None:
        """After a fork (a DataLoader worker), open the store again, at the version the
        parent opened: a forked child shares its parent's file descriptors and their
        offsets (two workers reading one zip through inherited handles would read each
        other's bytes), and an open group's store its parent's sessions (an s3fs session
        is bound to the parent's event loop).

        Raises
        ------
        StreamError
            For an open group whose store cannot be read after a fork (icechunk,
            obstore: their runtime's threads are gone, a read would hang), naming it.
        """
        with _REOPEN_LOCK:
            if self._pid != os.getpid():
                location = self.location
                if not isinstance(location, (str, os.PathLike)):
                    location = _GroupAt(location, forked=True).open()
                self.__init__(location, self.split, self.names, self.partial, self.storage_options,
                              self.verify, self.version, cache=self.cache_spec, identity=self.identity,
                              opened=self._opened, keep_mapped=self.keep_mapped)

    def sample_shape(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        r = self.readers[name]
        return r.tail_shape, r.dtype


class _GroupAt:
    """An open zarr group, as another process opens it again: its store's state
    (:func:`~pipeline.streaming.foreign.store_state`) and its path there."""

    def __init__(self, group: Any, forked: bool):
        from pipeline.streaming.foreign import store_state

        self.path = group.path
        self.store = store_state(group.store, "<group>", forked)

    def open(self) -> Any:
        import zarr

        from pipeline.streaming.foreign import open_store

        return zarr.open_group(open_store(self.store), path=self.path, mode="r")


class ArraySource:
    """In-memory numpy arrays (virtual chunks) or dask arrays (their own chunks).

    A dask chunk is computed when the prefetch thread asks for it, one group ahead of
    the batches being served, with every array's block of that chunk in one
    ``dask.compute``: x and y usually share their upstream graph (windows and labels of
    the same features), which is then computed once, on the active distributed client
    when there is one.
    """

    def __init__(self, arrays: Mapping[str, Any], names: Sequence[str]):
        import dask.array as da

        self.names = tuple(names)
        missing = [n for n in self.names if n not in arrays]
        if missing:
            raise StreamError(f"arrays {missing} are not among the given arrays {list(arrays)}")
        lens = {n: arrays[n].shape[0] for n in self.names}
        if len(set(lens.values())) != 1:
            raise StreamError(f"arrays must have the same length on axis 0, got {lens}")
        first = arrays[self.names[0]]
        if isinstance(first, da.Array):
            bounds = first.chunks[0]
        else:
            n = int(first.shape[0])
            bounds = (DEFAULT_ARRAY_CHUNK,) * (n // DEFAULT_ARRAY_CHUNK) + ((n % DEFAULT_ARRAY_CHUNK,) if n % DEFAULT_ARRAY_CHUNK else ())
        self.lengths = tuple(int(b) for b in bounds)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.arrays = {}
        for n in self.names:
            a = arrays[n]
            if isinstance(a, da.Array):
                a = a.rechunk({0: self.lengths, **{i: -1 for i in range(1, a.ndim)}})
            self.arrays[n] = a
        self._lazy = [n for n in self.names if isinstance(self.arrays[n], da.Array)]
        # chunk -> (event set when computed, {name: block or exception}); an entry is
        # dropped once every lazy array has taken its block.
        self._pending: dict[int, tuple[threading.Event, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_pending"], state["_lock"] = {}, None  # per process; rebuilt below
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def assembled(self, name: str) -> bool:
        return False

    @property
    def lazy(self) -> bool:
        """Whether reading a chunk computes it (a dask array): the streamer then reads
        nothing ahead for an epoch that may never come."""
        return bool(self._lazy)

    def _computed(self, name: str, chunk: int) -> np.ndarray:
        import dask

        while True:
            with self._lock:
                entry = self._pending.get(chunk)
                if entry is not None and entry[0].is_set() and name not in entry[1]:
                    entry = None  # left by an abandoned epoch after this array took its block
                owner = entry is None
                if owner:
                    entry = (threading.Event(), {})
                    self._pending[chunk] = entry
            event, blocks = entry
            if owner:
                try:
                    values = dask.compute(*(self.arrays[n].blocks[chunk] for n in self._lazy))
                    blocks.update({n: np.asarray(v) for n, v in zip(self._lazy, values)})
                except BaseException as exc:  # noqa: BLE001 - every waiting array re-raises it
                    blocks.update({n: exc for n in self._lazy})
                event.set()
            event.wait()
            with self._lock:
                if name not in blocks:
                    continue  # another reader of the same array took it: compute again
                value = blocks.pop(name)
                if not blocks and self._pending.get(chunk) is entry:
                    del self._pending[chunk]
            if isinstance(value, BaseException):
                raise value
            return value

    def read(self, name: str, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        if name in self._lazy:
            data = self._computed(name, chunk)
        else:
            data = np.asarray(self.arrays[name][self.starts[chunk] : self.starts[chunk + 1]])
        if out is not None:
            out[...] = data
            return out
        return data

    def scatter(self, name: str, piece: Any, out: np.ndarray, rows: np.ndarray) -> None:
        """Samples ``[piece.lo, piece.hi)`` of chunk ``piece.chunk`` to ``out[rows]``."""
        out[rows] = self.read(name, piece.chunk)[piece.lo : piece.hi]

    def sample_shape(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        a = self.arrays[name]
        return tuple(a.shape[1:]), native_dtype(a.dtype)


def read_part(source: Any, name: str, piece: Any, out: np.ndarray) -> None:
    """Copy a partial chunk (a rank or worker boundary falls inside it) into ``out``."""
    out[...] = source.read(name, piece.chunk)[piece.lo : piece.hi]
