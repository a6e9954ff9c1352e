"""The store's write lock after a crash in a container: the restarted run is PID 1
again on the same hostname, and a pid may be reused by another process. A lock whose
holder is gone is taken over; one whose holder lives is refused before a run reads its
source or starts its cluster."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import pipeline
from pipeline.config import load_config
from pipeline.errors import StoreLockedError
from pipeline.storage import write


def _start_ticks(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat, read independently of pipeline."""
    stat = open(f"/proc/{pid}/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[19])


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")


def _lock(path, **holder) -> None:
    path.write_text(json.dumps({"host": socket.gethostname(), "since": "then", **holder}))


def test_a_lock_naming_our_own_pid_is_stale_and_taken_over(tmp_path):
    """A container restarted after a SIGKILL runs as PID 1 again: the lock its previous
    life left names this very pid, and this process has not taken it."""
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    _lock(tmp_path / "s.zarr.lock", pid=os.getpid())
    write(tmp_path / "s.zarr", {"x": x, "y": x[:, 0]}, progress=False)
    np.testing.assert_array_equal(np.asarray(pipeline.open(tmp_path / "s.zarr")["train"]["x"][:]), x)
    assert not (tmp_path / "s.zarr.lock").exists()


@needs_proc
def test_a_reused_pid_is_another_holder_and_a_live_one_is_refused(tmp_path):
    x = np.zeros((20, 2), np.float32)
    other = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        start = _start_ticks(other.pid)
        # The holder that wrote the lock started at another time: the pid was reused.
        _lock(tmp_path / "a.zarr.lock", pid=other.pid, start=start - 1)
        write(tmp_path / "a.zarr", {"x": x, "y": x[:, 0]}, progress=False)
        assert pipeline.open(tmp_path / "a.zarr").attrs["complete"]
        # The same process, same start: it is alive and holds the lock.
        _lock(tmp_path / "b.zarr.lock", pid=other.pid, start=start)
        with pytest.raises(StoreLockedError, match=f"pid {other.pid}"):
            write(tmp_path / "b.zarr", {"x": x, "y": x[:, 0]}, progress=False)
        assert not (tmp_path / "b.zarr").exists()
    finally:
        other.kill()
        other.wait()


def test_the_lock_records_its_start_and_is_reentrant(tmp_path):
    from pipeline.storage.lock import write_lock

    target = str(tmp_path / "r.zarr")
    with write_lock(target):
        held = json.loads((tmp_path / "r.zarr.lock").read_text())
        with write_lock(target):  # the writer inside pipeline run takes it again
            pass
        assert (tmp_path / "r.zarr.lock").exists()  # still held by the outer block
    assert not (tmp_path / "r.zarr.lock").exists()
    assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
    if os.path.exists("/proc/self/stat"):
        assert held["start"] == _start_ticks(os.getpid())


def test_a_run_refused_by_the_lock_reads_nothing_and_starts_no_cluster(tmp_path):
    """The lock is checked before the source is read: a refused run costs nothing."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        (tmp_path / "raw.csv").write_text("timestamp,bid,ask\n" + "".join(
            f"{i},{100 + i},{101 + i}\n" for i in range(50)))
        (tmp_path / "c.yaml").write_text(
            f"source: {{paths: {tmp_path / 'raw.csv'}, timestamp: timestamp, timestamp_unit: s}}\n"
            "features: {steps: [mid_price]}\nwindows: {size: 4}\n"
            f"output: {{path: {tmp_path / 'out.zarr'}}}\n")
        _lock(tmp_path / "out.zarr.lock", pid=holder.pid)
        from pipeline.job import run

        log = io.StringIO()
        t0 = time.perf_counter()
        with pytest.raises(StoreLockedError, match=f"pid {holder.pid}"):
            run(load_config(str(tmp_path / "c.yaml")), log=log, progress=False)
        assert "cluster:" not in log.getvalue() and "source:" not in log.getvalue()
        assert time.perf_counter() - t0 < 5
        assert not (tmp_path / "out.zarr").exists()
    finally:
        holder.kill()
        holder.wait()
