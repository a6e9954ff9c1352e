"""End to end: generated order-book files -> `pipeline run` on a LocalCluster -> zarr ->
one streamed epoch; the store is compared with a plain-numpy computation of the same
features, windows, labels and splits."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import pipeline
from pipeline.config import parse_config
from pipeline.demo import DemoSpec, write_demo_data
from pipeline.errors import StoreConflictError
from pipeline.job import run

SIZE, STRIDE, SCALES, HORIZON = 8, 3, (1, 3), 5


@pytest.fixture(scope="module")
def raw_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("raw")
    write_demo_data(d, DemoSpec(days=3, rows_per_day=4000, levels=10, seed=7, formats=("parquet",)))
    return d


def config_dict(raw_dir: Path, out: Path) -> dict:
    return {
        "cluster": {"n_workers": 2, "threads_per_worker": 1, "memory_limit": "1GiB"},
        "source": {"paths": str(raw_dir / "*.parquet"), "timestamp": "timestamp", "chunk_rows": 1500},
        "features": {
            "steps": ["mid_price", "spread", {"name": "imbalance", "levels": 3}, "log_return"],
            "normalize": "none",
        },
        "windows": {"size": SIZE, "stride": STRIDE, "scales": list(SCALES)},
        "labels": {"kind": "return", "horizon": HORIZON},
        "output": {"path": str(out), "splits": {"train": 0.7, "val": 0.3}, "chunk_samples": 256},
    }


def day_reference(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Plain numpy over one file (one session): features per step, windows, labels, each
    window's end row in the file and its timestamp."""
    names = [f"{s}_{k}_{i}" for s in ("bid", "ask") for k in ("price", "size") for i in range(1, 11)]
    raw = pq.read_table(path)
    table = np.stack([raw.column(c).to_numpy().astype(np.float32) for c in names], axis=1)
    stamps = raw.column("timestamp").cast("int64").to_numpy()
    col = {c: j for j, c in enumerate(names)}
    bid1, ask1 = table[:, col["bid_price_1"]], table[:, col["ask_price_1"]]
    mid = (bid1 + ask1) / np.float32(2)
    mid64 = (bid1.astype(np.float64) + ask1.astype(np.float64)) / 2
    spread = ask1 - bid1
    b = sum(table[:, col[f"bid_size_{i}"]] for i in range(1, 4))
    a = sum(table[:, col[f"ask_size_{i}"]] for i in range(1, 4))
    imb = (b - a) / (b + a)
    logmid = np.log(mid64)
    ret = np.full_like(mid, np.nan)
    ret[1:] = logmid[1:] - logmid[:-1]
    feats = np.stack([mid, spread, imb, ret], axis=1)[1:]  # the first row has no return
    logmid = logmid[1:]
    T = feats.shape[0]
    S = max(SCALES)
    ends = np.arange((SIZE - 1) * S, T - HORIZON, STRIDE)
    x = np.stack(
        [np.concatenate([feats[e - s * np.arange(SIZE - 1, -1, -1)] for s in SCALES], axis=1) for e in ends]
    )
    y = logmid[ends + HORIZON] - logmid[ends]
    return x, y, ends + 1, stamps[ends + 1]


def reference(raw_dir: Path) -> tuple[np.ndarray, ...]:
    """Each day (file) computed on its own, concatenated: windows never span the night.
    Ends are rows of the concatenated files."""
    parts, offset = [], 0
    for k, path in enumerate(sorted(raw_dir.glob("*.parquet"))):
        x, y, ends, t = day_reference(path)
        parts.append((x, y, ends + offset, t, np.full(len(x), k)))
        offset += pq.ParquetFile(path).metadata.num_rows
    return tuple(np.concatenate(p) for p in zip(*parts))


