"""Zarr this package did not write: arrays passed directly, stores of plain zarr and of
xarray. Each streams through the fast chunk reader, every sample once per epoch, with the
values numpy holds; encodings that would make the stored numbers wrong are refused."""

from __future__ import annotations

import pickle
import re
import warnings

import dask.array as da
import numpy as np
import pytest
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline
from pipeline.errors import StoreError, StreamError
from pipeline.streaming.chunks import ChunkReader
from pipeline.streaming.foreign import ZarrSource
from pipeline.streaming.sources import StoreSource

N = 600


@pytest.fixture(scope="module")
def reference():
    """``x`` of random values, ``y`` the sample ids: each batch is checked against them."""
    rng = np.random.default_rng(0)
    return rng.standard_normal((N, 4, 3)).astype(np.float32), np.arange(N, dtype=np.int64)


def check_epochs(s, x, y, epochs=2):
    """Every sample once per epoch, ``x`` aligned with its id, values as numpy has them."""
    for e in range(epochs):
        s.set_epoch(e)
        xs, ys = zip(*[(xb.copy(), yb.copy()) for xb, yb in s])
        ids = np.concatenate(ys)
        order = np.argsort(ids, kind="stable")
        np.testing.assert_array_equal(ids[order], y)
        np.testing.assert_array_equal(np.concatenate(xs)[order], x)


def fast(source):
    """Every zarr array of ``source`` is read by a ChunkReader that decodes chunks itself."""
    assert isinstance(source, ZarrSource)
    readers = [g.reader for g in source.readers.values() if g.reader is not None]
    assert readers and all(isinstance(r, ChunkReader) and r._decoder is not None for r in readers)
    return True


def zarr_arrays(tmp_path, x, y, chunks=(100, 100)):
    zx = zarr.create_array(tmp_path / "x.zarr", data=x, chunks=(chunks[0], 4, 3))
    zy = zarr.create_array(tmp_path / "y.zarr", data=y, chunks=(chunks[1],))
    return zx, zy


# -- zarr arrays passed directly ---------------------------------------------------------


def test_a_tuple_of_zarr_arrays_takes_the_fast_path(tmp_path, reference):
    x, y = reference
    s = pipeline.stream(zarr_arrays(tmp_path, x, y), batch_size=64, seed=1, buffer_chunks=2)
    assert fast(s.source) and s.source.lengths == (100,) * 6
    check_epochs(s, x, y)


def test_a_mapping_with_numpy_beside_and_chunkings_that_differ(tmp_path, reference):
    """x in chunks of 100, y of 150: streamed on their common grid of 300 samples; a
    numpy array beside them is sliced on the same grid."""
    x, y = reference
    zx, zy = zarr_arrays(tmp_path, x, y, chunks=(100, 150))
    s = pipeline.stream({"x": zx, "y": zy, "w": -y}, arrays=("x", "y", "w"), batch_size=50, seed=2)
    assert fast(s.source) and s.source.lengths == (300, 300)
    for xb, yb, wb in s:
        np.testing.assert_array_equal(wb, -yb)
    check_epochs(pipeline.stream({"x": zx, "y": zy}, arrays=("x", "y"), batch_size=50, seed=2), x, y)


def test_reads_on_a_common_grid_cross_the_arrays_own_chunks(tmp_path, reference):
    x, y = reference
    zx, zy = zarr_arrays(tmp_path, x, y, chunks=(100, 150))
    source = ZarrSource({"x": zx, "y": zy, "w": x}, ("x", "y", "w"))
    for name, ref in (("x", x), ("y", y), ("w", x)):
        np.testing.assert_array_equal(source.read(name, 1), ref[300:600])
        starts, stops = (10, 95, 190, 290), (20, 160, 230, 300)  # runs across 100, 150, 200
        rows = np.random.default_rng(1).permutation(sum(b - a for a, b in zip(starts, stops)))
        out = np.zeros((len(rows),) + ref.shape[1:], ref.dtype)
        source.scatter_runs(name, 1, starts, stops, out, rows)
        expected = np.concatenate([ref[300 + a : 300 + b] for a, b in zip(starts, stops)])
        np.testing.assert_array_equal(out[rows], expected)


def test_zarr_arrays_over_ranks_serve_every_sample_once(tmp_path, reference):
    """Rank boundaries fall inside chunks: their partial reads go through the grid too."""
    x, y = reference
    arrays = zarr_arrays(tmp_path, x, y, chunks=(100, 150))
    ids = [yb for r in range(3) for _, yb in pipeline.stream(arrays, batch_size=32, rank=r, world_size=3)]
    assert sorted(np.concatenate(ids).tolist()) == list(range(N))


