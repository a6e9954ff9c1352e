"""Zarr arrays this package did not write, streamed through the fast chunk reader.

Two ways in: zarr arrays passed to :func:`pipeline.stream` directly (a tuple, or a
mapping of names to arrays, with numpy arrays beside them if wanted), and the variables
of a store another tool wrote at its root (xarray's ``to_zarr``), chosen by name, with
samples along a named dimension (:func:`open_variables`). Neither makes a completeness
claim, so neither needs ``partial``.

Every zarr array is read chunk by chunk by a
:class:`~pipeline.streaming.chunks.ChunkReader` (the path a pipeline store takes). When
the arrays' chunks along axis 0 differ, the stream's chunks are the coarser grid whose
boundaries all of them share (:func:`common_rows`), each stream chunk read as the few
array chunks it holds; a grid far coarser than every array's own chunks is refused
instead, naming the arrays and the fix (rechunk them alike).
"""

from __future__ import annotations

import json
import math
import os
import pickle
import threading
from typing import Any, Mapping, Sequence

import numpy as np
import zarr

from pipeline.errors import StreamError
from pipeline.streaming.chunks import native_dtype
from pipeline.streaming.readahead import ReadAhead, local_files
from pipeline.streaming.zarrmeta import cf_problem, chunk_reader, dimension_names

__all__ = ["MAX_GRID_RATIO", "ZarrSource", "array_layout", "as_opened", "common_rows", "open_store", "open_variables", "pin_rows",
           "store_state"]

#: Largest stream chunk, in multiples of the largest array chunk, that arrays chunked
#: differently are streamed over: beyond, a stream chunk (and the buffers holding a few of
#: them) grows past what ``buffer_chunks`` promises, so the arrays must be rechunked.
MAX_GRID_RATIO = 8
_REOPEN_LOCK = threading.Lock()


def common_rows(rows: Mapping[str, int], length: int, label: str) -> int:
    """Rows per stream chunk for arrays of ``rows`` rows per chunk along axis 0: the least
    common multiple, whose boundaries every array's chunks share.

    Raises
    ------
    StreamError
        When that grid is more than :data:`MAX_GRID_RATIO` times the largest chunk (and
        shorter than the arrays), naming every array's chunking and the fix.
    """
    grid = math.lcm(*rows.values()) if rows else length
    largest = max(rows.values(), default=grid)
    if min(grid, length) > MAX_GRID_RATIO * largest:
        shown = ", ".join(f"{n}: {r}" for n, r in rows.items())
        raise StreamError(f"{label}: arrays are chunked differently along axis 0 ({shown} samples per chunk); "
                          f"their common grid of {grid} samples is over {MAX_GRID_RATIO} times the largest "
                          "chunk. Rechunk them alike (zarr: write with the same chunks[0]; xarray: "
                          "ds.chunk({dim: n}).to_zarr(...); dask: da.rechunk)")
    return max(1, int(grid))


def pin_rows(array: zarr.Array, rows: int, label: str, name: str) -> zarr.Array:
    """``array`` seen with its first ``rows`` samples only, as the stream opened it.

    Another tool may grow a store while a stream reads it (xarray's ``append_dim``): a
    DataLoader worker that opens it again must serve the samples the stream planned,
    not those appended since, which its epoch has no place for (they would be served
    beyond ``len(stream)``, or twice where workers disagree on the length). The
    metadata is changed in memory only; nothing is written.

    Raises
    ------
    StreamError
        When the array now holds fewer than ``rows`` samples (the store shrank, or
        another store was written at its path), naming the store and the array.
    """
    have = int(array.shape[0])
    if have == rows:
        return array
    if have < rows:
        raise StreamError(f"{label}: array {name!r} holds {have} samples, fewer than the {rows} this stream opened "
                          "with: the store shrank or was replaced since; open the stream again")
    from zarr.core.array import AsyncArray

    aa = array.async_array
    meta = aa.metadata.update_shape((int(rows), *array.shape[1:]))
    return zarr.Array(AsyncArray(metadata=meta, store_path=aa.store_path, config=aa.config))


