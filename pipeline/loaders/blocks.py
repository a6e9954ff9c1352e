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

__all__ = ["can_fit", "check_block", "concat_array", "fit_shape", "pad_shape", "row_blocks", "row_step",
           "stack_array"]

#: Bytes of one row block of joined files when ``rows_per_chunk`` is not given.
TARGET_BLOCK_BYTES = 32 << 20
#: A file's row alignment (an HDF5 dataset's chunk rows) is followed only while a block
#: of whole chunks stays under this many target blocks: one chunk must be decoded
#: whole anyway, but a block of many target sizes would bound no task's memory.
_ALIGN_LIMIT = 4


def can_fit(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether :func:`fit_shape` can make an array of ``shape`` have ``target``: the
    same number of dimensions, or one more or fewer trailing axis of length 1."""
    shape, target = tuple(shape), tuple(target)
    if len(shape) == len(target):
        return True
    if len(shape) == len(target) - 1:
        return target[-1] == 1
    return len(shape) == len(target) + 1 and shape[-1] == 1


def pad_shape(shapes: Sequence[tuple[int, ...]], first: tuple[int, ...]) -> tuple[int, ...]:
    """The shape ``on_mismatch="pad"`` fits every stacked file to: the largest length
    along each axis among ``shapes``, in ``first``'s number of dimensions.

    As torch's ``pad_sequence`` and Keras' ``pad_sequences`` (without ``maxlen``) pad,
    so that no file is cut and the result does not depend on the files' order. Each
    shape is one that :func:`can_fit` accepts for ``first``: a trailing axis of length 1
    that it lacks or has more than ``first`` is added or dropped first, as
    :func:`fit_shape` does, and holds no length of its own.
    """
    first = tuple(int(t) for t in first)
    largest = list(first)
    for shape in shapes:
        shape = tuple(int(s) for s in shape)
        shape = (*shape, 1) if len(shape) < len(first) else shape[: len(first)]
        largest = [max(a, b) for a, b in zip(largest, shape)]
    return tuple(largest)


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
            if not np.can_cast(a.dtype, dtype, "safe"):  # every probed dtype casts safely: the file changed
                from pipeline.errors import LoaderError

                raise LoaderError(p, f"read as {a.dtype}, which the array's dtype {np.dtype(dtype)} (from the "
                                  "headers when the array was built) cannot hold: the file changed since; build "
                                  "the array again (pipeline.load) from the files as they are now")
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


def row_step(row_bytes: int, align: int | None = None, *, target: int = TARGET_BLOCK_BYTES) -> int:
    """Rows per block of a file of ``row_bytes`` per row: about ``target`` bytes, rounded
    to a multiple of ``align`` (an HDF5 dataset's chunk rows) when given.

    Reading rows that cut through a compressed HDF5 chunk decodes the whole chunk for
    each block that touches it: aligned blocks decode each chunk once. A chunk larger
    than the target makes a block of one chunk, unless that block would pass
    ``_ALIGN_LIMIT`` targets, where the plain target is kept to bound a task's memory.
    """
    step = max(1, target // max(1, row_bytes))
    if not align or align <= 0:
        return step
    if align * row_bytes > _ALIGN_LIMIT * target:
        return step
    return max(1, round(step / align)) * align


def row_blocks(rows: int, step: int) -> list[tuple[int, int]]:
    """``(lo, hi)`` of consecutive blocks of ``step`` rows covering ``rows`` rows."""
    return [(lo, min(lo + step, rows)) for lo in range(0, rows, step)]


def check_block(path: str, lo: int, hi: int, block: np.ndarray, probed: tuple[tuple[int, ...], np.dtype | None],
                dtype: np.dtype) -> None:
    """Refuse rows ``lo:hi`` of ``path`` read as ``block`` when the file no longer is what
    its header said when the array was built (``probed``: its shape, and its dtype when
    known), before the block goes anywhere.

    A file rewritten shorter reads fewer rows than the block's place in the array holds:
    dask and zarr would store zeros in the missing rows. A file rewritten in a wider
    dtype would be cast back into the array's dtype, silently. Without the probed dtype,
    a dtype the array's one cannot hold safely is refused (every probed dtype casts
    safely to the array's ``np.result_type``, so the file changed).

    Raises
    ------
    ShapeMismatchError
        For a block of another shape than ``(hi - lo, *probed_shape[1:])``.
    LoaderError
        For a block of another dtype than probed (or one ``dtype`` cannot hold safely).
    """
    from pipeline.errors import LoaderError, ShapeMismatchError

    shape, was = tuple(probed[0]), probed[1]
    want = (hi - lo, *shape[1:])
    said = f"its header said shape {shape}{f' {np.dtype(was)}' if was is not None else ''} when the array was built"
    fix = "the file changed since; build the array again (pipeline.load) from the files as they are now"
    if tuple(block.shape) != want:
        raise ShapeMismatchError(path, f"{said}, but rows {lo}:{hi} now read as shape {tuple(block.shape)} "
                                 f"{block.dtype} (expected {want}): {fix}")
    if was is not None and block.dtype != np.dtype(was):
        raise LoaderError(path, f"{said}, but rows {lo}:{hi} now read as {block.dtype}: {fix}")
    if was is None and not np.can_cast(block.dtype, dtype, "safe"):
        raise LoaderError(path, f"{said}, read as {np.dtype(dtype)}, but rows {lo}:{hi} now read as {block.dtype}, "
                          f"which {np.dtype(dtype)} cannot hold: {fix}")


def concat_array(
    paths: Sequence[str],
    rows: Sequence[int],
    tail: tuple[int, ...],
    dtype: np.dtype,
    read_rows: Callable[[str, int, int], np.ndarray],
    *,
    rows_per_chunk: int | None = None,
    probed: Sequence[tuple[tuple[int, ...], np.dtype]] | None = None,
    row_align: Sequence[int | None] | None = None,
    block_bytes: int = TARGET_BLOCK_BYTES,
) -> da.Array:
    """``(sum(rows), *tail)``: files joined along axis 0, each read by blocks of rows and
    cast to ``dtype``, which must hold every file's values (their ``np.result_type``).

    Parameters
    ----------
    paths, rows, tail, dtype
        The files, their row counts, the shape of a row, and the array's dtype.
    read_rows
        ``read_rows(path, lo, hi)``: rows ``lo:hi`` of a file, in its own dtype.
    rows_per_chunk
        Rows per block; default about ``block_bytes``, in whole multiples of ``row_align``.
    probed
        Each file's ``(shape, dtype)`` from its header: every block is checked against
        it by :func:`check_block` (without it, against ``rows`` and ``tail``, and the
        dtype only for a cast ``dtype`` cannot hold).
    row_align
        Each file's row alignment (an HDF5 dataset's chunk rows, None for none): default
        blocks of that file are whole multiples of it (:func:`row_step`).
    block_bytes
        Bytes of a default block (in the array's dtype).
    """
    row_bytes = max(1, int(np.prod(tail, dtype=np.int64)) * np.dtype(dtype).itemsize)
    aligns = list(row_align) if row_align is not None else [None] * len(paths)
    expect = list(probed) if probed is not None else [((n, *tail), None) for n in rows]
    parts = [(p, lo, hi, (tuple(e[0]), None if e[1] is None else np.dtype(e[1])))
             for p, n, a, e in zip(paths, rows, aligns, expect)
             for lo, hi in row_blocks(n, rows_per_chunk or row_step(row_bytes, a, target=block_bytes))]
    if not parts:
        # Every file has 0 rows (an empty dataset, an npy of shape (0, F)): the result is
        # empty as np.concatenate makes it, with no block to read (map_blocks over no
        # block fails inside dask).
        return da.zeros((0, *tail), dtype=dtype, chunks=((0,), *((s,) for s in tail)))
    specs = np.empty(len(parts), dtype=object)
    specs[:] = parts
    blocks = da.from_array(specs, chunks=1, name=f"row-blocks-{tokenize(parts)}")

    def read_block(block: np.ndarray) -> np.ndarray:
        path, lo, hi, was = block[0]
        got = np.asarray(read_rows(path, lo, hi))
        check_block(path, lo, hi, got, was, dtype)
        # ``dtype`` is the files' common dtype: a widening cast, never a narrowing one.
        return got.astype(dtype, copy=False)

    return blocks.map_blocks(
        read_block,
        dtype=dtype,
        chunks=(tuple(hi - lo for _, lo, hi, _ in parts),) + tuple((s,) for s in tail),
        new_axis=list(range(1, len(tail) + 1)),
        token="read-rows",
        meta=np.empty((0,) * (len(tail) + 1), dtype=dtype),
    )
