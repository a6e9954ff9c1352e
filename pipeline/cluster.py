"""A ``distributed.Client`` from the cluster config: LocalCluster or a remote scheduler.

The same config runs on a laptop and on a cluster: ``address: null`` starts a
LocalCluster here; ``address: tcp://host:8786`` (or ``scheduler_file:``) connects to a
running dask-distributed cluster. Workers must see the same storage as the client (a
shared path or an object store), because they read the raw files and write the zarr
chunks themselves.
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import sys
import threading
import warnings
from typing import IO, TYPE_CHECKING, Any, Iterator, Sequence

from pipeline.errors import ClusterError
from pipeline.remote import check_address, check_tls_files, connect_remote, scheduler_file_address

if TYPE_CHECKING:  # pragma: no cover
    import logging

    import distributed

    from pipeline.workerlog import PausedWorkersWatch

__all__ = ["WORKER_MODULES", "check_address", "check_tls_files", "cluster", "dashboard_link", "scheduler_file_address",
           "start_worker_server"]

#: What a run's tasks import. A LocalCluster's worker processes are forked from one
#: server process that imported these once (multiprocessing's ``forkserver``), instead
#: of each being spawned fresh and importing them all at its first task: on a laptop
#: those imports were most of a run's fixed start-up (see benchmarks/README.md).
WORKER_MODULES: tuple[str, ...] = (
    "pipeline.daskimport",  # first: dask.array without xarray or scipy (see the module)
    "distributed",
    "dask.array",
    "pyarrow.parquet",
    "zarr",
    "pipeline.loaders.segments",
    "pipeline.features.build",
    "pipeline.storage.writer",
    "pipeline.workerlog",
    "pipeline.gcfreeze",
)
_METHOD_KEY = "distributed.worker.multiprocessing-method"

#: How often a LocalCluster's scheduler and workers check that their event loop is not
#: blocked (distributed's ``admin.tick.interval``), where the dask config leaves it at
#: distributed's 20 ms. That watchdog only warns after seconds (``admin.tick.limit``,
#: 3 s), and checking 50 times a second cost the process that holds a LocalCluster's
#: scheduler about 1.7% of a core while idle (benchmarks/README.md).
TICK_INTERVAL = "500ms"
_TICK_KEY = "distributed.admin.tick.interval"
_PROFILE_KEY = "distributed.worker.profile.enabled"

#: distributed's settings that a LocalCluster runs with instead of distributed's
#: defaults, each unless the dask config names a value of its own (see
#: :func:`_local_settings`):
#:
#: - the event-loop watchdog's interval, :data:`TICK_INTERVAL`;
#: - the workers' sampling profiler off. It looks at every task thread's stack 100 times
#:   a second for the dashboard's "Profile" page, and the workers of a build spent 15-20%
#:   more CPU with it, the task threads themselves 10-15% more (benchmarks/README.md).
#:   The dashboard's task stream, progress and memory pages do not need it. To keep it,
#:   name it in dask's YAML config or the environment
#:   (``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=True``).
LOCAL_SETTINGS: dict[str, object] = {_TICK_KEY: TICK_INTERVAL, _PROFILE_KEY: False}

#: glibc's allocator settings for the workers forked from that server. distributed sets
#: only the trim threshold (64 KiB), which also fixes glibc's mmap threshold at 128 KiB:
#: every temporary from 128 KiB up (feature columns, index arrays, compressed chunks) was
#: then a fresh mapping, its pages faulted in one by one and unmapped when freed. Up to
#: 32 MiB (glibc's largest) they come from the heap and are reused, and up to 64 MiB free
#: at its top stays there: a build's system time fell about 3.5x (benchmarks/README.md).
#: One arena for all of a worker's threads: memory that one thread freed (the event loop
#: that receives data, the task thread that makes blocks) is reused by the others rather
#: than kept in an arena of its own; a build's peak worker memory fell about a tenth and
#: its page faults a quarter. pyarrow allocates from that same heap too (its default pool
#: is mimalloc, a heap of its own): the memory a Parquet read frees serves the features
#: and blocks made from it, and a build's peak worker memory fell about a tenth again
#: (benchmarks/README.md). A variable already in the environment wins.
WORKER_MALLOC: dict[str, str] = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(64 << 20),
                                 "MALLOC_ARENA_MAX": "1", "ARROW_DEFAULT_MEMORY_POOL": "system"}


def _configured(key: str) -> bool:
    """Whether the dask config names ``key`` itself: a value other than the default
    that distributed registers for it, or any value in dask's YAML files or the
    environment (``DASK_...``)."""
    import dask

    default = dask.config.get(key, None, config=dask.config.merge(*dask.config.defaults))
    if dask.config.get(key, default) != default:
        return True
    collected: object = dask.config.collect()
    for part in key.split("."):
        if not isinstance(collected, dict):
            return False
        # The environment's keys come as written (dask canonicalizes - and _ on lookup).
        found = [v for k, v in collected.items() if str(k).replace("_", "-") == part.replace("_", "-")]
        if not found:
            return False
        collected = found[0]
    return True


@contextlib.contextmanager
def _local_settings() -> Iterator[None]:
    """:data:`LOCAL_SETTINGS` for a LocalCluster's life (its nannies hand the config to
    the workers they start), each where the dask config does not name a value of its
    own."""
    import importlib

    import dask

    importlib.import_module("distributed")  # its defaults, to tell them from a user's value
    chosen = {k: v for k, v in LOCAL_SETTINGS.items() if not _configured(k)}
    with dask.config.set(chosen):
        yield


def _start_method() -> str:
    """How a LocalCluster starts its workers: ``forkserver`` where the platform has it,
    unless the dask config names another method than distributed's default (spawn)."""
    import dask

    configured = dask.config.get(_METHOD_KEY, "spawn")
    if configured != "spawn" or "forkserver" not in multiprocessing.get_all_start_methods():
        return configured
    return "forkserver"


