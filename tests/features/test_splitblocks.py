"""A split's arrays made block by block: the values of every array against numpy, and
one task per block."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from pipeline.features.labels import finalize_labels
from pipeline.features.sessions import SegmentTable, window_runs
from pipeline.features.specs import LabelSpec
from pipeline.features.splitblocks import split_arrays
from pipeline.storage.units import MadeBlocks
from tests.features.test_windows import reference as windows_ref


def _inputs(rows: int, chunk: int):
    rng = np.random.default_rng(4)
    f = rng.standard_normal((rows, 3)).astype(np.float32)
    steps = rng.standard_normal((rows, 1))
    times = np.arange(rows, dtype=np.int64) * 1000 + 7
    return f, steps, times, [da.from_array(a, chunks=(chunk,) + (-1,) * (a.ndim - 1)) for a in (f, steps, times)]


@pytest.mark.parametrize("chunk, block", [(13, 5), (50, 37), (400, 1000)])
@pytest.mark.parametrize("materialize", [True, False])
def test_every_array_of_a_block_equals_numpy_and_each_block_is_one_task(chunk, block, materialize):
    size, scales, halo = 4, (1, 3), 9
    f, steps, times, (fd, sd, td) = _inputs(300, chunk)
    segs = SegmentTable.from_lengths([120, 180])  # two sessions: windows never cross the cut
    runs = window_runs(segs, size=size, stride=2, scales=scales, back=halo, fwd=0)
    n = runs.n
    chunks = (block,) * (n // block) + ((n % block,) if n % block else ())
    label = LabelSpec(horizon=3, scale=10.0)
    arrays = split_arrays(fd, runs, chunks, sd, td, segs, label=label, size=size, scales=scales, halo=halo,
                          zscore=False, materialize=materialize, row_offset=5)
    ends = runs.ends()
    with dask.config.set(scheduler="sync"):
        got = {k: a.compute() for k, a in arrays.items()}
    want_x = np.concatenate([windows_ref(f[a:b], size, 2, scales) for a, b in ((0, 120), (120, 300))])
    if materialize:
        np.testing.assert_array_equal(got["x"], want_x)
    else:
        np.testing.assert_array_equal(got["ends"], ends + 5)
        assert got["ends"].dtype == np.int32
    np.testing.assert_array_equal(got["y"], finalize_labels(steps[ends], label))
    np.testing.assert_array_equal(got["t"], times[ends])
    np.testing.assert_array_equal(got["session"], np.repeat([0, 1], [runs.segments_of().tolist().count(s)
                                                                     for s in (0, 1)]))
    assert list(got) == ["x" if materialize else "ends", "y", "t", "session"]
    made, field = arrays["y"].attrs["blocks"]
    assert isinstance(made, MadeBlocks) and field == "y" and made.chunks == chunks
    # One task per block makes all of its arrays: the made layer has a key per block.
    assert len(made.graph().layers[made.name]) == len(chunks)


def test_an_empty_split_gives_empty_arrays_of_the_stored_shapes():
    f, steps, times, (fd, sd, td) = _inputs(50, 10)
    segs = SegmentTable.from_lengths([50])
    runs = window_runs(segs, size=4, stride=1, scales=(1,), back=3, fwd=0).subset(np.zeros(47, dtype=bool))
    arrays = split_arrays(fd, runs, (), sd, td, segs, label=LabelSpec(horizon=1), size=4, scales=(1,), halo=3,
                          zscore=False, materialize=True)
    assert {k: a.shape for k, a in arrays.items()} == {"x": (0, 4, 3), "y": (0,), "t": (0,), "session": (0,)}


@pytest.mark.parametrize("materialize", [True, False])
def test_a_blocks_maker_makes_any_range_of_it_as_the_whole_block_holds_it(materialize):
    """The writer makes a block a unit at a time: every range its maker makes equals
    that range of the whole block (the whole block itself checked against numpy above)."""
    size, scales, halo = 4, (1, 3), 9
    f, steps, times, (fd, sd, td) = _inputs(300, 40)
    segs = SegmentTable.from_lengths([120, 180])
    runs = window_runs(segs, size=size, stride=1, scales=scales, back=halo, fwd=0)
    chunks = (100,) * (runs.n // 100) + ((runs.n % 100,) if runs.n % 100 else ())
    arrays = split_arrays(fd, runs, chunks, sd, td, segs, label=LabelSpec(horizon=3, scale=10.0), size=size,
                          scales=scales, halo=halo, zscore=False, materialize=materialize)
    made, _ = arrays["y"].attrs["blocks"]
    assert len(made.makers) == len(chunks)
    with dask.config.set(scheduler="sync"):
        whole = {k: a.compute() for k, a in arrays.items()}
        for j, start in enumerate(np.cumsum((0,) + chunks[:-1])):
            graph = dict(made.graph())
            maker = dask.get({**graph, "m": made.makers[j]}, "m")
            for lo, hi in ((0, chunks[j]), (0, 7), (7, 60), (60, chunks[j]), (5, 5)):
                part = maker(lo, hi)
                assert list(part) == list(whole)
                for k, v in part.items():
                    np.testing.assert_array_equal(v, whole[k][start + lo : start + hi])


def test_the_writer_makes_and_writes_a_block_one_unit_at_a_time():
    """A write task makes only one unit's samples at a time, and writes every unit of
    its plan from them, in order."""
    from pipeline.storage.units import write_blocks

    f, steps, times, (fd, sd, td) = _inputs(300, 40)
    segs = SegmentTable.from_lengths([300])
    runs = window_runs(segs, size=4, stride=1, scales=(1,), back=3, fwd=0)
    unit, block = 16, 64
    chunks = (block,) * (runs.n // block) + ((runs.n % block,) if runs.n % block else ())
    arrays = split_arrays(fd, runs, chunks, sd, td, segs, label=LabelSpec(horizon=3, scale=10.0), size=4,
                          scales=(1,), halo=3, zscore=False, materialize=True)
    whole = {k: a.compute(scheduler="sync") for k, a in arrays.items()}
    seen = []

    def write(location, options, split, todo, start, blocks, token):
        assert len(todo) == 1 and todo[0][1] == start
        for k, v in blocks.items():
            assert v.shape[0] == todo[0][2] - todo[0][1] <= unit
            np.testing.assert_array_equal(v, whole[k][todo[0][1] : todo[0][2]])
        seen.append(todo[0][0])
        return 1

    done = np.zeros(-(-runs.n // unit), dtype=bool)
    done[3] = True  # written before: not made again
    counts = write_blocks(write, "mem://", None, "train", arrays, unit=unit, block=block, done=done, token="t")
    assert int(counts.sum().compute(scheduler="sync")) == done.size - 1
    assert sorted(seen) == [u for u in range(done.size) if u != 3]
