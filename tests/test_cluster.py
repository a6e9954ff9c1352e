"""Clusters: a LocalCluster by default, and a real remote `dask scheduler` + `dask worker`
processes on 127.0.0.1 running the same config with --scheduler."""

from __future__ import annotations

import contextlib
import io
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import pipeline
from pipeline.cluster import cluster
from pipeline.demo import DemoSpec, write_demo_data
from pipeline.errors import ClusterError
from tests.conftest import (assert_same_store, run_cli, scheduler_address, small_run_config, stop_cluster,
                            wait_until)

BIN = Path(sys.executable).parent


def test_a_local_cluster_leaves_distributeds_preload_list_unimported_in_the_client():
    """distributed's first nanny imported its packages (pandas among them) in the
    client, for a preload list that the worker server, started already with ours,
    never reads: half a second of the client's CPU on every run."""
    code = (
        "import sys\n"
        "from pipeline.cluster import WORKER_MODULES, cluster\n"
        "with cluster(n_workers=1, threads_per_worker=1, memory_limit='512MiB', log=None) as client:\n"
        "    assert client.submit(sum, [1, 2]).result() == 3\n"
        "    # The workers still come forked from a server that imported what a task needs.\n"
        "    missing = client.run(lambda names: [n for n in names if n not in sys.modules], WORKER_MODULES)\n"
        "    print(list(missing.values()), 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[0] == "[[]] False"


def test_local_cluster_binds_to_loopback_and_prints_the_dashboard():
    import urllib.request

    import dask
    from distributed import Client

    from pipeline.cluster import WORKER_MODULES

    method = "distributed.worker.multiprocessing-method"
    before = dask.config.get(method)
    pages_before = "distributed.dashboard.scheduler" in sys.modules
    log = io.StringIO()
    with cluster(n_workers=1, threads_per_worker=1, memory_limit="512MiB", log=log) as client:
        assert isinstance(client, Client) and dask.config.get(method) == "forkserver"
        # Forked from a server that imported them: nothing left to import at a first task.
        missing = client.run(lambda names: [n for n in names if n not in sys.modules], WORKER_MODULES)
        assert list(missing.values()) == [[]]
        # ... and dask.array came without xarray (pipeline.daskimport).
        assert list(client.run(lambda: "xarray" in sys.modules).values()) == [False]
        assert client.submit(sum, [1, 2, 3]).result() == 6
        assert len(client.scheduler_info()["workers"]) == 1
        # Their event loops' watchdog ticks at TICK_INTERVAL, not 50 times a second.
        assert list(client.run(lambda dask_worker: dask_worker._tick_interval).values()) == [0.5]
        assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler._tick_interval) == 0.5
        # What the workers held once set up is out of their full collections (pipeline.gcfreeze).
        import gc

        assert all(n > 10_000 for n in client.run(gc.get_freeze_count).values())
        # Their sampling profiler is off: no callback looks at their stacks.
        assert list(client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks).values()) == [False]
        # The dashboard's pages are added when first asked for: no bokeh until then (the
        # scheduler runs in this process, where another test may have imported it).
        if not pages_before:
            assert "distributed.dashboard.scheduler" not in sys.modules
        with urllib.request.urlopen(client.dashboard_link, timeout=60) as page:
            assert page.status == 200 and b"bokeh" in page.read().lower()
        with urllib.request.urlopen(client.dashboard_link.replace("/status", "/workers"), timeout=30) as page:
            assert page.status == 200 and b"bokeh" in page.read().lower()  # served by the pages themselves now
    assert dask.config.get(method) == before
    assert dask.config.get("distributed.admin.tick.interval") == "20ms"
    assert dask.config.get("distributed.worker.profile.enabled") is True
    text = log.getvalue()
    assert "LocalCluster with 1 worker" in text
    assert "dashboard: http://127.0.0.1:" in text


def _listening() -> set[tuple[str, int]]:
    import psutil

    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections() if c.status == psutil.CONN_LISTEN}


