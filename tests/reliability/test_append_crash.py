"""An append (`pipeline run` on a config whose files grew, issue 19) killed with SIGKILL, its
whole process group (the LocalCluster's worker processes too), at seeded random moments
of its writes; each rerun is killed again at the next moment.

After every kill the store opens at the previous version exactly as it was before the
append (compared with a copy made before), and a stream of it serves exactly that
version's samples. The last rerun completes, and the store then equals an uninterrupted
append of the same files and a from-scratch build of every file.

The moments are points in the append's progress, not in seconds: this run's pending
record written, then a seeded share of the write units still to write (counted by their
markers, from the store). On 2 busy cores start-up (imports, the cluster, the new files'
sessions) takes most of a run's seconds, so moments in seconds would mostly land before
anything is written; moments in progress land at every step of the append's order
(pending record, growing arrays, rewriting the tail unit, new units, folds, commit) and
are the same moments on a fast machine or a slow one.
"""

from __future__ import annotations

import math
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
import zarr

import pipeline
from pipeline.config import load_config
from pipeline.demo import DemoSpec, write_demo_data
from tests.conftest import assert_bitwise_equal
from pipeline.job import run
from pipeline.storage.versions import PENDING, pinned_array
from pipeline.storage.writer import written_units
from tests.conftest import in_process_cluster, wait_until

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
NEW_DAY = "2026-01-09"  # the fifth day of the demo data: held back, then appended


@pytest.fixture(scope="module")
def address():
    """An in-process cluster for the builds the test compares against (the appends that
    are killed run on their own LocalCluster, in their own process group)."""
    with in_process_cluster(n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        yield c.scheduler_address


def _config(tmp_path: Path, *, materialize: bool, cluster: dict[str, Any], out: str, name: str) -> Path:
    cfg = {
        "cluster": cluster,
        "source": {"paths": str(tmp_path / "raw" / "*" / "*.parquet"), "timestamp": "timestamp",
                   "instrument": {"path": str(tmp_path / "raw" / "{instrument}" / "*.parquet")},
                   "sessions": "file"},
        "features": {"steps": ["mid_price", "spread", {"name": "imbalance", "levels": 1}, "log_return",
                               {"name": "rolling_mean", "window": 20}],
                     "normalize": "global"},
        "windows": {"size": 16, "stride": 5, "scales": [1, 2], "materialize": materialize},
        "labels": {"kind": "return", "horizon": 10},
        "output": {"path": str(tmp_path / out), "chunk_samples": 24,
                   "splits": {"train": {"until": "2026-01-06"}, "val": {"until": "2026-01-07"}, "test": {}}},
    }
    if not materialize:
        # Folds too: the append then also writes the new fold's index arrays (its step 4).
        cfg["output"]["splits"] = {"all": {}}
        cfg["output"]["folds"] = {"kind": "anchored", "test_sessions": 1, "min_train_sessions": 2}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _copy(src: Path, dst: Path) -> None:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)


def _split_groups(group: zarr.Group) -> list[str]:
    """Groups of the store written in units with markers (splits, shared features)."""
    return sorted(name for name, sub in group.groups() if "_written" in sub)


def _new_units(before: Path, after: Path) -> dict[str, tuple[int, int]]:
    """Per split: the write units ``[u0, u1)`` an append from ``before`` to ``after`` writes
    (from the unit holding the last stored sample to the end)."""
    a, b = zarr.open_group(str(before), mode="r"), zarr.open_group(str(after), mode="r")
    out = {}
    for split in _split_groups(b):
        probe = next(arr for name, arr in b[split].arrays() if name != "_written")
        unit = int((probe.shards or probe.chunks)[0])
        n0 = int(next(arr for name, arr in a[split].arrays() if name != "_written").shape[0])
        u0, u1 = n0 // unit, int(b[f"{split}/_written"].shape[0])
        if n0 < int(probe.shape[0]):
            out[split] = (u0, u1)
    return out


