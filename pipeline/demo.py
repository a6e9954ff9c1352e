"""Seeded synthetic Level-2 order-book data for the demo and the tests.

Each trading day becomes one file of timestamped snapshots: ``timestamp``, then
``bid_price_1..L``, ``bid_size_1..L``, ``ask_price_1..L``, ``ask_size_1..L`` (level 1 is
the best quote). The generator plants a weak, learnable signal: a slowly varying latent
order flow ``z`` tilts the book's size imbalance and the next step's mid-price return,
so a model trained on imbalance windows can beat the mean (the demo's losses fall).
"""

from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pipeline.errors import MissingDependencyError

__all__ = ["DemoSpec", "generate_day", "orderbook_columns", "write_demo_data"]

TICK = 0.01


@dataclass(frozen=True, slots=True)
class DemoSpec:
    """Size and shape of the synthetic data set."""

    days: int = 5
    rows_per_day: int = 400_000
    levels: int = 10
    seed: int = 0
    start: str = "2026-01-05"
    formats: tuple[str, ...] = ("parquet", "csv")


def orderbook_columns(levels: int = 10) -> list[str]:
    """Column names of the price and size columns, in file order."""
    cols: list[str] = []
    for side in ("bid", "ask"):
        cols += [f"{side}_price_{k}" for k in range(1, levels + 1)]
        cols += [f"{side}_size_{k}" for k in range(1, levels + 1)]
    return cols


def _ewm(noise: np.ndarray, alpha: float) -> np.ndarray:
    """AR(1)-like smoothing ``y_t = (1-alpha) y_{t-1} + alpha x_t`` without a Python loop.

    Done blockwise with a closed form so a day of a few hundred thousand rows takes
    milliseconds: inside a block, ``y_t = d^t (y_0 + sum_{j<=t} alpha x_j d^{-j})``.
    """
    decay = 1.0 - alpha
    out = np.empty_like(noise)
    carry = 0.0
    block = 512  # keeps d^-j within float64 range for alpha up to ~0.5
    for start in range(0, noise.size, block):
        x = noise[start : start + block]
        j = np.arange(1, x.size + 1, dtype=np.float64)
        pw = decay**j
        y = pw * (carry + np.cumsum(alpha * x / pw))
        out[start : start + x.size] = y
        carry = y[-1]
    return out


def generate_day(day: int, spec: DemoSpec) -> dict[str, np.ndarray]:
    """One day of snapshots as a dict of column name -> numpy array.

    Parameters
    ----------
    day
        Day number from ``spec.start``; with ``spec.seed`` it seeds the generator, so a
        day's content does not depend on how many days are generated.
    spec
        Size and seed.
    """
    rng = np.random.default_rng([spec.seed, day])
    n = spec.rows_per_day
    start = np.datetime64(spec.start) + np.timedelta64(day, "D") + np.timedelta64(9 * 3600 + 1800, "s")
    gaps = rng.exponential(10e6, size=n).astype(np.int64) + 1_000_000  # >= 1 ms apart, ~11 ms mean
    timestamps = start.astype("datetime64[ns]") + np.cumsum(gaps).astype("timedelta64[ns]")

    flow = np.tanh(3.0 * _ewm(rng.standard_normal(n), alpha=0.02) / 0.1)  # latent order flow in (-1, 1)
    vol = 2e-5 * np.exp(0.5 * _ewm(rng.standard_normal(n), alpha=0.001) / 0.03)
    ret = vol * (0.3 * np.roll(flow, 1) + rng.standard_normal(n))
    ret[0] = 0.0
    mid = (100.0 + 10.0 * day / max(spec.days, 1)) * np.exp(np.cumsum(ret))

    spread_ticks = 1 + rng.poisson(0.6, size=n)
    bid1 = np.floor((mid - spread_ticks * TICK / 2) / TICK) * TICK
    ask1 = bid1 + spread_ticks * TICK

    cols: dict[str, np.ndarray] = {"timestamp": timestamps}
    levels = spec.levels
    depth = np.arange(levels, dtype=np.float64)
    # Occasional empty price levels widen the ladder, as in real books.
    gaps_b = np.cumsum(1 + (rng.random((n, levels)) < 0.1), axis=1) - 1
    gaps_a = np.cumsum(1 + (rng.random((n, levels)) < 0.1), axis=1) - 1
    base = rng.lognormal(mean=4.0, sigma=0.6, size=(n, 2 * levels)) * (1.0 + 0.15 * depth.repeat(2)[None, :])
    tilt = 1.0 + 0.6 * flow
    bid_sizes = np.maximum(1, base[:, :levels] * tilt[:, None]).astype(np.int32)
    ask_sizes = np.maximum(1, base[:, levels:] * (2.0 - tilt)[:, None]).astype(np.int32)
    bid_prices = np.round(bid1[:, None] - gaps_b * TICK, 2)
    ask_prices = np.round(ask1[:, None] + gaps_a * TICK, 2)
    for side, prices, sizes in (("bid", bid_prices, bid_sizes), ("ask", ask_prices, ask_sizes)):
        for k in range(levels):
            cols[f"{side}_price_{k + 1}"] = prices[:, k]
        for k in range(levels):
            cols[f"{side}_size_{k + 1}"] = sizes[:, k]
    return cols


def write_demo_data(directory: str | os.PathLike[str], spec: DemoSpec = DemoSpec()) -> list[str]:
    """Write ``spec.days`` daily files per format into ``directory``.

    Files are named ``YYYY-MM-DD.parquet`` / ``YYYY-MM-DD.csv`` so a sorted glob is in
    time order. Existing files with the same name are replaced.

    Returns
    -------
    list of str
        The paths written.
    """
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise MissingDependencyError("pipeline demo-data", "pyarrow", "tabular") from None
    unknown = set(spec.formats) - {"parquet", "csv"}
    if unknown:
        raise ValueError(f"demo formats: expected parquet and/or csv, got {sorted(unknown)}")
    os.makedirs(directory, exist_ok=True)
    written: list[str] = []
    first = _dt.date.fromisoformat(spec.start)
    for day in range(spec.days):
        table = pa.table(generate_day(day, spec))
        stem = os.path.join(os.fspath(directory), (first + _dt.timedelta(days=day)).isoformat())
        if "parquet" in spec.formats:
            # Row groups of 128k rows: the loader maps each to a dask chunk of ~20 MB.
            pq.write_table(table, stem + ".parquet", row_group_size=131_072, compression="zstd")
            written.append(stem + ".parquet")
        if "csv" in spec.formats:
            pacsv.write_csv(table, stem + ".csv")
            written.append(stem + ".csv")
    return written


def reference_columns(spec: DemoSpec) -> Sequence[str]:
    """All numeric columns of a demo file, in order (for configs and tests)."""
    return orderbook_columns(spec.levels)
