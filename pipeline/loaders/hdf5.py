"""HDF5 files (h5py): one dataset path per file, shape from metadata, read by block."""

from __future__ import annotations

from typing import Any

import fsspec
import numpy as np

from pipeline.errors import FormatMismatchError, LoaderError, MissingDependencyError

__all__ = ["probe_hdf5", "read_hdf5"]


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:  # pragma: no cover
        raise MissingDependencyError("Reading HDF5", "h5py", "hdf5") from None
    return h5py


def _dataset_name(path: str, dataset: str | None, f: Any) -> str:
    if dataset is not None:
        return dataset
    names = [k for k in f.keys() if hasattr(f[k], "shape")]
    if len(names) != 1:
        raise LoaderError(path, f"holds datasets {names}; choose one with dataset:")
    return names[0]


def probe_hdf5(path: str, so: dict, *, dataset: str | None = None) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of the dataset, without reading it."""
    h5py = _h5py()
    try:
        with fsspec.open(path, "rb", **so) as fh:
            head = fh.read(8)
            if head != b"\x89HDF\r\n\x1a\n":
                raise FormatMismatchError(path, f"expected an HDF5 file, found bytes {head!r}")
            fh.seek(0)
            with h5py.File(fh, "r") as f:
                name = _dataset_name(path, dataset, f)
                if name not in f:
                    raise LoaderError(path, f"has no dataset {name!r} (top level: {list(f.keys())})")
                ds = f[name]
                return tuple(int(s) for s in ds.shape), np.dtype(ds.dtype)
    except (FormatMismatchError, LoaderError):
        raise
    except OSError as exc:
        raise LoaderError(path, f"cannot read HDF5 ({exc})") from None


def read_hdf5(path: str, so: dict, *, dataset: str | None = None, rows: slice | None = None) -> np.ndarray:
    """The dataset, or a block of its rows."""
    h5py = _h5py()
    try:
        with fsspec.open(path, "rb", **so) as fh, h5py.File(fh, "r") as f:
            ds = f[_dataset_name(path, dataset, f)]
            return ds[rows] if rows is not None else ds[()]
    except OSError as exc:
        raise LoaderError(path, f"cannot read HDF5 data ({exc})") from None
