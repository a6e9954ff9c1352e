"""What a store records of its raw files, and which of them a rerun or an append takes for
changed: against checksums computed here with zlib and hashlib over the bytes on disk."""

from __future__ import annotations

import hashlib
import os
import zlib
from pathlib import Path

import fsspec
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import LoaderError
from pipeline.loaders import provenance
from pipeline.loaders.provenance import (CRC_KEY, compare_files, content_hash, hash_batches, hashes_on,
                                        recorded_files, with_hashes)
from tests.conftest import in_process_cluster

MIB = 1 << 20


def _stat(path: str) -> tuple[int, float]:
    st = os.stat(path)
    return st.st_size, st.st_mtime


def _ends_hash(data: bytes) -> str:
    """The ``hash`` the first version recorded: BLAKE2b of the size, the first MiB and
    then the last MiB (for a file of up to 2 MiB, the bytes after the first MiB)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(len(data).to_bytes(8, "little"))
    h.update(data[:MIB])
    h.update(data[len(data) - MIB:] if len(data) > 2 * MIB else data[MIB:2 * MIB])
    return h.hexdigest()


def _long_csv(path: Path) -> bytes:
    """An hourly two-station CSV of about 3 MiB, as a user's raw file."""
    rng = np.random.default_rng(0)
    t = pd.date_range("2024-01-01", periods=36_000, freq="h")
    df = pd.DataFrame({"timestamp": t.repeat(2), "station": np.tile(["ST_A", "ST_B"], t.size),
                       "bid_price_1": rng.normal(100, 1, 2 * t.size), "temp": rng.normal(5, 1, 2 * t.size)})
    df.to_csv(path, index=False, float_format="%.3f")
    data = path.read_bytes()
    assert len(data) > 2 * MIB + 100_000  # the middle is outside both hashed ends
    return data


def _edit_middle(path: Path, data: bytes) -> bytes:
    """One temperature reading in the middle corrected: the same length, a new time."""
    mid = len(data) // 2
    start, end = data.rfind(b"\n", 0, mid) + 1, data.find(b"\n", mid)
    fields = data[start:end].split(b",")
    fields[-1] = (b"9" if fields[-1][:1] != b"9" else b"8") + fields[-1][1:]
    edited = data[:start] + b",".join(fields) + data[end:]
    assert len(edited) == len(data) and edited != data
    path.write_bytes(edited)
    os.utime(path, (1e9, 1e9))
    return edited


def _record(path: Path) -> dict:
    size, mtime = _stat(str(path))
    return {"path": str(path), "size": size, "mtime": mtime}


def _random_files(folder: Path, sizes: list[int], seed: int) -> tuple[list[dict], dict[str, bytes]]:
    """Files ``f0.bin``... of random bytes of ``sizes``, the first with a companion
    (``f0_message.csv``, as LOBSTER's): their records, and every file's bytes by path."""
    rng = np.random.default_rng(seed)
    files, blobs = [], {}
    for i, size in enumerate(sizes):
        path = folder / f"f{i}.bin"
        blobs[str(path)] = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        path.write_bytes(blobs[str(path)])
        files.append(_record(path))
    comp = folder / "f0_message.csv"
    blobs[str(comp)] = b"1,2,3\n" * 1000
    comp.write_bytes(blobs[str(comp)])
    files[0]["companion"] = _record(comp)
    return files, blobs


def test_a_same_size_correction_in_the_middle_of_a_large_file_is_a_change(tmp_path):
    """The first and last MiB alone took this file for unchanged: a rerun said 'up to
    date' and the store kept windows of the old data."""
    csv = tmp_path / "long.csv"
    data = _long_csv(csv)
    sources = with_hashes({"files": [_record(csv)], "shape": [1, 1]})
    entry = sources["files"][0]
    assert entry[CRC_KEY] == f"{zlib.crc32(data):08x}" and entry["hash"] == _ends_hash(data)
    assert sources["shape"] == [1, 1]  # the rest of the attribute as it was
    recorded = recorded_files(sources)

    os.utime(csv, (2e9, 2e9))  # touched, the same bytes: unchanged
    assert compare_files(recorded, [str(csv)], _stat).changed == ()

    edited = _edit_middle(csv, data)
    assert _ends_hash(edited) == entry["hash"]  # what the ends alone see
    changes = compare_files(recorded, [str(csv)], _stat)
    assert changes.changed == ((str(csv), "it was modified: its modification time and its content differ from "
                                          "the store's record"),)
    assert changes.new == () and changes.missing == ()


