"""Chunks that several pieces of one worker's plan read, decoded once.

An elastic plan (:mod:`~pipeline.streaming.elastic`) cuts each lane's samples where a
group of global steps ends, and a lane's share of a group may be less than a chunk: a
chunk's samples then go to two groups or more, read as pieces at different times. A
chunk read as a piece is decoded whole first, unless it is a large blosc chunk, whose
blocks holding the piece are decoded alone (:meth:`~pipeline.streaming.chunks.ChunkReader.scatter`).
So without care, a small chunk cut in ``k`` pieces is decoded ``k`` times.

:class:`SharedChunks` stands in for the source of one worker's loader: the first piece
of a chunk that the plan reads in several pieces decodes the chunk, the others copy from
it, and it is dropped once its last piece is read. Only chunks of at most
:data:`~pipeline.streaming.blosc.BLOCKWISE_ABOVE` bytes are kept: larger ones are read by
blocks (blosc), or decoded per piece (other codecs), rather than held in memory.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any, Sequence

import numpy as np

from pipeline.streaming.blosc import BLOCKWISE_ABOVE
from pipeline.streaming.chunks import ArrayPool

__all__ = ["SharedChunks"]


class _Entry:
    """One shared chunk of one array: decoded by the first piece that asks for it."""

    __slots__ = ("lock", "array", "left")

    def __init__(self, left: int):
        self.lock = threading.Lock()
        self.array: np.ndarray | None = None
        self.left = left


class SharedChunks:
    """A source whose ``scatter`` decodes a chunk read in several pieces only once.

    Parameters
    ----------
    source
        The stream's source; everything but ``scatter`` goes straight to it.
    pieces
        The plan's pieces (anything with ``chunk``, ``lo`` and ``hi``), all of which
        will be scattered once per array.
    names
        The arrays scattered (assembled arrays are read by rows and not counted).
    arrays
        Where the decoded chunks come from and go back to once their last piece is read
        (kept by the stream across epochs): a new array of a few MB costs as much in
        page faults as decoding into it. None: new arrays.
    """

    def __init__(self, source: Any, pieces: Sequence[Any], names: Sequence[str], arrays: ArrayPool | None = None):
        self._source = source
        self._arrays = arrays
        counts = Counter(p.chunk for p in pieces)
        self._shared: dict[str, dict[int, int]] = {}
        for name in names:
            tail, dtype = source.sample_shape(name)
            row_bytes = int(np.prod(tail, dtype=np.int64)) * np.dtype(dtype).itemsize
            self._shared[name] = {c: k for c, k in counts.items()
                                  if k > 1 and source.lengths[c] * row_bytes <= BLOCKWISE_ABOVE}
        self._entries: dict[tuple[str, int], _Entry] = {}
        self._lock = threading.Lock()

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._source, attr)

    def scatter(self, name: str, piece: Any, out: np.ndarray, rows: np.ndarray) -> None:
        """Samples ``[piece.lo, piece.hi)`` of chunk ``piece.chunk`` to ``out[rows]``."""
        left = self._shared.get(name, {}).get(piece.chunk)
        if left is None:
            self._source.scatter(name, piece, out, rows)
            return
        key = (name, piece.chunk)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = _Entry(left)
        with entry.lock:
            if entry.array is None:
                into = None
                if self._arrays is not None:
                    tail, dtype = self._source.sample_shape(name)
                    into = self._arrays.get((int(self._source.lengths[piece.chunk]),) + tuple(tail), np.dtype(dtype))
                try:
                    entry.array = self._source.read(name, piece.chunk, into)
                except BaseException:
                    if into is not None:
                        self._arrays.put(into)
                    raise
        out[rows] = entry.array[piece.lo : piece.hi]
        with self._lock:
            entry.left -= 1
            if entry.left == 0:  # its last piece: nothing will ask for it again
                del self._entries[key]
                # Every piece's copy is done (each counts down after its own).
                if self._arrays is not None and entry.array is not None:
                    self._arrays.put(entry.array)

    @property
    def held(self) -> int:
        """Chunks decoded and kept for pieces still to come (for tests and diagnostics)."""
        with self._lock:
            return sum(e.array is not None for e in self._entries.values())