@pytest.fixture(scope="module")
def store(raw_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out") / "set.zarr"
    summary = run(parse_config(config_dict(raw_dir, out)), log=None, progress=False)
    assert summary.rows_read == 3 * 4000
    return out


def test_a_run_into_a_directory_that_is_not_a_store_is_refused_before_the_cluster_starts(raw_dir, tmp_path,
                                                                                         monkeypatch):
    import pipeline.cluster

    def no_cluster(*a, **k):
        raise AssertionError("the cluster was started")

    monkeypatch.setattr(pipeline.cluster, "cluster", no_cluster)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.txt").write_text("my notes")
    cfg = config_dict(raw_dir, victim)
    cfg["output"]["overwrite"] = True
    with pytest.raises(StoreConflictError, match="victim: a directory that is not a zarr store"):
        run(parse_config(cfg), log=None, progress=False)
    assert [p.name for p in victim.iterdir()] == ["thesis.txt"]


def test_a_run_over_array_files_or_no_files_is_refused_before_the_cluster_starts(tmp_path, monkeypatch):
    """Features and labels name table columns: npy files got "column '0' is not in the
    source (columns: )" after the cluster had started."""
    import pipeline.cluster
    from pipeline.errors import ConfigError, EmptyInputError

    monkeypatch.setattr(pipeline.cluster, "cluster", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started")))
    (tmp_path / "raw").mkdir()
    np.save(tmp_path / "raw" / "0.npy", np.zeros((50, 3), np.float32))
    cfg = {"source": {"paths": str(tmp_path / "raw" / "*.npy"), "combine": "concat"}, "windows": {"size": 4},
           "features": {"steps": [{"name": "column", "column": "0"}]}, "labels": {"kind": "column", "column": "1"},
           "output": {"path": str(tmp_path / "out.zarr")}}
    with pytest.raises(ConfigError, match=r"source.paths: expected tables with named columns .*Python API.*\(npy\)"):
        run(parse_config(cfg), log=None, progress=False)
    assert not (tmp_path / "out.zarr").exists()
    cfg["source"]["paths"] = str(tmp_path / "raw" / "*.parquet")  # a glob that matches nothing: named at once
    with pytest.raises(EmptyInputError, match=r"raw/\*\.parquet: matched no file"):
        run(parse_config(cfg), log=None, progress=False)


def test_a_run_into_a_zip_path_holding_another_file_is_refused_before_the_cluster_starts(raw_dir, tmp_path,
                                                                                         monkeypatch):
    import pipeline.cluster

    monkeypatch.setattr(pipeline.cluster, "cluster", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started")))
    (tmp_path / "notes.zarr.zip").write_text("my notes")
    cfg = config_dict(raw_dir, tmp_path / "notes.zarr.zip")
    cfg["output"]["overwrite"] = True
    with pytest.raises(StoreConflictError, match="notes.zarr.zip: a file that is not a zip store pipeline wrote"):
        run(parse_config(cfg), log=None, progress=False)
    assert (tmp_path / "notes.zarr.zip").read_text() == "my notes"


def test_a_run_over_another_configs_store_is_refused_before_the_cluster_starts(store, raw_dir, monkeypatch):
    import pipeline.cluster

    monkeypatch.setattr(pipeline.cluster, "cluster", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started")))
    cfg = config_dict(raw_dir, store)
    cfg["windows"]["stride"] = STRIDE + 1
    cfg["cluster"] = {"n_workers": 7}  # not part of the data: not named
    with pytest.raises(StoreConflictError, match=r"written from fingerprint.*What differs from the stored build's "
                       rf"config: windows.stride: {STRIDE} -> {STRIDE + 1} \(--rebuild builds it again\)$"):
        run(parse_config(cfg), log=None, progress=False)


def test_stored_windows_and_labels_equal_plain_numpy(store, raw_dir):
    x_ref, y_ref, ends, t_ref, day_ref = reference(raw_dir)
    ds = pipeline.open(store)
    assert list(ds.splits) == ["train", "val"]
    offsets = {}
    for name in ds.splits:
        x = ds[name]["x"][:]
        y = ds[name]["y"][:]
        assert x.shape[1:] == (SIZE, 4 * len(SCALES)) and x.dtype == np.float32
        # Locate the split in the reference by its first window, then compare it whole.
        start = int(np.flatnonzero(np.all(np.isclose(x_ref, x[0], rtol=1e-5, atol=1e-6), axis=(1, 2)))[0])
        np.testing.assert_allclose(x, x_ref[start : start + len(x)], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(y, y_ref[start : start + len(y)], rtol=1e-4, atol=1e-7)
        np.testing.assert_array_equal(ds[name]["t"][:], t_ref[start : start + len(x)])
        np.testing.assert_array_equal(ds[name]["session"][:], day_ref[start : start + len(x)])
        offsets[name] = (start, start + len(x))
    (t0, t1), (v0, v1) = offsets["train"], offsets["val"]
    assert t0 == 0 and v1 == len(x_ref)  # nothing lost at the ends
    assert abs((t1 - t0) / len(x_ref) - 0.7) < 0.05
    # Leakage: the last step any train label touches is before the first step any val window
    # reads, its features' lookback (one step, for the return) included.
    last_train_step = ends[t1 - 1] + HORIZON
    first_val_step = ends[v0] - (SIZE - 1) * max(SCALES) - 1
    assert last_train_step < first_val_step
    # The session table: one session per file, with the windows stored from it (the split
    # gap falls inside the third day), its rows and its times.
    table = ds.attrs["sessions"]
    stored = np.concatenate([ds[name]["session"][:] for name in ds.splits])
    assert [row["windows"] for row in table] == np.bincount(stored, minlength=3).tolist()
    assert [row["rows"][1] - row["rows"][0] for row in table] == [4000] * 3
    assert table[0]["start"].startswith("2026-01-05T09:30") and table[2]["end"].startswith("2026-01-07")


def test_one_epoch_streams_every_sample_exactly_once_aligned(store):
    ds = pipeline.open(store)
    x_all, y_all = ds["train"]["x"][:], ds["train"]["y"][:]
    expected = collections.Counter(zip(map(bytes, x_all.reshape(len(x_all), -1)), y_all.tolist()))
    s = pipeline.stream(str(store), split="train", batch_size=100, seed=3, buffer_chunks=2)
    seen = collections.Counter()
    batches = 0
    for xb, yb in s:
        batches += 1
        seen.update(zip(map(bytes, xb.reshape(len(xb), -1)), yb.tolist()))
    assert batches == len(s)
    assert seen == expected  # every (window, label) pair once: aligned and exactly once


def test_store_records_provenance(store):
    attrs = pipeline.open(store).attrs
    assert attrs["complete"] is True
    assert yaml.safe_load(attrs["config"])["windows"]["size"] == SIZE
    assert len(attrs["config_hash"]) >= 8
    assert attrs["splits"]["train"] > 0


def test_the_smallest_valid_config_runs(raw_dir, tmp_path):
    """Every section with defaults may be left out: features, labels, cluster, stream."""
    out = tmp_path / "small.zarr"
    config = parse_config({"source": {"paths": str(raw_dir / "*.parquet")}, "windows": {"size": 4},
                           "output": {"path": str(out)}})
    summary = run(config, log=None, progress=False)
    ds = pipeline.open(out)
    assert ds.attrs["complete"] and ds.attrs["features"] == ["mid_price", "spread", "log_return"]
    assert summary.samples["train"] == ds["train"]["x"].shape[0] > 0
    assert len(ds.attrs["sessions"]) == 3  # one per file by default


def test_virtual_windows_over_sessions_stream_the_materialized_bytes(raw_dir, tmp_path):
    stores = {}
    for materialize in (True, False):
        cfg = config_dict(raw_dir, tmp_path / f"{materialize}.zarr")
        cfg["windows"]["materialize"] = materialize
        cfg["output"]["splits"] = {"train": 1.0}
        run(parse_config(cfg), log=None, progress=False)
        stores[materialize] = tmp_path / f"{materialize}.zarr"
    seen = {}
    for materialize, path in stores.items():
        s = pipeline.stream(str(path), split="train", batch_size=64, seed=1, arrays=("x", "y", "session"))
        seen[materialize] = collections.Counter(
            (bytes(x.tobytes()), float(y), int(d)) for xb, yb, db in s for x, y, d in zip(xb, yb, db))
    assert seen[True] == seen[False] and len(seen[True]) > 0


def test_a_build_decodes_only_the_columns_its_features_and_label_read(raw_dir, store, tmp_path):
    """A column no feature or label reads is never decoded: a NaN in it does not stop a
    build under ``source.nan: raise``, and the store equals the one built without the
    column, bit for bit. Under ``nan: drop`` every column still decides which rows stay."""
    wide = tmp_path / "wide"
    wide.mkdir()
    for path in sorted(raw_dir.glob("*.parquet")):
        t = pq.read_table(path)
        junk = np.zeros(t.num_rows)
        junk[100:110] = np.nan  # ten rows of the morning, inside windows of the train split
        pq.write_table(t.append_column("junk", pa.array(junk)), wide / path.name, row_group_size=1500)
    cfg = config_dict(wide, tmp_path / "wide.zarr")
    summary = run(parse_config(cfg), log=None, progress=False)
    assert summary.rows_read == 3 * 4000
    a, b = pipeline.open(tmp_path / "wide.zarr"), pipeline.open(store)
    assert a.splits == b.splits and a.attrs["normalization"] == b.attrs["normalization"]
    for split in b.splits:
        for name in ("x", "y", "t", "session"):
            assert a[split][name][:].tobytes() == b[split][name][:].tobytes(), (split, name)
    cfg = config_dict(wide, tmp_path / "dropped.zarr")
    cfg["source"]["nan"] = "drop"
    assert run(parse_config(cfg), log=None, progress=False).rows_read == 3 * (4000 - 10)


def test_times_of_day_dated_by_file_name_build_the_store_of_whole_times(raw_dir, tmp_path):
    """The demo's days as an ITCH-like feed would deliver them (nanoseconds since
    midnight, the date only in an MMDDYYYY file name, which does not sort in time
    order) build the same store as the files with whole timestamps."""
    itch = tmp_path / "itch"
    itch.mkdir()
    for f in sorted(raw_dir.glob("*.parquet")):
        t = pq.read_table(f)
        ns = t.column("timestamp").cast(pa.int64()).to_numpy()
        day = ns // (86_400 * 10**9) * (86_400 * 10**9)
        name = str(np.datetime64(int(day[0]), "ns").astype("datetime64[D]")).replace("-", "")
        t = t.set_column(t.schema.get_field_index("timestamp"), "timestamp", pa.array(ns - day))
        pq.write_table(t, itch / f"{name[4:]}{name[:4]}.parquet")
    stores = {}
    for kind in ("whole", "itch"):
        cfg = config_dict(raw_dir, tmp_path / f"{kind}.zarr")
        first = sorted(raw_dir.glob("*.parquet"))[0].stem  # the first day: train; the rest: val
        cfg["output"]["splits"] = {"train": {"until": str(np.datetime64(first) + 1)}, "val": {}}
        if kind == "itch":
            cfg["source"].update(paths=str(itch / "*.parquet"), date={"path": "itch/{date}.parquet",
                                                                      "format": "%m%d%Y"})
        run(parse_config(cfg), log=None, progress=False)
        stores[kind] = pipeline.open(tmp_path / f"{kind}.zarr")
    for split in ("train", "val"):
        for name in ("x", "y", "t"):
            want = stores["whole"][split][name][:]
            assert want.shape[0] > 0
            np.testing.assert_array_equal(stores["itch"][split][name][:], want)


def test_times_of_day_dated_by_a_date_column_in_one_file_build_the_store_of_whole_times(raw_dir, tmp_path):
    """The demo's days as an LSEG/TRTH-like export would deliver them (one file of
    every day, nanoseconds since midnight beside a YYYYMMDD integer date column, which
    is no feature) build the same store as the files with whole timestamps, one session
    per date."""
    tables = []
    for f in sorted(raw_dir.glob("*.parquet")):
        t = pq.read_table(f)
        ns = t.column("timestamp").cast(pa.int64()).to_numpy()
        day = ns // (86_400 * 10**9) * (86_400 * 10**9)
        ymd = np.array([int(str(d)[:10].replace("-", "")) for d in day.astype("datetime64[ns]")], dtype=np.int64)
        t = t.set_column(t.schema.get_field_index("timestamp"), "timestamp", pa.array(ns - day))
        tables.append(t.append_column("date", pa.array(ymd)))
    vendor = tmp_path / "vendor"
    vendor.mkdir()
    pq.write_table(pa.concat_tables(tables), vendor / "quotes.parquet", row_group_size=2500)  # groups span midnights
    stores = {}
    for kind in ("whole", "column"):
        cfg = config_dict(raw_dir, tmp_path / f"{kind}.zarr")
        cfg["cluster"]["n_workers"] = 1
        cfg["source"]["sessions"] = "date"
        first = sorted(raw_dir.glob("*.parquet"))[0].stem  # the first day: train; the rest: val
        cfg["output"]["splits"] = {"train": {"until": str(np.datetime64(first) + 1)}, "val": {}}
        if kind == "column":
            cfg["source"].update(paths=str(vendor / "quotes.parquet"), date={"column": "date", "format": "%Y%m%d"})
        run(parse_config(cfg), log=None, progress=False)
        stores[kind] = pipeline.open(tmp_path / f"{kind}.zarr")
    for split in ("train", "val"):
        for name in ("x", "y", "t", "session"):
            want = stores["whole"][split][name][:]
            assert want.shape[0] > 0
            np.testing.assert_array_equal(stores["column"][split][name][:], want)


def test_an_up_to_date_store_still_refuses_a_wrong_cluster_section_and_contacts_no_scheduler(store, raw_dir,
                                                                                              tmp_path, monkeypatch):
    """A cron job whose scheduler file or TLS file is wrong reported success (exit 0)
    as long as the store was up to date: the cluster section is checked before the run
    decides there is nothing to do; the scheduler itself is not contacted then."""
    import io

    import pipeline.cluster
    from pipeline.errors import ClusterError, ConfigError

    monkeypatch.setattr(pipeline.cluster, "cluster", lambda *a, **k: (_ for _ in ()).throw(AssertionError("started")))
    before = sorted(p.relative_to(store) for p in store.rglob("*"))

    def run_with(cluster_section: dict, log: io.StringIO | None = None):
        cfg = config_dict(raw_dir, store)
        cfg["cluster"] = cluster_section  # not part of the data: the same build
        return run(parse_config(cfg), log=log, progress=False)

    with pytest.raises(ConfigError, match=r"^cluster\.scheduler_file: .*nodir/s\.json: no such file, and no folder"):
        run_with({"scheduler_file": str(tmp_path / "nodir" / "s.json")})
    with pytest.raises(ConfigError, match=r"^cluster\.tls_ca_file: .*ca\.pem: no such file"):
        run_with({"address": "tls://127.0.0.1:8786", "tls_ca_file": str(tmp_path / "ca.pem")})
    with pytest.raises(ClusterError, match=r"tls://127\.0\.0\.1:8786: a tls:// scheduler needs cluster\.tls_ca_file"):
        run_with({"address": "tls://127.0.0.1:8786"})
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before
    # Nothing listens there, and nothing needs to: the store is up to date.
    log = io.StringIO()
    summary = run_with({"address": "tcp://127.0.0.1:1"}, log)
    assert summary.action == "up to date"
    assert "up to date (every file the config matches is in the store; nothing to compute, so the cluster was not " \
           "contacted)" in log.getvalue()
