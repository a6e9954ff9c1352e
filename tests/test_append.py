"""Appending new sessions (`pipeline run` on a config whose files grew): the store equals a
build of every file (every array value for value, folds, attributes), and what would make
it differ, or what a build of every file refuses, is refused first."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

import pipeline
from pipeline.config import load_config
from pipeline.errors import PipelineError
from pipeline.job import run
from tests.conftest import assert_bitwise_equal, in_process_cluster

NS = 10**9
DAY = 86_400 * NS


@pytest.fixture(scope="module")
def address():
    """One in-process cluster for every run of this module (a LocalCluster per run
    would cost seconds each)."""
    with in_process_cluster(n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        yield c.scheduler_address


def _day(path: Path, day: int, rows: int, seed: int) -> None:
    """One session of a one-level book: prices a random walk, sizes positive."""
    rng = np.random.default_rng(seed)
    mid = 100 + np.cumsum(rng.normal(0, 0.01, rows))
    t0 = np.datetime64("2026-01-05T09:30", "ns").astype(np.int64) + day * DAY
    table = pa.table({
        "timestamp": pa.array(t0 + np.arange(rows) * NS // 10, pa.timestamp("ns")),
        "bid_price_1": mid - 0.01, "ask_price_1": mid + 0.01,
        "bid_size_1": rng.integers(1, 100, rows).astype(float), "ask_size_1": rng.integers(1, 100, rows).astype(float),
    })
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def _config(tmp_path: Path, address: str, out: str, **over) -> Path:
    cfg = {
        "cluster": {"address": address},
        "source": {"paths": str(tmp_path / "raw" / "*" / "*.parquet"), "timestamp": "timestamp",
                   "instrument": {"path": str(tmp_path / "raw" / "{instrument}" / "*.parquet")}, "sessions": "file",
                   "chunk_rows": over.pop("chunk_rows", None)},
        "features": {"steps": ["mid_price", "spread", {"name": "imbalance", "levels": 1}, "log_return",
                               {"name": "rolling_mean", "window": 5}],
                     "normalize": over.pop("normalize", "global")},
        "windows": {"size": 8, "stride": over.pop("stride", 3), "scales": [1, 2],
                    "materialize": over.pop("materialize", True)},
        "labels": {"kind": "return", "horizon": 4},
        "output": {"path": str(tmp_path / out), "chunk_samples": over.pop("chunk_samples", 64),
                   "splits": over.pop("splits", {"train": {"until": "2026-01-07"}, "test": {}})},
    }
    for key, value in over.items():
        cfg["output"][key] = value
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))  # split order is time order
    return path


def _run(path: Path, mode: str = "auto"):
    return run(load_config(path), log=None, progress=False, mode=mode)


def _write_days(tmp_path: Path, lengths: list[list[int]]) -> list[list[Path]]:
    """Files per instrument (AAA, BBB...) and day with the given row counts."""
    out = []
    for i, per_day in enumerate(lengths):
        name = "AB"[i] * 3
        out.append([tmp_path / "raw" / name / f"2026-01-{5 + d:02d}.parquet" for d in range(len(per_day))])
        for d, rows in enumerate(per_day):
            _day(out[-1][d], d, rows, seed=100 * i + d)
    return out


def _hold_back(tmp_path: Path, files: list[list[Path]], new: int) -> list[tuple[Path, Path]]:
    """Move each instrument's last ``new`` days aside; returns (held, home) pairs."""
    moved = []
    for per in files:
        for f in per[len(per) - new:]:
            held = tmp_path / "held" / f.parent.name / f.name
            held.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(f, held)
            moved.append((held, f))
    return moved


