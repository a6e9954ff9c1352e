"""Exchange-calendar sessions (pipeline/features/calendars.py) against exchange_calendars'
schedule read by pandas alone."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("exchange_calendars")


def _pandas_sessions(ns: np.ndarray, name: str, aware: bool) -> np.ndarray:
    """Each timestamp's session label (days since 1970-01-01, or -1 outside every
    session) from exchange_calendars' schedule by pandas alone, one session at a time;
    naive times read as wall clock in the calendar's zone."""
    import warnings

    import exchange_calendars as xcals
    import pandas as pd

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = xcals.get_calendar(name, start="2024-01-02", end="2024-12-31")
    t = pd.DatetimeIndex(pd.to_datetime(ns, utc=True)) if aware else pd.DatetimeIndex(ns.view("datetime64[ns]"))
    t = t if aware else t.tz_localize(cal.tz, ambiguous="NaT", nonexistent="NaT")
    out = np.full(ns.size, -1, dtype=np.int64)
    for day, row in cal.schedule.iterrows():
        inside = np.asarray((t >= row["open"]) & (t < row["close"]))
        out[inside] = pd.Timestamp(day).value // (86_400 * 10**9)
    return out


@pytest.mark.parametrize("name", ["XNYS", "us_futures", "CMES"])
@pytest.mark.parametrize("aware", [True, False])
def test_calendar_sessions_are_those_pandas_finds_in_the_calendars_schedule(name, aware):
    """Minutes over 2024-03-06..03-14 (the 2024-03-10 DST change) and 2024-11-26..12-02
    (Thanksgiving, the half day after it, and the 2024-11-03 change's week before)."""
    from pipeline.features.calendars import OUTSIDE, calendar_sessions

    rng = np.random.default_rng(3)
    spans = [("2024-03-06", "2024-03-14"), ("2024-10-31", "2024-11-05"), ("2024-11-26", "2024-12-02")]
    ns = np.sort(np.concatenate([
        np.datetime64(a, "ns").astype(np.int64) + rng.integers(0, (np.datetime64(b) - np.datetime64(a)).astype(
            "timedelta64[ns]").astype(np.int64), 4000) for a, b in spans]))
    got = calendar_sessions(ns, "America/New_York" if aware else None, name)
    want = _pandas_sessions(ns, name, aware)
    np.testing.assert_array_equal(np.where(got == OUTSIDE, -1, got), want)
    assert (want >= 0).any() and (want < 0).any()