def start_worker_server(modules: Sequence[str] = WORKER_MODULES) -> bool:
    """Start now, in the background, the process that a LocalCluster's workers will be
    forked from, importing ``modules``; a no-op where workers are not forked from one.

    Call it as early as possible (before the caller's own imports): the server imports
    in a process of its own, on another core, while the caller goes on. Returns whether
    a server runs.
    """
    import importlib

    # distributed's config defaults (read below, and by _start_method) come with it.
    importlib.import_module("distributed")
    if _start_method() != "forkserver":
        return False
    import dask
    from multiprocessing import forkserver

    # The variables distributed sets before it starts a worker process (malloc's trim
    # threshold, one BLAS thread), and ours: a forked worker inherits the server's
    # environment, and glibc reads its variables when a process starts, so the server
    # must start with them. A variable already in the environment wins, as distributed
    # sets them; this process's own environment is left as it was.
    spawn_env = {k: str(v) for k, v in (dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {}).items()
                 if v is not None}
    added = {k: v for k, v in {**spawn_env, **WORKER_MALLOC}.items() if k not in os.environ}
    multiprocessing.get_context("forkserver").set_forkserver_preload(list(modules))
    os.environ.update(added)
    try:
        with _children_ignore_interrupts():
            forkserver.ensure_running()
    finally:
        for key in added:
            os.environ.pop(key, None)
    _skip_distributed_preload()
    return True


def _skip_distributed_preload() -> None:
    """Keep distributed from importing its preload list in this process.

    The first nanny of a forkserver LocalCluster (``distributed.utils.get_mp_context``)
    imports dask's required and optional packages here, pandas among them (half a
    second, on the path to a ready cluster), to hand the server a preload list. The
    server runs already, with ours, and a running server never reads a new list: those
    imports only cost this process. distributed keeps "done" in a module global.
    """
    import distributed.utils

    if hasattr(distributed.utils, "_forkserver_preload_set"):
        distributed.utils._forkserver_preload_set = True


@contextlib.contextmanager
def _children_ignore_interrupts() -> Iterator[None]:
    """Processes started in the block ignore SIGINT for their whole life, and so do the
    processes they fork; this process's own handling is as before once the block ends.

    A terminal's Ctrl-C is a SIGINT to its whole foreground process group: the workers
    of a LocalCluster got it too, each died printing its ``KeyboardInterrupt`` and
    ``CancelledError`` tracebacks, and the scheduler, the nannies and multiprocessing's
    resource tracker then reported the lost workers. The process that holds the cluster
    stops them in order instead (its ``KeyboardInterrupt`` closes the cluster). An
    ignored signal stays ignored across ``exec`` (Python then installs no handler of its
    own), and the forkserver restores it in every process it forks. SIGINT is blocked
    meanwhile, so that a Ctrl-C that comes in the block waits for its end, here, rather
    than being lost.
    """
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - no forkserver there either
        yield
        return
    if signal.getsignal(signal.SIGINT) is None:  # a handler set outside Python: not ours to swap
        yield
        return
    was_blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    # Only the main thread may set a handler; the mask alone still keeps it from the children.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
        if not was_blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def dashboard_link(client: object) -> str | None:
    """The dashboard URL of a client's scheduler, if it serves one."""
    try:
        return client.dashboard_link  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a scheduler without bokeh has no dashboard
        return None


def _has_bokeh() -> bool:
    import importlib.util

    return importlib.util.find_spec("bokeh") is not None