# No shrinking: each example builds three stores; a failure is reported as drawn.
@settings(max_examples=14, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    instruments=st.integers(1, 2),
    days=st.integers(4, 6),
    new=st.integers(1, 2),
    rows=st.lists(st.integers(30, 400), min_size=12, max_size=12),
    chunk_rows=st.sampled_from([None, 37, 128]),
    chunk_samples=st.sampled_from([16, 64, 500]),
    materialize=st.booleans(),
    normalize=st.sampled_from(["global", "none", {"kind": "trailing", "sessions": 2}]),
    folds=st.booleans(),
)
def test_an_append_equals_a_build_of_every_file(tmp_path_factory, address, instruments, days, new, rows, chunk_rows,
                                                  chunk_samples, materialize, normalize, folds):
    tmp_path = tmp_path_factory.mktemp("append")
    lengths = [rows[i * 6: i * 6 + days] for i in range(instruments)]
    files = _write_days(tmp_path, lengths)
    opts = dict(chunk_rows=chunk_rows, chunk_samples=chunk_samples, materialize=materialize, normalize=normalize)
    if folds:
        opts.update(splits={"all": {}}, folds={"kind": "anchored", "test_sessions": 1, "min_train_sessions": 1})
    moved = _hold_back(tmp_path, files, new)
    grown = _config(tmp_path, address, "grown.zarr", **opts)
    try:
        first = _run(grown)
    except PipelineError as exc:
        event(f"no first build: {type(exc).__name__}")
        return  # too little data for a window in some split: nothing to append to
    for held, home in moved:
        shutil.move(held, home)
    appended = _run(grown)
    event("appended")
    assert (first.version, appended.version, appended.action) == (0, 1, "append")
    full = _config(tmp_path, address, "full.zarr", **opts)
    _run(full)
    assert_bitwise_equal(tmp_path / "grown.zarr", tmp_path / "full.zarr")
    # The first version is still there, as it was.
    v0 = pipeline.open(tmp_path / "grown.zarr", version=0)
    assert v0.attrs["splits"] == first.samples


@pytest.fixture()
def grown(tmp_path, address):
    """A store of 2 instruments x 4 days, and the config, with a fifth day written
    afterwards (returned as the files to add)."""
    files = _write_days(tmp_path, [[200] * 5, [150] * 5])
    moved = _hold_back(tmp_path, files, 1)
    path = _config(tmp_path, address, "grown.zarr")
    _run(path)
    return path, moved


def _store_bytes(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}


def _refused(path: Path, match: str) -> None:
    store = Path(load_config(path).output.path)
    before = _store_bytes(store)
    with pytest.raises(PipelineError, match=match):
        _run(path)
    assert _store_bytes(store) == before  # refused before anything was written


def test_a_rerun_without_new_files_is_up_to_date(grown):
    path, _ = grown
    summary = _run(path)
    assert (summary.action, summary.version) == ("up to date", 0)
    text = summary.format()  # the store as it is: no rows read, nothing written, no rate
    assert "up to date: no new file" in text and "store size:" in text
    assert "written:" not in text and "rows read" not in text and "MiB/s" not in text


def test_a_changed_stored_file_is_refused_naming_it_and_rebuild_starts_over(grown, tmp_path):
    path, moved = grown
    for held, home in moved:
        shutil.move(held, home)
    old = tmp_path / "raw" / "AAA" / "2026-01-06.parquet"
    _day(old, 1, 210, seed=7)  # another size
    _refused(path, r"AAA/2026-01-06.parquet: changed since the store was built \(its size is .*--rebuild")
    summary = _run(path, mode="rebuild")
    assert (summary.action, summary.version) == ("build", 0)
    _run(_config(tmp_path, load_config(path).cluster.address, "full.zarr"))
    assert_bitwise_equal(tmp_path / "grown.zarr", tmp_path / "full.zarr")


