"""Splits and folds: no window of one split shares a step, a lookback step or a label
step with another split; date cuts on session boundaries lose nothing; folds walk
forward."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ConfigError, WindowError
from pipeline.features import LabelSpec, build_training_set
from pipeline.features.sessions import SegmentTable
from pipeline.features.splits import (FoldSpec, NormalizeSpec, assign_splits, fold_sessions, localize_splits,
                                     parse_splits, to_ns)
from tests.features.test_sessions import SPECS, L, _times
from tests.features.test_steps import COLS, book


def reach_rows(ts, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows each window of a virtual split reaches: from its oldest step's lookback to its
    label's last step."""
    ends = ts.splits[name]["ends"].compute().astype(np.int64)
    return ends - ts.attrs["windows"]["back"], ends + ts.attrs["windows"]["fwd"]


@settings(max_examples=100, deadline=None)
@given(lo=st.lists(st.integers(0, 1000), min_size=1, max_size=60), width=st.integers(0, 30),
       cuts=st.lists(st.integers(0, 1030), min_size=0, max_size=3, unique=True))
def test_assign_splits_never_puts_a_straddling_window_in_a_split(lo, width, cuts):
    lo = np.asarray(lo)
    hi = lo + width
    cuts = sorted(cuts)
    names = [f"s{i}" for i in range(len(cuts) + 1)]
    where = assign_splits(lo, hi, cuts, names)
    bounds = [-np.inf, *cuts, np.inf]
    for i in range(lo.size):
        inside = [k for k in range(len(names)) if bounds[k] <= lo[i] and hi[i] < bounds[k + 1]]
        assert where[i] == (inside[0] if inside else -1)


@pytest.mark.parametrize("lengths", [[900], [300, 250, 350]])
def test_fraction_splits_share_no_step(lengths):
    x = book(sum(lengths), seed=2)
    ts = build_training_set(da.from_array(x, chunks=(101, -1)), columns=COLS, features=SPECS, size=6, stride=2,
                            scales=(1, 3), label=LabelSpec(horizon=4), segments=SegmentTable.from_lengths(lengths),
                            splits={"train": 0.6, "val": 0.2, "test": 0.2}, materialize=False)
    spans = [reach_rows(ts, name) for name in ("train", "val", "test")]
    for (a_lo, a_hi), (b_lo, b_hi) in zip(spans, spans[1:]):
        assert a_hi.max() < b_lo.min()
    counts = ts.attrs["window_counts"]
    total = sum(counts.values())
    assert abs(counts["train"] / total - 0.6) < 0.05


def test_fraction_splits_of_several_instruments_cut_every_one_at_the_same_time():
    lengths = [150, 160, 140, 155, 165, 145]
    days = [0, 1, 2, 0, 1, 2]
    x = book(sum(lengths), seed=9)
    t = _times(lengths, days)
    table = SegmentTable.from_lengths(lengths, instrument=[0, 0, 0, 1, 1, 1], session=days, instruments=["A", "B"])
    kw = dict(columns=COLS, features=SPECS, size=5, stride=1, scales=(1,), label=LabelSpec(horizon=3),
              segments=table, splits={"train": 0.5, "test": 0.5}, materialize=False)
    with pytest.raises(WindowError, match="timestamps"):
        build_training_set(da.from_array(x, chunks=(100, -1)), **kw)
    ts = build_training_set(da.from_array(x, chunks=(100, -1)), timestamps=da.from_array(t, chunks=90), **kw)
    (tr_lo, tr_hi), (te_lo, te_hi) = reach_rows(ts, "train"), reach_rows(ts, "test")
    assert t[tr_hi].max() < t[te_lo].min()  # in time, across both instruments
    for name in ("train", "test"):
        assert set(ts.splits[name]["instrument"].compute().tolist()) == {0, 1}


def test_date_splits_without_timestamps_are_refused_with_the_fix():
    x = book(300, seed=1)
    with pytest.raises(WindowError, match="source.timestamp"):
        build_training_set(da.from_array(x, chunks=(100, -1)), columns=COLS, features=SPECS, size=4,
                           label=LabelSpec(horizon=2), splits={"train": {"until": to_ns("2026-01-06", "u")},
                                                               "test": {"until": None}})


