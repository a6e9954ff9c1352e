"""A ``distributed.Client`` from the cluster config: LocalCluster or a remote scheduler.

The same config runs on a laptop and on a cluster: ``address: null`` starts a
LocalCluster here; ``address: tcp://host:8786`` (or ``scheduler_file:``) connects to a
running dask-distributed cluster. Workers must see the same storage as the client (a
shared path or an object store), because they read the raw files and write the zarr
chunks themselves.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import socket
import ssl
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any, Iterator, Sequence

from pipeline.errors import ClusterError, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    import distributed

__all__ = ["WORKER_MODULES", "check_address", "check_tls_files", "cluster", "dashboard_link", "scheduler_file_address",
           "start_worker_server"]

#: What a run's tasks import. A LocalCluster's worker processes are forked from one
#: server process that imported these once (multiprocessing's ``forkserver``), instead
#: of each being spawned fresh and importing them all at its first task: on a laptop
#: those imports were most of a run's fixed start-up (see benchmarks/README.md).
WORKER_MODULES: tuple[str, ...] = (
    "pipeline.daskimport",  # first: dask.array without xarray (see the module)
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
        forkserver.ensure_running()
    finally:
        for key in added:
            os.environ.pop(key, None)
    return True


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
    paused_after: float | None = 5.0,
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
        the config, a ClusterError for the scheduler.
    log
        Where to print the dashboard address, and a warning for workers paused at
        their memory limit; ``None`` prints nothing.
    preload
        Modules a LocalCluster's worker processes hold imported from their start: they
        are forked from a server process that imported them once (see
        :func:`start_worker_server`). Ignored for a remote cluster, for threads
        (``processes=False``) and when the dask config names a start method of its own
        (``distributed.worker.multiprocessing-method``).
    paused_after
        Seconds workers may stay paused at their memory limit, or the scheduler stay
        without workers, while tasks wait, before a warning on ``log`` names them
        (:class:`pipeline.workerlog.PausedWorkersWatch`); ``None``: no warning.

    Yields
    ------
    distributed.Client
        Registered as the default scheduler for dask computations in the block.
    """
    with contextlib.ExitStack() as settings:
        if address is None and scheduler_file is None:
            _enter_local_settings(settings, processes)
        client, local, later = _connect(address, scheduler_file, timeout, tls_ca_file, tls_cert_file, tls_key_file,
                                 preload=preload if processes else None, log=log, n_workers=n_workers,
                                 threads_per_worker=threads_per_worker, memory_limit=memory_limit,
                                 dashboard_address=dashboard_address, processes=processes)
        if later:
            _serve_dashboard(local)
        if local is not None:
            # The workers share the user's terminal: a task's own error is reported once,
            # by the client, not first dumped by every worker (pipeline.workerlog).
            from pipeline.gcfreeze import FreezeWorkerHeap
            from pipeline.workerlog import QuietOwnErrors

            client.register_plugin(QuietOwnErrors())
            if processes:
                # The workers' own processes (not threads of the caller's): what they
                # hold once set up is left out of their full collections (pipeline.gcfreeze).
                client.register_plugin(FreezeWorkerHeap())
        watch = contextlib.ExitStack()
        try:
            if log is not None:
                _announce(client, local, log)
            if log is not None and paused_after is not None:
                from pipeline.workerlog import PausedWorkersWatch

                watch.enter_context(PausedWorkersWatch(client, log, after=paused_after))
            yield client
        finally:
            watch.close()  # before the client it asks closes
            client.close()
            if local is not None:
                local.close()


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
    from pipeline.workerlog import quiet_cancelled_feeds

    # The scheduler logs here: a progress bar's feed cancelled at close is not an error.
    settings.enter_context(quiet_cancelled_feeds())


def _announce(client: Any, local: Any, log: IO[str]) -> None:
    """The cluster's kind, its workers and its dashboard's address, on ``log``."""
    kind = "LocalCluster" if local is not None else f"scheduler {client.scheduler.address}"
    n = len(client.scheduler_info().get("workers", {}))
    print(f"cluster: {kind} with {n} workers", file=log)
    link = dashboard_link(client)
    if link:
        print(f"dashboard: {link}", file=log)


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


# -- a remote scheduler: what is checked before a Client starts ------------------------

