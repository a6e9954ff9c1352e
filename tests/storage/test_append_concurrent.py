"""A stream that iterates while a second process appends to its store (issue 19) keeps
serving exactly the version it opened; versions are listed and opened by number.

The append is a real `pipeline run` in its own process, on its own LocalCluster. The
stream in the test process serves small batches and waits on the store between them
(on a deadline, woken by the append's writes), so its epoch spans the append: it starts
before the append's first write and waits for the commit before serving its last third.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
import zarr

import pipeline
from pipeline.config import load_config
from pipeline.demo import DemoSpec, write_demo_data
from pipeline.errors import StoreError
from pipeline.job import run
from pipeline.storage.versions import PENDING
from tests.conftest import in_process_cluster, run_cli, wait_until

BIN = Path(sys.executable).parent
NEW_DAY = "2026-01-09"
ARRAYS = ("x", "y", "t", "instrument")


@pytest.fixture(scope="module")
def address():
    with in_process_cluster(n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        yield c.scheduler_address


def _config(tmp_path: Path, cluster: dict[str, Any], out: str, name: str) -> Path:
    cfg = {
        "cluster": cluster,
        "source": {"paths": str(tmp_path / "raw" / "*" / "*.parquet"), "timestamp": "timestamp",
                   "instrument": {"path": str(tmp_path / "raw" / "{instrument}" / "*.parquet")},
                   "sessions": "file"},
        "features": {"steps": ["mid_price", {"name": "imbalance", "levels": 2}, "log_return"]},
        "windows": {"size": 16, "stride": 5, "scales": [1, 2]},
        "labels": {"kind": "return", "horizon": 10},
        "output": {"path": str(tmp_path / out), "chunk_samples": 32,
                   "splits": {"train": {"until": "2026-01-07"}, "test": {}}},
    }
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def stores(tmp_path_factory, address):
    """A store of 2 instruments x 4 days (version 0), a copy of it, the config whose files
    now include a fifth day, and a build of all 5 days to compare with."""
    tmp_path = tmp_path_factory.mktemp("concurrent")
    raw = tmp_path / "raw"
    write_demo_data(raw, DemoSpec(days=5, rows_per_day=2_500, levels=2, seed=23, formats=("parquet",),
                                  per_instrument=True, instruments=("AAA", "BBB")))
    new = [raw / name / f"{NEW_DAY}.parquet" for name in ("AAA", "BBB")]
    for f in new:
        (tmp_path / "held" / f.parent.name).mkdir(parents=True)
        shutil.move(f, tmp_path / "held" / f.parent.name / f.name)
    run(load_config(_config(tmp_path, {"address": address}, "store.zarr", "inproc.yaml")), log=None, progress=False)
    shutil.copytree(tmp_path / "store.zarr", tmp_path / "before.zarr")
    for f in new:
        shutil.move(tmp_path / "held" / f.parent.name / f.name, f)
    run(load_config(_config(tmp_path, {"address": address}, "full.zarr", "full.yaml")), log=None, progress=False)
    appender = _config(tmp_path, {"n_workers": 1, "threads_per_worker": 2, "memory_limit": "1GiB"}, "store.zarr",
                       "append.yaml")
    return {"dir": tmp_path, "store": tmp_path / "store.zarr", "before": tmp_path / "before.zarr",
            "full": tmp_path / "full.zarr", "config": appender, "new": new}


def _samples(path: Path, split: str) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    """Every sample of a split of a store (newest version), by (instrument, t)."""
    ds = pipeline.open(path)
    g = ds[split]
    x, y = np.asarray(g["x"][:]), np.asarray(g["y"][:])
    keys = zip(np.asarray(g["instrument"][:]).tolist(), np.asarray(g["t"][:]).tolist())
    return {k: (x[i].tobytes(), y[i].tobytes()) for i, k in enumerate(keys)}


def _served(batches: list[tuple[np.ndarray, ...]]) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    """The samples an epoch served, by (instrument, t); each must come once."""
    out = {}
    for x, y, t, inst in batches:
        for i, key in enumerate(zip(inst.tolist(), t.tolist())):
            assert key not in out, f"sample {key} served twice in one epoch"
            out[key] = (x[i].tobytes(), y[i].tobytes())
    return out


def _newest(store: Path) -> int:
    meta = zarr.open_group(str(store), mode="r").attrs["pipeline"]
    return len(meta.get("history") or [None]) - 1


def _pending(store: Path) -> bool:
    return PENDING in zarr.open_group(str(store), mode="r").attrs["pipeline"]


def test_a_stream_keeps_its_version_while_another_process_appends(stores):
    store, before, full = stores["store"], stores["before"], stores["full"]
    v0, v1 = _samples(before, "test"), _samples(full, "test")
    assert len(v1) > len(v0)
    # The append rewrites the unit holding the last stored samples while the stream reads.
    assert len(v0) % 32, "the stored samples fill their last unit; pick another chunk_samples"
    pinned = pipeline.stream(store, split="test", arrays=ARRAYS, batch_size=8, seed=3, buffer_chunks=2)
    follower = pipeline.stream(store, split="test", arrays=ARRAYS, batch_size=8, seed=3, buffer_chunks=2,
                               follow=True)
    assert pinned.version == follower.version == 0
    n_batches = len(pinned)
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    log = stores["dir"] / "append.log"
    served: list[tuple[np.ndarray, ...]] = []
    during_pending = 0  # batches served while the append had written but not committed

    def next_write() -> None:
        """Wait until the append writes something in the store, or 50 ms."""
        calls = iter([False])
        wait_until(lambda: next(calls, True), timeout=0.05, watch=store, procs=[proc])

    with open(log, "w") as out:
        proc = subprocess.Popen([str(BIN / "pipeline"), "run", str(stores["config"]), "--no-progress"], stdout=out,
                                stderr=subprocess.STDOUT, env=env)
        try:
            for i, batch in enumerate(pinned):
                served.append(tuple(np.array(b) for b in batch))
                if _pending(store):
                    during_pending += 1
                if i == n_batches // 3:
                    # The first third is served while the append starts; the middle third
                    # once it has begun writing, a batch per write it makes (or 50 ms).
                    assert wait_until(lambda: proc.poll() is not None or _pending(store) or _newest(store) == 1,
                                      timeout=300, watch=store, procs=[proc]), log.read_text()
                elif i == 2 * n_batches // 3:
                    # The last third waits for the commit: the append happens within the epoch.
                    assert wait_until(lambda: proc.poll() is not None or _newest(store) == 1, timeout=300,
                                      watch=store, procs=[proc]), log.read_text()
                elif n_batches // 3 < i < 2 * n_batches // 3 and _newest(store) == 0:
                    next_write()
            committed_during_epoch = _newest(store)
        finally:
            proc.wait(timeout=300)
    assert proc.returncode == 0, log.read_text()
    assert committed_during_epoch == 1, "the append did not commit before the epoch ended"
    assert during_pending > 0, "no batch was served while the append was writing"
    print(f"{during_pending} of {n_batches} batches served while the append was pending")
    assert len(served) == n_batches == len(pinned)
    assert _served(served) == v0  # exactly version 0's samples, each once, byte for byte

    # The next epoch, without follow: still version 0.
    pinned.set_epoch(1)
    assert _served([tuple(np.array(b) for b in batch) for batch in pinned]) == v0
    assert pinned.version == 0 and len(pinned) == n_batches and pinned.state_dict()["version"] == 0

    # With follow: the epoch it was in stays version 0; the next one moves to version 1.
    assert _served([tuple(np.array(b) for b in batch) for batch in follower]) == v0
    follower.set_epoch(1)
    assert follower.version == 1 and follower.state_dict()["version"] == 1
    assert _served([tuple(np.array(b) for b in batch) for batch in follower]) == v1
    assert len(follower) == -(-len(v1) // 8)
    pinned.close()
    follower.close()

    # A stream opened now serves the newest version unless told otherwise.
    with pipeline.stream(store, split="test", arrays=ARRAYS, batch_size=64, version=0) as s:
        assert s.version == 0 and _served([tuple(np.array(b) for b in batch) for batch in s]) == v0
    with pipeline.stream(store, split="test", arrays=ARRAYS, batch_size=64) as s:
        assert s.version == 1 and _served([tuple(np.array(b) for b in batch) for batch in s]) == v1


def test_versions_are_listed_and_opened_by_number(stores):
    store, before, full = stores["store"], stores["before"], stores["full"]
    if _newest(store) == 0:  # run alone: append here
        done = run_cli("run", str(stores["config"]), "--no-progress")
        assert done.returncode == 0, done.stderr
    first, ref = pipeline.open(store, version=0), pipeline.open(before)
    assert first.version.number == 0
    assert first.attrs["splits"] == ref.attrs["splits"]
    for split in ref.splits:
        assert first[split]["x"].shape == ref[split]["x"].shape
        assert np.asarray(first[split]["y"][:]).tobytes() == np.asarray(ref[split]["y"][:]).tobytes()
    newest = pipeline.open(store)
    assert [(v.number, v.kind) for v in newest.versions] == [(0, "build"), (1, "append")]
    assert newest.versions[0].samples == ref.attrs["splits"]
    assert newest.versions[1].samples == pipeline.open(full).attrs["splits"]
    assert sorted(Path(a).name for a in newest.versions[1].added) == [f"{NEW_DAY}.parquet"] * 2
    assert sorted(Path(a).parent.name for a in newest.versions[1].added) == ["AAA", "BBB"]
    assert newest.versions[0].added == ()
    assert pipeline.open(store, version=-2).version.number == 0
    with pytest.raises(StoreError, match=r"no version 5.*versions 0\.\.1"):
        pipeline.open(store, version=5)
    with pytest.raises(StoreError, match="no version"):
        pipeline.stream(store, split="test", batch_size=8, version=5)


def test_inspect_lists_the_versions(stores):
    store = stores["store"]
    if _newest(store) == 0:
        done = run_cli("run", str(stores["config"]), "--no-progress")
        assert done.returncode == 0, done.stderr
    out = run_cli("inspect", str(store))
    assert out.returncode == 0, out.stderr
    versions = pipeline.open(store).versions
    assert len(versions) == 2
    for v in versions:
        assert v.describe() in out.stdout, out.stdout



@pytest.fixture()
def small_append(tmp_path, address):
    """A store of 2 instruments x 3 days whose last unit of ``test`` is partly filled,
    a copy of it, and a function that appends a fourth day (in this process)."""
    raw = tmp_path / "raw"
    write_demo_data(raw, DemoSpec(days=4, rows_per_day=2_500, levels=2, seed=29, formats=("parquet",),
                                  per_instrument=True, instruments=("AAA", "BBB")))
    new = [raw / name / "2026-01-08.parquet" for name in ("AAA", "BBB")]
    for f in new:
        (tmp_path / "held" / f.parent.name).mkdir(parents=True)
        shutil.move(f, tmp_path / "held" / f.parent.name / f.name)
    cfg = _config(tmp_path, {"address": address}, "store.zarr", "inproc.yaml")
    run(load_config(cfg), log=None, progress=False)
    shutil.copytree(tmp_path / "store.zarr", tmp_path / "before.zarr")

    def append() -> None:
        for f in new:
            shutil.move(tmp_path / "held" / f.parent.name / f.name, f)
        assert run(load_config(cfg), log=None, progress=False).version == 1

    v0 = _samples(tmp_path / "before.zarr", "test")
    assert len(v0) % 32, "the stored samples fill their last unit; pick another chunk_samples"
    return tmp_path / "store.zarr", v0, append


def _epoch(s: Any) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    return _served([tuple(np.array(b) for b in batch) for batch in s])


def test_a_verifying_stream_opened_before_an_append_keeps_its_version(small_append):
    """``verify=True`` checks each chunk read against the CRC32 recorded when it was
    written. The append rewrites the unit holding the last stored samples (the same
    stored samples, new ones after them): a stream opened before reads the new file and
    still serves its version, without calling the chunk corrupt."""
    store, v0, append = small_append
    with pipeline.stream(store, split="test", arrays=ARRAYS, batch_size=64, verify=True) as s:
        assert _epoch(s) == v0
        s.close()  # the next epoch reads the chunk files again
        append()
        s.set_epoch(1)
        assert _epoch(s) == v0


@pytest.mark.parametrize("how", ["opened after", "reopened by a worker"])
def test_a_verifying_stream_of_an_older_version_after_an_append(small_append, how):
    """The same older version, opened after the append, or opened before and reopened
    by a DataLoader worker after it (the stream pickled, as a worker receives it): its
    last chunk holds the version's samples and the new ones after them, and the CRC
    recorded for that unit is now the rewritten chunk's. Version 0's samples must still
    verify."""
    store, v0, append = small_append
    if how == "opened after":
        append()
        s = pipeline.stream(store, split="test", arrays=ARRAYS, batch_size=64, verify=True, version=0)
    else:
        first = pipeline.stream(store, split="test", arrays=ARRAYS, batch_size=64, verify=True)
        append()
        s = pickle.loads(pickle.dumps(first))
        first.close()
    with s:
        assert s.version == 0
        assert _epoch(s) == v0
