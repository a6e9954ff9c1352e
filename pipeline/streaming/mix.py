"""Weighted mixing of several streams: :func:`pipeline.mix`.

Each step of a mix serves one whole batch of one source (a batch never mixes stores of
different shapes), so every source keeps its own chunk-randomizing stream and the mix
only decides, step by step, which stream the next batch comes from.

**The epoch.** Source ``i`` yields ``L_i`` batches per epoch on this rank (``len`` of its
stream) and has the share ``p_i = w_i / sum(w)``. A mix epoch has ``N`` steps:
``epoch_length`` when given, else ``N = ceil(max_i L_i / p_i)`` over the sources with a
positive weight, the fewest steps in which every source, drawn in proportion to its
weight, serves at least its whole epoch. Source ``i`` serves ``c_i`` of them, the
largest-remainder (Hamilton) apportionment of ``N`` by the shares (``|c_i - p_i N| < 1``;
ties in the remainders go to the lower source index). The source with the largest
``L_i / p_i`` then serves about one pass per mix epoch, and the others cycle through
their own epochs.

**A source's batches run on across mix epochs.** Source ``i`` is an endless sequence of
batches: its epoch 0, then its epoch 1, and so on, each shuffled by its own stream.
Mix epoch ``E`` takes positions ``E * c_i`` to ``E * c_i + c_i - 1`` of it, so no batch
of a source is skipped, and every sample of a source is served exactly once per epoch of
that source (across ranks and DataLoader workers), whatever the weights. A source's
epoch boundaries need not fall on the mix's.

**The order of the steps.** Inside an epoch the source of each step follows the quota
method of apportionment (Balinski and Young): step ``h`` goes to the source that is
furthest from its share by the Jefferson priority ``c_i / (taken_i + 1)`` among those
still below their upper quota. In every prefix of ``h`` steps source ``i`` has then served
``floor(h c_i / N)`` or ``ceil(h c_i / N)`` batches, so in every window of ``k``
consecutive steps (across epoch boundaries too) it serves from ``floor(k c_i / N) - 1``
to ``ceil(k c_i / N) + 1`` batches: less than two from its share. Ties are broken in a source order
permuted by ``(seed, epoch)``: the schedule is a function of the counts, the seed and
the epoch, the same on every rank and in every process, and it varies between epochs
where ties leave a choice (with equal weights: which source leads each pair of steps).

**Ranks and workers.** Every rank computes the same schedule (the ``L_i`` are equal on
all ranks), so every rank takes ``N`` steps and at each step draws from the same source;
each source's stream serves this rank's share of its samples. A DataLoader worker ``k``
of ``K`` serves the steps ``[N k // K, N (k + 1) // K)`` of its rank's schedule, and so a
contiguous range of each source's batches.

**Resuming.** ``state_dict()`` is ``(epoch, batches_served)``; every source's position
is recomputed from the schedule, and the rest of the epoch is served exactly as in an
uninterrupted run. What the positions depend on is recorded too and checked on loading:
the steps per source (``counts``) and each source's order (batch size,
``buffer_chunks``, ``shuffle``, ``drop_last``, samples), at an epoch's start as well,
since a source's position runs on across mix epochs. When every source is a stream with ``global_batch_size``
(:mod:`~pipeline.streaming.elastic`), a source's steps per epoch, and so the schedule,
do not depend on the world size, and each source's batch at a position holds the same
samples on every world size: a state then resumes on any world size the sources allow.
The DataLoader workers must be as many as those that served the state; they take the
turns up where the interrupted loader stopped
(:func:`~pipeline.streaming.plan.resumed_share`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from multiprocessing.context import get_spawning_popen
from numbers import Real
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from pipeline.errors import StreamError
from pipeline.streaming.plan import resumed_share
from pipeline.streaming.api import EMPTY_EPOCHS_OK, check_seed, stream
from pipeline.streaming.streamer import (ORDER_KEYS, Stream, saved_value, uncounted_workers, warn_continued,
                                         warn_loader_again)

__all__ = ["Mix", "MixPlan", "apportion", "epoch_steps", "mix", "quota_schedule", "shares"]


# -- pure planning ------------------------------------------------------------------------


def shares(weights: Sequence[Any], n_sources: int) -> tuple[Fraction, ...]:
    """The weights as exact fractions of their sum, checked.

    Floats are taken at their exact binary value, so every process computes the same
    counts and schedule from the same weights.
    """
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise StreamError(f"mix: weights must be a sequence of {n_sources} numbers, got {weights!r}")
    if len(weights) != n_sources:
        raise StreamError(f"mix: expected {n_sources} weights (one per source), got {len(weights)}: {list(weights)!r}")
    for i, w in enumerate(weights):
        if isinstance(w, bool) or not isinstance(w, Real) or not math.isfinite(w):
            raise StreamError(f"mix: weight {i} must be a finite number, got {w!r}")
        if w < 0:
            raise StreamError(f"mix: weights must be 0 or more, got {w!r} for source {i}")
    exact = [Fraction(w) for w in weights]
    total = sum(exact, Fraction(0))
    if total <= 0:
        raise StreamError(f"mix: the weights must have a positive sum, got {list(weights)!r}")
    return tuple(w / total for w in exact)


def apportion(total: int, parts: Sequence[Fraction]) -> tuple[int, ...]:
    """Largest-remainder (Hamilton) apportionment of ``total`` steps by ``parts`` (summing
    to 1): each gets the floor of its quota, and the steps left over go to the largest
    remainders, ties to the lower index."""
    quotas = [p * total for p in parts]
    counts = [math.floor(q) for q in quotas]
    left = total - sum(counts)
    by_remainder = sorted(range(len(parts)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[:left]:
        counts[i] += 1
    return tuple(counts)


def epoch_steps(lengths: Sequence[int], parts: Sequence[Fraction]) -> int:
    """Default steps per mix epoch: ``ceil(max L_i / p_i)`` over sources with ``p_i > 0``.

    Then ``p_i N >= L_i``, so every source's apportioned count is at least its length.
    """
    return max(math.ceil(Fraction(n) / p) for n, p in zip(lengths, parts) if p > 0)


def quota_schedule(counts: Sequence[int], order: Sequence[int]) -> np.ndarray:
    """The source of each step of an epoch with ``counts[i]`` steps of source ``i``.

    The quota method (Balinski and Young): step ``h`` goes, among the sources whose count
    would not pass its upper quota ``ceil((h + 1) c_i / N)``, to the one with the largest
    ``c_i / (taken_i + 1)``; ties to the earliest in ``order``. Every prefix then stays
    within quota (between floor and ceiling of ``h c_i / N``), which a largest-deficit
    (smooth weighted round-robin) order does not guarantee beyond a few sources.
    """
    n_steps = int(sum(counts))
    taken = [0] * len(counts)
    out = np.empty(n_steps, dtype=np.int64)
    for h in range(n_steps):
        best = -1
        for i in order:
            c, t = counts[i], taken[i]
            # Integer forms of t + 1 <= ceil((h+1) c / N) and c/(t+1) > c_b/(t_b+1).
            if t * n_steps < (h + 1) * c and (best < 0 or c * (taken[best] + 1) > counts[best] * (t + 1)):
                best = i
        out[h] = best
        taken[best] += 1
    return out


def tie_order(n_sources: int, seed: int, epoch: int) -> list[int]:
    """The order that breaks ties in an epoch's schedule, seeded by ``(seed, epoch)``."""
    return [int(i) for i in np.random.default_rng([seed, epoch, 0x313]).permutation(n_sources)]


