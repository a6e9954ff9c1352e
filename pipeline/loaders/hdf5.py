"""HDF5 files (h5py): one dataset path per file, shape from metadata, read by block.

Every file is read at the same dataset path: ``dataset=``, or else the one dataset of
the first file (groups searched too, external links followed), which every other file
must then hold, so that one file's ``/prices`` is never joined with another's ``/volumes``.

Local files are opened by name, as ``h5py.File(path)`` opens them, so that HDF5 can
follow what points into other files: external links and virtual datasets (whose
sources, relative ones taken from the file's folder, are read as h5py reads them; a
missing source reads as the dataset's fill value). URLs are opened as fsspec byte
streams, through which HDF5 cannot open another file: a link or a virtual dataset there
is refused, naming it, instead of crashing the process.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Iterator, Sequence

import fsspec
import numpy as np

from pipeline.errors import FormatMismatchError, LoaderError, MissingDependencyError, UnwrittenChunksWarning

__all__ = ["default_dataset", "probe_hdf5", "read_hdf5", "row_chunk", "shared_dataset", "unwritten_chunks"]

_SIGNATURE = b"\x89HDF\r\n\x1a\n"
#: Dataset paths shown in a message, at most.
_SHOWN = 20


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:  # pragma: no cover
        raise MissingDependencyError("Reading HDF5", "h5py", "hdf5") from None
    return h5py


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _by_name(obj: Any) -> bool:
    """Whether the file of ``obj`` was opened by name (not from a Python file object),
    so that HDF5 can open the files its links and virtual datasets point to."""
    return obj.file.driver != "fileobj"


def _hard_datasets(group: Any) -> list[str]:
    """Paths of the datasets stored under ``group`` in its own file, in h5py's visit order."""
    h5py = _h5py()
    out: list[str] = []
    group.visititems(lambda name, obj: out.append(name) if isinstance(obj, h5py.Dataset) else None)
    return out


def _external_links(group: Any) -> list[str]:
    """Paths of the external links under ``group`` (in its own file), in visit order."""
    h5py = _h5py()
    out: list[str] = []
    group.visit_links(lambda name: out.append(name)
                      if isinstance(group.get(name, getlink=True), h5py.ExternalLink) else None)
    return out


def _datasets(group: Any) -> list[str]:
    """Paths of every dataset under ``group``, nested ones too, in h5py's visit order,
    then those reached through external links (which ``visititems`` does not follow).

    A link whose target cannot be opened (its file is missing, or the file was opened
    as a byte stream) is listed too: reading it says why it cannot be read.
    """
    h5py = _h5py()
    out = _hard_datasets(group)
    for name in _external_links(group):
        if not _by_name(group):  # HDF5 would open the target through this file's stream
            out.append(name)
            continue
        try:
            target = group[name]
        except (KeyError, OSError):
            out.append(name)
            continue
        if isinstance(target, h5py.Dataset):
            out.append(name)
        elif isinstance(target, h5py.Group):  # one level: a link loop cannot recurse
            out += [f"{name}/{n}" for n in _hard_datasets(target)]
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


def _link(f: Any, name: str) -> Any:
    """The link ``name`` (an ``h5py.ExternalLink``, ``SoftLink`` or ``HardLink``), or
    None where a group on the way cannot be opened or nothing is linked there."""
    try:
        return f.get(name, getlink=True)
    except (KeyError, OSError, ValueError):
        return None


#: Registered ids of common plugin filters, named where a file does not store the name.
_PLUGIN_NAMES = {307: "bzip2", 32001: "blosc", 32004: "lz4", 32008: "bitshuffle", 32015: "zstd", 32026: "blosc2"}
#: What makes a plugin filter decodable: the loader imports hdf5plugin when it is installed.
_FILTER_HINT = ("install hdf5plugin (pip install hdf5plugin, on every worker too), which the loader imports to "
                "register the common plugin filters (blosc, zstd, lz4, bitshuffle) with HDF5")


