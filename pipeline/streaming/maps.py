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

__all__ = ["MapCache", "close_map", "default_map_budget", "live_mappings", "map_file", "memory_limit"]

#: Where a process's cgroup memory limit is read: cgroup v2's ``memory.max`` of the
#: process's own group (``/proc/self/cgroup``'s ``0::`` line), else cgroup v1's.
_CGROUP_ROOT = "/sys/fs/cgroup"
_PROC_CGROUP = "/proc/self/cgroup"


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
    mapping lives (Python 3.13's ``trackfd=False`` aside). A stream keeps the chunk
    files it read mapped up to its budget (:class:`MapCache`), thousands for a store of
    a few GB, and maps the others for one read each: at the usual limit of 1024
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


def _cgroup_limit(root: str | None = None, proc_cgroup: str | None = None) -> int | None:
    """The memory limit of this process's cgroup in bytes, or None where there is none
    (``max``, no cgroup file system, or v1's "unlimited", a number near 2**63).

    The lowest of the limits of its group and of the groups above it, which bound it
    too (a SLURM job's step under the job's limit). ``root`` and ``proc_cgroup``: where
    the cgroup file system and this process's ``/proc/self/cgroup`` are read (default
    ``_CGROUP_ROOT`` and ``_PROC_CGROUP``).
    """
    root = _CGROUP_ROOT if root is None else root
    proc_cgroup = _PROC_CGROUP if proc_cgroup is None else proc_cgroup
    groups = []  # (directory of the hierarchy, the group's path in it, the limit's file)
    try:
        with open(proc_cgroup) as fh:
            for line in fh:
                hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
                if hierarchy == "0" and controllers == "":
                    groups.append((root, path, "memory.max"))
                elif "memory" in controllers.split(","):
                    groups.append((os.path.join(root, "memory"), path, "memory.limit_in_bytes"))
    except (OSError, ValueError):
        pass
    # A container often sees its own group as the root of the file system it mounts.
    groups += [(root, "/", "memory.max"), (os.path.join(root, "memory"), "/", "memory.limit_in_bytes")]
    limits = []
    for top, path, name in groups:
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):  # the group, then each group above it
            limit = _read_limit(os.path.join(top, *parts[:depth], name))
            if limit is not None:
                limits.append(limit)
    return min(limits, default=None)


def _read_limit(path: str) -> int | None:
    """A cgroup memory limit file's bytes; None when absent, unreadable or unlimited."""
    try:
        with open(path) as fh:
            text = fh.read().strip()
        limit = int(text)
    except (OSError, ValueError):  # absent, or "max" (v2's unlimited)
        return None
    return limit if 0 < limit < 1 << 62 else None


def memory_limit() -> int:
    """The memory this process may use: physical memory, or its cgroup's limit (a
    container's, a SLURM job's, a Kubernetes pod's) where that is lower."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not on Linux
        physical = 8 << 30
    limit = _cgroup_limit()
    return int(physical if limit is None else min(physical, limit))


def default_map_budget() -> int:
    """The most bytes of chunk files a stream keeps mapped from one epoch to the next:
    a quarter of :func:`memory_limit`, at most 16 GiB. ``pipeline.stream``'s default
    (``keep_mapped=None``), and the cap of a ``keep_mapped`` given.

    Mapped file pages are the page cache's own (nothing is copied, and the kernel may
    drop them, clean, under memory pressure), but they count in the process's resident
    memory (``RssFile``), which ``ps``, ``psutil``, SLURM's accounting and a pod's
    working set report, and in its address space (``ulimit -v``): hence a share of the
    memory the process may use (a container's limit), not of the machine's.
    """
    return int(min(memory_limit() // 4, 16 << 30))


class MapCache:
    """Chunk files kept mapped from one read to the next, up to a budget of bytes.

    Mapping a chunk file for every read and unmapping it after costs its page tables
    again every epoch (a fault every few pages, and an unmap that interrupts the other
    cores: ``benchmarks/README.md`` has the figures). A file kept mapped is faulted in
    once: later epochs read it with no system call at all. But every page kept mapped
    counts in the process's resident memory, so the stream keeps only ``budget`` bytes
    of files (``pipeline.stream``'s ``keep_mapped``; by default
    :func:`default_map_budget`): the files mapped first stay, and a file read once the
    budget is full is mapped for that read only, unmapped once decoded. Nothing kept is
    unmapped to make room: every epoch reads every chunk once, in a new order, so
    evicting the least recently used would unmap and map a file at nearly every read
    of a store larger than the budget, where keeping a fixed set saves the same share
    of the store's maps every epoch.

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
        return self._maps.get(path)

    def holds(self, path: str) -> bool:
        """Whether ``path`` is kept mapped."""
        return path in self._maps

    def add(self, path: str, m: np.ndarray) -> np.ndarray:
        """Keep ``m`` where the budget has room for it (or the mapping another thread
        kept first, closing ``m``) and return the mapping to read: one not kept is
        unmapped once its reader lets go of it."""
        with self._lock:
            kept = self._maps.get(path)
            if kept is None:
                if self._bytes + len(m) > self.budget or len(self._maps) >= self.max_files:
                    return m
                self._maps[path] = kept = m
                self._bytes += len(m)
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
