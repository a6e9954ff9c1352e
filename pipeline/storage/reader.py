"""Opening a finished store: splits, arrays and the provenance metadata."""

from __future__ import annotations

import os
from typing import Any, Iterator, Mapping

import zarr

from pipeline.errors import IncompleteStoreError, StoreError
from pipeline.storage.store import open_store_group, store_root_attrs

__all__ = ["Dataset", "open"]


class Dataset(Mapping[str, zarr.Group]):
    """A read-only view of a store: ``ds["train"]["x"]`` is a ``zarr.Array``."""

    def __init__(self, group: zarr.Group, location: str):
        self.group = group
        self.location = location
        self.attrs: dict[str, Any] = store_root_attrs(group)

    @property
    def splits(self) -> tuple[str, ...]:
        """Split names in the order they were written."""
        names = list(self.attrs.get("splits", {}))
        present = {name for name, _ in self.group.groups() if not name.startswith("_")}
        return tuple(n for n in names if n in present) or tuple(sorted(present))

    def __getitem__(self, split: str) -> zarr.Group:
        if split not in self.splits:
            raise KeyError(f"{self.location}: no split {split!r} (splits: {', '.join(self.splits)})")
        return self.group[split]

    def __iter__(self) -> Iterator[str]:
        return iter(self.splits)

    def __len__(self) -> int:
        return len(self.splits)

    def __repr__(self) -> str:
        parts = ", ".join(f"{s}: {self.group[s]['x'].shape}" for s in self.splits if "x" in self.group[s])
        return f"<pipeline.Dataset {self.location} {parts}>"


def open(
    location: str | os.PathLike[str],
    *,
    partial: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> Dataset:
    """Open a store written by :func:`pipeline.write` or ``pipeline run``.

    Parameters
    ----------
    location
        Directory, ``.zarr.zip`` file or fsspec URL.
    partial
        Allow reading a store whose writer has not finished (its unwritten chunks read
        as zeros).
    storage_options
        fsspec options for remote URLs.

    Raises
    ------
    IncompleteStoreError
        When the store is not marked complete and ``partial`` is false.
    """
    loc = os.fspath(location)
    group = open_store_group(loc, mode="r", storage_options=storage_options)
    meta = store_root_attrs(group)
    if not meta:
        raise StoreError(f"{loc}: not a pipeline store (no '{'pipeline'}' attributes)")
    if not meta.get("complete") and not partial:
        raise IncompleteStoreError(loc)
    return Dataset(group, loc)