def _missing_filters(ds: Any) -> list[str]:
    """The filters of ``ds`` this HDF5 cannot decode, as ``name (id N)``."""
    from h5py import h5z

    plist = ds.id.get_create_plist()
    out = []
    for i in range(plist.get_nfilters()):
        code, _, _, name = plist.get_filter(i)
        if not h5z.filter_avail(code):
            label = name.decode("ascii", "replace") if isinstance(name, bytes) else str(name)
            out.append(f"{label or _PLUGIN_NAMES.get(code, 'unnamed')} (id {code})")
    return out


def _unavailable_filters(ds: Any) -> list[str]:
    """:func:`_missing_filters`, after importing ``hdf5plugin`` when it is installed:
    it registers the common plugin filters (blosc, zstd, lz4, bitshuffle) with HDF5,
    and a worker process has not imported it unless something did."""
    missing = _missing_filters(ds)
    if missing:
        try:
            import hdf5plugin  # noqa: F401 - registering the filters is the point
        except ImportError:
            return missing
        missing = _missing_filters(ds)
    return missing


def _field_type(dt: np.dtype) -> str:
    """A compound field's type as a message shows it: ``float64``, or ``float64[3]``."""
    return f"{dt.base}{list(dt.shape)}" if dt.shape else str(dt)


def _object_kind(dt: np.dtype) -> str:
    """What an HDF5 type h5py reads as ``dtype=object`` holds, in words."""
    h5py = _h5py()
    if h5py.check_string_dtype(dt) is not None:
        return "variable-length strings"
    base = h5py.check_vlen_dtype(dt)
    if base is not None:
        return f"variable-length (ragged) arrays of {base}"
    ref = h5py.check_ref_dtype(dt)
    if ref is not None:
        return "region references" if ref is h5py.RegionReference else "object references"
    return "values of an HDF5 type without a fixed size"


def _check_dataset(path: str, name: str, ds: Any) -> None:
    """Refuse, naming the file and the dataset, what would otherwise be read as
    something other than a numeric array, or fail inside HDF5 (or crash it).

    Raises
    ------
    LoaderError
        For a null dataspace (``h5py.Empty``), a compound dtype (a table, e.g. one
        pandas wrote with ``format="table"``), an opaque type (raw bytes), a type h5py reads as Python objects
        (variable-length strings, ragged arrays, references: numpy's ``.npy`` object
        arrays are refused too, and zarr cannot store them), a filter this HDF5 cannot decode (a
        plugin such as blosc, as PyTables writes), or a virtual dataset in a file read
        over a URL.
    """
    if ds.shape is None:
        raise LoaderError(path, f"dataset {name!r} has a null dataspace (h5py.Empty): it holds no array, not even "
                          "an empty one; choose another dataset")
    if ds.dtype.names is not None:
        fields = ", ".join(f"{n!r} ({_field_type(ds.dtype.fields[n][0])})" for n in ds.dtype.names)
        raise LoaderError(path, f"dataset {name!r} holds records of fields {fields} (a compound dtype: a table, "
                          "as pandas writes with format='table'), not an array of numbers; read it with "
                          "pandas.read_hdf and save it as Parquet (format: parquet reads tables), or store "
                          "each field as a dataset of its own")
    if ds.dtype.hasobject:
        raise LoaderError(path, f"dataset {name!r} holds {_object_kind(ds.dtype)}, which h5py reads as Python "
                          "objects (dtype=object), not an array of numbers; choose a numeric dataset, or store "
                          "these values as one (fixed-length bytes for strings, padded rows for ragged arrays)")
    if ds.dtype.kind == "V" and ds.dtype.subdtype is None:
        raise LoaderError(path, f"dataset {name!r} holds opaque values ({ds.dtype.itemsize}-byte HDF5 opaque type, "
                          f"numpy {ds.dtype.str!r}): raw bytes with no numeric meaning, which zarr cannot store "
                          "either; choose a numeric dataset, or store these bytes as uint8 with a trailing axis")
    missing = _unavailable_filters(ds)
    if missing:
        raise LoaderError(path, f"dataset {name!r} is compressed with the HDF5 filter {', '.join(missing)}, whose "
                          f"plugin this HDF5 does not have, so its data cannot be decoded; {_FILTER_HINT}")
    if ds.is_virtual and not _by_name(ds):
        raise LoaderError(path, f"dataset {name!r} is a virtual dataset (its data lives in other files), which is "
                          "read only from a local file: HDF5 cannot open its source files from a file read over "
                          "a URL; read the source files themselves")


