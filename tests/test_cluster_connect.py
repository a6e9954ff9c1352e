"""Reaching a remote scheduler: every wrong address, scheduler file or TLS file is one
line, and every connection attempt ends within the connect timeout.

A real ``dask scheduler`` and ``dask worker`` run as OS processes on 127.0.0.1, and tiny
socket servers play the things a wrong address reaches instead: a server that accepts
and never answers (the dashboard's port waits for an HTTP request), one that answers in
another protocol (an HTTP proxy), and one that closes at once. Each used to hang
``pipeline run`` forever, or end in a traceback.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from pipeline.cluster import check_address, cluster, scheduler_file_address
from pipeline.errors import ClusterError, ConfigError
from tests.conftest import free_port, in_process_cluster, scheduler_address, stop_cluster, wait_until
from tests.test_cluster_tls import make_tls_files

BIN = Path(sys.executable).parent
#: Short enough to keep each test fast, long enough for a loaded 2-core machine.
TIMEOUT = 2.0


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A tcp:// scheduler (its dashboard on a known port) and one worker, as OS processes.

    Yields the scheduler's address, its dashboard's port, the worker's address and the
    scheduler file.
    """
    tmp_path = tmp_path_factory.mktemp("plain_cluster")
    sched_file = tmp_path / "scheduler.json"
    dashboard = free_port()
    procs = [subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", f"127.0.0.1:{dashboard}", "--scheduler-file", str(sched_file)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )]
    try:
        assert wait_until(lambda: scheduler_address(sched_file) is not None, timeout=60, watch=tmp_path,
                          procs=procs), "the scheduler did not start"
        address = scheduler_address(sched_file)
        procs.append(subprocess.Popen(
            [str(BIN / "dask"), "worker", address, "--nthreads", "1", "--memory-limit", "1GiB", "--host", "127.0.0.1",
             "--no-dashboard", "--no-nanny", "--local-directory", str(tmp_path / "w")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
        from distributed import Client

        with Client(address, timeout=30) as c:
            c.wait_for_workers(1, timeout=60)
            (worker,) = c.scheduler_info()["workers"]
        yield address, dashboard, worker, sched_file
    finally:
        stop_cluster(procs)


class _Server:
    """A TCP server on 127.0.0.1 that does ``reply`` with every connection it accepts:
    ``"silent"`` holds it open and says nothing, ``"http"`` answers an HTTP error and
    holds it open, ``"close"`` closes it at once."""

    def __init__(self, reply: str):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.reply, self.held = reply, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            if self.reply == "close":
                conn.close()
                continue
            if self.reply == "http":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture()
def server(request):
    s = _Server(request.param)
    yield s
    s.close()


def _io_loops() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "IO loop"}


# -- addresses, checked before anything connects ----------------------------------------

@pytest.mark.parametrize("address", ["tcp://10.0.0.5:8786", "tls://scheduler:8786", "127.0.0.1:8786",
                                     "tcp://[::1]:8786", "ws://host:80", "tcp://host:1", "tcp://host:65535",
                                     "inproc://192.0.2.2/1621/31"])
def test_addresses_distributed_can_reach_are_kept(address):
    assert check_address(address) == address


@pytest.mark.parametrize("address, says", [
    ("http://127.0.0.1:8787", r"is a web address \(the dashboard's.*tcp://127\.0\.0\.1:8786"),
    ("https://dask.example.org/status", r"is a web address.*tcp://dask\.example\.org:8786"),
    ("tcp://127.0.0.1", r"has no port: a scheduler listens on tcp://127\.0\.0\.1:8786 by default"),
    ("tcp://127.0.0.1:99999", r"port 99999 is out of range \(1-65535\)"),
    ("tcp://127.0.0.1:0", r"port 0 is out of range"),
    ("tcp://:8786", r"has no host"),
    ("tcp://host:port", r"is not tcp://host:port"),
    ("tcp://::1:8786", r"an IPv6 host goes in brackets"),
    ("ucx://127.0.0.1:8786", r"distributed no longer supports ucx://"),
    ("ftp://host:21", r"unknown scheme ftp://; expected tcp://host:port or tls://host:port"),
])
def test_an_address_distributed_cannot_reach_is_refused_naming_the_key(address, says):
    loops = _io_loops()
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=says) as err:
        with cluster(address, timeout=30, log=None):
            pass
    assert time.monotonic() - t0 < 5  # not the 30 s of distributed's retries
    assert str(err.value).startswith(f"cluster.address: {address!r}")
    assert "\n" not in str(err.value) and _io_loops() <= loops  # one line, and no Client was started


# -- what a wrong address reaches -------------------------------------------------------

def test_the_scheduler_and_only_it_is_connected_to(plain):
    address, _, worker, _ = plain
    with cluster(address, timeout=TIMEOUT, log=None) as client:
        assert client.submit(sum, [1, 2, 3]).result() == 6
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=re.escape(f"{worker} is a dask worker, not the scheduler")):
        with cluster(worker, timeout=TIMEOUT, log=None):
            pass
    assert time.monotonic() - t0 < TIMEOUT + 3


def test_a_scheduler_in_this_process_is_reached_through_its_inproc_address():
    with in_process_cluster(n_workers=1, dashboard_address=None) as local:
        assert local.scheduler_address.startswith("inproc://")
        with cluster(local.scheduler_address, timeout=TIMEOUT, log=None) as client:
            assert client.submit(sum, [1, 2]).result() == 3


def test_the_dashboards_port_is_named_within_the_timeout(plain):
    """The dashboard (tornado's HTTP server) accepts the connection and waits for a
    request that never comes: distributed waited for its handshake forever."""
    _, dashboard, _, _ = plain
    address = f"tcp://127.0.0.1:{dashboard}"
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=re.escape(
            f"no dask scheduler answered at {address} within {TIMEOUT:g} s") + ".*is it the dashboard's port\\? "
            "the scheduler listens on 8786 by default"):
        with cluster(address, timeout=TIMEOUT, log=None):
            pass
    assert TIMEOUT - 0.5 < time.monotonic() - t0 < TIMEOUT + 3


