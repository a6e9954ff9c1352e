"""Sessions and instruments: windows, features, labels and normalization never span a
segment, against a plain-numpy reference that computes each segment on its own."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pipeline.errors import ConfigError, WindowError
from pipeline.features import FeatureSpec, LabelSpec, build_training_set, windows
from pipeline.features.sessions import (DateSpec, InstrumentSpec, SegmentTable, SessionSpec, WindowRuns, calendar_days,
                                       window_runs)
from pipeline.features.splits import NormalizeSpec
from tests.features.test_steps import COLS, book, reference
from tests.features.test_windows import reference as windows_ref

SPECS = [FeatureSpec.from_mapping(v, "f") for v in
         ["mid_price", {"name": "imbalance", "levels": 2}, {"name": "rolling_std", "window": 4}]]
L = max(s.lookback_steps for s in SPECS)


def segment_reference(x: np.ndarray, size: int, stride: int, scales: tuple[int, ...], horizon: int,
                      scale: float = 1.0):
    """Windows and return labels of one segment computed on its own (ends counted from
    the segment's first usable row)."""
    if len(x) == 0:
        width = len(SPECS) * len(scales)
        return np.empty((0, size, width), np.float32), np.empty(0, np.float32), np.empty(0, np.int64)
    feats = np.stack([reference(x, s) for s in SPECS], axis=1).astype(np.float32)
    mid = (x[:, COLS.index("bid_price_1")].astype(np.float64) + x[:, COLS.index("ask_price_1")]) / 2
    logmid = np.log(mid)
    f = feats[L:]
    w = windows_ref(f[: max(0, len(f) - horizon)], size, stride, scales)
    halo = (size - 1) * max(scales)
    ends = np.arange(halo, halo + stride * len(w), stride)[: len(w)] + L
    y = ((logmid[ends + horizon] - logmid[ends]) * scale).astype(np.float32)
    return w, y, ends


def concat_reference(x, lengths, size, stride, scales, horizon, scale=1.0):
    ws, ys, sess = [], [], []
    start = 0
    for k, n in enumerate(lengths):
        w, y, _ = segment_reference(x[start : start + n], size, stride, scales, horizon, scale)
        ws.append(w)
        ys.append(y)
        sess.append(np.full(len(w), k, np.int32))
        start += n
    return np.concatenate(ws), np.concatenate(ys), np.concatenate(sess)


# -- pure arithmetic -----------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=6), stride=st.integers(1, 4),
       back=st.integers(0, 9), fwd=st.integers(0, 5), data=st.data())
def test_window_runs_equal_a_loop_over_segments(lengths, stride, back, fwd, data):
    table = SegmentTable.from_lengths(lengths)
    runs = window_runs(table, size=1, stride=stride, scales=(1,), back=back, fwd=fwd)
    expect, seg = [], []
    for k, (a, b) in enumerate(zip(table.starts, table.stops)):
        e = a + back
        while e + fwd <= b - 1:
            expect.append(e)
            seg.append(k)
            e += stride
    np.testing.assert_array_equal(runs.ends(), np.asarray(expect, dtype=np.int64))
    np.testing.assert_array_equal(runs.segments_of(), np.asarray(seg, dtype=np.int64))
    assert runs.n == len(expect)
    if runs.n:
        keep = np.asarray(data.draw(st.lists(st.booleans(), min_size=runs.n, max_size=runs.n)))
        sub = runs.subset(keep)
        np.testing.assert_array_equal(sub.ends(), np.asarray(expect)[keep])
        np.testing.assert_array_equal(sub.segments_of(), np.asarray(seg)[keep])
        # The runs themselves: the longest stretches of consecutive kept windows of one
        # segment (a segment is one run here).
        ref_first, ref_count, ref_seg = [], [], []
        for e, sg in zip(np.asarray(expect)[keep], np.asarray(seg)[keep]):
            if ref_first and ref_seg[-1] == sg and e == ref_first[-1] + ref_count[-1] * stride:
                ref_count[-1] += 1
            else:
                ref_first.append(e)
                ref_count.append(1)
                ref_seg.append(sg)
        np.testing.assert_array_equal(sub.first, ref_first)
        np.testing.assert_array_equal(sub.count, ref_count)
        lo = data.draw(st.integers(0, runs.n))
        hi = data.draw(st.integers(lo, runs.n))
        np.testing.assert_array_equal(runs.ends(lo, hi), np.asarray(expect[lo:hi], dtype=np.int64))