#: The port ``dask scheduler`` listens on unless told otherwise, and its dashboard's.
SCHEDULER_PORT = 8786
DASHBOARD_PORT = 8787

#: The config keys of the TLS files, in the order ``cluster()`` takes them.
_TLS_KEYS = ("cluster.tls_ca_file", "cluster.tls_cert_file", "cluster.tls_key_file")


def _host_of(loc: str) -> str:
    """The host of ``host:port/path`` (``[v6]:port`` too), for a hint; ``HOST`` if none."""
    hostport = loc.split("/", 1)[0]
    if hostport.startswith("["):
        return hostport.partition("]")[0] + "]"
    return hostport.rpartition(":")[0] if ":" in hostport else (hostport or "HOST")


def _scheme_problem(scheme: str) -> str | None:
    """Why distributed cannot connect to a scheduler through ``scheme`` from here, or
    ``None`` when it can."""
    from distributed.comm import registry

    try:
        backend = registry.get_backend(scheme)
    except ValueError:
        return f"unknown scheme {scheme}://"
    if scheme == "ucx":
        return "distributed no longer supports ucx:// (the distributed-ucxx package adds UCX back)"
    try:
        # A registered scheme may still be unusable: ucx://'s connector, for one, is an
        # abstract class since distributed removed it.
        backend.get_connector()
    except Exception as exc:  # noqa: BLE001 - any failure means: not usable here
        return f"distributed cannot connect through {scheme}:// here ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    return None


def check_address(address: object, *, key: str = "cluster.address") -> str:
    """``address`` when distributed can connect to it from here, else a ConfigError
    naming ``key``; nothing is contacted.

    distributed answers an ``http://`` URL (the dashboard's, as ``dask scheduler``
    prints it) or an address without a port with a traceback from inside it, a port
    above 65535 with 30 s of retries, and ``ucx://`` (removed from distributed) with an
    error about abstract classes.

    Parameters
    ----------
    address
        A scheduler address: ``tcp://host:port``, ``tls://host:port`` (also ``ws://``,
        ``wss://``); ``host:port`` means ``tcp://``, as for distributed.
    key
        The config key the address came from, named by the error.

    Returns
    -------
    str
        ``address``, unchanged.
    """
    expected = f"a scheduler address such as tcp://host:{SCHEDULER_PORT}"
    if not isinstance(address, str) or not address.strip():
        raise ConfigError(key, expected, address)
    scheme, sep, loc = address.partition("://")
    if not sep:
        scheme, loc = "tcp", address  # distributed's default scheme
    host = _host_of(loc)
    if scheme.lower() in ("http", "https"):
        raise ConfigError(key, expected, address, detail=(
            f"{address!r} is a web address (the dashboard's, on port {DASHBOARD_PORT} by default), not the "
            f"scheduler's: that is tcp://{host}:{SCHEDULER_PORT} by default ('Scheduler at:' in dask scheduler's log)"))
    if scheme == "inproc":  # a scheduler in this process (a LocalCluster of threads): no host or port
        return address
    problem = _scheme_problem(scheme)
    if problem is not None:
        raise ConfigError(key, expected, address, detail=(
            f"{address!r}: {problem}; expected tcp://host:port or tls://host:port"))
    from distributed.comm.addressing import parse_host_port

    try:
        host, port = parse_host_port(loc)
    except ValueError as exc:
        if "missing port" in str(exc):
            raise ConfigError(key, expected, address, detail=(
                f"{address!r} has no port: a scheduler listens on {scheme}://{host}:{SCHEDULER_PORT} by default"
            )) from None
        raise ConfigError(key, expected, address, detail=(
            f"{address!r} is not {scheme}://host:port (a port is a number; an IPv6 host goes in brackets, "
            f"[::1])")) from None
    if not host:
        raise ConfigError(key, expected, address, detail=f"{address!r} has no host: expected {scheme}://host:{port}")
    if not 1 <= port <= 65535:
        raise ConfigError(key, expected, address, detail=f"{address!r}: port {port} is out of range (1-65535)")
    return address


