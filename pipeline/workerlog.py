"""What a LocalCluster's workers log when a task raises this package's own error.

A task that raises a :class:`~pipeline.errors.PipelineError` (a file the loaders refuse,
a store that cannot be written) fails the computation, and the client reports it in one
line naming the file, key or chunk. A worker of a LocalCluster writes to the same
terminal, and distributed logs every failed task there first ("Compute Failed", its key,
its task and the traceback as one escaped string): the same message again, buried in a
dump. :class:`QuietOwnErrors` drops that record for the package's own errors and for an
``OSError`` of a write task (a full disk, a read-only output: the writer reports it in
one line); any other exception is a bug, and its record is kept whole. It also drops the
warning a worker logs for a task cancelled as it closes. :class:`IgnoreInterrupts` keeps a
terminal's Ctrl-C, which reaches the workers' processes too, from killing them mid-task
with a traceback each: the process that holds the cluster closes them.

The scheduler of a LocalCluster runs in the caller's process, and
:func:`quiet_cancelled_feeds` keeps one of its records off the same terminal: a
progress bar's feed, still waiting for its next update when the cluster closes, is
cancelled, and distributed logs that cancellation as an error with its traceback.

:class:`PausedWorkersWatch` says on the client's terminal what the workers say only in
their own logs: a worker at its memory limit pauses ("Pausing worker. Process memory:
...") and starts no task until it frees memory, and a build whose workers all stay
paused waits without a word. On a remote cluster those logs are on other machines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import signal
import threading
import time
import traceback
from typing import IO, Any, Iterator, Mapping

from distributed.diagnostics.plugin import WorkerPlugin

from pipeline.errors import PipelineError

__all__ = ["IgnoreInterrupts", "PausedWorkersWatch", "QuietOwnErrors", "TaskFacts", "answers_again_line",
           "failed_task_facts", "filtered_log", "idle_over_limit_line", "killed_worker_line", "memory_restarts",
           "no_workers_warning", "os_error_names", "own_error_names", "paused_warning", "paused_workers",
           "quiet_cancelled_feeds", "quiet_failed_for_dead_workers", "task_facts", "unanswered_warning"]

#: The logger distributed's workers report failed tasks on.
_LOGGER = "distributed.worker"


def _class_names(root: type) -> frozenset[str]:
    """The names of ``root`` and of every subclass of it, at any depth."""
    names, todo = set(), [root]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return frozenset(names)


def own_error_names() -> frozenset[str]:
    """The class names of :class:`~pipeline.errors.PipelineError` and every subclass."""
    return _class_names(PipelineError)


def os_error_names() -> frozenset[str]:
    """The class names of ``OSError`` and every built-in subclass (``PermissionError``,
    ``FileNotFoundError``, ...)."""
    return _class_names(OSError)


#: Where a write task stores its units (:mod:`pipeline.storage.units`), as a formatted
#: traceback names the frame: an ``OSError`` raised there (a full disk, a read-only
#: output) is the one the writer reports in one line, "cannot write (...)". A block made
#: a unit at a time is written from ``_write_made_units``.
_WRITE_FRAME = re.compile(r'pipeline[/\\]storage[/\\]units\.py", line \d+, in _write_(made|made_units|block)\b')


class _OwnErrors(logging.Filter):
    """Drops distributed's "Compute Failed" record of a task whose exception is one of
    this package's errors, or an ``OSError`` raised while a write task stored its units,
    which the writer turns into its own one-line :class:`~pipeline.errors.StoreError`
    (the record's fourth argument is the exception's ``repr``, its fifth the formatted
    traceback)."""

    def __init__(self) -> None:
        super().__init__()
        self.names = own_error_names()
        self.os_errors = os_error_names()

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith("Compute Failed")):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) < 4:
            return True
        name = str(args[3]).split("(", 1)[0]
        if name in self.names:
            return False
        # Not every OSError: one raised while a task read a raw file, or in a user's
        # feature, is not what the writer reports, and is kept whole.
        return not (name in self.os_errors and len(args) >= 5 and _WRITE_FRAME.search(str(args[4])) is not None)


class _CancelledAtClose(logging.Filter):
    """Drops the worker's "Async instruction for <Task ...> ended with CancelledError"
    record: a task still running when the worker closes (a run that failed on a bad file
    closes its LocalCluster at once) is cancelled, which distributed says happens only
    in ``Worker.close()``; the client has reported the failure already."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith("Async instruction for") and msg.endswith("ended with CancelledError"))