@pytest.mark.parametrize("normalize", ["global", "none"])
def test_a_date_split_before_the_data_is_refused_naming_it(normalize):
    lengths = [400]
    x = book(400, seed=4)
    t = _times(lengths, [0])
    with pytest.raises(WindowError, match=r"split 'train': no window left \(.* 0 in this split"):
        build_training_set(da.from_array(x, chunks=(64, -1)), columns=COLS, features=SPECS, size=4,
                           label=LabelSpec(horizon=5), segments=SegmentTable.from_lengths(lengths),
                           splits={"train": {"until": int(t[0])}, "test": {"until": None}}, normalize=normalize,
                           timestamps=da.from_array(t, chunks=100))


def test_a_date_split_inside_the_sessions_trailing_normalization_skips_says_so():
    # Three daily sessions, trailing normalization over 2: only the third day has
    # windows, so a train split until the third day is empty for that reason alone.
    lengths = [300, 300, 300]
    x = book(900, seed=4)
    t = _times(lengths, [0, 1, 2])
    kw = dict(columns=COLS, features=SPECS, size=4, label=LabelSpec(horizon=5),
              segments=SegmentTable.from_lengths(lengths, session=[0, 1, 2]),
              splits={"train": {"until": int(t[600])}, "test": {"until": None}},
              timestamps=da.from_array(t, chunks=100))
    with pytest.raises(WindowError, match=r"split 'train': no window left .*trailing normalization serves no "
                                          r"window of each instrument's first 2 sessions"):
        build_training_set(da.from_array(x, chunks=(64, -1)), normalize={"kind": "trailing", "sessions": 2}, **kw)
    with pytest.raises(WindowError, match=r"no window left") as plain:
        build_training_set(da.from_array(x, chunks=(64, -1)), normalize={"kind": "trailing", "sessions": 1},
                           **{**kw, "splits": {"train": {"until": int(t[300])}, "test": {"until": None}}})
    assert "trailing normalization serves no window of each instrument's first session" in str(plain.value)


def test_date_splits_after_the_data_are_empty_and_one_between_two_is_refused():
    """A daily store set up before its validation and test days exist: the splits after
    the data are empty (appended days fill them); the first split holds what a single
    split would. An empty split with windows after it is still refused."""
    lengths = [300, 300]
    x = book(600, seed=4)
    t = _times(lengths, [0, 1])
    kw = dict(columns=COLS, features=SPECS, size=4, label=LabelSpec(horizon=5), normalize="global",
              segments=SegmentTable.from_lengths(lengths, session=[0, 1]), timestamps=da.from_array(t, chunks=100))
    after = int(t[-1]) + 10**9
    ts = build_training_set(da.from_array(x, chunks=(64, -1)), **kw,
                            splits={"train": {"until": after}, "val": {"until": after + 86_400 * 10**9},
                                    "test": {"until": None}})
    alone = build_training_set(da.from_array(x, chunks=(64, -1)), **kw, splits={"train": 1.0})
    assert [ts.splits[s]["x"].shape[0] for s in ("val", "test")] == [0, 0]
    np.testing.assert_array_equal(ts.splits["train"]["x"].compute(), alone.splits["train"]["x"].compute())
    with pytest.raises(WindowError, match=r"split 'val': no window left"):
        build_training_set(da.from_array(x, chunks=(64, -1)), **kw,
                           splits={"train": {"until": int(t[300])}, "val": {"until": int(t[300]) + 1},
                                   "test": {"until": None}})


def test_date_splits_inside_one_session_leave_the_straddling_windows_out():
    lengths = [400]
    x = book(400, seed=4)
    t = _times(lengths, [0])
    cut = int(t[200])
    ts = build_training_set(da.from_array(x, chunks=(64, -1)), columns=COLS, features=SPECS, size=4, stride=1,
                            scales=(1,), label=LabelSpec(horizon=5), segments=SegmentTable.from_lengths(lengths),
                            splits={"train": {"until": cut}, "test": {"until": None}},
                            timestamps=da.from_array(t, chunks=100), materialize=False)
    (a_lo, a_hi), (b_lo, b_hi) = reach_rows(ts, "train"), reach_rows(ts, "test")
    assert t[a_hi].max() < cut <= t[b_lo].min()
    assert a_hi.max() == 199 and b_lo.min() == 200  # every window that fits on either side is kept