def _serve_dashboard(local: "distributed.LocalCluster") -> None:
    """Add the dashboard's pages to a LocalCluster whose scheduler started without them,
    when someone first asks for one.

    Importing bokeh and building its pages cost a build about 4-5 s of CPU (a demo
    ``pipeline run`` took 0.86x the wall time without it, ``benchmarks/README.md``), on
    cores the build needs, and most runs are never looked at. The scheduler's web server
    (and so the printed link) is up from the start; a page asked for before the pages
    exist is answered once they do (bokeh imported off the event loop), with a redirect
    to itself.
    """
    from tornado import web
    from tornado.ioloop import IOLoop

    scheduler = local.scheduler
    routes = scheduler.http_application  # distributed's RoutingApplication
    state: dict[str, object] = {}

    def _bokeh_pages() -> object:
        from distributed.dashboard.scheduler import connect

        return connect

    class _FirstVisit(web.RequestHandler):
        async def get(self) -> None:
            try:
                if "connect" not in state:
                    connect = await IOLoop.current().run_in_executor(None, _bokeh_pages)
                    if "connect" not in state:  # another request may have added them meanwhile
                        state["connect"] = connect
                        connect(routes, scheduler.http_server, scheduler, prefix="/")
                        # distributed's application tries added applications in order after
                        # its own routes: the pages (added after this one) now answer.
                        routes.applications.remove(first_visit)
            except Exception as exc:  # noqa: BLE001 - the build goes on; the page says why
                self.set_status(503)
                self.finish(f"the dashboard's pages could not be built: {type(exc).__name__}: {exc}")
                return
            self.redirect(self.request.uri)

    first_visit = web.Application([(r"/.*", _FirstVisit)])
    routes.add_application(first_visit)


