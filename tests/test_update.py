"""An append whose new files leave out an instrument the store holds: a warning naming
it, and, once its late file arrives, a refusal that says why (another instrument's stored
day) and what to do, not that the file falls before the stored sessions; under
``output.on_partial_day: refuse``, a refusal before anything is written. A file the
stored build skipped (``source.on_error: skip``), delivered again repaired, is refused
naming the skip."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.config import load_config
from pipeline.errors import StoreError, WindowError
from pipeline.job import run
from pipeline.update import late_segments, skipped_by_build, skipped_refusal, uncovered_days
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


def _config(tmp_path: Path, address: str, **output) -> Path:
    cfg = {
        "cluster": {"address": address},
        "source": {"paths": str(tmp_path / "raw" / "*" / "*.parquet"), "timestamp": "timestamp",
                   "instrument": {"path": str(tmp_path / "raw" / "{instrument}" / "*.parquet")}, "sessions": "file"},
        "features": {"steps": ["mid_price", "spread", "log_return"], "normalize": "global"},
        "windows": {"size": 8, "stride": 3},
        "labels": {"kind": "return", "horizon": 4},
        "output": {"path": str(tmp_path / "s.zarr"), "chunk_samples": 64,
                   "splits": {"train": {"until": "2026-01-06"}, "test": {}}, **output},
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
                    "day arriving later cannot be appended (only --rebuild takes it); for a job that cannot wait for "
                    "it, output.on_partial_day: refuse refuses such an append until every instrument's file of the "
                    "day is there (for an instrument that did not trade that day, nothing is to be done)"]
    assert "stop this run" not in said[0]  # the run goes on and commits: nothing to stop
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


def _tree(path: Path) -> dict[str, bytes]:
    """Every file of a store with its bytes: the reference for "nothing was written"."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_on_partial_day_refuse_writes_nothing_and_the_rerun_appends_the_whole_day(tmp_path, address):
    cfg = _config(tmp_path, address, on_partial_day="refuse")
    for day in (0, 1):
        for name in ("AAA", "BBB"):
            _file(tmp_path, name, day)
    run(load_config(cfg), log=None, progress=False)
    store = tmp_path / "s.zarr"
    before = _tree(store)
    aaa = _file(tmp_path, "AAA", 2)
    day = np.datetime64(_first_ns(aaa), "ns").astype("datetime64[D]")
    with pytest.raises(StoreError) as info:
        run(load_config(cfg), log=None, progress=False)
    assert str(info.value) == (
        f"append: the new files hold {day} for instrument(s) AAA only; the store also holds BBB, with no new file "
        "for that day. output.on_partial_day: refuse refuses such an append, and nothing was written: rerun once "
        f"the file(s) of BBB for {day} are there (if BBB did not trade that day, rerun once with --set "
        "output.on_partial_day=append)")
    assert _tree(store) == before
    # The late file arrives: the rerun appends the whole day, as a build of every file
    # places it (the late-file refusal of the default never comes).
    bbb = _file(tmp_path, "BBB", 2)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="append: the new files hold")
        run(load_config(cfg), log=None, progress=False)
    import pipeline

    ds = pipeline.open(str(store))
    assert ds.version.number == 1
    files = {f["path"] for f in ds.attrs["sources"]["files"]}
    assert {str(aaa), str(bbb)} <= files
    starts = sorted(np.datetime64(r["start"], "ns").astype(np.int64) for r in ds.attrs["sessions"])
    assert starts[-2:] == sorted([_first_ns(aaa), _first_ns(bbb)])


def test_skipped_files_and_the_refusal_that_names_them():
    meta = {"skipped": [["/raw/d07.parquet", "expected a Parquet file"], ["/raw/d09.parquet", "truncated"]]}
    left = skipped_by_build(meta, ["/raw/d07.parquet", "/raw/d08.parquet"])
    assert left == [("/raw/d07.parquet", "expected a Parquet file")]
    assert skipped_by_build({}, ["/raw/d07.parquet"]) == []
    named = skipped_refusal("append: /raw/d07.parquet (from 2026-01-07T14:30) falls before or among ...", left)
    assert named.startswith("append: /raw/d07.parquet was left out of the stored build by source.on_error: skip "
                            "(expected a Parquet file); ")
    assert named.endswith("rerun with --rebuild to build every file, this one included")
    other = skipped_refusal("append: 2026-01-06 falls before or among the stored sessions", left)
    assert other.startswith("append: 2026-01-06 falls before or among the stored sessions (/raw/d07.parquet, a new "
                            "file, is one the stored build left out by source.on_error: skip (expected a Parquet "
                            "file): --rebuild includes it)")


def test_a_repaired_file_the_stored_build_skipped_is_refused_naming_the_skip(tmp_path, address):
    raw = tmp_path / "raw"
    for day in (0, 1, 3):
        _day(raw / f"2026-01-{5 + day:02d}.parquet", day, seed=day + 1)
    broken = raw / "2026-01-07.parquet"
    broken.write_bytes(b"broken" * 20)
    with pytest.raises(Exception):  # the reference: pyarrow cannot read it either
        pq.read_table(broken)
    cfg = {
        "cluster": {"address": address},
        "source": {"paths": str(raw / "*.parquet"), "timestamp": "timestamp", "on_error": "skip"},
        "features": {"steps": ["mid_price", "spread"], "normalize": "none"},
        "windows": {"size": 8, "stride": 3},
        "labels": {"kind": "return", "horizon": 4},
        "output": {"path": str(tmp_path / "s.zarr"), "splits": {"train": {"until": "2026-01-07"}, "test": {}}},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    with pytest.warns(UserWarning, match="source.on_error: skip left out 1 of 4 files"):
        run(load_config(path), log=None, progress=False)
    _day(broken, 2, seed=3)  # the vendor delivers the day again, readable
    with pytest.raises(WindowError) as info:
        run(load_config(path), log=None, progress=False)
    msg = str(info.value)
    assert msg.startswith(f"append: {broken} was left out of the stored build by source.on_error: skip (expected a "
                          "Parquet file")
    assert "falls among the stored sessions" in msg and "--rebuild" in msg
    assert "falls before or among" not in msg