def check_tls_files(ca_file: str | None, cert_file: str | None, key_file: str | None) -> None:
    """Raise a ConfigError naming the key and the path of a TLS file that is missing,
    unreadable, or not what it should be; nothing is contacted.

    distributed reads the files only when it connects, and said "[Errno 2] No such file
    or directory" naming neither the file nor the key.
    """
    import ssl

    for key, path in zip(_TLS_KEYS, (ca_file, cert_file, key_file)):
        if path is None:
            continue
        if not os.path.exists(path):
            raise ConfigError(key, "a PEM file", path, detail=f"{path}: no such file")
        if os.path.isdir(path):
            raise ConfigError(key, "a PEM file", path, detail=f"{path}: a folder, not a PEM file")
        if not os.access(path, os.R_OK):
            raise ConfigError(key, "a PEM file", path, detail=f"{path}: cannot be read (permission denied)")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except ssl.SSLError as exc:
            raise ConfigError(_TLS_KEYS[0], "a PEM file", ca_file, detail=(
                f"{ca_file}: not a PEM CA certificate ({exc.reason or exc})")) from None
    if cert_file is not None:
        try:
            # An empty password instead of OpenSSL's prompt on the terminal: distributed
            # has no way to pass one, so an encrypted key could never be used.
            ctx.load_cert_chain(cert_file, key_file, password=lambda: b"")
        except ssl.SSLError as exc:
            raise ConfigError(_TLS_KEYS[1], "a PEM file", cert_file, detail=(
                f"{cert_file} with cluster.tls_key_file {key_file}: cannot load this certificate and its "
                f"unencrypted private key ({exc.reason or exc})")) from None


def scheduler_file_address(path: str, *, timeout: float, log: IO[str] | None = None) -> str:
    """The address in a scheduler file, waiting up to ``timeout`` seconds for a
    scheduler that is starting to write it (saying so on ``log``).

    distributed's Client waited for a missing file forever, without a word: a typo in
    ``cluster.scheduler_file`` hung ``pipeline run``. The file may be missing for a
    moment, though, when the scheduler and the run are started together.
    """
    key = "cluster.scheduler_file"
    expected = "the file dask scheduler --scheduler-file writes"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(key, expected, path, detail=(
            f"{path}: no such file, and no folder {folder} for a scheduler to write it in"))
    deadline = time.monotonic() + timeout
    said = False
    while True:
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            problem = "no such file"
        except IsADirectoryError:
            raise ConfigError(key, expected, path, detail=f"{path}: a folder, not a scheduler file") from None
        except PermissionError:
            raise ConfigError(key, expected, path, detail=f"{path}: cannot be read (permission denied)") from None
        except ValueError:  # not JSON (yet: the scheduler writes the file in place)
            problem = 'not a scheduler file (expected JSON with an "address")'
        else:
            address = data.get("address") if isinstance(data, dict) else None
            if isinstance(address, str):
                return address
            problem = 'not a scheduler file (expected JSON with an "address")'
        if time.monotonic() >= deadline:
            hint = (f" (waited {timeout:g} s for a scheduler to write it: is the path right, and does the scheduler "
                    f"run with --scheduler-file {path}?)" if problem == "no such file" else "")
            raise ConfigError(key, expected, path, detail=f"{path}: {problem}{hint}")
        if not said and log is not None and problem == "no such file":
            print(f"cluster: waiting up to {timeout:g} s for a scheduler to write {path} (cluster.scheduler_file)",
                  file=log, flush=True)
            said = True
        time.sleep(0.05)


class _NoScheduler(Exception):
    """Why a probe of a scheduler address failed: the step and the exception."""

    def __init__(self, step: str, exc: BaseException | None, *, tcp_open: bool | None = None,
                 kind: str | None = None):
        super().__init__(step)
        self.step, self.exc, self.tcp_open, self.kind = step, exc, tcp_open, kind


