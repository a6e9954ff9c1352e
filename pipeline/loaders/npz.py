"""``.npz`` archives: one named array per file, header-only probe, never unpickled."""

from __future__ import annotations

import zipfile

import fsspec
import numpy as np

from pipeline.errors import FormatMismatchError, LoaderError

__all__ = ["probe_npz", "read_npz"]


def _member(path: str, names: list[str], key: str | None) -> str:
    arrays = [n[:-4] for n in names if n.endswith(".npy")]
    if key is None:
        if len(arrays) != 1:
            raise LoaderError(path, f"holds arrays {arrays}; choose one with key:")
        return arrays[0] + ".npy"
    if key not in arrays:
        raise LoaderError(path, f"has no array {key!r} (arrays: {arrays})")
    return key + ".npy"


def probe_npz(path: str, so: dict, *, key: str | None = None) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of the chosen member, from its .npy header inside the zip."""
    try:
        with fsspec.open(path, "rb", **so) as fh:
            try:
                zf = zipfile.ZipFile(fh)
            except zipfile.BadZipFile:
                raise FormatMismatchError(path, "expected an .npz (zip) archive, found something else") from None
            with zf, zf.open(_member(path, zf.namelist(), key)) as member:
                version = np.lib.format.read_magic(member)
                read = np.lib.format.read_array_header_1_0 if version[0] == 1 else np.lib.format.read_array_header_2_0
                shape, _, dtype = read(member)
    except (FormatMismatchError, LoaderError):
        raise
    except (ValueError, OSError) as exc:
        raise FormatMismatchError(path, f"expected an .npz of .npy members, could not parse it ({exc})") from None
    if dtype.hasobject:
        raise FormatMismatchError(path, "holds Python objects (dtype=object, a pickle); refusing to load it")
    return tuple(int(s) for s in shape), dtype


def read_npz(path: str, so: dict, *, key: str | None = None) -> np.ndarray:
    """The chosen member's data (``allow_pickle`` stays off)."""
    try:
        with fsspec.open(path, "rb", **so) as fh, np.load(fh, allow_pickle=False) as z:
            return z[_member(path, [n + ".npy" for n in z.files], key)[:-4]]
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise LoaderError(path, f"cannot read .npz data ({exc})") from None
