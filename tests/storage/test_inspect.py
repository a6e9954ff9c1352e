"""`pipeline inspect`: the report and the PNG."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from pipeline.storage import format_report, inspect_store, write


def test_report_lists_splits_chunks_codec_ratio_and_completeness(tmp_path):
    x = np.repeat(np.arange(256, dtype=np.float32), 32).reshape(256, 8, 4)
    write(tmp_path / "s.zarr", {"x": x, "y": np.arange(256)}, splits={"train": .5, "val": .5}, chunk_samples=32,
          attrs={"features": ["a", "b", "c", "d"], "windows": {"size": 8, "scales": [1]}}, progress=False)
    report = inspect_store(tmp_path / "s.zarr")
    assert report.complete and [a.split for a in report.arrays] == ["train", "train", "val", "val"]
    assert report.stored_bytes < report.nbytes  # compressible data compressed
    text = format_report(report)
    for needle in ("complete: yes", "train/x: (128, 8, 4) float32, chunks (32, 8, 4)", "blosc", "ratio",
                   "features: a, b, c, d"):
        assert needle in text, needle
    assert "_written" not in text


def test_cli_inspect_with_plot_writes_a_png(tmp_path):
    x = np.random.default_rng(0).standard_normal((100, 8, 4)).astype(np.float32)
    write(tmp_path / "s.zarr", {"x": x, "y": np.arange(100)}, progress=False)
    png = tmp_path / "view.png"
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", "inspect", str(tmp_path / "s.zarr"), "--plot",
                             str(png)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "train/x" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
