"""The chunk-randomizing streamer behind :func:`pipeline.stream`.

Why chunks: shuffling a disk-backed array sample by sample is random I/O and crawls.
Instead the chunk order is permuted every epoch, ``buffer_chunks`` chunks are read
together and their samples mixed in memory, and the next group of chunks is read in
background threads while the current group's batches are served.

Why batches cost no copy: a group's mixing is known before it is read, so each read
decodes its samples straight to their mixed places in the group's buffer
(:meth:`~pipeline.streaming.chunks.ChunkReader.scatter`), and a batch is a run of that
buffer, handed out as a view. Decoding chunks in order and then gathering each batch
from them wrote every sample twice and read it once more (``benchmarks/bench_streaming.py``
prints the stream against the raw decode limit; its history is in
``benchmarks/README.md``). Group buffers follow one another in one ring
(:class:`~pipeline.streaming.groups.BufferPool`), so a batch that spans groups (a batch
size that does not divide the group, or a batch larger than a group) is a view too; only
one spanning the ring's end is copied.

The ``buffer_chunks`` trade-off: a batch drawn from a buffer of ``k`` chunks mixes
samples of up to ``k`` chunks, so larger buffers decorrelate batches better (the quality
report's mean distinct chunks per batch grows with ``k``), at the price of memory: the
group being served, the one before it, the groups read ahead, the groups that queued
batches still view, and near an epoch's end the next epoch's first. The bound is
:func:`memory_bound` (stated in :func:`pipeline.stream`'s docstring): the ring of group
buffers never holds more than an epoch's samples, the read-ahead is bounded in bytes
(:data:`AHEAD_BYTES`) and the batch queue too (:data:`QUEUE_BYTES`), and the next epoch's
first group is read ahead only where the ring has room for it. Virtual windows are
assembled batch by batch (:mod:`~pipeline.streaming.virtual`): a group holds their
feature rows and ends, never its windows, and :meth:`Stream.memory_bound` adds the
assembled batches alive, which the queue's and the assembling threads' byte limits keep
to a few batches, whatever the chunks' sizes.

Why two groups ahead: the read threads then always have the next group's chunks queued
behind the current group's, and never wait for a group's slowest chunk; with one group
ahead a core sat idle part of the time (the comparison is in ``benchmarks/README.md``).
Groups of fewer than 4 chunks are read further ahead (:func:`groups_ahead`; the
stream's ``prefetch`` attribute is the number of groups then): what keeps the threads
busy is chunks queued, not groups.

Why the read threads run nicer than the rest (``read_niceness=5``): reading ahead is
background work, and the training loop (and the thread that hands it batches, and
assembles virtual windows) must get a core as soon as it wants one: at equal priority,
three busy threads on 2 cores left one core idle part of the time (see
``benchmarks/README.md``).

Where the pieces live: :mod:`~pipeline.streaming.plan` computes who serves what,
:mod:`~pipeline.streaming.sources` reads chunks (:mod:`~pipeline.streaming.subsets`
those of a fold, from its base split), :mod:`~pipeline.streaming.groups` loads
and recycles group buffers, :mod:`~pipeline.streaming.batches` recycles the memory of
batches that span two groups or are assembled;
this module runs the epoch and hands batches to the training loop.
"""

from __future__ import annotations

import os
import queue
import threading
import warnings
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.context import get_spawning_popen
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from pipeline.errors import StreamError
from pipeline.streaming.batches import BatchSlabs
from pipeline.streaming.cache import FETCH_REQUESTS, CacheStats
from pipeline.streaming.chunks import ArrayPool
from pipeline.streaming.elastic import (
    ElasticPlan,
    Lanes,
    consumed_steps,
    elastic_plan,
    elastic_served_order,
    LAYOUT,
    epoch_lanes,
    legacy_first_step,
    remaining_steps,
    step_intervals,
    worker_steps,
)
from pipeline.streaming.groups import BufferPool, Group, GroupLoader
from pipeline.streaming.shared import SharedChunks
from pipeline.streaming.plan import (
    WorkerPlan,
    batches_per_rank,
    check_batch_counts,
    resumed_share,
    served_order,
    shuffle_quality,
    worker_plan,
)

__all__ = ["AHEAD_BYTES", "AHEAD_GROUP_CHUNKS", "ORDER_KEYS", "QUEUE_BYTES", "Stream", "default_threads",
           "groups_ahead", "memory_bound", "reads_over_network", "saved_value", "uncounted_workers", "warn_continued",
           "warn_repeated"]

#: What an epoch's order depends on besides the seed, epoch, rank and world size: recorded
#: by :meth:`Stream.state_dict` and checked on loading a state saved mid-epoch.
ORDER_KEYS = ("batch_size", "buffer_chunks", "shuffle", "drop_last", "n_samples")


def saved_value(saved: Any, have: Any) -> Any:
    """A saved value read as this stream's (a state passed through JSON or YAML keeps
    ints and bools, one through other tools may hold strings or numpy scalars)."""
    if isinstance(have, bool):
        return saved if isinstance(saved, bool) else str(saved).lower() in ("1", "true")
    try:
        return type(have)(saved)
    except (TypeError, ValueError):
        return saved


def warn_continued(what: str, epoch: int, served: int, total: int) -> None:
    """Say that an iteration continues an epoch another iteration left (``break``).

    Continuing is the rule (a loop that stops and iterates again, and the resume of a
    state, go on where the epoch stands), but a loop that took a few batches to try
    the stream and then iterates to train would otherwise lose the batches it tried
    without a word.
    """
    warnings.warn(
        f"{what}: iterating again continues epoch {epoch}, which an earlier iteration left after {served} of its "
        f"{total} batches: this pass serves the {total - served} left. For a whole pass call set_epoch with "
        f"the next epoch first (set_epoch({epoch}) keeps the position), or load_state_dict({{'epoch': {epoch}, "
        "'batches_served': 0}) to serve this epoch again from its start; to continue it on purpose, "
        "load_state_dict(state_dict()) first", RuntimeWarning, stacklevel=3)


def uncounted_workers(what: str, workers: int, epoch: int, served: int, total: int) -> StreamError:
    """The refusal of ``state_dict()`` without ``batches_served=`` while ``workers``
    DataLoader workers serve the position it stands at.

    The workers iterate copies of the stream, so the batches the loop took from them
    are counted nowhere in this process: its own count (0, or a loaded state's
    ``served``) would have a resume serve them again.
    """
    return StreamError(
        f"{what}: state_dict() without batches_served=, but {workers} DataLoader workers serve epoch {epoch} "
        f"from batch {served} of {total} (its torch() dataset's workers said so when they started), and this "
        "process cannot count the batches the loop took from them: pass batches_served=n, the batches the loop "
        f"took this epoch ({served} to {total}, those before a resume included; {total} after the whole epoch), "
        f"or call set_epoch({epoch + 1}) first to save the next epoch's start")


def warn_loader_again(what: str, epoch: int) -> None:
    """Say, from a DataLoader worker, that the loader iterates again from where
    its previous iteration began: the stream did not move since (no ``set_epoch``, no
    ``load_state_dict``), so its workers serve epoch ``epoch`` again from there, all of
    it even after a ``break`` (the workers cannot count what the loop took), where a
    loop in one process continues the epoch (:func:`warn_continued`)."""
    warnings.warn(
        f"{what}: a DataLoader iterates epoch {epoch} again from where its previous iteration began (the stream did "
        f"not move since): its workers serve it again, whole, even after a break. Call set_epoch({epoch + 1}) before "
        f"each epoch's loop; after a break, load_state_dict(state_dict(batches_served=n, num_workers=k)) with the "
        f"loop's count continues the epoch; set_epoch({epoch}) first repeats it on purpose, which silences this",
        RuntimeWarning, stacklevel=2)


def warn_repeated(epoch: int) -> None:
    """Say that an iteration serves again the epoch the previous one finished.

    An epoch's order follows its number, and only ``set_epoch`` changes it: a loop
    ``for epoch in range(3): for xb, yb in s`` would train every epoch on the one order,
    which is rarely what it means. Said once per stream (a validation stream iterated
    the same way every epoch would repeat it); not when the caller chose the epoch
    (``set_epoch``, ``load_state_dict``), nor without shuffling, whose order is the same
    in every epoch anyway.
    """
    warnings.warn(
        f"stream: iterating again serves epoch {epoch} again, in the same order as the pass that just finished it: "
        f"call set_epoch({epoch + 1}) before each new epoch for a new order (set_epoch({epoch}) to repeat this one "
        "on purpose, which silences this)", RuntimeWarning, stacklevel=3)


