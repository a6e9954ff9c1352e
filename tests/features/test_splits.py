"""Splits and folds: no window of one split shares a step, a lookback step or a label
step with another split; date cuts on session boundaries lose nothing; folds walk
forward."""

from __future__ import annotations

import functools
import warnings

import dask.array as da
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.errors import ConfigError, WindowError
from pipeline.features import FeatureSpec, LabelSpec, build_training_set
from pipeline.features.sessions import SegmentTable
from pipeline.features.splits import (FoldSpec, NormalizeSpec, as_splits, assign_splits, fold_sessions,
                                     localize_splits, parse_splits, to_ns)
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
    # A split narrower than what its cuts leave out: the cuts are named, not NaN.
    with pytest.raises(WindowError, match=r"split 'val': no window left \(\d+ windows in all, 0 in this split; \d+ "
                                          r"left out across the cuts between splits, as a window whose history or "
                                          r"label spans a cut is, splits"):
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
        ({"a": {"from": "2026-01-01"}, "b": {"until": "2026-01-08"}}, "s.a.until"),
        ({"a": {"from": "2026-01-09", "until": "2026-01-08"}, "b": {}}, "s.a.until"),
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


# -- published splits (dates, files), from: bounds, embargoes -----------------------------

DAYS = ["2026-01-05", "2026-01-06", "2026-01-07", "2026-01-08", "2026-01-09"]


def _five_days(instruments: int = 2):
    """``instruments`` instruments on the five days of :data:`DAYS`, a session a day each."""
    lengths = [70, 85, 60, 90, 75, 80, 65, 95, 70, 85][: 5 * instruments]
    days = list(range(5)) * instruments
    inst = np.repeat(np.arange(instruments), 5)
    segs = SegmentTable.from_lengths(lengths, instrument=inst, instruments=[f"i{k}" for k in range(instruments)])
    return book(sum(lengths), seed=5), segs, _times(lengths, days)


def _build(x, segs, t, splits, **kw):
    return build_training_set(da.from_array(x, chunks=(97, -1)), columns=COLS, features=SPECS, size=4, stride=2,
                              scales=(1, 2), label=LabelSpec(horizon=3), segments=segs,
                              timestamps=da.from_array(t, chunks=211), splits=splits, materialize=False, **kw)


def _candidates(segs, t, back: int, fwd: int, stride: int = 2):
    """Every window that fits a session, from the documented geometry alone, with the
    timestamps of its reach (pandas)."""
    import pandas as pd

    ends = np.concatenate([np.arange(a + back, b - fwd, stride) for a, b in zip(segs.starts, segs.stops)])
    return pd.DataFrame({"end": ends, "lo": pd.to_datetime(t[ends - back]), "hi": pd.to_datetime(t[ends + fwd])})


def _stored_ends(ts) -> dict[str, set[int]]:
    return {name: set(ts.splits[name]["ends"].compute().astype(np.int64).tolist()) for name in ts.splits}


def _by_dates(c, assignment: dict[str, list[str]]) -> dict[str, set[int]]:
    """Which windows land where by pandas: a window is in the split listing its date when
    its whole reach lies on that date."""
    import pandas as pd

    day = c["lo"].dt.normalize()
    same = day == c["hi"].dt.normalize()
    return {name: set(c.loc[same & day.isin(pd.to_datetime(d)), "end"].tolist()) for name, d in assignment.items()}


def test_published_date_lists_place_each_window_by_its_sessions_date():
    """val lies between train days, as published splits may: every window goes to the
    split that lists its session's date (pandas' date of its first and last step)."""
    x, segs, t = _five_days()
    assignment = {"train": [DAYS[0], DAYS[1], DAYS[3]], "val": [DAYS[2]], "test": [DAYS[4]]}
    ts = _build(x, segs, t, parse_splits({k: {"dates": v} for k, v in assignment.items()}, "s"))
    w = ts.attrs["windows"]
    want = _by_dates(_candidates(segs, t, w["back"], w["fwd"]), assignment)
    assert _stored_ends(ts) == want
    # Cuts on day boundaries with daily sessions: no window reaches across one.
    assert all(want.values()) and ts.attrs["split_left_out"] == {"outside": 0, "across": 0}


def test_a_split_file_assigns_dates_and_windows_on_unlisted_dates_are_counted_and_left_out(tmp_path):
    x, segs, t = _five_days()
    (tmp_path / "splits.csv").write_text("date,split,note\n2026-01-05,train,\n2026-01-06,train,x\n"
                                         "2026-01-07,val,\n2026-01-08,test,\n")
    splits = parse_splits({"file": str(tmp_path / "splits.csv")}, "output.splits")
    assert list(splits) == ["train", "val", "test"]
    with pytest.warns(UserWarning, match=r"windows start on dates no split lists \(the first at 2026-01-09"):
        ts = _build(x, segs, t, splits)
    w = ts.attrs["windows"]
    c = _candidates(segs, t, w["back"], w["fwd"])
    want = _by_dates(c, {"train": DAYS[:2], "val": [DAYS[2]], "test": [DAYS[3]]})
    assert _stored_ends(ts) == want
    assert ts.attrs["split_left_out"]["outside"] == int((c["lo"].dt.normalize() == DAYS[4]).sum()) > 0


