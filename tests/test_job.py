"""What a run prints at its end, and what it says of its input (pipeline/job.py): files
`source.on_error: skip` left out, files changed while the run read them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipeline
import pipeline.cluster
import pipeline.loaders.provenance  # patched below: imported so, whichever tests ran first
import pipeline.storage
import pipeline.storage.replace
import pipeline.storage.writer
from pipeline.config import load_config
from pipeline.errors import IncompleteStoreError, LoaderError, StoreConflictError
from pipeline.job import RunSummary, changed_files, mtime_text, run, skipped_line
from tests.conftest import small_run_config


def _summary(**kw) -> RunSummary:
    return RunSummary(store="s.zarr", rows_read=1000, samples={"train": 80, "val": 10}, bytes_written=2**20,
                      uncompressed_bytes=2**22, seconds=2.0, **kw)


def test_the_summary_says_what_the_splits_left_out():
    lines = _summary(left_out={"outside": 1234, "embargo": {"train": 5, "val": 0}}).format().splitlines()
    assert "windows left out: 1,234 outside every split; by the embargo: train 5" in lines
    assert lines.index("windows per split: train 80, val 10") + 1 == lines.index(
        "windows left out: 1,234 outside every split; by the embargo: train 5")
    assert not any(x.startswith("windows left out") for x in _summary().format().splitlines())
    assert not any(x.startswith("windows left out") for x in _summary(left_out={"embargo": {"train": 0}}).format()
                   .splitlines())


# -- a run's input: files left out, files changed while read ------------------------------


def test_the_skipped_line_names_the_first_files_and_counts_the_rest():
    skipped = [(f"/raw/d{i}.csv.gz", f"cannot read (reason {i})") for i in range(5)]
    assert skipped_line(skipped[:1], 3) == (
        "source.on_error: skip left out 1 of 3 files: /raw/d0.csv.gz: cannot read (reason 0) (the store's skipped "
        "attribute lists them: pipeline inspect STORE)")
    line = skipped_line(skipped, 9)
    assert line.startswith("source.on_error: skip left out 5 of 9 files: /raw/d0.csv.gz: cannot read (reason 0); "
                           "/raw/d1.csv.gz: cannot read (reason 1); /raw/d2.csv.gz: cannot read (reason 2); and 2 more")
    assert "d3" not in line and "\n" not in line


def _config(tmp_path: Path, *extra: str):
    path = small_run_config(tmp_path, rows_per_day=3000, seed=7, chunk_rows=1000)
    return load_config(path, overrides=["cluster.n_workers=1", "features.normalize=global", *extra])


def test_a_run_names_the_files_on_error_skip_left_out(tmp_path):
    config = _config(tmp_path, "source.on_error=skip")
    good = sorted((tmp_path / "raw").glob("*.parquet"))
    bad = tmp_path / "raw" / "zz-truncated.parquet"
    bad.write_bytes(good[0].read_bytes()[:5000])  # a day cut off in its transfer
    with pytest.raises(Exception) as reference:  # what pyarrow itself says of the file
        pq.read_table(bad)
    assert reference.value is not None
    with pytest.warns(UserWarning, match=rf"source.on_error: skip left out 1 of {len(good) + 1} files: "
                                         rf"{bad}: expected a Parquet file"):
        run(config, log=None, progress=False)
    assert pipeline.open(config.output.path).attrs["skipped"][0][0] == str(bad)


def test_a_changed_modification_time_is_said_in_utc_iso_and_a_size_with_separators(tmp_path):
    f = tmp_path / "d.csv"
    f.write_bytes(b"x" * 12_345)
    os.utime(f, (1_795_805_223.457024, 1_795_805_223.457024))
    now = os.stat(f).st_mtime
    # The references: pandas' own rendering of the same instants in UTC.
    ref = {t: pd.Timestamp(t, unit="s", tz="UTC").strftime("%Y-%m-%dT%H:%M:%S.%fZ") for t in (1_795_805_042.25, now)}
    assert mtime_text(1_795_805_042.25) == ref[1_795_805_042.25] == "2026-11-27T18:44:02.250000Z"
    assert changed_files({str(f): (12_345, 1_795_805_042.25)}) == [
        (str(f), f"its modification time was {ref[1_795_805_042.25]}, is {ref[now]}")]
    assert changed_files({str(f): (1_000, now)}) == [(str(f), "its size was 1,000 bytes, is 12,345")]
    # Times apart by less than the microsecond shown keep the raw seconds, lest the message
    # say a time changed to itself.
    near = float(np.nextafter(now, 0))
    [(_, why)] = changed_files({str(f): (12_345, near)})
    assert why == f"its modification time was {ref[now]} ({near!r} s), is {ref[now]} ({now!r} s)"


def _replace_with_other_prices(path: Path) -> None:
    """A vendor's re-send: the same rows, prices x1.5, written anew and moved in."""
    df = pd.read_parquet(path)
    prices = [c for c in df if "price" in c]
    df[prices] = df[prices] * 1.5
    tmp = path.with_name(".resend.parquet")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def test_a_file_replaced_before_the_write_fails_the_run_and_writes_nothing(tmp_path, monkeypatch):
    config = _config(tmp_path)
    victim = sorted((tmp_path / "raw").glob("*.parquet"))[-1]
    real = pipeline.loaders.provenance.with_hashes

    def replaced_meanwhile(*args, **kwargs):  # between the source's opening and its hashes
        _replace_with_other_prices(victim)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline.loaders.provenance, "with_hashes", replaced_meanwhile)
    with pytest.raises(LoaderError, match=rf"^{victim}: changed while this run read it \(its (size|modification "
                                          r"time) was .*\); nothing was written: rerun"):
        run(config, log=None, progress=False)
    assert not Path(config.output.path).exists()
    monkeypatch.undo()
    run(config, log=None, progress=False)  # the rerun builds from the file as it is
    rec = {f["path"]: f for f in pipeline.open(config.output.path).attrs["sources"]["files"]}[str(victim)]
    st = os.stat(victim)
    assert (rec["size"], rec["mtime"]) == (st.st_size, st.st_mtime)