def unguarded_main() -> str | None:
    """The script (``python script.py``, ``python -m pkg.mod``) whose top-level code, not
    under ``if __name__ == "__main__":``, is running now, or None (a guarded block, a
    function called from elsewhere, stdin, a notebook). Worker processes started by
    spawn or forkserver import the main script again: unguarded, it starts them again."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str) or not os.path.isfile(path):
        return None
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    import ast

    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    line = frame.f_lineno
    for stmt in tree.body:
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            return None if _is_main_guard(stmt) else path
    return None


def _is_main_guard(stmt: Any) -> bool:
    """Whether ``stmt`` is an ``if`` whose test compares ``__name__`` with ``"__main__"``
    (either way round, alone or among other conditions)."""
    import ast

    if not isinstance(stmt, ast.If):
        return False
    for node in ast.walk(stmt.test):
        if isinstance(node, ast.Compare) and len(node.comparators) == 1 and isinstance(node.ops[0], ast.Eq):
            sides = [node.left, node.comparators[0]]
            names = [s.id for s in sides if isinstance(s, ast.Name)]
            texts = [s.value for s in sides if isinstance(s, ast.Constant)]
            if names == ["__name__"] and texts == ["__main__"]:
                return True
    return False


@contextlib.contextmanager
def cluster(
    address: str | None = None,
    *,
    n_workers: int = 2,
    threads_per_worker: int = 1,
    memory_limit: str | int = "auto",
    scheduler_file: str | None = None,
    dashboard_address: str = "127.0.0.1:0",
    processes: bool = True,
    tls_ca_file: str | None = None,
    tls_cert_file: str | None = None,
    tls_key_file: str | None = None,
    timeout: float = 30.0,
    log: IO[str] | None = sys.stderr,
    preload: Sequence[str] = WORKER_MODULES,
    warm_imports: Sequence[str] = (),
    paused_after: float | None = 5.0,
    unanswered_after: float | None = 15.0,
    stalled_after: float | None = 30.0,
) -> Iterator["distributed.Client"]:
    """Start or connect to a dask cluster and yield a client for it.

    Parameters
    ----------
    address
        ``None`` starts a LocalCluster; otherwise the scheduler address, for example
        ``tcp://10.0.0.5:8786`` or ``tls://scheduler:8786``.
    n_workers
        LocalCluster workers (ignored, like the next four, for a remote cluster).
    threads_per_worker
        Threads of each LocalCluster worker.
    memory_limit
        Memory per LocalCluster worker (``"4GiB"``, bytes, or ``"auto"``).
    dashboard_address
        Where the LocalCluster's dashboard listens: 127.0.0.1 by default, so that a
        laptop run is not reachable from the network; ``None``: no dashboard.
    processes
        Workers as processes (``False``: threads of this process).
    scheduler_file
        Path of a scheduler file written by ``dask scheduler --scheduler-file``.
    tls_ca_file
        The CA certificate, for ``tls://`` addresses (``distributed.security.Security``).
    tls_cert_file
        This client's certificate, for ``tls://`` addresses.
    tls_key_file
        This client's private key, for ``tls://`` addresses.
    timeout
        Seconds to wait for a remote scheduler: for its scheduler file to appear, for
        a connection and for its answer. Each is checked before a Client starts, and
        anything wrong (an address that is not a scheduler's, a missing TLS file, a
        server that does not speak dask's protocol) is one line: a ConfigError for
        the config, a ClusterError for the scheduler. For a LocalCluster, the most
        seconds its workers may take to start; the first error a nanny logs ends the
        wait sooner (a ClusterError naming it).
    log
        Where to print the cluster, its workers and its dashboard's address (a remote
        scheduler without workers is given up to :data:`FIRST_WORKER_WAIT` seconds for
        its first, or said to have none yet), and a warning for workers paused at their
        memory limit; ``None`` prints nothing (and waits for no worker).
    preload
        Modules a LocalCluster's worker processes hold imported from their start: they
        are forked from a server process that imported them once (see
        :func:`start_worker_server`). Ignored for a remote cluster, for threads
        (``processes=False``) and when the dask config names a start method of its own
        (``distributed.worker.multiprocessing-method``).
    warm_imports
        Modules a LocalCluster's worker processes import in the background once set up
        (``pipeline run``: :data:`pipeline.gcfreeze.WARM_MODULES`); ignored where ``preload`` is.
    paused_after
        Seconds workers may stay paused at their memory limit, or the scheduler stay
        without workers, while tasks wait, before a warning on ``log`` names them
        (:class:`pipeline.workerlog.PausedWorkersWatch`); ``None``: no warning.
    unanswered_after
        Seconds the scheduler may leave a question unanswered before a line on ``log``
        says so (a stopped process, a paused VM, a network partition: its connections
        stay open, and the client would wait without a word), and another once it
        answers again. The run keeps waiting: a scheduler that comes back finishes it.
        ``None``: nothing said.
    stalled_after
        Seconds every worker of a LocalCluster may stay paused at its memory limit
        running no task, while tasks wait, before the run is stopped with a
        :class:`~pipeline.errors.ClusterError` naming the worker's memory and the limit
        to set (such a worker frees nothing, and no other joins); ``None``: it waits.
        A LocalCluster of worker processes whose worker is paused as it starts is
        refused at once.

    Raises
    ------
    ClusterError
        Besides a cluster that cannot be started or reached: a task that every worker
        running it died of (distributed's ``KilledWorker``, most often a worker
        restarted at its memory limit), naming what the task read or wrote, the memory
        limit and the settings that help; and a LocalCluster whose workers cannot run a
        task within their memory limit.

    Yields
    ------
    distributed.Client
        Registered as the default scheduler for dask computations in the block.
    """
    with contextlib.ExitStack() as settings:
        if address is None and scheduler_file is None:
            _enter_local_settings(settings, processes)
        client, local = _connect(address, scheduler_file, timeout, tls_ca_file, tls_cert_file, tls_key_file,
                                 preload=preload if processes else None, log=log, n_workers=n_workers,
                                 threads_per_worker=threads_per_worker, memory_limit=memory_limit,
                                 dashboard_address=dashboard_address, processes=processes)
        watch, watcher = contextlib.ExitStack(), None
        try:
            watcher = _set_up(watch, client, local, log, processes=processes, warm_imports=warm_imports,
                              dashboard=dashboard_address is not None, paused_after=paused_after,
                              unanswered_after=unanswered_after, stalled_after=stalled_after)
            yield client
        except Exception as exc:
            error = _run_error(exc, client, watcher)
            if error is None:
                raise
            raise error from None
        finally:
            _close(watch, client, local, log)


def _set_up(watch: contextlib.ExitStack, client: "distributed.Client", local: Any, log: IO[str] | None, *,
            processes: bool, warm_imports: Sequence[str], dashboard: bool, paused_after: float | None,
            unanswered_after: float | None, stalled_after: float | None) -> "PausedWorkersWatch | None":
    """What follows a connection: a LocalCluster's idle memory checked, the workers'
    plugins, the cluster announced on ``log`` and its workers watched (entered on
    ``watch``); returns the watch."""
    if local is not None and processes:
        # First: a worker over its memory limit as it starts is soon killed by its nanny,
        # which on a loaded machine happened while the plugins were registered (a
        # CommClosedError's traceback instead of this one line).
        _check_idle_memory(client)
    _register_plugins(client, local=local is not None, processes=processes, warm_imports=warm_imports)
    if log is not None:
        _announce(client, local, log, dashboard=dashboard)
    return _watch_workers(watch, client, log, paused_after=paused_after, unanswered_after=unanswered_after,
                          stalled_after=stalled_after if local is not None else None)


def _register_plugins(client: "distributed.Client", *, local: bool, processes: bool,
                      warm_imports: Sequence[str] = ()) -> None:
    """The plugins of a LocalCluster's workers (``local``) and of the scheduler,
    registered through ``client``."""
    if local:
        # The workers share the user's terminal: a task's own error is reported once,
        # by the client, not first dumped by every worker (pipeline.workerlog).
        from pipeline.gcfreeze import FreezeWorkerHeap
        from pipeline.workerlog import IgnoreInterrupts, QuietOwnErrors

        client.register_plugin(QuietOwnErrors())
        if processes:
            # The workers' own processes (not threads of the caller's): what they
            # hold once set up is left out of their full collections (pipeline.gcfreeze),
            # and a Ctrl-C at the terminal, which reaches them too, is this process's
            # to handle: it closes them (pipeline.workerlog.IgnoreInterrupts).
            client.register_plugin(FreezeWorkerHeap(warm_imports))
            client.register_plugin(IgnoreInterrupts())
    _record_failed_tasks(client)


def _watch_workers(watch: contextlib.ExitStack, client: "distributed.Client", log: IO[str] | None, *,
                   paused_after: float | None, unanswered_after: float | None,
                   stalled_after: float | None) -> "PausedWorkersWatch | None":
    """A :class:`pipeline.workerlog.PausedWorkersWatch` of ``client``'s cluster, entered on
    ``watch``, where it has something to say on ``log`` or a stalled run to stop
    (``stalled_after`` is ``None`` for a remote cluster); otherwise ``None``."""
    if not (log is not None and (paused_after is not None or unanswered_after is not None)
            or stalled_after is not None):
        return None
    from pipeline.workerlog import PausedWorkersWatch

    # paused_after=None: never named (no look at the workers lasts that long).
    return watch.enter_context(PausedWorkersWatch(
        client, log if log is not None and paused_after is not None else _NoLog(),
        after=paused_after or float("inf"), unanswered_after=unanswered_after if log is not None else None,
        stalled_after=stalled_after))


def _run_error(exc: Exception, client: "distributed.Client",
               watcher: "PausedWorkersWatch | None") -> ClusterError | None:
    """The one-line :class:`~pipeline.errors.ClusterError` that ``exc``, raised in a
    cluster's block, stands for (workers that stayed paused running nothing, a
    ``KilledWorker``); ``None`` where ``exc`` is to go on as it is."""
    if watcher is not None and watcher.stalled is not None:
        return ClusterError(watcher.stalled)
    from distributed.scheduler import KilledWorker

    if isinstance(exc, KilledWorker):
        return ClusterError(_killed_worker(client, exc))
    return None


def _close(watch: contextlib.ExitStack, client: "distributed.Client",
           local: "distributed.LocalCluster | None", log: Any = None) -> None:
    """Close the watch, the client and a LocalCluster, in that order, a Ctrl-C meanwhile
    held until they are closed (:func:`_interrupts_deferred`). A close that fails (a
    nanny that would not stop its worker in time) is one line (:func:`_said_close_failed`),
    never raised: the run's own error stays the one reported (a close's ``TimeoutError``
    replaced it: a run whose paused workers ran out of memory ended with only that
    traceback), and a run that finished stays done."""
    with _interrupts_deferred():
        try:
            watch.close()  # before the client it asks closes
            client.close()
            if local is not None:
                local.close()
        except Exception as exc:  # noqa: BLE001 - see above
            _said_close_failed(log, exc)


def _said_close_failed(log: Any, exc: BaseException) -> None:
    """One line, to ``log`` (else a warning), for a cluster whose close failed."""
    text = f"cluster: closing the cluster failed ({type(exc).__name__}: {exc or 'no detail'}); its worker " \
           "processes are stopped as this process exits"
    if log is not None:
        print(text, file=log, flush=True)
    else:
        warnings.warn(text, RuntimeWarning, stacklevel=3)


class _NoLog:
    """A log that drops what is written to it."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _record_failed_tasks(client: Any) -> None:
    """Register :class:`pipeline.taskfacts.TaskFacts` on the scheduler of ``client``, so
    that a ``KilledWorker`` can be told as the file or block its task read or wrote.

    A scheduler that cannot take it (one without pipeline installed, where the graph's
    own functions could not be read either) leaves the message with the task's name.
    """
    from pipeline.taskfacts import TaskFacts

    try:
        client.register_plugin(TaskFacts())
    except Exception:  # noqa: BLE001 - only the message of a later failure is poorer
        pass


