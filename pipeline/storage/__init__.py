"""Storage: chunked, compressed zarr 3 stores with splits and provenance.

Names are imported when first used: a stream opening a store needs the store helpers,
not the writer (dask) or the plotting code.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "CodecSpec",
    "Dataset",
    "VerifyReport",
    "format_report",
    "inspect_store",
    "open",
    "open_store_group",
    "plot_store",
    "verify_store",
    "write",
]

_LAZY = {
    "CodecSpec": "pipeline.storage.codecs",
    "Dataset": "pipeline.storage.reader",
    "VerifyReport": "pipeline.storage.inspect",
    "format_report": "pipeline.storage.inspect",
    "inspect_store": "pipeline.storage.inspect",
    "open": "pipeline.storage.reader",
    "open_store_group": "pipeline.storage.store",
    "plot_store": "pipeline.storage.plot",
    "verify_store": "pipeline.storage.inspect",
    "write": "pipeline.storage.writer",
}

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.storage.codecs import CodecSpec
    from pipeline.storage.inspect import VerifyReport, format_report, inspect_store, verify_store
    from pipeline.storage.plot import plot_store
    from pipeline.storage.reader import Dataset, open
    from pipeline.storage.store import open_store_group
    from pipeline.storage.writer import write


def __getattr__(name: str) -> Any:
    try:
        module = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'pipeline.storage' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
