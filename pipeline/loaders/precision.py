"""Prices that float32 cannot hold: a cheap check of each part read in float32.

Tables are read in float32 by default (``source.dtype: float32``), which keeps about 7
significant digits: near 97,123.45 (a BTC-like book) the nearest float32 values are
0.0078125 apart, so a spread of one 0.01 tick is stored as 0.0078125 or 0.015625 and a
one-tick return is wrong by a fifth or more. Nothing fails: the data are silently wrong.
``source.dtype: float64`` reads the exact values (features and labels are computed from
them; the stored windows stay float32).

While a part is read in float32, :func:`check_prices` looks at its level-1 price column
in float64, before the cast: its distinct prices, sorted, lie a tick or more apart, and
when float32's resolution near two neighbouring ones (the gap ``np.spacing`` gives) is
more than an eighth of their distance, the ticks do not survive and a
:class:`PriceResolutionWarning` says so, naming the file, the column, that distance and
that resolution. Sorted prices rather than moves from row to row: a file of several
instruments interleaves their rows, and each instrument's prices keep their own grid at
their own magnitude. It costs a sort of one column's first :data:`CHECK_ROWS` rows, about
0.1 ms, a fraction of a percent of the part's read. Columns a Parquet file stores as
float32 (or float16) lose nothing and are not checked.

The read runs in a dask worker, whose warnings would stay in that worker's log (another
machine's, with a remote cluster). So a worker reports on an event topic of the
scheduler, and the client that built the source (:func:`arm`, when the lazy array is
made) turns the first report into a warning: once per client, which is once per
``pipeline run``. Without a distributed worker (dask's local schedulers) the warning is
raised where the part is read, once per source.

An integer column a float cannot hold exactly is refused where it is read
(:func:`~pipeline.loaders.tables.inexact_integers`); :func:`integer_hint` says what it
likely is and what to set: a vendor's "no value" sentinel (``source.missing``), a
timestamp read as a value (``source.columns`` leaves it out), a fixed-point price
(``source.scale``), or an id (``source.columns`` too).

Ticks that survive are not enough for class labels: a label computed from float32
prices differs from the exact one by up to about ``2 * 2**-24`` of ``1 + |label|``, and a
label that close to a class boundary (``alpha``, a threshold) can land in the other
class. Prices on a tick grid make such near-ties common. :func:`near_boundaries` finds
those labels among a build's label values (no pass over the data: the build has them),
and :func:`boundary_message` is the warning the build gives, with the fix.
"""

from __future__ import annotations

import re
import sys
import threading
import uuid
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from pipeline.errors import PriceResolutionWarning

__all__ = ["CHECK_ROWS", "LABEL_ROUNDING", "PRICE_COLUMNS", "TOPIC", "PriceGuard", "arm", "boundary_message",
           "check_prices", "epoch_reading", "integer_hint", "looks_like_price", "looks_like_time", "message",
           "near_boundaries", "pending", "price_columns", "resolution_problem"]

#: The level-1 price columns of an order book (LOBSTER's, the demo's, and those the
#: ``mid_price``, ``spread`` and ``book`` features read).
PRICE_COLUMNS = ("ask_price_1", "bid_price_1")

#: The scheduler's event topic a worker reports a part's lost ticks on.
TOPIC = "pipeline-price-resolution"

#: Rows of a part the check looks at, its first: prices a tick or a few apart show within
#: far fewer, every part is checked, and a run warns once; the sort then costs the same
#: for a part of any size (about 0.1 ms; 2.4 ms for 65,536 rows).
CHECK_ROWS = 1 << 12

#: Neighbouring prices must lie this many times float32's resolution apart: prices a few
#: resolutions apart are still stored off by up to half a resolution each.
_MARGIN = 8

#: How far, relative to ``1 + |label|``, rounding prices to float32 can move a mid-price
#: label (unscaled): each price moves by at most 2**-24 of itself, so does a mid price
#: or a mean of them (prices of one sign), and a ratio or a log difference of two of
#: them by at most twice that; the rest is room for float64's own rounding.
LABEL_ROUNDING = 2.5 * 2.0**-24


@dataclass(frozen=True, slots=True)
class PriceGuard:
    """What a part's read task needs to report lost ticks: ``run``, the source's id
    (each process reports once per source). Its dask token is constant, so a source's
    graph keys do not change from one opening to the next."""

    run: str

    def __dask_tokenize__(self) -> str:
        return "price-guard"


def price_columns(columns: Sequence[str]) -> tuple[str, ...]:
    """Of ``columns``, the one the check reads: the level-1 ask price, else the bid
    price, else the first whose name holds ``price`` (a trades feed's ``price``); none
    when no column is a price.

    One column is enough: both sides of a book move by the same tick at the same
    prices, and a second column would double the check's cost."""
    level1 = [c for c in PRICE_COLUMNS if c in columns]
    if level1:
        return (level1[0],)
    return tuple(c for c in columns if "price" in c.lower())[:1]