def _check_idle_memory(client: Any) -> None:
    """Refuse a LocalCluster whose worker, running no task, already holds the fraction of
    its memory limit at which dask pauses a worker: it would never run one, and the run
    would wait for good. (A worker of threads measures the caller's process instead:
    not checked.)"""
    from pipeline.workerlog import _pause_fraction, idle_over_limit_line

    pause = _pause_fraction()
    for address, info in client.scheduler_info(n_workers=-1).get("workers", {}).items():
        limit = int(info.get("memory_limit") or 0)
        memory = (info.get("metrics") or {}).get("memory")
        if limit and memory is not None and (info.get("status") == "paused" or memory >= pause * limit):
            raise ClusterError(idle_over_limit_line(address, int(memory), limit, pause))


def _killed_worker(client: Any, exc: BaseException) -> str:
    """The one line of a ``KilledWorker``: what its task read or wrote (as the
    scheduler's :class:`pipeline.taskfacts.TaskFacts` recorded it), the workers' memory
    limit and whether their nannies restarted them for memory, and what to set."""
    from pipeline.taskfacts import failed_task_facts, killed_worker_line, memory_restarts

    key = getattr(exc, "task", None)
    last = getattr(exc, "last_worker", None)
    facts = failed_task_facts(client, key)
    write = facts.get("write") or {}
    sample_bytes, unit_bytes = _split_sizes(write) if write else (None, None)
    return killed_worker_line(key, attempts=int(getattr(exc, "allowed_failures", 3)) + 1,
                              memory_limit=getattr(last, "memory_limit", None), restarted=memory_restarts(client),
                              last_worker=str(getattr(last, "address", "")), facts=facts,
                              unit_bytes=unit_bytes, sample_bytes=sample_bytes)