def _dataset(path: str, f: Any, name: str, chosen_in: str | None) -> Any:
    """The dataset ``name`` of the open file ``f``, checked by :func:`_check_dataset`.

    Raises
    ------
    LoaderError
        For a missing path (listing the file's datasets, and saying which file the name
        was chosen in when it was not given), a path naming a group or another object,
        an external link whose target cannot be opened (or is in a file read over a URL),
        or a dataset :func:`_check_dataset` refuses.
    """
    h5py = _h5py()
    link = _link(f, name)
    if isinstance(link, h5py.ExternalLink) and not _by_name(f):
        raise LoaderError(path, f"{name!r} is an external link (to {link.path!r} in {link.filename}), which is "
                          "followed only in a local file: HDF5 cannot open another file from a file read over "
                          "a URL; copy the data into the file, or read the linked file itself")
    try:
        obj = f[name]
    except KeyError as exc:
        if isinstance(link, h5py.ExternalLink):
            raise LoaderError(path, f"{name!r} is an external link to {link.path!r} in {link.filename}, which "
                              f"cannot be opened ({exc.args[0] if exc.args else exc}; a relative file name is "
                              "looked up beside this file)") from None
        obj = None
    if isinstance(obj, h5py.Dataset):
        _check_dataset(path, name, obj)
        return obj
    if obj is None:
        why = (f"; {name!r} is the only dataset of {chosen_in}, the first file, and every file must hold the "
               "dataset read from the first: set dataset: to choose one" if chosen_in and chosen_in != path else "")
        raise LoaderError(path, f"has no dataset {name!r} (its datasets: {_listing(_datasets(f))}){why}")
    if isinstance(obj, h5py.Group):
        raise LoaderError(path, f"{name!r} is a group, not a dataset (datasets under it: "
                          f"{_listing([name.rstrip('/') + '/' + n for n in _datasets(obj)])}); set dataset: to one")
    raise LoaderError(path, f"{name!r} is a {type(obj).__name__}, not a dataset; set dataset: to one")


def _check_signature(path: str, head: bytes) -> None:
    if head != _SIGNATURE:
        raise FormatMismatchError(path, f"expected an HDF5 file, found bytes {head!r}")


#: What HDF5 says when a file's writer still holds it (or was killed holding it).
_HELD = ("already open for write", "unable to lock file")


def _held_message(exc: OSError, swmr: bool) -> str | None:
    """What to tell the user when ``h5py.File`` failed because a writer holds the file,
    or None for another failure. HDF5 says "file is already open for write" for a file
    whose superblock marks a writer (an SWMR writer, or any writer of the latest file
    format killed before closing), and "unable to lock file, errno = 11" for a file
    another process has open for writing with HDF5's file locking."""
    text = str(exc)
    if not any(h in text for h in _HELD):
        return None
    why = text[text.find("(") + 1 : text.rfind(")")] if "(" in text else text
    if "unable to lock" in text:
        return (f"another process has the file open for writing (HDF5: {why}); read it after that process closes "
                "it, or read a copy. A file written in SWMR mode (h5py: f.swmr_mode = True) can be read while it "
                "is written, with swmr=True")
    if swmr:
        return (f"the file is marked open for writing (HDF5: {why}), and reading it with swmr=True failed too, so "
                "its writer is not in SWMR mode, or was killed before closing it: then `h5clear -s FILE` clears the "
                "mark (rows it had not flushed are lost)")
    return (f"another process has the file open for writing (HDF5: {why}): to read a file an SWMR writer is "
            "appending to, read it with swmr=True (h5py's SWMR read mode; the rows the writer has flushed when "
            "the array is built are read); if no process writes it, its writer was killed before closing it: "
            "`h5clear -s FILE` clears the mark (rows it had not flushed are lost)")