def _units_done(store: Path, units: dict[str, tuple[int, int]]) -> int:
    """Write units of the append marked written in the store (0 before an append is pending)."""
    group = zarr.open_group(str(store), mode="r")
    if PENDING not in (group.attrs.get("pipeline") or {}):
        return 0
    return sum(int(written_units(group, split)[u0:u1].sum()) for split, (u0, u1) in units.items())


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out


def _kill_group(proc: subprocess.Popen) -> int:
    """SIGKILL the run and every process of its group; return once all have exited.
    Returns how many processes the group held."""
    members = _group_members(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    fds = []
    for pid in set(_group_members(proc.pid)) | set(members):
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    try:
        while fds and time.monotonic() < deadline:  # a pidfd turns readable when its process exits
            ready, _, _ = select.select(fds, [], [], deadline - time.monotonic())
            for fd in ready:
                fds.remove(fd)
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)
    assert not _group_members(proc.pid), "processes of the killed run's group outlived SIGKILL"
    return len(members)


def _served(store: Path, split: str, seed: int) -> list[tuple[np.ndarray, ...]]:
    with pipeline.stream(store, split=split, arrays=("x", "y", "t", "instrument"), batch_size=50, seed=seed,
                         buffer_chunks=3) as s:
        assert s.version == 0
        batches = [tuple(np.array(b) for b in batch) for batch in s]
        assert len(batches) == len(s)
    return batches


def _assert_previous_version(store: Path, before: Path, seed: int) -> None:
    """The store opens at the version it had before the append, every sample as the copy
    made before holds it, and streams serve exactly that version's samples."""
    ds, ref = pipeline.open(store), pipeline.open(before)
    assert ds.version.number == ref.version.number == 0
    assert [v.to_attrs() for v in ds.versions] == [v.to_attrs() for v in ref.versions]
    assert ds.attrs == ref.attrs  # counts, sessions, folds, statistics: the version's view
    assert ds.splits == ref.splits and ds.folds == ref.folds
    for split in ref.splits:
        assert sorted(ds[split]) == sorted(ref[split])
        for name in ref[split]:
            if name.startswith("_"):
                continue
            x, y = ds[split][name], ref[split][name]
            assert (x.shape, x.dtype) == (y.shape, y.dtype), (split, name)
            assert np.asarray(x[:]).tobytes() == np.asarray(y[:]).tobytes(), (split, name)
    if "_shared" in ref.group:
        x = pinned_array(ds.group["_shared/features"], ds.version.shared_rows)[:]
        assert x.tobytes() == ref.group["_shared/features"][:].tobytes()
    for fold in ref.folds:
        np.testing.assert_array_equal(ds.fold(fold).index, ref.fold(fold).index)
    for split in (*ref.splits, *ref.folds):
        got, want = _served(store, split, seed), _served(before, split, seed)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            for u, v in zip(a, b):
                assert u.tobytes() == v.tobytes(), split
        # Each of the version's samples exactly once, identified by (instrument, t).
        ids = sorted(zip(np.concatenate([b[3] for b in got]).tolist(), np.concatenate([b[2] for b in got]).tolist()))
        stored = sorted(zip(np.asarray(ref[split]["instrument"][:]).tolist(), np.asarray(ref[split]["t"][:]).tolist()))
        assert ids == stored and len(set(ids)) == len(ids), split


def _clean_attrs(attrs: dict[str, Any]) -> dict[str, Any]:
    """Root attributes without the times they were written at."""
    out = {k: v for k, v in attrs.items() if k != "created"}
    out["history"] = [{k: v for k, v in h.items() if k != "created"} for h in attrs.get("history", [])]
    return out


def _assert_identical(a: Path, b: Path) -> None:
    """Every array of both stores (markers and fold indices included) holds the same
    bytes; every node's attributes are equal but for the times written."""
    ga, gb = zarr.open_group(str(a), mode="r"), zarr.open_group(str(b), mode="r")
    ma = dict(ga.members(max_depth=None))
    mb = dict(gb.members(max_depth=None))
    assert sorted(ma) == sorted(mb)
    for path, node in mb.items():
        other = ma[path]
        if isinstance(node, zarr.Array):
            assert (other.shape, other.dtype, other.chunks) == (node.shape, node.dtype, node.chunks), path
            assert np.asarray(other[...]).tobytes() == np.asarray(node[...]).tobytes(), path
        assert dict(other.attrs) == dict(node.attrs), path
    assert _clean_attrs(dict(ga.attrs["pipeline"])) == _clean_attrs(dict(gb.attrs["pipeline"]))


