"""Buffer groups: a worker's chunk pieces read in background threads into recycled buffers.

A group is ``buffer_chunks`` consecutive pieces of a :class:`~pipeline.streaming.plan.WorkerPlan`;
its samples are decoded into one buffer per array, each straight to its place in the
group's mixed order (:func:`~pipeline.streaming.plan.group_permutation`), so that a
batch is a run of the buffer, served without a copy. A :class:`GroupLoader` keeps up to
``prefetch`` groups loading ahead of the one being served. Buffers come from a
:class:`BufferPool` shared by every loader of one stream: a fresh buffer of a few
hundred MB per group costs as much in page faults as decoding into it, so buffers are
reused across groups and epochs.

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
from pipeline.streaming.sources import read_part

__all__ = ["BufferPool", "Group", "GroupLoader", "lower_thread_priority"]


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


class BufferPool:
    """Group buffers of one stream, each big enough for any group of it.

    A group's samples are stored in their mixed order and its batches are views of its
    buffer (no copy), so a buffer given back is handed out again only once no view of
    it is alive anywhere: a batch still queued for the training loop, or kept by it (in
    a list, as a torch tensor sharing its memory), keeps its buffer out of use, and a
    new buffer is made meanwhile. Nothing a caller holds is ever overwritten. When more
    than ``keep`` buffers given back are still viewed, a
    :class:`~pipeline.errors.KeptBatchesWarning` says so, once.

    Parameters
    ----------
    source
        The stream's source (for sample shapes and dtypes).
    names
        Arrays to hold.
    capacity
        Samples per buffer: ``buffer_chunks`` times the longest chunk bounds every group.
    keep
        Buffers kept when the pool is trimmed; more are dropped, to the allocator.
    """

    def __init__(self, source: Any, names: Sequence[str], capacity: int, keep: int):
        # Assembled arrays (virtual windows) need no buffer: their batches are built
        # from the group's feature rows.
        self.names = tuple(n for n in names if not source.assembled(n))
        self.source, self.capacity, self.keep = source, int(capacity), int(keep)
        self._free: list[dict[str, np.ndarray]] = []
        self._lock = threading.Lock()
        self.made = 0  # buffers allocated so far (for tests and diagnostics)
        self._warned = False

    def get(self) -> dict[str, np.ndarray]:
        """A buffer given back that nothing views any more, or a new one."""
        with self._lock:
            for k, buffers in enumerate(self._free):
                if unviewed(buffers.values()):
                    return self._free.pop(k)
            pinned = len(self._free)  # given back, every one still viewed by a batch
        out = {}
        for n in self.names:
            tail, dtype = self.source.sample_shape(n)
            out[n] = np.empty((self.capacity,) + tuple(tail), dtype=dtype)
        self.made += 1
        # The batch queue pins a group or two; more than ``keep`` is the loop keeping batches.
        if pinned > self.keep and not self._warned:
            self._warned = True
            warnings.warn(KeptBatchesWarning(pinned, pinned * sum(a.nbytes for a in out.values())), stacklevel=2)
        return out

    def put(self, buffers: dict[str, np.ndarray]) -> None:
        """Give a buffer back once no read writes into it any more (views of it may live on)."""
        with self._lock:
            self._free.append(buffers)

    @property
    def idle(self) -> int:
        """Buffers given back, viewed or not (for tests and diagnostics)."""
        return len(self._free)

    def trim(self) -> None:
        """Drop buffers beyond ``keep`` (between epochs, so memory does not creep up);
        unviewed ones are kept first. A dropped buffer still viewed lives as long as
        its views."""
        with self._lock:
            self._free.sort(key=lambda b: not unviewed(b.values()))
            del self._free[self.keep :]


@dataclass(frozen=True, slots=True)
class Group:
    """One loaded group: its samples per array in mixed order (views into ``buffers``,
    or for assembled arrays a :class:`~pipeline.streaming.virtual.MixedWindows`) and
    the mixing (``perm[k]`` is the group sample served ``k``-th, counted in the
    order of the group's pieces)."""

    arrays: dict[str, Any]
    perm: np.ndarray
    buffers: dict[str, np.ndarray]


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
        self._announced = False

    def want(self, g: int, count: int | None = None) -> None:
        """Start loading groups ``g`` to ``g + count - 1`` (``count`` defaults to ``prefetch``)."""
        count = self.prefetch if count is None else count
        for k in range(g, min(g + max(1, count), len(self.plan.groups))):
            if k not in self._futures:
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
        return self._futures.pop(g).result()

    def close(self) -> None:
        """Stop loading; buffers of groups loaded but never taken go back to the pool."""
        # Queued reads are cancelled and running ones waited for: every group's future
        # is then settled, and a group that failed or was cut short has given its
        # buffer back already.
        self._reads.shutdown(wait=True, cancel_futures=True)
        for f in self._futures.values():
            if f.exception() is None:
                self.pool.put(f.result().buffers)
        self._futures.clear()

    def _start(self, g: int) -> Future:
        """Queue group ``g``'s reads; the returned future gives the :class:`Group` once
        all of them are done."""
        a, b = self.plan.groups[g]
        pieces = self.plan.pieces[a:b]
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
        full = self.pool.get()
        arrays: dict[str, Any] = {}
        rows: dict[str, list[Future]] = {}
        futs: list[Future] = []
        try:
            for n in self.names:
                if self.source.assembled(n):
                    rows[n] = [self._reads.submit(self.source.read_rows, n, p.chunk, p.lo, p.hi) for p in pieces]
                    futs.extend(rows[n])
                    continue
                buf = full[n][: int(offsets[-1])]
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
            self.pool.put(full)
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
                self.pool.put(full)
                group.set_exception(failed)
            else:
                group.set_result(Group(arrays, perm, full))

        if not futs:  # nothing to read (no arrays): ready at once
            settle(group)
        for f in futs:
            f.add_done_callback(settle)
        return group
