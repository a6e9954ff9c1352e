"""The chunk files a stream keeps mapped between epochs: by default up to a quarter of the
memory the process may use (its cgroup's limit where lower); with ``keep_mapped`` bounded,
the process's resident memory, mapped chunk files included, stays near its memory bound."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import pipeline
from pipeline.errors import StreamError
from pipeline.storage import write
from pipeline.streaming.chunks import ChunkReader
from pipeline.storage.store import open_store_group
from pipeline.streaming import maps as maps_module
from pipeline.streaming.maps import MapCache, _cgroup_limit, default_map_budget, memory_limit

MIB = 2**20

# One epoch, then a second, of a stream in a fresh process: its resident memory
# (VmRSS, and of it the mapped files' RssFile) before iterating, at its peak (VmHWM,
# reset by clear_refs once the stream is open), and at the end.
_EPOCHS = r"""
import json, sys
import numpy as np
import pipeline

def status():
    out = {}
    for line in open("/proc/self/status"):
        key, value = line.split(":", 1)
        if key in ("VmRSS", "VmHWM", "RssFile", "RssAnon"):
            out[key] = int(value.split()[0]) * 1024
    return out

def stream(keep_mapped=None):
    return pipeline.stream(sys.argv[1], batch_size=128, buffer_chunks=4, seed=0, threads=2, keep_mapped=keep_mapped)

with stream() as probe:
    bound = probe.memory_bound()
keep = bound if sys.argv[2] == "bound" else int(sys.argv[2])
s = stream(keep)
before = status()
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # the peak (VmHWM) from here on
ids = []
for epoch in range(2):
    s.set_epoch(epoch)
    # Copies: a batch is a view of the group buffers, which a kept batch keeps alive.
    ids.append(np.concatenate([y.astype(np.int64) for _, y in s]))
