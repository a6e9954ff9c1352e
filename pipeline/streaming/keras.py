"""Keras 3 adapter: a ``keras.utils.PyDataset`` over a :class:`~pipeline.streaming.Stream`.

Keras 3 converts anything array-like handed to ``fit`` into one numpy array: a dask
array passed to ``model.fit`` is loaded whole, every epoch. A PyDataset is iterated
batch by batch instead, on every backend. This class exposes no ``__array__``.
"""

from __future__ import annotations

import threading
from typing import Any, Iterator

import numpy as np

from pipeline.errors import MissingDependencyError

try:
    import keras
except ImportError:  # pragma: no cover - exercised only without the extra
    keras = None

__all__ = ["KerasDataset"]

_Base: Any = keras.utils.PyDataset if keras is not None else object


class KerasDataset(_Base):
    """Batches of a stream, reshuffled every epoch.

    ``model.fit`` shuffles the batch *indices* of a PyDataset by default
    (``shuffle=True``): served literally, every index would seek to another group of
    chunks, turning chunk reads back into random reads. The stream already shuffles
    (chunk order and in-buffer mixing), so the k-th call of an epoch returns the
    stream's k-th batch, whatever index Keras asks for: each batch is still served once
    per epoch, chunks are read once, and the background prefetch keeps the next batch
    ready. To resume mid-epoch, call ``stream.load_state_dict`` before ``fit``.
    """

    def __init__(self, stream: Any, **kwargs: Any):
        if keras is None:
            raise MissingDependencyError("Stream.keras()", "Keras 3", "keras")
        super().__init__(**kwargs)
        self.stream = stream
        self._iter: Iterator[tuple[np.ndarray, ...]] | None = None
        self._served = 0
        # Keras may call __getitem__ from several threads (workers > 1).
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.stream)

    def __getitem__(self, index: int) -> tuple[np.ndarray, ...]:
        if index < 0 or index >= len(self):
            raise IndexError(index)
        with self._lock:
            if self._iter is None or self._served >= len(self):
                # A new pass (validation data is iterated again without on_epoch_end).
                if self._served >= len(self):
                    self.stream.set_epoch(self.stream.epoch)
                    self.stream.load_state_dict({"epoch": self.stream.epoch, "batches_served": 0,
                                                 "seed": self.stream.seed, "rank": self.stream.rank,
                                                 "world_size": self.stream.world_size})
                    self._served = 0
                self._iter = iter(self.stream)
            self._served += 1
            return next(self._iter)

    def on_epoch_end(self) -> None:
        with self._lock:
            if self._iter is not None:
                self._iter.close()  # releases the reader threads
            self._iter = None
            self._served = 0
            self.stream.set_epoch(self.stream.epoch + 1)