def test_a_local_cluster_of_threads_listens_on_loopback_only_and_links_to_its_dashboard_there():
    """Workers as threads of this process (``processes=False``): distributed bound their
    own HTTP servers to every interface and named the machine's network address in the
    dashboard's link, where the dashboard listens on 127.0.0.1 only."""
    import urllib.request

    before = _listening()
    log = io.StringIO()
    with cluster(n_workers=1, processes=False, log=log) as client:
        assert list(client.run(os.getpid).values()) == [os.getpid()]  # a thread of this process
        assert client.submit(sum, [1, 2, 3]).result() == 6
        opened = _listening() - before  # the dashboard and the worker's own HTTP server
        assert len(opened) >= 2 and all(ip == "127.0.0.1" for ip, _ in opened), opened
        link = re.search(r"^dashboard: (\S+)$", log.getvalue(), re.M)
        assert link and link[1].startswith("http://127.0.0.1:"), log.getvalue()
        with urllib.request.urlopen(link[1], timeout=60) as page:
            assert page.status == 200
        # The worker's own server answers its health route, without bokeh pages of its
        # own (the scheduler's show every worker; building them cost 0.7 s of CPU).
        (worker,) = client.cluster.workers.values()
        served = f"http://127.0.0.1:{worker.http_server.port}"
        with urllib.request.urlopen(f"{served}/health", timeout=60) as page:
            assert page.read() == b"ok"
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(f"{served}/status", timeout=60)
    assert log.getvalue().startswith("cluster: LocalCluster with 1 worker\n")


def test_a_run_on_worker_threads_equals_a_run_on_worker_processes(tmp_path):
    path = small_run_config(tmp_path, rows_per_day=1500, seed=8, chunk_rows=500)
    threads = run_cli("run", str(path), "--no-progress", "--set", "cluster.processes=false",
                      "--set", f"output.path={tmp_path / 'threads.zarr'}")
    assert threads.returncode == 0, threads.stderr
    assert "cluster: LocalCluster with 2 workers\ndashboard: http://127.0.0.1:" in threads.stderr
    processes = run_cli("run", str(path), "--no-progress")
    assert processes.returncode == 0, processes.stderr
    assert_same_store(tmp_path / "local.zarr", tmp_path / "threads.zarr")


@pytest.mark.parametrize("yaml_cluster, overrides, starts", [
    ({}, [], True),
    ({"processes": False}, [], False),
    ({}, ["cluster.processes=false"], False),
    ({"processes": False}, ["cluster.processes=true"], True),
    ({"address": "tcp://127.0.0.1:8786"}, [], False),
])
def test_the_workers_server_is_started_ahead_only_for_worker_processes(tmp_path, yaml_cluster, overrides, starts):
    """``pipeline run`` starts the server that worker processes are forked from before it
    reads the config; threads of the command's process (``processes: false``) need none."""
    import argparse

    from pipeline.cli import _starts_a_local_cluster

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"cluster": yaml_cluster}))
    args = argparse.Namespace(config=str(path), overrides=overrides, scheduler=None, print_config=False)
    assert _starts_a_local_cluster(args) is starts


def test_a_script_piped_to_python_starts_a_local_cluster(tmp_path):
    # ``python - < script``: __main__.__file__ is "<stdin>", which multiprocessing handed
    # to each worker process to run first; the workers failed to start. The script's own
    # __file__ is back once the cluster is closed.
    script = (
        "import __main__, dask.array as da, pipeline\n"
        "with pipeline.cluster(n_workers=1, threads_per_worker=1, memory_limit='512MiB', log=None) as client:\n"
        "    total = int(da.ones(1000, chunks=100).sum().compute())\n"
        "    workers = len(client.scheduler_info()['workers'])\n"
        "print('result', total, workers, __main__.__file__)\n"
    )
    done = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["result", "1000", "1", "<stdin>"]