@dataclass(frozen=True, slots=True)
class MixPlan:
    """What one DataLoader worker of one rank serves in one mix epoch.

    ``sources[j]`` is the source of the worker's ``j``-th batch and ``positions[j]`` its
    place in that source's endless batch sequence (source epoch ``position // len``,
    batch ``position % len`` of that epoch); ``batch_sizes[j]`` its number of samples.
    """

    sources: tuple[int, ...]
    positions: tuple[int, ...]
    batch_sizes: tuple[int, ...]


# -- the mix ------------------------------------------------------------------------------


class Mix:
    """Batches of several streams in proportion to their weights, one epoch per iteration.

    Use :func:`mix` to make one; the epoch, the order and how ranks share it are
    described in :mod:`pipeline.streaming.mix`. ``len(m)`` is the steps per epoch (the
    same on every rank). Iterating yields each source's batches as its stream does.
    """

    def __init__(self, streams: Sequence[Stream], *, weights: Sequence[float], seed: int,
                 epoch_length: int | None = None):
        self.streams = tuple(streams)
        self.weights = tuple(weights)
        self.shares = shares(self.weights, len(self.streams))
        self.seed = int(seed)
        self.rank = self.streams[0].rank
        self.world_size = self.streams[0].world_size
        for i, s in enumerate(self.streams):
            if (s.rank, s.world_size) != (self.rank, self.world_size):
                raise StreamError(f"mix: source {i} is rank {s.rank} of {s.world_size}, source 0 is rank "
                                  f"{self.rank} of {self.world_size}; every source must be the same rank's share")
        self.lengths = tuple(len(s) for s in self.streams)
        for i, (n, p) in enumerate(zip(self.lengths, self.shares)):
            if p > 0 and n == 0:
                raise StreamError(f"mix: source {i} has weight {self.weights[i]!r} but no batches on rank "
                                  f"{self.rank} of {self.world_size}; give it weight 0 or more samples")
        if epoch_length is None:
            self.steps = epoch_steps(self.lengths, self.shares)
        elif isinstance(epoch_length, bool) or not isinstance(epoch_length, int) or epoch_length <= 0:
            raise StreamError(f"mix: epoch_length must be a positive integer or None, got {epoch_length!r}")
        else:
            self.steps = epoch_length
        self.counts = apportion(self.steps, self.shares)
        self.epoch = 0
        self._served = 0
        self._iter_start = 0  # where this process's latest loop began (see Stream.state_dict)
        self._served_workers: int | None = None  # DataLoader workers that served _served
        self._cut_short = False  # as for a stream: its own iteration stopped inside the epoch
        self._schedules: dict[int, np.ndarray] = {}
        # As for a stream (see Stream._publish): moves counted for the Keras adapter, and
        # the board that carries them to persistent DataLoader workers.
        self._moves = 0
        self._board: Any = None
        self._board_seen = 0

    def __getstate__(self) -> dict:
        # The shared board travels only to a process being spawned (see Stream.__getstate__).
        state = dict(self.__dict__)
        if get_spawning_popen() is None:
            state["_board"] = None
        return state

    @property
    def elastic(self) -> bool:
        """Whether every source has a world-size independent order (``global_batch_size``)."""
        return all(getattr(s, "global_batch_size", None) is not None for s in self.streams)

    def __len__(self) -> int:
        return self.steps

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose schedule (and sources' positions) the next iteration follows."""
        if epoch != self.epoch:
            self._served, self._cut_short, self._iter_start = 0, False, 0
            self._served_workers = None
        self.epoch = int(epoch)
        self._publish()

    def _publish(self) -> None:
        """After a move: count it, and show persistent DataLoader workers where the next
        iteration starts (see :mod:`pipeline.streaming.torch`)."""
        self._moves += 1
        board = self._board
        if board is not None and board.owned():
            self._board_seen = board.publish(self.epoch, self._served, self._served_workers, None, ())

    def follow_board(self) -> None:
        """In a DataLoader worker: take up the latest position the main process
        published, for the mix and each of its streams."""
        board = self._board
        got = None if board is None else board.read()
        if got is not None and got.seq != self._board_seen:
            self.epoch, self._served, self._served_workers = got.epoch, got.served, got.workers
            self._iter_start = self._served
            self._board_seen = got.seq
        for s in self.streams:
            s.follow_board()

    def state_dict(self, *, batches_served: int | None = None, num_workers: int | None = None) -> dict[str, Any]:
        """Where this mix is: enough to resume mid-epoch; with each source's order keys
        (batch size, ``buffer_chunks``, ``shuffle``, ``drop_last``, samples) and the
        steps per source (``counts``), checked on loading.

        Parameters
        ----------
        batches_served, num_workers
            For a loop over a DataLoader: the batches it consumed this epoch and the
            loader's ``num_workers`` (by default what this mix's own iteration counted).

        Raises
        ------
        StreamError
            Without ``batches_served``, while the workers of this mix's ``torch()``
            dataset serve the epoch from where the mix stands, as for a stream (see
            :meth:`Stream.state_dict`).
        """
        if batches_served is None and (workers := self._reported_workers()) is not None:
            raise uncounted_workers("mix", workers, self.epoch, self._served, self.steps)
        served = self._served if batches_served is None else int(batches_served)
        if served < self._iter_start:
            raise StreamError(f"mix: state_dict: batches_served counts this epoch's batches, at least the "
                              f"{self._iter_start} served before this iteration began; got "
                              f"{served}")
        if served > self.steps:
            raise StreamError(f"mix: state_dict: batches_served must be 0 to {self.steps} (this epoch's steps), "
                              f"got {served}")
        if num_workers is None and served > self._served:
            # The DataLoader's workers said how many they are (see Stream.state_dict).
            num_workers = self._reported_workers()
            if num_workers is None and self._served_workers is None and served < self.steps:
                raise StreamError(f"mix: state_dict(batches_served={served}): this mix cannot tell how many "
                                  "DataLoader workers served those batches (its torch() dataset's workers say so "
                                  "when they start; these did not, or the mix moved since): pass num_workers= "
                                  "(the loader's num_workers, 0 for a loop in this process)")
        state = {"epoch": self.epoch, "batches_served": served,
                 "seed": self.seed, "rank": self.rank, "world_size": self.world_size, "steps_per_epoch": self.steps,
                 "counts": list(self.counts), "sources": [self._source_keys(s) for s in self.streams]}
        if num_workers is not None or self._served_workers is not None:
            # Recorded whoever served (a loop in this process is one server): a loader
            # of another number of workers would take its turns over other shares.
            state["num_workers"] = max(1, int(num_workers if num_workers is not None else self._served_workers))
        return state

    def served_by(self, num_workers: int, run: int = 0) -> None:
        """In a DataLoader worker, before its first batch: tell the main process how many
        workers serve (see :meth:`Stream.served_by`)."""
        board = self._board
        if board is not None and board.report(self._board_seen, max(1, int(num_workers)), run):
            warn_loader_again("mix", self.epoch)

    def _reported_workers(self) -> int | None:
        board = self._board
        return board.reported(self._board_seen) if board is not None and board.owned() else None

    def serving_in_process(self) -> None:
        """An iteration in this process begins (a plain loop, ``DataLoader(num_workers=0)``):
        one server, recorded by ``state_dict`` (see :meth:`Stream.serving_in_process`)."""
        board = self._board
        if board is not None and board.owned():
            board.report(self._board_seen, 0)  # no DataLoader workers serve this iteration
        if self._served_workers is None:
            self._served_workers = 1

    @staticmethod
    def _source_keys(s: Stream) -> dict[str, Any]:
        """What a source's order depends on (see :data:`~pipeline.streaming.streamer.ORDER_KEYS`);
        a source with ``global_batch_size`` has it instead of a per-rank batch size."""
        keys = {key: getattr(s, key) for key in ORDER_KEYS}
        if s.global_batch_size is not None:
            keys["global_batch_size"] = s.global_batch_size
            del keys["batch_size"]
        return keys

    def _check_sources(self, state: Mapping[str, Any]) -> None:
        """Refuse a state whose sources' orders differ from this mix's. A source's
        position runs on across mix epochs, so this holds at an epoch's start too."""
        if "counts" in state and [int(c) for c in state["counts"]] != list(self.counts):
            raise StreamError(f"mix: state_dict was saved with counts={list(state['counts'])}, this mix has "
                              f"{list(self.counts)} (other weights); resume with the same weights")
        saved = state.get("sources")
        if saved is None:
            if "n_samples" in state or "buffer_chunks" in state:
                raise StreamError("mix: state_dict was saved by a single stream (it has n_samples and "
                                  "buffer_chunks, no sources); load it into that stream, not into a mix")
            return
        if len(saved) != len(self.streams):
            raise StreamError(f"mix: state_dict was saved with {len(saved)} sources, this mix has {len(self.streams)}")
        for i, (keys, s) in enumerate(zip(saved, self.streams)):
            for key, have in self._source_keys(s).items():
                if key in keys and saved_value(keys[key], have) != have:
                    raise StreamError(f"mix: state_dict was saved with source {i}'s {key}={keys[key]!r}, this mix's "
                                      f"source {i} has {key}={have!r}; resuming would skip and repeat its samples")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields exactly the batches not yet served (on any
        world size when :attr:`elastic`)."""
        keys = [("seed", self.seed), ("steps_per_epoch", self.steps)]
        if not self.elastic:
            keys += [("rank", self.rank), ("world_size", self.world_size)]
        for key, have in keys:
            if key in state and int(state[key]) != have:
                fix = ("; a mix of streams without global_batch_size resumes only the rank that saved the state: "
                       "save each rank's own state_dict() and load it on that rank, or give every source "
                       "global_batch_size=") if key in ("rank", "world_size") else ""
                raise StreamError(f"mix: state_dict was saved with {key}={state[key]}, this mix has {have}{fix}")
        self._check_sources(state)
        served = int(state["batches_served"])
        if not 0 <= served <= self.steps:
            raise StreamError(f"mix: batches_served must be 0 to {self.steps}, got {served}")
        self.epoch = int(state["epoch"])
        self._served = self._iter_start = served
        workers = state.get("num_workers")
        self._served_workers = None if workers is None else max(1, int(workers))
        self._cut_short = False
        self._publish()

    @property
    def threads(self) -> int:
        """Decoding threads of each source's stream; setting it sets them all."""
        return max(s.threads for s in self.streams)

    @threads.setter
    def threads(self, value: int) -> None:
        for s in self.streams:
            s.threads = value

    def schedule(self, epoch: int | None = None) -> np.ndarray:
        """The source of every step of ``epoch`` (default: the current one) on this rank."""
        e = self.epoch if epoch is None else int(epoch)
        got = self._schedules.get(e)
        if got is None:
            got = quota_schedule(self.counts, tie_order(len(self.streams), self.seed, e))
            got.flags.writeable = False
            # Two epochs are enough: the one served and the next one, planned early.
            self._schedules = {k: v for k, v in self._schedules.items() if k in (e - 1, e + 1)}
            self._schedules[e] = got
        return got

    def _range(self, worker: int, num_workers: int) -> tuple[int, int]:
        return self.steps * worker // num_workers, self.steps * (worker + 1) // num_workers

    def _starts(self, sched: np.ndarray, step: int, epoch: int) -> np.ndarray:
        """Each source's position in its batch sequence at ``step`` of ``epoch``."""
        before = np.bincount(sched[:step], minlength=len(self.streams))
        return np.asarray(self.counts, dtype=np.int64) * epoch + before

    def plan(self, worker: int = 0, num_workers: int = 1, *, epoch: int | None = None) -> MixPlan:
        """What one DataLoader worker of this rank serves in ``epoch`` (default: the current one)."""
        e = self.epoch if epoch is None else int(epoch)
        sched = self.schedule(e)
        lo, hi = self._range(worker, num_workers)
        pos = self._starts(sched, lo, e)
        positions, sizes = [], []
        plans: dict[tuple[int, int], tuple[int, ...]] = {}
        for i in sched[lo:hi].tolist():
            p = int(pos[i])
            pos[i] += 1
            source_epoch, k = divmod(p, self.lengths[i])
            if (i, source_epoch) not in plans:
                plans[i, source_epoch] = self.streams[i].plan(epoch=source_epoch).batch_sizes
            positions.append(p)
            sizes.append(plans[i, source_epoch][k])
        return MixPlan(sources=tuple(sched[lo:hi].tolist()), positions=tuple(positions), batch_sizes=tuple(sizes))

    def __iter__(self) -> Iterator[tuple[np.ndarray, ...]]:
        """The rest of the current epoch, as for a stream (see :meth:`Stream.__iter__`)."""
        if self._served and self._cut_short:
            warn_continued("mix", self.epoch, self._served, self.steps)
        self._iter_start = self._served
        self.serving_in_process()
        for batch in self.iter_resumed(0, 1, read_ahead=True):
            self._served += 1
            self._served_workers = 1
            self._cut_short = True
            yield batch
        self._served, self._cut_short, self._iter_start = 0, False, 0
        self._served_workers = None

    def iter_resumed(self, worker: int, num_workers: int, *, read_ahead: bool = False
                     ) -> Iterator[tuple[np.ndarray, ...]]:
        """One DataLoader worker's share of what is left of the epoch after
        :meth:`load_state_dict`.

        Raises
        ------
        StreamError
            When the state was saved with another number of DataLoader workers.
        """
        num_workers = max(1, num_workers)
        skip, share = 0, worker
        if self._served:
            if self._served_workers not in (None, num_workers):
                def serving(n: int) -> str:
                    return f"{n} DataLoader workers" if n > 1 else "one server (a loop in one process, or one worker)"

                raise StreamError(f"mix: state_dict was saved while {serving(self._served_workers)} served, here "
                                  f"{serving(num_workers)}; resume a mix on as many workers")
            # The DataLoader took batches from the workers in turn: each share skips what
            # it delivered, and the turns go on where they stopped.
            counts = [hi - lo for lo, hi in (self._range(k, num_workers) for k in range(num_workers))]
            share, skip = resumed_share(counts, self._served, worker)
        return self.iter_worker(share, num_workers, skip_batches=skip, read_ahead=read_ahead)

    def iter_worker(self, worker: int, num_workers: int, *, skip_batches: int = 0, read_ahead: bool = False
                    ) -> Iterator[tuple[np.ndarray, ...]]:
        """Batches of one DataLoader worker's share of the epoch (all of it for ``0, 1``),
        after skipping its first ``skip_batches``."""
        e = self.epoch
        sched = self.schedule(e)
        lo, hi = self._range(worker, num_workers)
        start = min(lo + skip_batches, hi)
        pos = self._starts(sched, start, e)
        need = np.bincount(sched[start:hi], minlength=len(self.streams))
        runs = [self._source_run(i, int(pos[i]), int(need[i]), read_ahead) for i in range(len(self.streams))]
        try:
            for i in sched[start:hi].tolist():
                yield next(runs[i])
        finally:
            for run in runs:
                run.close()  # stops each source's reader threads

    def _source_run(self, i: int, position: int, count: int, read_ahead: bool) -> Iterator[tuple[np.ndarray, ...]]:
        """``count`` batches of source ``i`` from ``position`` of its batch sequence, through
        as many of its epochs as they span."""
        s, length = self.streams[i], self.lengths[i]
        while count > 0:
            source_epoch, k = divmod(position, length)
            n = min(length - k, count)
            s.set_epoch(source_epoch)
            # A pass served to its end reads the source's next epoch ahead; one the mix
            # epoch stops inside is resumed from its group in the next mix epoch.
            batches = s.iter_worker(0, 1, skip_batches=k, read_ahead=read_ahead and k + n == length)
            try:
                for _ in range(n):
                    batch = next(batches, None)
                    if batch is None:
                        raise StreamError(f"mix: source {i} ended its epoch {source_epoch} before its "
                                          f"{length} batches; was its stream changed while mixing?")
                    yield batch
            finally:
                batches.close()
            position += n
            count -= n

    def close(self) -> None:
        """Free every source stream's buffers and threads (see :meth:`Stream.close`)."""
        for s in self.streams:
            s.close()

    def __enter__(self) -> "Mix":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- adapters ---------------------------------------------------------------------

    def keras(self, **kwargs: Any) -> Any:
        """A ``keras.utils.PyDataset`` over this mix (see :mod:`pipeline.streaming.keras`)."""
        from pipeline.streaming.keras import KerasDataset

        return KerasDataset(self, **kwargs)

    def torch(self, *, pin_memory: bool = False) -> Any:
        """A ``torch.utils.data.IterableDataset`` (see :mod:`pipeline.streaming.torch`)."""
        from pipeline.streaming.torch import TorchDataset

        return TorchDataset(self, pin_memory=pin_memory)


def _open_source(i: int, item: Any, batch_size: int | None, seed: int, rank: int | None,
                 world_size: int | None, stream_kwargs: dict[str, Any]) -> Stream:
    """One source of :func:`mix` as a stream: a made stream as it is, or opened."""
    if isinstance(item, Stream):
        for key, want in (("rank", rank), ("world_size", world_size)):
            if want is not None and getattr(item, key) != want:
                raise StreamError(f"mix: source {i} is a stream with {key}={getattr(item, key)}, the mix was "
                                  f"given {key}={want}")
        return item
    kwargs = dict(stream_kwargs)
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], str):
        item, kwargs["split"] = item
    if batch_size is None and kwargs.get("global_batch_size") is None:
        raise StreamError(f"mix: batch_size or global_batch_size is needed to open source {i} ({item!r}); got None")
    token = EMPTY_EPOCHS_OK.set(True)  # the mix refuses a weighted source without batches itself
    try:
        return stream(item, batch_size=batch_size, seed=seed, rank=rank, world_size=world_size, **kwargs)
    finally:
        EMPTY_EPOCHS_OK.reset(token)


