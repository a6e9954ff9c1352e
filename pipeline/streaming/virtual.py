"""Virtual windows: assemble ``(n, size, F * len(scales))`` windows while streaming.

A virtual store keeps the per-step feature matrix once (``_shared/features``) and, per
split, the end step of every window (``ends``) with its label. Reading chunk ``i`` of
``x`` reads chunk ``i`` of ``ends``, the feature rows from ``min(end) - halo`` to
``max(end)`` (the halo is ``(size-1) * max(scales)``), and gathers the windows with the
same function the materializing path uses, so the bytes are identical. Disk shrinks by
about ``size`` times for overlapping windows.

While streaming, a group of chunks is not assembled into a buffer of windows: the
loader keeps the group's feature rows (:class:`WindowRows`, ``size`` times smaller than
its windows) and, in the group's mixed order, the rows of every window
(:class:`MixedWindows`); each batch is then one gather of its own windows' rows. Every
window byte is written once, into the batch, where a materialized store decodes each
byte into a buffer and copies it again into the batch.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pipeline.features.windows import (
    check_window_ends,
    row_offsets,
    windows_numpy_block,
)
from pipeline.streaming.chunks import ChunkReader, runs_index

__all__ = ["MixedWindows", "VirtualWindowReader", "WindowRows"]


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
    """A group's windows in its mixed order, each batch one ``np.take`` of feature rows.

    The row index of every window (``size * len(scales)`` rows, in output order) is
    computed for the whole group when it is loaded, in the loader's thread; serving a
    batch of windows ``[lo, hi)`` of the mixed order is then a single gather, as cheap
    in Python as a batch of a materialized store. Measured on 2 cores: the per-batch
    numpy calls, each releasing and retaking the GIL against the loader's and the
    training loop's threads, cost more than assembling the windows.

    Memory: 8 bytes per window row (a ``(32, 18)`` float32 window of 2 scales holds 64
    rows: 512 bytes of index for 2,304 bytes of window), for the groups in memory only.
    """

    __slots__ = ("block", "rows")

    def __init__(self, windows: WindowRows, perm: np.ndarray):
        self.block = windows.block
        ends = np.take(windows.ends, perm)  # bounds checked: perm comes from outside
        self.rows = np.add(ends[:, None], windows._offsets)

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def take_range(self, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
        """Windows ``[lo, hi)`` of the mixed order, assembled into C-contiguous ``out``."""
        np.take(self.block, self.rows[lo:hi].reshape(-1), axis=0, out=out.reshape(-1, self.block.shape[1]),
                mode="clip")
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

    @property
    def n_chunks(self) -> int:
        return self.ends.n_chunks

    def length(self, i: int) -> int:
        return self.ends.length(i)

    def _rows(self, lo: int, hi: int) -> np.ndarray:
        """Feature rows ``[lo, hi)``, from the feature chunks that hold them."""
        c = self.features.rows
        parts = [self.features.read(k) for k in range(lo // c, (hi - 1) // c + 1)]
        block = parts[0] if len(parts) == 1 else np.concatenate(parts)
        start = (lo // c) * c
        return block[lo - start : hi - start]

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
