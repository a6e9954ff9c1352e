"""Multi-scale windows over a ``(T, F)`` series, computed blockwise.

Each input block borrows ``halo`` steps from its left neighbour
(``dask.array.overlap.overlap`` with a backward-only depth) and makes exactly the windows
whose end step it holds, so windows crossing chunk boundaries are right and no window is
made twice. A block gathers its windows scale by scale with one fancy index each:
memory per task is the output chunk plus one scale's share of it, not a
``sliding_window_view`` copy of the block per scale.
"""

from __future__ import annotations

from typing import Sequence

import dask.array as da
import numpy as np

from pipeline.errors import WindowError
from pipeline.features.geometry import block_window_counts, halo, merge_short_chunks, split_long_chunks, window_count

__all__ = ["windows", "windows_numpy_block"]


def _validate(size: int, stride: int, scales: Sequence[int]) -> tuple[int, ...]:
    for name, value in (("size", size), ("stride", stride)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise WindowError(f"windows: {name} must be a positive integer, got {value!r}")
    scales = tuple(scales)
    if not scales or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s <= 0 for s in scales):
        raise WindowError(f"windows: scales must be positive integers, got {scales!r}")
    return tuple(int(s) for s in scales)


def windows_numpy_block(
    block: np.ndarray, local_ends: np.ndarray, size: int, scales: Sequence[int], out: np.ndarray | None = None
) -> np.ndarray:
    """Windows ending at ``local_ends`` (indices into ``block``), scales side by side.

    The one place windows are assembled: the blockwise dask path and the streamer's
    virtual windows both call it, so both give the same bytes.
    """
    n, width = local_ends.size, block.shape[1]
    if out is None:
        out = np.empty((n, size, width * len(scales)), dtype=block.dtype)
    if n == 0:
        return out
    row = block.strides[0]
    for k, s in enumerate(scales):
        span = s * (size - 1)
        # A strided view in which view[t] is the window of scale s starting at step t:
        # one fancy index along its first axis then copies whole (size, F) windows,
        # instead of gathering size * n single rows.
        view = np.lib.stride_tricks.as_strided(
            block, shape=(block.shape[0] - span, size, width), strides=(row, s * row, block.strides[1]),
            writeable=False,
        )
        out[:, :, k * width : (k + 1) * width] = view[local_ends - span]
    return out


#: Largest output block: a task holds about three of them at its peak (the block, one
#: scale's gather, the halo'd input), so 64 MiB keeps tasks well inside 1 GiB workers.
MAX_BLOCK_BYTES = 64 * 2**20


def windows(
    x: da.Array | np.ndarray,
    *,
    size: int,
    stride: int = 1,
    scales: Sequence[int] = (1,),
    max_block_bytes: int = MAX_BLOCK_BYTES,
) -> da.Array:
    """Windows of a ``(T, F)`` series: ``(n, size, F * len(scales))``, lazily.

    Window ``i`` ends at step ``e_i = (size-1)*max(scales) + i*stride``; at scale ``s``
    it holds steps ``e_i - s*(size-1), ..., e_i - s, e_i``; scales are concatenated along
    the last axis in the order given.

    Parameters
    ----------
    x
        A 2-D dask or numpy array, time along axis 0.
    size
        Steps per window.
    stride
        Steps between consecutive window ends.
    scales
        Sampling intervals, one block of ``F`` columns each.
    max_block_bytes
        Input chunks are split so that no output block exceeds this.

    Returns
    -------
    dask.array.Array
        Chunked along windows: one chunk per input block (possibly empty).

    Raises
    ------
    WindowError
        When ``x`` is not 2-D, or no window fits in ``T`` steps.
    """
    scales = _validate(size, stride, scales)
    if not isinstance(x, da.Array):
        x = da.from_array(np.asarray(x), chunks=(max(1, 1 << 16), -1))
    if x.ndim != 2:
        raise WindowError(f"windows: expected a (time, features) array, got shape {x.shape}")
    T, F = x.shape
    h = halo(size, scales)
    n = window_count(T, size, stride, scales)
    if n == 0:
        raise WindowError(
            f"windows: a series of {T} steps is too short for size={size} and scales={scales}: "
            f"the first window needs {h + 1} steps"
        )
    x = x.rechunk({1: -1})
    window_bytes = size * F * len(scales) * x.dtype.itemsize
    max_steps = max(stride, (max_block_bytes // max(1, window_bytes)) * stride)
    chunks = split_long_chunks(x.chunks[0], max(max_steps, h))
    if h > 0:
        chunks = merge_short_chunks(chunks, h)
    if chunks != x.chunks[0]:
        x = x.rechunk({0: chunks})
    in_chunks = x.chunks[0]
    counts = block_window_counts(in_chunks, size, stride, scales)
    starts = np.concatenate([[0], np.cumsum(in_chunks)[:-1]]).astype(np.int64)
    overlapped = da.overlap.overlap(x, depth={0: (h, 0), 1: 0}, boundary="none") if h > 0 else x

    def block_fn(block: np.ndarray, block_id: tuple[int, ...] = (0, 0)) -> np.ndarray:
        j = block_id[0]
        if counts[j] == 0:
            return np.empty((0, size, F * len(scales)), dtype=block.dtype)
        start = int(starts[j])
        left = min(h, start)  # the first block has no left neighbour to borrow from
        first = max(0, -(-(start - h) // stride))
        ends = h + stride * (first + np.arange(counts[j], dtype=np.int64))
        return windows_numpy_block(block, ends - (start - left), size, scales)

    return da.map_blocks(
        block_fn,
        overlapped,
        dtype=x.dtype,
        chunks=(counts, (size,), (F * len(scales),)),
        new_axis=2,
        token="windows",
        meta=np.empty((0, 0, 0), dtype=x.dtype),
    )
