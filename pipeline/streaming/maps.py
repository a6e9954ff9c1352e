"""Chunk files of a complete store kept mapped from one read to the next."""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict

__all__ = ["MapCache", "default_map_budget"]


def default_map_budget() -> int:
    """Bytes of chunk files a stream keeps mapped: a quarter of physical memory, at most
    16 GiB. Mapped file pages are the page cache's own (nothing is copied), so the
    budget bounds address space and page tables, not memory taken from the machine."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not on Linux
        physical = 8 << 30
    return int(min(physical // 4, 16 << 30))


class MapCache:
    """Chunk files kept mapped from one read to the next, least recently used unmapped
    past a budget of bytes.

    Mapping a chunk file for every read and unmapping it after costs a page fault per
    few pages, every epoch, and an unmap that interrupts the other cores (a large share
    of the stream's CPU went to system time). A file
    kept mapped is faulted in once: later epochs read it with no system call at all.
    Only for stores nothing writes to any more (a file truncated while mapped would end
    the process with SIGBUS); a store overwritten while streamed is removed and written
    anew, and the files already mapped keep serving the old bytes until the stream is
    closed.
    """

    def __init__(self, budget: int | None = None, max_files: int = 16384):
        self.budget = default_map_budget() if budget is None else int(budget)
        # Each mapping is one kernel memory area, and a process may have only so many
        # (vm.max_map_count, 65530 by default): a store of many small chunk files must
        # not use them all up.
        self.max_files = int(max_files)
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, path: str) -> mmap.mmap | None:
        with self._lock:
            m = self._maps.get(path)
            if m is not None:
                self._maps.move_to_end(path)
            return m

    def holds(self, path: str) -> bool:
        """Whether ``path`` is kept mapped (without counting as a use)."""
        return path in self._maps

    def add(self, path: str, m: mmap.mmap) -> mmap.mmap:
        """Keep ``m`` (or the mapping another thread kept first, closing ``m``) and
        return the one kept."""
        with self._lock:
            kept = self._maps.get(path)
            if kept is None:
                self._maps[path] = kept = m
                self._bytes += len(m)
                while (self._bytes > self.budget or len(self._maps) > self.max_files) and len(self._maps) > 1:
                    _, old = self._maps.popitem(last=False)
                    self._bytes -= len(old)
                    _close_map(old)
        if kept is not m:
            _close_map(m)
        return kept

    @property
    def mapped_bytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        """Unmap everything (a read in progress keeps its mapping until it is done)."""
        with self._lock:
            maps, self._maps, self._bytes = list(self._maps.values()), OrderedDict(), 0
        for m in maps:
            _close_map(m)


def _close_map(m: mmap.mmap) -> None:
    try:
        m.close()
    except BufferError:  # a read still decodes from it: unmapped once that read lets go
        pass
