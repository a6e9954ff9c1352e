"""Vendor conventions in table values: fixed-point integer prices and "no value" sentinels.

Feeds store prices as integers in a fixed unit (Databento MBP-10: int64 in units of
1e-9; many exchange dumps: 1e-4 or 1e-8) and mark an empty book level with a sentinel
(the largest int64, or -1). LOBSTER's conventions are built into its loader; for CSV and
Parquet the config states them:

- ``source.scale: {column or glob: factor}``: an integer column's values times
  ``factor``, computed exactly in float64 (as a division by ``1 / factor`` when that is a
  whole number, which gives the correctly rounded quotient, as LOBSTER's prices / 10,000
  are) before any cast to float32. A floating-point column with fractions matched by a
  scale is refused: it is in units already, and scaling it (a day a vendor re-exported
  in dollars) would be wrong silently.
- ``source.missing: [values]`` (every column read) or ``{column or glob: [values]}``:
  values that mean "no value", read as NaN, so that ``source.nan`` (raise, drop, fill)
  decides what happens to them. Compared in the column's own type, before any scale.

Patterns are :mod:`fnmatch` globs matching a column's canonical name (after ``rename``)
or its name in the file, so that the vendor's own names (``*_px_*``) reach renamed
columns too. Floats that are all whole numbers count as fixed-point integers (pandas
stores an integer column with a missing value as floats).
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pipeline.errors import ConfigError, LoaderError

__all__ = ["ValueRules", "convert_column"]


@dataclass(frozen=True, slots=True)
class ValueRules:
    """Scales and sentinels by column pattern, first match wins (see the module doc).

    Attributes
    ----------
    scale
        ``((pattern, factor), ...)``.
    missing
        ``((pattern, (value, ...)), ...)``.
    """

    scale: tuple[tuple[str, float], ...] = ()
    missing: tuple[tuple[str, tuple[int | float, ...]], ...] = ()

    @classmethod
    def from_options(cls, scale: Mapping[str, Any] | None, missing: Any, path: str = "source") -> "ValueRules":
        """The rules of ``source.scale`` and ``source.missing``, validated.

        Raises
        ------
        ConfigError
            Naming the key: a factor that is not a positive finite number, a sentinel
            that is not a number, or a float one past 2**53 (write the integer).
        """
        scales = []
        if scale is not None:
            if not isinstance(scale, Mapping):
                raise ConfigError(f"{path}.scale", "a mapping of column name (or glob) to a factor, e.g. "
                                  "{'*_price_*': 1.0e-9}", scale)
            for pattern, factor in scale.items():
                if (not isinstance(pattern, str) or not pattern or isinstance(factor, bool)
                        or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0):
                    raise ConfigError(f"{path}.scale.{pattern}", "a positive number (the unit of the integers, "
                                      "e.g. 1.0e-9)", factor)
                scales.append((pattern, float(factor)))
        return cls(scale=tuple(scales), missing=_missing_rules(missing, f"{path}.missing"))

    def __bool__(self) -> bool:
        return bool(self.scale or self.missing)

    def factor_of(self, *names: str) -> float | None:
        """The scale of a column known by ``names`` (its canonical name, its name in the
        file), or ``None``."""
        return next((f for p, f in self.scale if any(fnmatch.fnmatchcase(n, p) for n in names)), None)

    def sentinels_of(self, *names: str) -> tuple[int | float, ...]:
        """The values read as NaN in a column known by ``names``."""
        return next((v for p, v in self.missing if any(fnmatch.fnmatchcase(n, p) for n in names)), ())


def _missing_rules(missing: Any, path: str) -> tuple[tuple[str, tuple[int | float, ...]], ...]:
    if missing is None:
        return ()
    if not isinstance(missing, Mapping):
        missing = {"*": missing}
    rules = []
    for pattern, values in missing.items():
        values = [values] if isinstance(values, (int, float)) and not isinstance(values, bool) else values
        if (not isinstance(pattern, str) or not pattern or not isinstance(values, (list, tuple)) or not values
                or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values)):
            raise ConfigError(path if pattern == "*" else f"{path}.{pattern}",
                              "a list of numbers that mean 'no value' (e.g. [9223372036854775807, -1]), or a "
                              "mapping of column name (or glob) to such a list", values)
        for v in values:
            _check_float_sentinel(v, path if pattern == "*" else f"{path}.{pattern}")
        rules.append((pattern, tuple(values)))
    return tuple(rules)


def _check_float_sentinel(value: int | float, path: str) -> None:
    """Refuse a float sentinel past 2**53 that stands for an integer of an int64 or
    uint64 column (up to 2**64): YAML reads ``9.223372036854775807e18`` (INT64_MAX copied
    from a spec) as a float, which is 2**63, so it would never match the column's
    INT64_MAX, and the loader would then advise listing what the user did list. The
    integer, written out, matches an integer column and a float one alike. Larger floats
    (DBL_MAX) are no column's integer: a float column's own sentinels, taken as they are.

    Raises
    ------
    ConfigError
        Naming the key, the integer the float is, and the integer to write instead.
    """
    if not isinstance(value, float) or not 2**53 < abs(value) <= 2**64:
        return
    exact = int(value)
    if exact == 2**63:
        meant = (f"{exact} (2**63), not {2**63 - 1} (INT64_MAX, an empty level's price): past 2**53 a float skips "
                 f"integers; write the sentinel as an integer ({2**63 - 1})")
    else:
        meant = f"{exact}: past 2**53 a float skips integers; write the sentinel as an integer"
    raise ConfigError(path, "", detail=f"the float {value!r} is {meant}, without a decimal point or exponent")


def convert_column(col: Any, name: str, rules: ValueRules, path: str, source: str | None = None,
                   where: Callable[[int], str] | None = None) -> Any | None:
    """Column ``name`` (a pyarrow array; ``source``, its name in the file) with ``rules``
    applied: sentinels made null, then an integer column scaled exactly to float64;
    ``None`` when no rule applies. Floats that are all whole numbers are fixed-point
    integers a writer stored as floats (pandas does, for a column with a missing value)
    and are scaled too. ``where(i)`` tells where the column's row ``i`` is in the file
    (``line 7``, ``row 3 of row group 0``), for a refusal.

    Raises
    ------
    LoaderError
        Naming the file and column: a scale on floats with fractions (in units already),
        or on integers past 2**53 (float64 would round them), naming the first such
        value and its row.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    names = (name,) if source in (None, name) else (name, source)
    sentinels, factor = rules.sentinels_of(*names), rules.factor_of(*names)
    if not sentinels and factor is None:
        return None
    if sentinels:
        fits = [v for v in sentinels if _fits(v, col.type)]
        if fits:
            # A comparison per sentinel (one or two): a seventh of is_in's time.
            found = None
            for value in fits:
                typed = pa.scalar(value if pa.types.is_integer(col.type) else float(value), col.type)
                same = pc.equal(col, typed)
                found = same if found is None else pc.or_(found, same)
            if pc.any(found).as_py():  # most columns hold none: no copy for them
                col = pc.if_else(found, pa.scalar(None, col.type), col)
    if factor is None:
        return col
    low, high = (v.as_py() for v in pc.min_max(col).values())  # nulls for a column of none
    big = None if low is None else max(abs(low), abs(high))
    if big is not None and big > 2**53:
        raise _past_exact(col, names, rules, path, where)
    values = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
    if not pa.types.is_integer(col.type):
        finite = values[np.isfinite(values)]
        if not np.array_equal(finite, np.round(finite)):
            raise LoaderError(path, f"column {name!r} holds {col.type} values with fractions, but source.scale gives "
                              f"it a factor of {factor:g}: a scale is for fixed-point integers; this file's column "
                              "is in units already (convert it, or read it apart)")
    inverse = 1.0 / factor
    if inverse >= 1 and abs(inverse - round(inverse)) <= 1e-9 * inverse:
        return values / float(round(inverse))  # one rounding, as prices / 10,000
    return values * factor


