"""Loaders: raw files -> one lazy dask array, probing headers only.

Formats are chosen by suffix or ``format=``. Building the array reads only metadata
(Parquet footers, npy headers), in parallel threads, and makes one blockwise graph
layer over the file list, whatever the number of files.
"""

from __future__ import annotations

import glob
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

import dask.array as da
import fsspec
import numpy as np

from pipeline.errors import EmptyInputError, FormatMismatchError, LoaderError, ShapeMismatchError

__all__ = ["FileInfo", "Source", "expand_paths", "load", "open_source"]

SUFFIXES = {
    ".npy": "npy",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One input file as found when the array was built."""

    path: str
    size: int
    mtime: float
    rows: int | None = None
    shape: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Source:
    """A lazy array and what it was built from."""

    array: da.Array
    columns: tuple[str, ...] | None
    files: tuple[FileInfo, ...]
    timestamps: da.Array | None = None
    labels: da.Array | None = None
    classes: tuple[str, ...] | None = None
    skipped: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def metadata(self) -> dict[str, Any]:
        """JSON-able provenance: files with sizes and modification times, columns, skips."""
        return {
            "files": [{"path": f.path, "size": f.size, "mtime": f.mtime, "rows": f.rows,
                       "shape": list(f.shape) if f.shape else None} for f in self.files],
            "columns": list(self.columns) if self.columns else None,
            "classes": list(self.classes) if self.classes else None,
            "skipped": [list(s) for s in self.skipped],
            "shape": list(self.array.shape),
            "dtype": str(self.array.dtype),
        }


def expand_paths(paths: str | os.PathLike[str] | Sequence[str], storage_options: dict | None = None) -> list[str]:
    """Files matched by globs or URLs, deduplicated, in sorted (deterministic) order."""
    items = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
    out: list[str] = []
    for item in items:
        if "://" in item and not item.startswith("file://"):
            fs, _, matched = fsspec.get_fs_token_paths(item, storage_options=storage_options or {})
            proto = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
            out += [f"{proto}://{m}" for m in sorted(matched)]
        elif any(ch in item for ch in "*?["):
            out += sorted(p for p in glob.glob(item, recursive=True) if os.path.isfile(p))
        else:
            out.append(item)
    seen: set[str] = set()
    unique = [p for p in out if not (p in seen or seen.add(p))]
    if not unique:
        raise EmptyInputError(", ".join(items), "matched no file")
    return unique


def _format_of(path: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in SUFFIXES:
        raise FormatMismatchError(path, f"unknown suffix {suffix!r}; expected one of {sorted(SUFFIXES)} or set format:")
    return SUFFIXES[suffix]


def _stat(path: str, so: dict) -> tuple[int, float]:
    try:
        fs, p = fsspec.core.url_to_fs(path, **so)
        info = fs.info(p)
    except FileNotFoundError:
        raise LoaderError(path, "no such file") from None
    except OSError as exc:
        raise LoaderError(path, f"cannot read ({exc})") from None
    mtime = info.get("mtime") or info.get("LastModified") or 0
    mtime = mtime.timestamp() if hasattr(mtime, "timestamp") else float(mtime)
    return int(info.get("size") or 0), mtime


def open_source(
    paths: str | os.PathLike[str] | Sequence[str],
    *,
    format: str | None = None,
    combine: Literal["stack", "concat"] | None = None,
    columns: Sequence[str] | None = None,
    timestamp: str | None = None,
    dtype: str = "float32",
    nan: Literal["raise", "drop", "fill"] = "raise",
    fill_value: float = 0.0,
    on_error: Literal["raise", "skip"] = "raise",
    chunk_rows: int | None = None,
    storage_options: dict | None = None,
    **_: Any,
) -> Source:
    """Build a lazy array over files, reading headers only.

    Parameters
    ----------
    paths
        A glob (``**`` recursive), a list of paths, or fsspec URLs.
    format
        Force a format instead of the suffix.
    combine
        ``stack``: one sample per file; ``concat``: join along axis 0 (tables default).
    columns, timestamp
        Table columns to read (default every column but the timestamp) and the timestamp
        column used to check the files join in time order.
    nan, fill_value
        NaN/inf in tables: ``raise`` (naming file, column and row), ``fill``, or ``drop``.
    on_error
        ``skip`` leaves out files that fail their header probe and records why.
    chunk_rows
        Unused for Parquet (a chunk per row group) and CSV (a chunk per file).
    """
    from pipeline.loaders import npy, tables

    so = dict(storage_options or {})
    files = expand_paths(paths, so)
    fmts = {p: _format_of(p, format) for p in files}
    kinds = {("table" if f in ("csv", "parquet") else f) for f in fmts.values()}
    if len(kinds) > 1:
        raise FormatMismatchError(files[0], f"files of different kinds cannot be combined: {sorted(kinds)}")
    skipped: list[tuple[str, str]] = []

    def probe(path: str) -> Any:
        try:
            size, mtime = _stat(path, so)
            if fmts[path] in ("csv", "parquet"):
                return path, size, mtime, tables.probe_table(path, fmts[path], timestamp, so)
            return path, size, mtime, npy.probe_npy(path, so)
        except LoaderError as exc:
            if on_error == "skip":
                skipped.append((path, exc.problem))
                return None
            raise

    with ThreadPoolExecutor(max_workers=16) as pool:
        probed = [p for p in pool.map(probe, files) if p is not None]
    if not probed:
        raise EmptyInputError(str(paths), "no readable file left after skipping bad ones")
    kind = kinds.pop()
    if kind == "table":
        parts = [part for _, _, _, ps in probed for part in ps]
        cols = tables.check_columns(parts, columns, timestamp)
        tables.check_time_order(parts)
        arr = tables.table_array(parts, cols, timestamp, nan, fill_value, so)
        if nan == "drop":
            arr = arr.map_blocks(lambda b: b[np.isfinite(b).all(axis=1)], dtype=arr.dtype, chunks=((np.nan,) * arr.numblocks[0], arr.chunks[1]))
            arr = arr.compute_chunk_sizes()
        infos = tuple(FileInfo(p, s, m, rows=sum(x.rows for x in ps)) for p, s, m, ps in probed)
        return Source(array=arr.astype(dtype), columns=cols, files=infos, skipped=tuple(skipped))
    shapes = {p: (shape, dt) for p, _, _, (shape, dt) in probed}
    first_path = probed[0][0]
    ref = shapes[first_path]
    bad = [(p, s) for p, s in shapes.items() if s != ref]
    if bad:
        listing = "; ".join(f"{p}: shape {s[0]} {s[1]}" for p, s in bad[:5])
        raise ShapeMismatchError(first_path, f"has shape {ref[0]} {ref[1]}, but {len(bad)} file(s) differ: {listing}")
    arr = npy.npy_array([p for p, *_ in probed], ref[0], ref[1], combine or "stack", so)
    infos = tuple(FileInfo(p, s, m, shape=tuple(sh)) for p, s, m, (sh, _) in probed)
    return Source(array=arr.astype(dtype), columns=None, files=infos, skipped=tuple(skipped))


def load(paths: str | os.PathLike[str] | Sequence[str], *, format: str | None = None,
         combine: Literal["stack", "concat"] | None = None, **options: Any) -> da.Array:
    """A lazy dask array over raw files; nothing is read but headers.

    See :func:`open_source` for the options. The returned array carries the source's
    provenance as ``array.attrs``.
    """
    source = open_source(paths, format=format, combine=combine, **options)
    arr = source.array
    try:
        arr.attrs = source.metadata()
    except AttributeError:  # pragma: no cover - a dask version with slots-only arrays
        pass
    return arr
