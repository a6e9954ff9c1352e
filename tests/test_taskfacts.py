"""A task its workers died of (KilledWorker) is one line naming what it read or wrote,
the memory limit and what to set (pipeline.taskfacts), from real runs whose workers
the nanny restarts at their limit."""

from __future__ import annotations

import re

import numpy as np

from tests.test_workerlog import _book, _one_line, _run_config


def test_a_row_group_larger_than_the_workers_memory_names_the_file_the_limit_and_the_fix(tmp_path):
    import pyarrow.parquet as pq

    raw = tmp_path / "big.parquet"
    _book(raw, 1_000_000, row_group=1_000_000)  # ~250 MB of columns, read whole
    meta = pq.ParquetFile(raw).metadata
    cfg = {"cluster": {"n_workers": 1, "threads_per_worker": 1, "memory_limit": "250MiB"},
           "source": {"paths": str(raw), "timestamp": "timestamp", "chunk_rows": 100_000},
           # Every level's prices and sizes: the read decodes 40 columns of the row group.
           "features": {"steps": ["mid_price", {"name": "imbalance", "levels": 10}]}, "windows": {"size": 8},
           "labels": {"kind": "return", "horizon": 5},
           "output": {"path": str(tmp_path / "out.zarr"), "splits": {"train": 0.8, "val": 0.2}}}
    line = _one_line(_run_config(tmp_path, cfg))
    assert meta.num_row_groups == 1
    assert f"reading {raw} row group 0 ({meta.row_group(0).num_rows:,} rows)" in line, line
    assert re.search(r"restarted by its nanny at [\d,]+ MiB of its 250 MiB memory limit", line), line
    for fix in ("cluster.memory_limit", "smaller row groups", "source.chunk_rows does not split it", "resumes"):
        assert fix in line, line
    assert not (tmp_path / "out.zarr.lock").exists()  # the write lock released


def test_a_write_block_larger_than_the_workers_memory_names_the_split_its_size_and_the_fix_and_resumes(tmp_path):
    import zarr

    import pipeline

    raw = tmp_path / "day.parquet"
    _book(raw, 300_000, row_group=50_000)
    # A limit with room for the statistics pass (at 250 MiB a worker under a loaded
    # machine could pause at 80% before the write began), and units over it.
    cfg = {"cluster": {"n_workers": 1, "threads_per_worker": 1, "memory_limit": "400MiB"},
           "source": {"paths": str(raw), "timestamp": "timestamp"},
           "features": {"steps": ["mid_price", "spread", {"name": "imbalance", "levels": 5}, "log_return"]},
           "windows": {"size": 64, "scales": [1, 4]}, "labels": {"kind": "return", "horizon": 20},
           "output": {"path": str(tmp_path / "out.zarr"), "target_chunk_mb": 400,
                      "splits": {"train": 0.8, "val": 0.1, "test": 0.1}}}
    line = _one_line(_run_config(tmp_path, cfg))
    found = re.search(rf"writing split '(\w+)' of {re.escape(str(tmp_path / 'out.zarr'))}: a block of ([\d,]+) "
                      r"samples \(([\d,]+) MiB\)", line)
    assert found, line
    split, samples = found[1], int(found[2].replace(",", ""))
    # The block's size from the store's own metadata: every array of the split, per sample.
    group = zarr.open_group(str(tmp_path / "out.zarr"), mode="r")[split]
    per_sample = sum(int(np.prod(a.shape[1:])) * a.dtype.itemsize for name, a in group.arrays()
                     if not name.startswith("_"))
    assert samples <= group["x"].shape[0]
    assert int(found[3].replace(",", "")) == round(samples * per_sample / 2**20)
    assert "400 MiB memory limit" in line and "cluster.memory_limit" in line and "output.target_chunk_mb" in line
    # More memory, the same config otherwise: the build resumes and completes.
    cfg["cluster"]["memory_limit"] = "2GiB"
    again = _run_config(tmp_path, cfg, "more.yaml")
    assert again.returncode == 0, again.stderr[-3000:]
    assert pipeline.open(tmp_path / "out.zarr")[split]["x"].shape[0] == group["x"].shape[0]
