"""The store's write lock on a full disk, and locks that name no holder: a failed run
never leaves a lock that blocks the next one, and a lock taken over says whose it was.

A full disk is the process's file-size limit (``RLIMIT_FSIZE``): every write past it
fails with ``EFBIG``, as one to a full disk fails with ``ENOSPC``, on any filesystem and
without root."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from pipeline.errors import StoreError, StoreLockedError
from pipeline.storage.lock import NO_HOLDER_GRACE_S, write_lock
from tests.conftest import file_size_limit

pytest.importorskip("resource")  # a file-size limit stands for a full disk



def _gone_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_lock_whose_holder_cannot_be_written_is_not_left_behind(tmp_path):
    """The holder's write fails (a full disk): the run fails in one line, and no lock file,
    empty or not, nor its temporary file, is left to refuse the next run."""
    target = str(tmp_path / "s.zarr")
    with file_size_limit(8), pytest.raises(StoreError, match=r"s\.zarr: cannot write \(File too large\)$"):
        with write_lock(target):
            pass
    assert sorted(os.listdir(tmp_path)) == []
    with write_lock(target):  # space is back: the next run takes the lock
        held = json.loads((tmp_path / "s.zarr.lock").read_text())
        assert (held["host"], held["pid"]) == (socket.gethostname(), os.getpid())
    assert sorted(os.listdir(tmp_path)) == []


def test_an_old_lock_without_a_holder_is_taken_over_with_a_warning(tmp_path):
    """An empty lock (left by a version that created the file before writing its holder,
    on a full disk) older than the grace period is stale: taken over, and said."""
    lock = tmp_path / "s.zarr.lock"
    for content in (b"", b'{"host": "h', b"{}"):
        lock.write_bytes(content)
        old = time.time() - NO_HOLDER_GRACE_S - 5
        os.utime(lock, (old, old))
        with pytest.warns(UserWarning, match=r"s\.zarr: taking over the write lock .*s\.zarr\.lock, which names no "
                          r"holder \(empty or unreadable, last written \d{4}-\d\d-\d\dT"):
            with write_lock(str(tmp_path / "s.zarr")):
                assert json.loads(lock.read_text())["pid"] == os.getpid()
        assert not lock.exists()


def test_a_fresh_lock_without_a_holder_is_refused_and_kept(tmp_path):
    """A lock that names no holder yet may be one another run is creating this instant
    (a filesystem without hard links writes its holder after the file): refused, kept."""
    lock = tmp_path / "s.zarr.lock"
    lock.write_bytes(b"")
    with pytest.raises(StoreLockedError, match=rf"s\.zarr: the lock file .*s\.zarr\.lock names no holder yet "
                       rf"\(written \d+ s ago\): .*rerun in {NO_HOLDER_GRACE_S:.0f} s"):
        with write_lock(str(tmp_path / "s.zarr")):
            pass
    assert lock.read_bytes() == b""


def test_taking_over_a_dead_holders_lock_names_it(tmp_path):
    pid = _gone_pid()
    lock = tmp_path / "s.zarr.lock"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "since": "2026-01-01T00:00:00+00:00"}))
    with pytest.warns(UserWarning, match=rf"s\.zarr: taking over the write lock .*s\.zarr\.lock of pid {pid} on "
                      rf"{socket.gethostname()} \(since 2026-01-01T00:00:00\+00:00\): that process is gone"):
        with write_lock(str(tmp_path / "s.zarr")):
            assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert os.listdir(tmp_path) == []