class _HeartbeatAtClose(logging.Filter):
    """Drops the worker's "Failed to communicate with scheduler during heartbeat" record
    (and its traceback) when the connection to the scheduler was closed under it
    (distributed's ``CommClosedError``) or every worker of this process is closing: a
    heartbeat that races the close of a LocalCluster, whose scheduler closes its
    connections only as it closes. A heartbeat that fails otherwise (a timeout, a refused
    connection while a worker still runs) is kept.

    One per process, never removed (:func:`_quiet_heartbeats_at_close`): a heartbeat
    under way when the worker closes fails after its plugins' teardown.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str)
                and record.msg.startswith("Failed to communicate with scheduler during heartbeat")):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, OSError):
            return True
        from distributed.comm.core import CommClosedError

        # The exception itself, not its chain: a connection refused after retries is an
        # OSError ("Timed out trying to connect") raised during a CommClosedError.
        if isinstance(exc, CommClosedError):
            return False
        return not _workers_closing()


def _workers_closing() -> bool:
    """Whether this process has workers and every one is closing or closed."""
    from distributed import Worker

    statuses = [str(getattr(w.status, "name", w.status)) for w in list(getattr(Worker, "_instances", ()))]
    return bool(statuses) and all(s in {"closing", "closed", "closing_gracefully", "failed"} for s in statuses)


_HEARTBEATS = _HeartbeatAtClose()


def _quiet_heartbeats_at_close() -> None:
    """:class:`_HeartbeatAtClose` on the workers' logger, once per process."""
    logger = logging.getLogger(_LOGGER)
    if _HEARTBEATS not in logger.filters:
        logger.addFilter(_HEARTBEATS)


#: The logger distributed's worker state machine reports a cancelled instruction on.
_STATE_LOGGER = "distributed.worker.state_machine"


class QuietOwnErrors(WorkerPlugin):
    """A worker plugin: no "Compute Failed" record for this package's own errors, which
    the client reports, no record of a task cancelled as the worker closes, and no
    traceback of a heartbeat that races the cluster's close (registered on the
    LocalClusters :func:`pipeline.cluster.cluster` starts)."""

    name = "pipeline-quiet-own-errors"

    def __init__(self) -> None:
        self._filters: list[tuple[str, logging.Filter]] = []

    def setup(self, worker: Any) -> None:
        _quiet_heartbeats_at_close()
        self._filters = [(_LOGGER, _OwnErrors()), (_STATE_LOGGER, _CancelledAtClose())]
        for name, quiet in self._filters:
            logging.getLogger(name).addFilter(quiet)

    def teardown(self, worker: Any) -> None:
        for name, quiet in self._filters:
            logging.getLogger(name).removeFilter(quiet)


class IgnoreInterrupts(WorkerPlugin):
    """A worker plugin: the worker's process ignores SIGINT (registered on the
    LocalClusters of worker processes that :func:`pipeline.cluster.cluster` starts).

    A terminal's Ctrl-C reaches every process of its foreground group, a LocalCluster's
    workers too: each died printing its ``KeyboardInterrupt`` and ``CancelledError``
    tracebacks, and the nannies and the scheduler then reported the lost workers. The
    process that holds the cluster gets the same Ctrl-C and closes the cluster in order.
    Workers forked from :func:`pipeline.cluster.start_worker_server` ignore it from
    their start already; this covers the other start methods (``fork``) from the moment
    the worker is set up. Kept until the process ends: its close is when a Ctrl-C comes.
    """

    name = "pipeline-ignore-interrupts"

    def setup(self, worker: Any) -> None:
        # Only a process's main thread may set a handler: a worker that is a thread of
        # the caller's process (processes=False) leaves the caller's Ctrl-C alone.
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)


