"""One blockwise graph layer over a file list, for stacked and concatenated arrays.

The file list becomes a 1-D object array (``da.from_array``) and one ``map_blocks`` reads
each block of it, so the graph has the same few layers for 10 files or 100,000.
Shape fixes for files that differ (``on_mismatch``) are pure functions of the data.
"""

from __future__ import annotations

from typing import Callable, Sequence

import dask.array as da
import numpy as np
from dask.base import tokenize

__all__ = ["can_fit", "concat_array", "fit_shape", "stack_array"]


def can_fit(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether :func:`fit_shape` can make an array of ``shape`` have ``target``: the
    same number of dimensions, or one more or fewer trailing axis of length 1."""
    shape, target = tuple(shape), tuple(target)
    if len(shape) == len(target):
        return True
    if len(shape) == len(target) - 1:
        return target[-1] == 1
    return len(shape) == len(target) + 1 and shape[-1] == 1


def fit_shape(a: np.ndarray, shape: tuple[int, ...], how: str, *, axes: int | None = None) -> np.ndarray:
    """Make ``a`` have ``shape``: ``pad`` with zeros at the end of each axis, ``crop``
    from the start (both keep the leading, top-left part), ``resize`` by nearest-neighbour
    resampling (or ``raise``: unchanged).

    ``axes`` fits the leading ``axes`` axes only (an image's height and width), the
    others (its channels) must already be equal: padding or resampling channels would
    make RGB into ``[R, R, G, B]`` or give it a zero alpha. Only shapes :func:`can_fit`
    accepts, and with ``axes`` equal trailing axes, are fitted (a ``ValueError``
    otherwise); the loaders check them from the headers when the array is built."""
    shape = tuple(shape)
    if a.shape == shape or how == "raise":
        return a
    if axes is not None and (a.ndim != len(shape) or a.shape[axes:] != shape[axes:]):
        raise ValueError(f"cannot fit an array of shape {a.shape} to {shape}: only its first {axes} axes are fitted")
    if a.ndim != len(shape):
        if not can_fit(a.shape, shape):
            raise ValueError(f"cannot fit an array of shape {a.shape} to {shape}")
        a = a[..., None] if a.ndim < len(shape) else a[..., 0]
    n = len(shape) if axes is None else axes
    if how == "resize":
        for ax in range(n):
            s, t = a.shape[ax], shape[ax]
            a = np.take(a, np.minimum((np.arange(t) * s) // max(t, 1), s - 1), axis=ax)
        return a
    out = np.zeros(shape, dtype=a.dtype)
    common = tuple(slice(0, min(s, t)) for s, t in zip(a.shape[:n], shape[:n]))
    out[common] = a[common]  # pad and crop both keep the leading part of each axis
    return out


def stack_array(
    paths: Sequence[str],
    shape: tuple[int, ...],
    dtype: np.dtype,
    read: Callable[[str], np.ndarray],
    *,
    files_per_chunk: int | None = None,
    on_mismatch: str = "raise",
    fit_axes: int | None = None,
) -> da.Array:
    """``(N, *shape)``: one sample per file, ``files_per_chunk`` files per dask chunk.

    A file of another shape is refused (``on_mismatch="raise"``) or fitted by
    :func:`fit_shape`, on its first ``fit_axes`` axes only when given (images: height
    and width)."""
    sample_bytes = max(1, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    per = files_per_chunk or max(1, min(4096, (16 << 20) // sample_bytes))
    names = np.empty(len(paths), dtype=object)
    names[:] = list(paths)
    files = da.from_array(names, chunks=per, name=f"files-{tokenize(list(paths))}")

    def read_block(block: np.ndarray) -> np.ndarray:
        out = np.empty((len(block), *shape), dtype=dtype)
        for i, p in enumerate(block):
            a = np.asarray(read(p))
            if a.shape != tuple(shape):
                from pipeline.errors import ShapeMismatchError

                if on_mismatch == "raise":
                    raise ShapeMismatchError(p, f"expected shape {tuple(shape)} (from the header), read {a.shape}")
                try:
                    a = fit_shape(a, shape, on_mismatch, axes=fit_axes)
                except ValueError as exc:  # the header said another shape than the data has
                    raise ShapeMismatchError(p, f"read shape {a.shape}, which on_mismatch={on_mismatch!r} cannot "
                                             f"fit to {tuple(shape)} ({exc})") from None
            out[i] = a
        return out

    return files.map_blocks(
        read_block,
        dtype=dtype,
        chunks=(files.chunks[0],) + tuple((s,) for s in shape),
        new_axis=list(range(1, len(shape) + 1)),
        token="read-files",
        meta=np.empty((0,) * (len(shape) + 1), dtype=dtype),
    )


def concat_array(
    paths: Sequence[str],
    rows: Sequence[int],
    tail: tuple[int, ...],
    dtype: np.dtype,
    read_rows: Callable[[str, int, int], np.ndarray],
    *,
    rows_per_chunk: int | None = None,
) -> da.Array:
    """``(sum(rows), *tail)``: files joined along axis 0, each read by blocks of rows and
    cast to ``dtype``, which must hold every file's values (their ``np.result_type``)."""
    row_bytes = max(1, int(np.prod(tail, dtype=np.int64)) * np.dtype(dtype).itemsize)
    step = rows_per_chunk or max(1, (32 << 20) // row_bytes)
    parts = [(p, lo, min(lo + step, n)) for p, n in zip(paths, rows) for lo in range(0, n, step)]
    if not parts:
        # Every file has 0 rows (an empty dataset, an npy of shape (0, F)): the result is
        # empty as np.concatenate makes it, with no block to read (map_blocks over no
        # block fails inside dask).
        return da.zeros((0, *tail), dtype=dtype, chunks=((0,), *((s,) for s in tail)))
    specs = np.empty(len(parts), dtype=object)
    specs[:] = parts
    blocks = da.from_array(specs, chunks=1, name=f"row-blocks-{tokenize(parts)}")

    def read_block(block: np.ndarray) -> np.ndarray:
        path, lo, hi = block[0]
        # ``dtype`` is the files' common dtype: a widening cast, never a narrowing one.
        return np.asarray(read_rows(path, lo, hi)).astype(dtype, copy=False)

    return blocks.map_blocks(
        read_block,
        dtype=dtype,
        chunks=(tuple(hi - lo for _, lo, hi in parts),) + tuple((s,) for s in tail),
        new_axis=list(range(1, len(tail) + 1)),
        token="read-rows",
        meta=np.empty((0,) * (len(tail) + 1), dtype=dtype),
    )
