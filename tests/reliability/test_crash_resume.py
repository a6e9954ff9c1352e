"""`pipeline run` killed with SIGKILL at (at least) 10 seeded random moments of its write; each rerun
completes, and the final store equals an uninterrupted run's, chunk by chunk."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml
import zarr

import pipeline
from pipeline.demo import DemoSpec, write_demo_data
from pipeline.storage.writer import written_units
from tests.conftest import wait_until

BIN = Path(sys.executable).parent


def test_killed_runs_resume_to_the_uninterrupted_store(tmp_path):
    raw = tmp_path / "raw"
    write_demo_data(raw, DemoSpec(days=2, rows_per_day=30_000, seed=9, formats=("parquet",)))
    cfg = {
        "cluster": {"n_workers": 1, "threads_per_worker": 2, "memory_limit": "2GiB"},
        "source": {"paths": str(raw / "*.parquet"), "timestamp": "timestamp", "chunk_rows": 2000},
        "features": {"steps": ["mid_price", {"name": "imbalance", "levels": 5}, "log_return"]},
        "windows": {"size": 32, "stride": 2, "scales": [1, 2]},
        "labels": {"kind": "return", "horizon": 5},
        "output": {"path": str(tmp_path / "killed.zarr"), "splits": {"train": 0.8, "val": 0.2},
                   "chunk_samples": 256},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    cmd = [str(BIN / "pipeline"), "run", str(path), "--no-progress"]
    store = tmp_path / "killed.zarr"
    rng = random.Random(1234)
    kills = 0
    for attempt in range(12):
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        target = rng.uniform(0.05, 0.9)  # fraction of units written when the kill lands

        def reached(target: float = target, proc: subprocess.Popen = proc) -> bool:
            if proc.poll() is not None:
                return True
            try:
                g = zarr.open_group(str(store), mode="r")
                done = np.concatenate([written_units(g, s) for s in ("train", "val") if s in g])
            except Exception:  # noqa: BLE001 - the store is not created yet
                return False
            return bool(done.size) and done.mean() >= target

        wait_until(reached, timeout=180, watch=tmp_path, procs=[proc])
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            kills += 1
        proc.wait()
    assert kills >= 10, "the runs finished before they could be killed; use more data"
    final = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert final.returncode == 0, final.stderr
    ref = subprocess.run(cmd + ["--set", f"output.path={tmp_path / 'ref.zarr'}"], capture_output=True, text=True,
                         env=env, timeout=300)
    assert ref.returncode == 0, ref.stderr
    a, b = pipeline.open(store), pipeline.open(tmp_path / "ref.zarr")
    assert a.splits == b.splits
    for split in a.splits:
        for name in ("x", "y"):
            x, y = a[split][name], b[split][name]
            assert x.shape == y.shape
            for i in range(0, x.shape[0], x.chunks[0]):
                np.testing.assert_array_equal(x[i : i + x.chunks[0]], y[i : i + x.chunks[0]])
