"""Labels: hand-computed values of every kind, chunk independence, and config parsing.

Expected values are written out by hand from a short mid-price series (or computed with
plain numpy in the formula of the earlier build code), never with the module's helpers.
"""

from __future__ import annotations

import math

import dask.array as da
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.demo import DemoSpec, generate_day, orderbook_columns
from pipeline.errors import ConfigError, FeatureError
from pipeline.features import LabelSpec, class_balance, finalize_labels, label_steps
from pipeline.features.labels import gaps_message, label_gaps, label_gaps_numpy, label_steps_numpy

NAN = math.nan
#: Mid prices of 8 steps; the book quotes them half a tick either side (exact in float32).
P = [100.0, 101.0, 102.0, 100.0, 98.0, 99.0, 103.0, 104.0]
#: A label column of the source, beside the quotes (column order is deliberately not the
#: book's, so lookups go by name).
TAG = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0]
COLS = ["ask_price_1", "tag", "bid_price_1"]


def table() -> np.ndarray:
    p = np.asarray(P)
    return np.stack([p + 0.5, np.asarray(TAG), p - 0.5], axis=1).astype(np.float32)


def spec(**value) -> LabelSpec:
    return LabelSpec.from_mapping(value, "labels")


def steps(label: LabelSpec) -> np.ndarray:
    return label_steps_numpy(table(), COLS, label)


# -- hand-computed values ------------------------------------------------------------------


def test_return_is_the_log_return_of_the_mid_over_the_horizon():
    got = steps(spec(kind="return", horizon=2))
    want = [math.log(102 / 100), math.log(100 / 101), math.log(98 / 102), math.log(99 / 100),
            math.log(103 / 98), math.log(104 / 99), NAN, NAN]
    assert got.shape == (8, 1) and got.dtype == np.float64
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-12)
    y = finalize_labels(got[:6], spec(kind="return", horizon=2, scale=10000))
    assert y.shape == (6,) and y.dtype == np.float32
    np.testing.assert_allclose(y, np.asarray(want[:6]) * 1e4, rtol=1e-6)


def test_class_bins_the_scaled_return_in_ascending_order():
    label = spec(kind="class", horizon=1, thresholds=[-100, 100], scale=10000)
    # Returns in basis points: +99.5, +98.5, -198.0, -202.0, +101.5, +396.1, +96.6.
    y = finalize_labels(steps(label)[:7], label)
    assert y.dtype == np.int64 and y.tolist() == [1, 1, 0, 0, 2, 2, 1]
    assert label.class_names == ("< -100", "[-100, 100)", ">= 100")
    assert label.out_dtype == np.int64
    assert class_balance(y, label) == [2, 3, 2]


def test_smoothed_against_the_current_mid():
    got = steps(spec(kind="smoothed", horizon=2))[:, 0]
    # m_plus(e) = (p[e+1] + p[e+2]) / 2; l = (m_plus - p[e]) / p[e].
    want = [(101.5 - 100) / 100, (101 - 101) / 101, (99 - 102) / 102, (98.5 - 100) / 100,
            (101 - 98) / 98, (103.5 - 99) / 99, NAN, NAN]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_smoothed_against_the_past_mean_averages_k_steps_current_included():
    got = steps(spec(kind="smoothed", horizon=2, reference="past_mean"))[:, 0]
    # m_minus(e) = (p[e-1] + p[e]) / 2 (k terms, not DeepLOB's printed k+1).
    want = [NAN, (101 - 100.5) / 100.5, (99 - 101.5) / 101.5, (98.5 - 101) / 101,
            (101 - 99) / 99, (103.5 - 98.5) / 98.5, NAN, NAN]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_smoothed_with_horizon_three_past_mean():
    got = steps(spec(kind="smoothed", horizon=3, reference="past_mean"))[:, 0]
    m_minus = {2: (100 + 101 + 102) / 3, 3: (101 + 102 + 100) / 3, 4: (102 + 100 + 98) / 3}
    m_plus = {2: (100 + 98 + 99) / 3, 3: (98 + 99 + 103) / 3, 4: (99 + 103 + 104) / 3}
    want = [NAN, NAN] + [(m_plus[e] - m_minus[e]) / m_minus[e] for e in (2, 3, 4)] + [NAN] * 3
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_smoothed_alpha_gives_down_stationary_up_in_ascending_order():
    label = spec(kind="smoothed", horizon=2, alpha=0.01)
    # l: +0.015, 0, -0.0294, -0.015, +0.0306, +0.0455.
    y = finalize_labels(steps(label)[:6], label)
    assert y.dtype == np.int64 and y.tolist() == [2, 1, 0, 0, 2, 2]
    assert label.class_names == ("down", "stationary", "up")
    assert class_balance(y, label) == [2, 1, 3]
    # alpha 0: only a change of exactly zero is stationary.
    assert finalize_labels(steps(label)[:6], spec(kind="smoothed", horizon=2, alpha=0)).tolist() == [2, 1, 0, 0, 2, 2]


