"""Elastic order: global steps whose samples do not depend on the world size.

With ``global_batch_size=G`` (:func:`pipeline.stream`) the epoch is planned as a
sequence of *global steps* of ``G`` samples, a function of the store, ``G``, the seed,
the epoch, ``buffer_chunks`` and ``drop_last`` alone. Rank ``r`` of ``W`` serves
``G / W`` samples of every global step, so a run may stop on 2 ranks and go on, mid-epoch,
on 3: the rest of the epoch is the same global steps an uninterrupted run serves.

**Lanes.** The epoch's sample sequence (the chunks' samples in the permuted order of
:func:`~pipeline.streaming.plan.chunk_order`) is cut into ``L`` contiguous lanes of equal
length (up to one sample), ``L`` the least common multiple of the world sizes from 1 to 8
that divide ``G`` (:func:`lane_count`: 8 for a power of two from 8 up, 24 for 24, 48 or
96). Every lane serves ``m = G / L`` samples at every step, so global step ``j`` is the
union of the lanes' ``j``-th micro-batches. Rank ``r`` of ``W`` (any ``W`` dividing ``L``)
serves lanes ``[r L / W, (r + 1) L / W)``: the same contiguous stretch of the chunk
sequence that rank ``r`` reads without ``global_batch_size``, so each rank reads its own
chunks, not all of them.

**The last step.** An epoch of ``N`` samples is ``ceil(N / G)`` global steps, all of
``G`` samples but the last, which holds the ``R = N mod G`` left (none with
``drop_last``, as ``batch_size=`` ends an epoch with one short batch). Since lane ``l``
starts at sample ``floor(l N / L)``, its share of that step is ``floor((l + 1) R / L) -
floor(l R / L)`` samples: rank ``r`` of ``W`` gets ``floor((r + 1) R / W) - floor(r R /
W)``, so the ranks' shares differ by at most one sample on every world size, and DDP's
average over ranks weighs the step's samples alike. A world size above ``R`` would leave
a rank without a sample in the last step, and is refused without ``drop_last``
(:meth:`Lanes.check_world_size`). Layouts before :data:`LAYOUT` 2 spread the step over
the last two when ``R`` was below ``L``; their mid-epoch states are refused where the
steps they served differ (:func:`legacy_first_step`).

**Groups.** Global steps are taken ``T`` at a time, ``T = ceil(buffer_chunks * C / G)``
(``C`` the longest chunk): a group of steps holds ``buffer_chunks`` chunks' worth of
samples of the whole job, whatever its world size. Each lane mixes its samples of a
group (a permutation seeded by ``(seed, epoch, lane, group)``) and deals them out to the
group's steps in that order. A rank loads its lanes' samples of a group into one buffer,
batch after batch, each decoded straight to its place, so that a batch is a run of the
buffer served without a copy; inside a batch the rank's samples are mixed once more
(seeded by the rank and world size too: only a step's *set* of samples is fixed).

**What it costs.** Memory: a rank's group holds ``buffer_chunks / W`` chunks' worth of
samples: one rank holds what a stream without ``global_batch_size`` holds, more ranks
less each, the job as a whole the same. Reads: a rank reads the chunks of its stretch
of the sequence, as without, each once per epoch: a lane's share of a group is
``buffer_chunks / L`` chunks' worth, so a chunk is often cut into pieces that go to
different groups, but a chunk of one worker's plan read in several pieces is decoded
once (:mod:`~pipeline.streaming.shared`; large blosc chunks are read by blocks instead,
and large chunks of other codecs are decoded once per piece); a chunk whose pieces two
DataLoader workers serve is read by both. Shuffle quality:
a batch mixes the samples of the rank's ``L / W`` lanes, each drawn from about
``max(1, buffer_chunks / L)`` chunks, so one rank's batches mix more chunks than without
``global_batch_size`` and 8 ranks' fewer; raise ``buffer_chunks`` with the world size to
keep them (``benchmarks/bench_elastic.py`` measures both).

**Workers and resuming.** The steps left in an epoch are shared among a rank's
DataLoader workers as contiguous runs ending where groups do (:func:`worker_steps`: a
worker serving part of a group would read all of it); a DataLoader takes their
batches in turns (:func:`~pipeline.streaming.plan.round_robin_consumed`), so what a
loop has consumed is known from the count of its batches and the number of workers
(:func:`consumed_steps`). A state records the steps done before the iteration in
progress (as intervals), the batches served and the workers serving them: any rank, on
any world size dividing ``L``, with any number of workers, recomputes the steps left and
serves each once. On as many workers as served the state, each worker goes on with a
run of the interrupted loop, the turns taken up where they stopped
(:func:`~pipeline.streaming.plan.resumed_share`): the rest comes in the uninterrupted
order. On another number of workers the steps left are shared anew, and the loop's
order depends on the workers (a DataLoader interleaves its workers' runs), but every
rank, given the same state and workers, serves the same global step at each turn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pipeline.errors import StreamError
from pipeline.streaming.plan import Piece, chunk_order, round_robin_consumed

__all__ = [
    "LAYOUT",
    "MAX_WORLD_SIZE",
    "ElasticPlan",
    "Lanes",
    "consumed_steps",
    "elastic_plan",
    "elastic_served_order",
    "epoch_lanes",
    "lane_count",
    "legacy_first_step",
    "per_rank_batch",
    "remaining_steps",
    "step_intervals",
    "worker_steps",
]

#: Every world size up to this one that divides the global batch gets the same global steps.
MAX_WORLD_SIZE = 8

#: The layout of an epoch's steps that a state records (``elastic_layout``): 2 ends an
#: epoch with one short step. States without it were saved by layout 1, which made the
#: last two steps short when the last step held fewer samples than lanes.
LAYOUT = 2


def lane_count(global_batch_size: int) -> int:
    """Lanes of a global batch: the least common multiple of the world sizes from 1 to
    :data:`MAX_WORLD_SIZE` that divide it (a divisor of the global batch)."""
    return math.lcm(*(w for w in range(1, MAX_WORLD_SIZE + 1) if global_batch_size % w == 0))


def per_rank_batch(global_batch_size: int, world_size: int) -> int:
    """Samples per rank and step; the world size must divide the lanes.

    Raises
    ------
    StreamError
        When ``world_size`` does not divide :func:`lane_count` of the global batch.
    """
    lanes = lane_count(global_batch_size)
    if lanes % world_size:
        sizes = [w for w in range(1, lanes + 1) if lanes % w == 0]
        raise StreamError(f"stream: global_batch_size={global_batch_size} is served on world sizes dividing its "
                          f"{lanes} lanes ({', '.join(map(str, sizes))}); got world_size={world_size}")
    return global_batch_size // world_size


@dataclass(frozen=True, slots=True)
class Lanes:
    """An epoch's lanes and steps: lane ``l`` is positions ``[starts[l], starts[l + 1])``
    of the epoch's sample sequence; it serves ``micro`` samples at each of ``steps``
    global steps, except its last ``tail.shape[1]`` steps, which serve ``tail[l]``."""

    global_batch: int
    micro: int
    steps: int
    group_steps: int
    starts: np.ndarray
    tail: np.ndarray

    @property
    def n_lanes(self) -> int:
        return int(self.starts.size - 1)

    @property
    def n_groups(self) -> int:
        return -(-self.steps // self.group_steps)

    def check_world_size(self, world_size: int) -> None:
        """Refuse a world size on which a rank would have an empty batch.

        Raises
        ------
        StreamError
            When the epoch's last step holds fewer samples than ``world_size`` (its
            ranks' shares differ by at most one: some would be 0), without drop_last.
        """
        if not self.tail.size:
            return
        last = self.tail[:, -1].reshape(world_size, -1).sum(axis=1)
        if int(last.min()) == 0:
            n, rest = int(self.starts[-1]), int(self.tail[:, -1].sum())
            raise StreamError(
                f"stream: {n} samples: global steps of global_batch_size={self.global_batch} leave {rest} for "
                f"the epoch's last step, fewer than world_size={world_size}: a rank would have no sample in it; "
                f"use drop_last=True, a world size of at most {rest}, or another global batch")

    def group_range(self, group: int) -> tuple[int, int]:
        """Global steps ``[t0, t1)`` of a group."""
        return group * self.group_steps, min(self.steps, (group + 1) * self.group_steps)

    def before(self, l0: int, l1: int, t: np.ndarray | int) -> np.ndarray:
        """Samples lanes ``l0..l1-1`` served before step(s) ``t``: shape ``(l1 - l0,) + shape(t)``."""
        t = np.asarray(t, dtype=np.int64)
        full = self.steps - self.tail.shape[1]
        cum = np.concatenate([np.zeros((self.n_lanes, 1), np.int64), np.cumsum(self.tail, axis=1)], axis=1)
        head = self.micro * np.minimum(t, full)
        extra = cum[l0:l1][:, np.clip(t - full, 0, self.tail.shape[1])]
        return head + extra

    def rank_before(self, l0: int, l1: int, t: np.ndarray) -> np.ndarray:
        """Samples lanes ``l0..l1-1`` together served before each step of ``t``."""
        t = np.asarray(t, dtype=np.int64)
        k = self.tail.shape[1]
        full = self.steps - k
        cum = np.concatenate([[0], np.cumsum(self.tail[l0:l1].sum(axis=0))])
        return (l1 - l0) * self.micro * np.minimum(t, full) + cum[np.clip(t - full, 0, k)]

    def sizes(self, l0: int, l1: int, t0: int, t1: int) -> np.ndarray:
        """Samples lanes ``l0..l1-1`` serve at steps ``t0..t1-1``: shape ``(l1 - l0, t1 - t0)``."""
        out = np.full((l1 - l0, t1 - t0), self.micro, dtype=np.int64)
        full = self.steps - self.tail.shape[1]
        if t1 > full:
            a = max(t0, full)
            out[:, a - t0 :] = self.tail[l0:l1, a - full : t1 - full]
        return out


def epoch_lanes(n_samples: int, *, global_batch_size: int, drop_last: bool, longest_chunk: int,
                buffer_chunks: int) -> Lanes:
    """The lanes and steps of every epoch of ``n_samples`` samples (see the module notes):
    every step full but the last, which holds ``n_samples mod global_batch_size``."""
    n_lanes = lane_count(global_batch_size)
    micro = global_batch_size // n_lanes
    starts = np.array([n_samples * k // n_lanes for k in range(n_lanes + 1)], dtype=np.int64)
    steps = n_samples // global_batch_size if drop_last else -(-n_samples // global_batch_size)
    if drop_last or n_samples % global_batch_size == 0:
        tail = np.empty((n_lanes, 0), dtype=np.int64)
    else:
        # Lane l is micro * (steps - 1) samples long, plus its share of the last step
        # (the lane starts floor(l N / L) spread that step's samples evenly).
        tail = (np.diff(starts) - micro * (steps - 1)).reshape(n_lanes, 1)
    group_steps = max(1, -(-buffer_chunks * longest_chunk // global_batch_size))
    return Lanes(global_batch=global_batch_size, micro=micro, steps=steps, group_steps=group_steps,
                 starts=starts, tail=tail)


def legacy_first_step(lanes: Lanes) -> int | None:
    """The first step whose samples a state saved before :data:`LAYOUT` 2 meant
    otherwise, or None when both layouts agree.

    Layout 1 gave every lane a sample in the last step: when it held fewer samples than
    lanes, the lanes without one took one from the step before. Only those two steps'
    samples differ, but a group mixes its samples over its steps, so the steps of the
    groups that hold them (the last, and the one before when the last starts at the
    epoch's last step) are laid out otherwise too.
    """
    if not lanes.tail.size or lanes.steps < 2 or int(lanes.tail.min()) > 0:
        return None
    return (lanes.steps - 2) // lanes.group_steps * lanes.group_steps


# -- steps left, and who serves them -------------------------------------------------------


def remaining_steps(n_steps: int, done: Sequence[Sequence[int]]) -> np.ndarray:
    """The steps of ``0..n_steps-1`` outside the intervals ``done`` (``[a, b)`` pairs), ascending.

    Raises
    ------
    StreamError
        When an interval is not within ``0..n_steps``.
    """
    left = np.ones(n_steps, dtype=bool)
    for pair in done:
        if len(pair) != 2 or not 0 <= int(pair[0]) <= int(pair[1]) <= n_steps:
            raise StreamError(f"state_dict: 'done' holds [start, stop) steps within 0..{n_steps}, got {list(pair)!r}")
        left[int(pair[0]) : int(pair[1])] = False
    return np.flatnonzero(left).astype(np.int64)


def step_intervals(steps: np.ndarray) -> list[list[int]]:
    """Ascending steps as ``[start, stop)`` runs (how a state records them)."""
    steps = np.asarray(steps, dtype=np.int64)
    if steps.size == 0:
        return []
    cut = np.flatnonzero(np.diff(steps) != 1) + 1
    first = steps[np.concatenate([[0], cut])]
    last = steps[np.concatenate([cut - 1, [steps.size - 1]])] + 1
    return [[int(a), int(b)] for a, b in zip(first, last)]


def worker_steps(remaining: np.ndarray, worker: int, num_workers: int, group_steps: int = 1) -> np.ndarray:
    """A DataLoader worker's share of the steps left: a contiguous run of them.

    The runs end where a group of ``group_steps`` steps does, nearest to an even split,
    so that no group is read by two workers (its samples are mixed over all its steps:
    a worker serving part of it reads all of it).
    """
    return remaining[_cut(remaining, worker, num_workers, group_steps):
                     _cut(remaining, worker + 1, num_workers, group_steps)]


def _cut(remaining: np.ndarray, k: int, num_workers: int, group_steps: int) -> int:
    """Where worker ``k``'s share of ``remaining`` begins: the even split, moved to the
    nearest group boundary (ties to the earlier one)."""
    n = remaining.size
    p = n * k // num_workers
    if p in (0, n) or group_steps == 1:
        return p
    g = int(remaining[p]) // group_steps
    lo = int(np.searchsorted(remaining, g * group_steps))
    hi = int(np.searchsorted(remaining, (g + 1) * group_steps))
    return lo if p - lo <= hi - p else hi


def consumed_steps(remaining: np.ndarray, served: int, num_workers: int, group_steps: int = 1) -> np.ndarray:
    """The steps a loop over ``num_workers`` DataLoader workers took in its first ``served``
    batches, when the workers shared ``remaining`` (:func:`worker_steps`), ascending."""
    shares = [worker_steps(remaining, k, num_workers, group_steps) for k in range(num_workers)]
    taken = round_robin_consumed([s.size for s in shares], served)
    return np.concatenate([s[:t] for s, t in zip(shares, taken)] + [np.empty(0, np.int64)])


# -- one worker's plan -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ElasticPlan:
    """What one worker of one rank serves: the global ``steps``, and for the groups they
    touch, the pieces to read (``groups`` are piece index ranges, as in a
    :class:`~pipeline.streaming.plan.WorkerPlan`). Batch ``k`` is samples
    ``[batch_offset[k], batch_offset[k] + batch_sizes[k])`` of group ``batch_group[k]``'s
    buffer, laid out by :meth:`order`."""

    pieces: tuple[Piece, ...]
    groups: tuple[tuple[int, int], ...]
    batch_sizes: tuple[int, ...]
    steps: np.ndarray
    batch_group: np.ndarray
    batch_offset: np.ndarray
    group_ids: tuple[int, ...]
    lanes: Lanes
    lane_range: tuple[int, int]
    key: tuple[int, int, bool, int, int]  # seed, epoch, shuffle, rank, world_size

    def order(self, i: int) -> np.ndarray:
        """Group ``i``'s mixing: ``perm[k]`` is the sample (counted over the group's pieces,
        in order) at place ``k`` of the group's buffer."""
        seed, epoch, shuffle, rank, world_size = self.key
        g = self.group_ids[i]
        l0, l1 = self.lane_range
        t0, t1 = self.lanes.group_range(g)
        z = self.lanes.sizes(l0, l1, t0, t1)
        per_step = z.sum(axis=0)
        batch_off = np.concatenate([[0], np.cumsum(per_step)])
        lane_off = np.cumsum(z, axis=0) - z  # where each lane's samples start in a batch
        places = np.empty(int(batch_off[-1]), dtype=np.int64)
        base = 0
        for i_lane in range(l1 - l0):
            zi = z[i_lane]
            n = int(zi.sum())
            step = np.repeat(np.arange(t1 - t0), zi)  # the step of the lane's k-th sample dealt
            slot = np.arange(n) - (np.cumsum(zi) - zi)[step]
            dealt = lane_permutation(n, seed=seed, epoch=epoch, lane=l0 + i_lane, group=g, shuffle=shuffle)
            places[base + dealt] = batch_off[step] + lane_off[i_lane, step] + slot
            base += n
        if shuffle:
            # Mix the rank's lanes inside each batch: sorting by (batch, random key)
            # permutes every batch's places among themselves.
            keys = np.random.default_rng([seed, epoch, g, rank, world_size, 0xBA7]).random(places.size)
            within = np.argsort(np.repeat(np.arange(t1 - t0), per_step) + keys, kind="stable")
            places = within[places]
        perm = np.empty_like(places)
        perm[places] = np.arange(places.size, dtype=np.int64)
        return perm