@pytest.mark.parametrize("server, says", [
    ("silent", r"within 2 s: the connection opened, but nothing answered \(is it the dashboard's port\?"),
    ("http", r"something answered, but not in dask's protocol \(a web server or proxy\?"),
    ("close", r"the connection was closed without a dask handshake \(is it a tls:// scheduler\? then use tls://"),
], indirect=["server"])
def test_a_server_that_is_not_a_scheduler_is_named_within_the_timeout(server, says):
    if server.reply == "http":
        # The reply's first 8 bytes, read by dask as a frame's length, ask for exabytes:
        # what ended the trial in numpy's ArrayMemoryError.
        assert struct.unpack("<Q", b"HTTP/1.1")[0] > 2**60
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=re.escape(f"no dask scheduler answered at {server.address}") + ".*" + says):
        with cluster(server.address, timeout=TIMEOUT, log=None):
            pass
    assert time.monotonic() - t0 < TIMEOUT + 3


def test_nothing_listening_is_named():
    address = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(ClusterError, match=re.escape(f"nothing listens at {address} (connection refused")):
        with cluster(address, timeout=1, log=None):
            pass


def test_a_tls_address_at_a_plain_scheduler_says_so(plain, tmp_path):
    address, *_ = plain
    tls = make_tls_files(tmp_path / "tls")
    as_tls = address.replace("tcp://", "tls://")
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=re.escape(
            f"cannot reach {as_tls}: the scheduler did not complete a TLS handshake (is it a tcp:// scheduler? "
            f"then its address is {address})")):
        with cluster(as_tls, timeout=TIMEOUT, log=None, tls_ca_file=str(tls.ca_file), tls_cert_file=str(tls.cert_file),
                     tls_key_file=str(tls.key_file)):
            pass
    assert time.monotonic() - t0 < TIMEOUT + 3


# -- TLS files, checked before anything connects ----------------------------------------

def _tls(tls, **changed) -> dict[str, str]:
    files = {"tls_ca_file": str(tls.ca_file), "tls_cert_file": str(tls.cert_file), "tls_key_file": str(tls.key_file)}
    return {**files, **changed}


@pytest.mark.parametrize("key", ["tls_ca_file", "tls_cert_file", "tls_key_file"])
def test_a_missing_tls_file_is_named_with_its_key(tmp_path, key):
    tls = make_tls_files(tmp_path / "tls")
    typo = str(tmp_path / "tls" / "clinet.pem")
    loops = _io_loops()
    with pytest.raises(ConfigError, match=rf"^cluster\.{key}: {re.escape(typo)}: no such file$"):
        with cluster("tls://127.0.0.1:8786", timeout=30, log=None, **_tls(tls, **{key: typo})):
            pass
    assert _io_loops() <= loops