def test_head_mask_marks_the_first_lookback_rows_of_each_segment():
    table = SegmentTable.from_lengths([5, 2, 6])
    np.testing.assert_array_equal(table.head_mask(0, 13, 3),
                                  [1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0])


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(0, 60), min_size=1, max_size=5), stride=st.integers(1, 3),
       size=st.integers(1, 5), scales=st.lists(st.integers(1, 3), min_size=1, max_size=2, unique=True),
       chunk=st.integers(1, 50))
def test_public_windows_per_session_equal_each_session_on_its_own(lengths, stride, size, scales, chunk):
    x = np.random.default_rng(0).standard_normal((sum(lengths), 3)).astype(np.float32)
    scales = tuple(scales)
    parts, start = [], 0
    for n in lengths:
        parts.append(windows_ref(x[start : start + n], size, stride, scales))
        start += n
    expect = np.concatenate(parts)
    if len(expect) == 0:
        with pytest.raises(WindowError, match="no session"):
            windows(da.from_array(x, chunks=(chunk, -1)), size=size, stride=stride, scales=scales, sessions=lengths)
        return
    got = windows(da.from_array(x, chunks=(chunk, -1)), size=size, stride=stride, scales=scales, sessions=lengths)
    np.testing.assert_array_equal(got.compute(), expect)
    assert got.attrs["windows"]["sessions"] == lengths


def test_session_and_instrument_specs_parse_and_refuse():
    assert SessionSpec.from_value({"gap": "30min"}, "s").gap_ns == 30 * 60 * 10**9
    assert SessionSpec.from_value("date", "s").mode == "date"
    for bad in ("daily", {"gap": "soon"}, {"gap": "-1s"}, {"every": "1h"}, 3):
        with pytest.raises(ConfigError, match=r"^s"):
            SessionSpec.from_value(bad, "s")
    spec = InstrumentSpec.from_value({"path": "data/{instrument}/*.parquet"}, "i")
    assert spec.instrument_of("/tmp/x/data/AAPL/2026-01-05.parquet") == "AAPL"
    assert spec.instrument_of("/tmp/x/other/AAPL/2026-01-05.csv") is None
    with pytest.raises(ConfigError, match="i.path"):
        InstrumentSpec.from_value({"path": "data/*.parquet"}, "i")
    with pytest.raises(ConfigError, match="^i:"):
        InstrumentSpec.from_value({"column": "sym", "path": "x/{instrument}"}, "i")


# -- the whole feature stage ---------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.integers(0, 90), min_size=1, max_size=4), chunk=st.integers(3, 70),
       stride=st.integers(1, 3), size=st.integers(2, 5), horizon=st.integers(1, 4),
       instruments=st.integers(1, 2), data=st.data())