class _CancelledFeed(logging.Filter):
    """Drops the scheduler's record of a cancelled ``feed`` (the stream a progress bar
    reads): a feed whose bar has finished waits for its next update before it notices,
    and a cluster closed meanwhile cancels it, which is not an error."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, asyncio.CancelledError):
            return True
        return not any(frame.name == "feed" for frame in traceback.extract_tb(exc.__traceback__))


class _FailedForDeadWorkers(logging.Filter):
    """Drops the scheduler's "Task ... marked as failed because 4 workers died while
    trying to run it": the client's one line says it, naming what the task read or
    wrote instead of its key (:func:`killed_worker_line`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and "marked as failed because" in record.msg
                    and "workers died" in record.msg)


def quiet_failed_for_dead_workers() -> contextlib.AbstractContextManager[None]:
    """No scheduler record of a task failed because its workers died while the block
    runs (a LocalCluster's life, whose scheduler logs to this process's terminal)."""
    return filtered_log("distributed.scheduler", _FailedForDeadWorkers())


@contextlib.contextmanager
def filtered_log(name: str, quiet: logging.Filter) -> Iterator[None]:
    """Logger ``name`` with the filter ``quiet`` while the block runs."""
    logger = logging.getLogger(name)
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)


def quiet_cancelled_feeds() -> contextlib.AbstractContextManager[None]:
    """No "ERROR ... CancelledError" record from a cancelled progress feed while the
    block runs (a LocalCluster's life, its close included)."""
    return filtered_log("distributed.scheduler", _CancelledFeed())


def paused_workers(workers: Mapping[str, Mapping[str, Any]]) -> dict[str, tuple[int | None, int | None]]:
    """The paused workers among the scheduler's worker records (``scheduler_info()
    ["workers"]``), each with its process memory and its memory limit in bytes
    (``None`` where the record has none)."""
    out = {}
    for address, info in workers.items():
        if info.get("status") != "paused":
            continue
        memory = (info.get("metrics") or {}).get("memory")
        limit = info.get("memory_limit")
        out[address] = (int(memory) if memory is not None else None, int(limit) if limit else None)
    return out


def _executing(info: Mapping[str, Any]) -> int:
    """How many tasks a worker record (``scheduler_info()["workers"][address]``) says
    its worker runs."""
    counts = (info.get("metrics") or {}).get("task_counts") or {}
    return int(counts.get("executing", 0) or 0)


def _pause_fraction() -> float:
    """The fraction of its memory limit at which dask pauses a worker."""
    import dask

    return float(dask.config.get("distributed.worker.memory.pause", 0.8) or 0.8)


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**20:,.0f} MiB"


def paused_warning(paused: Mapping[str, tuple[int | None, int | None]], seconds: float) -> str:
    """One line naming the paused workers, their memory and limit, and what to do."""
    shown = [f"{address} ({_mib(memory)} of its {_mib(limit)} limit)" for address, (memory, limit) in
             list(paused.items())[:3]]
    more = f" and {len(paused) - 3} more" if len(paused) > 3 else ""
    which = "worker " if len(paused) == 1 else "workers "
    return (f"cluster: {which}{', '.join(shown)}{more} paused at the memory limit for {seconds:.0f} s while tasks "
            f"wait: dask starts no task on a paused worker, so the run may wait for good. Give the workers more "
            f"memory (cluster.memory_limit, or dask worker --memory-limit) or fewer threads each "
            f"(cluster.threads_per_worker, or dask worker --nthreads), and run again: a build resumes")


def no_workers_warning(scheduler: str, seconds: float) -> str:
    """One line saying that the scheduler has no workers to run the waiting tasks."""
    return (f"cluster: the scheduler {scheduler} has had no workers for {seconds:.0f} s while tasks wait: the run "
            f"goes on once workers join (dask worker {scheduler})")


def unanswered_warning(scheduler: str, seconds: float) -> str:
    """One line saying that the scheduler has stopped answering, that the run keeps
    waiting for it, and what to check."""
    return (f"cluster: the scheduler {scheduler} has not answered for {seconds:.0f} s; still waiting (a scheduler "
            f"that is paused or overloaded, or a network partition, may come back, and the run then goes on): "
            f"check that its process runs and its host answers; Ctrl-C stops the run, and the same command "
            f"resumes it")


def gone_warning(scheduler: str, seconds: float) -> str:
    """One line saying that the scheduler has not answered and its port refuses
    connections: its process is gone, not paused."""
    return (f"cluster: the scheduler {scheduler} has not answered for {seconds:.0f} s and its port refuses "
            f"connections: its process has stopped (killed, or its host restarted); the run ends once the client "
            f"gives up on it. Start the scheduler again and rerun the same command: it resumes")