def test_arrays_that_cannot_stream_together_are_refused(tmp_path, reference):
    x, y = reference
    zx = zarr.create_array(tmp_path / "x.zarr", data=np.zeros((10_000, 2), "f4"), chunks=(13, 2))
    zy = zarr.create_array(tmp_path / "y.zarr", data=np.arange(10_000), chunks=(1000,))
    with pytest.raises(StreamError, match=r"a0: 13, a1: 1000.*Rechunk"):
        pipeline.stream((zx, zy), batch_size=8)
    with pytest.raises(StreamError, match="same length"):
        pipeline.stream((zx, y), batch_size=8)
    with pytest.raises(StreamError, match="'a1' is a Array.*da.from_zarr"):
        pipeline.stream((zy, da.arange(10_000)), batch_size=8)
    with pytest.raises(StreamError, match="dim="):
        pipeline.stream((zx, zy), batch_size=8, dim="sample")


def test_dataloader_workers_reopen_zarr_arrays(tmp_path, reference):
    from torch.utils.data import DataLoader

    x, y = reference
    s = pipeline.stream(zarr_arrays(tmp_path, x, y), batch_size=50, seed=0)
    copy = pickle.loads(pickle.dumps(s.source))  # a spawned worker opens the arrays again
    np.testing.assert_array_equal(copy.read("a1", 3), y[300:400])
    loader = DataLoader(s.torch(), batch_size=None, num_workers=2, multiprocessing_context="fork")
    ids = [yb.numpy() for _, yb in loader]
    assert sorted(np.concatenate(ids).tolist()) == list(range(N))


def test_each_process_reads_a_zip_store_through_its_own_handle(tmp_path, reference):
    """A forked DataLoader worker must not read through the parent's ZipStore: one file
    handle, whose offset two processes would move under each other (BadZipFile)."""
    from torch.utils.data import DataLoader

    x, y = reference
    with zarr.storage.ZipStore(tmp_path / "s.zip", mode="w") as zs:
        g = zarr.open_group(zs, mode="w")
        g.create_array("x", data=x, chunks=(25, 4, 3))
        g.create_array("y", data=y, chunks=(25,))
    g = zarr.open_group(zarr.storage.ZipStore(tmp_path / "s.zip", mode="r"), mode="r")
    s = pipeline.stream((g["x"], g["y"]), batch_size=20, buffer_chunks=2, seed=0)
    copy = ZarrSource.__new__(ZarrSource)
    copy.__setstate__(s.source.__getstate__())  # what a forked worker does (no pickling)
    assert copy.arrays["a0"].store_path.store is not s.source.arrays["a0"].store_path.store
    np.testing.assert_array_equal(copy.read("a1", 3), y[75:100])
    for epoch in range(3):
        s.set_epoch(epoch)
        loader = DataLoader(s.torch(), batch_size=None, num_workers=2, multiprocessing_context="fork")
        xs, ys = zip(*[(xb.numpy(), yb.numpy()) for xb, yb in loader])
        ids = np.concatenate(ys)
        assert sorted(ids.tolist()) == list(range(N))
        np.testing.assert_array_equal(np.concatenate(xs), x[ids])


def test_a_split_a_root_variables_store_does_not_have_is_refused(tmp_path, reference):
    x, y = reference
    g = zarr.open_group(tmp_path / "plain.zarr", mode="w")
    g.create_array("x", data=x, chunks=(128, 4, 3))
    g.create_array("y", data=y, chunks=(128,))
    g.create_group("extra")
    for split in ("test", "no-such-split"):
        with pytest.raises(StreamError, match=rf"no split '{split}'.*at its root.*split='train'; its groups: extra"):
            pipeline.stream(str(tmp_path / "plain.zarr"), split=split, batch_size=64)
    for split in (".", "..", "extra/../x"):  # zarr's own ValueError named no store
        for source in (str(tmp_path / "plain.zarr"), zarr.open_group(tmp_path / "plain.zarr", mode="r")):
            with pytest.raises(StreamError, match=rf"(plain\.zarr|<group>): split='{re.escape(split)}': a split is "
                                                  r"a group's name inside the store"):
                pipeline.stream(source, split=split, batch_size=64)
    check_epochs(pipeline.stream(str(tmp_path / "plain.zarr"), batch_size=64), x, y, epochs=1)