def _replaced_during_the_write(monkeypatch, victim: Path) -> None:
    """The file replaced once the workers have written every unit (and so read it),
    before the store is marked complete."""
    real = pipeline.storage.writer._confirm_written

    def replaced_during(*args, **kwargs):
        if victim.stat().st_size and not getattr(replaced_during, "done", False):
            replaced_during.done = True
            _replace_with_other_prices(victim)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline.storage.writer, "_confirm_written", replaced_during)


def test_a_file_replaced_during_the_write_leaves_the_store_incomplete_and_refuses_its_resume(tmp_path, monkeypatch):
    config = _config(tmp_path)
    victim = sorted((tmp_path / "raw").glob("*.parquet"))[-1]
    _replaced_during_the_write(monkeypatch, victim)
    with pytest.raises(LoaderError, match=rf"^{victim}: changed while this run read it .*; the store, which may "
                                          r"hold windows of both contents, is not marked complete .*: rerun with "
                                          r"--rebuild"):
        run(config, log=None, progress=False)
    monkeypatch.undo()
    with pytest.raises(IncompleteStoreError):
        pipeline.open(config.output.path)
    with pytest.raises(StoreConflictError, match=rf"{victim}: changed since the interrupted build began.*--rebuild"):
        run(config, log=None, progress=False)  # a resume would keep windows of the old content
    run(config, log=None, progress=False, mode="rebuild")
    ds = pipeline.open(config.output.path)
    rec = {f["path"]: f for f in ds.attrs["sources"]["files"]}[str(victim)]
    assert rec["size"] == os.stat(victim).st_size


def test_a_file_replaced_during_an_overwrite_puts_the_previous_store_back(tmp_path, monkeypatch):
    # The check ran after the write: the overwrite had marked the new store complete and
    # removed the old one, then the flag was taken back: no complete store was left.
    config = _config(tmp_path)
    run(config, log=None, progress=False)
    store = Path(config.output.path)
    before = {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}
    victim = sorted((tmp_path / "raw").glob("*.parquet"))[-1]
    _replaced_during_the_write(monkeypatch, victim)
    with pytest.warns(RuntimeWarning, match="the previous store is back in place"), \
            pytest.raises(LoaderError, match=rf"^{victim}: changed while this run read it"):
        run(config, log=None, progress=False, mode="rebuild")
    monkeypatch.undo()
    pipeline.storage.replace.wait_for_removals()
    after = {str(p.relative_to(store)): p.read_bytes() for p in sorted(store.rglob("*")) if p.is_file()}
    assert after == before and sorted(os.listdir(store.parent)).count(store.name) == 1
    assert not [n for n in os.listdir(store.parent) if ".replaced-" in n]


@pytest.mark.parametrize("pattern", ["raw/*", "raw/**", "raw/**/*", "raw/*.parquet", "raw/?ut.zarr*", "raw/[a-o]*",
                                     "*/out.zarr.lock", "raw/*/zarr.json", "**/*.lock", "raw/out.zarr", "other/*"])