def test_a_listed_date_without_data_is_refused_and_one_after_the_data_waits_for_an_append():
    x, segs, t = _five_days(1)
    lacking = {"train": {"dates": DAYS[:3]}, "test": {"dates": ["2026-01-03", DAYS[4]]}}
    with pytest.raises(WindowError, match=r"split 'test' lists 1 date\(s\) that none of its windows reaches into: "
                                          r"2026-01-03 \(1 such dates in all splits"):
        _build(x, segs, t, parse_splits(lacking, "s"))
    # A day whose session is too short for one window has data, but gives val nothing.
    short = SegmentTable.from_lengths([70, 85, 6, 90, 75])
    t_short = _times([70, 85, 6, 90, 75], [0, 1, 2, 3, 4])
    with pytest.raises(WindowError, match=r"split 'val' lists 1 date\(s\) that none of its windows reaches into: "
                                          r"2026-01-07 .*no window's reach \(history to label\) fits"):
        _build(book(326, seed=1), short, t_short,
               parse_splits({"train": {"dates": [DAYS[0], DAYS[1], DAYS[3]]}, "val": {"dates": [DAYS[2]]},
                             "test": {"dates": [DAYS[4]]}}, "s"))
    later = {"train": {"dates": DAYS[:4]}, "test": {"dates": ["2026-01-12"]}}  # after the data: empty for now
    with pytest.warns(UserWarning, match="31 of 159 windows start on dates no split lists"):  # the 9th
        ts = _build(x, segs, t, parse_splits(later, "s"), normalize="none")
    assert ts.attrs["window_counts"]["test"] == 0 and ts.attrs["window_counts"]["train"] > 0


@pytest.mark.parametrize("text, match", [
    ("day,split\n2026-01-05,train\n", "header row with columns date and split"),
    ("date,split\n2026-01-05,train\n2026-01-5x,val\n", "line 3"),
    ("date,split\n2026-01-05,train\n2026-01-05,val\n", "line 3: date 2026-01-05 is already assigned on line 2"),
    ("date,split\n2026-01-05T10:00,train\n", "line 2: expected a date without a time of day"),
    ("date,split\n2026-01-05,train set\n", "line 2: expected a split name"),
    ("date,split\n", "no date assigned"),
])
def test_a_malformed_split_file_is_refused_naming_the_file_and_line(tmp_path, text, match):
    path = tmp_path / "splits.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"^output\.splits\.file") as err:
        parse_splits({"file": str(path)}, "output.splits")
    assert match in str(err.value) and (str(path) in str(err.value) or "no date" not in match)


@pytest.mark.parametrize("value, path, match", [
    ({"a": {"dates": ["2026-01-05"], "until": "2026-01-06"}, "b": {}}, "s.a.until", "dates or by from/until"),
    ({"a": {"dates": ["2026-01-05T12:00"]}}, r"s.a.dates\[0\]", "without a time of day"),
    ({"a": {"dates": "2026-01-05"}}, "s.a.dates", "a list of dates"),
    ({"a": {"dates": ["2026-01-05", "2026-01-05"]}}, "s.a.dates", "listed twice"),
    ({"a": {"dates": ["2026-01-05"]}, "b": {"dates": ["2026-01-05"]}}, "s.b.dates", "also in split 'a'"),
    ({"a": {"until": "2026-01-08"}, "b": {"dates": ["2026-01-06"]}, "c": {"from": "2026-01-09"}}, "s.b.dates",
     "also in split 'a'"),
    ({"a": {"until": "2026-01-08"}, "b": {"from": "2026-01-07"}}, "s.b.from", "on or after the previous"),
    ({"a": {"until": "2026-01-08", "embargo": "soon"}, "b": {}}, "s.a.embargo", "a duration"),
    ({"a": 0.8, "b": {"embargo": "1h"}}, "s", "an embargo needs dated splits"),
    ({"file": "x.csv", "a": {}}, "s.a", "unknown key beside file"),
])
def test_misused_split_bounds_are_refused_naming_the_key(value, path, match):
    with pytest.raises(ConfigError, match=rf"^{path}") as err:
        parse_splits(value, "s")
    assert match in str(err.value)


