"""Loaders: raw files -> one lazy dask array, probing headers only.

Formats are chosen by suffix or ``format=`` (``lobster`` and ``fi2010`` only by name). Building the
array reads only metadata (Parquet footers, npy headers, CSV newline counts), in
parallel threads, and makes one blockwise graph layer over the file list, whatever the
number of files. Tables may also give per-row timestamps and instrument codes, each a
layer of its own with the array's chunks.
"""

from __future__ import annotations

import glob
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import dask.array as da
import fsspec
import numpy as np

from pipeline.errors import ConfigError, EmptyInputError, FormatMismatchError, LoaderError, ShapeMismatchError
from pipeline.loaders.arrays import (FileRun, Values, check_fill_value, checked_casts, checked_dtype, common_dtype,
                                     file_runs, refuse_opaque)
from pipeline.loaders.conversions import ValueRules
from pipeline.loaders.registry import dataset_format

__all__ = ["FileInfo", "Source", "expand_paths", "load", "open_source"]

@dataclass(frozen=True, slots=True)
class FileInfo:
    """One input file as found when the array was built.

    ``companion`` is a second file read with this one (LOBSTER: the message file).
    """

    path: str
    size: int
    mtime: float
    rows: int | None = None
    shape: tuple[int, ...] | None = None
    companion: "FileInfo | None" = None

    def metadata(self) -> dict[str, Any]:
        """JSON-able provenance of the file (and of its companion, when it has one)."""
        out: dict[str, Any] = {"path": self.path, "size": self.size, "mtime": self.mtime, "rows": self.rows,
                               "shape": list(self.shape) if self.shape else None}
        if self.companion is not None:
            out["companion"] = self.companion.metadata()
        return out


@dataclass(frozen=True, slots=True)
class Source:
    """A lazy array and what it was built from.

    Attributes
    ----------
    array
        ``(T, F)`` for tables, ``(N, ...)`` for stacked files.
    columns
        Table column names (canonical, after ``rename``), or ``None``.
    files
        The files read, in array order.
    timestamps
        Tables with a timestamp column, and LOBSTER: ``(T,)`` int64 nanoseconds since
        the epoch, chunked like ``array`` (the same rows kept under ``nan="drop"``).
    labels, classes
        Class labels of stacked samples and their names.
    skipped
        ``(path, why)`` of the files left out by ``on_error="skip"``.
    instrument_codes, instruments
        With an instrument column (or LOBSTER's tickers): ``(T,)`` int32 codes chunked
        like ``array``, each an index into ``instruments``, the sorted distinct names.
    """

    array: da.Array
    columns: tuple[str, ...] | None
    files: tuple[FileInfo, ...]
    timestamps: da.Array | None = None
    labels: da.Array | None = None
    classes: tuple[str, ...] | None = None
    skipped: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    instrument_codes: da.Array | None = None
    instruments: tuple[str, ...] | None = None
    #: Tables: how many chunks of ``array`` each file makes (Parquet: its row groups),
    #: so that rows can be told apart by file even after ``nan="drop"``.
    file_chunks: tuple[int, ...] | None = None
    #: Tables: the distinct time zones of the timestamp column as the files' schemas
    #: store them (Parquet), sorted; empty for naive timestamps, or where no schema says
    #: (CSV, LOBSTER, numbers or text), which are read as UTC.
    time_zones: tuple[str, ...] = ()
    #: Tables: whether every file's first and last timestamps came from its metadata
    #: (Parquet footers), so that the files' time order was checked when the source was
    #: opened; otherwise :func:`pipeline.loaders.segments.open_segmented` checks it from
    #: the rows (CSV, LOBSTER), before anything is written. With an instrument column
    #: the footers are not compared (they bound every instrument of a file together):
    #: ``open_segmented`` checks the order of each instrument from the timestamp and
    #: instrument columns, one pass over them, before anything is written.
    times_from_metadata: bool = False
    #: Tables opened with a calendar: the rows left out as outside its sessions (rows
    #: left out otherwise, LOBSTER's halts or ``nan="drop"``, not counted).
    outside_calendar: int = 0
    #: Tables: the rows left out otherwise, with NaN or inf under ``nan="drop"`` or in
    #: LOBSTER's trading halts (``halts="drop"``); the array holds the rest.
    rows_dropped: int = 0

    @property
    def time_zone(self) -> str | None:
        """The time zone of the timestamps' calendar dates: the files' one zone, or
        ``None`` (naive timestamps keep their wall-clock date; UTC alike).

        Raises
        ------
        LoaderError
            For files whose timestamp columns store different time zones, naming them.
        """
        if len(self.time_zones) > 1:
            raise LoaderError(self.files[0].path, f"the files' timestamps are in several time zones "
                              f"({', '.join(self.time_zones)}): their calendar dates (sessions: date, date splits) "
                              "need one; store every file in one zone")
        return self.time_zones[0] if self.time_zones else None

    def metadata(self) -> dict[str, Any]:
        """JSON-able provenance: files with sizes and modification times, columns, skips."""
        out = {
            "files": [f.metadata() for f in self.files],
            "columns": list(self.columns) if self.columns else None,
            "classes": list(self.classes) if self.classes else None,
            "skipped": [list(s) for s in self.skipped],
            "shape": list(self.array.shape),
            "dtype": str(self.array.dtype),
        }
        if self.instruments is not None:
            out["instruments"] = list(self.instruments)
        return out


def expand_paths(paths: str | os.PathLike[str] | Sequence[str], storage_options: dict | None = None) -> list[str]:
    """Files matched by globs or URLs, in sorted (deterministic) order, each once.

    Local paths come back absolute: the files are read by dask workers, whose working
    directory (a remote cluster's) is not this process's. URLs (``s3://``, ``file://``)
    are kept as they are; a chained URL (``zip://*.csv::/data/day.zip``) keeps its
    chain, each file the URL of one member (:func:`_chained_files`). A local ``.zip``
    holding one file is that file (:func:`_zip_member`), as pandas reads it; a local
    directory named like a CSV or Parquet file (``book_train.parquet/``, as pandas and
    Spark write a data set) is its files (:func:`_dataset_files`).

    Raises
    ------
    EmptyInputError
        For paths that match no file, or a data set directory holding none.
    LoaderError
        For a file that ``paths`` reach twice (:func:`_refuse_repeats`): named twice
        (``a.npy`` and ``./a.npy``, or a symlink to it), matched by two globs, or by one
        glob through a symlink loop; for a chained URL whose archive cannot be opened,
        or a ``.zip`` that does not hold exactly one file.
    """
    items = [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]
    so = storage_options or {}
    found: list[tuple[str, str]] = []  # (file, the item of paths that reached it)
    for item in items:
        if "::" in item:
            found += [(f, item) for f in _chained_files(item, so)]
        elif "://" in item and not item.startswith("file://"):
            fs, _, matched = fsspec.get_fs_token_paths(item, storage_options=so)
            proto = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
            found += [(f"{proto}://{m}", item) for m in sorted(matched)]
        elif any(ch in item for ch in "*?["):
            pattern = os.path.expanduser(item)
            hits = [p for p in glob.glob(pattern, recursive=True) if os.path.isfile(p) or dataset_format(p)]
            matched = sorted(_absolute(p) for p in hits)
            _refuse_aliases(pattern, [p for p in matched if os.path.isfile(p)])
            # dict: "**/*.parquet" reaches a data set's files both inside it and alone.
            inner = dict.fromkeys(f for m in matched for f in _inner_files(m))
            found += [(f, item) for f in sorted(inner)]
        else:
            found += [(f, item) for f in _inner_files(_absolute(item))]
    if not found:
        raise EmptyInputError(", ".join(items) or "paths",
                              "matched no file" if items else "no path given (an empty list)")
    _refuse_repeats(found)
    return [f for f, _ in found]


