"""One blockwise step with a halo: each block of a series sees rows of its neighbours.

Per-step features look back (their lookback), labels look back and ahead (their reach).
Both run a numpy function on each block extended by ``back`` rows before it and ``fwd``
after (``dask.array.overlap`` with no padding at the series' ends, so a value whose
reach leaves the series comes out as it would in one block) and keep the block's own
rows: results are the same whatever the chunking.
"""

from __future__ import annotations

from typing import Any, Callable

import dask.array as da
import numpy as np

from pipeline.features.geometry import merge_short_chunks

__all__ = ["map_with_halo"]


def map_with_halo(x: da.Array, fn: Callable[[np.ndarray], np.ndarray], *, back: int, fwd: int, width: int,
                  dtype: Any, token: str) -> da.Array:
    """``fn`` over each block of ``x`` (``(T, C)``) with ``back`` rows before and ``fwd``
    after it; ``fn`` returns one row per input row, of ``width`` columns.

    Chunks shorter than the halo are merged with their neighbours first (``overlap``
    borrows from one neighbour only); a lone chunk borrows nothing.
    """
    x = x.rechunk({1: -1})
    depth = max(back, fwd)
    if depth > 0:
        chunks = merge_short_chunks(x.chunks[0], depth)
        if chunks != x.chunks[0]:
            x = x.rechunk({0: chunks})
    overlapped = depth > 0 and len(x.chunks[0]) > 1
    padded = (da.overlap.overlap(x, depth={0: (back, fwd), 1: 0}, boundary="none", allow_rechunk=False)
              if overlapped else x)
    sizes = np.asarray(x.chunks[0], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    out_dtype = np.dtype(dtype)

    def block_fn(block: np.ndarray, block_id: tuple[int, ...] = (0, 0)) -> np.ndarray:
        i = block_id[0]
        left = min(back, int(starts[i])) if overlapped else 0
        return fn(block)[left : left + int(sizes[i])].astype(out_dtype, copy=False)

    return da.map_blocks(block_fn, padded, dtype=out_dtype, chunks=(x.chunks[0], (width,)), token=token,
                         meta=np.empty((0, 0), dtype=out_dtype))
