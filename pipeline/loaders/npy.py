"""``.npy`` files: shape and dtype from the header only; data by memory map.

``allow_pickle`` is never enabled: an object-dtype or pickled file is refused with its
name, instead of numpy's "Failed to interpret file as a pickle".
"""

from __future__ import annotations

import io
import os
import tokenize
from typing import Any

import fsspec
import numpy as np

from pipeline.errors import FormatMismatchError, LoaderError

__all__ = ["HEADER_ERRORS", "header_reason", "probe_npy", "read_npy"]

#: What numpy's header parser raises for a damaged header: a byte changed in its length
#: field or its dict ends the dict early, which numpy's tokenizer reports as
#: ``tokenize.TokenError`` (not a ValueError) and ``ast`` as ``SyntaxError``.
HEADER_ERRORS = (ValueError, SyntaxError, tokenize.TokenError)


def header_reason(exc: BaseException) -> str:
    """What numpy's header parser said, in words for a tokenizer's error (whose own text
    is a tuple such as ``('EOF in multi-line statement', (2, 0))``)."""
    if isinstance(exc, tokenize.TokenError):
        return "its header's dict is cut short: the header or its length field is damaged"
    return str(exc)


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


_HEADERS: dict[bytes, tuple[tuple[int, ...], bool, np.dtype]] = {}


def _parse_header(path: str, prefix: bytes, fh: Any) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """Parse (shape, fortran, dtype) and the data offset; identical headers (the usual
    case for a data set of same-shape files) are parsed once and then looked up.

    Raises
    ------
    FormatMismatchError
        For a file that ends inside its header (it starts with the magic), saying how
        many bytes the header needs and how many the file holds.
    """
    if len(prefix) < 8:
        raise FormatMismatchError(path, f"truncated: the file is {len(prefix)} bytes, too short for an .npy header "
                                  "(the magic \\x93NUMPY and a format version take 8)")
    major = prefix[6]
    size_bytes = 2 if major == 1 else 4
    start = 8 + size_bytes
    if len(prefix) < start:
        raise FormatMismatchError(path, f"truncated header: the file is {len(prefix)} bytes, too short for an .npy "
                                  f"version {major} header, whose length field ends at byte {start}")
    hlen = int.from_bytes(prefix[8:start], "little")
    header = prefix[start : start + hlen]
    if len(header) < hlen:
        fh.seek(start)
        header = fh.read(hlen)
    if len(header) < hlen:
        raise FormatMismatchError(path, f"truncated header: its length field declares {hlen} header bytes from byte "
                                  f"{start}, the file holds {len(header)} of them")
    if header not in _HEADERS:
        buf = io.BytesIO(prefix[:start] + header)
        np.lib.format.read_magic(buf)
        read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        _HEADERS[header] = read(buf)
    shape, fortran, dtype = _HEADERS[header]
    return shape, fortran, dtype, start + hlen


def probe_npy(path: str, so: dict) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype from the header, checking the file is long enough for them."""
    try:
        # Local files skip fsspec: at 100,000 files its per-open overhead dominates.
        local = _is_local(path)
        opener = open(path.removeprefix("file://"), "rb") if local else fsspec.open(path, "rb", **so)
        with opener as fh:
            prefix = fh.read(256)
            if not prefix:
                raise FormatMismatchError(path, "is empty (0 bytes); expected an .npy file")
            if prefix[:6] != b"\x93NUMPY"[: len(prefix)]:  # a file cut inside the magic is truncated, below
                raise FormatMismatchError(path, f"expected an .npy file (magic \\x93NUMPY), found {prefix[:6]!r}")
            shape, _, dtype, offset = _parse_header(path, prefix, fh)
            if local:
                size = os.fstat(fh.fileno()).st_size
            else:
                fh.seek(0, 2)
                size = fh.tell()
    except FormatMismatchError:
        raise
    except OSError as exc:
        raise LoaderError(path, f"cannot read ({exc.strerror or exc})") from None
    except HEADER_ERRORS as exc:
        raise FormatMismatchError(path, f"expected an .npy header, could not parse it ({header_reason(exc)})"
                                  ) from None
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
    except HEADER_ERRORS as exc:
        raise LoaderError(path, f"cannot read .npy data ({header_reason(exc)})") from None
