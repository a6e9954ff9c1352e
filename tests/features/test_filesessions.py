"""Sessions of an array read with an instrument column: rows of several instruments
interleaved in time are refused (never windowed as one series), and the segment-ordered
source keeps them apart; windows checked against numpy slicing of the rows pandas reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline.errors import WindowError
from pipeline.features import build_training_set, windows
from pipeline.features.specs import FeatureSpec, LabelSpec
from pipeline.loaders import open_source
from pipeline.loaders.segments import open_segmented

COLUMNS = ["bid_price_1", "ask_price_1"]


def _book(path: Path, symbols: list[str], n: int = 40, seed: int = 0) -> pd.DataFrame:
    """A Parquet file of ``symbols`` interleaved in time (ES near 4770, NQ near 16850, as
    a vendor's MBP file of several instruments stores them); the frame written."""
    rng = np.random.default_rng(seed)
    level = {"ES": 4770.0, "NQ": 16850.0}
    sym = np.array(symbols)[rng.integers(0, len(symbols), n)]
    bid = np.array([level[s] for s in sym]) + rng.integers(0, 8, n) * 0.25
    ts = pd.Timestamp("2024-01-02 14:30") + pd.to_timedelta(np.arange(n) * 10 + seed * 1000, unit="ms")
    frame = pd.DataFrame({"ts": ts.as_unit("ns"), "symbol": sym, "bid_price_1": bid, "ask_price_1": bid + 0.25})
    frame.to_parquet(path, index=False)
    return frame


def _sliding(rows: np.ndarray, size: int) -> np.ndarray:
    """Every window of ``size`` consecutive rows, by numpy slicing."""
    return np.stack([rows[e - size + 1:e + 1] for e in range(size - 1, len(rows))])


def test_windows_over_interleaved_instruments_are_refused_naming_file_and_instruments(tmp_path):
    path = tmp_path / "glbx-mdp3-20240102.mbp-10.parquet"
    _book(path, ["ES", "NQ"])
    x = open_source(str(path), columns=COLUMNS, timestamp="ts", instrument_column="symbol").array
    # What the refusal prevents: windows whose rows jump between ES and NQ (pandas' rows).
    rows = pd.read_parquet(path)[COLUMNS].to_numpy()
    assert (np.abs(np.diff(_sliding(rows, 4)[..., 0], axis=1)).max(axis=1) > 1000).any()
    for derived in (x, x * 2, x[:, :1], x[:20]):
        with pytest.raises(WindowError, match=rf"2 instruments \(ES, NQ\) read from {path}.*open_segmented"
                                              r".*sessions=seg\.segments\.stops - seg\.segments\.starts"):
            windows(derived, size=4)


def test_several_files_of_interleaved_instruments_are_refused_with_sessions_file_too(tmp_path):
    paths = [tmp_path / f"day{k}.parquet" for k in range(2)]
    for k, p in enumerate(paths):
        _book(p, ["ES", "NQ"], seed=k)
    x = open_source([str(p) for p in paths], columns=COLUMNS, timestamp="ts", instrument_column="symbol").array
    for sessions in (None, "file"):
        with pytest.raises(WindowError, match=rf"read from 2 files \(the first {paths[0]}\)"):
            windows(x, size=4, sessions=sessions)


def test_build_training_set_refuses_interleaved_instruments_without_segments(tmp_path):
    path = tmp_path / "mix.parquet"
    _book(path, ["ES", "NQ"])
    src = open_source(str(path), columns=COLUMNS, timestamp="ts", instrument_column="symbol")
    with pytest.raises(WindowError, match=r"2 instruments \(ES, NQ\).*segments=seg\.segments"):
        build_training_set(src.array, columns=src.columns, features=[FeatureSpec("mid_price")], size=4,
                           label=LabelSpec(kind="return", horizon=1), normalize="none", timestamps=src.timestamps)


def test_sessions_none_or_rows_window_the_rows_as_they_are(tmp_path):
    """The deliberate opt-outs: the rows in file order, as numpy slices them."""
    path = tmp_path / "mix.parquet"
    _book(path, ["ES", "NQ"])
    x = open_source(str(path), columns=COLUMNS, timestamp="ts", instrument_column="symbol", dtype="float64").array
    rows = pd.read_parquet(path)[COLUMNS].to_numpy()
    np.testing.assert_array_equal(windows(x, size=4, sessions="none").compute(), _sliding(rows, 4))
    np.testing.assert_array_equal(windows(x, size=4, sessions=[15, 25]).compute(),
                                  np.concatenate([_sliding(rows[:15], 4), _sliding(rows[15:], 4)]))


def test_the_segment_ordered_source_with_its_segments_keeps_instruments_apart(tmp_path):
    """What the refusal points to: each window holds one instrument's rows in time order."""
    path = tmp_path / "mix.parquet"
    frame = _book(path, ["ES", "NQ"])
    seg = open_segmented(str(path), instrument={"column": "symbol"}, columns=COLUMNS, timestamp="ts", dtype="float64")
    got = windows(seg.array, size=4, sessions=seg.segments.stops - seg.segments.starts).compute()
    expect = np.concatenate([_sliding(frame.loc[frame.symbol == s, COLUMNS].to_numpy(), 4) for s in ("ES", "NQ")])
    np.testing.assert_array_equal(got, expect)


def test_one_instrument_read_with_its_column_windows_by_default(tmp_path):
    path = tmp_path / "es.parquet"
    _book(path, ["ES"])
    x = open_source(str(path), columns=COLUMNS, timestamp="ts", instrument_column="symbol", dtype="float64").array
    rows = pd.read_parquet(path)[COLUMNS].to_numpy()
    np.testing.assert_array_equal((windows(x * 2, size=4)).compute(), _sliding(rows * 2, 4))


def _lobster_pair(d: Path, ticker: str, n: int, base: int) -> np.ndarray:
    """A LOBSTER orderbook/message pair of one level; its book in dollars."""
    book = np.column_stack([base + 100 * np.arange(n), np.full(n, 5), base - 100 + 100 * np.arange(n), np.full(n, 7)])
    stem = d / f"{ticker}_2012-06-21_34200000_57600000"
    Path(f"{stem}_orderbook_1.csv").write_text("".join(",".join(map(str, r)) + "\n" for r in book))
    Path(f"{stem}_message_1.csv").write_text("".join(f"{34_200 + k:.9f},1,1,1,1,1\n" for k in range(n)))
    out = book.astype(np.float64)
    out[:, 0::2] /= 10_000
    return out


def test_lobster_files_name_one_instrument_each_and_stay_the_sessions(tmp_path):
    """Tickers from LOBSTER's file names are not interleaved: each file is one, and its
    windows stay inside it."""
    books = [_lobster_pair(tmp_path, t, n, b) for t, n, b in (("AAPL", 9, 5_850_000), ("MSFT", 7, 300_000))]
    x = open_source(str(tmp_path / "*_orderbook_1.csv"), format="lobster", dtype="float64").array
    np.testing.assert_array_equal(windows(x, size=3).compute(), np.concatenate([_sliding(b, 3) for b in books]))