def test_a_tls_file_that_is_not_pem_or_a_key_of_another_certificate_is_named(tmp_path):
    tls, other = make_tls_files(tmp_path / "tls"), make_tls_files(tmp_path / "other")
    (tmp_path / "notes.txt").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=rf"^cluster\.tls_ca_file: {re.escape(str(tmp_path / 'notes.txt'))}: "
                                          r"not a PEM CA certificate"):
        with cluster("tls://127.0.0.1:8786", log=None, **_tls(tls, tls_ca_file=str(tmp_path / "notes.txt"))):
            pass
    with pytest.raises(ConfigError, match=rf"^cluster\.tls_cert_file: {re.escape(str(tls.cert_file))} with "
                                          rf"cluster\.tls_key_file {re.escape(str(other.key_file))}: cannot load"):
        with cluster("tls://127.0.0.1:8786", log=None, **_tls(tls, tls_key_file=str(other.key_file))):
            pass


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_an_unreadable_tls_file_is_named(tmp_path):
    tls = make_tls_files(tmp_path / "tls")
    tls.key_file.chmod(0)
    with pytest.raises(ConfigError, match=rf"^cluster\.tls_key_file: .*key\.pem: cannot be read"):
        with cluster("tls://127.0.0.1:8786", log=None, **_tls(tls)):
            pass


def test_tls_files_with_a_plain_address_are_refused(tmp_path):
    tls = make_tls_files(tmp_path / "tls")
    with pytest.raises(ConfigError, match=r"^cluster\.address: 'tcp://127\.0\.0\.1:8786' is unencrypted, but "
                                          r"cluster\.tls_\* files are set.*tls://127\.0\.0\.1:8786"):
        with cluster("tcp://127.0.0.1:8786", log=None, **_tls(tls)):
            pass


# -- scheduler files --------------------------------------------------------------------

def test_a_missing_scheduler_file_is_refused_after_the_timeout(tmp_path):
    """distributed's Client waited for it forever, without a word."""
    path = tmp_path / "schedulre.json"
    log = io.StringIO()
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=rf"^cluster\.scheduler_file: {re.escape(str(path))}: no such file \(waited "
                                          r"1 s for a scheduler to write it"):
        with cluster(scheduler_file=str(path), timeout=1, log=log):
            pass
    assert 1 <= time.monotonic() - t0 < 4
    assert log.getvalue() == f"cluster: waiting up to 1 s for a scheduler to write {path} (cluster.scheduler_file)\n"


def test_a_scheduler_file_in_a_missing_folder_is_refused_at_once(tmp_path):
    path = tmp_path / "no" / "scheduler.json"
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=rf"^cluster\.scheduler_file: {re.escape(str(path))}: no such file, and no "
                                          rf"folder {re.escape(str(path.parent))}"):
        with cluster(scheduler_file=str(path), timeout=30, log=None):
            pass
    assert time.monotonic() - t0 < 2


def test_a_file_that_is_not_a_scheduler_file_is_refused(tmp_path):
    path = tmp_path / "scheduler.json"
    path.write_text(json.dumps({"type": "Scheduler"}))
    with pytest.raises(ConfigError, match=r'not a scheduler file \(expected JSON with an "address"\)'):
        scheduler_file_address(str(path), timeout=0.2)


def test_a_scheduler_file_written_while_the_run_waits_is_used(plain, tmp_path):
    """A scheduler and a run started together: the file appears a moment later."""
    address, _, _, sched_file = plain
    late = tmp_path / "late.json"
    writer = threading.Timer(0.5, lambda: late.write_text(Path(sched_file).read_text()))
    writer.start()
    try:
        with cluster(scheduler_file=str(late), timeout=10, log=None) as client:
            assert client.scheduler.address == address
            assert client.submit(sum, [4, 5]).result() == 9
    finally:
        writer.cancel()


