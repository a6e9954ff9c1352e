"""The write tasks of a write call still running: counted where they run, stopped, and
waited for (here, in threads, and on a cluster's workers)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from pipeline.storage import inflight
from tests.conftest import in_process_cluster


def _token() -> str:
    return uuid.uuid4().hex


#: What each write call's tasks did, by token (module-level: a cluster's task finds it).
_LOGS: dict[str, list[str]] = {}


def _task(token: str, hold: float = 0.3) -> str:
    """A write task: counted while it runs; once its call is stopped it finishes the
    "unit" it is in (``hold`` seconds), as a task that was writing does."""
    log = _LOGS.setdefault(token, [])
    with inflight.running(token) as go:
        if not go:
            log.append("refused")
            return "refused"
        log.append("started")
        deadline = time.monotonic() + 30
        while not inflight.stopped(token) and time.monotonic() < deadline:
            threading.Event().wait(0.005)
        threading.Event().wait(hold)
        log.append("ended")
    return "ended"


def _wait_started(token: str, n: int) -> None:
    deadline = time.monotonic() + 30
    while _LOGS.get(token, []).count("started") < n and time.monotonic() < deadline:
        threading.Event().wait(0.005)
    assert _LOGS[token].count("started") == n


def test_a_stopped_call_refuses_new_tasks_and_counts_running_ones():
    token, other = _token(), _token()
    with inflight.running(token) as go:
        assert go is True
        assert inflight.stop_here(token) == 1  # this one still runs
        with inflight.running(token) as late:
            assert late is False  # started after the stop: must write nothing
        with inflight.running(other) as go_other:
            assert go_other is True  # another write call is not stopped
    assert inflight.stop_here(token) == 0 and inflight.stopped(token) and not inflight.stopped(other)


def test_settle_waits_for_a_task_running_in_a_thread():
    token = _token()
    thread = threading.Thread(target=_task, args=(token,))
    thread.start()
    _wait_started(token, 1)
    assert inflight.settle(token, timeout=30) is True
    assert _LOGS[token] == ["started", "ended"]  # it ended before settle returned
    thread.join()
    assert _task(token) == "refused"


def test_settle_waits_for_tasks_on_the_workers_of_the_default_client():
    from distributed import Client

    token = _token()
    with in_process_cluster(n_workers=1, threads_per_worker=2, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        futures = [client.submit(_task, token, pure=False, key=f"write-{token}-{i}") for i in range(2)]
        _wait_started(token, 2)
        assert inflight.settle(token, timeout=30) is True
        assert _LOGS[token].count("ended") == 2  # both ended before settle returned
        assert [f.result() for f in futures] == ["ended", "ended"]


def test_settle_gives_up_after_its_timeout_when_a_task_does_not_end():
    token = _token()
    thread = threading.Thread(target=_task, args=(token, 3.0))
    thread.start()
    _wait_started(token, 1)
    t0 = time.monotonic()
    assert inflight.settle(token, timeout=0.5) is False
    assert time.monotonic() - t0 < 2.5 and "ended" not in _LOGS[token]
    thread.join()


class _Client:
    """A client whose workers answer ``answer`` (per worker, or an error of the run) and
    whose scheduler knows the workers ``alive``."""

    def __init__(self, answer, alive):
        self.answer, self.alive = answer, alive

    def run(self, *args, **kwargs):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def scheduler_info(self, **kwargs):
        return {"workers": {w: {} for w in self.alive}}


@pytest.mark.parametrize("answer", [RuntimeError("scheduler gone"), {"tcp://w": OSError("no route"), "tcp://v": 0}])
def test_settle_is_unconfirmed_when_a_worker_in_the_cluster_does_not_answer(monkeypatch, answer):
    monkeypatch.setattr(inflight, "_client", lambda: _Client(answer, alive=["tcp://w", "tcp://v"]))
    t0 = time.monotonic()
    assert inflight.settle(_token(), timeout=0.5) is False
    assert time.monotonic() - t0 < 5


def test_a_worker_that_left_the_cluster_runs_nothing(monkeypatch):
    # Killed with its process group (a SIGTERM to a job): its error is no unknown.
    answer = {"tcp://gone": OSError("connection closed"), "tcp://v": 0}
    monkeypatch.setattr(inflight, "_client", lambda: _Client(answer, alive=["tcp://v"]))
    assert inflight.settle(_token(), timeout=5) is True