def test_glob_reaches_what_glob_matches(tmp_path, pattern):
    """The pure match of a glob against a path, checked against glob.glob on files that
    exist (components matched one by one; ** across any number of them)."""
    import glob

    from pipeline.job import glob_reaches

    for name in ("raw/a.parquet", "raw/out.zarr/zarr.json", "raw/out.zarr.lock", "raw/sub/b.parquet", "other/c.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    full = os.path.join(str(tmp_path), pattern)
    found = {p.rstrip(os.sep) for p in glob.glob(full, recursive=True)}  # "raw/**" lists "raw/" too
    every = {os.path.join(root, n) for root, dirs, files in os.walk(tmp_path) for n in dirs + files}
    assert {p for p in every if glob_reaches(full, p)} == found


@pytest.mark.parametrize("paths, out", [("raw/*", "raw/out.zarr"), ("raw/**", "raw/deep/out.zarr"),
                                        (["x/*.parquet", "raw/*"], "raw/out.zarr.zip")])
def test_an_output_where_the_source_reads_is_refused_before_anything_is_written(tmp_path, paths, out):
    """Its lock file, made first, was named as an input of unknown suffix (and gone by
    the time the user looked); on a rerun the store itself would be read."""
    from pipeline.errors import ConfigError

    config = _config(tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        import dataclasses

        src = dataclasses.replace(config.source, paths=paths)
        bad = dataclasses.replace(config, source=src, output=dataclasses.replace(config.output, path=out))
        with pytest.raises(ConfigError, match=rf"^output\.path: '[^']*{out}' is where source\.paths '(raw/\*|raw/\*\*)' "
                                              r"reads raw files: the store's own files \(.*\) would be read as input"):
            run(bad, log=None, progress=False)
    finally:
        os.chdir(cwd)
    assert sorted(p.name for p in (tmp_path / "raw").iterdir() if not p.name.endswith(".parquet")) == []


def test_rows_left_out_under_nan_drop_are_said_beside_the_rows_read(tmp_path):
    """The source line said 2,997 rows read of a file of 3,000 and nothing of the 3 rows
    ``source.nan: drop`` left out."""
    import io

    # A worker thread measures the whole test process's memory: no limit to pause it at.
    config = _config(tmp_path, "source.nan=drop", "cluster.processes=false", "cluster.memory_limit=null")
    day = sorted((tmp_path / "raw").glob("*.parquet"))[1]
    table = pd.read_parquet(day)
    table.loc[[10, 500, 501], "bid_price_1"] = np.nan
    table.loc[[900], "ask_price_3"] = np.inf
    table.to_parquet(day, index=False)
    log = io.StringIO()
    summary = run(config, log=log, progress=False)
    (line,) = [x for x in log.getvalue().splitlines() if x.startswith("source:")]
    assert line.endswith("; 4 row(s) left out with NaN or inf (source.nan: drop)"), line
    assert f"{summary.rows_read:,} rows x" in line and summary.rows_read == 2 * 3000 - 4


@pytest.mark.parametrize("config_file", sorted((Path(__file__).parent.parent / "configs").glob("*.yaml")))
def test_a_printed_config_prints_the_same_again(tmp_path, config_file):
    """``--print-config`` fills in the defaults: the default codec was printed as its
    shorthand, which printed expanded once read back."""
    from pipeline.job import config_as_yaml

    once = config_as_yaml(load_config(config_file))
    (tmp_path / "printed.yaml").write_text(once)
    assert config_as_yaml(load_config(tmp_path / "printed.yaml")) == once
    assert isinstance(__import__("yaml").safe_load(once)["output"]["codec"], dict)


def test_an_output_bucket_that_does_not_exist_is_refused_before_the_cluster_starts(tmp_path, s3, monkeypatch):
    """The run read and computed every window, then failed to write, saying "no zarr
    group found"; now the bucket is named first, and no cluster starts."""
    import pipeline.cluster
    from pipeline.errors import StoreError

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["endpoint_url"])
    started = []
    monkeypatch.setattr(pipeline.cluster, "cluster", lambda *a, **k: started.append(1))
    config = _config(tmp_path, "output.path=s3://no-such-bucket/set.zarr")
    with pytest.raises(StoreError, match=r"output.path: s3://no-such-bucket/set.zarr: the bucket 'no-such-bucket' "
                                         r"does not exist .*nothing was read or written"):
        run(config, log=None, progress=False)
    assert started == []


@pytest.mark.parametrize("suffix, said", [(".feather", r"is an Arrow IPC \(Feather\) file \(\.feather\), which is not "
                                                      r"read; convert it to Parquet once: pyarrow\.parquet\.write_table"),
                                          (".orc", r"unknown suffix '\.orc'")])
def test_files_of_a_suffix_no_table_format_has_are_refused_before_the_cluster_starts(tmp_path, suffix, said,
                                                                                       monkeypatch):
    """A Feather day beside the Parquet ones: the refusal came from the first task, once
    the cluster had started, and ended "or set format:" without naming any format."""
    import dataclasses

    import pyarrow.feather as feather

    from pipeline.errors import ConfigError

    config = _config(tmp_path)
    first = sorted((tmp_path / "raw").glob("*.parquet"))[0]
    other = first.with_suffix(suffix)
    feather.write_feather(pq.read_table(first), other)
    src = dataclasses.replace(config.source, paths=[config.source.paths, str(tmp_path / "raw" / f"*{suffix}")])

    def no_cluster(*args, **kwargs):
        raise AssertionError("the cluster was started")

    monkeypatch.setattr(pipeline.cluster, "cluster", no_cluster)  # job.run imports it when it starts one
    with pytest.raises(ConfigError, match=rf"^source\.paths: '[^']*\*{re.escape(suffix)}': {said}.*; pipeline run "
                                          r"reads tables: \.csv, \.parquet, \.pq files \(CSV also compressed: \.csv\.gz.*\), or "
                                          r"files of any suffix with source\.format: csv, parquet, lobster, fi2010$"):
        run(dataclasses.replace(config, source=src), log=None, progress=False)
    assert not Path(config.output.path).exists()


def test_archives_and_compressed_text_pass_the_suffix_check_to_be_opened(tmp_path):
    """A glob of .zip days (Binance's public files) or of .csv.gz ones is left to the files
    opened, as before: the check of suffixes refuses only those that no format has."""
    import dataclasses
    import gzip
    import zipfile

    from pipeline.job import _check_table_source

    config = _config(tmp_path)
    with zipfile.ZipFile(tmp_path / "day.zip", "w") as z:
        z.writestr("day.csv", "timestamp,bid_price_1\n1,2\n")
    (tmp_path / "day.csv.gz").write_bytes(gzip.compress(b"timestamp,bid_price_1\n1,2\n"))
    for pattern in ("*.zip", "*.csv.gz"):
        _check_table_source(dataclasses.replace(config.source, paths=str(tmp_path / pattern)))


def test_an_arrow_ipc_file_read_as_parquet_is_named_as_one(tmp_path):
    """pyarrow says "Parquet magic bytes not found in footer" of a Feather file given
    ``format: parquet`` (or named .parquet): the file is now named for what it is."""
    import pyarrow as pa
    import pyarrow.feather as feather

    from pipeline.errors import FormatMismatchError
    from pipeline.loaders import open_source

    table = pa.table({"timestamp": pa.array(np.arange(10).astype("datetime64[ns]")), "bid_price_1": np.ones(10)})
    feather.write_feather(table, tmp_path / "day.parquet")
    with pytest.raises(FormatMismatchError, match=r"day\.parquet: is an Arrow IPC \(Feather\) file \(its first bytes "
                                                  r"are ARROW1\), which is not read; convert it to Parquet once"):
        open_source(str(tmp_path / "day.parquet"), timestamp="timestamp")
    pq.write_table(table, tmp_path / "real.parquet")  # the advice's own conversion reads
    assert open_source(str(tmp_path / "real.parquet"), timestamp="timestamp").timestamps.compute().shape == (10,)


def test_windows_left_out_for_nan_are_in_the_summary_and_the_report(tmp_path):
    """Windows whose features were NaN (an empty book's imbalance, 0/0) were left out
    without a word in the summary or in `pipeline inspect`: only the store's
    ``nan_windows_dropped`` attribute counted them."""
    from pipeline.storage.inspect import format_report, inspect_store

    config = _config(tmp_path)
    day = sorted((tmp_path / "raw").glob("*.parquet"))[0]
    table = pq.read_table(day).to_pandas()
    empty = table.index[100:400:25]
    for side in ("bid", "ask"):
        for level in range(1, 6):
            table.loc[empty, f"{side}_size_{level}"] = 0.0
    pq.write_table(pa.Table.from_pandas(table, preserve_index=False), day)
    summary = run(config, log=None, progress=False)
    dropped = pipeline.open(config.output.path).attrs["nan_windows_dropped"]
    assert sum(dropped.values()) > 0
    counts = ", ".join(f"{k} {v:,}" for k, v in dropped.items() if v)
    line = f"holding NaN or a label on an empty price: {counts}"
    assert any(x.startswith("windows left out: ") and line in x for x in summary.format().splitlines()), \
        summary.format()
    assert line in format_report(inspect_store(config.output.path))
