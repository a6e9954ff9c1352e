"""Array files (npy, npz, images, HDF5): the rules that make their values one array's.

Files joined into one array are read in one dtype: the files' common dtype when it
holds every file's values exactly (:func:`common_dtype`), or the ``dtype=`` asked for,
each value checked as it is read where the cast could change it (:class:`Values`), with
NaN/inf raised or filled (``nan=``); how many values cropping a stacked file to the first's
shape would cut (:func:`values_cut`). Short files joined along axis 0 are read several to
a task (:func:`file_runs`, :class:`FileRun`), each still checked on its own and named in
an error. Small functions of dtypes and arrays that read nothing themselves: the
loaders call them when they build the array (:func:`pipeline.loaders.open_source`) and
in the tasks that read its blocks (:mod:`pipeline.loaders.blocks`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from pipeline.errors import ConfigError, LoaderError

__all__ = ["FileRun", "Values", "changed_values", "checked_casts", "checked_dtype", "common_dtype", "file_runs",
           "check_fill_value", "holds_exactly", "refuse_opaque", "values_cut"]


def file_runs(rows: Sequence[int], limit: int) -> list[tuple[int, int]]:
    """``[a, b)`` runs of consecutive files (of ``rows`` rows each) read by one task
    each, by the rule that joins small Parquet row groups
    (:func:`pipeline.loaders.tables.merged_groups`): a file of at least a quarter of
    ``limit`` rows (a block) is read alone, in blocks of ``limit``; smaller neighbours
    are joined until a run holds that quarter, never more than ``limit`` rows.

    A folder of many short recordings made one task per file, whose scheduling cost
    far more than reading the file."""
    from pipeline.loaders.tables import merged_groups

    return merged_groups(rows, limit)


@dataclass(frozen=True, slots=True)
class FileRun:
    """Consecutive files read by one task (one file, when its values are checked),
    with each one's probed ``(shape, dtype)``: every file is checked against its header
    (:func:`pipeline.loaders.blocks.check_block`) and its values by :class:`Values`,
    so that an error names the file, not the run."""

    paths: tuple[str, ...]
    rows: tuple[int, ...]
    probed: tuple[tuple[tuple[int, ...], np.dtype], ...]

    def __str__(self) -> str:  # what an error about the whole run names
        if len(self.paths) == 1:
            return self.paths[0]
        return f"{self.paths[0]} (and the {len(self.paths) - 1} file(s) read with it, to {self.paths[-1]})"

    def read(self, lo: int, hi: int, read_file: Any, values: "Values") -> np.ndarray:
        """Rows ``lo:hi`` of the run, in ``values.dtype``, each file's part checked."""
        from pipeline.loaders.blocks import check_block

        tail = self.probed[0][0][1:]
        out = np.empty((hi - lo, *tail), dtype=values.dtype)
        start = 0
        for path, n, probed in zip(self.paths, self.rows, self.probed):
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                got = np.asarray(read_file(path, a - start, b - start))
                if values.needed or got.dtype != probed[1] or got.shape != (b - a, *tail):
                    check_block(path, a - start, b - start, got, probed, values.dtype)
                    got = values.apply(path, got, a - start)
                out[a - lo : b - lo] = got  # unchecked, a widening cast into the files' common dtype
            start += n
        return out