#: Chunks a group holds at the default ``buffer_chunks``: ``prefetch`` counts groups of
#: at least this many chunks (see :func:`groups_ahead`).
AHEAD_GROUP_CHUNKS = 4


#: Bytes of groups read ahead at most (beyond the groups a batch takes at once): the
#: counts of :func:`groups_ahead` keep the read threads' queue full for chunks of a few
#: MiB, and with chunks of 64 MiB they held half a GB ahead for no more speed.
AHEAD_BYTES = 256 << 20


#: Bytes of batches queued for the training loop beyond two (see ``Stream.prefetch_batches``).
QUEUE_BYTES = 64 << 20


def groups_ahead(prefetch: int, buffer_chunks: int, batch_groups: int = 1, group_bytes: int = 0) -> int:
    """Groups read ahead for ``prefetch`` at ``buffer_chunks`` chunks per group: smaller
    groups are read further ahead, so that as many chunks are queued as ``prefetch``
    groups of :data:`AHEAD_GROUP_CHUNKS` chunks hold. With 2-chunk groups, two groups
    ahead left the read threads idle whenever the loop fell a few batches behind (the
    comparison is in ``benchmarks/README.md``); memory, ``(3 + groups) * buffer_chunks``
    chunks, stays below the default's.

    A batch spanning ``batch_groups`` groups takes them all at once, so that many more
    less one are read ahead: with two groups ahead and batches of two groups, the read
    threads had nothing queued while the producer waited for a batch's second group.

    Given ``group_bytes`` (a group's bytes, over the arrays held in buffers), these
    additions hold at most :data:`AHEAD_BYTES` (never fewer than ``prefetch`` groups or
    one batch's groups): counted in groups alone, large chunks and large batches multiplied the memory
    read ahead (8 groups of 64 MiB for 1-chunk groups, and a batch's groups on top).
    """
    if prefetch <= 0:
        return prefetch
    extra = max(0, batch_groups - 1)
    if buffer_chunks >= AHEAD_GROUP_CHUNKS:
        ahead = prefetch + extra
    else:
        ahead = max(prefetch, -(-prefetch * AHEAD_GROUP_CHUNKS // max(1, buffer_chunks))) + extra
    if group_bytes > 0:
        ahead = min(ahead, max(prefetch, batch_groups, AHEAD_BYTES // group_bytes))
    return ahead


def memory_bound(*, sample_bytes: int, share_samples: int, group_samples: int, batch_size: int, ahead: int,
                 queued_batches: int = 4, chunk_samples: int = 0, read_threads: int = 0) -> int:
    """The most bytes of batch memory a stream holds (group buffers, copied batches and
    chunks being decoded), per rank or DataLoader worker process, while its loop keeps
    no batch.

    ``min(share, (ahead + 2 + viewed) * group) + 2 * batch + decoding``, in samples
    times ``sample_bytes``: ``group`` is ``group_samples`` (``buffer_chunks`` times the
    longest chunk) samples, ``batch`` is ``batch_size`` samples, ``share`` is
    ``share_samples`` (the epoch's samples of this rank or worker), ``ahead`` the groups
    read ahead (``Stream.prefetch``) and ``viewed = max(1, ceil((queued_batches + 2) *
    batch / group))`` the groups that the batches queued for the loop, held by it and
    being cut still view. The two batches are those copied where a batch spans the end
    of the ring of group buffers. ``decoding = (read_threads + 1) * chunk_samples``: a
    chunk that is not decoded straight to its places is decoded whole first, into
    memory reused from one chunk to the next, one per read thread at a time, and one
    more for the shorter last chunk's shape (0 when not given: the group buffers alone).

    Not counted: the memory of the interpreter, the libraries and the stream's threads
    themselves (stacks, the allocator's per-thread arenas, Python objects), which does
    not grow with these settings but comes on top of the bound in a process's resident
    memory (``RssAnon``), tens of MiB at most; and the chunk files kept mapped (clean
    page-cache pages, up to ``pipeline.stream``'s ``keep_mapped``).
    """
    viewed = max(1, -(-(queued_batches + 2) * batch_size // max(1, group_samples)))
    rows = min(share_samples, (ahead + 2 + viewed) * group_samples)
    decoding = (read_threads + 1) * chunk_samples if chunk_samples and read_threads else 0
    return int((rows + 2 * batch_size + decoding) * sample_bytes)


def _sample_bytes(source: Any, names: Sequence[str], *, assembled: bool = False) -> int:
    """Bytes of one sample over the arrays held in group buffers (not assembled ones),
    or with ``assembled`` over the arrays assembled per batch (virtual windows)."""
    total = 0
    for n in names:
        if source.assembled(n) != assembled:
            continue
        tail, dtype = source.sample_shape(n)
        total += int(np.prod(tail, dtype=np.int64)) * np.dtype(dtype).itemsize
    return total


def default_threads(cpus: int | None, remote: bool) -> int:
    """The read threads of a stream that was given no ``threads``.

    One per core (at most 32) decodes a local store's chunks as fast as the cores
    allow. A remote store read without the node-local cache sends one request per
    chunk object from a read thread, which then waits for its round trip: with one
    thread per core, two cores kept two requests in flight, and an epoch cost a round
    trip per object. So such a store gets at least as many threads as the cache's
    fetcher keeps requests in flight (:data:`~pipeline.streaming.cache.FETCH_REQUESTS`):
    waiting threads cost no CPU.

    Parameters
    ----------
    cpus
        The cores of the machine (``os.cpu_count()``; None counts as 2).
    remote
        Whether the stream reads a remote store's objects without a cache
        (:func:`reads_over_network`).

    Returns
    -------
    int
        ``min(32, cpus)``, or for a remote store at least ``FETCH_REQUESTS``.
    """
    local = min(32, cpus or 2)
    return max(local, FETCH_REQUESTS) if remote else local


def reads_over_network(source: Any) -> bool:
    """Whether ``source`` (or, for a fold, its base split) reads the chunk objects of a
    remote store one request each, without the node-local cache: a zarr array whose
    store is an fsspec file system other than the local disk or memory."""
    while source is not None:
        if getattr(source, "cache", None) is not None:
            return False  # the cache's fetch thread keeps the requests in flight
        arrays = [getattr(r, "array", None) for r in (getattr(source, "readers", None) or {}).values()]
        arrays += list((getattr(source, "arrays", None) or {}).values())
        if any(_remote_array(a) for a in arrays):
            return True
        source = getattr(source, "base", None)
    return False


def _remote_array(array: Any) -> bool:
    """Whether ``array`` is a zarr array of a store reached over the network."""
    store = getattr(getattr(array, "store_path", None), "store", None)
    protocol = getattr(getattr(store, "fs", None), "protocol", None)
    if protocol is None:
        return False  # a local, zip or memory store of zarr's own, or arrays read without zarr
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    return not set(protocols) & {"file", "local", "memory"}


def _window_reader(source: Any, name: str) -> Any:
    """The :class:`~pipeline.streaming.virtual.VirtualWindowReader` behind assembled
    array ``name`` (a fold's source reads through its base split's); None if none."""
    while source is not None:
        reader = (getattr(source, "readers", None) or {}).get(name)
        if reader is not None and hasattr(reader, "max_piece_rows"):
            return reader
        source = getattr(source, "base", None)
    return None


class Stream:
    """Shuffled, aligned batches of one split, one epoch per iteration.

    Use :func:`stream` to make one. ``len(s)`` is this rank's batches per epoch; every
    rank yields the same number, and across ranks and DataLoader workers every sample is
    served exactly once per epoch (with ``drop_last=False``). With ``global_batch_size``
    the epoch is a sequence of global steps that does not depend on the world size
    (:mod:`~pipeline.streaming.elastic`), and a state resumes on any world size.
    """

    def __init__(self, source: Any, *, names: Sequence[str], batch_size: int, shuffle: bool, seed: int,
                 buffer_chunks: int, drop_last: bool, rank: int, world_size: int, prefetch: int,
                 threads: int | None, read_niceness: int = 5, follow: bool = False,
                 global_batch_size: int | None = None):
        self.source = source
        self.follow = follow
        self.names = tuple(names)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.buffer_chunks = buffer_chunks
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.prefetch = groups_ahead(prefetch, buffer_chunks, 1, self._group_bytes(source, names, buffer_chunks))
        self.threads = threads or default_threads(os.cpu_count(), reads_over_network(source))
        self.read_niceness = read_niceness
        # Batches queued for the loop: four, or fewer where four batches would hold more
        # than QUEUE_BYTES. A queued batch is a view that keeps its groups' buffers from
        # reuse, so four batches of 64 MiB kept 384 MiB of groups alive (with the one
        # held and the one being cut); views cost nothing to make, and two queued
        # suffice to cover a wait for a group.
        # Assembled windows count too: each queued batch of them is a copy of its own.
        row = _sample_bytes(source, names) + _sample_bytes(source, names, assembled=True)
        self.prefetch_batches = max(2, min(4, QUEUE_BYTES // max(1, batch_size * row)))
        self.epoch = 0
        self._served = 0  # batches served in the current epoch, for state_dict
        # Where this process's latest loop began in the epoch: a count saved below
        # _served but not below this is the loop's own (batches fetched, not trained on).
        self._iter_start = 0
        # The stream's own iteration stopped inside the epoch (a break): the next one
        # continues the epoch, and says so (warn_continued).
        self._cut_short = False
        # Elastic order (global_batch_size): the steps done before the iteration in
        # progress, as [start, stop) runs, and how many DataLoader workers serve the
        # batches counted beyond them (None: those of the next iteration).
        self.global_batch_size = global_batch_size
        self._done: list[list[int]] = []
        self._served_workers: int | None = None
        self._lanes_cache: tuple[tuple[int, int], Lanes] | None = None
        self._quality_epoch: int | None = None  # the last epoch served whole, from its start
        # The epoch this process's iteration last finished, until the next move: iterating
        # it again serves the same order (warn_repeated, once per stream).
        self._finished: int | None = None
        self._repeat_warned = False
        # Moves by set_epoch and load_state_dict, counted: an adapter that holds an
        # iteration open (keras.py) sees that the caller moved the stream under it.
        self._moves = 0
        # The board through which this process's set_epoch and load_state_dict reach the
        # copies of persistent DataLoader workers (set by torch.py), and the board
        # version this copy follows.
        self._board: Any = None
        self._board_seen = 0
        self.n_samples = int(sum(source.lengths))
        if self.n_samples < world_size:
            raise StreamError(f"{self.n_samples} samples cannot be shared among {world_size} ranks")
        if self._lanes() is None:  # (an impossible elastic split is reported now, not at the first batch)
            check_batch_counts(self.n_samples, world_size, batch_size, drop_last)
            # Batches larger than a group take several groups at once (an elastic plan's
            # groups hold whole batches).
            group = buffer_chunks * max(source.lengths, default=0)
            self.prefetch = groups_ahead(prefetch, buffer_chunks, -(-batch_size // max(1, group)),
                                         self._group_bytes(source, names, buffer_chunks))
        self._init_process_state()

    @staticmethod
    def _group_bytes(source: Any, names: Sequence[str], buffer_chunks: int) -> int:
        """Bytes of one full group: its buffers, and for assembled arrays (virtual
        windows) the feature rows and ends it holds, estimated without reading them (a
        chunk's span of steps taken as one feature chunk's rows: the build writes the
        features in chunks of the steps one chunk of windows spans)."""
        samples = buffer_chunks * max(source.lengths, default=0)
        total = samples * _sample_bytes(source, names)
        for n in names:
            reader = _window_reader(source, n) if source.assembled(n) else None
            if reader is not None:
                # Here, not at the top: virtual.py imports the window code, and with it
                # dask, which a stream of stored arrays never needs.
                from pipeline.streaming.virtual import window_group_bytes

                total += window_group_bytes(samples=samples, pieces=buffer_chunks,
                                            piece_rows=reader.features.rows + reader.halo, row_bytes=reader.row_bytes)
        return total

    def memory_bound(self) -> int:
        """The most bytes of batch memory this stream holds per process while its loop
        keeps no batch (:func:`memory_bound` of its settings, plus for virtual windows
        :func:`~pipeline.streaming.virtual.window_memory`: the groups' feature rows and
        ends, the pieces being read and the assembled batches; an estimate before the
        first iteration of a stream with ``global_batch_size``). The process's own
        memory (interpreter, libraries, threads) comes on top: see :func:`memory_bound`.

        For virtual windows the first call reads every chunk of the window ends once,
        to measure the widest chunk's span of steps (kept for later calls)."""
        capacity, plan = self._group_rows(), self.plan(0, 1)
        share = int(sum(p.hi - p.lo for p in plan.pieces))
        stored = memory_bound(sample_bytes=_sample_bytes(self.source, self.names), share_samples=share,
                              group_samples=capacity, batch_size=self.batch_size, ahead=self.prefetch,
                              queued_batches=self.prefetch_batches, chunk_samples=max(self.source.lengths, default=0),
                              read_threads=self.threads)
        return stored + self._window_bound(plan, capacity, share)

    def _window_bound(self, plan: WorkerPlan | ElasticPlan, group: int, share: int) -> int:
        """What assembled arrays (virtual windows) add to :meth:`memory_bound`: see
        :func:`~pipeline.streaming.virtual.window_memory`. Their batches are copies,
        alive while queued for the loop (``prefetch_batches``), held by it, waiting for
        the queue and being cut (3), and waiting to be taken from the assembling
        threads (``2 * gather + 1`` when several assemble)."""
        names = [n for n in self.names if self.source.assembled(n)]
        if not names:
            return 0
        from pipeline.streaming.virtual import window_group_bytes, window_memory

        pieces = max((b - a for a, b in plan.groups), default=0)
        viewed = max(1, -(-(self.prefetch_batches + 2) * self.batch_size // max(1, group)))
        groups = min(self.prefetch + 2 + viewed, -(-share // max(1, group)) + 1)
        gather = self._gather_threads()
        batches = self.prefetch_batches + 3 + (2 * gather + 1 if gather > 1 else 0)
        total = 0
        for n in names:
            reader = _window_reader(self.source, n)
            tail, dtype = self.source.sample_shape(n)
            window = int(np.prod(tail, dtype=np.int64)) * np.dtype(dtype).itemsize
            group_bytes = window_group_bytes(samples=group, pieces=pieces, piece_rows=reader.max_piece_rows(),
                                             row_bytes=reader.row_bytes)
            total += window_memory(groups=groups, group_bytes=group_bytes, read_threads=self._read_threads(),
                                   read_bytes=reader.read_bytes(), batches=batches, batch_size=self.batch_size,
                                   window_bytes=window, gather_threads=gather, cache_bytes=reader.kept.max_bytes)
        return total

    def _read_threads(self) -> int:
        """Threads reading chunks. Reads of virtual windows are small chunks (window
        ends, per-step features) whose Python overhead weighs more than their decoding:
        more read threads only fight over the GIL (one read thread per two cores
        streamed faster than two). Half the threads read, the other half assemble."""
        return max(1, self.threads // 2) if self._assembled() else self.threads

    def _gather_threads(self) -> int:
        """Threads assembling batches of virtual windows (1 otherwise, the batch thread
        itself): half the threads (a second assembling thread per core slowed each
        assembly, competing with the first for the core's cache), but no more than
        assemble :data:`QUEUE_BYTES` of batches at once. Each keeps two batches in
        flight, and with long windows a batch is hundreds of MB: on 16 threads, eight
        assemblers would hold 17 batches, 5 GiB of batches of 4,096 windows of 80 KiB
        that nobody had asked for yet."""
        if not self._assembled():
            return 1
        batch = self.batch_size * _sample_bytes(self.source, self.names, assembled=True)
        return max(1, min(self.threads // 2, QUEUE_BYTES // max(1, batch)))

    def peak_buffer_bytes(self) -> int:
        """The most bytes of group buffers in use at once so far, plus the batch memory made
        for copied batches (for tests and diagnostics; compare :meth:`memory_bound`)."""
        pool = self._pool
        return (0 if pool is None else pool.peak_bytes) + sum(slabs.nbytes for slabs in self._slabs.values())

    def _group_rows(self) -> int:
        """Samples a group holds at most: ``buffer_chunks`` whole chunks, or with
        ``global_batch_size`` a group of global steps (this rank's share of each)."""
        lanes = self._lanes()
        if lanes is not None:
            return lanes.group_steps * self.batch_size
        return self.buffer_chunks * max(self.source.lengths, default=0)

    def _share_rows(self) -> int:
        """Samples of this rank's epoch (the first worker's share of a DataLoader has no more)."""
        plan = self.plan(0, 1)
        return int(sum(p.hi - p.lo for p in plan.pieces))

    def _init_process_state(self) -> None:
        """Buffers and the next epoch's early loader: per process, never pickled or forked."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pool: BufferPool | None = None
        self._ahead: tuple[tuple, GroupLoader] | None = None  # (key, loader) started early
        self._last_epoch: int | None = None  # epoch of the previous iteration, to guess the next
        self._epoch_step = 1
        self._slabs: dict[str, BatchSlabs] = {}  # batch memory per array, reused once dropped
        # Chunks an elastic plan reads in pieces for several groups, decoded once and held
        # until their last piece is read: about two groups' chunks per group in memory,
        # per array.
        self._shared_arrays = ArrayPool(keep=2 * len(self.names) * self.buffer_chunks * (self.prefetch + 2))
        # The loop of this process serving now (its batches), and a number that a later
        # loop, set_epoch or load_state_dict moves on: a loop resumed after that stops,
        # saying why (_stopped_why), instead of serving batches counted for another.
        self._open: Iterator[tuple[np.ndarray, ...]] | None = None
        self._ticket = 0
        self._stopped_why = ""

    def __getstate__(self) -> dict:
        # Sent to DataLoader workers (spawn): the source reopens itself; buffers, threads
        # and locks stay behind. The shared board goes only to a process being spawned,
        # the one place its shared memory can travel; any other copy (a pickle, a
        # deepcopy) is a stream of its own that follows no board.
        state = dict(self.__dict__)
        for key in ("_pid", "_lock", "_pool", "_ahead", "_last_epoch", "_epoch_step", "_slabs", "_shared_arrays",
                    "_open", "_ticket", "_stopped_why"):
            state.pop(key, None)
        if get_spawning_popen() is None:
            state["_board"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def close(self) -> None:
        """Stop the next epoch's early read, if one runs, free the group buffers and
        unmap the chunk files kept mapped.

        Optional: the stream holds at most a few group buffers, two idle threads and
        the mappings of files it read between epochs; this gives them back at once. The
        stream can still be iterated afterwards.
        """
        self._check_process()
        with self._lock:
            ahead, self._ahead, self._pool = self._ahead, None, None
            self._shared_arrays = ArrayPool(keep=self._shared_arrays.keep)
        if ahead is not None:
            ahead[1].close()
        release = getattr(self.source, "release", None)
        if release is not None:
            release()

    def stop_read_ahead(self) -> None:
        """Stop the next epoch's early read, waiting for a read in progress; its buffers
        stay with the stream for the next epoch, which then starts by reading its
        first group.

        For a loop that does other heavy work before its next epoch, and for
        benchmarks: nothing this stream reads then runs beside what is timed next.
        """
        self._check_process()
        self._adopt(None)

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _check_process(self) -> None:
        """A forked child (a DataLoader worker) inherits the parent's buffers and its
        early loader, whose threads did not survive the fork: start afresh."""
        if getattr(self, "_pid", None) != os.getpid():
            self._init_process_state()

    # -- bookkeeping ------------------------------------------------------------------

    @property
    def shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per array: the shape of one sample and the dtype (for building a model)."""
        return {n: self.source.sample_shape(n) for n in self.names}

    def __len__(self) -> int:
        lanes = self._lanes()
        if lanes is not None:
            return lanes.steps
        return batches_per_rank(self.n_samples, self.world_size, self.batch_size, self.drop_last)

    def _lanes(self) -> Lanes | None:
        """The elastic order's lanes and steps (None without ``global_batch_size``); they
        follow the source, whose lengths a new version changes."""
        if self.global_batch_size is None:
            return None
        key = (self.n_samples, max(self.source.lengths, default=0))
        cached = self._lanes_cache
        if cached is None or cached[0] != key:
            lanes = epoch_lanes(self.n_samples, global_batch_size=self.global_batch_size, drop_last=self.drop_last,
                                longest_chunk=key[1], buffer_chunks=self.buffer_chunks)
            lanes.check_world_size(self.world_size)
            cached = self._lanes_cache = (key, lanes)
        return cached[1]

    @property
    def version(self) -> int | None:
        """The store version served (``None`` for arrays and foreign zarr groups)."""
        return getattr(self.source, "version", None)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration follows; with ``follow``, a
        new epoch also moves to the store's newest version.

        Called inside a loop over the stream (rather than before each epoch's loop), it
        stops that loop: resumed, the loop raises :class:`StreamError`, instead of
        serving batches of one epoch counted as another's (a ``state_dict`` saved then
        resumed wrong).
        """
        if epoch != self.epoch:
            self._stop_open(f"set_epoch({int(epoch)}) was called while it served; call set_epoch before each "
                            "epoch's loop, not inside it")
            self._served, self._cut_short, self._iter_start = 0, False, 0
            self._done, self._served_workers = [], None
            if self.follow and hasattr(self.source, "at_version"):
                self._switch(self.source.at_version(None))
        self.epoch = int(epoch)
        self._finished = None  # the caller chose the epoch: serving it again is meant
        self._publish()

    def _switch(self, source: Any) -> None:
        """Serve ``source`` (the same split at another version) from the next iteration."""
        if source.version == self.version:
            return
        n = int(sum(source.lengths))
        if n < self.world_size:
            raise StreamError(f"{n} samples cannot be shared among {self.world_size} ranks")
        if self.global_batch_size is None:
            check_batch_counts(n, self.world_size, self.batch_size, self.drop_last)
        self.close()  # the next epoch's early read was of the old version
        self.source, self.n_samples = source, n

    def state_dict(self, *, batches_served: int | None = None, num_workers: int | None = None) -> dict[str, Any]:
        """Where this stream is: enough to resume mid-epoch (and the store version it
        serves, which a resumed stream serves too).

        Parameters
        ----------
        batches_served
            For a loop over a DataLoader, whose workers iterate copies of the stream:
            the batches the loop consumed this epoch (those before a resume included).
            By default, what this stream's own iteration counted (a plain loop, Keras,
            ``DataLoader(num_workers=0)``), which is refused while DataLoader workers
            serve where the stream stands (see Raises).
        num_workers
            With ``batches_served``: the loader's ``num_workers``. Optional: the workers
            of this stream's ``torch()`` dataset report how many they are, and a count
            served by workers that did not (or before the stream's last move) is
            refused, since a resume on another number of workers would serve some
            batches twice and others never.

        Returns
        -------
        dict
            ``epoch``, ``batches_served``, ``seed``, ``rank``, ``world_size`` (and
            ``version``), and what the order depends on, checked on loading:
            ``batch_size``, ``buffer_chunks``, ``shuffle``, ``drop_last`` and
            ``n_samples``; ``num_workers``, the DataLoader workers that served the
            batches counted (beyond ``done``), once given, reported by the workers, or
            once this process iterated the stream (1: a plain loop, Keras or
            ``DataLoader(num_workers=0)``, one server). With ``global_batch_size`` also ``global_batch_size``,
            ``steps_per_epoch`` (checked on loading), ``elastic_layout`` (how the
            epoch's last steps are laid out: a state without it is refused mid-epoch
            where that changed the steps it served) and ``done``, the
            global steps served before the iteration in progress as ``[start, stop)``
            runs; ``rank``,
            ``world_size`` and ``batch_size`` (this rank's share of a step) are then for
            information, not checked.

        Raises
        ------
        StreamError
            Without ``batches_served``, when the workers of this stream's ``torch()``
            dataset reported serving the epoch from where the stream stands (since its
            last ``set_epoch`` or ``load_state_dict``): this process cannot count the
            batches the loop took from them, and its own count would have a resume
            serve them again. Pass ``batches_served=n``, or, between epochs, call
            ``set_epoch`` with the next epoch first: its start needs no count. With
            ``batches_served``, when no worker count is known for a count mid-epoch
            (see ``num_workers``), or the count is below the batches served before
            this iteration began.
        """
        if batches_served is None and (workers := self._reported_workers()) is not None:
            # Refused in this process, not in the workers: a loader whose workers raise
            # takes torch seconds per worker to shut down.
            raise uncounted_workers("stream", workers, self.epoch, self._served, len(self))
        if batches_served is None and self._served == 0 and self._finished == self.epoch:
            # The epoch was served whole, and its count is back at 0: the state resumes
            # the start of this epoch (the README says so), which a checkpoint at an
            # epoch's end rarely means.
            warnings.warn(f"stream: state_dict() after epoch {self.epoch} was served whole saves its start "
                          f"(batches_served=0): a resume serves epoch {self.epoch} again; call "
                          f"set_epoch({self.epoch + 1}) before saving to resume at the next epoch",
                          RuntimeWarning, stacklevel=2)
        served = self._served if batches_served is None else int(batches_served)
        if served < self._iter_start:
            # A count of the loop's own batches since a resume would skip back and
            # serve the batches between the two counts again. Below what this loop
            # fetched, but not below where it began, the loop trained on fewer batches
            # than it took (a step budget, a preemption flag): served again on resume.
            raise StreamError(f"state_dict: batches_served counts this epoch's batches, at least the "
                              f"{self._iter_start} served before this iteration began; "
                              f"got {served}")
        if served > len(self):
            raise StreamError(f"state_dict: batches_served must be 0 to {len(self)} (this epoch's batches), "
                              f"got {served}")
        if num_workers is None and served > self._served:
            # The DataLoader's workers said how many they are (see served_by).
            num_workers = self._reported_workers()
            if num_workers is None and self._served_workers is None and served < len(self):
                # Batches served by nobody this stream knows of: a resume on another
                # worker count would take its turns over other shares (a whole epoch
                # leaves nothing to share).
                raise StreamError(f"state_dict(batches_served={served}): this stream cannot tell how many "
                                  "DataLoader workers served those batches (its torch() dataset's workers say so "
                                  "when they start; these did not, or the stream moved since): pass "
                                  "num_workers= (the loader's num_workers, 0 for a loop in this process)")
        state: dict[str, Any] = {"epoch": self.epoch, "batches_served": served, "seed": self.seed,
                                 "rank": self.rank, "world_size": self.world_size,
                                 **{key: getattr(self, key) for key in ORDER_KEYS}}
        if self.global_batch_size is not None:
            done, workers = self._done, self._served_workers
            if num_workers is not None:
                workers = max(1, int(num_workers))
                if self._served_workers not in (None, workers):
                    # The loader's iteration shared anew the steps left after the batches
                    # other workers served (see iter_resumed): those are done now.
                    left = self._remaining(workers)
                    done = step_intervals(np.setdiff1d(np.arange(len(self)), left, assume_unique=True))
                # else: the loader went on with the turns of the loop that served the
                # state, so the steps done before it and the count still say what it took.
            state.update(global_batch_size=self.global_batch_size, steps_per_epoch=len(self),
                         elastic_layout=LAYOUT, done=[list(p) for p in done])
            if workers is not None:
                state["num_workers"] = workers
        elif num_workers is not None or self._served_workers is not None:
            # Recorded whoever served: a loader of another number of workers would take
            # its turns over other shares, serving some batches twice and others never.
            state["num_workers"] = max(1, int(num_workers if num_workers is not None else self._served_workers))
        if self.version is not None:
            state["version"] = self.version
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields exactly the batches not yet served, of the
        store version the state was saved on.

        Without ``global_batch_size`` the state must come from the same rank and world
        size, and a DataLoader must have as many workers as the one that served it. With
        it, a state saved by any rank resumes any rank, on any world size the global
        batch allows and any number of workers.

        Raises
        ------
        StreamError
            When the state was saved mid-epoch by a stream whose order differs from this
            one's (another seed, batch size, ``buffer_chunks``, ``shuffle``,
            ``drop_last``, or another number of samples: a store that grew or shrank):
            resuming would skip and repeat samples. States saved before these keys were
            recorded are checked on the keys they hold.
        """
        self._check_identity(state)
        self._stop_open("load_state_dict was called while it served; load a state before the loop that resumes it")
        source = self.source
        if state.get("version") is not None and hasattr(self.source, "at_version"):
            source = self.source.at_version(int(state["version"]))
        # The samples are those of the version the state names, checked before switching
        # to it, so that a state refused for its samples leaves the stream on its version.
        self._check_samples(state, int(sum(source.lengths)))
        self._check_layout(state, source)
        if source is not self.source:
            self._switch(source)
        served = int(state["batches_served"])
        workers = state.get("num_workers")
        workers = None if workers is None else max(1, int(workers))
        if self.global_batch_size is not None:
            if "steps_per_epoch" in state and int(state["steps_per_epoch"]) != len(self):
                raise StreamError(f"state_dict was saved with steps_per_epoch={state['steps_per_epoch']}, this "
                                  f"stream has {len(self)} (another store version, drop_last or global batch)")
            done = [[int(a), int(b)] for a, b in state.get("done", ())]
            left = remaining_steps(len(self), done)
            if not len(self) - left.size <= served <= len(self):
                raise StreamError(f"state_dict: batches_served={served}, but {len(self) - left.size} steps are "
                                  f"done and {left.size} left")
            # The steps the loop took beyond ``done`` stay counted by the workers that
            # served them: a loader of as many workers goes on with their turns.
            self.epoch, self._served, self._done, self._served_workers = int(state["epoch"]), served, done, workers
            self._iter_start = served
        else:
            if not 0 <= served <= len(self):
                raise StreamError(f"state_dict: batches_served must be 0 to {len(self)}, got {served}")
            self.epoch, self._served, self._served_workers = int(state["epoch"]), served, workers
            self._iter_start = served
        self._cut_short = False  # where to go on was said: no warning
        self._finished = None
        self._publish()

    def _check_identity(self, state: Mapping[str, Any]) -> None:
        """Refuse a state saved by a stream whose order differs from this one's, or by a
        mix (whose batches are counted in its own steps)."""
        if "sources" in state or "counts" in state:
            raise StreamError("state_dict was saved by a pipeline.mix (it has sources and counts); load it into "
                              "the same mix, not into one of its streams")
        elastic = self.global_batch_size is not None
        keys = ("seed", "global_batch_size", "buffer_chunks") if elastic else ("seed", "rank", "world_size")
        for key in keys:
            if key in state and int(state[key]) != getattr(self, key):
                fix = ""
                if key in ("rank", "world_size"):
                    # Each rank's order is its own: rank 0's state says nothing of rank 1's.
                    fix = ("; without global_batch_size a state resumes only the rank (and world size) that saved "
                           "it: save each rank's own state_dict() (a file per rank) and load it on that rank, or "
                           "stream with global_batch_size=, whose state any rank loads on any world size")
                raise StreamError(f"state_dict was saved with {key}={state[key]}, this stream has "
                                  f"{getattr(self, key)}{fix}")
        if not int(state.get("batches_served", 0)):
            return  # nothing served: any epoch start is the same
        # The order of an epoch, and so which batches the count skips, depends on these
        # too; the per-rank batch of a global batch follows the world size and is not one
        # of them.
        for key in ("shuffle", "drop_last") if elastic else ("batch_size", "buffer_chunks", "shuffle", "drop_last"):
            if key in state and saved_value(state[key], getattr(self, key)) != getattr(self, key):
                raise StreamError(f"state_dict was saved mid-epoch with {key}={state[key]!r}, this stream has "
                                  f"{key}={getattr(self, key)!r}; resuming would skip and repeat samples: resume "
                                  f"with {key}={state[key]!r}")
        if elastic and "global_batch_size" not in state and ("world_size" in state or "rank" in state):
            raise StreamError("state_dict was saved by a stream without global_batch_size, whose order depends on "
                              "its rank and world size; resume it with a stream like the one that saved it")
        if not elastic and "global_batch_size" in state:
            raise StreamError(f"state_dict was saved by a stream with global_batch_size={state['global_batch_size']}"
                              "; this stream has none: pass the same global_batch_size to resume it")

    def _check_samples(self, state: Mapping[str, Any], n_samples: int) -> None:
        """Refuse a state saved mid-epoch on another number of samples (a store that
        was appended to, or another store): its epoch's order is another one."""
        if "n_samples" not in state or not int(state.get("batches_served", 0)):
            return
        if int(state["n_samples"]) != n_samples:
            where = f" at version {state['version']}" if state.get("version") is not None else ""
            raise StreamError(f"state_dict was saved mid-epoch with n_samples={state['n_samples']}, this stream "
                              f"has n_samples={n_samples}{where}; the samples changed since (an append, or "
                              "another store), and resuming would skip and repeat samples: finish the epoch on "
                              "the samples it was saved on, or start a new epoch (set_epoch)")

    def _check_layout(self, state: Mapping[str, Any], source: Any) -> None:
        """Refuse a mid-epoch state of an earlier elastic layout (no ``elastic_layout``)
        that served steps this layout fills with other samples: the rest of the epoch
        would skip some samples and repeat others. Its steps before those resume exactly.
        """
        if self.global_batch_size is None or "elastic_layout" in state:
            return
        lengths = source.lengths
        lanes = epoch_lanes(int(sum(lengths)), global_batch_size=self.global_batch_size, drop_last=self.drop_last,
                            longest_chunk=max(lengths, default=0), buffer_chunks=self.buffer_chunks)
        first = legacy_first_step(lanes)
        served = int(state.get("batches_served", 0))
        if first is None or not 0 < served < lanes.steps:
            return
        left = remaining_steps(lanes.steps, [[int(a), int(b)] for a, b in state.get("done", ())])
        pending = served - (lanes.steps - left.size)
        if not 0 <= pending <= left.size:
            return  # refused, with the counts, by load_state_dict
        # The steps taken: those done, and those the loop's workers took beyond them.
        taken = np.setdiff1d(np.arange(lanes.steps), left, assume_unique=True)
        if pending:
            workers = max(1, int(state.get("num_workers") or 1))
            taken = np.concatenate([taken, consumed_steps(left, pending, workers, lanes.group_steps)])
        if int(taken.max()) >= first:
            raise StreamError(
                f"state_dict was saved mid-epoch by an earlier pipeline (no elastic_layout), whose last "
                f"{lanes.steps - first} global steps of this epoch hold other samples than they do now (the epoch "
                f"now ends with one short step), and it served some of them; resuming would skip and repeat "
                f"samples: finish epoch {state.get('epoch')} with the pipeline that saved it, or start the next "
                "epoch (set_epoch)")

    def _publish(self) -> None:
        """After a move (set_epoch, load_state_dict): count it, and show the persistent
        DataLoader workers' copies where the next iteration starts (see
        :mod:`pipeline.streaming.torch`)."""
        self._moves += 1
        board = self._board
        if board is not None and board.owned():
            self._board_seen = board.publish(self.epoch, self._served, self._served_workers, self.version,
                                             self._done)

    def follow_board(self) -> None:
        """In a DataLoader worker: take up the latest position the main process
        published (a persistent worker's copy would otherwise keep the epoch it was
        made with)."""
        board = self._board
        got = None if board is None else board.read()
        if got is None or got.seq == self._board_seen:
            return
        if got.version is not None and hasattr(self.source, "at_version") and got.version != self.version:
            self._switch(self.source.at_version(got.version))
        self.epoch, self._served, self._served_workers = got.epoch, got.served, got.workers
        self._iter_start = self._served
        self._done = [list(p) for p in got.done]
        self._board_seen = got.seq

    def _remaining(self, num_workers: int) -> np.ndarray:
        """The global steps left at the start of an iteration by ``num_workers`` DataLoader
        workers: the steps not done, less those the batches counted beyond them took
        (served by ``_served_workers`` workers, or by these when not known)."""
        left = remaining_steps(len(self), self._done)
        pending = self._served - (len(self) - left.size)
        if pending:
            taken = consumed_steps(left, pending, self._served_workers or num_workers, self._lanes().group_steps)
            left = np.setdiff1d(left, taken, assume_unique=True)
        return left

    def cache_stats(self, epoch: int | None = None) -> CacheStats | None:
        """What ``epoch`` (default: the current one) read through the remote store's
        cache: hit rate and bytes fetched, the reads of this stream's DataLoader workers
        included; print it for a one-line report. None without a cache."""
        cache = getattr(getattr(self.source, "base", self.source), "cache", None)
        return None if cache is None else cache.stats(self.epoch if epoch is None else epoch)

    def quality(self) -> dict[str, float]:
        """Shuffle quality of the last epoch served whole by this stream's own iterator.

        Returns ``mean_distinct_chunks_per_batch`` (up to ``buffer_chunks``, more when a
        batch spans two groups) and ``spearman_position_vs_index``, the rank correlation
        between a sample's position in the epoch and its index in the store (near 0 when
        well shuffled). Empty before the first whole epoch. Recomputed from the plan, so
        serving batches pays nothing for it.
        """
        if self._quality_epoch is None:
            return {}
        plan = self.plan(epoch=self._quality_epoch)
        if isinstance(plan, ElasticPlan):
            chunks, index = elastic_served_order(plan, self.source.lengths)
        else:
            chunks, index = served_order(plan, self.source.lengths, seed=self.seed, epoch=self._quality_epoch,
                                         rank=self.rank, worker=0, shuffle=self.shuffle)
        return shuffle_quality(chunks, index, plan.batch_sizes)

    # -- iteration --------------------------------------------------------------------

    def plan(self, worker: int = 0, num_workers: int = 1, *, epoch: int | None = None,
             steps: np.ndarray | None = None) -> WorkerPlan | ElasticPlan:
        """What one DataLoader worker of this rank serves in ``epoch`` (default: the current
        one). With ``global_batch_size``, an :class:`~pipeline.streaming.elastic.ElasticPlan`
        of the global ``steps`` given, by default the worker's share of the whole epoch."""
        e = self.epoch if epoch is None else epoch
        lanes = self._lanes()
        if lanes is None:
            if steps is not None:
                raise StreamError("Stream.plan: steps are global steps, which only a stream with global_batch_size has")
            return worker_plan(
                self.source.lengths, seed=self.seed, epoch=e, shuffle=self.shuffle,
                batch_size=self.batch_size, drop_last=self.drop_last, rank=self.rank,
                world_size=self.world_size, worker=worker, num_workers=num_workers,
                buffer_chunks=self.buffer_chunks,
            )
        if steps is None:
            steps = worker_steps(np.arange(lanes.steps, dtype=np.int64), worker, num_workers, lanes.group_steps)
        return elastic_plan(self.source.lengths, lanes, steps=steps, seed=self.seed, epoch=e, shuffle=self.shuffle,
                            rank=self.rank, world_size=self.world_size)

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        """The rest of the current epoch: all of it, or what a resumed state, or an
        iteration stopped early (said by a RuntimeWarning), left of it.

        One loop at a time: a loop begun while another is open takes the epoch over
        where it stands, and the earlier loop, resumed, raises :class:`StreamError`
        (two loops at once served every batch twice, counted once).
        """
        self._check_process()
        self._stop_open("a later loop over the same stream took the epoch over (a stream serves one loop at a "
                        "time: open another pipeline.stream for a second loop, a validation loop among them)")
        if self._served and self._cut_short:
            warn_continued("stream", self.epoch, self._served, len(self))
        whole = self._served == 0
        self._iter_start = self._served
        if whole and self.shuffle and self._finished == self.epoch and not self._repeat_warned:
            self._repeat_warned = True
            warn_repeated(self.epoch)
        self.serving_in_process()
        ticket = self._ticket
        batches = self.iter_resumed(0, 1, read_ahead=True)
        self._open = batches
        try:
            for batch in batches:
                self._served += 1
                self._cut_short = True  # until the epoch's end
                yield batch
                if self._ticket != ticket:
                    raise StreamError(f"stream: this loop over epoch {self._stopped_why}")
        finally:
            if self._ticket == ticket:
                self._open = None
        self._end_of_epoch(whole)

    def _end_of_epoch(self, whole: bool) -> None:
        self._served, self._cut_short, self._iter_start = 0, False, 0
        self._done, self._served_workers = [], None
        self._finished = self.epoch
        if whole:
            self._quality_epoch = self.epoch

    def _stop_open(self, why: str) -> None:
        """Stop the loop of this process that is open, if any (see :meth:`__iter__`):
        its reads end now, and when resumed it raises, saying ``why``. A loop that had
        served its epoch's last batch has finished it."""
        self._check_process()
        batches = self._open
        if batches is None:
            return
        self._open = None
        self._ticket += 1
        self._stopped_why = f"{self.epoch} was stopped after {self._served} of its {len(self)} batches: {why}"
        try:
            batches.close()  # its read threads and buffers let go
        except ValueError:  # running in another thread: it stops at its next batch
            pass
        if self._served >= len(self):
            self._end_of_epoch(False)

    def served_by(self, num_workers: int, run: int = 0) -> None:
        """In a DataLoader worker, before its first batch: tell the main process that
        ``num_workers`` workers serve this iteration, so that its ``state_dict`` records
        them without ``num_workers=`` (see :mod:`pipeline.streaming.torch`). ``run``
        names the loader's iteration: one from a position another already served from
        is said (:func:`warn_loader_again`)."""
        board = self._board
        if board is not None and board.report(self._board_seen, max(1, int(num_workers)), run):
            warn_loader_again("stream", self.epoch)

    def _reported_workers(self) -> int | None:
        """The workers that reported serving from where this stream stands (None: none
        did since its last move)."""
        board = self._board
        return board.reported(self._board_seen) if board is not None and board.owned() else None

    def serving_in_process(self) -> None:
        """An iteration in this process begins: a plain loop, Keras, or a
        ``DataLoader(num_workers=0)``, one server that takes every batch in order (as a
        loader of one worker does). ``state_dict`` then records ``num_workers: 1``, so
        that a loader of other workers resumes its state exactly (``global_batch_size``)
        or refuses it, rather than take turns over shares this loop never had.

        A state served by other workers is left as it is: without ``global_batch_size``
        the iteration refuses it (:meth:`iter_resumed`)."""
        board = self._board
        if board is not None and board.owned():
            board.report(self._board_seen, 0)  # no DataLoader workers serve this iteration
        if self.global_batch_size is not None:
            # This iteration is the one in progress: what came before it is done.
            left = self._remaining(1)
            self._done = step_intervals(np.setdiff1d(np.arange(len(self)), left, assume_unique=True))
            self._served_workers = 1
        elif self._served_workers is None:
            self._served_workers = 1

    def iter_resumed(self, worker: int, num_workers: int, *, read_ahead: bool = False
                     ) -> Iterator[tuple[np.ndarray, ...]]:
        """One DataLoader worker's share of what is left of the epoch after
        :meth:`load_state_dict` (all of the epoch when nothing was served).

        Raises
        ------
        StreamError
            Without ``global_batch_size``, when the state was saved with another number
            of DataLoader workers.
        """
        num_workers = max(1, num_workers)
        if self.global_batch_size is not None:
            steps, share = self._resumed_steps(worker, num_workers)
            return self.iter_worker(share, num_workers, read_ahead=read_ahead, steps=steps)
        skip, share = 0, worker
        if self._served:
            if self._served_workers not in (None, num_workers):
                who = (f"{self._served_workers} DataLoader workers" if self._served_workers > 1 else
                       "1 server (a loop in one process: plain, Keras or DataLoader num_workers=0)")
                now = (f"{num_workers} DataLoader workers serve" if num_workers > 1 else
                       "one server does (a loop in one process, DataLoader num_workers=0, or one DataLoader worker)")
                raise StreamError(f"state_dict was saved while {who} served, here {now}; resuming on another number "
                                  "of workers needs global_batch_size")
            # The DataLoader took batches from the workers in turn: each share skips what
            # it delivered, and the turns go on where they stopped.
            counts = [len(self.plan(k, num_workers).batch_sizes) for k in range(num_workers)]
            share, skip = resumed_share(counts, self._served, worker)
        return self.iter_worker(share, num_workers, skip_batches=skip, read_ahead=read_ahead)

    def _resumed_steps(self, worker: int, num_workers: int) -> tuple[np.ndarray | None, int]:
        """With ``global_batch_size``: the global steps DataLoader worker ``worker`` of
        ``num_workers`` serves in this iteration (None: its share of the whole epoch),
        and the worker share they belong to.

        On as many workers as served the batches counted beyond the done steps, each
        worker goes on with a share of the loop that served them, in its turn: the rest
        comes in the order of an uninterrupted loop. On another number of workers (no
        uninterrupted loop to follow) the steps left are shared anew.
        """
        group_steps = self._lanes().group_steps
        if self._served_workers not in (None, num_workers):
            return worker_steps(self._remaining(num_workers), worker, num_workers, group_steps), worker
        left = remaining_steps(len(self), self._done)
        pending = self._served - (len(self) - left.size)
        if left.size == len(self) and not pending:
            return None, worker
        shares = [worker_steps(left, k, num_workers, group_steps) for k in range(num_workers)]
        share, skip = resumed_share([s.size for s in shares], pending, worker)
        return shares[share][skip:], share

    def iter_worker(self, worker: int, num_workers: int, *, skip_batches: int = 0, read_ahead: bool = False,
                    steps: np.ndarray | None = None) -> Iterator[tuple[np.ndarray, ...]]:
        """Batches of one DataLoader worker's share (all of them for ``0, 1``), after
        skipping its first ``skip_batches``; with ``global_batch_size``, ``steps`` names
        the global steps to serve instead (ascending).

        Batches are cut by a background thread into a short queue, so the consumer's
        ``next()`` only takes a ready batch: waiting for a group's reads, copying the
        batch that spans two groups and assembling virtual windows overlap the
        training step instead of adding to it. With ``read_ahead``, the
        next epoch's first group is read while this epoch's last group is served
        (``epoch + 1``, or the same epoch again when the previous iteration repeated its
        epoch), so the next epoch starts without waiting for its first chunks.
        """
        produced = self._produce(worker, num_workers, skip_batches=skip_batches, read_ahead=read_ahead, steps=steps)
        # Two C-level SimpleQueues instead of one bounded queue.Queue: a queue.Queue's
        # get runs its Condition bookkeeping in Python after the consumer wakes from a
        # training step, a visible share of a short step by itself. ``ready``
        # carries batches; ``credit`` carries how many more batches the producer may
        # make, so it stays at most ``prefetch_batches`` ahead. The consumer hands
        # credit back for half the queue at a time: waking the producer costs the
        # consumer a system call (and on 2 busy cores often its time slice), so it
        # does that every few batches rather than for each one.
        depth = max(2, self.prefetch_batches)
        refill = max(1, depth // 2)
        ready: queue.SimpleQueue = queue.SimpleQueue()
        credit: queue.SimpleQueue = queue.SimpleQueue()
        credit.put(depth)
        stop = threading.Event()
        done = object()

        def run() -> None:
            tokens = 0
            try:
                for batch in produced:
                    while not tokens and not stop.is_set():
                        try:
                            tokens = credit.get(timeout=0.1)
                        except queue.Empty:
                            continue
                    if stop.is_set():
                        break
                    tokens -= 1
                    ready.put(batch)
                ready.put(done)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
                ready.put(exc)
            finally:
                produced.close()

        thread = threading.Thread(target=run, name="pipeline-batches", daemon=True)
        thread.start()
        owed = 0
        try:
            while True:
                item = ready.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                owed += 1
                if owed >= refill:
                    credit.put(owed)
                    owed = 0
                yield item
        finally:
            stop.set()
            credit.put(1)  # a producer waiting for credit sees the stop at once
            thread.join()

    def _produce(self, worker: int, num_workers: int, *, skip_batches: int = 0, read_ahead: bool = False,
                 steps: np.ndarray | None = None) -> Iterator[tuple[np.ndarray, ...]]:
        self._check_process()
        fresh = skip_batches == 0 and steps is None  # the whole share: a loader started early fits
        if self.global_batch_size is not None and skip_batches:
            if steps is None:
                steps = worker_steps(np.arange(len(self), dtype=np.int64), worker, num_workers,
                                     self._lanes().group_steps)
            steps, skip_batches = steps[skip_batches:], 0
        plan = self.plan(worker, num_workers, steps=steps)
        if read_ahead:
            if self._last_epoch is not None and self.epoch - self._last_epoch in (0, 1):
                self._epoch_step = self.epoch - self._last_epoch
            self._last_epoch = self.epoch
        loader = self._adopt(self._ahead_key(self.epoch, worker, num_workers) if fresh else None)
        if loader is None:
            loader = self._loader(plan, self.epoch, worker)
        try:
            if len(plan.batch_sizes) <= skip_batches:
                return
            if isinstance(plan, ElasticPlan):
                cuts = self._elastic_cuts(plan, loader)
            else:
                cuts = self._sequential_cuts(plan, loader, skip_batches)
            yield from self._cut_batches(cuts, loader, read_ahead, worker, num_workers)
        finally:
            loader.close()
            loader.pool.trim()

    @staticmethod
    def _sequential_cuts(plan: WorkerPlan, loader: GroupLoader, skip_batches: int) -> Iterator[tuple]:
        """Each batch as ``(parts, finished, start_next)``: runs ``(group, from, to)`` of
        the groups' mixed order, the groups it finishes, and the groups whose successors
        start loading after it. A batch is a run of a group (two runs when it spans groups)."""
        skip_samples = int(sum(plan.batch_sizes[:skip_batches]))
        group_sizes = loader.group_sizes
        g = 0
        while g < len(group_sizes) and skip_samples >= group_sizes[g]:  # skip whole groups unread
            skip_samples -= group_sizes[g]
            g += 1
        loader.want(g, 1)
        cur: Group | None = None
        pos = skip_samples
        for size in plan.batch_sizes[skip_batches:]:
            parts: list[tuple[Group, int, int]] = []
            finished: list[Group] = []
            start_next: list[int] = []
            need = size
            while need > 0:
                if cur is None:
                    cur = loader.take(g)
                    start_next.append(g + 1)
                take = min(cur.perm.size - pos, need)
                parts.append((cur, pos, pos + take))
                pos += take
                need -= take
                if pos == cur.perm.size:
                    finished.append(cur)
                    cur, pos, g = None, 0, g + 1
            yield parts, finished, start_next

    @staticmethod
    def _elastic_cuts(plan: ElasticPlan, loader: GroupLoader) -> Iterator[tuple]:
        """As :meth:`_sequential_cuts`, for an elastic plan: a group's buffer holds its
        steps' batches one after another, so a batch is always one run of one group, and
        a group some of whose steps another worker serves is left part unserved."""
        loader.want(0, 1)
        cur: Group | None = None
        at = -1
        n = len(plan.batch_sizes)
        for k in range(n):
            g = int(plan.batch_group[k])
            start_next = []
            if g != at:
                cur, at = loader.take(g), g
                start_next.append(g + 1)
            lo = int(plan.batch_offset[k])
            last = k + 1 == n or int(plan.batch_group[k + 1]) != g
            yield [(cur, lo, lo + plan.batch_sizes[k])], [cur] if last else [], start_next

    def _cut_batches(self, cuts: Iterator[tuple], loader: GroupLoader, read_ahead: bool, worker: int,
                     num_workers: int) -> Iterator[tuple[np.ndarray, ...]]:
        """The batches of ``cuts`` (see :meth:`_sequential_cuts`), gathered.

        Stored arrays need no gather: their batches are runs of a group buffer already
        in mixed order. Assembled arrays (virtual windows) are built per batch: reading
        their feature rows is cheap and assembling the windows is the work, so several
        threads assemble (:meth:`_gather_threads`); numpy's fancy indexing releases the GIL.
        """
        gather_threads = self._gather_threads()
        gatherer = ThreadPoolExecutor(gather_threads, "pipeline-gather") if gather_threads > 1 else None
        pending: deque[tuple[Future, list[Group]]] = deque()
        try:
            for parts, finished, start_next in cuts:
                if gatherer is None:
                    batch = self._gather(parts)
                    for done_group in finished:  # its samples are copied out: reuse its memory
                        loader.pool.put(done_group.lease)
                    self._start_next(loader, start_next, read_ahead, worker, num_workers)
                    yield batch
                    continue
                pending.append((gatherer.submit(self._gather, parts), finished))
                self._start_next(loader, start_next, read_ahead, worker, num_workers)
                while len(pending) > 2 * gather_threads or (pending and pending[0][0].done()):
                    yield self._next_gathered(pending, loader.pool)
            while pending:
                yield self._next_gathered(pending, loader.pool)
        finally:
            cuts.close()
            if gatherer is not None:
                gatherer.shutdown(wait=True, cancel_futures=True)

    # -- group loaders, and the next epoch's read ahead --------------------------------

    def _start_next(self, loader: GroupLoader, start_next: list[int], read_ahead: bool, worker: int,
                    num_workers: int) -> None:
        """Start loading what follows the groups taken for the batch just cut: the next
        groups of this epoch or, after its last group, the next epoch's first."""
        for g in start_next:
            if g < len(loader.group_sizes):
                loader.want(g)
            elif read_ahead:
                self._read_ahead(worker, num_workers)

    def _buffer_pool(self) -> BufferPool:
        with self._lock:
            if self._pool is None:
                # buffer_chunks whole chunks bound every group; enough buffers are kept
                # for the group served, those loading ahead, the next epoch's first, and
                # the groups that batches queued for the loop or held by it still view
                # (one or two groups, unless batches are larger than groups).
                # The ring holds no more than an epoch's samples: a split smaller than the
                # read-ahead window costs its own size (see BufferPool's ``share``).
                capacity = self._group_rows()
                viewed = -(-(self.prefetch_batches + 2) * self.batch_size // max(1, capacity))
                self._pool = BufferPool(self.source, self.names, capacity, keep=self.prefetch + 2 + max(1, viewed),
                                        share=self._share_rows())
            return self._pool

    def _assembled(self) -> bool:
        """Whether an array is assembled from stored rows (virtual windows)."""
        return any(self.source.assembled(n) for n in self.names)

    def _loader(self, plan: WorkerPlan | ElasticPlan, epoch: int, worker: int) -> GroupLoader:
        threads = self._read_threads()
        elastic = isinstance(plan, ElasticPlan)
        source = self.source
        if elastic:  # a lane's chunk may be cut in pieces for several groups: decode it once
            source = SharedChunks(self.source, plan.pieces, [n for n in self.names if not self.source.assembled(n)],
                                  arrays=self._shared_arrays)
        loader = GroupLoader(source, self.names, plan, pool=self._buffer_pool(), threads=threads,
                             prefetch=self.prefetch, seed=self.seed, epoch=epoch, rank=self.rank, worker=worker,
                             shuffle=self.shuffle or elastic, niceness=self.read_niceness)
        return loader

    def _ahead_key(self, epoch: int, worker: int, num_workers: int) -> tuple:
        """Everything a worker plan depends on: a loader started early is used only for
        exactly the plan it was started for."""
        return (epoch, worker, num_workers, self.seed, self.shuffle, self.batch_size, self.global_batch_size,
                self.drop_last,
                self.rank, self.world_size, self.buffer_chunks, self.prefetch, self.threads, self.read_niceness)

    def _adopt(self, key: tuple | None) -> GroupLoader | None:
        """The loader started early for ``key``, if any; a loader for another plan is
        closed (its buffers go back to the pool)."""
        with self._lock:
            ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        if key is not None and ahead[0] == key:
            return ahead[1]
        ahead[1].close()
        return None

    def _read_ahead(self, worker: int, num_workers: int) -> None:
        """Start reading the first group of the epoch most likely to come next."""
        if getattr(self.source, "lazy", False):
            return
        epoch = self.epoch + self._epoch_step
        plan = self.plan(worker, num_workers, epoch=epoch)
        if not plan.batch_sizes:
            return
        a, b = plan.groups[0]
        if not self._buffer_pool().fits(sum(p.hi - p.lo for p in plan.pieces[a:b])):
            # The epoch's groups still hold the ring (a split of a group or two): reading
            # the next epoch's first group now would take new memory, a group beyond the
            # bound; it is read when the next epoch starts.
            return
        loader = self._loader(plan, epoch, worker)
        loader.want(0, 1)
        with self._lock:
            old, self._ahead = self._ahead, (self._ahead_key(epoch, worker, num_workers), loader)
        if old is not None:
            old[1].close()

    def _gather(self, parts: list[tuple[Group, int, int]]) -> tuple[np.ndarray, ...]:
        """One batch: samples ``[lo, hi)`` of each part's group in its mixed order, per array.

        A group's buffer holds its samples in mixed order already, so a batch within
        one group is a view of it, with no copy (the buffer is reused only once no
        view of it is alive, see :class:`~pipeline.streaming.groups.BufferPool`); so
        is a batch spanning groups whose buffers follow one another in the pool's ring.
        Any other batch spanning groups, and a batch of assembled windows, is written
        into reused batch memory (:mod:`~pipeline.streaming.batches`).
        """
        n = sum(hi - lo for _, lo, hi in parts)
        out = []
        for name in self.names:
            first = parts[0][0].arrays[name]
            if len(parts) == 1 and isinstance(first, np.ndarray):
                out.append(first[parts[0][1] : parts[0][2]])
                continue
            if isinstance(first, np.ndarray) and self._pool is not None:
                view = self._pool.span(name, [(group.lease, lo, hi) for group, lo, hi in parts])
                if view is not None:
                    out.append(view)
                    continue
            dest = self._batch_memory(name).take(n)
            pos = 0
            for group, lo, hi in parts:
                src, part = group.arrays[name], dest[pos : pos + hi - lo]
                if isinstance(src, np.ndarray):
                    part[...] = src[lo:hi]
                else:  # assembled on demand, already in mixed order (virtual windows)
                    src.take_range(lo, hi, part)
                pos += hi - lo
            out.append(dest)
        return tuple(out)

    def _batch_memory(self, name: str) -> BatchSlabs:
        slabs = self._slabs.get(name)
        if slabs is None:
            tail, dtype = self.source.sample_shape(name)
            # The batches queued ahead, those being filled, and a few the loop holds.
            slabs = BatchSlabs(tail, dtype, self.batch_size, max_slabs=self.prefetch_batches + self.threads + 6)
            with self._lock:
                slabs = self._slabs.setdefault(name, slabs)
        return slabs

    @staticmethod
    def _next_gathered(pending: deque, pool: BufferPool) -> tuple[np.ndarray, ...]:
        """The oldest batch; batches finish in order of submission or are waited for, so
        when a group's last batch is taken every batch that read the group is done."""
        fut, finished = pending.popleft()
        batch = fut.result()
        for done_group in finished:
            pool.put(done_group.lease)
        return batch

    # -- adapters ---------------------------------------------------------------------

    def keras(self, *, repeat: bool = False, **kwargs: Any) -> Any:
        """A ``keras.utils.PyDataset`` over this stream (see :mod:`pipeline.streaming.keras`);
        ``repeat=True`` serves epoch after epoch without end, for ``fit(...,
        steps_per_epoch=k)`` whose epochs go on across the stream's epochs."""
        from pipeline.streaming.keras import KerasDataset

        return KerasDataset(self, repeat=repeat, **kwargs)

    def torch(self, *, pin_memory: bool = False) -> Any:
        """A ``torch.utils.data.IterableDataset`` (see :mod:`pipeline.streaming.torch`)."""
        from pipeline.streaming.torch import TorchDataset

        return TorchDataset(self, pin_memory=pin_memory)
