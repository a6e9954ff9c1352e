"""Pure epoch planning: chunk order, rank and worker shares, batch sizes, buffer groups.

Everything here is a function of integers (chunk lengths, seed, epoch, rank, world size,
worker, workers, batch size, buffer size), so every rank and DataLoader worker computes
the same global plan without talking to the others, and a resumed stream recomputes it
from a few integers instead of replaying what was served.

The epoch's sample sequence is the chunks' samples in a permuted chunk order. Rank ``r``
of ``W`` takes the contiguous slice ``[N*r//W, N*(r+1)//W)`` of it, so ranks differ by at
most one sample; inside a rank, batches are split contiguously among DataLoader workers.
Each worker mixes its samples within groups of ``buffer_chunks`` chunk pieces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from pipeline.errors import StreamError

__all__ = [
    "Piece",
    "WorkerPlan",
    "batch_sizes",
    "batches_per_rank",
    "check_batch_counts",
    "chunk_order",
    "group_permutation",
    "pieces_for_range",
    "rank_range",
    "resumed_share",
    "round_robin_consumed",
    "served_order",
    "shuffle_quality",
    "worker_plan",
]


@dataclass(frozen=True, slots=True)
class Piece:
    """Samples ``[lo, hi)`` of chunk ``chunk`` (offsets inside the chunk)."""

    chunk: int
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """What one worker of one rank serves in one epoch."""

    pieces: tuple[Piece, ...]
    batch_sizes: tuple[int, ...]
    groups: tuple[tuple[int, int], ...]  # piece index ranges [start, stop) per buffer group


def chunk_order(n_chunks: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """Chunk ids in this epoch's order: a permutation seeded by ``(seed, epoch)``."""
    if not shuffle:
        return np.arange(n_chunks, dtype=np.int64)
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(n_chunks).astype(np.int64)


def rank_range(n_samples: int, rank: int, world_size: int) -> tuple[int, int]:
    """This rank's contiguous slice of the epoch's sample sequence."""
    return n_samples * rank // world_size, n_samples * (rank + 1) // world_size


