"""The sessions windows of an array are made within: rows given per session, or the
files the array was joined from (the provenance :func:`pipeline.load` and
``open_source(...).array`` carry in ``x.attrs``). Pure arithmetic on shapes and
attributes: nothing is read.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import dask.array as da
import numpy as np

from pipeline.errors import WindowError

__all__ = ["SESSION_RULES", "file_sessions", "series_length", "session_rows"]


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
    carries, or ``None`` when it carries none.

    :func:`pipeline.load` and ``open_source(...).array`` set ``x.attrs`` to the files
    read, in array order (``attrs["files"]``, each with its ``rows`` (tables) or its
    ``shape`` (npy, HDF5), and ``attrs["shape"]``). Files joined along time
    (``combine="concat"``) are separate recordings: a window over the seam of two
    mixes them. ``None`` for one file, files stacked one sample each, a numpy array,
    or a dask array computed from the loaded one (dask drops ``attrs``).

    Raises
    ------
    WindowError
        When the files' rows do not add up to ``x``'s length (rows dropped by
        ``nan="drop"``, or attrs copied from another array) or a file does not say how
        many rows it holds: where one file ends is then not known.
    """
    attrs = getattr(x, "attrs", None)
    files = attrs.get("files") if isinstance(attrs, Mapping) else None
    if not isinstance(files, (list, tuple)) or len(files) < 2:
        return None
    shape = attrs.get("shape")
    ndim = len(shape) if isinstance(shape, (list, tuple)) else len(x.shape)
    T = series_length(x)
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
    if all(n is None for n in rows):
        return None  # stacked: each row is a file, and the series runs across them
    known = [n for n in rows if n is not None]
    if len(known) != len(rows) or sum(known) != T:
        path = files[0].get("path", "?") if isinstance(files[0], Mapping) else "?"
        raise WindowError(
            f"windows: x carries the {len(files)} files it was read from (x.attrs['files'], the first {path}), "
            f"whose rows add up to {sum(known)}, not x's {T} (rows dropped by nan='drop', or the attrs of another "
            "array), so where one file ends is not known; pass sessions=[rows per file] (no window spans two), "
            "or sessions='none' for one continuous series"
        )
    return known


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
                "open_source(...).array with combine='concat'), which carries them in x.attrs['files']; this one "
                "carries none (dask drops attrs when an array is computed on: copy them back, x2.attrs = x.attrs, "
                "or pass sessions=[rows per session])"
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
