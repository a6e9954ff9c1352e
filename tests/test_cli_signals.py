"""``pipeline run`` stopped by SIGTERM: one line, exit status 143, the workers stopped
and the store's lock released; the handler is the command's alone."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from pipeline import cli
from tests.conftest import wait_until
from tests.test_cluster import _group_alive, _long_run, _resumes_as_uninterrupted, _run_while_writing


def test_sigterm_stops_a_run_in_one_line_releasing_its_lock_and_the_rerun_resumes(tmp_path):
    """SIGTERM (a service manager, a batch scheduler, `timeout`) ended the run at once:
    exit status -15, no line in the log, the store's lock file left behind."""
    cfg = _long_run(tmp_path, seed=12, store="o.zarr", rows_per_day=20_000)
    with _run_while_writing(cfg, tmp_path, written=4, sigint_default=False) as (run, lines, path):
        run.send_signal(signal.SIGTERM)  # to the run alone, as `kill PID` sends it
    text = "".join(lines)
    assert run.returncode == 143, text
    assert lines[-1] == cli.TERMINATED_LINE + "\n", text
    assert "Traceback" not in text, text
    assert not Path(f"{tmp_path / 'o.zarr'}.lock").exists(), "the store's lock was left behind"
    # Its workers, the forkserver and the resource tracker end with it.
    assert wait_until(lambda: not _group_alive(run.pid), timeout=15, watch=tmp_path), "helpers outlived the run"
    _resumes_as_uninterrupted(tmp_path, path)


def test_the_sigterm_handler_is_the_run_commands_for_its_run_only(tmp_path):
    """Installed while `run` runs, put back after; other commands and a process that
    embeds pipeline keep their own handling; a process forked meanwhile (a worker of the
    fork start method) has the default back, so that its nanny's SIGTERM ends it."""
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    seen = {}

    def fake_run(args):
        seen["handler"] = signal.getsignal(signal.SIGTERM)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child reports its handler and ends at once
            os.write(write, b"default" if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL else b"other")
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        seen["child"] = os.read(read, 16).decode()
        os.close(read)
        signal.raise_signal(signal.SIGTERM)
        threading.Event().wait(5)  # not reached: the handler raises
        return 0

    original = cli._cmd_run
    cli._cmd_run = fake_run
    try:
        status = cli.main(["run", str(tmp_path / "c.yaml")])
    finally:
        cli._cmd_run = original
    assert status == 143
    assert callable(seen["handler"]) and seen["child"] == "default"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

    def own(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, own)
    try:
        with cli._terminate_as_interrupt():
            assert signal.getsignal(signal.SIGTERM) is own  # an embedding's handler is left alone
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert cli.main(["demo-data", str(tmp_path / "raw"), "--days", "1", "--rows-per-day", "50",
                     "--formats", "csv"]) == 0
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