@dataclass(frozen=True, slots=True)
class Values:
    """How each file's values become the array's: cast to ``dtype``, each value checked
    first where the cast could change it (``checked``), and NaN/inf raised or filled
    (``nan``). Applied in the task that reads the values, before they go anywhere."""

    dtype: np.dtype
    checked: bool
    nan: str | None
    fill_value: float = 0.0

    @property
    def needed(self) -> bool:
        """Whether reading needs this at all (else the blocks' own widening cast does)."""
        return self.checked or self.nan in ("raise", "fill")

    def apply(self, path: str, a: np.ndarray, first_row: int | None = None) -> np.ndarray:
        """``a`` (a file's array, or its rows from ``first_row``) in ``dtype``.

        Raises
        ------
        InvalidValueError
            Under ``nan="raise"``, for NaN or inf, naming the file and the index.
        LoaderError
            For a value ``dtype`` cannot hold, naming the file, the index, the value and
            what it would become.
        """
        from pipeline.errors import InvalidValueError

        def where(index: np.ndarray) -> str:
            at = tuple(int(i) for i in index)
            if first_row is not None and at:
                at = (at[0] + first_row, *at[1:])
            return f"index {at}" if at else "its one value"

        if self.nan in ("raise", "fill") and a.dtype.kind in "fc":
            bad = ~np.isfinite(a)
            if bad.any():
                if self.nan == "raise":
                    raise InvalidValueError(path, f"NaN or inf at {where(np.argwhere(bad)[0])}; pass nan='fill' to "
                                            "replace them with fill_value, or leave nan unset to keep them")
                a = np.where(bad, a.dtype.type(self.fill_value), a)
        if a.dtype == self.dtype:
            return a
        rule = _cast_rule(a.dtype, self.dtype)
        if rule == "refused":  # every probed dtype was accepted when the array was built
            raise LoaderError(path, f"read as {a.dtype}, which dtype={self.dtype.name!r} cannot hold "
                              f"({_refusal(a.dtype, self.dtype)}): the file changed since the array was built; "
                              "build it again (pipeline.load) from the files as they are now")
        if rule == "values":
            changed = changed_values(a, self.dtype)
            if changed.any():
                index = np.argwhere(changed)[0]
                value = a[tuple(index)]
                with np.errstate(over="ignore", invalid="ignore"):
                    became = value.astype(self.dtype)
                raise LoaderError(path, f"holds {value.item()!r} at {where(index)}, which dtype={self.dtype.name!r} "
                                  f"cannot hold (it would read as {became.item()!r}); choose a dtype that holds the "
                                  f"file's values (its own is {a.dtype})")
        return a.astype(self.dtype)


#: dtype kinds of text: unicode, bytes, and numpy 2's variable-width StringDType.
_TEXT_KINDS = "UST"


def _mantissa_bits(dtype: np.dtype) -> int:
    """Bits of integer a float (or a complex number's parts) holds exactly: 2**53 for float64."""
    return int(np.finfo(dtype).nmant) + 1


def holds_exactly(src: np.dtype, dst: np.dtype) -> bool:
    """Whether every value of dtype ``src`` is exactly a value of ``dst``.

    numpy's ``can_cast(..., "safe")`` counts int64 in float64 as safe; it is not for
    integers beyond 2**53 (nanosecond timestamps), which float64 rounds.
    """
    src, dst = np.dtype(src), np.dtype(dst)
    if src == dst:
        return True
    if not np.can_cast(src, dst, "safe"):
        return False
    if src.kind in "iu" and dst.kind in "fc":
        return src.itemsize * 8 - (src.kind == "i") <= _mantissa_bits(dst)
    return True


@functools.lru_cache(maxsize=256)
def _cast_rule(src: np.dtype, dst: np.dtype) -> str:
    """How values of ``src`` are read as ``dst`` asked for by ``dtype=``: ``exact`` (every
    value is held), ``values`` (numbers that may not all fit: integers in a narrower
    integer, or in a float; floats in a narrower float, which round by design but must
    not overflow: each read is checked) or ``refused`` (no check makes it safe:
    fractions cut to integers, an imaginary part dropped, numbers made bools or text)."""
    if holds_exactly(src, dst):
        return "exact"
    ints, floats = "biu", "fc"
    if (src.kind in ints and dst.kind in "iu" + floats) or (src.kind == "f" and dst.kind in floats) \
            or (src.kind == "c" and dst.kind == "c"):
        return "values"
    return "refused"


def _refusal(src: np.dtype, dst: np.dtype) -> str:
    """Why a cast :func:`_cast_rule` refuses loses values, in a few words."""
    if src.kind in "fc" and dst.kind in "biu":
        return "fractions and NaN have no integer value; round them after loading (x.round().astype(...))"
    if src.kind == "c":
        return "the imaginary parts would be dropped"
    if dst.kind == "b":
        return "every value but 0 would become True"
    return "numpy has no cast between them that keeps the values"