def refuses_connections(address: str, timeout: float = 1.0) -> bool:
    """Whether nothing listens at scheduler ``address`` (``tcp://host:port``,
    ``tls://...``): a TCP connection to it is refused. False where it connects, times out
    or cannot be told (a paused host or a partition drops packets: no refusal)."""
    import socket

    try:
        from distributed.comm import get_address_host_port

        host, port = get_address_host_port(address)
        with socket.create_connection((host, port), timeout=timeout):
            return False
    except ConnectionRefusedError:
        return True
    except Exception:  # noqa: BLE001 - an address of another kind, a timeout: cannot tell
        return False


def answers_again_line(scheduler: str, seconds: float) -> str:
    """One line saying that a scheduler said to be silent answers again."""
    return f"cluster: the scheduler {scheduler} answers again, after {seconds:.0f} s without an answer"


class PausedWorkersWatch:
    """Warn once on ``log`` when workers stay paused (at their memory limit), or the
    scheduler has no workers, for ``after`` seconds while the client waits for tasks;
    and when the scheduler has not answered for ``unanswered_after`` seconds (and again
    once it answers).

    A thread asks the scheduler for its workers' state every ``interval`` seconds; the
    client's own futures tell whether anything waits (a paused worker holding finished
    results stops nothing). Use as a context manager around the client's use.

    A scheduler that stops answering (its process stopped, its VM paused, a network
    partition) keeps its connections open: distributed's client then waits for it
    without end and without a word, where a dead scheduler closes them and fails the
    run within a second. Each look is bounded by ``unanswered_after``, so the silence is
    told. The run is not stopped: a paused VM or a healed partition brings the
    scheduler back with its state, and the run then finishes.

    Parameters
    ----------
    client
        A connected ``distributed.Client``.
    log
        Where the warning goes.
    after
        Seconds a worker must stay paused before it is named.
    interval
        Seconds between two looks at the scheduler.
    unanswered_after
        Seconds without an answer from the scheduler before a line says so; ``None``:
        looks wait for their answer, and nothing is said.
    stalled_after
        Seconds every worker may stay paused running no task, while tasks wait, before
        the watch gives up on the run: :attr:`stalled` then holds the one line that
        says why (:func:`idle_over_limit_line`), and the waiting futures are cancelled,
        so that the computation waiting on them ends. For a LocalCluster, whose workers
        free no memory they hold while idle and to which no worker is added; ``None``:
        the watch only warns.
    """

    def __init__(self, client: Any, log: IO[str], *, after: float = 5.0, interval: float = 1.0,
                 unanswered_after: float | None = 15.0, stalled_after: float | None = None):
        self.client, self.log, self.after, self.interval = client, log, after, interval
        self.unanswered_after = unanswered_after
        self.stalled_after = stalled_after
        self.warned: str | None = None
        #: Why the watch stopped the run (``stalled_after``), or ``None``.
        self.stalled: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pipeline-paused-workers", daemon=True)

    def __enter__(self) -> "PausedWorkersWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        # Not forever: a look at a scheduler that stopped answering may be under way.
        self._thread.join(timeout=5)

    def _waiting(self) -> bool:
        try:
            return any(state.status == "pending" for state in list(self.client.futures.values()))
        except RuntimeError:  # the futures changed under us (the client's loop thread): look again
            return False

    def _give_up(self, line: str) -> None:
        """Record why the run stops, and end the client's wait for what is pending:
        the computation waiting on those futures raises, and
        :func:`pipeline.cluster.cluster` reports ``line`` as it closes the cluster.

        Only this client's view of the futures is cancelled, on its own event loop: the
        scheduler forgets the tasks when the client closes (asking it to cancel keys
        whose dependents it still holds failed an assertion in distributed).
        """
        self.stalled = line
        client = self.client

        def cancel() -> None:
            for state in list(client.futures.values()):
                if state.status == "pending":
                    state.cancel(reason="pipeline-stalled", msg=line)

        try:
            client.loop.add_callback(cancel)
        except Exception:  # noqa: BLE001 - a client closing meanwhile: nothing left to stop
            pass

    def _say(self, line: str) -> None:
        self.warned = line
        print(line, file=self.log, flush=True)

    def _look(self) -> dict[str, Any]:
        """The scheduler's worker records, waiting at most ``unanswered_after`` seconds
        (a ``TimeoutError`` then)."""
        client = self.client
        if self.unanswered_after is None:
            return client.scheduler_info(n_workers=-1).get("workers", {})
        # The scheduler's identity call, as scheduler_info makes it, with a bound.
        info = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=self.unanswered_after)
        return (info or {}).get("workers", {})

    def _run(self) -> None:
        since: dict[str, float] = {}
        empty_since: float | None = None
        silent_since: float | None = None
        stuck_since: float | None = None  # every worker paused, running no task
        told: set[str] = set()  # paused, no workers: each said once
        scheduler = str(self.client.scheduler.address)
        while not self._stop.wait(self.interval):
            asked = time.monotonic()
            try:
                workers = self._look()
            except TimeoutError:
                if self._stop.is_set():
                    return
                if silent_since is None:
                    silent_since = asked
                    # A stopped process refuses connections; a paused one, or a
                    # partition, drops them, and may come back.
                    said = gone_warning if refuses_connections(scheduler) else unanswered_warning
                    self._say(said(scheduler, time.monotonic() - asked))
                continue
            except Exception:  # noqa: BLE001 - a closing or lost client: nothing more to watch
                return
            now = time.monotonic()
            if silent_since is not None:
                self._say(answers_again_line(scheduler, now - silent_since))
                silent_since = None
            empty_since = (empty_since or now) if not workers else None
            if ("empty" not in told and empty_since is not None and now - empty_since >= self.after
                    and self._waiting()):
                told.add("empty")
                self._say(no_workers_warning(scheduler, now - empty_since))
            paused = paused_workers(workers)
            since = {address: since.get(address, now) for address in paused}
            long = {a: v for a, v in paused.items() if now - since[a] >= self.after}
            if "paused" not in told and long and self._waiting():
                told.add("paused")
                self._say(paused_warning(long, max(now - since[a] for a in long)))
            idle = {a: workers[a] for a in paused if not _executing(workers[a])}
            if not (workers and len(idle) == len(workers)):
                stuck_since = None
                continue
            stuck_since = stuck_since or now
            if self.stalled_after is not None and now - stuck_since >= self.stalled_after and self._waiting():
                # Every worker paused, none running a task: none will free memory, and
                # the run would wait for good. The fullest one is named.
                address = max(idle, key=lambda a: paused[a][0] or 0)
                memory, limit = paused[address]
                self._give_up(idle_over_limit_line(address, memory or 0, limit or 0, _pause_fraction(),
                                                   seconds=now - stuck_since))
                return