def test_splits_round_trip_through_their_config_value_and_the_parsed_form():
    from pipeline.features.splits import as_splits, splits_value

    value = {"train": {"from": "2026-01-02", "until": "2026-01-08", "embargo": "90min"},
             "val": {"dates": ["2026-01-12", "2026-01-09"], "embargo": "1h"}, "test": {"from": "2026-01-13"}}
    parsed = parse_splits(value, "s")
    assert parsed["val"]["dates"][0][0] == to_ns("2026-01-09", "d") and parsed["train"]["embargo"] == 5400 * 10**9
    assert parse_splits(splits_value(parsed), "s") == parsed == as_splits(parsed)
    assert splits_value(parsed)["train"]["embargo"] == "90min"


def test_a_from_bound_leaves_a_warm_up_out_of_every_split():
    import pandas as pd

    x, segs, t = _five_days()
    start = "2026-01-06T09:30:20"  # inside the second day's sessions: windows reaching before it are out
    ts = _build(x, segs, t, parse_splits({"train": {"from": start, "until": DAYS[3]}, "test": {}}, "s"))
    w = ts.attrs["windows"]
    c = _candidates(segs, t, w["back"], w["fwd"])
    lo, cut = pd.Timestamp(start), pd.Timestamp(DAYS[3])
    want = {"train": set(c.loc[(c["lo"] >= lo) & (c["hi"] < cut), "end"]), "test": set(c.loc[c["lo"] >= cut, "end"])}
    assert _stored_ends(ts) == want
    assert ts.attrs["split_left_out"]["outside"] == int((c["lo"] < lo).sum()) > 0


def _embargoed(c, split_of, embargo: str, name: str, others: list[str]) -> set[int]:
    """pandas: windows of ``name`` whose last step is less than ``embargo`` before the
    first step of the next window of another split (in ``others``) after it starts."""
    import pandas as pd

    mine = c[c["end"].isin(split_of[name])]
    other_lo = np.sort(c.loc[c["end"].isin(set().union(*(split_of[o] for o in others))), "lo"].to_numpy())
    out = set()
    for end, lo, hi in mine[["end", "lo", "hi"]].itertuples(index=False):
        later = other_lo[other_lo > np.datetime64(lo)]
        if later.size and pd.Timestamp(later[0]) - hi < pd.Timedelta(embargo):
            out.add(end)
    return out


def test_an_embargo_leaves_out_the_windows_that_end_too_close_to_the_next_split():
    """A cut inside a session, with a 20 s embargo on train: the train windows whose
    label ends less than 20 s before test's first step are left out, and counted."""
    import pandas as pd

    x, segs, t = _five_days()
    cut = "2026-01-06T09:31:00"
    plain = _build(x, segs, t, parse_splits({"train": {"until": cut}, "test": {}}, "s"))
    ts = _build(x, segs, t, parse_splits({"train": {"until": cut, "embargo": "20s"}, "test": {}}, "s"))
    w = ts.attrs["windows"]
    c = _candidates(segs, t, w["back"], w["fwd"])
    cut_at = pd.Timestamp(cut)
    before = {"train": set(c.loc[c["hi"] < cut_at, "end"]), "test": set(c.loc[c["lo"] >= cut_at, "end"])}
    assert _stored_ends(plain) == before
    dropped = _embargoed(c, before, "20s", "train", ["test"])
    assert dropped and _stored_ends(ts) == {"train": before["train"] - dropped, "test": before["test"]}
    assert ts.attrs["split_left_out"]["embargo"] == {"train": len(dropped)}


def test_the_left_out_counts_and_the_stored_windows_add_up_to_the_windows_made():
    """A warm-up before a ``from``, a cut inside a session between train and val, an
    embargo on train, and date-list test days: pandas places each window by its reach
    and counts, apart, those starting outside every split, those reaching across a cut
    and those the embargo takes; ``split_left_out`` holds the same three counts, and they
    and the stored windows add up to every window made."""
    import pandas as pd

    x, segs, t = _five_days()
    start, cut = pd.Timestamp("2026-01-05T09:30:20"), pd.Timestamp("2026-01-06T09:31:00")
    splits = parse_splits({"train": {"from": str(start), "until": str(cut), "embargo": "20s"},
                           "val": {"until": DAYS[3]}, "test": {"dates": DAYS[3:]}}, "s")
    with pytest.warns(UserWarning, match="windows start on dates no split lists"):  # the warm-up
        ts = _build(x, segs, t, splits)
    w = ts.attrs["windows"]
    c = _candidates(segs, t, w["back"], w["fwd"])
    end = pd.Timestamp(DAYS[3])
    placed = {"train": set(c.loc[(c["lo"] >= start) & (c["hi"] < cut), "end"]),
              "val": set(c.loc[(c["lo"] >= cut) & (c["hi"] < end), "end"]),
              "test": set(c.loc[c["lo"] >= end, "end"])}
    outside = int((c["lo"] < start).sum())
    across = len(c) - outside - sum(len(v) for v in placed.values())
    embargoed = _embargoed(c, placed, "20s", "train", ["val", "test"])
    left = ts.attrs["split_left_out"]
    assert across > 0 and embargoed and outside > 0
    assert left == {"outside": outside, "across": across, "embargo": {"train": len(embargoed)}}
    stored = sum(ts.attrs["window_counts"].values())
    assert stored + left["outside"] + left["across"] + sum(left["embargo"].values()) == len(c)