def test_a_stale_scheduler_file_names_the_file(tmp_path):
    path = tmp_path / "scheduler.json"
    address = f"tcp://127.0.0.1:{free_port()}"  # a scheduler that has stopped
    path.write_text(json.dumps({"address": address, "type": "Scheduler"}))
    with pytest.raises(ClusterError, match=re.escape(f"nothing listens at {address} (from cluster.scheduler_file "
                                                     f"{path})")):
        with cluster(scheduler_file=str(path), timeout=1, log=None):
            pass
    path.write_text(json.dumps({"address": "http://127.0.0.1:8787"}))
    with pytest.raises(ConfigError, match=r"^cluster\.scheduler_file: 'http://127\.0\.0\.1:8787' is a web address"):
        with cluster(scheduler_file=str(path), timeout=1, log=None):
            pass


def _fingerprint_of(root: Path) -> str:
    """pipeline's version and a hash of its .py files, read independently of pipeline."""
    import hashlib

    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    version = re.search(r'__version__ = "([^"]+)"', (root / "__init__.py").read_text()).group(1)
    return f"{version}+{digest.hexdigest()[:12]}"


def test_workers_running_other_pipeline_code_are_named(plain, tmp_path):
    """A worker whose image was not rebuilt runs the old code: refused when the client
    connects, naming that worker and both fingerprints (the other worker is not named)."""
    import shutil

    import pipeline

    address, _, worker, _ = plain
    here = Path(pipeline.__file__).parent
    shutil.copytree(here, tmp_path / "old" / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "old" / "pipeline" / "errors.py", "a") as fh:
        fh.write("# an older build\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "old")}
    old = subprocess.Popen(
        [str(BIN / "dask"), "worker", address, "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard",
         "--no-nanny", "--name", "old-image", "--local-directory", str(tmp_path / "w")],
        cwd=tmp_path / "old", env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from distributed import Client

    try:
        with Client(address, timeout=30) as c:
            c.wait_for_workers(2, timeout=60)
            (old_worker,) = set(c.scheduler_info()["workers"]) - {worker}
        mine, theirs = _fingerprint_of(here), _fingerprint_of(tmp_path / "old" / "pipeline")
        assert mine != theirs
        with pytest.raises(ClusterError) as err:
            with cluster(address, timeout=TIMEOUT, log=None):
                pass
        msg = str(err.value)
        assert "\n" not in msg and f"(pipeline {mine})" in msg and f"{old_worker}: pipeline {theirs}" in msg
        assert f"{worker}:" not in msg
    finally:
        old.terminate()
        old.wait(timeout=30)
        with Client(address, timeout=30) as c:
            assert wait_until(lambda: len(c.scheduler_info()["workers"]) == 1, timeout=30, watch=tmp_path)
    with cluster(address, timeout=TIMEOUT, log=None) as client:  # the same code everywhere: connected
        assert client.submit(sum, [1, 2]).result() == 3


_LOST = """
import sys, threading
from pipeline.cluster import cluster
from pipeline.errors import PipelineError
from pipeline.remote import remote_errors_explained

def task(marker):  # says it runs on the worker, then outlives the scheduler
    open(marker, "w").close()
    threading.Event().wait(60)

try:
    with remote_errors_explained(sys.argv[3], remote=True):
        with cluster(sys.argv[1], timeout=2, log=None) as client:
            future = client.submit(task, sys.argv[2])
            print("submitted", flush=True)
            future.result()
except PipelineError as exc:
    print(f"pipeline run: {exc}", file=sys.stderr)
    sys.exit(1)
"""


def test_a_scheduler_lost_before_the_store_was_begun_calls_no_store_incomplete(tmp_path):
    from distributed.comm.core import CommClosedError

    from pipeline.errors import ClusterError
    from pipeline.remote import remote_errors_explained

    with pytest.raises(ClusterError, match=r"^the connection to the dask scheduler was lost before anything of "
                                           r".*none\.zarr was written; once the scheduler is back, rerun the same "
                                           r"command$"):
        with remote_errors_explained(str(tmp_path / "none.zarr"), remote=True):
            raise CommClosedError("in <TCP (closed)>: Stream is closed")
    assert not (tmp_path / "none.zarr").exists()


def test_a_scheduler_lost_mid_run_is_one_line_saying_the_rerun_resumes(tmp_path):
    sched_file = tmp_path / "s.json"
    procs = [subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
         "--scheduler-file", str(sched_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        assert wait_until(lambda: scheduler_address(sched_file) is not None, timeout=60, watch=tmp_path, procs=procs)
        address = scheduler_address(sched_file)
        procs.append(subprocess.Popen(
            [str(BIN / "dask"), "worker", address, "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard",
             "--no-nanny", "--local-directory", str(tmp_path / "w")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(address, timeout=30) as c:
            c.wait_for_workers(1, timeout=60)
        marker = tmp_path / "task-started"
        store = tmp_path / "out.zarr"
        store.mkdir()
        (store / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')  # a write begun
        run = subprocess.Popen([sys.executable, "-c", _LOST, address, str(marker), str(store)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert run.stdout.readline().strip() == "submitted"
        assert wait_until(marker.exists, timeout=60, watch=tmp_path, procs=[run])  # the task runs
        procs[0].kill()  # the scheduler dies, as a SIGKILL or a lost node does
        _, err = run.communicate(timeout=60)
        assert run.returncode == 1
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert f"connection to the dask scheduler was lost while writing {store}" in err
        assert "incomplete" in err and "rerun the same command to resume it" in err
    finally:
        for p in procs:  # a worker whose scheduler is gone would wait for it to close
            p.kill()
            p.wait()


def test_workers_without_s3_credentials_are_named_not_the_client(plain):
    """botocore's NoCredentialsError, raised in a task on a worker, is one line naming
    the output URL and the workers."""
    from pipeline.remote import remote_errors_explained

    address, *_ = plain

    def write_chunk() -> None:  # a local function: shipped by value, the worker imports no test module
        from botocore.exceptions import NoCredentialsError

        raise NoCredentialsError()

    with pytest.raises(ClusterError) as err:
        with remote_errors_explained("s3://bucket/set.zarr", sources=("data/raw/*.parquet",), remote=True):
            with cluster(address, timeout=TIMEOUT, log=None) as client:
                client.submit(write_chunk).result()
    msg = str(err.value)
    assert msg.startswith("s3://bucket/set.zarr (output): the workers could not find S3 credentials")
    assert "this client has them" in msg and "\n" not in msg


def test_workers_that_cannot_see_the_output_folder_or_a_raw_file_are_named(plain, tmp_path):
    from pipeline.remote import check_workers_see

    address, _, worker, _ = plain
    raw = tmp_path / "a.parquet"
    raw.write_bytes(b"x")
    # What the client has and a worker does not: here, a path that exists nowhere.
    hidden = "/nonexistent-client-disk/out.zarr"
    with cluster(address, timeout=TIMEOUT, log=None) as client:
        check_workers_see(client, store=str(tmp_path / "out.zarr"), marker=str(raw), files=[str(raw)])
        with pytest.raises(ClusterError, match=re.escape(
                f"{hidden}: the workers {worker} cannot see this output folder (/nonexistent-client-disk is a "
                f"local path of this client's machine)")):
            check_workers_see(client, store=hidden, marker=hidden + ".lock", files=[str(raw)])
        with pytest.raises(ClusterError, match=re.escape(
                f"/nonexistent-client-disk/b.parquet: the workers {worker} cannot see this raw file")):
            check_workers_see(client, store=str(tmp_path / "out.zarr"), marker=None,
                              files=[str(raw), "/nonexistent-client-disk/b.parquet"])


def test_a_remote_scheduler_without_workers_yet_is_said_to_wait_for_them(monkeypatch):
    """"with 0 workers" read as a cluster that would never compute, while its workers
    were still starting: the announcement waits (bounded) for the first, and says so
    when none has come."""
    import pipeline.cluster

    monkeypatch.setattr(pipeline.cluster, "FIRST_WORKER_WAIT", 0.3)
    with in_process_cluster(n_workers=0, dashboard_address=None) as local:
        log = io.StringIO()
        t0 = time.monotonic()
        with cluster(local.scheduler_address, timeout=TIMEOUT, log=log, paused_after=None) as client:
            assert client.scheduler_info()["workers"] == {}
        assert time.monotonic() - t0 < TIMEOUT + 5
    assert log.getvalue().splitlines()[0] == (
        f"cluster: scheduler {local.scheduler_address} with 0 workers yet; waiting for workers (the tasks start "
        f"when one joins)")


def test_a_worker_that_joins_while_the_run_connects_is_counted(monkeypatch):
    import pipeline.cluster

    monkeypatch.setattr(pipeline.cluster, "FIRST_WORKER_WAIT", 30.0)
    with in_process_cluster(n_workers=0, dashboard_address=None) as local:
        joins = threading.Timer(1.0, local.scale, args=(1,))
        log = io.StringIO()
        joins.start()
        try:
            with cluster(local.scheduler_address, timeout=TIMEOUT, log=log, paused_after=None) as client:
                assert len(client.scheduler_info()["workers"]) == 1
        finally:
            joins.join()
    assert log.getvalue().splitlines()[0] == f"cluster: scheduler {local.scheduler_address} with 1 worker"


@pytest.fixture()
def stale_worker(tmp_path):
    """A scheduler, one worker that sees the client's ``raw`` folder, and one that sees,
    at the same path, an old copy where ``raw/d13.parquet`` holds other bytes (its own
    mount namespace: a tmpfs over ``raw``, as a stale NFS cache or a node's own copy).

    Yields the scheduler's address, the raw files, the stale worker's address and the
    stale copy of ``d13.parquet``.
    """
    if os.geteuid() != 0:
        pytest.skip("needs root (unshare -m) to give one worker its own view of a folder")
    raw, old = tmp_path / "raw", tmp_path / "old"
    raw.mkdir()
    old.mkdir()
    rng = np.random.default_rng(0)
    files = []
    for i in range(20):
        f = raw / f"d{i:02d}.parquet"
        f.write_bytes(rng.bytes(1000 + i))
        (old / f.name).write_bytes(f.read_bytes())
        files.append(str(f))
    (old / "d13.parquet").write_bytes(rng.bytes(900))  # the stale copy: another day's bytes, another size
    sched_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
         "--scheduler-file", str(sched_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        assert wait_until(lambda: scheduler_address(sched_file) is not None, timeout=60, watch=tmp_path,
                          procs=procs), "the scheduler did not start"
        address = scheduler_address(sched_file)
        worker = [str(BIN / "dask"), "worker", address, "--nthreads", "1", "--memory-limit", "512MiB",
                  "--host", "127.0.0.1", "--no-dashboard", "--no-nanny", "--name"]
        procs.append(subprocess.Popen(worker + ["fresh"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        procs.append(subprocess.Popen(
            ["unshare", "-m", "sh", "-c", f'mount -t tmpfs none {raw} && cp {old}/* {raw}/ && exec "$0" "$@"',
             *worker, "stale"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client

        with Client(address, timeout=30) as c:
            c.wait_for_workers(2, timeout=60)
            stale = next(a for a, w in c.scheduler_info()["workers"].items() if w["name"] == "stale")
        yield address, files, stale, old / "d13.parquet"
    finally:
        stop_cluster(procs)


def test_a_worker_that_sees_another_file_at_the_same_path_is_refused_naming_both_sizes(stale_worker, tmp_path):
    """A worker with a stale copy wrote a wrong store, marked complete; now the check
    before any task compares every file's size as each worker sees it with the client's."""
    from pipeline.remote import check_workers_see

    address, files, stale, old = stale_worker
    client_size, worker_size = os.path.getsize(files[13]), os.path.getsize(old)  # the reference: plain os.stat
    assert client_size != worker_size
    with cluster(address, timeout=TIMEOUT, log=None) as client:
        with pytest.raises(ClusterError) as err:
            check_workers_see(client, store=str(tmp_path / "out.zarr"), marker=None, files=files)
        # The files a worker sees alike pass, whatever their modification times.
        check_workers_see(client, store=str(tmp_path / "out.zarr"), marker=None, files=files[:13] + files[14:])
    msg = str(err.value)
    assert msg.startswith(f"{files[13]}: the worker {stale} sees {worker_size:,} bytes at this path"), msg
    assert f"this client {client_size:,}" in msg and "stale copy" in msg and "\n" not in msg


def test_checking_what_the_workers_see_is_one_call_per_worker_and_cheap_for_thousands_of_files(plain, tmp_path):
    from pipeline.remote import check_workers_see

    address, *_ = plain
    folder = tmp_path / "many"
    folder.mkdir()
    files = []
    for i in range(5000):
        (folder / f"{i:05d}.csv").write_bytes(b"x" * (i % 97))
        files.append(str(folder / f"{i:05d}.csv"))
    with cluster(address, timeout=TIMEOUT, log=None) as client:
        t0 = time.perf_counter()
        check_workers_see(client, store=str(tmp_path / "out.zarr"), marker=None, files=files)
        seconds = time.perf_counter() - t0
    assert seconds < 5, seconds  # measured: well under a second on the shared 2-core machine