def test_verify_on_what_has_no_checksums_warns(tmp_path, reference):
    x, y = reference
    zx, zy = zarr_arrays(tmp_path, x, y)
    with pytest.warns(RuntimeWarning, match="arrays passed directly holds no checksums") as said:
        pipeline.stream((zx, zy), batch_size=64, verify=True)
    assert [w.filename for w in said] == [__file__]  # at the caller's line
    g = zarr.open_group(tmp_path / "plain.zarr", mode="w")
    g.create_array("x", data=x, chunks=(128, 4, 3))
    g.create_array("y", data=y, chunks=(128,))
    with pytest.warns(RuntimeWarning, match="plain.zarr holds no checksums") as said:
        pipeline.stream(str(tmp_path / "plain.zarr"), batch_size=64, verify=True)
    assert [w.filename for w in said] == [__file__]
    # Laid out in a split group, as pipeline lays a store out: it was skipped silently.
    train = zarr.open_group(tmp_path / "split.zarr", mode="w").create_group("train")
    train.create_array("x", data=x, chunks=(128, 4, 3))
    train.create_array("y", data=y, chunks=(128,))
    with pytest.warns(RuntimeWarning, match=r"split\.zarr \(split 'train'\) holds no checksums") as said:
        s = pipeline.stream(str(tmp_path / "split.zarr"), batch_size=64, verify=True)
    assert [w.filename for w in said] == [__file__]  # at the caller's line
    check_epochs(s, x, y, epochs=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipeline.stream(str(tmp_path / "split.zarr"), batch_size=64)


@pytest.mark.parametrize("layout", ["root", "split", "arrays", "shards"])
def test_verify_on_arrays_with_their_own_crc32c_does_not_warn(tmp_path, reference, layout):
    """zarr checks a ``crc32c`` codec's checksum on every read (a flipped byte is
    refused): ``verify=True`` said such a store could not be verified."""
    from zarr.codecs import Crc32cCodec, ZstdCodec

    from pipeline.errors import CorruptChunkError

    x, y = reference
    root = zarr.open_group(tmp_path / "crc.zarr", mode="w")
    g = root.create_group("train") if layout == "split" else root
    kw = ({"shards": (256, 4, 3), "chunks": (128, 4, 3)} if layout == "shards" else {"chunks": (128, 4, 3)})
    zx = g.create_array("x", data=x, compressors=[ZstdCodec(), Crc32cCodec()], **kw)
    zy = g.create_array("y", data=y, chunks=(128,), compressors=[Crc32cCodec()],
                        **({"shards": (256,)} if layout == "shards" else {}))
    source = (zx, zy) if layout == "arrays" else str(tmp_path / "crc.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_epochs(pipeline.stream(source, batch_size=64, verify=True), x, y, epochs=1)
    # The checksum is checked, asked or not: a flipped byte of a chunk is refused.
    chunk = min(p for p in (tmp_path / "crc.zarr").rglob("*") if p.is_file() and {"x", "c"} <= set(p.parts))
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptChunkError):
        for _ in pipeline.stream(source, batch_size=64, verify=True):
            pass


def test_a_corrupt_chunk_of_an_array_passed_directly_names_its_store(tmp_path, reference):
    from pipeline.errors import CorruptChunkError

    x, y = reference
    zx, zy = zarr_arrays(tmp_path, x, y)
    chunk = tmp_path / "x.zarr" / "c" / "3" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])
    with pytest.raises(CorruptChunkError, match=rf"{tmp_path / 'x.zarr'}: /a0 chunk 3: cannot decode"):
        for _ in pipeline.stream((zx, zy), batch_size=64):
            pass


def test_a_file_url_names_a_local_store(tmp_path, reference):
    x, y = reference
    g = zarr.open_group(tmp_path / "plain.zarr", mode="w")
    g.create_array("x", data=x, chunks=(128, 4, 3))
    g.create_array("y", data=y, chunks=(128,))
    check_epochs(pipeline.stream(f"file://{tmp_path / 'plain.zarr'}", batch_size=64), x, y, epochs=1)


