"""Per-row timestamps (pipeline.loaders.columns): what a file of rows going back in time is told."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline.errors import LoaderError
from pipeline.loaders import open_source

#: 09:30:00 to 09:30:04 as nanoseconds since midnight (NASDAQ ITCH's times of day).
TOD = (34_200 + np.arange(5, dtype=np.int64)) * 10**9


def _days_in_one_file(path, dates=(20231228, 20231229)) -> pd.DataFrame:
    """A vendor's quotes: several days in one file, a date column beside the times of day."""
    frame = pd.concat([pd.DataFrame({"date": d, "timestamp": TOD, "bid_price_1": 190.0 + np.arange(5)})
                       for d in dates])
    frame.to_csv(path, index=False)
    return frame


def test_times_of_day_of_several_days_in_one_file_are_not_told_to_sort(tmp_path):
    # The second day's first row goes back to 09:30 of 1970-01-01: sorting the file by
    # time, the usual advice, would interleave the two days.
    frame = _days_in_one_file(tmp_path / "quotes.csv")
    back = int(np.flatnonzero(np.diff(frame["timestamp"].to_numpy()) < 0)[0]) + 1  # pandas' row of the new day
    with pytest.raises(LoaderError) as err:
        open_source(str(tmp_path / "quotes.csv"), timestamp="timestamp").timestamps.compute()
    msg = str(err.value)
    assert f"quotes.csv: timestamp column 'timestamp': line {back + 2} is at 1970-01-01T09:30:00" in msg
    assert "they look like times of day" in msg and "source.date" in msg and "sort the file" not in msg


def test_a_file_dated_by_its_path_that_holds_several_days_is_told_to_keep_one_day_per_file(tmp_path):
    _days_in_one_file(tmp_path / "20231228.csv")
    with pytest.raises(LoaderError, match=r"20231228\.csv: timestamp column 'timestamp': line 7 is at "
                       r"2023-12-28T09:30:00\.000000000, before .*2023-12-28T09:30:04.*source\.date gives a whole file "
                       r"one date.*keep one day per file"):
        open_source(str(tmp_path / "*.csv"), timestamp="timestamp",
                    date={"path": str(tmp_path / "{date}.csv"), "format": "%Y%m%d"}).timestamps.compute()


def test_whole_times_out_of_order_are_still_told_to_sort(tmp_path):
    t = pd.Timestamp("2024-01-02 09:30").value + np.array([0, 2, 1]) * 10**9 * 3600 * 2
    pd.DataFrame({"timestamp": t, "v": [1.0, 2.0, 3.0]}).to_csv(tmp_path / "q.csv", index=False)
    with pytest.raises(LoaderError, match=r"q\.csv: timestamp column 'timestamp': line 4 .*sort the file by time$"):
        open_source(str(tmp_path / "q.csv"), timestamp="timestamp").timestamps.compute()