def _causes(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or during, and the OS or SSL error
    that closed a tornado stream (its ``real_error``: where a TLS alert is told)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        exc = todo.pop(0)
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        yield exc
        real = getattr(exc, "real_error", None)
        todo += [exc.__cause__ or exc.__context__, real if isinstance(real, BaseException) else None]


async def _tcp_open(host: str, port: int, timeout: float) -> bool:
    """Whether a plain TCP connection to ``host:port`` opens within ``timeout``."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    return True


async def _identity(address: str, connection_args: dict[str, object], timeout: float) -> dict[str, object]:
    """Connect to ``address`` as distributed does, with every step (the connection, the
    TLS and dask handshakes, the identity request) bounded by one deadline, and return
    the server's identity; raise :class:`_NoScheduler` on failure.

    distributed's own ``connect`` retries only the connection within its timeout and
    then waits for the peer's handshake without one: a server that accepts and never
    answers (the dashboard's port) hung ``Client()`` forever, and one that answers
    garbage (an HTTP proxy) made it allocate the "frame" its first 8 bytes announced.
    """
    from distributed.comm import registry
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.core import FatalCommClosedError

    scheme, loc = parse_address(address)
    connector = registry.get_backend(scheme).get_connector()
    deadline = time.monotonic() + timeout

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    comm, last = None, None
    while comm is None:
        try:
            # Retried until the deadline, as distributed does: a scheduler may be starting.
            comm = await asyncio.wait_for(connector.connect(loc, deserialize=True, **connection_args), left())
        except Exception as exc:  # noqa: BLE001 - tornado's ValueError "IOStream is not idle" too
            # The last attempt, cut short by the deadline, would hide why the others failed.
            if last is None or not isinstance(exc, asyncio.TimeoutError):
                last = exc
            # Only a refused or timed-out connection is worth another try: a TLS refusal
            # (FatalCommClosedError) and anything stranger are final.
            retry = isinstance(exc, (asyncio.TimeoutError, OSError)) and not isinstance(exc, FatalCommClosedError)
            if not retry or not left():
                encrypted = getattr(connector, "encrypted", False)
                # Over TLS, whether the port takes plain TCP tells "not a TLS server" apart.
                open_ = await _tcp_open(*parse_host_port(loc), 1.0) if encrypted else None
                raise _NoScheduler("connect", last, tcp_open=open_) from None
            await asyncio.sleep(min(0.05, left()))
    step = "handshake"
    try:
        local = comm.handshake_info()
        await asyncio.wait_for(comm.write(local), left())
        remote = await asyncio.wait_for(comm.read(), left())
        step = "protocol"
        if not isinstance(remote, dict):
            raise TypeError(f"a handshake of type {type(remote).__name__}")
        comm.remote_info = {**remote, "address": comm.peer_address}
        comm.local_info = {**local, "address": comm.local_address}
        comm.handshake_options = comm.handshake_configuration(comm.local_info, comm.remote_info)
        step = "identity"
        await asyncio.wait_for(comm.write({"op": "identity", "reply": True}), left())
        reply = await asyncio.wait_for(comm.read(), left())
    except Exception as exc:  # noqa: BLE001 - MemoryError included: garbage read as a frame length
        if step == "handshake" and not isinstance(exc, (asyncio.TimeoutError, OSError)):
            step = "protocol"
        raise _NoScheduler(step, exc) from None
    finally:
        comm.abort()
    if not isinstance(reply, dict):
        raise _NoScheduler("protocol", TypeError(f"an identity of type {type(reply).__name__}"))
    if reply.get("type") in ("Worker", "Nanny"):
        raise _NoScheduler("identity", None, kind=str(reply["type"]))
    return reply


def _explain(address: str, origin: str, failure: _NoScheduler, timeout: float) -> str:
    """One line saying why no scheduler answered at ``address``, and the likely cause."""
    from distributed.comm.addressing import parse_address

    scheme, loc = parse_address(address)
    at = f"{address}{origin}"
    exc = failure.exc
    causes = list(_causes(exc))
    ssl_errors = [c for c in causes if isinstance(c, ssl.SSLError)]
    if failure.kind is not None:
        return (f"{at} is a dask {failure.kind.lower()}, not the scheduler: a worker's log names its scheduler "
                f"('Registered to: ...'); a scheduler listens on port {SCHEDULER_PORT} by default")
    # The scheduler's alert for a client certificate it refuses comes in the handshake
    # under TLS 1.2, and with the first read after it under TLS 1.3.
    alert = next((c.reason for c in ssl_errors if c.reason and "ALERT" in c.reason), None)
    if alert is not None:
        return (f"cannot reach {at}: the scheduler refused the TLS handshake ({alert}): cluster.tls_cert_file "
                f"must be signed by a CA the scheduler trusts")
    if failure.step == "connect":
        if any(isinstance(c, ConnectionRefusedError) for c in causes):
            return (f"nothing listens at {at} (connection refused for {timeout:g} s): is the scheduler running, "
                    f"on that host and port? (it listens on {SCHEDULER_PORT} by default)")
        if any(isinstance(c, socket.gaierror) for c in causes):
            return f"cannot reach {at}: the host {_host_of(loc)!r} is not known"
        if any(isinstance(c, ssl.SSLCertVerificationError) for c in causes):
            reason = next(c for c in causes if isinstance(c, ssl.SSLCertVerificationError)).verify_message
            return (f"cannot reach {at}: this client does not trust the scheduler's certificate ({reason}): "
                    f"cluster.tls_ca_file must be the CA that signed it")
        if failure.tcp_open:
            return (f"cannot reach {at}: the scheduler did not complete a TLS handshake (is it a tcp:// scheduler? "
                    f"then its address is tcp://{loc})")
        if isinstance(exc, asyncio.TimeoutError) or failure.tcp_open is False:
            return (f"cannot reach {at}: no answer within {timeout:g} s (is the host up, and the port open to "
                    f"this machine?)")
        return f"cannot reach {at}: {_reason(causes)}"
    hint = f"is it the dashboard's port? the scheduler listens on {SCHEDULER_PORT} by default"
    if failure.step == "handshake" and isinstance(exc, asyncio.TimeoutError):
        return (f"no dask scheduler answered at {at} within {timeout:g} s: the connection opened, but nothing "
                f"answered ({hint})")
    if failure.step == "handshake" and scheme in ("tls", "wss"):
        # Closed once the TLS handshake was done: under TLS 1.3 a scheduler checks the
        # client's certificate then, and its alert may be lost with the connection.
        return (f"cannot reach {at}: the scheduler closed the connection after the TLS handshake, as it does for a "
                f"client certificate it does not trust: cluster.tls_cert_file must be signed by a CA the scheduler "
                f"trusts")
    if failure.step == "handshake":  # closed on us without a word
        tls = (f"is it a tls:// scheduler? then use tls://{loc} with the cluster.tls_* files; or "
               if scheme == "tcp" else "")
        return f"no dask scheduler answered at {at}: the connection was closed without a dask handshake ({tls}{hint})"
    if failure.step == "protocol":
        if isinstance(exc, ValueError) and "versions" in str(exc):
            return f"the dask scheduler at {at} runs another version: {exc}"
        return (f"no dask scheduler answered at {at}: something answered, but not in dask's protocol (a web server "
                f"or proxy? {hint})")
    if isinstance(exc, asyncio.TimeoutError):
        return f"the dask scheduler at {at} did not answer its identity request within {timeout:g} s"
    return f"the dask scheduler at {at} did not answer its identity request: {_reason(causes)}"


def _reason(causes: Sequence[BaseException]) -> str:
    """``Type: message`` of the first exception in ``causes`` that has a message
    (distributed raises some, a TLS failure for one, without any)."""
    told = next((c for c in causes if str(c)), causes[0] if causes else None)
    return "no reason given" if told is None else f"{type(told).__name__}: {told}".rstrip(": ")


def _probe(address: str, connection_args: dict[str, object], timeout: float, origin: str = "") -> None:
    """Raise a one-line ClusterError unless a dask scheduler answers at ``address``
    within ``timeout`` seconds.

    Runs its own event loop, in a thread of its own, so that it works where the caller
    already runs one (a notebook).
    """
    outcome: list[BaseException | None] = []

    def ask() -> None:
        try:
            asyncio.run(_identity(address, connection_args, timeout))
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome.append(exc)

    thread = threading.Thread(target=ask, name="pipeline-scheduler-probe", daemon=True)
    thread.start()
    thread.join(timeout + 5)  # every step is bounded; the margin is for the TCP check and the loop's close
    if not outcome:
        raise ClusterError(f"no dask scheduler answered at {address}{origin} within {timeout:g} s")
    exc = outcome[0]
    if isinstance(exc, _NoScheduler):
        raise ClusterError(_explain(address, origin, exc, timeout)) from None
    if exc is not None:
        raise ClusterError(f"cannot reach {address}{origin}: {type(exc).__name__}: {exc}") from exc


def _needs_tls_files(where: str, why: str) -> ClusterError:
    return ClusterError(
        f"cannot reach {where}: a tls:// scheduler needs cluster.tls_ca_file, "
        f"cluster.tls_cert_file and cluster.tls_key_file (all three): {why}"
    )


def _remote(address: str | None, scheduler_file: str | None, timeout: float, tls_ca_file: str | None,
            tls_cert_file: str | None, tls_key_file: str | None, log: IO[str] | None) -> "distributed.Client":
    """A client of the remote scheduler at ``address`` (or in ``scheduler_file``), once
    the address, the TLS files and a probe of the scheduler found nothing wrong."""
    from distributed import Client
    from distributed.security import Security

    check_tls_files(tls_ca_file, tls_cert_file, tls_key_file)
    if address is None:
        address = scheduler_file_address(scheduler_file, timeout=timeout, log=log)  # type: ignore[arg-type]
        key, origin = "cluster.scheduler_file", f" (from cluster.scheduler_file {scheduler_file})"
    else:
        key, origin = "cluster.address", ""
    check_address(address, key=key)
    security = None
    if tls_ca_file or tls_cert_file or tls_key_file:
        security = Security(tls_ca_file=tls_ca_file, tls_client_cert=tls_cert_file, tls_client_key=tls_key_file,
                            require_encryption=True)
    scheme = address.partition("://")[0] if "://" in address else "tcp"
    if security is not None and scheme in ("tcp", "ws"):
        raise ConfigError(key, "a tls:// address", address, detail=(
            f"{address!r} is unencrypted, but cluster.tls_* files are set, which make every connection "
            f"encrypted: a TLS scheduler's address is tls://{address.partition('://')[2] or address}"))
    # Without an SSL context distributed raises a bare TypeError for tls:// and leaves
    # the half-started Client behind. When the garbage collector later finalizes it
    # inside the IO-loop thread of the next Client being started, its close() waits for
    # the lock that Client's starter holds, and that next Client fails after 10 s. So
    # check first, by distributed's own rule (the dask config may hold the TLS files
    # too), and never start that Client.
    args = (security if security is not None else Security()).get_connection_args("client")
    if scheme in ("tls", "wss") and args["ssl_context"] is None:
        raise _needs_tls_files(f"{address}{origin}", "no CA file and certificate to build an SSL context from")
    if scheme != "inproc":  # in this process: neither a dashboard's port nor a proxy can be there
        _probe(address, args, timeout, origin)
    try:
        return Client(address, timeout=timeout, security=security)
    except Exception as exc:  # noqa: BLE001 - the scheduler answered the probe a moment ago
        raise ClusterError(f"cannot reach {address}{origin}: {type(exc).__name__}: {exc}") from exc


def _connect(address: str | None, scheduler_file: str | None, timeout: float, tls_ca_file: str | None,
             tls_cert_file: str | None, tls_key_file: str | None, *, preload: Sequence[str] | None,
             log: IO[str] | None = None,
             **local_kwargs: object) -> tuple["distributed.Client", "distributed.LocalCluster | None", bool]:
    """A client of a new LocalCluster (and the cluster), or of a remote scheduler, and
    whether the dashboard's pages are still to be added (:func:`_serve_dashboard`)."""
    if address is not None or scheduler_file is not None:
        # An address wins over a scheduler file: --scheduler overrides a config's either.
        return _remote(address, scheduler_file, timeout, tls_ca_file, tls_cert_file, tls_key_file, log), None, False
    from distributed import Client, LocalCluster

    local = None
    try:
        if preload is not None:
            start_worker_server(preload)
        later = local_kwargs["dashboard_address"] is not None and _has_bokeh()
        # In-process clusters talk over inproc://, which takes no host.
        local = LocalCluster(**local_kwargs, **({"host": "127.0.0.1"} if local_kwargs["processes"] else {}),
                             scheduler_kwargs={"dashboard": False} if later else None)
        client = Client(local)
    except (OSError, RuntimeError, TimeoutError) as exc:
        if local is not None:
            local.close()
        raise ClusterError(f"cannot start a LocalCluster: {exc}") from exc
    return client, local, later
