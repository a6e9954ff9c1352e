"""Reaching a remote dask scheduler: what is checked before a ``Client`` starts.

The address's syntax and the TLS files are :class:`~pipeline.errors.ConfigError`\\ s naming
the key; a scheduler file is waited for up to the connect timeout; then a probe connects
and asks the scheduler who it is, every step bounded by the timeout (distributed reads
the handshake with none: the dashboard's port, or a proxy, hung a run), and a failure is
one :class:`~pipeline.errors.ClusterError` naming the address and the likely cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import ssl
import threading
import time
from typing import IO, TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import distributed

from pipeline.errors import ClusterError, ConfigError, PipelineError

__all__ = [
    "DASHBOARD_PORT",
    "SCHEDULER_PORT",
    "check_address",
    "check_encryption",
    "check_remote",
    "check_same_code",
    "check_scheduler_folder",
    "check_tls_files",
    "code_fingerprint",
    "connect_remote",
    "quiet_abandoned_gathers",
    "remote_errors_explained",
    "scheduler_file_address",
    "scheduler_lost",
]


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
    if ca_file is None and cert_file is None and key_file is None:
        return  # no TLS: nothing to check (an SSL context loads the system's CAs, 40-60 ms)
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


_SCHEDULER_FILE = "the file dask scheduler --scheduler-file writes"


def check_scheduler_folder(path: str) -> None:
    """Raise a ConfigError naming ``cluster.scheduler_file`` when no folder holds, or
    could hold, the scheduler file ``path``; nothing is contacted and nothing waited for.

    The file itself may be missing for a moment (a scheduler started with the run
    writes it); a missing folder is a typo no scheduler will fix.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError("cluster.scheduler_file", _SCHEDULER_FILE, path, detail=(
            f"{path}: no such file, and no folder {folder} for a scheduler to write it in"))


def check_encryption(address: str, *, key: str, tls_files: bool) -> None:
    """Raise a ConfigError naming ``key`` when the cluster.tls_* files are set
    (``tls_files``) for an unencrypted ``address``: distributed encrypts every
    connection then, and a tcp:// scheduler could never answer."""
    scheme = address.partition("://")[0] if "://" in address else "tcp"
    if tls_files and scheme in ("tcp", "ws"):
        raise ConfigError(key, "a tls:// address", address, detail=(
            f"{address!r} is unencrypted, but cluster.tls_* files are set, which make every connection "
            f"encrypted: a TLS scheduler's address is tls://{address.partition('://')[2] or address}"))


def _security(tls_ca_file: str | None, tls_cert_file: str | None,
              tls_key_file: str | None) -> "distributed.security.Security | None":
    """distributed's Security for the TLS files, ``None`` when none is set."""
    from distributed.security import Security

    if not (tls_ca_file or tls_cert_file or tls_key_file):
        return None
    return Security(tls_ca_file=tls_ca_file, tls_client_cert=tls_cert_file, tls_client_key=tls_key_file,
                    require_encryption=True)


def _connection_args(address: str, security: "distributed.security.Security | None",
                     where: str) -> dict[str, object]:
    """The client's connection arguments for ``address``, or a ClusterError for a
    tls:// address without an SSL context to reach it with."""
    from distributed.security import Security

    # Without an SSL context distributed raises a bare TypeError for tls:// and leaves
    # the half-started Client behind. When the garbage collector later finalizes it
    # inside the IO-loop thread of the next Client being started, its close() waits for
    # the lock that Client's starter holds, and that next Client fails after 10 s. So
    # check first, by distributed's own rule (the dask config may hold the TLS files
    # too), and never start that Client.
    args = (security if security is not None else Security()).get_connection_args("client")
    scheme = address.partition("://")[0] if "://" in address else "tcp"
    if scheme in ("tls", "wss") and args["ssl_context"] is None:
        raise _needs_tls_files(where, "no CA file and certificate to build an SSL context from")
    return args


