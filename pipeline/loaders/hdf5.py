"""HDF5 files (h5py): one dataset path per file, shape from metadata, read by block.

Every file is read at the same dataset path: ``dataset=``, or else the one dataset of
the first file (groups searched too), which every other file must then hold, so that
one file's ``/prices`` is never joined with another's ``/volumes``.
"""

from __future__ import annotations

from typing import Any, Sequence

import fsspec
import numpy as np

from pipeline.errors import FormatMismatchError, LoaderError, MissingDependencyError

__all__ = ["default_dataset", "probe_hdf5", "read_hdf5", "shared_dataset"]

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: Dataset paths shown in a message, at most.
_SHOWN = 20


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:  # pragma: no cover
        raise MissingDependencyError("Reading HDF5", "h5py", "hdf5") from None
    return h5py


def _datasets(group: Any) -> list[str]:
    """Paths of every dataset under ``group``, nested ones too, in h5py's visit order."""
    h5py = _h5py()
    out: list[str] = []
    group.visititems(lambda name, obj: out.append(name) if isinstance(obj, h5py.Dataset) else None)
    return out


def _listing(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_SHOWN])
    more = f", and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
    return f"[{shown}{more}]"


def _only_dataset(path: str, f: Any) -> str:
    """The file's one dataset, searched through its groups.

    Raises
    ------
    LoaderError
        For a file of no dataset, or of several, listing them.
    """
    names = _datasets(f)
    if len(names) != 1:
        held = f"holds datasets {_listing(names)}" if names else "holds no dataset"
        raise LoaderError(path, f"{held}; choose one with dataset:")
    return names[0]


def _dataset(path: str, f: Any, name: str, chosen_in: str | None) -> Any:
    """The dataset ``name`` of the open file ``f``.

    Raises
    ------
    LoaderError
        For a missing path (listing the file's datasets, and saying which file the name
        was chosen in when it was not given), or a path naming a group or another object.
    """
    h5py = _h5py()
    try:
        obj = f[name]
    except KeyError:
        obj = None
    if isinstance(obj, h5py.Dataset):
        return obj
    if obj is None:
        why = (f"; {name!r} is the only dataset of {chosen_in}, the first file, and every file must hold the "
               "dataset read from the first: set dataset: to choose one" if chosen_in and chosen_in != path else "")
        raise LoaderError(path, f"has no dataset {name!r} (its datasets: {_listing(_datasets(f))}){why}")
    if isinstance(obj, h5py.Group):
        raise LoaderError(path, f"{name!r} is a group, not a dataset (datasets under it: "
                          f"{_listing([name.rstrip('/') + '/' + n for n in _datasets(obj)])}); set dataset: to one")
    raise LoaderError(path, f"{name!r} is a {type(obj).__name__}, not a dataset; set dataset: to one")


def _open(path: str, so: dict) -> Any:
    """The file opened for reading, its signature checked first."""
    fh = fsspec.open(path, "rb", **so).open()
    head = fh.read(8)
    if head != _SIGNATURE:
        fh.close()
        raise FormatMismatchError(path, f"expected an HDF5 file, found bytes {head!r}")
    fh.seek(0)
    return fh


def default_dataset(path: str, so: dict) -> str:
    """The one dataset of a file (groups searched too), read when ``dataset`` is not given.

    Raises
    ------
    LoaderError
        For a file that is not HDF5, cannot be read, or holds no dataset or several.
    """
    h5py = _h5py()
    try:
        with _open(path, so) as fh, h5py.File(fh, "r") as f:
            return _only_dataset(path, f)
    except OSError as exc:
        raise LoaderError(path, f"cannot read HDF5 ({exc})") from None


def shared_dataset(paths: Sequence[str], so: dict, *, skip: bool = False) -> tuple[str | None, str | None]:
    """The dataset every file is read at when ``dataset`` is not given, and the file it
    comes from: the first file's one dataset (with ``skip``, the first readable file's;
    ``(None, None)`` when none is).

    Raises
    ------
    LoaderError
        Without ``skip``, from :func:`default_dataset` for the first file.
    """
    for path in paths:
        try:
            return default_dataset(path, so), path
        except LoaderError:
            if not skip:
                raise
    return None, None


def probe_hdf5(path: str, so: dict, *, dataset: str | None = None,
               dataset_from: str | None = None) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of the dataset, without reading it.

    Parameters
    ----------
    path, so
        The file and its fsspec options.
    dataset
        The dataset path; default the file's one dataset.
    dataset_from
        The file ``dataset`` was chosen in (it was not given), named when this one lacks it.
    """
    h5py = _h5py()
    try:
        with _open(path, so) as fh, h5py.File(fh, "r") as f:
            ds = _dataset(path, f, dataset if dataset is not None else _only_dataset(path, f), dataset_from)
            return tuple(int(s) for s in ds.shape), np.dtype(ds.dtype)
    except OSError as exc:
        raise LoaderError(path, f"cannot read HDF5 ({exc})") from None


def read_hdf5(path: str, so: dict, *, dataset: str | None = None, dataset_from: str | None = None,
              rows: slice | None = None) -> np.ndarray:
    """The dataset, or a block of its rows (``dataset_from``: see :func:`probe_hdf5`)."""
    h5py = _h5py()
    try:
        with fsspec.open(path, "rb", **so) as fh, h5py.File(fh, "r") as f:
            ds = _dataset(path, f, dataset if dataset is not None else _only_dataset(path, f), dataset_from)
            return ds[rows] if rows is not None else ds[()]
    except OSError as exc:
        raise LoaderError(path, f"cannot read HDF5 data ({exc})") from None