def _split_sizes(write: dict[str, Any]) -> tuple[int | None, int | None]:
    """The bytes of one sample, and of one write unit (a chunk, or a shard), of the
    arrays of a split being written, from the store's metadata; ``(None, None)`` when
    it cannot be read."""
    import math

    from pipeline.storage.store import open_store_group

    try:
        group = open_store_group(write["location"], mode="r", storage_options=write.get("storage_options") or None)
        arrays = [a for name, a in group[write["split"]].arrays() if not name.startswith("_")]
        sample = sum(math.prod(a.shape[1:]) * a.dtype.itemsize for a in arrays)
        unit = max(int((a.shards or a.chunks)[0]) for a in arrays)
    except Exception:  # noqa: BLE001 - the sizes only add to the message
        return None, None
    return (sample, sample * unit) if arrays else (None, None)


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """A SIGINT (Ctrl-C), or a SIGTERM that this process handles in Python, that comes
    while the block runs is held until its end, and delivered then, unless an exception
    is on its way out already (a first Ctrl-C's ``KeyboardInterrupt``, a run's error): it
    is the answer to that.

    Closing the cluster is what a first Ctrl-C leads to. A second one, pressed while the
    cluster closed, cancelled distributed's close midway: the cluster stayed "closing",
    and at the process's exit distributed waited 10 s for it to close again before
    giving up. The close is short (the workers, which ignore the Ctrl-C, stop when their
    nannies ask them). SIGTERM is held only where a handler of Python's is set for it
    (``pipeline run`` sets one, :mod:`pipeline.cli`): with the system's default it ends
    the process at once, here as anywhere. Only the main thread may set a handler (and
    one set outside Python could not be put back): elsewhere nothing is held.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = [s for s in _deferrable_signals() if signal.getsignal(s) is not None]
    came: list[int] = []
    previous = {s: signal.signal(s, lambda signum, frame: came.append(signum)) for s in held}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if came and sys.exc_info()[0] is None:
        # To the handler there was before: KeyboardInterrupt, or whatever the caller chose.
        signal.raise_signal(came[0])


def _deferrable_signals() -> tuple[int, ...]:
    """The signals :func:`_interrupts_deferred` holds now: SIGINT, and SIGTERM while a
    Python function handles it (not the system's default, which ends the process, nor
    ``SIG_IGN``)."""
    term = signal.getsignal(signal.SIGTERM)
    return (signal.SIGINT, signal.SIGTERM) if callable(term) else (signal.SIGINT,)


def _enter_local_settings(settings: contextlib.ExitStack, processes: bool) -> None:
    """The settings a LocalCluster runs under, entered on ``settings`` for its whole life."""
    if processes:
        import importlib

        import dask

        # distributed's defaults first: leaving the block restores the value they set.
        importlib.import_module("distributed")
        # For the cluster's whole life: a worker that dies is restarted the same way.
        settings.enter_context(dask.config.set({_METHOD_KEY: _start_method()}))
        # distributed's nannies set their pre-spawn variables in this process's own
        # environment before each worker starts, and leave them there: restored once
        # the cluster is closed, so that the caller's later subprocesses do not get them.
        names = (dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {}).keys()
        settings.callback(_restore_environ, {k: os.environ.get(k) for k in names})
        settings.enter_context(_main_file_hidden())
    settings.enter_context(_local_settings())
    from pipeline.workerlog import quiet_cancelled_feeds, quiet_failed_for_dead_workers

    # The scheduler logs here: a progress bar's feed cancelled at close is not an error,
    # and a task its workers died of is the client's one line (cluster's KilledWorker).
    settings.enter_context(quiet_cancelled_feeds())
    settings.enter_context(quiet_failed_for_dead_workers())


#: Seconds the announcement of a remote cluster waits for its first worker to register:
#: workers started with the scheduler (a DaskJob, a SLURM allocation) join it a moment
#: later. Bounded: a run goes on without them, its tasks waiting for the workers.
FIRST_WORKER_WAIT = 5.0


def _workers(client: Any, wait: float) -> int:
    """How many workers the scheduler of ``client`` has, waiting up to ``wait`` seconds
    for the first one when it has none."""
    n = len(client.scheduler_info().get("workers", {}))
    if n or wait <= 0:
        return n
    try:
        client.wait_for_workers(1, timeout=wait)
    except TimeoutError:
        return 0
    return len(client.scheduler_info().get("workers", {}))


def _announce(client: Any, local: Any, log: IO[str], *, dashboard: bool = True) -> None:
    """The cluster's kind, its workers and its dashboard's address, on ``log``; no
    dashboard line for a LocalCluster started without one (``dashboard`` false) or a
    remote scheduler that serves none."""
    kind = "LocalCluster" if local is not None else f"scheduler {client.scheduler.address}"
    # A LocalCluster's workers are up once it has started; a remote scheduler's may be
    # starting still: "with 0 workers" read as a cluster that would never compute.
    n = _workers(client, 0.0 if local is not None else FIRST_WORKER_WAIT)
    workers = (f"{n} worker{'' if n == 1 else 's'}" if n or local is not None
               else "0 workers yet; waiting for workers (the tasks start when one joins)")
    print(f"cluster: {kind} with {workers}", file=log)
    # distributed names a link whenever the scheduler serves HTTP, which it does without
    # the dashboard too (its health and metrics routes): a LocalCluster started with
    # dashboard_address=None, a `dask scheduler --no-dashboard`, printed a link to no page.
    link = dashboard_link(client) if (dashboard if local is not None else _serves_dashboard(client)) else None
    if link and local is not None:
        link = _bound_link(link, local)
    if link:
        print(f"dashboard: {link}", file=log)


def _bound_link(link: str, local: Any) -> str:
    """``link`` with the host the LocalCluster's dashboard is bound to.

    distributed names the host of the scheduler's address, which for workers that are
    threads (``inproc://``) is the machine's network address: a link to 192.0.2.2 for a
    dashboard that listens on 127.0.0.1 only leads nowhere.
    """
    from urllib.parse import urlsplit, urlunsplit

    try:
        sockets = local.scheduler.http_server._sockets.values()  # tornado keeps no public list
        hosts = {sock.getsockname()[0] for sock in sockets}
    except Exception:  # noqa: BLE001 - another tornado or distributed: distributed's link
        return link
    parts = urlsplit(link)
    if len(hosts) != 1 or parts.port is None:
        return link
    host = hosts.pop()
    if host in ("0.0.0.0", "::", parts.hostname):  # every interface: distributed's host is one of them
        return link
    return urlunsplit(parts._replace(netloc=f"[{host}]:{parts.port}" if ":" in host else f"{host}:{parts.port}"))


def _serves_dashboard(client: Any) -> bool:
    """Whether a remote scheduler serves the dashboard's pages (``True`` when it cannot
    be asked: its link is printed as before)."""

    # Defined here, so that it travels by value: the scheduler need not have pipeline.
    def has_pages(dask_scheduler: Any = None) -> bool:
        routes = getattr(dask_scheduler, "http_application", None)
        return bool(getattr(routes, "applications", [True]))

    try:
        return bool(client.run_on_scheduler(has_pages))
    except Exception:  # noqa: BLE001 - a scheduler that runs no function of a client's
        return True


@contextlib.contextmanager
def _main_file_hidden() -> Iterator[None]:
    """Hide ``__main__.__file__`` from multiprocessing while it names no file on disk.

    A script piped in (``python - < script.py``, ``python - <<EOF``) runs as a
    ``__main__`` whose ``__file__`` is ``"<stdin>"``. multiprocessing hands that path to
    every worker process a nanny starts, and the worker, which runs the parent's main
    file first, failed with ``FileNotFoundError: .../<stdin>``: the LocalCluster never
    started. Without ``__file__`` (as under ``python -c`` or in a notebook) a worker
    runs no main module. Hidden for the cluster's whole life, since a nanny restarts a
    worker that died the same way; a real script's path is left alone.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str) or os.path.isfile(path) or getattr(main, "__spec__", None):
        yield
        return
    del main.__file__
    try:
        yield
    finally:
        if not hasattr(main, "__file__"):
            main.__file__ = path


