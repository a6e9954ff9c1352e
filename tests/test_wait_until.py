"""The tests' condition wait (tests/conftest.py): woken by files and process exits."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.conftest import wait_until


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_file_written_in_a_new_nested_directory_ends_the_wait(tmp_path):
    target = tmp_path / "a" / "b" / "done"
    p = _child(f"import time, pathlib; time.sleep(0.5); t = pathlib.Path({str(target)!r});"
               " t.parent.mkdir(parents=True); t.write_text('x'); time.sleep(30)")
    try:
        t0 = time.monotonic()
        assert wait_until(target.exists, timeout=20, watch=tmp_path, procs=[p])
        assert time.monotonic() - t0 < 10
    finally:
        p.kill()
        p.wait()


def test_a_process_exit_ends_the_wait(tmp_path):
    p = _child("import time; time.sleep(0.3)")
    assert wait_until(lambda: p.poll() is not None, timeout=20, watch=tmp_path, procs=[p])


def test_after_a_process_exits_the_wait_blocks_on_files_not_spins(tmp_path):
    # r exits at once, unreaped: its pidfd stays readable for the rest of the wait.
    r = _child("pass")
    q = _child(f"import time, pathlib; time.sleep(1); pathlib.Path({str(tmp_path / 'f')!r}).write_text('x')")
    calls = []

    def seen() -> bool:
        calls.append(1)
        return (tmp_path / "f").exists()

    try:
        assert wait_until(seen, timeout=20, watch=tmp_path, procs=[r])
        assert len(calls) < 20
    finally:
        for c in (q, r):
            c.wait()


def test_the_deadline_returns_false(tmp_path):
    t0 = time.monotonic()
    assert not wait_until(lambda: False, timeout=0.3, watch=tmp_path)
    assert 0.3 <= time.monotonic() - t0 < 5
