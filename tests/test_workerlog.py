"""A LocalCluster's workers do not dump the package's own errors before the client's
one-line report; any other exception (a bug, a user hook's) is still logged whole."""

from __future__ import annotations

import logging
import re
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline import errors
from pipeline.workerlog import _OwnErrors, own_error_names

BIN = Path(sys.executable).parent
COLUMNS = [f"{side}_{kind}_{level}" for side in ("bid", "ask") for kind in ("price", "size") for level in (1, 2)]


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, msg, args, None)


def test_every_error_class_of_the_package_is_named():
    declared = {name for name, obj in vars(errors).items()
                if isinstance(obj, type) and issubclass(obj, errors.PipelineError)}
    assert declared and declared <= own_error_names()


@pytest.mark.parametrize("exception, kept", [
    ('LoaderError("/data/day2.csv: line 7 goes back in time")', False),
    ("CorruptChunkError('train/x chunk 3')", False),
    ("ZeroDivisionError('division by zero')", True),
    ("ValueError('LoaderError(inside a message)')", True),
])
def test_compute_failed_records_are_dropped_for_own_errors_only(exception, kept):
    failed = _record("Compute Failed\nKey: %s\nState: %s\nTask: %s\nException: %r\nTraceback: %r\n",
                     "k", "executing", "<Task>", exception, "tb")
    assert _OwnErrors().filter(failed) is kept
    assert _OwnErrors().filter(_record("Worker stopped: %s", "LoaderError('x')"))  # other records kept


def test_only_a_task_cancelled_as_the_worker_closes_is_left_out_of_its_log():
    from pipeline.workerlog import _CancelledAtClose

    quiet = _CancelledAtClose()
    # distributed formats the task into the message itself (an f-string)
    assert not quiet.filter(_record('Async instruction for <Task cancelled name="execute((\'read-table-8c\', 1, 0))" '
                                    'coro=<Worker.execute() done>> ended with CancelledError'))
    assert quiet.filter(_record("Async instruction for %s ended with %r", "<Task>", "ValueError('x')"))
    assert quiet.filter(_record("Compute Failed\nKey: %s", "k"))


