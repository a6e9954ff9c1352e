"""``source.sessions: {calendar: NAME}`` end to end: rows outside an exchange calendar's
sessions are left out, each calendar session is one session of the store, date splits
cut at a session's open, and an append equals a build of every file. Each store is
checked against a pandas computation from exchange_calendars' own schedule."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import pipeline
from pipeline.config import load_config
from pipeline.errors import ConfigError, WindowError
from pipeline.job import run
from tests.conftest import assert_bitwise_equal, in_process_cluster

xcals = pytest.importorskip("exchange_calendars")

# exchange_calendars' own use of pandas warns under newer pandas (Series.values).
pytestmark = pytest.mark.filterwarnings("ignore:Series.values")

SIZE, STRIDE, H = 4, 3, 2


@pytest.fixture(scope="module")
def address():
    with in_process_cluster(n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        yield c.scheduler_address


def _frame(start: str, end: str, n: int, seed: int, tz: str | None) -> pd.DataFrame:
    """``n`` sorted times between two wall-clock times (``tz``: aware there, else naive)
    with a one-level book."""
    rng = np.random.default_rng(seed)
    s, e = pd.Timestamp(start, tz=tz), pd.Timestamp(end, tz=tz)
    ts = s + pd.to_timedelta(np.sort(rng.integers(0, (e - s).value, n)), unit="ns")
    mid = 100 + np.cumsum(rng.choice([-0.01, 0.0, 0.01], n))
    return pd.DataFrame({"timestamp": pd.DatetimeIndex(ts).as_unit("ns"), "bid_price_1": mid - 0.01,
                         "ask_price_1": mid + 0.01})


def _sessions_of(ts: pd.Series, name: str) -> pd.Series:
    """Each row's session label from exchange_calendars' schedule (NaT outside every
    session), by pandas alone: aware times as they are, naive ones in the calendar's zone."""
    cal = xcals.get_calendar(name, start="2024-01-02", end="2024-12-31")
    sched = cal.schedule
    t = pd.DatetimeIndex(ts)
    t = t.tz_convert("UTC") if t.tz is not None else t.tz_localize(cal.tz).tz_convert("UTC")
    label = pd.Series(pd.NaT, index=range(len(t)), dtype="datetime64[ns]")
    for day, row in sched.iterrows():
        inside = (t >= row["open"]) & (t < row["close"])
        label[np.asarray(inside)] = day
    return label


def _reference(frames: list[pd.DataFrame], name: str, wall: str | None = None) -> dict:
    """Windows (x: mid, spread, log_return; y: return label; t; session) of every
    session, rows outside the calendar left out; ``wall``: the calendar's zone, for
    naive times, whose ``t`` are wall-clock values."""
    df = pd.concat(frames, ignore_index=True)
    df["session"] = _sessions_of(df["timestamp"], name)
    left_out = int(df["session"].isna().sum())
    df = df[df["session"].notna()]
    out: dict = {"x": [], "y": [], "t": [], "session": [], "open": [], "left_out": left_out}
    sched = xcals.get_calendar(name, start="2024-01-02", end="2024-12-31").schedule
    for day, g in df.groupby("session", sort=True):
        mid = (g.bid_price_1.to_numpy() + g.ask_price_1.to_numpy()) / 2
        spread = g.ask_price_1.to_numpy() - g.bid_price_1.to_numpy()
        lr = np.r_[np.nan, np.diff(np.log(mid))]
        feats = np.stack([mid, spread, lr], 1)
        ns = pd.DatetimeIndex(g.timestamp).as_unit("ns").asi8
        e = 1 + SIZE - 1  # log_return's one step of lookback
        while e + H <= len(g) - 1:
            out["x"].append(feats[e - SIZE + 1:e + 1])
            out["y"].append(np.log(mid[e + H]) - np.log(mid[e]))
            out["t"].append(ns[e])
            out["session"].append(day)
            e += STRIDE
        out["open"].append(sched.loc[day, "open"])
    return {k: (np.asarray(v) if k not in ("left_out", "open") else v) for k, v in out.items()}


