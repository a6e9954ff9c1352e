"""`pipeline inspect`: the report and the PNG."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import zarr

import pipeline
from pipeline.errors import StoreError
from pipeline.features.windows import windows_numpy_block
from pipeline.storage import format_report, inspect_store, plot_store, write
from pipeline.storage.inspect import PlotSample, feature_labels, plot_sample, spread_chunks


def test_report_lists_splits_chunks_codec_ratio_and_completeness(tmp_path):
    x = np.repeat(np.arange(256, dtype=np.float32), 32).reshape(256, 8, 4)
    write(tmp_path / "s.zarr", {"x": x, "y": np.arange(256)}, splits={"train": .5, "val": .5}, gap=0, chunk_samples=32,
          attrs={"features": ["a", "b", "c", "d"], "windows": {"size": 8, "scales": [1]}}, progress=False)
    report = inspect_store(tmp_path / "s.zarr")
    assert report.complete and [a.split for a in report.arrays] == ["train", "train", "val", "val"]
    assert report.stored_bytes < report.nbytes  # compressible data compressed
    text = format_report(report)
    for needle in ("complete: yes", "train/x: (128, 8, 4) float32, chunks (32, 8, 4)", "blosc", "ratio",
                   "features: a, b, c, d"):
        assert needle in text, needle
    assert "_written" not in text


def test_cli_inspect_with_plot_writes_a_png(tmp_path):
    x = np.random.default_rng(0).standard_normal((100, 8, 4)).astype(np.float32)
    write(tmp_path / "s.zarr", {"x": x, "y": np.arange(100)}, progress=False)
    png = tmp_path / "view.png"
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", "inspect", str(tmp_path / "s.zarr"), "--plot",
                             str(png)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "train/x" in result.stdout and f"plot: {png}" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = matplotlib.image.imread(png).shape[:2]
    assert width >= 1000 and height >= 600


def test_inspect_and_verify_do_not_import_dask_array(tmp_path):
    """``pipeline inspect`` reads metadata and markers: dask.array (with xarray and
    pandas behind it) was most of its start-up, a second before the first line."""
    x = np.random.default_rng(1).standard_normal((120, 8, 4)).astype(np.float32)
    write(tmp_path / "s.zarr", {"x": x, "y": np.arange(120)}, chunk_samples=40, progress=False)
    code = ("import sys\nfrom pipeline.storage import format_report, inspect_store, verify_store\n"
            f"report = inspect_store({str(tmp_path / 's.zarr')!r})\n"
            f"assert verify_store({str(tmp_path / 's.zarr')!r}).problems == ()\n"
            "print(report.complete, sorted(m for m in ('dask.array', 'pandas', 'xarray') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "[]"]


def test_verify_names_every_corrupt_chunk(tmp_path):
    x = np.random.default_rng(3).standard_normal((200, 6)).astype(np.float32)
    path = tmp_path / "v.zarr"
    write(path, {"x": x, "y": np.arange(200)}, chunk_samples=50, codec="none", progress=False)
    from pipeline.storage import verify_store

    assert verify_store(path).problems == ()
    # A silent bit flip (uncompressed, so it still decodes) and a truncated chunk.
    chunk = path / "train" / "x" / "c" / "1" / "0"
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0xFF
    chunk.write_bytes(bytes(data))
    (path / "train" / "y" / "c" / "3").write_bytes(b"\x00\x01")
    problems = verify_store(path)
    assert "train/x chunk 1: checksum mismatch" in problems
    assert any(p.startswith("train/y chunk 3: cannot decode") for p in problems)
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", "inspect", str(path), "--verify"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "CORRUPT train/x chunk 1: checksum mismatch" in result.stdout


def test_verify_says_a_chunk_file_is_missing(tmp_path):
    """zarr reads a missing chunk file as the fill value: its checksum differs, and the
    report says why, apart from a flipped bit."""
    from pipeline.storage import verify_store

    path = tmp_path / "m.zarr"
    y = np.arange(200)
    y[50:100] = 0  # chunk 1 holds only the fill value: no file, and nothing wrong
    write(path, {"x": np.ones((200, 2), np.float32), "y": y}, chunk_samples=50, progress=False)
    assert verify_store(path).problems == ()
    (path / "train" / "y" / "c" / "2").unlink()
    assert verify_store(path).problems == ("train/y chunk 2: checksum mismatch (its chunk file is missing: the "
                                           "store was copied or synced in part)",)


def test_verify_finds_one_arrays_chunk_copied_over_anothers(tmp_path):
    """The CRCs of a unit are recorded in writing order, which zarr does not keep: a
    chunk file copied over another array's (so that its CRC is among the unit's) is
    still found, by counting each CRC."""
    from pipeline.storage import verify_store

    n = 200
    path = tmp_path / "v.zarr"
    write(path, {"x": np.ones((n, 2), np.float32), "y": np.arange(n), "t": np.arange(n) * 1000}, chunk_samples=50,
          codec="none", progress=False)
    assert verify_store(path).problems == ()
    (path / "train" / "y" / "c" / "0").write_bytes((path / "train" / "t" / "c" / "0").read_bytes())
    np.testing.assert_array_equal(pipeline.open(path)["train"]["y"][:50], np.arange(50) * 1000)  # it decodes
    problems = verify_store(path)
    assert "train/y chunk 0: checksum mismatch (it holds the same bytes as train/t, which the unit's checksums " \
           "do not)" in problems and len(problems) == 2  # t's chunk 0 now shares its bytes with y's


@pytest.mark.parametrize(("fmt", "layout"), [(3, "root"), (3, "train"), (2, "root")])
def test_a_store_another_tool_wrote_is_described_as_such_and_verify_decodes_every_chunk(tmp_path, fmt, layout):
    """No 'rerun the same pipeline run' for a store pipeline never wrote, its arrays listed
    wherever they are, and --verify (no checksums there) decoding every chunk rather than
    calling a damaged store verified."""
    import zarr

    from pipeline.storage import verify_store

    x = np.random.default_rng(0).standard_normal((500, 4)).astype(np.float32)
    path = tmp_path / f"{layout}{fmt}.zarr"
    group = zarr.open_group(str(path), mode="w", zarr_format=fmt)
    sub = group.require_group("train") if layout == "train" else group
    sub.create_array("x", data=x, chunks=(100, 4))
    sub.create_array("y", data=np.arange(500), chunks=(100,))
    before = {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    prefix = "train/" if layout == "train" else ""
    report = inspect_store(path)
    assert report.foreign and [(f"{a.split}/{a.name}".lstrip("/"), a.shape) for a in report.arrays] == \
        [(f"{prefix}x", (500, 4)), (f"{prefix}y", (500,))]
    text = format_report(report)
    assert "written by: another tool" in text and "rerun" not in text and f"  {prefix}x: (500, 4) float32" in text
    assert report.nbytes == x.nbytes + 500 * 8
    assert verify_store(path).problems == ()
    cli = [sys.executable, "-m", "pipeline.cli", "inspect", str(path), "--verify"]
    result = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.rstrip().endswith(
        "verify: no checksums recorded (a store pipeline did not write): every chunk decodes")
    assert {p: p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()} == before  # read only
    with pytest.raises(StoreError, match=r"--plot draws the windows, features and labels of a store pipeline "
                       "wrote; this one another tool wrote"):
        plot_store(path, str(tmp_path / "p.png"))
    chunk = path.joinpath(*prefix.split("/")[:-1], "x", *(["c", "2", "0"] if fmt == 3 else ["2.0"]))
    data = bytearray(chunk.read_bytes())
    data[10:30] = b"\xff" * 20
    chunk.write_bytes(bytes(data))
    problems = verify_store(path)
    assert len(problems) == 1 and problems.problems[0].startswith(f"{prefix}x chunk (2, 0): cannot decode")
    result = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and f"CORRUPT {prefix}x chunk (2, 0): cannot decode" in result.stdout


def test_session_table_and_class_balance_lines():
    from pipeline.storage.inspect import balance_lines, session_lines

    attrs = {
        "instruments": ["AAA", "BBB"],
        "sessions": [{"instrument": "AAA", "session": 0, "rows": [0, 100], "start": "2026-01-05T09:30:00",
                      "end": "2026-01-05T16:00:00", "windows": 0},
                     {"instrument": "BBB", "session": 1, "rows": [100, 350], "start": "2026-01-06T09:30:00",
                      "end": "2026-01-06T16:00:00", "windows": 1234}],
        "labels": {"kind": "smoothed", "horizons": [10, 20], "classes": ["down", "stationary", "up"]},
        "class_balance": {"train": [[1, 2, 1], [2, 0, 2]]},
    }
    text = "\n".join(session_lines(attrs))
    assert "sessions: 2 over 2 instruments (AAA, BBB)" in text
    row = [line for line in text.splitlines() if line.strip().startswith("BBB")][0].split()
    assert row[1] == "1" and row[-2] == "250" and row[-1] == "1,234"
    balance = balance_lines(attrs)
    assert balance[0] == "class balance (down, stationary, up):"
    assert balance[1] == "  train k=10: 1 (25%), 2 (50%), 1 (25%)" and balance[2].startswith("  train k=20: 2 (50%)")
    assert session_lines({}) == [] and balance_lines({}) == []


# -- the plot ----------------------------------------------------------------------------


def test_histogram_chunks_are_spread_evenly_over_the_split_first_and_last_included():
    assert spread_chunks([10] * 100, 16) == tuple(round(i * 99 / 15) for i in range(16))
    picks = spread_chunks([10] * 100, 16)
    assert picks[0] == 0 and picks[-1] == 99 and len(set(picks)) == 16
    assert max(np.diff(picks)) - min(np.diff(picks)) <= 1  # even steps, up to rounding
    assert spread_chunks([5, 0, 5, 0, 5], 16) == (0, 2, 4)  # empty chunks hold nothing to count
    assert spread_chunks([5, 0, 5, 0, 5], 2) == (0, 4)
    assert spread_chunks([0, 0], 4) == () and spread_chunks([3], 0) == ()


def test_sample_windows_come_one_from_each_stretch_of_the_split_and_follow_the_seed():
    lengths = [100] * 40 + [0] + [37]  # 4,037 samples, an empty chunk, a short last chunk
    starts = np.concatenate([[0], np.cumsum(lengths)])
    a = plot_sample(lengths, n_windows=4, seed=7)
    assert a == plot_sample(lengths, n_windows=4, seed=7)  # deterministic
    assert a.windows != plot_sample(lengths, n_windows=4, seed=8).windows  # and seeded
    assert a.chunks == spread_chunks(lengths, 16)
    total = sum(lengths)
    for k, (chunk, row, index) in enumerate(a.windows):
        assert starts[chunk] + row == index and 0 <= row < lengths[chunk]  # a real sample of that chunk
        assert k * total // 4 <= index < (k + 1) * total // 4  # one in each quarter of the split
    # Over many seeds the draws reach every part of the split, not its first chunk only.
    chunks = {c for seed in range(50) for c, _, _ in plot_sample(lengths, n_windows=4, seed=seed).windows}
    assert len(chunks) > 30 and max(chunks) == 41 and 40 not in chunks
    assert len(plot_sample([2, 1], n_windows=8).windows) == 3  # never more than the split holds
    assert plot_sample([], n_windows=4) == plot_sample([0, 0], n_windows=4) == PlotSample(windows=(), chunks=())


def test_feature_labels_name_every_column_once_per_scale():
    attrs = {"features": ["mid", "spread"], "windows": {"scales": [1, 4]}}
    assert feature_labels(attrs, 4) == (["mid@1", "spread@1", "mid@4", "spread@4"], ["mid", "spread"])
    assert feature_labels({"features": ["a", "b"], "virtual": {"scales": [2, 3]}}, 4)[0] == ["a@2", "b@2", "a@3", "b@3"]
    assert feature_labels({"features": ["a", "b", "c"]}, 3) == (["a", "b", "c"], ["a", "b", "c"])
    assert feature_labels({"features": ["a"]}, 2)[0] == ["f0", "f1"]  # names that do not fit are not guessed
    assert feature_labels({"windows": {"scales": [1, 2]}}, 4)[0] == ["f0@1", "f1@1", "f0@2", "f1@2"]


def _series(T=6000, seed=0):
    rng = np.random.default_rng(seed)
    return np.c_[100 + np.cumsum(rng.standard_normal(T)) * 0.1, rng.exponential(1, T),
                 rng.standard_normal((T, 2))].astype(np.float32)


NAMES = ["mid", "spread", "imbalance", "ret"]
SIZE, SCALES = 16, (1, 4)
HALO = (SIZE - 1) * max(SCALES)


@pytest.fixture(scope="module")
def plotted(tmp_path_factory):
    """The same windows, materialized and virtual, with class labels for two horizons."""
    d = tmp_path_factory.mktemp("plot")
    f = _series()
    ends = np.arange(HALO, len(f))
    y = np.random.default_rng(1).integers(0, 3, size=(ends.size, 2))
    labels = {"kind": "smoothed", "horizons": [10, 50], "classes": ["down", "stationary", "up"]}
    w = pipeline.windows(f, size=SIZE, scales=SCALES, names=NAMES)
    mat = write(d / "m.zarr", {"x": w, "y": y}, splits={"train": .8, "val": .2}, horizon=0, chunk_samples=200,
                attrs={"labels": labels}, progress=False)
    n = int(ends.size * .8)
    virt = write(d / "v.zarr", {"train": {"ends": ends[:n], "y": y[:n]}, "val": {"ends": ends[n + HALO:],
                                "y": y[n + HALO:]}}, shared={"features": f}, shared_chunk_rows=300, chunk_samples=200,
                 features=NAMES, attrs={"labels": labels, "class_balance": {"train": [[5, 6, 7], [7, 6, 5]]},
                                        "virtual": {"size": SIZE, "stride": 1, "scales": list(SCALES), "halo": HALO}},
                 progress=False)
    return {"materialized": mat, "virtual": virt, "features": f, "ends": ends}


@pytest.mark.parametrize("kind", ["materialized", "virtual"])
def test_plot_of_a_store_is_one_readable_png(plotted, kind, tmp_path):
    png = tmp_path / f"{kind}.png"
    assert plot_store(plotted[kind], str(png)) == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(png)  # decodes: a whole, valid PNG
    height, width = image.shape[:2]
    assert 1000 <= width <= 4000 and 800 <= height <= 4000
    assert 30_000 < png.stat().st_size < 5_000_000
    assert image[..., :3].std() > 0.05  # something is drawn, not a blank page


@pytest.mark.parametrize("kind", ["materialized", "virtual"])
def test_plot_reads_windows_and_histograms_from_across_the_split(plotted, kind, tmp_path, monkeypatch):
    from pipeline.streaming.sources import StoreSource

    reads: list[tuple[str, str, int]] = []
    lengths: list[tuple[int, ...]] = []
    original = StoreSource.read

    def spy(self, name, chunk, out=None):
        block = original(self, name, chunk, out)
        reads.append((self.split, name, chunk))
        if name == "x" and self.split == "train":
            lengths.append(self.lengths)
            # The windows drawn are the split's windows, assembled as a stream does.
            lo = sum(self.lengths[:chunk])
            e = plotted["ends"][lo : lo + len(block)]
            np.testing.assert_array_equal(block, windows_numpy_block(plotted["features"], e, SIZE, SCALES))
        return block

    monkeypatch.setattr(StoreSource, "read", spy)
    plot_store(plotted[kind], str(tmp_path / "p.png"), seed=3)
    x_chunks = sorted({c for split, name, c in reads if (split, name) == ("train", "x")})
    n_chunks = len(lengths[0])
    assert n_chunks > 16 and set(spread_chunks(lengths[0], 16)) <= set(x_chunks)  # 16 chunks from first to last
    assert x_chunks[0] == 0 and x_chunks[-1] == n_chunks - 1 and len(x_chunks) <= 16 + 4
    assert {c for c, _, _ in plot_sample(lengths[0], n_windows=4, seed=3).windows} <= set(x_chunks)
    assert all(split == "train" for split, name, _ in reads if name == "x")
    y_splits = {split for split, name, _ in reads if name == "y"}
    # Recorded class balance is used as it is; a split without one is counted from its chunks.
    assert y_splits == ({"val"} if kind == "virtual" else {"train", "val"})


def test_plot_of_an_unknown_split_names_the_splits_there(plotted, tmp_path):
    with pytest.raises(StoreError, match=r"no split 'nope' to plot; splits: train, val"):
        plot_store(plotted["materialized"], str(tmp_path / "p.png"), split="nope")
    assert not (tmp_path / "p.png").exists()
    png = plot_store(plotted["materialized"], str(tmp_path / "val.png"), split="val", n_windows=2)
    assert matplotlib.image.imread(png).shape[1] >= 1000


def test_the_report_says_statistics_are_per_instrument():
    from pipeline.storage.inspect import StoreReport, format_report

    def line(norm: dict) -> str:
        text = format_report(StoreReport("s.zarr", True, (), attrs={"normalization": norm}))
        return next(t for t in text.splitlines() if t.startswith("normalization"))

    assert line({"kind": "global", "per": "instrument", "fit_on": "train"}) == (
        "normalization: global, per instrument (fit on train)")
    assert line({"kind": "global", "fit_on": "train"}) == "normalization: global (fit on train)"


@pytest.mark.parametrize("codec", [{"name": "blosc", "cname": "zstd", "clevel": 4, "shuffle": "noshuffle"},
                                   {"name": "zstd", "clevel": 3}, "none"])
def test_an_incomplete_store_names_the_codec_its_windows_were_created_with(tmp_path, codec):
    import dask.array as da
    import zarr

    x = np.arange(240 * 8 * 4, dtype=np.float32).reshape(240, 8, 4)

    def fail_late(block, block_info=None):
        if block_info[0]["chunk-location"][0] == 3:  # a write that dies part-way: the store stays incomplete
            raise OSError("no space left on device")
        return block

    lazy = da.from_array(x, chunks=(40, 8, 4)).map_blocks(fail_late, dtype=x.dtype)
    path = tmp_path / "s.zarr"
    with pytest.raises(Exception):
        write(path, {"x": lazy, "y": np.arange(240)}, chunk_samples=40, codec=codec, progress=False)
    report = inspect_store(path)
    assert not report.complete
    # The reference: the compressor zarr itself reads from the array's metadata.
    (c,) = zarr.open_array(str(path / "train" / "x"), mode="r").compressors or (None,)
    expected = ("none" if c is None else f"blosc({c.cname.value}, {c.shuffle.value}, {c.clevel})"
                if type(c).__name__ == "BloscCodec" else f"zstd({c.level})")
    line = next(ln for ln in format_report(report).splitlines() if ln.startswith("codec: "))
    assert line.startswith(f"codec: {expected} (read from train/x"), line
    assert "?" not in line


def test_the_report_says_what_the_splits_left_out():
    from pipeline.storage.inspect import StoreReport, format_report

    left = {"split_left_out": {"outside": 7, "embargo": {"val": 2}}}
    text = format_report(StoreReport("s.zarr", True, (), attrs=left))
    assert "windows left out: 7 outside every split; by the embargo: val 2" in text.splitlines()
    assert "windows left out" not in format_report(StoreReport("s.zarr", True, (), attrs={}))
    across = {"split_left_out": {"outside": 0, "across": 1234, "embargo": {"train": 45}}}
    assert ("windows left out: 1,234 across a cut between splits; by the embargo: train 45"
            in format_report(StoreReport("s.zarr", True, (), attrs=across)).splitlines())


# -- unfinished builds and appends -------------------------------------------------------


def _markers(path) -> np.ndarray:
    """The write markers of a split as zarr itself reads them: 1 in column 0 once a unit
    is written."""
    import zarr

    return np.asarray(zarr.open_array(str(path), mode="r")[:, 0]) == 1


def _failing(x: np.ndarray, rows: int, bad_from: int, store: Path | None = None):
    """``x`` as a dask array whose blocks past sample ``bad_from`` fail to compute: a
    write that stops part-way, as a Ctrl-C or a full disk leaves it. Given the
    ``store`` folder, they fail only once another task has marked a unit of its
    ``train`` split written, so that some units are."""
    import dask.array as da

    from tests.conftest import wait_until

    def some_marked() -> bool:
        return any(p.is_file() for p in (store / "train" / "_written" / "c").rglob("*"))

    def fail(block, block_info=None):
        if block_info[0]["array-location"][0][1] > bad_from:
            if store is not None:
                wait_until(some_marked, timeout=60, watch=store.parent)
            raise OSError("interrupted")
        return block

    return da.from_array(x, chunks=(rows, *x.shape[1:])).map_blocks(fail, dtype=x.dtype)


def test_written_samples_counts_marked_units_and_the_versions_own():
    from pipeline.storage.inspect import written_samples

    assert written_samples(np.array([1, 1, 1], bool), 10, 25, 25) == 25
    assert written_samples(np.array([1, 0, 1], bool), 10, 25, 0) == 15  # a build: units 0 and 2 (5 samples)
    # An append from 25 to 47 samples: unit 2 (the version's last 5) cleared, to be rewritten.
    assert written_samples(np.array([1, 1, 0, 1, 0], bool), 10, 47, 25) == 10 + 10 + 5 + 10
    assert written_samples(np.array([], bool), 10, 0, 0) == 0


def test_an_interrupted_build_is_incomplete_not_corrupt_and_its_ratio_counts_what_is_written(tmp_path, monkeypatch):
    from pipeline.storage import layout

    x = np.random.default_rng(5).standard_normal((240, 8, 4)).astype(np.float32)
    y = np.arange(240, dtype=np.int64)
    path = tmp_path / "s.zarr"
    monkeypatch.setattr(layout, "TASK_BYTES", 1)  # one write task per unit, so that some finish
    with pytest.raises(Exception):
        write(path, {"x": _failing(x, 40, 200, path), "y": y}, chunk_samples=40, codec="none", progress=False)
    done = _markers(path / "train" / "_written")
    assert 0 < done.sum() < 6  # units of 40 samples: some written, the failing ones not
    from pipeline.storage import verify_store

    result = verify_store(path)
    missing = int((~done).sum())
    assert result.problems == () and not result and list(result) == []
    assert result.pending == (f"incomplete: {missing} of 6 write units not written yet (train {missing} of 6); "
                              "rerun the same pipeline run to resume",)
    assert result.checked == int(done.sum()) and result.version is None
    # The ratio is over the written units' bytes (codec none: about 1x), not the whole arrays'.
    report = inspect_store(path)
    held = int(done.sum()) * 40 * (x[0].nbytes + y[0].nbytes)
    assert report.held_nbytes == held and report.nbytes == x.nbytes + y.nbytes
    size = next(line for line in format_report(report).splitlines() if line.startswith("size: "))
    assert f"ratio {held / report.stored_bytes:.2f}x" in size and size.endswith(
        f"{(x.nbytes + y.nbytes) / 2**20:,.1f} MiB uncompressed once complete")
    # Codec none: the written units' chunk files are their raw bytes, and the rest of what
    # the store holds is metadata, a few hundred bytes an array, however many units were
    # written (one unit alone made the ratio 0.84x, which a bound on it took for a failure).
    chunks = sum(f.stat().st_size for a in ("x", "y") for f in (path / "train" / a / "c").rglob("*") if f.is_file())
    assert chunks == held and held < report.stored_bytes < held + 4096
    # A damaged written unit is still damage.
    first = int(np.flatnonzero(done)[0])
    chunk = path / "train" / "x" / "c" / str(first) / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[7] ^= 0xFF
    chunk.write_bytes(bytes(data))
    assert verify_store(path).problems == (f"train/x chunk {first}: checksum mismatch",)


def test_verify_of_an_interrupted_append_checks_the_versions_readers_see(tmp_path, monkeypatch):
    """Units an unfinished append has not written are pending, not CORRUPT; the version
    readers see is checked whole (its last, partly filled unit against its own checksum,
    though the append cleared that unit's marker), and so are the units the append wrote."""
    from pipeline.storage import layout, verify_store
    from pipeline.storage.append import append

    rng = np.random.default_rng(7)
    x = rng.standard_normal((400, 6)).astype(np.float32)
    y = np.arange(400, dtype=np.int64)
    path = tmp_path / "a.zarr"
    write(path, {"x": x[:230], "y": y[:230]}, chunk_samples=50, codec="none", progress=False)
    attrs = pipeline.open(path).attrs
    monkeypatch.setattr(layout, "TASK_BYTES", 1)  # one write task per unit, so that some finish
    with pytest.raises(Exception):
        append(path, {"train": {"x": _failing(x[230:], 170, 100), "y": y[230:]}}, attrs=attrs, token="t",
               progress=False)
    done = _markers(path / "train" / "_written")
    assert done.size == 8 and done[:4].all() and not done[4:].all()  # units 4-7 are the append's
    result = verify_store(path)
    missing = int((~done[4:]).sum())
    assert result.problems == () and result.version == 0
    assert result.pending == (f"append to version 1 in progress (or interrupted): {missing} of 4 new write units not "
                              f"written yet (train {missing} of 4); readers see version 0; rerun the same pipeline "
                              "run to finish it",)
    report = inspect_store(path)
    assert [a.shape[0] for a in report.arrays] == [230, 230]  # what readers see
    # Readers of version 0 get its samples: the reference the checks stand for.
    np.testing.assert_array_equal(pipeline.open(path)["train"]["x"][:], x[:230])
    cli = subprocess.run([sys.executable, "-m", "pipeline.cli", "inspect", str(path), "--verify"],
                         capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and "CORRUPT" not in cli.stdout, cli.stdout
    assert f"PENDING {result.pending[0]}" in cli.stdout and f"verify: {result.summary}" in cli.stdout
    # Damage to version 0, to its last unit (which the append cleared) and to a unit
    # the append wrote, is found and named.
    for chunk, at in (("1", 10), ("4", 4 * 30)):
        f = path / "train" / "x" / "c" / chunk / "0"
        data = bytearray(f.read_bytes())
        data[at] ^= 0xFF
        f.write_bytes(bytes(data))
    problems = list(verify_store(path))
    assert problems[:2] == ["train/x chunk 1: checksum mismatch", "train/x chunk 4: checksum mismatch"]
    written = [u for u in (5, 6) if done[u]]
    for u in written:
        f = path / "train" / "y" / "c" / str(u)
        data = bytearray(f.read_bytes())
        data[0] ^= 0xFF
        f.write_bytes(bytes(data))
    assert list(verify_store(path))[2:] == [f"train/y chunk {u}: checksum mismatch (written by the unfinished "
                                            "append to version 1)" for u in written]


def test_verify_checks_each_older_versions_last_samples(tmp_path):
    from pipeline.storage import verify_store
    from pipeline.storage.append import append

    x = np.random.default_rng(9).standard_normal((130, 3)).astype(np.float32)
    path = tmp_path / "v.zarr"
    write(path, {"x": x[:70], "y": np.arange(70)}, chunk_samples=50, codec="none", progress=False)
    append(path, {"train": {"x": x[70:], "y": np.arange(70, 130)}}, attrs=pipeline.open(path).attrs, token="t",
           progress=False)
    result = verify_store(path)
    assert result.problems == () and result.pending == () and result.version == 1
    assert result.checked == 3 + 1  # version 1's three units, version 0's partly filled last one
    # Version 0 holds samples 50-69 of chunk 1: a flipped byte there is damage to both.
    f = path / "train" / "x" / "c" / "1" / "0"
    data = bytearray(f.read_bytes())
    data[5 * 12] ^= 0xFF
    f.write_bytes(bytes(data))
    assert list(verify_store(path)) == ["train/x chunk 1: checksum mismatch",
                                        "train/x chunk 1: checksum mismatch (the last samples of version 0)"]


def test_an_interrupted_zip_build_is_found_in_its_folder(tmp_path, monkeypatch):
    from pipeline.storage import layout, verify_store

    x = np.random.default_rng(2).standard_normal((200, 4, 3)).astype(np.float32)
    zipped = tmp_path / "set.zarr.zip"
    staging = tmp_path / "set.zarr.zip.partial.zarr"
    monkeypatch.setattr(layout, "TASK_BYTES", 1)
    with pytest.raises(Exception):
        write(zipped, {"x": _failing(x, 50, 120), "y": np.arange(200)}, chunk_samples=50, progress=False)
    assert staging.is_dir() and not zipped.exists()
    report = inspect_store(zipped)
    assert report.location == str(zipped) and report.staging == str(staging) and not report.complete
    assert f"complete: NO: the build was interrupted (or is still running) in {staging}, which is packed into " \
           f"{zipped} once complete; rerun the same pipeline run to finish it" in format_report(report).splitlines()
    missing = int((~_markers(staging / "train" / "_written")).sum())
    assert missing and verify_store(zipped).pending == (
        f"incomplete in {staging}: {missing} of 4 write units not written yet (train {missing} of 4); rerun the "
        "same pipeline run to resume",)
    cli = subprocess.run([sys.executable, "-m", "pipeline.cli", "inspect", str(zipped)], capture_output=True,
                         text=True, timeout=120)
    assert cli.returncode == 0 and f"in {staging}" in cli.stdout, cli.stderr
    with pytest.raises(StoreError, match=r"set\.zarr\.zip: not packed yet: its build was interrupted \(or is still "
                       r"running\) in .*set\.zarr\.zip\.partial\.zarr; rerun"):
        pipeline.open(zipped)
    # Written whole (other dask names, so another fingerprint: overwrite), it is packed.
    write(zipped, {"x": x, "y": np.arange(200)}, chunk_samples=50, overwrite=True, progress=False)
    assert not staging.exists() and inspect_store(zipped).staging is None and inspect_store(zipped).complete
    with pytest.raises(StoreError, match=r"nope\.zarr\.zip: no such zip store$"):
        pipeline.open(tmp_path / "nope.zarr.zip")


def test_verify_reports_damage_in_unit_order_whatever_order_the_checks_end(tmp_path):
    """Units are checked concurrently: the lines still come split by split, unit by unit,
    arrays by name, as a check of one unit after another gives them."""
    import zlib

    import zarr

    from pipeline.storage import verify_store

    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((640, 6)).astype(np.float32), np.arange(640)
    path = tmp_path / "order.zarr"
    write(path, {"x": x, "y": y}, splits={"train": .5, "val": .5}, gap=0, chunk_samples=10, codec="none",
          progress=False)
    flips = {("train", "x", 3), ("train", "y", 3), ("train", "y", 17), ("train", "x", 31), ("val", "y", 0),
             ("val", "x", 29)}
    for split, name, unit in flips:
        chunk = path / split / name / "c" / str(unit) / ("0" if name == "x" else "")
        chunk = chunk if chunk.is_file() else chunk.parent
        data = bytearray(chunk.read_bytes())
        data[-1] ^= 0xFF  # still decodes (no codec): only the CRC tells
        chunk.write_bytes(bytes(data))
    # The reference: each unit's bytes read back with numpy, their CRC32 (zlib) against
    # the marker row, in split, unit and name order.
    expected = []
    for split in ("train", "val"):
        marks = np.asarray(zarr.open_array(str(path / split / "_written"), mode="r")[:])
        got = pipeline.open(path)[split]
        for unit in range(marks.shape[0]):
            for name in ("x", "y"):
                crc = zlib.crc32(np.ascontiguousarray(got[name][unit * 10:(unit + 1) * 10]).data)
                if crc not in [int(v) for v in marks[unit][1:]]:
                    expected.append(f"{split}/{name} chunk {unit}: checksum mismatch")
    assert len(expected) == len(flips)
    result = verify_store(path)
    assert list(result) == expected and result.checked == 64


class _InFlight:
    """A TCP proxy on loopback in front of ``upstream`` that delays each request by
    ``delay`` seconds and counts the most requests for data chunks (not the write
    markers, which zarr reads many at once itself) waiting for their answer at once
    (one per connection: HTTP/1.1 sends the next request after the answer)."""

    def __init__(self, upstream: int, delay: float):
        import socket
        import threading

        self.upstream, self.delay, self.now, self.most = upstream, delay, 0, 0
        self._lock = threading.Lock()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            up, waiting = socket.create_connection(("127.0.0.1", self.upstream)), [False]
            threading.Thread(target=self._pump, args=(client, up, waiting, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, client, waiting, False), daemon=True).start()

    def _pump(self, src, dst, waiting: list, request: bool) -> None:
        import threading

        try:
            while data := src.recv(1 << 16):
                with self._lock:
                    chunk = b"/c/" in data.split(b"\r\n", 1)[0] and b"_written" not in data.split(b"\r\n", 1)[0]
                    if request and not waiting[0] and chunk:
                        waiting[0], self.now = True, self.now + 1
                        self.most = max(self.most, self.now)
                    elif not request and waiting[0]:
                        waiting[0], self.now = False, self.now - 1
                if request:
                    threading.Event().wait(self.delay)  # the link's latency, per request
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.close()
                except OSError:
                    pass


def test_verify_of_a_remote_store_keeps_many_requests_in_flight(s3, tmp_path):
    """Checked unit after unit, a remote store's verify paid a round trip per object;
    through a proxy that delays every request, many must wait at once, and the report
    is the local copy's."""
    from pipeline.storage import verify_store

    x = np.random.default_rng(6).standard_normal((480, 4)).astype(np.float32)
    url = "s3://training/inspect/verify.zarr"
    write(url, {"x": x, "y": np.arange(480)}, chunk_samples=10, codec="none", storage_options=s3, progress=False)
    write(tmp_path / "v.zarr", {"x": x, "y": np.arange(480)}, chunk_samples=10, codec="none", progress=False)
    proxy = _InFlight(int(s3["endpoint_url"].rsplit(":", 1)[1]), delay=0.02)
    try:
        result = verify_store(url, storage_options={**s3, "endpoint_url": proxy.url})
    finally:
        proxy.server.close()
    assert result == verify_store(tmp_path / "v.zarr") and result.checked == 48 and not result
    assert proxy.most >= 8, proxy.most


def test_the_codec_line_is_the_whole_chain_filters_serializer_and_compressors(tmp_path):
    # It listed the compressors alone: an array stored through a scale-offset filter
    # (float64 kept as integers) read "blosc", a big-endian one "gzip".
    import numcodecs.zarr3
    from zarr.codecs import BytesCodec, GzipCodec, TransposeCodec, ZstdCodec

    from pipeline.storage.inspect import codec_chain

    x = np.arange(60, dtype=np.float64).reshape(10, 6)
    group = zarr.open_group(str(tmp_path / "c.zarr"), mode="w")
    made = {
        "fso": dict(filters=[numcodecs.zarr3.FixedScaleOffset(offset=0, scale=10, dtype="<f8", astype="<i8")]),
        "big": dict(serializer=BytesCodec(endian="big"), compressors=[GzipCodec()]),
        "t": dict(filters=[TransposeCodec(order=(1, 0))], compressors=[ZstdCodec()]),
        "raw": dict(compressors=None),
    }
    for name, kwargs in made.items():
        group.create_array(name, shape=x.shape, dtype=x.dtype, chunks=(5, 6), **kwargs)[:] = x
    got = {name: codec_chain(group[name]) for name in made}
    assert got == {"fso": "fixedscaleoffset, zstd", "big": "bytes(big), gzip", "t": "transpose, zstd",
                   "raw": "none"}