def _h5file(path: str, target: Any, swmr: bool) -> Any:
    """``h5py.File(target, "r", swmr=swmr)``, a writer holding the file named as such.

    Raises
    ------
    LoaderError
        For a file another process holds open for writing (or whose writer was killed
        holding it), saying what to do.
    """
    h5py = _h5py()
    try:
        return h5py.File(target, "r", swmr=swmr)
    except OSError as exc:
        held = _held_message(exc, swmr)
        if held is None:
            raise
        raise LoaderError(path, held) from None


@contextlib.contextmanager
def _open(path: str, so: dict, swmr: bool = False) -> Iterator[Any]:
    """The ``h5py.File``, opened for reading after its signature is checked (``swmr``:
    in HDF5's SWMR read mode, beside a writer appending to it). A local file is opened
    by name: HDF5 opens the files its external links and virtual datasets point to
    only from a file it opened by name (from a Python file object, reading a virtual
    dataset crashes the process). A URL is opened through fsspec."""
    if _is_local(path):
        local = path.removeprefix("file://")
        with open(local, "rb") as fh:
            _check_signature(path, fh.read(8))
        with _h5file(path, local, swmr) as f:
            yield f
        return
    with fsspec.open(path, "rb", **so) as fh:
        _check_signature(path, fh.read(8))
        fh.seek(0)
        with _h5file(path, fh, swmr) as f:
            yield f


def default_dataset(path: str, so: dict, *, swmr: bool = False) -> str:
    """The one dataset of a file (groups searched too), read when ``dataset`` is not given
    (``swmr``: see :func:`probe_hdf5`).

    Raises
    ------
    LoaderError
        For a file that is not HDF5, cannot be read, or holds no dataset or several.
    """
    try:
        with _open(path, so, swmr) as f:
            return _only_dataset(path, f)
    except OSError as exc:
        raise LoaderError(path, f"cannot read HDF5 ({exc})") from None


def shared_dataset(paths: Sequence[str], so: dict, *, skip: bool = False,
                   swmr: bool = False) -> tuple[str | None, str | None]:
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
            return default_dataset(path, so, swmr=swmr), path
        except LoaderError:
            if not skip:
                raise
    return None, None


