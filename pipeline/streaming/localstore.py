"""A local pipeline store's groups and arrays, read from their ``zarr.json`` files.

Opening a stream needs a store's attributes and each array's shape, chunks, dtype and
codecs; the chunks themselves are read and decoded by
:class:`~pipeline.streaming.chunks.ChunkReader` without zarr. ``import zarr`` costs a
fresh process about 0.2 s (its codec registry, config and event loop), as much as
numpy and the whole rest of the stream's first batch together. So a store this package
wrote in a local directory is opened here, from the JSON documents zarr 3 itself
defines, and zarr is imported only where its own code must read something: a layout the
fast path does not decode, the checksums of ``verify=True``, fold indexes.

Anything else (zip files, remote URLs, zarr 2, another tool's store, an array whose
dtype or fill value this module does not spell) is opened by zarr, as before:
:func:`open_local` returns None for it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import math
import os
import sys
from typing import Any, Iterator

import numpy as np

from pipeline.errors import StoreError
from pipeline.storage.store import ATTRS_KEY, local_path

__all__ = ["LocalArray", "LocalGroup", "is_group", "is_zarr", "one_reading", "open_local", "open_root"]

_META = "zarr.json"

#: While a stream opens (:func:`one_reading`): each store's root group, by location,
#: opened once. Opening opened the root three times (for another tool's variables, a
#: fold, the split): requests each on an object store.
_SEEN: contextvars.ContextVar[dict[Any, Any] | None] = contextvars.ContextVar("pipeline_seen", default=None)


@contextlib.contextmanager
def one_reading() -> Iterator[None]:
    """Within the block, :func:`open_root` of the same location gives what the first
    open found (the store as it was opened)."""
    token = _SEEN.set({})
    try:
        yield
    finally:
        _SEEN.reset(token)


def _seen(key: Any, read: Any) -> Any:
    """``read()``, or within :func:`one_reading` what it gave for ``key`` the first time."""
    memo = _SEEN.get()
    if memo is None:
        return read()
    if key not in memo:
        memo[key] = read()
    return memo[key]


def _read_meta(directory: str, strict: bool = False) -> dict[str, Any] | None:
    """A node's zarr 3 metadata; None when ``directory`` holds none, or (unless
    ``strict``) none this module reads.

    Raises
    ------
    StoreError
        With ``strict``, for a ``zarr.json`` that is not zarr 3 metadata, naming it.
    """
    path = os.path.join(directory, _META)
    try:
        with open(path, "rb") as fh:
            meta = json.loads(fh.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        if strict:
            raise StoreError(f"{path}: not readable zarr metadata ({exc})") from exc
        return None
    if not isinstance(meta, dict) or meta.get("zarr_format") != 3 or meta.get("node_type") not in ("group", "array"):
        if strict:
            raise StoreError(f"{path}: not the metadata of a zarr 3 group or array")
        return None
    return meta


def open_local(location: Any) -> "LocalGroup | None":
    """The root group of a store this package wrote in a local directory, or None for
    any other location (zarr opens those)."""
    loc = local_path(location)
    if loc is None:
        return None
    meta = _read_meta(loc)
    if meta is None or meta.get("node_type") != "group" or ATTRS_KEY not in (meta.get("attributes") or {}):
        return None
    return LocalGroup(os.path.abspath(loc), "", meta)


def is_zarr(obj: Any, kind: str) -> bool:
    """Whether ``obj`` is a ``zarr.<kind>`` (``"Group"``, ``"Array"``), asked without
    importing zarr: whoever made one has imported it."""
    zarr = sys.modules.get("zarr")
    return zarr is not None and isinstance(obj, getattr(zarr, kind))


def is_group(node: Any) -> bool:
    """Whether ``node`` is a group: a :class:`LocalGroup` or a zarr group."""
    return isinstance(node, LocalGroup) or is_zarr(node, "Group")


class _Metadata:
    """What :class:`~pipeline.streaming.chunks.ChunkReader` asks of zarr's array
    metadata: the document as a dict, and its format."""

    zarr_format = 3

    def __init__(self, doc: dict[str, Any]):
        self._doc = doc

    def to_dict(self) -> dict[str, Any]:
        return self._doc


def _fill_value(value: Any, dtype: np.dtype) -> Any:
    """zarr 3's JSON fill value as a scalar of ``dtype`` (ValueError for a spelling
    this module does not read: zarr opens such an array)."""
    if isinstance(value, str):
        special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
        if value not in special or dtype.kind not in "fc":
            raise ValueError(f"fill value {value!r}")
        value = special[value]
    if isinstance(value, (list, dict)) or value is None:
        raise ValueError(f"fill value {value!r}")
    return np.array(value, dtype=dtype)[()]


class LocalArray:
    """One array of a local store, as far as streaming reads it without zarr.

    Attributes mirror ``zarr.Array``'s (``shape``, ``chunks``, ``shards``, ``dtype``,
    ``fill_value``, ``path``, ``attrs``, ``metadata``); ``local_dir`` is the directory
    its chunk keys are under. Anything else, such as reading values, goes to the zarr
    array of the same path (opened on first use, with the same length).
    """

    def __init__(self, root: str, path: str, doc: dict[str, Any]):
        grid = doc.get("chunk_grid") or {}
        if grid.get("name") != "regular" or not isinstance(doc.get("data_type"), str):
            raise ValueError("not a regular grid of a plain dtype")
        if doc.get("storage_transformers"):
            raise ValueError("storage transformers")  # they change where chunks are: zarr's to read
        self.root, self.path = root, path
        self.local_dir = os.path.join(root, path)
        self.shape = tuple(int(n) for n in doc["shape"])
        outer = tuple(int(n) for n in grid["configuration"]["chunk_shape"])
        codecs = doc.get("codecs") or []
        if len(codecs) == 1 and codecs[0].get("name") == "sharding_indexed":
            # zarr calls the inner chunks the chunks, the stored objects the shards.
            self.chunks = tuple(int(n) for n in codecs[0]["configuration"]["chunk_shape"])
            self.shards: tuple[int, ...] | None = outer
        else:
            self.chunks, self.shards = outer, None
        self.dtype = np.dtype(doc["data_type"])
        self.fill_value = _fill_value(doc.get("fill_value"), self.dtype)
        self.attrs = dict(doc.get("attributes") or {})
        self.metadata = _Metadata(doc)
        self.ndim = len(self.shape)
        self._zarr: Any = None

    def __repr__(self) -> str:
        return f"<LocalArray {self.local_dir} shape={self.shape} dtype={self.dtype}>"

    @property
    def store_path(self) -> str:
        return f"file://{self.local_dir}"

    def with_rows(self, rows: int) -> "LocalArray":
        """This array seen with its first ``rows`` samples only (a store version's
        length: whatever was appended after them is not read)."""
        doc = dict(self.metadata.to_dict())
        doc["shape"] = [int(rows), *self.shape[1:]]
        return LocalArray(self.root, self.path, doc)

    def zarr(self) -> Any:
        """The zarr array of the same path and length."""
        if self._zarr is None:
            import zarr

            from pipeline.storage.versions import pinned_array

            arr = zarr.open_group(self.root, mode="r")[self.path]
            self._zarr = pinned_array(arr, self.shape[0]) if arr.shape[0] != self.shape[0] else arr
        return self._zarr

    def __getitem__(self, key: Any) -> Any:
        return self.zarr()[key]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.zarr(), name)


class LocalGroup:
    """One group of a local store: its attributes and its members, read from their
    ``zarr.json`` files. Members are :class:`LocalArray` where this module reads their
    metadata, else zarr's own array."""

    def __init__(self, root: str, path: str, doc: dict[str, Any]):
        self.root, self.path = root, path
        self.attrs = dict(doc.get("attributes") or {})
        self.store = None  # not a remote store: no node-local cache applies
        self.local_dir = os.path.join(root, path)

    def __repr__(self) -> str:
        return f"<LocalGroup {self.local_dir}>"

    def _child(self, name: str) -> str:
        return f"{self.path}/{name}".strip("/")

    def get(self, name: str, default: Any = None) -> Any:
        path = self._child(name)
        doc = _read_meta(os.path.join(self.root, path), strict=True)
        if doc is None:
            return default
        if doc.get("node_type") == "group":
            return LocalGroup(self.root, path, doc)
        try:
            return LocalArray(self.root, path, doc)
        except (ValueError, TypeError, KeyError):
            return self.zarr()[name]

    def __getitem__(self, name: str) -> Any:
        node = self.get(name)
        if node is None:
            raise KeyError(name)
        return node

    def __contains__(self, name: str) -> bool:
        return os.path.isfile(os.path.join(self.root, self._child(name), _META))

    def _members(self) -> Iterator[tuple[str, Any]]:
        try:
            names = sorted(os.listdir(self.local_dir))
        except OSError:
            return
        for name in names:
            if name != _META and name in self:
                yield name, self[name]

    def groups(self) -> Iterator[tuple[str, Any]]:
        return ((n, m) for n, m in self._members() if isinstance(m, LocalGroup))

    def arrays(self) -> Iterator[tuple[str, Any]]:
        return ((n, m) for n, m in self._members() if not isinstance(m, LocalGroup))

    def zarr(self) -> Any:
        """The zarr group of the same path."""
        import zarr

        group = zarr.open_group(self.root, mode="r")
        return group[self.path] if self.path else group


def open_root(location: Any, storage_options: dict[str, Any] | None = None) -> Any:
    """A store's root group for reading: a :class:`LocalGroup` for a store this package
    wrote in a local directory, else zarr's group
    (:func:`~pipeline.storage.store.open_store_group`)."""
    if not isinstance(location, (str, os.PathLike)):
        return _open_root(location, storage_options)
    key = (os.fspath(location), json.dumps(storage_options or {}, sort_keys=True, default=repr))
    return _seen(key, lambda: _open_root(location, storage_options))


def _open_root(location: Any, storage_options: dict[str, Any] | None) -> Any:
    local = open_local(location)
    if local is not None:
        return local
    from pipeline.storage.store import open_store_group

    return open_store_group(location, mode="r", storage_options=storage_options)
