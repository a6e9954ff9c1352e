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

from pipeline.features.geometry import chunk_bounds, halo_span, row_pieces

__all__ = ["map_with_halo", "rows_task", "take_rows"]


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


def _take(parts: Sequence[np.ndarray], local: Sequence[np.ndarray], order: np.ndarray) -> np.ndarray:
    """The picked rows of each chunk, joined, in the order asked for."""
    picked = np.concatenate([p[i] for p, i in zip(parts, local)])
    return picked[order]


def take_rows(a: da.Array, rows: Sequence[int] | np.ndarray) -> da.Array:
    """Rows ``rows`` of ``a`` along axis 0 (any order, repeats and negative indices
    allowed, as numpy takes them) as one task that reads only the chunks holding them.

    dask's own ``a[rows]`` splits every chunk of ``a`` (a shuffle of one task per chunk,
    plus its gathering tasks), and so computes every chunk: the first row of each of a
    few segments read every timestamp of every file. An array chunked along another
    axis too goes through dask's index.
    """
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    n = int(a.shape[0])
    if rows.size and (rows.min() < -n or rows.max() >= n):
        raise IndexError(f"rows {int(rows.min())}..{int(rows.max())} outside -{n}..{n - 1}")
    if any(k != 1 for k in a.numblocks[1:]):
        return a[rows]
    tail = tuple((int(d),) for d in a.shape[1:])
    if not rows.size:
        return da.zeros((0,) + a.shape[1:], dtype=a.dtype, chunks=((0,),) + tail)
    rows = np.where(rows < 0, rows + n, rows)  # from the end, as numpy and dask count them
    bounds = chunk_bounds(a.chunks[0])
    chunk_of = np.searchsorted(bounds, rows, side="right") - 1
    by_chunk = np.argsort(chunk_of, kind="stable")
    chunks, first = np.unique(chunk_of[by_chunk], return_index=True)
    groups = np.split(by_chunk, first[1:])
    rest = (0,) * (a.ndim - 1)
    refs = List(*(TaskRef((a.name, int(c), *rest)) for c in chunks))
    local = [rows[g] - bounds[c] for c, g in zip(chunks, groups)]
    # Row k of the joined picks is rows[by_chunk[k]]: its inverse puts them back in order.
    order = np.empty(rows.size, dtype=np.int64)
    order[by_chunk] = np.arange(rows.size)
    name = f"take-rows-{tokenize(a.name, rows)}"
    key = (name, 0) + rest
    graph = HighLevelGraph.from_collections(name, {key: Task(key, _take, refs, local, order)}, dependencies=[a])
    return da.Array(graph, name, chunks=((rows.size,),) + tail, dtype=a.dtype)


def _step(fn: Callable[[np.ndarray], np.ndarray], rows: np.ndarray, columns: Sequence[int] | None, left: int,
          count: int, dtype: Any, post: Callable[[np.ndarray, int], np.ndarray] | None = None,
          start: int = 0) -> np.ndarray:
    block = rows if columns is None else rows[:, list(columns)]
    out = fn(block)[left : left + count].astype(dtype, copy=False)
    return out if post is None else post(out, start)


def map_with_halo(x: da.Array, fn: Callable[[np.ndarray], np.ndarray], *, back: int, fwd: int, width: int,
                  dtype: Any, token: str, columns: Sequence[int] | None = None,
                  post: Callable[[np.ndarray, int], np.ndarray] | None = None,
                  cuts: Sequence[int] | None = None) -> da.Array:
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
    post
        ``post(result, start)`` finishes each block's result in its task (``start``: the
        block's first row): a step that would otherwise be a layer of its own, and so,
        once dask fuses it with this one, an extra task per block that only hands the
        fused result on under the layer's keys.
    cuts
        Rows where the series is cut into sessions (their starts and stops): no block's
        halo reaches across one (:func:`~pipeline.features.geometry.halo_span`). Rows
        whose reach crosses a cut then come out otherwise than over the uncut series;
        for callers that never use those rows (a build: see the geometry's note). A
        block starting or ending on a cut then reads no neighbour's chunk, so its task
        need not wait for that chunk, nor keep it in memory.

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
    bounds = chunk_bounds(x.chunks[0])
    cols = None if columns is None else tuple(int(c) for c in columns)
    edges = None if cuts is None else np.unique(np.asarray(cuts, dtype=np.int64))
    name = f"{token}-{tokenize(x.name, fn, back, fwd, width, out_dtype.str, cols, post, edges)}"
    layer = {}
    for i in range(len(x.chunks[0])):
        start, stop = int(bounds[i]), int(bounds[i + 1])
        if stop == start:
            layer[(name, i, 0)] = Task((name, i, 0), np.zeros, [0, width], out_dtype)
            continue
        lo, hi = halo_span(start, stop, back, fwd, T, edges)
        layer[(name, i, 0)] = Task((name, i, 0), _step, fn, rows_task(x, bounds, lo, hi), cols, start - lo,
                                   stop - start, out_dtype, post, start)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    return da.Array(graph, name, chunks=(x.chunks[0], (width,)), dtype=out_dtype,
                    meta=np.empty((0, 0), dtype=out_dtype))
