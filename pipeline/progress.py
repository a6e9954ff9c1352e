"""Progress bars for compute stages, on a distributed client or the local scheduler.

Long stages show a terminal bar (tqdm) counting finished tasks. On a distributed client
the bar follows the futures as they finish; on the local schedulers it uses a dask
callback. Either way the result is the same as ``dask.compute``.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import dask

__all__ = ["compute"]


def _active_client() -> Any | None:
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):
        return None


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
        return dask.compute(*collections)
    client = _active_client()
    if client is not None:
        from distributed.diagnostics.progressbar import progress as distributed_progress

        futures: Sequence[Any] = client.compute(list(collections))
        print(f"{desc}:", file=sys.stderr, flush=True)
        # The scheduler counts every task of the futures' graphs, so the bar moves with
        # the work on all workers, not with whole collections.
        distributed_progress(futures, notebook=False, multi=False)
        print(file=sys.stderr, flush=True)
        return tuple(f.result() for f in futures)

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
        return dask.compute(*collections)
