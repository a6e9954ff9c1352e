"""Storage: chunked, compressed zarr 3 stores with splits and provenance."""

from pipeline.storage.codecs import CodecSpec
from pipeline.storage.inspect import format_report, inspect_store, plot_store, verify_store
from pipeline.storage.reader import Dataset, open
from pipeline.storage.store import open_store_group
from pipeline.storage.writer import write

__all__ = [
    "CodecSpec",
    "Dataset",
    "format_report",
    "inspect_store",
    "open",
    "open_store_group",
    "plot_store",
    "verify_store",
    "write",
]