def test_a_touched_file_with_the_same_bytes_is_not_a_change(grown, tmp_path):
    path, moved = grown
    old = tmp_path / "raw" / "BBB" / "2026-01-05.parquet"
    os.utime(old, (1e9, 1e9))
    assert _run(path).action == "up to date"
    data = bytearray(old.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes, another time: changed
    old.write_bytes(bytes(data))
    _refused(path, r"BBB/2026-01-05.parquet: changed since the store was built \(it was modified")


def test_a_missing_stored_file_is_refused(grown, tmp_path):
    path, _ = grown
    (tmp_path / "raw" / "BBB" / "2026-01-07.parquet").unlink()
    _refused(path, r"BBB/2026-01-07.parquet: read by the store's build, but no longer there")


def test_a_session_among_the_stored_ones_is_refused_naming_it(grown, tmp_path):
    path, moved = grown
    early = tmp_path / "raw" / "AAA" / "2026-01-04.parquet"
    _day(early, -1, 100, seed=3)
    _refused(path, r"AAA/2026-01-04.parquet \(from 2026-01-04.*falls before or among the stored sessions")


def test_a_stored_day_supplied_again_or_overlapping_the_last_session_is_refused(grown, tmp_path):
    """A build of every file refuses these as files out of time order; the append took
    them as new sessions, duplicating windows."""
    path, _ = grown
    last = tmp_path / "raw" / "AAA" / "2026-01-08.parquet"
    again = tmp_path / "raw" / "AAA" / "2026-01-08-resend.parquet"
    shutil.copy(last, again)
    _refused(path, r"AAA/2026-01-08-resend.parquet starts at 2026-01-08T09:30:00.000000000, before the stored data "
                   r"of its instrument ends \(2026-01-08T09:30:19.9.*a day supplied twice")
    again.unlink()
    late = pq.read_table(last).slice(100)  # the second half of the last stored session
    pq.write_table(late, tmp_path / "raw" / "AAA" / "2026-01-08-late.parquet")
    _refused(path, r"2026-01-08-late.parquet starts at 2026-01-08T09:30:10.000000000, before the stored data")


def test_fraction_splits_and_new_instruments_are_refused(tmp_path, address):
    files = _write_days(tmp_path, [[200] * 4, [150] * 4])
    moved = _hold_back(tmp_path, files, 1)
    path = _config(tmp_path, address, "frac.zarr", splits={"train": 0.7, "test": 0.3})
    _run(path)
    for held, home in moved:
        shutil.move(held, home)
    _refused(path, r"fraction splits would move stored samples from one split to another")
    dated = _config(tmp_path, address, "dated.zarr")
    for _, home in moved:
        home.unlink()
    _run(dated)
    _day(tmp_path / "raw" / "CCC" / "2026-01-08.parquet", 3, 100, seed=5)
    _refused(dated, r"instrument 'CCC' is not in the store")


def test_an_append_to_a_zip_store_swaps_the_file_and_old_readers_keep_theirs(tmp_path, address):
    files = _write_days(tmp_path, [[200] * 5])
    moved = _hold_back(tmp_path, files, 1)
    path = _config(tmp_path, address, "set.zarr.zip")
    _run(path)
    before = pipeline.open(tmp_path / "set.zarr.zip")
    y_before = before["test"]["y"][:]
    for held, home in moved:
        shutil.move(held, home)
    assert _run(path).action == "append"
    # The reader opened before still reads the old file, whole.
    np.testing.assert_array_equal(before["test"]["y"][:], y_before)
    full = _config(tmp_path, address, "full.zarr.zip")
    _run(full)
    assert_bitwise_equal(tmp_path / "set.zarr.zip", tmp_path / "full.zarr.zip")
    assert not list(tmp_path.glob("*.append.zarr"))  # the unpacked copy is gone


def test_an_append_to_s3_equals_a_local_build(tmp_path, address, s3):
    files = _write_days(tmp_path, [[200] * 5])
    moved = _hold_back(tmp_path, files, 1)
    url = f"s3://training/append-{tmp_path.name}.zarr"
    path = _config(tmp_path, address, "remote", storage_options=s3)
    cfg = yaml.safe_load(path.read_text())
    cfg["output"]["path"] = url
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    _run(path)
    for held, home in moved:
        shutil.move(held, home)
    assert _run(path).version == 1
    local = _config(tmp_path, address, "full.zarr")
    _run(local)
    remote = pipeline.open(url, storage_options=s3)
    full = pipeline.open(tmp_path / "full.zarr")
    for split in full.splits:
        for name in full[split]:
            if not name.startswith("_"):
                assert remote[split][name][:].tobytes() == full[split][name][:].tobytes()


def _sydney_day(path: Path, day: int, rows: int) -> None:
    """One Sydney session, 10:00 to 16:00 local (23:00 to 05:00 UTC): it spans UTC midnight."""
    rng = np.random.default_rng(day)
    mid = 100 + np.cumsum(rng.normal(0, 0.01, rows))
    start = np.datetime64("2026-01-04T23:00", "ns").astype(np.int64) + day * DAY
    stamps = pa.array(start + np.arange(rows) * (6 * 3600 * NS // rows), pa.timestamp("ns", tz="Australia/Sydney"))
    table = pa.table({"timestamp": stamps, "bid_price_1": mid - 0.01, "ask_price_1": mid + 0.01,
                      "bid_size_1": rng.integers(1, 100, rows).astype(float),
                      "ask_size_1": rng.integers(1, 100, rows).astype(float)})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)


def test_dates_of_sessions_and_splits_are_the_datas_own_zone_in_builds_and_appends(tmp_path, address):
    """Sydney's 2026-01-07 starts at 13:00 UTC on the 6th: the date split cuts there, not at
    UTC midnight (11:00 in Sydney, mid-session), and an append numbers its sessions by
    Sydney dates as the build of every file does."""
    files = [tmp_path / "raw" / "AAA" / f"day{d}.parquet" for d in range(4)]
    for d, f in enumerate(files):
        _sydney_day(f, d, 300)
    opts = dict(normalize="none", splits={"train": {"until": "2026-01-07"}, "test": {}})
    held = _hold_back(tmp_path, [files], 1)
    grown = _config(tmp_path, address, "grown.zarr", **dict(opts))
    cfg = yaml.safe_load(grown.read_text())
    cfg["source"]["sessions"] = "date"
    grown.write_text(yaml.safe_dump(cfg, sort_keys=False))
    _run(grown)
    for moved, home in held:
        shutil.move(moved, home)
    assert _run(grown).action == "append"
    full = tmp_path / "full.yaml"
    cfg["output"]["path"] = str(tmp_path / "full.zarr")
    full.write_text(yaml.safe_dump(cfg, sort_keys=False))
    _run(full)
    assert_bitwise_equal(tmp_path / "grown.zarr", tmp_path / "full.zarr")
    ds = pipeline.open(tmp_path / "full.zarr")
    cut = np.datetime64("2026-01-06T13:00", "ns").astype(np.int64)
    train_t, test_t = ds["train"]["t"][:].astype(np.int64), ds["test"]["t"][:].astype(np.int64)
    assert train_t.max() < cut <= test_t.min()
    assert len(np.unique(ds["train"]["session"][:])) == 2 and len(np.unique(ds["test"]["session"][:])) == 2


def test_a_new_day_without_a_column_a_feature_reads_is_refused_naming_the_file_column_and_feature(grown):
    """The feature code named the column only; the new day's file and the feature are
    named, before anything is written."""
    path, moved = grown
    for held, home in moved:
        pq.write_table(pq.read_table(held).drop(["ask_size_1"]), home)
    assert "ask_size_1" not in pq.read_schema(moved[0][1]).names
    _refused(path, r"raw/AAA/2026-01-09\.parquet: append: this new file \(and the 1 other new file\(s\)\) has no "
                   r"column 'ask_size_1', which feature 'imbalance' \(features\.steps\[2\]\) reads")


def test_date_splits_after_the_first_days_start_empty_and_appends_fill_them(tmp_path, address):
    """A daily store set up with only its training days: validation and test are created
    empty, with the chunks a full build gives them, and appended days fill them to
    the bytes of a build of every file."""
    files = _write_days(tmp_path, [[200] * 4, [150] * 4])
    moved = _hold_back(tmp_path, files, 2)
    splits = {"train": {"until": "2026-01-07"}, "val": {"until": "2026-01-08"}, "test": {}}
    grown = _config(tmp_path, address, "grown.zarr", splits=splits)
    first = _run(grown)
    assert first.samples["train"] > 0 and (first.samples["val"], first.samples["test"]) == (0, 0)
    with pytest.raises(PipelineError, match="split 'test' of .* holds no samples"):
        next(iter(pipeline.stream(str(tmp_path / "grown.zarr"), split="test", batch_size=8)))
    for held, home in moved:
        shutil.move(held, home)
    appended = _run(grown)
    assert appended.samples["val"] > 0 and appended.samples["test"] > 0
    _run(_config(tmp_path, address, "full.zarr", splits=splits))
    assert_bitwise_equal(tmp_path / "grown.zarr", tmp_path / "full.zarr")


def test_new_windows_in_the_split_the_statistics_were_fitted_on_are_warned_of(tmp_path, address):
    """Frozen statistics scale new train windows by the first build's mean and std: an
    append into train then differs from a build of every file, which was said nowhere.
    An append whose new days fall after train's end says nothing."""
    import warnings

    files = _write_days(tmp_path, [[200] * 4, [150] * 4])
    moved = _hold_back(tmp_path, files, 2)
    into_train = _config(tmp_path, address, "a.zarr", splits={"train": {}})
    after_train = _config(tmp_path, address, "b.zarr")  # train until 2026-01-07: the held days come after
    _run(into_train)
    _run(after_train)
    for held, home in moved:
        shutil.move(held, home)
    with pytest.warns(UserWarning, match=r"append: [\d,]+ new window\(s\) fall in split 'train', on which the "
                                         r"normalization statistics were fitted: .* `pipeline run --refit`") as said:
        grown = _run(into_train)
    (text,) = [str(w.message) for w in said if "normalization statistics" in str(w.message)]
    assert f"{grown.samples['train'] - pipeline.open(tmp_path / 'a.zarr', version=0)['train']['x'].shape[0]:,} new " \
        in text
    full = pipeline.open(tmp_path / "a.zarr").attrs["normalization"]
    assert full["fit_on"] == "train"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _run(after_train)


def _ny_day(path: Path, day: str, rows: int, seed: int, kind: str = "aware") -> None:
    """A New York session as a vendor's pandas writes it (``kind``: how this day differs
    from the others, as a trial's quant found it: ``naive`` times, ``utc`` ones, epoch
    ``int_timestamps``, fixed-point ``int_prices`` x 10^4, or ``empty``, a holiday)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    t = pd.Timestamp(f"{day} 09:30", tz="America/New_York") + pd.to_timedelta(np.arange(rows) * NS // 10, unit="ns")
    mid = 100 + np.cumsum(rng.choice([-0.01, 0.0, 0.01], rows))
    frame = pd.DataFrame({"timestamp": t, "bid_price_1": mid - 0.01, "ask_price_1": mid + 0.01,
                          "bid_size_1": rng.integers(1, 99, rows).astype(float),
                          "ask_size_1": rng.integers(1, 99, rows).astype(float)})
    if kind == "naive":
        frame["timestamp"] = frame["timestamp"].dt.tz_localize(None)
    elif kind == "utc":
        frame["timestamp"] = frame["timestamp"].dt.tz_convert("UTC")
    elif kind == "int_timestamps":
        frame["timestamp"] = frame["timestamp"].astype("int64")
    elif kind == "int_prices":
        for c in ("bid_price_1", "ask_price_1"):
            frame[c] = np.rint(frame[c] * 10_000).astype("int64")
    elif kind == "empty":
        frame = frame.iloc[:0]
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "no_row_groups":  # a schema and no row group, as a header-only CSV has no line
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.ParquetWriter(path, pa.Schema.from_pandas(frame, preserve_index=False)).close()
        return
    frame.to_parquet(path, index=False)


NY_DAYS = ["2024-12-02", "2024-12-03", "2024-12-04", "2024-12-05", "2024-12-06"]


def _ny_store(tmp_path: Path, address: str, days: int = 3) -> Path:
    for d, day in enumerate(NY_DAYS[:days]):
        _ny_day(tmp_path / "raw" / "AAA" / f"{day}.parquet", day, 200, seed=d)
    path = _config(tmp_path, address, "grown.zarr", normalize="none",
                   splits={"train": {"until": "2024-12-04"}, "test": {}})
    _run(path)
    return path


def _build_error(tmp_path: Path, address: str) -> str:
    """What a build of every file says of them."""
    with pytest.raises(PipelineError) as exc:
        _run(_config(tmp_path, address, "full.zarr", normalize="none",
                     splits={"train": {"until": "2024-12-04"}, "test": {}}))
    return str(exc.value)


@pytest.mark.parametrize("kind, says", [
    ("naive", r"timestamp column 'timestamp' is naive \(no time zone\); the files mix both, time-zone-aware: 3 file\(s\)"),
    ("int_prices", r"column 'bid_price_1' holds integers up to 1\.0\d+e\+06, but .*2024-12-02\.parquet holds floats"),
    ("int_timestamps", r"timestamp column 'timestamp' holds integers \(epoch times, read in source\.timestamp_unit\) "
                       r"in 1 file\(s\), but a timestamp type in America/New_York in 3 file\(s\)"),
    ("utc", r"the files' timestamps are in several time zones \(America/New_York, UTC\): a date"),
])
def test_an_append_refuses_what_a_build_of_every_file_refuses_with_its_message_naming_the_new_file(
        tmp_path, address, kind, says):
    """A trial's quant: each new day was accepted, stored 5 hours early (naive), 10,000x
    too large (int_prices) or in a zone that made the next --rebuild fail (utc); a build
    of the same files refused each. The append refuses it before writing anything, in
    the build's words, naming the new file."""
    path = _ny_store(tmp_path, address)
    new = tmp_path / "raw" / "AAA" / "2024-12-05.parquet"
    _ny_day(new, "2024-12-05", 200, seed=5, kind=kind)
    _refused(path, rf"^{re.escape(str(new))}: {says}")
    with pytest.raises(PipelineError) as appended:
        _run(path)
    built = _build_error(tmp_path, address)
    assert re.search(says, built)
    if kind != "utc":  # the build names its first file there, the append the new one
        assert str(appended.value) == built


def test_a_store_without_the_record_of_file_types_checks_its_last_stored_file(tmp_path, address):
    """Stores written before ``sources.types``: the last stored file's footer stands for
    the stored ones (the build refused files of mixed kinds)."""
    import zarr

    from pipeline.storage.store import ATTRS_KEY

    path = _ny_store(tmp_path, address)
    group = zarr.open_group(str(tmp_path / "grown.zarr"), mode="r+")
    meta = dict(group.attrs[ATTRS_KEY])
    assert meta["sources"].pop("types")["groups"]["AAA"]["time"] == {
        "aware:America/New_York": [str(tmp_path / "raw" / "AAA" / "2024-12-02.parquet"), 3]}
    group.attrs[ATTRS_KEY] = meta
    new = tmp_path / "raw" / "AAA" / "2024-12-05.parquet"
    _ny_day(new, "2024-12-05", 200, seed=5, kind="naive")
    _refused(path, rf"^{re.escape(str(new))}: timestamp column 'timestamp' is naive \(no time zone\); the "
                   r"files mix both, time-zone-aware: 3 file\(s\) \(first .*2024-12-04\.parquet, America/New_York\)")
    _ny_day(new, "2024-12-05", 200, seed=5)
    assert _run(path).action == "append"
    assert pipeline.open(tmp_path / "grown.zarr").attrs["sources"]["types"]["groups"]["AAA"]["time"] == {
        "aware:America/New_York": [str(tmp_path / "raw" / "AAA" / "2024-12-04.parquet"), 4]}


def test_an_empty_holiday_file_adds_nothing_and_the_append_equals_a_build(tmp_path, address):
    """A holiday written as a 0-row file was refused as data of 1970 'before or among the
    stored sessions'; alone, it is recorded as read and the next run is up to date."""
    path = _ny_store(tmp_path, address)
    _ny_day(tmp_path / "raw" / "AAA" / "2024-12-05.parquet", "2024-12-05", 200, seed=5, kind="empty")
    _ny_day(tmp_path / "raw" / "AAA" / "2024-12-06.parquet", "2024-12-06", 150, seed=6)
    appended = _run(path)
    assert (appended.action, appended.version) == ("append", 1)
    full = _config(tmp_path, address, "full.zarr", normalize="none", splits={"train": {"until": "2024-12-04"},
                                                                             "test": {}})
    _run(full)
    assert_bitwise_equal(tmp_path / "grown.zarr", tmp_path / "full.zarr")
    # The last day's windows, against pandas: window i ends at its session's row
    # lookback + (size - 1) * max(scales) + i * stride.
    import pandas as pd

    last = pd.read_parquet(tmp_path / "raw" / "AAA" / "2024-12-06.parquet")
    ds = pipeline.open(tmp_path / "grown.zarr")
    test = ds["test"]
    mine = test["session"][:] == test["session"][:].max()
    ends = last["timestamp"].astype("int64").to_numpy()[int(ds.attrs["lookback"]) + 7 * 2::3]
    ends = ends[ends <= last["timestamp"].astype("int64").to_numpy()[-1 - 4]]  # its label 4 rows on
    np.testing.assert_array_equal(test["t"][:][mine].astype(np.int64), ends)

    _ny_day(tmp_path / "raw" / "AAA" / "2024-12-09.parquet", "2024-12-09", 200, seed=9, kind="empty")
    alone = _run(path)
    assert (alone.action, alone.version) == ("append", 2) and _run(path).action == "up to date"
    assert pipeline.open(tmp_path / "grown.zarr").attrs["splits"] == appended.samples
    # A file with no row group at all (a header-only CSV has no part either): every new
    # file empty was refused ("every one of the 1 file(s) has no data rows").
    _ny_day(tmp_path / "raw" / "AAA" / "2024-12-10.parquet", "2024-12-10", 200, seed=10, kind="no_row_groups")
    alone = _run(path)
    assert (alone.action, alone.version) == ("append", 3) and _run(path).action == "up to date"
    recorded = pipeline.open(tmp_path / "grown.zarr").attrs["sources"]["files"]
    assert recorded[-1]["path"].endswith("2024-12-10.parquet") and recorded[-1]["rows"] == 0
    assert pipeline.open(tmp_path / "grown.zarr").attrs["splits"] == appended.samples
    _run(full, mode="rebuild")
    assert_bitwise_equal(tmp_path / "grown.zarr", tmp_path / "full.zarr")


def test_gap_sessions_appended_are_numbered_on_as_a_build_numbers_them(tmp_path, address):
    """``sessions: {gap: ...}`` labels each instrument's sessions #0, #1, ...: appended
    ones were all #0 (the new files numbered alone)."""
    files = _write_days(tmp_path, [[200] * 4, [150] * 4])
    moved = _hold_back(tmp_path, files, 2)
    paths = {}
    for out in ("grown.zarr", "full.zarr"):
        path = _config(tmp_path, address, out)
        cfg = yaml.safe_load(path.read_text())
        cfg["source"]["sessions"] = {"gap": "1h"}
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        paths[out] = path
    _run(paths["grown.zarr"])
    for held, home in moved:
        shutil.move(held, home)
    _run(paths["grown.zarr"])
    _run(paths["full.zarr"])
    labels = {out: [(s["instrument"], s["label"]) for s in pipeline.open(tmp_path / out).attrs["sessions"]]
              for out in paths}
    assert labels["grown.zarr"] == labels["full.zarr"]
    assert sorted(labels["full.zarr"]) == [(i, f"#{k}") for i in ("AAA", "BBB") for k in range(4)]
    assert_bitwise_equal(tmp_path / "grown.zarr", tmp_path / "full.zarr")
