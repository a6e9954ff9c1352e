"""Seeded synthetic Level-2 order-book data for the demo and the tests.

Parquet and CSV (``formats=("parquet", "csv")``): each trading day becomes one file of
timestamped snapshots named ``YYYY-MM-DD.parquet`` / ``.csv``: ``timestamp``, then
``bid_price_1..L``, ``bid_size_1..L``, ``ask_price_1..L``, ``ask_size_1..L`` (level 1 is
the best quote). The generator plants a weak, learnable signal: a slowly varying latent
order flow ``z`` tilts the book's size imbalance and the next step's mid-price return,
so a model trained on imbalance windows can beat the mean (the demo's losses fall).

LOBSTER (``formats=("lobster",)``): per instrument in ``spec.instruments`` and per day, a
headerless pair in LOBSTER's layout (see :mod:`pipeline.loaders.lobster`), named
``TICKER_YYYY-MM-DD_34200000_END_orderbook_L.csv`` and ``..._message_L.csv`` (END: the
last event in milliseconds after midnight, at least 57600000, 16:00):

- orderbook: per row and level ``i = 1..L``: ask price, ask size, bid price, bid size;
  prices are dollars times 10000 as integers. In a fraction ``spec.empty_level_rate``
  of the rows one side (ask or bid, at random) of the deepest level is empty: price
  ``+9999999999`` (ask) or ``-9999999999`` (bid), size 0;
- message: time (seconds after midnight with 9 decimals), event type (1 new order, 2
  partial cancel, 3 delete, 4 execution), order id, size, price (times 10000) and
  direction (1 buy, -1 sell). The messages are plausible but synthetic: they do not
  replay the book's changes.

Each instrument is seeded apart (by its ticker) and trades at its own price level
(20 to 500 dollars, from the ticker), so two instruments never hold the same data.
"""

from __future__ import annotations

import datetime as _dt
import os
import zlib
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from pipeline.errors import MissingDependencyError

__all__ = ["DemoSpec", "generate_day", "lobster_tables", "orderbook_columns", "price_level", "write_demo_data"]

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
    #: LOBSTER files: one pair per instrument and day.
    instruments: tuple[str, ...] = ("AAA", "BBB")
    #: Parquet and CSV: one folder per instrument of ``instruments``
    #: (``DIR/TICKER/YYYY-MM-DD.parquet``) instead of one instrument's files in ``DIR``.
    per_instrument: bool = False
    #: LOBSTER files: the fraction of rows whose deepest level is empty on one side (0
    #: keeps every row complete, so a demo runs with ``nan: raise``).
    empty_level_rate: float = 0.0


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


def _ticker_key(ticker: str) -> int:
    return zlib.crc32(ticker.encode("utf-8"))  # stable across runs, unlike hash()


def price_level(ticker: str | None) -> float:
    """The starting mid price of an instrument: 100 without a ticker, else 20 to 500
    dollars, fixed by the ticker."""
    if ticker is None:
        return 100.0
    return float(20 + _ticker_key(ticker) % 481)


