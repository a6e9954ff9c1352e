"""Per-step features against plain numpy over the whole series, for any chunking."""

from __future__ import annotations

from unittest import mock

import dask.array as da
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.demo import DemoSpec, generate_day, orderbook_columns
from pipeline.errors import ConfigError, FeatureError
from pipeline.features import FeatureSpec, LabelSpec, compute_features

COLS = orderbook_columns(10)


def book(n: int, seed: int = 0) -> np.ndarray:
    day = generate_day(seed, DemoSpec(rows_per_day=n, seed=seed))
    return np.stack([day[c] for c in COLS], axis=1).astype(np.float32)


def col(x: np.ndarray, name: str) -> np.ndarray:
    return x[:, COLS.index(name)].astype(np.float64)


def trailing(values: np.ndarray, w: int, fn) -> np.ndarray:
    out = np.full(values.shape, np.nan)
    for t in range(w - 1, len(values)):
        out[t] = fn(values[t - w + 1 : t + 1])
    return out


def reference(x: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    mid = (col(x, "bid_price_1") + col(x, "ask_price_1")) / 2
    ret = np.concatenate([[np.nan], np.diff(np.log(mid))])
    if spec.name == "mid_price":
        return mid
    if spec.name == "spread":
        return col(x, "ask_price_1") - col(x, "bid_price_1")
    if spec.name == "imbalance":
        b = sum(col(x, f"bid_size_{i}") for i in range(1, spec.levels + 1))
        a = sum(col(x, f"ask_size_{i}") for i in range(1, spec.levels + 1))
        return (b - a) / (b + a)
    if spec.name == "log_return":
        return ret
    if spec.name == "column":
        return col(x, spec.column)
    base = {"log_return": ret, "mid_price": mid, "spread": col(x, "ask_price_1") - col(x, "bid_price_1")}[spec.of]
    return trailing(base, spec.window, np.mean if spec.name == "rolling_mean" else np.std)


SPECS = [
    FeatureSpec.from_mapping(v, "f")
    for v in [
        "mid_price", "spread", {"name": "imbalance", "levels": 1}, {"name": "imbalance", "levels": 7},
        "log_return", {"name": "rolling_mean", "window": 5}, {"name": "rolling_std", "window": 12},
        {"name": "rolling_mean", "window": 3, "of": "mid_price"}, {"name": "column", "column": "ask_size_3"},
    ]
]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(20, 300), chunk=st.integers(1, 80), seed=st.integers(0, 5))
def test_every_feature_equals_numpy_for_any_chunking(n, chunk, seed):
    x = book(n, seed)
    frame = compute_features(da.from_array(x, chunks=(chunk, -1)), columns=COLS, specs=SPECS)
    got = frame.array.compute(scheduler="sync")
    assert got.shape == (n, len(SPECS)) and got.dtype == np.float32
    assert frame.lookback == 12  # rolling_std over 12 log returns needs 12 steps back
    for j, spec in enumerate(SPECS):
        ref = reference(x, spec).astype(np.float32)
        lb = spec.lookback_steps
        np.testing.assert_allclose(got[lb:, j], ref[lb:], rtol=2e-5, atol=1e-6, err_msg=spec.label)
        if lb:
            assert np.isnan(got[:lb, j]).all(), spec.label


def double_mid(block: np.ndarray, columns: tuple[str, ...]) -> np.ndarray:
    """A user feature: bid_price_1 two steps ago (needs a lookback of 2)."""
    out = np.full(len(block), np.nan)
    out[2:] = block[:-2, columns.index("bid_price_1")]
    return out


def test_custom_feature_gets_its_declared_halo():
    x = book(200)
    spec = FeatureSpec.from_mapping({"name": "custom", "function": f"{__name__}:double_mid", "lookback": 2}, "f")
    got = compute_features(da.from_array(x, chunks=(7, -1)), columns=COLS, specs=[spec]).array.compute()
    np.testing.assert_allclose(got[2:, 0], x[:-2, COLS.index("bid_price_1")])


