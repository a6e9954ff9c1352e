"""Virtual windows: assemble ``(n, size, F * len(scales))`` windows while streaming.

A virtual store keeps the per-step feature matrix once (``_shared/features``) and, per
split, the end step of every window (``ends``) with its label. Reading chunk ``i`` of
``x`` reads chunk ``i`` of ``ends``, the feature rows from ``min(end) - halo`` to
``max(end)`` (the halo is ``(size-1) * max(scales)``), and gathers the windows with the
same function the materializing path uses, so the bytes are identical. Disk shrinks by
about ``size`` times for overlapping windows.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from pipeline.features.windows import windows_numpy_block
from pipeline.streaming.chunks import ChunkReader

__all__ = ["VirtualWindowReader"]


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

    def read(self, i: int, out: np.ndarray | None = None) -> np.ndarray:
        ends = self.ends.read(i).astype(np.int64, copy=False)
        if ends.size == 0:
            return np.empty((0,) + self.tail_shape, self.dtype) if out is None else out
        lo, hi = int(ends.min()) - self.halo, int(ends.max()) + 1
        block = self._rows(lo, hi)
        return windows_numpy_block(block, ends - lo, self.size, self.scales, out=out)