def test_alpha_applies_to_the_scaled_value():
    label = spec(kind="smoothed", horizon=2, scale=100, alpha=2)
    # Scaled l: +1.5, 0, -2.94, -1.5, +3.06, +4.55.
    assert finalize_labels(steps(label)[:6], label).tolist() == [1, 1, 0, 1, 2, 2]
    unscaled = spec(kind="smoothed", horizon=2, scale=100)
    np.testing.assert_allclose(finalize_labels(steps(unscaled)[:1], unscaled), [1.5], rtol=1e-6)


# -- ties with tick prices -----------------------------------------------------------------

#: LOBSTER's prices: integers over 10,000, read into float64 as its loader reads them.
TICK = 10_000
#: A mid price of 100.0000 in half ticks, and moves of it that make decimal labels.
M = 2 * 1_000_000


def _tick_book(bid: list[int], ask: list[int]) -> tuple[np.ndarray, list[str]]:
    return (np.stack([np.asarray(ask) / TICK, np.asarray(bid) / TICK], axis=1),
            ["ask_price_1", "bid_price_1"])


def _exact_smoothed(bid: list[int], ask: list[int], k: int, past_mean: bool) -> list:
    """Each step's smoothed relative change in exact rational arithmetic (None where its
    reach leaves the series)."""
    from fractions import Fraction

    mid = [Fraction(b + a, 2 * TICK) for b, a in zip(bid, ask)]
    out = []
    for e in range(len(mid)):
        back = k - 1 if past_mean else 0
        if e - back < 0 or e + k >= len(mid):
            out.append(None)
            continue
        ref = sum(mid[e - back: e + 1]) / (back + 1)
        out.append((sum(mid[e + 1: e + k + 1]) / k - ref) / ref)
    return out


def test_a_change_that_equals_alpha_exactly_is_stationary():
    """A move from 100.0000 to 100.0060 is +6e-05 exactly; float64 of the decimal prices
    made it 6.000000000000227e-05, which was classed up."""
    bid, ask = [999_990, 1_000_050] * 4, [1_000_010, 1_000_070] * 4  # mids 100.0000, 100.0060
    x, cols = _tick_book(bid, ask)
    label = spec(kind="smoothed", horizon=1, alpha=0.00006)
    values = label_steps_numpy(x, cols, label)[:-1]
    assert values[0, 0] != 0.00006  # the rounding this is about
    assert finalize_labels(values, label).tolist() == [1] * 7  # up and down by alpha exactly: ties
    bp = spec(kind="smoothed", horizon=1, alpha=0.6, scale=1e4)  # the same in basis points
    assert finalize_labels(values, bp).tolist() == [1] * 7
    cut = spec(kind="class", horizon=1, thresholds=[-0.6, 0.6], scale=1e4)  # a tie goes up, as digitize puts it
    ret = label_steps_numpy(x, cols, cut)[:-1]
    assert finalize_labels(ret, cut).tolist() == [1, 1] * 3 + [1]