def array_layout(array: zarr.Array) -> str:
    """What an array's samples are, as a stream planned them: its metadata without its
    length and attributes (which appends change), as canonical JSON (a NaN fill value
    compares equal to itself there)."""
    doc = {k: v for k, v in array.metadata.to_dict().items() if k not in ("shape", "attributes")}
    return json.dumps(doc, sort_keys=True, default=str)


def store_state(store: Any, what: str, forked: bool = False) -> tuple[str, Any]:
    """How another process opens ``store`` again: a spawned one from this state pickled,
    a forked one (``forked``: a DataLoader worker on Linux, which inherits the parent's
    objects) from this state as it is (:func:`open_store`).

    Parameters
    ----------
    store
        A zarr store.
    what
        What lives in it, for error messages (``"<zarr arrays>: array 'x'"``).
    forked
        Whether the state is for this process, forked from the one that opened ``store``.

    Raises
    ------
    StreamError
        For a store the process cannot open (naming its type and what to do instead):
        a store in memory in a spawned process, whose memory it does not have; a store
        run by a tokio runtime (icechunk, obstore) in a forked one, where that runtime's
        threads do not exist and the first read would hang.
    """
    kind = type(store).__name__
    if isinstance(store, zarr.storage.LocalStore):
        return ("local", str(store.root))
    if isinstance(store, zarr.storage.ZipStore):
        # Opened again by path, in a process or after a fork: one ZipStore holds one file
        # handle, and two processes reading through it would move each other's offset.
        return ("zip", str(store.path))
    if isinstance(store, zarr.storage.FsspecStore):
        if not forked and "memory" in _protocols(store.fs):
            raise StreamError(f"{what} lives in fsspec's memory file system, which a spawned worker process does "
                              "not have; write it to a directory, zip or object store, or stream it without "
                              "workers (num_workers=0) or with forked ones")
        # The file system travels pickled (fsspec pickles its class and options), even to
        # a forked worker, which unpickles a file system of its own: an s3fs session is
        # bound to the event loop of the process that opened it, and a worker reading
        # through its parent's fails ("attached to a different loop").
        try:
            fs = pickle.dumps(store.fs)
        except Exception as exc:  # noqa: BLE001 - whatever its options hold that does not pickle
            raise StreamError(f"{what} lives in an fsspec {type(store.fs).__name__} that cannot be pickled "
                              f"({type(exc).__name__}: {exc}), so a worker process cannot open it again; pass "
                              "storage options that pickle, or stream it without workers") from exc
        return ("fsspec", (fs, store.path, store.read_only))
    if _runs_on_tokio(store):
        if forked:
            raise StreamError(f"{what} lives in {kind} ({type(store).__module__}), run by a tokio runtime whose "
                              "threads do not survive the fork that starts a DataLoader worker: its first read "
                              "there would hang. Stream it with num_workers=0, or start the workers with "
                              "DataLoader(..., multiprocessing_context='spawn') (or 'forkserver'), where each "
                              "opens the store from its pickled state")
        return ("pickled", store)  # a read-only icechunk session pickles for distributed reads
    if forked:
        return ("copied", store)  # a store in memory: the fork copied it, nothing is shared
    raise StreamError(f"{what} lives in a {kind}, which worker processes cannot open; write it to a directory, zip "
                      "or fsspec store, or stream it without workers")


def open_store(state: tuple[str, Any]) -> Any:
    """The store :func:`store_state` described, opened (again) for reading."""
    kind, where = state
    if kind == "local":
        return zarr.storage.LocalStore(where, read_only=True)
    if kind == "zip":
        return zarr.storage.ZipStore(where, mode="r")
    if kind == "fsspec":
        fs, root, read_only = where
        # In a forked child fsspec has emptied its instance cache: this makes a file
        # system of the child's own, with its own session and event loop.
        return zarr.storage.FsspecStore(pickle.loads(fs), read_only=read_only, path=root)
    return where


def _store_state(array: zarr.Array, name: str, label: str, forked: bool = False) -> tuple[Any, ...]:
    """How another process opens ``array`` again (:func:`store_state`, and its path)."""
    return (store_state(array.store_path.store, f"{label}: array {name!r}", forked), array.store_path.path)


def _protocols(fs: Any) -> tuple[str, ...]:
    p = getattr(fs, "protocol", ())
    return (p,) if isinstance(p, str) else tuple(p)


