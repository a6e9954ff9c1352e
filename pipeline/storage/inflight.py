"""The write tasks of one write call that are still running, wherever they run.

An interrupted write (Ctrl-C, a task's error, a full disk) ends the client's wait, not
the tasks already running: dask's threads and a cluster's workers finish the task they
are in. A write task writes its units by path, so one that ends after the writer has
given up writes into whatever store is at that path by then: an overwrite that put the
replaced store back in place got units of the new data, with their markers, in a store
marked complete (its checksums then matched, and nothing said it was mixed). A write
call that raises therefore first stops its tasks (:func:`settle`): a task not yet
writing writes nothing, one that is writing stops after its current unit, and the
writer goes on only once none of its tasks runs, here or on any worker of the cluster.

Each write call has a token (the writers' ``token``/``call``); :func:`running` counts a
task of it in the process where the task runs, and refuses one whose call was stopped.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, OrderedDict
from typing import Iterator

__all__ = ["running", "settle", "stop_here", "stopped"]

_LOCK = threading.Lock()
_RUNNING: Counter[str] = Counter()
#: Write calls stopped in this process (oldest first); a few hundred tokens at most.
_STOPPED: OrderedDict[str, None] = OrderedDict()
_MAX_STOPPED = 256

#: Seconds :func:`settle` waits for running tasks before it gives up (a worker that does
#: not answer): a task stops after the unit it is writing, a second or two of work. A
#: second Ctrl-C waits too (see :func:`settle`), so the wait is kept short.
SETTLE_TIMEOUT = 20.0


@contextlib.contextmanager
def running(token: str) -> Iterator[bool]:
    """Count a task of write call ``token`` as running while the block runs; the block
    gets ``False`` (and is not counted) when the call was stopped: it must not write."""
    with _LOCK:
        go = token not in _STOPPED
        if go:
            _RUNNING[token] += 1
    try:
        yield go
    finally:
        if go:
            with _LOCK:
                _RUNNING[token] -= 1
                if _RUNNING[token] <= 0:
                    del _RUNNING[token]


def stopped(token: str) -> bool:
    """Whether write call ``token`` was stopped in this process (a task checks between units)."""
    return token in _STOPPED


def stop_here(token: str) -> int:
    """Stop write call ``token`` in this process; the number of its tasks still running here."""
    with _LOCK:
        _STOPPED[token] = None
        _STOPPED.move_to_end(token)
        while len(_STOPPED) > _MAX_STOPPED:
            _STOPPED.popitem(last=False)
        return _RUNNING.get(token, 0)


def _client() -> object | None:
    """The distributed client computations go to, if any."""
    try:
        from distributed import default_client
    except ImportError:
        return None
    try:
        return default_client()
    except ValueError:  # no client: dask's threads, counted in this process
        return None


def _on_workers(client: object, token: str, timeout: float) -> int | None:
    """:func:`stop_here` on every worker of ``client``'s cluster: the sum of their running
    tasks, or ``None`` when a worker that is still in the cluster did not answer within
    ``timeout`` seconds. A worker that failed to answer and has left the cluster since
    (killed with its process group, its nanny stopped) runs nothing."""
    answer: list = []

    def ask() -> None:
        try:
            counts = client.run(stop_here, token, on_error="return")  # type: ignore[attr-defined]
            failed = [w for w, c in counts.items() if not isinstance(c, int)]
            if failed:
                alive = client.scheduler_info(n_workers=-1).get("workers", {})  # type: ignore[attr-defined]
                counts = {w: (0 if w in failed and w not in alive else c) for w, c in counts.items()}
            answer.append(counts)
        except Exception as exc:  # noqa: BLE001 - the scheduler is gone: nothing is confirmed
            answer.append(exc)

    # In a thread: Client.run has no timeout of its own, and a scheduler that stopped
    # answering must not keep an interrupted write from ending.
    thread = threading.Thread(target=ask, name="pipeline-settle", daemon=True)
    thread.start()
    thread.join(timeout)
    if not answer or not isinstance(answer[0], dict):
        return None
    counts = answer[0].values()
    if not all(isinstance(c, int) for c in counts):
        return None
    return sum(counts)


def settle(token: str, *, timeout: float = SETTLE_TIMEOUT) -> bool:
    """Stop the tasks of write call ``token`` wherever they run, and wait until none runs.

    Returns ``True`` once no task of the call runs in this process (dask's threads, an
    in-process cluster) or on any worker of the default distributed client; ``False``
    when that could not be confirmed within ``timeout`` seconds (a worker that does not
    answer): the caller must then leave alone anything those tasks could write into.
    A second Ctrl-C (or SIGTERM) during the wait is held until it ends: it cut the wait
    short, and the replaced store was then left aside though the tasks were ending.
    """
    from pipeline.cluster import _interrupts_deferred

    deadline = time.monotonic() + timeout
    client = _client()
    with _interrupts_deferred():
        while True:
            count: int | None = stop_here(token)
            if client is not None:
                remote = _on_workers(client, token, max(0.1, deadline - time.monotonic()))
                count = None if remote is None else count + remote
            if count == 0:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