def mix(
    sources: Sequence[Any],
    *,
    weights: Sequence[float],
    batch_size: int | None = None,
    seed: int = 0,
    rank: int | None = None,
    world_size: int | None = None,
    epoch_length: int | None = None,
    **stream_kwargs: Any,
) -> Mix:
    """Stream whole batches from several sources in proportion to ``weights``.

    Parameters
    ----------
    sources
        Each one of: anything :func:`pipeline.stream` takes as its ``source`` (a store
        path or URL, a ``zarr.Group``, a mapping or tuple of arrays), streamed with
        ``stream_kwargs`` (its ``split`` included); a pair ``(store, split)``, which
        streams that split; or a :class:`~pipeline.streaming.Stream` already made, used
        as it is (its own batch size, seed and options; it must be this rank's share).
        The same stream object may appear only once.
    weights
        One number per source, 0 or more, with a positive sum; only their ratios matter.
        A source of weight 0 is never drawn.
    batch_size
        Samples per batch of the sources opened here (not needed when every source is a
        stream, or with ``global_batch_size=`` among ``stream_kwargs``: an order that
        does not depend on the world size, see :mod:`pipeline.streaming.mix`).
    seed
        Seeds the schedule's tie order and the shuffles of the sources opened here: an
        integer, 0 or more, the same on every rank (see :func:`pipeline.stream`).
    rank
        This process's rank, as in :func:`pipeline.stream` (default from
        ``torch.distributed`` when initialized, else ``0``).
    world_size
        The number of ranks (default from ``torch.distributed``, else ``1``).
    epoch_length
        Steps per mix epoch; default ``ceil(max_i L_i / p_i)`` (see
        :mod:`pipeline.streaming.mix`).
    **stream_kwargs
        Passed to :func:`pipeline.stream` for the sources opened here (``split``,
        ``arrays``, ``buffer_chunks``, ``drop_last``, ``threads``, ...). Each source
        keeps its own buffers: memory is the sum of the sources' streams.

    Returns
    -------
    Mix
        ``len(m)`` steps per epoch on every rank; ``m.counts[i]`` of them from source
        ``i``; ``m.schedule()`` names the source of each step; ``set_epoch``,
        ``state_dict`` / ``load_state_dict``, ``.keras()`` and ``.torch()`` as for a
        stream.
    """
    if isinstance(sources, (str, bytes, Mapping)) or not isinstance(sources, Sequence) or not sources:
        raise StreamError(f"mix: sources must be a non-empty list of stores, (store, split) pairs or streams, "
                          f"got {sources!r}")
    shares(weights, len(sources))  # bad weights and seeds are reported before any store is opened
    seed = check_seed(seed, "mix")
    streams = [_open_source(i, item, batch_size, seed, rank, world_size, stream_kwargs)
               for i, item in enumerate(sources)]
    seen: dict[int, int] = {}
    for i, s in enumerate(streams):
        if id(s) in seen:
            raise StreamError(f"mix: sources {seen[id(s)]} and {i} are the same stream object; make one stream "
                              "per source")
        seen[id(s)] = i
    return Mix(streams, weights=weights, seed=seed, epoch_length=epoch_length)