@pytest.mark.parametrize("kind", ["anchored", "rolling"])
def test_folds_walk_forward_over_sessions_and_share_no_step(kind):
    lengths = [120, 130, 110, 125, 140, 115]
    x = book(sum(lengths), seed=6)
    spec = FoldSpec(kind=kind, test_sessions=1, min_train_sessions=2)
    ts = build_training_set(da.from_array(x, chunks=(90, -1)), columns=COLS, features=SPECS, size=4, stride=2,
                            scales=(1, 2), label=LabelSpec(horizon=3), segments=SegmentTable.from_lengths(lengths),
                            folds=spec, materialize=False)
    lo, hi = reach_rows(ts, "train")
    session = ts.splits["train"]["session"].compute()
    assert ts.attrs["folds"]["count"] == 4
    for k in range(4):
        train, test = ts.folds[f"fold{k}/train"], ts.folds[f"fold{k}/test"]
        assert set(session[test].tolist()) == {k + 2}
        want = set(range(0, k + 2)) if kind == "anchored" else {k, k + 1}
        assert set(session[train].tolist()) == want
        assert hi[train].max() < lo[test].min()
        assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)
    # Global statistics come from the first fold's training sessions only.
    assert ts.attrs["normalization"]["fit_on"] == "fold0/train"


@settings(max_examples=100, deadline=None)
@given(periods=st.integers(0, 30), test=st.integers(1, 4), min_train=st.integers(1, 6),
       train=st.one_of(st.none(), st.integers(1, 6)), kind=st.sampled_from(["anchored", "rolling"]))
def test_fold_sessions_arithmetic(periods, test, min_train, train, kind):
    spec = FoldSpec(kind=kind, test_sessions=test, min_train_sessions=min_train, train_sessions=train)
    if periods < min_train + test:
        with pytest.raises(WindowError, match="too few"):
            fold_sessions(periods, spec)
        return
    folds = fold_sessions(periods, spec)
    assert len(folds) == (periods - min_train) // test
    for i, (tr, te) in enumerate(folds):
        assert te.tolist() == list(range(min_train + i * test, min_train + (i + 1) * test))
        assert tr.max() == te.min() - 1
        assert tr.min() == 0 if kind == "anchored" else tr.size == min(te.min(), train or min_train)


def test_split_and_fold_specs_refuse_bad_values():
    assert parse_splits({"a": 0.5, "b": 0.5}, "s") == {"a": 0.5, "b": 0.5}
    dated = parse_splits({"a": {"until": "2026-01-08"}, "b": {}}, "s")
    assert dated["a"]["until"] == int(np.datetime64("2026-01-08", "ns").astype(np.int64))
    bad = [
        ({"a": 0.5, "b": {"until": "2026-01-08"}}, "s"),
        ({"a": {}, "b": {"until": "2026-01-08"}}, "s.a.until"),
        ({"a": {"until": "2026-01-09"}, "b": {"until": "2026-01-08"}}, "s.b.until"),
        ({"a": {"until": "tomorrow"}, "b": {}}, "s.a.until"),
        ({"a": {"from": "2026-01-01"}}, "s.a.from"),
        ({"a": 0.7, "b": 0.7}, "s"),
    ]
    for value, path in bad:
        with pytest.raises(ConfigError, match=rf"^{path}"):
            parse_splits(value, "s")
    assert NormalizeSpec.from_value({"kind": "trailing", "sessions": 3}, "n").sessions == 3
    for value in ("zscore", {"kind": "trailing"}, {"kind": "trailing", "sessions": 0}):
        with pytest.raises(ConfigError, match="^n"):
            NormalizeSpec.from_value(value, "n")
    for value in ({"kind": "expanding"}, {"test_sessions": 0}, {"every": 1}, 3):
        with pytest.raises(ConfigError, match="^f"):
            FoldSpec.from_value(value, "f")


@pytest.mark.parametrize("tz", ["Australia/Sydney", "America/Sao_Paulo", "UTC", None])
def test_date_splits_take_their_dates_in_the_zone_of_the_data(tz):
    """``until: 2026-01-09`` of Sydney data is Sydney's midnight (pandas' instant); in
    Sao Paulo 2018-11-04 had no midnight (clocks went 00:00 -> 01:00): the day starts at
    01:00; naive data and UTC keep the value."""
    import pandas as pd

    day = "2018-11-04" if tz == "America/Sao_Paulo" else "2026-01-09"
    splits = parse_splits({"train": {"until": day}, "test": {}}, "s")
    got = localize_splits(splits, tz)
    for name, bound in splits.items():
        if bound["until"] is None:
            assert got[name]["until"] is None
            continue
        wall = pd.Timestamp(int(bound["until"]), unit="ns")
        expect = (wall.tz_localize(tz, nonexistent="shift_forward", ambiguous=True).value if tz else wall.value)
        assert got[name]["until"] == expect
    assert localize_splits({"train": 0.8, "test": 0.2}, tz) == {"train": 0.8, "test": 0.2}