def _day(path: Path, start_ns: int, n: int, swap: int | None = None) -> None:
    rng = np.random.default_rng(n)
    t = start_ns + np.arange(n, dtype=np.int64) * 10**9
    if swap is not None:
        t[[swap, swap + 1]] = t[[swap + 1, swap]]
    cols = {c: 100 + rng.random(n) for c in COLUMNS}
    lines = [",".join(["timestamp", *COLUMNS])]
    lines += [",".join([str(t[i]), *(f"{cols[c][i]:.4f}" for c in COLUMNS)]) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")


def _run(tmp_path: Path, steps: list, swap: int | None, *, rows: int = 400,
         output: Path | None = None) -> subprocess.CompletedProcess:
    raw = tmp_path / "raw"
    raw.mkdir()
    _day(raw / "day1.csv", 1_767_605_400 * 10**9, rows)
    _day(raw / "day2.csv", 1_767_691_800 * 10**9, rows, swap=swap)
    cfg = {"cluster": {"n_workers": 1, "threads_per_worker": 1, "memory_limit": "1GiB"},
           "source": {"paths": str(raw / "*.csv"), "timestamp": "timestamp", "sessions": "file"},
           "features": {"steps": steps}, "windows": {"size": 8, "stride": 1},
           "labels": {"kind": "return", "horizon": 5},
           "output": {"path": str(output or tmp_path / "out.zarr"), "splits": {"train": 0.8, "test": 0.2}}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run([str(BIN / "pipeline"), "run", str(tmp_path / "cfg.yaml"), "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=240)


def test_a_run_reports_a_refused_file_once(tmp_path):
    done = _run(tmp_path, ["mid_price", "spread"], swap=200)
    assert done.returncode == 1
    assert "Compute Failed" not in done.stderr, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("pipeline run:")]
    assert "day2.csv" in line and "line 203" in line, line
    assert not (tmp_path / "out.zarr" / "train").exists()


#: How distributed formats the traceback of a write task's OSError (the fifth argument),
#: and of a raw file's read that failed with one.
_WRITE_TB = ('  File "/site/pipeline/storage/units.py", line 307, in _write_made\n    count = write(...)\n'
             '  File "/site/zarr/storage/_local.py", line 60, in _put\n    f.write(value)\n')
_READ_TB = '  File "/site/pipeline/loaders/tables.py", line 80, in read_part\n    with open(path) as fh:\n'
#: A block made and written a unit at a time.
_UNITS_TB = _WRITE_TB.replace("in _write_made\n", "in _write_made_units\n")


@pytest.mark.parametrize("exception, traceback_text, kept", [
    ("OSError(28, 'No space left on device')", _WRITE_TB, False),
    ("PermissionError(13, 'Permission denied')", _WRITE_TB, False),
    ("OSError(28, 'No space left on device')", _UNITS_TB, False),
    ("FileNotFoundError(2, 'No such file or directory')", _READ_TB, True),  # not the writer's: kept whole
    ("ValueError('bad')", _WRITE_TB, True),  # a bug in the writer: kept whole
])
def test_an_os_error_of_a_write_task_is_dropped_as_the_writer_reports_it(exception, traceback_text, kept):
    failed = _record("Compute Failed\nKey: %s\nState: %s\nTask: %s\nException: %r\nTraceback: %r\n",
                     "('write-units-train-1', 1)", "executing", "<Task>", exception, traceback_text)
    assert _OwnErrors().filter(failed) is kept


def test_a_full_disk_under_a_local_cluster_is_one_line_without_a_workers_traceback(tmp_path):
    mount = Path("/tmp") / f"pipeline-full-{os.getpid()}-{tmp_path.name}"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                      capture_output=True).returncode:
        mount.rmdir()
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        done = _run(tmp_path, ["mid_price", "spread"], swap=None, rows=12_000, output=mount / "out.zarr")
    finally:
        subprocess.run(["umount", str(mount)], check=False)
        mount.rmdir()
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Compute Failed" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("pipeline run:")]
    assert "cannot write (No space left on device)" in line, line


def test_a_bug_in_a_users_feature_is_still_logged_whole(tmp_path):
    (tmp_path / "userhook.py").write_text(textwrap.dedent("""
        def broken(block, columns):
            return 1 / 0
    """))
    done = _run(tmp_path, ["mid_price", {"name": "custom", "function": "userhook:broken"}], swap=None)
    assert done.returncode != 0
    assert "Compute Failed" in done.stderr and "ZeroDivisionError" in done.stderr, done.stderr[-3000:]


def _raised_in(name: str, exc: BaseException) -> logging.LogRecord:
    """A record of ``exc`` raised inside a function called ``name``, as log_errors makes it."""
    def raiser() -> None:
        raise exc

    code = compile(f"def {name}(f):\n    f()\n", "<scheduler>", "exec")
    scope: dict = {}
    exec(code, scope)
    try:
        scope[name](raiser)
    except BaseException as caught:  # noqa: BLE001
        return logging.LogRecord("distributed.scheduler", logging.ERROR, __file__, 1, "", (),
                                 (type(caught), caught, caught.__traceback__))
    raise AssertionError("not raised")


def test_only_a_cancelled_feed_is_left_out_of_the_schedulers_log():
    import asyncio

    from pipeline.workerlog import _CancelledFeed

    quiet = _CancelledFeed()
    assert not quiet.filter(_raised_in("feed", asyncio.CancelledError()))
    assert quiet.filter(_raised_in("handle_worker", asyncio.CancelledError()))  # another handler: kept
    assert quiet.filter(_raised_in("feed", RuntimeError("a real error")))  # a feed's real error: kept
    assert quiet.filter(logging.LogRecord("distributed.scheduler", logging.ERROR, __file__, 1, "plain", (), None))


def test_closing_a_cluster_right_after_a_progress_bar_logs_no_error(capsys):
    import dask.array as da

    from pipeline.cluster import cluster
    from pipeline.progress import compute

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(logging.ERROR)
    logger = logging.getLogger("distributed.scheduler")
    logger.addHandler(keep)
    try:
        for _ in range(3):  # the feed is cancelled when the cluster closes within its 100 ms wait
            with cluster(n_workers=1, threads_per_worker=1, memory_limit="512MiB", log=None):
                (total,) = compute(da.ones(1000, chunks=100).sum(), desc="sum", progress=True)
                assert total == 1000
    finally:
        logger.removeHandler(keep)
    # Filters of a logger drop a record before its handlers see it.
    assert [r.getMessage() for r in records] == []
    assert "CancelledError" not in capsys.readouterr().err


def _sigint_handler() -> str:
    import signal

    return repr(signal.getsignal(signal.SIGINT))


@pytest.mark.parametrize("method", [None, "fork"])
def test_the_workers_of_a_local_cluster_ignore_ctrl_c(method):
    """A terminal's Ctrl-C reaches the workers too (the process group): they printed their
    KeyboardInterrupt tracebacks and died, where the process holding the cluster closes
    them. Forked from the worker server they ignore it from their start; forked from
    this process (the ``fork`` method), once set up (IgnoreInterrupts). A worker that is
    a thread leaves this process's Ctrl-C alone."""
    import signal

    import dask

    from pipeline.cluster import cluster

    chosen = {"distributed.worker.multiprocessing-method": method} if method else {}
    # 4 GiB: a forked worker's resident memory starts as this process's (under xdist,
    # with torch imported, over 800 MiB), which a smaller limit refuses as paused.
    with dask.config.set(chosen), cluster(n_workers=1, memory_limit="4GiB", log=None) as client:
        handlers = client.run(_sigint_handler)
    assert list(handlers.values()) == [repr(signal.SIG_IGN)]
    with cluster(n_workers=1, processes=False, log=None) as client:
        assert list(client.run(_sigint_handler).values()) == [repr(signal.default_int_handler)]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


# -- a worker killed at its memory limit, a LocalCluster that cannot run a task, a heartbeat at close


def _book(path: Path, rows: int, *, row_group: int) -> None:
    """A 10-level order book in Parquet, uncompressed, ``row_group`` rows per row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    mid = 100 + np.cumsum(rng.choice([-0.01, 0, 0.01], size=rows))
    cols = {"timestamp": pa.array(np.datetime64("2026-01-05T09:30", "ns").astype(np.int64)
                                  + np.arange(rows) * 5_000_000, type=pa.timestamp("ns"))}
    for side, sign in (("bid", -1), ("ask", 1)):
        for level in range(1, 11):
            cols[f"{side}_price_{level}"] = np.round(mid + sign * 0.01 * level, 2)
            cols[f"{side}_size_{level}"] = rng.integers(1, 1000, rows).astype(np.int32)
    pq.write_table(pa.table(cols), path, row_group_size=row_group, compression="none", use_dictionary=False)


def _run_config(tmp_path: Path, cfg: dict, name: str = "cfg.yaml") -> subprocess.CompletedProcess:
    (tmp_path / name).write_text(yaml.safe_dump(cfg))
    # One death per task, not distributed's four: the same message, four times sooner.
    env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"}
    return subprocess.run([str(BIN / "pipeline"), "run", str(tmp_path / name), "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=240)


def _one_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "KilledWorker" not in done.stderr, done.stderr[-3000:]
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("pipeline run:")]
    return line


def test_a_local_cluster_whose_idle_worker_is_over_its_pause_limit_is_refused_before_any_work(tmp_path):
    raw = tmp_path / "day.parquet"
    _book(raw, 2_000, row_group=2_000)
    cfg = {"cluster": {"n_workers": 1, "threads_per_worker": 1, "memory_limit": "64MiB"},
           "source": {"paths": str(raw), "timestamp": "timestamp"},
           "features": {"steps": ["mid_price"]}, "windows": {"size": 4},
           "labels": {"kind": "return", "horizon": 2},
           "output": {"path": str(tmp_path / "out.zarr"), "splits": {"train": 1.0}}}
    line = _one_line(_run_config(tmp_path, cfg))
    found = re.search(r"holds ([\d,]+) MiB of its 64 MiB memory limit \(dask pauses a worker at (\d+)% of it\) as it "
                      r"starts, before any task", line)
    assert found, line
    assert int(found[1].replace(",", "")) >= int(found[2]) / 100 * 64
    assert "Set cluster.memory_limit to at least" in line
    assert not (tmp_path / "out.zarr").exists() and not (tmp_path / "out.zarr.lock").exists()


def test_a_heartbeat_whose_connection_the_closing_scheduler_closed_is_not_logged():
    """The record distributed's worker logs when its heartbeat's connection is closed
    under it (as a LocalCluster's scheduler does when it closes), made by a real
    worker's heartbeat to a peer that closes the connection, is dropped; one that fails
    otherwise while the worker runs is kept."""
    import asyncio

    import dask
    from distributed import Scheduler, Worker

    from pipeline.workerlog import _HEARTBEATS, _HeartbeatAtClose

    records: list[logging.LogRecord] = []
    kept: dict[str, bool] = {}  # each record as the filter judged it when it was logged

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    def judged(name: str) -> None:
        record = records[-1]
        assert record.getMessage().startswith("Failed to communicate with scheduler during heartbeat"), record
        kept[name] = _HeartbeatAtClose().filter(record)

    async def heartbeats() -> None:
        async def close_at_once(reader, writer):
            writer.close()

        closing = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
        port = closing.sockets[0].getsockname()[1]
        async with Scheduler(dashboard_address=None, host="127.0.0.1") as s, Worker(s.address) as w:
            w.scheduler = w.rpc(f"tcp://127.0.0.1:{port}")
            await w.heartbeat()  # the connection closed under it
            assert type(records[-1].exc_info[1]).__name__ == "CommClosedError"
            judged("closed")
            w.scheduler = w.rpc("tcp://127.0.0.1:9")  # nothing listens: refused, the worker still running
            await w.heartbeat()
            assert "Timed out trying to connect" in str(records[-1].exc_info[1])
            judged("refused")
        closing.close()

    logger, keep = logging.getLogger("distributed.worker"), Keep()
    # A LocalCluster of threads in this process (an earlier test) left its filter on.
    installed = _HEARTBEATS in logger.filters
    logger.removeFilter(_HEARTBEATS)
    logger.addHandler(keep)
    try:
        with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
            asyncio.run(heartbeats())
    finally:
        logger.removeHandler(keep)
        if installed:
            logger.addFilter(_HEARTBEATS)
    assert kept == {"closed": False, "refused": True}


def test_a_local_clusters_workers_drop_a_heartbeat_that_races_its_close():
    from pipeline.cluster import cluster

    def quiet() -> bool:
        from pipeline.workerlog import _HeartbeatAtClose

        return any(isinstance(f, _HeartbeatAtClose) for f in logging.getLogger("distributed.worker").filters)

    with cluster(n_workers=1, memory_limit="512MiB", log=None) as client:
        assert list(client.run(quiet).values()) == [True]


def test_a_scheduler_whose_port_refuses_connections_is_said_to_be_gone(monkeypatch):
    """A scheduler killed outright was first said to be "paused or overloaded, or behind a
    network partition" and waited for. Its port refusing connections tells a stopped
    process from a paused one, whose port still accepts them (the kernel's backlog)."""
    import io
    import socket
    import types

    from pipeline import workerlog
    from tests.conftest import free_port

    dead = f"tcp://127.0.0.1:{free_port()}"
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        alive = f"tcp://127.0.0.1:{listening.getsockname()[1]}"
        assert workerlog.refuses_connections(dead) and not workerlog.refuses_connections(alive)
        for address, said in ((dead, "its port refuses connections: its process has stopped"),
                              (alive, "still waiting (a scheduler that is paused or overloaded")):
            log = io.StringIO()
            client = types.SimpleNamespace(scheduler=types.SimpleNamespace(address=address), futures={})
            watch = workerlog.PausedWorkersWatch(client, log, interval=0.01, unanswered_after=0.01)

            looks = []

            def silent():
                looks.append(1)
                if len(looks) > 1:
                    watch._stop.set()  # one silent look said, then the watch ends
                raise TimeoutError

            monkeypatch.setattr(watch, "_look", silent)
            watch._stop.clear()
            watch._run()
            assert said in log.getvalue()