def _inner_files(path: str) -> list[str]:
    """The files a local path stands for: a data set directory's files, a ``.zip``'s
    one member as a chained URL, else the path itself."""
    if dataset_format(path):
        return _dataset_files(path)
    if path.lower().endswith(".zip") and os.path.isfile(path.removeprefix("file://")):
        return [_zip_member(path)]
    return [path]


def _dataset_files(path: str) -> list[str]:
    """The files of a data set directory (``book_train.parquet/stock_id=0/0.parquet``),
    in path order, skipping names that start with ``_`` or ``.`` at any depth below it
    (``_SUCCESS``, ``_metadata``, ``.part-0.crc``), as pyarrow's datasets skip them.
    Partition folders (``stock_id=0``) stay in the paths, where ``source.instrument``'s
    ``{path: ...stock_id={instrument}/*.parquet}`` finds them. A file of another
    format, or of none, is refused by its suffix afterwards, not left out.

    Raises
    ------
    EmptyInputError
        For a data set directory with no file in it.
    """
    prefix = "file://" if path.startswith("file://") else ""
    root = path.removeprefix("file://")
    out = []
    for top, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        out += [os.path.join(top, n) for n in names if not n.startswith(("_", "."))]
    if not out:
        raise EmptyInputError(path, "is a data set directory (named like a file of its format) holding no data file "
                              "(names starting with _ or . are skipped, as pyarrow skips them)")
    return sorted(prefix + f for f in out)


def _zip_member(path: str) -> str:
    """A local ``.zip`` holding one file (a vendor's daily download, Binance's
    ``BTCUSDT-bookTicker-2024-01-01.zip``) as the chained URL of that file
    (``zip://NAME::/abs/day.zip``), read through fsspec's zip file system as pandas
    reads such a zip; macOS's ``__MACOSX/`` entries are not files of the data.

    Raises
    ------
    LoaderError
        For a file that is not a zip archive, or one holding no file or several,
        naming them and the chained URL that picks one.
    """
    import zipfile

    try:
        with zipfile.ZipFile(path.removeprefix("file://")) as archive:
            names = [i.filename for i in archive.infolist()
                     if not i.is_dir() and not i.filename.startswith("__MACOSX/")]
    except (OSError, zipfile.BadZipFile) as exc:
        raise LoaderError(path, f"expected a zip archive (its .zip suffix), could not read one ({exc})") from None
    if len(names) == 1:
        return f"zip://{names[0]}::{path}"
    if not names:
        raise LoaderError(path, "is a zip archive holding no file; a .zip is read as the one file it holds")
    listing = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    # LOBSTER's sample downloads are such archives, an orderbook and a message file each.
    member = "*_orderbook_*.csv" if any("_orderbook_" in n for n in names) else "*.csv"
    raise LoaderError(path, f"is a zip archive holding {len(names)} files ({listing}); a .zip is read as the one "
                      f"file it holds: name the files with a chained URL, such as 'zip://{member}::{path}'"
                      + (" (format: lobster finds each message file beside its orderbook file)"
                         if member != "*.csv" else ""))


def _chained_files(item: str, so: dict) -> list[str]:
    """The files of a chained fsspec URL, each as a chained URL that reads it.

    ``zip://*.csv::/data/day.zip`` globs the archive's members, ``simplecache::s3://b/*.csv``
    the bucket's files; fsspec lists them as bare paths of the first link that has one,
    so the rest of the chain is put back around each (without it, ``zip://day.csv``
    opened the working directory as the archive). A local target (the last link) is
    made absolute, for workers in another directory, and may be a glob
    (``zip://*.csv::data/*.zip``: every archive's members, archives in path order).

    Raises
    ------
    LoaderError
        For a target that cannot be opened as the chain's archive (missing, a
        directory, not an archive), naming it and the URL.
    """
    import tarfile
    import zipfile

    links = item.split("::")
    k = next((i for i, link in enumerate(links) if "://" in link), len(links) - 1)
    last = links[-1]
    targets = [last]
    if k < len(links) - 1 and ("://" not in last or last.startswith("file://")):
        local = os.path.expanduser(last.removeprefix("file://"))
        if any(ch in local for ch in "*?["):
            targets = sorted(_absolute(p) for p in glob.glob(local, recursive=True) if os.path.isfile(p))
        else:
            targets = [_absolute(local)]
    proto = links[k].split("://", 1)[0]
    out: list[str] = []
    for target in targets:
        url = "::".join([*links[:-1], target])
        try:
            _, _, matched = fsspec.get_fs_token_paths(url, storage_options=so)
        except (OSError, ValueError, zipfile.BadZipFile, tarfile.TarError) as exc:  # as the archive's module raises
            why = ("no such file" if isinstance(exc, FileNotFoundError) else "is a directory, not an archive"
                   if isinstance(exc, IsADirectoryError) else f"{type(exc).__name__}: {exc}")
            raise LoaderError(target, f"cannot be opened for the chained URL {item!r} ({why}); its last link names "
                              "the archive (zip://NAME.csv::/data/day.zip)") from None
        for m in sorted(matched):
            chain = [*links[:-1], target]
            chain[k] = f"{proto}://{m}"
            out.append("::".join(chain))
    return out


def _refuse_repeats(found: Sequence[tuple[str, str]]) -> None:
    """Refuse a file that two items of ``paths`` reach (``found``: each file with its
    item): kept once, the data would silently hold fewer samples or rows than the paths
    listed; kept twice, one recording would be joined to itself. A file named by a
    symlink counts as the file it links to; a directory reached through a link is not
    resolved (that costs a system call per path component of every file).

    Raises
    ------
    LoaderError
        Naming the file and both items that reach it.
    """
    seen: dict[str, str] = {}
    for path, item in found:
        key = os.path.realpath(path) if "://" not in path and os.path.islink(path) else path
        if key in seen:
            first = seen[key]
            how = f" (as {first!r} and {item!r})" if first != item else ""
            raise LoaderError(path, f"is listed twice in paths{how}: list each file once (to weight a file's "
                              "samples, repeat or weight them after loading)")
        seen[key] = item


def _absolute(path: str) -> str:
    """A local path made absolute in this process's working directory, ``~`` expanded; a
    ``file://`` URL as it is."""
    return path if path.startswith("file://") else os.path.abspath(os.path.expanduser(path))


def _refuse_aliases(pattern: str, matched: list[str]) -> None:
    """A recursive glob through a symlink loop (or duplicate links) matches one file
    under many names: the data would silently hold it many times. Name it instead."""
    seen: dict[str, str] = {}
    for p in matched:
        real = os.path.realpath(p)
        if real in seen:
            first, second = sorted((seen[real], p), key=len)
            raise LoaderError(
                second,
                f"is the same file as {first} (the glob {pattern!r} reaches it twice, through a "
                "symlink loop or duplicate links); narrow the glob or remove the link",
            )
        seen[real] = p


def _stat(path: str, so: dict) -> tuple[int, float]:
    """A file's size and modification time (of a chained URL's member: its size, and
    the time of the local archive it is read from, :func:`_local_target`)."""
    try:
        if "://" not in path or path.startswith("file://"):
            st = os.stat(path.removeprefix("file://"))  # no fsspec round trip for local files
            return int(st.st_size), float(st.st_mtime)
        fs, p = fsspec.core.url_to_fs(path, **so)
        info = fs.info(p)
    except FileNotFoundError:
        raise LoaderError(path, "no such file") from None
    except OSError as exc:
        raise LoaderError(path, f"cannot read ({exc})") from None
    mtime = info.get("mtime") or info.get("LastModified") or 0
    mtime = mtime.timestamp() if hasattr(mtime, "timestamp") else float(mtime)
    archive = _local_target(path)
    if archive is not None:
        # A zip member has no mtime, only a 2-second date a rewritten archive may keep
        # (vendors stamp their own): the archive's own time moves when it is replaced.
        mtime = os.stat(archive).st_mtime
    return int(info.get("size") or 0), mtime