def test_missing_column_and_bad_hook_fail_before_computing():
    x = da.zeros((10, 2), chunks=5)
    with pytest.raises(FeatureError, match=r"^feature mid_price \(features.steps\[0\]\) reads column 'bid_price_1', "
                                           r"which is not in the source \(columns: a, b\); .*source.rename: "
                                           r"\{bid_price_1: <the files' name>\}$"):
        compute_features(x, columns=["a", "b"], specs=[FeatureSpec("mid_price")])
    with pytest.raises(FeatureError, match="cannot import"):
        compute_features(x, columns=["a", "b"], specs=[FeatureSpec(name="custom", function="no_such_mod:f")])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"name": "rolling_std", "window": 0}, "f.window: expected a positive integer, got 0"),
        ({"name": "rolling_std"}, "f.window: missing required key"),
        ({"name": "imbalance", "levels": "x"}, "f.levels: expected a positive integer, got 'x'"),
        ({"name": "spread", "window": 3}, "f.window: unknown key for spread"),
        ({"name": "bogus"}, "f.name: expected one of"),
        ({"name": ["mid_price"]}, "f.name: expected one of"),
        ({"name": "custom", "function": "nocolon"}, "f.function: expected 'module:function'"),
        (3, "f: expected a feature name or a mapping"),
    ],
)
def test_feature_spec_errors_name_the_key_path(value, message):
    with pytest.raises(ConfigError) as err:
        FeatureSpec.from_mapping(value, "f")
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"horizon": 0}, "labels.horizon: expected a positive integer"),
        ({"kind": "class"}, "labels.thresholds: missing required key"),
        ({"kind": "class", "thresholds": [1, 0]}, "labels.thresholds: expected strictly ascending"),
        ({"kind": "other"}, "labels.kind: expected one of"),
        ({"scale": -1}, "labels.scale: expected a positive number"),
    ],
)
def test_label_spec_errors_name_the_key_path(value, message):
    with pytest.raises(ConfigError) as err:
        LabelSpec.from_mapping(value, "labels")
    assert str(err.value).startswith(message)


