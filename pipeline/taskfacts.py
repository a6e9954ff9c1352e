"""Why the workers of a run died running a task (dask's ``KilledWorker``): what the task
was, read from its spec on the scheduler (:class:`TaskFacts`), and the one line a run
prints for it (:func:`killed_worker_line`): the file and row group it read, or the
split's block it wrote and its size, the workers' memory limit, and what to set."""

from __future__ import annotations

from typing import Any, Mapping

from distributed.diagnostics.plugin import SchedulerPlugin

from pipeline.workerlog import _mib

__all__ = ["TaskFacts", "failed_task_facts", "killed_worker_line", "memory_restarts", "task_facts"]


#: The functions of :mod:`pipeline.storage.units` a write task runs, each given its
#: block's plan ``(start, [(unit, first, stop), ...])`` first and the store's
#: ``location`` and ``split`` by keyword.
_WRITE_STEPS = frozenset({"_write_made_units", "_write_made", "_write_block"})


def _plan(value: Any) -> tuple[int, list] | None:
    """A write task's plan, ``(start, [(unit, first, stop), ...])``, from its first
    argument (a ``_write_block`` gets it as a one-element object array), or ``None``."""
    value = getattr(value, "value", value)  # a DataNode holds it
    if hasattr(value, "dtype") and getattr(value, "size", 0) == 1:
        value = value.reshape(-1)[0]
    if (isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], list)
            and all(isinstance(u, tuple) and len(u) == 3 for u in value[1])):
        return int(value[0]), [tuple(int(v) for v in u) for u in value[1]]
    return None


def task_facts(spec: Any, *, limit: int = 500) -> dict[str, Any]:
    """What a task reads or writes, as plain values found in its spec (the scheduler's
    ``run_spec``: a :class:`dask.task_spec.Task`, whose arguments may hold other tasks
    inlined by dask's fusion).

    ``{"read": [{"path", "fmt", "group", "rows", "companion"}, ...]}`` for the raw-file
    parts (:class:`pipeline.loaders.tables.TablePart`) among its arguments, and
    ``{"write": {"location", "split", "start", "units"}}`` for a write task of
    :mod:`pipeline.storage.units`; empty when neither is found. At most ``limit`` values
    are looked at: a fused task's arguments may be many.
    """
    facts: dict[str, Any] = {}
    todo, seen = [spec], 0
    while todo and seen < limit:
        obj = todo.pop()
        seen += 1
        if isinstance(obj, (str, bytes, int, float)) or obj is None:
            continue
        if type(obj).__name__ == "TablePart" and hasattr(obj, "path"):
            read = {k: getattr(obj, k, None) for k in ("path", "fmt", "group", "rows", "companion")}
            if read not in facts.setdefault("read", []):
                facts["read"].append(read)
            continue
        func, args = getattr(obj, "func", None), getattr(obj, "args", None)
        kwargs = getattr(obj, "kwargs", None) or getattr(obj, "keywords", None)
        if callable(func) and isinstance(args, tuple):
            name = getattr(func, "__name__", "")
            if name in _WRITE_STEPS and isinstance(kwargs, Mapping) and "write" not in facts:
                plan = _plan(args[0]) if args else None
                facts["write"] = {"location": str(kwargs.get("location")), "split": str(kwargs.get("split")),
                                  "storage_options": kwargs.get("storage_options"),
                                  "start": plan[0] if plan else None, "units": plan[1] if plan else None}
            todo.extend(args)
            todo.append(func)  # a partial or a fused subgraph's callable holds arguments too
            if isinstance(kwargs, Mapping):
                todo.extend(kwargs.values())
        elif isinstance(obj, (tuple, list)):
            todo.extend(obj[:limit])
        elif isinstance(obj, Mapping):
            todo.extend(list(obj.values())[:limit])
        elif hasattr(obj, "value") and not callable(obj):  # a DataNode
            todo.append(obj.value)
    return facts


class TaskFacts(SchedulerPlugin):
    """A scheduler plugin that keeps :func:`task_facts` of the last tasks that failed of
    themselves (a worker killed under them four times, or their own exception), so that
    the client can name the file or the block behind a ``KilledWorker`` after the
    scheduler has forgotten the task: ``dask.compute`` releases its futures as the error
    comes back, and with them the failed task.

    Registered by :func:`pipeline.cluster.cluster` on the scheduler of every cluster it
    starts or connects to; :func:`failed_task_facts` reads it there.
    """

    name = "pipeline-task-facts"
    idempotent = True  # one per scheduler: runs connecting to one scheduler share it
    keep = 64

    def __init__(self) -> None:
        self.facts: dict[str, dict[str, Any]] = {}
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def transition(self, key: Any, start: str, finish: str, *args: Any, stimulus_id: str = "",
                   **kwargs: Any) -> None:
        # Every transition of every task comes here: return at once but for a task that
        # failed of itself (its dependents fail with it, blamed on it: not these).
        if finish != "erred" or kwargs.get("cause") != key or self.scheduler is None:
            return
        ts = self.scheduler.tasks.get(key)
        if ts is None:
            return
        try:
            found = task_facts(ts.run_spec)
        except Exception:  # noqa: BLE001 - a spec this does not know: nothing to add
            return
        self.facts[str(key)] = found
        while len(self.facts) > self.keep:
            self.facts.pop(next(iter(self.facts)))