def batches_per_rank(n_samples: int, world_size: int, batch_size: int, drop_last: bool) -> int:
    """Batches every rank yields per epoch (the same on all ranks)."""
    smallest = n_samples // world_size
    largest = -(-n_samples // world_size)
    if drop_last:
        return smallest // batch_size
    return -(-largest // batch_size)


def check_batch_counts(n_samples: int, world_size: int, batch_size: int, drop_last: bool) -> None:
    """Refuse a split that cannot give every rank :func:`batches_per_rank` non-empty
    batches: checked when a stream is made, on every rank, so that ``len(stream)``
    never promises batches that iterating would then refuse.

    Ranks hold ``n_samples // world_size`` or one more sample; the smallest must fill
    as many batches as the largest. Only ``batch_size=1`` without ``drop_last`` on
    samples that the ranks do not divide fails.

    Raises
    ------
    StreamError
        Naming the samples, ranks and batch size, and the two ways out.
    """
    if drop_last or world_size <= 0:
        return
    smallest = n_samples // world_size
    n_batches = batches_per_rank(n_samples, world_size, batch_size, drop_last)
    if smallest < n_batches:
        raise StreamError(
            f"stream: {n_samples} samples on {world_size} ranks in batches of {batch_size}: every rank must serve "
            f"len(stream) = {n_batches} batches, and a rank's {smallest} samples cannot fill {n_batches} non-empty "
            "batches without serving a sample twice; use drop_last=True or a batch_size above 1"
        )


def batch_sizes(n_rank: int, n_batches: int, batch_size: int, drop_last: bool) -> tuple[int, ...]:
    """Sizes of a rank's batches: full batches, then the remainder; never an empty batch.

    A rank with one sample fewer than the largest rank can come up one sample short of
    filling its last batch; that sample is then taken from the batch before it, so the
    rank still yields ``n_batches`` non-empty batches.
    """
    if n_batches == 0:
        return ()
    if drop_last:
        return (batch_size,) * n_batches
    sizes = [batch_size] * (n_batches - 1) + [n_rank - batch_size * (n_batches - 1)]
    i = n_batches - 2
    while sizes[-1] <= 0 and i >= 0:
        take = min(sizes[i] - 1, 1 - sizes[-1])
        sizes[i] -= take
        sizes[-1] += take
        i -= 1
    if sizes[-1] <= 0 or sum(sizes) != n_rank:
        # Only batch_size=1 with samples not divisible by the ranks gets here: the ranks
        # then cannot have equal batch counts without serving a sample twice.
        raise StreamError(
            f"cannot split a rank's {n_rank} samples into {n_batches} non-empty batches so that every "
            "rank has the same number of batches; use drop_last=True or a batch_size above 1"
        )
    return tuple(sizes)


def pieces_for_range(order: Sequence[int], lengths: Sequence[int], start: int, stop: int) -> list[Piece]:
    """Chunk pieces covering positions ``[start, stop)`` of the sequence of chunks in ``order``."""
    out: list[Piece] = []
    pos = 0
    for c in order:
        n = int(lengths[c])
        lo, hi = max(start - pos, 0), min(stop - pos, n)
        if lo < hi:
            out.append(Piece(int(c), lo, hi))
        pos += n
        if pos >= stop:
            break
    return out


def worker_plan(
    lengths: Sequence[int],
    *,
    seed: int,
    epoch: int,
    shuffle: bool,
    batch_size: int,
    drop_last: bool,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    buffer_chunks: int,
) -> WorkerPlan:
    """The pieces, batch sizes and buffer groups of one worker of one rank."""
    if not 0 <= rank < world_size:
        raise StreamError(f"rank {rank} is outside 0..{world_size - 1}")
    n_samples = int(np.sum(lengths))
    if n_samples < world_size:
        raise StreamError(f"{n_samples} samples cannot be shared among {world_size} ranks")
    order = chunk_order(len(lengths), seed, epoch, shuffle)
    r0, r1 = rank_range(n_samples, rank, world_size)
    n_batches = batches_per_rank(n_samples, world_size, batch_size, drop_last)
    sizes = batch_sizes(r1 - r0, n_batches, batch_size, drop_last)
    b0, b1 = n_batches * worker // num_workers, n_batches * (worker + 1) // num_workers
    offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    s0, s1 = r0 + int(offsets[b0]), r0 + int(offsets[b1])
    pieces = pieces_for_range(order, lengths, s0, s1)
    groups = tuple((g, min(g + buffer_chunks, len(pieces))) for g in range(0, len(pieces), buffer_chunks))
    return WorkerPlan(pieces=tuple(pieces), batch_sizes=tuple(sizes[b0:b1]), groups=groups)


def round_robin_consumed(counts: Sequence[int], served: int) -> list[int]:
    """Batches each DataLoader worker had delivered when ``served`` batches were consumed.

    A DataLoader takes batches from its workers in turn (0, 1, ..., k-1, 0, ...),
    skipping workers that are done; ``counts`` are the workers' batch counts.
    """
    served = int(served)
    if not 0 <= served <= sum(counts):
        raise StreamError(f"{served} batches served, but the workers only have {sum(counts)}")
    # After r whole turns worker k has delivered min(c_k, r): find the most turns that
    # fit, then the next turn goes to the workers still going, in worker order.
    lo, hi = 0, max(counts, default=0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(c, mid) for c in counts) <= served:
            lo = mid
        else:
            hi = mid - 1
    taken = [min(int(c), lo) for c in counts]
    left = served - sum(taken)
    for k, c in enumerate(counts):
        if left and c > lo:
            taken[k] += 1
            left -= 1
    return taken


def resumed_share(counts: Sequence[int], served: int, worker: int) -> tuple[int, int]:
    """Whose share a worker of a fresh DataLoader serves after ``served`` batches of an
    epoch whose workers' shares had ``counts`` batches: ``(share, batches to skip)``.

    A fresh DataLoader iterator takes its first batch from worker 0, while the
    interrupted one would have gone on with the worker whose turn was next (worker 1
    after an odd count on 2 workers). So the turns are rotated: worker ``w`` serves the
    share of the worker ``w`` places after the next one in turn, and the loop gets the
    rest of the epoch in the order an uninterrupted loop would have served it (the
    DataLoader skips a worker whose share is done, in both loops alike).
    """
    taken = round_robin_consumed(counts, served)
    # The next turn is the worker with batches left that has delivered the fewest
    # (those served in the turn in progress have one more), the first of them in order.
    going = [(taken[k], k) for k in range(len(counts)) if taken[k] < counts[k]]
    first = min(going)[1] if going else 0
    share = (first + worker) % len(counts)
    return share, taken[share]


def group_permutation(n: int, *, seed: int, epoch: int, rank: int, worker: int, group: int, shuffle: bool,
                      orders: Any = None) -> np.ndarray:
    """How the samples of one buffer group are mixed.

    ``orders``: a plan that fixes its groups' mixing itself (an
    :class:`~pipeline.streaming.elastic.ElasticPlan`, whose ``order(group)`` is used).
    """
    if orders is not None:
        perm = orders.order(group)
        if perm.size != n:
            raise StreamError(f"group {group}: the plan orders {perm.size} samples, its pieces hold {n}")
        return perm
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    return np.random.default_rng([seed, epoch, rank, worker, group, 0xB0F]).permutation(n).astype(np.int64)


def served_order(
    plan: WorkerPlan, lengths: Sequence[int], *, seed: int, epoch: int, rank: int, worker: int, shuffle: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The chunk id and the global sample index of every sample a worker serves, in order.

    The streamer serves group ``g``'s pieces, concatenated, in the order of
    :func:`group_permutation`; this recomputes that order from the plan alone, so the
    shuffle quality report costs nothing while batches are served.
    """
    starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    chunk_parts: list[np.ndarray] = []
    index_parts: list[np.ndarray] = []
    for g, (a, b) in enumerate(plan.groups):
        pieces = plan.pieces[a:b]
        ids = np.concatenate([np.full(p.hi - p.lo, p.chunk, dtype=np.int64) for p in pieces])
        idx = np.concatenate([np.arange(starts[p.chunk] + p.lo, starts[p.chunk] + p.hi, dtype=np.int64)
                              for p in pieces])
        perm = group_permutation(ids.size, seed=seed, epoch=epoch, rank=rank, worker=worker, group=g,
                                 shuffle=shuffle)
        chunk_parts.append(ids[perm])
        index_parts.append(idx[perm])
    if not chunk_parts:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(chunk_parts), np.concatenate(index_parts)


def shuffle_quality(chunk_ids: np.ndarray, sample_index: np.ndarray, sizes: Sequence[int]) -> dict[str, float]:
    """Mean distinct chunks per batch, and the Spearman rank correlation between a
    sample's position in the epoch and its index in the store (near 0: well shuffled;
    1: served in storage order)."""
    n = int(sample_index.size)
    if n == 0 or not len(sizes):
        return {}
    batch = np.repeat(np.arange(len(sizes), dtype=np.int64), np.asarray(sizes, dtype=np.int64))[:n]
    pairs = np.unique(batch * (int(chunk_ids.max()) + 1) + chunk_ids[: batch.size])
    distinct = np.bincount(pairs // (int(chunk_ids.max()) + 1), minlength=len(sizes))
    if n > 1:
        # Sample indices are distinct, so their ranks are a permutation: no ties to average.
        pos = np.arange(n, dtype=np.float64)
        ranks = np.empty(n, dtype=np.float64)
        ranks[np.argsort(sample_index, kind="stable")] = pos
        rho = float(np.corrcoef(pos, ranks)[0, 1])
    else:
        rho = 1.0
    return {"mean_distinct_chunks_per_batch": float(np.mean(distinct)), "spearman_position_vs_index": rho}
