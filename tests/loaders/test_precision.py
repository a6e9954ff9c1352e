"""Prices float32 cannot hold: ``dtype="float64"`` reads them exactly (CSV, Parquet,
LOBSTER, a `pipeline run` end to end), and the float32 default warns, once, naming the
file and the column, where a book's ticks are lost; the demo's books do not warn."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import yaml

import pipeline
from pipeline.demo import DemoSpec, write_demo_data
from pipeline.loaders import open_source, precision
from pipeline.errors import PriceResolutionWarning
from pipeline.features.labels import label_steps_numpy
from pipeline.features.specs import LabelSpec
from pipeline.loaders.precision import near_boundaries, resolution_problem

ROOT = Path(__file__).resolve().parents[2]
#: A BTC-USD-like book: about 97,123.45 with a tick of 0.01 (float32 resolves 0.0078125 there).
BTC_CENTS = 9_712_345
LOBSTER_NAME = "BTC_2026-01-0{day}_34200000_57600000_{kind}_1.csv"


def btc_book(n: int = 400, seed: int = 0) -> dict[str, np.ndarray]:
    """Level-1 bid and ask one tick (0.01) apart, the mid moving by a tick at a time."""
    rng = np.random.default_rng(seed)
    cents = BTC_CENTS + np.cumsum(rng.integers(-1, 2, n))
    return {"bid_price_1": cents / 100, "ask_price_1": (cents + 1) / 100,
            "bid_size_1": rng.integers(1, 9, n).astype(np.float64), "ask_size_1": rng.integers(1, 9, n) / 4}


def write_btc(d: Path, fmt: str, days: int = 1, n: int = 400) -> tuple[list[Path], list[dict[str, np.ndarray]]]:
    """BTC-like files of ``fmt`` (parquet, csv, lobster), one a day: their paths (LOBSTER:
    the orderbook files) and each one's values in float64, as the loader names them."""
    paths, books = [], []
    for day in range(days):
        book = btc_book(n, seed=day)
        books.append(book)
        if fmt == "lobster":
            ob = d / LOBSTER_NAME.format(day=5 + day, kind="orderbook")
            ints = {k: np.rint(v * 10_000).astype(np.int64) if "price" in k else np.rint(v).astype(np.int64)
                    for k, v in book.items()}
            book["ask_size_1"] = np.rint(book["ask_size_1"])  # LOBSTER's sizes are integers
            rows = np.stack([ints["ask_price_1"], ints["ask_size_1"], ints["bid_price_1"], ints["bid_size_1"]], 1)
            ob.write_text("".join(",".join(map(str, r)) + "\n" for r in rows))
            times = 34_200 + np.arange(n) * 0.001
            (d / LOBSTER_NAME.format(day=5 + day, kind="message")).write_text(
                "".join(f"{t:.9f},1,{i},1,{ints['ask_price_1'][i]},1\n" for i, t in enumerate(times)))
            paths.append(ob)
            continue
        ts = np.datetime64(f"2026-01-0{5 + day}") + np.arange(n).astype("timedelta64[s]")
        table = pa.table({"timestamp": ts, **book})
        path = d / f"2026-01-0{5 + day}.{fmt}"
        pq.write_table(table, path, row_group_size=150) if fmt == "parquet" else pacsv.write_csv(table, path)
        paths.append(path)
    return paths, books


def open_btc(d: Path, fmt: str, **kw):
    pattern = str(d / ("*_orderbook_*.csv" if fmt == "lobster" else f"*.{fmt}"))
    if fmt == "lobster":
        return open_source(pattern, format="lobster", **kw)
    return open_source(pattern, timestamp="timestamp", **kw)


