"""``.npz`` members read by rows: every block equals numpy's read of the member, in any
order of blocks, for stored and deflated members (Fortran-ordered and 0-d ones too),
local or over a URL; a block costs memory bounded by the block and the blocks of a
member inflate it about once in all, not once each."""

from __future__ import annotations

import time
import tracemalloc
import zipfile

import fsspec
import numpy as np
import pytest

import pipeline
from pipeline.errors import LoaderError
from pipeline.loaders.npz import read_npz

SAVES = {"stored": np.savez, "deflated": np.savez_compressed}


def _member(path, key):
    with np.load(path, allow_pickle=False) as z:
        return z[key]


@pytest.mark.parametrize("how", sorted(SAVES))
def test_blocks_in_any_order_equal_numpy(tmp_path, how):
    rng = np.random.default_rng(1)
    path = tmp_path / "a.npz"
    SAVES[how](path, x=rng.standard_normal((3001, 3)).astype(">f4"), f=np.asfortranarray(rng.random((40, 5))),
               c=np.float64(3.5), e=np.zeros((0, 2)))
    expected = _member(path, "x")
    starts = list(range(0, 3001, 200))
    for order in (starts, starts[::-1], list(rng.permutation(starts))):
        for lo in order:
            got = read_npz(str(path), {}, key="x", rows=slice(lo, lo + 200))
            assert got.dtype == expected.dtype
            np.testing.assert_array_equal(got, expected[lo:lo + 200])
    np.testing.assert_array_equal(read_npz(str(path), {}, key="f")[7:19], _member(path, "f")[7:19])
    assert np.asarray(read_npz(str(path), {}, key="c")) == 3.5
    assert np.asarray(read_npz(str(path), {}, key="e")).shape == (0, 2)
    x = pipeline.load(str(path), combine="concat", key="x", chunk_rows=250)
    np.testing.assert_array_equal(x.compute(scheduler="threads"), expected)


def test_a_member_over_a_url_reads_as_numpy(tmp_path):
    a = np.arange(600, dtype="i8").reshape(200, 3)
    np.savez_compressed(tmp_path / "u.npz", x=a)
    fs = fsspec.filesystem("memory")
    fs.pipe("/npz/u.npz", (tmp_path / "u.npz").read_bytes())
    try:
        x = pipeline.load("memory://npz/u.npz", combine="concat", key="x", chunk_rows=33)
        np.testing.assert_array_equal(x.compute(scheduler="sync"), a)
    finally:
        fs.rm("/npz", recursive=True)


def test_a_block_of_a_deflated_member_costs_memory_of_the_block(tmp_path):
    a = (np.arange(8_000_000) % 251).astype("f4").reshape(2_000_000, 4)  # 32 MB, quick to deflate
    np.savez_compressed(tmp_path / "m.npz", x=a)
    tracemalloc.start()
    try:
        block = read_npz(str(tmp_path / "m.npz"), {}, key="x", rows=slice(1_500_000, 1_501_000))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(block, a[1_500_000:1_501_000])
    assert peak < a.nbytes / 3, f"peak {peak} bytes for a block of {block.nbytes}, the member is {a.nbytes}"


def test_the_blocks_of_a_member_inflate_it_about_once(tmp_path):
    a = np.random.default_rng(3).standard_normal((200_000, 8)).astype("f4")  # 6.4 MB
    np.savez_compressed(tmp_path / "t.npz", x=a)
    t = time.process_time()
    whole = _member(tmp_path / "t.npz", "x")
    once = time.process_time() - t
    path, starts = str(tmp_path / "t.npz"), range(0, 200_000, 2_000)
    t = time.process_time()
    for lo in reversed(starts):  # dask reads blocks in no fixed order; backwards is the worst
        np.testing.assert_array_equal(read_npz(path, {}, key="x", rows=slice(lo, lo + 2_000)), whole[lo:lo + 2_000])
    blocks = time.process_time() - t
    # Inflating the whole member for each of the 100 blocks takes about 50x np.load.
    assert blocks < 8 * once + 0.3, f"100 blocks took {blocks:.2f} s of CPU, np.load of the member {once:.2f} s"


def test_a_damaged_member_is_named(tmp_path):
    np.savez_compressed(tmp_path / "d.npz", x=np.random.default_rng(4).standard_normal((20_000, 2)))
    with zipfile.ZipFile(tmp_path / "d.npz") as zf:
        info = zf.getinfo("x.npy")
    raw = bytearray((tmp_path / "d.npz").read_bytes())
    middle = info.header_offset + 30 + len(info.filename) + info.compress_size // 2
    raw[middle:middle + 64] = bytes(64)
    (tmp_path / "d.npz").write_bytes(bytes(raw))
    with pytest.raises(Exception):
        _member(tmp_path / "d.npz", "x")  # numpy fails too (zlib's or the zip's CRC check)
    with pytest.raises(LoaderError, match=r"d\.npz: .*'x\.npy'"):
        read_npz(str(tmp_path / "d.npz"), {}, key="x", rows=slice(0, 20_000))
