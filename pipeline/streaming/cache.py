"""A node-local disk cache of a remote store's chunk objects, fetched ahead of need.

Streaming ``s3://`` (or any fsspec URL) without a cache pays the network every epoch,
one request per chunk, each waiting for its round trip. With ``pipeline.stream(...,
cache_dir=..., cache_bytes=...)`` every chunk object read is kept in a directory on
local disk, so later epochs read local files (mapped, as a local store's are), and the
first epoch fetches with many requests in flight: the epoch's chunk order is known
before it starts (:mod:`~pipeline.streaming.plan`), so each worker announces its plan
(:meth:`RemoteCache.will_read`) and a fetch thread keeps up to
:data:`FETCH_REQUESTS` requests running a window ahead of the reads.

Sharing: every rank and DataLoader worker of a node may use the same directory at
once. A file appears only by a rename of a complete temporary file, so a reader never
sees a torn one; inserting and evicting run under an exclusive ``flock`` of the
directory's lock file, which also holds the running count of cached bytes.
A file deleted while another process reads or maps it stays readable to that process.
Least recently used files are evicted past the budget (a read touches its file's
modification time, which every process sees), down to :func:`eviction_target`.

Safety of other people's files: the cache works only in its own subfolder
(:data:`SUBDIR`) of the directory given, marked by a file of its own, and refuses a
subfolder holding anything it did not write. It deletes only files named as its chunk
files or its temporary files.

Staleness: an object is cached under the store's URL, endpoint and identity (a pipeline
store's ``created`` time and fingerprint, so a store rebuilt at the same URL is a new
cache namespace) and its key. Objects are assumed not to change once written, except
the one holding an array's last samples, which an append rewrites with more samples:
an object not wholly inside the array's length (as the reader's version sees it) is
cached under that length too. A store another tool rewrites in place at the same URL
needs its cache files removed (or another ``cache_dir``).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import mmap
import os
import re
import secrets
import threading
import time
import warnings
from collections import OrderedDict, deque
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Collection, Iterator, Mapping, Sequence

from pipeline.errors import StoreError, StreamError

__all__ = ["FETCH_REQUESTS", "SUBDIR", "CacheSpec", "CacheStats", "CachedFile", "DiskCache", "RemoteCache",
           "cache_spec", "eviction_target", "lru_victims", "open_remote_cache"]

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
#: Requests a stream's fetch thread keeps in flight.
FETCH_REQUESTS = 16
#: Most bytes a process fetches ahead of its reads (and at most a quarter of the budget).
AHEAD_BYTES = 1 << 30
#: A temporary file this old was left by a process that died while writing it.
_STALE_TEMP_S = 3600.0
#: The fetch thread ends after this long without work (it starts again when needed).
_IDLE_S = 10.0
#: Plans (announced epochs) tracked at once: the epoch being read, the next one read
#: ahead, and one abandoned.
_PLANS = 3
#: Epochs whose per-object outcomes are kept (older epochs keep their counts only).
_EPOCHS_DETAILED = 4


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """Where a stream caches a remote store's chunks, and the most bytes it may keep there."""

    directory: str
    budget: int


def cache_spec(cache_dir: Any, cache_bytes: Any) -> CacheSpec | None:
    """The checked cache settings of :func:`pipeline.stream` (None without ``cache_dir``).

    Raises
    ------
    StreamError
        When ``cache_bytes`` is missing or not a positive integer, or given without
        ``cache_dir``.
    """
    if cache_dir is None:
        if cache_bytes is not None:
            raise StreamError(f"stream: cache_bytes={cache_bytes!r} needs cache_dir, the directory to cache in")
        return None
    if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes <= 0:
        raise StreamError(f"stream: cache_dir needs cache_bytes, the most bytes the cache may hold on disk "
                          f"(a positive integer), got {cache_bytes!r}")
    return CacheSpec(os.path.abspath(os.fspath(cache_dir)), int(cache_bytes))


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


# -- statistics ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheStats:
    """What one epoch of a stream read through its cache, in this process.

    Attributes
    ----------
    epoch
        The epoch (as set by ``set_epoch``; iterating an epoch again adds to it).
    reads
        Chunk objects the epoch read (each counted once, however often it was read).
    hits
        Of those, objects found in the cache directory, not fetched.
    bytes_fetched, requests
        Bytes and requests fetched from the remote store for the epoch.
    """

    epoch: int
    reads: int
    hits: int
    bytes_fetched: int
    requests: int

    @property
    def misses(self) -> int:
        return self.reads - self.hits

    @property
    def hit_rate(self) -> float:
        """Hits per object read (0.0 before anything is read)."""
        return self.hits / self.reads if self.reads else 0.0

    def __str__(self) -> str:
        return (f"epoch {self.epoch}: cache hit rate {self.hit_rate:.1%} ({self.hits} of {self.reads} chunk "
                f"objects), {_size(self.bytes_fetched)} fetched in {self.requests} requests")


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


