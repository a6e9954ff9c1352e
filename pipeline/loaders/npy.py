"""``.npy`` files: shape and dtype from the header only; data by memory map.

``allow_pickle`` is never enabled: an object-dtype or pickled file is refused with its
name, instead of numpy's "Failed to interpret file as a pickle".
"""

from __future__ import annotations

import fsspec
import numpy as np

from pipeline.errors import FormatMismatchError, LoaderError

__all__ = ["probe_npy", "read_npy"]


def probe_npy(path: str, so: dict) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from the header, checking the file is long enough for them."""
    try:
        with fsspec.open(path, "rb", **so) as fh:
            magic = fh.read(6)
            if magic != b"\x93NUMPY":
                raise FormatMismatchError(path, f"expected an .npy file (magic \\x93NUMPY), found {magic[:6]!r}")
            fh.seek(0)
            major, _ = np.lib.format.read_magic(fh)
            read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(fh)
            offset = fh.tell()
            fh.seek(0, 2)
            size = fh.tell()
    except FormatMismatchError:
        raise
    except (ValueError, OSError) as exc:
        raise FormatMismatchError(path, f"expected an .npy header, could not parse it ({exc})") from None
    if dtype.hasobject:
        raise FormatMismatchError(path, "holds Python objects (dtype=object, a pickle); refusing to load it")
    need = offset + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size < need:
        raise LoaderError(path, f"truncated: the header declares {shape} {dtype} ({need} bytes), the file has {size}")
    return tuple(int(s) for s in shape), dtype


def read_npy(path: str, so: dict) -> np.ndarray:
    """One file's data (memory-mapped for local files)."""
    try:
        if "://" not in path or path.startswith("file://"):
            return np.load(path.removeprefix("file://"), mmap_mode="r", allow_pickle=False)
        with fsspec.open(path, "rb", **so) as fh:
            return np.load(fh, allow_pickle=False)
    except ValueError as exc:
        raise LoaderError(path, f"cannot read .npy data ({exc})") from None
