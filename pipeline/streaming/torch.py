"""PyTorch adapter: an ``IterableDataset`` that shares chunks among ranks and workers.

Use it with ``DataLoader(ds, batch_size=None, num_workers=k)``: batches come ready-made.
``batch_size=None`` is needed: with torch's default (1) the DataLoader adds an axis to
every batch (``[1, B, ...]`` tensors, silently: a model that broadcasts trains on them),
and with a larger number it stacks that many of the stream's batches into one and fails
in its collate at the epoch's shorter last batch; the dataset cannot see the loader's
batch size to say so.
Start from ``num_workers=0``: the stream already reads and decodes chunks on its own
threads and cuts batches on another, in the training process, so workers add no reading
speed; what they add is torch's cost of moving every batch between processes, which on
2 cores made the loop wait more and run slower than with no workers (a plain zarr
``IterableDataset`` fared the same; the measurement is in ``benchmarks/README.md``).
Workers help only when per-batch Python work in the loader is heavy (a ``collate_fn``,
transforms on each batch) or cores are many.
Each DataLoader worker serves a contiguous share of its rank's batches, so across all
ranks and workers every sample appears exactly once per epoch. Only the store location
is pickled to workers; each opens the store itself after the fork (no zarr, fsspec or
blosc thread state crosses it), with blosc's internal threads off.

To resume mid-epoch, count the batches the loop consumed this epoch and save
``stream.state_dict(batches_served=n)``: the state records ``num_workers``, the
loader's workers, which each tell the stream in the main process how many they are
before their first batch (on the board below; ``num_workers=k`` may still be passed, and
a count no worker reported for is refused rather than guessed; so is
``stream.state_dict()`` without the count once workers served from where the stream
stands, which would say 0). With ``num_workers=0``
the dataset iterates the stream itself, as a plain loop, one server that counts its
batches: ``stream.state_dict()`` holds them, and iterating the loader again after a
``break`` continues the epoch. Before the next ``iter(loader)``, call
``stream.load_state_dict`` with the state: each worker then serves its share of exactly
what is left, in the order the
uninterrupted loop would have served it (a new DataLoader iterator starts its turns at
worker 0, so after an odd count on 2 workers worker 0 serves what worker 1 would have
served next: :func:`~pipeline.streaming.plan.resumed_share`). Without
``global_batch_size`` the loader must have the same number of workers (and the stream
the same rank and world size); with it, any (see :mod:`pipeline.streaming.elastic`).

With ``persistent_workers=True`` the workers keep the copies of the stream they made at
the first epoch, where the main process's ``set_epoch`` and ``load_state_dict`` would
never reach them (every epoch would repeat the first one's order). So the dataset gives
the stream (and each stream of a mix) a :class:`StateBoard`, a few integers in shared
memory made in the main process: each move of the stream there is published on it,
and a worker takes up the latest one before each epoch it serves. Workers started
afresh each epoch copy the stream as it stands and have nothing to take up. The board
carries one thing the other way: the number of workers serving from the latest
position, which every worker writes before its first batch (:meth:`StateBoard.report`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from multiprocessing.context import get_spawning_popen
from multiprocessing.sharedctypes import RawArray
from typing import Any, Iterator, Sequence

from pipeline.errors import MissingDependencyError, StreamError

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError:  # pragma: no cover - exercised only without the extra
    torch = None
    IterableDataset = object

__all__ = ["Posted", "StateBoard", "TorchDataset"]


@dataclass(frozen=True, slots=True)
class Posted:
    """A position published on a :class:`StateBoard`: ``seq`` grows with each one."""

    seq: int
    epoch: int
    served: int
    workers: int | None
    version: int | None
    done: tuple[tuple[int, int], ...]


class StateBoard:
    """Where a stream stands in the main process, in shared memory its DataLoader
    workers read: epoch, batches served, the workers that served them, the store
    version and an elastic stream's done steps.

    Made in the main process, which alone publishes; a forked worker shares the memory,
    a spawned one receives it while being spawned (and only then: the memory cannot
    travel in any other pickle). Writes are guarded by a sequence number that is odd
    while one is in progress, so a reader never takes half of one.
    """

    #: ``[start, stop)`` runs of done steps a board holds: an elastic stream's runs are a
    #: few per resume (one per DataLoader worker that served the state).
    RUNS = 4096
    _HEAD = 7  # seq, epoch, served, workers (0: unknown), has version, version, runs
    # After the head and the runs: the workers' report, the one slot workers write (see
    # :meth:`report`).
    _REPORT = _HEAD + 2 * RUNS

    def __init__(self) -> None:
        self._array = RawArray("q", self._REPORT + 2)  # the report, then the iteration that made it
        self._owner = os.getpid()
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:
        if get_spawning_popen() is None:
            raise StreamError("a StateBoard's shared memory goes only to a process being spawned")
        return {"_array": self._array, "_owner": self._owner}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def owned(self) -> bool:
        """Whether this process made the board (and so publishes on it)."""
        return os.getpid() == self._owner

    def publish(self, epoch: int, served: int, workers: int | None, version: int | None,
                done: Sequence[Sequence[int]]) -> int:
        """Show a new position; returns its sequence number."""
        runs = [int(v) for pair in done for v in pair]
        if len(runs) > 2 * self.RUNS:
            raise StreamError(f"a stream's state holds {len(runs) // 2} runs of done steps, more than the "
                              f"{self.RUNS} persistent DataLoader workers can be shown; use "
                              "persistent_workers=False")
        a = self._array
        with self._lock:
            seq = a[0] + 2
            a[0] = seq - 1  # odd: a write in progress
            a[1:self._HEAD] = [int(epoch), int(served), int(workers or 0), int(version is not None),
                               int(version or 0), len(runs) // 2]
            a[self._HEAD:self._HEAD + len(runs)] = runs
            a[0] = seq
        return seq

    def report(self, seen: int, workers: int, run: int = 0) -> bool:
        """A DataLoader worker says, before its first batch, that ``workers`` workers
        serve the iteration that began at position ``seen`` (a sequence number of
        :meth:`publish`, 0 before the first); ``workers=0`` clears the report (an
        iteration in the main process). One 64-bit store: a reader never sees half.

        ``run`` names the DataLoader's iteration (its workers' base seed, new for each
        iteration of the loader); returns whether another one reported serving from the
        same position before: the loader iterates again where the stream has not moved
        since, so its workers serve that epoch again from there."""
        a = self._array
        got, before = a[self._REPORT], a[self._REPORT + 1]
        again = bool(run) and bool(got & 0xFFFF) and got >> 16 == int(seen) and before != int(run)
        a[self._REPORT + 1] = int(run)
        a[self._REPORT] = (int(seen) << 16) | (int(workers) & 0xFFFF)
        return again

    def reported(self, seen: int) -> int | None:
        """The workers reported for an iteration that began at position ``seen``; None
        when none was, or the report is of another position (the stream moved since)."""
        got = self._array[self._REPORT]
        workers = got & 0xFFFF
        return workers if workers and got >> 16 == seen else None

    def read(self) -> Posted | None:
        """The latest position (None before the first), waiting out a write in progress."""
        a = self._array
        for _ in range(100_000):
            seq = a[0]
            if seq == 0:
                return None
            if seq % 2 == 0:
                head = a[1:self._HEAD]
                runs = a[self._HEAD:self._HEAD + 2 * head[5]]
                if a[0] == seq:
                    return Posted(seq=seq, epoch=head[0], served=head[1], workers=head[2] or None,
                                  version=head[4] if head[3] else None,
                                  done=tuple(zip(runs[::2], runs[1::2])))
            time.sleep(0.0001)
        raise StreamError("a stream's shared state stayed half written for 10 s; was the main process killed?")


class TorchDataset(IterableDataset):
    """One epoch of a stream (or of a :class:`~pipeline.streaming.mix.Mix`) per
    iteration, as tuples of tensors."""

    def __init__(self, stream: Any, *, pin_memory: bool = False):
        if torch is None:
            raise MissingDependencyError("Stream.torch()", "PyTorch", "torch")
        super().__init__()
        self.stream = stream
        self.pin_memory = pin_memory
        for s in (stream, *getattr(stream, "streams", ())):
            if getattr(s, "_board", False) is None:  # a second dataset shares the first's board
                s._board = StateBoard()

    def __len__(self) -> int:
        return len(self.stream)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if info is not None:
            import numcodecs

            numcodecs.blosc.use_threads = False  # our threads decode; blosc's would oversubscribe
            # A mix (pipeline.streaming.mix) serves the batches of several streams.
            for stream in getattr(self.stream, "streams", (self.stream,)):
                stream.threads = 2
                # A forked worker shares the parent's open files (a zip store's handle and
                # offset): open the store again before any reader thread starts.
                reopen = getattr(stream.source, "_reopen", None)
                if reopen is not None:
                    reopen()
            # A persistent worker's copy is as old as the worker: take up where the main
            # process moved the stream since (set_epoch, load_state_dict).
            follow = getattr(self.stream, "follow_board", None)
            if follow is not None:
                follow()
            # The main process's state_dict(batches_served=n) must know how many workers
            # took turns over those n batches: without it a resume on another count
            # served some batches twice and others never. Said before the first batch,
            # so that any batch the loop counted comes after it.
            report = getattr(self.stream, "served_by", None)
            if report is not None:
                # The loader's base seed (the worker's seed less its id: new for each
                # iteration of a loader's workers) and this worker's count of passes (a
                # persistent worker's seed stays) name this iteration of the loader:
                # another one from the same position is said, by the worker that reports
                # this iteration first (whichever: the others find it reported).
                self._passes = getattr(self, "_passes", 0) + 1
                run = hash((info.seed - info.id, self._passes)) & ((1 << 62) - 1)
                report(workers, run=run or 1)
            # Resuming (Stream.load_state_dict): each worker serves its share of what the
            # loop has not consumed yet.
            batches = self.stream.iter_resumed(worker, workers)
        else:
            # num_workers=0: this process serves every batch in order, as a plain loop
            # does, and counts them as one: state_dict() knows where the loop stands, and
            # iterating the loader again continues the epoch (with the plain loop's
            # warning) instead of serving it again from its start. The stream lives on
            # between epochs and reads the next epoch's first chunks early.
            batches = iter(self.stream)
        pin = self.pin_memory and torch.cuda.is_available() and info is None
        for batch in batches:
            tensors = tuple(torch.from_numpy(b) for b in batch)
            yield tuple(t.pin_memory() for t in tensors) if pin else tensors
