"""Opening a finished store: splits, arrays and the provenance metadata."""

from __future__ import annotations

import os
from typing import Any, Iterator, Mapping

import numpy as np
import zarr

from pipeline.errors import IncompleteStoreError, StoreError
from pipeline.storage.store import FOLDS, open_store_group, store_root_attrs
from pipeline.storage.versions import Version, attrs_at, pinned_array, select_version, versions_of

__all__ = ["Dataset", "Fold", "FoldArray", "SplitGroup", "open"]


class SplitGroup(Mapping[str, zarr.Array]):
    """The arrays of one split at a store's version: ``split["x"]`` is a ``zarr.Array``
    holding exactly that version's samples, however many were appended since.

    Attributes
    ----------
    group
        The split's ``zarr.Group`` (its arrays as they are now, appends included).
    samples
        The version's sample count.
    """

    def __init__(self, group: zarr.Group, samples: int):
        self.group, self.samples = group, int(samples)

    def __getitem__(self, name: str) -> zarr.Array:
        try:
            node = self.group[name]
        except KeyError:
            node = None
        if not isinstance(node, zarr.Array):
            held = ", ".join(self) or "none"
            why = ""
            if name == "x" and "ends" in self:
                # Virtual windows (windows.materialize: false) keep no x: a stream makes
                # each window from the shared features and its end row.
                why = ("; this store's windows are virtual (windows.materialize: false): they are made from "
                       "_shared/features at the rows in 'ends' as they are streamed: read them with "
                       "pipeline.stream(store, split=...), or build with windows.materialize: true for an x array")
            raise KeyError(f"{self.group.path}: no array {name!r} (arrays: {held}){why}")
        return pinned_array(node, self.samples) if not name.startswith("_") else node

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(name for name, _ in self.group.arrays()))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.group and isinstance(self.group[name], zarr.Array)

    def arrays(self) -> Iterator[tuple[str, zarr.Array]]:
        """``(name, array)`` pairs, as ``zarr.Group.arrays`` gives them."""
        return ((name, self[name]) for name in self)

    @property
    def attrs(self) -> Any:
        return self.group.attrs

    def __repr__(self) -> str:
        return f"<pipeline.SplitGroup {self.group.path}: {self.samples} samples>"


class FoldArray:
    """One array of a fold's base split, seen through the fold's sample indices.

    Nothing is read until indexed: ``a[i]``, ``a[lo:hi]``, ``a[[...]]`` read the fold's
    samples ``i``... from the base split's array, ``np.asarray(a)`` all of them.
    """

    def __init__(self, array: zarr.Array, index: np.ndarray):
        self.array, self.index = array, index  # the base split's array, pinned to its version

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self.index.size),) + tuple(self.array.shape[1:])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.array.dtype)

    def __len__(self) -> int:
        return int(self.index.size)

    def __getitem__(self, key: Any) -> np.ndarray:
        rows = self.index[key]
        if np.ndim(rows) == 0:
            return np.asarray(self.array[int(rows)])
        return np.asarray(self.array.get_orthogonal_selection(np.asarray(rows)))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def __repr__(self) -> str:
        return f"<pipeline.FoldArray {self.shape} {self.dtype}>"


class Fold(Mapping[str, FoldArray]):
    """A fold of a store: ``fold["y"]`` is the base split's ``y`` at the fold's samples.

    For analysis and checks (a few samples, labels); to train on a fold, stream it:
    ``pipeline.stream(store, split=name)`` reads it chunk by chunk.

    Attributes
    ----------
    name, base
        The fold's name and the split its indices point into.
    index
        The fold's sorted sample indices into ``base`` (int64).
    """

    def __init__(self, name: str, base: str, group: "SplitGroup", index: np.ndarray):
        self.name, self.base, self.group, self.index = name, base, group, index

    def __getitem__(self, array: str) -> FoldArray:
        if array.startswith("_") or array not in self.group:
            raise KeyError(f"fold {self.name!r}: split {self.base!r} has no array {array!r} "
                           f"(arrays: {', '.join(self)})")
        return FoldArray(self.group[array], self.index)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(name for name in self.group if not name.startswith("_")))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"<pipeline.Fold {self.name} of {self.base}: {self.index.size} samples>"