@pytest.mark.parametrize("fractions", [{"train": 0.6, "val": 0.2, "test": 0.2}, {"train": 0.5, "test": 0.3}])
def test_fraction_splits_count_the_windows_over_a_cut_and_past_their_share(fractions):
    """Fraction cuts inside sessions: the windows whose reach holds a cut (by the stored
    ``split_cuts``, counted with numpy) are ``across``; fractions that sum below 1
    leave the latest windows ``outside``; with the stored ones they are every window."""
    lengths = [300, 250, 350]
    x = book(sum(lengths), seed=2)
    segs = SegmentTable.from_lengths(lengths)
    ts = build_training_set(da.from_array(x, chunks=(101, -1)), columns=COLS, features=SPECS, size=6, stride=2,
                            scales=(1, 3), label=LabelSpec(horizon=4), segments=segs, splits=fractions,
                            materialize=False)
    w = ts.attrs["windows"]
    ends = np.concatenate([np.arange(a + w["back"], b - w["fwd"], 2) for a, b in zip(segs.starts, segs.stops)])
    lo, hi = ends - w["back"], ends + w["fwd"]
    cuts = ts.attrs["split_cuts"]
    assert len(cuts) == len(fractions) - 1
    over = np.zeros(ends.size, dtype=bool)
    for cut in cuts:
        over |= (lo < cut) & (hi >= cut)
    left = ts.attrs["split_left_out"]
    assert left["across"] == int(over.sum()) > 0
    stored = sum(ts.attrs["window_counts"].values())
    assert stored + left["across"] + left.get("outside", 0) == ends.size
    assert ("outside" in left) == (sum(fractions.values()) < 1)


def test_an_embargo_beside_dated_splits_is_every_splits_unless_one_gives_its_own():
    """``embargo: 20s`` beside interval or date-list splits gives each split that
    embargo (one given inside a split wins); the build leaves out the windows pandas
    finds within it of the next split, as the per-split form does."""
    import pandas as pd

    x, segs, t = _five_days()
    cut = "2026-01-06T09:31:00"
    top = parse_splits({"train": {"until": cut}, "test": {}, "embargo": "20s"}, "s")
    assert top == parse_splits({"train": {"until": cut, "embargo": "20s"}, "test": {"embargo": "20s"}}, "s")
    own = parse_splits({"train": {"until": cut, "embargo": "1h"}, "test": {}, "embargo": "20s"}, "s")
    assert [own["train"]["embargo"], own["test"]["embargo"]] == [3600 * 10**9, 20 * 10**9]
    listed = {"train": {"dates": DAYS[:2]}, "test": {"dates": DAYS[2:]}, "embargo": "90min"}
    assert {k: v["embargo"] for k, v in parse_splits(listed, "s").items()} == {"train": 5400 * 10**9,
                                                                                 "test": 5400 * 10**9}
    ts = _build(x, segs, t, top)
    w = ts.attrs["windows"]
    c = _candidates(segs, t, w["back"], w["fwd"])
    cut_at = pd.Timestamp(cut)
    before = {"train": set(c.loc[c["hi"] < cut_at, "end"]), "test": set(c.loc[c["lo"] >= cut_at, "end"])}
    dropped = _embargoed(c, before, "20s", "train", ["test"])
    assert dropped and _stored_ends(ts) == {"train": before["train"] - dropped, "test": before["test"]}


@pytest.mark.parametrize("value, path, match", [
    ({"train": 0.8, "val": 0.2, "embargo": "1h"}, "s.embargo",
     "an embargo needs dated splits ({until: date}, {from: date, until: date}, {dates: [date, ...]}, or "
     "{file: splits.csv}), with embargo: 1h beside them or per split (train: {until: date, embargo: 1h})"),
    ({"train": 0.8, "val": {"until": "2026-01-08"}}, "s",
     "expected fractions for every split, or dated splits for every split ({until: date}, {from: date, until: "
     "date}, {dates: [date, ...]}, or {file: splits.csv}; an embargo needs dated splits)"),
    ({"train": {"until": "2026-01-08"}, "test": {}, "embargo": "soon"}, "s.embargo", "a duration such as '30min'"),
    ({"train": 0.8, "embargo": 0.2}, "s.embargo", "a duration such as '30min'"),
    ({"embargo": "1h"}, "s", "splits beside embargo"),
])
def test_a_misplaced_embargo_is_refused_naming_the_dated_forms(value, path, match):
    with pytest.raises(ConfigError, match=rf"^{path}:") as err:
        parse_splits(value, "s")
    assert match in str(err.value)


