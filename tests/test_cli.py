"""The `pipeline` command: help texts, config errors as one line with exit status 2."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "configs" / "orderbook.yaml"


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_help_lists_every_command_and_option():
    top = cli("--help")
    assert top.returncode == 0
    for command in ("run", "inspect", "demo-data", "bench"):
        assert command in top.stdout
    run = cli("run", "--help")
    for option in ("CONFIG", "--scheduler", "--set", "--no-progress", "--print-config"):
        assert option in run.stdout
    assert "inspect" in cli("inspect", "--help").stdout and "--plot" in cli("inspect", "--help").stdout


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("windows.size=abc", "windows.size: expected a positive integer, got 'abc'"),
        ("windows.bogus=1", "windows.bogus: unknown key"),
        ("cluster.n_workers=[1]", "cluster.n_workers: expected a positive integer, got [1]"),
        # It passed, and the LocalCluster's start failed with dask's traceback (exit status 1).
        ("cluster.memory_limit=lots", "cluster.memory_limit: expected a size such as 4GiB or 500MB, a fraction of "
         "memory such as 0.5, auto, or null (no limit), got 'lots'"),
    ],
)
def test_config_errors_are_one_line_with_exit_status_2(override, message):
    result = cli("run", str(EXAMPLE), "--set", override)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_missing_required_field_from_a_file(tmp_path):
    data = yaml.safe_load(EXAMPLE.read_text())
    del data["windows"]["size"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    result = cli("run", str(path))
    assert result.returncode == 2
    assert result.stderr.strip() == "pipeline run: windows.size: missing required key (a positive integer)"


def test_set_and_scheduler_reach_the_validated_config():
    result = cli(
        "run", str(EXAMPLE), "--set", "windows.size=128", "--scheduler", "tcp://127.0.0.1:8786", "--print-config"
    )
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    assert printed["windows"]["size"] == 128
    assert printed["cluster"]["address"] == "tcp://127.0.0.1:8786"


def test_inspect_of_a_missing_store_is_a_clear_error(tmp_path):
    result = cli("inspect", str(tmp_path / "nope.zarr"))
    assert result.returncode == 1
    assert "nope.zarr" in result.stderr and "Traceback" not in result.stderr


def test_inspect_plot_into_a_missing_folder_is_one_line_naming_it(tmp_path):
    import numpy as np

    import pipeline

    store = tmp_path / "s.zarr"
    x = np.arange(64 * 4 * 2, dtype=np.float32).reshape(64, 4, 2)
    pipeline.write(store, {"x": x, "y": np.arange(64)}, progress=False)
    result = cli("inspect", str(store), "--plot", str(tmp_path / "no" / "such" / "x.png"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"pipeline inspect: --plot {tmp_path / 'no' / 'such' / 'x.png'}: the folder {tmp_path / 'no' / 'such'} "
        "does not exist; create it or choose another file"]
    assert result.stdout == ""  # refused before the store is described
    assert not (tmp_path / "no").exists()


def _small_store(tmp_path: Path) -> Path:
    import numpy as np

    import pipeline

    store = tmp_path / "s.zarr"
    x = np.arange(64 * 4 * 2, dtype=np.float32).reshape(64, 4, 2)
    pipeline.write(store, {"x": x, "y": np.arange(64)}, progress=False)
    return store


def test_inspect_plot_to_a_format_matplotlib_cannot_write_is_refused_before_the_report(tmp_path):
    """``--plot p.txt`` printed the whole report, then matplotlib's traceback."""
    from matplotlib.backend_bases import FigureCanvasBase

    store = _small_store(tmp_path)
    result = cli("inspect", str(store), "--plot", str(tmp_path / "p.txt"))
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("pipeline inspect: --plot: expected a file name ending in an image format's extension "
                           "(the format follows it: ") and line.endswith(f"), got {str(tmp_path / 'p.txt')!r}")
    named = set(line.split("follows it: ", 1)[1].split(")", 1)[0].split(", "))
    # The reference: the formats matplotlib writes, less LaTeX code and raw pixel buffers.
    assert named == {f".{e}" for e in FigureCanvasBase.get_supported_filetypes()} - {".pgf", ".raw", ".rgba"}
    assert {".png", ".jpg", ".pdf", ".svg"} <= named
    assert not (tmp_path / "p.txt").exists()


