"""Progress bars for compute stages, on a distributed client or the local scheduler.

Long stages show a terminal bar (tqdm) counting finished tasks. On a distributed client
the bar follows the futures as they finish; on the local schedulers it uses a dask
callback. Either way the result is the same as ``dask.compute``'s, in the order given
(:func:`ordered_compute`).
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import dask

__all__ = ["compute", "ordered_compute"]


def _by_type(collections: Sequence[Any]) -> list[int]:
    """Indices of ``collections``, those of one type together, types in the order they
    first come (stable within a type)."""
    first: dict[type, int] = {}
    for c in collections:
        first.setdefault(type(c), len(first))
    return sorted(range(len(collections)), key=lambda i: first[type(collections[i])])


def _in_place(order: Sequence[int], results: Sequence[Any]) -> tuple[Any, ...]:
    out: list[Any] = [None] * len(order)
    for j, i in enumerate(order):
        out[i] = results[j]
    return tuple(out)


def ordered_compute(*collections: Any, **kwargs: Any) -> tuple[Any, ...]:
    """``dask.compute(*collections, **kwargs)``, each result where its collection was.

    dask 2026.7 returns the results of mixed collections grouped by type, in the order
    each type first comes: ``dask.compute(array_a, delayed_d, array_e)`` gives ``(a, e,
    d)``, on every scheduler and through ``Client.compute`` too. Here the collections
    are passed grouped so, and their results put back in the order given.
    """
    order = _by_type(collections)
    return _in_place(order, dask.compute(*(collections[i] for i in order), **kwargs))


def _active_client() -> Any | None:
    """The distributed client that ``dask.compute`` would run on, or None.

    dask's own choice (``dask.base.get_scheduler``): its config may name a local
    scheduler while a client exists (``with dask.config.set(scheduler="sync")``), and
    then the bar's compute runs locally too. Asking distributed for its client
    regardless also waited on one whose cluster was gone (10 s in the test suite)."""
    from dask.base import get_scheduler

    try:
        chosen = get_scheduler()
    except (RuntimeError, ValueError):  # config names "distributed" with no client, or a bad name: dask says so
        return None
    # dask hands out a client as its bound ``get`` method: the client is its owner.
    owner = getattr(chosen, "__self__", chosen)
    return owner if "Client" in type(owner).__name__ else None


def compute(*collections: Any, desc: str = "compute", progress: bool = True) -> tuple[Any, ...]:
    """Compute dask collections, optionally with a progress bar.

    Parameters
    ----------
    collections
        Dask collections (arrays, delayed objects) to compute together.
    desc
        Label shown left of the bar.
    progress
        Draw the bar on stderr; ``False`` computes silently.

    Returns
    -------
    tuple
        One result per collection, as ``dask.compute`` returns them.
    """
    if not collections:
        return ()
    if not progress:
        return ordered_compute(*collections)
    client = _active_client()
    if client is not None:
        from distributed.diagnostics.progressbar import progress as distributed_progress

        order = _by_type(collections)  # Client.compute groups by type as dask.compute does
        futures: Sequence[Any] = client.compute([collections[i] for i in order])
        print(f"{desc}:", file=sys.stderr, flush=True)
        # The scheduler counts every task of the futures' graphs, so the bar moves with
        # the work on all workers, not with whole collections.
        distributed_progress(futures, notebook=False, multi=False)
        print(file=sys.stderr, flush=True)
        # Anything but a collection comes back as it was given, as from dask.compute.
        return _in_place(order, [f.result() if hasattr(f, "result") else f for f in futures])

    from dask.callbacks import Callback
    from tqdm.auto import tqdm

    class _Bar(Callback):
        def _start_state(self, dsk: Any, state: dict) -> None:
            self.bar = tqdm(total=sum(len(state[k]) for k in ("ready", "waiting", "running", "finished")),
                            desc=desc, unit="task", file=sys.stderr)

        def _posttask(self, key: Any, result: Any, dsk: Any, state: dict, worker_id: Any) -> None:
            self.bar.update(1)

        def _finish(self, dsk: Any, state: dict, errored: bool) -> None:
            self.bar.close()

    with _Bar():
        return ordered_compute(*collections)
