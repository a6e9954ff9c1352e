"""The garbage collector's full collections, kept to the objects a build makes.

CPython's cyclic collector scans every tracked object at a full (generation 2)
collection: in a process that holds dask, distributed, zarr and pyarrow that is about
150,000 objects, 0.1-0.2 s a collection on these machines. A build makes enough
objects (graphs, tasks, futures, messages) to set one or two off, in the process that
holds the client and a LocalCluster's scheduler and in every worker, and none of the
objects imported before it can be garbage that only a full collection would find.

``gc.freeze()`` moves the objects alive now to a generation the collector leaves
alone, and ``gc.unfreeze()`` puts them back: :func:`frozen_heap` does that around a
build (nothing is lost: a cycle among frozen objects is collected after the block, at
the next full collection), and :class:`FreezeWorkerHeap` does it once in each worker
of a LocalCluster, whose process this package started (measured in
``benchmarks/README.md``, build).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from typing import Any, Iterator, Sequence

from distributed.diagnostics.plugin import WorkerPlugin

__all__ = ["FreezeWorkerHeap", "WARM_MODULES", "frozen_heap", "warm_imports_done"]

_lock = threading.Lock()
_depth = 0  # blocks open
_ours = False  # whether the open blocks' freeze is this module's


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Leave the objects alive on entry out of full collections until the block ends.

    Nested and concurrent blocks share one freeze: the heap is unfrozen when the last
    of them ends. A process whose heap something else froze is left as it is (unfreezing
    would undo that freeze too).
    """
    global _depth, _ours
    with _lock:
        _depth += 1
        if _depth == 1:
            _ours = gc.get_freeze_count() == 0
            if _ours:
                gc.freeze()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _ours:
                gc.unfreeze()


#: What a build's first tasks import that the worker server does not
#: (:data:`pipeline.cluster.WORKER_MODULES`): pyarrow's conversions to numpy import
#: pandas where it is installed, 0.15-0.2 s a worker. Imported there, every worker's
#: first task waited for it; the server importing it delayed every run's cluster by
#: 0.5 s. A worker of ``pipeline run`` (which reads tables) imports them in the
#: background as it is set up, while the client plans the run (a core is free then), in
#: the order a task imports them: a task that needs one meanwhile waits for that import,
#: and no two imports wait on each other. Other clusters leave them out: half a second
#: of CPU and 37 MiB a worker where no task needs them.
WARM_MODULES: tuple[str, ...] = ("pyarrow.compute", "pandas", "pipeline.loaders.columns", "pipeline.remote")


#: The name of a worker's thread that imports :data:`WARM_MODULES`.
WARM_THREAD = "pipeline-warm-imports"


def warm_imports_done(timeout: float | None = None) -> bool:
    """Wait (in a worker) until its background imports are done; whether they are.
    What measures the worker's heap or CPU at its start waits for them first."""
    for thread in threading.enumerate():
        if thread.name == WARM_THREAD:
            thread.join(timeout)
            if thread.is_alive():
                return False
    return True


def _warm_then_freeze(modules: tuple[str, ...], worker: Any) -> None:
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional module (pandas) may be missing: a task says so if it needs it
            pass
    # Frozen only while the worker knows no task: a task's objects frozen with them would
    # be left out of full collections for good (a cycle among them never freed).
    if not getattr(getattr(worker, "state", None), "tasks", None):
        gc.freeze()


class FreezeWorkerHeap(WorkerPlugin):
    """A worker plugin: the objects the worker holds (its imports, distributed's own
    state) are frozen for the worker's life, and again once ``modules`` (``pipeline
    run``: :data:`WARM_MODULES`) are imported in the background. Registered only on
    the LocalClusters of worker processes that :func:`pipeline.cluster.cluster` starts,
    which are this package's own (threaded workers share the caller's process)."""

    name = "pipeline-freeze-heap"

    def __init__(self, modules: Sequence[str] = ()):
        self.modules = tuple(modules)

    def setup(self, worker: Any) -> None:
        gc.freeze()  # at once: the imports below add to it
        if self.modules:
            threading.Thread(target=_warm_then_freeze, args=(self.modules, worker), name=WARM_THREAD,
                             daemon=True).start()
