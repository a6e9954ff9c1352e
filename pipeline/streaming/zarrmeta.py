"""What a zarr array that this package did not write says about itself.

Stores written by other tools (plain zarr, xarray's ``to_zarr``) name their dimensions
(zarr 3 ``dimension_names``, or xarray's ``_ARRAY_DIMENSIONS`` attribute in zarr 2) and
may carry CF encodings: attributes under which the stored numbers are not the values
meant (``scale_factor``, ``add_offset``, a time's ``units = "days since ..."``, a
``dtype`` that xarray restores). Only arrays that name their dimensions are read so:
xarray opens no other. Streaming reads the stored numbers, so a variable with
such an encoding is refused by name (:func:`cf_problem`) rather than served wrong.

:class:`V2ChunkReader` gives zarr 2 arrays (xarray's other format) the fast path of
:class:`~pipeline.streaming.chunks.ChunkReader`: the same decode, other keys.
"""

from __future__ import annotations

import base64
import json
import math
import os
import struct
from typing import TYPE_CHECKING, Any, Sequence

import numcodecs
import numpy as np

from pipeline.errors import StoreError
from pipeline.streaming.chunks import ChunkReader, local_dir

if TYPE_CHECKING:  # pragma: no cover
    import zarr

__all__ = ["METADATA_FILES", "V2ChunkReader", "cf_problem", "chunk_reader", "damaged_json", "dimension_names",
           "metadata_error"]

#: The files a zarr store's metadata lives in: zarr 3's, zarr 2's and consolidated.
METADATA_FILES = ("zarr.json", ".zmetadata", ".zgroup", ".zattrs", ".zarray")

#: Attributes under which the stored numbers are not the values meant, and why.
_ENCODINGS = {
    "scale_factor": "values are stored scaled (value = stored * scale_factor + add_offset)",
    "add_offset": "values are stored offset (value = stored * scale_factor + add_offset)",
    "_Unsigned": "the stored integers are reinterpreted with another signedness",
}


def dimension_names(array: zarr.Array) -> tuple[str, ...] | None:
    """The names of ``array``'s dimensions, or None when it names none."""
    names = getattr(array.metadata, "dimension_names", None)
    if names is None:
        names = array.attrs.get("_ARRAY_DIMENSIONS")
    if names is None or any(n is None for n in names):
        return None
    return tuple(str(n) for n in names)


def _cf_fill(value: Any, dtype: np.dtype) -> float | complex | None:
    """A ``_FillValue`` (or ``missing_value``) attribute as a number; None when it
    cannot be read.

    xarray writes a float's for zarr 3 as base64 of its little-endian bytes (those of a
    double, whatever the variable's float dtype; bytes of the variable's own dtype are
    read too), a complex's as a list of two such strings, and NaN or infinities as
    ``"NaN"``, ``"Infinity"``, ``"-Infinity"``.
    """
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, str):
        return _decoded_float(value, dtype)
    if isinstance(value, (list, tuple)) and len(value) == 2 and dtype.kind == "c":
        parts = [_cf_fill(part, np.dtype(np.float64)) for part in value]
        return None if None in parts else complex(parts[0], parts[1])
    if isinstance(value, (int, float, complex)) and not isinstance(value, bool):
        return value
    return None


def _decoded_float(text: str, dtype: np.dtype) -> float | None:
    """A float fill value spelled as a string: JSON's names for NaN and the infinities,
    or base64 of little-endian bytes (a double's, or ``dtype``'s own)."""
    named = {"nan": math.nan, "+nan": math.nan, "-nan": math.nan, "infinity": math.inf, "+infinity": math.inf,
             "-infinity": -math.inf, "inf": math.inf, "-inf": -math.inf}
    if text.lower() in named:
        return named[text.lower()]
    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        return None
    if len(raw) == 8:
        return struct.unpack("<d", raw)[0]
    if dtype.kind == "f" and len(raw) == dtype.itemsize:
        return float(np.frombuffer(raw, dtype.newbyteorder("<"))[0])
    return None


