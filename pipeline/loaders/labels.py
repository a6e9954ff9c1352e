"""Class labels for stacked samples: from the parent folder's name, or from a manifest.

A manifest is a CSV or Parquet table with a ``path`` column (relative to the manifest's
folder, or absolute, or a URL) and a ``label`` column; other columns are ignored. Its
rows give the samples and their order, so filtered or reordered subsets need no folder
structure. Text labels are class names: sorted (or in the order ``classes=`` pins), and
their index is the label. Numeric labels are kept as numbers: integers, and floats that
are all whole numbers (``1.0``, ``2.0``, as tools export integer classes), as int64,
other floats (regression targets) as float64.

Folder labels are the class folder of each file: the first folder below a directory
read as torchvision's ``ImageFolder`` reads one (``cat/indoor/2.png`` is ``cat``), else
the file's parent folder. Classes come from the files listed, before any is skipped, so
a file that does not decode never shifts another class's index.
"""

from __future__ import annotations

import math
import os
import posixpath
from typing import Any, Sequence

import numpy as np

from pipeline.errors import ConfigError, LoaderError, MissingColumnError, MissingDependencyError

__all__ = ["check_classes", "folder_labels", "in_manifest", "read_manifest"]


def check_classes(classes: Sequence[str] | None, labels: str | None) -> tuple[str, ...] | None:
    """``classes=`` as a tuple, refused (before any file is read) when it is not a list
    of distinct names, or is given without text labels to name.

    Raises
    ------
    ConfigError
        Naming the option and what it needs.
    """
    if classes is None:
        return None
    if isinstance(classes, str) or not all(isinstance(c, str) and c for c in classes):
        raise ConfigError("classes", "a list of class names (strings), such as ['cat', 'dog']", classes)
    pinned = tuple(classes)
    if not pinned or len(set(pinned)) != len(pinned):
        raise ConfigError("classes", "a non-empty list of distinct class names", classes)
    if labels is None:
        raise ConfigError("classes", "labels='folder' or a manifest of text labels to name", classes,
                          detail="classes= pins the index of each class, but no labels= was given")
    return pinned


def _classes(values: Sequence[str], pinned: tuple[str, ...] | None = None, paths: Sequence[str] = (),
             what: str = "label") -> tuple[tuple[str, ...], np.ndarray]:
    """Classes (sorted, or ``pinned``) and each value's index.

    Raises
    ------
    LoaderError
        For a value ``pinned`` does not list, naming its file.
    """
    classes = pinned if pinned is not None else tuple(sorted(set(values)))
    index = {c: i for i, c in enumerate(classes)}
    unknown = next((i for i, v in enumerate(values) if v not in index), None)
    if unknown is not None:
        where = paths[unknown] if paths else "classes"
        raise LoaderError(where, f"has {what} {values[unknown]!r}, which classes={list(classes)} does not list; "
                          "add it to classes=, or leave such files out")
    return classes, np.array([index[v] for v in values], dtype=np.int64)


def _norm(path: str) -> str:
    return path.replace(os.sep, "/").rstrip("/")


def _class_folder(path: str, roots: Sequence[str]) -> str:
    """The class of ``path``: the first folder below the deepest of ``roots`` holding it,
    else its parent folder's name.

    Raises
    ------
    LoaderError
        For a file directly in a root, which has no class folder.
    """
    p = _norm(path)
    for root in sorted(roots, key=len, reverse=True):
        if p.startswith(root + "/"):
            rel = p[len(root) + 1:]
            if "/" not in rel:
                raise LoaderError(path, f"is directly in {root}, not in a class folder below it: labels='folder' "
                                  "takes each image's class from the first folder below the directory read (as "
                                  "torchvision's ImageFolder, which leaves such files out); move it into its "
                                  "class folder, or name the files with a glob")
            return rel.split("/", 1)[0]
    return posixpath.basename(posixpath.dirname(p))


def folder_labels(paths: Sequence[str], roots: Sequence[str] = (),
                  classes: tuple[str, ...] | None = None) -> tuple[tuple[str, ...], np.ndarray]:
    """Classes (sorted folder names, or ``classes``) and each file's label index.

    Parameters
    ----------
    paths
        Every file listed, before any is skipped: the classes do not depend on which
        files decode.
    roots
        Directories read whole (``format="image"``): a file below one is labelled by the
        first folder under it (``root/cat/indoor/2.png`` is ``cat``), as ``ImageFolder``.
    classes
        Class names in index order; a folder it does not list is refused.
    """
    names = [_class_folder(p, [_norm(r) for r in roots]) for p in paths]
    return _classes(names, classes, paths, "class folder")


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


def _numbers(manifest: str, paths: Sequence[str], raw: list[Any]) -> np.ndarray:
    """Numeric labels as numbers: int64 when every one is a whole number (``2.0`` as
    ``2``), else float64.

    Raises
    ------
    LoaderError
        For a label that is NaN or infinite, naming its line.
    """
    bad = next((i for i, v in enumerate(raw) if isinstance(v, float) and not math.isfinite(v)), None)
    if bad is not None:
        raise LoaderError(manifest, f"{_place(manifest, bad)} ({paths[bad]}) has label {raw[bad]}; expected a "
                          "finite number")
    values = np.asarray(raw, dtype=np.float64)
    # Whole numbers as int64 only where float64 holds them exactly (below 2**53).
    if all(isinstance(v, int) for v in raw) or (np.all(values == np.round(values)) and np.all(abs(values) < 2.0**53)):
        return np.asarray([int(v) for v in raw], dtype=np.int64)
    return values


def read_manifest(manifest: str, storage_options: dict | None = None, classes: tuple[str, ...] | None = None
                  ) -> tuple[list[str], tuple[str, ...] | None, np.ndarray]:
    """Paths, classes (None for numeric labels) and labels from a manifest: numbers
    (:func:`_numbers`), or text labels as indices into the sorted class names (or into
    ``classes``, which must list every one).

    Paths are resolved by :func:`_resolve`: a local manifest's come back absolute, even
    when the manifest is given by a relative path.

    Raises
    ------
    LoaderError
        For a manifest that cannot be read, a row without a path or a label, a label
        ``classes`` does not list, or ``classes`` beside numeric labels.
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
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):
        if classes is not None:
            raise LoaderError(manifest, f"its labels are numbers, which classes={list(classes)} cannot name; "
                              "classes= pins text labels (class names) to indices")
        return paths, None, _numbers(manifest, paths, raw)
    names = [str(v) for v in raw]
    unknown = next((i for i, v in enumerate(names) if v not in classes), None) if classes is not None else None
    if unknown is not None:
        raise LoaderError(manifest, f"{_place(manifest, unknown)} ({paths[unknown]}) has label {names[unknown]!r}, "
                          f"which classes={list(classes)} does not list; add it to classes=")
    classes, labels = _classes(names, classes)
    return paths, classes, labels
