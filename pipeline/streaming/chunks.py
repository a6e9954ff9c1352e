"""Fast chunk reads: fetch a chunk's bytes and decode them with numcodecs, in place.

zarr's array API pays per call for selection planning, an event-loop round trip and an
extra copy. For the layouts this package writes (regular chunks along axis 0, the
default ``c/i/0/...`` key encoding, little-endian ``bytes`` then blosc, zstd or nothing)
a chunk is one object: its bytes are read and decoded straight into a preallocated
array. Sharded arrays (shards along axis 0 only) are read the same way: the shard's
index (``bytes`` plus an optional ``crc32c``, at its start or end) is read once per shard
and cached, and each inner chunk is one byte-range read. Decoding in numcodecs releases
the GIL, so a few threads decode in parallel. Anything else (other codecs or key
encodings, chunks or shards split along other axes) falls back to zarr's own read, which
is always correct.

:meth:`ChunkReader.scatter` decodes rows straight to scattered places (the streamer's
mixed order). For large blosc chunks, a few blocks at a time (:data:`SCATTER_BYTES`, decoded into a
buffer that stays in cache) with c-blosc's own ``blosc_getitem``, then their rows are
copied to their places: every sample is written to memory once, where decoding a whole
chunk and then mixing writes it twice and reads it once more. Measured on 2 cores,
decoding and mixing this way ran 1.15-1.35x as fast as decoding chunks and then
gathering batches from them.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
from collections import OrderedDict
from typing import Any

import numcodecs
import numpy as np
import zarr

from pipeline.errors import CorruptChunkError

__all__ = ["BLOSC_GETITEM", "ArrayPool", "ChunkReader", "MapCache", "default_map_budget"]

#: Offset and length of an inner chunk that was never written (zarr's sharding spec).
_EMPTY = 2**64 - 1
#: Largest compressed chunk whose read buffer is kept for the next read.
_MAX_SCRATCH = 64 * 2**20
#: Read buffers kept between reads: one per read thread is enough.
_MAX_FREE_SCRATCH = 8
#: Decoded chunk size above which ChunkReader.scatter decodes blosc chunks a span of
#: blocks at a time. A smaller chunk is decoded whole into a reused buffer that stays in
#: cache while its rows are copied out, which costs less than the calls (and the copy
#: blosc_getitem makes of each block). Measured on 2 cores (32 MB of L3), decoding
#: whole against by spans: 4 MB chunks 1.04x and 1.18x (highly compressible), 16 MB
#: 0.99x, 32 MB 0.87-0.89x.
BLOCKWISE_ABOVE = 16 * 2**20
#: Bytes decoded per blosc_getitem call by ChunkReader.scatter (whole blocks). Each call
#: and each copy of its rows to their places is a round of the GIL between the read
#: threads and the loop; measured on 2 cores with 512 KB blocks: 2 MB per call streamed
#: 1.06-1.12x as fast as one block per call (fewer rounds), 8 MB 0.93x (out of cache).
SCATTER_BYTES = 2 * 1024 * 1024
#: Blosc header flag: the chunk is stored uncompressed, without block starts.
_BLOSC_MEMCPYED = 0x2


def _load_blosc_getitem() -> Any:
    """c-blosc's ``blosc_getitem`` from the library numcodecs bundles, or None.

    It decodes a range of items of a blosc frame, one block at a time, into a given
    buffer. numcodecs does not wrap it, but its extension exports the C symbol (checked
    by the tests); where a build hides it, :meth:`ChunkReader.scatter` decodes whole
    chunks instead. ctypes releases the GIL for the call, as numcodecs does for decode.
    """
    try:
        import numcodecs.blosc as nb

        fn = ctypes.CDLL(nb.__file__).blosc_getitem
    except (ImportError, OSError, AttributeError):  # pragma: no cover - depends on the build
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


#: None where numcodecs' build does not export it (or to force whole-chunk decoding).
BLOSC_GETITEM = _load_blosc_getitem()


def default_map_budget() -> int:
    """Bytes of chunk files a stream keeps mapped: a quarter of physical memory, at most
    16 GiB. Mapped file pages are the page cache's own (nothing is copied), so the
    budget bounds address space and page tables, not memory taken from the machine."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not on Linux
        physical = 8 << 30
    return int(min(physical // 4, 16 << 30))


class MapCache:
    """Chunk files kept mapped from one read to the next, least recently used unmapped
    past a budget of bytes.

    Mapping a chunk file for every read and unmapping it after costs a page fault per
    few pages, every epoch, and an unmap that interrupts the other cores (measured on 2
    cores: 0.1 core-s of system time per GB read, a fifth of the stream's CPU). A file
    kept mapped is faulted in once: later epochs read it with no system call at all.
    Only for stores nothing writes to any more (a file truncated while mapped would end
    the process with SIGBUS); a store overwritten while streamed is removed and written
    anew, and the files already mapped keep serving the old bytes until the stream is
    closed.
    """

    def __init__(self, budget: int | None = None, max_files: int = 16384):
        self.budget = default_map_budget() if budget is None else int(budget)
        # Each mapping is one kernel memory area, and a process may have only so many
        # (vm.max_map_count, 65530 by default): a store of many small chunk files must
        # not use them all up.
        self.max_files = int(max_files)
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, path: str) -> mmap.mmap | None:
        with self._lock:
            m = self._maps.get(path)
            if m is not None:
                self._maps.move_to_end(path)
            return m

    def add(self, path: str, m: mmap.mmap) -> mmap.mmap:
        """Keep ``m`` (or the mapping another thread kept first, closing ``m``) and
        return the one kept."""
        with self._lock:
            kept = self._maps.get(path)
            if kept is None:
                self._maps[path] = kept = m
                self._bytes += len(m)
                while (self._bytes > self.budget or len(self._maps) > self.max_files) and len(self._maps) > 1:
                    _, old = self._maps.popitem(last=False)
                    self._bytes -= len(old)
                    _close_map(old)
        if kept is not m:
            _close_map(m)
        return kept

    @property
    def mapped_bytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        """Unmap everything (a read in progress keeps its mapping until it is done)."""
        with self._lock:
            maps, self._maps, self._bytes = list(self._maps.values()), OrderedDict(), 0
        for m in maps:
            _close_map(m)


def _close_map(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:  # a read still decodes from it: unmapped once that read lets go
        pass


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
        keep them mapped here (shared by the readers of one stream): ``read()`` copies
        the bytes out of the page cache, which on the machines measured cost as much
        CPU as decoding them (0.4 s of system time per 0.8 GB, against 0.1 s mapped the
        first time and nothing after). Only for stores nothing writes to any more (see
        :class:`MapCache`). Without it, chunk files are read into reused buffers.
    """

    def __init__(self, array: zarr.Array, where: tuple[str, str, str], checksums: np.ndarray | None = None,
                 maps: MapCache | None = None):
        self.array = array
        self.where = where
        self.maps = maps
        # Rows of the split's ``_written`` table (one per chunk when unsharded): when
        # given, every decoded chunk's CRC32 must be one of its row's recorded values.
        self.checksums = checksums if array.shards is None else None
        self.rows = int(array.chunks[0])
        self.n = int(array.shape[0])
        self.tail_shape = tuple(array.shape[1:])
        self.dtype = np.dtype(array.dtype)
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
        self._decoder, self._root = self._plan()

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
        if any(c != arr.shape[k] for k, c in enumerate(arr.chunks) if k > 0):
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
        store = arr.store_path.store
        root = getattr(store, "root", None)
        if root is None or not isinstance(store, zarr.storage.LocalStore):
            return decoder, None  # fast decode, bytes fetched through the store
        return decoder, os.path.join(str(root), arr.store_path.path)

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
                                return self.maps.add(path, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
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
        again each time (measured: about 10,000 faults per epoch per thread).
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
        try:
            out = self._read(i, out)
        finally:
            self._release_read_buffer()
        self._verify(i, out)
        return out

    def _verify(self, i: int, decoded: np.ndarray) -> None:
        """With checksums, refuse a decoded chunk whose CRC32 was not recorded for it."""
        if self.checksums is None:
            return
        import zlib

        row = self.checksums[i]
        if row[0] != 1 or zlib.crc32(np.ascontiguousarray(decoded).data) not in {int(v) for v in row[1:]}:
            store, split, name = self.where
            raise CorruptChunkError(store, split, name, i, "checksum mismatch (the chunk decodes, but not to "
                                    "what was written)")

    def scatter(self, i: int, lo: int, hi: int, out: np.ndarray, rows: np.ndarray) -> None:
        """Rows ``[lo, hi)`` of chunk ``i`` decoded to their places in ``out``.

        The same as ``out[rows] = self.read(i)[lo:hi]`` (row ``lo + k`` goes to
        ``out[rows[k]]``), without a decoded chunk in between where it can be avoided:
        a blosc chunk of more than :data:`BLOCKWISE_ABOVE` bytes is decoded a few
        blocks at a time into a small buffer that stays in cache, with c-blosc's
        ``blosc_getitem``, and only the blocks holding rows ``[lo, hi)`` are decoded.
        Other chunks (small enough to stay in cache themselves), and every chunk when
        checksums are verified (they are over the whole decoded chunk), are decoded
        whole into a reused buffer first.

        Raises
        ------
        CorruptChunkError
            Naming the store, split, array and chunk, when the chunk cannot be decoded.
        """
        if self._decoder is None:  # zarr's own read
            chunk = self._arrays.get((self.length(i),) + self.tail_shape, self.dtype)
            try:
                out[rows] = self.read(i, chunk)[lo:hi]
            finally:
                self._arrays.put(chunk)
            return
        try:
            raw = self._fetch(i)
            if (raw is not None and BLOSC_GETITEM is not None and isinstance(self._decoder, numcodecs.Blosc)
                    and not self._transposed and self.checksums is None
                    and self.rows * int(np.prod(self.tail_shape)) * self.dtype.itemsize > BLOCKWISE_ABOVE
                    and self._scatter_blocks(i, raw, lo, hi, out, rows)):
                return
            chunk = self._arrays.get((self.length(i),) + self.tail_shape, self.dtype)
            try:
                self._decode(i, raw, chunk)
                self._verify(i, chunk)
                out[rows] = chunk[lo:hi]
            finally:
                self._arrays.put(chunk)
        finally:
            self._release_read_buffer()

    def _scatter_blocks(self, i: int, raw: Any, lo: int, hi: int, out: np.ndarray, rows: np.ndarray) -> bool:
        """:meth:`scatter` from the chunk's bytes ``raw``, a few blosc blocks at a time;
        False for a frame ``blosc_getitem`` does not read (the caller then decodes the
        chunk whole).

        Calls cover spans of whole blocks (:data:`SCATTER_BYTES`), so each block is
        decoded once (``blosc_getitem`` decodes every block it touches). A row that
        straddles the end of a span is carried: its first bytes are moved to the front
        of the buffer, and the next call decodes the rest of it behind them.
        """
        row_bytes = int(np.prod(self.tail_shape, dtype=np.int64)) * self.dtype.itemsize
        try:
            _check_blosc_frame(raw)
            head = bytes(raw[:16])
            flags, typesize = head[2], head[3]
            nbytes, blocksize = int.from_bytes(head[4:8], "little"), int.from_bytes(head[8:12], "little")
            if nbytes != self.rows * row_bytes:
                raise ValueError(f"the blosc header says {nbytes} decoded bytes, a chunk of this array holds "
                                 f"{self.rows * row_bytes}")
            if head[0] > 2 or blocksize <= 0 or not typesize or row_bytes % typesize or blocksize % typesize:
                return False  # not the blosc 1 frame blosc_getitem reads, or items split across rows
            src = np.frombuffer(raw, dtype=np.uint8)
            _check_block_starts(src, flags, nbytes, blocksize)
            span = max(blocksize, SCATTER_BYTES // blocksize * blocksize)
            buf = self._arrays.get((span + row_bytes,), np.dtype(np.uint8))
            try:
                pos, end = lo * row_bytes, hi * row_bytes  # bytes of the chunk still to decode
                carry = 0  # bytes of a row begun by the previous call, at the front of buf
                done = 0  # rows placed
                while pos < end:
                    stop = min(end, (pos // span + 1) * span)
                    got = BLOSC_GETITEM(src.ctypes.data, pos // typesize, (stop - pos) // typesize,
                                        buf.ctypes.data + carry)
                    if got != stop - pos:
                        raise ValueError(f"blosc could not decode bytes {pos}-{stop} (it returned {got})")
                    have = carry + stop - pos
                    whole = have // row_bytes
                    if whole:
                        rows_now = buf[: whole * row_bytes].view(self.dtype).reshape((whole,) + self.tail_shape)
                        out[rows[done : done + whole]] = rows_now
                        done += whole
                        carry = have - whole * row_bytes
                        buf[:carry] = buf[whole * row_bytes : have]  # less than a row: no overlap
                    else:
                        carry = have
                    pos = stop
            finally:
                self._arrays.put(buf)
                del src  # a mapped chunk file can be unmapped once nothing views it
        except Exception as exc:  # noqa: BLE001 - any decode failure is a corrupt chunk
            store, split, name = self.where
            raise CorruptChunkError(store, split, name, i, f"cannot decode ({exc})") from exc
        return True

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
            try:
                out[...] = self.array[i * self.rows : i * self.rows + n]
            except Exception as exc:  # noqa: BLE001 - zarr's decode errors vary by codec
                store, split, name = self.where
                raise CorruptChunkError(store, split, name, i, f"cannot decode ({exc})") from exc
            return out
        return self._decode(i, self._fetch(i), out)

    def _decode(self, i: int, raw: Any, out: np.ndarray) -> np.ndarray:
        """Chunk ``i``'s bytes ``raw`` (None: never written) decoded into ``out``."""
        if raw is None:  # never written: zarr reads it as the fill value
            out[...] = self.array.fill_value
            return out
        n = self.length(i)
        shape = (n,) + self.tail_shape
        full = (self.rows,) + self.tail_shape
        try:
            if isinstance(self._decoder, numcodecs.Blosc):
                _check_blosc_frame(raw)
            if self._transposed:
                data = raw if isinstance(self._decoder, str) else self._decoder.decode(raw)
                decoded = np.frombuffer(data, dtype=self.dtype)
                out[...] = decoded.reshape(self.tail_shape[0], self.rows).T[:n]
                return out
            if isinstance(self._decoder, str):  # "raw"; == would build both codecs' configs
                decoded = np.frombuffer(raw, dtype=self.dtype)
            elif n == self.rows and out.flags.c_contiguous:
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


def _check_block_starts(src: np.ndarray, flags: int, nbytes: int, blocksize: int) -> None:
    """Refuse a blosc frame whose block offsets point outside it.

    c-blosc follows each block's offset without a bound (the whole-chunk decode does
    too): a damaged offset would read beyond the frame, here a mapped file.
    """
    nblocks = -(-nbytes // blocksize)
    if flags & _BLOSC_MEMCPYED:
        if src.size < 16 + nbytes:
            raise ValueError(f"an uncompressed blosc frame of {nbytes} bytes has only {src.size - 16}")
        return
    if src.size < 16 + 4 * nblocks:
        raise ValueError(f"a blosc frame of {nblocks} blocks is {src.size} bytes, too short for their offsets")
    starts = np.frombuffer(src, dtype="<i4", count=nblocks, offset=16)
    if nblocks and (int(starts.min()) < 16 + 4 * nblocks or int(starts.max()) >= src.size):
        raise ValueError(f"blosc block offsets point outside the frame of {src.size} bytes")


class ArrayPool:
    """Reused arrays of a few shapes, for any thread: a new array of a few MB costs as
    much in page faults as decoding into it, and read threads are new every epoch."""

    def __init__(self, keep: int = 8):
        self.keep = keep
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def get(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        with self._lock:
            for k, a in enumerate(self._free):
                if a.shape == shape and a.dtype == dtype:
                    return self._free.pop(k)
        return np.empty(shape, dtype=dtype)

    def put(self, a: np.ndarray) -> None:
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(a)
            else:  # the oldest goes: shapes in use now are the ones worth keeping
                self._free = self._free[1:] + [a]


def _check_blosc_frame(raw: Any) -> None:
    """Refuse a blosc frame whose header does not match its length.

    numcodecs' blosc decoder trusts the compressed size in the frame's header and reads
    that many bytes whatever the buffer holds: a truncated or empty chunk would decode
    bytes beyond it (another chunk's, left in the read buffer) without an error.
    """
    if len(raw) < 16:
        raise ValueError(f"a blosc frame has a 16-byte header, got {len(raw)} bytes")
    cbytes = int.from_bytes(bytes(raw[12:16]), "little")
    if cbytes != len(raw):
        raise ValueError(f"the blosc header says {cbytes} compressed bytes, the chunk has {len(raw)}")