FORMATS = ["parquet", "csv", "lobster"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_float64_reads_every_price_exactly(tmp_path, fmt):
    _, books = write_btc(tmp_path, fmt, days=2)
    src = open_btc(tmp_path, fmt, dtype="float64")
    assert src.array.dtype == np.float64 and src.metadata()["dtype"] == "float64"
    got = src.array.compute(scheduler="sync")
    expected = np.concatenate([np.stack([b[c] for c in src.columns], 1) for b in books])
    np.testing.assert_array_equal(got, expected)
    spread = got[:, src.columns.index("ask_price_1")] - got[:, src.columns.index("bid_price_1")]
    np.testing.assert_array_equal(spread.astype(np.float32), np.float32((BTC_CENTS + 1) / 100 - BTC_CENTS / 100))
    if fmt == "parquet":  # pipeline.load takes the same option
        loaded = pipeline.load(str(tmp_path / "*.parquet"), timestamp="timestamp", dtype="float64")
        np.testing.assert_array_equal(loaded.compute(scheduler="sync"), expected)


@pytest.mark.parametrize("fmt", FORMATS)
def test_float32_warns_once_naming_the_file_column_move_and_resolution(tmp_path, fmt):
    paths, _ = write_btc(tmp_path, fmt, days=2)
    src = open_btc(tmp_path, fmt)
    assert src.array.dtype == np.float32  # the default stays float32
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        src.array.compute(scheduler="sync")
    found = [w for w in seen if issubclass(w.category, PriceResolutionWarning)]
    assert len(found) == 1, [str(w.message) for w in seen]  # two files, one warning
    assert issubclass(found[0].category, RuntimeWarning)
    text = str(found[0].message)
    assert any(text.startswith(f"{p}: column ") for p in paths)  # whichever part was read first
    assert "column 'ask_price_1'" in text
    assert "as little as 0.01 " in text and "resolves only 0.0078125" in text
    assert "source.dtype: float64" in text


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_demo_books_are_checked_and_do_not_warn(tmp_path, fmt, monkeypatch):
    spec = DemoSpec(days=2, rows_per_day=3000, levels=2, formats=(fmt,), instruments=("AAA",))
    write_demo_data(tmp_path, spec)
    checked = []
    original = precision.check_prices
    monkeypatch.setattr(precision, "check_prices", lambda path, cols, guard: checked.append(sorted(cols))
                        or original(path, cols, guard))
    src = open_btc(tmp_path, fmt, chunk_rows=1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        src.array.compute(scheduler="sync")
    parts = src.array.numblocks[0]
    assert checked == [["ask_price_1"]] * parts and parts >= 2  # every part, its level-1 ask


@pytest.mark.parametrize(
    "values, found",
    [
        (np.array([97123.45, 97123.46, 97123.46, 97123.48]), (0.01, 0.0078125, 97123.48)),
        # |price|; NaN left out
        (np.array([-97123.45, np.nan, -97123.46, -97123.44]), (0.01, 0.0078125, 97123.46)),
        # two instruments' rows interleaved (BTC beside ETH): BTC's ticks are lost all the same
        (np.array([97123.45, 3500.01, 97123.46, 3500.02, 97123.48, 3500.01]), (0.01, 0.0078125, 97123.48)),
        # a token at 1.2e-5 with 1e-8 ticks beside BTC with 0.5 ticks: each keeps its own
        (np.array([97211.5, 1.2e-5, 97212.0, 1.201e-5, 97211.0, 1.2e-5]), None),
        (np.array([100.01, 100.02, 100.0, 100.03]), None),  # the demo's level: 7.6e-6 against 0.01
        (np.array([97123.45, 97123.45]), None),  # no move
        (np.array([97123.45, np.nan, np.nan]), None),
        (np.array([97123.5]), None),
        # 0.0078125 * 8 = 0.0625: a move of 0.0625 is kept well enough, one just below is not.
        (np.array([97123.5, 97123.5625]), None),
        (np.array([97123.5, 97123.56]), (0.06, 0.0078125, 97123.56)),
    ],
)
def test_float32_loses_the_moves_when_its_resolution_exceeds_an_eighth_of_the_smallest(values, found):
    got = resolution_problem(values)
    if found is None:
        assert got is None
    else:
        np.testing.assert_allclose(got, found, rtol=1e-9)


def _run(config: dict, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return subprocess.run([sys.executable, "-m", "pipeline", "run", str(path), "--no-progress", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)


def _btc_config(tmp_path: Path) -> dict:
    return {"cluster": {"n_workers": 2, "threads_per_worker": 1, "memory_limit": "1GiB"},
            "source": {"paths": str(tmp_path / "*.parquet"), "timestamp": "timestamp"},
            "features": {"steps": ["spread", "mid_price", "log_return"], "normalize": "none"},
            "windows": {"size": 4, "stride": 1},
            "labels": {"kind": "return", "horizon": 1, "scale": 10000},
            "output": {"path": str(tmp_path / "btc.zarr"), "overwrite": True}}


def test_pipeline_run_prints_the_warning_once(tmp_path):
    paths, _ = write_btc(tmp_path, "parquet", days=2)  # two files, four row groups, two workers
    done = _run(_btc_config(tmp_path), tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("PriceResolutionWarning: ") == 1, done.stderr
    line = next(x for x in done.stderr.splitlines() if "PriceResolutionWarning" in x)
    # One line, as the command prints its warnings: no file of the package, no source line.
    assert line.startswith("PriceResolutionWarning: ") and "warnings.warn(" not in done.stderr, done.stderr
    assert any(str(p) in line for p in paths) and "source.dtype: float64" in line


def test_pipeline_run_with_float64_stores_exact_features_and_labels(tmp_path):
    from pipeline.config import parse_config
    from pipeline.job import _source_kwargs

    config = _btc_config(tmp_path)
    config["source"]["dtype"] = "float64"
    assert _source_kwargs(parse_config(config)).get("dtype") == "float64"
    _, books = write_btc(tmp_path, "parquet", days=1)
    done = _run(config, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "PriceResolutionWarning" not in done.stderr
    g = pipeline.open(str(tmp_path / "btc.zarr"))["train"]
    x, y, t = g["x"][:], g["y"][:], g["t"][:]
    assert x.dtype == np.float32 and y.dtype == np.float32
    bid, ask = books[0]["bid_price_1"], books[0]["ask_price_1"]
    mid = (bid + ask) / 2.0
    ret = np.log(mid[1:]) - np.log(mid[:-1])
    # Each window's last step e, from its timestamp (one a second); its label is one step ahead.
    ends = ((t - np.datetime64("2026-01-05", "ns").astype(np.int64)) // 10**9).astype(np.int64)
    assert ends[0] == 4 and ends[-1] == len(mid) - 2 and (np.diff(ends) == 1).all()  # log_return looks back 1
    np.testing.assert_array_equal(x[:, -1, 0], (ask - bid)[ends].astype(np.float32))
    np.testing.assert_array_equal(x[:, -1, 1], mid[ends].astype(np.float32))
    np.testing.assert_array_equal(x[:, -1, 2], ret[ends - 1].astype(np.float32))
    np.testing.assert_array_equal(y, (ret[ends] * 10000).astype(np.float32))


# -- class labels from float32 prices -------------------------------------------------------

LABELS = [
    LabelSpec(kind="smoothed", horizon=1),                               # (p[e+1] - p[e]) / p[e]
    LabelSpec(kind="smoothed", horizons=(3, 8), reference="past_mean"),  # DeepLOB's
    LabelSpec(kind="return", horizons=(2,), scale=1e4),                  # basis points
]


def pandas_label_values(path: Path, label: LabelSpec) -> np.ndarray:
    """The label values (scaled) of a one-level LOBSTER book, in float64 with pandas from
    the file's integers: the exact computation."""
    import pandas as pd

    book = pd.read_csv(path, header=None).to_numpy(np.float64)
    mid = pd.Series((book[:, 2] / 10_000 + book[:, 0] / 10_000) / 2)
    cols = []
    for k in label.horizon_list:
        if label.kind == "return":
            cols.append(np.log(mid).shift(-k) - np.log(mid))
        elif label.reference == "current":
            cols.append((mid.rolling(k).mean().shift(-k) - mid) / mid)
        else:
            past = mid.rolling(k).mean()
            cols.append((past.shift(-k) - past) / past)
    return np.stack(cols, axis=1) * label.scale


@pytest.mark.parametrize("label", LABELS)
def test_near_boundaries_flags_every_class_label_float32_prices_flip(tmp_path, label):
    """A $200 book on a cent grid keeps its ticks in float32 (no resolution warning), but
    a label on a class boundary, as tick prices often put one, can change class with the
    prices' float32 rounding. For boundaries at exact label values, every label whose
    class from the float32 source differs from pandas' float64 class is flagged, and only
    labels that near a boundary are."""
    from tests.features.test_build import write_lobster_day

    path = write_lobster_day(tmp_path, 3000, seed=1)
    src = open_source(str(tmp_path / "*_orderbook_1.csv"), format="lobster")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PriceResolutionWarning)
        x32 = src.array.compute(scheduler="sync")
    assert x32.dtype == np.float32
    got = label_steps_numpy(x32, src.columns, label) * label.scale
    exact = pandas_label_values(path, label)
    finite = np.isfinite(exact)
    np.testing.assert_array_equal(np.isfinite(got), finite)
    values, counts = np.unique(np.abs(exact[finite]), return_counts=True)
    # Boundaries of the size alphas and thresholds have, that most labels tie with.
    ties = values[(values > 1e-6 * label.scale) & (counts > 1)]
    ties = ties[np.argsort(-counts[np.isin(values, ties)], kind="stable")][:40]
    flips = 0
    for b in ties:
        classes = [np.where(v > b, 2, np.where(v < -b, 0, 1))[finite] for v in (got, exact)]
        near = near_boundaries(got / label.scale, (-b, b), label.scale)[finite]
        differ = classes[0] != classes[1]
        assert not (differ & ~near).any(), f"boundary {b!r}: a flipped label was not flagged"
        # ... and only labels whose exact value lies that near the boundary are.
        room = 2 * label.scale * precision.LABEL_ROUNDING * (1 + np.abs(exact[finite] / label.scale))
        assert (np.abs(np.abs(exact[finite][near]) - b) <= room[near]).all()
        flips += int(differ.sum())
    assert flips > 0


def test_near_boundaries_scales_the_room_with_the_label():
    bound = precision.LABEL_ROUNDING * (1 + 1e-4)
    values = np.array([1e-4, 1e-4 + 0.9 * bound, 1e-4 + 1.1 * bound, -1e-4 - 0.9 * bound, np.nan])
    np.testing.assert_array_equal(near_boundaries(values, (-1e-4, 1e-4)), [True, True, False, True, False])
    # return labels in basis points: the boundary is on the scaled value, the room too
    np.testing.assert_array_equal(near_boundaries(values, (-1.0, 1.0), 1e4), [True, True, False, True, False])
    assert "3 of 10 labels" in precision.boundary_message(3, 10, "alpha 0.0001")


@pytest.mark.parametrize("name, own, value, dtype, first, then", [
    # Named as a time, a ns date: the time hint alone (a scale would make it a feature).
    ("ts_event", "ts_event", 1_704_205_800_002_515_140, "float64", "'ts_event' looks like a timestamp (", None),
    # A ms date in a column named as no time: both, the time first.
    ("t", "t", 1_704_205_800_002, "float32", "'t' looks like a timestamp (", "; if they are fixed-point prices "
     "instead, source.scale gives their unit ({t: 1.0e-9})"),
    # An ETH price in units of 1e-9 is a date in ms by chance: its name says price.
    ("ask_price_1", "ask_px_00", 2_301_250_000_000, "float32", "set source.dtype: float64 (exact up to 2**53); "
     "if they are fixed-point prices, source.scale gives their unit ({ask_price_1: 1.0e-9})", None),
    # An id past 2**53: float64 holds it no better; source.columns leaves it out.
    ("order_id", "order_id", 2**62 + 1, "float32", "no float holds them exactly: ", "; or, if no feature or label "
     "reads 'order_id', leave it out: source.columns"),
    # Binance's update_id as ms would be 2093: no time.
    ("update_id", "u", 3_900_000_000_000, "float32", "set source.dtype: float64 (exact up to 2**53); or, if no "
     "feature or label reads 'update_id', leave it out", None),
])
def test_integer_hints_tell_a_time_from_a_price_and_an_id(name, own, value, dtype, first, then):
    import pandas as pd

    hint = precision.integer_hint(name, own, value, "int64", np.dtype(dtype))
    assert hint.startswith(first), hint
    assert (then is None and "instead" not in hint) or (then is not None and then in hint), hint
    if "timestamp (" in hint:  # the date shown is the value's, in the unit pandas reads it as
        shown, unit = hint.split("timestamp (")[1].split(")")[0].split(" as epoch ")
        assert pd.Timestamp(shown) == pd.Timestamp(value, unit=unit)
        assert "source.columns lists the columns read" in hint