def check_remote(address: str | None, scheduler_file: str | None, tls_ca_file: str | None,
                 tls_cert_file: str | None, tls_key_file: str | None) -> None:
    """Everything :func:`connect_remote` checks before it contacts anything: the TLS
    files, the address (or the scheduler file's folder: the address in the file is
    read when connecting), TLS files with an unencrypted address (ConfigErrors naming
    the key), and a tls:// address without an SSL context (a ClusterError).

    ``pipeline run`` calls it before it decides whether there is anything to do: a run
    on an up-to-date store connects to no scheduler, and a typo in the cluster section
    must not pass there unseen (a cron job reported success).
    """
    check_tls_files(tls_ca_file, tls_cert_file, tls_key_file)
    if address is None:
        if scheduler_file is not None:  # else a LocalCluster: nothing remote to check
            check_scheduler_folder(scheduler_file)
        return
    check_address(address)
    security = _security(tls_ca_file, tls_cert_file, tls_key_file)
    check_encryption(address, key="cluster.address", tls_files=security is not None)
    _connection_args(address, security, address)


def scheduler_file_address(path: str, *, timeout: float, log: IO[str] | None = None) -> str:
    """The address in a scheduler file, waiting up to ``timeout`` seconds for a
    scheduler that is starting to write it (saying so on ``log``).

    distributed's Client waited for a missing file forever, without a word: a typo in
    ``cluster.scheduler_file`` hung ``pipeline run``. The file may be missing for a
    moment, though, when the scheduler and the run are started together.
    """
    key = "cluster.scheduler_file"
    expected = _SCHEDULER_FILE
    check_scheduler_folder(path)
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


def connect_remote(address: str | None, scheduler_file: str | None, timeout: float, tls_ca_file: str | None,
            tls_cert_file: str | None, tls_key_file: str | None, log: IO[str] | None) -> "distributed.Client":
    """A client of the remote scheduler at ``address`` (or in ``scheduler_file``), once
    the address, the TLS files and a probe of the scheduler found nothing wrong."""
    from distributed import Client

    check_tls_files(tls_ca_file, tls_cert_file, tls_key_file)
    if address is None:
        address = scheduler_file_address(scheduler_file, timeout=timeout, log=log)  # type: ignore[arg-type]
        key, origin = "cluster.scheduler_file", f" (from cluster.scheduler_file {scheduler_file})"
    else:
        key, origin = "cluster.address", ""
    check_address(address, key=key)
    security = _security(tls_ca_file, tls_cert_file, tls_key_file)
    check_encryption(address, key=key, tls_files=security is not None)
    args = _connection_args(address, security, f"{address}{origin}")
    scheme = address.partition("://")[0] if "://" in address else "tcp"
    if scheme != "inproc":  # in this process: neither a dashboard's port nor a proxy can be there
        _probe(address, args, timeout, origin)
    try:
        client = Client(address, timeout=timeout, security=security)
    except Exception as exc:  # noqa: BLE001 - the scheduler answered the probe a moment ago
        raise ClusterError(f"cannot reach {address}{origin}: {type(exc).__name__}: {exc}") from exc
    try:
        check_same_code(client, f"{address}{origin}")
    except BaseException:
        client.close()
        raise
    return client


#: How a future is cancelled when its client loses the scheduler (distributed's reason).
_LOST_REASON = "scheduler-connection-lost"


def scheduler_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) says the client lost its scheduler:
    distributed cancels every future then (``FutureCancelledError`` for the reason
    ``scheduler-connection-lost``), or the client's own calls fail on the closed comm."""
    from distributed.comm.core import CommClosedError

    for cause in _causes(exc):
        if _LOST_REASON in str(cause) or isinstance(cause, CommClosedError):
            return True
    return False


class _ReconnectNoise(logging.Filter):
    """Drops the client's records of its failed attempts to reach a lost scheduler
    (connection refused, then a cancelled sleep, each with its traceback): the run
    says in one line what happened."""

    def filter(self, record: logging.LogRecord) -> bool:
        from distributed.comm.core import CommClosedError

        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            msg = record.getMessage()
            return not ("connection to the scheduler" in msg.lower() or "reconnect" in msg.lower())
        return not any(isinstance(c, (CommClosedError, OSError, asyncio.CancelledError)) for c in _causes(exc))


