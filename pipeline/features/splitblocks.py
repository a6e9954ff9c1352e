"""The arrays of one split, made block by block: one task makes every array of a block.

A block of windows needs the rows of the per-step features its windows span (their
halo included) and the label values and times at their ends. Those rows are sliced
straight out of the chunks of the inputs
(:func:`~pipeline.features.geometry.row_pieces`), so a block is one task: no rechunk
of the inputs to the blocks, no overlap layer, no task per array. Built from dask's
generic layers instead (a rechunk, an overlap, a gather per array), a block cost about
twenty tasks, and a build took 2.4x as long (benchmarks/README.md).

Each array of the split is one field of the made blocks and carries their recipe
(``attrs["blocks"]``, a :class:`~pipeline.storage.units.MadeBlocks`), so that the
writer makes and writes a block in the same task. Anything else that computes them
(``.compute()``, a slice) gets ordinary dask arrays.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.task_spec import Task, TaskRef

from pipeline.features.blockwise import rows_task
from pipeline.features.geometry import chunk_bounds
from pipeline.features.labels import finalize_labels
from pipeline.features.normalize import RowScaler
from pipeline.features.sessions import SegmentTable, WindowRuns
from pipeline.features.specs import LabelSpec
from pipeline.features.windows import windows_numpy_block
from pipeline.storage.units import MadeBlocks

__all__ = ["split_arrays", "window_zscore"]


def window_zscore(block: np.ndarray) -> np.ndarray:
    """Each window z-scored over its own steps, feature by feature (``normalize: window``)."""
    mean = block.mean(axis=1, keepdims=True, dtype=np.float64)
    std = block.std(axis=1, keepdims=True, dtype=np.float64)
    std[std == 0] = 1.0
    return ((block - mean) / std).astype(np.float32)


@dataclass(frozen=True)
class _Geometry:
    """What every block of a split makes its arrays with."""

    size: int
    scales: tuple[int, ...]
    label: LabelSpec
    zscore: bool
    materialize: bool
    ends_dtype: Any
    row_offset: int
    instruments: bool
    scaler: RowScaler | None = None


@dataclass(frozen=True, eq=False)
class _BlockMaker:
    """One block's inputs, ready to make the arrays of any range of its windows: the
    writer makes a block a write unit at a time, so that only one unit's windows exist
    at once (a task's whole block of windows is 8 units of 4 MiB, and one unit's is
    still in the cache when it is encoded).

    ``features``, ``labels`` and ``times`` hold rows from ``origin[name]`` on (the
    features already scaled); ``session`` and ``instrument`` hold one value per run."""

    runs: WindowRuns
    origin: Mapping[str, int]
    session: np.ndarray
    instrument: np.ndarray
    g: _Geometry
    features: np.ndarray | None
    labels: np.ndarray
    times: np.ndarray | None

    def __call__(self, lo: int = 0, hi: int | None = None) -> dict[str, np.ndarray]:
        """Every array of windows ``[lo, hi)`` of the block, in the order they are
        stored: the values of :func:`~pipeline.features.windows.windows_at`,
        :func:`~pipeline.features.windows.gather_rows` and ``finalize_labels``, which
        made them before."""
        runs, origin, g = self.runs, self.origin, self.g
        ends = runs.ends(lo, hi)
        out: dict[str, np.ndarray] = {}
        if g.materialize:
            x = windows_numpy_block(self.features, ends - origin["features"], g.size, g.scales)
            out["x"] = window_zscore(x) if g.zscore else x
        else:
            out["ends"] = (ends + g.row_offset).astype(g.ends_dtype)
        out["y"] = finalize_labels(self.labels[ends - origin["labels"]], g.label)
        if self.times is not None:
            out["t"] = self.times[ends - origin["times"]]
        out["session"] = runs.per_window(self.session, lo, hi).astype(np.int32)
        if g.instruments:
            out["instrument"] = runs.per_window(self.instrument, lo, hi).astype(np.int32)
        return out


def _block_maker(runs: WindowRuns, origin: Mapping[str, int], session: np.ndarray, instrument: np.ndarray,
                 g: _Geometry, features: np.ndarray | None, labels: np.ndarray,
                 times: np.ndarray | None) -> _BlockMaker:
    """A block's :class:`_BlockMaker`, its feature rows scaled once for all its windows."""
    if g.materialize and g.scaler is not None:
        features = g.scaler(features, origin["features"])
    return _BlockMaker(runs, origin, session, instrument, replace(g, scaler=None), features, labels, times)


def _make_block(runs: WindowRuns, origin: Mapping[str, int], session: np.ndarray, instrument: np.ndarray,
                g: _Geometry, features: np.ndarray | None, labels: np.ndarray,
                times: np.ndarray | None) -> dict[str, np.ndarray]:
    """Every array of one whole block of windows (``runs``): see :class:`_BlockMaker`."""
    return _block_maker(runs, origin, session, instrument, g, features, labels, times)()


