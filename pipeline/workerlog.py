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

__all__ = ["IgnoreInterrupts", "PausedWorkersWatch", "QuietOwnErrors", "answers_again_line", "filtered_log",
           "no_workers_warning", "os_error_names", "own_error_names", "paused_warning", "paused_workers",
           "quiet_cancelled_feeds", "unanswered_warning"]

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


#: The logger distributed's worker state machine reports a cancelled instruction on.
_STATE_LOGGER = "distributed.worker.state_machine"


class QuietOwnErrors(WorkerPlugin):
    """A worker plugin: no "Compute Failed" record for this package's own errors, which
    the client reports, and no record of a task cancelled as the worker closes
    (registered on the LocalClusters :func:`pipeline.cluster.cluster` starts)."""

    name = "pipeline-quiet-own-errors"

    def __init__(self) -> None:
        self._filters: list[tuple[str, logging.Filter]] = []

    def setup(self, worker: Any) -> None:
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
    """

    def __init__(self, client: Any, log: IO[str], *, after: float = 5.0, interval: float = 1.0,
                 unanswered_after: float | None = 15.0):
        self.client, self.log, self.after, self.interval = client, log, after, interval
        self.unanswered_after = unanswered_after
        self.warned: str | None = None
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
                    self._say(unanswered_warning(scheduler, time.monotonic() - asked))
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
