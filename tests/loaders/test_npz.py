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


@pytest.mark.parametrize("blocks", [1, 7])
def test_a_damaged_stored_member_fails_its_crc_check(tmp_path, blocks):
    """np.savez stores members uncompressed: a flipped bit is found by the zip's CRC once
    the member is read to its end in order, as np.load finds it, not served."""
    a = np.arange(1000, dtype=np.float64).reshape(250, 4)
    np.savez(tmp_path / "s.npz", x=a)
    raw = bytearray((tmp_path / "s.npz").read_bytes())
    raw[300] ^= 0x01
    (tmp_path / "s.npz").write_bytes(bytes(raw))
    with pytest.raises(Exception, match="CRC"):
        _member(tmp_path / "s.npz", "x")
    with pytest.raises(LoaderError, match=r"s\.npz: member 'x\.npy' fails its CRC check"):
        pipeline.load(str(tmp_path / "s.npz"), combine="concat", chunk_rows=-(-250 // blocks)).compute(
            scheduler="sync")


def test_an_undamaged_stored_member_read_in_blocks_in_any_order_passes(tmp_path):
    a = np.random.default_rng(2).standard_normal((999, 3))
    np.savez(tmp_path / "s.npz", x=a)
    for order in ([0, 400, 800], [800, 400, 0], [400, 0, 800], [0, 400, 800]):
        got = np.concatenate([read_npz(str(tmp_path / "s.npz"), {}, key="x", rows=slice(lo, lo + 400))
                              for lo in order])
        np.testing.assert_array_equal(got, np.concatenate([a[lo:lo + 400] for lo in order]))


def test_files_are_read_at_the_first_files_member_without_key(tmp_path):
    """Without key, each file at its own one member would join one file's prices to
    another's volumes: every file is read at the first file's."""
    np.savez(tmp_path / "a.npz", prices=np.array([[100.0, 101.0]]))
    np.savez(tmp_path / "b.npz", volumes=np.array([[5000.0, 7000.0]]))
    np.savez(tmp_path / "c.npz", prices=np.array([[102.0, 103.0]]))
    with pytest.raises(LoaderError, match=r"b\.npz: has no array 'prices' \(arrays: \['volumes'\]\); 'prices' is the "
                       r"only array of .*a\.npz, the first file"):
        pipeline.load(str(tmp_path / "*.npz"), combine="concat")
    got = pipeline.load([str(tmp_path / "a.npz"), str(tmp_path / "c.npz")], combine="concat").compute()
    np.testing.assert_array_equal(got, [[100.0, 101.0], [102.0, 103.0]])
    skipped = pipeline.open_source(str(tmp_path / "*.npz"), combine="concat", on_error="skip")
    assert [p.rsplit("/", 1)[-1] for p, _ in skipped.skipped] == ["b.npz"]
    np.testing.assert_array_equal(skipped.array.compute(), [[100.0, 101.0], [102.0, 103.0]])


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_a_damaged_header_length_is_named_with_the_file(tmp_path, suffix):
    """A changed byte in the header's length field cuts its dict short: numpy's parser
    raises tokenize.TokenError, which named no file."""
    import io

    buf = io.BytesIO()
    np.save(buf, np.arange(6.0))
    raw = bytearray(buf.getvalue())
    raw[8] = 34
    path = tmp_path / f"bad{suffix}"
    if suffix == ".npy":
        path.write_bytes(bytes(raw))
    else:
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("x.npy", bytes(raw))
    with pytest.raises(LoaderError, match=rf"bad\{suffix}: expected an .* could not parse it \(its header's dict is "
                       "cut short"):
        pipeline.load(str(path), combine="concat")
