"""The fast chunk reader equals zarr's own read; corrupt chunks are named, never served."""

from __future__ import annotations

import os
import subprocess
import sys

import numcodecs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

from pipeline.errors import CorruptChunkError
from pipeline.storage import write
from pipeline.storage.store import open_store_group
from pipeline.streaming import chunks as chunks_module
from pipeline.streaming.chunks import ChunkReader
from pipeline.streaming.maps import MapCache


CODECS = {
    "lz4-shuffle": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
    "zstd-bitshuffle": [BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")],
    "zstd": [ZstdCodec(level=3)],
    "none": [],
}


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("shards", [None, (60, 5, 2)])
def test_reader_equals_zarr_for_codecs_short_last_chunk_and_shards(tmp_path, codec, shards, mapped):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((107, 5, 2)).astype(np.float32)
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=data.shape, chunks=(20, 5, 2), shards=shards,
                            dtype="float32", compressors=CODECS[codec])
    arr[:] = data
    reader = ChunkReader(arr, ("a.zarr", "train", "x"), maps=MapCache() if mapped else None)
    assert reader.n_chunks == 6
    for i in range(reader.n_chunks):
        np.testing.assert_array_equal(reader.read(i), arr[i * 20 : (i + 1) * 20])
    out = np.empty((20, 5, 2), np.float32)
    reader.read(2, out)
    np.testing.assert_array_equal(out, data[40:60])


def test_reader_reads_zip_stores(tmp_path):
    data = np.arange(300 * 4, dtype=np.float32).reshape(300, 4)
    path = write(tmp_path / "z.zarr.zip", {"x": data, "y": np.arange(300)}, chunk_samples=64, progress=False)
    group = open_store_group(path)
    reader = ChunkReader(group["train/x"], (path, "train", "x"))
    got = np.concatenate([reader.read(i) for i in range(reader.n_chunks)])
    np.testing.assert_array_equal(got, data)


def test_a_garbage_chunk_is_reported_with_split_array_and_index(tmp_path):
    data = np.random.default_rng(1).standard_normal((100, 8)).astype(np.float32)
    path = write(tmp_path / "c.zarr", {"x": data, "y": np.arange(100)}, chunk_samples=25, progress=False)
    (tmp_path / "c.zarr" / "train" / "x" / "c" / "2" / "0").write_bytes(b"not blosc at all" * 10)
    group = open_store_group(path)
    reader = ChunkReader(group["train/x"], (path, "train", "x"))
    np.testing.assert_array_equal(reader.read(1), data[25:50])
    with pytest.raises(CorruptChunkError, match=r"train/x chunk 2: cannot decode"):
        reader.read(2)


def test_the_stream_never_serves_a_garbage_or_truncated_chunk(tmp_path):
    import pipeline

    y = np.arange(400)
    x = np.repeat(y[:, None].astype(np.float32), 8, axis=1)
    path = write(tmp_path / "g.zarr", {"x": x, "y": y}, chunk_samples=50, progress=False)
    (tmp_path / "g.zarr" / "train" / "x" / "c" / "5" / "0").write_bytes(b"\x02\x01garbage" * 30)
    with pytest.raises(CorruptChunkError, match=r"train/x chunk 5"):
        for _ in pipeline.stream(path, batch_size=40):
            pass
    (tmp_path / "g.zarr" / "train" / "x" / "c" / "5" / "0").write_bytes(b"")
    with pytest.raises(CorruptChunkError, match=r"train/x chunk 5"):
        for _ in pipeline.stream(path, batch_size=40):
            pass