def test_an_embargo_between_interleaved_date_splits_looks_at_the_next_split_in_time():
    """train on days 1, 3, 5 and val on 2, 4, with a train embargo longer than a night:
    the train days before a val day lose their late windows, the last one none."""
    x, segs, t = _five_days()
    assignment = {"train": [DAYS[0], DAYS[2], DAYS[4]], "val": [DAYS[1], DAYS[3]]}
    embargo = "86390s"  # a day less 10 s: reaches into the previous day's last 10 s before the next open
    ts = _build(x, segs, t, parse_splits({"train": {"dates": assignment["train"], "embargo": embargo},
                                          "val": {"dates": assignment["val"]}}, "s"))
    w = ts.attrs["windows"]
    c = _candidates(segs, t, w["back"], w["fwd"])
    before = _by_dates(c, assignment)
    dropped = _embargoed(c, before, embargo, "train", ["val"])
    assert dropped and _stored_ends(ts) == {"train": before["train"] - dropped, "val": before["val"]}
    assert not dropped & set(c.loc[c["lo"].dt.normalize() == DAYS[4], "end"])


def test_dates_and_from_bounds_are_taken_in_the_zone_of_the_data():
    import pandas as pd

    splits = parse_splits({"warm": {"until": "2026-01-05"}, "train": {"from": "2026-01-06", "until": "2026-01-08"},
                           "val": {"dates": ["2026-01-09"]}}, "s")
    got = localize_splits(splits, "Australia/Sydney")

    def sydney(day: str) -> int:
        return pd.Timestamp(day).tz_localize("Australia/Sydney").value

    assert got["train"]["from"] == sydney("2026-01-06") and got["train"]["until"] == sydney("2026-01-08")
    assert got["val"]["dates"] == [[to_ns("2026-01-09", "d"), sydney("2026-01-09"), sydney("2026-01-10")]]


@pytest.mark.parametrize("aware", [True, False])
def test_listed_trading_dates_span_their_calendar_session_and_a_weekend_spans_nothing(aware):
    """Under a futures calendar, trading date 2024-03-12 spans from its open (18:00 New
    York on the 11th) to the next session's open; Saturday the 9th has no session."""
    pytest.importorskip("exchange_calendars")
    import warnings

    import exchange_calendars as xcals

    from pipeline.features.splits import calendar_splits, split_spans

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sched = xcals.get_calendar("us_futures", start="2024-03-01", end="2024-03-29").schedule
    got = calendar_splits(parse_splits({"val": {"dates": ["2024-03-09", "2024-03-12"]}}, "s"), "us_futures",
                          aware=aware)

    def at(day: str) -> int:
        o = sched.loc[day, "open"]
        return o.value if aware else o.tz_convert("America/New_York").tz_localize(None).value

    assert [d[1:] for d in got["val"]["dates"]] == [[at("2024-03-11"), at("2024-03-11")],
                                                    [at("2024-03-12"), at("2024-03-13")]]
    assert split_spans(got)[0].tolist() == [[at("2024-03-12"), at("2024-03-13")]]


@pytest.mark.parametrize("embargo, refused", [("20min", True), ("1h", True), ("10min", False)])
def test_an_append_that_starts_the_next_split_within_a_stored_splits_embargo_is_refused(embargo, refused):
    """The stored days end at 09:31:25 on the 6th; new sessions of the test split start
    at 09:50 the same day (after a break): the stored train windows were placed before
    that step existed, so an embargo of 20 min or more must be applied by a rebuild."""
    from pipeline.features.history import Prior

    lengths = [60, 70]
    t = _times(lengths, [1, 1]) + np.int64(20 * 60 * 10**9)  # 09:50 on the 6th
    stored_end = str(np.datetime64("2026-01-06T09:31:25", "ns"))
    prior = Prior(samples={"train": 40, "test": 0}, rows=500, segments=SegmentTable.from_lengths([250, 250]),
                  stats={}, attrs={"sessions": [{"start": "2026-01-05T09:30", "end": stored_end}]})
    splits = parse_splits({"train": {"until": "2026-01-06T09:40", "embargo": embargo}, "test": {}}, "s")
    run = functools.partial(_build, book(sum(lengths), seed=3), SegmentTable.from_lengths(lengths), t, splits,
                            normalize="none", prior=prior)
    if refused:
        with pytest.raises(WindowError, match=rf"append: split 'train' has an embargo of {embargo}, and the new "
                                              r"files' first window of split 'test' starts at 2026-01-06T09:50.*"
                                              r"pipeline run --rebuild"):
            run()
    else:
        assert run().attrs["window_counts"]["test"] > 0