def generate_day(day: int, spec: DemoSpec, instrument: str | None = None) -> dict[str, np.ndarray]:
    """One day of snapshots as a dict of column name -> numpy array.

    Parameters
    ----------
    day
        Day number from ``spec.start``; with ``spec.seed`` it seeds the generator, so a
        day's content does not depend on how many days are generated.
    spec
        Size and seed.
    instrument
        A ticker: seeds the generator apart from other tickers and sets the price level
        (:func:`price_level`). ``None`` is the single instrument of the Parquet and CSV
        demo.
    """
    seed = [spec.seed, day] if instrument is None else [spec.seed, day, _ticker_key(instrument)]
    rng = np.random.default_rng(seed)
    n = spec.rows_per_day
    start = np.datetime64(spec.start) + np.timedelta64(day, "D") + np.timedelta64(9 * 3600 + 1800, "s")
    gaps = rng.exponential(10e6, size=n).astype(np.int64) + 1_000_000  # >= 1 ms apart, ~11 ms mean
    timestamps = start.astype("datetime64[ns]") + np.cumsum(gaps).astype("timedelta64[ns]")

    flow = np.tanh(3.0 * _ewm(rng.standard_normal(n), alpha=0.02) / 0.1)  # latent order flow in (-1, 1)
    vol = 2e-5 * np.exp(0.5 * _ewm(rng.standard_normal(n), alpha=0.001) / 0.03)
    ret = vol * (0.3 * np.roll(flow, 1) + rng.standard_normal(n))
    ret[0] = 0.0
    scale = price_level(instrument) / 100.0
    mid = (100.0 + 10.0 * day / max(spec.days, 1)) * scale * np.exp(np.cumsum(ret))

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

    Parquet and CSV files are named ``YYYY-MM-DD.parquet`` / ``YYYY-MM-DD.csv`` so a
    sorted glob is in time order (in a folder per instrument with ``per_instrument``); LOBSTER pairs as the module docstring describes.
    Existing files with the same name are replaced.

    Returns
    -------
    list of str
        The paths written (for LOBSTER, each orderbook file then its message file).
    """
    try:
        import pyarrow as pa
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise MissingDependencyError("pipeline demo-data", "pyarrow", "tabular") from None
    unknown = set(spec.formats) - {"parquet", "csv", "lobster"}
    if unknown:
        raise ValueError(f"demo formats: expected parquet, csv and/or lobster, got {sorted(unknown)}")
    if not 0.0 <= spec.empty_level_rate <= 1.0:
        raise ValueError(f"demo empty_level_rate: expected a fraction in [0, 1], got {spec.empty_level_rate}")
    os.makedirs(directory, exist_ok=True)
    written: list[str] = []
    first = _dt.date.fromisoformat(spec.start)
    tables = [(None, os.fspath(directory))]
    if spec.per_instrument:
        tables = [(t, os.path.join(os.fspath(directory), t)) for t in spec.instruments]
    for day in range(spec.days):
        date = (first + _dt.timedelta(days=day)).isoformat()
        for ticker, folder in tables:
            if "parquet" not in spec.formats and "csv" not in spec.formats:
                break
            os.makedirs(folder, exist_ok=True)
            stem = os.path.join(folder, date)
            table = pa.table(generate_day(day, spec, instrument=ticker))
            if "parquet" in spec.formats:
                # Row groups of 128k rows: the loader maps each to a dask chunk of ~20 MB.
                pq.write_table(table, stem + ".parquet", row_group_size=131_072, compression="zstd")
                written.append(stem + ".parquet")
            if "csv" in spec.formats:
                pacsv.write_csv(table, stem + ".csv")
                written.append(stem + ".csv")
        if "lobster" in spec.formats:
            for ticker in spec.instruments:
                written += _write_lobster_day(os.fspath(directory), ticker, day, date, spec)
    return written


def lobster_tables(ticker: str, day: int, date: str,
                   spec: DemoSpec) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """One LOBSTER instrument-day as (orderbook, message) columns, integers as written.

    Built from :func:`generate_day` for ``ticker``; see the module docstring for the
    layout and the empty levels.
    """
    from pipeline.loaders.lobster import ASK_DUMMY, BID_DUMMY, PRICE_SCALE, book_columns

    cols = generate_day(day, spec, ticker)
    n, levels = spec.rows_per_day, spec.levels
    rng = np.random.default_rng([spec.seed, day, _ticker_key(ticker), 1])  # apart from the book's stream
    book: dict[str, np.ndarray] = {}
    for k in range(1, levels + 1):
        for side in ("ask", "bid"):
            book[f"{side}_price_{k}"] = np.rint(cols[f"{side}_price_{k}"] * PRICE_SCALE).astype(np.int64)
            book[f"{side}_size_{k}"] = cols[f"{side}_size_{k}"].astype(np.int64)
    empty = rng.random(n) < spec.empty_level_rate
    ask_side = rng.random(n) < 0.5
    for side, rows, dummy in (("ask", empty & ask_side, ASK_DUMMY), ("bid", empty & ~ask_side, BID_DUMMY)):
        book[f"{side}_price_{levels}"][rows] = dummy
        book[f"{side}_size_{levels}"][rows] = 0
    book = {c: book[c] for c in book_columns(levels)}

    midnight = np.datetime64(date, "ns")
    direction = np.where(rng.random(n) < 0.5, 1, -1).astype(np.int64)
    message = {
        "time_ns": (cols["timestamp"] - midnight).astype(np.int64),
        "event": rng.choice(np.array([1, 2, 3, 4], dtype=np.int64), size=n, p=[0.5, 0.1, 0.3, 0.1]),
        "order_id": (10_000_000 * (day + 1) + np.arange(n)).astype(np.int64),
        "size": rng.integers(1, 500, size=n, dtype=np.int64),
        "price": np.where(direction == 1, book["bid_price_1"], book["ask_price_1"]),
        "direction": direction,
    }
    return book, message


def _write_lobster_day(directory: str, ticker: str, day: int, date: str, spec: DemoSpec) -> list[str]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    book, message = lobster_tables(ticker, day, date, spec)
    ns = message.pop("time_ns")
    # Seconds after midnight with exactly 9 decimals, as text: a float would round them.
    time = pc.binary_join_element_wise(pa.array(ns // 1_000_000_000).cast(pa.string()),
                                       pc.utf8_lpad(pa.array(ns % 1_000_000_000).cast(pa.string()), 9, "0"), ".")
    end_ms = max(57_600_000, int(-(-int(ns[-1]) // 1_000_000))) if ns.size else 57_600_000
    stem = os.path.join(directory, f"{ticker}_{date}_34200000_{end_ms}")
    options = pacsv.WriteOptions(include_header=False, quoting_style="none")
    paths = [f"{stem}_orderbook_{spec.levels}.csv", f"{stem}_message_{spec.levels}.csv"]
    pacsv.write_csv(pa.table(book), paths[0], write_options=options)
    pacsv.write_csv(pa.table({"time": time, **message}), paths[1], write_options=options)
    return paths


def reference_columns(spec: DemoSpec) -> Sequence[str]:
    """All numeric columns of a demo file, in order (for configs and tests)."""
    return orderbook_columns(spec.levels)