def test_a_store_written_before_the_crc_is_checked_by_its_ends(tmp_path):
    """Records without ``crc32`` keep being read: touched files are unchanged, a change
    at either end is a change, and one in the middle is not seen (docs say so)."""
    csv = tmp_path / "long.csv"
    data = _long_csv(csv)
    old = recorded_files({"files": [{**_record(csv), "hash": _ends_hash(data)}]})
    assert old[str(csv)][CRC_KEY] is None
    os.utime(csv, (2e9, 2e9))
    assert compare_files(old, [str(csv)], _stat).changed == ()
    _edit_middle(csv, data)
    assert compare_files(old, [str(csv)], _stat).changed == ()
    csv.write_bytes(data[:-2] + b"9\n")  # the last reading, within the last MiB
    assert [p for p, _ in compare_files(old, [str(csv)], _stat).changed] == [str(csv)]
    # With neither digest there is nothing to compare: a moved time is a change.
    bare = recorded_files({"files": [_record(csv)]})
    os.utime(csv, (3e9, 3e9))
    assert [p for p, _ in compare_files(bare, [str(csv)], _stat).changed] == [str(csv)]


@pytest.mark.parametrize("block", [4 * MIB, 300_001])
def test_digests_of_every_size_equal_zlib_and_the_first_versions_hash(tmp_path, monkeypatch, block):
    """Sizes around the hashed ends and the read blocks, many files at once (in threads),
    companions too; ``content_hash`` (the ends only) agrees with the one pass."""
    monkeypatch.setattr(provenance, "_BLOCK_BYTES", block)
    sizes = [0, 1, MIB - 1, MIB, MIB + 1, 2 * MIB, 2 * MIB + 1, 3 * MIB + 17, block - 1, block + 5]
    files, blobs = _random_files(tmp_path, sizes, seed=1)
    comp = tmp_path / "f0_message.csv"
    out = with_hashes({"files": files})["files"]
    items = [*out, out[0]["companion"]]
    assert [item["path"] for item in items] == [*(f["path"] for f in files), str(comp)]
    for item in items:
        data = blobs[item["path"]]
        assert item[CRC_KEY] == f"{zlib.crc32(data):08x}", item["path"]
        assert item["hash"] == _ends_hash(data) == content_hash(item["path"], len(data)), item["path"]
    assert "hash" not in files[0] and "hash" not in files[0]["companion"]  # the input left as it was
    rec = recorded_files({"files": out})
    assert rec[str(comp)] == {"size": len(blobs[str(comp)]), "mtime": files[0]["companion"]["mtime"],
                              "hash": _ends_hash(blobs[str(comp)]), CRC_KEY: f"{zlib.crc32(blobs[str(comp)]):08x}",
                              "companion_of": files[0]["path"]}


def test_many_moved_files_are_compared_and_reported_in_record_order(tmp_path):
    rng = np.random.default_rng(2)
    paths = []
    for i in range(12):
        p = tmp_path / f"day{i:02d}.csv"
        p.write_bytes(rng.integers(48, 58, 50_000, dtype=np.uint8).tobytes())
        paths.append(p)
    recorded = recorded_files(with_hashes({"files": [_record(p) for p in paths]}))
    for i, p in enumerate(paths):  # every time moved (a folder copied anew); some bytes changed
        data = bytearray(p.read_bytes())
        if i in (3, 7, 8):
            data[25_000] = ord("x")
        p.write_bytes(bytes(data))
        os.utime(p, (1e9 + i, 1e9 + i))
    (tmp_path / "day05.csv").write_bytes(b"shorter")
    (tmp_path / "day11.csv").unlink()
    extra = tmp_path / "day12.csv"
    extra.write_bytes(b"new")
    current = sorted(str(p) for p in tmp_path.glob("*.csv"))
    changes = compare_files(recorded, current, _stat)
    assert [p for p, _ in changes.changed] == [str(paths[i]) for i in (3, 5, 7, 8)]
    assert changes.changed[1][1] == "its size is 7 bytes, the store recorded 50,000"
    assert changes.missing == (str(paths[11]),) and changes.new == (str(extra),)


def test_a_remote_file_is_checksummed_through_fsspec():
    data = np.random.default_rng(3).integers(0, 256, 3 * MIB + 5, dtype=np.uint8).tobytes()
    url = "memory://provenance-test/day0.csv"
    with fsspec.open(url, "wb") as f:
        f.write(data)
    try:
        entry = with_hashes({"files": [{"path": url, "size": len(data), "mtime": 0.0}]})["files"][0]
        assert entry[CRC_KEY] == f"{zlib.crc32(data):08x}" and entry["hash"] == _ends_hash(data)
    finally:
        fsspec.filesystem("memory").rm("/provenance-test", recursive=True)


