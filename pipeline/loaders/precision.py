"""Prices that float32 cannot hold: a cheap check of each part read in float32.

Tables are read in float32 by default (``source.dtype: float32``), which keeps about 7
significant digits: near 97,123.45 (a BTC-like book) the nearest float32 values are
0.0078125 apart, so a spread of one 0.01 tick is stored as 0.0078125 or 0.015625 and a
one-tick return is wrong by a fifth or more. Nothing fails: the data are silently wrong.
``source.dtype: float64`` reads the exact values (features and labels are computed from
them; the stored windows stay float32).

While a part is read in float32, :func:`check_prices` looks at its level-1 price column
in float64, before the cast: when float32's resolution at the largest price (the gap
``np.spacing`` gives) is more than an eighth of the smallest nonzero move between
consecutive rows, the ticks do not survive and a :class:`PriceResolutionWarning` says so,
naming the file, the column, that move and that resolution. It costs a maximum, a
difference and two comparisons over one column's first :data:`CHECK_ROWS` rows: a
fraction of a percent of the part's read. Columns a Parquet file stores as float32 (or float16) lose nothing and are not
checked.

The read runs in a dask worker, whose warnings would stay in that worker's log (another
machine's, with a remote cluster). So a worker reports on an event topic of the
scheduler, and the client that built the source (:func:`arm`, when the lazy array is
made) turns the first report into a warning: once per client, which is once per
``pipeline run``. Without a distributed worker (dask's local schedulers) the warning is
raised where the part is read, once per source.
"""

from __future__ import annotations

import sys
import threading
import uuid
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from pipeline.errors import PriceResolutionWarning

__all__ = ["CHECK_ROWS", "PRICE_COLUMNS", "TOPIC", "PriceGuard", "arm", "check_prices",
           "message", "pending", "price_columns", "resolution_problem"]

#: The level-1 price columns of an order book (LOBSTER's, the demo's, and those the
#: ``mid_price``, ``spread`` and ``book`` features read).
PRICE_COLUMNS = ("ask_price_1", "bid_price_1")

#: The scheduler's event topic a worker reports a part's lost ticks on.
TOPIC = "pipeline-price-resolution"

#: Rows of a part the check looks at, its first: a book's smallest move (a tick) shows
#: within far fewer, every part is checked, and a run warns once; the check then costs
#: the same for a part of any size.
CHECK_ROWS = 1 << 16

#: The smallest move must be this many times float32's resolution at the largest price:
#: a move of a few resolutions is still stored off by up to half a resolution each side.
_MARGIN = 8


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
    """``(smallest move, resolution, largest |price|)`` when float32 cannot keep the
    moves of ``values`` (float64, one column in row order), else ``None``.

    The smallest move is the smallest nonzero absolute difference of consecutive values
    (NaN left out); the resolution is ``np.spacing(np.float32(max |value|))``; float32
    cannot keep the moves when the resolution is more than an eighth of that move. A
    column that never moves, or holds fewer than two finite values, has no problem.
    """
    if values.size < 2:
        return None
    # fmax and fmin skip NaN (a gap in the quotes) without nanmax's copy.
    top = max(float(np.fmax.reduce(values)), -float(np.fmin.reduce(values)))
    if not np.isfinite(top):
        return None
    resolution = float(np.spacing(np.float32(top)))
    step = np.diff(values)
    np.abs(step, out=step)
    # Only whether some move is that small, in two comparisons: the smallest one is
    # looked for only then (a masked minimum cost ten times as much). NaN compares false.
    small = step < resolution * _MARGIN
    small &= step > 0
    if not small.any():
        return None
    return float(step[small].min()), resolution, top


def message(path: str, column: str, move: float, resolution: float, top: float) -> str:
    """The warning's text: the file, the column, the move and the resolution, and the fix."""
    return (f"{path}: column {column!r} moves by as little as {move:.6g} between rows, but float32 resolves only "
            f"{resolution:.6g} near its prices (up to {top:.10g}): read as float32 (source.dtype's default) its "
            "ticks are lost, and spreads and returns computed from it are wrong. Set source.dtype: float64 "
            "(the stored windows stay float32)")


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