@pytest.mark.parametrize("aware", [True, False])
def test_calendar_splits_cut_at_the_open_of_that_trading_dates_session(aware):
    """``until`` a trading date is its session's open (futures: 18:00 New York the
    evening before); a weekend date is the next session's; naive timestamps get the
    open's wall-clock time in the calendar's zone."""
    pytest.importorskip("exchange_calendars")
    import warnings

    import exchange_calendars as xcals
    import pandas as pd

    from pipeline.features.splits import calendar_splits, parse_splits

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sched = xcals.get_calendar("us_futures", start="2024-03-01", end="2024-03-29").schedule
    splits = parse_splits({"train": {"until": "2024-03-09"}, "val": {"until": "2024-03-12"}, "test": {}}, "s")
    got = calendar_splits(splits, "us_futures", aware=aware)
    opens = [sched.loc["2024-03-11", "open"], sched.loc["2024-03-12", "open"]]  # the 9th is a Saturday
    want = [o.value if aware else o.tz_convert("America/New_York").tz_localize(None).value for o in opens]
    assert [got["train"]["until"], got["val"]["until"], got["test"].get("until")] == [*want, None]
    assert pd.Timestamp(got["val"]["until"], tz="UTC" if aware else None).day == 11  # the evening before


@pytest.mark.parametrize("splits", [
    {"train": {"until": "2026-01-06"}, "test": {}},
    {"train": {"until": "2026-01-06"}, "test": {"until": None}},
    {"train": {"until": "2026-01-06T00:00"}, "test": None},
    {"train": {"until": __import__("pandas").Timestamp("2026-01-06")}, "test": {}},
    {"train": {"until": __import__("datetime").date(2026, 1, 6)}, "test": {}},
    {"train": {"until": np.datetime64("2026-01-06")}, "test": {}},
])
def test_build_training_set_takes_date_splits_in_every_documented_form(splits):
    """The documented form crashed with a bare KeyError ('until') or a UFuncTypeError
    unless parse_splits had been called first: build_training_set parses it itself."""
    import pandas as pd

    lengths = [300, 300]
    x = book(600, seed=4)
    t = _times(lengths, [0, 1])
    kw = dict(columns=COLS, features=SPECS, size=4, label=LabelSpec(horizon=2), normalize="none",
              segments=SegmentTable.from_lengths(lengths), timestamps=da.from_array(t, chunks=100))
    ts = build_training_set(da.from_array(x, chunks=(64, -1)), splits=splits, **kw)
    parsed = build_training_set(da.from_array(x, chunks=(64, -1)), **kw,
                                splits=parse_splits({"train": {"until": "2026-01-06"}, "test": {}}, "s"))
    cut = pd.Timestamp("2026-01-06").value
    assert (ts.splits["train"]["t"].compute() < cut).all() and (ts.splits["test"]["t"].compute() >= cut).all()
    assert ts.attrs["window_counts"] == {"train": 300 - 3 - L - 2, "test": 300 - 3 - L - 2}
    for name in ("train", "test"):
        np.testing.assert_array_equal(ts.splits[name]["x"].compute(), parsed.splits[name]["x"].compute())


def test_build_training_set_names_a_malformed_split_by_its_key():
    x = book(300, seed=4)
    kw = dict(columns=COLS, features=SPECS, size=4, label=LabelSpec(horizon=2),
              timestamps=da.from_array(_times([300], [0]), chunks=100))
    for splits, path in (({"train": {"until": "someday"}, "test": {}}, "splits.train.until"),
                         ({"train": {}, "test": {"until": "2026-01-06"}}, "splits.train.until"),
                         ({"train": 0.5, "test": {}}, "splits")):
        with pytest.raises(ConfigError, match=rf"^{path}"):
            build_training_set(da.from_array(x, chunks=(64, -1)), splits=splits, **kw)


def test_global_normalization_per_instrument_parses_and_renders_back():
    per = NormalizeSpec.from_value({"kind": "global", "per": "instrument"}, "n")
    assert (per.kind, per.per) == ("global", "instrument")
    assert NormalizeSpec.from_value(per.to_value(), "n") == per
    assert NormalizeSpec.from_value({"kind": "global"}, "n") == NormalizeSpec.from_value("global", "n")
    assert NormalizeSpec.from_value("global", "n").to_value() == "global"  # stores' configs unchanged
    for value, path in (({"kind": "global", "per": "venue"}, "n.per"), ({"kind": "global", "by": "x"}, "n.by"),
                        ({"kind": "trailing", "sessions": 1, "per": "instrument"}, "n.per")):
        with pytest.raises(ConfigError, match=rf"^{path}"):
            NormalizeSpec.from_value(value, "n")
