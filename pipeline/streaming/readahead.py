"""Chunk files of a local store asked of the kernel ahead of their reads, when they are
not in the page cache.

A stream maps a local store's chunk files (:mod:`~pipeline.streaming.maps`). On a warm
page cache that is the cheapest read there is. On a cold one (the first epoch after a
reboot, a store larger than memory, a network block device) every page fault of a
mapped file reads one small span of the file and waits for it: the read threads take
turns waiting on the disk with one small request each in flight, and a cold epoch ran
well below the speed of reading the same files whole, in order (measured in
``benchmarks/README.md``, streaming).

The epoch's order is known before it starts (:mod:`~pipeline.streaming.plan`), so a
group loader names the chunk files it will read next, a window ahead of its reads
(:data:`READAHEAD_BYTES`), and a thread asks the kernel to read each one that is not in
the page cache (``posix_fadvise(POSIX_FADV_WILLNEED)``, which queues the file's reads at
once, many requests in flight). A file in the page cache costs one probe, a one-byte
``preadv2`` with ``RWF_NOWAIT`` that fails rather than waits for the disk; after a run of
probes that all found their file cached, only the files of every :data:`PROBE_EVERY`-th
chunk are probed until one is missing, so a warm epoch pays almost nothing. Files a stream keeps
mapped are skipped without a probe.

Nothing here changes what is read: a hint the kernel ignores, a file that is gone, or a
platform without these calls only leaves the reads to wait for the disk as before.
Where the file system cannot say what is cached (no non-blocking reads), every file is
asked for: on a warm cache that costs the thread a walk over the file's cached pages.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Any, Callable, Iterable

__all__ = ["PROBE_EVERY", "READAHEAD_BYTES", "ReadAhead", "in_page_cache", "local_files"]


def _readahead_bytes() -> int:
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not on Linux
        physical = 8 << 30
    return int(min(1 << 30, physical // 16))


#: Decoded bytes of the groups after those a loader is reading whose files are named
#: ahead: 1 GiB (at most a sixteenth of memory). A cold epoch kept up with the disk
#: only this far ahead; windows of 64 and 256 MiB left it behind (measured in
#: ``benchmarks/README.md``). The pages read ahead are the page cache's, which the
#: kernel takes back under pressure.
READAHEAD_BYTES = _readahead_bytes()
#: Probes that must find their file cached in a row before files are probed sparsely.
_CACHED_RUN = 32
#: While files keep being found cached, the files of one chunk in this many are probed.
PROBE_EVERY = 8
#: The thread ends after this long without a file to look at (it starts again when needed).
_IDLE_S = 5.0

_SUPPORTED = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_WILLNEED")


def in_page_cache(fd: int) -> bool | None:
    """Whether the first byte of the open file ``fd`` is in the page cache: a read that
    must not wait for the disk (``RWF_NOWAIT``) of one byte. None where the kernel or
    the file system cannot say (no ``preadv2`` flags, an empty file)."""
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None:
        return None
    try:
        return os.preadv(fd, [bytearray(1)], 0, flag) == 1 or None
    except BlockingIOError:
        return False
    except OSError:  # EOPNOTSUPP: a file system without non-blocking reads
        return None


def local_files(readers: Iterable[Any], chunks: Iterable[int]) -> list[str]:
    """The local files holding ``chunks`` (in order, each once) of every reader that
    can name them (a :class:`~pipeline.streaming.chunks.ChunkReader` of a local
    directory); readers of anything else name none."""
    finders = [f for f in (getattr(r, "local_files", None) for r in readers) if f is not None]
    files: dict[str, None] = {}
    for c in chunks:
        for find in finders:
            files.update(dict.fromkeys(find(int(c))))
    return list(files)


class ReadAhead:
    """A thread that asks the kernel to read chunk files before they are read.

    Parameters
    ----------
    files
        The local files of a chunk (none for a chunk not read from local files).
    mapped
        Tells whether a path is kept mapped by the stream already (its pages were
        faulted in by an earlier read): such files count as cached, without a probe.
    """

    def __init__(self, files: Callable[[int], list[str]], mapped: Callable[[str], bool] | None = None):
        self._files, self._mapped = files, mapped
        self._queue: deque[int] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._cached_run = 0
        self._skip = 0
        self._last = -1
        self._pid = os.getpid()
        self.probed = 0  # files probed (for tests and diagnostics)
        self.advised = 0  # files the kernel was asked to read

    def advise(self, chunks: Iterable[int]) -> None:
        """Queue ``chunks`` (in the order they will be read); the caller's thread only
        queues them, the thread finds their files."""
        if not _SUPPORTED:
            return
        self._after_fork()
        with self._cond:
            self._queue.extend(chunks)
            if self._queue and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pipeline-readahead", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _after_fork(self) -> None:
        """In a forked child (a DataLoader worker): no thread of the parent's is here, and
        the parent's thread may have held the lock when the process forked, so this
        process starts with a lock, a queue and a thread of its own."""
        if self._pid != os.getpid():
            self._cond, self._queue = threading.Condition(), deque()
            self._thread, self._last, self._cached_run, self._skip = None, -1, 0, 0
            self._pid = os.getpid()

    def clear(self) -> None:
        """Drop what is queued (the stream let go of its plans)."""
        self._after_fork()
        with self._cond:
            self._queue.clear()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    if not self._cond.wait(_IDLE_S) and not self._queue:
                        self._thread = None
                        return
                # All that is queued at once: each time this thread takes the GIL
                # back, the thread holding it (the training loop) is asked to let go.
                chunks = list(self._queue)
                self._queue.clear()
            for chunk in chunks:
                if chunk != self._last:  # a chunk cut in pieces is named once per piece
                    self._last = chunk
                    self._look_at(chunk)

    def _look_at(self, chunk: int) -> None:
        # While files keep being found cached, most chunks are passed over unlooked at
        # (their files not even named): a warm epoch costs next to nothing here.
        if self._skip:
            self._skip -= 1
            return
        for path in self._files(chunk):
            cached = True if self._mapped is not None and self._mapped(path) else self._probe(path)
            if cached:
                self._cached_run += 1
                if self._cached_run >= _CACHED_RUN:
                    self._skip = PROBE_EVERY - 1
            else:
                self._cached_run = self._skip = 0

    def _probe(self, path: str) -> bool:
        """Whether ``path`` is in the page cache; when not, the kernel is asked to read it."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:  # not written (the fill value), or gone: the read itself says so
            return True
        try:
            self.probed += 1
            if in_page_cache(fd):
                return True
            # Queues the reads of the whole file and returns; it blocks only while the
            # device's queue is full, which paces this thread, not the readers.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            self.advised += 1
            return False
        except OSError:
            return True
        finally:
            os.close(fd)