def split_arrays(f: da.Array | None, runs: WindowRuns, chunks: Sequence[int], labels_steps: da.Array,
                 timestamps: da.Array | None, segs: SegmentTable, *, label: LabelSpec, size: int,
                 scales: Sequence[int], halo: int, zscore: bool, materialize: bool,
                 row_offset: int = 0, scaler: RowScaler | None = None) -> dict[str, da.Array]:
    """The arrays of one split, in blocks of ``chunks`` windows: the windows (or, for
    virtual windows, their end rows counted from ``row_offset``), labels, end times,
    sessions and instruments, each block of all of them made by one task.

    Parameters
    ----------
    f
        ``(T, F)`` per-step features (``None`` for virtual windows).
    runs
        The split's windows.
    chunks
        Windows per block.
    labels_steps
        ``(T, k)`` label values per step (:func:`~pipeline.features.labels.label_steps`).
    timestamps
        ``(T,)`` times, or ``None``.
    segs
        The segments ``runs`` refers to (their sessions and instruments).
    label
        The label, for its stored form.
    size
        Steps per window.
    scales
        Sampling intervals.
    halo
        Rows a window reaches before its end.
    zscore
        Z-score each window over its own steps.
    materialize
        Make the windows (else their end rows).
    row_offset
        Added to stored end rows (an append's rows after the stored ones).
    scaler
        Z-scores the feature rows a block's windows read, in the task that makes them
        (``global`` and ``trailing`` normalization); ``None``: ``f`` as given.

    Returns
    -------
    dict of dask.array.Array
        ``x`` or ``ends``, ``y``, ``t`` (with timestamps), ``session``, ``instrument``
        (with several instruments), each carrying the blocks' recipe in
        ``attrs["blocks"]``.
    """
    scales = tuple(int(s) for s in scales)
    n = runs.n
    chunks = tuple(int(c) for c in chunks)
    if sum(chunks) != n:
        raise ValueError(f"blocks of {sum(chunks)} windows for {n} windows")
    ends_dtype = np.dtype(np.int32 if int(labels_steps.shape[0]) + row_offset < 2**31 else np.int64)
    g = _Geometry(size, scales, label, zscore, materialize, ends_dtype, int(row_offset),
                  segs.instruments != ("",), scaler if materialize else None)
    specs = _field_specs(f, labels_steps, timestamps, g)
    if n == 0 or not chunks:
        return {k: da.zeros((0, *shape), dtype=dtype, chunks=-1) for k, (shape, dtype) in specs.items()}
    inputs = {"features": f if materialize else None, "labels": labels_steps, "times": timestamps}
    bounds = {k: chunk_bounds(a.chunks[0]) for k, a in inputs.items() if a is not None}
    starts = chunk_bounds(chunks)
    name = "split-blocks-" + tokenize(runs, chunks, g, *(a.name for a in inputs.values() if a is not None))
    tasks, makers = [], []
    for j in range(len(chunks)):
        sub = runs.slice(int(starts[j]), int(starts[j + 1]))
        lo, last = sub.span()
        hi = last + 1
        origin = {"features": lo - halo, "labels": lo, "times": lo}
        reads = {k: rows_task(a, bounds[k], origin[k], hi) if a is not None else None for k, a in inputs.items()}
        args = (sub, origin, segs.session[sub.segment], segs.instrument[sub.segment], g, reads["features"],
                reads["labels"], reads["times"])
        tasks.append(Task(None, _make_block, *args))
        makers.append(Task(None, _block_maker, *args))
    made = MadeBlocks(name=name, chunks=chunks, tasks=tuple(tasks),
                      inputs=tuple(a for a in inputs.values() if a is not None), makers=tuple(makers))
    base = made.graph()  # the made blocks' layer, shared by every field's graph
    return {k: _field(made, base, k, shape, dtype) for k, (shape, dtype) in specs.items()}


def _field_specs(f: da.Array | None, labels_steps: da.Array, timestamps: da.Array | None,
                 g: _Geometry) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each stored array's sample shape and dtype, in the order they are stored."""
    out: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    if g.materialize:
        width = int(f.shape[1]) * len(g.scales)
        scaled = g.zscore or g.scaler is not None
        out["x"] = ((g.size, width), np.dtype(np.float32) if scaled else np.dtype(f.dtype))
    else:
        out["ends"] = ((), g.ends_dtype)
    out["y"] = ((int(labels_steps.shape[1]),) if g.label.multi else (), np.dtype(g.label.out_dtype))
    if timestamps is not None:
        out["t"] = ((), np.dtype(timestamps.dtype))
    out["session"] = ((), np.dtype(np.int32))
    if g.instruments:
        out["instrument"] = ((), np.dtype(np.int32))
    return out


def _field(made: MadeBlocks, base: HighLevelGraph, field: str, shape: tuple[int, ...], dtype: np.dtype) -> da.Array:
    """One array of the made blocks: block ``j`` is ``made block j[field]``."""
    name = f"{field}-{made.name}"
    rest = (0,) * len(shape)
    layer = {(name, j, *rest): Task((name, j, *rest), operator.getitem, TaskRef((made.name, j)), field)
             for j in range(len(made.chunks))}
    layers = dict(base.layers)
    deps = {k: set(v) for k, v in base.dependencies.items()}
    layers[name] = MaterializedLayer(layer)
    deps[name] = {made.name}
    arr = da.Array(HighLevelGraph(layers, deps), name, chunks=(made.chunks, *((s,) for s in shape)), dtype=dtype,
                   meta=np.empty((0,) * (1 + len(shape)), dtype=dtype))
    arr.attrs = {"blocks": (made, field)}
    return arr
