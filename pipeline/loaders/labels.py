"""Class labels for stacked samples: from the parent folder's name, or from a manifest.

A manifest is a CSV or Parquet table with a ``path`` column (relative to the manifest's
folder, or absolute, or a URL) and a ``label`` column; other columns are ignored. Its
rows give the samples and their order, so filtered or reordered subsets need no folder
structure. Class names are sorted, and their index is the label.
"""

from __future__ import annotations

import os
import posixpath
from typing import Sequence

import numpy as np

from pipeline.errors import LoaderError, MissingColumnError, MissingDependencyError

__all__ = ["folder_labels", "in_manifest", "read_manifest"]


def _classes(values: Sequence[str]) -> tuple[tuple[str, ...], np.ndarray]:
    classes = tuple(sorted(set(values)))
    index = {c: i for i, c in enumerate(classes)}
    return classes, np.array([index[v] for v in values], dtype=np.int64)


def folder_labels(paths: Sequence[str]) -> tuple[tuple[str, ...], np.ndarray]:
    """Classes (sorted folder names) and each file's label index."""
    names = [posixpath.basename(posixpath.dirname(p.replace(os.sep, "/"))) for p in paths]
    return _classes(names)


def _resolve(manifest: str, paths: Sequence[str]) -> list[str]:
    """A manifest's paths, relative ones taken from its folder. A local manifest's come
    back absolute (``~`` expanded), as :func:`pipeline.loaders.expand_paths` makes them:
    dask workers (a remote cluster's) have another working directory. URLs stay as they
    are, and a relative path in a remote manifest is joined to the manifest's URL."""
    if "://" in manifest and not manifest.startswith("file://"):
        base = posixpath.dirname(manifest)
        return [p if ("://" in p or posixpath.isabs(p)) else posixpath.join(base, p) for p in paths]
    local = manifest.removeprefix("file://")
    base = os.path.dirname(os.path.abspath(os.path.expanduser(local)))
    return [p if "://" in p else os.path.abspath(os.path.join(base, os.path.expanduser(p))) for p in paths]


def _place(manifest: str, row: int) -> str:
    """Where entry ``row`` (from 0) of a manifest is, as its reader would look for it: a
    CSV's line (its header is line 1), a Parquet file's row counted from 1."""
    if manifest.endswith((".parquet", ".pq")):
        return f"row {row + 1} (counted from 1)"
    return f"line {row + 2} (the header is line 1)"


def in_manifest(exc: LoaderError, manifest: str, paths: Sequence[str]) -> LoaderError:
    """``exc`` (a listed file's error) of the same class, also naming the manifest and the
    line (CSV) or row (Parquet) that lists the file; ``exc`` itself for another file."""
    if exc.path not in paths:
        return exc
    place = _place(manifest, list(paths).index(exc.path))
    return type(exc)(exc.path, f"{exc.problem}; listed on {place} of the manifest {manifest}")


def read_manifest(manifest: str, storage_options: dict | None = None) -> tuple[list[str], tuple[str, ...] | None, np.ndarray]:
    """Paths, classes (None for integer labels) and labels from a manifest.

    Paths are resolved by :func:`_resolve`: a local manifest's come back absolute, even
    when the manifest is given by a relative path.

    Raises
    ------
    LoaderError
        For a manifest that cannot be read, or a row without a path or a label.
    MissingColumnError
        For a manifest without a ``path`` or ``label`` column.
    """
    try:
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover
        raise MissingDependencyError("Manifest labels", "pyarrow", "tabular") from None
    import fsspec

    try:
        with fsspec.open(manifest, "rb", **(storage_options or {})) as fh:
            table = pq.read_table(fh) if manifest.endswith((".parquet", ".pq")) else pacsv.read_csv(fh)
    except FileNotFoundError:
        raise LoaderError(manifest, "no such manifest") from None
    except Exception as exc:  # noqa: BLE001 - pyarrow's parse errors
        raise LoaderError(manifest, f"cannot read the manifest ({exc})") from None
    for col in ("path", "label"):
        if col not in table.column_names:
            raise MissingColumnError(manifest, f"missing column {col!r}; the manifest has {table.column_names}")
    listed = table.column("path").to_pylist()
    if not all(isinstance(p, str) and p for p in listed):
        row = next(i for i, p in enumerate(listed) if not (isinstance(p, str) and p))
        raise LoaderError(manifest, f"{_place(manifest, row)} has no path (found {listed[row]!r}); expected a file "
                          "path or URL")
    paths = _resolve(manifest, listed)
    raw = table.column("label").to_pylist()
    if any(v is None for v in raw):
        row = raw.index(None)
        raise LoaderError(manifest, f"{_place(manifest, row)} ({paths[row]}) has no label")
    if all(isinstance(v, int) for v in raw):
        return paths, None, np.asarray(raw, dtype=np.int64)
    classes, labels = _classes([str(v) for v in raw])
    return paths, classes, labels
