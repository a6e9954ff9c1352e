"""The unit writer's pieces: zarr's emptiness rule, blocks culled on resume, and the
write layer fused with the blockwise layer that computes its blocks."""

from __future__ import annotations

import threading

import dask
import dask.array as da
import numpy as np
import pytest
from dask.array.optimization import optimize
from dask.utils import key_split
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from zarr.core.buffer.cpu import NDBuffer

from pipeline.storage.units import is_fill, write_blocks


@settings(max_examples=150, deadline=None)
@given(data=st.data(), dtype=st.sampled_from([np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8,
                                              np.uint64, np.bool_]),
       shape=st.sampled_from([(0,), (1,), (5,), (3, 4), (2, 3, 2)]), plain=st.booleans())
def test_is_fill_agrees_with_zarr(data, dtype, shape, plain):
    """Empty exactly when zarr's own comparison says so: -0.0 is not 0.0 (bit patterns),
    NaN equals a NaN fill, integers and booleans by value (the fill value a numpy scalar,
    as in a chunk spec, or ``plain``: a Python one, compared as numpy promotes it)."""
    kind = np.dtype(dtype).kind
    # Floats: values that float32 holds only rounded (0.1 in a Python fill is another
    # number than in the chunk), a subnormal, infinities, and the zeros and NaN above.
    values = [0, 1, -0.0, np.nan, 0.1, 1e-45, np.inf, -np.inf] if kind == "f" else \
        [False, True] if kind == "b" else [0, 1, 2]
    a = data.draw(arrays(dtype, shape, elements=st.sampled_from(values)))
    fill = data.draw(st.sampled_from(values))
    fill = fill if plain else np.dtype(dtype).type(fill)
    chunk = NDBuffer.from_numpy_array(a)
    assert is_fill(chunk, fill) == chunk.all_equal(fill)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(("values", "fill"), [
    ([np.nan] * 3, np.nan),  # NaN equals a NaN fill: empty
    ([np.nan, 1.0], np.nan),
    ([-0.0, -0.0], 0.0),  # the same value, other bits: not empty
    ([0.0, 0.0], -0.0),
    ([0.0, 0.0], 0),  # an integer fill compares by value
    ([-0.0, 0.0], 0),
    ([0.1, 0.1], 0.1),  # float32's 0.1 is not the Python float's
    ([np.inf], np.inf),
    ([1e-45, 0.0], 1e-45),
])
@pytest.mark.parametrize("plain", [True, False])
def test_is_fill_agrees_with_zarr_at_the_edges(dtype, values, fill, plain):
    """The cases a first-element shortcut could decide wrongly, each one explicitly."""
    chunk = NDBuffer.from_numpy_array(np.array(values, dtype=dtype))
    fill = fill if plain else np.dtype(dtype).type(fill)
    assert is_fill(chunk, fill) == chunk.all_equal(fill)


def _recording(n: int, seen: list) -> da.Array:
    lock = threading.Lock()

    def mark(block: np.ndarray, block_info: dict | None = None) -> np.ndarray:
        with lock:
            seen.append(block_info[0]["chunk-location"][0])
        return block

    return da.from_array(np.arange(n, dtype=np.float32), chunks=20).map_blocks(mark, dtype=np.float32)


def test_blocks_with_nothing_left_to_write_are_not_computed():
    seen: list[int] = []
    calls: list[tuple] = []

    def write(location, options, split, todo, start, blocks, call):
        calls.append((todo, start, blocks["x"][:2].tolist()))
        return len(todo)

    done = np.ones(10, dtype=bool)
    done[7] = False  # unit 7 (samples 70..79), in the block of samples 60..79
    out = write_blocks(write, "loc", None, "train", {"x": _recording(100, seen)}, unit=10, block=20, done=done,
                       token="t")
    with dask.config.set(scheduler="sync"):
        counts = out.compute()
    assert counts.sum() == 1 and calls == [([(7, 70, 80)], 60, [60.0, 61.0])]
    assert seen == [3]
    assert write_blocks(write, "loc", None, "train", {"x": _recording(100, seen)}, unit=10, block=20,
                        done=np.ones(10, dtype=bool), token="t") is None