def _config(tmp: Path, address: str, name: str, out: str, splits: dict | None = None) -> Path:
    cfg = {
        "cluster": {"address": address},
        "source": {"paths": str(tmp / "raw" / "*.parquet"), "timestamp": "timestamp",
                   "sessions": {"calendar": name}, "dtype": "float64"},
        "features": {"steps": ["mid_price", "spread", "log_return"], "normalize": "none"},
        "windows": {"size": SIZE, "stride": STRIDE},
        "labels": {"kind": "return", "horizon": H},
        "output": {"path": str(tmp / out), **({"splits": splits} if splits else {})},
    }
    path = tmp / f"{out}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _run(path: Path) -> str:
    log = io.StringIO()
    run(load_config(path), log=log, progress=False)
    return log.getvalue()


def _check(store: Path, split: str, ref: dict, keep: np.ndarray) -> None:
    got = pipeline.open(store)[split]
    assert got["t"][:].tolist() == ref["t"][keep].tolist()
    # Windows are stored in float32.
    np.testing.assert_allclose(got["x"][:], ref["x"][keep], rtol=1e-6, atol=1e-7, equal_nan=True)
    np.testing.assert_allclose(np.asarray(got["y"][:]).reshape(-1), ref["y"][keep], rtol=1e-5, atol=1e-7)


def _equity_days(tmp: Path) -> list[pd.DataFrame]:
    """NYSE days with pre- and post-market rows (04:00-20:00 New York, aware): before
    and after the 2024-03-10 DST change, Thanksgiving (a holiday: every row left out)
    and the half day after it (closes at 13:00)."""
    (tmp / "raw").mkdir()
    frames = []
    for i, day in enumerate(["2024-03-08", "2024-03-11", "2024-11-28", "2024-11-29"]):
        df = _frame(f"{day} 04:00", f"{day} 20:00", 300, seed=i, tz="America/New_York")
        df.to_parquet(tmp / "raw" / f"SPY_{day}.parquet", index=False)
        frames.append(df)
    return frames


def test_equity_keeps_regular_hours_of_each_nyse_session_and_splits_at_its_open(tmp_path, address):
    frames = _equity_days(tmp_path)
    ref = _reference(frames, "XNYS")
    cfg = _config(tmp_path, address, "XNYS", "eq.zarr", {"train": {"until": "2024-03-11"}, "test": {}})
    log = _run(cfg)
    assert f"calendar XNYS: {ref['left_out']:,} row(s) outside its sessions left out" in log
    ds = pipeline.open(tmp_path / "eq.zarr")
    # Three sessions (the holiday holds none), keyed by the trading date.
    assert [s["label"] for s in ds.attrs["sessions"]] == ["2024-03-08", "2024-03-11", "2024-11-29"]
    labels = pd.DatetimeIndex(ref["session"])
    _check(tmp_path / "eq.zarr", "train", ref, np.asarray(labels < "2024-03-11"))
    _check(tmp_path / "eq.zarr", "test", ref, np.asarray(labels >= "2024-03-11"))
    # The half day's last window ends before 13:00 New York.
    half = ref["t"][np.asarray(labels == "2024-11-29")]
    assert pd.Timestamp(int(half.max()), tz="UTC") < pd.Timestamp("2024-11-29 13:00", tz="America/New_York")


