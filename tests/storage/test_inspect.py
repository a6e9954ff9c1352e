"""`pipeline inspect`: the report and the PNG."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from pipeline.storage import format_report, inspect_store, write


def test_report_lists_splits_chunks_codec_ratio_and_completeness(tmp_path):
    x = np.repeat(np.arange(256, dtype=np.float32), 32).reshape(256, 8, 4)
    write(tmp_path / "s.zarr", {"x": x, "y": np.arange(256)}, splits={"train": .5, "val": .5}, gap=0, chunk_samples=32,
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


def test_verify_names_every_corrupt_chunk(tmp_path):
    x = np.random.default_rng(3).standard_normal((200, 6)).astype(np.float32)
    path = tmp_path / "v.zarr"
    write(path, {"x": x, "y": np.arange(200)}, chunk_samples=50, codec="none", progress=False)
    from pipeline.storage import verify_store

    assert verify_store(path) == []
    # A silent bit flip (uncompressed, so it still decodes) and a truncated chunk.
    chunk = path / "train" / "x" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0xFF
    chunk.write_bytes(bytes(data))
    (path / "train" / "y" / "c" / "3").write_bytes(b"\x00\x01")
    problems = verify_store(path)
    assert "train/x chunk 1: checksum mismatch" in problems
    assert any(p.startswith("train/y chunk 3: cannot decode") for p in problems)
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", "inspect", str(path), "--verify"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "CORRUPT train/x chunk 1: checksum mismatch" in result.stdout


def test_session_table_and_class_balance_lines():
    from pipeline.storage.inspect import balance_lines, session_lines

    attrs = {
        "instruments": ["AAA", "BBB"],
        "sessions": [{"instrument": "AAA", "session": 0, "rows": [0, 100], "start": "2026-01-05T09:30:00",
                      "end": "2026-01-05T16:00:00", "windows": 0},
                     {"instrument": "BBB", "session": 1, "rows": [100, 350], "start": "2026-01-06T09:30:00",
                      "end": "2026-01-06T16:00:00", "windows": 1234}],
        "labels": {"kind": "smoothed", "horizons": [10, 20], "classes": ["down", "stationary", "up"]},
        "class_balance": {"train": [[1, 2, 1], [2, 0, 2]]},
    }
    text = "\n".join(session_lines(attrs))
    assert "sessions: 2 over 2 instruments (AAA, BBB)" in text
    row = [line for line in text.splitlines() if line.strip().startswith("BBB")][0].split()
    assert row[1] == "1" and row[-2] == "250" and row[-1] == "1,234"
    balance = balance_lines(attrs)
    assert balance[0] == "class balance (down, stationary, up):"
    assert balance[1] == "  train k=10: 1 (25%), 2 (50%), 1 (25%)" and balance[2].startswith("  train k=20: 2 (50%)")
    assert session_lines({}) == [] and balance_lines({}) == []
