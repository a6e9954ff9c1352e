"""Fast chunk reads: fetch a chunk's bytes and decode them with numcodecs, in place.

zarr's array API pays per call for selection planning, an event-loop round trip and an
extra copy. For the layouts this package writes (regular chunks along axis 0, the
default ``c/i/0/...`` key encoding, little-endian ``bytes`` then blosc, zstd or nothing)
a chunk is one object: its bytes are read and decoded straight into a preallocated
array. Sharded arrays (shards along axis 0 only) are read the same way: the shard's
index (``bytes`` plus an optional ``crc32c``, at its start or end) is read once per shard
and cached, and each inner chunk is one byte-range read. Decoding in numcodecs releases
the GIL, so a few threads decode in parallel. Unsharded chunks that also split samples
(zarr's automatic chunks do) are read the same way, block by block: each block of a row
range is decoded into a reused buffer and copied to its place. Anything else (other
codecs or key encodings, shards split along other axes, a transposed chunk split along
its rows) falls back to zarr's own read, which is always correct.

A remote store's objects (a chunk, or a whole shard) are read through a node-local disk
cache when the stream has one (:mod:`~pipeline.streaming.cache`): fetched ahead of need,
then read from local files, mapped like a local store's. Without the cache, an ``s3://``
store's objects are fetched through obstore where its options allow
(:mod:`~pipeline.streaming.fetch`), else through zarr's store.

:meth:`ChunkReader.scatter` decodes rows straight to scattered places (the streamer's
mixed order). For large blosc chunks, a few blocks at a time into a buffer that stays in
cache, with c-blosc's own ``blosc_getitem`` (:mod:`~pipeline.streaming.blosc`), then
their rows are copied to their places: every sample is written to memory once, where decoding a whole
chunk and then mixing writes it twice and reads it once more (``benchmarks/README.md``
has the comparison).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numcodecs
import numpy as np

from pipeline.errors import CorruptChunkError, StoreError
from pipeline.streaming import blosc, zstdframe
from pipeline.streaming.fetch import fetch_failure, store_fetcher
from pipeline.streaming.maps import MapCache, map_file

if TYPE_CHECKING:  # pragma: no cover
    import zarr

__all__ = ["BLOCKWISE_RUNS", "ArrayPool", "ChunkReader", "local_dir", "runs_index"]

#: Offset and length of an inner chunk that was never written (zarr's sharding spec).
_EMPTY = 2**64 - 1
#: Largest compressed chunk whose read buffer is kept for the next read.
_MAX_SCRATCH = 64 * 2**20
#: Read buffers kept between reads: one per read thread is enough.
_MAX_FREE_SCRATCH = 8
#: Most runs of one chunk that :meth:`ChunkReader.scatter_runs` decodes by blocks, run by
#: run: each run boundary may decode one span of blocks twice, so beyond a few runs
#: decoding the chunk once costs less.
BLOCKWISE_RUNS = 4


def native_dtype(dtype: Any) -> np.dtype:
    """``dtype`` in this machine's byte order: batches are served in it, whatever order
    the store keeps (zarr 2 stores may hold ``>f4``), since torch and most frameworks
    take native arrays only. Reads convert as they copy into the batch memory."""
    return np.dtype(dtype).newbyteorder("=")


def runs_index(starts: Sequence[int], stops: Sequence[int]) -> np.ndarray:
    """The offsets of the runs ``[starts[k], stops[k])``, concatenated, as int64."""
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(stops, dtype=np.int64) - starts
    # Each offset is its run's start plus its place in the run.
    before = np.cumsum(lengths) - lengths
    return np.repeat(starts - before, lengths) + np.arange(int(lengths.sum()), dtype=np.int64)


def local_dir(array: Any) -> str | None:
    """The directory a local array's chunk keys are under, or None for an array of
    another store (its bytes are fetched through that store)."""
    if hasattr(array, "local_dir"):  # read without zarr (pipeline.streaming.localstore)
        return array.local_dir
    import zarr.storage  # imported already by whoever opened a zarr array

    store = array.store_path.store
    root = getattr(store, "root", None)
    if root is None or not isinstance(store, zarr.storage.LocalStore):
        return None
    return os.path.join(str(root), array.store_path.path)


class ChunkReader:
    """Reads chunk ``i`` (along axis 0) of one zarr array as a numpy array.

    Parameters
    ----------
    array
        The zarr array.
    where
        ``(store, split, name)`` used in error messages.
    checksums
        The split's ``_written`` rows, to verify every decoded chunk against.
    maps
        Map whole chunk files of a local store into memory instead of reading them, and
        keep them mapped here (shared by the readers of one stream), up to its budget
        (``pipeline.stream``'s ``keep_mapped``; past it a file is mapped for its read
        only): ``read()`` copies the bytes out of the page cache, which costs about as
        much CPU as decoding them, while a kept file costs system time only the first
        time it is read. Only for stores nothing writes to any more (see
        :class:`MapCache`). Without it, chunk files are read into reused buffers.
    cache
        For a remote store: read its chunk objects through this node-local cache
        (:class:`~pipeline.streaming.cache.RemoteCache`), which fetches them ahead of
        need once told what an epoch reads (:meth:`object_key`). Layouts read by zarr's
        own code (see above) bypass it.
    """

    def __init__(self, array: zarr.Array, where: tuple[str, str, str], checksums: np.ndarray | None = None,
                 maps: MapCache | None = None, cache: Any = None, recorded: Callable[[], Any] | None = None):
        self.array = array
        self.where = where
        self.maps = maps
        # Rows of the split's ``_written`` table (one per chunk when unsharded): when
        # given, every decoded chunk's CRC32 must be one of its row's recorded values.
        self.checksums = checksums if array.shards is None else None
        # The same rows, read only when a chunk's file is missing (see _check_missing).
        self._recorded = recorded if array.shards is None else None
        self._recorded_rows: Any = None
        self.rows = int(array.chunks[0])
        self.n = int(array.shape[0])
        self.tail_shape = tuple(array.shape[1:])
        # Native: bytes decoded here are little-endian only (_plan), and zarr's own reads
        # of other byte orders are converted as they are copied out.
        self.dtype = native_dtype(array.dtype)
        self._transposed = False
        self._per_shard = 0  # inner chunks per shard; 0 when not sharded
        self._index_at_end = True
        self._index_crc = False
        self._indexes: dict[int, np.ndarray | None] = {}
        self._index_lock = threading.Lock()
        self._scratch = threading.local()  # the read buffer of a read in progress, per thread
        self._scratch_free: list[bytearray] = []  # read buffers between reads, for any thread
        self._scratch_lock = threading.Lock()
        self._arrays = ArrayPool()  # decoded chunks and blocks on their way to scatter()'s places
        # Chunks that also split samples (zarr's automatic chunks do) are blocks: every
        # block of a row range is decoded into a reused buffer and copied to its place.
        self._blocks: list[tuple[str, tuple, tuple]] | None = None
        self._block_decoder: Any = None
        self._decoder, self._root = self._plan()
        if self._blocks is not None:
            # Not one object per chunk: zarr's code path as far as callers can tell (no
            # whole-chunk decoder, no remote cache), read block by block here.
            self._block_decoder, self._decoder = self._decoder, None
            if self._block_decoder is None:
                self._blocks = None
        self.cache = cache if self._decoder is not None and self._root is None else None
        # A remote store read without the cache: its objects through obstore where it can.
        self._fetcher = store_fetcher(array.store_path.store) if self._root is None and self.cache is None else None
        self._chunk_bytes = self.rows * int(np.prod(self.tail_shape, dtype=np.int64)) * self.dtype.itemsize
        # scatter() decodes blosc chunks by blocks when nothing needs the whole chunk:
        # checksums cover whole chunks, and a transposed chunk is rows only once whole.
        self._blockwise = isinstance(self._decoder, numcodecs.Blosc) and not self._transposed \
            and self.checksums is None

    @property
    def n_chunks(self) -> int:
        return -(-self.n // self.rows) if self.n else 0

    def length(self, i: int) -> int:
        """Samples in chunk ``i`` (the last one may be short)."""
        return min(self.rows, self.n - i * self.rows)

    def _plan(self) -> tuple[Any, str | None]:
        arr = self.array
        meta = arr.metadata.to_dict()
        if meta.get("chunk_key_encoding", {}).get("name") != "default":
            return None, None
        if meta["chunk_key_encoding"].get("configuration", {}).get("separator", "/") != "/":
            return None, None
        split = any(c != arr.shape[k] for k, c in enumerate(arr.chunks) if k > 0)
        if split and arr.shards is not None:
            return None, None
        codecs = list(meta.get("codecs", ()))
        if arr.shards is not None:
            codecs = self._plan_shards(arr, codecs)
            if codecs is None:
                return None, None
        # A 2-D chunk stored column-major (the transpose codec) decodes the same way and
        # is transposed back after.
        self._transposed = False
        if codecs and codecs[0].get("name") == "transpose":
            if tuple(codecs[0].get("configuration", {}).get("order", ())) != (1, 0) or len(arr.shape) != 2:
                return None, None
            self._transposed = True
            codecs = codecs[1:]
        if split:
            if self._transposed:
                return None, None
            self._blocks = _block_places(arr.shape, arr.chunks)
        if not codecs or codecs[0].get("name") != "bytes":
            return None, None
        if self.dtype.itemsize > 1 and codecs[0].get("configuration", {}).get("endian", "little") != "little":
            return None, None
        rest = codecs[1:]
        decoder: Any
        if not rest:
            decoder = "raw"
        elif len(rest) == 1 and rest[0]["name"] == "blosc":
            decoder = numcodecs.Blosc()
        elif len(rest) == 1 and rest[0]["name"] == "zstd":
            decoder = numcodecs.Zstd()
        else:
            return None, None
        return decoder, local_dir(arr)

    def _plan_shards(self, arr: zarr.Array, codecs: list[dict]) -> list[dict] | None:
        """The inner chunks' codecs of a sharded array the fast path can read, else None."""
        if len(codecs) != 1 or codecs[0].get("name") != "sharding_indexed":
            return None
        conf = codecs[0].get("configuration", {})
        if any(c != arr.shape[k] for k, c in enumerate(arr.shards) if k > 0):
            return None  # shards split along another axis: several shard keys per row range
        index_codecs = [c.get("name") for c in conf.get("index_codecs", ())]
        if index_codecs not in (["bytes"], ["bytes", "crc32c"]):
            return None
        if conf["index_codecs"][0].get("configuration", {}).get("endian", "little") != "little":
            return None
        if conf.get("index_location", "end") not in ("start", "end"):
            return None
        self._per_shard = int(arr.shards[0]) // int(arr.chunks[0])
        self._index_at_end = conf.get("index_location", "end") == "end"
        self._index_crc = index_codecs[-1] == "crc32c"
        return list(conf.get("codecs", ()))

    def _key(self, i: int) -> str:
        return "c/" + "/".join([str(i)] + ["0"] * len(self.tail_shape))

    def _object_index(self, key: str) -> int:
        """The index along axis 0 of the stored object ``key`` (:meth:`_key`'s inverse)."""
        return int(key.split("/")[1])

    def object_key(self, i: int) -> tuple[str, str] | None:
        """The stored object holding chunk ``i`` as the cache names it: its path in the
        store and a tag, or None when reads of this array bypass the cache.

        The tag is empty for an object wholly inside the array's length: appends never
        change its samples. An object the length ends inside (the last chunk or shard,
        which an append rewrites with more samples) is tagged with the length, so that
        a reader of a later version does not get the earlier, shorter bytes.
        """
        if self.cache is None:
            return None
        k = i // self._per_shard if self._per_shard else i
        rows = self.rows * max(1, self._per_shard)
        tag = "" if (k + 1) * rows <= self.n else f"@{self.n}"
        return f"{self.array.store_path.path}/{self._key(k)}".lstrip("/"), tag

    def local_files(self, i: int) -> list[str]:
        """The files holding chunk ``i`` when this array is read from a local directory
        (the chunk's file, its shard's, or its blocks'), for the kernel's read ahead
        (:mod:`~pipeline.streaming.readahead`); none when zarr's own code reads it."""
        if self._root is None or (self._decoder is None and self._blocks is None):
            return []
        if self._blocks is not None:
            return [os.path.join(self._root, f"c/{i}/{suffix}") for suffix, _, _ in self._blocks]
        return [os.path.join(self._root, self._key(i // self._per_shard if self._per_shard else i))]

    @property
    def object_bytes(self) -> int:
        """The decoded size of one stored object (a chunk, or a shard), as a bound on
        what fetching one costs."""
        return self._chunk_bytes * max(1, self._per_shard)

    def _cached(self, key: str, start: int | None, stop: int | None, suffix: int | None) -> Any:
        """:meth:`_get` through the cache: the whole object, or a range of it."""
        k = self._object_index(key)
        path, tag = self.object_key(k * self._per_shard if self._per_shard else k)
        whole = self.cache.get(path, tag)
        if whole is None or (start is None and suffix is None):
            return whole
        view = memoryview(whole)
        if suffix is not None:
            return view[max(len(view) - suffix, 0):]
        return view[start:stop]

    def _get(self, key: str, start: int | None = None, stop: int | None = None, suffix: int | None = None
             ) -> Any:
        """Bytes of one stored object, or a range of them (a ``bytes`` or a view of this
        thread's read buffer); None when the object is absent."""
        if self._root is not None:
            path = os.path.join(self._root, key)
            mapped = self.maps is not None and start is None and suffix is None
            if mapped:
                kept = self.maps.get(path)
                if kept is not None:
                    return kept
            try:
                with open(path, "rb", buffering=0) as fh:
                    if mapped:
                        size = os.fstat(fh.fileno()).st_size
                        if size:  # mmap refuses empty files
                            try:
                                return self.maps.add(path, map_file(fh.fileno(), size))
                            except OSError:  # out of address space or mappings: read it instead
                                pass
                        return self._read_into_scratch(fh, size)
                    if suffix is not None:
                        size = fh.seek(0, os.SEEK_END)
                        fh.seek(max(size - suffix, 0))
                        return fh.read()
                    if start is not None:
                        fh.seek(start)
                        return self._read_into_scratch(fh, stop - start)
                    return self._read_into_scratch(fh, os.fstat(fh.fileno()).st_size)
            except FileNotFoundError:
                return None
        if self.cache is not None:
            return self._cached(key, start, stop, suffix)
        if self._fetcher is not None:
            path = f"{self.array.store_path.path}/{key}".lstrip("/")
            try:
                return self._fetcher.fetch(path, start, stop, suffix)
            except Exception as exc:  # noqa: BLE001 - any failure to fetch is the store's (after obstore's retries)
                raise StoreError(f"{self.where[0]}: cannot fetch {path} ({fetch_failure(exc)})") from exc
        from zarr.abc.store import RangeByteRequest, SuffixByteRequest
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        store = self.array.store_path.store
        path = f"{self.array.store_path.path}/{key}".lstrip("/")
        request: Any = None
        if suffix is not None:
            request = SuffixByteRequest(suffix)
        elif start is not None:
            request = RangeByteRequest(start, stop)
        buf = sync(store.get(path, prototype=default_buffer_prototype(), byte_range=request))
        return None if buf is None else buf.to_bytes()

    def _read_into_scratch(self, fh: Any, size: int) -> Any:
        """``size`` bytes of ``fh`` in a reusable read buffer.

        A fresh ``bytes`` of a few MB per chunk costs as much in page faults as decoding
        it. The buffer stays with this thread until :meth:`read` returns (callers copy or
        decode out of it before), then goes to a shared free list: the streamer's read
        threads are new every epoch, and buffers kept per thread would be faulted in
        again each time (thousands of page faults per epoch per thread).
        """
        scratch = getattr(self._scratch, "buf", None)
        if scratch is None:
            with self._scratch_lock:
                scratch = self._scratch_free.pop() if self._scratch_free else None
        if scratch is None or len(scratch) < size:
            # Headroom: compressed chunks differ a little in size, and a buffer one byte
            # short would be replaced (and faulted in) again.
            scratch = bytearray(size + size // 8)
        self._scratch.buf = scratch if len(scratch) <= _MAX_SCRATCH else None
        view = memoryview(scratch)[:size]
        got = fh.readinto(view)
        return view[:got]

    def _shard_index(self, s: int, i: int) -> np.ndarray | None:
        """Shard ``s``'s ``(offset, nbytes)`` rows, read once; None when the shard is absent."""
        with self._index_lock:
            if s in self._indexes:
                return self._indexes[s]
        size = 16 * self._per_shard + (4 if self._index_crc else 0)
        key = self._key(s)
        raw = self._get(key, suffix=size) if self._index_at_end else self._get(key, 0, size)
        index = None
        if raw is not None:
            try:
                if len(raw) != size:
                    raise ValueError(f"shard index of {len(raw)} bytes, expected {size}")
                if self._index_crc:
                    raw = numcodecs.CRC32C().decode(raw)
                index = np.frombuffer(raw, dtype="<u8").reshape(self._per_shard, 2).copy()  # raw may be a reused buffer
            except Exception as exc:  # noqa: BLE001 - a damaged index is a corrupt chunk
                store, split, name = self.where
                raise CorruptChunkError(store, split, name, i, f"cannot read shard {s}'s index ({exc})") from exc
        with self._index_lock:
            self._indexes[s] = index
        return index

    def _fetch(self, i: int) -> Any:
        if not self._per_shard:
            return self._get(self._key(i))
        s, j = divmod(i, self._per_shard)
        index = self._shard_index(s, i)
        if index is None:
            return None
        offset, nbytes = int(index[j, 0]), int(index[j, 1])
        if offset == _EMPTY and nbytes == _EMPTY:
            return None  # an inner chunk left out because it held only the fill value
        raw = self._get(self._key(s), offset, offset + nbytes)
        if raw is None or len(raw) != nbytes:
            got = "nothing" if raw is None else f"{len(raw)} bytes"
            store, split, name = self.where
            raise CorruptChunkError(store, split, name, i, f"shard {s} is truncated: expected {nbytes} bytes "
                                    f"at offset {offset}, got {got}")
        return raw

    def read(self, i: int, out: np.ndarray | None = None) -> np.ndarray:
        """Chunk ``i`` as an array of ``length(i)`` rows, decoded into ``out`` if given."""
        return self._refetching(i, self._read_verified, i, out)

    def _read_verified(self, i: int, out: np.ndarray | None) -> np.ndarray:
        try:
            out = self._read(i, out)
        finally:
            self._release_read_buffer()
        self._verify(i, out)
        return out

    def _refetching(self, i: int, attempt: Any, *args: Any) -> Any:
        """``attempt(*args)``; for chunk ``i`` read through the node-local cache, a
        failure to decode or to match its checksum drops the cached object and tries
        once more with the store's bytes.

        A cache file can be damaged on the node (a disk error, a copy torn by a crash)
        while the store's object is intact: blaming the store would send its owner
        hunting for a fault that is not there, and the stream could go on. A warning
        names the cache file dropped. Only when the store's own bytes fail too is the
        chunk reported as the store's.

        Raises
        ------
        CorruptChunkError
            Naming the store, split, array and chunk, when the bytes fetched again fail too.
        """
        try:
            return attempt(*args)
        except CorruptChunkError as first:
            if self.cache is None:
                raise
            path, tag = self.object_key(i)
            dropped = self.cache.drop(path, tag)
            if self._per_shard:
                with self._index_lock:  # the index may have come from the damaged copy
                    self._indexes.pop(i // self._per_shard, None)
            problem = _problem(first)
            try:
                result = attempt(*args)
            except CorruptChunkError as again:
                store, split, name = self.where
                raise CorruptChunkError(store, split, name, i, f"{_problem(again)}; also when fetched "
                                        f"again from the store (its cached copy {dropped} failed first and was "
                                        "dropped): the store's object is damaged") from again
            import warnings

            warnings.warn(f"{dropped}: a damaged file in the chunk cache (chunk {i} of {self.where[1]}/"
                          f"{self.where[2]} of {self.where[0]}: {problem}); dropped, and the chunk fetched again "
                          "from the store, which is intact", RuntimeWarning, stacklevel=2)
            return result

    def _check_missing(self, i: int) -> None:
        """Refuse chunk ``i`` of a store this package wrote whose file is missing though
        the store's records say it holds data: zarr stores no file for a chunk of only
        the fill value, and reads a missing one as that, so a store copied or synced in
        part served zeros where its data was. The records (the split's ``_written``
        table) are read the first time a chunk is missing."""
        if self._recorded is None:
            return
        if self._recorded_rows is None:
            self._recorded_rows = self._recorded()
        rows = self._recorded_rows
        if rows is None or i >= len(rows) or int(rows[i][0]) != 1:
            return  # a unit not recorded as written: nothing to say it held data
        if _fill_crc(self, i) not in {int(v) for v in rows[i][1:]}:
            store, split, name = self.where
            raise CorruptChunkError(store, split, name, i, f"its chunk file {self._key(i)!r} is missing, but the "
                                    "store's records say the chunk holds data, not only the fill value: the store "
                                    "was copied or synced in part; copy it again (pipeline inspect --verify checks "
                                    "every chunk)")

    def _verify(self, i: int, decoded: np.ndarray) -> None:
        """With checksums, refuse a decoded chunk whose CRC32 was not recorded for it."""
        if self.checksums is None:
            return
        from pipeline.storage.checksum import crc32

        row = self.checksums[i]
        if row[0] != 1 or crc32(np.ascontiguousarray(decoded).data) not in {int(v) for v in row[1:]}:
            store, split, name = self.where
            raise CorruptChunkError(store, split, name, i, "checksum mismatch (the chunk decodes, but not to "
                                    "what was written)")

    def scatter(self, i: int, lo: int, hi: int, out: np.ndarray, rows: np.ndarray) -> None:
        """Rows ``[lo, hi)`` of chunk ``i`` decoded to their places in ``out``.

        The same as ``out[rows] = self.read(i)[lo:hi]`` (row ``lo + k`` goes to
        ``out[rows[k]]``), without a decoded chunk in between where it can be avoided:
        a blosc chunk of more than :data:`~pipeline.streaming.blosc.BLOCKWISE_ABOVE`
        bytes is decoded a few blocks at a time into a small buffer that stays in
        cache, with c-blosc's ``blosc_getitem``, and only the blocks holding rows
        ``[lo, hi)`` are decoded. Other chunks (small enough to stay in cache
        themselves), and every chunk when checksums are verified (they are over the
        whole decoded chunk), are decoded whole into a reused buffer first.

        Raises
        ------
        CorruptChunkError
            Naming the store, split, array and chunk, when the chunk cannot be decoded.
        """
        self.scatter_runs(i, (lo,), (hi,), out, rows)

    def scatter_runs(self, i: int, starts: Sequence[int], stops: Sequence[int], out: np.ndarray,
                     rows: np.ndarray) -> None:
        """Rows of the runs ``[starts[k], stops[k])`` of chunk ``i``, in order, decoded to
        ``out[rows]``: :meth:`scatter` for a subset of a chunk (a fold's samples).

        Runs are increasing and disjoint. Up to :data:`BLOCKWISE_RUNS` runs of a large
        blosc chunk are decoded by blocks, run by run (a block two runs share is decoded
        twice, which costs less than the whole chunk while runs are few); more runs, and
        every other chunk, are decoded whole once and gathered with one fancy index.

        Raises
        ------
        CorruptChunkError
            Naming the store, split, array and chunk, when the chunk cannot be decoded.
        """
        self._refetching(i, self._scatter_runs, i, starts, stops, out, rows)

    def _scatter_runs(self, i: int, starts: Sequence[int], stops: Sequence[int], out: np.ndarray,
                      rows: np.ndarray) -> None:
        try:
            raw = None if self._decoder is None else self._fetch(i)
            if (raw is not None and blosc.BLOSC_GETITEM is not None and self._blockwise
                    and self._chunk_bytes > blosc.BLOCKWISE_ABOVE and len(starts) <= BLOCKWISE_RUNS):
                try:
                    pos, done = 0, False
                    for lo, hi in zip(starts, stops):
                        # False only from the frame's header: then for the first run,
                        # before anything is written.
                        done = blosc.scatter_blocks(raw, self.rows, self.tail_shape, self.dtype, int(lo), int(hi),
                                                    out, rows[pos : pos + hi - lo], self._arrays)
                        if not done:
                            break
                        pos += hi - lo
                except Exception as exc:  # noqa: BLE001 - any decode failure is a corrupt chunk
                    store, split, name = self.where
                    raise CorruptChunkError(store, split, name, i, f"cannot decode ({exc})") from exc
                if done:
                    return
            chunk = self._arrays.get((self.length(i),) + self.tail_shape, self.dtype)
            try:
                if self._decoder is None:  # zarr's own read
                    self._read(i, chunk)
                else:
                    self._decode(i, raw, chunk)
                self._verify(i, chunk)
                if len(starts) == 1:
                    out[rows] = chunk[starts[0] : stops[0]]
                else:
                    out[rows] = chunk[runs_index(starts, stops)]
            finally:
                self._arrays.put(chunk)
        finally:
            self._release_read_buffer()

    def _release_read_buffer(self) -> None:
        scratch = getattr(self._scratch, "buf", None)
        if scratch is not None:
            self._scratch.buf = None
            with self._scratch_lock:
                if len(self._scratch_free) < _MAX_FREE_SCRATCH:
                    self._scratch_free.append(scratch)

    def _read(self, i: int, out: np.ndarray | None = None) -> np.ndarray:
        n = self.length(i)
        shape = (n,) + self.tail_shape
        if out is None:
            out = np.empty(shape, dtype=self.dtype)
        if self._decoder is None:
            if self._blocks is not None:
                return self._read_blocks(i, out)
            try:
                out[...] = self.array[i * self.rows : i * self.rows + n]
            except Exception as exc:  # noqa: BLE001 - zarr's decode errors vary by codec
                store, split, name = self.where
                raise CorruptChunkError(store, split, name, i, f"cannot decode ({exc})") from exc
            return out
        return self._decode(i, self._fetch(i), out)

    def _read_blocks(self, i: int, out: np.ndarray) -> np.ndarray:
        """Row chunk ``i`` of an array whose chunks also split samples: each block's
        bytes decoded into a reused buffer, then copied to its place in ``out``."""
        n = self.length(i)
        full = (self.rows,) + tuple(int(c) for c in self.array.chunks[1:])
        tmp = self._arrays.get(full, self.dtype)
        try:
            for suffix, dest, src in self._blocks:
                raw = self._get(f"c/{i}/{suffix}")
                if raw is None:  # never written: zarr reads it as the fill value
                    out[(slice(0, n),) + dest] = self.array.fill_value
                    continue
                if isinstance(self._block_decoder, str):  # "raw"
                    tmp[...] = np.frombuffer(raw, dtype=self.dtype).reshape(full)
                else:
                    if isinstance(self._block_decoder, numcodecs.Blosc):
                        blosc.check_frame(raw, tmp.nbytes)
                    if _declares(self._block_decoder, raw, tmp.nbytes):
                        self._block_decoder.decode(raw, out=tmp)
                    else:  # a block of the wrong size is refused, not served past its end
                        tmp[...] = _sized(self._block_decoder.decode(raw), self.dtype, full)
                copy_runs(out[(slice(0, n),) + dest], tmp[(slice(0, n),) + src])
        except Exception as exc:  # noqa: BLE001 - any decode failure is a corrupt chunk
            store, split, name = self.where
            raise CorruptChunkError(store, split, name, i, f"cannot decode ({exc})") from exc
        finally:
            self._arrays.put(tmp)
        return out

    def _decode(self, i: int, raw: Any, out: np.ndarray) -> np.ndarray:
        """Chunk ``i``'s bytes ``raw`` (None: never written) decoded into ``out``."""
        if raw is None:  # never written: zarr reads it as the fill value
            self._check_missing(i)
            out[...] = self.array.fill_value
            return out
        n = self.length(i)
        shape = (n,) + self.tail_shape
        full = (self.rows,) + self.tail_shape
        try:
            if isinstance(self._decoder, numcodecs.Blosc):
                blosc.check_frame(raw, out.nbytes if n == self.rows and not self._transposed else None)
            if self._transposed:
                data = raw if isinstance(self._decoder, str) else self._decoder.decode(raw)
                decoded = np.frombuffer(data, dtype=self.dtype)
                out[...] = decoded.reshape(self.tail_shape[0], self.rows).T[:n]
                return out
            if isinstance(self._decoder, str):  # "raw"; == would build both codecs' configs
                decoded = np.frombuffer(raw, dtype=self.dtype)
            elif n == self.rows and out.flags.c_contiguous and _declares(self._decoder, raw, out.nbytes):
                # The common case: decode straight into the caller's buffer, no copy.
                self._decoder.decode(raw, out=out)
                return out
            else:
                decoded = np.frombuffer(self._decoder.decode(raw), dtype=self.dtype)
            if decoded.size == int(np.prod(full)):
                out[...] = decoded.reshape(full)[:n]
            elif decoded.size == int(np.prod(shape)):
                out[...] = decoded.reshape(shape)
            else:
                raise ValueError(f"decoded {decoded.size} values, expected {int(np.prod(full))}")
        except Exception as exc:  # noqa: BLE001 - any decode failure is a corrupt chunk
            store, split, name = self.where
            raise CorruptChunkError(store, split, name, i, f"cannot decode ({exc})") from exc
        return out


def _fill_crc(reader: ChunkReader, i: int) -> int:
    """The CRC32 of chunk ``i`` of ``reader`` holding only the fill value, as the writer
    would have recorded it (for a missing chunk file: see ``_check_missing``)."""
    from pipeline.storage.checksum import crc32

    fill = np.full((reader.length(i),) + reader.tail_shape, reader.array.fill_value, dtype=reader.dtype)
    return int(crc32(fill.data))


def _declares(decoder: Any, raw: Any, nbytes: int) -> bool:
    """Whether chunk bytes ``raw`` declare that they decode to ``nbytes``, so that they
    can be decoded in place by ``decoder``: a decoder fills only as many bytes of the
    buffer as the frame holds (a blosc frame's size is checked by
    ``blosc.check_frame``). A zstd frame that declares another size, or none, is decoded
    into a new buffer and its size checked there: a chunk may be several zstd frames one
    after another (RFC 8878; zarr and the ``zstd`` tool read them), the first declaring
    only its own part."""
    if not isinstance(decoder, numcodecs.Zstd):
        return True
    return zstdframe.content_size(raw) == nbytes


def _sized(data: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Decoded bytes ``data`` as an array of ``shape``, refused when they hold another
    number of values."""
    decoded = np.frombuffer(data, dtype=dtype)
    if decoded.size != math.prod(shape):
        raise ValueError(f"decoded {decoded.size} values, expected {math.prod(shape)}")
    return decoded.reshape(shape)


def _problem(exc: CorruptChunkError) -> str:
    """What went wrong with a chunk, without the store, split, array and index its
    message starts with."""
    text = str(exc)
    where = f"{exc.store}: {exc.split}/{exc.array} chunk {exc.index}: "
    return text[len(where):] if text.startswith(where) else text


def _block_places(shape: Sequence[int], chunks: Sequence[int]) -> list[tuple[str, tuple, tuple]]:
    """For chunks that split samples: each block of a row range as its key suffix (the
    block's indices past axis 0), its place in the rows' samples and the part of the
    decoded block that goes there (edge blocks are stored whole, padded)."""
    out = []
    grids = [range(-(-int(s) // int(c))) for s, c in zip(shape[1:], chunks[1:])]
    for idx in itertools.product(*grids):
        dest = tuple(slice(j * int(c), min((j + 1) * int(c), int(s))) for j, c, s in zip(idx, chunks[1:], shape[1:]))
        src = tuple(slice(0, d.stop - d.start) for d in dest)
        out.append(("/".join(map(str, idx)), dest, src))
    return out


def copy_runs(dest: np.ndarray, src: np.ndarray) -> None:
    """``dest[...] = src`` for arrays of equal shape whose last axis is contiguous, each
    run along it copied as one item: numpy's copy loop pays per item, and a block
    that splits samples is many short runs (16 bytes for zarr's automatic chunks of
    windows), several times slower copied item by item (``benchmarks/README.md``)."""
    run = dest.shape[-1] * dest.itemsize if dest.ndim else 0
    if run and dest.strides[-1] == dest.itemsize and src.strides[-1] == src.itemsize and dest.dtype == src.dtype:
        try:
            item = np.dtype((np.void, run))
            dest.view(item)[...] = src.view(item)
            return
        except (TypeError, ValueError):  # a view numpy refuses: copy by items
            pass
    dest[...] = src


class ArrayPool:
    """Reused arrays of a few shapes, for any thread: a new array of a few MB costs as
    much in page faults as decoding into it, and read threads are new every epoch."""

    def __init__(self, keep: int = 8):
        self.keep = keep
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.made = 0  # arrays allocated (for tests and diagnostics)

    def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        with self._lock:
            for k, a in enumerate(self._free):
                if a.shape == shape and a.dtype == dtype:
                    return self._free.pop(k)
            self.made += 1
        return np.empty(shape, dtype=dtype)

    def put(self, a: np.ndarray) -> None:
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(a)
            else:  # the oldest goes: shapes in use now are the ones worth keeping
                self._free = self._free[1:] + [a]