def _local_target(path: str) -> str | None:
    """The local file a chained URL reads through (its last link), or None."""
    if "::" not in path:
        return None
    last = path.rsplit("::", 1)[1]
    return last.removeprefix("file://") if "://" not in last or last.startswith("file://") else None


def open_source(
    paths: str | os.PathLike[str] | Sequence[str] | None = None, *, format: str | None = None,
    combine: Literal["stack", "concat"] | None = None, columns: Sequence[str] | None = None,
    read: Sequence[str] | None = None, timestamp: str | None = None,
    timestamp_unit: Literal["s", "ms", "us", "ns"] | None = None, dtype: str | None = None,
    shape: Sequence[int] | None = None, mode: str | None = None, dataset: str | None = None, key: str | None = None,
    labels: str | None = None, classes: Sequence[str] | None = None,
    on_mismatch: Literal["raise", "pad", "crop", "resize"] = "raise",
    nan: Literal["raise", "drop", "fill"] | None = None, fill_value: float = 0.0,
    on_error: Literal["raise", "skip"] = "raise", chunk_rows: int | None = None, files_per_chunk: int | None = None,
    storage_options: dict | None = None, header: bool | Literal["auto"] = True, names: Sequence[str] | None = None,
    rename: Mapping[str, str] | None = None, instrument_column: str | None = None,
    scale: Mapping[str, float] | None = None, missing: Any = None, date: Any = None, delimiter: str = ",",
    decimal: str = ".", halts: Literal["drop", "keep"] | None = None, swmr: bool = False, calendar: str | None = None,
) -> Source:
    """Build a lazy array over files, reading headers only; an option that does not apply
    to the files is refused, naming it.

    Parameters
    ----------
    paths
        A glob (``**`` recursive), paths or fsspec URLs (a file reached twice is refused).
    format
        A format instead of the suffix's (``lobster`` and ``fi2010`` by name only).
    combine
        ``stack``: a sample per file (arrays' default); ``concat``: along axis 0 (tables, shards).
    columns
        Table columns to read (default every numeric one but timestamp and instrument).
    read
        Tables: of ``columns`` (each still checked in every file), decode only these.
    timestamp
        The timestamp column (files must join in time order): ``Source.timestamps``.
    timestamp_unit
        The unit of a numeric timestamp column; default integers ns, floats s.
    dtype
        Tables: ``float32`` (default) or ``float64`` (exact). Arrays: default the files'
        common dtype; another is checked value by value.
    shape
        Images: resize to ``shape`` (``(H, W)``).
    mode
        Images: convert to ``mode`` (:data:`~pipeline.loaders.images.MODES`).
    dataset
        The HDF5 dataset path read from each file.
    swmr
        HDF5: SWMR read mode, to read a file an SWMR writer appends to (else refused).
    key
        The ``.npz`` member read from each file (default: the first file's only one).
    labels
        ``"folder"`` (the parent folder, as ``ImageFolder``) or a manifest file.
    classes
        Class names in index order (as Keras' ``class_names``); default the sorted names.
    on_mismatch
        Stacked files of other shapes: ``raise``; ``pad`` (zeros up to the largest length
        along each axis), ``crop`` (cut to the first file's shape, zeros where shorter),
        ``resize`` (to the first's; nearest neighbour). Shards along axis 0: ``combine="concat"``.
    nan
        ``raise``, ``fill`` or ``drop`` (tables only); ``None``: ``raise`` for tables, arrays as stored.
    fill_value
        The value ``nan="fill"`` writes.
    on_error
        ``"skip"``: files whose probe fails are left out (recorded).
    chunk_rows
        Tables: rows per part; arrays joined along axis 0: rows per chunk (about 32 MiB).
    files_per_chunk
        Samples per chunk when stacking (default about 16 MiB).
    storage_options
        fsspec options for URLs.
    header
        CSV: the first line holds names; ``False``: all lines data; ``"auto"``: per file.
    names
        CSV column names; with a header, they replace its names.
    rename
        ``{canonical: source_name}`` (CSV, Parquet).
    instrument_column
        A column naming each row's instrument (``Source.instrument_codes``).
    scale
        CSV, Parquet: ``{column or glob: factor}`` for fixed-point integers.
    missing
        CSV, Parquet: values that mean "no value", read as NaN.
    date
        CSV, Parquet: times of day dated by the file's path (a ``DateSpec``).
    delimiter
        CSV: the field delimiter, one character.
    decimal
        CSV: the decimal mark, ``.`` or ``,``.
    halts
        LOBSTER: ``drop`` (default) or ``keep`` trading-halt rows (event type 7).
    calendar
        Tables with timestamps: an exchange calendar (``XNYS``); rows outside its
        sessions are left out.

    Returns
    -------
    Source
        The lazy array, its provenance, per-row timestamps, instrument codes or labels.
    """
    from pipeline.loaders.lobster import halts_option
    from pipeline.loaders.registry import FORMATS

    given = _given(locals())
    rules, date, pinned = _checked_options(scale, missing, date, mode, classes, labels)
    halts = halts_option(halts, format)
    out_dtype = checked_dtype(dtype)
    so = dict(storage_options or {})
    files, classes, label_values, fmts, kind = _listed_files(paths, labels, format, so, pinned)
    _check_table_options(kind, str(paths), rules, date, timestamp, (delimiter, decimal))
    _check_applicable(kind, fmts[files[0]], combine, str(paths), given)
    opts = _array_options(kind, files, so, on_error, shape=shape, mode=mode, dataset=dataset, key=key, swmr=swmr)
    results, skipped, companions = _probe_listed(files, kind, fmts, opts, so, labels, timestamp=timestamp,
                                                 header=header, names=names, rename=rename, on_error=on_error,
                                                 part_rows=chunk_rows, delimiter=delimiter, decimal=decimal)
    probed, label_values = _readable(results, label_values, str(paths or labels))
    if kind == "table":
        return _table_source(probed, companions, skipped, out_dtype, so, combine=combine, columns=columns, read=read,
                             timestamp=timestamp, timestamp_unit=timestamp_unit, instrument_column=instrument_column,
                             names=names, nan=nan or "raise", fill_value=fill_value, rules=rules, date=date,
                             halts=halts, calendar=calendar)
    arr, combine = _array_files(probed, FORMATS[kind], opts, so, combine=combine, on_mismatch=on_mismatch,
                                chunk_rows=chunk_rows, files_per_chunk=files_per_chunk, dtype=out_dtype, nan=nan,
                                fill_value=fill_value)
    return _array_source(arr, combine, probed, skipped, label_values, classes, labels, str(paths or labels))


def _carrying(source: "Source") -> "Source":
    """``source`` with its provenance on its array as ``array.attrs``, which
    :func:`pipeline.write` records in the store (files, classes, skipped files)."""
    from pipeline.features.filesessions import remember_files

    try:
        source.array.attrs = source.metadata()
    except AttributeError:  # pragma: no cover - a dask version with slots-only arrays
        pass
    # Dask drops attrs from every array computed from this one (f = x * 2): recorded
    # under its dask name, its files stay the sessions windows of f are made within.
    remember_files(source.array)
    return source