@pytest.mark.parametrize("where", ["root", "split"])
def test_big_endian_zarr_2_arrays_are_served_in_native_byte_order(tmp_path, reference, where):
    """zarr 2 stores may keep ``>f4``: batches come in native order, which torch needs."""
    import torch

    x, y = reference
    g = zarr.open_group(tmp_path / "be.zarr", mode="w", zarr_format=2)
    node = g if where == "root" else g.create_group("train")
    node.create_array("x", shape=x.shape, chunks=(100, 4, 3), dtype=">f4")[:] = x
    node.create_array("y", shape=y.shape, chunks=(100,), dtype=">i8")[:] = y
    s = pipeline.stream(str(tmp_path / "be.zarr"), batch_size=64)
    assert all(dtype.isnative for _, dtype in s.shapes.values())
    check_epochs(s, x, y, epochs=1)
    xb, yb = next(iter(s.torch()))
    assert xb.dtype == torch.float32 and yb.dtype == torch.int64
    np.testing.assert_array_equal(xb.numpy(), x[yb.numpy()])


def test_arrays_in_memory_stores_cannot_go_to_spawned_workers(reference):
    """A spawned worker cannot open a MemoryStore; a forked one has a copy of it."""
    from torch.utils.data import DataLoader

    x, y = reference
    zy = zarr.create_array(zarr.storage.MemoryStore(), data=y, chunks=(100,))
    s = pipeline.stream((zy, zy), batch_size=50)
    check_epochs(s, y, y, epochs=1)
    with pytest.raises(StreamError, match="MemoryStore.*directory"):
        pickle.dumps(s.source)
    loader = DataLoader(s.torch(), batch_size=None, num_workers=1, multiprocessing_context="fork")
    assert sorted(np.concatenate([yb.numpy() for _, yb in loader]).tolist()) == list(range(N))


# -- stores another tool wrote ---------------------------------------------------------


def test_a_plain_zarr_store_streams_its_root_arrays_without_partial(tmp_path, reference):
    x, y = reference
    g = zarr.open_group(tmp_path / "plain.zarr", mode="w")
    g.create_array("x", data=x, chunks=(128, 4, 3))
    g.create_array("y", data=y, chunks=(128,))
    s = pipeline.stream(str(tmp_path / "plain.zarr"), arrays=("x", "y"), batch_size=64)
    assert fast(s.source)
    check_epochs(s, x, y)
    with pytest.raises(StreamError, match="no variable 'z'; variables: x, y"):
        pipeline.stream(str(tmp_path / "plain.zarr"), arrays=("x", "z"), batch_size=64)



@pytest.mark.parametrize("as_path", [True, False])
def test_a_foreign_split_with_zarrs_automatic_chunks_streams_on_their_common_grid(tmp_path, reference, as_path):
    # zarr's automatic chunks differ for x and y (here 75 and 150 samples): a store laid
    # out in splits by another tool was refused as "arrays differ in chunking".
    x, y = reference
    g = zarr.open_group(tmp_path / "auto.zarr", mode="w")
    g.create_array("train/x", data=x, chunks=(75, 4, 3))
    g.create_array("train/y", data=y, chunks=(150,))
    g.create_array("train/alike", data=y, chunks=(75,))
    s = pipeline.stream(str(tmp_path / "auto.zarr") if as_path else g, split="train", batch_size=64, seed=1)
    assert fast(s.source) and s.source.lengths == (150,) * 4
    check_epochs(s, x, y)
    # Arrays chunked alike still read as a split of a store, chunk for chunk.
    alike = pipeline.stream(str(tmp_path / "auto.zarr"), split="train", arrays=("x", "alike"), batch_size=64)
    assert isinstance(alike.source, StoreSource) and alike.source.lengths == (75,) * 8
    check_epochs(alike, x, y, epochs=1)

@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 300), x_rows=st.integers(1, 300), y_rows=st.integers(1, 300), batch=st.integers(1, 64),
       world=st.integers(1, 3))
def test_a_foreign_split_of_any_chunkings_streams_every_sample_once_or_names_the_fix(n, x_rows, y_rows, batch, world):
    x = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    g = zarr.open_group(zarr.storage.MemoryStore(), mode="w")
    g.create_array("train/x", data=x, chunks=(x_rows, 2))
    g.create_array("train/y", data=np.arange(n), chunks=(y_rows,))
    try:
        streams = [pipeline.stream(g, split="train", batch_size=batch, rank=r, world_size=world, drop_last=world > 1)
                   for r in range(world)]
    except StreamError as exc:
        if world > 1 and n // world < batch:  # drop_last, and no rank fills a batch
            assert f"holds {n} samples, which fill no whole batch" in str(exc)
            return
        # a common grid far coarser than both chunks
        assert "Rechunk them alike" in str(exc) and f"x: {x_rows}" in str(exc) and f"y: {y_rows}" in str(exc)
        return
    seen = [np.zeros(0, np.int64)]
    for s in streams:
        for xb, yb in s:
            np.testing.assert_array_equal(xb[:, 0], 2 * yb)  # x aligned with its id
            seen.append(yb.copy())
    ids = np.concatenate(seen)
    assert len(np.unique(ids)) == len(ids)
    if world == 1:
        np.testing.assert_array_equal(np.sort(ids), np.arange(n))