# -- a LocalCluster that cannot run a task --------------------------------------------


def _suggested_limit(memory: int) -> int:
    """A memory limit for a worker whose idle process holds ``memory`` bytes: two and a
    half times it, rounded up to 64 MiB: room for the tasks beside what it holds, and for
    what a run's first tasks import (a worker that held 85 MiB as it started held about
    140 MiB once it had read a Parquet file)."""
    step = 64 * 2**20
    return -(-5 * memory // (2 * step)) * step


def idle_over_limit_line(worker: str, memory: int, limit: int, pause: float, *, seconds: float | None = None) -> str:
    """One line for a LocalCluster whose worker, running no task, holds ``pause`` of its
    memory ``limit`` or more: dask pauses it, and it never runs a task. ``seconds``:
    how long it stayed so while tasks waited (``None``: found as it started)."""
    where = f"{_mib(memory)} of its {_mib(limit)} memory limit (dask pauses a worker at {pause:.0%} of it)"
    if seconds is None:
        said = f"cluster: worker {worker} holds {where} as it starts, before any task: it would never run one"
    else:
        said = (f"cluster: worker {worker} has stayed paused for {seconds:.0f} s at {where}, running no task while "
                f"tasks wait: the memory it holds leaves no room for one, and the run was stopped")
    return (f"{said}. Set cluster.memory_limit to at least {_mib(_suggested_limit(memory))} (its own memory, what "
            f"a run's tasks import, and room for the tasks), and run again: a build resumes")
