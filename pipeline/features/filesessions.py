"""The sessions windows of an array are made within: rows given per session, or the
files the array was joined from (the provenance :func:`pipeline.load` and
``open_source(...).array`` carry in ``x.attrs``). Pure arithmetic on shapes and
attributes: nothing is read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import dask.array as da
import numpy as np

from pipeline.errors import WindowError

__all__ = ["SESSION_RULES", "file_sessions", "remember_files", "series_length", "session_rows"]


def series_length(x: da.Array | np.ndarray) -> int:
    """The length of ``x``, checked to be a ``(time, features)`` series of known length,
    without making a dask array of it (which hashes a numpy array's every byte).

    Raises
    ------
    WindowError
        For another number of dimensions, or an unknown length (a boolean mask's).
    """
    shape = tuple(x.shape) if isinstance(x, da.Array) else np.shape(x)
    if len(shape) != 2:
        raise WindowError(f"windows: expected a (time, features) array, got shape {shape}")
    if any(np.isnan(c) for c in shape):
        raise WindowError(f"windows: the series' length is unknown (shape {shape}, as after a boolean mask); "
                          "call x.compute_chunk_sizes() first")
    return int(shape[0])


#: ``sessions=`` values that name a rule instead of giving rows, spelled as the config's
#: ``source.sessions`` spells them.
SESSION_RULES = ("file", "none")


def file_sessions(x: Any) -> list[int] | None:
    """Rows per file of an array joined from several files, from the provenance it
    carries or, for an array computed from such an array, from the loaded array's;
    ``None`` when there is none.

    :func:`pipeline.load` and ``open_source(...).array`` set ``x.attrs`` to the files
    read, in array order (``attrs["files"]``, each with its ``rows`` (tables) or its
    ``shape`` (npy, HDF5), and ``attrs["shape"]``). Files joined along time
    (``combine="concat"``) are separate recordings: a window over the seam of two
    mixes them. ``None`` for one file, files stacked one sample each, or a numpy array.

    Dask drops ``attrs`` from every array computed from ``x`` (``x * 2``, ``x[:, :2]``,
    ``x.map_blocks(f)``), so for an array without them the loaded arrays its dask graph
    depends on are looked up (see :func:`remember_files`): when they hold exactly its
    rows (features computed row by row, columns selected or joined), their files are
    its sessions.

    Rows of several instruments read with an instrument column (``attrs["instruments"]``)
    are interleaved in time, in one file or many: no files' rows keep them apart, so
    such an array, and any computed from it, is refused rather than windowed as one
    series (:func:`_mixed_instruments` says how to keep them apart).

    Raises
    ------
    WindowError
        For the rows of several instruments read with an instrument column. When the files' rows do not add up to ``x``'s length (rows dropped by
        ``nan="drop"``, or attrs copied from another array), a file does not say how
        many rows it holds, or ``x`` was computed from a loaded array of several files
        but has another number of rows (sliced, shifted, joined along time), or from
        several whose files end at different rows: where one file ends is then not
        known.
    """
    attrs = getattr(x, "attrs", None)
    files = attrs.get("files") if isinstance(attrs, Mapping) else None
    if not isinstance(files, (list, tuple)):
        return _derived_file_rows(x)
    names = _interleaved_instruments(attrs, files)
    if names:
        raise WindowError(_mixed_instruments(names, _first_path(files), len(files), "x"))
    if len(files) < 2:
        return None
    shape = attrs.get("shape")
    ndim = len(shape) if isinstance(shape, (list, tuple)) else len(x.shape)
    T = series_length(x)
    rows = _attr_rows(files, ndim)
    if rows is None:
        return None
    return _checked_rows(rows, T, f"x carries the {len(files)} files it was read from (x.attrs['files'], the first "
                                  f"{_first_path(files)})")


def _first_path(files: Sequence[Any]) -> str:
    """The first file's path, for messages."""
    return str(files[0].get("path", "?")) if files and isinstance(files[0], Mapping) else "?"


def _interleaved_instruments(attrs: Mapping[str, Any], files: Sequence[Any]) -> tuple[str, ...]:
    """The instruments of an array whose files may hold several interleaved in time
    (``open_source(..., instrument_column=...)``: ``attrs["instruments"]``), or ``()``.

    Files or no file, such rows are no series: which file holds which instrument is
    known only by reading the column. LOBSTER's pairs (a file with a ``companion``)
    name one instrument each in the file name, so its files keep them apart.
    """
    names = attrs.get("instruments")
    if not isinstance(names, (list, tuple)) or len(names) < 2:
        return ()
    if files and all(isinstance(f, Mapping) and f.get("companion") for f in files):
        return ()
    return tuple(str(n) for n in names)


def _mixed_instruments(names: Sequence[str], first: str, n_files: int, what: str) -> str:
    """The refusal of windows over the interleaved rows of several instruments: which,
    from which files, and the API that keeps them apart (as ``pipeline run`` does)."""
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    where = first if n_files == 1 else f"{n_files} files (the first {first})"
    return (
        f"windows: {what} holds the rows of {len(names)} instruments ({shown}) read from {where} with an instrument "
        "column, interleaved in time as the files store them: a window, feature or label over its rows would mix "
        "instruments. Keep them apart with pipeline.loaders.segments.open_segmented(paths, instrument={'column': "
        "<the instrument column>}, <open_source's other options>), whose array holds each instrument's rows "
        "session by session, and pass its segments (its array alone does not say where they end), as pipeline "
        "run does: pipeline.windows(seg.array, ..., sessions=seg.segments.stops - seg.segments.starts), or "
        "build_training_set(seg.array, ..., "
        "segments=seg.segments, timestamps=seg.timestamps). sessions='none' (or sessions=[rows per session]) "
        "makes windows over these rows as they are"
    )


def _attr_rows(files: Sequence[Any], ndim: int) -> list[int | None] | None:
    """Rows per file from ``attrs["files"]`` (``None`` for a file stacked as one sample),
    or ``None`` when every file is one sample (the series runs across them).

    Raises
    ------
    WindowError
        For a file that says neither its rows nor its shape.
    """
    rows: list[int | None] = []
    for f in files:
        f = f if isinstance(f, Mapping) else {}
        n, fshape = f.get("rows"), f.get("shape")
        if isinstance(n, (int, np.integer)) and not isinstance(n, bool):
            rows.append(int(n))
        elif isinstance(fshape, (list, tuple)) and len(fshape) == ndim:  # joined row by row
            rows.append(int(fshape[0]))
        elif isinstance(fshape, (list, tuple)) and len(fshape) == ndim - 1:  # one sample per file
            rows.append(None)
        else:
            raise WindowError(f"windows: x carries the files it was read from (x.attrs['files']), but "
                              f"{f.get('path', f)!r} does not say how many rows it holds, so where it ends is not "
                              "known; pass sessions=[rows per session], or sessions='none' for one series")
    return None if all(n is None for n in rows) else rows


def _checked_rows(rows: Sequence[int | None], T: int, where: str) -> list[int]:
    """``rows`` when every file's rows are known and add up to ``T``.

    Raises
    ------
    WindowError
        Otherwise, saying ``where`` the files come from, their sum and ``T``.
    """
    known = [n for n in rows if n is not None]
    if len(known) != len(rows) or sum(known) != T:
        raise WindowError(
            f"windows: {where}, whose rows add up to {sum(known)}, not x's {T} (rows dropped by nan='drop', "
            "or the attrs of another array), so where one file ends is not known; pass sessions=[rows per file] "
            "(no window spans two), or sessions='none' for one continuous series"
        )
    return known


@dataclass(frozen=True, slots=True)
class _LoadedFiles:
    """What windows need of a loaded array of several files joined along time, or of
    interleaved instruments, kept after the array itself is gone: its files' rows
    (``None``: unknown, see ``problem``), its own length, its first file and how many
    (for messages), and the instruments its rows interleave (``()``: none)."""

    rows: tuple[int | None, ...] | None
    length: int
    first: str
    problem: str | None = None
    files: int = 0
    instruments: tuple[str, ...] = ()


# Dask names of loaded arrays -> their files. Keyed by name, not by the array: a
# derived array's graph holds the loaded array's layer (by name), not the array, which
# is often gone (`f = pipeline.load(...) * 2`). Bounded, oldest dropped first, by
# entries and by files held (an array of 100,000 npy files keeps 100,000 counts).
_LOADED: OrderedDict[str, _LoadedFiles] = OrderedDict()
_LOADED_LOCK = threading.Lock()
_MAX_LOADED = 256
_MAX_LOADED_FILES = 2_000_000


def remember_files(x: Any) -> None:
    """Record the files a loaded array ``x`` was joined from under its dask name, so
    that arrays computed from it (which lose ``x.attrs``) keep them as sessions (see
    :func:`file_sessions`), and the instruments its rows interleave, so that those
    arrays are refused as it is. Arrays of one file or stacked files (one series) of
    one instrument are not recorded; nothing is read.

    Arrays of any number of dimensions are recorded: 1-D token shards joined along
    time become a series by ``x[:, None]``, which keeps every row.
    """
    attrs = getattr(x, "attrs", None)
    files = attrs.get("files") if isinstance(attrs, Mapping) else None
    name = getattr(x, "name", None)
    shape = tuple(getattr(x, "shape", ()))
    if not isinstance(name, str) or not isinstance(files, (list, tuple)) or not files or not shape:
        return
    if np.isnan(shape[0]):
        return
    names = _interleaved_instruments(attrs, files)
    if len(files) < 2 and not names:
        return
    try:
        rows = _attr_rows(files, len(shape))
        record = _LoadedFiles(None if rows is None else tuple(rows), int(shape[0]), _first_path(files),
                              files=len(files), instruments=names)
    except WindowError as err:
        record = _LoadedFiles(None, int(shape[0]), _first_path(files), problem=str(err), files=len(files),
                              instruments=names)
    if record.rows is None and record.problem is None and not names:
        return  # stacked: one series, as without a record
    with _LOADED_LOCK:
        _LOADED.pop(name, None)
        _LOADED[name] = record
        held = sum(len(r.rows or ()) for r in _LOADED.values())
        while len(_LOADED) > 1 and (len(_LOADED) > _MAX_LOADED or held > _MAX_LOADED_FILES):
            _, old = _LOADED.popitem(last=False)
            held -= len(old.rows or ())


def _loaded_ancestors(x: Any) -> list[_LoadedFiles]:
    """The recorded loaded arrays ``x``'s dask graph depends on (``x`` among them)."""
    layers = getattr(getattr(x, "dask", None), "layers", None) if isinstance(x, da.Array) else None
    if not isinstance(layers, Mapping):
        return []
    with _LOADED_LOCK:
        return [_LOADED[name] for name in layers if name in _LOADED]


def _derived_file_rows(x: Any) -> list[int] | None:
    """Rows per file of the loaded arrays of several files that ``x`` was computed
    from, when they hold exactly ``x``'s rows; ``None`` when it depends on none.

    Equal lengths are taken as rows kept one for one, as elementwise features,
    column selections, ``map_blocks`` and joins along columns keep them. A reordering
    that keeps the length (``x[::-1]``) cannot be told apart here.

    Raises
    ------
    WindowError
        When ``x`` has another length than such an array (rows sliced, shifted or
        joined along time: no file's end is known), or depends on several whose
        files end at different rows.
    """
    found = _loaded_ancestors(x)
    if not found:
        return None
    T = series_length(x)
    for rec in found:
        # First: whatever x did to the rows (kept, sliced, reordered), they were never
        # one instrument's series, and no count of rows says where each one's are.
        if rec.instruments:
            raise WindowError(_mixed_instruments(rec.instruments, rec.first, rec.files,
                                                 "x was computed from an array that"))
        if rec.length != T:
            raise WindowError(
                f"windows: x was computed from an array of {len(rec.rows or ())} files joined along time (the first "
                f"{rec.first}) of {rec.length} rows, but has {T} rows (sliced, shifted, reshaped or joined along time), so "
                "where one file ends in it is not known; pass sessions=[rows per file] (no window spans two), or "
                "sessions='none' for one continuous series"
            )
        if rec.problem is not None:
            raise WindowError(f"{rec.problem} (x was computed from that array)")
    bounds = {tuple(_checked_rows(rec.rows or (), T, f"x was computed from an array of {len(rec.rows or ())} files "
                                                    f"joined along time (the first {rec.first})"))
              for rec in found}
    if len(bounds) > 1:
        raise WindowError(
            f"windows: x was computed from {len(found)} arrays joined from files whose ends differ "
            f"({' and '.join(str(list(b)) for b in sorted(bounds)[:2])} rows per file), so its sessions are not known; "
            "pass sessions=[rows per session], or sessions='none' for one continuous series"
        )
    return list(bounds.pop())


def session_rows(x: Any, sessions: Sequence[int] | str | None) -> list[int] | None:
    """The rows per session that windows of ``x`` are made within, or ``None`` for
    one continuous series: ``sessions`` of :func:`windows`, resolved.

    Raises
    ------
    WindowError
        For session lengths that are not whole rows or do not add up to ``x``'s length,
        an unknown rule, ``"file"`` for an array that carries no files, or files whose
        rows do not add up (see :func:`file_sessions`).
    """
    T = series_length(x)
    if isinstance(sessions, str):
        if sessions == "none":
            return None
        if sessions != "file":
            raise WindowError(f"windows: sessions must be rows per session, one of {SESSION_RULES} or None, "
                              f"got {sessions!r}")
        lengths = file_sessions(x)
        if lengths is None:
            raise WindowError(
                "windows: sessions='file' needs an array joined from several files (pipeline.load or "
                "open_source(...).array with combine='concat'), which carries them in x.attrs['files'], or an "
                "array computed from one; this one is neither (pass sessions=[rows per session])"
            )
        return lengths
    if sessions is None:
        return file_sessions(x)
    lengths = _session_lengths(sessions)
    if sum(lengths) != T:
        raise WindowError(f"windows: sessions of {sum(lengths)} rows in all for a series of {T} steps")
    return lengths


def _session_lengths(sessions: Sequence[int]) -> list[int]:
    """Rows per session as integers; a fraction or a negative count is refused rather
    than truncated (and then blamed on the sessions' sum)."""
    lengths = []
    for k, v in enumerate(sessions):
        number = isinstance(v, (int, np.integer, float, np.floating)) and not isinstance(v, bool)
        if not number or not float(v).is_integer() or v < 0:
            raise WindowError(f"windows: sessions[{k}] must be a number of rows (an integer, 0 or more), got {v!r}")
        lengths.append(int(v))
    return lengths