after = status()
print(json.dumps({"before": before, "after": after, "bound": s.memory_bound(), "keep": keep,
                  "mapped": s.source.maps.mapped_bytes, "ids": [sorted(i.tolist()) == list(range(len(i))) for i in ids],
                  "n": [len(i) for i in ids]}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux /proc only")
@pytest.mark.parametrize("keep_mapped", ["0", "bound"])
def test_resident_memory_of_an_epoch_stays_near_memory_bound_with_keep_mapped(tmp_path, keep_mapped):
    """Two epochs of a store 6x larger than ``memory_bound()``, with ``keep_mapped=0`` and
    ``keep_mapped=memory_bound()``: the process's resident memory, mapped chunk files
    included (``RssFile``, what ps, psutil, SLURM and a pod's working set count), grows
    by at most twice the bound plus 16 MiB of interpreter and thread memory, at its peak
    and at the end; the mapped files alone by ``keep_mapped`` and the few being decoded.
    By default every chunk file read stays mapped up to a quarter of the memory the
    process may use: RssFile grows by the whole store."""
    n, rows = 12_288, 32  # samples of 64x16 float32 (4 KiB), chunks of 128 KiB: a 48 MiB store
    x = np.random.default_rng(0).random((n, 64, 16), dtype=np.float32)
    path = write(tmp_path / "big.zarr", {"x": x, "y": np.arange(n, dtype=np.float32)}, chunk_samples=rows,
                 codec="none", progress=False)
    del x
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
    out = subprocess.run([sys.executable, "-c", _EPOCHS, str(path), keep_mapped], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    bound, keep, before, after = got["bound"], got["keep"], got["before"], got["after"]
    assert got["ids"] == [True, True] and got["n"] == [n, n]  # every sample once per epoch
    assert on_disk >= 6 * bound, (on_disk, bound)  # the store is several times the bound
    allowed = 2 * bound + 16 * MIB
    assert after["VmHWM"] - before["VmRSS"] <= allowed, (after, before, bound)
    assert after["VmRSS"] - before["VmRSS"] <= allowed, (after, before, bound)
    # The mapped files alone: at most keep_mapped kept, and the chunk files being decoded.
    assert after["RssFile"] - before["RssFile"] <= keep + 4 * MIB, (after, before, keep)
    assert got["mapped"] <= keep


def _store(tmp_path):
    data = np.random.default_rng(5).standard_normal((300, 40)).astype(np.float32)
    path = write(tmp_path / "k.zarr", {"x": data, "y": np.arange(300)}, chunk_samples=100, codec="none",
                 progress=False)
    return path, data, 100 * 40 * 4  # bytes of one uncompressed chunk file


def test_past_its_budget_a_file_is_mapped_for_its_read_only(tmp_path, own_mappings):
    """The files mapped first stay mapped; one read once the budget is full is unmapped
    once decoded, and the kept ones stay kept (every epoch reads every chunk in a new
    order: unmapping the least recently used would unmap at nearly every read)."""
    path, data, size = _store(tmp_path)
    maps = MapCache(budget=2 * size)
    reader = ChunkReader(open_store_group(path)["train/x"], (path, "train", "x"), maps=maps)
    for _ in range(3):  # three epochs
        np.testing.assert_array_equal(np.concatenate([reader.read(i) for i in range(3)]), data)
        assert maps.mapped_bytes == 2 * size and own_mappings() == 2
    assert maps.holds(reader._root + "/c/0/0") and maps.holds(reader._root + "/c/1/0")
    assert not maps.holds(reader._root + "/c/2/0")
    assert len(own_mappings.made) == 2 + 3  # the two kept mapped once, the third at each read
    maps.clear()
    assert own_mappings() == 0


def test_keep_mapped_is_the_streams_to_set_and_travels_to_workers(tmp_path, own_mappings):
    path, data, size = _store(tmp_path)
    files = [os.path.join(path, "train", n, "c", str(i), *(["0"] if n == "x" else [])) for n in "xy" for i in range(3)]
    whole = sum(os.path.getsize(f) for f in files)
    with pipeline.stream(path, batch_size=64, seed=0, keep_mapped=0) as s:
        assert sorted(np.concatenate([y for _, y in s]).tolist()) == list(range(300))
        # The next epoch's first group is read ahead as the last is served, its chunks
        # mapped while they are decoded: wait for that read before looking.
        s.stop_read_ahead()
        assert s.source.maps.mapped_bytes == 0 and len(own_mappings.made) >= len(files)
        assert own_mappings() == 0  # each unmapped once decoded
        assert pickle.loads(pickle.dumps(s.source)).maps.budget == 0  # a DataLoader worker's copy
    with pipeline.stream(path, batch_size=64, seed=0, keep_mapped=whole - 1) as s:
        assert sorted(np.concatenate([y for _, y in s]).tolist()) == list(range(300))
        assert 0 < s.source.maps.mapped_bytes < whole
    with pipeline.stream(path, batch_size=64, seed=0) as s:  # the default: as much as the budget allows
        assert sorted(np.concatenate([y for _, y in s]).tolist()) == list(range(300))
        assert s.source.maps.budget == default_map_budget() and s.source.maps.mapped_bytes == whole
        assert pickle.loads(pickle.dumps(s.source)).maps.budget == default_map_budget()
    with pipeline.stream(path, batch_size=64, seed=0, keep_mapped=1 << 62) as s:  # never past the default
        assert s.source.maps.budget == default_map_budget()


def test_keep_mapped_reaches_a_folds_base_split_its_workers_and_other_versions(tmp_path):
    n = 300
    path = write(tmp_path / "f.zarr", {"all": {"x": np.arange(n, dtype=np.float32)[:, None], "y": np.arange(n)}},
                 chunk_samples=100, folds={"f/train": np.arange(50, 250)}, progress=False, codec="none")
    for keep in (0, None):
        with pipeline.stream(path, split="f/train", batch_size=64, seed=0, keep_mapped=keep) as s:
            assert sorted(np.concatenate([y for _, y in s]).tolist()) == list(range(50, 250))
            budget = default_map_budget() if keep is None else keep
            assert s.source.base.maps.budget == budget
            assert (s.source.base.maps.mapped_bytes == 0) == (keep == 0)
            assert pickle.loads(pickle.dumps(s.source)).base.maps.budget == budget  # a DataLoader worker's copy
            assert s.source.at_version(None).base.maps.budget == budget  # follow=True's next version


@pytest.mark.parametrize("bad", [-1, 1.5, "1GiB", True])
def test_keep_mapped_refuses_what_is_not_bytes(tmp_path, bad):
    path, _, _ = _store(tmp_path)
    with pytest.raises(StreamError, match=r"keep_mapped must be None .* or bytes, an integer 0 or more; got "):
        pipeline.stream(path, batch_size=64, keep_mapped=bad)


def test_the_default_budget_respects_the_cgroup_limit(tmp_path, monkeypatch):
    """A container limited to 16 MiB (cgroup v2's ``memory.max`` of its group) keeps at
    most a quarter of it mapped by default, however much memory the machine has."""
    limit = 16 * MIB
    (tmp_path / "cg" / "pod").mkdir(parents=True)
    (tmp_path / "cg" / "pod" / "memory.max").write_text(f"{limit}\n")
    (tmp_path / "cgroup").write_text("0::/pod\n")
    monkeypatch.setattr(maps_module, "_CGROUP_ROOT", str(tmp_path / "cg"))
    monkeypatch.setattr(maps_module, "_PROC_CGROUP", str(tmp_path / "cgroup"))
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert physical > limit and memory_limit() == limit and default_map_budget() == limit // 4
    n = 8192  # samples of 256 float32: an 8 MiB x in chunks of 256 KiB
    x = np.random.default_rng(1).standard_normal((n, 256)).astype(np.float32)
    path = write(tmp_path / "c.zarr", {"x": x, "y": np.arange(n)}, chunk_samples=256, codec="none", progress=False)
    chunk = 256 * 256 * 4
    with pipeline.stream(path, batch_size=512, seed=0) as s:
        for epoch in range(2):
            s.set_epoch(epoch)
            got = [(xb.copy(), yb.copy()) for xb, yb in s]
            ys = np.concatenate([y for _, y in got])
            np.testing.assert_array_equal(np.concatenate([xb for xb, _ in got]), x[ys])
            assert sorted(ys.tolist()) == list(range(n))
            assert s.source.maps.budget == limit // 4
            assert limit // 4 - chunk < s.source.maps.mapped_bytes <= limit // 4


@pytest.mark.parametrize("files, expected", [
    ({"0::/job\n": {"job/memory.max": "536870912\n"}}, 512 * MIB),
    ({"0::/job\n": {"job/memory.max": "max\n"}}, None),
    ({"4:memory:/pod\n0::/\n": {"memory/pod/memory.limit_in_bytes": "1073741824\n"}}, 1024 * MIB),
    ({"4:memory:/pod\n": {"memory/pod/memory.limit_in_bytes": "9223372036854771712\n"}}, None),  # v1: none
    ({"0::/elsewhere\n": {"memory.max": "268435456\n"}}, 256 * MIB),  # a container's own group as the root
    ({"0::/job/step\n": {"job/memory.max": "1073741824\n", "job/step/memory.max": "max\n"}}, 1024 * MIB),  # above
    ({"4:memory:/pod\n0::/pod\n": {"memory/pod/memory.limit_in_bytes": "1073741824\n",
                                   "pod/memory.max": "536870912\n"}}, 512 * MIB),  # the lowest
    ({"": {}}, None),
])
def test_the_cgroup_limit_is_read_as_the_kernel_writes_it(tmp_path, files, expected):
    (proc, tree), = files.items()
    for rel, text in tree.items():
        (tmp_path / "cg" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cg" / rel).write_text(text)
    (tmp_path / "cgroup").write_text(proc)
    assert _cgroup_limit(str(tmp_path / "cg"), str(tmp_path / "cgroup")) == expected


def test_the_map_budget_comes_from_the_memory_the_process_may_use():
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = _cgroup_limit()
    assert memory_limit() == (physical if limit is None else min(physical, limit))
    assert default_map_budget() == min(memory_limit() // 4, 16 << 30)
