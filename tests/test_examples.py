"""The example scripts run end to end on tiny data (in a subprocess, as a user runs them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pipeline

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_deeplob_prepares_lobster_data_and_trains(tmp_path: Path):
    data, store = tmp_path / "lobster", tmp_path / "deeplob.zarr"
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    # Four days: the first only feeds the trailing normalization, then train, val, test.
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "deeplob.py"), "--data", str(data), "--out", str(store),
         "--days", "4", "--rows-per-day", "2000", "--epochs", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert len(list(data.glob("AAA_*_orderbook_10.csv"))) == 4
    assert len(list(data.glob("BBB_*_message_10.csv"))) == 4
    assert "splits: train until 2026-01-07, val until 2026-01-08, test the rest" in out
    assert "sessions: 8 over 2 instruments (AAA, BBB)" in out
    assert "class balance (down, stationary, up):" in out
    for split in ("train", "val", "test"):
        assert re.search(rf"^  {split} k=100: ", out, re.MULTILINE), out
    assert re.search(r"^keras epoch 1: loss \d", out, re.MULTILINE), out
    for k in (10, 20, 50, 100):
        assert re.search(rf"^  k={k} +accuracy 0\.\d{{3}}  \(majority class '\w+': 0\.\d{{3}}\)$", out,
                         re.MULTILINE), out

    ds = pipeline.open(store)
    assert tuple(ds.splits) == ("train", "val", "test")
    for split in ds.splits:
        y = ds[split]["y"]
        assert y.ndim == 2 and y.shape[1] == 4 and y.shape[0] > 0
    # Sessions by file: each instrument-day after the first makes its own windows.
    windows = [row["windows"] for row in ds.attrs["sessions"]]
    assert windows.count(0) == 2 and len(windows) == 8
    assert ds.attrs["labels"]["horizons"] == [10, 20, 50, 100]


def test_deeplob_refuses_too_few_days(tmp_path: Path):
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "deeplob.py"), "--data", str(tmp_path / "lobster"),
         "--out", str(tmp_path / "s.zarr"), "--days", "3", "--rows-per-day", "500"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode != 0
    assert "need at least 4 days" in done.stderr
    assert not (tmp_path / "s.zarr").exists()


def test_deeplob_names_each_of_several_label_columns(tmp_path: Path):
    """``--store`` on a store of FI-2010's five label columns (``column: [label_1, ...,
    label_10]``, as its recipe offers): one accuracy line per column, named by it (the
    store records no horizon; the evaluation crashed formatting ``None``)."""
    from pipeline.storage import write

    rng = np.random.default_rng(1)
    columns = ["label_1", "label_2", "label_3", "label_5", "label_10"]
    split = {name: {"x": rng.standard_normal((n, 20, 8)).astype(np.float32), "y": rng.integers(0, 3, (n, 5))}
             for name, n in (("train", 128), ("test", 64))}
    store = write(tmp_path / "fi5.zarr", split, features=[f"f{j}" for j in range(8)],
                  attrs={"labels": {"kind": "column", "column": columns, "dtype": "int64"}}, progress=False)
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "deeplob.py"), "--store", store, "--val", "none", "--epochs", "1",
         "--batch-size", "64"],
        cwd=tmp_path, env={**os.environ, "KERAS_BACKEND": "torch"}, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    y = split["test"]["y"]
    for j, name in enumerate(columns):
        counts = np.bincount(y[:, j], minlength=3)
        line = re.search(rf"^  k={name} +accuracy 0\.\d{{3}}  \(majority class '\w+': (0\.\d{{3}})\)$",
                         done.stdout, re.MULTILINE)
        assert line, done.stdout
        assert float(line.group(1)) == pytest.approx(counts.max() / len(y), abs=1e-3)


def test_deeplob_trains_on_a_store_built_already_with_one_label_column(tmp_path: Path):
    """``--store``: a store as the FI-2010 recipe writes one (windows of 100 x 40, one
    label column as 0 down, 1 stationary, 2 up, folds or splits named), trained as it is."""
    from pipeline.storage import write

    rng = np.random.default_rng(0)
    names = [f"{side}_{what}_{level}" for level in range(1, 11) for side, what in
             (("ask", "price"), ("ask", "size"), ("bid", "price"), ("bid", "size"))]
    split = {name: {"x": rng.standard_normal((n, 100, 40)).astype(np.float32), "y": rng.integers(0, 3, n)}
             for name, n in (("train", 300), ("test", 120))}
    store = write(tmp_path / "fi.zarr", split, features=names,
                  attrs={"labels": {"kind": "column", "column": "label_10", "dtype": "int64"}}, progress=False)
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "deeplob.py"), "--store", store, "--val", "none", "--epochs", "1",
         "--batch-size", "64"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "train (300, 100, 40), 5 batches/epoch" in done.stdout, done.stdout
    assert re.search(r"^test: 120 samples\n  k=label_10 accuracy 0\.\d{3}  \(majority class '\w+': 0\.\d{3}\)$",
                     done.stdout, re.MULTILINE), done.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "examples" / "deeplob.py"), "--store", store],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "has no split 'val'; its splits and folds: train, test" in bad.stderr
