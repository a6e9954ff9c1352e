"""The chunk-randomizing streamer behind :func:`pipeline.stream`.

Why chunks: shuffling a disk-backed array sample by sample is random I/O and crawls.
Instead the chunk order is permuted every epoch, ``buffer_chunks`` chunks are read
together and their samples mixed in memory, and the next group of chunks is read in
background threads while the current group's batches are served.

The ``buffer_chunks`` trade-off: a batch drawn from a buffer of ``k`` chunks mixes
samples of up to ``k`` chunks, so larger buffers decorrelate batches better (the quality
report's mean distinct chunks per batch grows with ``k``), at the price of ``2k`` chunks
in memory (the buffer being served and the one being prefetched). With 4 MiB chunks,
``buffer_chunks=8`` costs 64 MiB.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from pipeline.errors import IncompleteStoreError, StreamError
from pipeline.streaming.chunks import ChunkReader
from pipeline.streaming.plan import (
    WorkerPlan,
    batches_per_rank,
    group_permutation,
    served_order,
    shuffle_quality,
    worker_plan,
)

__all__ = ["Stream", "stream"]

DEFAULT_ARRAY_CHUNK = 4096
_REOPEN_LOCK = threading.Lock()


class _StoreSource:
    """Chunks of the arrays of one split of a zarr store."""

    def __init__(self, location: Any, split: str, names: Sequence[str], partial: bool,
                 storage_options: dict | None, verify: bool = False):
        from pipeline.storage.store import open_store_group, store_root_attrs

        self.location, self.split, self.names = location, split, tuple(names)
        self.partial, self.storage_options, self.verify = partial, storage_options, verify
        group = open_store_group(location, mode="r", storage_options=storage_options)
        meta = store_root_attrs(group)
        label = location if isinstance(location, (str, os.PathLike)) else "<group>"
        if not meta.get("complete") and not partial:
            raise IncompleteStoreError(str(label))
        if split not in group:
            raise StreamError(f"{label}: no split {split!r}")
        arrays = {}
        virtual = meta.get("virtual")
        for n in self.names:
            if n == "x" and virtual and "x" not in group[split] and "ends" in group[split]:
                arrays[n] = group[f"{split}/ends"]  # windows are assembled from the features
                continue
            if n not in group[split]:
                raise StreamError(f"{label}: split {split!r} has no array {n!r}")
            arrays[n] = group[f"{split}/{n}"]
        shapes = {n: (a.shape[0], a.chunks[0]) for n, a in arrays.items()}
        if len(set(shapes.values())) != 1:
            raise StreamError(f"{label}: split {split!r}: arrays differ in length or chunking: {shapes}")
        sums = group[f"{split}/_written"][:] if verify and "_written" in group[split] else None
        self.readers = {n: ChunkReader(a, (str(label), split, n), sums) for n, a in arrays.items()}
        if "x" in self.readers and arrays["x"].path.endswith("/ends"):
            from pipeline.streaming.virtual import VirtualWindowReader

            shared_sums = group["_shared/_written"][:] if verify else None
            feats = ChunkReader(group["_shared/features"], (str(label), "_shared", "features"), shared_sums)
            self.readers["x"] = VirtualWindowReader(self.readers["x"], feats, virtual["size"], virtual["scales"])
        first = self.readers[self.names[0]]
        self.lengths = tuple(first.length(i) for i in range(first.n_chunks))
        # Set last: other threads of a forked child read only once the readers are new.
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        # Only the location travels to DataLoader workers; each reopens the store itself.
        if not isinstance(self.location, (str, os.PathLike)):
            raise StreamError("a stream over an open zarr group cannot be sent to worker processes; pass its path")
        return {"location": self.location, "split": self.split, "names": self.names,
                "partial": self.partial, "storage_options": self.storage_options, "verify": self.verify}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["location"], state["split"], state["names"], state["partial"], state["storage_options"],
                      state.get("verify", False))

    def read(self, name: str, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        if self._pid != os.getpid():
            self._reopen()
        return self.readers[name].read(chunk, out)

    def _reopen(self) -> None:
        """After a fork (a DataLoader worker), open the store again: a forked child shares
        its parent's file descriptors and their offsets, so two workers reading one zip
        through inherited handles would read each other's bytes."""
        with _REOPEN_LOCK:
            if self._pid != os.getpid():
                self.__init__(self.location, self.split, self.names, self.partial, self.storage_options,
                              self.verify)

    def sample_shape(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        r = self.readers[name]
        return r.tail_shape, r.dtype


class _ArraySource:
    """In-memory numpy arrays (virtual chunks) or dask arrays (their own chunks).

    A dask chunk is computed when the prefetch thread asks for it, one group ahead of
    the batches being served, with every array's block of that chunk in one
    ``dask.compute``: x and y usually share their upstream graph (windows and labels of
    the same features), which is then computed once, on the active distributed client
    when there is one.
    """

    def __init__(self, arrays: Mapping[str, Any], names: Sequence[str]):
        import dask.array as da

        self.names = tuple(names)
        missing = [n for n in self.names if n not in arrays]
        if missing:
            raise StreamError(f"arrays {missing} are not among the given arrays {list(arrays)}")
        lens = {n: arrays[n].shape[0] for n in self.names}
        if len(set(lens.values())) != 1:
            raise StreamError(f"arrays must have the same length on axis 0, got {lens}")
        first = arrays[self.names[0]]
        if isinstance(first, da.Array):
            bounds = first.chunks[0]
        else:
            n = int(first.shape[0])
            bounds = (DEFAULT_ARRAY_CHUNK,) * (n // DEFAULT_ARRAY_CHUNK) + ((n % DEFAULT_ARRAY_CHUNK,) if n % DEFAULT_ARRAY_CHUNK else ())
        self.lengths = tuple(int(b) for b in bounds)
        self.starts = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.arrays = {}
        for n in self.names:
            a = arrays[n]
            if isinstance(a, da.Array):
                a = a.rechunk({0: self.lengths, **{i: -1 for i in range(1, a.ndim)}})
            self.arrays[n] = a
        self._lazy = [n for n in self.names if isinstance(self.arrays[n], da.Array)]
        # chunk -> (event set when computed, {name: block or exception}); an entry is
        # dropped once every lazy array has taken its block.
        self._pending: dict[int, tuple[threading.Event, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_pending"], state["_lock"] = {}, None  # per process; rebuilt below
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _computed(self, name: str, chunk: int) -> np.ndarray:
        import dask

        while True:
            with self._lock:
                entry = self._pending.get(chunk)
                if entry is not None and entry[0].is_set() and name not in entry[1]:
                    entry = None  # left by an abandoned epoch after this array took its block
                owner = entry is None
                if owner:
                    entry = (threading.Event(), {})
                    self._pending[chunk] = entry
            event, blocks = entry
            if owner:
                try:
                    values = dask.compute(*(self.arrays[n].blocks[chunk] for n in self._lazy))
                    blocks.update({n: np.asarray(v) for n, v in zip(self._lazy, values)})
                except BaseException as exc:  # noqa: BLE001 - every waiting array re-raises it
                    blocks.update({n: exc for n in self._lazy})
                event.set()
            event.wait()
            with self._lock:
                if name not in blocks:
                    continue  # another reader of the same array took it: compute again
                value = blocks.pop(name)
                if not blocks and self._pending.get(chunk) is entry:
                    del self._pending[chunk]
            if isinstance(value, BaseException):
                raise value
            return value

    def read(self, name: str, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        if name in self._lazy:
            data = self._computed(name, chunk)
        else:
            data = np.asarray(self.arrays[name][self.starts[chunk] : self.starts[chunk + 1]])
        if out is not None:
            out[...] = data
            return out
        return data

    def sample_shape(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        a = self.arrays[name]
        return tuple(a.shape[1:]), np.dtype(a.dtype)


class Stream:
    """Shuffled, aligned batches of one split, one epoch per iteration.

    Use :func:`stream` to make one. ``len(s)`` is this rank's batches per epoch; every
    rank yields the same number, and across ranks and DataLoader workers every sample is
    served exactly once per epoch (with ``drop_last=False``).
    """

    def __init__(self, source: Any, *, names: Sequence[str], batch_size: int, shuffle: bool, seed: int,
                 buffer_chunks: int, drop_last: bool, rank: int, world_size: int, prefetch: int,
                 threads: int | None):
        self.source = source
        self.names = tuple(names)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.buffer_chunks = buffer_chunks
        self.drop_last = drop_last
        self.rank = rank
        self.world_size = world_size
        self.prefetch = prefetch
        self.threads = threads or min(32, (os.cpu_count() or 2))
        self.prefetch_batches = 4
        self.epoch = 0
        self._served = 0  # batches served in the current epoch, for state_dict
        self._quality_epoch: int | None = None  # the last epoch served whole, from its start
        self._spare: list[dict[str, np.ndarray]] = []  # group buffers kept between epochs
        self._spare_lock = threading.Lock()
        self.n_samples = int(sum(source.lengths))
        if self.n_samples < world_size:
            raise StreamError(f"{self.n_samples} samples cannot be shared among {world_size} ranks")

    def __getstate__(self) -> dict:
        # Sent to DataLoader workers (spawn): the source reopens itself; spare buffers and
        # locks stay behind.
        state = dict(self.__dict__)
        state["_spare"], state["_spare_lock"] = [], None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._spare_lock = threading.Lock()

    # -- bookkeeping ------------------------------------------------------------------

    @property
    def shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per array: the shape of one sample and the dtype (for building a model)."""
        return {n: self.source.sample_shape(n) for n in self.names}

    def __len__(self) -> int:
        return batches_per_rank(self.n_samples, self.world_size, self.batch_size, self.drop_last)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration follows."""
        if epoch != self.epoch:
            self._served = 0
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, int]:
        """Where this stream is: enough integers to resume mid-epoch."""
        return {"epoch": self.epoch, "batches_served": self._served, "seed": self.seed,
                "rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume: the next iteration yields exactly the batches not yet served."""
        for key in ("seed", "rank", "world_size"):
            if key in state and int(state[key]) != getattr(self, key):
                raise StreamError(f"state_dict was saved with {key}={state[key]}, this stream has {getattr(self, key)}")
        self.epoch = int(state["epoch"])
        self._served = int(state["batches_served"])

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
        plan = worker_plan(
            self.source.lengths, seed=self.seed, epoch=self._quality_epoch, shuffle=self.shuffle,
            batch_size=self.batch_size, drop_last=self.drop_last, rank=self.rank,
            world_size=self.world_size, worker=0, num_workers=1, buffer_chunks=self.buffer_chunks,
        )
        chunks, index = served_order(plan, self.source.lengths, seed=self.seed, epoch=self._quality_epoch,
                                     rank=self.rank, worker=0, shuffle=self.shuffle)
        return shuffle_quality(chunks, index, plan.batch_sizes)

    # -- iteration --------------------------------------------------------------------

    def plan(self, worker: int = 0, num_workers: int = 1) -> WorkerPlan:
        return worker_plan(
            self.source.lengths, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle,
            batch_size=self.batch_size, drop_last=self.drop_last, rank=self.rank,
            world_size=self.world_size, worker=worker, num_workers=num_workers,
            buffer_chunks=self.buffer_chunks,
        )

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        skip = self._served
        whole = skip == 0
        for batch in self.iter_worker(0, 1, skip_batches=skip):
            self._served += 1
            yield batch
        self._served = 0
        if whole:
            self._quality_epoch = self.epoch

    def iter_worker(self, worker: int, num_workers: int, *, skip_batches: int = 0
                    ) -> Iterator[tuple[np.ndarray, ...]]:
        """Batches of one DataLoader worker's share (all of them for ``0, 1``).

        Batches are assembled by a background thread into a short queue, so the
        consumer's ``next()`` only takes a ready batch: the gather that mixes samples
        overlaps the training step instead of adding to it.
        """
        produced = self._produce(worker, num_workers, skip_batches=skip_batches)
        ready: queue.Queue = queue.Queue(maxsize=max(2, self.prefetch_batches))
        stop = threading.Event()
        done = object()

        def run() -> None:
            try:
                for batch in produced:
                    while not stop.is_set():
                        try:
                            ready.put(batch, timeout=0.1)
                            break
                        except queue.Full:
                            continue
                    if stop.is_set():
                        break
                ready.put(done)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
                ready.put(exc)
            finally:
                produced.close()

        thread = threading.Thread(target=run, name="pipeline-batches", daemon=True)
        thread.start()
        try:
            while True:
                item = ready.get()
                if item is done:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()
            while thread.is_alive():  # unblock a producer waiting on a full queue
                try:
                    ready.get(timeout=0.05)
                except queue.Empty:
                    pass
            thread.join()

    def _produce(self, worker: int, num_workers: int, *, skip_batches: int = 0
                 ) -> Iterator[tuple[np.ndarray, ...]]:
        plan = self.plan(worker, num_workers)
        sizes = plan.batch_sizes[skip_batches:]
        if not sizes:
            return
        skip_samples = int(sum(plan.batch_sizes[:skip_batches]))
        starts = np.concatenate([[0], np.cumsum([p.hi - p.lo for p in plan.pieces])]).astype(np.int64)
        group_sizes = [int(starts[b] - starts[a]) for a, b in plan.groups]
        # Skip whole groups without reading them.
        g0 = 0
        while g0 < len(group_sizes) and skip_samples >= group_sizes[g0]:
            skip_samples -= group_sizes[g0]
            g0 += 1

        pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="pipeline-read")
        # Group buffers are recycled once their batches are cut: a fresh buffer of a few
        # hundred MB per group costs as much in page faults as decoding into it.
        capacity = max(group_sizes, default=0)
        free: queue.SimpleQueue = queue.SimpleQueue()
        # ... and kept for the next epoch, whose first group would otherwise wait on them.
        with self._spare_lock:
            keep = [b for b in self._spare if all(len(v) >= capacity for v in b.values())]
            # By identity: dicts of arrays do not compare with ==.
            self._spare = [b for b in self._spare if not any(b is k for k in keep)]
        for b in keep:
            free.put(b)
        try:
            def buffers() -> dict[str, np.ndarray]:
                try:
                    return free.get_nowait()
                except queue.Empty:
                    out = {}
                    for n in self.names:
                        tail, dtype = self.source.sample_shape(n)
                        out[n] = np.empty((capacity,) + tail, dtype=dtype)
                    return out

            def load(g: int) -> tuple:
                """Read group ``g``'s pieces into one buffer per array; return the buffers,
                the mixing permutation and the full buffers to recycle."""
                a, b = plan.groups[g]
                pieces = plan.pieces[a:b]
                offsets = np.concatenate([[0], np.cumsum([p.hi - p.lo for p in pieces])]).astype(np.int64)
                full = buffers()
                bufs = {}
                futs = []
                for n in self.names:
                    buf = full[n][: int(offsets[-1])]
                    bufs[n] = buf
                    for p, off in zip(pieces, offsets[:-1]):
                        whole = p.lo == 0 and p.hi == self.source.lengths[p.chunk]
                        if whole:  # decode straight into the buffer
                            futs.append(pool.submit(self.source.read, n, p.chunk, buf[off : off + p.hi - p.lo]))
                        else:
                            futs.append(pool.submit(_read_part, self.source, n, p, buf[off : off + p.hi - p.lo]))
                for f in futs:
                    f.result()
                perm = group_permutation(group_sizes[g], seed=self.seed, epoch=self.epoch, rank=self.rank,
                                         worker=worker, group=g, shuffle=self.shuffle)
                return bufs, perm, full

            futures: dict[int, Future] = {}
            loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pipeline-prefetch")

            def want(g: int) -> None:
                for k in range(g, min(g + 1 + self.prefetch, len(plan.groups))):
                    if k not in futures:
                        futures[k] = loader.submit(load, k)

            want(g0)
            cur: tuple | None = None
            pos = skip_samples
            g = g0
            # One thread gathers about as fast as three decode (a row copy against an lz4
            # decode), so many-core machines gather several batches at once; numpy's
            # fancy indexing releases the GIL. With few threads the gather stays inline.
            gather_threads = max(1, self.threads // 3)
            gatherer = ThreadPoolExecutor(gather_threads, "pipeline-gather") if gather_threads > 1 else None
            pending: deque[tuple[Future, list[tuple]]] = deque()
            try:
                for size in sizes:
                    # A batch is one gather from the mixed group (two when it spans groups):
                    # the only copy of the data after decoding.
                    parts: list[tuple[tuple, np.ndarray]] = []
                    finished: list[tuple] = []
                    need = size
                    while need > 0:
                        if cur is None:
                            want(g)
                            cur = futures.pop(g).result()
                            want(g + 1)
                        perm = cur[1]
                        take = min(perm.size - pos, need)
                        parts.append((cur, perm[pos : pos + take]))
                        pos += take
                        need -= take
                        if pos == perm.size:
                            finished.append(cur)
                            cur, pos, g = None, 0, g + 1
                    if gatherer is None:
                        batch = self._gather(parts)
                        for done_group in finished:  # its samples are copied out: reuse its memory
                            free.put(done_group[2])
                        yield batch
                        continue
                    pending.append((gatherer.submit(self._gather, parts), finished))
                    while len(pending) > 2 * gather_threads or (pending and pending[0][0].done()):
                        yield self._next_gathered(pending, free)
                while pending:
                    yield self._next_gathered(pending, free)
            finally:
                if gatherer is not None:
                    gatherer.shutdown(wait=True, cancel_futures=True)
                loader.shutdown(wait=True, cancel_futures=True)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            # No decode is in flight any more (the loader was shut down, waiting).
            spare = []
            while not free.empty() and len(spare) < 2 + self.prefetch:
                spare.append(free.get_nowait())
            with self._spare_lock:
                self._spare = spare

    def _gather(self, parts: list[tuple[tuple, np.ndarray]]) -> tuple[np.ndarray, ...]:
        out = []
        for n in self.names:
            pieces_n = [c[0][n][idx] for c, idx in parts]
            out.append(pieces_n[0] if len(pieces_n) == 1 else np.concatenate(pieces_n))
        return tuple(out)

    @staticmethod
    def _next_gathered(pending: deque, free: queue.SimpleQueue) -> tuple[np.ndarray, ...]:
        """The oldest batch; batches finish in order of submission or are waited for, so
        when a group's last batch is taken every batch that read the group is done."""
        fut, finished = pending.popleft()
        batch = fut.result()
        for done_group in finished:
            free.put(done_group[2])
        return batch

    # -- adapters ---------------------------------------------------------------------

    def keras(self, **kwargs: Any) -> Any:
        """A ``keras.utils.PyDataset`` over this stream (see :mod:`pipeline.streaming.keras`)."""
        from pipeline.streaming.keras import KerasDataset

        return KerasDataset(self, **kwargs)

    def torch(self, *, pin_memory: bool = False) -> Any:
        """A ``torch.utils.data.IterableDataset`` (see :mod:`pipeline.streaming.torch`)."""
        from pipeline.streaming.torch import TorchDataset

        return TorchDataset(self, pin_memory=pin_memory)


def _read_part(source: Any, name: str, piece: Any, out: np.ndarray) -> None:
    """Copy a partial chunk (a rank or worker boundary falls inside it) into ``out``."""
    out[...] = source.read(name, piece.chunk)[piece.lo : piece.hi]


def stream(
    source: Any,
    *,
    split: str = "train",
    arrays: Sequence[str] = ("x", "y"),
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    buffer_chunks: int = 4,
    drop_last: bool = False,
    rank: int | None = None,
    world_size: int | None = None,
    partial: bool = False,
    storage_options: dict[str, Any] | None = None,
    prefetch: int = 1,
    threads: int | None = None,
    verify: bool = False,
) -> Stream:
    """Stream shuffled, aligned batches of a split.

    Parameters
    ----------
    source
        A store path or URL (directory, ``.zarr.zip``, ``s3://...``), an open
        ``zarr.Group``, or a mapping / tuple of numpy or dask arrays (dask chunks are
        computed in background threads, on the active cluster if there is one).
    split
        Split of a store to read.
    arrays
        Names of the arrays to yield, in order (ignored names for a tuple source).
    batch_size
        Samples per batch (the last batch of a rank may be smaller unless ``drop_last``).
    shuffle, seed
        Chunk order and in-buffer mixing are permutations seeded by ``(seed, epoch)``.
    buffer_chunks
        Chunks whose samples are mixed together (memory: about ``2 * buffer_chunks``
        chunks).
    drop_last
        Drop each rank's incomplete last batch.
    rank, world_size
        This process's share; default from ``torch.distributed`` when initialized, else
        ``0`` of ``1``.
    partial
        Read a store that is not marked complete.
    prefetch
        Buffer groups read ahead in the background.
    threads
        Threads decoding chunks.
    verify
        Check every chunk read against the CRC32 recorded when it was written (stores
        without sharding). A chunk that fails to decode is always reported; this also
        catches one that decodes to the wrong bytes, at about a third of the speed.

    Returns
    -------
    Stream
    """
    for name, value in (("batch_size", batch_size), ("buffer_chunks", buffer_chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise StreamError(f"stream: {name} must be a positive integer, got {value!r}")
    if rank is None or world_size is None:
        r, w = _distributed_rank()
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if world_size <= 0 or not 0 <= rank < world_size:
        raise StreamError(f"stream: rank {rank} is outside 0..{world_size - 1}")
    import zarr

    if isinstance(source, (str, os.PathLike, zarr.Group)):
        src: Any = _StoreSource(source, split, arrays, partial, storage_options, verify)
    elif isinstance(source, Mapping):
        src = _ArraySource(source, arrays)
    elif isinstance(source, (tuple, list)):
        names = tuple(f"a{i}" for i in range(len(source)))
        src = _ArraySource(dict(zip(names, source)), names)
        arrays = names
    else:
        raise StreamError(f"stream: cannot stream from {type(source).__name__}; pass a store path, a zarr group or arrays")
    return Stream(src, names=src.names, batch_size=batch_size, shuffle=shuffle, seed=seed,
                  buffer_chunks=buffer_chunks, drop_last=drop_last, rank=rank, world_size=world_size,
                  prefetch=prefetch, threads=threads)


def _distributed_rank() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return 0, 1