def changed_values(a: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Where casting ``a`` to ``dtype`` changes a value: an integer out of an integer
    dtype's range (which would wrap: 300 as int8 is 44), an integer a float rounds
    (16,777,217 in float32), a finite float that overflows (to inf). A float rounded to
    a narrower float's precision is what that dtype means, and not counted.

    Returns
    -------
    numpy.ndarray
        A bool mask of ``a``'s shape.
    """
    dtype = np.dtype(dtype)
    if a.dtype.kind == "b":
        return np.zeros(a.shape, dtype=bool)
    if a.dtype.kind in "iu" and dtype.kind in "iu":
        info = np.iinfo(dtype)
        return (a < info.min) | (a > info.max)  # numpy 2 compares Python ints beyond a's range exactly
    with np.errstate(over="ignore", invalid="ignore"):
        if a.dtype.kind in "iu":
            part = np.finfo(dtype).dtype  # a complex dtype's parts
            cast = a.astype(part)
            src = np.iinfo(a.dtype)
            wide = cast.astype(np.float64)  # the bounds below are exact in float64
            ok = np.isfinite(cast) & (wide >= float(src.min)) & (wide < 2.0 ** (src.bits - (a.dtype.kind == "i")))
            back = np.where(ok, cast, 0).astype(a.dtype)
            return ~ok | (back != a)
        return np.isfinite(a) & ~np.isfinite(a.astype(dtype))


def checked_casts(dtypes: Mapping[str, np.dtype], dtype: np.dtype) -> bool:
    """Whether some file's values must be checked as read to be cast to ``dtype``
    (``dtype=``); refused up front when no check could make it safe.

    Raises
    ------
    LoaderError
        Naming the first file of a dtype :func:`_cast_rule` refuses, and why.
    """
    rules = {d: _cast_rule(d, dtype) for d in set(dtypes.values())}
    bad = next((p for p, d in dtypes.items() if rules[d] == "refused"), None)
    if bad is not None:
        raise LoaderError(bad, f"holds {dtypes[bad]} values, which dtype={dtype.name!r} cannot hold "
                          f"({_refusal(dtypes[bad], dtype)}); leave dtype unset to read them as they are")
    return "values" in rules.values()


def checked_dtype(dtype: Any) -> np.dtype | None:
    """``dtype=`` as a numpy dtype of numbers or bools (``None``: the files' own).

    Raises
    ------
    ConfigError
        Naming the option, for a name numpy does not know or a dtype of no numbers.
    """
    expected = "a numpy dtype of numbers, such as 'float32', 'float64', 'int64' or 'uint8'"
    if dtype is None:
        return None
    try:
        out = np.dtype(dtype)
    except (TypeError, ValueError):
        raise ConfigError("dtype", expected, dtype) from None
    if out.kind not in "biufc":
        raise ConfigError("dtype", expected, dtype)
    return out


def check_fill_value(fill_value: float, dtype: Any) -> None:
    """Refuse, before anything is read, a ``fill_value`` (what ``nan="fill"`` puts in
    place of NaN and inf) beyond the range of the float dtype it is put into: it would
    become inf, or be blamed on the file that held the NaN. Rounding to the dtype's
    precision (0.1 in float32) is not refused: that is the value the dtype holds
    nearest. Integer dtypes hold no NaN, so their fill is never used.

    Raises
    ------
    ConfigError
        Naming ``fill_value``, the dtype and its range.
    """
    from pipeline.errors import ConfigError

    dt = np.dtype(dtype)
    if dt.kind != "f":
        return
    top = float(np.finfo(dt).max)  # a Python float: no overflow warning comparing with it
    if np.isfinite(fill_value) and abs(float(fill_value)) > top:
        raise ConfigError("fill_value", f"a value {dt.name} holds (at most {top:.6g} in magnitude)", fill_value)


def refuse_opaque(dtypes: Mapping[str, np.dtype]) -> None:
    """Refuse files of raw bytes (numpy's void dtype without fields, such as ``V8``:
    what an opaque HDF5 type or ``np.void`` data reads as), naming the first: they hold
    no numbers, and zarr cannot store them, so a write would fail late, naming no file.

    Raises
    ------
    LoaderError
        For the first such file.
    """
    opaque = next((p for p, d in dtypes.items() if d.kind == "V" and d.names is None and d.subdtype is None), None)
    if opaque is not None:
        raise LoaderError(opaque, f"holds raw bytes (dtype {dtypes[opaque].str!r}, no fields): no numbers, and zarr "
                          "cannot store them; save them as uint8 with a trailing axis of their bytes")


def common_dtype(dtypes: Mapping[str, np.dtype]) -> np.dtype:
    """The dtype every file is read in: ``np.result_type`` of the files' dtypes, so
    that no file's values are cast into another file's narrower dtype, when it holds
    every file's values exactly (:func:`holds_exactly`).

    Raises
    ------
    LoaderError
        For strings beside numbers (numpy would silently turn the numbers into strings),
        dtypes numpy cannot promote to one (datetimes beside floats), or whose common
        dtype would round some values (int64 beside uint64 or float32 is float64, which
        rounds integers beyond 2**53), naming a file of each.
    """
    text = next((p for p, d in dtypes.items() if d.kind in _TEXT_KINDS), None)
    other = next((p for p, d in dtypes.items() if d.kind not in _TEXT_KINDS), None)
    if text is not None and other is not None:
        first, second = sorted((text, other), key=list(dtypes).index)
        raise LoaderError(first, f"holds {dtypes[first]} values, but {second} holds {dtypes[second]}: strings and "
                          "numbers cannot be combined (the numbers would become strings); read them separately")
    by_dtype = {d: p for p, d in reversed(list(dtypes.items()))}  # each distinct dtype's first file
    try:
        common = functools.reduce(np.result_type, by_dtype)  # pairwise: np.result_type takes at most 64
    except TypeError:
        pairs = [(a, b) for a in by_dtype for b in by_dtype if not _promotes(a, b)]
        first, second = sorted((by_dtype[pairs[0][0]], by_dtype[pairs[0][1]]), key=list(dtypes).index)
        raise LoaderError(first, f"holds {dtypes[first]} values, but {second} holds {dtypes[second]}, and numpy has "
                          "no common dtype for both; read them separately") from None
    lost = next((d for d in dtypes.values() if not holds_exactly(d, common)), None)  # the first file's first
    if lost is not None:
        _refuse_rounding(dtypes, by_dtype, lost, common)
    return common


def _refuse_rounding(dtypes: Mapping[str, np.dtype], by_dtype: Mapping[np.dtype, str], lost: np.dtype,
                     common: np.dtype) -> None:
    """Refuse files whose common dtype ``common`` would round the values of dtype
    ``lost``, naming a file of ``lost`` and one of a dtype that made the common dtype so.

    Raises
    ------
    LoaderError
        Always, with the ``dtype=`` choices that read them exactly or checked.
    """
    partner = next((d for d in by_dtype if d != lost and not holds_exactly(lost, np.result_type(lost, d))),
                   next(d for d in by_dtype if d != lost))
    first, second = sorted((by_dtype[lost], by_dtype[partner]), key=list(dtypes).index)
    choose = ("dtype='int64' or 'uint64' keeps every integer that fits it" if partner.kind in "biu" else
              f"dtype={common.name!r} reads them with each integer checked, one it would round refused")
    raise LoaderError(first, f"holds {dtypes[first]} values, but {second} holds {dtypes[second]}: their common "
                      f"dtype {common} holds integers exactly only up to 2**{_mantissa_bits(common)}, so larger "
                      f"{lost} values (nanosecond timestamps, ids) would be rounded silently; {choose} (values "
                      "checked as each block is read), or read the files separately")


def _promotes(a: np.dtype, b: np.dtype) -> bool:
    """Whether numpy has a common dtype for ``a`` and ``b``."""
    try:
        np.result_type(a, b)
    except TypeError:
        return False
    return True


def values_cut(shape: Sequence[int], target: Sequence[int]) -> int:
    """How many of an array's values fitting ``shape`` to ``target`` by zeros and cuts
    (``on_mismatch="crop"``: :func:`~pipeline.loaders.blocks.fit_shape`) drops: those
    past ``target`` along any axis, ``0`` for an array that fits inside it (``pad``
    fits to the largest shape, :func:`~pipeline.loaders.blocks.pad_shape`, and never cuts).

    ``shape`` is one that :func:`~pipeline.loaders.blocks.can_fit` accepts: a trailing
    axis of length 1 that one of them lacks is added or dropped first, as the fit does,
    and holds no value of its own.
    """
    shape, target = tuple(int(s) for s in shape), tuple(int(t) for t in target)
    if len(shape) < len(target):
        shape = (*shape, 1)
    elif len(shape) > len(target):
        shape = shape[:-1]
    kept = int(np.prod([min(s, t) for s, t in zip(shape, target)], dtype=np.int64))
    return int(np.prod(shape, dtype=np.int64)) - kept