def _assert_equals_full_build(a: Path, full: Path) -> None:
    """The appended store's newest version equals a build of every file: each array of
    each split, the shared features, the folds and the attributes."""
    assert pipeline.open(a).version.number == 1
    assert_bitwise_equal(a, full)

def _first_version(tmp_path: Path, address: str, materialize: bool) -> dict[str, Path]:
    """2 instruments x 4 days built in-process as version 0 (``store.zarr``), a copy of
    it (``before.zarr``), a fifth day added to the files, and a build of all 5 days
    (``full.zarr``). Returns the paths and the two configs of the store: ``inproc``
    (this process's cluster) and ``killed`` (a LocalCluster of worker processes)."""
    raw = tmp_path / "raw"
    write_demo_data(raw, DemoSpec(days=5, rows_per_day=2_500, levels=2, seed=19, formats=("parquet",),
                                  per_instrument=True, instruments=("AAA", "BBB")))
    held = [(raw / name / f"{NEW_DAY}.parquet", tmp_path / "held" / name / f"{NEW_DAY}.parquet")
            for name in ("AAA", "BBB")]
    for home, aside in held:
        aside.parent.mkdir(parents=True)
        shutil.move(home, aside)
    # The same config twice but for the cluster (which the store's fingerprint leaves
    # out): in-process for the reference builds, a LocalCluster of worker processes for
    # the runs that are killed.
    inproc = _config(tmp_path, materialize=materialize, cluster={"address": address}, out="store.zarr",
                     name="inproc.yaml")
    killed = _config(tmp_path, materialize=materialize, out="store.zarr", name="killed.yaml",
                     cluster={"n_workers": 1, "threads_per_worker": 2, "memory_limit": "1GiB"})
    assert run(load_config(inproc), log=None, progress=False).version == 0
    _copy(tmp_path / "store.zarr", tmp_path / "before.zarr")
    for home, aside in held:
        shutil.move(aside, home)
    full = _config(tmp_path, materialize=materialize, cluster={"address": address}, out="full.zarr",
                   name="full.yaml")
    run(load_config(full), log=None, progress=False)
    return {"store": tmp_path / "store.zarr", "before": tmp_path / "before.zarr", "full": tmp_path / "full.zarr",
            "inproc": inproc, "killed": killed}


