"""Pure chunk arithmetic for the store: samples per chunk, write units, split ranges."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from pipeline.errors import StoreError

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "TASK_BYTES",
    "chunk_samples_for",
    "last_of_blocks",
    "time_split_ranges",
    "task_block",
    "unit_chunks",
    "unit_samples",
    "units_aligned",
]

#: 4 MiB uncompressed per chunk: large enough that per-chunk overhead (a file or object
#: request, a codec call) is amortized and blosc sees enough data to compress well; small
#: enough that a shuffle buffer of several chunks fits easily in memory and an epoch has
#: many chunks to randomize the order of.
DEFAULT_CHUNK_BYTES = 4 * 2**20


def chunk_samples_for(sample_bytes: int, target_chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Samples per chunk so that a chunk holds about ``target_chunk_bytes`` (at least 1)."""
    return max(1, int(target_chunk_bytes) // max(1, int(sample_bytes)))


#: Uncompressed bytes a write task aims for: it writes as many whole units as fit (at
#: least one). Per task, the scheduler, the client and the worker each pay about a
#: millisecond of Python; a 4 MiB unit compresses in a few milliseconds, so one task per
#: unit left the client and scheduler a fifth of a 2-core machine (see
#: benchmarks/README.md).
TASK_BYTES = 32 * 2**20


def unit_samples(sample_bytes: int, chunk_samples: int | None = None, shard_chunks: int | None = None,
                 target_chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Samples per write unit: a chunk (``chunk_samples``, or sized to hold about
    ``target_chunk_bytes`` of ``sample_bytes`` samples), times ``shard_chunks`` when sharded."""
    chunk = int(chunk_samples) if chunk_samples else chunk_samples_for(sample_bytes, target_chunk_bytes)
    return chunk * (int(shard_chunks) if shard_chunks else 1)


def task_block(unit: int, sample_bytes: int, task_bytes: int | None = None) -> int:
    """Samples one write task writes: as many whole units of ``unit`` samples (of
    ``sample_bytes`` each, the widest array's) as fit in ``task_bytes`` (default
    :data:`TASK_BYTES`), at least one."""
    budget = TASK_BYTES if task_bytes is None else task_bytes
    return int(unit) * max(1, int(budget) // max(1, int(unit) * int(sample_bytes)))


def unit_chunks(n: int, unit: int) -> tuple[int, ...]:
    """Dask chunks along the sample axis that coincide with the zarr write units."""
    if n == 0:
        return (0,)
    full, rest = divmod(n, unit)
    return (unit,) * full + ((rest,) if rest else ())


def last_of_blocks(todo: np.ndarray, per_block: int) -> np.ndarray:
    """The last of ``todo`` (increasing unit numbers) in each block of ``per_block``
    units that holds one: the unit whose marker a block's task writes last."""
    todo = np.asarray(todo, dtype=np.int64)
    if not todo.size:
        return todo
    block = todo // max(1, int(per_block))
    return todo[np.append(block[1:] != block[:-1], True)]


def units_aligned(chunks: Sequence[int], unit: int) -> bool:
    """Whether every dask chunk boundary is a write-unit boundary and no dask chunk
    spans two units (so no two tasks ever touch one zarr chunk or shard)."""
    bounds = np.cumsum(chunks)[:-1]
    return bool(np.all(bounds % unit == 0)) and all(c <= unit for c in chunks)


def time_split_ranges(n: int, fractions: Mapping[str, float], gap: int) -> dict[str, tuple[int, int]]:
    """Contiguous ``[start, stop)`` sample ranges per split, ``gap`` samples left between.

    The same arithmetic as the feature stage's window splits
    (:func:`pipeline.features.geometry.split_ranges`), reported as a storage error.
    """
    from pipeline.errors import WindowError
    from pipeline.features.geometry import split_ranges

    try:
        return split_ranges(n, fractions, gap)
    except WindowError as exc:
        raise StoreError(str(exc)) from None
