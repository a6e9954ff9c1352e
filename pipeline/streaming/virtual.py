"""Virtual windows: assemble ``(n, size, F * len(scales))`` windows while streaming.

A virtual store keeps the per-step feature matrix once (``_shared/features``) and, per
split, the end step of every window (``ends``) with its label. Reading chunk ``i`` of
``x`` reads chunk ``i`` of ``ends``, the feature rows from ``min(end) - halo`` to
``max(end)`` (the halo is ``(size-1) * max(scales)``), and gathers the windows with the
same function the materializing path uses, so the bytes are identical. Disk shrinks by
about ``size`` times for overlapping windows.

While streaming, a group of chunks is not assembled into a buffer of windows: the
loader keeps the group's feature rows (:class:`WindowRows`, about ``size`` times smaller
than its windows) and its window ends in the group's mixed order (:class:`MixedWindows`,
8 bytes a window); each batch is then gathered from those rows, a bounded piece of
windows at a time. Every window byte is written once, into the batch, where a
materialized store decodes each byte into a buffer and copies it again into the batch.

Memory therefore follows the stored bytes, never the assembled ones: a group costs its
feature rows and ends (:func:`window_group_bytes`), a batch its own windows and the row
index of one piece (:data:`TAKE_ROWS`); decoded feature chunks are kept up to a budget
(:class:`FeatureChunks`). Holding the row index of a whole group instead
(8 bytes per window row: 32 KB for a window of 2,048 steps at 2 scales) made a group of
4 chunks of 16,384 such windows cost 2 GiB. :func:`window_memory` is the bound the
streamer adds for assembled arrays (``Stream.memory_bound``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

import numpy as np

from pipeline.features.windows import (
    check_window_ends,
    row_offsets,
    windows_numpy_block,
)
from pipeline.streaming.chunks import ChunkReader, runs_index

__all__ = ["FEATURE_CACHE_BYTES", "TAKE_ROWS", "UNIT_BYTES", "FeatureChunks", "MixedWindows", "VirtualWindowReader",
           "WindowRows", "window_group_bytes", "window_memory"]

#: Window rows gathered by one ``np.take`` while a batch is assembled: the row index of
#: that piece (8 bytes a row, 512 KiB) is all the scratch a batch needs beside itself,
#: whatever the window's size. A batch of small windows is one piece (one gather).
TAKE_ROWS = 1 << 16

#: A row index per assembling thread, reused from batch to batch: a fresh 512 KiB array
#: per piece is above glibc's mmap threshold and would be faulted in again every time.
_SCRATCH = threading.local()


#: Decoded feature chunks a stream keeps (:class:`FeatureChunks`), at most.
FEATURE_CACHE_BYTES = 64 << 20

#: Bytes of feature chunks decoded and kept as one run (:class:`FeatureChunks`).
UNIT_BYTES = 1 << 20


def _row_index(n: int) -> np.ndarray:
    """This thread's reusable int64 scratch of at least ``n`` values."""
    buf = getattr(_SCRATCH, "rows", None)
    if buf is None or buf.size < n:
        buf = _SCRATCH.rows = np.empty(max(n, TAKE_ROWS), dtype=np.int64)
    return buf[:n]


def window_group_bytes(*, samples: int, pieces: int, piece_rows: int, row_bytes: int) -> int:
    """Bytes one loaded group of virtual windows holds: the feature rows of its
    ``pieces`` chunk pieces (``piece_rows`` each at most: their windows' span of steps and
    the lookback before it, ``row_bytes`` a row), and per window its end in the mixed
    order and its place in that order (the group's permutation), int64 each.

    Parameters
    ----------
    samples
        Windows in the group.
    pieces
        Chunk pieces the group is read from (``buffer_chunks`` at most in a plain plan).
    piece_rows
        The most feature rows one piece reads (:meth:`VirtualWindowReader.max_piece_rows`).
    row_bytes
        Bytes of one feature row (all features of one step).
    """
    return int(pieces) * int(piece_rows) * int(row_bytes) + int(samples) * 16


