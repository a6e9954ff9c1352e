"""Chunk files of a complete store kept mapped from one read to the next, by mappings
that hold no file descriptor."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np

__all__ = ["MapCache", "close_map", "default_map_budget", "live_mappings", "map_file"]


def _load_mmap() -> tuple[Any, Any] | None:
    """libc's ``mmap`` and ``munmap`` through ctypes, or None where there are none."""
    if os.name != "posix":  # pragma: no cover - Windows
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        do_map, do_unmap = libc.mmap, libc.munmap
    except (OSError, AttributeError):  # pragma: no cover - a libc without them
        return None
    do_map.restype = ctypes.c_void_p
    do_map.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
    do_unmap.restype = ctypes.c_int
    do_unmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return do_map, do_unmap


_LIBC_MMAP = _load_mmap()
_MAP_FAILED = ctypes.c_void_p(-1).value
_live = [0]  # mappings made by map_file and not yet unmapped
_live_lock = threading.Lock()


class _Mapped:
    """Owner of one mapped region: numpy arrays of it hold it as their base, and the
    region is unmapped when the last of them (and this) is gone."""

    __slots__ = ("__array_interface__", "__weakref__")


def _unmap(address: int, size: int) -> None:
    _LIBC_MMAP[1](address, size)
    with _live_lock:
        _live[0] -= 1


def map_file(fd: int, size: int) -> np.ndarray:
    """The first ``size`` bytes (at least 1) of the open file ``fd``, mapped read-only, as
    a read-only ``uint8`` array that holds no file descriptor: the caller closes ``fd``.

    Python's ``mmap.mmap`` keeps a duplicate of the file's descriptor for as long as the
    mapping lives (Python 3.13's ``trackfd=False`` aside). A stream keeps every chunk
    file it read mapped, thousands for a store of a few GB: at the usual limit of 1024
    descriptors a process then fails to open anything ("Too many open files"), and any
    ``select()`` in it fails once descriptors pass 1024. This mapping is made by libc's
    ``mmap`` directly, and unmapped once nothing references it: the array, any array
    viewing it, or a buffer taken from it by a decoder. Where libc's ``mmap`` cannot be
    called, Python's is used.

    Raises
    ------
    OSError
        When the file cannot be mapped (out of address space, or of mappings).
    """
    if _LIBC_MMAP is None:  # pragma: no cover - not POSIX
        return np.frombuffer(mmap.mmap(fd, size, access=mmap.ACCESS_READ), dtype=np.uint8)
    address = _LIBC_MMAP[0](None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address is None or address == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot map {size} bytes: {os.strerror(err)}")
    owner = _Mapped()
    owner.__array_interface__ = {"data": (address, True), "shape": (size,), "typestr": "|u1", "version": 3}
    with _live_lock:
        _live[0] += 1
    # Not at exit: a daemon read thread may still decode from it while the interpreter
    # ends, and the process's end unmaps everything anyway.
    weakref.finalize(owner, _unmap, address, size).atexit = False
    return np.asarray(owner)


def live_mappings() -> int:
    """Mappings made by :func:`map_file` that are not unmapped yet (for tests and
    diagnostics)."""
    with _live_lock:
        return _live[0]


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
        self._maps: OrderedDict[str, np.ndarray] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, path: str) -> np.ndarray | None:
        with self._lock:
            m = self._maps.get(path)
            if m is not None:
                self._maps.move_to_end(path)
            return m

    def holds(self, path: str) -> bool:
        """Whether ``path`` is kept mapped (without counting as a use)."""
        return path in self._maps

    def add(self, path: str, m: np.ndarray) -> np.ndarray:
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
                    close_map(old)
        if kept is not m:
            close_map(m)
        return kept

    @property
    def mapped_bytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        """Unmap everything (a read in progress keeps its mapping until it is done)."""
        with self._lock:
            maps, self._maps, self._bytes = list(self._maps.values()), OrderedDict(), 0
        for m in maps:
            close_map(m)


def close_map(m: Any) -> None:
    """Let go of a mapping: unmapped now, or once a read that still decodes from it
    lets go (a :func:`map_file` array unmaps itself when nothing references it)."""
    close = getattr(m, "close", None)
    if close is None:
        return
    try:
        close()
    except BufferError:
        pass
