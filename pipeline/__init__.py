"""pipeline: out-of-core training sets.

Raw files become a lazy dask array (:func:`load`), feature windows are computed
blockwise on a dask cluster (:func:`windows`, :func:`cluster`), the result is stored as
chunked, compressed zarr (:func:`write`, :func:`open`), and a chunk-randomizing streamer
(:func:`stream`) feeds shuffled batches to Keras ``model.fit`` or a PyTorch loop.

The public names are imported lazily so that ``pipeline --help`` and ``import
pipeline.errors`` do not pay for importing dask, zarr and the loaders.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from pipeline.errors import PipelineError

__version__ = "0.1.0"

__all__ = [
    "PipelineError",
    "__version__",
    "build_training_set",
    "cluster",
    "load",
    "load_config",
    "mix",
    "open",
    "open_source",
    "run",
    "stream",
    "window_end_rows",
    "windows",
    "write",
]

_LAZY = {
    "build_training_set": ("pipeline.features", "build_training_set"),
    "cluster": ("pipeline.cluster", "cluster"),
    "load": ("pipeline.loaders", "load"),
    "load_config": ("pipeline.config", "load_config"),
    "mix": ("pipeline.streaming.mix", "mix"),
    "open": ("pipeline.storage", "open"),
    "open_source": ("pipeline.loaders", "open_source"),
    "run": ("pipeline.job", "run"),
    "stream": ("pipeline.streaming", "stream"),
    "window_end_rows": ("pipeline.features", "window_end_rows"),
    "windows": ("pipeline.features", "windows"),
    "write": ("pipeline.storage", "write"),
}

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.cluster import cluster
    from pipeline.config import load_config
    from pipeline.features import build_training_set, window_end_rows, windows
    from pipeline.job import run
    from pipeline.loaders import load, open_source
    from pipeline.storage import open, write
    from pipeline.streaming import stream
    from pipeline.streaming.mix import mix


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
