"""Formats by name and by suffix: what probes a file's header and what reads its data."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Callable

from pipeline.errors import FormatMismatchError

__all__ = ["DATASET_FORMATS", "FORMATS", "NAMED", "SUFFIXES", "TABLES", "TEXT_COMPRESSIONS", "ArrayFormat",
           "compression_of", "dataset_format", "directory_glob", "format_of", "own_name"]

#: Suffix -> format name. ``format:`` in the config overrides it.
SUFFIXES = {
    ".npy": "npy",
    ".npz": "npz",
    ".jpg": "image",
    ".jpeg": "image",
    ".png": "image",
    ".tif": "image",
    ".tiff": "image",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".h5": "hdf5",
    ".hdf5": "hdf5",
}

#: Formats chosen by name only (``format: lobster``, ``format: fi2010``): their files
#: share a suffix with others (``.csv``, ``.txt``).
NAMED = ("lobster", "fi2010")

#: Compression suffixes of text files (fsspec's codec names; zstd is decompressed by
#: pyarrow): a ``day.csv.gz`` is CSV, read through a decompressing stream. Real
#: order-book data is often shipped so.
TEXT_COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd"}
#: Formats whose files may be compressed that way.
TEXT_FORMATS = ("csv", "lobster")


def own_name(path: str) -> str:
    """The name that says a file's format: ``path`` itself, or of a chained fsspec URL
    (``zip://day.csv::/data/day.zip``) the path of its first link with one
    (``day.csv``, the file read), not of the archive or cache it is read through."""
    if "::" not in path:
        return path
    links = path.split("::")
    return next((link for link in links if "://" in link), links[-1])


def compression_of(path: str) -> str | None:
    """The codec a text file is compressed with, from its last suffix (None: plain)."""
    return TEXT_COMPRESSIONS.get(os.path.splitext(own_name(path))[1].lower())


TABLES = ("csv", "parquet", "lobster", "fi2010")


@dataclass(frozen=True, slots=True)
class ArrayFormat:
    """An array-per-file format: a header probe and a reader (both take ``(path, so, **opts)``).

    ``probe`` returns ``(shape, dtype, *layout)``: HDF5 adds its dataset's chunk rows,
    which default row blocks follow (``row_align`` of :func:`~pipeline.loaders.blocks.concat_array`).
    """

    name: str
    probe: Callable
    read: Callable
    options: tuple[str, ...]  # which loader options the format takes


def _formats() -> dict[str, ArrayFormat]:
    from pipeline.loaders import hdf5, images, npy, npz

    return {
        "npy": ArrayFormat("npy", npy.probe_npy, npy.read_npy, ()),
        "npz": ArrayFormat("npz", npz.probe_npz, npz.read_npz, ("key", "key_from")),
        "image": ArrayFormat("image", images.probe_image, images.read_image, ("shape", "mode")),
        "hdf5": ArrayFormat("hdf5", functools.partial(hdf5.probe_hdf5, layout=True), hdf5.read_hdf5,
                            ("dataset", "dataset_from", "swmr")),
    }


class _Lazy(dict):
    def __missing__(self, key: str) -> ArrayFormat:
        self.update(_formats())
        if key not in self:
            raise KeyError(key)
        return self[key]


FORMATS: dict[str, ArrayFormat] = _Lazy()


def _is_local_dir(path: str) -> bool:
    return ("://" not in path or path.startswith("file://")) and os.path.isdir(path.removeprefix("file://"))


def _listdir(path: str) -> list[str]:
    """A local directory's entries, and those of its subdirectories as ``sub/name``
    (class folders, perhaps beside a ``labels.csv``), at most :data:`_SCANNED` of them."""
    root = path.removeprefix("file://")
    try:
        names = os.listdir(root)
    except OSError:
        return []
    out: list[str] = list(names)
    for sub in sorted(n for n in names if os.path.isdir(os.path.join(root, n)))[:_SCANNED]:
        try:
            out += [f"{sub}/{n}" for n in os.listdir(os.path.join(root, sub))]
        except OSError:
            continue
    return out


#: Subdirectories looked into for a glob to suggest for a directory.
_SCANNED = 32


def directory_glob(path: str, names: list[str]) -> str:
    """A glob of a directory's files to suggest for ``path``, from ``names`` (its
    entries, and ``sub/name`` for files in its subdirectories): ``path/*.png`` (or
    ``path/*/*.png``) for the most common known suffix, images before other formats (a
    manifest such as ``labels.csv`` beside class folders of images names no files to
    read; ties go to the first in sorted order), else ``path/**/*``."""
    counts: dict[tuple[str, bool], int] = {}
    for name in names:
        suffix = os.path.splitext(name)[1].lower()
        if suffix in SUFFIXES:
            key = (suffix, "/" in name)
            counts[key] = counts.get(key, 0) + 1
    base = path.rstrip("/" + os.sep) or path
    if not counts:
        return f"{base}/**/*"
    suffix, nested = min(counts, key=lambda k: (SUFFIXES[k[0]] != "image", -counts[k], k))
    return f"{base}/*/*{suffix}" if nested else f"{base}/*{suffix}"


#: Table formats whose data sets are written as a directory of files named like one
#: file (pandas, Spark, Dask: ``book_train.parquet/stock_id=0/part.0.parquet``).
DATASET_FORMATS = ("csv", "parquet")


def dataset_format(path: str) -> str | None:
    """The table format of a local data set directory (one named with a CSV or Parquet
    suffix, :data:`DATASET_FORMATS`), else None (a file, a URL, another directory)."""
    fmt = SUFFIXES.get(os.path.splitext(path.rstrip("/" + os.sep))[1].lower())
    return fmt if fmt in DATASET_FORMATS and _is_local_dir(path) else None


def format_of(path: str, fmt: str | None) -> str:
    """The format of ``path``: ``fmt`` if given, else from its suffix (of a chained
    URL, its member's: :func:`own_name`).

    Raises
    ------
    FormatMismatchError
        For an unknown ``fmt`` or suffix, a compression suffix on a format that is not
        text, a ``.zip`` that path expansion did not open, or a directory (before its
        suffix is looked at: ``data.parquet/`` is a directory, not a Parquet file),
        with a glob of its files.
    """
    if _is_local_dir(path):
        # Before the suffix: a directory named like a file would be opened as one.
        raise FormatMismatchError(path, f"is a directory, not a file; give a glob of its files, such as "
                                  f"{directory_glob(path, _listdir(path))!r}")
    if fmt:
        known = set(SUFFIXES.values()) | set(NAMED)
        if fmt not in known:
            raise FormatMismatchError(path, f"unknown format {fmt!r}; expected one of {sorted(known)}")
        return fmt
    inner, suffix = os.path.splitext(own_name(path))
    suffix = suffix.lower()
    if suffix in TEXT_COMPRESSIONS:
        inner_suffix = os.path.splitext(inner)[1].lower()
        if SUFFIXES.get(inner_suffix) not in TEXT_FORMATS:
            raise FormatMismatchError(
                path, f"a {suffix} file is read as compressed text (CSV: .csv{suffix}); {inner_suffix or 'no suffix'} "
                "inside it is not, so decompress it first or set format:")
        return SUFFIXES[inner_suffix]
    if suffix == ".zip":
        # Path expansion opens a local .zip holding one file; a remote one is not listed.
        raise FormatMismatchError(path, "a .zip is read as the one file it holds when it is a local file; name the "
                                  "file inside with a chained URL, such as 'zip://NAME.csv::s3://bucket/day.zip'")
    if suffix in ARROW_IPC_SUFFIXES:
        raise FormatMismatchError(path, arrow_ipc_advice(suffix))
    if suffix not in SUFFIXES:
        raise FormatMismatchError(
            path, f"unknown suffix {suffix or '(none)'!r}; expected one of {', '.join(sorted(SUFFIXES))} (CSV also "
            f"compressed: {', '.join('.csv' + s for s in TEXT_COMPRESSIONS)}), or set format: to one of "
            f"{', '.join(sorted(set(SUFFIXES.values()) | set(NAMED)))}")
    return SUFFIXES[suffix]


#: Suffixes of Arrow IPC files (Feather version 2), which no loader reads.
ARROW_IPC_SUFFIXES = (".feather", ".arrow", ".ipc")
#: The first bytes of an Arrow IPC file.
ARROW_IPC_MAGIC = b"ARROW1"


def arrow_ipc_advice(what: str) -> str:
    """Why an Arrow IPC file (``what``: its suffix, or how it was told) is refused, and
    the one-time conversion to Parquet, which reads the same columns and types."""
    return (f"is an Arrow IPC (Feather) file ({what}), which is not read; convert it to Parquet once: "
            "pyarrow.parquet.write_table(pyarrow.feather.read_table(path), path_without_suffix + '.parquet')")
