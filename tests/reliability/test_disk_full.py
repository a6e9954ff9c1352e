"""A full disk mid-write: a clear error, and the partial store resumes once space is back."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.errors import IncompleteStoreError, StoreError
from pipeline.storage import write


@pytest.fixture()
def small_disk(tmp_path):
    mount = Path("/tmp") / f"pipeline-tmpfs-{uuid.uuid4().hex[:8]}"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", str(mount)], capture_output=True)
    if result.returncode != 0:
        mount.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)
    mount.rmdir()


def test_disk_full_is_a_clear_error_and_the_store_resumes(small_disk):
    x = np.random.default_rng(0).standard_normal((4000, 256)).astype(np.float32)  # 4 MB, incompressible
    target = small_disk / "s.zarr"
    with pytest.raises(StoreError, match=r"s\.zarr: cannot write \(No space left on device\).*rerun"):
        write(target, {"x": x, "y": np.arange(4000)}, chunk_samples=250, fingerprint="f", progress=False)
    with pytest.raises(IncompleteStoreError):
        pipeline.open(target)
    subprocess.run(["mount", "-o", "remount,size=32M", str(small_disk)], check=True)
    write(target, {"x": x, "y": np.arange(4000)}, chunk_samples=250, fingerprint="f", progress=False)
    np.testing.assert_array_equal(pipeline.open(target)["train"]["x"][:], x)


def test_a_read_only_output_is_a_clear_error_and_nothing_is_lost(tmp_path):
    x = np.arange(2000, dtype=np.float32).reshape(1000, 2)
    mount = Path("/tmp") / f"pipeline-ro-{uuid.uuid4().hex[:8]}"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8M", "tmpfs", str(mount)], capture_output=True).returncode:
        mount.rmdir()
        pytest.skip("cannot mount a tmpfs here")
    try:
        write(mount / "s.zarr", {"x": x, "y": x[:, 0]}, chunk_samples=100, fingerprint="f", progress=False)
        before = pipeline.open(mount / "s.zarr")["train"]["x"][:]
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        with pytest.raises(StoreError, match=r"Read-only file system"):
            write(mount / "other.zarr", {"x": x, "y": x[:, 0]}, progress=False)
        # The finished store is untouched and still readable on the read-only mount.
        np.testing.assert_array_equal(pipeline.open(mount / "s.zarr")["train"]["x"][:], before)
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        mount.rmdir()
