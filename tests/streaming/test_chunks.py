"""The fast chunk reader equals zarr's own read; corrupt chunks are named, never served."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

from pipeline.errors import CorruptChunkError
from pipeline.storage import write
from pipeline.storage.store import open_store_group
from pipeline.streaming.chunks import ChunkReader

CODECS = {
    "lz4-shuffle": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
    "zstd-bitshuffle": [BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle")],
    "zstd": [ZstdCodec(level=3)],
    "none": [],
}


@pytest.mark.parametrize("codec", list(CODECS))
@pytest.mark.parametrize("shards", [None, (60, 5, 2)])
def test_reader_equals_zarr_for_codecs_short_last_chunk_and_shards(tmp_path, codec, shards):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((107, 5, 2)).astype(np.float32)
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=data.shape, chunks=(20, 5, 2), shards=shards,
                            dtype="float32", compressors=CODECS[codec])
    arr[:] = data
    reader = ChunkReader(arr, ("a.zarr", "train", "x"))
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