@pytest.mark.parametrize("materialize, n_kills", [(True, 3), (False, 2)], ids=["materialized", "virtual"])
def test_a_killed_append_keeps_the_previous_version_and_a_rerun_completes_it(tmp_path, address, materialize,
                                                                            n_kills):
    paths = _first_version(tmp_path, address, materialize)
    store, before, full = paths["store"], paths["before"], paths["full"]
    appended = tmp_path / "appended.zarr"
    t0 = time.perf_counter()
    summary = run(load_config(paths["inproc"]), log=None, progress=False)
    uninterrupted = time.perf_counter() - t0
    assert (summary.action, summary.version) == ("append", 1)
    _copy(store, appended)
    _copy(before, store)
    _assert_equals_full_build(appended, full)  # the reference itself is right

    units = _new_units(before, appended)
    total = sum(u1 - u0 for u0, u1 in units.values())
    assert total >= 20, "too few write units for kills at distinct moments; use more data"
    # The unit holding the last stored samples is rewritten with new ones after them.
    first = zarr.open_group(str(before), mode="r")
    assert any(first[f"{split}/_written"].shape[0] > u0 for split, (u0, _) in units.items())
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    cmd = [str(BIN / "pipeline"), "run", str(paths["killed"]), "--no-progress"]
    rng = random.Random(19)
    kills, completed, group_sizes, moments = 0, 0, [], []
    for attempt in range(n_kills + 6):
        if kills == n_kills:
            break
        done = _units_done(store, units)
        if done == total and moments and moments[-1].endswith(f"{total}->{total}/{total}"):
            # Killed once already with only the folds and the commit left: start the
            # next kills on a fresh append, from the first version's copy.
            _copy(before, store)
            done = 0
        # This run's moment: a seeded share of the units still to write, after its own
        # pending record; the first run's share is 0: killed right after that record.
        share = rng.uniform(0.0, 0.5) if moments else 0.0
        target = done + math.ceil(share * (total - done))
        root = store / "zarr.json"
        root_before = (root.stat().st_ino, root.stat().st_mtime_ns)
        log = tmp_path / f"run{attempt}.log"
        with open(log, "w") as err:
            proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, env=env, start_new_session=True)

        def reached(proc: subprocess.Popen = proc, target: int = target) -> bool:
            if proc.poll() is not None:
                return True
            if (root.stat().st_ino, root.stat().st_mtime_ns) == root_before:
                return False  # this run has not recorded its pending append yet
            try:
                return _units_done(store, units) >= target
            except Exception:  # noqa: BLE001 - metadata being replaced as it is read
                return False

        assert wait_until(reached, timeout=120 + 10 * uninterrupted, watch=store, procs=[proc]), log.read_text()
        if proc.poll() is None:
            group_sizes.append(_kill_group(proc))
        else:
            assert proc.returncode == 0, log.read_text()
        if pipeline.open(store).version.number == 0:
            kills += 1
            moments.append(f"{done}->{target}/{total}")
            _assert_previous_version(store, before, seed=attempt)
        else:
            # The run committed before its moment (it fell on the commit, or the run
            # was shutting its cluster down): it must be the uninterrupted append. The
            # next kill starts from the first version again.
            _assert_identical(store, appended)
            completed += 1
            _copy(before, store)
    assert kills == n_kills, f"only {kills} kills landed before the commit ({completed} runs completed)"
    assert max(group_sizes) >= 2, "the killed runs' groups held no worker process"
    final = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert final.returncode == 0, final.stderr
    assert "version 1: appended 2 session(s)" in final.stdout, final.stdout
    _assert_identical(store, appended)
    _assert_equals_full_build(store, full)
    print(f"{kills} kills at units {moments} ({completed} runs completed before their moment), "
          f"uninterrupted in-process append {uninterrupted:.1f} s")


class _Killed(BaseException):
    """Stands for SIGKILL at one exact point: nothing in the package catches it."""


@pytest.mark.parametrize("materialize", [True, False], ids=["materialized", "virtual"])
def test_an_append_stopped_before_it_cleared_the_tail_units_marker_resumes_to_a_full_build(
        tmp_path, address, materialize, monkeypatch):
    """The moment after an append recorded itself as pending and grew the arrays, before
    it cleared the marker of the unit holding the last stored samples (which it must
    rewrite with the new samples after them). A SIGKILL lands there only by chance (a
    few milliseconds of the append); here the run stops exactly there."""
    paths = _first_version(tmp_path, address, materialize)
    store, before, full = paths["store"], paths["before"], paths["full"]
    setitem = zarr.Array.__setitem__

    def stop_at_the_first_marker_write(self, key, value):
        if self.path.endswith("/_written"):
            raise _Killed(self.path)
        return setitem(self, key, value)

    monkeypatch.setattr(zarr.Array, "__setitem__", stop_at_the_first_marker_write)
    with pytest.raises(_Killed):
        run(load_config(paths["inproc"]), log=None, progress=False)
    monkeypatch.setattr(zarr.Array, "__setitem__", setitem)
    group, first = zarr.open_group(str(store), mode="r"), pipeline.open(before)
    assert PENDING in group.attrs["pipeline"]  # stopped after the pending record...
    grows = [split for split in first.splits if group[f"{split}/y"].shape[0] > first[split]["y"].shape[0]]
    assert grows  # ...and after growing the arrays
    assert all(first[split]["y"].shape[0] % 24 for split in grows)  # the last stored unit is partly filled
    _assert_previous_version(store, before, seed=0)
    summary = run(load_config(paths["inproc"]), log=None, progress=False)
    assert (summary.action, summary.version) == ("append", 1)
    _assert_equals_full_build(store, full)
