"""The tests' condition wait (tests/conftest.py): woken by files and process exits."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from tests.conftest import wait_until


def _child(code: str) -> subprocess.Popen:
    """A Python child whose ``gate()`` blocks until the parent calls :func:`_open`."""
    gate = "import sys\ndef gate():\n    sys.stdin.read(1)\n"
    return subprocess.Popen([sys.executable, "-c", gate + code], stdin=subprocess.PIPE)


def _open(p: subprocess.Popen) -> None:
    p.stdin.write(b"x")
    p.stdin.flush()


def _opening(p: subprocess.Popen, condition):
    """``condition``, which lets the child go on its first call: the wait has started
    (it checks once before blocking), so what the child does next happens while the
    wait watches, with no sleep to guess when that is."""
    opened = []

    def check() -> bool:
        if not opened:
            opened.append(1)
            _open(p)
        return condition()

    return check


def test_a_file_written_in_a_new_nested_directory_ends_the_wait(tmp_path):
    target = tmp_path / "a" / "b" / "done"
    # the child lives on after writing (gate() waits for a second byte that never comes):
    # the file, not its exit, must end the wait
    p = _child(f"import pathlib; gate(); t = pathlib.Path({str(target)!r});"
               " t.parent.mkdir(parents=True); t.write_text('x'); gate()")
    try:
        t0 = time.monotonic()
        assert wait_until(_opening(p, target.exists), timeout=20, watch=tmp_path, procs=[p])
        assert time.monotonic() - t0 < 10
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_a_process_exit_ends_the_wait(tmp_path):
    p = _child("gate()")
    try:
        assert wait_until(_opening(p, lambda: p.poll() is not None), timeout=20, watch=tmp_path, procs=[p])
    finally:
        p.kill()
        p.wait()


def test_after_a_process_exits_the_wait_blocks_on_files_not_spins(tmp_path):
    # r exits at once, unreaped: its pidfd stays readable for the rest of the wait.
    r = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, r.pid, os.WEXITED | os.WNOWAIT)  # until it has exited, left unreaped
    q = _child(f"import pathlib; gate(); pathlib.Path({str(tmp_path / 'f')!r}).write_text('x')")
    calls = []

    def seen() -> bool:
        calls.append(1)
        return (tmp_path / "f").exists()

    try:
        assert wait_until(_opening(q, seen), timeout=20, watch=tmp_path, procs=[r])
        assert len(calls) < 20
    finally:
        for c in (q, r):
            c.wait()


def test_the_deadline_returns_false(tmp_path):
    t0 = time.monotonic()
    assert not wait_until(lambda: False, timeout=0.3, watch=tmp_path)
    assert 0.3 <= time.monotonic() - t0 < 5