def test_a_script_starting_a_local_cluster_outside_a_main_guard_is_named_at_once(tmp_path):
    # Every worker process imported the script again, ran the same line and failed with
    # multiprocessing's own error (in the child only); the run waited 30 s and said the
    # nannies logged no error.
    body = "with pipeline.cluster(n_workers=1, threads_per_worker=1, memory_limit='512MiB', log=None) as c:\n" \
           "    print('workers', len(c.scheduler_info()['workers']))\n"
    (tmp_path / "bad.py").write_text("import pipeline\n" + body)
    (tmp_path / "main.py").write_text("import pipeline\n\ndef main():\n" + "".join(
        "    " + line + "\n" for line in body.splitlines()) + "\nmain()\n")
    for name in ("bad.py", "main.py"):
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, name], capture_output=True, text=True, cwd=tmp_path, timeout=120)
        assert done.returncode == 1 and time.monotonic() - t0 < 25, done.stderr[-2000:]
        assert f"ClusterError: {tmp_path / name}: starts a LocalCluster of worker processes in its top-level code" \
            in done.stderr and 'under `if __name__ == "__main__":`' in done.stderr
    guarded = "import pipeline\nif __name__ == '__main__' and True:\n" + "".join(
        "    " + line + "\n" for line in body.splitlines())
    (tmp_path / "good.py").write_text(guarded)
    done = subprocess.run([sys.executable, "good.py"], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["workers", "1"], done.stderr[-2000:]


def test_dashboard_pages_that_cannot_be_built_answer_with_the_reason(monkeypatch):
    import urllib.error
    import urllib.request

    import distributed.dashboard.scheduler as pages

    def broken(*args, **kwargs):
        raise RuntimeError("no pages today")

    monkeypatch.setattr(pages, "connect", broken)
    with cluster(n_workers=1, threads_per_worker=1, memory_limit="512MiB", log=None) as client:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(client.dashboard_link, timeout=60)
        assert err.value.code == 503 and b"no pages today" in err.value.read()
        assert client.submit(sum, [1, 2]).result() == 3  # the cluster works on


def test_a_tick_interval_the_dask_config_names_is_kept():
    import dask

    with dask.config.set({"distributed.admin.tick.interval": "50ms"}):
        with cluster(n_workers=1, threads_per_worker=1, memory_limit="512MiB", processes=False, log=None) as client:
            assert client.run_on_scheduler(lambda dask_scheduler: dask_scheduler._tick_interval) == 0.05


def test_a_profiler_the_environment_asks_for_is_kept(monkeypatch):
    # distributed's own default (on) named in the environment: the user's choice, kept;
    # the same default left unnamed is turned off (the test above).
    monkeypatch.setenv("DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED", "True")
    with cluster(n_workers=1, threads_per_worker=1, memory_limit="512MiB", processes=False, log=None) as client:
        assert list(client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks).values()) == [True]


def _reused_heap() -> tuple[str | None, int, str]:
    """Page faults of a worker allocating and freeing 2 MiB arrays: none once its heap
    holds them; 512 each when every one is a fresh mapping (glibc's mmap threshold
    fixed at 128 KiB)."""
    import resource

    from pipeline.gcfreeze import warm_imports_done

    assert warm_imports_done(60)  # its imports allocate meanwhile: measured after them

    def cycle() -> None:
        for _ in range(50):
            a = np.ones(1 << 18)  # 2 MiB: under numpy's own huge-page threshold (4 MiB)
            del a

    cycle()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cycle()
    import pyarrow

    return (os.environ.get("MALLOC_MMAP_THRESHOLD_"), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before,
            pyarrow.default_memory_pool().backend_name)


def test_local_workers_reuse_their_heap_and_leave_the_callers_environment_alone():
    from pipeline.cluster import WORKER_MALLOC

    had = {k: os.environ.get(k) for k in WORKER_MALLOC}
    with cluster(n_workers=1, threads_per_worker=1, memory_limit="512MiB", log=None) as client:
        ((threshold, faults, pool),) = client.run(_reused_heap).values()
    assert {k: os.environ.get(k) for k in WORKER_MALLOC} == had
    if had["MALLOC_MMAP_THRESHOLD_"] is None:
        assert threshold == WORKER_MALLOC["MALLOC_MMAP_THRESHOLD_"]
        assert faults < 50 * 512 // 10, faults
    if had["ARROW_DEFAULT_MEMORY_POOL"] is None:
        assert pool == "system"  # pyarrow on glibc's heap, beside numpy


def _heap_shared_across_threads() -> int:
    """Page faults of a new thread allocating 16 MiB that another thread has just
    freed: none when every thread allocates from one arena, 4,096 when the new thread
    gets an arena of its own."""
    import resource
    import threading

    from pipeline.gcfreeze import warm_imports_done

    assert warm_imports_done(60)  # its imports allocate from the same heap meanwhile
    a = np.ones(1 << 21)  # 16 MiB: from the heap (under the mmap threshold), kept when freed
    del a
    faults = []

    def other() -> None:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        b = np.ones(1 << 21)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        del b

    t = threading.Thread(target=other)
    t.start()
    t.join()
    return faults[0]


