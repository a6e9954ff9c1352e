"""A ``distributed.Client`` from the cluster config: LocalCluster or a remote scheduler.

The same config runs on a laptop and on a cluster: ``address: null`` starts a
LocalCluster here; ``address: tcp://host:8786`` (or ``scheduler_file:``) connects to a
running dask-distributed cluster. Workers must see the same storage as the client (a
shared path or an object store), because they read the raw files and write the zarr
chunks themselves.
"""

from __future__ import annotations

import contextlib
import sys
from typing import IO, TYPE_CHECKING, Iterator

from pipeline.errors import ClusterError

if TYPE_CHECKING:  # pragma: no cover
    import distributed

__all__ = ["cluster", "dashboard_link"]


def dashboard_link(client: object) -> str | None:
    """The dashboard URL of a client's scheduler, if it serves one."""
    try:
        return client.dashboard_link  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a scheduler without bokeh has no dashboard
        return None


def _needs_tls_files(where: str, why: str) -> ClusterError:
    return ClusterError(
        f"cannot reach {where}: a tls:// scheduler needs cluster.tls_ca_file, "
        f"cluster.tls_cert_file and cluster.tls_key_file (all three): {why}"
    )


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
) -> Iterator["distributed.Client"]:
    """Start or connect to a dask cluster and yield a client for it.

    Parameters
    ----------
    address
        ``None`` starts a LocalCluster; otherwise the scheduler address, for example
        ``tcp://10.0.0.5:8786`` or ``tls://scheduler:8786``.
    n_workers, threads_per_worker, memory_limit, dashboard_address, processes
        LocalCluster settings; ignored for a remote cluster. The dashboard binds to
        127.0.0.1 by default so a laptop run is not reachable from the network.
    scheduler_file
        Path of a scheduler file written by ``dask scheduler --scheduler-file``.
    tls_ca_file, tls_cert_file, tls_key_file
        Passed to ``distributed.security.Security`` for ``tls://`` addresses.
    timeout
        Seconds to wait for a remote scheduler.
    log
        Where to print the dashboard address; ``None`` prints nothing.

    Yields
    ------
    distributed.Client
        Registered as the default scheduler for dask computations in the block.
    """
    from distributed import Client, LocalCluster
    from distributed.security import Security

    security = None
    if tls_ca_file or tls_cert_file or tls_key_file:
        security = Security(
            tls_ca_file=tls_ca_file,
            tls_client_cert=tls_cert_file,
            tls_client_key=tls_key_file,
            require_encryption=True,
        )
    local = None
    try:
        if address is None and scheduler_file is None:
            local = LocalCluster(
                n_workers=n_workers,
                threads_per_worker=threads_per_worker,
                memory_limit=memory_limit,
                dashboard_address=dashboard_address,
                processes=processes,
                # In-process clusters talk over inproc://, which takes no host.
                **({"host": "127.0.0.1"} if processes else {}),
            )
            client = Client(local)
        elif scheduler_file is not None and address is None:
            client = Client(scheduler_file=scheduler_file, timeout=timeout, security=security)
        else:
            # Without an SSL context distributed raises a bare TypeError for tls:// and
            # leaves the half-started Client behind. When the garbage collector later
            # finalizes it inside the IO-loop thread of the next Client being started,
            # its close() waits for the lock that Client's starter holds, and that next
            # Client fails after 10 s. So check first, by distributed's own rule (the
            # dask config may hold the TLS files too), and never start that Client.
            sec = security if security is not None else Security()
            if address.startswith("tls://") and sec.get_connection_args("client")["ssl_context"] is None:
                raise _needs_tls_files(address, "no CA file and certificate to build an SSL context from")
            client = Client(address, timeout=timeout, security=security)
    except (OSError, RuntimeError, TimeoutError) as exc:
        if local is not None:
            local.close()
        where = address or scheduler_file or "a LocalCluster"
        raise ClusterError(f"cannot start or reach {where}: {exc}") from exc
    except TypeError as exc:
        # distributed builds no SSL context unless it has both a CA and a certificate,
        # and then its tls:// connector raises a bare TypeError ("TLS expects a
        # `ssl_context` argument ...") before any network traffic: a tls:// scheduler
        # reached without the TLS files, or with only some of them. Checked above for an
        # address; this catches a scheduler file naming a tls:// address. A TypeError
        # from starting a LocalCluster is a different bug: let it through.
        if address is None and scheduler_file is None:
            raise
        raise _needs_tls_files(address or scheduler_file, str(exc)) from exc
    try:
        if log is not None:
            kind = "LocalCluster" if local is not None else f"scheduler {client.scheduler.address}"
            n = len(client.scheduler_info().get("workers", {}))
            print(f"cluster: {kind} with {n} workers", file=log)
            link = dashboard_link(client)
            if link:
                print(f"dashboard: {link}", file=log)
        yield client
    finally:
        client.close()
        if local is not None:
            local.close()
