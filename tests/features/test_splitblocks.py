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