def unwritten_chunks(ds: Any) -> tuple[int, int, int] | None:
    """``(written, needed, rows)`` for a chunked dataset some of whose chunks were never
    written, which read as the fill value: the chunks stored, those its shape needs,
    and the rows in a band of chunks missing one (they read the fill value in some or
    all columns). None when every chunk is stored, or the dataset is not chunked.

    HDF5 stores a chunk when data is first written to it, and records it in the
    file's chunk index when the file is flushed or closed: a writer killed before that
    leaves a file whose rows, written or not, read as the fill value. Counting the
    stored chunks walks the chunk index once (milliseconds for 100,000 chunks); the
    rows are counted only when chunks are missing.
    """
    if ds.chunks is None or ds.is_virtual or not ds.shape or ds.size == 0:
        return None
    grid = [-(-int(s) // int(c)) for s, c in zip(ds.shape, ds.chunks)]
    needed = int(np.prod(grid, dtype=np.int64))
    written = int(ds.id.get_num_chunks())
    if written >= needed:
        return None
    band, n = int(ds.chunks[0]), int(ds.shape[0])
    bands: list[int] = []
    ds.id.chunk_iter(lambda info: bands.append(info.chunk_offset[0] // band))
    full = np.bincount(np.asarray(bands, dtype=np.int64), minlength=grid[0]) >= needed // grid[0]
    lengths = np.minimum(band, n - np.arange(grid[0], dtype=np.int64) * band)
    return written, needed, int(lengths[~full].sum())


def _warn_unwritten(path: str, name: str, ds: Any) -> None:
    """Warn, naming the file and the dataset, when rows will read as the fill value
    because their chunks were never written (:func:`unwritten_chunks`)."""
    found = unwritten_chunks(ds)
    if found is None:
        return
    written, needed, rows = found
    fill = ds.fillvalue.item() if hasattr(ds.fillvalue, "item") else ds.fillvalue
    warnings.warn(f"{path}: dataset {name!r} has {written} of the {needed} chunks its shape {tuple(ds.shape)} needs "
                  f"written: {rows} of its {ds.shape[0]} rows read as the fill value {fill!r} (in some or "
                  "all columns). HDF5 stores a chunk when it is first written and indexes it when the file is "
                  "closed: a writer killed before closing the file, or one that never wrote those rows, leaves "
                  "them so; rewrite the file if they should hold data", UnwrittenChunksWarning, stacklevel=1)


def _element_shape(shape: tuple[int, ...], dtype: np.dtype) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype h5py reads a dataset as: a dataset of an HDF5 array type
    (numpy's subarray dtype, such as ``('<f4', (3,))``) reads as its base dtype with the
    element's axes after the dataset's (shape ``(5,)`` reads as ``(5, 3)`` float32)."""
    if dtype.subdtype is None:
        return shape, dtype
    base, sub = dtype.subdtype
    return shape + tuple(int(s) for s in sub), np.dtype(base)


def row_chunk(ds: Any) -> int | None:
    """Rows of one HDF5 chunk of ``ds`` (None for a contiguous dataset): reading whole
    chunks of rows decodes each chunk once (see ``blocks.row_step``)."""
    return int(ds.chunks[0]) if ds.chunks and ds.ndim else None


def probe_hdf5(path: str, so: dict, *, dataset: str | None = None, dataset_from: str | None = None,
               swmr: bool = False, layout: bool = False) -> tuple:
    """Shape and dtype of the dataset, without reading it (with ``layout``, and its
    :func:`row_chunk`: ``(shape, dtype, chunk_rows)``).

    Parameters
    ----------
    path, so
        The file and its fsspec options.
    dataset
        The dataset path; default the file's one dataset.
    dataset_from
        The file ``dataset`` was chosen in (it was not given), named when this one lacks it.
    swmr
        Open the file in HDF5's SWMR read mode (h5py's ``swmr=True``), to read a file
        that a writer in SWMR mode is appending to: the rows it has flushed are read.
        Without it, such a file is refused, saying so.
    layout
        Return the dataset's chunk rows too (``row_align`` of ``blocks.concat_array``).

    Warns
    -----
    UserWarning
        For a chunked dataset some of whose chunks were never written, which read as
        the fill value (:func:`unwritten_chunks`), naming the file, the dataset and the
        rows: a writer killed before closing the file leaves it so.

    Raises
    ------
    LoaderError
        For a file another process holds open for writing, saying what to do; for a
        dataset :func:`_dataset` refuses.
    """
    try:
        with _open(path, so, swmr) as f:
            ds = _dataset(path, f, dataset if dataset is not None else _only_dataset(path, f), dataset_from)
            shape, dtype = _element_shape(tuple(int(s) for s in ds.shape), np.dtype(ds.dtype))
            _warn_unwritten(path, dataset if dataset is not None else ds.name.lstrip("/"), ds)
            return (shape, dtype, row_chunk(ds)) if layout else (shape, dtype)
    except OSError as exc:
        raise LoaderError(path, f"cannot read HDF5 ({exc})") from None


def read_hdf5(path: str, so: dict, *, dataset: str | None = None, dataset_from: str | None = None,
              rows: slice | None = None, swmr: bool = False) -> np.ndarray:
    """The dataset, or a block of its rows (``dataset_from``, ``swmr``: see :func:`probe_hdf5`)."""
    try:
        with _open(path, so, swmr) as f:
            ds = _dataset(path, f, dataset if dataset is not None else _only_dataset(path, f), dataset_from)
            return ds[rows] if rows is not None else ds[()]
    except OSError as exc:
        raise LoaderError(path, f"cannot read HDF5 data ({exc})") from None
