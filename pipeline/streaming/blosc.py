"""Blosc frames: checks, and decoding rows of a chunk a few blocks at a time.

A blosc 1 frame is a 16-byte header (version, flags, type size, decoded bytes, block
size, frame bytes), then, unless stored uncompressed, one offset per block, then the
compressed blocks. c-blosc's ``blosc_getitem`` decodes the blocks holding a range of
items into a given buffer: :func:`scatter_blocks` uses it to decode a large chunk a
span of blocks at a time, in cache, and copy each span's rows straight to their places
(the streamer's mixed order), instead of decoding the whole chunk to memory first.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

__all__ = ["BLOCKWISE_ABOVE", "BLOSC_GETITEM", "SCATTER_BYTES", "check_block_starts", "check_frame", "scatter_blocks"]

#: Decoded chunk size above which ``ChunkReader.scatter`` decodes blosc chunks a span of
#: blocks at a time. A smaller chunk is decoded whole into a reused buffer that stays in
#: cache while its rows are copied out, which costs less than the calls (and the copy
#: blosc_getitem makes of each block); past a cache's worth, spans win. The
#: measurements by chunk size are in ``benchmarks/README.md`` (streaming).
BLOCKWISE_ABOVE = 16 * 2**20
#: Bytes decoded per ``blosc_getitem`` call by :func:`scatter_blocks` (whole blocks). Each call
#: and each copy of its rows to their places is a round of the GIL between the read
#: threads and the loop, so fewer, larger calls win until a call's output leaves the
#: cache (measurements in ``benchmarks/README.md``, streaming).
SCATTER_BYTES = 2 * 1024 * 1024
#: Blosc header flag: the chunk is stored uncompressed, without block starts.
_MEMCPYED = 0x2


def _load_blosc_getitem() -> Any:
    """c-blosc's ``blosc_getitem`` from the library numcodecs bundles, or None.

    It decodes a range of items of a blosc frame, one block at a time, into a given
    buffer. numcodecs does not wrap it, but its extension exports the C symbol (checked
    by the tests); where a build hides it,
    :meth:`~pipeline.streaming.chunks.ChunkReader.scatter` decodes whole
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


def check_frame(raw: Any, nbytes: int | None = None) -> None:
    """Refuse a blosc frame whose header does not match its length, or (``nbytes``
    given) decodes to another number of bytes than a chunk holds.

    numcodecs' blosc decoder trusts the compressed size in the frame's header and reads
    that many bytes whatever the buffer holds: a truncated or empty chunk would decode
    bytes beyond it (another chunk's, left in the read buffer) without an error. Decoding
    into a chunk's buffer, it fills as many bytes as the frame holds and leaves the rest
    as they were: a valid frame of fewer bytes (a wrong file copied in) would serve the
    buffer's old contents.
    """
    if len(raw) < 16:
        raise ValueError(f"a blosc frame has a 16-byte header, got {len(raw)} bytes")
    cbytes = int.from_bytes(bytes(raw[12:16]), "little")
    if cbytes != len(raw):
        raise ValueError(f"the blosc header says {cbytes} compressed bytes, the chunk has {len(raw)}")
    decoded = int.from_bytes(bytes(raw[4:8]), "little")
    if nbytes is not None and decoded != nbytes:
        raise ValueError(f"the blosc header says {decoded} decoded bytes, a chunk of this array holds {nbytes}")


def check_block_starts(src: np.ndarray, flags: int, nbytes: int, blocksize: int) -> None:
    """Refuse a blosc frame whose block offsets point outside it.

    c-blosc follows each block's offset without a bound (the whole-chunk decode does
    too): a damaged offset would read beyond the frame, here a mapped file.
    """
    nblocks = -(-nbytes // blocksize)
    if flags & _MEMCPYED:
        if src.size < 16 + nbytes:
            raise ValueError(f"an uncompressed blosc frame of {nbytes} bytes has only {src.size - 16}")
        return
    if src.size < 16 + 4 * nblocks:
        raise ValueError(f"a blosc frame of {nblocks} blocks is {src.size} bytes, too short for their offsets")
    starts = np.frombuffer(src, dtype="<i4", count=nblocks, offset=16)
    if nblocks and (int(starts.min()) < 16 + 4 * nblocks or int(starts.max()) >= src.size):
        raise ValueError(f"blosc block offsets point outside the frame of {src.size} bytes")


def scatter_blocks(raw: Any, chunk_rows: int, tail: tuple[int, ...], dtype: np.dtype, lo: int, hi: int,
                   out: np.ndarray, rows: np.ndarray, arrays: Any) -> bool:
    """Rows ``[lo, hi)`` of the blosc frame ``raw`` (a chunk of ``chunk_rows`` rows of
    shape ``tail``) decoded to ``out[rows]``, a few blocks at a time; False for a frame
    ``blosc_getitem`` does not read (the caller then decodes the chunk whole).

    Calls cover spans of whole blocks (:data:`SCATTER_BYTES`), so each block is decoded
    once (``blosc_getitem`` decodes every block it touches). A row that straddles the
    end of a span is carried: its first bytes are moved to the front of the buffer, and
    the next call decodes the rest of it behind them. ``arrays`` lends the buffer (an
    :class:`~pipeline.streaming.chunks.ArrayPool`).

    Raises
    ------
    ValueError
        When the frame is damaged: its header, block offsets or blocks.
    """
    row_bytes = int(np.prod(tail, dtype=np.int64)) * dtype.itemsize
    check_frame(raw)
    head = bytes(raw[:16])
    flags, typesize = head[2], head[3]
    nbytes, blocksize = int.from_bytes(head[4:8], "little"), int.from_bytes(head[8:12], "little")
    if nbytes != chunk_rows * row_bytes:
        raise ValueError(f"the blosc header says {nbytes} decoded bytes, a chunk of this array holds "
                         f"{chunk_rows * row_bytes}")
    if head[0] > 2 or blocksize <= 0 or not typesize or row_bytes % typesize or blocksize % typesize:
        return False  # not the blosc 1 frame blosc_getitem reads, or items split across rows
    src = np.frombuffer(raw, dtype=np.uint8)
    check_block_starts(src, flags, nbytes, blocksize)
    span = max(blocksize, SCATTER_BYTES // blocksize * blocksize)
    buf = arrays.get((span + row_bytes,), np.dtype(np.uint8))
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
                rows_now = buf[: whole * row_bytes].view(dtype).reshape((whole,) + tail)
                out[rows[done : done + whole]] = rows_now
                done += whole
                carry = have - whole * row_bytes
                buf[:carry] = buf[whole * row_bytes : have]  # less than a row: no overlap
            else:
                carry = have
            pos = stop
    finally:
        arrays.put(buf)
        del src  # a mapped chunk file can be unmapped once nothing views it
    return True