def test_rolling_statistics_are_the_same_in_pieces(monkeypatch):
    """Rolling windows are reduced a bounded number at a time; the values are exactly
    those of one reduction over all of them, NaN-holding windows included."""
    from pipeline.features import steps

    v = np.cumsum(np.random.default_rng(3).standard_normal(1000)) + 100.0
    v[[10, 500, 501]] = np.nan
    whole = {stat: steps._rolling(v, 13, stat) for stat in ("mean", "std")}
    monkeypatch.setattr(steps, "_ROLL_ROWS", 7)
    for stat, want in whole.items():
        got = steps._rolling(v, 13, stat)
        np.testing.assert_array_equal(got, want)
        ref = trailing(v, 13, np.mean if stat == "mean" else np.std)
        np.testing.assert_allclose(got, ref, rtol=1e-12)
    assert np.isnan(whole["std"][[12 - 1, 10, 22, 513]]).all() and np.isfinite(whole["std"][23:500]).all()


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 400), piece=st.integers(1, 60), seed=st.integers(0, 3))
def test_features_computed_in_row_pieces_equal_the_whole_block_bit_for_bit(rows, piece, seed):
    """A block's features are computed a bounded number of rows at a time, each piece
    with its history: the same bits as all rows at once, NaN where history is short or
    a source value is missing, a user feature included."""
    from pipeline.features import steps

    x = book(rows, seed)
    x[rows // 3, COLS.index("bid_price_1")] = np.nan
    specs = [*SPECS, FeatureSpec.from_mapping({"name": "custom", "function": f"{__name__}:double_mid",
                                               "lookback": 2}, "f")]
    whole = steps.features_numpy(x, COLS, specs)
    with mock.patch.object(steps, "_PIECE_ROWS", piece):
        np.testing.assert_array_equal(steps.features_numpy(x, COLS, specs), whole)


def test_book_gives_deeplob_order_under_the_source_names():
    x = book(60)
    spec = FeatureSpec.from_mapping({"name": "book", "levels": 2}, "f")
    order = ["ask_price_1", "ask_size_1", "bid_price_1", "bid_size_1",
             "ask_price_2", "ask_size_2", "bid_price_2", "bid_size_2"]
    assert spec.labels == tuple(order) and spec.width == 8 and spec.lookback_steps == 0
    frame = compute_features(da.from_array(x, chunks=(13, -1)), columns=COLS,
                             specs=[FeatureSpec("mid_price"), spec, FeatureSpec("log_return")])
    assert frame.names == ("mid_price", *order, "log_return") and frame.lookback == 1
    got = frame.array.compute(scheduler="sync")
    assert got.shape == (60, 10) and got.dtype == np.float32
    np.testing.assert_array_equal(got[:, 1:9], x[:, [COLS.index(c) for c in order]])
    np.testing.assert_allclose(got[:, 0], reference(x, FeatureSpec("mid_price")), rtol=1e-6)
    np.testing.assert_allclose(got[1:, 9], reference(x, FeatureSpec("log_return"))[1:], rtol=2e-5, atol=1e-6)


def test_book_defaults_to_ten_levels():
    spec = FeatureSpec.from_mapping("book", "f")
    assert spec == FeatureSpec("book") and spec.levels == 10 and spec.width == 40
    assert spec.labels[-4:] == ("ask_price_10", "ask_size_10", "bid_price_10", "bid_size_10")
    assert FeatureSpec("imbalance").levels == 1 and FeatureSpec("imbalance").labels == ("imbalance_1",)
    frame = compute_features(da.from_array(book(20), chunks=(7, -1)), columns=COLS, specs=[spec])
    assert frame.array.shape == (20, 40) and frame.names == spec.labels


def test_book_missing_column_fails_before_computing():
    cols = orderbook_columns(1)
    x = da.zeros((10, len(cols)), chunks=5)
    with pytest.raises(FeatureError, match=r"feature book \(features.steps\[0\]\) reads column 'ask_price_2', "
                                           r"which is not in the source"):
        compute_features(x, columns=cols, specs=[FeatureSpec("book", levels=2)])
    with pytest.raises(ConfigError, match=r"^f\.levels: expected a positive integer, got 0"):
        FeatureSpec.from_mapping({"name": "book", "levels": 0}, "f")
    with pytest.raises(ConfigError, match=r"^f\.window: unknown key for book \(expected levels\)"):
        FeatureSpec.from_mapping({"name": "book", "window": 3}, "f")


def test_a_series_shorter_than_the_lookback_is_all_nan():
    frame = compute_features(da.from_array(book(5), chunks=(5, -1)), columns=COLS,
                             specs=[FeatureSpec("rolling_mean", window=12)])
    assert np.isnan(frame.array.compute()).all()


def test_the_columns_read_are_those_the_features_and_label_use():
    from pipeline.features.steps import columns_read

    specs = [FeatureSpec.from_mapping(v, "f") for v in ("mid_price", {"name": "imbalance", "levels": 2},
                                                         {"name": "column", "column": "volume"})]
    assert columns_read(specs) == ("ask_price_1", "ask_size_1", "ask_size_2", "bid_price_1", "bid_size_1",
                                   "bid_size_2", "volume")
    label = LabelSpec.from_mapping({"kind": "column", "column": "target"}, "labels")
    assert columns_read(specs[2:], label) == ("target", "volume")
    # A custom feature is handed every column: all are read.
    assert columns_read([*specs, FeatureSpec.from_mapping(
        {"name": "custom", "function": f"{__name__}:double_mid", "lookback": 2}, "f")]) is None


def test_a_block_s_features_keep_nothing_but_their_result():
    """Each piece's float64 columns and features are freed when it is done, not left to
    the cyclic collector (a piece's closures form a cycle): with the collector off, a
    block of 8 pieces leaves only its result allocated."""
    import gc
    import tracemalloc

    from pipeline.features.steps import _PIECE_ROWS, features_numpy

    x = book(8 * _PIECE_ROWS)
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        out = features_numpy(x, COLS, SPECS)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    assert out.shape == (x.shape[0], len(SPECS))
    assert held - out.nbytes < 2**20  # a piece's columns alone are 8 x 16384 x 8 bytes each


def test_a_float64_source_stores_a_btc_like_book_s_exact_features_and_labels(tmp_path):
    # Near 97,123.45 float32 resolves 0.0078: read in float32, a spread of one 0.01 tick
    # was stored as 0.0078125 or 0.015625 and one-tick returns were off by 20-40%.
    import pipeline
    from pipeline.features import build_training_set
    from pipeline.loaders import open_source
    from tests.loaders.test_precision import write_btc

    _, (b,) = write_btc(tmp_path, "parquet")
    src = open_source(str(tmp_path / "*.parquet"), timestamp="timestamp", dtype="float64")
    specs = [FeatureSpec.from_mapping(v, "f") for v in ("spread", "mid_price", "log_return")]
    label = LabelSpec.from_mapping({"kind": "return", "horizon": 1, "scale": 10000}, "labels")
    ts = build_training_set(src.array, columns=src.columns, features=specs, size=4, label=label, normalize="none",
                            timestamps=src.timestamps)
    pipeline.write(str(tmp_path / "btc.zarr"), ts.splits["train"], progress=False)
    g = pipeline.open(str(tmp_path / "btc.zarr"))["train"]
    x, y, t = g["x"][:], g["y"][:], g["t"][:]
    assert x.dtype == np.float32 and y.dtype == np.float32  # stored in float32, computed from float64

    bid, ask = b["bid_price_1"], b["ask_price_1"]  # plain numpy, float64
    mid = (bid + ask) / 2.0
    ret = np.log(mid[1:]) - np.log(mid[:-1])
    ends = ((t - np.datetime64("2026-01-05", "ns").astype(np.int64)) // 10**9).astype(np.int64)  # one row a second
    assert ends[0] == 4 and ends[-1] == len(mid) - 2 and (np.diff(ends) == 1).all()
    for k in range(4):  # every step of every window
        e = ends - 3 + k
        np.testing.assert_array_equal(x[:, k, 0], (ask - bid)[e].astype(np.float32))
        np.testing.assert_array_equal(x[:, k, 1], mid[e].astype(np.float32))
        np.testing.assert_array_equal(x[:, k, 2], ret[e - 1].astype(np.float32))
    np.testing.assert_array_equal(y, (ret[ends] * 10000).astype(np.float32))
    assert set(np.unique(x[:, :, 0])) == {np.float32(0.01)}


def test_a_missing_column_among_many_lists_the_first_twenty_and_the_count():
    cols = [f"bids_distance_{i}" for i in range(150)]
    with pytest.raises(FeatureError) as err:
        compute_features(da.zeros((10, 150), chunks=5), columns=cols,
                         specs=[FeatureSpec("spread"), FeatureSpec("mid_price")])
    msg = str(err.value)
    assert msg.startswith("feature spread (features.steps[0]) reads column 'bid_price_1'")
    assert "bids_distance_19, ... (150 columns)" in msg and "bids_distance_20" not in msg


EMPTY_SPECS = [
    FeatureSpec.from_mapping(v, "f")
    for v in [
        "mid_price", "spread", "log_return", {"name": "rolling_mean", "window": 3, "of": "mid_price"},
        {"name": "rolling_std", "window": 4, "of": "spread"}, {"name": "rolling_std", "window": 3},
        {"name": "imbalance", "levels": 2}, {"name": "book", "levels": 2}, {"name": "column", "column": "bid_price_1"},
    ]
]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(20, 120), chunk=st.integers(1, 40), seed=st.integers(0, 3),
       dtype=st.sampled_from([np.float32, np.float64]), data=st.data())
def test_features_of_an_empty_level_1_price_are_nan_and_the_rest_keep_the_fill(n, chunk, seed, dtype, data):
    """source.nan: fill wrote 0 where bid_price_1 or ask_price_1 was empty (a one-sided
    book). Given that value, the features made from the level-1 prices equal plain numpy
    over the prices with NaN in those cells (NaN there, in log_return the row after, in a
    rolling feature its window), for any chunking; book, column and the size imbalance
    keep the filled values; without it, nothing changes."""
    x = book(n, seed).astype(dtype)
    rows = st.lists(st.integers(0, n - 1), max_size=5)
    empty_bid, empty_ask = data.draw(rows), data.draw(rows)
    x[empty_bid, COLS.index("bid_price_1")] = 0
    x[empty_ask, COLS.index("ask_price_1")] = 0
    got = compute_features(da.from_array(x, chunks=(chunk, -1)), columns=COLS, specs=EMPTY_SPECS, empty=0.0,
                           dtype="float64").array.compute(scheduler="sync")
    priced = x.astype(np.float64)  # the reference: the prices as NaN where empty
    priced[empty_bid, COLS.index("bid_price_1")] = np.nan
    priced[empty_ask, COLS.index("ask_price_1")] = np.nan
    j = 0
    for spec in EMPTY_SPECS:
        top = spec.name in ("mid_price", "spread", "log_return") or spec.name.startswith("rolling_")
        if spec.name == "book":  # the raw columns, fill included
            names = list(spec.labels)
            np.testing.assert_array_equal(got[:, j : j + len(names)], x[:, [COLS.index(c) for c in names]])
            j += len(names)
            continue
        with np.errstate(all="ignore"):  # the reference's log of a filled 0, its std over NaN
            ref = reference(priced if top else x, spec)
        lb = spec.lookback_steps
        np.testing.assert_allclose(got[lb:, j], ref[lb:], rtol=1e-12, atol=1e-12, err_msg=spec.label)
        j += 1
    blind = compute_features(da.from_array(x, chunks=(chunk, -1)), columns=COLS, specs=EMPTY_SPECS,
                             dtype="float64").array.compute(scheduler="sync")
    mid = (x[:, COLS.index("bid_price_1")].astype(np.float64) + x[:, COLS.index("ask_price_1")]) / 2
    np.testing.assert_array_equal(blind[:, 0], mid)  # without the fill value: the filled prices, as before


def test_the_features_read_from_level_1_prices_and_the_empty_rows_warning():
    from pipeline.features.steps import empty_prices_message, empty_top_prices, top_price_features

    assert top_price_features(EMPTY_SPECS) == ("mid_price", "spread", "log_return", "rolling_mean_mid_price_3",
                                               "rolling_std_spread_4", "rolling_std_log_return_3")
    assert top_price_features([FeatureSpec.from_mapping({"name": "rolling_mean", "window": 2, "of": "imbalance"},
                                                        "f"), FeatureSpec("book")]) == ()
    x = book(6).astype(np.float64)
    x[[1, 4], COLS.index("ask_price_1")] = 0
    x[4, COLS.index("bid_price_1")] = 0
    flags = empty_top_prices(x, COLS, 0.0)
    np.testing.assert_array_equal(flags, [[0, 0], [0, 1], [0, 0], [0, 0], [1, 1], [0, 0]])
    assert empty_prices_message([1, 2, 2], ["mid_price", "spread"], nan="drop") == (
        "features: 2 rows hold an empty bid_price_1 (1) or ask_price_1 (2) (source.nan: fill); mid_price, spread are "
        "NaN there (and where their lookback reads one) rather than computed from the fill value; the windows "
        "holding them are left out, counted with the NaN windows")
    assert empty_prices_message([0, 1, 1], ["log_return"], nan="fill", fill_value=-1).startswith(
        "features: 1 row holds an empty ask_price_1 (source.nan: fill); log_return is NaN")
    assert empty_prices_message([0, 0, 0], ["mid_price"], nan="drop") is None
    assert empty_prices_message([3, 0, 3], [], nan="drop") is None
