"""The cache directory that every process of a node shares (see :mod:`~pipeline.streaming.cache`).

Sharing: every rank and DataLoader worker of a node may use the same directory at
once. A file appears only by a rename of a complete temporary file, so a reader never
sees a torn one; inserting and evicting run under an exclusive ``flock`` of the
directory's lock file, which also holds the running count of cached bytes. A file
deleted while another process reads it stays readable to that process; files are
read, never mapped, so that one truncated in place (which no cache code does) costs a
fetch, never the process (a mapped file truncated under it faults with SIGBUS). Least
recently used files are evicted past the budget (a read touches its file's
modification time, which every process sees), down to :func:`eviction_target`
(:func:`lru_victims` is the arithmetic).

Safety of other people's files: the cache works only in its own subfolder
(:data:`SUBDIR`) of the directory given, marked by a file of its own, and refuses a
subfolder holding anything it did not write. It deletes only files named as its chunk
files, its temporary files or its read counts (:meth:`DiskCache.write_stats`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Sequence

from pipeline.errors import StreamError

__all__ = ["MARKER", "SUBDIR", "CachedFile", "DiskCache", "eviction_target", "lru_victims"]

#: The cache's own subfolder of the directory a user names.
SUBDIR = "pipeline-chunk-cache"
#: The file that marks :data:`SUBDIR` as the cache's.
MARKER = "PIPELINE-CHUNK-CACHE"
_MARKER_TEXT = ("pipeline chunk cache, format 1: every file here is written and deleted by "
                "pipeline.stream(cache_dir=...); put nothing else here\n")
#: The lock file, which also holds the running count of cached bytes.
_LOCK = "lock"
_CHUNK = re.compile(r"^[0-9a-f]{16}-[0-9a-f]{32}\.chunk$")
_TEMP = re.compile(r"^\.[0-9a-f]{16}-[0-9a-f]{32}\.chunk\.\d+\.[0-9a-f]{8}\.tmp$")
#: A process's read counts for one stream (stream id, then the process's own id), and
#: its temporary file: what lets a stream report the reads of its DataLoader workers.
_STATS = re.compile(r"^stats-([0-9a-f]{16})-([0-9a-f]{16})\.json$")
_STATS_TEMP = re.compile(r"^\.stats-[0-9a-f]{16}-[0-9a-f]{16}\.json\.[0-9a-f]{8}\.tmp$")
#: A temporary file this old was left by a process that died while writing it.
_STALE_TEMP_S = 3600.0
#: Read counts this old belong to a stream long gone.
_STALE_STATS_S = 86400.0


def _owned(name: str) -> bool:
    """Whether ``name`` is a file the cache writes (and may delete)."""
    return any(p.match(name) for p in (_CHUNK, _TEMP, _STATS, _STATS_TEMP))


# -- eviction arithmetic ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CachedFile:
    """One cache file: its name, size in bytes and last use (modification time, ns)."""

    name: str
    size: int
    used_ns: int


def eviction_target(budget: int) -> int:
    """Bytes an eviction leaves: a sixteenth below the budget, so that a directory
    listing (what an eviction costs) is paid once per many inserts, not per insert."""
    return budget - budget // 16


def lru_victims(files: Sequence[CachedFile], target: int, keep: Collection[str] = ()) -> list[CachedFile]:
    """The files to delete, least recently used first (ties by name), until the rest
    hold at most ``target`` bytes. Files named in ``keep`` are never chosen: with them
    alone above ``target``, the rest is all chosen and the total stays above it."""
    total = sum(f.size for f in files)
    out: list[CachedFile] = []
    for f in sorted(files, key=lambda f: (f.used_ns, f.name)):
        if total <= target:
            break
        if f.name in keep:
            continue
        out.append(f)
        total -= f.size
    return out


# -- the directory ------------------------------------------------------------------------


class DiskCache:
    """The cache directory shared by the processes of a node.

    Parameters
    ----------
    directory
        Where to cache; the files go to its subfolder :data:`SUBDIR`, made if needed.
    budget
        Most bytes of cache files kept; a process inserting past it evicts the least
        recently used files (every process should pass the same budget).

    Raises
    ------
    StreamError
        When the subfolder holds files the cache did not write, or cannot be made.
    """

    def __init__(self, directory: str, budget: int):
        self.root = os.path.join(directory, SUBDIR)
        self.budget = int(budget)
        try:
            os.makedirs(self.root, exist_ok=True)
            names = os.listdir(self.root)
        except OSError as exc:
            raise StreamError(f"{self.root}: cannot use as a chunk cache ({exc})") from exc
        foreign = sorted(n for n in names if n not in (MARKER, _LOCK) and not _owned(n))
        if foreign or (names and MARKER not in names):
            shown = ", ".join(foreign[:5]) or ", ".join(sorted(names)[:5])
            raise StreamError(f"{self.root}: expected a folder written only by pipeline's chunk cache (marked by "
                              f"{MARKER}), found files it did not write ({shown}); name another cache_dir")
        with open(os.path.join(self.root, MARKER), "a", encoding="utf-8") as fh:
            if fh.tell() == 0:
                fh.write(_MARKER_TEXT)
        self._lock_fd = os.open(os.path.join(self.root, _LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self._thread_lock = threading.Lock()  # flock excludes processes, not threads sharing its descriptor
        self.evictions = 0  # files this process deleted (for tests and diagnostics)
        with self._locked():
            self._write_usage(self._scan_total(clean=True))

    def path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def touch(self, name: str) -> bool:
        """Mark ``name`` as used now; False when it is not in the cache."""
        try:
            os.utime(os.path.join(self.root, name))
            return True
        except FileNotFoundError:
            return False

    def files(self) -> list[CachedFile]:
        """The cache files there are now."""
        out = []
        with os.scandir(self.root) as it:
            for entry in it:
                if _CHUNK.match(entry.name):
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except FileNotFoundError:
                        continue  # evicted meanwhile
                    if entry.is_file(follow_symlinks=False):
                        out.append(CachedFile(entry.name, int(st.st_size), int(st.st_mtime_ns)))
        return out

    def usage(self) -> int:
        """Bytes of cache files, as the running count says."""
        with self._locked():
            return self._read_usage()

    def put(self, name: str, data: Any) -> bool:
        """Store ``data`` as ``name`` (atomically), evicting past the budget; False when
        it is larger than the whole budget and is not kept."""
        size = len(data)
        if size > self.budget:
            return False
        tmp = os.path.join(self.root, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view, done = memoryview(data).cast("B"), 0
            while done < size:
                done += os.write(fd, view[done:])
        except BaseException:
            os.close(fd)
            os.unlink(tmp)
            raise
        os.close(fd)
        with self._locked():
            final = os.path.join(self.root, name)
            if os.path.exists(final):  # another process stored it first: the same bytes
                os.unlink(tmp)
                os.utime(final)
                return True
            os.rename(tmp, final)
            used = self._read_usage() + size
            if used > self.budget:
                used = self._evict(keep={name})
            self._write_usage(used)
        return True

    def remove(self, name: str) -> bool:
        """Delete the cache file ``name`` (found damaged), its bytes taken off the count;
        False when it is not there."""
        with self._locked():
            path = os.path.join(self.root, name)
            try:
                size = os.stat(path).st_size
                os.unlink(path)
            except FileNotFoundError:
                return False
            self._write_usage(max(0, self._read_usage() - size))
        return True

    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._thread_lock:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _evict(self, keep: Collection[str]) -> int:
        """Delete least recently used files down to the target; the bytes left. Under the lock."""
        files = self.files()
        total = sum(f.size for f in files)
        for f in lru_victims(files, eviction_target(self.budget), keep):
            try:
                os.unlink(os.path.join(self.root, f.name))
                self.evictions += 1
            except FileNotFoundError:
                pass
            total -= f.size
        return total

    def write_stats(self, stream: str, process: str, counts: dict[str, list[int]]) -> None:
        """Publish one process's read counts of stream ``stream`` (``{epoch: [reads,
        hits, bytes, requests, ...]}``, see :func:`~pipeline.streaming.cache.merge_counts`), whole: a
        reader never sees half a file."""
        final = self.path(f"stats-{stream}-{process}.json")
        temp = self.path(f".stats-{stream}-{process}.json.{secrets.token_hex(4)}.tmp")
        try:
            with open(temp, "w", encoding="utf-8") as fh:
                json.dump(counts, fh)
            os.replace(temp, final)
        except OSError:  # counts are a report: a full disk must not stop the stream
            with contextlib.suppress(OSError):
                os.unlink(temp)

    def read_stats(self, stream: str, exclude: str) -> list[dict[str, list[int]]]:
        """The read counts other processes published for stream ``stream``."""
        out = []
        with os.scandir(self.root) as it:
            for entry in it:
                m = _STATS.match(entry.name)
                if m and m.group(1) == stream and m.group(2) != exclude:
                    with contextlib.suppress(OSError, ValueError):
                        with open(entry.path, encoding="utf-8") as fh:
                            out.append(json.load(fh))
        return out

    def _scan_total(self, clean: bool = False) -> int:
        """The bytes of cache files, from a listing; with ``clean``, temporary files left
        by dead writers, and read counts of streams long gone, go. Under the lock."""
        if clean:
            now = time.time()
            with os.scandir(self.root) as it:
                for entry in it:
                    stale = (_STALE_TEMP_S if _TEMP.match(entry.name) or _STATS_TEMP.match(entry.name)
                             else _STALE_STATS_S if _STATS.match(entry.name) else None)
                    if stale is not None:
                        try:
                            if now - entry.stat(follow_symlinks=False).st_mtime > stale:
                                os.unlink(entry.path)
                        except FileNotFoundError:
                            pass
        total = sum(f.size for f in self.files())
        return self._evict(keep=()) if total > self.budget else total

    def _read_usage(self) -> int:
        try:
            return int(os.pread(self._lock_fd, 32, 0).decode("ascii").strip() or "x")
        except (ValueError, UnicodeDecodeError):  # never written, or a writer died mid-write: count again
            return self._scan_total()

    def _write_usage(self, used: int) -> None:
        # The count lives in the lock file: one descriptor, no extra open per insert.
        text = f"{int(used)}\n".encode("ascii")
        os.pwrite(self._lock_fd, text, 0)
        os.ftruncate(self._lock_fd, len(text))