def test_the_write_layer_fuses_with_the_layer_that_makes_its_blocks():
    x = da.from_array(np.zeros((100, 3, 2), dtype=np.float32), chunks=(20, 3, 2)).map_blocks(np.negative)
    y = da.from_array(np.zeros(100, dtype=np.int64), chunks=20).map_blocks(np.abs)
    out = write_blocks(lambda *a: 0, "loc", None, "train", {"x": x, "y": y}, unit=10, block=20,
                       done=np.zeros(10, dtype=bool), token="t")
    names = {key_split(k) for k in dict(optimize(out.__dask_graph__(), out.__dask_keys__()))}
    assert "negative" not in names and "abs" not in names
    assert len([k for k in dict(optimize(out.__dask_graph__(), out.__dask_keys__())) if "write-units" in str(k)]) == 5


def test_a_build_is_made_and_written_one_task_per_block_with_the_bytes_of_plain_arrays(tmp_path, monkeypatch):
    """Arrays a build made together (``MadeBlocks``) are written by one task per block,
    which makes the block and writes it; the store holds the same files as the same
    values written from plain numpy arrays, through the generic blockwise path."""
    import pipeline.storage.units as units
    from pipeline.features import LabelSpec, build_training_set
    from pipeline.storage import write
    from tests.features.test_build import SCALES, SIZE, SPECS, STRIDE
    from tests.features.test_steps import COLS, book
    from tests.storage.test_build_bytes import store_files

    unit = 40
    ts = build_training_set(da.from_array(book(900, seed=3), chunks=(97, -1)), columns=COLS, features=SPECS,
                            size=SIZE, stride=STRIDE, scales=SCALES, label=LabelSpec(horizon=4, scale=1e4),
                            splits={"train": 0.7, "val": 0.3}, block_windows=unit)
    made: list[int] = []
    real = units._made_writes

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        made.append(len(out.__dask_graph__().layers[out.name]))
        return out

    monkeypatch.setattr(units, "_made_writes", spy)
    kw = dict(chunk_samples=20, target_chunk_bytes=1 << 20, progress=False)
    with dask.config.set(scheduler="sync"):
        write(tmp_path / "made.zarr", ts.splits, **kw)
        plain = {s: {k: a.compute() for k, a in arrs.items()} for s, arrs in ts.splits.items()}
        assert len(made) == 2  # both splits took the one-task-per-block path
        write(tmp_path / "plain.zarr", plain, **kw)
    assert len(made) == 2  # plain arrays took the generic path
    blocks = {s: -(-len(a["x"]) // unit) for s, a in plain.items()}
    assert made == [blocks["train"], blocks["val"]]
    a, b = store_files(tmp_path / "made.zarr"), store_files(tmp_path / "plain.zarr")
    assert a.keys() == b.keys() and all(a[k] == b[k] for k in a)


@settings(max_examples=25, deadline=None)
@given(rows=st.lists(st.tuples(st.booleans(), st.integers(0, 2**40)), min_size=1, max_size=30),
       compressed=st.booleans())
def test_tables_read_without_the_event_loop_equal_zarrs_own_read(tmp_path_factory, rows, compressed):
    """A split's ``_written`` table (one row per chunk) read chunk by chunk through the
    store's ``get_sync`` and the codecs' synchronous methods: the values zarr reads,
    unwritten rows (no chunk stored) as the fill value."""
    import zarr
    from zarr.codecs import ZstdCodec

    from pipeline.storage.units import read_rows_sync

    root = tmp_path_factory.mktemp("rows")
    table = zarr.open_group(str(root), mode="w").create_array(
        "t", shape=(len(rows), 3), dtype="uint64", chunks=(1, 3), fill_value=0,
        compressors=[ZstdCodec(level=3)] if compressed else [])
    for u, (marked, crc) in enumerate(rows):
        if marked:
            table[u] = [1, crc, crc // 3]
    np.testing.assert_array_equal(read_rows_sync(table), table[:])
    assert read_rows_sync(table).dtype == np.uint64
