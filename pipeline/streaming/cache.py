"""A node-local disk cache of a remote store's chunk objects, fetched ahead of need.

Streaming ``s3://`` (or any fsspec URL) without a cache pays the network every epoch,
one request per chunk, each waiting for its round trip. With ``pipeline.stream(...,
cache_dir=..., cache_bytes=...)`` every chunk object read is kept in a directory on
local disk, so later epochs read local files, and the
first epoch fetches with many requests in flight: the epoch's chunk order is known
before it starts (:mod:`~pipeline.streaming.plan`), so each worker announces its plan
(:meth:`RemoteCache.will_read`) and a fetch thread fetches it in order, a window ahead
of the reads, with up to :data:`FETCH_REQUESTS` requests (and :data:`FETCH_BYTES`) in
flight, through obstore where the store's options allow (:mod:`~pipeline.streaming.fetch`).
Each process counts what its epochs found in the cache and fetched, and publishes its
counts in the cache directory, so that a stream reports the reads of its DataLoader
workers with its own (:class:`CacheStats`, ``Stream.cache_stats``).

Sharing and safety: every rank and DataLoader worker of a node may use the same
directory at once, never sees a torn file, and the cache deletes nothing but its own
files, in its own subfolder (:mod:`~pipeline.streaming.diskcache`). A cache file that
fails to decode or to match its checksum (a disk error on the node, a copy torn by a
crash) is not the store's fault: the reader drops it (:meth:`RemoteCache.drop`) and
fetches the object again once, with a warning naming the file; only bytes fetched again
that fail too are reported as the store's
(:meth:`~pipeline.streaming.chunks.ChunkReader.read`).

Staleness: an object is cached under the store's URL, endpoint and identity (a pipeline
store's ``created`` time and fingerprint, so a store rebuilt at the same URL is a new
cache namespace) and its key. Objects are assumed not to change once written, except
the one holding an array's last samples, which an append rewrites with more samples:
an object not wholly inside the array's length (as the reader's version sees it) is
cached under that length too. A store another tool rewrites in place at the same URL
needs its cache files removed (or another ``cache_dir``).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
import time
import warnings
import weakref
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pipeline.errors import StoreError, StreamError
from pipeline.streaming.diskcache import DiskCache
from pipeline.streaming.fetch import fetch_failure, fetcher_for

__all__ = ["FETCH_BYTES", "FETCH_REQUESTS", "CacheSpec", "CacheStats", "RemoteCache", "cache_spec", "merge_counts",
           "open_remote_cache"]

#: Most requests a stream's fetch thread keeps in flight.
FETCH_REQUESTS = 16
#: Most bytes (decoded size, a bound on the size fetched) it keeps in flight. Transfers in
#: flight share the network: with all of an epoch's requests sent at once, the first
#: chunk would arrive with the last, and nothing could be decoded meanwhile. Enough to
#: cover a request's latency at the bandwidth (20 ms at 2 GB/s is 40 MB) with a few
#: chunks of 32 MiB still in flight, in order.
FETCH_BYTES = 128 << 20
#: Most bytes a process fetches ahead of its reads (and at most a quarter of the budget).
AHEAD_BYTES = 1 << 30
#: The fetch thread ends after this long without work (it starts again when needed).
_IDLE_S = 10.0
#: Plans (announced epochs) tracked at once: the epoch being read, the next one read
#: ahead, and one abandoned.
_PLANS = 3
#: Epochs whose per-object outcomes are kept (older epochs keep their counts only).
_EPOCHS_DETAILED = 4
#: Seconds between a process's publications of its read counts (and always when it has
#: read the last object of a plan).
_PUBLISH_S = 0.5


@dataclass(frozen=True, slots=True)
class CacheSpec:
    """Where a stream caches a remote store's chunks, the most bytes it may keep there,
    and the stream's id, which its copies in DataLoader workers share: their read counts
    are reported with the stream's."""

    directory: str
    budget: int
    stream: str = ""


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
    return CacheSpec(os.path.abspath(os.fspath(cache_dir)), int(cache_bytes), secrets.token_hex(8))