def window_memory(*, groups: int, group_bytes: int, read_threads: int, read_bytes: int, batches: int,
                  batch_size: int, window_bytes: int, gather_threads: int, cache_bytes: int = 0) -> int:
    """The most bytes a stream of virtual windows holds for them, beside the buffers of
    its stored arrays (:func:`~pipeline.streaming.streamer.memory_bound`).

    ``(groups + 1) * group_bytes + read_threads * read_bytes + batches * batch_size *
    window_bytes + gather_threads * TAKE_ROWS * 8 + cache_bytes``: the loaded groups
    (plus one being joined from its pieces, which hold a copy of it until the join
    ends), each read thread's piece in progress (its feature chunks decoded whole, at
    most ``read_bytes``), the assembled batches alive (queued for the loop, held by it,
    being cut), each assembling thread's row index, and the decoded feature chunks kept
    (:class:`FeatureChunks`).

    Parameters
    ----------
    groups
        Groups loaded at once (served, read ahead, the next epoch's first).
    group_bytes
        One group's bytes (:func:`window_group_bytes`).
    read_threads, read_bytes
        Read threads, and the bytes one holds while it reads a piece.
    batches, batch_size, window_bytes
        Assembled batches alive at once, their samples, and one window's bytes.
    gather_threads
        Threads assembling batches at once.
    cache_bytes
        Decoded feature chunks kept (``FeatureChunks.max_bytes``).
    """
    return int((groups + 1) * group_bytes + read_threads * read_bytes + batches * batch_size * window_bytes
               + gather_threads * TAKE_ROWS * 8 + cache_bytes)