def test_an_unchanged_mid_made_of_other_quotes_is_a_return_of_exactly_zero():
    bid, ask = [1_000_100, 1_000_000, 1_000_050], [1_000_300, 1_000_400, 1_000_350]  # one mid, three quotes
    x, cols = _tick_book(bid, ask)
    assert len({float(m) for m in x.sum(axis=1)}) > 1  # the rounding this is about
    for label in (spec(horizon=1), spec(kind="smoothed", horizon=1)):
        values = label_steps_numpy(x, cols, label)[:-1]
        assert finalize_labels(values, label).tolist() == [0.0, 0.0]
    cut = spec(kind="class", horizon=1, thresholds=[0.0])
    assert finalize_labels(label_steps_numpy(x, cols, cut)[:-1], cut).tolist() == [1, 1]


@settings(max_examples=80, deadline=None)
@given(moves=st.lists(st.sampled_from([0, 60, -60, 120, -120, 30, 45, -200]), min_size=3, max_size=40),
       spreads=st.lists(st.integers(1, 40).map(lambda s: 2 * s), min_size=40, max_size=40),
       k=st.sampled_from([1, 2, 3, 10]), past_mean=st.booleans(),
       alpha=st.sampled_from(["0.00003", "0.00006", "0.0001", "0.000045", "0"]), bp=st.booleans())