# -- statistics ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CacheStats:
    """What one epoch of a stream read through its cache: in this process and in the
    DataLoader workers that read for it.

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


def _published(c: "_EpochCounts") -> list[Any]:
    """One process's counts of an epoch as published: ``[reads, hits, bytes, requests]``,
    and while its per-object outcomes are kept, the objects it found and those it fetched."""
    row: list[Any] = [c.reads, c.hits, c.bytes, c.requests]
    if c.outcome is not None:
        row += [sorted(n for n, hit in c.outcome.items() if hit), sorted(n for n, hit in c.outcome.items() if not hit)]
    return row


def merge_counts(rows: Sequence[Sequence[Any]]) -> tuple[int, int, int, int]:
    """Reads, hits, bytes and requests of one epoch over the processes that published
    ``rows`` (see :func:`_published`). Bytes and requests add up; reads and hits count
    each object once when every row names its objects (a fetch anywhere makes it a
    miss), and add up otherwise (an epoch old enough to have lost its detail)."""
    fetched = sum(int(r[2]) for r in rows)
    requests = sum(int(r[3]) for r in rows)
    if not all(len(r) >= 6 for r in rows):
        return sum(int(r[0]) for r in rows), sum(int(r[1]) for r in rows), fetched, requests
    found: set[str] = set()
    missed: set[str] = set()
    for r in rows:
        found.update(r[4])
        missed.update(r[5])
    return len(found | missed), len(found - missed), fetched, requests


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


@dataclass(slots=True)
class _Plan:
    """The objects one worker reads in one epoch, in order, and how far it got."""

    epoch: int
    entries: list[tuple[str, str, int]]  # (cache name, remote path, expected bytes)
    index: dict[str, int]
    window: int
    read: set[str]  # entries whose read started
    done: set[str] = field(default_factory=set)  # entries whose read returned
    read_to: int = 0  # one past the furthest entry read
    next: int = 0  # the next entry the fetch thread looks at


class RemoteCache:
    """The chunk objects of one remote store, read through a :class:`DiskCache`.

    Parameters
    ----------
    disk
        The node's cache directory.
    fetcher
        What fetches the store's objects by their path in the store
        (:mod:`~pipeline.streaming.fetch`).
    namespace
        What identifies the store's content (URL, endpoint, identity): part of every
        cache file's name.
    label
        The store, for error messages.
    stream
        The id of the stream whose reads these are (:class:`CacheSpec`); empty: the
        counts stay in this process.
    """

    def __init__(self, disk: DiskCache, fetcher: Any, namespace: str, label: str, stream: str = ""):
        from zarr.core.sync import _get_loop

        self.disk, self.fetcher, self.label = disk, fetcher, label
        self._ns = hashlib.blake2b(namespace.encode("utf-8"), digest_size=8).hexdigest()
        # An fsspec file system's session lives on zarr's event loop (it opened the store there).
        self._loop = _get_loop()
        self._lock = threading.RLock()  # RLock: a fetch done already runs its callback at once
        self._wake = threading.Condition(self._lock)
        self._inflight: dict[str, Any] = {}
        self._flying: dict[str, int] = {}  # expected bytes of the fetch thread's requests in flight
        self._plans: deque[_Plan] = deque()
        self._epochs: dict[int, _EpochCounts] = {}
        self._last_epoch: int | None = None  # of the last read a plan announced, or of a plan-less epoch
        self._thread: threading.Thread | None = None
        self._warned = False
        self._pid = os.getpid()
        self.ahead_bytes = min(AHEAD_BYTES, max(1, disk.budget // 4))
        self._stream, self._process = stream, secrets.token_hex(8)
        self._published = 0.0  # time.monotonic() of the last publication of the counts
        self._plan_done = False  # a read finished a plan: publish at once
        if stream:
            # A DataLoader worker exits once its share is served, its last reads possibly
            # within _PUBLISH_S of its last publication: publish them on the way out
            # (multiprocessing runs finalizers with a priority when a child exits).
            from multiprocessing.util import Finalize

            Finalize(self, _publish_at_exit, args=(weakref.ref(self),), exitpriority=10)

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
        # Virtual windows: their window ends follow the plan's chunks (the features they
        # read are fetched when read).
        readers = [getattr(r, "ends", r) for r in readers]
        readers = [r for r in readers if getattr(r, "cache", None) is self]
        entries: list[tuple[str, str, int]] = []
        index: dict[str, int] = {}
        for c in chunks:
            for r in readers:
                path, tag = r.object_key(int(c))
                name = self.name(path, tag)
                if name not in index:
                    index[name] = len(entries)
                    entries.append((name, path, int(r.object_bytes)))
        object_bytes = sum(r.object_bytes for r in readers) / max(1, len(readers))
        if not entries or max((r.object_bytes for r in readers), default=0) > self.disk.budget:
            # Objects the cache cannot hold are fetched when read, not twice; with no plan
            # to place them, the reads from now on are this epoch's.
            with self._lock:
                self._last_epoch = int(epoch)
                self._counts(int(epoch))
            return
        window = int(max(1, min(1024, self.ahead_bytes // max(1.0, object_bytes))))
        with self._lock:
            self._plans.append(_Plan(int(epoch), entries, index, window, set()))
            while len(self._plans) > _PLANS:
                self._plans.popleft()
            self._counts(int(epoch))
            self._wake_fetcher()

    def _wake_fetcher(self) -> None:
        """Start the fetch thread, or wake it: there may be work. Under the lock."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pipeline-fetch", daemon=True)
            self._thread.start()
        self._wake.notify_all()

    def _run(self) -> None:
        """The fetch thread: resolves the plans' entries in order, within their windows.
        It ends when it found nothing to do for a while (a plan waiting for reads that
        may never come, of an abandoned epoch, keeps nothing alive); a read that moves a
        window on starts it again."""
        while True:
            with self._wake:
                job = self._next_job()
                while job is None:
                    if not self._wake.wait(_IDLE_S):
                        job = self._next_job()
                        if job is None:
                            self._thread = None
                            return
                    job = self._next_job()
                plan, name, path, nbytes = job
                if self.disk.touch(name):  # cached: touched, so that it stays until read
                    self._counts(plan.epoch).record(name, True)
                else:
                    self._submit(path, name, plan.epoch)
                    self._flying[name] = nbytes

    def _next_job(self) -> tuple[_Plan, str, str, int] | None:
        if len(self._inflight) >= FETCH_REQUESTS or (self._flying and sum(self._flying.values()) >= FETCH_BYTES):
            return None
        for plan in self._plans:
            limit = min(len(plan.entries), plan.read_to + plan.window)
            while plan.next < limit:
                name, path, nbytes = plan.entries[plan.next]
                plan.next += 1
                if name not in plan.read and name not in self._inflight:
                    return plan, name, path, nbytes
        return None

    # -- reads --------------------------------------------------------------------------

    def get(self, path: str, tag: str = "") -> Any:
        """The bytes of object ``path`` (read from its cache file, or as fetched), or
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
                    self._returned(name)
                fut = None if kept is not None else self._submit(path, name, epoch)
        if fut is None:  # a hit: its counts are published outside the lock the fetch thread takes
            self._publish()
            return kept
        try:
            data = fut.result()
        except Exception as exc:  # noqa: BLE001 - any failure to fetch is the store's
            raise StoreError(f"{self.label}: cannot fetch {path} ({fetch_failure(exc)})") from exc
        if data is None:  # not in the store: nothing read or fetched, but this read is over
            with self._lock:
                self._returned(name)
            self._publish()
            return None
        with self._lock:
            self._counts(epoch).record(name, False)
            self._returned(name)
        self._publish()
        return data

    def drop(self, path: str, tag: str = "") -> str:
        """Forget the cached copy of object ``path`` (it failed to decode or to match its
        checksum): deleted, so that the next :meth:`get` fetches it from the
        store again. Returns the cache file's path, for messages."""
        self._check_process()
        name = self.name(path, tag)
        self.disk.remove(name)
        return self.disk.path(name)

    def _check_process(self) -> None:
        if os.getpid() != self._pid:
            # Its event loop, fetch thread and lock file did not survive the fork.
            raise StreamError(f"{self.label}: a chunk cache was used in a process forked from the one that made "
                              "it; the store's source opens the store (and its cache) again after a fork")

    def _returned(self, name: str) -> None:
        """A read of ``name`` returned, its counts recorded. Under the lock. Once every
        entry of a plan has (not merely started: a read that started may still wait for
        its fetch, whose bytes are then not yet counted), the counts are published."""
        for plan in self._plans:
            if name in plan.index and name not in plan.done:
                plan.done.add(name)
                if len(plan.done) == len(plan.entries):
                    self._plan_done = True

    def _note_read(self, name: str) -> int:
        """The epoch a read of ``name`` belongs to; moves its plan's window on."""
        for plan in self._plans:
            pos = plan.index.get(name)
            if pos is not None and name not in plan.read:
                plan.read.add(name)
                if pos + 1 > plan.read_to:
                    plan.read_to = pos + 1
                    self._wake_fetcher()
                self._last_epoch = plan.epoch
                return plan.epoch
        # Not announced (a virtual window's features): the epoch of the last read that was.
        if self._last_epoch is not None:
            return self._last_epoch
        return self._plans[0].epoch if self._plans else 0

    def _open(self, name: str) -> Any:
        """The bytes of cache file ``name`` (touched), or None when it is not cached.

        Read, not mapped: a mapped file truncated under the process (a cleanup tool, a
        disk error, ``truncate``) kills it with SIGBUS on its next access, where a read
        returns the bytes that are left, which fail to decode and are fetched again
        (:meth:`drop`). Eviction, which deletes, never truncates."""
        path = self.disk.path(name)
        if not self.disk.touch(name):
            return None
        try:
            with open(path, "rb", buffering=0) as fh:
                return fh.read()  # one read of the size fstat gives, into one bytes object
        except FileNotFoundError:
            return None

    def _submit(self, path: str, name: str, epoch: int) -> Any:
        import asyncio  # here: only a remote store's stream, which has imported zarr and its loop, runs it

        fut = asyncio.run_coroutine_threadsafe(self._fetch(path, name, epoch), self._loop)
        self._inflight[name] = fut
        fut.add_done_callback(lambda f: self._settled(name, f))
        return fut

    def _settled(self, name: str, fut: Any) -> None:
        with self._wake:
            if self._inflight.get(name) is fut:
                del self._inflight[name]
                self._flying.pop(name, None)
            if self._plans:  # a request is free for the next entry
                self._wake_fetcher()

    async def _fetch(self, path: str, name: str, epoch: int) -> bytes | None:
        data = await self.fetcher.get(path)
        if data is None:
            return None  # never written: read as the fill value, and nothing to cache
        with self._lock:
            counts = self._counts(epoch)
            counts.bytes += len(data)
            counts.requests += 1
            counts.record(name, False)
        # Written before the fetch counts as done: a read that then finds the fetch gone
        # finds the file.
        import asyncio

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

    def _publish(self, force: bool = False) -> None:
        """Write this process's counts where the stream's other processes read them: at
        most every :data:`_PUBLISH_S`, and at once when a plan was read to its end (a
        DataLoader worker's epoch ends there, before its last batches are served)."""
        if not self._stream:
            return
        now = time.monotonic()
        with self._lock:
            if not (force or self._plan_done or now - self._published >= _PUBLISH_S):
                return
            self._plan_done, self._published = False, now
            counts = {str(e): _published(c) for e, c in self._epochs.items()}
        self.disk.write_stats(self._stream, self._process, counts)

    def stats(self, epoch: int) -> CacheStats:
        """What ``epoch`` read through the cache so far, in this process and in the other
        processes reading for the same stream (its DataLoader workers). An object two
        workers both read (the chunk their shares split) is one read, a hit only when
        neither fetched it."""
        with self._lock:
            c = self._epochs.get(int(epoch)) or _EpochCounts()
            rows = [_published(c)]
        if self._stream:
            for other in self.disk.read_stats(self._stream, exclude=self._process):
                row = other.get(str(int(epoch)))
                if row is not None:
                    rows.append(row)
        return CacheStats(int(epoch), *merge_counts(rows))

    def release(self) -> None:
        """Forget the plans (nothing more is fetched ahead) and publish the counts."""
        self._publish(force=True)
        with self._lock:
            self._plans.clear()


