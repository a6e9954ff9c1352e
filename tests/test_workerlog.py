"""A LocalCluster's workers do not dump the package's own errors before the client's
one-line report; any other exception (a bug, a user hook's) is still logged whole."""

from __future__ import annotations

import logging
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
    with dask.config.set(chosen), cluster(n_workers=1, memory_limit="512MiB", log=None) as client:
        handlers = client.run(_sigint_handler)
    assert list(handlers.values()) == [repr(signal.SIG_IGN)]
    with cluster(n_workers=1, processes=False, log=None) as client:
        assert list(client.run(_sigint_handler).values()) == [repr(signal.default_int_handler)]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