class _AbandonedGathers(logging.Filter):
    """Drops asyncio's "Task exception was never retrieved" record of distributed's
    ``AllExit``: the signal a client's ``gather`` uses to stop its helper tasks. A run
    interrupted by Ctrl-C leaves them unawaited, and each printed a traceback before
    the run's one line ("interrupted; rerun the same command to resume")."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (exc is not None and type(exc).__name__ == "AllExit"
                    and type(exc).__module__.startswith("distributed"))


def quiet_abandoned_gathers() -> contextlib.AbstractContextManager[None]:
    """No asyncio traceback of an abandoned gather's ``AllExit`` while the block runs
    (:class:`_AbandonedGathers`); any other never-retrieved exception is kept."""
    from pipeline.workerlog import filtered_log

    return filtered_log("asyncio", _AbandonedGathers())


@contextlib.contextmanager
def remote_errors_explained(store: str, *, sources: Sequence[str] = (), remote: bool) -> Iterator[None]:
    """Around a run on a remote cluster (``remote``), one
    :class:`~pipeline.errors.ClusterError` for what fails there rather than here: a
    lost scheduler (``store`` is incomplete and the same command resumes it; without
    distributed's tracebacks of its reconnection attempts), and workers that find no S3
    credentials for ``store`` or one of ``sources``. A no-op for a LocalCluster, which
    lives and dies with this process and shares its environment."""
    if not remote:
        yield
        return
    quiet = _ReconnectNoise()
    loggers = [logging.getLogger(name) for name in ("distributed.client", "distributed.utils", "distributed.core")]
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    except PipelineError:
        raise
    except Exception as exc:
        if _no_credentials(exc):
            raise _credentials_error(store, sources, exc) from None
        if scheduler_lost(exc):
            if _store_begun(store):
                raise ClusterError(
                    f"the connection to the dask scheduler was lost while writing {store}: the store is incomplete "
                    f"(nothing written is lost); once the scheduler is back, rerun the same command to resume it"
                ) from None
            raise ClusterError(  # lost while planning: there is no store to call incomplete
                f"the connection to the dask scheduler was lost before anything of {store} was written; once the "
                "scheduler is back, rerun the same command"
            ) from None
        raise
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


def _store_begun(store: str) -> bool:
    """Whether anything of the store at ``store`` is written (its root metadata); True
    when that cannot be told (an object store that does not answer)."""
    try:
        import fsspec

        fs, root = fsspec.core.url_to_fs(store)
        return bool(fs.exists(f"{root.rstrip('/')}/zarr.json"))
    except Exception:  # noqa: BLE001 - unknown: say what may be so
        return True


def _fingerprint_function() -> Callable[[], str | None]:
    """The function that fingerprints the installed pipeline package, made anew so that
    it is a local function: cloudpickle ships a local function by value, and a worker
    runs it whatever pipeline it has (an older one lacks this module's functions)."""

    def fingerprint() -> str | None:
        import hashlib
        import importlib
        import os

        try:
            package = importlib.import_module("pipeline")
        except ImportError:
            return None
        cached = getattr(package, "_code_fingerprint", None)
        if isinstance(cached, str):
            return cached
        root = os.path.dirname(os.path.abspath(package.__file__))
        sources = sorted(os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
                         for folder, dirs, files in os.walk(root) if "__pycache__" not in folder
                         for name in files if name.endswith(".py"))
        digest = hashlib.sha256()
        for rel in sources:  # in one order wherever the package is installed
            with open(os.path.join(root, rel), "rb") as fh:
                digest.update(rel.encode() + b"\0" + fh.read() + b"\0")
        found = f"{getattr(package, '__version__', '?')}+{digest.hexdigest()[:12]}"
        package._code_fingerprint = found  # once per process: the files do not change under it
        return found

    return fingerprint


def code_fingerprint() -> str:
    """This process's pipeline: its version and a hash of its ``.py`` sources (computed
    once per process), such as ``0.1.0+3f2a9c01b7de``."""
    return _fingerprint_function()() or "?"


def _differing(client_fp: str, found: Mapping[str, object]) -> dict[str, str]:
    """Those of ``found`` (an address -> its fingerprint, ``None`` where pipeline is not
    installed, or the exception that computing it raised) that differ from
    ``client_fp``, as the text to show; an exception is no evidence, and left out."""
    out = {}
    for address, fp in found.items():
        if fp is None:
            out[address] = "pipeline not installed"
        elif isinstance(fp, str) and fp != client_fp:
            out[address] = f"pipeline {fp}"
    return out


def check_same_code(client: "distributed.Client", where: str) -> None:
    """Raise a one-line :class:`~pipeline.errors.ClusterError` when the workers of
    ``client`` (or its scheduler, where it has pipeline installed: it unpickles the
    graph) run another pipeline than this process: an image not rebuilt after an
    upgrade ran this version's tasks with the old code, and failed deep inside a task.

    One function call per worker (``client.run``) and one on the scheduler; each
    process hashes its sources once.
    """
    fingerprint = _fingerprint_function()
    mine = code_fingerprint()
    workers = _differing(mine, client.run(fingerprint, on_error="return"))
    try:
        on_scheduler = client.run_on_scheduler(fingerprint)
    except Exception:  # noqa: BLE001 - a scheduler that runs no code of ours: nothing to compare
        on_scheduler = None
    differ = dict(sorted(workers.items()))
    if isinstance(on_scheduler, str) and on_scheduler != mine:
        differ = {f"the scheduler {where}": f"pipeline {on_scheduler}", **differ}
    if not differ:
        return
    shown = "; ".join(f"{a}: {fp}" for a, fp in list(differ.items())[:4])
    more = f" and {len(differ) - 4} more" if len(differ) > 4 else ""
    raise ClusterError(
        f"the cluster at {where} runs other pipeline code than this client (pipeline {mine}): {shown}{more}; "
        f"install the same pipeline on the client, the scheduler and every worker (rebuild and redeploy the "
        f"workers' image after an upgrade)")


def _views(paths: Sequence[str]) -> list[tuple[int, int] | None]:
    """Each of ``paths`` as this process sees it: ``(size, mtime_ns)``, or ``None`` where
    it sees no file (run on each worker, and here)."""
    import os

    out: list[tuple[int, int] | None] = []
    for p in paths:
        try:
            st = os.stat(p)
        except OSError:
            out.append(None)
        else:
            out.append((int(st.st_size), int(st.st_mtime_ns)))
    return out


def _named(workers: Sequence[str]) -> str:
    return ", ".join(workers[:3]) + (f" and {len(workers) - 3} more" if len(workers) > 3 else "")


def _when(mtime_ns: int) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(mtime_ns / 1e9, dt.timezone.utc).isoformat(timespec="seconds")


def differing_views(files: Sequence[str], mine: Sequence[tuple[int, int] | None],
                    theirs: Mapping[str, object]) -> dict[str, list[tuple[str, tuple[int, int], tuple[int, int]]]]:
    """The workers whose view of ``files`` differs in size from this client's (``mine``,
    from :func:`_views`): each worker's ``(file, client's (size, mtime_ns), worker's)``,
    in the files' order. A worker's answer that is not a list (an exception) is no
    evidence and left out; a file either side does not see is left to the
    missing-files check.

    Only the size decides: the modification time of a copy may differ while its bytes
    do not (``cp`` without ``-p``, a node's own copy), so it is shown, never compared.
    """
    out: dict[str, list[tuple[str, tuple[int, int], tuple[int, int]]]] = {}
    for address, views in theirs.items():
        if not isinstance(views, list) or len(views) != len(files):
            continue
        differ = [(f, m, tuple(v)) for f, m, v in zip(files, mine, views)
                  if m is not None and v is not None and int(v[0]) != m[0]]
        if differ:
            out[address] = differ  # type: ignore[assignment]
    return out


def check_workers_see(client: "distributed.Client", *, store: str, marker: str | None,
                      files: Sequence[str]) -> None:
    """Raise a one-line :class:`~pipeline.errors.ClusterError` naming the workers of a
    remote cluster that cannot see ``marker`` (a file this client holds beside the
    local output ``store``: its write lock) or one of the local raw ``files``, or that
    see one of ``files`` at another size than this client does.

    The workers read the raw files and write the store themselves: a worker without the
    client's folder failed deep inside a task ("no zarr group found", a file not found),
    as if the store or the file were at fault; a worker that saw another file at the
    same path (a stale NFS cache, an old copy on one node) wrote a wrong store without
    a word. One call per worker, before any task: each stats every path (no byte is
    read), and the client compares the sizes with its own.
    """
    paths = ([marker] if marker else []) + list(files)
    if not paths:
        return
    answers = client.run(_views, paths, on_error="return")
    missing = {a: [p for p, v in zip(paths, views) if v is None] for a, views in answers.items()
               if isinstance(views, list)}
    missing = {a: m for a, m in missing.items() if m}
    if missing:
        workers = sorted(missing)
        named = _named(workers)
        lost = missing[workers[0]]
        if marker and marker in lost:
            raise ClusterError(
                f"{store}: the workers {named} cannot see this output folder ({os.path.dirname(store)} is a local "
                f"path of this client's machine): they write the store themselves; use a folder the client and "
                f"every worker share (a shared filesystem mounted at the same path) or an object store (s3://...)")
        raise ClusterError(
            f"{lost[0]}: the workers {named} cannot see this raw file ({len(lost)} of the {len(files)} checked), "
            f"which this client reads: they read the raw files themselves; put them on a filesystem every worker "
            f"mounts at the same path, or in an object store (s3://...)")
    offset = 1 if marker else 0
    differ = differing_views(files, _views(files), {a: v[offset:] for a, v in answers.items()
                                                    if isinstance(v, list)})
    if not differ:
        return
    workers = sorted(differ)
    first, (size, mtime), (their_size, their_mtime) = differ[workers[0]][0]
    n_files = len({f for d in differ.values() for f, _, _ in d})
    more = f" ({n_files} files differ in all)" if n_files > 1 else ""
    others = f" (and {_named(workers[1:])} see other sizes too)" if len(workers) > 1 else ""
    raise ClusterError(
        f"{first}: the worker {workers[0]} sees {their_size:,} bytes at this path (modified {_when(their_mtime)}), "
        f"this client {size:,} (modified {_when(mtime)}){others}{more}: that worker would read another file than "
        f"this client and write a wrong store; a stale copy (an NFS client's cache, an old copy on that node) is the "
        f"usual cause: make every worker see the client's files at the same path, then rerun")


def _no_credentials(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) is botocore's ``NoCredentialsError``, told by name:
    botocore is imported only where S3 is used."""
    return any(type(c).__name__ in ("NoCredentialsError", "PartialCredentialsError") for c in _causes(exc))


def _credentials_error(store: str, sources: Sequence[str], exc: BaseException) -> ClusterError:
    """The one line for a worker's task that found no S3 credentials: the URL it read or
    wrote (by where the task failed) and that the workers, not this client, lack them."""
    import traceback

    frames = [f.filename.replace(os.sep, "/") for c in _causes(exc) for f in traceback.extract_tb(c.__traceback__)]
    remote_sources = [s for s in sources if "://" in s]
    reading = any("/pipeline/loaders/" in f for f in frames) or "://" not in store
    url = (remote_sources[0] if remote_sources else store) if reading else store
    what = "source" if reading and remote_sources else "output"
    return ClusterError(
        f"{url} ({what}): the workers could not find S3 credentials (this client has them, and the workers read and "
        f"write the data themselves): give every worker the same credentials (AWS_ACCESS_KEY_ID and "
        f"AWS_SECRET_ACCESS_KEY in its environment, a role, or ~/.aws/credentials), or put them in "
        f"{what}.storage_options (key, secret)")