class _EpochCounts:
    """Per object, whether an epoch found it in the cache (a fetch for it, even after
    it was found, makes it a miss), and the bytes and requests fetched."""

    def __init__(self) -> None:
        self.outcome: dict[str, bool] | None = {}
        self.reads = self.hits = self.bytes = self.requests = 0

    def record(self, name: str, hit: bool) -> None:
        if self.outcome is None:  # an old epoch: counted as it comes
            self.reads += 1
            self.hits += int(hit)
            return
        before = self.outcome.get(name)
        if before is None:
            self.outcome[name] = hit
            self.reads += 1
            self.hits += int(hit)
        elif before and not hit:
            self.outcome[name] = False
            self.hits -= 1


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
        foreign = sorted(n for n in names if n not in (MARKER, _LOCK) and not _CHUNK.match(n)
                         and not _TEMP.match(n))
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

    def _scan_total(self, clean: bool = False) -> int:
        """The bytes of cache files, from a listing; with ``clean``, temporary files left
        by dead writers go. Under the lock."""
        if clean:
            now = time.time()
            with os.scandir(self.root) as it:
                for entry in it:
                    if _TEMP.match(entry.name):
                        try:
                            if now - entry.stat(follow_symlinks=False).st_mtime > _STALE_TEMP_S:
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


class _Mapped:
    """Cache files kept mapped between reads (as a local store's chunk files are, see
    :class:`~pipeline.streaming.maps.MapCache`), forgotten when their file is evicted."""

    def __init__(self, budget: int):
        self.budget = budget
        self._maps: OrderedDict[str, mmap.mmap] = OrderedDict()
        self._bytes = 0

    def get(self, path: str) -> mmap.mmap | None:
        m = self._maps.get(path)
        if m is not None:
            self._maps.move_to_end(path)
        return m

    def add(self, path: str, m: mmap.mmap) -> mmap.mmap:
        self._maps[path] = m
        self._bytes += len(m)
        while self._bytes > self.budget and len(self._maps) > 1:
            self._drop(next(iter(self._maps)))
        return m

    def discard(self, path: str) -> None:
        if path in self._maps:
            self._drop(path)

    def clear(self) -> None:
        for path in list(self._maps):
            self._drop(path)

    def _drop(self, path: str) -> None:
        m = self._maps.pop(path)
        self._bytes -= len(m)
        try:
            m.close()
        except BufferError:  # a decode still reads it: unmapped once it lets go
            pass


@dataclass(slots=True)
class _Plan:
    """The objects one worker reads in one epoch, in order, and how far it got."""

    epoch: int
    entries: list[tuple[str, str]]  # (cache name, remote path)
    index: dict[str, int]
    window: int
    read: set[str]
    read_to: int = 0  # one past the furthest entry read
    next: int = 0  # the next entry the fetch thread looks at