def test_local_workers_share_one_heap_between_threads():
    if os.environ.get("MALLOC_ARENA_MAX") is not None:
        pytest.skip("the caller's MALLOC_ARENA_MAX wins")
    with cluster(n_workers=1, threads_per_worker=1, memory_limit="512MiB", log=None) as client:
        assert client.run(lambda: os.environ.get("MALLOC_ARENA_MAX")).popitem()[1] == "1"
        (faults,) = client.run(_heap_shared_across_threads).values()
    assert faults < 4096 // 10, faults


def _poll(condition, timeout: float) -> bool:
    """Whether ``condition()`` holds within ``timeout`` seconds: a worker's status lives in
    the scheduler's memory, with no file or event to wait on, so it is looked at every
    50 ms (the test's deadline is the bound, not the interval)."""
    deadline, tick = time.monotonic() + timeout, threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            return False
        tick.wait(0.05)
    return True


class _Log(io.StringIO):
    """A log that wakes whoever waits for what is written to it."""

    def __init__(self):
        super().__init__()
        self.written = threading.Condition()

    def write(self, text: str) -> int:
        with self.written:
            n = super().write(text)
            self.written.notify_all()
            return n

    def wait_for(self, condition, timeout: float) -> bool:
        with self.written:
            return self.written.wait_for(condition, timeout)


def test_workers_paused_at_their_memory_limit_are_named_once():
    """A worker at its memory limit pauses and starts no task: the run waited without a
    word, and the worker's "Pausing worker" went to its own log (on another machine,
    for a remote cluster). A threaded worker measures this process, far above the
    64 MiB it is given, so distributed's memory monitor pauses it as it would a worker
    process at its limit."""
    import dask

    log, limit = _Log(), 64 * 2**20
    with cluster(n_workers=1, processes=False, memory_limit=limit, dashboard_address=None, log=log,
                 paused_after=0.5) as client:
        (address,) = client.scheduler_info()["workers"]
        assert _poll(lambda: client.scheduler_info()["workers"][address]["status"] == "paused", 10)
        future = client.submit(sum, [1, 2])
        assert log.wait_for(lambda: "paused at the memory limit" in log.getvalue(), 10), log.getvalue()
        # Still paused, the task still waiting: no second warning.
        assert not log.wait_for(lambda: log.getvalue().count("paused at the memory limit") > 1, 1.5)
        client.run(lambda dask_worker: setattr(dask_worker.memory_manager, "memory_limit", 2**40))
        assert future.result(timeout=10) == 3  # resumed: the warning stopped nothing
    (line,) = [x for x in log.getvalue().splitlines() if "paused" in x]
    found = re.search(rf"worker {re.escape(address)} \(([\d,]+) MiB of its 64 MiB limit\) paused at the memory limit "
                      r"for \d+ s while tasks wait", line)
    assert found, line
    # Paused: above distributed's pause fraction of the limit.
    assert int(found[1].replace(",", "")) >= dask.config.get("distributed.worker.memory.pause") * limit / 2**20
    assert "cluster.memory_limit, or dask worker --memory-limit" in line and "cluster.threads_per_worker" in line


def test_a_scheduler_without_workers_is_named():
    log = _Log()
    with cluster(n_workers=0, processes=False, dashboard_address=None, log=log, paused_after=0.5) as client:
        future = client.submit(sum, [1, 2])  # held: a released future waits for nothing
        assert log.wait_for(lambda: "no workers" in log.getvalue(), 10), log.getvalue()
        assert re.search(rf"cluster: the scheduler {re.escape(client.scheduler.address)} has had no workers for \d+ s "
                         r"while tasks wait", log.getvalue()), log.getvalue()
        assert future.status == "pending"


def test_unreachable_scheduler_is_a_clear_error():
    with pytest.raises(ClusterError, match="tcp://127.0.0.1:1"):
        with cluster("tcp://127.0.0.1:1", timeout=2, log=None):
            pass