def _runs_on_tokio(store: Any) -> bool:
    """Whether ``store`` (or the store a zarr ``WrapperStore`` such as ``LoggingStore``
    wraps) does its I/O on a Rust tokio runtime (icechunk's, obstore's)."""
    while isinstance(store, zarr.storage.WrapperStore):
        store = store._store
    return (type(store).__module__.split(".")[0] == "icechunk"
            or isinstance(store, getattr(zarr.storage, "ObjectStore", ())))


def _location(array: zarr.Array) -> str:
    """Where an array passed directly lives, for error messages: its store's directory,
    zip or URL, and its path there."""
    store = array.store_path.store
    where = getattr(store, "root", None) or getattr(store, "path", None) or type(store).__name__
    return "/".join(p for p in (str(where).rstrip("/"), array.store_path.path) if p)


def _reopen_array(state: tuple[Any, ...]) -> zarr.Array:
    store, path = state
    return zarr.open_array(open_store(store), path=path, mode="r")


class _Grid:
    """One array read on the stream's chunk grid: stream chunk ``c`` is the array's
    rows ``[c * grid, (c + 1) * grid)``, its chunks ``c * k .. c * k + k - 1``."""

    def __init__(self, reader: Any, grid: int, n: int):
        self.reader, self.grid, self.n = reader, grid, n
        # A numpy array has no chunks of its own: it is sliced on the grid.
        self.rows = grid if reader is None else reader.rows

    def _parts(self, c: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """``(own chunk, lo, hi)`` of the array's chunks holding stream rows ``[lo, hi)``."""
        a, b = c * self.grid + lo, c * self.grid + hi
        return [(j, max(a, j * self.rows) - j * self.rows, min(b, (j + 1) * self.rows) - j * self.rows)
                for j in range(a // self.rows, -(-b // self.rows))]

    def read(self, array: Any, c: int, length: int, out: np.ndarray | None) -> np.ndarray:
        if self.reader is None:
            data = np.asarray(array[c * self.grid : c * self.grid + length])
            if out is None:
                return data
            out[...] = data
            return out
        if self.rows == self.grid:
            return self.reader.read(c, out)
        if out is None:
            out = np.empty((length,) + self.reader.tail_shape, dtype=self.reader.dtype)
        pos = 0
        for j, lo, hi in self._parts(c, 0, length):
            if lo == 0 and hi == self.reader.length(j):
                self.reader.read(j, out[pos : pos + hi])  # a slice along axis 0: decoded in place
            else:
                out[pos : pos + hi - lo] = self.reader.read(j)[lo:hi]
            pos += hi - lo
        return out

    def scatter_runs(self, array: Any, c: int, starts: Sequence[int], stops: Sequence[int], out: np.ndarray,
                     rows: np.ndarray) -> None:
        if self.reader is None:
            base, pos = c * self.grid, 0
            for lo, hi in zip(starts, stops):
                out[rows[pos : pos + hi - lo]] = array[base + lo : base + hi]
                pos += hi - lo
            return
        if self.rows == self.grid:
            self.reader.scatter_runs(c, starts, stops, out, rows)
            return
        # Each run split at the array's chunk boundaries, then one scatter per own chunk.
        per: dict[int, tuple[list[int], list[int], list[np.ndarray]]] = {}
        pos = 0
        for lo, hi in zip(starts, stops):
            for j, a, b in self._parts(c, int(lo), int(hi)):
                entry = per.setdefault(j, ([], [], []))
                entry[0].append(a)
                entry[1].append(b)
                entry[2].append(rows[pos : pos + b - a])
                pos += b - a
        for j, (s0, s1, places) in per.items():
            self.reader.scatter_runs(j, s0, s1, out, np.concatenate(places))


class ZarrSource:
    """Chunks of zarr arrays (and numpy arrays beside them) that this package did not
    write, read by :class:`~pipeline.streaming.chunks.ChunkReader`.

    Parameters
    ----------
    arrays
        Names to ``zarr.Array`` or numpy arrays, at least one of them a zarr array, all
        of one length along axis 0 (the samples).
    names
        The arrays to stream, in order.
    label
        Where they come from, for error messages (a store path, or ``"<zarr arrays>"``).
    cache
        The stream's node-local cache settings (:class:`~pipeline.streaming.cache.CacheSpec`):
        zarr arrays of a remote store read their chunk objects through it. Local stores
        ignore it.
    opened
        How the stream's first opening saw the arrays (:meth:`opened`), given when a
        DataLoader worker opens them again: their first ``rows`` samples are served,
        whatever was appended since, and a store replaced meanwhile is refused.

    Raises
    ------
    StreamError
        For arrays of different lengths, a grid too coarse, a CF-encoded variable, or a
        cache asked for arrays of several remote stores; with ``opened``, for arrays
        that shrank below its rows or a store that was replaced (another directory, or
        arrays of another layout at its path).
    """

    def __init__(self, arrays: Mapping[str, Any], names: Sequence[str], label: str = "<zarr arrays>",
                 cache: Any = None, opened: Mapping[str, Any] | None = None):
        self.names, self.label, self.cache_spec = tuple(names), label, cache
        missing = [n for n in self.names if n not in arrays]
        if missing:
            raise StreamError(f"{label}: arrays {missing} are not among the given arrays {list(arrays)}")
        self.arrays = {n: arrays[n] for n in self.names}
        for n, a in self.arrays.items():
            if not isinstance(a, (zarr.Array, np.ndarray)):
                raise StreamError(f"{label}: array {n!r} is a {type(a).__name__}; zarr arrays stream beside zarr "
                                  "or numpy arrays only (wrap a dask array with da.from_zarr, or compute it)")
            if a.ndim == 0:
                raise StreamError(f"{label}: array {n!r} is a scalar; samples run along axis 0")
            problem = cf_problem(a) if isinstance(a, zarr.Array) else None
            if problem is not None:
                raise StreamError(f"{label}: variable {n!r}: {problem}")
        self.guards = _store_guards(self.arrays, label, None if opened is None else opened["dirs"])
        if opened is not None:
            self.arrays = as_opened(self.arrays, opened, label)
        lens = {n: int(a.shape[0]) for n, a in self.arrays.items()}
        if len(set(lens.values())) != 1:
            # Arrays passed directly are named by where they live (a0, a1 name nothing).
            shown = {(_location(a) if label == "<zarr arrays>" and isinstance(a, zarr.Array) else n): lens[n]
                     for n, a in self.arrays.items()}
            raise StreamError(f"{label}: arrays must have the same length along the samples' axis, got {shown}")
        self.n = lens[self.names[0]]
        self.cache = _remote_cache(cache, [a for a in self.arrays.values() if isinstance(a, zarr.Array)], label)
        # Stores other tools write may still be written to: chunks are read, not mapped.
        readers = {n: chunk_reader(a, (_location(a) if label == "<zarr arrays>" else label, "", n), cache=self.cache)
                   for n, a in self.arrays.items() if isinstance(a, zarr.Array)}
        self._chunk_readers = list(readers.values())
        self.grid = common_rows({n: r.rows for n, r in readers.items()}, self.n, label)
        self.readers = {n: _Grid(readers.get(n), self.grid, self.n) for n in self.names}
        full, rest = divmod(self.n, self.grid)
        self.lengths = (self.grid,) * full + ((rest,) if rest else ())
        # Their files are read, never kept mapped; only arrays chunked on the stream's
        # grid have files per stream chunk.
        self._on_grid = on_grid = [r for r in self._chunk_readers if r.rows == self.grid]
        self.readahead = ReadAhead(lambda c: local_files(on_grid, (c,)))
        self._pid = os.getpid()  # set last, as in StoreSource

    def __getstate__(self) -> dict:
        return self._state(forked=False)

    def _state(self, forked: bool) -> dict:
        # Zarr arrays travel as their store's location: each worker opens them itself.
        state = {n: ("zarr", _store_state(a, n, self.label, forked)) if isinstance(a, zarr.Array) else ("numpy", a)
                 for n, a in self.arrays.items()}
        return {"arrays": state, "names": self.names, "label": self.label, "cache": self.cache_spec,
                "opened": self.opened()}

    def opened(self) -> dict[str, Any]:
        """How this source saw its arrays: their samples, their layouts and their local
        stores' directories, which a worker opening them again must find the same."""
        return {"rows": self.n,
                "layouts": {n: array_layout(a) for n, a in self.arrays.items() if isinstance(a, zarr.Array)},
                "dirs": {root: g.identity for root, g in self.guards.items()}}

    def __setstate__(self, state: dict) -> None:
        arrays = {n: _reopen_array(v) if kind == "zarr" else v for n, (kind, v) in state["arrays"].items()}
        self.__init__(arrays, state["names"], state["label"], cache=state.get("cache"), opened=state.get("opened"))

    def _check_process(self) -> None:
        # After a fork (a DataLoader worker) open the stores again: a zip store's file
        # handle and its offset, an s3fs session and its event loop, would otherwise be
        # the parent's. A store that cannot be read after a fork is refused here, before
        # its first read hangs; the source stays unopened, so every later use says so too.
        if self._pid != os.getpid():
            with _REOPEN_LOCK:
                if self._pid != os.getpid():
                    self.__setstate__(self._state(forked=True))

    def _reopen(self) -> None:
        """In a DataLoader worker, before any reader thread starts: open the stores again
        if this process was forked (:meth:`_check_process`)."""
        self._check_process()

    def read(self, name: str, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        self._check_process()
        return self.readers[name].read(self.arrays[name], chunk, self.lengths[chunk], out)

    def scatter(self, name: str, piece: Any, out: np.ndarray, rows: np.ndarray) -> None:
        """Samples ``[piece.lo, piece.hi)`` of chunk ``piece.chunk`` to ``out[rows]``."""
        self.scatter_runs(name, piece.chunk, (piece.lo,), (piece.hi,), out, rows)

    def scatter_runs(self, name: str, chunk: int, starts: Any, stops: Any, out: np.ndarray, rows: np.ndarray
                     ) -> None:
        """The runs ``[starts[k], stops[k])`` of chunk ``chunk``, in order, to ``out[rows]``."""
        self._check_process()
        self.readers[name].scatter_runs(self.arrays[name], chunk, starts, stops, out, rows)

    def will_read(self, chunks: Sequence[int], epoch: int) -> None:
        """The chunks an epoch reads next, in order: a remote store's cache fetches them
        ahead (arrays chunked on the stream's grid; others are fetched as they are read)."""
        self._check_process()
        if self.cache is not None:
            self.cache.will_read(self._on_grid, chunks, epoch)

    def advise(self, chunks: Sequence[int]) -> None:
        """The chunks to be read soon, in order: the local files of arrays chunked on the
        stream's grid are read ahead by the kernel when not in the page cache."""
        self._check_process()
        self.readahead.advise(chunks)

    def release(self) -> None:
        """Forget what the cache was to fetch ahead, and unmap its files."""
        self.readahead.clear()
        if self.cache is not None:
            self.cache.release()

    def assembled(self, name: str) -> bool:
        return False

    def sample_shape(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        a = self.arrays[name]
        return tuple(int(s) for s in a.shape[1:]), native_dtype(a.dtype)


def _store_guards(arrays: Mapping[str, Any], label: str, expected: Mapping[str, Any] | None) -> dict[str, Any]:
    """The directory of each local store the zarr arrays live in, by path
    (:class:`~pipeline.streaming.storeid.StoreGuard`): with ``expected``, the identities
    the stream's first opening recorded, refused when the path names another directory
    now (the store was written anew there)."""
    from pipeline.streaming.storeid import StoreGuard

    guards: dict[str, Any] = {}
    for a in arrays.values():
        store = a.store_path.store if isinstance(a, zarr.Array) else None
        if isinstance(store, zarr.storage.LocalStore):
            root = os.path.abspath(str(store.root))
            if root not in guards:
                guards[root] = StoreGuard(root, root if label == "<zarr arrays>" else label,
                                          None if expected is None else expected.get(root))
    return guards


def as_opened(arrays: Mapping[str, Any], opened: Mapping[str, Any], label: str) -> dict[str, Any]:
    """``arrays`` opened again, seen as the stream first opened them: each zarr array's
    first ``opened["rows"]`` samples (:func:`pin_rows`), refused when its layout changed.

    Raises
    ------
    StreamError
        For an array that shrank below those rows, or whose layout (dtype, chunks,
        codecs, sample shape) is another one: another store was written at its path.
    """
    rows, layouts = int(opened["rows"]), opened["layouts"]
    out = {}
    for n, a in arrays.items():
        if isinstance(a, zarr.Array):
            where = _location(a) if label == "<zarr arrays>" else label
            if n in layouts and array_layout(a) != layouts[n]:
                raise StreamError(f"{where}: array {n!r} is not laid out as when this stream opened it (another "
                                  "dtype, chunking, codec or sample shape): the store was replaced since; open "
                                  "the stream again")
            a = pin_rows(a, rows, where, n)
        out[n] = a
    return out


def _remote_cache(spec: Any, arrays: Sequence[zarr.Array], label: str) -> Any:
    """The node-local cache of the remote store ``arrays`` live in, or None (no cache
    asked for, or local stores, which need none).

    Raises
    ------
    StreamError
        When a cache is asked for and the arrays live in several remote stores.
    """
    from pipeline.streaming.cache import open_remote_cache

    if spec is None:
        return None
    remote = {}
    for a in arrays:
        store = a.store_path.store
        if isinstance(store, zarr.storage.FsspecStore):
            remote.setdefault((str(getattr(store.fs, "protocol", "")), store.path), a)
    if len(remote) > 1:
        roots = ", ".join(sorted(path for _, path in remote))
        raise StreamError(f"{label}: cache_dir= caches the chunks of one remote store, and these arrays live in "
                          f"{len(remote)} ({roots}); stream them from one store, or without a cache")
    first = next(iter(remote.values()), None)
    return None if first is None else open_remote_cache(spec, first, label, None, {})


def open_variables(location: Any, group: zarr.Group, where: str, names: Sequence[str], dim: str | None,
                   cache: Any = None) -> ZarrSource:
    """The variables ``names`` of ``group`` (a store's root, or its group ``where``), as
    xarray writes them, with samples along dimension ``dim``.

    Parameters
    ----------
    location
        The store's path or URL, or the open group, for error messages.
    group
        The group holding the variables.
    where
        Its path in the store (``""``: the root).
    names
        The variables to stream, in order.
    dim
        The samples' dimension: the first of every variable. None: axis 0, which must
        then be one dimension for all variables that name theirs.
    cache
        The stream's node-local cache settings, for a remote store.

    Raises
    ------
    StreamError
        For a missing variable (listing those present), one without ``dim`` or with
        ``dim`` not first (naming its dimensions and the fix), or one whose CF encoding
        would make the stored numbers wrong (naming the attribute).
    """
    label = os.fspath(location) if isinstance(location, (str, os.PathLike)) else "<group>"
    label = f"{label}/{where}" if where else label
    present = sorted(k for k, _ in group.arrays())
    arrays = {}
    for n in names:
        node = group.get(n)
        if not isinstance(node, zarr.Array):
            raise StreamError(f"{label}: no variable {n!r}; variables: {', '.join(present) or 'none'}")
        arrays[n] = node
    dims = {n: dimension_names(a) for n, a in arrays.items()}
    if dim is None:
        firsts = {n: d[0] for n, d in dims.items() if d}
        if len(set(firsts.values())) > 1:
            raise StreamError(f"{label}: variables start with different dimensions {firsts}; pass dim= naming "
                              "the samples' dimension")
    for n, d in dims.items() if dim is not None else ():
        if d is None:
            raise StreamError(f"{label}: variable {n!r} names no dimensions (zarr 3 dimension_names or xarray's "
                              f"_ARRAY_DIMENSIONS), so dim={dim!r} cannot be found in it")
        if dim not in d:
            raise StreamError(f"{label}: variable {n!r} has dimensions {d}, without {dim!r}")
        if d[0] != dim:
            order = ", ".join(repr(x) for x in (dim,) + tuple(x for x in d if x != dim))
            raise StreamError(f"{label}: variable {n!r} has dimensions {d}: samples along {dim!r} must be its "
                              f"first dimension, read chunk by chunk. Write it transposed: "
                              f"ds[{n!r}].transpose({order}) (or ds.transpose({dim!r}, ...)) before to_zarr")
    source = ZarrSource(arrays, names, label, cache=cache)
    source.group = where  # a split's group, or "" for a store's root variables (no split applies)
    return source