def _restore_environ(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@functools.cache
def _thread_worker() -> type:
    """distributed's ``Worker`` for a LocalCluster of threads, without bokeh pages of its own.

    Such a worker is given a loopback address for its HTTP server (see :func:`_connect`),
    and distributed then builds the worker's own bokeh pages too (its ``dashboard``
    follows that address): bokeh imported on the cluster's event loop as it starts, 0.7 s
    of CPU in a run of a few seconds. Its metrics and health routes stay, and so does the
    scheduler's dashboard, whose pages show every worker.
    """
    from distributed import Worker

    class ThreadWorker(Worker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["dashboard"] = False
            super().__init__(*args, **kwargs)

    return ThreadWorker


def _connect(address: str | None, scheduler_file: str | None, timeout: float, tls_ca_file: str | None,
             tls_cert_file: str | None, tls_key_file: str | None, *, preload: Sequence[str] | None,
             log: IO[str] | None = None,
             **local_kwargs: object) -> tuple["distributed.Client", "distributed.LocalCluster | None"]:
    """A client of a new LocalCluster (and the cluster, its dashboard's pages added on
    a first visit: :func:`_serve_dashboard`), or of a remote scheduler."""
    if address is not None or scheduler_file is not None:
        # An address wins over a scheduler file: --scheduler overrides a config's either.
        client = connect_remote(address, scheduler_file, timeout, tls_ca_file, tls_cert_file, tls_key_file, log)
        return client, None
    from distributed import Client, LocalCluster

    script = unguarded_main() if local_kwargs["processes"] else None
    if script is not None:
        # Its worker processes would each import the script again, run this very line and
        # fail (multiprocessing's "bootstrapping phase" error, in each child only): the
        # wait for them then ended after 30 s saying the nannies logged no error.
        raise ClusterError(f"{script}: starts a LocalCluster of worker processes in its top-level code, which every "
                           "worker process runs again as it imports the script; put the code that starts it (a "
                           "pipeline.run, pipeline.cluster, pipeline.write or stream on a cluster) under "
                           "`if __name__ == \"__main__\":`")
    n_workers = int(local_kwargs.pop("n_workers"))  # type: ignore[call-overload]
    local = None
    client = None
    later = local_kwargs["dashboard_address"] is not None and _has_bokeh()
    # The nannies' errors are collected until a failed start is closed too: one that a
    # nanny logs while it closes (a second failed start, under load) would otherwise
    # print its traceback after the run's one line.
    with _nanny_errors() as errors:
        try:
            if preload is not None:
                start_worker_server(preload)
            # The scheduler alone first, in this process (short): a Ctrl-C or SIGTERM that comes
            # meanwhile waits for it, so that what started is closed below. One that broke off
            # distributed's start of the workers left nannies starting that distributed's own
            # close at the exit then failed on (``AssertionError: Status.init``).
            with _interrupts_deferred():
                # In-process clusters talk over inproc://, which takes no host.
                # Threads' own HTTP servers (a worker's metrics and profile) would listen on
                # every interface: on loopback, as those of worker processes.
                local = LocalCluster(n_workers=0, **local_kwargs,
                                     **({"host": "127.0.0.1"} if local_kwargs["processes"]
                                        else {"worker_dashboard_address": "127.0.0.1:0",
                                              "worker_class": _thread_worker()}),
                                     scheduler_kwargs={"dashboard": False} if later else None)
                client = Client(local)
            local.scale(n_workers)
            _await_workers(local, n_workers, timeout, errors)
        except (OSError, RuntimeError, TimeoutError) as exc:
            _close_started(client, local)
            raise ClusterError(f"cannot start a LocalCluster: {exc}") from exc
        except BaseException:
            # A ClusterError of _await_workers, an interrupt: the workers started so far stop.
            _close_started(client, local)
            raise
    if later:
        _serve_dashboard(local)
    return client, local


#: Seconds :func:`_close_started` gives a LocalCluster that failed to start to close:
#: a nanny whose worker process never started can stay "closing" for good.
START_CLOSE_WAIT = 10.0


def _close_started(client: "distributed.Client | None", local: "distributed.LocalCluster | None") -> None:
    """Close what a LocalCluster's failed or interrupted start left, within
    :data:`START_CLOSE_WAIT` seconds, a Ctrl-C meanwhile held."""
    with _interrupts_deferred():
        if client is not None:
            with contextlib.suppress(Exception):
                client.close(timeout=START_CLOSE_WAIT)
        if local is None:
            return
        with contextlib.suppress(Exception):
            # distributed's close waits for the starts under way first: those workers
            # stop too, rather than being left to its close at the exit.
            local.close(timeout=START_CLOSE_WAIT)
        # Closed, or given up on: not closed again at the exit (another 10 s, and its
        # traceback for workers still starting).
        local.shutdown_on_close = False


@contextlib.contextmanager
def _nanny_errors() -> Iterator[list["logging.LogRecord"]]:
    """The errors distributed's nannies log in the block, collected instead of printed:
    a worker process that cannot start is told in one line (:func:`_await_workers`)."""
    import logging

    records: list[logging.LogRecord] = []

    def keep(record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        records.append(record)
        return False

    nanny = logging.getLogger("distributed.nanny")
    nanny.addFilter(keep)
    try:
        yield records
    finally:
        nanny.removeFilter(keep)


def _await_workers(local: "distributed.LocalCluster", n_workers: int, timeout: float,
                   errors: Sequence["logging.LogRecord"]) -> None:
    """Wait until the ``n_workers`` workers that ``local`` was scaled to have started.

    distributed's own start waits for good for a nanny whose worker process never
    started (a forkserver that refuses the connection leaves the nanny "closing"): the
    wait ends at the first error a nanny logs, or after ``timeout`` seconds.

    Raises
    ------
    ClusterError
        Naming the workers that did not start and the cause from the nannies' log.
    """
    import time

    from distributed.core import Status

    deadline = time.monotonic() + timeout
    while True:
        started = [w for w in list(local.workers.values()) if w.status == Status.running]
        if len(started) >= n_workers:
            return
        if errors or time.monotonic() >= deadline:
            raise ClusterError(workers_not_started_line(n_workers, len(started), timeout, errors))
        time.sleep(0.02)


def workers_not_started_line(n_workers: int, started: int, timeout: float,
                             errors: Sequence["logging.LogRecord"]) -> str:
    """The one line of a LocalCluster whose worker processes did not start: how many,
    and the first error its nannies logged (with the exception at its root), or how
    long the run waited."""
    what = f"{n_workers - started} of its {n_workers} worker processes" if started else "its worker processes"
    if errors:
        first = errors[0]
        cause = first.getMessage()
        exc = first.exc_info[1] if first.exc_info else None
        root = _root_cause(exc) if exc is not None else None
        if root is not None:
            cause += f": {type(root).__name__}: {root}"
        return f"cannot start a LocalCluster: {what} could not start (the nanny's log: {cause})"
    return (f"cannot start a LocalCluster: {what} did not start within {timeout:g} s, and their nannies "
            f"logged no error")


def _root_cause(exc: BaseException) -> BaseException:
    """The first exception of ``exc``'s chain: the one the others were raised handling."""
    seen = {id(exc)}
    while True:
        inner = exc.__cause__ or exc.__context__
        if inner is None or id(inner) in seen:
            return exc
        seen.add(id(inner))
        exc = inner