class Dataset(Mapping[str, "SplitGroup | Fold"]):
    """A read-only view of one version of a store: ``ds["train"]["x"]`` is a
    ``zarr.Array`` of that version's samples; ``ds["fold0/train"]`` is a :class:`Fold`
    of the folds listed in ``ds.folds``.

    Attributes
    ----------
    version
        The :class:`~pipeline.storage.versions.Version` it shows.
    versions
        Every version of the store, oldest first.
    attrs
        The store's attributes as of ``version``.
    """

    def __init__(self, group: zarr.Group, location: str, version: int | None = None):
        self.group = group
        self.location = location
        meta = store_root_attrs(group)
        self.versions: list[Version] = versions_of(meta)
        self.version: Version = select_version(meta, version, location)
        self.attrs: dict[str, Any] = attrs_at(meta, self.version)

    @property
    def splits(self) -> tuple[str, ...]:
        """Split names in the order they were written."""
        names = list(self.attrs.get("splits", {}))
        # The group of fold indices is no split (a split of that name has "_written").
        present = {name for name, sub in self.group.groups()
                   if not name.startswith("_") and (name != FOLDS or "_written" in sub)}
        return tuple(n for n in names if n in present) or tuple(sorted(present))

    @property
    def folds(self) -> tuple[str, ...]:
        """Fold names, sorted (empty for a store written without folds)."""
        info = self.attrs.get("folds")
        return tuple(info.get("names") or ()) if isinstance(info, Mapping) else ()

    def __getitem__(self, split: str) -> SplitGroup | Fold:
        if split in self.folds:
            return self.fold(split)
        if split not in self.splits:
            raise KeyError(f"{self.location}: no split {split!r} (splits: {', '.join(self.splits)}; "
                           f"folds: {', '.join(self.folds) or 'none'})")
        return self._split(split)

    def _split(self, split: str) -> SplitGroup:
        group = self.group[split]
        samples = self.version.samples.get(split)
        if samples is None:  # a store written before versions: its arrays as they are
            first = next((a for name, a in group.arrays() if not name.startswith("_")), None)
            samples = 0 if first is None else int(first.shape[0])
        return SplitGroup(group, samples)

    def fold(self, name: str) -> Fold:
        """Fold ``name``: its base split's arrays at its sample indices.

        Raises
        ------
        KeyError
            When the store has no fold of that name.
        StoreError
            When its index array is missing.
        """
        if name not in self.folds:
            raise KeyError(f"{self.location}: no fold {name!r} (folds: {', '.join(self.folds) or 'none'})")
        base = self.attrs["folds"]["base"]
        try:
            index = np.asarray(self.group[f"{FOLDS}/{name}"][:], dtype=np.int64)
        except KeyError as exc:
            raise StoreError(f"{self.location}: fold {name!r} is listed, but {FOLDS}/{name} is missing") from exc
        return Fold(name, base, self._split(base), index)

    def __iter__(self) -> Iterator[str]:
        return iter(self.splits)

    def __len__(self) -> int:
        return len(self.splits)

    def __repr__(self) -> str:
        parts = ", ".join(f"{s}: {self[s]['x'].shape}" for s in self.splits if "x" in self.group[s])
        return f"<pipeline.Dataset {self.location} v{self.version.number} {parts}>"


def open(
    location: str | os.PathLike[str] | zarr.Group,
    *,
    partial: bool = False,
    storage_options: dict[str, Any] | None = None,
    version: int | None = None,
) -> Dataset:
    """Open a version of a store written by :func:`pipeline.write` or ``pipeline run``.

    Parameters
    ----------
    location
        Directory, ``.zarr.zip`` file or fsspec URL, or the store's root group opened
        already (``zarr.open_group``).
    version
        The version to show (``ds.versions`` lists them; negative counts from the
        newest). ``None``: the newest when opening. Either way the dataset keeps that
        version while later appends add others.
    partial
        Allow reading a store whose writer has not finished (its unwritten chunks read
        as zeros).
    storage_options
        fsspec options for remote URLs.

    Raises
    ------
    IncompleteStoreError
        When the store is not marked complete and ``partial`` is false.
    StoreError
        When the store has no such version.
    """
    if isinstance(location, zarr.Group):  # opened already (zarr.open_group, an icechunk session's store)
        group, loc = location, f"{location.store}/{location.path}".rstrip("/")
    elif isinstance(location, (str, os.PathLike)):
        loc = os.fspath(location)
        group = open_store_group(loc, mode="r", storage_options=storage_options)
    else:
        raise StoreError(f"pipeline.open takes a store's path, URL or zarr group, got {type(location).__name__}; a "
                         "zarr array or a pair of them streams with pipeline.stream")
    meta = store_root_attrs(group)
    if not meta:
        raise StoreError(f"{loc}: not a pipeline store (no 'pipeline' attributes): pipeline.open reads the splits "
                         "and provenance pipeline writes; a zarr store another tool wrote streams as it is with "
                         "pipeline.stream(path or group), and zarr.open_group(path) reads it")
    if not meta.get("complete") and not partial:
        raise IncompleteStoreError(loc)
    return Dataset(group, loc, version)