def cf_problem(array: zarr.Array) -> str | None:
    """Why streaming ``array``'s stored numbers would serve wrong values, or None.

    Strings, times and records are not samples a batch can hold. Attributes are read as
    xarray reads them only on an array that names its dimensions (zarr 3
    ``dimension_names``, zarr 2 ``_ARRAY_DIMENSIONS``): xarray opens no other, so on
    another array ``scale_factor`` or ``_FillValue`` are the user's own attributes. On
    such a variable, what xarray decodes is refused: scaled or offset values, times
    counted from a date (``units = "... since ..."``), ``dtype`` naming bools or
    timedeltas, reinterpreted signedness, and missing-value markers other than NaN on
    floats (the stored NaN is the value meant; any other marker would be served as a
    number where xarray masks it). What xarray leaves as stored (a ``calendar`` or
    ``dtype`` of other values) streams.
    """
    attrs = dict(array.attrs)
    dtype = np.dtype(array.dtype) if isinstance(array.dtype, np.dtype) else None
    if dtype is None or dtype.kind not in "biufc":
        return f"dtype {array.dtype} is not numeric or bool; encode it as numbers first"
    if dimension_names(array) is None:
        return None
    units = attrs.get("units")
    if isinstance(units, str) and " since " in units:
        return (f"attribute units={units!r}: the stored numbers are times counted from a reference date; "
                "write them as numbers of your own (for example seconds as float64) first")
    encodings = dict(_ENCODINGS)
    if str(attrs.get("dtype", "")) == "bool" or str(attrs.get("dtype", "")).startswith("timedelta64"):
        encodings["dtype"] = "the stored numbers decode to another dtype (xarray's encoding of bools or timedeltas)"
    for key, why in encodings.items():
        if key in attrs:
            return f"attribute {key}={attrs[key]!r}: {why}; decode it (xarray: open, then write without the encoding)"
    fills = {k: attrs[k] for k in ("_FillValue", "missing_value") if k in attrs}
    for key, value in fills.items():
        problem = _fill_problem(value, dtype)
        if problem is not None:
            return (f"attribute {key}={problem}: values equal to it are missing under CF conventions and would be "
                    "served as that number; fill or drop them, and write the variable without it")
    if array.metadata.zarr_format == 2 and "_FillValue" not in attrs and array.fill_value is not None:
        # xarray reads a zarr 2 array's fill_value as its _FillValue (it writes it there).
        problem = _fill_problem(array.fill_value, dtype)
        if problem is not None:
            return (f"its .zarray's fill_value {problem} (xarray's _FillValue): values equal to it are missing "
                    "under CF conventions and would be served as that number; fill or drop them, and write the "
                    f"variable with fill_value=None (xarray: encoding={{{array.basename!r}: {{'_FillValue': None}}}})")
    return None


def _fill_problem(value: Any, dtype: np.dtype) -> str | None:
    """A missing-value marker as shown in a refusal, or None where it masks nothing
    (NaN on floats: the stored NaN is the value meant)."""
    number = _cf_fill(value, dtype)
    if dtype.kind in "fc" and number is not None and bool(np.isnan(number)):
        return None
    # The number, not xarray's base64 of its bytes, which no user can read.
    return repr(value if number is None else number)


def chunk_reader(array: zarr.Array, where: tuple[str, str, str], **kwargs: Any) -> ChunkReader:
    """A :class:`ChunkReader` for ``array``, zarr 2 or 3; a remote store's chunk objects
    of either go through the node-local cache when one is given."""
    if array.metadata.zarr_format == 2:
        return V2ChunkReader(array, where, **kwargs)
    return ChunkReader(array, where, **kwargs)