def _facts_on_scheduler(dask_scheduler: Any, key: str) -> dict[str, Any]:
    plugin = dask_scheduler.plugins.get(TaskFacts.name)
    return dict(getattr(plugin, "facts", {}).get(key, {}))


def failed_task_facts(client: Any, key: Any) -> dict[str, Any]:
    """The :func:`task_facts` the scheduler of ``client`` recorded for the failed task
    ``key``; empty when none (a scheduler without :class:`TaskFacts`, or no answer)."""
    try:
        return client.run_on_scheduler(_facts_on_scheduler, key=str(key)) or {}
    except Exception:  # noqa: BLE001 - the facts only add to the message
        return {}


def memory_restarts(client: Any) -> dict[str, int]:
    """The workers (by address) that their nanny restarted for exceeding its memory
    budget, each with its process memory then (bytes): the scheduler's
    ``worker-restart-memory`` events; empty when there are none or no answer."""
    try:
        events = client.get_events("worker-restart-memory")
    except Exception:  # noqa: BLE001 - the events only add to the message
        return {}
    out = {}
    for _, event in events or ():
        if isinstance(event, Mapping) and "worker" in event:
            out[str(event["worker"])] = int(event.get("rss") or 0)
    return out


def _task_name(key: Any) -> str:
    """A task key's name (``('read-table-ab67', 0, 0)`` -> ``read-table-ab67``)."""
    return str(key[0] if isinstance(key, tuple) and key else key)


def _rows(read: Mapping[str, Any]) -> str:
    rows = read.get("rows")
    rows_text = f"{rows:,} rows" if isinstance(rows, int) else "rows"
    if read.get("fmt") == "parquet" and isinstance(read.get("group"), int):
        return f"row group {read['group']} ({rows_text})"
    return f"a part of {rows_text}"


def killed_worker_line(key: Any, *, attempts: int, memory_limit: int | None, restarted: Mapping[str, int],
                       last_worker: str, facts: Mapping[str, Any], unit_bytes: int | None = None,
                       sample_bytes: int | None = None) -> str:
    """One line for a task that every worker that ran it died of (distributed's
    ``KilledWorker``): what the task did, the workers' memory limit, and what to set.

    Parameters
    ----------
    key
        The task's key.
    attempts
        How many workers died running it.
    memory_limit
        The last worker's memory limit in bytes (0 or ``None``: none).
    restarted
        Workers their nanny restarted for memory, with their memory then
        (:func:`memory_restarts`).
    last_worker
        The address of the last worker that died running it.
    facts
        What the task read or wrote (:func:`task_facts`).
    unit_bytes, sample_bytes
        For a write task: the bytes of one write unit of its split, and of one sample.
    """
    name = _task_name(key)
    what = f"task {name}"
    fix = []
    reads, write = facts.get("read") or [], facts.get("write")
    if reads:
        shown = "; ".join(f"{r['path']} {_rows(r)}" for r in reads[:3]) + (" and more" if len(reads) > 3 else "")
        what = f"reading {shown}"
        if any(r.get("fmt") == "parquet" for r in reads):
            fix.append("or write the Parquet file with smaller row groups (a row group is read whole: "
                       "source.chunk_rows does not split it; pyarrow.parquet.write_table(..., row_group_size=...))")
        else:
            fix.append("or read the file in smaller parts (source.chunk_rows)")
    elif write:
        what = f"writing split {write['split']!r} of {write['location']}"
        units = write.get("units") or []
        if units:
            samples = max(u[2] for u in units) - min(u[1] for u in units)
            size = f" ({_mib(samples * sample_bytes)})" if sample_bytes else ""
            what += f": a block of {samples:,} samples{size} in {len(units)} write unit(s)"
        if unit_bytes:
            what += f" of {_mib(unit_bytes)} each"
        fix.append("or make the write units smaller (output.chunk_samples, or output.target_chunk_mb where "
                   "chunk_samples is not set; output.shard_chunks for sharded stores)")
    else:
        fix.append("or make its chunks smaller")
    memory = restarted.get(last_worker)
    if memory_limit:
        why = (f"the last, {last_worker}, restarted by its nanny at {_mib(memory)} of its {_mib(memory_limit)} "
               f"memory limit" if memory is not None else f"most likely at their {_mib(memory_limit)} memory limit")
    else:
        why = "they had no memory limit: the system's out-of-memory killer, or a crash, is likely"
    return (f"cluster: {attempts} workers died running one task, {what} ({why}); the run was stopped. Give the "
            f"workers more memory (cluster.memory_limit, or dask worker --memory-limit) " + ", ".join(fix)
            + ", and run again: a build resumes")
