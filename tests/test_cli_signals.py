"""``pipeline run`` stopped by SIGTERM: one line, exit status 143, the workers stopped
and the store's lock released; the handler is the command's alone."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import yaml

from pipeline import cli
from tests.conftest import BIN, assert_same_store, run_cli, wait_until
from tests.test_cluster import _group_alive, _long_run


def test_sigterm_stops_a_run_in_one_line_releasing_its_lock_and_the_rerun_resumes(tmp_path):
    """SIGTERM (a service manager, a batch scheduler, `timeout`) ended the run at once:
    exit status -15, no line in the log, the store's lock file left behind."""
    cfg = _long_run(tmp_path, seed=12, store="o.zarr", rows_per_day=20_000)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = subprocess.Popen([str(BIN / "pipeline"), "run", str(path), "--no-progress"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(run.stdout), daemon=True)
    reader.start()
    chunks = tmp_path / "o.zarr" / "train" / "x" / "c"
    try:
        wait_until(lambda: run.poll() is not None or (chunks.exists() and sum(1 for _ in chunks.rglob("*")) >= 4),
                   timeout=240, watch=tmp_path, procs=[run])
        assert run.poll() is None, "the run ended before it could be terminated; make the data larger"
        run.send_signal(signal.SIGTERM)  # to the run alone, as `kill PID` sends it
        run.wait(timeout=60)
        reader.join(timeout=10)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    text = "".join(lines)
    assert run.returncode == 143, text
    assert lines[-1] == cli.TERMINATED_LINE + "\n", text
    assert "Traceback" not in text, text
    assert not Path(f"{tmp_path / 'o.zarr'}.lock").exists(), "the store's lock was left behind"
    # Its workers, the forkserver and the resource tracker end with it.
    assert wait_until(lambda: not _group_alive(run.pid), timeout=15, watch=tmp_path), "helpers outlived the run"

    resumed = run_cli("run", str(path), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    reference = run_cli("run", str(path), "--no-progress", "--set", f"output.path={tmp_path / 'ref.zarr'}")
    assert reference.returncode == 0, reference.stderr
    assert_same_store(tmp_path / "o.zarr", tmp_path / "ref.zarr")


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