@settings(max_examples=100, deadline=None)
@given(lo=st.lists(st.integers(0, 400), min_size=1, max_size=40), width=st.integers(0, 20),
       days=st.lists(st.tuples(st.integers(0, 19), st.integers(0, 2)), min_size=1, max_size=12,
                     unique_by=lambda d: d[0]),
       embargo=st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30)))
def test_placement_and_embargo_equal_a_brute_force_over_days_of_20_steps(lo, width, days, embargo):
    """Days of 20 steps assigned to three splits: a window is in the split of the days
    its whole reach covers (touching days of one split join); the embargo drops one
    whose reach ends less than ``embargo`` before a later-starting window of another split."""
    from pipeline.features.splits import embargo_mask, place_windows, split_spans

    lo = np.asarray(lo, dtype=np.int64)
    hi = lo + width
    splits = {f"s{k}": {"dates": [[d, 20 * d, 20 * d + 20] for d, kk in days if kk == k]} for k in range(3)}
    owner = {step: k for d, k in days for step in range(20 * d, 20 * d + 20)}
    where = place_windows(lo, hi, split_spans(splits))
    for i in range(lo.size):
        ks = {owner.get(step, -1) for step in range(lo[i], hi[i] + 1)}
        assert where[i] == (ks.pop() if len(ks) == 1 else -1)
    dropped = embargo_mask(lo, hi, where, list(embargo))
    for i in range(lo.size):
        later = [lo[j] for j in range(lo.size) if where[j] >= 0 and where[j] != where[i] and lo[j] > lo[i]]
        assert dropped[i] == (where[i] >= 0 and bool(later) and min(later) - hi[i] < embargo[where[i]])


#: Fraction splits the share tests draw from: two or three splits summing to 1.
_SHARES = [{"train": 0.6, "val": 0.4}, {"train": 0.7, "val": 0.15, "test": 0.15},
           {"train": 0.5, "val": 0.25, "test": 0.25}, {"train": 0.8, "test": 0.2}]


