"""Numpy arrays handed to :func:`pipeline.write`, as dask arrays in the blocks its write
tasks write: never one task holding a whole array.

A memory-mapped file (``np.load(path, mmap_mode="r")``, an ``np.memmap``, or a view of
one) is read by each write task from the file, by path and position
(:class:`FileRows`): the graph holds no array data, the client reads none of it, and a
file changed during the write is refused naming it. Any other numpy array is cut into
the blocks in memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import dask.array as da
import numpy as np

from pipeline.storage.layout import unit_chunks

__all__ = ["FileRows", "as_blocks", "file_rows"]


@dataclass(frozen=True, eq=False)
class FileRows:
    """Rows of an array that lies in a file, as a memory map lays them out: the file,
    the position of element ``[0, ...]``, shape, strides and dtype, and the file's size
    and modification time when the write began. Everything a write task needs to read
    its rows itself, by path: the graph holds no array data.

    ``index`` (sorted rows of the array so described) picks rows, for a split made by
    ``times=`` or ``split_by="random"``; it holds one block's rows only.
    """

    path: str
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype
    stamp: tuple[int, int]
    index: np.ndarray | None = None

    def __str__(self) -> str:  # errors of the blocks read (blocks.check_block) name the file
        return self.path

    @property
    def rows(self) -> int:
        """Rows described (picked, where ``index`` picks them)."""
        return int(self.shape[0] if self.index is None else self.index.size)

    def sliced(self, lo: int, hi: int) -> "FileRows":
        """Rows ``lo:hi`` (``0 <= lo <= hi <= shape[0]``), a view of the same file."""
        return FileRows(self.path, self.offset + lo * self.strides[0], (hi - lo, *self.shape[1:]), self.strides,
                         self.dtype, self.stamp)

    def picked(self, index: np.ndarray) -> "FileRows":
        """Rows ``index`` of these rows (sorted, in range)."""
        return FileRows(self.path, self.offset, self.shape, self.strides, self.dtype, self.stamp,
                         np.asarray(index, dtype=np.int64))

    def read(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi`` read from the file into memory. Runs on a worker.

        Raises
        ------
        LoaderError
            Naming the file, when it changed since the write began (size or
            modification time) or no longer holds the rows.
        """
        from pipeline.errors import LoaderError

        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise LoaderError(self.path, f"cannot read the memory-mapped array's rows ({exc.strerror or exc}); "
                              "every worker must see the file at this path") from None
        fix = "pass the array again (np.load(..., mmap_mode='r')) to write the file as it is now"
        if (st.st_size, st.st_mtime_ns) != self.stamp:
            raise LoaderError(self.path, f"changed since pipeline.write began (size {self.stamp[0]} bytes, modified "
                              f"at {self.stamp[1]} ns; now {st.st_size} bytes at {st.st_mtime_ns} ns): the rows "
                              f"stored would not be the array's; {fix}")
        data, start = _file_bytes(self.path, self.offset)
        try:
            view = np.ndarray(self.shape, self.dtype, buffer=data, offset=self.offset - start, strides=self.strides)
        except (TypeError, ValueError) as exc:
            raise LoaderError(self.path, f"expected {self.shape} {self.dtype} from byte {self.offset}, the file "
                              f"holds {st.st_size} bytes ({exc}); {fix}") from None
        # A copy: the block outlives neither the map nor the file's bytes as they are now.
        return np.array(view[lo:hi]) if self.index is None else view[self.index[lo:hi]]


def _file_bytes(path: str, first: int) -> tuple[np.ndarray, int]:
    """A file's bytes from ``first`` on, as a read-only memory map, and the file position
    of the map's first byte.

    An ``.npy`` file is opened as :func:`pipeline.load` opens it
    (:func:`~pipeline.loaders.npy.read_npy`: its header parsed, a pickle refused, errors
    naming it) and its data mapped; any other file (a raw ``np.memmap``), or a map of an
    ``.npy`` that starts inside its header, whole.
    """
    from pipeline.loaders.npy import read_npy

    if path.endswith(".npy"):
        full = read_npy(path, {})
        if isinstance(full, np.memmap) and full.size and first >= int(full.offset):
            return full.ravel(order="K").view(np.uint8), int(full.offset)
    return np.memmap(path, dtype=np.uint8, mode="r"), 0