@pytest.fixture()
def remote(tmp_path):
    """A scheduler and two workers as separate OS processes, like on a real cluster."""
    sched_file = tmp_path / "scheduler.json"
    procs = [
        subprocess.Popen(
            [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
             "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    ]
    assert wait_until(lambda: scheduler_address(sched_file) is not None, timeout=60, watch=tmp_path,
                      procs=procs), "the scheduler did not start"
    address = scheduler_address(sched_file)
    for _ in range(2):
        procs.append(
            subprocess.Popen(
                [str(BIN / "dask"), "worker", address, "--nthreads", "1", "--memory-limit", "1GiB",
                 "--host", "127.0.0.1", "--no-dashboard", "--local-directory", str(tmp_path / "w")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        )
    from distributed import Client

    with Client(address, timeout=30) as c:
        c.wait_for_workers(2, timeout=60)
    yield address, procs
    stop_cluster(procs)


def test_same_config_on_a_remote_cluster_gives_the_local_output(remote, tmp_path):
    address, _ = remote
    path = small_run_config(tmp_path, rows_per_day=6000, seed=3, chunk_rows=2000)
    local = run_cli("run", str(path), "--no-progress")
    assert local.returncode == 0, local.stderr
    remote_run = run_cli("run", str(path), "--no-progress", "--scheduler", address,
                         "--set", f"output.path={tmp_path / 'remote.zarr'}")
    assert remote_run.returncode == 0, remote_run.stderr
    assert f"scheduler {address}" in remote_run.stderr
    assert_same_store(tmp_path / "local.zarr", tmp_path / "remote.zarr")


def _long_run(tmp_path, *, seed: int, store: str, rows_per_day: int = 60_000) -> dict:
    """A config over two generated days whose write phase lasts long enough to be
    interrupted (stride 1, chunks of 512 windows)."""
    raw = tmp_path / "raw"
    write_demo_data(raw, DemoSpec(days=2, rows_per_day=rows_per_day, seed=seed, formats=("parquet",)))
    return {
        "source": {"paths": str(raw / "*.parquet"), "timestamp": "timestamp", "chunk_rows": 4000},
        "features": {"steps": ["mid_price", "spread", {"name": "imbalance", "levels": 10}, "log_return",
                               {"name": "rolling_std", "window": 50}]},
        "windows": {"size": 64, "stride": 1, "scales": [1, 4]},
        "labels": {"kind": "return", "horizon": 10},
        "output": {"path": str(tmp_path / store), "splits": {"train": 0.9, "val": 0.1}, "chunk_samples": 512},
    }


@contextlib.contextmanager
def _run_while_writing(cfg: dict, tmp_path, *args: str, written: int, group: bool = True,
                       sigint_default: bool = True):
    """``pipeline run`` of ``cfg`` (``args`` added to its command line) in a subprocess,
    yielded as ``(run, lines, config path)`` once ``written`` chunk files of its
    ``train/x`` exist: its write phase under way. Its output is collected in ``lines``
    (complete after the block); ``group``: in a process group of its own, as a terminal's
    foreground job; ``sigint_default``: with SIGINT's default action (a test runner may
    ignore it). A run still alive after the block is killed, with its group."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = subprocess.Popen([str(BIN / "pipeline"), "run", str(path), "--no-progress", *args],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=group,
                           preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if sigint_default else None)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(run.stdout), daemon=True)
    reader.start()
    chunks = Path(cfg["output"]["path"]) / "train" / "x" / "c"
    try:
        wait_until(lambda: run.poll() is not None or (chunks.exists() and sum(1 for _ in chunks.rglob("*")) >= written),
                   timeout=240, watch=tmp_path, procs=[run])
        assert run.poll() is None, "the run ended before it could be stopped; make the data larger"
        yield run, lines, path
        run.wait(timeout=60)
        reader.join(timeout=10)
    finally:
        if run.poll() is None:
            if group:
                os.killpg(run.pid, signal.SIGKILL)
            else:
                run.kill()


def _resumes_as_uninterrupted(tmp_path, path) -> None:
    """The same run again (into ``o.zarr``) finishes it, equal to a run never stopped."""
    resumed = run_cli("run", str(path), "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    reference = run_cli("run", str(path), "--no-progress", "--set", f"output.path={tmp_path / 'ref.zarr'}")
    assert reference.returncode == 0, reference.stderr
    assert_same_store(tmp_path / "o.zarr", tmp_path / "ref.zarr")


def test_a_worker_killed_mid_run_changes_nothing(remote, tmp_path):
    """SIGKILL one of the two workers while chunks are being written: the scheduler
    reruns its tasks on the survivor and the store equals an undisturbed run's."""
    address, procs = remote
    cfg = _long_run(tmp_path, seed=5, store="killed.zarr", rows_per_day=30_000)
    cfg["output"]["codec"] = {"name": "zstd"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    run = subprocess.Popen(
        [str(BIN / "pipeline"), "run", str(path), "--no-progress", "--scheduler", address],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    chunks = tmp_path / "killed.zarr" / "train" / "x" / "c"
    wait_until(lambda: run.poll() is not None or (chunks.exists() and sum(1 for _ in chunks.rglob("*")) >= 20),
               timeout=240, watch=tmp_path, procs=[run])
    assert run.poll() is None, "the run ended before a worker could be killed; make the data larger"
    procs[1].send_signal(signal.SIGKILL)
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err
    with_kill = pipeline.open(tmp_path / "killed.zarr")

    # The reference run, on the LocalCluster, without any failure.
    ref = subprocess.run(
        [str(BIN / "pipeline"), "run", str(path), "--no-progress", "--set", f"output.path={tmp_path / 'ref.zarr'}"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert ref.returncode == 0, ref.stderr
    reference = pipeline.open(tmp_path / "ref.zarr")
    for split in reference.splits:
        for name in ("x", "y"):
            np.testing.assert_array_equal(with_kill[split][name][:], reference[split][name][:])


def test_an_append_on_a_remote_cluster_equals_a_local_build(remote, tmp_path):
    """Build on a LocalCluster, append the next day with --scheduler on the real
    scheduler and workers: the store equals a local build of every file."""
    address, _ = remote
    raw = tmp_path / "raw"
    write_demo_data(raw, DemoSpec(days=4, rows_per_day=3000, seed=4, formats=("parquet",), per_instrument=True))
    held = {f: tmp_path / "held" / f.relative_to(raw) for f in raw.glob("*/2026-01-08.parquet")}
    for f, h in held.items():
        h.parent.mkdir(parents=True, exist_ok=True)
        f.rename(h)
    cfg = {
        "cluster": {"n_workers": 1},
        "source": {"paths": str(raw / "*" / "*.parquet"), "timestamp": "timestamp",
                   "instrument": {"path": str(raw / "{instrument}" / "*.parquet")}, "sessions": "file"},
        "features": {"steps": ["mid_price", {"name": "imbalance", "levels": 5}, "log_return"]},
        "windows": {"size": 16, "stride": 4},
        "labels": {"kind": "return", "horizon": 8},
        "output": {"path": str(tmp_path / "grown.zarr"), "chunk_samples": 128,
                   "splits": {"train": {"until": "2026-01-07"}, "test": {}}},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    assert run_cli("run", str(path), "--no-progress").returncode == 0
    for f, h in held.items():
        h.rename(f)
    appended = run_cli("run", str(path), "--no-progress", "--scheduler", address)
    assert appended.returncode == 0, appended.stderr
    assert "version 1: appended 2 session(s)" in appended.stdout
    full = run_cli("run", str(path), "--no-progress", "--set", f"output.path={tmp_path / 'full.zarr'}")
    assert full.returncode == 0, full.stderr
    assert_same_store(tmp_path / "grown.zarr", tmp_path / "full.zarr")
    assert pipeline.open(tmp_path / "grown.zarr").versions[-1].kind == "append"


def test_a_scheduler_that_stops_answering_is_said_to_and_the_run_goes_on_when_it_answers_again(tmp_path):
    """A scheduler stopped with SIGSTOP (a hung VM, a network partition) keeps its
    connections open: the client waited without end and without a word. Now a line
    comes once it has not answered for ``unanswered_after`` s, the run keeps waiting,
    and finishes once the scheduler runs again (SIGCONT)."""
    sched_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
         "--scheduler-file", str(sched_file)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    stopped = False
    try:
        assert wait_until(lambda: scheduler_address(sched_file) is not None, timeout=60, watch=tmp_path,
                          procs=procs), "the scheduler did not start"
        address = scheduler_address(sched_file)
        procs.append(subprocess.Popen(
            [str(BIN / "dask"), "worker", address, "--nthreads", "1", "--memory-limit", "512MiB", "--host",
             "127.0.0.1", "--no-dashboard", "--no-nanny"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        log = _Log()
        with cluster(address, timeout=30, log=log, unanswered_after=1.0) as client:
            client.wait_for_workers(1, timeout=60)
            future = client.submit(time.sleep, 0.5, pure=False)
            procs[0].send_signal(signal.SIGSTOP)
            stopped = True
            assert log.wait_for(lambda: "has not answered" in log.getvalue(), 8), log.getvalue()
            assert future.status == "pending"  # the result waits in the stopped scheduler
            procs[0].send_signal(signal.SIGCONT)
            stopped = False
            assert future.result(timeout=30) is None  # kept waiting: it finishes once the scheduler is back
            assert log.wait_for(lambda: "answers again" in log.getvalue(), 8), log.getvalue()
        (line,) = [x for x in log.getvalue().splitlines() if "has not answered" in x]
        assert re.fullmatch(rf"cluster: the scheduler {re.escape(address)} has not answered for \d+ s; still waiting "
                            r"\(.*\): check that its process runs .*resumes it", line), line
    finally:
        if stopped:
            procs[0].send_signal(signal.SIGCONT)
        stop_cluster(procs)


def test_ctrl_c_of_a_remote_run_prints_one_line_without_tracebacks(remote, tmp_path):
    """SIGINT (a terminal's Ctrl-C) while a remote run writes: it printed asyncio's "Task
    exception was never retrieved ... AllExit" tracebacks of the client's abandoned
    gathers before its one line."""
    address, _ = remote
    cfg = _long_run(tmp_path, seed=7, store="o.zarr", rows_per_day=20_000)
    # Interrupted while its gathers wait: some chunks written, not all.
    with _run_while_writing(cfg, tmp_path, "--scheduler", address, written=6, group=False) as (run, lines, _):
        run.send_signal(signal.SIGINT)
    text = "".join(lines)
    assert run.returncode == 130, text
    assert "Traceback" not in text and "AllExit" not in text, text
    assert text.rstrip().endswith("interrupted; rerun the same command to resume"), text


def test_ctrl_c_at_the_terminal_stops_a_local_run_with_its_one_line_and_the_rerun_resumes(tmp_path):
    """A terminal's Ctrl-C is a SIGINT to its whole foreground process group: the
    LocalCluster's worker processes got it too, and died printing their KeyboardInterrupt
    and CancelledError tracebacks, followed by the scheduler's list of lost tasks, the
    nannies' "still alive after 4.0 seconds, killing" and multiprocessing's leaked
    semaphores, before the run's one line. A second Ctrl-C while the cluster closed made
    the process wait 10 s at its exit. The rerun resumes to the uninterrupted store."""
    cfg = _long_run(tmp_path, seed=11, store="o.zarr", rows_per_day=20_000)
    # Interrupted while the workers write: some chunks written, not all.
    with _run_while_writing(cfg, tmp_path, written=6) as (run, lines, path):
        helpers = _group_members(run.pid) - {run.pid}  # its workers, the forkserver, the resource tracker
        os.killpg(run.pid, signal.SIGINT)
        pressed = time.monotonic()
        # Impatient: again, while the cluster closes. The workers ignore the Ctrl-C, and the
        # other helpers outlive the run: the first of them to end is a worker its nanny
        # stopped, so the close has begun (and the run is still in it, closing the others).
        _first_exit(helpers | {run.pid}, timeout=30)
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=60)
        took = time.monotonic() - pressed
    text = "".join(lines)
    assert run.returncode == 130, text
    for noise in ("Traceback", "CancelledError", "KeyboardInterrupt", "leaked semaphore", "still alive",
                  "CommClosedError", "WARNING"):
        assert noise not in text, text
    written = [i for i, line in enumerate(lines) if line.startswith("writing")]
    assert written and lines[written[0] + 1:] == ["interrupted; rerun the same command to resume\n"], text
    assert took < 8, f"{took:.1f} s from Ctrl-C to the exit\n{text}"
    # The workers are gone with the run: none left in its group.
    assert wait_until(lambda: not _group_alive(run.pid), timeout=10, watch=tmp_path), "workers outlived the run"
    _resumes_as_uninterrupted(tmp_path, path)


def _group_members(pgid: int) -> set[int]:
    """The processes of the group ``pgid`` that are still running (zombies are dead)."""
    members = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.add(int(stat.parent.name))
    return members


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group ``pgid`` is still running."""
    return bool(_group_members(pgid))


def _first_exit(pids: set[int], *, timeout: float) -> bool:
    """Wait until one of ``pids`` ends or ``timeout`` seconds pass; return whether one
    ended. Woken by the processes' pidfds (readable once a process ends, whoever its
    parent is): no polling."""
    fds = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:  # ended already
                return True
        ready, _, _ = select.select(fds, [], [], timeout)
        return bool(ready)
    finally:
        for fd in fds:
            os.close(fd)


def test_a_ctrl_c_while_the_cluster_closes_is_held_until_it_has_closed():
    """A second Ctrl-C cancelled distributed's close midway (the process then waited 10 s
    at its exit): it now comes once the block is done, and not on top of an exception
    already on its way out."""
    from pipeline.cluster import _interrupts_deferred

    reached = []
    with pytest.raises(KeyboardInterrupt):
        with _interrupts_deferred():
            # raise_signal delivers SIGINT to this (the main) thread and runs its Python
            # handler before it returns: the Ctrl-C has come, inside the block, here.
            signal.raise_signal(signal.SIGINT)
            reached.append("end of block")
    assert reached == ["end of block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(ValueError, match="the run's own error"):
        with _interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            raise ValueError("the run's own error")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_processes_started_for_the_workers_ignore_ctrl_c():
    """The forkserver that a LocalCluster's workers are forked from starts with SIGINT
    ignored, which every process it forks keeps; this process's own Ctrl-C is kept."""
    from pipeline.cluster import _children_ignore_interrupts

    probe = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"]
    with _children_ignore_interrupts():
        inside = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
    after = subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip()
    assert (inside, after) == ("True", "False")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_a_local_cluster_whose_workers_stay_paused_running_nothing_stops_the_run_after_a_bounded_wait():
    """Workers paused at their memory limit with no task running free nothing, and a
    LocalCluster gets no other worker: the run waited for good. A threaded worker
    measures this process, far above the 64 MiB it is given, so it stays paused."""
    import dask

    log, limit = _Log(), 64 * 2**20
    started = time.monotonic()
    with pytest.raises(ClusterError) as refused:
        with cluster(n_workers=1, processes=False, memory_limit=limit, dashboard_address=None, log=log,
                     paused_after=0.5, stalled_after=1.0) as client:
            (address,) = client.scheduler_info()["workers"]
            assert _poll(lambda: client.scheduler_info()["workers"][address]["status"] == "paused", 10)
            client.submit(sum, [1, 2]).result(timeout=60)
    assert time.monotonic() - started < 30
    message = str(refused.value)
    found = re.search(r"has stayed paused for \d+ s at ([\d,]+) MiB of its 64 MiB memory limit \(dask pauses a worker "
                      r"at (\d+)% of it\), running no task while tasks wait", message)
    assert found, message
    assert int(found[2]) == round(100 * dask.config.get("distributed.worker.memory.pause"))
    assert int(found[1].replace(",", "")) >= int(found[2]) / 100 * 64
    assert "Set cluster.memory_limit to at least" in message and "\n" not in message


@pytest.mark.parametrize("raised", [True, False])
def test_a_cluster_that_fails_to_close_leaves_the_runs_own_error_and_one_line(monkeypatch, raised):
    """A nanny that would not stop its worker in time made the LocalCluster's close
    raise ``TimeoutError``, which replaced the run's own error (a run of 500
    instruments whose workers paused ended with only that traceback, rc 1, no word of
    why). The run's error is the one raised; the close is one line; a run that
    finished is not failed by its close."""
    from distributed import LocalCluster

    from pipeline.errors import StoreError

    real = LocalCluster.close

    def stuck(self, *args, **kwargs):  # closed, then failing as a nanny's close that timed out
        real(self, *args, **kwargs)
        raise TimeoutError("the nanny's process.join timed out")

    log = _Log()
    monkeypatch.setattr(LocalCluster, "close", stuck)
    try:
        with (pytest.raises(StoreError, match="the run's own error") if raised else contextlib.nullcontext()):
            with cluster(n_workers=1, processes=False, dashboard_address=None, log=log) as client:
                assert client.submit(sum, [1, 2]).result(timeout=10) == 3
                if raised:
                    raise StoreError("the run's own error")
    finally:
        monkeypatch.undo()
    lines = [x for x in log.getvalue().splitlines() if "closing the cluster failed" in x]
    assert lines == ["cluster: closing the cluster failed (TimeoutError: the nanny's process.join timed out); its "
                     "worker processes are stopped as this process exits"], log.getvalue()
