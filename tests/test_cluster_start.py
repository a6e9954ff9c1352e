"""A LocalCluster's start: workers that cannot start, an interrupt while they start,
and the dashboard line of a cluster started without one. Each case that concerns a
forkserver or distributed's exit handlers runs in a fresh interpreter of its own."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request

import pytest

from pipeline.cluster import cluster


def _python(code: str, *, timeout: float) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter (its output captured), as a script run from a
    file would be: a forkserver's workers import nothing of the test's."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


def test_workers_that_cannot_start_are_one_error_naming_the_nannys_cause():
    """The forkserver's socket gone (as when a user's processes may not start children,
    which refused the connection): the nanny failed to start its worker process, then
    stayed "closing" for good, and distributed's start waited for it forever. The wait
    ends at the nanny's first error, with its cause, and nothing more is printed."""
    result = _python("""
        import multiprocessing.forkserver as fs, os, sys, time
        import pipeline.cluster as pc
        from pipeline.errors import ClusterError
        pc.START_CLOSE_WAIT = 1.0  # the nanny never closes: the test need not wait 10 s
        assert pc.start_worker_server()
        os.unlink(fs._forkserver._forkserver_address)  # the server runs; no one reaches it
        t0 = time.monotonic()
        try:
            with pc.cluster(n_workers=1, timeout=60, log=None):
                print("STARTED")
        except ClusterError as exc:
            print(f"ERROR {time.monotonic() - t0:.1f} {exc}")
    """, timeout=90)
    out = result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("ERROR")]
    assert result.returncode == 0 and lines, out
    took, message = float(lines[0].split()[1]), lines[0].split(" ", 2)[2]
    assert message.startswith("cannot start a LocalCluster: its worker processes could not start "
                              "(the nanny's log: Nanny failed to start process: FileNotFoundError"), out
    assert took < 30, out  # well before the 60 s deadline: at the nanny's error
    assert "Traceback" not in out, out


def test_workers_that_never_answer_are_given_up_after_the_timeout():
    """A forkserver that takes the connection and never forks (stopped here): no error
    to wait for, so the wait ends after ``timeout`` seconds, saying so."""
    result = _python("""
        import multiprocessing.forkserver as fs, os, signal, time
        import pipeline.cluster as pc
        from pipeline.errors import ClusterError
        pc.START_CLOSE_WAIT = 1.0
        assert pc.start_worker_server()
        pid = fs._forkserver._forkserver_pid
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        try:
            with pc.cluster(n_workers=1, timeout=3, log=None):
                print("STARTED")
        except ClusterError as exc:
            print(f"ERROR {time.monotonic() - t0:.1f} {exc}")
        finally:
            os.kill(pid, signal.SIGKILL)
    """, timeout=90)
    out = result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("ERROR")]
    assert lines, out
    took, message = float(lines[0].split()[1]), lines[0].split(" ", 2)[2]
    assert message == ("cannot start a LocalCluster: its worker processes did not start within 3 s, and their "
                       "nannies logged no error"), out
    assert 3 <= took < 20, out


def test_an_interrupt_while_the_workers_start_closes_them_without_a_traceback():
    """A Ctrl-C while the nannies started their workers broke off distributed's start,
    and its close at the process's exit could then fail on a nanny still starting
    (``AssertionError: Status.init``, after the run's own line; a race that this test
    does not force: here the interrupt comes as the worker process is being started,
    every time). The workers started so far are closed before the interrupt goes on."""
    result = _python("""
        import os, signal
        import distributed.nanny as nanny
        from pipeline.cluster import cluster

        start = nanny.WorkerProcess.start

        async def start_interrupted(self):
            signal.raise_signal(signal.SIGINT)  # to the main thread, waiting for the workers
            return await start(self)

        nanny.WorkerProcess.start = start_interrupted
        try:
            with cluster(n_workers=2, log=None):
                print("STARTED")
        except KeyboardInterrupt:
            print("INTERRUPTED")
    """, timeout=90)
    out = result.stdout + result.stderr
    assert result.returncode == 0 and result.stdout.splitlines() == ["INTERRUPTED"], out
    for noise in ("Traceback", "AssertionError", "Exception ignored"):
        assert noise not in out, out


def test_a_local_cluster_without_a_dashboard_prints_no_dashboard_line():
    """``dashboard_address=None`` printed ``dashboard: http://127.0.0.1:8787/status``:
    the scheduler's HTTP server (health, metrics), whose /status is no page."""
    log = io.StringIO()
    with cluster(n_workers=1, processes=False, dashboard_address=None, log=log) as client:
        link = client.dashboard_link  # what distributed names, and was printed
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(link, timeout=30)
    assert missing.value.code == 404
    assert log.getvalue().splitlines()[0] == "cluster: LocalCluster with 1 worker", log.getvalue()
    assert "dashboard" not in log.getvalue(), log.getvalue()