def test_a_pipeline_store_missing_the_split_is_still_refused(tmp_path, reference):
    x, y = reference
    g = zarr.open_group(tmp_path / "p.zarr", mode="w")
    g.create_array("train/y", data=y, chunks=(100,))
    g.attrs["pipeline"] = {"complete": True, "splits": {"train": N}}
    with pytest.raises(StreamError, match="no split 'val'"):
        pipeline.stream(str(tmp_path / "p.zarr"), split="val", arrays=("y",), batch_size=8)
    with pytest.raises(StreamError, match="dim='sample' is for stores another tool wrote"):
        pipeline.stream(str(tmp_path / "p.zarr"), arrays=("y",), batch_size=8, dim="sample")


def xarray_dataset(x, y):
    xr = pytest.importorskip("xarray")
    return xr.Dataset({"x": (("sample", "row", "col"), x), "y": (("sample",), y),
                       "other": (("sample",), np.zeros(N, "f4"))},
                      coords={"sample": np.arange(N) * 10})


@pytest.mark.parametrize("zarr_format", [3, 2])
def test_an_xarray_store_streams_variables_by_name_along_a_dimension(tmp_path, reference, zarr_format):
    x, y = reference
    path = str(tmp_path / "ds.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's note that consolidated metadata is not in the v3 spec
        xarray_dataset(x, y).chunk({"sample": 120}).to_zarr(path, mode="w", zarr_format=zarr_format)
    s = pipeline.stream(path, arrays=("x", "y"), dim="sample", batch_size=64, seed=3)
    assert fast(s.source) and s.source.lengths == (120,) * 5
    check_epochs(s, x, y)
    s = pipeline.stream(path, arrays=("y", "x"), batch_size=64)  # dim=None: axis 0, named alike
    assert [a.shape[1:] for a in next(iter(s))] == [(), (4, 3)]


def test_an_xarray_group_of_a_store_is_its_split(tmp_path, reference):
    x, y = reference
    path = str(tmp_path / "ds.zarr")
    xarray_dataset(x, y).to_zarr(path, group="train", mode="w", zarr_format=3, consolidated=False)
    s = pipeline.stream(path, split="train", arrays=("x", "y"), dim="sample", batch_size=64)
    assert fast(s.source)
    check_epochs(s, x, y, epochs=1)
    assert isinstance(pipeline.stream(path, split="train", batch_size=64).source, StoreSource)


def test_samples_along_a_later_dimension_are_refused_with_the_transpose(tmp_path, reference):
    x, y = reference
    ds = xarray_dataset(x, y)
    ds["x"] = ds["x"].transpose("row", "sample", "col")
    path = str(tmp_path / "t.zarr")
    ds.to_zarr(path, mode="w", zarr_format=3, consolidated=False)
    with pytest.raises(StreamError, match=r"'x' has dimensions \('row', 'sample', 'col'\).*transpose\('sample', "
                                          r"'row', 'col'\)"):
        pipeline.stream(path, arrays=("x", "y"), dim="sample", batch_size=64)
    with pytest.raises(StreamError, match="different dimensions.*pass dim="):
        pipeline.stream(path, arrays=("x", "y"), batch_size=64)
    with pytest.raises(StreamError, match="'y' has dimensions \\('sample',\\), without 'time'"):
        pipeline.stream(path, arrays=("y",), dim="time", batch_size=64)


@pytest.mark.parametrize("variable, encoding, attribute", [
    ("other", {"scale_factor": 0.5, "dtype": "int16", "_FillValue": -1}, "scale_factor"),
    ("other", {"_FillValue": -9999.0}, "_FillValue"),
    ("y", {"_FillValue": -1}, "_FillValue"),
    ("when", {}, "units='.* since"),
])
@pytest.mark.parametrize("zarr_format", [3, 2])
def test_cf_encoded_variables_are_refused_by_name(tmp_path, reference, variable, encoding, attribute, zarr_format):
    x, y = reference
    ds = xarray_dataset(x, y)
    ds["when"] = ("sample", np.datetime64("2024-01-01") + np.arange(N).astype("timedelta64[h]"))
    ds[variable].encoding = encoding
    path = str(tmp_path / "cf.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(path, mode="w", zarr_format=zarr_format, consolidated=False)
    # xarray writes a zarr 2 variable's _FillValue as the .zarray's fill_value.
    said = "its .zarray's fill_value" if zarr_format == 2 and attribute == "_FillValue" else f"attribute {attribute}"
    with pytest.raises(StreamError, match=f"variable '{variable}': {said}"):
        pipeline.stream(path, arrays=(variable,), dim="sample", batch_size=64)
    pipeline.stream(path, arrays=("x",), dim="sample", batch_size=64)  # NaN _FillValue on floats is fine


def test_cf_encoded_variable_of_a_foreign_split_is_refused(tmp_path, reference):
    x, y = reference
    ds = xarray_dataset(x, y)
    ds["other"].encoding = {"add_offset": 1.0}
    path = str(tmp_path / "cf.zarr")
    ds.to_zarr(path, group="train", mode="w", zarr_format=3, consolidated=False)
    with pytest.raises(StreamError, match="split 'train': variable 'other': attribute add_offset"):
        pipeline.stream(path, arrays=("x", "other"), batch_size=64)


@pytest.mark.parametrize("zarr_format, consolidated, damaged", [
    (3, False, "zarr.json"), (3, False, "y/zarr.json"), (3, True, "zarr.json"), (2, False, ".zgroup"),
    (2, False, ".zattrs"), (2, False, "y/.zarray"), (2, False, "y/.zattrs"), (2, True, ".zmetadata")])
def test_a_damaged_metadata_file_is_named_with_its_store(tmp_path, reference, zarr_format, consolidated, damaged):
    """Another tool's store with one metadata file that is not JSON: the error names the
    store and the file (zarr's own is a bare JSONDecodeError naming neither)."""
    import json

    x, y = reference
    path = str(tmp_path / "ds.zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xarray_dataset(x, y).chunk({"sample": 120}).to_zarr(path, mode="w", zarr_format=zarr_format,
                                                           consolidated=consolidated)
    (tmp_path / "ds.zarr" / damaged).write_text("{not json")
    with pytest.raises(json.JSONDecodeError):  # the reference: plain json refuses the file
        json.loads((tmp_path / "ds.zarr" / damaged).read_text())
    with pytest.raises(StoreError) as err:
        pipeline.stream(path, arrays=("x", "y"), dim="sample", batch_size=64)
    assert str(err.value).startswith(f"{path}: {damaged} is not valid JSON (")
    assert "line 1 column 2" in str(err.value)


def test_refusals_name_an_xarray_stores_variables_not_a_split(tmp_path):
    """``split`` does not apply to an xarray store's root variables: refusals name the
    store and its variables (they spoke of "split 'train'")."""
    xr = pytest.importorskip("xarray")
    path = str(tmp_path / "ds.zarr")
    xr.Dataset({"x": (("time", "f"), np.zeros((5, 4), "f4")), "y": (("time",), np.arange(5))}).to_zarr(
        path, mode="w", zarr_format=3, consolidated=False)
    with pytest.raises(StreamError) as err:
        pipeline.stream(path, arrays=("x", "y"), dim="time", batch_size=8, drop_last=True)
    assert str(err.value).startswith(f"stream: the variables 'x', 'y' of {path} hold 5 samples, which fill no whole")
    assert "split" not in str(err.value)
    with pytest.raises(StreamError) as err:
        pipeline.stream(path, arrays=("y",), dim="time", batch_size=2, rank=0, world_size=6)
    assert str(err.value).startswith(f"stream: the variables 'y' of {path} hold 5 samples, which cannot be shared "
                                     "among 6 ranks")
    assert "split" not in str(err.value)


def test_arrays_passed_directly_of_other_lengths_are_named_by_where_they_live(tmp_path):
    zx = zarr.create_array(tmp_path / "lm_x.zarr", shape=(100, 2), chunks=(10, 2), dtype="f4")
    zy = zarr.create_array(tmp_path / "lm_y.zarr", shape=(99,), chunks=(10,), dtype="i8")
    with pytest.raises(StreamError, match=rf"arrays must have the same length along the samples' axis, got "
                                          rf"\{{'{re.escape(str(tmp_path / 'lm_x.zarr'))}': 100, "
                                          rf"'{re.escape(str(tmp_path / 'lm_y.zarr'))}': 99\}}"):
        pipeline.stream((zx, zy), batch_size=8)