def _uneven_instruments(data) -> tuple[list[np.ndarray], list[list[int]]]:
    """Timestamps (int ns) per instrument, on the same days, sampled unevenly: every
    instrument its own step and start, some days of a few rows only (an illiquid
    instrument's window then reaches back over days); and each instrument's sessions
    as row lengths (one continuous series, or a session per day)."""
    days = data.draw(st.integers(2, 4), label="days")
    per_day = data.draw(st.booleans(), label="a session per day")
    times, sessions = [], []
    for _ in range(data.draw(st.integers(2, 3), label="instruments")):
        step = data.draw(st.integers(1, 3), label="seconds between rows") * 10**9
        rows = [data.draw(st.one_of(st.integers(1, 6), st.integers(60, 160)), label="rows") for _ in range(days)]
        start = data.draw(st.integers(0, 600), label="start") * 10**9
        t = [d * 86_400 * 10**9 + start + np.arange(r, dtype=np.int64) * step for d, r in enumerate(rows)]
        times.append(np.concatenate(t))
        sessions.append(rows if per_day else [sum(rows)])
    return times, sessions


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_fraction_cuts_keep_the_configured_shares_of_instruments_sampled_unevenly(data):
    """Instruments whose windows reach back over days where others hold hundreds of
    rows: every instrument is cut at the same instants, no stored window's reach holds
    a cut, and each split holds its configured share of the windows counted in time
    order, within a few windows per instrument and cut (those whose reach holds the
    cut). The cut used to be the reach start of the next split's first window, a whole
    day early when that window was an illiquid instrument's (60% -> 40%)."""
    from pipeline.features.geometry import split_ranges
    from pipeline.features.splits import fraction_cuts

    times, sessions = _uneven_instruments(data)
    back, fwd, stride = data.draw(st.integers(1, 8)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    fractions = data.draw(st.sampled_from(_SHARES))
    gap = (back + fwd) // stride  # split_gap_windows of a reach of back + fwd rows
    lo, hi, end = [], [], []
    for t, lengths in zip(times, sessions):
        for a, b in zip(np.cumsum([0, *lengths[:-1]]), np.cumsum(lengths)):
            e = np.arange(a + back, b - fwd, stride)
            lo.append(t[e - back])
            hi.append(t[e + fwd])
            end.append(t[e])
    lo, hi, end = np.concatenate(lo), np.concatenate(hi), np.concatenate(end)
    n, m, k = lo.size, len(fractions), len(times)
    per_cut = k * (gap + 2)  # at most this many windows of k instruments hold one instant in their reach
    try:
        split_ranges(n, fractions, gap)
    except WindowError:
        return  # too few windows for a window in every split: refused before any cut
    cuts = fraction_cuts(lo, np.argsort(end, kind="stable"), fractions, gap)
    where = assign_splits(lo, hi, cuts, list(fractions))
    assert len(cuts) == m - 1 and cuts == sorted(cuts)
    for c in cuts:
        assert not ((where >= 0) & (lo < c) & (hi >= c)).any()
    counts = np.bincount(where[where >= 0], minlength=m)
    across = int((where < 0).sum())
    assert across <= (m - 1) * per_cut
    stored = int(counts.sum())
    # Counted in time order, split j holds fractions[j] of the stored windows, off by at
    # most the windows that can hold a cut (those split_ranges' gap does not reserve).
    tolerance = (m - 1) * per_cut
    for j, name in enumerate(fractions):
        assert abs(counts[j] - fractions[name] * stored) <= tolerance, (name, counts, stored, cuts)


def test_fraction_splits_hold_their_share_when_an_illiquid_instruments_window_reaches_back_a_day():
    """The fuzz's case: AAA and BBB on three days of 400 rows, BBB with 3 rows on the
    second day, one series per instrument (``sessions: none``), {train: 0.6, val: 0.4}.
    The first val window in end order was BBB's, reaching back to the first day: the cut
    went there, and all of AAA's second day went to val (train 40%). Counted by numpy
    from the geometry: train holds 60% of the stored windows, within the windows that
    can hold the cut, AAA's second day is in train, and no step is shared."""
    day = 86_400 * 10**9
    base = int(np.datetime64("2026-01-05T09:30", "ns").astype(np.int64))
    rows = {"AAA": [400, 400, 400], "BBB": [400, 3, 400]}
    starts = {"AAA": base, "BBB": base - 60 * 10**9}  # BBB from 09:29
    t = np.concatenate([starts[name] + d * day + np.arange(r, dtype=np.int64) * 10**9
                        for name, per_day in rows.items() for d, r in enumerate(per_day)])
    lengths = [sum(v) for v in rows.values()]
    segs = SegmentTable.from_lengths(lengths, instrument=[0, 1], instruments=list(rows))
    x = book(sum(lengths), seed=4)
    mid = [FeatureSpec.from_mapping("mid_price", "features.steps[0]")]  # no lookback, as the fuzz's config
    ts = build_training_set(da.from_array(x, chunks=(211, -1)), columns=COLS, features=mid, size=8, stride=1,
                            label=LabelSpec(horizon=1), segments=segs, timestamps=da.from_array(t, chunks=300),
                            splits={"train": 0.6, "val": 0.4}, normalize="none", materialize=False)
    w = ts.attrs["windows"]
    ends = np.concatenate([np.arange(a + w["back"], b - w["fwd"]) for a, b in zip(segs.starts, segs.stops)])
    stored = {name: ts.splits[name]["ends"].compute().astype(np.int64) for name in ("train", "val")}
    total = sum(e.size for e in stored.values())
    assert total + ts.attrs["split_left_out"]["across"] == ends.size
    gap = ts.attrs["split_gap_windows"]
    assert abs(stored["train"].size - 0.6 * total) <= 2 * (gap + 2)  # two instruments, one cut
    train_hi = t[stored["train"] + w["fwd"]].max()
    assert train_hi < t[stored["val"] - w["back"]].min()  # both instruments cut at one instant
    aaa_day2 = (t[stored["train"]] >= base + day) & (t[stored["train"]] < base + 2 * day) & (stored["train"] < 1200)
    assert aaa_day2.sum() >= 400 - 2 * (gap + 2)  # AAA's second day in train, but where the cut is (it had none)


def _config_file(tmp_path, splits: dict, **dump) -> str:
    """A config file holding ``splits``, written by ``yaml.safe_dump`` as a script
    writes one (``dump``: its options)."""
    import yaml

    cfg = {"source": {"paths": str(tmp_path / "raw" / "*.parquet"), "timestamp": "timestamp"},
           "windows": {"size": 4}, "output": {"path": str(tmp_path / "o.zarr"), "splits": splits}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg, **dump))
    return str(path)