def lane_permutation(n: int, *, seed: int, epoch: int, lane: int, group: int, shuffle: bool) -> np.ndarray:
    """The order in which a lane deals its samples of a group to the group's steps."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng([seed, epoch, lane, group, 0xE1A5]).permutation(n).astype(np.int64)


def _lane_pieces(order: np.ndarray, seq: np.ndarray, bounds: np.ndarray) -> list[tuple[int, int, int, int]]:
    """``(group index, chunk, lo, hi)`` of a lane whose groups are positions
    ``[bounds[i], bounds[i + 1])`` of the sequence whose chunk ``order[k]`` starts at ``seq[k]``."""
    a, b = int(bounds[0]), int(bounds[-1])
    inner = seq[(seq > a) & (seq < b)]
    cuts = np.unique(np.concatenate([bounds, inner]))
    lo, hi = cuts[:-1], cuts[1:]
    k = np.searchsorted(seq, lo, side="right") - 1
    gi = np.searchsorted(bounds, lo, side="right") - 1
    return [(int(g), int(order[c]), int(x - seq[c]), int(y - seq[c])) for g, c, x, y in zip(gi, k, lo, hi)]


def elastic_plan(lengths: Sequence[int], lanes: Lanes, *, steps: np.ndarray, seed: int, epoch: int,
                 shuffle: bool, rank: int, world_size: int) -> ElasticPlan:
    """The plan of a worker of rank ``rank`` of ``world_size`` that serves the global
    ``steps`` (ascending) of ``epoch``."""
    steps = np.asarray(steps, dtype=np.int64)
    per = lanes.n_lanes // world_size
    l0, l1 = rank * per, (rank + 1) * per
    group_of = steps // lanes.group_steps
    ids = np.unique(group_of)
    order = chunk_order(len(lengths), seed, epoch, shuffle)
    seq = np.concatenate([[0], np.cumsum(np.asarray(lengths, dtype=np.int64)[order])])
    by_group: list[list[Piece]] = [[] for _ in ids]
    if ids.size:
        # Each lane's samples of the groups from the first touched to the last, cut
        # where a chunk ends; those of the touched groups are kept.
        edges = np.minimum(np.arange(ids[0], ids[-1] + 2, dtype=np.int64) * lanes.group_steps, lanes.steps)
        index = np.full(int(ids[-1] - ids[0] + 1), -1, dtype=np.int64)
        index[ids - ids[0]] = np.arange(ids.size)
        for lane in range(l0, l1):
            bounds = int(lanes.starts[lane]) + lanes.before(lane, lane + 1, edges)[0]
            for g, c, x, y in _lane_pieces(order, seq, bounds):
                if index[g] >= 0:
                    by_group[index[g]].append(Piece(c, x, y))
    pieces: list[Piece] = []
    groups = []
    for part in by_group:
        groups.append((len(pieces), len(pieces) + len(part)))
        pieces += part
    # A batch is the rank's samples of its step, after those of the group's steps before it.
    first = group_of * lanes.group_steps
    offsets = lanes.rank_before(l0, l1, steps) - lanes.rank_before(l0, l1, first)
    sizes = lanes.rank_before(l0, l1, steps + 1) - lanes.rank_before(l0, l1, steps)
    return ElasticPlan(pieces=tuple(pieces), groups=tuple(groups), batch_sizes=tuple(sizes.tolist()),
                       steps=steps, batch_group=np.searchsorted(ids, group_of), batch_offset=offsets,
                       group_ids=tuple(ids.tolist()), lanes=lanes, lane_range=(l0, l1),
                       key=(seed, epoch, shuffle, rank, world_size))


def elastic_served_order(plan: ElasticPlan, lengths: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The chunk id and the global sample index of every sample the plan serves, in order
    (for the shuffle quality report and for tests)."""
    starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    chunk_parts, index_parts = [np.empty(0, np.int64)], [np.empty(0, np.int64)]
    for i, (a, b) in enumerate(plan.groups):
        pieces = plan.pieces[a:b]
        if not pieces:
            continue
        ids = np.concatenate([np.full(p.hi - p.lo, p.chunk, dtype=np.int64) for p in pieces])
        idx = np.concatenate([np.arange(starts[p.chunk] + p.lo, starts[p.chunk] + p.hi, dtype=np.int64)
                              for p in pieces])
        perm = plan.order(i)
        ids, idx = ids[perm], idx[perm]
        for k in np.flatnonzero(plan.batch_group == i):
            lo, hi = int(plan.batch_offset[k]), int(plan.batch_offset[k]) + plan.batch_sizes[k]
            chunk_parts.append(ids[lo:hi])
            index_parts.append(idx[lo:hi])
    return np.concatenate(chunk_parts), np.concatenate(index_parts)