def _unsized_zstd(data: bytes) -> bytes:
    """A valid zstd frame of raw blocks that declares no content size (as a streaming
    compressor writes one)."""
    out = bytearray(b"\x28\xb5\x2f\xfd" + bytes([0x00, 0x50]))  # no content size; a 1 MiB window
    blocks = [data[i:i + (1 << 17)] for i in range(0, len(data), 1 << 17)] or [b""]
    for k, block in enumerate(blocks):
        out += ((len(block) << 3) | (k == len(blocks) - 1)).to_bytes(3, "little") + block
    return bytes(out)


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("codec", ["zstd", "blosc", "zstd-unsized"])
@pytest.mark.parametrize("width", [4, 2], ids=["whole-samples", "blocks"])
def test_a_valid_chunk_of_too_few_bytes_is_refused_not_served(tmp_path, codec, shuffle, width):
    """A chunk file whose frame is valid but holds fewer bytes than a chunk (another
    array's chunk copied in) decoded in place filled only part of the read buffer: the
    rest was served as it was (zeros, or another chunk's samples). zarr refuses it. The
    same for a block of an array whose chunks also split the samples (``width`` 2 of 4
    features: zarr's automatic chunks of images are such)."""
    import pipeline

    comp = [ZstdCodec()] if codec.startswith("zstd") else [BloscCodec()]
    g = zarr.open_group(tmp_path / "s.zarr", mode="w")
    x = g.create_array("x", shape=(400, 4), dtype="float32", chunks=(100, width), compressors=comp)
    x[:] = np.arange(1600, dtype="float32").reshape(400, 4)
    g.create_array("y", shape=(400,), dtype="int64", chunks=(100,), compressors=comp)[:] = np.arange(400)
    short = np.full((10, 4), -1, np.float32)
    if codec == "zstd-unsized":
        (tmp_path / "s.zarr" / "x" / "c" / "2" / str(4 // width - 1)).write_bytes(_unsized_zstd(short.tobytes()))
    else:
        g.create_array("short", shape=(10, 4), dtype="float32", chunks=(10, 4), compressors=comp)[:] = short
        (tmp_path / "s.zarr" / "x" / "c" / "2" / str(4 // width - 1)).write_bytes(
            (tmp_path / "s.zarr" / "short" / "c" / "0" / "0").read_bytes())
    with pytest.raises(ValueError):
        zarr.open_group(tmp_path / "s.zarr", mode="r")["x"][200:300]
    g = zarr.open_group(tmp_path / "s.zarr", mode="r")
    with pytest.raises(CorruptChunkError, match=r"chunk 2: cannot decode \(.*(160 decoded bytes|decoded 40 values)"):
        for _ in pipeline.stream((g["x"], g["y"]), batch_size=50, buffer_chunks=1, shuffle=shuffle, seed=0):
            pass


@pytest.mark.parametrize("zarr_format", [3, 2])
@pytest.mark.parametrize("width", [4, 2], ids=["whole-samples", "blocks"])
def test_a_chunk_of_several_zstd_frames_reads_as_zarr_reads_it(tmp_path, zarr_format, width):
    """zstd data may be several frames one after another (RFC 8878; ``cat a.zst b.zst``),
    the first declaring only its own size: zarr and numcodecs read the whole. It was
    refused as a chunk of the wrong size."""
    import pipeline

    data = np.arange(1600, dtype="float32").reshape(400, 4)
    g = zarr.open_group(tmp_path / "m.zarr", mode="w", zarr_format=zarr_format)
    comp = [ZstdCodec()] if zarr_format == 3 else numcodecs.Zstd()
    g.create_array("x", data=data, chunks=(100, width), compressors=comp)
    g.create_array("y", data=np.arange(400), chunks=(100,), compressors=comp)
    key = "c/1/0" if zarr_format == 3 else "1.0"
    raw = np.ascontiguousarray(data[100:200, :width]).tobytes()
    (tmp_path / "m.zarr" / "x" / key).write_bytes(numcodecs.Zstd().encode(raw[:320]) + numcodecs.Zstd().encode(raw[320:]))
    g = zarr.open_group(tmp_path / "m.zarr", mode="r")
    np.testing.assert_array_equal(g["x"][:], data)
    got = {}
    for xb, yb in pipeline.stream(tmp_path / "m.zarr", split=None, batch_size=64, seed=1):
        got.update(zip(yb.tolist(), xb.copy()))
    assert sorted(got) == list(range(400))
    np.testing.assert_array_equal(np.stack([got[i] for i in range(400)]), data)


def test_an_unsized_zstd_chunk_of_the_right_size_reads_as_zarr_reads_it(tmp_path):
    import pipeline

    g = zarr.open_group(tmp_path / "u.zarr", mode="w")
    x = g.create_array("x", shape=(300, 4), dtype="float32", chunks=(100, 4), compressors=[ZstdCodec()])
    x[:] = np.arange(1200, dtype="float32").reshape(300, 4)
    g.create_array("y", shape=(300,), dtype="int64", chunks=(100,), compressors=[ZstdCodec()])[:] = np.arange(300)
    (tmp_path / "u.zarr" / "x" / "c" / "1" / "0").write_bytes(_unsized_zstd(x[100:200].tobytes()))
    got = {}
    for xb, yb in pipeline.stream((g["x"], g["y"]), batch_size=64, seed=1):
        got.update(zip(yb.tolist(), xb))
    assert sorted(got) == list(range(300))
    np.testing.assert_array_equal(np.stack([got[i] for i in range(300)]), x[:])


def test_a_pipeline_store_chunk_of_too_few_bytes_is_refused(tmp_path):
    import pipeline

    y = np.arange(400)
    x = np.repeat(y[:, None].astype(np.float32), 8, axis=1)
    path = write(tmp_path / "o.zarr", {"x": x, "y": y}, chunk_samples=50, progress=False)
    other = write(tmp_path / "p.zarr", {"x": x[:10], "y": y[:10]}, chunk_samples=10, progress=False)
    (tmp_path / "o.zarr" / "train" / "x" / "c" / "2" / "0").write_bytes(
        (tmp_path / "p.zarr" / "train" / "x" / "c" / "0" / "0").read_bytes())
    assert other
    with pytest.raises(CorruptChunkError, match=r"train/x chunk 2: cannot decode \(the blosc header says 320 decoded"):
        for _ in pipeline.stream(path, batch_size=40):
            pass


def test_verify_catches_a_chunk_that_decodes_to_the_wrong_bytes(tmp_path):
    import pipeline

    y = np.arange(400)
    x = np.repeat(y[:, None].astype(np.float32), 8, axis=1)
    path = write(tmp_path / "v.zarr", {"x": x, "y": y}, chunk_samples=50, codec="none", progress=False)
    chunk = tmp_path / "v.zarr" / "train" / "x" / "c" / "3" / "0"
    data = bytearray(chunk.read_bytes())
    data[17] ^= 0x40  # a silent bit flip: same length, still "decodes"
    chunk.write_bytes(bytes(data))
    assert sum(len(b) for _, b in pipeline.stream(path, batch_size=40)) == 400  # undetectable unverified
    with pytest.raises(CorruptChunkError, match=r"train/x chunk 3: checksum mismatch"):
        for _ in pipeline.stream(path, batch_size=40, verify=True):
            pass
    clean = write(tmp_path / "c.zarr", {"x": x, "y": y}, chunk_samples=50, progress=False)
    ids = np.concatenate([b for _, b in pipeline.stream(clean, batch_size=40, verify=True)])
    assert sorted(ids.tolist()) == list(range(400))


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_reader_undoes_a_column_major_transpose(tmp_path, codec):
    from zarr.codecs import TransposeCodec

    data = np.random.default_rng(4).standard_normal((95, 7)).astype(np.float32)
    arr = zarr.create_array(str(tmp_path / "t.zarr"), shape=data.shape, chunks=(20, 7), dtype="float32",
                            filters=[TransposeCodec(order=(1, 0))], compressors=CODECS[codec])
    arr[:] = data
    reader = ChunkReader(arr, ("t.zarr", "_shared", "features"))
    assert reader._transposed and reader._decoder is not None  # the fast path, not the fallback
    np.testing.assert_array_equal(np.concatenate([reader.read(i) for i in range(reader.n_chunks)]), data)


# -- more layouts: the fast path for what the writer produces, the fallback for the rest -------------------


MORE_CODECS = {
    "lz4-bitshuffle": [BloscCodec(cname="lz4", clevel=5, shuffle="bitshuffle")],
    "lz4-noshuffle": [BloscCodec(cname="lz4", clevel=5, shuffle="noshuffle")],
    "zstd-shuffle": [BloscCodec(cname="zstd", clevel=3, shuffle="shuffle")],
    "blosclz": [BloscCodec(cname="blosclz", clevel=5, shuffle="shuffle")],
    "zstd-1": [ZstdCodec(level=1)],
}


def _chunks_equal_zarr(reader, arr):
    c = int(arr.chunks[0])
    for i in range(reader.n_chunks):
        got = reader.read(i)
        want = arr[i * c : (i + 1) * c]
        # Native byte order whatever the store keeps (zarr keeps a big-endian store's).
        assert got.dtype.isnative and got.dtype == want.dtype.newbyteorder("=") and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("codec", list(MORE_CODECS))
@pytest.mark.parametrize("dtype, tail", [("float32", (3,)), ("int16", ()), ("uint8", (2, 3)), ("float64", (4, 2, 2)),
                                         ("int64", ())])
def test_fast_path_equals_zarr_for_codecs_dtypes_and_ranks(tmp_path, codec, dtype, tail):
    rng = np.random.default_rng(2)
    data = (rng.standard_normal((93,) + tail) * 100).astype(dtype)
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=data.shape, chunks=(16,) + tail, dtype=dtype,
                            compressors=MORE_CODECS[codec])
    arr[:] = data
    reader = ChunkReader(arr, ("a.zarr", "train", "x"))
    assert reader._decoder is not None and reader._root is not None  # fast path, files read directly
    assert reader.n_chunks == 6 and reader.length(5) == 93 - 80
    _chunks_equal_zarr(reader, arr)
    # decoding into a caller's buffer: a full chunk and the short last one
    for i, rows in ((1, 16), (5, 13)):
        out = np.full((rows,) + tail, 7, dtype=dtype)
        assert reader.read(i, out) is out
        np.testing.assert_array_equal(out, data[i * 16 : i * 16 + rows])


@pytest.mark.parametrize(
    "layout",
    ["partial-inner-chunks", "dot-separator", "v2-keys", "big-endian", "shards-split-on-axis-1", "shards-gzip-inside"],
)
def test_other_layouts_fall_back_to_zarr_and_still_match(tmp_path, layout):
    from zarr.codecs import BytesCodec

    data = np.arange(107 * 6 * 2, dtype=np.float32).reshape(107, 6, 2) * 0.5
    kwargs: dict = dict(shape=data.shape, dtype="float32", chunks=(20, 6, 2),
                        compressors=[BloscCodec(cname="lz4", shuffle="shuffle")])
    if layout == "partial-inner-chunks":
        kwargs["chunks"] = (20, 3, 2)
    elif layout == "dot-separator":
        kwargs["chunk_key_encoding"] = {"name": "default", "separator": "."}
    elif layout == "v2-keys":
        kwargs["chunk_key_encoding"] = {"name": "v2", "separator": "."}
    elif layout == "big-endian":
        kwargs["dtype"] = ">f4"
        kwargs["serializer"] = BytesCodec(endian="big")
    elif layout == "shards-split-on-axis-1":
        kwargs["chunks"], kwargs["shards"] = (20, 3, 2), (40, 3, 2)
    else:
        from zarr.codecs import GzipCodec, ShardingCodec

        kwargs["serializer"] = ShardingCodec(chunk_shape=(20, 6, 2), codecs=[BytesCodec(), GzipCodec()])
        kwargs["compressors"] = None
        kwargs["chunks"] = (40, 6, 2)
    arr = zarr.create_array(str(tmp_path / "a.zarr"), **kwargs)
    arr[:] = data
    reader = ChunkReader(arr, ("a.zarr", "train", "x"))
    assert reader._decoder is None  # no whole-chunk decode: zarr's read, or block by block
    assert (reader._blocks is not None) == (layout == "partial-inner-chunks")
    assert reader.n_chunks == 6
    _chunks_equal_zarr(reader, arr)
    out = np.empty((7, 6, 2), dtype=reader.dtype)
    np.testing.assert_array_equal(reader.read(5, out), data[100:])


def test_a_chunk_never_written_reads_as_the_fill_value(tmp_path):
    arr = zarr.create_array(str(tmp_path / "f.zarr"), shape=(50, 3), chunks=(10, 3), dtype="int32", fill_value=7,
                            compressors=[BloscCodec(cname="lz4")])
    arr[0:10] = np.arange(30, dtype=np.int32).reshape(10, 3)
    reader = ChunkReader(arr, ("f.zarr", "train", "x"))
    _chunks_equal_zarr(reader, arr)
    assert (reader.read(3) == 7).all()


@pytest.mark.parametrize("codec", ["blosc-lz4", "zstd", "none"])
def test_writer_stores_fast_path_equals_zarr_including_zip(tmp_path, codec):
    n = 301
    y = np.arange(n, dtype=np.int64)
    x = (y[:, None, None] * 10 + np.arange(6).reshape(1, 3, 2)).astype(np.float32)
    for name in ("d.zarr", "z.zarr.zip"):
        path = write(tmp_path / f"{codec}-{name}", {"x": x, "y": y}, chunk_samples=40, codec=codec, progress=False)
        group = open_store_group(path)
        for key, want in (("x", x), ("y", y)):
            arr = group[f"train/{key}"]
            reader = ChunkReader(arr, (path, "train", key))
            assert reader._decoder is not None  # writer stores take the fast path, zip too
            assert (reader._root is None) == name.endswith(".zip")  # zip: bytes through the store
            _chunks_equal_zarr(reader, arr)
            np.testing.assert_array_equal(np.concatenate([reader.read(i) for i in range(reader.n_chunks)]), want)


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("codec", ["blosc-lz4", "blosc-zstd", "zstd", "none"])
@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_damaged_chunks_are_corrupt_chunk_errors_naming_where(tmp_path, codec, damage, mapped):
    y = np.arange(200, dtype=np.int64)
    x = np.repeat(y[:, None].astype(np.float32), 6, axis=1)
    path = write(tmp_path / "c.zarr", {"x": x, "y": y}, chunk_samples=40, codec=codec, progress=False)
    chunk = tmp_path / "c.zarr" / "train" / "x" / "c" / "3" / "0"
    raw = chunk.read_bytes()
    chunk.write_bytes({"garbage": b"\x07garbage!" * 13, "truncated": raw[: len(raw) // 2 + 1], "empty": b""}[damage])
    group = open_store_group(path)
    reader = ChunkReader(group["train/x"], (path, "train", "x"), maps=MapCache() if mapped else None)
    np.testing.assert_array_equal(reader.read(2), x[80:120])  # neighbours still read
    with pytest.raises(CorruptChunkError) as info:
        reader.read(3)
    err = info.value
    assert (err.split, err.array, err.index) == ("train", "x", 3)
    assert "train/x chunk 3" in str(err) and path in str(err)


def test_a_garbage_shard_is_a_corrupt_chunk_error(tmp_path):
    y = np.arange(400, dtype=np.int64)
    x = np.repeat(y[:, None].astype(np.float32), 8, axis=1)
    path = write(tmp_path / "s.zarr", {"x": x, "y": y}, chunk_samples=50, shard_chunks=2, progress=False)
    (tmp_path / "s.zarr" / "train" / "x" / "c" / "1" / "0").write_bytes(b"\x02\x01garbage" * 30)
    reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"))
    with pytest.raises(CorruptChunkError, match=r"train/x chunk 2"):
        reader.read(2)


# -- sharded arrays: the shard index is read once, each inner chunk is one byte-range read ----------------


@pytest.mark.parametrize("codec", ["lz4-shuffle", "zstd", "none"])
@pytest.mark.parametrize("index_location", ["end", "start"])
@pytest.mark.parametrize("index_crc", [True, False])
def test_sharded_fast_path_equals_zarr(tmp_path, codec, index_location, index_crc):
    from zarr.codecs import BytesCodec, Crc32cCodec, ShardingCodec

    data = np.random.default_rng(5).standard_normal((107, 5, 2)).astype(np.float32)
    data[40:60] = 0  # an all-fill inner chunk: left out of the shard, its index entry is empty
    sharding = ShardingCodec(chunk_shape=(20, 5, 2), codecs=[BytesCodec(), *CODECS[codec]],
                             index_codecs=[BytesCodec(), Crc32cCodec()] if index_crc else [BytesCodec()],
                             index_location=index_location)
    arr = zarr.create_array(str(tmp_path / "s.zarr"), shape=data.shape, chunks=(60, 5, 2), dtype="float32",
                            serializer=sharding, compressors=None, fill_value=0)
    arr[:] = data
    reader = ChunkReader(arr, ("s.zarr", "train", "x"))
    assert reader._decoder is not None and reader._per_shard == 3  # the fast path, not zarr's read
    assert reader.n_chunks == 6 and reader.length(5) == 7
    _chunks_equal_zarr(reader, arr)
    assert set(reader._indexes) == {0, 1}  # one index read per shard
    out = np.full((7, 5, 2), 9, np.float32)
    np.testing.assert_array_equal(reader.read(5, out), data[100:])


def test_sharded_array_with_a_missing_shard_reads_the_fill_value(tmp_path):
    arr = zarr.create_array(str(tmp_path / "m.zarr"), shape=(80, 3), chunks=(10, 3), shards=(40, 3), dtype="int32",
                            fill_value=-1, compressors=[BloscCodec(cname="lz4")])
    arr[40:80] = np.arange(120, dtype=np.int32).reshape(40, 3)
    reader = ChunkReader(arr, ("m.zarr", "train", "y"))
    assert reader._decoder is not None
    _chunks_equal_zarr(reader, arr)
    assert (reader.read(0) == -1).all() and reader._indexes[0] is None


@pytest.mark.parametrize("name", ["d.zarr", "z.zarr.zip"])
def test_writer_sharded_stores_take_the_fast_path_including_zip(tmp_path, name):
    y = np.arange(333, dtype=np.int64)
    x = (y[:, None] * 3 + np.arange(4)).astype(np.float32)
    path = write(tmp_path / name, {"x": x, "y": y}, chunk_samples=25, shard_chunks=4, progress=False)
    group = open_store_group(path)
    for key, want in (("x", x), ("y", y)):
        arr = group[f"train/{key}"]
        reader = ChunkReader(arr, (path, "train", key))
        assert reader._decoder is not None and reader._per_shard == 4
        _chunks_equal_zarr(reader, arr)
        np.testing.assert_array_equal(np.concatenate([reader.read(i) for i in range(reader.n_chunks)]), want)


@pytest.mark.parametrize("damage", ["index-bit-flip", "truncated"])
def test_a_damaged_shard_is_a_corrupt_chunk_error_on_the_fast_path(tmp_path, damage):
    y = np.arange(400, dtype=np.int64)
    x = np.repeat(y[:, None].astype(np.float32), 8, axis=1)
    path = write(tmp_path / "s.zarr", {"x": x, "y": y}, chunk_samples=50, shard_chunks=4, progress=False)
    shard = tmp_path / "s.zarr" / "train" / "x" / "c" / "1" / "0"
    raw = bytearray(shard.read_bytes())
    if damage == "index-bit-flip":
        raw[-10] ^= 0x01
        shard.write_bytes(bytes(raw))
        match = r"train/x chunk 4: cannot read shard 1's index"
    else:
        # keep the index, drop the start of the data: offsets now point past the end
        shard.write_bytes(bytes(raw[: len(raw) // 3]) + bytes(raw[-(16 * 4 + 4):]))
        match = r"train/x chunk [4-7]: (shard 1 is truncated|cannot decode)"
    reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"))
    assert reader._decoder is not None
    np.testing.assert_array_equal(reader.read(2), x[100:150])  # the other shard still reads
    with pytest.raises(CorruptChunkError, match=match):
        for i in range(4, 8):
            reader.read(i)


@pytest.mark.parametrize("keep", [0, 8, 16, 40, -1])
def test_a_truncated_blosc_chunk_never_decodes_bytes_beyond_it(tmp_path, keep):
    # numcodecs' blosc decoder trusts the frame header's size: after reading a good chunk
    # into the thread's read buffer, a truncated one must not decode the stale bytes.
    y = np.arange(400, dtype=np.int64)
    x = np.repeat(y[:, None].astype(np.float32), 8, axis=1)
    path = write(tmp_path / "t.zarr", {"x": x, "y": y}, chunk_samples=50, codec="blosc-lz4", progress=False)
    chunk = tmp_path / "t.zarr" / "train" / "x" / "c" / "5" / "0"
    good = (tmp_path / "t.zarr" / "train" / "x" / "c" / "4" / "0").read_bytes()
    chunk.write_bytes(good[: keep if keep >= 0 else len(good) - 1])  # chunk 4's prefix, cut short
    reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"))
    np.testing.assert_array_equal(reader.read(4), x[200:250])
    with pytest.raises(CorruptChunkError, match=r"train/x chunk 5: cannot decode"):
        reader.read(5)


def test_nothing_a_read_returns_aliases_a_mapped_chunk_file(tmp_path, own_mappings):
    """Chunk files stay mapped, but what a read returns is decoded or copied out of them."""
    data = np.random.default_rng(2).standard_normal((120, 6)).astype(np.float32)
    for codec in ("blosc-lz4", "none"):
        path = write(tmp_path / f"{codec}.zarr", {"x": data, "y": np.arange(120)}, chunk_samples=40, codec=codec,
                     progress=False)
        maps = MapCache()
        before = own_mappings()
        reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"), maps=maps)
        got = [reader.read(i) for i in range(reader.n_chunks)]
        kept = [maps.get(os.path.join(reader._root, reader._key(i))) for i in range(reader.n_chunks)]
        assert all(m is not None for m in kept) and own_mappings() == before + len(kept)
        assert not any(np.shares_memory(a, m) for a in got for m in kept)
        maps.clear()
        del kept
        assert own_mappings() == before  # no returned array kept a mapping alive
        np.testing.assert_array_equal(np.concatenate(got), data)


def test_read_buffers_are_shared_by_threads_that_come_and_go(tmp_path):
    """The streamer's read threads are new every epoch; their read buffers are not
    (each new buffer would be page-faulted in again)."""
    import threading

    data = np.random.default_rng(3).standard_normal((400, 50)).astype(np.float32)
    path = write(tmp_path / "t.zarr", {"x": data, "y": np.arange(400)}, chunk_samples=100, progress=False)
    reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"))
    seen: set[int] = set()
    got = {}

    def read(i):
        got[i] = reader.read(i)
        seen.update(id(b) for b in reader._scratch_free)

    for i in range(reader.n_chunks):  # one short-lived thread per read, one after another
        t = threading.Thread(target=read, args=(i,))
        t.start()
        t.join()
    assert len(seen) == 1 and len(reader._scratch_free) == 1
    np.testing.assert_array_equal(np.concatenate([got[i] for i in range(reader.n_chunks)]), data)


def _mapped_store(tmp_path):
    data = np.random.default_rng(5).standard_normal((300, 40)).astype(np.float32)
    path = write(tmp_path / "k.zarr", {"x": data, "y": np.arange(300)}, chunk_samples=100, codec="none",
                 progress=False)
    return path, data, 100 * 40 * 4  # bytes of one uncompressed chunk file


def _counting_maps(monkeypatch) -> list[int]:
    made: list[int] = []
    real = chunks_module.map_file
    monkeypatch.setattr(chunks_module, "map_file", lambda *a, **k: made.append(1) or real(*a, **k))
    return made


def test_mapped_files_stay_mapped_from_one_read_to_the_next(tmp_path, monkeypatch):
    """With a MapCache, each file is mapped once: later reads (later epochs) reuse the
    mapping, with no new map, fault or unmap."""
    path, data, size = _mapped_store(tmp_path)
    maps = MapCache(budget=10 * size)
    reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"), maps=maps)
    made = _counting_maps(monkeypatch)
    for _ in range(3):
        np.testing.assert_array_equal(np.concatenate([reader.read(i) for i in range(3)]), data)
    assert len(made) == 3 and maps.mapped_bytes == 3 * size
    maps.clear()
    assert maps.mapped_bytes == 0
    np.testing.assert_array_equal(reader.read(1), data[100:200])  # mapped again
    assert len(made) == 4


def test_the_map_cache_keeps_the_files_it_mapped_first_past_its_budget(tmp_path, monkeypatch):
    """Past its budget the cache unmaps nothing it keeps: a file that does not fit is
    mapped for its read only (tests/streaming/test_maps.py has the epochs)."""
    path, data, size = _mapped_store(tmp_path)
    maps = MapCache(budget=2 * size)
    reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"), maps=maps)
    for i in (0, 1):
        reader.read(i)
    first = maps.get(reader._root + "/c/0/0")
    reader.read(2)  # over budget: read, not kept
    assert maps.mapped_bytes == 2 * size
    assert maps.get(reader._root + "/c/2/0") is None and maps.get(reader._root + "/c/0/0") is first
    np.testing.assert_array_equal(first.view(np.float32).reshape(100, 40), data[:100])
    np.testing.assert_array_equal(np.concatenate([reader.read(i) for i in range(3)]), data)


def test_the_map_cache_keeps_at_most_max_files_mappings(tmp_path, monkeypatch):
    """A process may hold only so many mappings (vm.max_map_count): the cache unmaps by
    count as well as by bytes."""
    path, data, size = _mapped_store(tmp_path)
    maps = MapCache(budget=100 * size, max_files=2)
    reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"), maps=maps)
    np.testing.assert_array_equal(np.concatenate([reader.read(i) for i in range(3)]), data)
    assert maps.mapped_bytes == 2 * size and maps.get(reader._root + "/c/2/0") is None


def test_a_file_that_cannot_be_mapped_is_read(tmp_path, monkeypatch):
    path, data, size = _mapped_store(tmp_path)
    maps = MapCache(budget=100 * size)
    reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"), maps=maps)

    def no_more_maps(*a, **k):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(chunks_module, "map_file", no_more_maps)
    np.testing.assert_array_equal(np.concatenate([reader.read(i) for i in range(3)]), data)
    assert maps.mapped_bytes == 0


def test_unmapping_a_file_still_being_decoded_waits_for_that_read(tmp_path, own_mappings):
    """clear() (or an eviction) while another thread still reads a mapping: the mapping
    is dropped from the cache, and unmapped only once that read lets go of it."""
    path, data, size = _mapped_store(tmp_path)
    maps = MapCache(budget=10 * size)
    reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"), maps=maps)
    before = own_mappings()
    reader.read(0)
    held = memoryview(maps.get(reader._root + "/c/0/0"))  # what a decode in progress holds
    assert own_mappings() == before + 1
    maps.clear()
    assert maps.mapped_bytes == 0 and own_mappings() == before + 1  # still mapped
    np.testing.assert_array_equal(np.frombuffer(held, dtype=np.float32).reshape(100, 40), data[:100])
    held.release()
    del held
    assert own_mappings() == before  # unmapped once the read let go


def test_mapped_files_hold_no_file_descriptors(tmp_path):
    """A stream keeps every chunk file it read mapped: a store of more chunk files than
    the process may open descriptors streams, epoch after epoch, and the process can
    still open files (Python's own mmap would keep one descriptor per mapping)."""
    path = write(tmp_path / "many.zarr", {"x": np.arange(6000 * 8, dtype=np.float32).reshape(6000, 8),
                                           "y": np.arange(6000)}, chunk_samples=10, codec="blosc-lz4",
                 progress=False)  # 600 chunk files per array
    code = f"""
import os, resource
import numcodecs
import numpy as np
import pipeline
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
s = pipeline.stream({str(path)!r}, batch_size=100, seed=0)
for e in range(2):
    s.set_epoch(e)
    ids = np.concatenate([y for _, y in s])
    assert sorted(ids.tolist()) == list(range(6000)), e
print(s.source.maps.mapped_bytes > 0, len(os.listdir("/proc/self/fd")) < 64)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "True"]


def test_closing_a_stream_unmaps_its_files(tmp_path):
    import pipeline

    path, data, size = _mapped_store(tmp_path)
    s = pipeline.stream(path, batch_size=64, seed=0)
    ids = np.concatenate([y for _, y in s])
    assert sorted(ids.tolist()) == list(range(300))
    # Every chunk file of x and y, small ones too: kept mapped, only their first read faults.
    files = [os.path.join(path, "train", n, "c", str(i), *(["0"] if n == "x" else [])) for n in "xy" for i in range(3)]
    assert s.source.maps.mapped_bytes == sum(os.path.getsize(f) for f in files)
    s.close()
    assert s.source.maps.mapped_bytes == 0
    assert sorted(np.concatenate([y for _, y in s]).tolist()) == list(range(300))  # usable again


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 40), tail=st.lists(st.integers(1, 7), min_size=1, max_size=2), data=st.data(),
       codec=st.sampled_from(["lz4", "zstd", "none"]), dtype=st.sampled_from(["float32", "int16", "uint8"]))
def test_chunks_that_split_samples_are_read_block_by_block_as_zarr_reads_them(tmp_path_factory, rows, tail, data,
                                                                             codec, dtype):
    n = data.draw(st.integers(1, 3 * rows), label="n")
    split = [data.draw(st.integers(1, t), label="split") for t in tail]
    if split == tail:
        split[0] = max(1, tail[0] - 1) if tail[0] > 1 else split[0]
    values = np.random.default_rng(n).integers(0, 100, size=(n, *tail)).astype(dtype)
    compressors = (None if codec == "none" else [BloscCodec(cname="lz4")] if codec == "lz4" else [ZstdCodec()])
    arr = zarr.create_array(str(tmp_path_factory.mktemp("blocks") / "a.zarr"), shape=values.shape, dtype=dtype,
                            chunks=(rows, *split), compressors=compressors, fill_value=7)
    arr[: n // 2] = values[: n // 2]  # the rest never written: read as the fill value
    reader = ChunkReader(arr, ("a.zarr", "train", "x"))
    if split != tail:
        assert reader._blocks is not None
    _chunks_equal_zarr(reader, arr)


def test_a_flipped_byte_that_still_decodes_is_refused_with_verify(tmp_path):
    """The default codec (blosc lz4, shuffled): a byte flipped in a chunk's compressed
    payload that still decodes, to other values. The default stream refuses only what
    fails to decode, so it serves them (as the README says); ``verify=True`` refuses
    the chunk, naming the store, split, array and chunk."""
    import numcodecs

    import pipeline

    y = np.arange(400)
    x = np.random.default_rng(3).standard_normal((400, 8)).astype(np.float32)
    x[:, 0] = y  # each sample's id, to find what was served
    path = write(tmp_path / "b.zarr", {"x": x, "y": y}, chunk_samples=50, progress=False)
    chunk = tmp_path / "b.zarr" / "train" / "x" / "c" / "6" / "0"
    good = chunk.read_bytes()
    for k in range(len(good) // 2, len(good)):  # the first flip past the middle that decodes, to other bytes
        bad = bytearray(good)
        bad[k] ^= 0x10
        try:
            decoded = np.frombuffer(numcodecs.Blosc().decode(bytes(bad)), dtype=np.float32).reshape(50, 8)
        except Exception:  # noqa: BLE001 - this flip fails to decode: the default stream refuses it already
            continue
        if not np.array_equal(decoded, x[300:350]):
            break
    else:
        pytest.fail("no flipped byte of the chunk decodes")
    chunk.write_bytes(bytes(bad))
    served = np.concatenate([xb.copy() for xb, _ in pipeline.stream(path, batch_size=40)])
    assert len(served) == 400 and not np.array_equal(np.sort(served, axis=0), np.sort(x, axis=0))  # served, wrong
    with pytest.raises(CorruptChunkError) as err:
        for _ in pipeline.stream(path, batch_size=40, verify=True):
            pass
    assert str(err.value).startswith(f"{path}: train/x chunk 6: checksum mismatch")


@pytest.mark.parametrize("verify", [False, True])
def test_a_missing_chunk_file_of_a_pipeline_store_is_refused_unless_it_held_only_the_fill_value(tmp_path, verify):
    """zarr stores no file for a chunk of only the fill value and reads a missing one as
    that: a store copied or synced in part served zeros where its data was (500 samples
    of ``t == 0`` in a user's trial). The split's records tell the two apart."""
    import pipeline

    y = np.arange(400)
    x = np.repeat(y[:, None].astype(np.float32), 8, axis=1)
    x[100:200], y[100:200] = 0, 0  # chunks 2 and 3 hold only the fill value: no files
    path = write(tmp_path / "m.zarr", {"x": x, "y": y}, chunk_samples=50, progress=False)
    stored = sorted(int(f) for f in os.listdir(tmp_path / "m.zarr" / "train" / "y" / "c"))
    assert stored == [0, 1, 4, 5, 6, 7]
    xs, ys = [], []
    for xb, yb in pipeline.stream(path, batch_size=40, seed=2, verify=verify):
        xs += xb[:, 0].tolist()
        ys += yb.tolist()
    assert sorted(xs) == sorted(x[:, 0].tolist()) and sorted(ys) == sorted(y.tolist())
    os.remove(tmp_path / "m.zarr" / "train" / "y" / "c" / "5")
    with pytest.raises(CorruptChunkError, match=r"train/y chunk 5: its chunk file 'c/5' is missing, but the store's "
                                                r"records say the chunk holds data"):
        for _ in pipeline.stream(path, batch_size=40, seed=2, verify=verify):
            pass
