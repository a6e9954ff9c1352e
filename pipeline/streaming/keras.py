"""Keras 3 adapter: a ``keras.utils.PyDataset`` over a :class:`~pipeline.streaming.Stream`.

Keras 3 converts anything array-like handed to ``fit`` into one numpy array: a dask
array passed to ``model.fit`` is loaded whole, every epoch. A PyDataset is iterated
batch by batch instead, on every backend. This class exposes no ``__array__``.
"""

from __future__ import annotations

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
    """Batches of a stream, in order, reshuffled every epoch.

    Keras calls ``__getitem__(0) .. __getitem__(len-1)`` then ``on_epoch_end``; the
    stream's background prefetching keeps the next batch ready. An out-of-order index
    (a resumed fit) repositions the stream through its plan without reading skipped
    chunks.
    """

    def __init__(self, stream: Any, **kwargs: Any):
        if keras is None:
            raise MissingDependencyError("Stream.keras()", "Keras 3", "keras")
        super().__init__(**kwargs)
        self.stream = stream
        self._iter: Iterator[tuple[np.ndarray, ...]] | None = None
        self._next = 0

    def __len__(self) -> int:
        return len(self.stream)

    def __getitem__(self, index: int) -> tuple[np.ndarray, ...]:
        if index < 0 or index >= len(self):
            raise IndexError(index)
        if self._iter is None or index != self._next:
            self.stream.load_state_dict({"epoch": self.stream.epoch, "batches_served": index})
            self._iter = iter(self.stream)
        self._next = index + 1
        return next(self._iter)

    def on_epoch_end(self) -> None:
        if self._iter is not None:
            self._iter.close()  # releases the reader threads
        self._iter = None
        self._next = 0
        self.stream.set_epoch(self.stream.epoch + 1)