def test_inspect_plot_without_an_extension_reports_the_png_it_writes(tmp_path):
    """``--plot myplot`` said 'plot: myplot' and matplotlib wrote myplot.png."""
    from PIL import Image

    store = _small_store(tmp_path)
    result = cli("inspect", str(store), "--plot", str(tmp_path / "myplot"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == f"plot: {tmp_path / 'myplot.png'}"
    assert not (tmp_path / "myplot").exists()
    with Image.open(tmp_path / "myplot.png") as image:
        assert image.format == "PNG" and image.size[0] > 100


def test_inspect_plot_into_a_directory_is_refused_before_the_report(tmp_path):
    store = _small_store(tmp_path)
    (tmp_path / "figs").mkdir()
    for given in (tmp_path / "figs", f"{tmp_path / 'figs'}/"):
        result = cli("inspect", str(store), "--plot", str(given))
        assert result.returncode == 1 and result.stdout == "", result.stderr
        assert result.stderr.strip().splitlines() == [
            f"pipeline inspect: --plot {given}: a directory; name an image file, such as "
            f"{Path(tmp_path / 'figs' / 'plot.png')}"]
    assert list((tmp_path / "figs").iterdir()) == [] and not (tmp_path / "figs.png").exists()


def test_demo_data_is_seeded_and_time_ordered(tmp_path):
    import pyarrow.parquet as pq

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        result = cli("demo-data", str(d), "--days", "2", "--rows-per-day", "5000")
        assert result.returncode == 0, result.stderr
    files = sorted(p.name for p in a.iterdir())
    assert files == ["2026-01-05.csv", "2026-01-05.parquet", "2026-01-06.csv", "2026-01-06.parquet"]
    ta, tb = pq.read_table(a / files[1]), pq.read_table(b / files[1])
    assert ta.equals(tb)
    ts = pq.read_table(a / files[3]).column("timestamp").to_numpy()
    assert (ts[1:] > ts[:-1]).all() and ts[0] > ta.column("timestamp").to_numpy()[-1]
    assert ta.num_rows == 5000 and len(ta.column_names) == 41
    bid = ta.column("bid_price_1").to_numpy()
    ask = ta.column("ask_price_1").to_numpy()
    assert (ask > bid).all()


def test_bench_streams_every_sample_each_epoch_and_reports_the_warm_median(tmp_path):
    import numpy as np

    from pipeline.storage import write

    n = 3000
    x = np.random.default_rng(0).standard_normal((n, 8, 4)).astype(np.float32)
    store = write(tmp_path / "b.zarr", {"x": x, "y": np.arange(n)}, chunk_samples=256, progress=False)
    result = cli("bench", str(store), "--epochs", "3", "--batch-size", "100")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    epochs = [line for line in lines if line.startswith("epoch ")]
    assert len(epochs) == 3 and all(f": {n:,} samples in " in line for line in epochs)
    assert "cold" in epochs[0] and "cold" not in epochs[1]
    assert any(line.startswith("after the first epoch: median ") for line in lines)
    assert any(line.startswith("shuffle quality: ") for line in lines)


def test_bench_streams_a_remote_store_through_the_cache_and_prints_each_epochs_hit_rate(tmp_path, s3):
    import json

    import numpy as np

    from pipeline.storage import write

    n, chunk = 2000, 256
    url = "s3://training/cli/bench.zarr"
    write(url, {"x": np.ones((n, 8), np.float32), "y": np.arange(n)}, chunk_samples=chunk, progress=False,
          storage_options=s3, overwrite=True)
    objects = 2 * -(-n // chunk)  # x and y chunks
    result = cli("bench", url, "--epochs", "2", "--storage-options", json.dumps(s3),
                 "--cache-dir", str(tmp_path / "cache"), "--cache-bytes", "1GiB")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    hits = [line.strip() for line in lines if "cache hit rate" in line]
    assert hits[0].startswith(f"cache hit rate 0.0% (0 of {objects} chunk objects)"), lines
    assert hits[1].startswith(f"cache hit rate 100.0% ({objects} of {objects} chunk objects), 0 B fetched"), lines
    # A local store ignores the cache, and says so.
    local = write(tmp_path / "b.zarr", {"x": np.zeros((10, 2), np.float32), "y": np.arange(10)}, progress=False)
    result = cli("bench", str(local), "--epochs", "1", "--cache-dir", str(tmp_path / "cache"),
                 "--cache-bytes", "1000000")
    assert result.returncode == 0 and "cache: not used (a local store is read directly)" in result.stdout


@pytest.mark.parametrize(("args", "status", "message"), [
    (["--epochs", "0"], 2, "pipeline bench: error: argument --epochs: expected a positive integer, got '0'"),
    # The stream's own refusal named its argument (batch_size), with exit status 1.
    (["--batch-size", "0"], 2, "pipeline bench: error: argument --batch-size: expected a positive integer, got '0'"),
    (["--buffer-chunks", "-2"], 2,
     "pipeline bench: error: argument --buffer-chunks: expected a positive integer, got '-2'"),
    (["--batch-size", "x"], 2, "pipeline bench: error: argument --batch-size: expected a positive integer, got 'x'"),
    (["--split", "nope"], 1, "no split 'nope'"),
    (["--storage-options", "[1, 2]"], 2, "--storage-options: expected a mapping"),
    (["--storage-options", "{a: [}"], 2, "--storage-options: not YAML or JSON"),
    (["--cache-dir", "c", "--cache-bytes", "lots"], 2, "--cache-bytes: expected bytes or a size such as 50GiB"),
    (["--cache-bytes", "1GiB"], 2, "--cache-bytes needs --cache-dir"),
    (["--cache-dir", "c"], 2, "--cache-dir needs --cache-bytes"),
    (["--arrays", "x,"], 2, "pipeline bench: error: argument --arrays: expected comma-separated array names such as "
     "x,y, got 'x,'"),
    (["--arrays", "x,z"], 1, "split 'train' has no array 'z'"),
    # dim= reaches the stream, which refuses it for a pipeline store.
    (["--dim", "time"], 1, "dim='time' is for stores another tool wrote"),
])
def test_bench_errors_are_one_line(tmp_path, args, status, message):
    import numpy as np

    from pipeline.storage import write

    store = write(tmp_path / "b.zarr", {"x": np.zeros((10, 2), np.float32), "y": np.arange(10)}, progress=False)
    result = cli("bench", str(store), *args)
    assert result.returncode == status
    assert "Traceback" not in result.stderr and message in result.stderr.strip().splitlines()[-1]


def test_bench_streams_another_tools_store_by_its_variable_names(tmp_path):
    """``--arrays`` and ``--dim`` as ``pipeline.stream(arrays=..., dim=...)``: a store whose
    variables are not x and y was refused with no way to name them."""
    import numpy as np
    import zarr

    n = 1000
    path = tmp_path / "ds.zarr"
    group = zarr.open_group(path, mode="w")
    group.create_array("features", data=np.zeros((n, 8), "f4"), chunks=(100, 8))
    group.create_array("target", data=np.arange(n), chunks=(100,))
    refused = cli("bench", str(path), "--epochs", "1")
    assert refused.returncode == 1 and refused.stderr.strip() == (
        f"pipeline bench: {path}: no variable 'x'; variables: features, target; name the arrays to stream with "
        "--arrays, e.g. --arrays a,b")
    result = cli("bench", str(path), "--epochs", "2", "--batch-size", "64", "--arrays", "features,target")
    assert result.returncode == 0, result.stderr
    epochs = [line for line in result.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2 and all(f": {n:,} samples in " in line for line in epochs), result.stdout


def test_bench_dim_names_an_xarray_stores_samples(tmp_path):
    import numpy as np
    import xarray as xr

    n = 300
    path = tmp_path / "ds.zarr"
    xr.Dataset({"v": (("sample", "f"), np.ones((n, 3), "f4")), "w": ("sample", np.arange(n))}).to_zarr(
        path, zarr_format=3, consolidated=False)
    result = cli("bench", str(path), "--epochs", "1", "--arrays", "v,w", "--dim", "sample")
    assert result.returncode == 0, result.stderr
    assert f"epoch 0: {n:,} samples in " in result.stdout
    wrong = cli("bench", str(path), "--epochs", "1", "--arrays", "v,w", "--dim", "f")
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert "'f'" in wrong.stderr.strip().splitlines()[-1], wrong.stderr


def test_demo_data_lobster_pairs_are_seeded_headerless_and_load(tmp_path):
    import numpy as np

    from pipeline.loaders import open_source

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        result = cli("demo-data", str(d), "--format", "lobster", "--days", "2", "--rows-per-day", "3000",
                     "--levels", "3", "--instruments", "AAA,BBB", "--empty-level-rate", "0.05", "--seed", "7")
        assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in a.iterdir())
    assert names == [f"{t}_{day}_34200000_57600000_{kind}_3.csv" for t in ("AAA", "BBB")
                     for day in ("2026-01-05", "2026-01-06") for kind in ("message", "orderbook")]
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    book = (a / names[1]).read_text().splitlines()
    message = (a / names[0]).read_text().splitlines()
    assert len(book) == len(message) == 3000
    assert len(book[0].split(",")) == 12 and all(f.lstrip("-").isdigit() for f in book[0].split(","))
    fields = message[0].split(",")
    assert len(fields) == 6 and len(fields[0].split(".")[1]) == 9 and 34200 <= float(fields[0]) < 57600

    src = open_source(str(a / "*_orderbook_3.csv"), format="lobster", nan="drop")
    assert src.instruments == ("AAA", "BBB") and src.columns[:4] == ("ask_price_1", "ask_size_1", "bid_price_1",
                                                                      "bid_size_1")
    x, ts, codes = src.array.compute(), src.timestamps.compute(), src.instrument_codes.compute()
    assert 0.9 * 12000 < len(x) < 12000  # about 5% of the rows have an empty deepest level
    assert (x[:, 0] > x[:, 2]).all()  # ask above bid
    for code in (0, 1):  # per instrument: its two days in order, each from 09:30 on
        t = ts[codes == code].astype("datetime64[ns]")
        assert (np.diff(t) > np.timedelta64(0)).all()
        assert np.datetime64("2026-01-05T09:30") < t[0] < np.datetime64("2026-01-05T09:31") < np.datetime64(
            "2026-01-06T09:30") < t[-1] < np.datetime64("2026-01-06T16:00")
    mids = [((x[:, 0] + x[:, 2]) / 2)[codes == c].mean() for c in (0, 1)]
    assert abs(mids[0] / mids[1] - 1) > 0.2  # the two instruments trade at different price levels


@pytest.mark.parametrize(("args", "message"), [
    (["--days", "0"], "pipeline demo-data: error: argument --days: expected a positive integer, got '0'"),
    (["--levels", "-1"], "pipeline demo-data: error: argument --levels: expected a positive integer, got '-1'"),
    (["--format", "lobstr"], "--format: expected parquet, csv and/or lobster, got 'lobstr'"),
    (["--format", "lobster", "--instruments", "A/B"], "--instruments: expected distinct comma-separated tickers"),
    (["--format", "lobster", "--empty-level-rate", "1.5"], "--empty-level-rate: expected a fraction in [0, 1]"),
])
def test_demo_data_lobster_option_errors(tmp_path, args, message):
    result = cli("demo-data", str(tmp_path / "d"), "--days", "1", "--rows-per-day", "10", *args)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert message in result.stderr.strip().splitlines()[-1]


def test_python_dash_m_pipeline_is_the_same_command(tmp_path):
    import numpy as np

    from pipeline.storage import write

    store = write(tmp_path / "s.zarr", {"x": np.zeros((40, 4, 2), np.float32), "y": np.arange(40)}, progress=False)
    module = subprocess.run([sys.executable, "-m", "pipeline", "inspect", store], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert module.returncode == 0, module.stderr
    assert module.stdout == cli("inspect", store).stdout  # the console script's entry point, cli.entry
    assert "complete: yes" in module.stdout and "train/x: (40, 4, 2) float32" in module.stdout
    helped = subprocess.run([sys.executable, "-m", "pipeline", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: pipeline ")
    for command in ("run", "inspect", "demo-data", "bench", "--version"):
        assert command in helped.stdout
    # Its exit status is the command's: a missing store is status 1, a bad config value 2.
    missing = subprocess.run([sys.executable, "-m", "pipeline", "inspect", str(tmp_path / "nope.zarr")], cwd=ROOT,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "nope.zarr" in missing.stderr
    bad = subprocess.run([sys.executable, "-m", "pipeline", "run", str(EXAMPLE), "--set", "windows.size=abc"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "windows.size" in bad.stderr


def test_the_command_ends_with_exit_handlers_run_and_output_flushed_but_no_teardown(tmp_path):
    import numpy as np

    from pipeline.storage import write

    store = write(tmp_path / "s.zarr", {"x": np.zeros((40, 4, 2), np.float32), "y": np.arange(40)}, progress=False)
    script = (
        "import atexit, sys\n"
        "class Teardown:\n"
        "    def __del__(self):\n"
        "        print('teardown ran', flush=True)\n"
        "kept = Teardown()\n"  # a module global: only the interpreter's teardown deletes it
        "atexit.register(print, 'exit handler ran')\n"
        "sys.argv = ['pipeline', *sys.argv[1:]]\n"
        "from pipeline.cli import entry\n"
        "entry()\n"
    )
    done = subprocess.run([sys.executable, "-c", script, "inspect", str(store)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # The command's whole output (a pipe: block-buffered) and the exit handler's, no teardown.
    assert done.stdout.startswith(cli("inspect", str(store)).stdout)
    assert done.stdout.endswith("exit handler ran\n") and "teardown ran" not in done.stdout
    failed = subprocess.run([sys.executable, "-c", script, "inspect", str(tmp_path / "nope.zarr")], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "nope.zarr" in failed.stderr and failed.stdout == "exit handler ran\n"


def test_version_prints_the_installed_distribution_version():
    from importlib.metadata import version

    import pipeline

    assert pipeline.__version__ == version("pipeline")  # the package and its metadata agree
    for module in ("pipeline", "pipeline.cli"):
        command = [sys.executable, "-m", module, "--version"]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout == f"pipeline {pipeline.__version__}\n"


def test_the_installed_console_script_prints_the_same_version():
    import pipeline

    script = Path(sys.executable).with_name("pipeline")
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable}: the project is not installed in this environment")
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout == f"pipeline {pipeline.__version__}\n"


def test_a_relative_glob_that_matches_nothing_names_the_working_directory(tmp_path):
    """A container's or a batch job's working directory is not the config's folder
    (a DaskJob runs in /data): the message says where the relative glob was looked for."""
    (tmp_path / "job").mkdir()
    (tmp_path / "c.yaml").write_text(
        "source: {paths: data/raw/*.parquet, timestamp: timestamp}\nfeatures: {steps: [mid_price]}\n"
        "windows: {size: 4}\noutput: {path: out.zarr}\n")
    result = cli("run", str(tmp_path / "c.yaml"), "--no-progress", cwd=tmp_path / "job")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"pipeline run: data/raw/*.parquet: matched no file (relative paths are resolved against the working "
        f"directory {tmp_path / 'job'}, not the config's folder: {tmp_path / 'job' / 'data/raw/*.parquet'})")
    assert not (tmp_path / "job" / "out.zarr").exists()


def test_inspect_takes_storage_options_like_bench(tmp_path, s3):
    import json

    import numpy as np

    from pipeline.storage import write

    url = "s3://training/cli/inspect.zarr"
    write(url, {"x": np.ones((300, 4), np.float32), "y": np.arange(300)}, chunk_samples=100, progress=False,
          storage_options=s3, overwrite=True)
    result = cli("inspect", url, "--verify", "--storage-options", json.dumps(s3))
    assert result.returncode == 0, result.stderr
    assert "train" in result.stdout and "300" in result.stdout.replace(",", "")
    assert "verify: every chunk matches its checksum" in result.stdout
    bad = cli("inspect", url, "--storage-options", "[1, 2]")
    assert bad.returncode == 2 and bad.stderr.strip().startswith(
        "pipeline inspect: --storage-options: expected a mapping")


def test_an_unknown_argument_after_a_command_prints_that_commands_usage(tmp_path):
    result = cli("run", "c.yaml", "--bogus", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("usage: pipeline run [-h] [--scheduler ADDR]"), result.stderr
    assert result.stderr.strip().splitlines()[-1] == "pipeline run: error: unrecognized arguments: --bogus"
    # Before the command, it is the top-level parser's to refuse.
    top = cli("--bogus", "run", "c.yaml", cwd=tmp_path)
    assert top.returncode == 2 and top.stderr.startswith("usage: pipeline [-h] [--version] COMMAND")
    assert top.stderr.strip().splitlines()[-1] == "pipeline: error: unrecognized arguments: --bogus"


def test_print_config_refuses_what_the_run_refuses(tmp_path):
    """``--print-config`` validates: a value the run would refuse is refused there, one
    line naming the key path (the run's CSV check named ``delimiter:`` alone)."""
    (tmp_path / "c.yaml").write_text("source: {paths: x/*.csv}\nwindows: {size: 8}\noutput: {path: s.zarr}\n")
    result = cli("run", "c.yaml", "--print-config", "--set", "source.delimiter=';;'", "--set",
                 "cluster.address=tcp://h:1", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("pipeline run: source.delimiter: expected one character"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = cli("run", "c.yaml", "--print-config", "--set", "source.decimal=,", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == ("pipeline run: source.decimal: expected a YAML value, got ','; quote a string: "
                                     "--set 'source.decimal=\",\"'")


@pytest.mark.parametrize("users, want", [(None, "1 1"), ("2", "2 2")])
def test_the_command_imports_numpy_with_one_blas_thread_unless_the_user_chose(users, want):
    """numpy's OpenBLAS starts a thread per core at import, which spun 0.15 s of CPU on
    the core the worker server imports on; the command's process does no linear
    algebra. A user's own OPENBLAS_NUM_THREADS is kept."""
    import os

    script = ("import os, sys\n"
              "import pipeline.cli as cli\n"
              "def main():\n"
              "    import numpy  # noqa: F401\n"
              "    print(os.environ.get('OPENBLAS_NUM_THREADS'), len(os.listdir('/proc/self/task')))\n"
              "    return 0\n"
              "cli.main = main\n"
              "cli.entry()\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    if users is not None:
        env["OPENBLAS_NUM_THREADS"] = users
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    setting, threads = done.stdout.split()
    assert setting == want.split()[0]
    if (os.cpu_count() or 1) >= 2:  # one core: OpenBLAS starts no thread of its own either way
        assert threads == want.split()[1]


def test_demo_data_over_an_earlier_run_names_the_files_it_did_not_write(tmp_path):
    # A recipe's --days 3 after the quickstart's 5 days left days 4 and 5 there, silently:
    # the next build read 10 files where the page described 6.
    first = cli("demo-data", str(tmp_path / "raw"), "--per-instrument", "--days", "3", "--rows-per-day", "300")
    assert first.returncode == 0 and "note:" not in first.stderr
    again = cli("demo-data", str(tmp_path / "raw"), "--per-instrument", "--days", "2", "--rows-per-day", "300")
    assert again.returncode == 0
    assert re.search(r"note: .*raw also holds 4 file\(s\) this command did not write \(such as .*2026-01-07\.\w+\); "
                     r"a pipeline run over it reads them too", again.stderr), again.stderr


def _s3_env(endpoint: str) -> dict[str, str]:
    import os

    return {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing", "AWS_MAX_ATTEMPTS": "1", "AWS_DEFAULT_REGION": "us-east-1"}


def _one_line_refusal(result: subprocess.CompletedProcess, command: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr[-2000:]
    assert lines[0].startswith(f"pipeline {command}: the object store refused the request or could not be reached (")
    assert "AWS_ENDPOINT_URL" in lines[0]


def test_an_object_store_that_cannot_be_reached_or_refuses_the_credentials_is_one_line(tmp_path):
    """A wrong endpoint printed 256 lines of tracebacks, rejected credentials 66-109
    lines ending ``PermissionError: Forbidden``: both are one line, exit 1."""
    from tests.conftest import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    result = subprocess.run([sys.executable, "-m", "pipeline", "inspect", "s3://training/set.zarr"],
                            capture_output=True, text=True, timeout=120, env=_s3_env(dead))
    _one_line_refusal(result, "inspect")
    # A real S3-protocol server that checks credentials (moto's, with authentication on).
    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              env={**_s3_env(""), "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in server.stderr:  # werkzeug says where it listens once it does
            if "Running on" in line:
                break
        result = subprocess.run([sys.executable, "-m", "pipeline", "inspect", "s3://training/set.zarr"],
                                capture_output=True, text=True, timeout=120, env=_s3_env(f"http://127.0.0.1:{port}"))
        _one_line_refusal(result, "inspect")
    finally:
        server.terminate()
        server.wait(timeout=30)