def test_smoothed_classes_equal_exact_arithmetic_on_tick_prices(moves, spreads, k, past_mean, alpha, bp):
    """Mid prices on a grid that makes exact ties with decimal alphas common: each
    class is the class exact rational arithmetic on the integer prices gives."""
    from fractions import Fraction

    mids = [M + m for m in moves]  # half ticks
    bid = [(m - s) // 2 for m, s in zip(mids, spreads)]
    ask = [m - b for m, b in zip(mids, bid)]
    x, cols = _tick_book(bid, ask)
    scale, a = (1e4, Fraction(alpha) * 10_000) if bp else (1.0, Fraction(alpha))
    label = spec(kind="smoothed", horizon=k, alpha=float(a), scale=scale,
                 reference="past_mean" if past_mean else "current")
    values = label_steps_numpy(x, cols, label)
    exact = _exact_smoothed(bid, ask, k, past_mean)
    rows = [e for e, v in enumerate(exact) if v is not None]
    got = finalize_labels(values[rows], label).tolist()
    want = [0 if exact[e] * int(scale) < -a else 2 if exact[e] * int(scale) > a else 1 for e in rows]
    assert got == want


def test_horizons_give_one_column_per_horizon_in_the_order_given():
    label = spec(kind="smoothed", horizons=[2, 1])
    got = steps(label)
    assert got.shape == (8, 2)
    k1 = [(101 - 100) / 100, (102 - 101) / 101, (100 - 102) / 102, (98 - 100) / 100,
          (99 - 98) / 98, (103 - 99) / 99, (104 - 103) / 103, NAN]
    np.testing.assert_allclose(got[:, 1], k1, rtol=1e-12)
    np.testing.assert_allclose(got[0, 0], 0.015, rtol=1e-12)
    assert np.isnan(got[6:, 0]).all()
    y = finalize_labels(got[:6], label)
    assert y.shape == (6, 2) and y.dtype == np.float32
    # A list of one horizon is still 2-D: the shape follows the config's form.
    one = spec(kind="return", horizons=[3])
    assert one.multi and finalize_labels(steps(one)[:5], one).shape == (5, 1)
    assert not spec(kind="return", horizon=3).multi


def test_class_balance_per_horizon():
    label = spec(kind="class", horizons=[1, 2], thresholds=[0])
    y = finalize_labels(steps(label)[:6], label)
    # k=1 returns: + + - - + +; k=2: + - - - + +.
    assert y.tolist() == [[1, 1], [1, 0], [0, 0], [0, 0], [1, 1], [1, 1]]
    assert class_balance(y, label) == [[2, 4], [3, 3]]
    assert class_balance(np.zeros(3, np.float32), spec(kind="return")) == []


@pytest.mark.parametrize("value", [{"kind": "class", "horizons": [1, 2], "thresholds": [-1.0, 1.0]},
                                   {"kind": "smoothed", "horizons": [10, 20, 50, 100], "alpha": 0.00006,
                                    "reference": "past_mean"}])
def test_class_balance_of_an_empty_split_counts_zero_per_horizon(value):
    """A date split after the data is created empty, for appended days to fill: with
    several horizons its class balance crashed (reshape of (0, H) into (0, -1))."""
    label = spec(**value)
    y = finalize_labels(np.zeros((0, len(value["horizons"]))), label)
    assert y.shape == (0, len(value["horizons"]))
    zeros = [np.bincount(np.zeros(0, np.int64), minlength=len(label.class_names)).tolist()] * len(value["horizons"])
    assert class_balance(y, label) == zeros
    with pytest.raises(FeatureError, match=r"expected class labels of shape \(n, \d\) for \d horizons"):
        class_balance(np.zeros((4, 3), np.int64), label)


def test_column_label_is_the_value_at_the_window_end():
    label = spec(kind="column", column="tag")
    got = steps(label)
    assert got.shape == (8, 1)
    np.testing.assert_array_equal(got[:, 0], TAG)
    y = finalize_labels(got, label)
    assert y.dtype == np.float32 and y.shape == (8,)
    as_int = spec(kind="column", column="tag", dtype="int64")
    assert finalize_labels(got, as_int).tolist() == [3, 1, 4, 1, 5, 9, 2, 6]
    assert as_int.out_dtype == np.int64 and as_int.class_names is None
    assert label.horizon_list == () and label.reach == (0, 0) and label.required_columns == ("tag",)


def test_a_column_label_map_replaces_each_value_and_refuses_one_it_does_not_name():
    # FI-2010's published classes (1 up, 2 stationary, 3 down) as 0 down, 1 stationary, 2 up.
    label = spec(kind="column", column="tag", dtype="int64", map={1: 2, 2: 1, 3: 0})
    values = np.array([1.0, 3.0, 2.0, 2.0, 1.0])
    np.testing.assert_array_equal(finalize_labels(values, label), 3 - values.astype(np.int64))
    floats = spec(kind="column", column="tag", map={1: 0.5, 2: -0.5})
    np.testing.assert_array_equal(finalize_labels(np.array([2.0, np.nan, 1.0]), floats),
                                  np.array([-0.5, np.nan, 0.5], dtype=np.float32))
    assert label.describe()["map"] == [[1, 2], [2, 1], [3, 0]]
    # Keys as text (a JSON config, --set) are the same map.
    assert spec(kind="column", column="tag", dtype="int64", map={"1": 2, "2": 1, "3": 0}) == label
    with pytest.raises(FeatureError, match=r"column 'tag' holds 4, which the map does not name \(it maps 1, 2, 3\)"):
        finalize_labels(np.array([1.0, 4.0]), label)


@pytest.mark.parametrize("value", [[1, 2], {}, {"a": 1}, {1: "b"}, {1: float("nan")}, {"nan": 1}])
def test_a_column_label_map_must_map_numbers_to_numbers(value):
    with pytest.raises(ConfigError, match="labels.map"):
        LabelSpec.from_mapping({"kind": "column", "column": "tag", "map": value}, "labels")


def test_float_labels_pass_nan_through():
    for label in (spec(kind="return", horizon=2, scale=10), spec(kind="smoothed", horizons=[2, 7])):
        y = finalize_labels(steps(label), label)
        assert y.dtype == np.float32
        assert np.isnan(y[-1]).all() and np.isfinite(y[0]).all()


@pytest.mark.parametrize(
    ("value", "reach", "horizons", "required"),
    [
        ({}, (0, 1), (1,), ("bid_price_1", "ask_price_1")),
        ({"kind": "return", "horizons": [10, 100, 20]}, (0, 100), (10, 100, 20), ("bid_price_1", "ask_price_1")),
        ({"kind": "class", "horizon": 7, "thresholds": [0]}, (0, 7), (7,), ("bid_price_1", "ask_price_1")),
        ({"kind": "smoothed", "horizons": [10, 50]}, (0, 50), (10, 50), ("bid_price_1", "ask_price_1")),
        ({"kind": "smoothed", "horizons": [10, 50], "reference": "past_mean"}, (49, 50), (10, 50),
         ("bid_price_1", "ask_price_1")),
        ({"kind": "column", "column": "y"}, (0, 0), (), ("y",)),
    ],
)
def test_reach_horizons_and_columns(value, reach, horizons, required):
    label = spec(**value)
    assert label.reach == reach
    assert label.horizon_list == horizons
    assert label.required_columns == required


def test_labels_read_exactly_their_reach():
    """Changing a step outside ``e - back .. e + fwd`` leaves the label of ``e`` alone;
    changing either end of that range changes it."""
    rng = np.random.default_rng(0)
    p = 100 + np.cumsum(rng.standard_normal(40))
    x = np.stack([p + 0.5, p - 0.5], axis=1)
    cols = ["ask_price_1", "bid_price_1"]
    e = 20
    for label in (spec(kind="return", horizons=[3, 5]), spec(kind="smoothed", horizon=4, reference="past_mean"),
                  spec(kind="smoothed", horizon=4)):
        back, fwd = label.reach
        base = label_steps_numpy(x, cols, label)[e]
        for t in range(40):
            y = x.copy()
            y[t] += 1.0
            moved = label_steps_numpy(y, cols, label)[e]
            if t in (e - back, e + fwd):
                assert not np.array_equal(moved, base), (label, t)
            elif not e - back <= t <= e + fwd:
                np.testing.assert_array_equal(moved, base, err_msg=f"{label} {t}")


# -- same values as before, and for any chunking ------------------------------------------


def book(n: int, seed: int) -> tuple[np.ndarray, list[str]]:
    cols = orderbook_columns(2)
    day = generate_day(seed, DemoSpec(rows_per_day=n, levels=2, seed=seed))
    return np.stack([day[c] for c in cols], axis=1).astype(np.float32), cols


def test_return_and_class_are_bit_identical_to_the_earlier_formula():
    x, cols = book(500, 1)
    bid, ask = (x[:, cols.index(c)].astype(np.float64) for c in ("bid_price_1", "ask_price_1"))
    mid = (bid + ask) / 2.0
    logmid = np.log(mid)
    h, scale = 20, 10000.0
    ret = (logmid[h:] - logmid[:-h]) * scale
    values = label_steps(da.from_array(x, chunks=(37, -1)), columns=cols, spec=spec(horizon=h, scale=scale)).compute()
    n = len(x) - h
    np.testing.assert_array_equal(finalize_labels(values[:n], spec(horizon=h, scale=scale)), ret.astype(np.float32))
    assert np.isnan(values[n:]).all()
    label = spec(kind="class", horizon=h, thresholds=[-2, 2], scale=scale)
    np.testing.assert_array_equal(finalize_labels(values[:n], label), np.digitize(ret, [-2.0, 2.0]).astype(np.int64))


SPECS = [
    {"kind": "return", "horizon": 5},
    {"kind": "class", "horizons": [1, 12], "thresholds": [-1, 1], "scale": 1e4},
    {"kind": "smoothed", "horizons": [3, 17, 1]},
    {"kind": "smoothed", "horizons": [9, 2], "reference": "past_mean", "alpha": 0.001},
    {"kind": "column", "column": "ask_size_2"},
]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 150), sizes=st.lists(st.integers(1, 30), min_size=1, max_size=40),
       which=st.sampled_from(range(len(SPECS))), seed=st.integers(0, 3))
