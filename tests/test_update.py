"""An append whose new files leave out an instrument the store holds: a warning naming
it, and, once its late file arrives, a refusal that says why (another instrument's stored
day) and what to do, not that the file falls before the stored sessions."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.config import load_config
from pipeline.errors import WindowError
from pipeline.job import run
from pipeline.update import late_segments, uncovered_days
from tests.conftest import in_process_cluster

NS = 10**9
DAY = 86_400 * NS


@pytest.fixture(scope="module")
def address():
    with in_process_cluster(n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        yield c.scheduler_address


def _day(path: Path, day: int, rows: int = 60, seed: int = 0) -> None:
    """One session of a one-level book on 2026-01-05 + ``day``."""
    rng = np.random.default_rng(seed)
    mid = np.round(100 + np.cumsum(rng.normal(0, 0.01, rows)), 2)  # on ticks: exact in float32
    t0 = np.datetime64("2026-01-05T09:30", "ns").astype(np.int64) + day * DAY + seed * 1000
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "timestamp": pa.array(t0 + np.arange(rows) * NS // 10, pa.timestamp("ns")),
        "bid_price_1": mid - 0.01, "ask_price_1": mid + 0.01,
        "bid_size_1": rng.integers(1, 100, rows).astype(float), "ask_size_1": rng.integers(1, 100, rows).astype(float),
    }), path)


def _file(tmp_path: Path, name: str, day: int) -> Path:
    path = tmp_path / "raw" / name / f"2026-01-{5 + day:02d}.parquet"
    _day(path, day, seed=10 * "AB".index(name[0]) + day + 1)
    return path


def _config(tmp_path: Path, address: str) -> Path:
    cfg = {
        "cluster": {"address": address},
        "source": {"paths": str(tmp_path / "raw" / "*" / "*.parquet"), "timestamp": "timestamp",
                   "instrument": {"path": str(tmp_path / "raw" / "{instrument}" / "*.parquet")}, "sessions": "file"},
        "features": {"steps": ["mid_price", "spread", "log_return"], "normalize": "global"},
        "windows": {"size": 8, "stride": 3},
        "labels": {"kind": "return", "horizon": 4},
        "output": {"path": str(tmp_path / "s.zarr"), "chunk_samples": 64,
                   "splits": {"train": {"until": "2026-01-06"}, "test": {}}},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _first_ns(path: Path) -> int:
    """The reference: a file's first timestamp, read back with pyarrow."""
    return int(pq.read_table(path).column("timestamp").cast(pa.int64()).to_numpy()[0])


def test_late_segments_and_uncovered_days_by_hand():
    # Stored: AAA days 0, 1, 2; BBB days 0, 1 (its day 2 came late). New: BBB day 2 (late),
    # BBB day 3 and AAA day 3 (a whole day, fine).
    inst, days = np.array([0, 1, 0, 1, 0]), np.array([0, 0, 1, 1, 2])
    last = days * DAY + 100
    new_inst, new_days = np.array([1, 0, 1]), np.array([2, 3, 3])
    assert late_segments(inst, days, last, new_inst, new_days, new_days * DAY + 5) == [(0, 4)]
    # A new segment that is among its own instrument's stored sessions is left to
    # continue_sessions, which says so.
    assert late_segments(inst, days, last, np.array([0]), np.array([2]), np.array([2 * DAY + 5])) == []
    assert uncovered_days(inst, new_inst, new_days) == [(2, [0])]
    assert uncovered_days(inst, np.array([0, 1]), np.array([3, 3])) == []


def test_a_day_without_one_instrument_warns_and_its_late_file_is_refused_saying_why(tmp_path, address):
    cfg = _config(tmp_path, address)
    for day in (0, 1):
        for name in ("AAA", "BBB"):
            _file(tmp_path, name, day)
    run(load_config(cfg), log=None, progress=False)
    aaa = _file(tmp_path, "AAA", 2)
    with pytest.warns(UserWarning) as caught:
        run(load_config(cfg), log=None, progress=False)
    said = [str(w.message) for w in caught if "new files hold" in str(w.message)]
    day = np.datetime64(_first_ns(aaa), "ns").astype("datetime64[D]")
    assert said == [f"append: the new files hold {day} for instrument(s) AAA only; "
                    "the store also holds BBB, with no new file for that day. Appended now, a file of BBB for that "
                    "day arriving later cannot be appended (only --rebuild takes it): if it is late, stop this run "
                    "and append once it is there (for an instrument that did not trade that day, nothing is to be "
                    "done)"]
    bbb = _file(tmp_path, "BBB", 2)
    with pytest.raises(WindowError) as info:
        run(load_config(cfg), log=None, progress=False)
    msg = str(info.value)
    assert msg.startswith(f"append: {bbb} (instrument 'BBB', from {np.datetime64(_first_ns(bbb), 'ns')}) comes after "
                          "every stored session of 'BBB', but the store already holds 'AAA' up to "
                          f"{np.datetime64(_first_ns(bbb), 'ns').astype('datetime64[D]')} or later ({aaa}, from "
                          f"{np.datetime64(_first_ns(aaa), 'ns')})")
    assert "falls before or among" not in msg and "Rerun with --rebuild" in msg
    # Both instruments' next day together: appended without a warning.
    for name in ("AAA", "BBB"):
        _file(tmp_path, name, 3)
    bbb.unlink()  # set aside: its day stays refused (a rebuild takes it)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="append: the new files hold")
        run(load_config(cfg), log=None, progress=False)
