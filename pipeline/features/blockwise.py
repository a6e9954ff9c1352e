"""One blockwise step with a halo: each block of a series sees rows of its neighbours.

Per-step features look back (their lookback), labels look back and ahead (their reach).
Both run a numpy function on each block extended by ``back`` rows before it and ``fwd``
after (with no padding at the series' ends, so a value whose reach leaves the series
comes out as it would in one block) and keep the block's own rows: results are the
same whatever the chunking.

A block's task slices the rows it needs straight out of the input's chunks
(:func:`rows_task`): one task per block, where ``dask.array.overlap`` made four or five
(a slice of each neighbour, their concatenation, the step), and a chunk shorter than
the halo needs no merging, since its rows may come from any number of chunks.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import List, Task, TaskRef

from pipeline.features.geometry import row_pieces

__all__ = ["map_with_halo", "rows_task"]


def _rows(parts: Sequence[np.ndarray], slices: Sequence[tuple[int, int]]) -> np.ndarray:
    """One array of consecutive rows from slices of chunks (no copy for one slice)."""
    pieces = [p[a:b] for p, (a, b) in zip(parts, slices)]
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def rows_task(a: da.Array, bounds: np.ndarray, lo: int, hi: int) -> Task:
    """An inline task (no key) that gives rows ``lo .. hi - 1`` of ``a``, whose chunk
    edges along axis 0 are ``bounds`` (every other axis one chunk), from its chunks."""
    pieces = row_pieces(bounds, lo, hi)
    rest = (0,) * (a.ndim - 1)
    refs = List(*(TaskRef((a.name, c, *rest)) for c, _, _ in pieces))
    return Task(None, _rows, refs, [(s, e) for _, s, e in pieces])


def _step(fn: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, columns: Sequence[int] | None, left: int,
          count: int, dtype: Any) -> np.ndarray:
    block = rows if columns is None else rows[:, list(columns)]
    return fn(block)[left : left + count].astype(dtype, copy=False)


def map_with_halo(x: da.Array, fn: Callable[[np.ndarray], np.ndarray], *, back: int, fwd: int, width: int,
                  dtype: Any, token: str, columns: Sequence[int] | None = None) -> da.Array:
    """``fn`` over each block of ``x`` (``(T, C)``) with ``back`` rows before and ``fwd``
    after it; ``fn`` returns one row per input row, of ``width`` columns.

    Parameters
    ----------
    x
        The series, time along axis 0.
    fn
        The numpy step, on ``(rows, C)`` (or ``(rows, len(columns))``) blocks.
    back
        Rows each block borrows before it.
    fwd
        Rows each block borrows after it.
    width
        Columns of ``fn``'s result.
    dtype
        The result's dtype.
    token
        The name's prefix.
    columns
        Only these columns of ``x`` reach ``fn``, selected inside each task.

    Returns
    -------
    dask.array.Array
        ``(T, width)``, chunked as ``x`` along time: one task per chunk.
    """
    x = x.rechunk({1: -1})
    out_dtype = np.dtype(dtype)
    T = int(x.shape[0])
    if T == 0:
        return da.zeros((0, width), dtype=out_dtype, chunks=((0,), (width,)))
    bounds = np.concatenate([[0], np.cumsum(x.chunks[0])]).astype(np.int64)
    cols = None if columns is None else tuple(int(c) for c in columns)
    name = f"{token}-{tokenize(x.name, fn, back, fwd, width, out_dtype.str, cols)}"
    layer = {}
    for i in range(len(x.chunks[0])):
        start, stop = int(bounds[i]), int(bounds[i + 1])
        if stop == start:
            layer[(name, i, 0)] = Task((name, i, 0), np.zeros, [0, width], out_dtype)
            continue
        lo, hi = max(0, start - back), min(T, stop + fwd)
        layer[(name, i, 0)] = Task((name, i, 0), _step, fn, rows_task(x, bounds, lo, hi), cols, start - lo,
                                   stop - start, out_dtype)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    return da.Array(graph, name, chunks=(x.chunks[0], (width,)), dtype=out_dtype,
                    meta=np.empty((0, 0), dtype=out_dtype))
