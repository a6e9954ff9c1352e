"""An append that cannot write (a full disk, a read-only store) fails in one line that
says the previous version is intact, and its rerun finishes it; while an append is in
progress, a plain zarr reader is told so by the root's ``append_in_progress`` attribute.

The failures are real ones of the filesystem: a chunk's folder taken by a file (the
write fails with ``FileExistsError``, on a worker), and the process's file-size limit
(``RLIMIT_FSIZE``: writes past it fail with ``EFBIG``, as on a full disk), without root.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr

import pipeline
from pipeline.errors import StoreError
from pipeline.storage import layout, write
from pipeline.storage.append import append
from tests.conftest import file_size_limit

pytest.importorskip("resource")  # a file-size limit stands for a full disk

N0, N = 230, 400  # stored samples, and samples once appended (chunks of 50)



def _store(tmp_path):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((N, 6)).astype(np.float32)
    y = np.arange(N, dtype=np.int64)
    path = tmp_path / "a.zarr"
    write(path, {"x": x[:N0], "y": y[:N0]}, chunk_samples=50, codec="none", progress=False)
    return path, x, y


def _append(path, x, y, attrs):
    append(path, {"train": {"x": x[N0:], "y": y[N0:]}}, attrs=attrs, token="t", progress=False)


def _message(path) -> str:
    return (rf"^{path}: cannot write \(File exists\); the append stopped before its commit: the store's previous "
            r"version is intact and readers keep seeing it; fix the cause and rerun the same run: the append "
            r"resumes where it stopped$")


def test_a_write_failing_on_a_worker_is_one_line_and_the_rerun_finishes(tmp_path, monkeypatch):
    path, x, y = _store(tmp_path)
    attrs = pipeline.open(path).attrs
    monkeypatch.setattr(layout, "TASK_BYTES", 1)  # a task per unit: units before the blocked one are written
    blocker = path / "train" / "x" / "c" / "6"  # unit 6's chunk folder, taken by a file
    blocker.write_bytes(b"")
    with pytest.raises(StoreError, match=_message(path)) as caught:
        _append(path, x, y, attrs)
    assert not isinstance(caught.value, OSError)
    # pipeline's readers see version 0; a plain zarr reader is told an append is under
    # way, and which samples are complete: they equal the stored ones.
    ds = pipeline.open(path)
    assert ds.version.number == 0
    np.testing.assert_array_equal(ds["train"]["x"][:], x[:N0])
    root = zarr.open_group(path, mode="r")
    assert root.attrs["append_in_progress"] == {"version": 1, "complete_version": 0, "samples": {"train": N0}}
    assert root["train/x"].shape[0] == N  # grown: past the complete samples, unwritten
    np.testing.assert_array_equal(root["train/x"][:N0], x[:N0])
    np.testing.assert_array_equal(root["train/y"][:N0], y[:N0])

    blocker.unlink()  # the cause fixed: the same append resumes and commits
    _append(path, x, y, attrs)
    root = zarr.open_group(path, mode="r")
    assert "append_in_progress" not in root.attrs and root.attrs["pipeline"]["complete"] is True
    np.testing.assert_array_equal(root["train/x"][:], x)
    np.testing.assert_array_equal(root["train/y"][:], y)
    assert pipeline.open(path).version.number == 1


def test_a_store_that_cannot_be_written_at_all_is_one_line_and_left_as_it_was(tmp_path):
    """The append's first write, the pending record in the root's metadata, fails (a
    full disk; a read-only store fails there too): nothing changed, readers see version 0."""
    path, x, y = _store(tmp_path)
    attrs = pipeline.open(path).attrs
    before = (path / "zarr.json").read_bytes()
    assert len(before) > 600  # the limit lets the lock's holder through, not the root's metadata
    with file_size_limit(600), pytest.raises(StoreError, match=_message(path).replace("File exists",
                                                                                      "File too large")):
        _append(path, x, y, attrs)
    assert (path / "zarr.json").read_bytes() == before
    assert not (tmp_path / "a.zarr.lock").exists()
    root = zarr.open_group(path, mode="r")
    assert "append_in_progress" not in root.attrs and root["train/x"].shape[0] == N0
    _append(path, x, y, attrs)
    np.testing.assert_array_equal(zarr.open_group(path, mode="r")["train/x"][:], x)


def test_a_committed_append_leaves_the_root_attributes_a_build_has(tmp_path):
    """The in-progress attribute is the append's only: once committed the root holds
    what a build writes, the ``pipeline`` attributes alone."""
    path, x, y = _store(tmp_path)
    _append(path, x, y, pipeline.open(path).attrs)
    assert list(zarr.open_group(path, mode="r").attrs) == ["pipeline"]
