"""Buffer groups: a worker's chunk pieces read in background threads into recycled buffers.

A group is ``buffer_chunks`` consecutive pieces of a :class:`~pipeline.streaming.plan.WorkerPlan`;
its samples are decoded into one buffer per array, each straight to its place in the
group's mixed order (:func:`~pipeline.streaming.plan.group_permutation`), so that a
batch is a run of the buffer, served without a copy. A :class:`GroupLoader` keeps up to
``prefetch`` groups loading ahead of the one being served. Buffers come from a
:class:`BufferPool` shared by every loader of one stream: a fresh buffer of a few
hundred MB per group costs as much in page faults as decoding into it, so buffers are
reused across groups and epochs. The pool lays groups out one after another in a ring,
so a batch spanning the end of one group and the start of the next is a run of the ring.

A loader can be started before anyone asks for its groups: the streamer starts the next
epoch's loader while the last group of an epoch is served, so the next epoch's first
batch is already decoded when it is asked for.

Read threads run at a lower scheduling priority than the rest of the process (see
:func:`lower_thread_priority`): reading ahead is background work, and the threads that
mix batches and train on them must not queue behind it for a core.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from pipeline.errors import KeptBatchesWarning
from pipeline.streaming.batches import unviewed
from pipeline.streaming.plan import WorkerPlan, group_permutation
from pipeline.streaming.readahead import READAHEAD_BYTES
from pipeline.streaming.sources import read_part

__all__ = ["BufferPool", "Group", "GroupLoader", "Lease", "held_view", "lower_thread_priority"]


def lower_thread_priority(niceness: int) -> None:
    """Run the calling thread ``niceness`` steps nicer than the process's main thread.

    For the read threads, as their pool's initializer. Reading ahead is background
    work: while decoding keeps every core busy, the thread that mixes batches and the
    training loop that takes them would otherwise wait their turn behind it (the
    scheduler shares a core equally between the threads that want it). With three busy
    threads at equal priority on 2 cores, a core idled part of the time, because the
    mixing fell behind while two groups were decoded ahead and then ran alone; nicer
    read threads kept both cores busy (the history is in ``benchmarks/README.md``). Reads
    are not starved: at niceness 5 a thread still gets a third of the share of a
    normal one, and the whole of any core nobody else wants.

    Linux only, where a thread has its own nice value (``setpriority`` on a thread
    id); elsewhere, or where the sandbox forbids it, threads keep normal priority.
    """
    if niceness <= 0 or sys.platform != "linux":
        return
    try:
        base = os.getpriority(os.PRIO_PROCESS, os.getpid())  # the main thread's, not our creator's
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), min(19, base + niceness))
    except OSError:
        pass


class _Held:
    """What an array made by :func:`held_view` views: the memory's owner and whatever
    else must stay alive as long as the array does (its ``base``)."""

    __slots__ = ("__array_interface__", "held")


def held_view(owner: np.ndarray, start: int, stop: int, held: tuple = ()) -> np.ndarray:
    """Rows ``[start, stop)`` of ``owner`` as an array whose ``base`` is a small holder
    of ``owner`` and ``held``.

    numpy points every view's ``base`` at the array that owns the memory, so the views of
    one region of a large buffer could not be told from another region's. An array
    made from an ``__array_interface__`` owns no memory and its base is not an array:
    views of it point at it. A region made this way is counted in its own reference
    count (:func:`~pipeline.streaming.batches.unviewed`), and a view spanning several
    regions names them in ``held``, so each of them stays counted as viewed.
    """
    holder = _Held()
    holder.__array_interface__ = owner[start:stop].__array_interface__
    holder.held = (owner, held)
    return np.asarray(holder)


class Lease:
    """The buffers of one group: ``arrays`` (exactly the group's rows, per array), at
    rows ``[start, stop)`` of the pool's ring, or (``start`` None) in buffers of their
    own (``owner``, the pool's capacity each)."""

    __slots__ = ("arrays", "owner", "start", "stop", "returned")

    def __init__(self, arrays: dict[str, np.ndarray], owner: dict[str, np.ndarray], start: int | None = None,
                 stop: int | None = None):
        self.arrays, self.owner, self.start, self.stop = arrays, owner, start, stop
        self.returned = False

    def follows(self, other: "Lease") -> bool:
        """Whether this lease's rows come right after ``other``'s in the ring."""
        return self.start is not None and other.start is not None and self.start == other.stop

    def unviewed(self) -> bool:
        return unviewed(self.owner.values())


class BufferPool:
    """Group buffers of one stream: consecutive regions of one ring, reused.

    A group's samples are stored in their mixed order and its batches are views of its
    buffer (no copy). Groups are laid out one after another in a ring of ``keep``
    groups' rows, so a batch that spans the end of one group and the start of the next
    is a view as well, of both regions (:meth:`span`), instead of a copy: with a batch
    size that does not divide the group size, many batches span two groups, and with a
    batch larger than a group every batch does (copying them cost up to 2.5x the
    stream's time, ``benchmarks/README.md``). Only a batch spanning the ring's end is
    copied.

    A region given back is used again only once no view of it is alive anywhere: a
    batch still queued for the training loop, or kept by it (in a list, as a torch
    tensor sharing its memory), keeps its region out of use. While the ring's next
    region is still viewed, a group gets buffers of its own; when more than ``keep``
    given-back buffers are still viewed, a :class:`~pipeline.errors.KeptBatchesWarning`
    says so, once. Nothing a caller holds is ever overwritten.

    Parameters
    ----------
    source
        The stream's source (for sample shapes and dtypes).
    names
        Arrays to hold.
    capacity
        Samples per group at most: ``buffer_chunks`` times the longest chunk bounds every group.
    keep
        Groups in use at once in the steady state (served, viewed by queued batches, read
        ahead): the ring holds that many full groups.
    share
        The most samples one epoch of the stream serves (its rank's, or DataLoader
        worker's, share): the ring holds no more rows than that, however many groups
        ``keep`` asks for. A split smaller than the read-ahead window then costs its
        own size, not ``keep`` groups (the next epoch's first group is read ahead only
        where it fits, see :meth:`fits`).
    """

    def __init__(self, source: Any, names: Sequence[str], capacity: int, keep: int, share: int | None = None):
        # Assembled arrays (virtual windows) need no buffer: their batches are built
        # from the group's feature rows.
        self.names = tuple(n for n in names if not source.assembled(n))
        self.source, self.capacity, self.keep = source, int(capacity), int(keep)
        self.rows = self.keep * self.capacity  # the ring's rows
        if share is not None and share > 0:
            self.rows = min(self.rows, int(share))
        self.row_bytes = sum(int(np.prod(tail, dtype=np.int64)) * np.dtype(dtype).itemsize
                             for tail, dtype in (source.sample_shape(n) for n in self.names))
        self._high = 0  # the most ring rows ever placed (pages of the ring never touched cost nothing)
        self._lent: list[Lease] = []  # buffers of their own handed out and not yet given back
        self.peak_bytes = 0  # the most bytes of group buffers in use at once (ring touched + own)
        self._ring: dict[str, np.ndarray] | None = None
        self._head = 0  # the ring row after the last region placed
        self._placed: list[Lease] = []  # ring regions not yet reclaimed, oldest first
        self._free: list[Lease] = []  # buffers of their own given back
        self._lock = threading.Lock()
        self.made = 0  # the most group buffers in use at once (for tests and diagnostics)
        self.own_made = 0  # buffers of their own allocated (for tests and diagnostics)
        self._warned = False

    def get(self, size: int) -> Lease:
        """Buffers for a group of ``size`` samples: the ring's next region when nothing
        views it any more, else buffers given back that nothing views, else new ones."""
        size = int(size)
        with self._lock:
            self._placed = [lease for lease in self._placed if not (lease.returned and lease.unviewed())]
            lease = self._place(size) if self._ringed(size) else None
            if lease is None:
                for k, old in enumerate(self._free):
                    if old.unviewed():
                        own = self._free.pop(k).owner
                        lease = Lease({n: own[n][:size] for n in self.names}, own)
                        self._lent.append(lease)
                        break
            in_use = len(self._placed) + sum(1 for lease in self._free if not lease.unviewed())
            pinned = sum(1 for old in self._placed + self._free if old.returned and not old.unviewed())
        if lease is None:
            own = {}
            for n in self.names:
                tail, dtype = self.source.sample_shape(n)
                own[n] = np.empty((max(self.capacity, size),) + tuple(tail), dtype=dtype)
            lease = Lease({n: own[n][:size] for n in self.names}, own)
            in_use += 1
            with self._lock:
                self._lent.append(lease)
                self.own_made += 1
            # The batch queue pins a group or two; more than ``keep`` is the loop keeping batches.
            if pinned > self.keep and not self._warned:
                self._warned = True
                nbytes = sum(a.nbytes for a in own.values())
                warnings.warn(KeptBatchesWarning(pinned, pinned * nbytes), stacklevel=2)
        self.made = max(self.made, in_use)
        with self._lock:
            self.peak_bytes = max(self.peak_bytes, self._bytes_in_use())
        return lease

    def _ringed(self, size: int) -> bool:
        """Whether a group of ``size`` samples goes in the ring (else in buffers of its own)."""
        return 0 < size <= min(self.capacity, self.rows) and bool(self.names)

    def _bytes_in_use(self) -> int:
        """Bytes of group buffers alive: the ring's rows ever touched, and buffers of their
        own lent out or still viewed (called with the lock held)."""
        own = [lease for lease in self._lent] + [lease for lease in self._free if not lease.unviewed()]
        return (self._high + len(own) * self.capacity) * self.row_bytes

    def fits(self, size: int) -> bool:
        """Whether a group of ``size`` samples would get buffers without new memory: the
        ring's next region is free, or a buffer of its own given back is. The next
        epoch's first group is read ahead only then: reading it into new memory while
        the current epoch holds the ring would cost a group more than the stream's bound."""
        with self._lock:
            if self._ringed(size):
                start = self._head if self._head + size <= self.rows else 0
                stop = start + size
                if not any(lease.start < stop and start < lease.stop and not (lease.returned and lease.unviewed())
                           for lease in self._placed):
                    return True
            return any(old.unviewed() for old in self._free)

    def _place(self, size: int) -> Lease | None:
        """A ring region of ``size`` rows after the last one placed (from the ring's start
        when it does not fit before the end), or None while a live region is in the way."""
        start = self._head if self._head + size <= self.rows else 0
        stop = start + size
        if any(lease.start < stop and start < lease.stop for lease in self._placed):
            return None
        if self._ring is None:
            self._ring = {}
            for n in self.names:
                tail, dtype = self.source.sample_shape(n)
                self._ring[n] = np.empty((self.rows,) + tuple(tail), dtype=dtype)
        arrays = {n: held_view(self._ring[n], start, stop) for n in self.names}
        lease = Lease(arrays, arrays, start, stop)
        self._placed.append(lease)
        self._head = stop
        self._high = max(self._high, stop)
        return lease

    def put(self, lease: Lease) -> None:
        """Give a group's buffers back once no read writes into them any more (views of
        them may live on)."""
        with self._lock:
            lease.returned = True
            if lease.start is None:
                lease.arrays = {}  # views of the owner: only views held elsewhere count now
                self._free.append(lease)
                self._lent = [other for other in self._lent if other is not lease]

    def span(self, name: str, parts: Sequence[tuple[Lease, int, int]]) -> np.ndarray | None:
        """Rows ``[lo, hi)`` of each part's region, one after another, as one view of the
        ring, when the parts are consecutive there (each but the last ends its region,
        the next region follows it); else None (the caller copies)."""
        for (a, _, hi), (b, lo, _) in zip(parts, parts[1:]):
            if not b.follows(a) or hi != a.stop - a.start or lo != 0:
                return None
        first, last = parts[0], parts[-1]
        if first[0].start is None or self._ring is None:
            return None
        return held_view(self._ring[name], first[0].start + first[1], last[0].start + last[2],
                         tuple(lease.arrays[name] for lease, _, _ in parts))

    @property
    def idle(self) -> int:
        """Buffers given back and not yet reused, viewed or not (for tests and diagnostics)."""
        with self._lock:
            return sum(1 for lease in self._placed if lease.returned) + len(self._free)

    def trim(self) -> None:
        """Drop the buffers of their own given back but the last (between epochs, so
        memory does not creep up); one still viewed lives as long as its views.

        The one kept is what the next epoch's first groups take (once nothing views it)
        while a training loop's last batch still views the ring (it lives until the next
        batch replaces it): a new one was faulted in again at every such epoch, a cost of
        its own size (0.5 GB for a store whose chunks split samples, ``benchmarks/README.md``)."""
        with self._lock:
            self._free = self._free[-1:]


@dataclass(frozen=True, slots=True)
class Group:
    """One loaded group: its samples per array in mixed order (views into ``lease``'s
    buffers, or for assembled arrays a :class:`~pipeline.streaming.virtual.MixedWindows`)
    and the mixing (``perm[k]`` is the group sample served ``k``-th, counted in the
    order of the group's pieces)."""

    arrays: dict[str, Any]
    perm: np.ndarray
    lease: Lease


class GroupLoader:
    """Loads the groups of one worker's plan, ``prefetch`` groups ahead of the one taken.

    Asking for a group queues its chunk reads at once on ``threads`` shared read
    threads (decoding in numcodecs releases the GIL), behind those of the groups asked
    for before, and the group is ready when its last read is done. So the threads go
    from one group's reads straight to the next group's, without waiting for a group's
    slowest chunk. The read threads run ``niceness`` steps below the process's priority
    (:func:`lower_thread_priority`).
    """

    def __init__(self, source: Any, names: Sequence[str], plan: WorkerPlan, *, pool: BufferPool,
                 threads: int, prefetch: int, seed: int, epoch: int, rank: int, worker: int, shuffle: bool,
                 niceness: int = 0):
        self.source, self.names, self.plan, self.pool = source, tuple(names), plan, pool
        self.prefetch = prefetch
        self._mix = dict(seed=seed, epoch=epoch, rank=rank, worker=worker, shuffle=shuffle)
        starts = np.concatenate([[0], np.cumsum([p.hi - p.lo for p in plan.pieces])]).astype(np.int64)
        self.group_sizes = [int(starts[b] - starts[a]) for a, b in plan.groups]
        self._reads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pipeline-read",
                                         initializer=lower_thread_priority, initargs=(niceness,))
        self._futures: dict[int, Future] = {}
        self._taken: set[int] = set()
        self._announced = False
        # The groups after those wanted whose chunk files the kernel is asked to read
        # ahead (a local store's, when not in the page cache): READAHEAD_BYTES of samples.
        self._advise = getattr(source, "advise", None)
        # A local store's source checks that its directory is still the one it opened
        # (an overwrite would mix two stores' chunks in a group): one stat per check.
        self._check = getattr(source, "check_intact", None)
        self._advised = 0  # groups before this one were named to the read ahead
        row_bytes = sum(int(np.prod(tail, dtype=np.int64)) * np.dtype(dtype).itemsize
                        for tail, dtype in (source.sample_shape(n) for n in self.names if not source.assembled(n)))
        group_bytes = row_bytes * max(1, int(np.mean(self.group_sizes)) if self.group_sizes else 1)
        self._advise_groups = max(1, -(-READAHEAD_BYTES // max(1, group_bytes)))

    def want(self, g: int, count: int | None = None) -> None:
        """Start loading groups ``g`` to ``g + count - 1`` (``count`` defaults to ``prefetch``)."""
        count = self.prefetch if count is None else count
        if self._advise is not None:
            # Named before their reads start: the kernel then reads a group's files
            # whole, many requests at once, while the read threads fault in their pages.
            stop = min(g + max(1, count) + self._advise_groups, len(self.plan.groups))
            start = max(g, self._advised)
            if start < stop:
                self._advised = stop
                a, b = self.plan.groups[start][0], self.plan.groups[stop - 1][1]
                self._advise([p.chunk for p in self.plan.pieces[a:b]])
        for k in range(g, min(g + max(1, count), len(self.plan.groups))):
            # A group already taken is never loaded again: a batch that spans groups
            # takes the next group at once, before the groups after it are wanted.
            if k not in self._futures and k not in self._taken:
                self._futures[k] = self._start(k)

    def take(self, g: int) -> Group:
        """Group ``g``, waiting for it if needed.

        The caller then starts the groups after it with ``want(g + 1)``, once its first
        batch is out: at an epoch's start the consumer waits for that batch, and loads
        started at the same moment would compete with it for the cores and the GIL
        (a first batch then took many times longer). At most ``prefetch + 1``
        groups are in memory (plus, near an epoch's end, the next epoch's first).
        """
        self.want(g, 1)
        self._taken.add(g)
        return self._futures.pop(g).result()

    def close(self) -> None:
        """Stop loading; buffers of groups loaded but never taken go back to the pool."""
        # Queued reads are cancelled and running ones waited for: every group's future
        # is then settled, and a group that failed or was cut short has given its
        # buffer back already.
        self._reads.shutdown(wait=True, cancel_futures=True)
        for f in self._futures.values():
            if f.exception() is None:
                self.pool.put(f.result().lease)
        self._futures.clear()

    def _start(self, g: int) -> Future:
        """Queue group ``g``'s reads; the returned future gives the :class:`Group` once
        all of them are done."""
        a, b = self.plan.groups[g]
        pieces = self.plan.pieces[a:b]
        if self._check is not None:
            # Before the reads: a store replaced since the last group fails this one
            # with nothing read; after them (settle) catches a swap during its reads.
            try:
                self._check()
            except Exception as exc:  # noqa: BLE001 - handed to whoever takes the group
                refused: Future = Future()
                refused.set_running_or_notify_cancel()
                refused.set_exception(exc)
                return refused
        if not self._announced:
            # A source over the network (a remote store's cache) fetches the rest of the
            # plan ahead of the reads, in order, from the first group read (a resumed
            # epoch skips the groups before it).
            self._announced = True
            will_read = getattr(self.source, "will_read", None)
            if will_read is not None:
                will_read([p.chunk for p in self.plan.pieces[a:]], self._mix["epoch"])
        offsets = np.concatenate([[0], np.cumsum([p.hi - p.lo for p in pieces])]).astype(np.int64)
        # The mixing is known before anything is read: each read puts its samples
        # straight into their mixed places, and a batch is then a run of the buffer.
        # A plan that lays out its groups itself (an elastic plan, step after step) gives
        # the order; otherwise the group is permuted from the seed.
        perm = group_permutation(self.group_sizes[g], group=g, orders=self.plan if hasattr(self.plan, "order") else None,
                                 **self._mix)
        places = None
        if self._mix["shuffle"]:
            places = np.empty_like(perm)
            places[perm] = np.arange(perm.size, dtype=perm.dtype)
        lease = self.pool.get(int(offsets[-1]))
        arrays: dict[str, Any] = {}
        rows: dict[str, list[Future]] = {}
        futs: list[Future] = []
        try:
            for n in self.names:
                if self.source.assembled(n):
                    rows[n] = [self._reads.submit(self.source.read_rows, n, p.chunk, p.lo, p.hi) for p in pieces]
                    futs.extend(rows[n])
                    continue
                buf = lease.arrays[n]
                arrays[n] = buf
                for p, off in zip(pieces, offsets[:-1]):
                    part = buf[off : off + p.hi - p.lo]
                    if places is not None:
                        futs.append(self._reads.submit(self.source.scatter, n, p, buf, places[off : off + p.hi - p.lo]))
                    elif p.lo == 0 and p.hi == self.source.lengths[p.chunk]:  # decode straight into the buffer
                        futs.append(self._reads.submit(self.source.read, n, p.chunk, part))
                    else:  # a rank or worker boundary falls inside the chunk
                        futs.append(self._reads.submit(read_part, self.source, n, p, part))
        except BaseException:  # the executor was shut down: nothing more may write into the buffer
            for f in futs:
                f.cancel()
            wait(futs)
            self.pool.put(lease)
            raise
        group: Future = Future()
        group.set_running_or_notify_cancel()
        left = [len(futs) or 1]  # with nothing to read, the one settle() below
        lock = threading.Lock()

        def settle(_: Future) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            # The last read of the group is done (or cancelled): nothing writes into its
            # buffer any more. Failures are looked up, not raised here: a traceback made
            # in this frame would keep the calling thread's frames (and the buffer)
            # alive until the cyclic garbage collector runs.
            failed = next((CancelledError() if f.cancelled() else f.exception() for f in futs
                           if f.cancelled() or f.exception() is not None), None)
            if failed is None:
                try:
                    if self._check is not None:
                        self._check()
                    if rows:
                        from pipeline.streaming.virtual import WindowRows

                        for n, parts in rows.items():
                            arrays[n] = WindowRows.concat([f.result() for f in parts]).mixed(perm)
                except Exception as exc:  # noqa: BLE001 - handed to whoever takes the group
                    failed = exc
            # The reads' futures hold this callback: drop them now, not when the cyclic
            # garbage collector runs.
            futs.clear()
            rows.clear()
            if failed is not None:
                self.pool.put(lease)
                group.set_exception(failed)
            else:
                group.set_result(Group(arrays, perm, lease))

        if not futs:  # nothing to read (no arrays): ready at once
            settle(group)
        for f in futs:
            f.add_done_callback(settle)
        return group