def _past_exact(col: Any, names: tuple[str, ...], rules: ValueRules, path: str,
                where: Callable[[int], str] | None) -> LoaderError:
    """The refusal of a scaled column holding an integer past 2**53 (``names``: its
    canonical name, then its name in the file): its first such value and row, and the
    ``source.missing`` rule that reads it as NaN, under the pattern its scale matched,
    which reaches the same columns (every level's ``*_px_*``)."""
    import pyarrow.compute as pc

    values = np.asarray(pc.fill_null(col, 0).to_numpy(zero_copy_only=False))
    # Compared without abs(): the smallest int64 has no positive twin.
    r = int(np.flatnonzero((values > 2**53) | (values < -(2**53)))[0])
    value = col[r].as_py()
    value = int(value) if float(value).is_integer() else value  # floats of whole numbers: shown as integers
    pattern = next(p for p, _ in rules.scale if any(fnmatch.fnmatchcase(n, p) for n in names))
    key = f'"{pattern}"' if any(c in pattern for c in "*?[") else pattern  # a YAML alias otherwise
    own = f" (the file's {names[1]!r})" if len(names) > 1 else ""
    at = f" at {where(r)}" if where is not None else ""
    return LoaderError(path, f"column {names[0]!r}{own}: the integer {value}{at} is past 2**53, where float64 "
                       f"rounds; if it means 'no value' (an empty level), list it in source.missing "
                       f"({{{key}: [{value}]}}; read as NaN, see source.nan)")


def _fits(value: int | float, arrow_type: Any) -> bool:
    """Whether ``value`` is a value of ``arrow_type`` (a sentinel past an int32 column's
    range cannot occur in it)."""
    import pyarrow as pa

    if pa.types.is_integer(arrow_type):
        if not float(value).is_integer():
            return False
        info = np.iinfo(arrow_type.to_pandas_dtype())
        return info.min <= int(value) <= info.max
    return pa.types.is_floating(arrow_type)


def check_rules(rules: ValueRules, parts: Sequence[Any], columns: Sequence[str]) -> None:
    """Refuse, at open, rules a source cannot take: LOBSTER and FI-2010 have their own
    units, and a pattern that matches no column (by its canonical name or its name in
    the file) is most likely a typo. (A Parquet day whose prices are in units beside
    fixed-point days is refused at open by
    :func:`~pipeline.loaders.tables.check_units`; a column with fractions under a scale,
    when read, by :func:`convert_column`.)

    Raises
    ------
    LoaderError
        Naming the file and the pattern.
    """
    if not rules:
        return
    first = parts[0]
    if first.fmt in ("lobster", "fi2010"):
        raise LoaderError(first.path, f"source.scale and source.missing are for CSV and Parquet files; {first.fmt} "
                          "files have their units and empty levels built in")
    names = list(columns) + [first.source_of(c) for c in columns if first.source_of(c) != c]
    for pattern in [p for p, _ in rules.scale] + [p for p, _ in rules.missing if p != "*"]:
        if not any(fnmatch.fnmatchcase(c, pattern) for c in names):
            raise LoaderError(first.path, f"source.scale / source.missing name {pattern!r}, which matches no "
                              f"column (columns: {', '.join(names)})")