def test_label_steps_are_identical_for_any_chunking(n, sizes, which, seed):
    x, cols = book(n, seed)
    chunks: list[int] = []
    for s in sizes * (n // sum(sizes) + 1):
        if sum(chunks) >= n:
            break
        chunks.append(min(s, n - sum(chunks)))
    label = spec(**SPECS[which])
    got = label_steps(da.from_array(x, chunks=(tuple(chunks), -1)), columns=cols, spec=label)
    whole = label_steps_numpy(x, cols, label)
    assert got.shape == whole.shape == (n, max(1, len(label.horizon_list)))
    np.testing.assert_array_equal(got.compute(scheduler="sync"), whole)
    # Steps whose reach leaves the series are NaN; all others (on this finite data) are not.
    back, fwd = label.reach
    for j, k in enumerate(label.horizon_list or (0,)):
        b = k - 1 if back else 0
        inside = (np.arange(n) >= b) & (np.arange(n) + k < n)
        assert np.isfinite(whole[inside, j]).all() and np.isnan(whole[~inside, j]).all()


# -- labels that read an empty price (source.nan: fill) ------------------------------------


def rows_read(label: LabelSpec, e: int) -> set[int]:
    """The rows the label of a window ending at ``e`` reads, written out per kind from
    the formulas of LabelSpec's docstring."""
    rows = set()
    for k in label.horizon_list:
        if label.kind in ("return", "class"):
            rows |= {e, e + k}
        else:
            rows |= set(range(e + 1, e + k + 1))
            rows |= {e} if label.reference == "current" else set(range(e - k + 1, e + 1))
    return rows


@pytest.mark.parametrize("value", SPECS[:4])
def test_label_gaps_flag_the_windows_whose_label_reads_a_filled_price(value):
    """Against a row-by-row reading of the formulas, whatever the chunking; the gaps are
    exactly the steps whose label a NaN in place of the fill makes NaN."""
    x, cols = book(120, 3)
    rng = np.random.default_rng(7)
    ask, bid = cols.index("ask_price_1"), cols.index("bid_price_1")
    empty_ask, empty_bid = rng.random(120) < 0.04, rng.random(120) < 0.03
    x[empty_ask, ask], x[empty_bid, bid] = 0.0, 0.0  # as source.nan: fill writes them
    label = spec(**value)
    got = label_gaps_numpy(x, cols, label, 0.0)
    n = len(x)
    expected = np.zeros((n, 2), dtype=bool)
    for e in range(n):
        read = [r for r in rows_read(label, e) if 0 <= r < n]
        expected[e] = [empty_bid[read].any(), empty_ask[read].any()]  # required_columns: bid, ask
    np.testing.assert_array_equal(got, expected)
    for chunks in (7, 31, 120):
        lazy = label_gaps(da.from_array(x, chunks=(chunks, -1)), columns=cols, spec=label, empty=0.0)
        np.testing.assert_array_equal(lazy.compute(scheduler="sync"), expected)
    # The same steps as the label's own NaN where the empty prices are NaN, inside the reach.
    holed = x.copy()
    holed[empty_ask, ask], holed[empty_bid, bid] = np.nan, np.nan
    back, fwd = label.reach
    inside = (np.arange(n) >= back) & (np.arange(n) + fwd < n)
    nan_label = ~np.isfinite(label_steps_numpy(holed, cols, label)).all(axis=1)
    np.testing.assert_array_equal(got.any(axis=1)[inside], nan_label[inside])


def test_gaps_message_names_the_empty_column_and_counts_windows():
    label = spec(kind="return", horizon=2)  # reads bid_price_1, ask_price_1
    assert gaps_message(np.zeros((0, 2), dtype=bool), label) is None  # no window at all
    assert gaps_message(np.zeros((5, 2), dtype=bool), label) is None
    reads = np.array([[False, True], [False, True], [True, True], [False, False]])
    assert gaps_message(reads, label).startswith(
        "labels: 3 windows left out: their label reads bid_price_1 (1 window) or ask_price_1 (3 windows) where it "
        "was empty (source.nan: fill)")
    assert gaps_message(reads[:1], label).startswith("labels: 1 window left out: their label reads ask_price_1 where")


def test_label_gaps_refuse_a_column_label():
    x, cols = book(10, 0)
    with pytest.raises(FeatureError, match="column label reads no price"):
        label_gaps(da.from_array(x), columns=cols, spec=spec(kind="column", column="ask_size_2"), empty=0.0)


def test_missing_label_column_fails_before_computing():
    x = da.zeros((10, 2), chunks=5)
    with pytest.raises(FeatureError, match="labels reads column 'bid_price_1', which is not in the source .*source.rename"):
        label_steps(x, columns=["ask_price_1", "a"], spec=LabelSpec())
    with pytest.raises(FeatureError, match="labels reads column 'y', which is not in the source"):
        label_steps(x, columns=["a", "b"], spec=spec(kind="column", column="y"))
    # A feed of mid prices only: the rename advised cannot map one column to both, so
    # the error says what does label it (one side present: the rename is the fix).
    with pytest.raises(FeatureError, match=r"labels reads column 'bid_price_1', .*source\.rename.*; return, class and "
                                           r"smoothed labels move with the mid price of bid_price_1 and ask_price_1.*"
                                           r"labels: \{kind: column, column: <that column>\}$"):
        label_steps(x, columns=["midpoint", "spread"], spec=LabelSpec())
    with pytest.raises(FeatureError) as one_side:
        label_steps(x, columns=["ask_price_1", "a"], spec=LabelSpec())
    assert "kind: column" not in str(one_side.value)


def test_finalize_checks_the_number_of_columns():
    with pytest.raises(FeatureError, match=r"expected values of shape \(n, 2\)"):
        finalize_labels(np.zeros((4, 3)), spec(horizons=[1, 2]))


# -- config ----------------------------------------------------------------------------------


def test_existing_configs_parse_to_the_same_spec():
    assert spec(kind="return", horizon=20, scale=10000) == LabelSpec(horizon=20, scale=10000.0)
    assert spec(kind="class", horizon=5, thresholds=[-2, 2]) == LabelSpec("class", 5, (-2.0, 2.0))
    assert LabelSpec.from_mapping(None, "labels") == LabelSpec()
    assert spec(horizons=[10, 20, 50, 100]).horizon == 100
    assert LabelSpec(kind="column", column="y").horizon == 0
    assert spec().describe() == {"kind": "return", "horizon": 1, "thresholds": [], "scale": 1.0}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"kind": "other"}, "labels.kind: expected one of 'return', 'class', 'smoothed', 'column', got 'other'"),
        ({"kind": ["return"]}, "labels.kind: expected one of 'return', 'class', 'smoothed', 'column', got ['return']"),
        ({"kind": "column"}, "labels.column: missing required key for kind: column"),
        ({"kind": "column", "column": ""}, "labels.column: expected a column name or a non-empty list of column names, got ''"),
        ({"kind": "column", "column": "y", "dtype": "int8"}, "labels.dtype: expected one of 'float32', 'int64'"),
        ({"kind": "column", "column": "y", "horizon": 3}, "labels.horizon: not used by kind: column"),
        ({"kind": "smoothed", "alpha": -0.1}, "labels.alpha: expected a non-negative number, got -0.1"),
        ({"kind": "smoothed", "alpha": True}, "labels.alpha: expected a non-negative number, got True"),
        ({"kind": "smoothed", "reference": "mean"}, "labels.reference: expected one of 'current', 'past_mean'"),
        ({"kind": "smoothed", "thresholds": [0]}, "labels.thresholds: not used by kind: smoothed"),
        ({"kind": "return", "alpha": 1}, "labels.alpha: not used by kind: return"),
        ({"horizn": 3}, "labels.horizn: unknown key (expected one of: kind, alpha,"),
        ({"horizons": [10, 0]}, "labels.horizons.1: expected a positive integer, got 0"),
        ({"horizons": [10, 2.5]}, "labels.horizons.1: expected a positive integer, got 2.5"),
        ({"horizons": [True]}, "labels.horizons.0: expected a positive integer, got True"),
        ({"horizons": 10}, "labels.horizons: expected a non-empty list of positive integers, got 10"),
        ({"horizons": []}, "labels.horizons: expected a non-empty list of positive integers, got []"),
        ({"horizons": [5, 5]}, "labels.horizons: expected distinct positive integers"),
        ({"horizon": 5, "horizons": [5]}, "labels.horizons: give either horizon (one) or horizons (a list), not both"),
        # --set labels.horizons=[] over a file's horizon: the empty list is what to fix.
        ({"horizon": 5, "horizons": []}, "labels.horizons: expected a non-empty list of positive integers, got []"),
        ({"horizon": 0}, "labels.horizon: expected a positive integer, got 0"),
        ({"kind": "class", "thresholds": []}, "labels.thresholds: expected a non-empty list of numbers"),
        ({"scale": float("inf")}, "labels.scale: expected a positive number, got inf"),
        ([1], "labels: expected a mapping, got [1]"),
    ],
)
def test_label_config_errors_name_the_key_path(value, message):
    with pytest.raises(ConfigError) as err:
        LabelSpec.from_mapping(value, "labels")
    assert str(err.value).startswith(message), str(err.value)


