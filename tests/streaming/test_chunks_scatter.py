"""ChunkReader.scatter: rows decoded straight to their mixed places equal zarr's own read."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.codecs import BloscCodec, ZstdCodec

import pipeline
from pipeline.errors import CorruptChunkError
from pipeline.storage import write
from pipeline.storage.store import open_store_group
from pipeline.streaming import blosc as blosc_mod
from pipeline.streaming.blosc import check_block_starts
from pipeline.streaming.chunks import ChunkReader
from pipeline.streaming.maps import MapCache


@pytest.fixture(autouse=True)
def blockwise_always(monkeypatch):
    """The block path for chunks of any size (by default only for chunks of more than
    16 MiB, which these tests do not need to write)."""
    monkeypatch.setattr(blosc_mod, "BLOCKWISE_ABOVE", 0)


def test_small_chunks_are_decoded_whole_by_default(tmp_path, monkeypatch):
    monkeypatch.setattr(blosc_mod, "BLOCKWISE_ABOVE", 16 * 2**20)
    calls = _recording_getitem(monkeypatch)
    x = np.random.default_rng(0).standard_normal((300, 64, 32)).astype(np.float32)  # one chunk of 2.3 MiB
    path = write(tmp_path / "w.zarr", {"x": x, "y": np.arange(300)}, chunk_samples=300, progress=False)
    reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"))
    assert reader.n_chunks == 1
    out = np.zeros_like(x)
    reader.scatter(0, 0, 300, out, np.arange(300)[::-1])
    np.testing.assert_array_equal(out[::-1], x)
    assert not calls
    monkeypatch.setattr(blosc_mod, "BLOCKWISE_ABOVE", 2**20)  # the chunk is then large
    reader.scatter(0, 0, 300, out, np.arange(300))
    np.testing.assert_array_equal(out, x)
    assert calls


def _recording_getitem(monkeypatch):
    """The (first item, items) of every blosc_getitem call (the block-span path)."""
    calls = []
    real = blosc_mod.BLOSC_GETITEM

    def recorded(src, start, nitems, dest):
        calls.append((start, nitems))
        return real(src, start, nitems, dest)

    monkeypatch.setattr(blosc_mod, "BLOSC_GETITEM", recorded)
    return calls


def _blocksize(arr_path):
    """The blosc block size written in the first chunk's header."""
    raw = (arr_path / "c" / "0" / "0" / "0").read_bytes()[:16] if (arr_path / "c" / "0" / "0").is_dir() \
        else (arr_path / "c" / "0" / "0").read_bytes()[:16]
    return int.from_bytes(raw[8:12], "little")


def _scatter_equals_zarr(reader, arr, rng, pieces=4):
    """Scatter random row ranges of every chunk to random places; compare with zarr."""
    c = int(arr.chunks[0])
    for i in range(reader.n_chunks):
        want_chunk = arr[i * c : (i + 1) * c]
        n = want_chunk.shape[0]
        for lo, hi in [(0, n)] + [tuple(sorted(rng.choice(n + 1, 2, replace=False))) for _ in range(pieces)]:
            out = np.full((2 * n,) + want_chunk.shape[1:], -1, dtype=want_chunk.dtype)
            rows = rng.choice(2 * n, hi - lo, replace=False)
            reader.scatter(i, lo, hi, out, rows)
            want = np.full_like(out, -1)
            want[rows] = want_chunk[lo:hi]
            np.testing.assert_array_equal(out, want, err_msg=f"chunk {i}, rows {lo}-{hi}")


def test_numcodecs_exports_blosc_getitem():
    # The fast path depends on it; if a numcodecs release hides the symbol, this says so
    # (the stream then decodes whole chunks, still correct, about 1.2x slower).
    assert blosc_mod.BLOSC_GETITEM is not None