def _publish_at_exit(ref: Any) -> None:
    """A process's last publication of its read counts (a weak reference: a cache
    collected earlier published when released, and is not kept alive for this)."""
    cache = ref()
    if cache is not None and os.getpid() == cache._pid:
        cache._publish(force=True)


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
    if spec is None or getattr(group, "store", None) is None:
        return None  # no cache asked for, or a local store read without zarr
    import zarr

    store = group.store
    if not isinstance(store, zarr.storage.FsspecStore) or "file" in _protocols(store.fs):
        return None
    # Arrays opened by the caller come without their options: their file system keeps them.
    opts = dict(storage_options or getattr(store.fs, "storage_options", None) or {})
    endpoint = opts.get("endpoint_url") or (opts.get("client_kwargs") or {}).get("endpoint_url") or ""
    url = f"{_protocols(store.fs)[0] if _protocols(store.fs) else ''}://{store.path}"
    namespace = "\n".join([url, str(endpoint), str(meta.get("created", "")), str(meta.get("fingerprint", ""))])
    label = location if isinstance(location, (str, os.PathLike)) else url
    return RemoteCache(DiskCache(spec.directory, spec.budget), fetcher_for(store.fs, store.path, opts), namespace,
                       str(label), spec.stream)


def _protocols(fs: Any) -> tuple[str, ...]:
    p = getattr(fs, "protocol", ())
    return (p,) if isinstance(p, str) else tuple(p)