def resolution_problem(values: np.ndarray) -> tuple[float, float, float] | None:
    """``(smallest gap, resolution, largest |price|)`` when float32 cannot keep the
    prices ``values`` (float64, one column) apart, else ``None``.

    The prices are sorted and made distinct, and each neighbouring pair is compared with
    float32's resolution there (``np.spacing`` at the larger): float32 cannot keep them
    apart when the resolution is more than an eighth of their gap. Sorting, not the
    moves from row to row, makes this hold for a file of several instruments (their rows
    interleaved, BTC beside ETH): each instrument's prices lie on its own tick grid, at
    their own magnitude. NaN is left out; fewer than two distinct prices have no problem.
    """
    prices = np.unique(values[np.isfinite(values)])  # sorted and distinct
    if prices.size < 2:
        return None
    gap = np.diff(prices)
    resolution = np.spacing(np.maximum(np.abs(prices[1:]), np.abs(prices[:-1])).astype(np.float32))
    lost = gap < resolution.astype(np.float64) * _MARGIN
    if not lost.any():
        return None
    return float(gap[lost].min()), float(resolution[lost].max()), float(np.abs(prices).max())


def message(path: str, column: str, move: float, resolution: float, top: float) -> str:
    """The warning's text: the file, the column, the move and the resolution, and the fix."""
    return (f"{path}: column {column!r} holds prices as little as {move:.6g} apart, but float32 resolves only "
            f"{resolution:.6g} near them (prices up to {top:.10g}): read as float32 (source.dtype's default) their "
            "ticks are lost, and spreads and returns computed from them are wrong. Set source.dtype: float64 "
            "(the stored windows stay float32)")


#: Epoch nanoseconds of 1990-01-01 and 2050-01-01: an integer that is a date between them
#: in one of :data:`_EPOCH_UNITS` is taken for a time. Narrower than the dates a
#: timestamp column may hold (to 2100): Binance's ``update_id`` (about 3.9e12), read as
#: epoch ms, would be 2093. The units' ranges do not overlap (s about 6e8 to 2.5e9, ms
#: 6e11 to 2.5e12, and so on), so a value is a date in one unit at most.
_EPOCH_NS = (631_152_000 * 10**9, 2_524_608_000 * 10**9)
_EPOCH_UNITS = (("ns", 1), ("us", 10**3), ("ms", 10**6), ("s", 10**9))

def epoch_reading(value: int) -> tuple[str, str] | None:
    """``(unit, ISO time)`` when integer ``value`` is a date of 1990 to 2049 as epoch
    ns, us, ms or s (a timestamp), else ``None``."""
    lo, hi = _EPOCH_NS
    for unit, per in _EPOCH_UNITS:
        if lo <= int(value) * per < hi:
            return unit, str(np.datetime64(int(value), unit))
    return None


def _words(name: str) -> set[str]:
    return set(re.split(r"[^a-z0-9]+", name.lower()))


def looks_like_time(*names: str) -> bool:
    """Whether a column known by ``names`` (its canonical name, its name in the file) is
    named as a time is: ``ts_event``, ``local_timestamp``, ``transactTime``, ``date``."""
    return any("time" in n.lower() or _words(n) & {"ts", "date", "datetime"} for n in names)


def looks_like_price(*names: str) -> bool:
    """Whether a column known by ``names`` is named as a price is: ``ask_price_1``,
    Databento's ``bid_px_00``."""
    return any("price" in n.lower() or _words(n) & {"px", "prc"} for n in names)


def integer_hint(name: str, own: str, value: int, type_name: str, dtype: Any) -> str:
    """What to set for integer column ``name`` (``own``: its name in the file) whose
    ``value`` (of arrow type ``type_name``) ``dtype`` cannot hold exactly.

    The extreme of its type is a vendor's "no value" sentinel (``source.missing``). A
    column named as a time, or whose value is a plausible epoch date (when it is not
    named as a price), is a timestamp read only because every column is
    (``source.nan: drop``): ``source.columns`` leaves it out, and ``source.scale``,
    the fix for fixed-point prices, would make a time a feature. A price is a
    fixed-point one (``source.scale``); anything else may be an id (``source.columns``).
    ``source.dtype: float64`` is named only where it holds the value.
    """
    value = int(value)
    if value in (np.iinfo(np.int64).max, np.iinfo(np.int64).min, np.iinfo(np.uint64).max):
        return (f"{value} is the extreme {type_name}, a vendor's sentinel for no value (an empty level): list it "
                f"in source.missing ({{{name}: [{value}]}}; read as NaN, see source.nan)")
    leave_out = (f"if no feature or label reads {name!r}, leave it out: source.columns lists the columns read "
                 "(source.nan: drop reads every column unless source.columns names them)")
    scale = f"source.scale gives their unit ({{{name}: 1.0e-9}})"
    named_time, when = looks_like_time(name, own), epoch_reading(value)
    if not looks_like_price(name, own) and (named_time or when):
        seen = f" ({when[1]} as epoch {when[0]})" if when else ""
        hint = f"{name!r} looks like a timestamp{seen}, not a value to compute features from: {leave_out}"
        # A value alone may be a date by chance (an ETH price in units of 1e-9 is one in ms).
        return hint if named_time else f"{hint}; if they are fixed-point prices instead, {scale}"
    if abs(value) <= 2**53 and np.dtype(dtype) != np.float64:  # float64 holds it: float32 was asked for
        fix = "set source.dtype: float64 (exact up to 2**53)"
        return f"{fix}; if they are fixed-point prices, {scale}" if looks_like_price(name, own) else \
            f"{fix}; or, {leave_out}"
    fix = f"no float holds them exactly: if they are fixed-point prices, {scale}"
    return fix if looks_like_price(name, own) else f"{fix}; or, {leave_out}"


