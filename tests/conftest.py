"""Fixtures shared across the test packages."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import pytest



@contextlib.contextmanager
def file_size_limit(nbytes: int):
    """Writes of this process past ``nbytes`` in a file fail with ``EFBIG`` ("File too
    large"), a real write error as a full disk gives, without root (``RLIMIT_FSIZE``;
    SIGXFSZ ignored, so that the write returns the error instead of killing the process)."""
    import resource

    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def in_process_cluster(**kwargs):
    """A LocalCluster of threads in the test's own process, its workers' sampling
    profiler off (``with in_process_cluster(n_workers=1) as c``).

    The profiler calls ``sys._current_frames()`` every 10 ms. CPython 3.11 holds its
    lock on the list of threads while it builds that dict, and a garbage collection the
    building starts runs ``gc.callbacks`` (hypothesis installs one in every process that
    ran a hypothesis test), which may let go of the GIL; a thread that then takes the GIL
    and starts or ends a thread waits for that lock for ever, and so does everything
    after it. A CI run hung so, in a test writing through such a cluster to a moto
    server (a thread per request)."""
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.worker.profile.enabled": False}):
        return LocalCluster(processes=False, **kwargs)


# inotify(7) event bits: a file created, written and closed, or moved in; a directory.
_IN_CREATE, _IN_CLOSE_WRITE, _IN_MOVED_TO, _IN_Q_OVERFLOW, _IN_ISDIR = 0x100, 0x8, 0x80, 0x4000, 0x40000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then len bytes of name


class _TreeWatch:
    """inotify watches on every directory under ``root``, new ones included (Linux)."""

    def __init__(self, root: Path):
        import ctypes

        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._dirs: dict[int, Path] = {}
        self.add_tree(root)

    def add_tree(self, top: Path) -> None:
        # Directories made before their watch was added are found by this walk; what is
        # written in them afterwards raises an event.
        for d, _, _ in os.walk(top):
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(d), _IN_CREATE | _IN_CLOSE_WRITE | _IN_MOVED_TO)
            if wd >= 0:  # a directory removed meanwhile has nothing to watch
                self._dirs[wd] = Path(d)

    def drain(self) -> None:
        """Read the pending events; watch the directories they report as new."""
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            pos = 0
            while pos < len(data):
                wd, mask, _, n = _EVENT.unpack_from(data, pos)
                name = data[pos + _EVENT.size : pos + _EVENT.size + n].rstrip(b"\0")
                pos += _EVENT.size + n
                if mask & _IN_Q_OVERFLOW:  # events lost: watch the whole tree again
                    for top in set(self._dirs.values()):
                        self.add_tree(top)
                elif mask & _IN_ISDIR and wd in self._dirs:
                    self.add_tree(self._dirs[wd] / os.fsdecode(name))

    def close(self) -> None:
        os.close(self.fd)


def scheduler_address(sched_file: Path) -> str | None:
    """The address in a ``dask scheduler --scheduler-file``, or None while it is not written.

    The scheduler creates the file before it writes the JSON into it, so a watcher can
    see it exist and still empty: only a parsed address says the scheduler is up.
    """
    try:
        return json.loads(sched_file.read_text())["address"]
    except (OSError, ValueError, KeyError):
        return None


def wait_until(condition: Callable[[], bool], *, timeout: float, watch: Path,
               procs: Sequence[subprocess.Popen] = ()) -> bool:
    """Wait until ``condition`` holds or ``timeout`` seconds pass; return whether it held.

    The processes these tests drive (a dask scheduler starting, a run writing chunks
    that is about to be killed) signal nothing but the files they write and their exit.
    So the test blocks until a file under ``watch`` is created or written (inotify) or
    one of ``procs`` exits (its pidfd turns readable), and checks ``condition`` again:
    no fixed sleep, and no polling on a loaded machine. ``condition`` must read only
    files under ``watch`` and the exit of ``procs``.
    """
    deadline = time.monotonic() + timeout
    tree = _TreeWatch(watch)
    pidfds = []
    try:
        for p in procs:
            try:
                pidfds.append(os.pidfd_open(p.pid))
            except ProcessLookupError:  # already reaped: condition() sees its exit
                pass
        while not condition():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready, _, _ = select.select([tree.fd, *pidfds], [], [], left)
            tree.drain()
            for fd in set(ready) & set(pidfds):  # exited: stays readable, wait on files only
                pidfds.remove(fd)
                os.close(fd)
        return True
    finally:
        tree.close()
        for fd in pidfds:
            os.close(fd)


BIN = Path(sys.executable).parent


def small_run_config(tmp_path: Path, *, rows_per_day: int, seed: int, chunk_rows: int) -> Path:
    """Two days of seeded demo order book and a small config over them (output
    ``tmp_path/local.zarr``); returns the YAML file's path."""
    import yaml

    from pipeline.demo import DemoSpec, write_demo_data

    raw = tmp_path / "raw"
    write_demo_data(raw, DemoSpec(days=2, rows_per_day=rows_per_day, seed=seed, formats=("parquet",)))
    cfg = {
        "cluster": {"n_workers": 2, "memory_limit": "1GiB"},
        "source": {"paths": str(raw / "*.parquet"), "timestamp": "timestamp", "chunk_rows": chunk_rows},
        "features": {"steps": ["mid_price", {"name": "imbalance", "levels": 5}, "log_return",
                               {"name": "rolling_std", "window": 10}]},
        "windows": {"size": 16, "stride": 4, "scales": [1, 2]},
        "labels": {"kind": "return", "horizon": 8},
        "output": {"path": str(tmp_path / "local.zarr"), "splits": {"train": 0.8, "val": 0.2},
                   "chunk_samples": 200},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run_cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``pipeline ARGS...`` as a user runs it, output captured."""
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    return subprocess.run([str(BIN / "pipeline"), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def assert_same_store(a: Path, b: Path) -> None:
    """Both stores hold the same splits with equal x and y."""
    import numpy as np

    import pipeline

    sa, sb = pipeline.open(a), pipeline.open(b)
    assert sa.splits == sb.splits
    for split in sa.splits:
        for name in ("x", "y"):
            np.testing.assert_array_equal(sa[split][name][:], sb[split][name][:])


def stop_cluster(procs: list[subprocess.Popen]) -> None:
    """Stop a scheduler (``procs[0]``) and its workers: the workers first, then the scheduler.

    Stopped together, the workers' nannies wait 8 s for worker processes stuck talking
    to a scheduler that is already gone, then SIGKILL them; in this order it takes ~1 s.
    """
    for group in (procs[1:], procs[:1]):
        for p in group:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in group:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def s3():
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    import boto3

    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                 region_name="us-east-1").create_bucket(Bucket="training")
    # A real S3-protocol server on loopback: the storage and loader tests talk to it
    # through s3fs exactly as they would to S3.
    yield {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    server.stop()


#: Attributes that say when or from which files a store was written, not what it holds.
VOLATILE = {"created", "history", "versions", "sources", "rows_read", "config", "fingerprint", "config_hash", "version"}


def assert_bitwise_equal(a: Path, b: Path) -> None:
    """Every array of every split, the shared features and the folds hold the same bytes;
    the attributes are equal but for when and from which files they were written."""
    import numpy as np

    import pipeline
    from pipeline.storage.versions import pinned_array

    da_, db = pipeline.open(a), pipeline.open(b)
    assert da_.splits == db.splits
    for split in db.splits:
        assert sorted(da_[split]) == sorted(db[split])
        for name in db[split]:
            if name.startswith("_"):
                continue
            x, y = da_[split][name], db[split][name]
            assert x.shape == y.shape and x.dtype == y.dtype, (split, name)
            assert np.asarray(x[:]).tobytes() == np.asarray(y[:]).tobytes(), (split, name)
    if "_shared" in db.group:
        x = pinned_array(da_.group["_shared/features"], da_.version.shared_rows)[:]
        assert x.tobytes() == db.group["_shared/features"][:].tobytes()
    assert da_.folds == db.folds
    for fold in db.folds:
        np.testing.assert_array_equal(da_.fold(fold).index, db.fold(fold).index)
    keys = (set(da_.attrs) | set(db.attrs)) - VOLATILE
    assert {k: da_.attrs.get(k) for k in keys} == {k: db.attrs.get(k) for k in keys}