# (codec, tail, path): rows tile blocks, blocks tile rows, or neither; "whole": decoded
# whole, then scattered.
GEOMETRIES = {
    "lz4-rows-in-blocks": (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", blocksize=400), (5, 2), "blocks"),
    "zstd-bitshuffle-rows-in-blocks": (BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle", blocksize=800),
                                       (5, 2), "blocks"),
    # (blosc enlarges lz4's blocks to 64 KB when it splits them; zstd's it keeps)
    "zstd-blocks-in-rows": (BloscCodec(cname="zstd", clevel=3, shuffle="shuffle", blocksize=1024), (16, 32), "blocks"),
    "blosclz-noshuffle-one-block": (BloscCodec(cname="blosclz", clevel=5, shuffle="noshuffle"), (3,), "blocks"),
    "uncompressed-frame": (BloscCodec(cname="lz4", clevel=0, shuffle="noshuffle"), (7,), "blocks"),
    "rows-straddle-blocks": (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", blocksize=256), (5, 2), "blocks"),
    "rows-straddle-spans": (BloscCodec(cname="zstd", clevel=3, shuffle="shuffle", blocksize=1024), (9, 7), "blocks"),
    "zstd": (ZstdCodec(level=3), (5, 2), "whole"),
    "none": (None, (5, 2), "whole"),
}


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("shards", [False, True])
@pytest.mark.parametrize("geometry", list(GEOMETRIES))
def test_scatter_equals_zarr_for_codecs_block_geometries_and_shards(tmp_path, monkeypatch, geometry, shards, mapped):
    codec, tail, path = GEOMETRIES[geometry]
    rng = np.random.default_rng(3)
    data = (rng.standard_normal((107,) + tail) * 50).astype(np.float32)
    data[:, ..., 0] = np.arange(107)[:, None] if len(tail) > 1 else np.arange(107)  # compressible too
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=data.shape, chunks=(20,) + tail,
                            shards=(60,) + tail if shards else None, dtype="float32",
                            compressors=[codec] if codec is not None else [])
    arr[:] = data
    calls = _recording_getitem(monkeypatch)
    reader = ChunkReader(arr, ("a.zarr", "train", "x"), maps=MapCache() if mapped else None)
    _scatter_equals_zarr(reader, arr, rng)
    assert bool(calls) == (path == "blocks")


@pytest.mark.parametrize("geometry", ["lz4-rows-in-blocks", "zstd-blocks-in-rows", "rows-straddle-spans"])
@pytest.mark.parametrize("span_blocks", [1, 2, 3, 64])
def test_scatter_decodes_the_rows_asked_for_in_spans_of_whole_blocks(tmp_path, monkeypatch, geometry, span_blocks):
    codec, tail, _ = GEOMETRIES[geometry]
    data = np.random.default_rng(0).standard_normal((40,) + tail).astype(np.float32)
    arr = zarr.create_array(str(tmp_path / "a.zarr"), shape=data.shape, chunks=(40,) + tail, dtype="float32",
                            compressors=[codec])
    arr[:] = data
    row_bytes = 4 * int(np.prod(tail))
    block = _blocksize(tmp_path / "a.zarr")
    # blocks of 10 rows, rows of 2 blocks, or rows that straddle blocks (252 B rows, 1 KB blocks)
    assert {"lz4-rows-in-blocks": block == 10 * row_bytes, "zstd-blocks-in-rows": row_bytes == 2 * block,
            "rows-straddle-spans": block % row_bytes and row_bytes % block}[geometry]
    monkeypatch.setattr(blosc_mod, "SCATTER_BYTES", span_blocks * block)
    calls = _recording_getitem(monkeypatch)
    reader = ChunkReader(arr, ("a.zarr", "train", "x"))
    out = np.zeros((26,) + tail, np.float32)
    rows = np.random.default_rng(1).permutation(26)
    reader.scatter(0, 7, 33, out, rows)
    np.testing.assert_array_equal(out[rows], data[7:33])
    # the calls decode exactly the bytes of rows 7-32, one after another ...
    got = [(4 * a, 4 * (a + n)) for a, n in calls]  # items of 4 bytes -> bytes
    assert got[0][0] == 7 * row_bytes and got[-1][1] == 33 * row_bytes
    assert all(b == c for (_, b), (c, _) in zip(got, got[1:]))
    # ... one call per span of whole blocks touched, so that each block is decoded once
    span = span_blocks * block
    assert all(a // span == (b - 1) // span for a, b in got)
    assert len(got) == (33 * row_bytes - 1) // span - 7 * row_bytes // span + 1


@pytest.fixture(scope="module")
def multiblock(tmp_path_factory):
    """Chunks of 30 rows of 40 bytes, the last chunk short, in blosc blocks of 10 rows
    (400 bytes) or of 256 bytes (rows straddle blocks)."""
    data = np.random.default_rng(5).standard_normal((83, 10)).astype(np.float32)
    readers = {}
    for block in (400, 256):
        path = tmp_path_factory.mktemp("scatter") / f"m{block}.zarr"
        arr = zarr.create_array(str(path), shape=data.shape, chunks=(30, 10), dtype="float32",
                                compressors=[BloscCodec(cname="lz4", clevel=5, shuffle="shuffle", blocksize=block)])
        arr[:] = data
        assert _blocksize(path) == block
        readers[block] = ChunkReader(arr, (path.name, "train", "x"), maps=MapCache())
    return readers, data


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunk=st.integers(0, 2), bounds=st.tuples(st.integers(0, 30), st.integers(0, 30)), seed=st.integers(0, 2**16),
       block=st.sampled_from([400, 256]), span_blocks=st.sampled_from([1, 2, 3, 8192]))
def test_any_row_range_scattered_anywhere_equals_the_decoded_chunk(multiblock, chunk, bounds, seed, block, span_blocks):
    readers, data = multiblock
    reader = readers[block]
    n = reader.length(chunk)
    lo, hi = sorted(min(b, n) for b in bounds)
    rng = np.random.default_rng(seed)
    out = np.full((n + 5, 10), np.nan, np.float32)
    rows = rng.choice(n + 5, hi - lo, replace=False)
    saved = blosc_mod.SCATTER_BYTES
    blosc_mod.SCATTER_BYTES = span_blocks * block  # spans of 1, 2, 3 blocks: rows carried across calls
    try:
        reader.scatter(chunk, lo, hi, out, rows)
    finally:
        blosc_mod.SCATTER_BYTES = saved
    want = np.full_like(out, np.nan)
    want[rows] = data[chunk * 30 + lo : chunk * 30 + hi]
    np.testing.assert_array_equal(out, want)


def test_without_blosc_getitem_chunks_are_decoded_whole_with_the_same_result(multiblock, monkeypatch):
    readers, data = multiblock
    reader = readers[400]
    monkeypatch.setattr(blosc_mod, "BLOSC_GETITEM", None)
    out = np.zeros((30, 10), np.float32)
    rows = np.random.default_rng(1).permutation(30)
    reader.scatter(1, 0, 30, out, rows)
    np.testing.assert_array_equal(out[rows], data[30:60])


@pytest.mark.parametrize("name, shard_chunks", [("s.zarr", None), ("s.zarr.zip", None), ("s.zarr", 3),
                                                ("s.zarr.zip", 3)])
def test_stream_batches_are_the_same_with_and_without_blosc_getitem(tmp_path, monkeypatch, name, shard_chunks):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((700, 8, 4)).astype(np.float32)
    path = write(tmp_path / name, {"x": x, "y": np.arange(700)}, chunk_samples=64, shard_chunks=shard_chunks,
                 progress=False)
    calls = _recording_getitem(monkeypatch)
    fast = [(xb.copy(), yb.copy()) for xb, yb in pipeline.stream(path, batch_size=50, seed=3, buffer_chunks=3)]
    assert len(calls) >= 2 * 11  # every chunk of x and y decoded a few blocks at a time
    monkeypatch.setattr(blosc_mod, "BLOSC_GETITEM", None)
    whole = [(xb.copy(), yb.copy()) for xb, yb in pipeline.stream(path, batch_size=50, seed=3, buffer_chunks=3)]
    assert len(fast) == len(whole) == 14
    for (xa, ya), (xb, yb) in zip(fast, whole):
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(xa, x[ya])


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty", "block-offset", "decoded-size"])
def test_damaged_chunks_scattered_are_corrupt_chunk_errors_naming_where(tmp_path, damage):
    y = np.arange(200, dtype=np.int64)
    x = np.repeat(y[:, None].astype(np.float32), 6, axis=1)
    path = write(tmp_path / "c.zarr", {"x": x, "y": y}, chunk_samples=40, progress=False)
    chunk = tmp_path / "c.zarr" / "train" / "x" / "c" / "3" / "0"
    raw = bytearray(chunk.read_bytes())
    if damage == "block-offset":  # the first block's offset points past the frame's end
        raw[16:20] = (len(raw) + 1000).to_bytes(4, "little")
    elif damage == "decoded-size":  # a valid-looking header for a chunk of another size
        raw[4:8] = (int.from_bytes(raw[4:8], "little") // 2).to_bytes(4, "little")
    else:
        raw = {"garbage": b"\x02\x01garbage!" * 13, "truncated": raw[: len(raw) // 2 + 1], "empty": b""}[damage]
    chunk.write_bytes(bytes(raw))
    reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"), maps=MapCache())
    out = np.zeros((40, 6), np.float32)
    reader.scatter(2, 0, 40, out, np.arange(40)[::-1])  # neighbours still read
    np.testing.assert_array_equal(out, x[80:120][::-1])
    with pytest.raises(CorruptChunkError) as info:
        reader.scatter(3, 0, 40, out, np.arange(40))
    err = info.value
    assert (err.split, err.array, err.index) == ("train", "x", 3)
    assert "train/x chunk 3" in str(err) and path in str(err)


def test_block_offsets_outside_the_frame_are_refused():
    frame = np.zeros(16 + 4 * 3 + 100, np.uint8)
    starts = frame[16:28].view("<i4")
    starts[:] = [28, 60, 90]
    check_block_starts(frame, 0, 3 * 64, 64)  # inside: fine
    for bad in ([27, 60, 90], [28, 60, 128], [28, -5, 90]):
        starts[:] = bad
        with pytest.raises(ValueError, match="block offsets point outside"):
            check_block_starts(frame, 0, 3 * 64, 64)
    with pytest.raises(ValueError, match="too short"):
        check_block_starts(frame[:20], 0, 3 * 64, 64)
    with pytest.raises(ValueError, match="uncompressed blosc frame"):
        check_block_starts(frame[:50], 0x2, 3 * 64, 64)


def test_verified_scatter_catches_a_chunk_that_decodes_to_the_wrong_bytes(tmp_path):
    y = np.arange(400)
    x = np.repeat(y[:, None].astype(np.float32), 8, axis=1)
    path = write(tmp_path / "v.zarr", {"x": x, "y": y}, chunk_samples=50, progress=False)  # blosc
    base = tmp_path / "v.zarr" / "train" / "x" / "c"
    (base / "3" / "0").write_bytes((base / "2" / "0").read_bytes())  # a valid chunk, in the wrong place
    assert sum(len(b) for _, b in pipeline.stream(path, batch_size=40)) == 400  # undetectable unverified
    with pytest.raises(CorruptChunkError, match=r"train/x chunk 3: checksum mismatch"):
        for _ in pipeline.stream(path, batch_size=40, verify=True):
            pass
