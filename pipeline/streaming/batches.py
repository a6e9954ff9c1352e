"""Batch memory that is reused once nobody holds the batch any more.

Most batches need none: they are views of a group's buffer (see
:mod:`~pipeline.streaming.groups`). These slabs hold the batches that are copied: one
spanning two groups, and batches of windows assembled while streaming.

A new batch of a few hundred KB to a few MB per step is filled by the stream's
producer thread and dropped by the training loop's thread. glibc gives such blocks of a
thread's own arena back to the kernel when they are freed from another thread's side,
and the next batch faults them in again: many page faults per epoch, and on a virtual
machine a page fault can cost more than the copy it serves.

So batches are views of a few slabs kept here. A slab is handed out again only when its
reference count shows that no view of it is alive anywhere: a batch the caller keeps (in
a list, as a torch tensor sharing its memory, in a queue) keeps its slab out of use, and
a new slab is made, up to ``max_slabs``; past that, batches are plain new arrays.
Nothing a caller holds is ever overwritten.
"""

from __future__ import annotations

import sys
import threading
from typing import Iterable

import numpy as np

__all__ = ["BatchSlabs", "unviewed"]


def _refcounts(arrays: Iterable[np.ndarray]) -> list[int]:
    return [sys.getrefcount(a) for a in arrays]


#: What an array held by its container alone counts in :func:`_refcounts` on this
#: interpreter: whether the loop's variable and getrefcount's own argument count differs
#: between Python versions, so it is measured rather than assumed.
_ALONE = _refcounts([np.empty(0)])[0]


def unviewed(arrays: Iterable[np.ndarray]) -> bool:
    """Whether nothing but their container references ``arrays``: no view of them (a
    batch, a torch tensor sharing its memory) is alive anywhere, since a view holds its
    base array."""
    return all(n <= _ALONE for n in _refcounts(arrays))


class BatchSlabs:
    """Reusable memory for the batches of one array.

    Parameters
    ----------
    tail
        Shape of one sample.
    dtype
        Sample dtype.
    rows
        Samples per slab (the batch size).
    max_slabs
        Slabs kept: the batches queued ahead, the one being filled and those the loop
        holds.
    """

    def __init__(self, tail: tuple[int, ...], dtype: np.dtype, rows: int, max_slabs: int):
        self.tail, self.dtype, self.rows, self.max_slabs = tuple(tail), np.dtype(dtype), int(rows), int(max_slabs)
        self._slabs: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, n: int) -> np.ndarray:
        """An uninitialized ``(n,) + tail`` array that nothing else references."""
        if n > self.rows:
            return np.empty((n,) + self.tail, self.dtype)
        with self._lock:
            for slab, refs in zip(self._slabs, _refcounts(self._slabs)):
                if refs <= _ALONE:  # more is a batch view alive somewhere
                    return slab[:n]
            if len(self._slabs) < self.max_slabs:
                self._slabs.append(np.empty((self.rows,) + self.tail, self.dtype))
                return self._slabs[-1][:n]
        return np.empty((n,) + self.tail, self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the slabs made so far (for tests and diagnostics)."""
        return sum(slab.nbytes for slab in self._slabs)

    @property
    def slabs(self) -> int:
        """Slabs made so far (for tests and diagnostics)."""
        return len(self._slabs)