class V2ChunkReader(ChunkReader):
    """A :class:`ChunkReader` of a zarr 2 array: keys ``i.0.0`` (or ``i/0/0``), one
    compressor and no filters, C order, little-endian. Other layouts fall back to
    zarr's own read, as in the base class."""

    def _plan(self) -> tuple[Any, str | None]:
        arr = self.array
        meta = arr.metadata.to_dict()
        self._transposed = False
        self._separator = meta.get("dimension_separator") or "."
        if meta.get("filters") or meta.get("order", "C") != "C" or self._separator not in (".", "/"):
            return None, None
        if any(c != arr.shape[k] for k, c in enumerate(arr.chunks) if k > 0):
            return None, None
        if not np.dtype(arr.dtype).isnative:  # (self.dtype is native: what the batches hold)
            return None, None
        compressor = meta.get("compressor")
        decoder: Any
        if compressor is None:
            decoder = "raw"
        elif compressor.get("id") == "blosc":
            decoder = numcodecs.Blosc()
        elif compressor.get("id") == "zstd":
            decoder = numcodecs.Zstd()
        else:
            return None, None
        return decoder, local_dir(arr)

    def _key(self, i: int) -> str:
        return self._separator.join([str(i)] + ["0"] * len(self.tail_shape))

    def _object_index(self, key: str) -> int:
        # ``5.0`` or ``5/0``: the node-local cache names the object by this index.
        return int(key.split(self._separator)[0])

    def _decode(self, i: int, raw: Any, out: np.ndarray) -> np.ndarray:
        if raw is None and self.array.fill_value is None:
            out[...] = 0  # zarr reads a chunk never written, without a fill value, as zeros
            return out
        return super()._decode(i, raw, out)


# -- damaged metadata ----------------------------------------------------------------------


def damaged_json(exc: BaseException | None) -> json.JSONDecodeError | None:
    """The JSON decoding error behind ``exc`` (itself, or what it was raised from), or
    None: zarr lets a damaged metadata file's error out bare, naming no file."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, json.JSONDecodeError):
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def metadata_error(source: Any, storage_options: dict[str, Any] | None, paths: Sequence[str],
                   error: json.JSONDecodeError) -> StoreError:
    """The error that names a store's metadata file that is not valid JSON.

    Parameters
    ----------
    source
        The store's path or URL, or an open group.
    storage_options
        The fsspec options it was opened with.
    paths
        Nodes whose metadata opening the store read (``""`` the root, a split, its
        arrays): their files are searched for the document that failed.
    error
        The decoding error, whose document is matched against those files.
    """
    label = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<group>"
    key = _damaged_file(source, storage_options, paths, error.doc)
    what = key if key is not None else f"a metadata file ({', '.join(METADATA_FILES)})"
    return StoreError(f"{label}: {what} is not valid JSON ({error.msg}: line {error.lineno} column {error.colno}); "
                      "the store's metadata is damaged (a write cut short, or edited by hand): restore the file or "
                      "write the store again")


def _damaged_file(source: Any, storage_options: dict[str, Any] | None, paths: Sequence[str], doc: str
                  ) -> str | None:
    """The key, in the store, of the metadata file that holds ``doc``, or None when none
    of the nodes ``paths`` has it (or the store cannot be read to tell)."""
    try:
        get = _metadata_reader(source, storage_options)
        for path in dict.fromkeys(paths):
            for name in METADATA_FILES:
                key = f"{path.strip('/')}/{name}".lstrip("/")
                raw = get(key)
                if raw is not None and raw.decode("utf-8", "replace") == doc:
                    return key
    except Exception:  # noqa: BLE001 - an error message is being made: the store unreadable says no file
        return None
    return None


def _metadata_reader(source: Any, storage_options: dict[str, Any] | None) -> Any:
    """``get(key) -> bytes | None`` reading the store ``source`` (path, URL or group)
    through zarr's store classes, as opening it did."""
    import zarr
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    from pipeline.storage.store import is_remote, is_zip

    prefix = ""
    if isinstance(source, zarr.Group):
        store, prefix = source.store, source.path
    else:
        loc = os.fspath(source).removeprefix("file://")
        if is_zip(loc):
            store = zarr.storage.ZipStore(loc, mode="r")
        elif is_remote(loc):
            store = zarr.storage.FsspecStore.from_url(loc, storage_options=storage_options, read_only=True)
        else:
            store = zarr.storage.LocalStore(loc, read_only=True)

    def get(key: str) -> bytes | None:
        buf = sync(store.get(f"{prefix}/{key}".lstrip("/"), prototype=default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    return get
