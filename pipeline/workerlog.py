"""What a LocalCluster's workers log when a task raises this package's own error.

A task that raises a :class:`~pipeline.errors.PipelineError` (a file the loaders refuse,
a store that cannot be written) fails the computation, and the client reports it in one
line naming the file, key or chunk. A worker of a LocalCluster writes to the same
terminal, and distributed logs every failed task there first ("Compute Failed", its key,
its task and the traceback as one escaped string): the same message again, buried in a
dump. :class:`QuietOwnErrors` drops that record for the package's own errors (any other
exception is a bug, and its record is kept whole), and the warning a worker logs for a
task cancelled as it closes.

The scheduler of a LocalCluster runs in the caller's process, and
:func:`quiet_cancelled_feeds` keeps one of its records off the same terminal: a
progress bar's feed, still waiting for its next update when the cluster closes, is
cancelled, and distributed logs that cancellation as an error with its traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import traceback
from typing import Any, Iterator

from distributed.diagnostics.plugin import WorkerPlugin

from pipeline.errors import PipelineError

__all__ = ["QuietOwnErrors", "own_error_names", "quiet_cancelled_feeds"]

#: The logger distributed's workers report failed tasks on.
_LOGGER = "distributed.worker"


def own_error_names() -> frozenset[str]:
    """The class names of :class:`~pipeline.errors.PipelineError` and every subclass."""
    names, todo = set(), [PipelineError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return frozenset(names)


class _OwnErrors(logging.Filter):
    """Drops distributed's "Compute Failed" record of a task whose exception is one of
    this package's errors (its fourth argument is the exception's ``repr``)."""

    def __init__(self) -> None:
        super().__init__()
        self.names = own_error_names()

    def filter(self, record: logging.LogRecord) -> bool:
        if not (isinstance(record.msg, str) and record.msg.startswith("Compute Failed")):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) < 4:
            return True
        return str(args[3]).split("(", 1)[0] not in self.names


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
def quiet_cancelled_feeds() -> Iterator[None]:
    """No "ERROR ... CancelledError" record from a cancelled progress feed while the
    block runs (a LocalCluster's life, its close included)."""
    logger, quiet = logging.getLogger("distributed.scheduler"), _CancelledFeed()
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