def _checked_options(scale: Any, missing: Any, date: Any, mode: str | None, classes: Any, labels: str | None
                     ) -> tuple[Any, Any, Any]:
    """``open_source``'s options that need no file, refused before any is read: the
    value rules of ``scale`` and ``missing``, the ``date`` spec, the image ``mode`` and
    the pinned ``classes``."""
    from pipeline.features.sessions import DateSpec
    from pipeline.loaders.images import check_mode
    from pipeline.loaders.labels import check_classes

    rules = ValueRules.from_options(scale, missing)
    spec = DateSpec.from_value(date, "date")
    check_mode(mode)
    return rules, spec, check_classes(classes, labels)


def _check_table_options(kind: str, where: str, rules: Any, date: Any, timestamp: str | None,
                         marks: tuple[str, str] = (",", ".")) -> None:
    """Refuse options that only tables take, for files of another ``kind``: ignored,
    they would leave the user believing they applied (``marks``: the CSV delimiter and
    decimal mark given)."""
    if kind == "table":
        return
    if marks != (",", "."):
        raise FormatMismatchError(where, f"source.delimiter and source.decimal are for CSV files; {kind} files have "
                                  "no fields to split: leave them unset")
    if rules:
        raise FormatMismatchError(where, "source.scale and source.missing are for CSV and Parquet tables")
    if date is not None:
        raise FormatMismatchError(where, "source.date dates the rows of CSV and Parquet tables")
    if timestamp is not None:
        raise FormatMismatchError(where, f"timestamp={timestamp!r} names a column of a table (CSV, Parquet); "
                                  f"{kind} files have no columns and no times: leave source.timestamp unset")


#: Options that apply to some files only, with the scopes that take each (``table``:
#: CSV, Parquet, LOBSTER, FI-2010; ``array``: npy, npz, image, hdf5 files, or one of
#: them; ``stack`` and ``concat``: files so combined) and what it does there. Given for
#: other files, an option would be ignored and leave its author believing it applied.
_APPLIES: dict[str, tuple[frozenset[str], str]] = {
    "columns": (frozenset({"table"}), "names the table columns read"),
    "read": (frozenset({"table"}), "chooses the table columns decoded"),
    "timestamp_unit": (frozenset({"table"}), "is the unit of a table's timestamp column"),
    "header": (frozenset({"table"}), "says whether a CSV file's first line names its columns"),
    "names": (frozenset({"table"}), "names the columns of CSV files"),
    "rename": (frozenset({"table"}), "renames table columns"),
    "instrument_column": (frozenset({"table"}), "names a table column of instruments"),
    "calendar": (frozenset({"table"}), "leaves out table rows outside an exchange calendar's sessions"),
    "dataset": (frozenset({"hdf5"}), "names the dataset read from each HDF5 file"),
    "swmr": (frozenset({"hdf5"}), "opens HDF5 files in SWMR read mode, beside a writer appending to them"),
    "key": (frozenset({"npz"}), "names the member read from each .npz file"),
    "shape": (frozenset({"image"}), "resizes images"),
    "mode": (frozenset({"image"}), "converts images to a Pillow mode"),
    "labels": (frozenset({"array"}), "gives each stacked file (npy, npz, image, HDF5) a label"),
    "classes": (frozenset({"array"}), "names the classes of stacked files' labels"),
    "on_mismatch": (frozenset({"stack"}), "fits stacked files of other shapes (combine='stack')"),
    "files_per_chunk": (frozenset({"stack"}), "sets the samples per chunk of stacked files (combine='stack')"),
    "chunk_rows": (frozenset({"concat"}), "sets the rows per chunk of files joined along axis 0 (tables, "
                   "combine='concat')"),
}


