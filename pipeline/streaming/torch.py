"""PyTorch adapter: an ``IterableDataset`` that shares chunks among ranks and workers.

Use it with ``DataLoader(ds, batch_size=None, num_workers=k)``: batches come ready-made.
Each DataLoader worker serves a contiguous share of its rank's batches, so across all
ranks and workers every sample appears exactly once per epoch. Only the store location
is pickled to workers; each opens the store itself after the fork (no zarr, fsspec or
blosc thread state crosses it), with blosc's internal threads off.

To resume mid-epoch, count the batches the loop consumed this epoch and save
``stream.state_dict(batches_served=n, num_workers=k)`` (``k`` the loader's
``num_workers``); before the next ``iter(loader)``, call ``stream.load_state_dict`` with
it: each worker then serves its share of exactly what is left. Without
``global_batch_size`` the loader must have the same number of workers (and the stream
the same rank and world size); with it, any (see :mod:`pipeline.streaming.elastic`).
"""

from __future__ import annotations

from typing import Any, Iterator

from pipeline.errors import MissingDependencyError

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError:  # pragma: no cover - exercised only without the extra
    torch = None
    IterableDataset = object

__all__ = ["TorchDataset"]


class TorchDataset(IterableDataset):
    """One epoch of a stream (or of a :class:`~pipeline.streaming.mix.Mix`) per
    iteration, as tuples of tensors."""

    def __init__(self, stream: Any, *, pin_memory: bool = False):
        if torch is None:
            raise MissingDependencyError("Stream.torch()", "PyTorch", "torch")
        super().__init__()
        self.stream = stream
        self.pin_memory = pin_memory

    def __len__(self) -> int:
        return len(self.stream)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        if info is not None:
            import numcodecs

            numcodecs.blosc.use_threads = False  # our threads decode; blosc's would oversubscribe
            # A mix (pipeline.streaming.mix) serves the batches of several streams.
            for stream in getattr(self.stream, "streams", (self.stream,)):
                stream.threads = 2
                # A forked worker shares the parent's open files (a zip store's handle and
                # offset): open the store again before any reader thread starts.
                reopen = getattr(stream.source, "_reopen", None)
                if reopen is not None:
                    reopen()
        pin = self.pin_memory and torch.cuda.is_available() and info is None
        # Resuming (Stream.load_state_dict): each worker serves its share of what the
        # loop has not consumed yet.
        # In the main process (num_workers=0) the stream lives on between epochs and can
        # read the next epoch's first chunks early; a worker process ends with its epoch.
        for batch in self.stream.iter_resumed(worker, workers, read_ahead=info is None):
            tensors = tuple(torch.from_numpy(b) for b in batch)
            yield tuple(t.pin_memory() for t in tensors) if pin else tensors