def test_a_list_of_label_columns_gives_one_label_per_column_each_mapped(tmp_path):
    # FI-2010's five published horizons, read as numpy reads the published text
    from pipeline.loaders import open_source

    rng = np.random.default_rng(3)
    a = rng.random((149, 30)) + 1.0
    a[144:] = rng.integers(1, 4, size=(5, 30))
    path = tmp_path / "Train_Dst_NoAuction_ZScore_CF_1.txt"
    path.write_text("\n".join("".join(f"  {v:.7e}" for v in row) for row in a) + "\n")
    names = ["label_1", "label_2", "label_3", "label_5", "label_10"]
    label = spec(kind="column", column=names, dtype="int64", map={1: 2, 2: 1, 3: 0})
    assert label.multi and label.width == 5 and label.required_columns == tuple(names) and label.reach == (0, 0)
    assert LabelSpec.from_mapping(label.to_value(), "labels") == label
    src = open_source(str(path), format="fi2010")
    y = finalize_labels(label_steps(src.array, columns=src.columns, spec=label).compute(), label)
    published = np.loadtxt(path).T[:, 144:149]
    expected = np.vectorize({1.0: 2, 2.0: 1, 3.0: 0}.__getitem__)(published)
    assert y.dtype == np.int64 and y.shape == (30, 5)
    np.testing.assert_array_equal(y, expected)
    one = spec(kind="column", column=["label_5"], dtype="int64")  # a list of one is 2-D, as horizons: [k] is
    assert finalize_labels(label_steps(src.array, columns=src.columns, spec=one).compute(), one).shape == (30, 1)


def test_a_list_of_label_columns_names_the_column_a_map_misses():
    label = spec(kind="column", column=["tag", "ask_price_1"], map={1: 0, 3: 1, 4: 1, 5: 1, 9: 1, 2: 0, 6: 0})
    with pytest.raises(FeatureError, match=r"column 'ask_price_1' holds 100.5, which the map does not name"):
        finalize_labels(steps(label), label)
    for bad in ([], ["tag", "tag"], ["tag", 3]):
        with pytest.raises(ConfigError, match=r"^labels\.column: expected"):
            spec(kind="column", column=bad)