class FeatureChunks:
    """Decoded runs of the shared features' chunks, the most recently used kept up to
    ``max_bytes`` (one more may be on its way in from each read thread).

    Every chunk of windows reads its lookback too: ``(size - 1) * max(scales)`` steps
    before its first window. Where the features' chunks are short beside that lookback
    (a store chunked for the assembled windows' bytes: 51 steps a chunk against a
    lookback of 16,376), each chunk of windows decoded hundreds of feature chunks, and
    each feature chunk was decoded again by every chunk of windows whose lookback covers
    it: the Python cost of a chunk read, not the bytes, set the stream's speed. So
    chunks are decoded and kept in runs of consecutive chunks (a *unit*: the rows one
    chunk of windows reads, ``unit_rows``, at most :data:`UNIT_BYTES`; one chunk where
    chunks are that large already): a chunk of windows then copies its rows out of one
    or two units, and a store whose features fit in ``max_bytes`` is decoded once per
    stream.

    Parameters
    ----------
    reader
        The features' chunk reader.
    max_bytes
        Bytes of decoded units kept, at most (capped at the features' own bytes, at
        least one unit).
    unit_rows
        Rows a unit should cover (rounded up to whole chunks): about what one chunk of
        windows reads, so that a unit decoded for it holds little it does not use.
    """

    def __init__(self, reader: ChunkReader, max_bytes: int = FEATURE_CACHE_BYTES, unit_rows: int = 1):
        self.reader = reader
        row = int(np.prod(reader.tail_shape, dtype=np.int64)) * reader.dtype.itemsize
        chunk = max(1, reader.rows * row)
        self.per = max(1, min(UNIT_BYTES // chunk, -(-int(unit_rows) // reader.rows)))  # chunks in a unit
        self.rows = self.per * reader.rows  # rows in a unit (the last may hold fewer)
        self.max_bytes = int(min(reader.n * row, max(int(max_bytes), self.rows * row)))
        self._kept: OrderedDict[int, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def unit(self, u: int) -> np.ndarray:
        """Feature rows ``[u * rows, (u + 1) * rows)`` (fewer at the end), decoded;
        read-only: callers copy what they need."""
        with self._lock:
            got = self._kept.get(u)
            if got is not None:
                self._kept.move_to_end(u)
                return got
        got = self._decode(u)  # outside the lock: other threads decode meanwhile
        got.flags.writeable = False
        with self._lock:
            if u not in self._kept:
                self._kept[u] = got
                self._bytes += got.nbytes
                while self._bytes > self.max_bytes and len(self._kept) > 1:
                    _, old = self._kept.popitem(last=False)
                    self._bytes -= old.nbytes
        return got

    def _decode(self, u: int) -> np.ndarray:
        r = self.reader
        first, stop = u * self.per, min(r.n_chunks, (u + 1) * self.per)
        lo, hi = first * r.rows, min(r.n, stop * r.rows)
        out = np.empty((hi - lo,) + tuple(r.tail_shape), r.dtype)
        for k in range(first, stop):  # each chunk decoded straight into its place
            r.read(k, out[k * r.rows - lo : k * r.rows - lo + r.length(k)])
        return out


class WindowRows:
    """Windows of a run of samples, as feature rows and window ends; ``mixed(perm)``
    prepares them to be served in a mixed order.

    Parameters
    ----------
    block
        Feature rows ``(steps, F)`` holding every window's lookback.
    ends
        Each sample's window end, as a row of ``block``.
    size, scales
        The windows' geometry.

    Raises
    ------
    WindowError
        When a window would reach outside ``block``: checked here, once per group, so
        that a batch (:meth:`MixedWindows.take_range`) is one unchecked gather.
    """

    __slots__ = ("block", "ends", "size", "scales", "_offsets")

    def __init__(self, block: np.ndarray, ends: np.ndarray, size: int, scales: tuple[int, ...]):
        self.block = np.ascontiguousarray(block)
        self.ends = np.ascontiguousarray(ends, dtype=np.int64)
        self.size, self.scales = size, tuple(scales)
        check_window_ends(self.ends, self.block.shape[0], size, self.scales)
        self._offsets = row_offsets(size, self.scales)

    def __len__(self) -> int:
        return int(self.ends.size)

    def mixed(self, perm: np.ndarray) -> "MixedWindows":
        """These windows in the order ``perm``, ready to be cut into batches."""
        return MixedWindows(self, perm)

    @classmethod
    def concat(cls, parts: Sequence["WindowRows"]) -> "WindowRows":
        """One run of the parts' samples in order: their feature blocks stacked, each
        part's ends shifted by the rows before it (a window never reaches into another
        part's rows, since each block holds its own lookback)."""
        if len(parts) == 1:
            return parts[0]
        offsets = np.cumsum([0] + [p.block.shape[0] for p in parts[:-1]])
        block = np.concatenate([p.block for p in parts])
        ends = np.concatenate([p.ends + off for p, off in zip(parts, offsets)])
        return cls(block, ends, parts[0].size, parts[0].scales)


class MixedWindows:
    """A group's windows in its mixed order: its feature rows and, in that order, each
    window's end; a batch is gathered from the rows, :data:`TAKE_ROWS` at a time.

    The ends are checked against the rows once per group (:class:`WindowRows`), so a
    batch's gathers run unchecked. Memory: 8 bytes a window, beside the rows. A row
    index of the whole group (``size * len(scales)`` rows a window, made once at load)
    saved one ``np.add`` per batch but cost 8 bytes per window *row*: more than the
    windows themselves hold for a single feature, gigabytes for long windows.
    """

    __slots__ = ("block", "ends", "offsets")

    def __init__(self, windows: WindowRows, perm: np.ndarray):
        self.block = windows.block
        self.ends = np.take(windows.ends, perm)  # bounds checked: perm comes from outside
        self.offsets = windows._offsets

    def __len__(self) -> int:
        return int(self.ends.size)

    def take_range(self, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
        """Windows ``[lo, hi)`` of the mixed order, assembled into C-contiguous ``out``."""
        per = self.offsets.size
        flat = out.reshape(-1, self.block.shape[1])
        step = max(1, TAKE_ROWS // per)
        for a in range(lo, hi, step):
            b = min(hi, a + step)
            rows = _row_index((b - a) * per).reshape(b - a, per)
            np.add(self.ends[a:b, None], self.offsets, out=rows)
            np.take(self.block, rows.reshape(-1), axis=0, out=flat[(a - lo) * per : (b - lo) * per], mode="clip")
        return out


class VirtualWindowReader:
    """A :class:`ChunkReader` look-alike whose chunk ``i`` is the windows of ``ends`` chunk ``i``."""

    def __init__(self, ends: ChunkReader, features: ChunkReader, size: int, scales: Sequence[int]):
        self.ends = ends
        self.features = features
        self.size = int(size)
        self.scales = tuple(int(s) for s in scales)
        self.halo = (self.size - 1) * max(self.scales)
        self.rows = ends.rows
        self.n = ends.n
        self.tail_shape = (self.size, features.tail_shape[0] * len(self.scales))
        self.dtype = features.dtype
        self._piece_rows: int | None = None  # max_piece_rows, once measured
        # A unit of feature chunks about as long as one chunk of windows reads: the
        # build writes the features in chunks of the steps a chunk of windows spans.
        self.kept = FeatureChunks(features, unit_rows=self.halo + features.rows)

    @property
    def n_chunks(self) -> int:
        return self.ends.n_chunks

    def length(self, i: int) -> int:
        return self.ends.length(i)

    @property
    def row_bytes(self) -> int:
        """Bytes of one feature row."""
        return int(np.prod(self.features.tail_shape, dtype=np.int64)) * self.dtype.itemsize

    def max_piece_rows(self) -> int:
        """The most feature rows the windows of one chunk read: the span of its ends
        plus the lookback (exact: every chunk of ends is read once, then kept).

        Session boundaries and windows left out widen a chunk's span beyond its
        windows' steps, so the span is measured, not derived from the chunk's length.
        """
        if self._piece_rows is None:
            span = 0
            for i in range(self.n_chunks):
                ends = self.ends.read(i)
                if ends.size:
                    span = max(span, int(ends.max()) - int(ends.min()) + 1)
            self._piece_rows = span + self.halo
        return self._piece_rows

    def read_bytes(self) -> int:
        """The most bytes one read of a chunk piece holds while it runs, beside the
        kept feature chunks: the feature rows it returns, a unit of feature chunks
        decoded and not (yet) kept, and its chunk of ends (decoded, then as int64)."""
        ends = self.ends.rows * (np.dtype(self.ends.dtype).itemsize + 8)
        return (self.max_piece_rows() + self.kept.rows) * self.row_bytes + ends

    def _rows(self, lo: int, hi: int) -> np.ndarray:
        """Feature rows ``[lo, hi)``, copied out of the decoded runs of feature chunks
        that hold them (:class:`FeatureChunks`). The block holds exactly these rows: a
        view of whole decoded chunks would keep their other rows alive as long as the
        group."""
        c = self.kept.rows
        out = np.empty((hi - lo,) + tuple(self.features.tail_shape), self.dtype)
        for u in range(lo // c, (hi - 1) // c + 1):
            start = u * c
            unit = self.kept.unit(u)
            a, b = max(lo, start), min(hi, start + unit.shape[0])
            out[a - lo : b - lo] = unit[a - start : b - start]
        return out

    def window_rows(self, i: int, lo: int = 0, hi: int | None = None) -> WindowRows:
        """Samples ``[lo, hi)`` of chunk ``i``, to be assembled on demand."""
        return self._window_rows(self.ends.read(i)[lo:hi].astype(np.int64))

    def window_rows_runs(self, i: int, starts: Sequence[int], stops: Sequence[int]) -> WindowRows:
        """Samples of the runs ``[starts[k], stops[k])`` of chunk ``i``, in order (a
        fold's samples): the feature rows from the first window's lookback to the last
        window's end, as for a whole chunk."""
        return self._window_rows(self.ends.read(i)[runs_index(starts, stops)].astype(np.int64))

    def _window_rows(self, ends: np.ndarray) -> WindowRows:
        if ends.size == 0:
            return WindowRows(np.empty((0, self.features.tail_shape[0]), self.dtype), ends, self.size, self.scales)
        first, last = int(ends.min()) - self.halo, int(ends.max()) + 1
        return WindowRows(self._rows(first, last), ends - first, self.size, self.scales)

    def read(self, i: int, out: np.ndarray | None = None) -> np.ndarray:
        rows = self.window_rows(i)
        if len(rows) == 0:
            return np.empty((0,) + self.tail_shape, self.dtype) if out is None else out
        return windows_numpy_block(rows.block, rows.ends, self.size, self.scales, out=out)