def test_build_equals_each_segment_computed_on_its_own(lengths, chunk, stride, size, horizon, instruments, data):
    """Any chunking, sessions shorter than a window, chunk edges on session edges
    (chunks drawn from the session lengths too), several instruments."""
    assume(sum(lengths) > 0)
    scales = (1, 2)
    x = book(sum(lengths) + 1, seed=7)[: sum(lengths)]
    inst = sorted(data.draw(st.lists(st.integers(0, instruments - 1), min_size=len(lengths), max_size=len(lengths))))
    table = SegmentTable.from_lengths(lengths, instrument=inst, instruments=[f"i{k}" for k in range(instruments)])
    ref_x, ref_y, ref_s = concat_reference(x, lengths, size, stride, scales, horizon, scale=1e4)
    if data.draw(st.booleans()):
        chunks = tuple(n for n in lengths if n) or (1,)
    else:
        chunks = chunk
    kw = dict(columns=COLS, features=SPECS, size=size, stride=stride, scales=scales, normalize="none",
              label=LabelSpec(horizon=horizon, scale=1e4), segments=table)
    if len(ref_x) == 0:
        with pytest.raises(WindowError):
            build_training_set(da.from_array(x, chunks=(chunks, -1)), **kw)
        return
    ts = build_training_set(da.from_array(x, chunks=(chunks, -1)), **kw)
    got = ts.splits["train"]
    np.testing.assert_allclose(got["x"].compute(), ref_x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got["y"].compute(), ref_y, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(got["session"].compute(), table.session[ref_s])
    if instruments > 1:
        np.testing.assert_array_equal(got["instrument"].compute(), table.instrument[ref_s])
    windows_per = [row["windows"] for row in ts.attrs["sessions"]]
    assert windows_per == np.bincount(ref_s, minlength=len(lengths)).tolist()


def test_trailing_normalization_uses_only_the_sessions_before():
    lengths = [120, 100, 130, 110]
    x = book(sum(lengths), seed=11)
    table = SegmentTable.from_lengths(lengths)
    ts = build_training_set(da.from_array(x, chunks=(77, -1)), columns=COLS, features=SPECS, size=4, stride=3,
                            scales=(1,), label=LabelSpec(horizon=2), segments=table,
                            normalize=NormalizeSpec(kind="trailing", sessions=2))
    raw = build_training_set(da.from_array(x, chunks=(77, -1)), columns=COLS, features=SPECS, size=4, stride=3,
                             scales=(1,), label=LabelSpec(horizon=2), segments=table, normalize="none")
    sess = ts.splits["train"]["session"].compute()
    assert sorted(set(sess.tolist())) == [2, 3]  # the first two sessions only serve as history
    keep = np.isin(raw.splits["train"]["session"].compute(), [2, 3])
    xr = raw.splits["train"]["x"].compute()[keep]
    xt = ts.splits["train"]["x"].compute()
    start = np.concatenate([[0], np.cumsum(lengths)])
    for s in (2, 3):
        rows = []
        for p in (s - 2, s - 1):
            seg = x[start[p] : start[p + 1]]
            rows.append(np.stack([reference(seg, spec) for spec in SPECS], axis=1)[L:])
        pooled = np.concatenate(rows)
        mean, std = np.nanmean(pooled, axis=0), np.nanstd(pooled, axis=0)
        expect = (xr[sess == s] - mean.astype(np.float32)) / std.astype(np.float32)
        np.testing.assert_allclose(xt[sess == s], expect, rtol=1e-4, atol=1e-4)
    assert np.asarray(ts.attrs["normalization"]["mean"]).shape == (4, len(SPECS))


def _times(lengths: list[int], days: list[int]) -> np.ndarray:
    """One timestamp per row: session k on day ``days[k]``, rows a second apart from 09:30."""
    out = []
    for n, d in zip(lengths, days):
        base = np.datetime64("2026-01-05T09:30") + np.timedelta64(d, "D")
        out.append((base + np.arange(n).astype("timedelta64[s]")).astype("datetime64[ns]").astype(np.int64))
    return np.concatenate(out)


@pytest.mark.parametrize("materialize", [True, False])
def test_date_splits_and_several_instruments_share_no_time(materialize):
    """Two instruments on the same four days; train until day 2, val day 2, test the
    rest. Every window's whole reach (history to label) lies in its split's dates."""
    lengths = [80, 90, 70, 85, 95, 75, 60, 100]
    days = [0, 1, 2, 3, 0, 1, 2, 3]
    inst = [0, 0, 0, 0, 1, 1, 1, 1]
    x = book(sum(lengths), seed=5)
    t = _times(lengths, days)
    table = SegmentTable.from_lengths(lengths, instrument=inst, session=days, instruments=["A", "B"])
    day = lambda d: int(np.datetime64("2026-01-05", "ns").astype(np.int64)) + d * 86_400 * 10**9  # noqa: E731
    splits = {"train": {"until": day(2)}, "val": {"until": day(3)}, "test": {"until": None}}
    ts = build_training_set(da.from_array(x, chunks=(64, -1)), columns=COLS, features=SPECS, size=5, stride=2,
                            scales=(1, 2), label=LabelSpec(horizon=3), segments=table, splits=splits,
                            timestamps=da.from_array(t, chunks=50), materialize=materialize)
    back, fwd = ts.attrs["windows"]["back"], ts.attrs["windows"]["fwd"]
    bounds = {"train": (None, day(2)), "val": (day(2), day(3)), "test": (day(3), None)}
    for name, (lo, hi) in bounds.items():
        got = ts.splits[name]
        tt = got["t"].compute()
        assert set(got["instrument"].compute().tolist()) == {0, 1}
        if not materialize:
            ends = got["ends"].compute().astype(np.int64)
            np.testing.assert_array_equal(t[ends], tt)
            first, last = t[ends - back], t[ends + fwd]
            assert lo is None or first.min() >= lo
            assert hi is None or last.max() < hi
    # Cuts fall on session (day) boundaries: no window is lost to the gap.
    every = sum(max(0, (n - 1 - fwd - back) // 2 + 1) for n in lengths)
    assert sum(ts.attrs["window_counts"].values()) == every


@pytest.mark.parametrize("reference_kind", ["current", "past_mean"])
def test_smoothed_labels_at_several_horizons_stay_inside_each_session(reference_kind):
    """DeepLOB-style labels: the mean of the next k mids against the current mid or the
    mean of the previous k; neither side may reach into another session."""
    lengths = [150, 40, 170]
    horizons = (3, 10, 25)
    x = book(sum(lengths), seed=3)
    label = LabelSpec.from_mapping({"kind": "smoothed", "horizons": list(horizons), "reference": reference_kind,
                                    "alpha": 2e-5}, "labels")
    ts = build_training_set(da.from_array(x, chunks=(33, -1)), columns=COLS, features=SPECS, size=4, stride=1,
                            scales=(1,), label=label, normalize="none",
                            segments=SegmentTable.from_lengths(lengths), materialize=False)
    ends = ts.splits["train"]["ends"].compute().astype(np.int64)
    y = ts.splits["train"]["y"].compute()
    assert y.shape == (len(ends), len(horizons)) and y.dtype == np.int64
    mid = (x[:, COLS.index("bid_price_1")].astype(np.float64) + x[:, COLS.index("ask_price_1")]) / 2
    starts = np.concatenate([[0], np.cumsum(lengths)])
    k_max = max(horizons)
    expect_ends = []
    for a, b in zip(starts, starts[1:]):
        back = max(3 + L, k_max - 1 if reference_kind == "past_mean" else 0)
        expect_ends += list(range(a + back, b - k_max))
    np.testing.assert_array_equal(ends, expect_ends)
    for i, e in enumerate(ends):
        for j, k in enumerate(horizons):
            plus = mid[e + 1 : e + k + 1].mean()
            ref = mid[e] if reference_kind == "current" else mid[e - k + 1 : e + 1].mean()
            value = (plus - ref) / ref
            expect = 0 if value < -2e-5 else 2 if value > 2e-5 else 1
            assert y[i, j] == expect, (i, j)
    balance = ts.attrs["class_balance"]["train"]
    assert [sum(c) for c in balance] == [len(ends)] * len(horizons)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(0, 30), min_size=1, max_size=6), stride=st.integers(1, 3), data=st.data())
def test_runs_slice_and_shift_equal_the_ends_they_cut(lengths, stride, data):
    runs = window_runs(SegmentTable.from_lengths(lengths), size=1, stride=stride, scales=(1,), back=2, fwd=1)
    lo = data.draw(st.integers(0, runs.n))
    hi = data.draw(st.integers(lo, runs.n))
    part = runs.slice(lo, hi)
    np.testing.assert_array_equal(part.ends(), runs.ends(lo, hi))
    np.testing.assert_array_equal(part.segments_of(), runs.segments_of(lo, hi))
    np.testing.assert_array_equal(part.shifted(-5).ends(), runs.ends(lo, hi) - 5)
    for r in (runs, part):  # the first and last end, without every end
        if r.n:
            assert r.span() == (int(r.ends()[0]), int(r.ends()[-1]))


@settings(max_examples=300, deadline=None)
@given(counts=st.lists(st.integers(0, 6), min_size=1, max_size=8), stride=st.integers(1, 4), data=st.data())
def test_ends_and_segments_of_a_range_equal_each_windows_run(counts, stride, data):
    # Runs with no window among them too: their offsets repeat.
    count = np.asarray(counts, dtype=np.int64)
    first = np.cumsum(count * stride + 3).astype(np.int64)
    segment = np.arange(len(counts), dtype=np.int32) // 2
    runs = WindowRuns(first, count, segment, stride)
    lo = data.draw(st.integers(0, runs.n))
    hi = data.draw(st.integers(lo, runs.n))
    expect_ends, expect_segments = [], []
    w = 0
    for r, c in enumerate(counts):
        for p in range(c):
            if lo <= w < hi:
                expect_ends.append(int(first[r]) + p * stride)
                expect_segments.append(int(segment[r]))
            w += 1
    got = runs.ends(lo, hi)
    assert got.dtype == np.int64 and got.tolist() == expect_ends
    assert runs.segments_of(lo, hi).tolist() == expect_segments
    if lo == 0 and hi == runs.n:
        assert runs.ends().tolist() == expect_ends


@pytest.mark.parametrize("tz", ["Australia/Sydney", "America/New_York", "Europe/London", "UTC", None])
def test_calendar_days_are_the_dates_pandas_gives_in_the_zone(tz):
    """Across both DST changes of the year, each side of every local midnight."""
    import pandas as pd

    rng = np.random.default_rng(7)
    start = np.datetime64("2026-01-01", "ns").astype(np.int64)
    ns = np.sort(start + rng.integers(0, 365 * 86_400 * 10**9, 5000))
    stamps = pd.to_datetime(ns, utc=tz is not None)
    local = stamps.tz_convert(tz) if tz else stamps
    expect = (pd.DatetimeIndex(local.date).as_unit("ns").asi8 // (86_400 * 10**9))
    np.testing.assert_array_equal(calendar_days(ns, tz), expect)


def test_date_spec_takes_each_files_date_from_its_path_and_refuses_what_does_not_parse():
    itch = DateSpec.from_value({"path": "itch/{date}.csv", "format": "%m%d%Y"}, "d")
    assert itch.day_ns("/data/itch/01302019.csv") == int(np.datetime64("2019-01-30", "ns").astype(np.int64))
    iso = DateSpec.from_value({"path": "book/{date}/*.parquet"}, "d")
    for name in ("2024-02-29", "20240229"):  # either default format
        assert iso.day_ns(f"s3://b/book/{name}/part-0.parquet") == int(np.datetime64("2024-02-29", "ns").astype(int))
    assert DateSpec.from_value(itch.to_value(), "d") == itch
    with pytest.raises(ValueError, match="does not match source.date.path"):
        itch.day_ns("/data/other/01302019.csv")
    with pytest.raises(ValueError, match="'13302019'.*'%m%d%Y'"):
        itch.day_ns("/data/itch/13302019.csv")  # no 13th month
    with pytest.raises(ValueError, match="'2024-02-30'.*YYYYMMDD"):
        iso.day_ns("book/2024-02-30/p.parquet")
    for bad, key in (({"path": "itch/*.csv"}, "d.path"), ({"path": "{date}/{date}"}, "d.path"),
                     ({"path": "{date}.csv", "format": "mmddyyyy"}, "d.format"), ("itch/{date}.csv", "d"),
                     ({"path": "{date}.csv", "zone": "UTC"}, "d")):
        with pytest.raises(ConfigError, match=f"^{key}"):
            DateSpec.from_value(bad, "d")


def test_date_spec_takes_a_column_of_dates_with_an_optional_format_and_refuses_what_is_neither():
    from pipeline.config import parse_config

    spec = DateSpec.from_value({"column": "date"}, "d")
    assert (spec.column, spec.path, spec.format) == ("date", None, None)
    dated = DateSpec.from_value({"column": "trade_date", "format": "%Y%m%d"}, "d")
    assert (dated.column, dated.format) == ("trade_date", "%Y%m%d")
    for one in (spec, dated):
        assert DateSpec.from_value(one.to_value(), "d") == one
    with pytest.raises(TypeError, match="from a column"):
        spec.day_ns("data/20231228.csv")  # a row's date is no file's
    for bad, key in (({"column": "date", "path": "{date}.csv"}, "d"), ({"column": 5}, "d.column"),
                     ({"column": ""}, "d.column"), ({"column": "date", "format": "yyyymmdd"}, "d.format"),
                     ({"format": "%Y%m%d"}, "d"), ({"column": "date", "zone": "UTC"}, "d")):
        with pytest.raises(ConfigError, match=f"^{key}"):
            DateSpec.from_value(bad, "d")
    # Through the config, as `--set source.date={column: date}` gives it.
    cfg = parse_config({"source": {"paths": "q.csv", "timestamp": "timestamp",
                                   "date": {"column": "date", "format": "%Y%m%d"}},
                        "windows": {"size": 8}, "output": {"path": "out.zarr"}})
    assert cfg.source.date == DateSpec(column="date", format="%Y%m%d")
    with pytest.raises(ConfigError, match=r"^source\.date: expected \{path: PATTERN with \{date\}\} or "
                       r"\{column: NAME\}"):
        parse_config({"source": {"paths": "q.csv", "date": {"colum": "date"}}, "windows": {"size": 8},
                      "output": {"path": "out.zarr"}})


def test_a_leading_dot_component_in_a_path_pattern_matches_like_the_pattern_without_it():
    # Files are matched as absolute paths, which hold no "." component: "./itch/{date}.csv"
    # names the same files as "itch/{date}.csv".
    import pandas as pd

    want = pd.Timestamp("2019-01-30").value
    for pattern in ("itch/{date}.csv", "./itch/{date}.csv", "././itch/./{date}.csv"):
        spec = DateSpec.from_value({"path": pattern, "format": "%m%d%Y"}, "d")
        assert spec.day_ns("/data/itch/01302019.csv") == want, pattern
        with pytest.raises(ValueError, match="does not match source.date.path"):
            spec.day_ns("/data/other/01302019.csv")
        inst = InstrumentSpec(path=pattern.replace("{date}", "{instrument}"))
        assert inst.instrument_of("/data/itch/AAPL.csv") == "AAPL", pattern
        assert inst.instrument_of("/data/xitch/AAPL.csv") is None


def test_calendar_spec_parses_refuses_unknown_names_and_needs_the_extra(monkeypatch):
    pytest.importorskip("exchange_calendars")
    import sys

    from pipeline.errors import MissingDependencyError

    spec = SessionSpec.from_value({"calendar": "XNYS"}, "source.sessions")
    assert (spec.mode, spec.calendar, spec.needs_timestamps) == ("calendar", "XNYS", True)
    assert SessionSpec.from_value(spec.to_value(), "s") == spec
    with pytest.raises(ConfigError, match=r"source\.sessions\.calendar: expected an exchange calendar name such as "
                                          r"XNYS.*got 'NYSEE'"):
        SessionSpec.from_value({"calendar": "NYSEE"}, "source.sessions")
    with pytest.raises(ConfigError, match=r"source\.sessions"):
        SessionSpec.from_value({"calendar": "XNYS", "gap": "1h"}, "source.sessions")
    monkeypatch.setitem(sys.modules, "exchange_calendars", None)  # as if not installed
    with pytest.raises(MissingDependencyError, match=r"pipeline\[calendars\]"):
        SessionSpec.from_value({"calendar": "XNYS"}, "source.sessions")


def test_column_sessions_parse_round_trip_and_refuse_what_names_no_column():
    spec = SessionSpec.from_value({"column": "time_id"}, "source.sessions")
    assert (spec.mode, spec.column, spec.needs_timestamps) == ("column", "time_id", False)
    assert SessionSpec.from_value(spec.to_value(), "source.sessions") == spec
    with pytest.raises(ConfigError, match=r"source.sessions.column: expected a table column's name, got 3"):
        SessionSpec.from_value({"column": 3}, "source.sessions")
    with pytest.raises(ConfigError, match=r"\{column: <table column>\}"):
        SessionSpec.from_value({"columns": "time_id"}, "source.sessions")


@settings(max_examples=80, deadline=None)
@given(values=st.lists(st.integers(0, 4), min_size=0, max_size=40))
def test_value_runs_and_come_back_equal_pandas_run_lengths(values):
    from pipeline.features.sessions import come_back, value_runs

    v = np.asarray(values, dtype=np.float32)
    inner, run_values = value_runs(v)
    s = pd.Series(values, dtype="int64")
    run_id = (s != s.shift()).cumsum()  # pandas' run-length idiom
    starts = s.groupby(run_id).apply(lambda g: g.index[0]).to_numpy()
    np.testing.assert_array_equal(inner, starts[1:])
    np.testing.assert_array_equal(run_values, s.groupby(run_id).first().to_numpy())
    repeated = pd.Series(run_values).duplicated().to_numpy()
    assert come_back(run_values) == (int(np.flatnonzero(repeated)[0]) if repeated.any() else None)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.sampled_from([1, 1, 1, 2, 3, 0, 40, 500]), min_size=0, max_size=60),
       starts=st.sets(st.integers(1, 60), max_size=4))