def _given(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Of :func:`open_source`'s ``arguments``, those given a value other than their default."""
    import inspect

    defaults = {n: p.default for n, p in inspect.signature(open_source).parameters.items()}
    return {n: v for n, v in arguments.items() if n in defaults and not _is_default(v, defaults[n])}


def _is_default(value: Any, default: Any) -> bool:
    return value is default or (isinstance(value, (str, bool, int, float)) and type(value) is type(default)
                                and value == default)


def _check_applicable(kind: str, fmt: str, combine: str | None, where: str, given: Mapping[str, Any]) -> None:
    """Refuse an option given for files it does not apply to (:data:`_APPLIES`), and
    ``nan="drop"`` for array files, naming the option, what it is for and the files'
    format, before any file is read.

    ``nan="drop"`` drops table rows with their timestamps; an array file has none to
    keep aligned: a dropped sample would shift every label after it, and dropped rows of
    a recording would join the steps around them as if adjacent. ``raise`` and ``fill``
    apply to arrays as to tables.

    Raises
    ------
    FormatMismatchError
        Naming the first such option.
    """
    joined = "concat" if kind == "table" else combine or "stack"
    scopes = {kind, joined} | ({"array"} if kind != "table" else set())
    for name, value in given.items():
        if name not in _APPLIES or _APPLIES[name][0] & scopes:
            continue
        takes, does = _APPLIES[name]
        if takes <= {"stack", "concat"}:
            raise FormatMismatchError(where, f"{name}={value!r} {does}; {fmt} files joined with "
                                      f"combine={joined!r} take no {name}=: leave it unset")
        raise FormatMismatchError(where, f"{name}={value!r} {does}; {fmt} files take no {name}=: leave it unset")
    if kind != "table" and given.get("nan") == "drop":
        raise FormatMismatchError(where, f"nan='drop' drops table rows with their timestamps; {fmt} files are refused "
                                  "it (a dropped sample would shift the labels after it, dropped rows would join a "
                                  "recording's steps around them): nan='raise' names the first NaN or inf, "
                                  "nan='fill' replaces them with fill_value")


def _probe_listed(files: list[str], kind: str, fmts: Any, opts: Any, so: dict, labels: str | None,
                  **probe: Any) -> tuple:
    """:func:`_probe_files`, a file listed by a manifest named with its line there."""
    try:
        return _probe_files(files, kind, fmts, opts, so, **probe)
    except LoaderError as exc:
        if labels in (None, "folder"):
            raise
        from pipeline.loaders.labels import in_manifest

        raise in_manifest(exc, str(labels), files) from None  # the line listing the file, not the file alone


def _array_source(arr: da.Array, combine: str, probed: list, skipped: list, label_values: np.ndarray | None,
                  classes: tuple[str, ...] | None, labels: str | None, where: str) -> Source:
    """The :class:`Source` of array files (npy, HDF5, images) joined into ``arr`` (in
    the dtype asked for, its values checked as read: :func:`_array_files`).

    Raises
    ------
    LoaderError
        For labels (one per file) of files joined row by row.
    """
    if label_values is not None and combine != "stack":
        # One label per file, but concat makes rows of files: 2 labels for 20 rows.
        raise LoaderError(where, f"labels={labels!r} gives one label per file, but combine={combine!r} joins the "
                          "files' rows; labels need combine='stack' (one sample per file)")
    infos = tuple(FileInfo(p, s, m, shape=tuple(sh)) for p, s, m, (sh, *_) in probed)
    label_arr = None
    if label_values is not None:
        label_arr = da.from_array(label_values, chunks=(arr.chunks[0] if combine == "stack" else -1,))
    return _carrying(Source(array=arr, columns=None, files=infos,
                            labels=label_arr, classes=classes, skipped=tuple(skipped)))


def _array_options(kind: str, files: list[str], so: dict, on_error: str, *, shape: Sequence[int] | None,
                   mode: str | None, dataset: str | None, key: str | None, swmr: bool = False) -> dict[str, Any]:
    """The options of array formats. HDF5 files without ``dataset`` are all read at the
    first file's one dataset (``dataset_from`` names that file), never each at its own;
    ``.npz`` files without ``key`` likewise at the first file's one array (``key_from``);
    ``swmr`` opens them in SWMR read mode, that first file too.

    Raises
    ------
    LoaderError
        For a first HDF5 file holding no dataset or several, or a first .npz holding
        several arrays (with ``on_error: skip``, the first file that holds one is used).
    """
    dataset_from = key_from = None
    if kind == "hdf5" and dataset is None:
        from pipeline.loaders.hdf5 import shared_dataset

        dataset, dataset_from = shared_dataset(files, so, skip=on_error == "skip", swmr=swmr)
    if kind == "npz" and key is None:
        from pipeline.loaders.npz import shared_member

        key, key_from = shared_member(files, so, skip=on_error == "skip")
    return {"shape": tuple(shape) if shape else None, "mode": mode, "dataset": dataset, "key": key,
            "dataset_from": dataset_from, "key_from": key_from, "swmr": swmr}


def _readable(results: Sequence[Any], label_values: np.ndarray | None, where: str
              ) -> tuple[list[Any], np.ndarray | None]:
    """The probed files that are readable (``on_error: skip`` left the others out as
    None), with their labels (the classes were taken from every file listed, so a
    skipped file shifts no index).

    Raises
    ------
    EmptyInputError
        When no file is left.
    """
    keep = [i for i, r in enumerate(results) if r is not None]
    probed = [results[i] for i in keep]
    if not probed:
        raise EmptyInputError(where, "no readable file left after skipping bad ones")
    if label_values is not None:
        label_values = label_values[keep]
    return probed, label_values


def _listed_files(paths: Any, labels: str | None, format: str | None, so: dict,
                  pinned: tuple[str, ...] | None = None
                  ) -> tuple[list[str], tuple[str, ...] | None, np.ndarray | None, dict[str, str], str]:
    """The files to read (from ``paths``, or a manifest's, chosen by ``paths`` when
    given) with their labels and classes (``pinned``: the classes in index order), each
    one's format, and the kind they share (``table`` for every table).

    Raises
    ------
    EmptyInputError
        For no paths, an empty manifest, or paths that match no file it lists.
    FormatMismatchError
        For files of different kinds, naming one of each.
    """
    from pipeline.loaders import labels as labels_mod
    from pipeline.loaders.registry import TABLES, format_of

    classes, label_values = None, None
    if labels not in (None, "folder"):
        files, classes, label_values = labels_mod.read_manifest(str(labels), so, pinned)
        if not files:
            raise EmptyInputError(str(labels), "the manifest lists no file")
        if paths is not None:
            files, label_values = _manifest_rows(files, label_values, paths, str(labels), so)
    else:
        if paths is None:
            raise EmptyInputError("<none>", "no paths given")
        files = _globbed_files(paths, format, so)
        if labels == "folder":
            # From every file listed, before any is skipped: a file that fails to decode
            # must not shift the index of the classes after its own (torchvision's rule).
            classes, label_values = labels_mod.folder_labels(files, _image_roots(_items(paths), format), pinned)
    fmts = {p: format_of(p, format) for p in files}
    kinds = {("table" if f in TABLES else f) for f in fmts.values()}
    if len(kinds) > 1:
        by_kind = {k: next(p for p in files if (("table" if fmts[p] in TABLES else fmts[p]) == k)) for k in kinds}
        raise FormatMismatchError(files[0], "files of different formats cannot be combined: "
                                  + ", ".join(f"{k} ({p})" for k, p in sorted(by_kind.items())))
    return files, classes, label_values, fmts, kinds.pop()


def _items(paths: Any) -> list[str]:
    """``paths`` as a list of strings."""
    return [os.fspath(paths)] if isinstance(paths, (str, os.PathLike)) else [os.fspath(p) for p in paths]


def _is_dir(item: str) -> bool:
    return "://" not in item and os.path.isdir(os.path.expanduser(item))


def _image_roots(items: Sequence[str], format: str | None) -> list[str]:
    """The local directories read whole as ``ImageFolder`` reads them (``format="image"``),
    absolute: folder labels are the first folder below them."""
    return [_absolute(i) for i in items if format == "image" and _is_dir(i)]


def _manifest_rows(files: list[str], label_values: np.ndarray, paths: Any, manifest: str, so: dict
                   ) -> tuple[list[str], np.ndarray]:
    """The manifest's files (and labels) that ``paths`` match, in the manifest's order:
    one manifest for a whole data set, ``paths`` choosing a split (``val/*.png``). A
    directory in ``paths`` matches every file below it.

    Raises
    ------
    EmptyInputError
        For a glob that matches no file (as without a manifest), or paths that match no
        file the manifest lists, naming both.
    LoaderError
        For a file named one by one that the manifest does not list (it has no label).
    """
    items = [os.path.join(i, "**", "*") if _is_dir(i) else i for i in _items(paths)]
    matched = expand_paths(items, so)
    listed = set(files)
    named = [_absolute(i) for i in items if "://" not in i and not any(ch in i for ch in "*?[")]
    unlisted = next((p for p in named if p not in listed), None)
    if unlisted is not None:
        raise LoaderError(unlisted, f"is named in paths but not listed in the manifest {manifest}, so it has no "
                          "label; add it to the manifest or leave it out of paths")
    wanted = set(matched)
    keep = [i for i, f in enumerate(files) if f in wanted]
    if not keep:
        raise EmptyInputError(", ".join(_items(paths)), f"matched {len(matched)} file(s) (such as {matched[0]}), "
                              f"none of them listed in the manifest {manifest} (its {len(files)} file(s) such as "
                              f"{files[0]}); paths choose among the manifest's files: give a glob of files it lists, "
                              "or leave paths out")
    return [files[i] for i in keep], label_values[keep]


def _globbed_files(paths: Any, format: str | None, so: dict) -> list[str]:
    """The files ``paths`` name, of a glob or folder of images only the images
    (:func:`~pipeline.loaders.images.image_files`). With ``format="image"`` a local
    folder is read as torchvision's ``ImageFolder`` reads one: every image below it."""
    from pipeline.loaders.images import image_files

    items = _items(paths)
    if format == "image":
        items = [os.path.join(i, "**", "*") if _is_dir(i) else i for i in items]
    files = expand_paths(items, so)
    named = {i if "://" in i else _absolute(i) for i in items if not any(ch in i for ch in "*?[")}
    return image_files(files, named, format, ", ".join(items))


def _probe_files(files: list[str], kind: str, fmts: dict[str, str], opts: dict, so: dict, *,
                 timestamp: str | None, header: bool | Literal["auto"], names: Sequence[str] | None,
                 rename: Mapping[str, str] | None, on_error: str, part_rows: int | None = None, delimiter: str = ",",
                 decimal: str = "."
                 ) -> tuple[list, list[tuple[str, str]], dict[str, FileInfo]]:
    """Every file's header (``None`` for a file skipped with ``on_error="skip"``), the
    skipped files with their reasons, and the companion files read with tables (LOBSTER's
    message files)."""
    from pipeline.loaders import tables
    from pipeline.loaders.registry import FORMATS

    skipped: list[tuple[str, str]] = []
    companions: dict[str, FileInfo] = {}

    def probe(path: str) -> Any:
        try:
            size, mtime = _stat(path, so)
            if kind == "table":
                parts = tables.probe_table(path, fmts[path], timestamp, so, header=header, names=names,
                                           rename=rename, part_rows=part_rows, delimiter=delimiter, decimal=decimal)
                if parts and parts[0].companion:
                    companions[path] = FileInfo(parts[0].companion, *_stat(parts[0].companion, so),
                                                rows=sum(p.rows for p in parts))
                return path, size, mtime, parts
            fmt = FORMATS[kind]
            return path, size, mtime, fmt.probe(path, so, **{k: opts[k] for k in fmt.options})
        except LoaderError as exc:
            if on_error == "skip":
                skipped.append((path, exc.problem))
                return None
            raise

    # Remote header probes are latency-bound: threads overlap them. Local probes are a
    # few microseconds of Python each, where threads only add GIL contention.
    if any("://" in p and not p.startswith("file://") for p in files):
        with ThreadPoolExecutor(max_workers=32) as pool:
            return list(pool.map(probe, files)), skipped, companions
    return [probe(p) for p in files], skipped, companions


def _array_files(probed: list, fmt: Any, opts: dict, so: dict, *, combine: str | None, on_mismatch: str,
                 chunk_rows: int | None, files_per_chunk: int | None, dtype: np.dtype | None = None,
                 nan: str | None = None, fill_value: float = 0.0) -> tuple[da.Array, str]:
    """One lazy array over files of an array format (npy, npz, images, HDF5): stacked,
    one sample per file (in the first file's shape; with ``on_mismatch="pad"``, the
    largest length along each axis among the files: :func:`~pipeline.loaders.blocks.pad_shape`),
    or concatenated along axis 0 (small files read several to a task,
    :func:`~pipeline.loaders.arrays.file_runs`), in ``dtype`` or else the files'
    common dtype (:func:`~pipeline.loaders.arrays.common_dtype`), each value checked as
    read where the cast could change it and ``nan`` applied
    (:class:`~pipeline.loaders.arrays.Values`). Returns it and the combine used.

    Raises
    ------
    ShapeMismatchError
        For shapes that cannot be combined, checked from the headers: rows of another
        shape or 0-d arrays (``concat``), another shape (``stack`` with ``on_mismatch:
        raise``) or another number of dimensions than pad, crop or resize can fit.
    LoaderError
        For dtypes with no common dtype (strings beside numbers) or one that cannot hold
        every file's values exactly, naming a file of each; for a ``dtype`` that no
        check can make safe (floats read as integers), naming a file.
    """
    from pipeline.loaders.blocks import concat_array, pad_shape, row_step, stack_array

    kind = fmt.name
    fmt_opts = {k: opts[k] for k in fmt.options}
    shapes = {p: (tuple(sh), np.dtype(dt)) for p, _, _, (sh, dt, *_) in probed}
    aligns = {p: layout[0] if layout else None for p, _, _, (_, _, *layout) in probed}  # HDF5's chunk rows
    paths = [p for p, *_ in probed]
    dtypes = {p: d for p, (_, d) in shapes.items()}
    refuse_opaque(dtypes)
    if kind == "image" and fmt_opts.get("mode") is None:
        _check_image_depths(dtypes, {p: s for p, (s, _) in shapes.items()})
    out_dtype = common_dtype(dtypes) if dtype is None else dtype
    if nan == "fill":
        check_fill_value(fill_value, out_dtype)
    values = Values(out_dtype, checked_casts(dtypes, out_dtype) if dtype is not None else False, nan, fill_value)
    combine = combine or "stack"
    if combine == "concat":
        tail = _concat_tail(paths[0], {p: s for p, (s, _) in shapes.items()})

        def read_file(path: str, lo: int, hi: int) -> np.ndarray:
            if kind == "hdf5":
                return fmt.read(path, so, rows=slice(lo, hi), **fmt_opts)
            return fmt.read(path, so, **fmt_opts)[lo:hi]

        def read_rows(item: "str | FileRun", lo: int, hi: int) -> np.ndarray:
            return item.read(lo, hi, read_file, values) if isinstance(item, FileRun) else read_file(item, lo, hi)

        rows = [shapes[p][0][0] for p in paths]
        limit = chunk_rows or row_step(max(1, int(np.prod(tail, dtype=np.int64)) * out_dtype.itemsize))
        runs = file_runs(rows, limit)
        # A file read alone and unchecked stays a path: its blocks are read as before.
        items = [FileRun(tuple(paths[a:b]), tuple(rows[a:b]), tuple(shapes[p] for p in paths[a:b]))
                 if b - a > 1 or values.needed else paths[a] for a, b in runs]
        # Every block is checked against its file's header, dtype included: an f4 file
        # rewritten as i2 still casts safely into an f8 array, so a cast check misses it.
        # A run checks each of its files itself and returns the array's dtype.
        expect = [shapes[item] if isinstance(item, str) else ((sum(rows[a:b]), *tail), out_dtype)
                  for item, (a, b) in zip(items, runs)]
        # Without chunk_rows, a file read alone is read in whole multiples of its HDF5
        # chunk rows, near ``limit`` (blocks.row_step): a block that cuts a compressed
        # chunk decodes it once more. chunk_rows given is kept exactly.
        align = None if chunk_rows else [aligns[paths[a]] if b - a == 1 else None for a, b in runs]
        arr = concat_array(items, [sum(rows[a:b]) for a, b in runs], tail, out_dtype, read_rows,
                           rows_per_chunk=chunk_rows, probed=expect, row_align=align)
        return arr, combine
    image = kind == "image"
    dims = {p: s for p, (s, _) in shapes.items()}
    _check_stack_shapes(paths[0], dims[paths[0]], dims, on_mismatch, image=image)
    # pad fits every file to the largest length along each axis, whatever their order;
    # crop and resize fit them to the first file's shape.
    target = pad_shape(list(dims.values()), dims[paths[0]]) if on_mismatch == "pad" else dims[paths[0]]

    def read(path: str) -> np.ndarray:
        a = fmt.read(path, so, **fmt_opts)
        return values.apply(path, np.asarray(a)) if values.needed else a

    arr = stack_array(paths, target, out_dtype, read, files_per_chunk=files_per_chunk, on_mismatch=on_mismatch,
                      fit_axes=2 if image else None)
    return arr, combine


def _concat_tail(first: str, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    """The row shape (all axes but the first) that files joined along axis 0 share.

    Raises
    ------
    ShapeMismatchError
        For a 0-d file (no axis 0 to join along), or rows of another shape.
    """
    scalar = next((p for p, s in shapes.items() if not s), None)
    if scalar is not None:
        raise ShapeMismatchError(scalar, "is a 0-d array (a single value, shape ()): 0-d arrays cannot be joined "
                                 "along axis 0; use combine='stack' to make one sample per file")
    tail = shapes[first][1:]
    bad = [(p, s) for p, s in shapes.items() if s[1:] != tail]
    if bad:
        listing = "; ".join(f"{p}: {s}" for p, s in bad[:5])
        raise ShapeMismatchError(first, f"has rows of shape {tail}, but {len(bad)} file(s) differ: {listing}")
    return tail


def _channels(shape: tuple[int, ...]) -> int:
    """An image's channels from its array shape: ``(H, W)`` is 1, ``(H, W, C)`` is C."""
    return shape[2] if len(shape) > 2 else 1


def _check_stack_shapes(first: str, target: tuple[int, ...], shapes: Mapping[str, tuple[int, ...]],
                        on_mismatch: str, *, image: bool = False) -> None:
    """Refuse, from the headers, stacked files that ``on_mismatch`` cannot fit to one
    shape (``target``: the first file's).

    ``pad`` fits to the largest length along each axis among the files, so it never
    cuts and no file is too large for it; ``crop`` and ``resize`` fit to ``target``.

    Raises
    ------
    ShapeMismatchError
        With ``raise``, for any file of another shape, naming the fixes (first
        ``combine="concat"`` for files that differ along axis 0 only, as token or time
        series shards do); with ``pad``, ``crop`` or ``resize``, for a file of another
        number of dimensions (a trailing axis of length 1 aside), naming it and both
        shapes. Images (``image``), whatever ``on_mismatch``: for another number of
        channels (pad, crop and resize fit height and width only), naming the ``mode=``
        that reads them all alike.
    """
    from pipeline.loaders.blocks import can_fit

    bad = [(p, s) for p, s in shapes.items() if s != target]
    if image:
        _check_channels(first, target, bad, on_mismatch)
    if bad and on_mismatch == "raise":
        listing = "; ".join(f"{p}: {s}" for p, s in bad[:5])
        raise ShapeMismatchError(
            first, f"has shape {target}, but {len(bad)} file(s) differ (first: {listing}); "
            f"{_stack_fixes(target, bad, image=image)}")
    unfit = next(((p, s) for p, s in bad if not can_fit(s, target)), None)
    if unfit is not None:
        raise ShapeMismatchError(
            unfit[0], f"has shape {unfit[1]} ({len(unfit[1])}-d), but {first} has {target} ({len(target)}-d): "
            f"on_mismatch={on_mismatch!r} changes the length of axes, not their number; "
            "give files of one number of dimensions")


def _along_axis_0(target: tuple[int, ...], bad: Sequence[tuple[str, tuple[int, ...]]]) -> bool:
    """Whether every file differs from ``target`` in its length along axis 0 only: 1-D
    token shards, recordings of other lengths, which ``combine="concat"`` joins whole."""
    return all(len(s) == len(target) and s[1:] == target[1:] for _, s in bad)


def _stack_fixes(target: tuple[int, ...], bad: Sequence[tuple[str, tuple[int, ...]]], *, image: bool) -> str:
    """The fixes for stacked files of other shapes than the first's ``target``, the one
    that keeps every value first."""
    from pipeline.loaders.arrays import values_cut
    from pipeline.loaders.blocks import can_fit, pad_shape

    fitting = [s for _, s in bad if can_fit(s, target)]
    cut = sum(values_cut(s, target) for s in fitting)
    # The padded shape is said only where pad could make it: another number of
    # dimensions is refused under every on_mismatch.
    largest = f", {pad_shape(fitting, target)} here" if len(fitting) == len(bad) else ""
    fits = (f"pad (zeros at the end of each axis up to the largest length along it among the files{largest}; it "
            "never cuts), crop (each file cut to the first file's shape, zeros where it is shorter"
            f"{f'; it would drop {cut} values here' if cut else ''}) or resize (to the first file's shape by "
            "nearest-neighbour resampling, which changes values: not for token ids or labels)")
    if image:
        return f"set shape=(H, W) to resize every image, or on_mismatch: {fits}"
    if _along_axis_0(target, bad):
        return ("they differ along axis 0 only (time steps, tokens): combine='concat' joins them along it into one "
                f"array, keeping every value; to stack one sample per file instead, set on_mismatch: {fits}")
    return f"set on_mismatch: {fits} to make them fit"


def _check_channels(first: str, target: tuple[int, ...], bad: Sequence[tuple[str, tuple[int, ...]]],
                    on_mismatch: str) -> None:
    """Refuse images of another number of channels than the first: RGB beside RGBA
    would be padded with a zero alpha or resampled into ``[R, R, G, B]``, and grayscale
    beside RGB cannot be fitted at all; converting them to one mode is the fix.

    Raises
    ------
    ShapeMismatchError
        Naming the file, both shapes and the ``mode=`` to set.
    """
    from pipeline.loaders.images import mode_advice

    want = _channels(target)
    other = next(((p, s) for p, s in bad if _channels(s) != want), None)
    if other is None:
        return
    got = _channels(other[1])
    raise ShapeMismatchError(
        other[0], f"has shape {other[1]} ({got} channel(s)), but {first} has {target} ({want} channel(s)): images "
        f"of different channel counts are not stacked (on_mismatch={on_mismatch!r}: pad, crop and resize fit height "
        f"and width only); set {mode_advice(want)} to read every image with {want} channel(s) (mode='RGB': 3, "
        "'RGBA': 4, 'L': 1)")


def _check_image_depths(dtypes: Mapping[str, np.dtype], shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Refuse images of another pixel dtype than the first's, read without ``mode=``: an
    8-bit image beside a 16-bit one would be stacked as uint16 with its values unscaled
    (its white, 255, beside the other's 65535), a scale no cast can tell apart.

    Raises
    ------
    LoaderError
        Naming the first image of another dtype, both dtypes and the ``mode=`` that reads
        every image as 8-bit.
    """
    from pipeline.loaders.images import mode_advice

    first = next(iter(dtypes))
    other = next((p for p, d in dtypes.items() if d != dtypes[first]), None)
    if other is None:
        return
    raise LoaderError(other, f"has {dtypes[other]} pixels, but {first} has {dtypes[first]}: images of different "
                      "bit depths (8-bit beside 16-bit, integer beside float) would be stacked with their values "
                      f"on different scales; set {mode_advice(_channels(shapes[first]))} to read every image as "
                      "8-bit (16-bit ones by their high byte), or convert the files to one depth")


def _table_source(probed: list, companions: dict[str, FileInfo], skipped: list, dtype: np.dtype | None, so: dict, *,
                  columns: Sequence[str] | None, timestamp: str | None, timestamp_unit: str | None,
                  instrument_column: str | None, names: Sequence[str] | None, nan: str, fill_value: float,
                  read: Sequence[str] | None = None, combine: str | None = None, rules: Any = None,
                  date: Any = None, halts: str | None = None, calendar: str | None = None) -> Source:
    """The :class:`Source` of probed table files, their parts joined by :func:`_table`
    (``date``: a :class:`~pipeline.features.sessions.DateSpec` dating times of day)."""
    if combine == "stack":
        raise FormatMismatchError(probed[0][0], "tables are joined along time; combine must be 'concat'")
    if dtype is not None and dtype not in (np.float32, np.float64):  # cast after the read, unchecked, otherwise
        raise ConfigError("dtype", "float32 or float64 for tables (CSV, Parquet, LOBSTER, FI-2010), read as floats",
                          dtype.name)
    from pipeline.loaders.timeorder import check_time_zones

    parts = [part for _, _, _, ps in probed for part in ps]
    if not parts:  # every file empty: nothing to read, though headers were found
        exc = EmptyInputError(probed[0][0], f"every one of the {len(probed)} file(s) has no data rows")
        # What a build records of them: an append of only such files (a holiday's empty
        # file) records them as read, and adds nothing.
        exc.files_without_rows = [FileInfo(path, size, mtime, rows=0, companion=companions.get(path)).metadata()
                                  for path, size, mtime, _ in probed]
        raise exc
    dates = None
    if date is not None:
        from pipeline.loaders.columns import dated_parts, row_dates

        dates = row_dates(parts, date)  # before dated_parts drops the footers' bounds
        dated = dated_parts(parts, date, timestamp, timestamp_unit)
        if dates is None:
            # Joined in date order: names such as ITCH's 12312018 and 01302019 do not sort so.
            day = {p.path: p.day_ns for p in dated}
            probed = sorted(probed, key=lambda f: day.get(f[0], 0))
            parts = sorted(dated, key=lambda p: day[p.path])
        else:
            # Each row dated by a column: a file may hold several days, so no one date
            # orders the files; they join in name order, as files of whole times do, and
            # are refused out of time order from their rows' dated times.
            parts = dated
            columns = _without_date_column(parts, columns, timestamp, instrument_column, dates.column)
    # Before the time order: a naive file among aware ones is the cause, not its order.
    zones = check_time_zones(parts, timestamp, epochs_utc=calendar is not None and date is None) if timestamp else ()
    exact = dtype is not None and np.dtype(dtype) == np.float64
    if calendar is not None and not timestamp and parts[0].fmt != "lobster":  # LOBSTER's times: its messages
        raise ConfigError("source.sessions", "", detail=f"calendar {calendar} sessions place each row by its time; "
                          "set source.timestamp to the timestamp column")
    arr, cols, times, codes, instruments, (outside, dropped) = _table(
        parts, columns, timestamp, instrument_column, names, nan, fill_value, so, timestamp_unit, read, exact, rules,
        halts, (calendar, zones[0] if zones else None), dates)
    infos = tuple(FileInfo(p, s, m, rows=sum(x.rows for x in ps), companion=companions.get(p))
                  for p, s, m, ps in probed)
    known = all(p.first_ts is not None and p.last_ts is not None for p in parts)
    if dtype is not None and not exact:
        arr = arr.astype(dtype)  # read in float32
    return _carrying(Source(array=arr, columns=cols, files=infos, timestamps=times,
                            skipped=tuple(skipped), instrument_codes=codes, instruments=instruments,
                            file_chunks=tuple(len(ps) for _, _, _, ps in probed), time_zones=zones,
                            times_from_metadata=known, outside_calendar=outside, rows_dropped=dropped))


def _without_date_column(parts: Sequence[Any], columns: Sequence[str] | None, timestamp: str | None,
                         instrument_column: str | None, date_column: str) -> Sequence[str] | None:
    """The columns read as values when ``source.date`` names a column of dates: by
    default every numeric column but the timestamp, the instrument and the date column
    (its ``YYYYMMDD`` integers would otherwise be read as a feature); ``columns`` as
    given."""
    if columns:
        return columns
    first = parts[0]
    return tuple(c for c in first.columns if c not in (timestamp, instrument_column, date_column, "")
                 and first.source_of(c) not in first.non_numeric)


def _table(parts: list, columns: Sequence[str] | None, timestamp: str | None, instrument_column: str | None,
           names: Sequence[str] | None, nan: str, fill_value: float, so: dict,
           timestamp_unit: str | None = None, read: Sequence[str] | None = None, exact: bool = False,
           rules: Any = None, halts: str | None = None, calendar: tuple[str | None, str | None] = (None, None),
           dates: Any = None) -> tuple:
    """The values (float64 when ``exact``, else float32), columns, timestamps,
    instrument codes and names of joined table parts (LOBSTER's trading halts left
    out under ``halts="drop"``, rows outside the sessions of ``calendar``: its name and
    the zone the timestamps store, ``None`` for naive wall-clock times; ``dates``: a
    :class:`~pipeline.loaders.columns.RowDates` dating times of day row by row), and
    the rows left out: ``(outside the calendar's sessions, otherwise)``."""
    import dask

    from pipeline.loaders import columns as side
    from pipeline.loaders import tables
    from pipeline.loaders.timeorder import check_time_order

    first = parts[0]
    if first.fmt == "lobster":
        if timestamp not in (None, "timestamp"):
            raise FormatMismatchError(first.path, f"LOBSTER timestamps come from the message files; leave "
                                      f"source.timestamp unset (got {timestamp!r})")
        if instrument_column is not None:
            raise FormatMismatchError(first.path, "LOBSTER files name their instrument (the ticker in the file "
                                      "name); leave source.instrument unset")
        timestamp = None
        if columns is None:  # the message columns a feature or label reads, beside the book's
            from pipeline.loaders.lobster import named_columns

            columns = named_columns(first, read)
    if first.fmt == "fi2010":
        from pipeline.loaders.fi2010 import check_fold_files

        if timestamp is not None or instrument_column is not None:
            raise FormatMismatchError(first.path, "FI-2010 files have no timestamps and no instrument column (each "
                                      "file is one session, events in order); leave source.timestamp and "
                                      "source.instrument unset")
        check_fold_files(list(dict.fromkeys(p.path for p in parts)))
    if names is not None and first.fmt != "csv":
        raise FormatMismatchError(first.path, f"source.names applies to headerless CSV files; {first.fmt} files "
                                  "name their own columns (source.rename changes them)")
    # Every column asked for is checked in every file's schema; only those read are decoded.
    tables.check_numbers_read(parts, read, timestamp, instrument_column)
    every = tables.check_columns(parts, columns, timestamp, instrument_column, read, rules)
    if rules:
        from pipeline.loaders.conversions import check_rules

        check_rules(rules, parts, every)
    cols = tables.project_columns(every, read)
    check_time_order(parts, instrument_column)
    if nan == "fill":
        check_fill_value(fill_value, np.float64 if exact else np.float32)
    if exact:
        arr = tables.table_array(parts, cols, timestamp, nan, fill_value, so, dtype=np.float64, rules=rules)
    else:
        from pipeline.loaders.precision import arm

        arr = tables.table_array(parts, cols, timestamp, nan, fill_value, so, dtype=np.float32, guard=arm(),
                                 rules=rules)
    if timestamp_unit is not None and timestamp_unit not in side.TIMESTAMP_UNITS:
        raise ConfigError("timestamp_unit", " or ".join(side.TIMESTAMP_UNITS), timestamp_unit)
    times = (side.timestamp_array(parts, timestamp, so, timestamp_unit, instrument_column, dates)
             if timestamp or first.fmt == "lobster" else None)
    codes = instruments = None
    if instrument_column is not None or first.fmt == "lobster":
        instruments = side.instrument_names(parts, instrument_column, so)
        codes = side.instrument_array(parts, instrument_column, instruments, so)
    keep = None
    if halts == "drop":
        from pipeline.loaders.lobster import not_halted

        keep = tables.parts_array(parts, not_halted, so, token="lobster-halts", dtype=bool)
    if nan == "drop":
        keep = side.keep_mask(arr) if keep is None else keep & side.keep_mask(arr)
    outside = dropped = 0
    if calendar[0] is not None and times is not None:
        from pipeline.features.calendars import in_sessions

        inside = times.map_blocks(in_sessions, calendar[0], calendar[1], dtype=bool)
        # The calendar's own count leaves out the rows dropped already (a halt's row at
        # 12:00 is no row outside the sessions).
        out_of_hours = ~inside if keep is None else keep & ~inside
        keep = inside if keep is None else keep & inside
    if keep is not None:
        # One pass for the kept rows per block: later stages need known lengths.
        def per_block(mask: da.Array) -> da.Array:
            return mask.map_blocks(lambda k: np.array([int(k.sum())]), dtype=np.int64,
                                   chunks=((1,) * mask.numblocks[0],))

        if calendar[0] is not None and times is not None:
            kept, outside_rows = dask.compute(per_block(keep), per_block(out_of_hours))
            outside = int(np.sum(outside_rows))
        else:
            (kept,) = dask.compute(per_block(keep))
        kept = tuple(int(c) for c in kept)
        dropped = int(arr.shape[0]) - sum(kept) - outside
        arr = side.drop_rows(arr, keep, kept)
        times = side.drop_rows(times, keep, kept) if times is not None else None
        codes = side.drop_rows(codes, keep, kept) if codes is not None else None
    return arr, cols, times, codes, instruments, (outside, dropped)


def load(paths: str | os.PathLike[str] | Sequence[str], *, format: str | None = None,
         combine: Literal["stack", "concat"] | None = None, **options: Any) -> da.Array:
    """A lazy dask array over raw files; nothing is read but headers.

    Parameters
    ----------
    paths
        A glob (``**`` recursive), paths, or fsspec URLs.
    format
        Force a format instead of the suffix (see :func:`open_source`).
    combine
        ``stack``: one sample per file; ``concat``: join along axis 0 (tables, time series,
        token shards of any lengths).
    **options
        The other options of :func:`open_source`.

    Returns
    -------
    dask.array.Array
        The lazy array; it carries the source's provenance as ``array.attrs``.
    """
    if options.get("labels") is not None:
        # load returns the samples alone: labels passed here were silently dropped.
        raise LoaderError(str(paths), "pipeline.load returns the samples only; for their labels use "
                          "pipeline.loaders.open_source(..., labels=...), whose .array and .labels are aligned")
    return open_source(paths, format=format, combine=combine, **options).array  # carrying its provenance