def file_rows(a: np.ndarray) -> FileRows | None:
    """Where ``a`` lies in a file, when it is (a view of) a memory map whose file holds
    what it shows; None otherwise (in memory, empty, or a copy-on-write map, whose
    changed pages are in memory only)."""
    root = a
    while isinstance(root, np.ndarray) and not (isinstance(root, np.memmap) and root.base is getattr(
            root, "_mmap", None) and root.base is not None):
        root = root.base
    if not isinstance(root, np.memmap) or a.ndim == 0 or a.size == 0 or root.mode not in ("r", "r+", "w+"):
        return None
    path = os.path.abspath(str(root.filename)) if root.filename else None
    if path is None or not os.path.isfile(path):
        return None
    if root.mode != "r":
        root.flush()  # what a writable map holds, on disk for the workers
    st = os.stat(path)
    start = int(root.offset) + (a.__array_interface__["data"][0] - root.__array_interface__["data"][0])
    return FileRows(path, start, tuple(int(s) for s in a.shape), tuple(int(s) for s in a.strides), a.dtype,
                     (int(st.st_size), int(st.st_mtime_ns)))


def as_blocks(a: Any, block: int, rows: slice | np.ndarray | None = None) -> da.Array:
    """Rows ``rows`` of ``a`` (all of them for None; a ``slice`` of ``lo:hi``, or sorted
    indices) as a dask array in blocks of ``block`` samples, which a write task writes
    as they come (:func:`~pipeline.storage.units.write_blocks`): a numpy array is
    never taken whole into one task.

    A dask array is sliced as it is. A memory-mapped file (``np.load(path,
    mmap_mode="r")``, or a view of one) is read by each task from the file by path and
    position, through the blockwise layer that :func:`pipeline.load` reads files with
    (:func:`~pipeline.loaders.blocks.concat_array`): the graph holds no array data,
    and the client reads none. Any other array is cut into the blocks in memory.
    """
    if isinstance(a, da.Array):
        return a if rows is None else a[rows]
    a = a if isinstance(a, np.ndarray) else np.asarray(a)
    tail = tuple(int(s) for s in a.shape[1:])
    source = file_rows(a)
    if source is not None:
        from pipeline.loaders.blocks import concat_array

        if isinstance(rows, slice):
            lo, hi, _ = rows.indices(source.shape[0])
            source = source.sliced(lo, max(lo, hi))
        if rows is None or isinstance(rows, slice):
            parts = [source]
        else:  # each block's indices only, in its own task's spec
            index = np.asarray(rows, dtype=np.int64)
            parts = [source.picked(index[i:i + block]) for i in range(0, index.size, block)]
        return concat_array(parts, [p.rows for p in parts], tail, a.dtype, _read_file_rows, rows_per_chunk=block,
                            probed=[((p.rows, *tail), a.dtype) for p in parts])
    a = np.asarray(a)  # a copy-on-write map is in memory like any array
    # Picked rows are gathered here: each task then gets its own block only, where
    # tasks gathering from the whole array would each need all of it.
    picked = a if rows is None else a[rows] if isinstance(rows, slice) else np.take(a, rows, axis=0)
    return da.from_array(picked, chunks=(unit_chunks(picked.shape[0], block), *((s,) for s in tail)))


def _read_file_rows(source: FileRows, lo: int, hi: int) -> np.ndarray:
    """:func:`~pipeline.loaders.blocks.concat_array`'s reader: rows ``lo:hi`` of ``source``."""
    return source.read(lo, hi)