def near_boundaries(values: np.ndarray, boundaries: Sequence[float], scale: float = 1.0) -> np.ndarray:
    """Which labels computed from float32 prices may fall in another class than exact
    prices give.

    Parameters
    ----------
    values
        Unscaled mid-price label values (log returns, smoothed relative changes)
        computed in float64 from prices read as float32, any shape.
    boundaries
        The class boundaries, on the scaled value (``thresholds``; ``-alpha, alpha``).
    scale
        The label's ``scale``, applied before the boundaries are compared.

    Returns
    -------
    numpy.ndarray
        bool, the shape of ``values``: set where the scaled value lies within
        ``|scale| * LABEL_ROUNDING * (1 + |value|)`` of a boundary; exact prices give the
        same class everywhere else. NaN is not set.
    """
    v = np.asarray(values, dtype=np.float64)
    room = abs(scale) * LABEL_ROUNDING * (1.0 + np.abs(v))
    out = np.zeros(v.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        scaled = v * scale
        for b in boundaries:
            out |= np.abs(scaled - b) <= room
    return out


def boundary_message(near: int, total: int, boundaries: str) -> str:
    """The warning's text for labels near a class boundary: how many, of how many, the
    boundaries, and the fix."""
    return (f"labels: {near:,} of {total:,} labels lie within float32's rounding of a class boundary "
            f"({boundaries}): computed from prices read as float32 (source.dtype's default), each may be in "
            "another class than exact prices give. Set source.dtype: float64 for exact labels (the stored "
            "windows stay float32)")


#: Sources this process has reported on (a read task reports once per source).
_reported: set[str] = set()
_lock = threading.Lock()


def pending(guard: PriceGuard | None) -> bool:
    """Whether a part read under ``guard`` is to be checked: not when this process has
    reported on its source already (or there is no guard)."""
    return guard is not None and guard.run not in _reported


def check_prices(path: str, columns: Mapping[str, np.ndarray], guard: PriceGuard | None) -> None:
    """Warn (once per source and process) when a part's prices lose their ticks in float32.

    Parameters
    ----------
    path
        The part's file, for the message.
    columns
        ``{name: values}``: the part's price columns in float64, before the cast (their
        first :data:`CHECK_ROWS` rows are looked at).
    guard
        The source's :class:`PriceGuard`; ``None`` checks nothing.
    """
    if guard is None or guard.run in _reported:
        return
    for name, values in columns.items():
        found = resolution_problem(values[:CHECK_ROWS])
        if found is None:
            continue
        with _lock:
            if guard.run in _reported:
                return
            _reported.add(guard.run)
        _report(message(path, name, *found))
        return


def _report(text: str) -> None:
    """To the client that armed the source, through the scheduler, from a worker; as a
    warning here otherwise."""
    worker = None
    if "distributed" in sys.modules:  # a worker has it imported; nothing else needs it imported
        from distributed import get_worker

        try:
            worker = get_worker()
        except ValueError:  # not in a worker's task
            pass
    if worker is None:
        warnings.warn(text, PriceResolutionWarning, stacklevel=1)
    else:
        worker.log_event(TOPIC, {"message": text})


#: Clients already listening on :data:`TOPIC`.
_armed: "weakref.WeakSet[Any]" = weakref.WeakSet()


def arm() -> PriceGuard:
    """A new source's guard, with the current distributed client (if any) listening for
    its workers' reports: the first one this client hears becomes a warning here."""
    client = None
    if "distributed" in sys.modules:  # no client can exist without it
        from distributed import default_client

        try:
            client = default_client()
        except ValueError:  # no client
            pass
    if client is not None and client not in _armed:
        heard = threading.Event()

        def handler(event: tuple[float, Any]) -> None:
            _, msg = event
            if heard.is_set():
                return
            heard.set()
            text = msg.get("message", str(msg)) if isinstance(msg, dict) else str(msg)
            warnings.warn(text, PriceResolutionWarning, stacklevel=1)

        client.subscribe_topic(TOPIC, handler)
        _armed.add(client)
    return PriceGuard(uuid.uuid4().hex)