class RemoteCache:
    """The chunk objects of one remote store, read through a :class:`DiskCache`.

    Parameters
    ----------
    disk
        The node's cache directory.
    fs
        The store's asynchronous fsspec file system (as zarr's ``FsspecStore`` holds it).
    root
        The store's path on ``fs``.
    namespace
        What identifies the store's content (URL, endpoint, identity): part of every
        cache file's name.
    label
        The store, for error messages.
    """

    def __init__(self, disk: DiskCache, fs: Any, root: str, namespace: str, label: str):
        from zarr.core.sync import _get_loop

        self.disk, self.fs, self.label = disk, fs, label
        self.root = root.rstrip("/")
        self._ns = hashlib.blake2b(namespace.encode("utf-8"), digest_size=8).hexdigest()
        # The file system's session lives on zarr's event loop (it opened the store there).
        self._loop = _get_loop()
        self._lock = threading.RLock()  # RLock: a fetch done already runs its callback at once
        self._wake = threading.Condition(self._lock)
        self._inflight: dict[str, Any] = {}
        self._plans: deque[_Plan] = deque()
        self._epochs: dict[int, _EpochCounts] = {}
        self._last_epoch = 0
        self._maps = _Mapped(min(disk.budget, _map_budget()))
        self._thread: threading.Thread | None = None
        self._warned = False
        self._pid = os.getpid()
        self.ahead_bytes = min(AHEAD_BYTES, max(1, disk.budget // 4))

    def name(self, path: str, tag: str = "") -> str:
        """The cache file name of object ``path`` (``tag``: the array length it is valid for)."""
        key = hashlib.blake2b(f"{path}{tag}".encode("utf-8"), digest_size=16).hexdigest()
        return f"{self._ns}-{key}.chunk"

    # -- what an epoch will read --------------------------------------------------------

    def will_read(self, readers: Sequence[Any], chunks: Sequence[int], epoch: int) -> None:
        """Fetch the objects of ``chunks`` (in the order they will be read) of every
        reader that reads through this cache (a
        :class:`~pipeline.streaming.chunks.ChunkReader`), ahead of their reads, a
        window of about :attr:`ahead_bytes` ahead. Counted as reads of ``epoch``."""
        self._check_process()
        readers = [r for r in readers if getattr(r, "cache", None) is self]
        entries: list[tuple[str, str]] = []
        index: dict[str, int] = {}
        for c in chunks:
            for r in readers:
                path, tag = r.object_key(int(c))
                name = self.name(path, tag)
                if name not in index:
                    index[name] = len(entries)
                    entries.append((name, path))
        object_bytes = sum(r.object_bytes for r in readers) / max(1, len(readers))
        if not entries or max((r.object_bytes for r in readers), default=0) > self.disk.budget:
            return  # objects the cache cannot hold are fetched when read, not twice
        window = int(max(1, min(1024, self.ahead_bytes // max(1.0, object_bytes))))
        with self._lock:
            self._plans.append(_Plan(int(epoch), entries, index, window, set()))
            while len(self._plans) > _PLANS:
                self._plans.popleft()
            self._counts(int(epoch))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pipeline-fetch", daemon=True)
                self._thread.start()
            self._wake.notify_all()

    def _run(self) -> None:
        """The fetch thread: resolves the plans' entries in order, within their windows."""
        while True:
            with self._wake:
                job = self._next_job()
                while job is None:
                    self._wake.wait(_IDLE_S)
                    job = self._next_job()
                    if job is None and not self._has_work():
                        self._thread = None
                        return
                plan, name, path = job
                if self.disk.touch(name):  # cached: touched, so that it stays until read
                    self._counts(plan.epoch).record(name, True)
                else:
                    self._submit(path, name, plan.epoch)

    def _next_job(self) -> tuple[_Plan, str, str] | None:
        if len(self._inflight) >= FETCH_REQUESTS:
            return None
        for plan in self._plans:
            limit = min(len(plan.entries), plan.read_to + plan.window)
            while plan.next < limit:
                name, path = plan.entries[plan.next]
                plan.next += 1
                if name not in plan.read and name not in self._inflight:
                    return plan, name, path
        return None

    def _has_work(self) -> bool:
        return bool(self._inflight) or any(p.next < len(p.entries) for p in self._plans)

    # -- reads --------------------------------------------------------------------------

    def get(self, path: str, tag: str = "") -> Any:
        """The bytes of object ``path`` (a mapped cache file, or the bytes fetched), or
        None when the store has no such object.

        Raises
        ------
        StoreError
            When the object cannot be fetched, naming the store and the object.
        """
        self._check_process()
        name = self.name(path, tag)
        with self._lock:
            epoch = self._note_read(name)
            fut = self._inflight.get(name)
            if fut is None:
                kept = self._open(name)
                if kept is not None:
                    self._counts(epoch).record(name, True)
                    return kept
                fut = self._submit(path, name, epoch)
        try:
            data = fut.result()
        except Exception as exc:  # noqa: BLE001 - any failure to fetch is the store's
            raise StoreError(f"{self.label}: cannot fetch {path} ({type(exc).__name__}: {exc})") from exc
        if data is None:
            return None
        with self._lock:
            self._counts(epoch).record(name, False)
            # Read the file just written rather than the bytes: its mapping is then kept
            # for the next epoch, which reads it without mapping it anew.
            kept = self._open(name)
        return data if kept is None else kept

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            # Its event loop, fetch thread and lock file did not survive the fork.
            raise StreamError(f"{self.label}: a chunk cache was used in a process forked from the one that made "
                              "it; the store's source opens the store (and its cache) again after a fork")

    def _note_read(self, name: str) -> int:
        """The epoch a read of ``name`` belongs to; moves its plan's window on."""
        for plan in self._plans:
            pos = plan.index.get(name)
            if pos is not None and name not in plan.read:
                plan.read.add(name)
                if pos + 1 > plan.read_to:
                    plan.read_to = pos + 1
                    self._wake.notify_all()
                self._last_epoch = plan.epoch
                return plan.epoch
        return self._plans[-1].epoch if self._plans else self._last_epoch

    def _open(self, name: str) -> Any:
        """The cache file ``name``, mapped (and touched), or None when it is not cached."""
        path = self.disk.path(name)
        if not self.disk.touch(name):
            self._maps.discard(path)  # evicted: its mapping would hold its disk space
            return None
        kept = self._maps.get(path)
        if kept is not None:
            return kept
        try:
            with open(path, "rb", buffering=0) as fh:
                size = os.fstat(fh.fileno()).st_size
                if not size:  # mmap refuses empty files
                    return b""
                try:
                    return self._maps.add(path, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))
                except OSError:  # out of address space or mappings: read it instead
                    return fh.read()
        except FileNotFoundError:
            return None

    def _submit(self, path: str, name: str, epoch: int) -> Any:
        fut = asyncio.run_coroutine_threadsafe(self._fetch(path, name, epoch), self._loop)
        self._inflight[name] = fut
        fut.add_done_callback(lambda f: self._settled(name, f))
        return fut

    def _settled(self, name: str, fut: Any) -> None:
        with self._wake:
            if self._inflight.get(name) is fut:
                del self._inflight[name]
            self._wake.notify_all()

    async def _fetch(self, path: str, name: str, epoch: int) -> bytes | None:
        remote = f"{self.root}/{path}" if self.root else path
        try:
            data = await self.fs._cat_file(remote)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None  # never written: read as the fill value, and nothing to cache
        with self._lock:
            counts = self._counts(epoch)
            counts.bytes += len(data)
            counts.requests += 1
            counts.record(name, False)
        # Written before the fetch counts as done: a read that then finds the fetch gone
        # finds the file.
        await asyncio.get_running_loop().run_in_executor(None, self._keep, name, data)
        return data

    def _keep(self, name: str, data: bytes) -> None:
        try:
            self.disk.put(name, data)
        except OSError as exc:  # a full or failing disk: the stream goes on, uncached
            if not self._warned:
                self._warned = True
                warnings.warn(f"{self.disk.root}: cannot cache chunks of {self.label} ({exc}); reading them "
                              "uncached", RuntimeWarning, stacklevel=1)

    # -- statistics and cleanup ---------------------------------------------------------

    def _counts(self, epoch: int) -> _EpochCounts:
        counts = self._epochs.get(epoch)
        if counts is None:
            counts = self._epochs[epoch] = _EpochCounts()
            for old in sorted(self._epochs)[:-_EPOCHS_DETAILED]:
                self._epochs[old].outcome = None  # keep the counts, drop the per-object detail
        return counts

    def stats(self, epoch: int) -> CacheStats:
        """What ``epoch`` read through the cache in this process so far."""
        with self._lock:
            c = self._epochs.get(int(epoch)) or _EpochCounts()
            return CacheStats(int(epoch), c.reads, c.hits, c.bytes, c.requests)

    def release(self) -> None:
        """Forget the plans (nothing more is fetched ahead) and unmap the cache files."""
        with self._lock:
            self._plans.clear()
            self._maps.clear()


def _map_budget() -> int:
    from pipeline.streaming.maps import default_map_budget

    return default_map_budget()


def open_remote_cache(spec: CacheSpec | None, group: Any, location: Any, storage_options: Mapping | None,
                      meta: Mapping[str, Any]) -> RemoteCache | None:
    """The cache of an opened store's chunks, or None: without ``spec``, and for stores
    read from local disk (a directory, a zip file), which need none.

    Parameters
    ----------
    spec
        The stream's cache settings.
    group
        The store's root group, as opened.
    location
        The store's URL or group, for error messages.
    storage_options
        The fsspec options it was opened with.
    meta
        The store's ``pipeline`` attributes (empty for a foreign store).
    """
    import zarr

    if spec is None:
        return None
    store = group.store
    if not isinstance(store, zarr.storage.FsspecStore) or "file" in _protocols(store.fs):
        return None
    opts = dict(storage_options or {})
    endpoint = opts.get("endpoint_url") or (opts.get("client_kwargs") or {}).get("endpoint_url") or ""
    url = f"{_protocols(store.fs)[0] if _protocols(store.fs) else ''}://{store.path}"
    namespace = "\n".join([url, str(endpoint), str(meta.get("created", "")), str(meta.get("fingerprint", ""))])
    label = location if isinstance(location, (str, os.PathLike)) else url
    return RemoteCache(DiskCache(spec.directory, spec.budget), store.fs, store.path, namespace, str(label))


def _protocols(fs: Any) -> tuple[str, ...]:
    p = getattr(fs, "protocol", ())
    return (p,) if isinstance(p, str) else tuple(p)