@pytest.mark.parametrize("form", ["csv-ns", "csv-us", "parquet-int64"])
def test_epoch_numbers_are_instants_under_a_calendar(tmp_path, address, form):
    """Epoch numbers (Databento's ``ts_recv``, an integer column of a CSV) count from
    1970-01-01 UTC: they were read as New York wall-clock times, and most of each
    session was left out as outside it (UTC 14:30-16:00 kept as 09:30-11:00)."""
    frames = _equity_days(tmp_path)
    ref = _reference(frames, "XNYS")
    (tmp_path / "epoch").mkdir()
    for i, df in enumerate(frames):
        ns = pd.DatetimeIndex(df["timestamp"]).as_unit("ns").asi8
        numbers = df.assign(timestamp=ns // 1000 if form == "csv-us" else ns)
        if form.startswith("csv"):
            numbers.to_csv(tmp_path / "epoch" / f"SPY_{i}.csv", index=False)
        else:
            numbers.to_parquet(tmp_path / "epoch" / f"SPY_{i}.parquet", index=False)
    cfg = yaml.safe_load(_config(tmp_path, address, "XNYS", "ep.zarr").read_text())
    cfg["source"]["paths"] = str(tmp_path / "epoch" / ("*.csv" if form.startswith("csv") else "*.parquet"))
    if form == "csv-us":
        cfg["source"]["timestamp_unit"] = "us"
    (tmp_path / "ep.yaml").write_text(yaml.safe_dump(cfg))
    log = _run(tmp_path / "ep.yaml")
    assert f"calendar XNYS: {ref['left_out']:,} row(s) outside its sessions left out" in log
    keep = np.ones(len(ref["t"]), bool)
    if form == "csv-us":  # the times themselves lose their nanoseconds
        ref = {**ref, "t": ref["t"] // 1000 * 1000}
    _check(tmp_path / "ep.zarr", "train", ref, keep)


def test_text_times_beside_epoch_numbers_are_refused_under_a_calendar(tmp_path, address):
    """Text without an offset is the exchange's wall clock, numbers are UTC instants:
    files of both would be placed hours apart."""
    frames = _equity_days(tmp_path)
    (tmp_path / "mixed").mkdir()
    frames[0].assign(timestamp=pd.DatetimeIndex(frames[0]["timestamp"]).as_unit("ns").asi8).to_csv(
        tmp_path / "mixed" / "a.csv", index=False)
    frames[1].assign(timestamp=frames[1]["timestamp"].dt.tz_localize(None).astype(str)).to_csv(
        tmp_path / "mixed" / "b.csv", index=False)
    cfg = yaml.safe_load(_config(tmp_path, address, "XNYS", "mx.zarr").read_text())
    cfg["source"]["paths"] = str(tmp_path / "mixed" / "*.csv")
    (tmp_path / "mx.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(Exception, match=r"b\.csv.*holds text times, but .*a\.csv holds epoch numbers"):
        _run(tmp_path / "mx.yaml")
    assert not (tmp_path / "mx.zarr").exists()


def _futures_days(tmp: Path, days: list[str]) -> list[pd.DataFrame]:
    """CME equity-futures sessions as naive New York wall-clock times, 18:00 on the
    business day before to 18:00 on the trade date (exchange_calendars' us_futures
    session), one file each; the Monday after the 2024-03-10 DST change starts at noon
    on Sunday (closed until 18:00: those rows are left out)."""
    (tmp / "raw").mkdir(exist_ok=True)
    frames = []
    for day in days:
        prev = (pd.Timestamp(day) - pd.offsets.BDay(1)).strftime("%Y-%m-%d 18:00")
        start = "2024-03-10 12:00" if day == "2024-03-11" else prev
        df = _frame(start, f"{day} 17:59:59", 300, seed=int(day[-2:]), tz=None)
        df.to_parquet(tmp / "raw" / f"ES_{day}.parquet", index=False)
        frames.append(df)
    return frames


FUTURES = ["2024-03-08", "2024-03-11", "2024-03-12", "2024-03-13"]


def test_futures_sessions_open_the_evening_before_and_a_date_split_keeps_them_whole(tmp_path, address):
    frames = _futures_days(tmp_path, FUTURES)
    ref = _reference(frames, "us_futures")
    assert ref["left_out"] > 0
    log = _run(_config(tmp_path, address, "us_futures", "fut.zarr", {"train": {"until": "2024-03-12"}, "test": {}}))
    assert f"calendar us_futures: {ref['left_out']:,} row(s) outside its sessions left out" in log
    ds = pipeline.open(tmp_path / "fut.zarr")
    # Four trading days are four sessions, not six cut at midnight.
    assert [s["label"] for s in ds.attrs["sessions"]] == FUTURES
    labels = pd.DatetimeIndex(ref["session"])
    # No window lost at the cut: the session of 2024-03-12 (from 18:00 on the 11th) is test's.
    _check(tmp_path / "fut.zarr", "train", ref, np.asarray(labels < "2024-03-12"))
    _check(tmp_path / "fut.zarr", "test", ref, np.asarray(labels >= "2024-03-12"))
    test_t = pd.DatetimeIndex(ref["t"][np.asarray(labels >= "2024-03-12")])
    assert (test_t < pd.Timestamp("2024-03-12")).any()  # windows of the evening before, kept


def test_an_append_continues_the_calendar_sessions_as_a_build_of_every_file(tmp_path, address):
    frames = _futures_days(tmp_path, FUTURES[:2])
    splits = {"train": {"until": "2024-03-12"}, "test": {}}
    grown = _config(tmp_path, address, "us_futures", "grown.zarr", splits)
    _run(grown)
    frames += _futures_days(tmp_path, FUTURES[2:])
    _run(grown)  # appends the two new days
    full = _config(tmp_path, address, "us_futures", "full.zarr", splits)
    _run(full)
    assert_bitwise_equal(tmp_path / "grown.zarr", tmp_path / "full.zarr")
    ref = _reference(frames, "us_futures")
    labels = pd.DatetimeIndex(ref["session"])
    _check(tmp_path / "grown.zarr", "test", ref, np.asarray(labels >= "2024-03-12"))
    assert [s["label"] for s in pipeline.open(tmp_path / "grown.zarr").attrs["sessions"]] == FUTURES


def test_a_calendar_is_refused_as_the_config_is_read_when_unknown_or_without_timestamps(tmp_path):
    base = {"source": {"paths": str(tmp_path / "*.parquet"), "timestamp": "timestamp",
                       "sessions": {"calendar": "NOPE"}},
            "windows": {"size": 4}, "output": {"path": str(tmp_path / "o.zarr")}}
    from pipeline.config import parse_config

    with pytest.raises(ConfigError, match=r"source\.sessions\.calendar.*XNYS.*'NOPE'"):
        parse_config(base)
    base["source"]["sessions"] = {"calendar": "XNYS"}
    del base["source"]["timestamp"]
    with pytest.raises(ConfigError, match=r"source\.sessions.*source\.timestamp"):
        parse_config(base)
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_an_append_of_a_holiday_alone_adds_no_session_and_the_next_day_appends_as_a_build(tmp_path, address):
    """A nightly append whose one new file is a holiday's (every row outside the
    calendar's sessions) crashed with an IndexError; it is recorded as read, and the
    next trading day's append equals a build of every file."""
    frames = _equity_days(tmp_path)
    held = {p.name: p.read_bytes() for p in (tmp_path / "raw").glob("SPY_2024-11-2*.parquet")}
    for name in held:
        (tmp_path / "raw" / name).unlink()
    grown = _config(tmp_path, address, "XNYS", "grown.zarr")
    _run(grown)
    for name in sorted(held):  # Thanksgiving alone, then the half day after it
        (tmp_path / "raw" / name).write_bytes(held[name])
        log = _run(grown)
        if name == "SPY_2024-11-28.parquet":
            assert "append: 1 new file(s) without rows: no session to add; recorded as read" in log
            assert "up to date" in _run(grown)
    _run(_config(tmp_path, address, "XNYS", "full.zarr"))
    assert_bitwise_equal(tmp_path / "grown.zarr", tmp_path / "full.zarr")
    assert [s["label"] for s in pipeline.open(tmp_path / "grown.zarr").attrs["sessions"]] == [
        "2024-03-08", "2024-03-11", "2024-11-29"]
    ref = _reference(frames, "XNYS")
    _check(tmp_path / "grown.zarr", "train", ref, np.ones(len(ref["t"]), bool))


def test_a_file_continuing_a_session_stored_in_part_is_refused_saying_where_the_session_closes(tmp_path, address):
    """Futures files cut at midnight store the last evening as a session in part; the
    next file continues it, refused: the message now says the stored files end before
    the calendar closes that session."""
    (tmp_path / "raw").mkdir()
    for day, (start, end) in {"2024-03-07": ("2024-03-07 00:00", "2024-03-07 23:59:59"),
                              "2024-03-08": ("2024-03-08 00:00", "2024-03-08 16:59:59")}.items():
        _frame(start, end, 400, seed=int(day[-1]), tz=None).to_parquet(tmp_path / "raw" / f"ES_{day}.parquet",
                                                                        index=False)
    held = (tmp_path / "raw" / "ES_2024-03-08.parquet").read_bytes()
    (tmp_path / "raw" / "ES_2024-03-08.parquet").unlink()
    grown = _config(tmp_path, address, "us_futures", "grown.zarr")
    _run(grown)
    (tmp_path / "raw" / "ES_2024-03-08.parquet").write_bytes(held)
    with pytest.raises(WindowError, match=r"continues the stored session .* the stored files end before calendar "
                                          r"us_futures closes that session at 2024-03-08T23:00:00\.000000000 UTC, so "
                                          r"it was stored in part: cut each file at a session's close"):
        _run(grown)
