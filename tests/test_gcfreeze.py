"""Full collections during a build leave out what was alive before it, and lose nothing."""

from __future__ import annotations

import gc
import threading
import weakref

from pipeline.gcfreeze import frozen_heap


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_objects_alive_before_the_block_are_frozen_until_it_ends():
    gc.collect()
    base = gc.get_freeze_count()
    before = _Node()
    with frozen_heap():
        assert gc.get_freeze_count() >= base + 1
        assert not any(o is before for o in gc.get_objects())  # not in any generation the collector scans
        during = _Node()  # made in the block: collected as usual
        ref = weakref.ref(during)
        del during
        gc.collect()
        assert ref() is None
        # A collection leaves the frozen ones frozen (their count may still fall: refcounting
        # frees a frozen object whose last reference goes, as other threads' objects do).
        assert not any(o is before for o in gc.get_objects())
    assert gc.get_freeze_count() == base
    assert any(o is before for o in gc.get_objects())


def test_a_cycle_dropped_during_the_block_is_collected_after_it():
    gc.collect()
    old = _Node()
    ref = weakref.ref(old)
    with frozen_heap():
        del old
        gc.collect()
        assert ref() is not None  # frozen: a full collection inside the block leaves it
    gc.collect()
    assert ref() is None  # back in the oldest generation: freed, nothing leaks


def test_nested_and_concurrent_blocks_unfreeze_once_the_last_ends():
    gc.collect()
    base = gc.get_freeze_count()
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with frozen_heap():
            inside.set()
            leave.wait(30)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(30)
    with frozen_heap():
        with frozen_heap():
            pass
        assert gc.get_freeze_count() > base  # the inner block's end did not unfreeze
    assert gc.get_freeze_count() > base  # the other thread's block still runs
    leave.set()
    t.join(30)
    assert gc.get_freeze_count() == base


def test_a_heap_frozen_by_someone_else_stays_frozen():
    gc.collect()
    gc.freeze()
    try:
        theirs = gc.get_freeze_count()
        with frozen_heap():
            pass
        # Not unfrozen (that would leave 0); refcounting frees some frozen objects meanwhile,
        # more in a busy test process with other threads (140 of 1.18 million once).
        assert gc.get_freeze_count() >= theirs * 0.99
    finally:
        gc.unfreeze()


def test_threaded_workers_leave_the_callers_heap_alone():
    from pipeline.cluster import cluster

    gc.collect()
    with cluster(n_workers=1, threads_per_worker=1, processes=False, log=None) as client:
        assert client.submit(sum, [1, 2]).result() == 3
        assert gc.get_freeze_count() == 0  # no worker plugin froze this process's heap


def _after_warm_imports(names: list[str]) -> tuple[list[str], int]:
    """The modules of ``names`` a worker holds once its background imports are done,
    and its frozen objects."""
    import sys

    from pipeline.gcfreeze import warm_imports_done

    assert warm_imports_done(60)
    return [m for m in names if m in sys.modules], gc.get_freeze_count()


def test_worker_processes_import_what_a_first_task_would_before_any_task_then_freeze_it():
    """A worker's first task imported pandas (pyarrow's conversions to numpy do), 0.15-0.2
    s on each worker's critical path; the worker server does not import it (that delayed
    every cluster), so each worker of ``pipeline run`` imports it in the background once
    set up, and the objects it made are frozen too. A cluster that does not ask for them
    (the default: tasks that read no table) leaves them out: half a second of CPU a worker."""
    from pipeline.cluster import cluster
    from pipeline.gcfreeze import WARM_MODULES

    with cluster(n_workers=1, threads_per_worker=1, log=None, warm_imports=WARM_MODULES) as client:
        (loaded, frozen), = client.run(_after_warm_imports, list(WARM_MODULES)).values()
    assert "pandas" in WARM_MODULES and loaded == list(WARM_MODULES)
    assert frozen > 100_000  # the worker's heap, pandas' objects included
    with cluster(n_workers=1, threads_per_worker=1, log=None) as client:
        (loaded, _), = client.run(_after_warm_imports, ["pandas"]).values()
    assert loaded == []


def test_the_background_imports_freeze_only_a_worker_that_knows_no_task_yet():
    """Objects of a task that runs while the imports finish would be frozen with them,
    out of full collections for good; so the heap is frozen again only before any task."""
    from types import SimpleNamespace

    from pipeline.gcfreeze import _warm_then_freeze

    gc.collect()
    before = gc.get_freeze_count()
    _warm_then_freeze(("json",), SimpleNamespace(state=SimpleNamespace(tasks={"a-task": object()})))
    assert gc.get_freeze_count() == before
    if before == 0:  # this process's heap is nobody's frozen heap: it may be frozen and thawed here
        _warm_then_freeze(("json",), SimpleNamespace(state=SimpleNamespace(tasks={})))
        assert gc.get_freeze_count() > 0
        gc.unfreeze()