def test_step_gaps_equal_a_numpy_count_of_steps_over_ten_times_the_90th_percentile(steps, starts):
    from pipeline.features.sessions import step_gaps

    ns = np.concatenate([[0], np.cumsum(steps)]).astype(np.int64) * 3600 * 10**9
    heads = np.asarray(sorted(starts), dtype=np.int64)
    count, largest, typical, first = step_gaps(ns, heads)
    # Reference: a plain loop over the steps, leaving out those onto a session's first row.
    inside = [(i + 1, ns[i + 1] - ns[i]) for i in range(len(ns) - 1) if i + 1 not in set(heads.tolist())]
    positive = np.sort([d for _, d in inside if d > 0])
    if positive.size < 16:
        assert (count, largest, typical, first) == (0, 0, 0, -1)
        return
    ref_typical = positive[int(0.9 * (positive.size - 1))]
    big = [(row, d) for row, d in inside if d > 10 * ref_typical]
    assert typical == ref_typical
    assert count == len(big)
    assert largest == (max(d for _, d in big) if big else 0)
    assert first == (big[0][0] if big else -1)


def test_a_twelve_hour_outage_in_hourly_data_is_one_gap_and_order_book_lulls_none():
    from pipeline.features.sessions import step_gaps

    hours = pd.date_range("2026-01-01", periods=240, freq="h")
    hole = hours[(hours < "2026-01-05 06:00") | (hours >= "2026-01-05 18:00")]
    count, largest, typical, first = step_gaps(hole.as_unit("ns").asi8, np.zeros(0, np.int64))
    assert (count, largest, typical) == (1, 13 * 3600 * 10**9, 3600 * 10**9)
    assert hole[first] == pd.Timestamp("2026-01-05 18:00")
    # Event times (exponential steps): lulls of several median steps are ordinary.
    events = np.cumsum(np.random.default_rng(0).exponential(1e6, 200_000)).astype(np.int64)
    assert step_gaps(events, np.zeros(0, np.int64))[0] == 0