def test_a_file_that_cannot_be_read_is_named(tmp_path):
    there = tmp_path / "there.csv"
    there.write_bytes(b"a\n1\n")
    gone = str(tmp_path / "gone.csv")
    with pytest.raises(LoaderError, match=r"gone\.csv: cannot read"):
        with_hashes({"files": [_record(there), {"path": gone, "size": 4, "mtime": 0.0}]})


def test_a_member_read_through_a_chained_zip_url_is_hashed_whole(tmp_path):
    """``zip://NAME::/abs/x.zip``: the zip filesystem must stay open while the member is
    read (an early ``.open()`` let it be collected: 'seek of closed file')."""
    import zipfile

    data = _long_csv(tmp_path / "day.csv")
    with zipfile.ZipFile(tmp_path / "day.zip", "w") as z:
        z.writestr("day.csv", data)
    url = f"zip://day.csv::{tmp_path / 'day.zip'}"
    got = with_hashes({"files": [{"path": url, "size": len(data)}]})["files"][0]
    assert got[CRC_KEY] == f"{zlib.crc32(data):08x}"
    assert got["hash"] == _ends_hash(data)


def _no_local_reads(*args, **kwargs):
    raise AssertionError("the client read a file itself")


def test_hashes_on_a_cluster_are_its_workers_tasks_and_equal_zlibs(tmp_path, monkeypatch):
    """A build's digests are read by the cluster, not the client: the scheduler ran one
    task a file (and companion), none in the client's threads, with the same record."""
    from distributed import Client

    files, blobs = _random_files(tmp_path, [0, 5, MIB + 3, 3 * MIB + 1, 7], seed=4)
    sources = {"files": files, "shape": [10, 3]}
    monkeypatch.setattr(provenance, "_in_threads", _no_local_reads)
    # Tasks of at most 2 files and 2 MiB: [f0, its companion], [f1, f2], [f3 alone], [f4].
    monkeypatch.setattr(provenance, "HASH_TASK_FILES", 2)
    monkeypatch.setattr(provenance, "HASH_TASK_BYTES", 2 * MIB)
    with in_process_cluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        got = hashes_on(client, sources)()
        prefix = cluster.scheduler.task_prefixes["file-digests"]
        assert prefix.state_counts["memory"] == 4  # each task finished once
    assert got["shape"] == [10, 3] and "hash" not in files[0]
    for item in [*got["files"], got["files"][0]["companion"]]:
        data = blobs[item["path"]]
        assert item[CRC_KEY] == f"{zlib.crc32(data):08x}" and item["hash"] == _ends_hash(data), item["path"]
    monkeypatch.undo()
    assert got == with_hashes(sources)  # the client's own reading, as without a cluster


def test_a_file_the_workers_cannot_read_is_named_first_in_record_order(tmp_path, monkeypatch):
    from distributed import Client

    there = tmp_path / "there.csv"
    there.write_bytes(b"a\n1\n")
    # The larger unreadable file is listed first: it is named though the other may fail
    # first, each file a task of its own.
    gone = [{"path": str(tmp_path / name), "size": size, "mtime": 0.0} for name, size in [("b.csv", 9), ("a.csv", 4)]]
    monkeypatch.setattr(provenance, "HASH_TASK_FILES", 1)
    with in_process_cluster(n_workers=2, threads_per_worker=1) as cluster, Client(cluster) as client:
        result = hashes_on(client, {"files": [_record(there), *gone]})
        with pytest.raises(LoaderError, match=r"b\.csv: cannot read"):
            result()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 50), max_size=60), st.integers(1, 40), st.integers(1, 6))
def test_hash_batches_cover_every_file_once_in_order_within_their_bounds(sizes, max_bytes, max_files):
    ranges = hash_batches(sizes, max_bytes, max_files)
    assert [i for a, b in ranges for i in range(a, b)] == list(range(len(sizes)))  # each once, in order
    for a, b in ranges:
        assert 0 < b - a <= max_files
        assert b - a == 1 or sum(sizes[a:b]) <= max_bytes  # only a file alone may exceed the bytes
    for (a, b), (c, _) in zip(ranges, ranges[1:]):  # a range ends only where the next file would not fit
        assert b - a == max_files or sum(sizes[a:b]) + sizes[c] > max_bytes
