"""An interrupted write is resumed only from the input it began with: raw files corrected
or delivered again shorter between the killed run and the rerun are refused, naming the
file, where the rerun mixed old units with new ones (or kept old units at offsets the new
input moved) and called the store complete."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import dask.array as da
import numpy as np
import pandas as pd
import pytest
import yaml
import zarr

import pipeline
from pipeline.demo import DemoSpec, write_demo_data
from pipeline.errors import IncompleteStoreError, StoreConflictError
from pipeline.storage import write
from pipeline.storage.writer import written_units
from tests.conftest import wait_until

BIN = Path(sys.executable).parent


def _failing(x: np.ndarray, bad_block: int, rows: int) -> da.Array:
    """``x`` as a dask array whose block ``bad_block`` fails: a write interrupted there."""
    def block(b: np.ndarray, block_info=None) -> np.ndarray:
        if block_info[0]["chunk-location"][0] == bad_block:
            raise RuntimeError("interrupted")
        return b

    return da.from_array(x, chunks=(rows,) + x.shape[1:]).map_blocks(block, dtype=x.dtype)


def _sources(*files: tuple[str, int, int, str]) -> dict:
    return {"files": [{"path": p, "size": s, "rows": r, "hash": h, "mtime": 0.0} for p, s, r, h in files]}


def test_a_write_resumes_only_from_the_input_it_began_with(tmp_path):
    x = np.arange(4000 * 3, dtype=np.float32).reshape(4000, 3)
    target = tmp_path / "s.zarr"
    began = _sources(("/raw/a.parquet", 100, 2000, "aa"), ("/raw/b.parquet", 100, 2000, "bb"))
    with pytest.raises(RuntimeError, match="interrupted"):
        write(target, {"x": _failing(x, 3, 500), "y": x[:, 0]}, chunk_samples=500, attrs={"sources": began},
              fingerprint="f", progress=False)
    with pytest.raises(IncompleteStoreError):
        pipeline.open(target)
    before = {p: p.read_bytes() for p in sorted(target.rglob("*")) if p.is_file()}
    changed = _sources(("/raw/a.parquet", 100, 2000, "aa"), ("/raw/b.parquet", 100, 2000, "b2"))
    with pytest.raises(StoreConflictError, match=r"/raw/b.parquet: changed since the interrupted build began \(its "
                       r"content hash was bb, is b2\).*--rebuild"):
        write(target, {"x": x, "y": x[:, 0]}, chunk_samples=500, attrs={"sources": changed}, fingerprint="f",
              progress=False)
    with pytest.raises(StoreConflictError, match=r"train/x was begun with shape \(4000, 3\), this write's is "
                       r"\(3500, 3\)"):
        write(target, {"x": x[:3500], "y": x[:3500, 0]}, chunk_samples=500, attrs={"sources": began},
              fingerprint="f", progress=False)
    assert {p: p.read_bytes() for p in sorted(target.rglob("*")) if p.is_file()} == before
    write(target, {"x": x, "y": x[:, 0]}, chunk_samples=500, attrs={"sources": began}, fingerprint="f",
          progress=False)  # the same input: resumed
    np.testing.assert_array_equal(pipeline.open(target)["train"]["x"][:], x)
    assert "resume_sources" not in pipeline.open(target).attrs  # the complete store's attributes replace it


def test_a_write_over_a_file_corrected_inside_at_the_same_size_is_not_resumed(tmp_path):
    """The ends' hash is the same, the CRC-32 of every byte is not; a record begun by a
    version without CRC-32s still resumes on what both record."""
    x = np.arange(4000 * 3, dtype=np.float32).reshape(4000, 3)
    target = tmp_path / "s.zarr"
    began = _sources(("/raw/a.csv", 9 << 20, 4000, "aa"))
    began["files"][0]["crc32"] = 1
    with pytest.raises(RuntimeError, match="interrupted"):
        write(target, {"x": _failing(x, 3, 500), "y": x[:, 0]}, chunk_samples=500, attrs={"sources": began},
              fingerprint="f", progress=False)
    corrected = _sources(("/raw/a.csv", 9 << 20, 4000, "aa"))
    corrected["files"][0]["crc32"] = 2
    with pytest.raises(StoreConflictError, match=r"/raw/a.csv: changed since the interrupted build began \(its "
                       r"content CRC-32 was 1, is 2\)"):
        write(target, {"x": x, "y": x[:, 0]}, chunk_samples=500, attrs={"sources": corrected}, fingerprint="f",
              progress=False)
    root = zarr.open_group(str(target), mode="r+")
    meta = dict(root.attrs["pipeline"])
    meta["resume_sources"] = [row[:4] for row in meta["resume_sources"]]  # as an older version left it
    root.attrs["pipeline"] = meta
    write(target, {"x": x, "y": x[:, 0]}, chunk_samples=500, attrs={"sources": began}, fingerprint="f",
          progress=False)
    np.testing.assert_array_equal(pipeline.open(target)["train"]["x"][:], x)


def test_a_killed_run_over_corrected_raw_files_is_refused_before_the_cluster_starts(tmp_path):
    raw = tmp_path / "raw"
    write_demo_data(raw, DemoSpec(days=3, rows_per_day=60_000, seed=9, formats=("parquet",)))
    store = tmp_path / "s.zarr"
    cfg = {
        "cluster": {"n_workers": 1, "threads_per_worker": 2, "memory_limit": "2GiB"},
        "source": {"paths": str(raw / "*.parquet"), "timestamp": "timestamp", "chunk_rows": 2000},
        "features": {"steps": ["mid_price", "log_return"]},
        "windows": {"size": 32, "stride": 2, "scales": [1, 2]},
        "labels": {"kind": "return", "horizon": 5},
        "output": {"path": str(store), "splits": {"train": 0.8, "val": 0.2}, "chunk_samples": 256},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cmd = [str(BIN / "pipeline"), "run", str(path), "--no-progress"]
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    def some_written() -> bool:
        if proc.poll() is not None:
            return True
        try:
            return bool(written_units(zarr.open_group(str(store), mode="r"), "train").any())
        except Exception:  # noqa: BLE001 - not created yet
            return False

    wait_until(some_written, timeout=180, watch=tmp_path, procs=[proc])
    if proc.poll() is not None:
        pytest.skip("the build finished before it could be killed")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first = sorted(raw.glob("*.parquet"))[0]
    frame = pd.read_parquet(first)
    frame[[c for c in frame.columns if "price" in c]] *= 1.5  # corrected prices, the same rows
    frame.to_parquet(first, index=False)
    # A cluster that cannot start: the refusal must come first.
    bad = subprocess.run(cmd + ["--set", "cluster.address=tcp://127.0.0.1:1"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert bad.returncode == 1, bad.stderr
    assert f"{first}: changed since the interrupted build began (its size was" in bad.stderr
    assert "--rebuild" in bad.stderr and "Traceback" not in bad.stderr
    rebuilt = subprocess.run(cmd + ["--rebuild"], capture_output=True, text=True, env=env, timeout=300)
    assert rebuilt.returncode == 0, rebuilt.stderr
    fresh = subprocess.run(cmd + ["--set", f"output.path={tmp_path / 'fresh.zarr'}"], capture_output=True, text=True,
                           env=env, timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    a, b = pipeline.open(store), pipeline.open(tmp_path / "fresh.zarr")
    for split in ("train", "val"):
        np.testing.assert_array_equal(a[split]["x"][:], b[split]["x"][:])