def test_fraction_splits_sorted_by_yaml_safe_dump_warn_naming_the_order_used(tmp_path):
    """yaml.safe_dump sorts keys: {train, val, test} comes back {test, train, val}, and
    fractions are placed in time order as listed, so test became the earliest 20% and
    the statistics were fitted after it, silently. The warning names the order the file
    holds (read back with yaml), says why it looks unintended and how to keep it."""
    import re

    import yaml

    from pipeline.config import load_config
    from pipeline.features.splits import ORDER_WARNING

    path = _config_file(tmp_path, {"train": 0.6, "val": 0.2, "test": 0.2})  # sort_keys=True, the default
    listed = list(yaml.safe_load(open(path))["output"]["splits"])
    assert listed == ["test", "train", "val"]
    with pytest.warns(UserWarning, match=re.escape(ORDER_WARNING)) as caught:
        config = load_config(path)
    text = str(caught[0].message)
    assert list(config.output.splits) == listed  # the order is kept: deliberate orders still work
    assert "test 20% (earliest), train 60%, val 20% (latest)" in text
    assert "fitted on 'train', which then lies after 'test'" in text and "sort_keys=False" in text
    path = _config_file(tmp_path, {"train": 0.6, "val": 0.2, "test": 0.2}, sort_keys=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert list(load_config(path).output.splits) == ["train", "val", "test"]


@pytest.mark.parametrize("splits, warns", [
    ({"val": 0.3, "train": 0.5, "test": 0.2}, "which then lies after 'val'"),   # a period held out first
    ({"test": 0.5, "val": 0.5}, "alphabetical order"),                            # sorted, no train
    ({"train": 0.8, "val": 0.2}, None),
    ({"train": 0.6, "test": 0.2, "val": 0.2}, None),   # train first: fitted on the earliest period
    ({"early": 0.6, "late": 0.4}, None),               # names that say nothing of an order
    ({"a": 0.5, "b": 0.5}, None),
    ({"train": 1.0}, None),
    ({"test": {"until": "2026-01-06"}, "train": {}}, None),   # dated: the dates give the order
])
def test_only_fraction_orders_that_look_unintended_warn(splits, warns):
    if warns is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            parse_splits(splits, "output.splits")
        return
    with pytest.warns(UserWarning, match=warns):
        assert list(parse_splits(splits, "output.splits")) == list(splits)


def test_the_documented_pythonwarnings_setting_keeps_a_deliberate_order_without_the_warning(tmp_path):
    """The PYTHONWARNINGS value the warning and the docs give silences it in a fresh
    interpreter (``:`` separates its fields, so the message must start colon-free);
    a config parsed, then parsed again by its build, warns once."""
    import os
    import subprocess
    import sys

    from pipeline.features.splits import ORDER_WARNING

    path = _config_file(tmp_path, {"train": 0.6, "val": 0.2, "test": 0.2})
    check = "import sys; from pipeline.config import load_config; print(list(load_config(sys.argv[1]).output.splits))"
    env = {**os.environ, "PYTHONWARNINGS": f"ignore:{ORDER_WARNING}"}
    quiet = subprocess.run([sys.executable, "-c", check, path], capture_output=True, text=True, timeout=60, env=env)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert quiet.stdout == "['test', 'train', 'val']\n"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parsed = parse_splits({"test": 0.2, "train": 0.6, "val": 0.2}, "output.splits")  # pipeline run: the config,
        assert as_splits(parsed, "splits") == parsed                                      # then build_training_set
        assert len(caught) == 1 and f'PYTHONWARNINGS="ignore:{ORDER_WARNING}"' in str(caught[0].message)
        as_splits({"test": 0.2, "train": 0.6, "val": 0.2}, "splits")  # the Python API's own splits: warned
        assert len(caught) == 2


def test_a_split_file_saved_by_excel_with_a_byte_order_mark_is_read(tmp_path):
    """Excel's "CSV UTF-8" starts the file with a BOM (and ends lines with CRLF): the
    header's first column is still ``date``."""
    path = tmp_path / "splits.csv"
    path.write_bytes("date,split\r\n2026-01-05,train\r\n2026-01-06,test\r\n".encode("utf-8-sig"))
    splits = parse_splits({"file": str(path)}, "output.splits")
    assert splits == parse_splits({"train": {"dates": ["2026-01-05"]}, "test": {"dates": ["2026-01-06"]}}, "s")


def test_compact_yyyymmdd_dates_are_dates_in_a_split_file_and_a_date_list(tmp_path):
    """``20260105`` (text in a file, an int as YAML reads it) is 2026-01-05, as
    ``source.date`` takes it; numpy alone would read the digits as a year."""
    want = parse_splits({"train": {"dates": ["2026-01-05"]}, "test": {"dates": ["2026-01-06"]}}, "s")
    path = tmp_path / "splits.csv"
    path.write_text("date,split\n20260105,train\n20260106,test\n")
    assert parse_splits({"file": str(path)}, "output.splits") == want
    assert parse_splits({"train": {"dates": [20260105]}, "test": {"dates": ["20260106"]}}, "s") == want
    assert parse_splits({"train": {"until": "20260106"}, "test": {}}, "s")["train"]["until"] == to_ns("2026-01-06", "d")
    # Only 8 digits making a date of the calendar: a year, epoch seconds or a 13th month are no date.
    for bad in (2026, 1767571200, 20261305, "20261305", 20260230):
        with pytest.raises(ConfigError, match=r"^s\.train\.dates\[0\]: expected a date such as '2026-01-08'"):
            parse_splits({"train": {"dates": [bad]}}, "s")
