"""Build throughput: `pipeline run` of the demo config at stride 1 against the machine's
encode-and-write limit, measured in the same run, and where a build's time goes.

    python benchmarks/bench_build.py            # demo data: 5 days x 2 instruments x 200k rows
    python benchmarks/bench_build.py --quick    # 2 days x 2 instruments x 60k rows, about a minute
    python benchmarks/bench_build.py --only startup   # or --only profile, --only scaling: one part alone

Every ratio compares two figures measured here, in this run, on the same data and disk:

- the limit: the arrays a run stores (the windows and the per-window arrays beside them),
  already in memory, encoded with the store's own codecs chunk by chunk on all cores and
  written as files to the same disk. Virtual stores have their own: the shared features
  and the per-window arrays, encoded and written;
- ``pipeline run`` (a subprocess, as a user runs it: imports, LocalCluster, the
  statistics pass, the write), materialized and virtual, each against its limit; and
  once more over the store its first run left (``output.overwrite``, as a rerun);
- ``pipeline.write`` of the same arrays as existing dask arrays (in memory, dask's
  threaded scheduler) against the same limit;
- the fixed start-up of a run: ``pipeline run`` of a tiny input, from its launch to its
  ready LocalCluster (imports, cluster, workers holding what they run) plus from its
  summary to its exit, and its CPU; the same with worker threads (``cluster.processes:
  false``); beside it its imports alone and a LocalCluster alone;
- 1 and 2 workers on a 4x larger input (4x the run's own: 20 days x 200,000 rows for the
  demo input, about 4 GB written per run; 4 x 120,000 with ``--quick``), the whole run
  and its work once the cluster is ready, and the most that two workers could gain on
  this machine given the CPU the run spent in all (its workers, client, scheduler);
- a profiled run (in this process, on a LocalCluster it starts, after a warm-up build
  of a tiny input): the workers', the client's and the scheduler's CPU (the workers'
  system CPU and page faults apart) and the workers' peak memory over their idle
  baseline against a task's block; the same with nothing held between passes;
- the same build again with distributed's sampling profiler and task stream on (what
  they cost is printed): the workers' time by component, each beside its own limit:
  that component's work done once, alone, on one core, by the fastest library path.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import psutil

from pipeline.config import load_config
from pipeline.demo import DemoSpec, write_demo_data

BIN = Path(sys.executable).parent
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "orderbook.yaml"


# -- configs and runs -------------------------------------------------------------------

def overrides(raw: Path, out: Path, *, materialize: bool = True, workers: int = 2) -> list[str]:
    """``--set`` values: the demo config at stride 1 on ``raw``, written to ``out``."""
    return [f"source.paths={raw}/*/*.parquet", f"source.instrument={{path: '{raw}/{{instrument}}/*.parquet'}}",
            "windows.stride=1", f"windows.materialize={str(materialize).lower()}", f"output.path={out}",
            "output.overwrite=true", f"cluster.n_workers={workers}"]


#: CPU seconds of every ``pipeline run`` subprocess (and its workers), by output path:
#: on a shared machine, wall times swing with the load and CPU times much less.
CPU: dict[str, float] = {}


def tree_cpu(proc: subprocess.Popen, every: float = 0.1) -> Callable[[], float]:
    """Sample the CPU time of ``proc`` and of every process under it until it exits;
    the returned function gives their sum (each process's last sample). Its own
    rusage would miss the workers: a LocalCluster's are forked from a server process
    that nobody waits for, so their times never reach ``RUSAGE_CHILDREN``."""
    seen: dict[int, float] = {}

    def sample() -> None:
        try:
            root = psutil.Process(proc.pid)
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    seen[p.pid] = t.user + t.system
        except psutil.Error:
            pass

    def run() -> None:
        while proc.poll() is None:
            sample()
            time.sleep(every)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def total() -> float:
        thread.join()
        return sum(seen.values())

    return total


#: Seconds from the launch of every ``pipeline run`` subprocess to its ``cluster:`` line
#: (its LocalCluster ready) and to its ``wall time:`` line (its summary), by output path.
MARKS: dict[str, dict[str, float]] = {}


def cli_run(raw: Path, out: Path, **kwargs: Any) -> float:
    """Wall time of ``pipeline run`` in a subprocess, from its start to its exit (its
    CPU time, workers included, sampled every 0.1 s, goes to :data:`CPU`; when its
    lines came, to :data:`MARKS`)."""
    cmd = [str(BIN / "pipeline"), "run", str(CONFIG), "--no-progress"]
    for value in overrides(raw, out, **kwargs):
        cmd += ["--set", value]
    cpu: list[Callable[[], float]] = []
    marks, rc, lines = timed_lines(cmd, on_start=lambda proc: cpu.append(tree_cpu(proc)))
    if rc:
        raise SystemExit("pipeline run failed:\n" + "".join(lines)[-3000:])
    CPU[str(out)] = cpu[0]()
    MARKS[str(out)] = marks
    return marks["exit"]


def load_store(path: Path) -> dict[str, dict[str, tuple[np.ndarray, Any]]]:
    """Every data array of a store (the ``_written`` markers and fold indices left out),
    decoded into memory, with its zarr array: ``{group: {name: (values, array)}}``."""
    import zarr

    root = zarr.open_group(str(path), mode="r")
    out: dict[str, dict[str, tuple[np.ndarray, Any]]] = {}
    for split in [k for k in root.group_keys() if k != "folds"]:
        out[split] = {name: (np.asarray(arr[:]), arr) for name, arr in root[split].arrays() if name != "_written"}
    return out


def stored_chunks(path: Path, arrays: dict[str, dict[str, tuple[np.ndarray, Any]]]
                  ) -> list[tuple[str, np.ndarray, Any]]:
    """``(key, chunk, zarr array)`` for every chunk the store holds (zarr stores none
    for chunks equal to the fill value): its key in the store (``train/x/c/12/0/0``)
    and a view into ``arrays``."""
    out = []
    for split, named in arrays.items():
        for name, (values, arr) in named.items():
            folder = path / split / name / "c"
            rows = arr.chunks[0]
            for i in sorted(int(p.name) for p in folder.iterdir()) if folder.exists() else []:
                key = arr.metadata.encode_chunk_key((i,) + (0,) * (arr.ndim - 1))
                out.append((f"{split}/{name}/{key}", values[i * rows : (i + 1) * rows], arr))
    return out


def _encoder(arr: Any) -> Callable[[np.ndarray], bytes]:
    """The store's codecs for one array, as numcodecs calls on a numpy chunk."""
    import numcodecs
    from zarr.codecs import BloscCodec, TransposeCodec, ZstdCodec

    steps: list[Callable[[np.ndarray], Any]] = []
    for f in arr.filters:
        if isinstance(f, TransposeCodec):
            steps.append(lambda a, order=tuple(f.order): np.ascontiguousarray(a.transpose(order)))
    for c in arr.compressors:
        if isinstance(c, BloscCodec):
            codec = numcodecs.Blosc(cname=c.cname.value, clevel=c.clevel, blocksize=c.blocksize,
                                    shuffle={"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}[c.shuffle.value])
        elif isinstance(c, ZstdCodec):
            codec = numcodecs.Zstd(level=c.level)
        else:
            raise SystemExit(f"bench_build: no numcodecs twin for {c!r}")
        steps.append(codec.encode)

    def encode(chunk: np.ndarray) -> bytes:
        for step in steps:
            chunk = step(chunk)
        return bytes(chunk) if isinstance(chunk, np.ndarray) else chunk

    return encode


def limit_seconds(chunks: list[tuple[str, np.ndarray, Any]], target: Path, workers: int, *,
                  layout: bool = True) -> float:
    """Encode every chunk with its store codec and write it as a file under ``target``,
    on ``workers`` threads (numcodecs releases the GIL): the encode-and-write limit.

    ``layout``: each chunk at its key in the store, its directories made as it is
    written, as a store's files must be (zarr's chunk keys nest a directory per chunk
    index: ``c/12/0/0``). ``False``: the limit as first measured, every chunk a file of
    its array's one directory (``train/x/12``), the directories made before the clock
    starts."""
    encoders = {id(arr): _encoder(arr) for _, _, arr in chunks}
    if not layout:
        flat = []
        for key, c, a in chunks:
            split, name, rest = key.split("/", 2)
            flat.append((f"{split}/{name}/{rest.removeprefix('c/').replace('/', '.')}", c, a))
        chunks = flat
        for key, _, _ in chunks:
            (target / key).parent.mkdir(parents=True, exist_ok=True)

    def one(item: tuple[str, np.ndarray, Any]) -> None:
        key, chunk, arr = item
        data = encoders[id(arr)](chunk)
        path = target / key
        if layout:
            path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, chunks))
    return time.perf_counter() - t0


def api_write_seconds(arrays: dict[str, dict[str, tuple[np.ndarray, Any]]], target: Path) -> float:
    """``pipeline.write`` of a materialized store's split arrays, held in memory as dask
    arrays in blocks of its write tasks, with its chunking and codec, on dask's threaded
    scheduler (the Python API, no cluster)."""
    import dask
    import dask.array as da

    import pipeline
    from pipeline.storage.layout import task_block

    chunk = arrays["train"]["x"][1].chunks[0]
    splits = {}
    for split, named in arrays.items():
        block = task_block(chunk, named["x"][0][0].nbytes)
        splits[split] = {k: da.from_array(v, chunks=(block,) + v.shape[1:]) for k, (v, _) in named.items()}
    t0 = time.perf_counter()
    with dask.config.set(scheduler="threads"):
        pipeline.write(target, splits, chunk_samples=chunk, codec="blosc-lz4", progress=False)
    return time.perf_counter() - t0


# -- start-up, scaling ------------------------------------------------------------------

def timed_lines(cmd: list[str], on_start: Callable[[subprocess.Popen], Any] | None = None
                ) -> tuple[dict[str, float], int, list[str]]:
    """Run ``cmd`` (``on_start`` gets its process as soon as it starts); seconds from its
    launch to the first line of its output (stdout or stderr) that starts with each
    prefix it prints, and to its exit; its exit status; its lines."""
    marks: dict[str, float] = {}
    lines: list[str] = []
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if on_start is not None:
        on_start(proc)

    def read(stream: Any) -> None:
        for line in stream:
            lines.append(line)
            marks.setdefault(line.split(":", 1)[0].strip(), time.perf_counter() - t0)

    readers = [threading.Thread(target=read, args=(s,)) for s in (proc.stdout, proc.stderr)]
    for r in readers:
        r.start()
    rc = proc.wait()
    marks["exit"] = time.perf_counter() - t0
    for r in readers:
        r.join()
    return marks, rc, lines


def startup(work: Path, repeat: int = 3) -> dict[str, float]:
    """The fixed start-up of ``pipeline run`` of a tiny input (2 x 3000 rows), median of
    ``repeat`` runs: from its launch until its LocalCluster is ready (the ``cluster:``
    line: the run's imports and the cluster's start, workers holding what they run),
    and from its summary (the cluster closed) to its exit, and its CPU (its process tree);
    the same, in turns, with ``cluster.processes=false`` (worker threads); beside them,
    its imports alone (a fresh interpreter) and a LocalCluster started and closed in
    this process."""
    import statistics

    from pipeline.cluster import cluster

    code = ("import pipeline.cli, pipeline.job, pipeline.cluster, distributed, dask.array, zarr, pyarrow.parquet, "
            "pipeline.features, pipeline.loaders.segments, pipeline.storage.writer")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    imports = time.perf_counter() - t0
    t0 = time.perf_counter()
    with cluster(n_workers=2, threads_per_worker=1, memory_limit="4GiB", log=None):
        pass
    local = time.perf_counter() - t0
    tiny = work / "tiny"
    write_demo_data(tiny, DemoSpec(days=1, rows_per_day=3000, formats=("parquet",), per_instrument=True))
    cmd = [str(BIN / "pipeline"), "run", str(CONFIG), "--no-progress"]
    for value in overrides(tiny, work / "tiny.zarr"):
        cmd += ["--set", value]
    out = {"imports": imports, "cluster": local}
    # In turns: worker processes (the default) and worker threads (cluster.processes=false).
    runs: dict[str, list[tuple[float, ...]]] = {"": [], " threads": []}
    for _ in range(repeat):
        for kind, extra in (("", []), (" threads", ["--set", "cluster.processes=false"])):
            cpu: list[Callable[[], float]] = []
            marks, rc, _ = timed_lines(cmd + extra, on_start=lambda proc: cpu.append(tree_cpu(proc)))
            if rc or "cluster" not in marks or "wall time" not in marks:
                raise SystemExit(f"pipeline run{extra and ' ' + ' '.join(extra)} of the tiny input failed (exit {rc})")
            runs[kind].append((marks["cluster"], marks["exit"] - marks["wall time"], marks["exit"], cpu[0]()))
    for kind, got in runs.items():
        for i, name in enumerate(("ready", "exit", "tiny run", "cpu")):
            out[name + kind] = statistics.median(r[i] for r in got)
    return out


# -- the profiled run -------------------------------------------------------------------

#: Worker time by component: the deepest frame of a sample that one of these matches.
COMPONENTS: list[tuple[str, Callable[[dict], bool]]] = [
    ("Parquet decode", lambda d: d["filename"].endswith(("loaders/tables.py", "loaders/columns.py"))
     and d["name"] in ("_read_part", "_read_timestamps")),
    ("feature and label arithmetic", lambda d: d["filename"].endswith(("features/steps.py", "features/labels.py",
                                                                       "features/normalize.py", "features/build.py"))),
    ("statistics reductions", lambda d: d["filename"].endswith("dask/array/reductions.py")),
    ("dask copies (rechunk, overlap)", lambda d: d["filename"].endswith(("dask/array/core.py", "dask/array/_shuffle.py"))
     and d["name"].startswith(("concatenate", "_getitem"))),
    ("window copies", lambda d: d["name"] == "windows_numpy_block"),
    # The CRC32 of each part: its own function now; before, the frame of the unit
    # writer or the writer (the profile names functions, not lines).
    ("CRC32", lambda d: d["name"] == "crc32" and d["filename"].endswith("storage/checksum.py")
     or d["name"] == "write_units" and d["filename"].endswith("storage/units.py")
     or d["name"] == "_write_units" and d["filename"].endswith("storage/writer.py")),
    ("zarr codecs + store, per write unit", lambda d: "/zarr/" in d["filename"]
     or d["filename"].endswith("storage/units.py") and d["name"] in ("_store_sync", "_store", "_chunks", "is_fill")),
]


def by_component(profile: dict) -> dict[str, int]:
    """Samples of the workers' threads by component (``other``: dask's own task
    execution, serialization and the rest)."""
    counts = {name: 0 for name, _ in COMPONENTS}
    counts["other (dask task execution, ...)"] = 0

    def walk(node: dict, current: str) -> None:
        desc = node.get("description") or {}
        for name, match in COMPONENTS:
            if desc and match(desc):
                current = name
        children = node.get("children", {}).values()
        counts[current] += node["count"] - sum(c["count"] for c in children)
        for child in children:
            walk(child, current)

    walk(profile, "other (dask task execution, ...)")
    return counts


@contextlib.contextmanager
def phases() -> Iterator[list[tuple[str, float, float]]]:
    """``(stage, start, end)`` of each compute a run makes (perf_counter seconds): the
    wrapped ``compute`` of the feature stage and of the writer."""
    import pipeline.features.build as build
    import pipeline.storage.writer as writer
    from pipeline.progress import compute

    marks: list[tuple[str, float, float]] = []
    originals = {m: m.compute for m in (build, writer)}

    def timed(*collections: Any, desc: str = "compute", **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return compute(*collections, desc=desc, **kwargs)
        finally:
            marks.append((desc, t0, time.perf_counter()))

    for m in originals:
        m.compute = timed
    try:
        yield marks
    finally:
        for m, f in originals.items():
            m.compute = f


def _warm() -> int:
    # What a run's tasks import anyway, so that the baseline holds it (the worker's own
    # background imports included: pipeline.gcfreeze).
    import importlib

    from pipeline.gcfreeze import warm_imports_done

    warm_imports_done(60)
    for name in ("pyarrow.parquet", "pipeline.features.build", "pipeline.loaders.segments",
                 "pipeline.storage.units"):
        importlib.import_module(name)
    return psutil.Process().memory_info().rss


def anon_rss(pid: int) -> int:
    """Bytes of a process's resident memory that are its own (``RssAnon``: heap, numpy
    buffers), not pages of files it maps (``RssFile``: the code of the libraries it has
    run, shared with every process that runs them and dropped by the kernel at will);
    0 where ``/proc`` does not say."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


class PeakRSS:
    """The largest resident set of each of some processes, and the largest anonymous
    part of it (:func:`anon_rss`), sampled every 50 ms while the block runs
    (``ru_maxrss`` would not do: a spawned worker inherits its parent's peak across
    ``exec``)."""

    def __init__(self, procs: list[psutil.Process]):
        self.procs = procs
        self.peaks = [0] * len(procs)
        self.anon_peaks = [0] * len(procs)
        self._stop = threading.Event()

    def _run(self) -> None:
        self.tid = threading.get_native_id()
        while not self._stop.is_set():
            for i, p in enumerate(self.procs):
                self.peaks[i] = max(self.peaks[i], p.memory_info().rss)
                self.anon_peaks[i] = max(self.anon_peaks[i], anon_rss(p.pid))
            time.sleep(0.05)

    def __enter__(self) -> "PeakRSS":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def minor_faults(pid: int) -> int:
    """Minor page faults of a process so far (Linux; 0 elsewhere): each first touch of a
    freshly mapped page, which a worker pays for every new large buffer."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[7])
    except (OSError, IndexError, ValueError):
        return 0


def _noop(i: int) -> int:
    return i


def _executed(dask_worker: Any) -> int:
    return dask_worker.state.executed_count


def _received(dask_worker: Any) -> int:
    """Bytes this worker has fetched from other workers so far."""
    return sum(int(e.get("total", 0)) for e in dask_worker.transfer_incoming_log)


def thread_cpu() -> dict[int, float]:
    """CPU seconds of each thread of this process so far (Linux; empty elsewhere)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []:
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


#: The environment variable that keeps the workers' sampling profiler on in a LocalCluster.
PROFILE_ENV = "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"


def profiled_run(raw: Path, out: Path, *, hold: bool = True, sample: bool = False) -> dict[str, Any]:
    """One materialized build in this process on a LocalCluster of 2 workers, with its
    task stream, CPU times and peak memory. ``hold=False`` keeps nothing on the workers
    between passes, as for an input over the hold budget
    (``pipeline.features.build.HOLD_FRACTION``). ``sample``: with the workers' sampling
    profiler (distributed's, which a run's LocalCluster turns off: it costs the workers
    CPU of its own, so the figures of the run without it are the run's) and the task
    stream (a scheduler plugin that records every task: it costs the scheduler's event
    loop CPU of its own). Without them, tasks are counted by the workers."""
    from distributed import get_task_stream

    os.sync()  # the run writes back none of an earlier run's dirty pages

    import pipeline.features.build as build
    from pipeline import job
    from pipeline.cluster import cluster

    if not hold:
        saved = build.HOLD_FRACTION
        build.HOLD_FRACTION = 0.0
        try:
            return profiled_run(raw, out, sample=sample)
        finally:
            build.HOLD_FRACTION = saved
    if sample and os.environ.get(PROFILE_ENV) is None:
        os.environ[PROFILE_ENV] = "True"  # named in the environment: the cluster keeps it
        try:
            return profiled_run(raw, out, sample=sample)
        finally:
            del os.environ[PROFILE_ENV]

    from pipeline.gcfreeze import WARM_MODULES

    # The workers of a `pipeline run`: they import what a table's tasks need as they start.
    with cluster(n_workers=2, threads_per_worker=1, memory_limit="4GiB", log=None,
                 warm_imports=WARM_MODULES) as client:
        cfg = load_config(CONFIG, overrides=overrides(raw, out) + [f"cluster.address={client.scheduler.address}"])
        base = client.run(_warm)
        pids = client.run(os.getpid)
        procs = [psutil.Process(pids[a]) for a in base]
        anon_base = [anon_rss(p.pid) for p in procs]
        w0 = sum(p.cpu_times().user + p.cpu_times().system for p in procs)
        sys0, f0 = sum(p.cpu_times().system for p in procs), sum(minor_faults(p.pid) for p in procs)
        start = time.time()
        me0 = time.process_time()
        main0 = thread_cpu().get(threading.get_native_id(), 0.0)
        t0 = time.perf_counter()
        done0 = sum(client.run(_executed).values())
        moved0 = sum(client.run(_received).values())
        stream = get_task_stream(client=client) if sample else contextlib.nullcontext()
        with stream as ts, phases() as marks, PeakRSS(procs) as rss:
            summary = job.run(cfg, log=None, progress=False)
        wall = time.perf_counter() - t0
        client_cpu = time.process_time() - me0
        after = thread_cpu()
        main_cpu = after.get(threading.get_native_id(), 0.0) - main0
        # The memory sampler is this benchmark's, not the run's: its CPU is left out.
        client_cpu -= after.get(getattr(rss, "tid", -1), 0.0)
        worker_cpu = sum(p.cpu_times().user + p.cpu_times().system for p in procs) - w0
        worker_sys = sum(p.cpu_times().system for p in procs) - sys0
        faults = sum(minor_faults(p.pid) for p in procs) - f0
        profile = client.profile(start=start) if sample else {}
        tasks = sum(client.run(_executed).values()) - done0
        moved = sum(client.run(_received).values()) - moved0
        t1 = time.perf_counter()
        client.gather(client.map(_noop, range(400), pure=False))
        per_task = (time.perf_counter() - t1) / 400
    steps = [s for t in (ts.data if sample else []) for s in t["startstops"]]
    busy = sum(s["stop"] - s["start"] for s in steps if s["action"] == "compute")
    spill = [s["stop"] - s["start"] for s in steps if s["action"].startswith("disk")]
    return {"wall": wall, "summary": summary, "client_cpu": client_cpu, "main_cpu": main_cpu, "worker_cpu": worker_cpu,
            "worker_sys": worker_sys, "faults": faults,
            "tasks": tasks, "moved": moved, "busy": busy, "spill_s": sum(spill), "spills": len(spill),
            "profile": by_component(profile) if sample else {}, "peak_over_base": max(p - b for p, b in zip(rss.peaks, base.values())),
            "anon_over_base": max(p - b for p, b in zip(rss.anon_peaks, anon_base)),
            "per_task": per_task, "phases": [(name, a - t0, b - t0) for name, a, b in marks]}


def warm_up(work: Path) -> None:
    """A build of a tiny input in this process, its results dropped: what a process does
    once, at its first build (imports on first use, caches), which ``pipeline run``
    does in its fixed start-up, is not counted in the profiled runs that follow."""
    tiny = work / "warm"
    if not tiny.exists():
        write_demo_data(tiny, DemoSpec(days=1, rows_per_day=3000, formats=("parquet",), per_instrument=True))
    profiled_run(tiny, work / "warm.zarr")


def component_limits(raw: Path, window_bytes: int, stored_bytes: int) -> dict[str, float]:
    """Seconds, on one core, for each component's work done once: every file decoded,
    every session's features computed, the windows' bytes copied and checksummed."""
    import pyarrow.parquet as pq

    from pipeline.features.steps import columns_read, features_numpy

    config = load_config(CONFIG)
    steps = config.features.steps
    read = columns_read(steps, config.labels)  # the columns the run decodes
    out = {"Parquet decode": 0.0, "feature and label arithmetic": 0.0}
    for path in sorted(raw.glob("*/*.parquet")):
        t0 = time.perf_counter()
        # One core, as the label says: pyarrow's own threads would decode the columns on
        # every core, and the wall time of that understated one core's work about 1.7x.
        table = pq.read_table(path, use_threads=False, columns=[*read, "timestamp"])
        cols = [c for c in table.column_names if c != "timestamp"]
        values = np.empty((table.num_rows, len(cols)), dtype=np.float32)
        for j, c in enumerate(cols):
            values[:, j] = table.column(c).to_numpy()
        table.column("timestamp").to_numpy()
        t1 = time.perf_counter()
        features_numpy(values, cols, steps)
        out["Parquet decode"] += t1 - t0
        out["feature and label arithmetic"] += time.perf_counter() - t1
    piece = 32 * 2**20
    src, dst = np.ones(piece // 4, dtype=np.float32), np.empty(piece // 4, dtype=np.float32)
    t0 = time.perf_counter()
    for _ in range(max(1, window_bytes // piece)):
        np.copyto(dst, src)
    out["window copies"] = (time.perf_counter() - t0) * window_bytes / (max(1, window_bytes // piece) * piece)
    from pipeline.storage.checksum import crc32  # zlib-ng: the fastest CRC-32 on the package index

    t0 = time.perf_counter()
    for _ in range(max(1, stored_bytes // piece)):
        crc32(src)
    out["CRC32"] = (time.perf_counter() - t0) * stored_bytes / (max(1, stored_bytes // piece) * piece)
    return out


# -- main -------------------------------------------------------------------------------

def demo(directory: Path, days: int, rows: int) -> None:
    write_demo_data(directory, DemoSpec(days=days, rows_per_day=rows, formats=("parquet",), per_instrument=True))


def measure_limit(store: Path, target: Path, *, layout: bool = True) -> tuple[dict, list, float, float]:
    """A store's arrays in memory, and the encode-and-write limit on all cores (wall
    seconds and CPU seconds; ``layout``: see :func:`limit_seconds`)."""
    arrays = load_store(store)
    chunks = stored_chunks(store, arrays)
    os.sync()
    cpu0 = time.process_time()
    wall = limit_seconds(chunks, target, os.cpu_count() or 1, layout=layout)
    return arrays, chunks, wall, time.process_time() - cpu0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 days x 2 instruments x 60k rows")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument("--only", choices=("startup", "profile", "scaling"),
                        help="only the fixed start-up, only the profiled run (with its component limits), or "
                        "only 1 and 2 workers on a larger input")
    parser.add_argument("--scaling-days", type=int, default=None,
                        help="days of the scaling input (default 4x the input's: 20 days of 200,000 rows, "
                        "or 4 days of 120,000 with --quick)")
    parser.add_argument("--scaling-rows", type=int, default=None, help="rows per day and instrument of it")
    parser.add_argument("--turns", type=int, default=3,
                        help="pipeline run and its limit, materialized and virtual, this many times in turns "
                        "(median and worst ratio printed; default 3)")
    args = parser.parse_args()
    days, rows = (2, 60_000) if args.quick else (5, 200_000)
    # 4x the input: twice the days, and twice the rows for the quick input (whose days
    # are short); the demo input's days are full, so four times as many of them.
    args.scaling_days = args.scaling_days or (4 if args.quick else 20)
    args.scaling_rows = args.scaling_rows or (120_000 if args.quick else 200_000)
    work = Path(tempfile.mkdtemp(prefix="bench_build_", dir=os.environ.get("BENCH_DIR")))
    try:
        raw = work / "raw"
        demo(raw, days, rows)
        print(f"input: {days} days x 2 instruments x {rows:,} rows (demo order book, Parquet); "
              f"config {CONFIG.name} at stride 1; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} "
              "(other processes share the cores: compare ratios, not times, across runs)", flush=True)
        if args.only == "startup":
            say_startup(startup(work))
            return
        if args.only == "scaling":
            scaling(work, days=args.scaling_days, rows=args.scaling_rows)
            return
        if args.only == "profile":
            warm_up(work)
            prof = profiled_run(raw, work / "profiled.zarr")
            arrays, chunks, _, limit_cpu = measure_limit(work / "profiled.zarr", work / "limit")
            window_bytes = sum(v.nbytes for named in arrays.values() for k, (v, _) in named.items() if k == "x")
            limits = component_limits(raw, window_bytes, sum(c.nbytes for _, c, _ in chunks))
            limits["zarr codecs + store, per write unit"] = limit_cpu
            say_profile(prof, window_bytes)
            say_unheld(profiled_run(raw, work / "unheld.zarr", hold=False))
            say_components(profiled_run(raw, work / "sampled.zarr", sample=True), prof, limits)
            return
        sizes = materialized(raw, work, args.turns)
        virtual(raw, work, args.turns)
        say_startup(startup(work))
        warm_up(work)
        prof = profiled_run(raw, work / "profiled.zarr")
        limits = component_limits(raw, sizes["window_bytes"], sizes["stored_bytes"])
        limits["zarr codecs + store, per write unit"] = sizes["limit_cpu"]
        say_profile(prof, sizes["window_bytes"])
        say_unheld(profiled_run(raw, work / "unheld.zarr", hold=False))
        say_components(profiled_run(raw, work / "sampled.zarr", sample=True), prof, limits)
        scaling(work, days=args.scaling_days, rows=args.scaling_rows)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def scaling(work: Path, turns: int = 2, days: int = 20, rows: int = 200_000) -> None:
    """1 and 2 workers on a larger input (by default 4x the demo input), in turns: the
    whole ``pipeline run``, and its work once its LocalCluster is ready (its ``cluster:``
    line to its summary), which leaves out the fixed start-up that no worker count
    changes. Each run writes a new store (about 3.7 GB on disk for the 4x demo input),
    and all are removed after the last: on a file system that scans past recently freed
    inodes at each new file (ext4 without a journal, as on this project's machines), a
    run right after another's store was removed spends seconds in that scan, and two
    workers creating files at once contend for it, which measures the removal, not the
    build (benchmarks/README.md).

    Beside the ratio, its ceiling here: the 1-worker run's wall time against the CPU the
    2-worker run spent in all (workers, client, scheduler) spread over every core. The
    client and scheduler share the cores with two workers, not with one, so what they
    spend bounds the ratio on a machine with as many cores as workers."""
    import statistics

    big = work / f"raw-{days}-{rows}"
    demo(big, days, rows)
    whole: dict[int, list[float]] = {1: [], 2: []}
    after: dict[int, list[float]] = {1: [], 2: []}
    cpu: dict[int, list[float]] = {1: [], 2: []}
    written = []
    for turn in range(turns):
        for n in (1, 2) if turn % 2 == 0 else (2, 1):
            out = work / f"w{n}-{turn}.zarr"
            os.sync()  # no run writes back another's dirty pages
            whole[n].append(cli_run(big, out, workers=n))
            marks = MARKS[str(out)]
            after[n].append(marks["wall time"] - marks["cluster"])
            cpu[n].append(CPU[str(out)])
            written.append(out)
    for out in written:  # removed only now: see the docstring
        shutil.rmtree(out, ignore_errors=True)
    ratio = [a / b for a, b in zip(whole[1], whole[2])]
    ratio_after = [a / b for a, b in zip(after[1], after[2])]
    med = statistics.median
    print(f"{days} days x 2 instruments x {rows:,} rows, {turns} turns: 1 worker "
          f"{med(whole[1]):.1f} s, 2 workers {med(whole[2]):.1f} s = {med(ratio):.2f}x (goal >= 1.8x; runs "
          f"{', '.join(f'{r:.2f}' for r in ratio)}); once the cluster is ready (start-up left out): "
          f"{med(after[1]):.1f} s and {med(after[2]):.1f} s = {med(ratio_after):.2f}x (runs "
          f"{', '.join(f'{r:.2f}' for r in ratio_after)}); CPU {med(cpu[1]):.1f} s and {med(cpu[2]):.1f} s; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    cores = os.cpu_count() or 1
    ceiling = [w1 / (c2 / cores) for w1, c2 in zip(whole[1], cpu[2])]
    busy = [c / w for c, w in zip(cpu[2], whole[2])]
    print(f"  the most 2 workers could gain here: the 1-worker run's wall time against the 2-worker run's CPU over "
          f"{cores} cores = {med(ceiling):.2f}x; the 2-worker run kept {med(busy):.2f} of {cores} cores busy",
          flush=True)


def _turns(raw: Path, work: Path, name: str, chunks: list, first: tuple[float, float], turns: int,
           **kwargs: Any) -> tuple[list[float], list[float]]:
    """``pipeline run`` and its limit in turns (the first pair given, as measured), each
    into a new directory, removed after: run seconds, limit seconds."""
    runs, limits = [first[0]], [first[1]]
    cores = os.cpu_count() or 1
    for t in range(1, turns):
        target = work / f"{name}-limit{t}"
        os.sync()  # each timed write starts with no other's dirty pages to write back
        limits.append(limit_seconds(chunks, target, cores))
        shutil.rmtree(target, ignore_errors=True)
        out = work / f"{name}{t}.zarr"
        os.sync()
        runs.append(cli_run(raw, out, **kwargs))
        shutil.rmtree(out, ignore_errors=True)
    return runs, limits


def say_ratio(what: str, runs: list[float], limits: list[float], goal: str) -> None:
    """The median ratio of ``limits`` to ``runs`` (paired in turns), its worst and each."""
    import statistics

    ratios = [lim / run for run, lim in zip(runs, limits)]
    print(f"{what}: {statistics.median(runs):6.2f} s = {statistics.median(ratios):.2f}x its limit "
          f"({statistics.median(limits):.2f} s), median of {len(ratios)} in turns; worst {min(ratios):.2f}x "
          f"(runs {', '.join(f'{r:.2f}' for r in ratios)}) (goal {goal})", flush=True)


def materialized(raw: Path, work: Path, turns: int = 3) -> dict[str, float]:
    """``pipeline run`` and ``pipeline.write`` against the limit, ``turns`` times in turns,
    and a run over the store the first left; the sizes involved."""
    import statistics

    os.sync()
    run_s = cli_run(raw, work / "run.zarr")
    arrays, chunks, limit_s, limit_cpu = measure_limit(work / "run.zarr", work / "limit")
    window_bytes = sum(v.nbytes for named in arrays.values() for k, (v, _) in named.items() if k == "x")
    stored_bytes = sum(c.nbytes for _, c, _ in chunks)
    flat_s = limit_seconds(chunks, work / "limit-flat", os.cpu_count() or 1, layout=False)
    shutil.rmtree(work / "limit-flat", ignore_errors=True)
    shutil.rmtree(work / "limit", ignore_errors=True)
    runs, limits = _turns(raw, work, "run", chunks, (run_s, limit_s), turns)
    del chunks
    print(f"windows: {window_bytes / 2**30:.2f} GiB; every stored array {stored_bytes / 2**30:.2f} GiB uncompressed")
    print(f"limit: encoded with the store's codecs and written as files at their keys in the store (directories "
          f"made as written), {os.cpu_count()} threads: {limit_s:.2f} s ({stored_bytes / limit_s / 2**20:,.0f} MiB/s; "
          f"{limit_cpu:.2f} s of CPU); as first measured (one directory per array, made before the clock starts): "
          f"{flat_s:.2f} s")
    say_ratio("pipeline run, materialized", runs, limits, ">= 0.5x")
    cpu = CPU[str(work / "run.zarr")]
    print(f"  in CPU time (every process of the first run): {cpu:.1f} s against the limit's {limit_cpu:.1f} s = "
          f"{limit_cpu / cpu:.2f}x", flush=True)
    # A rerun over the store the first run left (output.overwrite, as `make demo` and a
    # user iterating on a config run it): the old store is removed as the new one is written.
    os.sync()
    again_s = cli_run(raw, work / "run.zarr")
    print(f"  over its own previous store (output.overwrite, as a rerun): {again_s:.2f} s = "
          f"{statistics.median(limits) / again_s:.2f}x the limits' median", flush=True)
    api_s = api_write_seconds(arrays, work / "api.zarr")
    print(f"pipeline.write of the same arrays as dask arrays (threads): {api_s:6.2f} s = {limit_s / api_s:.2f}x "
          "the limit (goal >= 0.5x)", flush=True)
    return {"window_bytes": window_bytes, "stored_bytes": stored_bytes, "limit_cpu": limit_cpu}


def virtual(raw: Path, work: Path, turns: int = 3) -> None:
    """``pipeline run`` with ``windows.materialize: false`` against its own limit,
    ``turns`` times in turns."""
    os.sync()
    vrun_s = cli_run(raw, work / "virtual.zarr", materialize=False)
    _, chunks, vlimit_s, vlimit_cpu = measure_limit(work / "virtual.zarr", work / "vlimit")
    shutil.rmtree(work / "vlimit", ignore_errors=True)
    vbytes = sum(c.nbytes for _, c, _ in chunks)
    runs, limits = _turns(raw, work, "virtual", chunks, (vrun_s, vlimit_s), turns, materialize=False)
    print(f"virtual limit: features and per-window arrays ({vbytes / 2**20:,.0f} MiB) encoded and written: "
          f"{vlimit_s:.2f} s ({vlimit_cpu:.2f} s of CPU)")
    say_ratio("pipeline run, virtual", runs, limits, ">= 0.5x")
    cpu = CPU[str(work / "virtual.zarr")]
    print(f"  in CPU time (the first run): {cpu:.1f} s against its limit's {vlimit_cpu:.1f} s = "
          f"{vlimit_cpu / cpu:.2f}x", flush=True)


def say_startup(up: dict[str, float]) -> None:
    fixed = up["ready"] + up["exit"]
    print(f"fixed start-up of pipeline run (median of 3, a tiny input): launch to a ready LocalCluster "
          f"{up['ready']:.2f} s + summary to exit {up['exit']:.2f} s = {fixed:.2f} s (goal < 3 s); the whole tiny "
          f"run {up['tiny run']:.2f} s. Alone: imports {up['imports']:.2f} s, LocalCluster start and close in a "
          f"process that holds them {up['cluster']:.2f} s; load average {os.getloadavg()[0]:.1f}", flush=True)
    threads = up["ready threads"] + up["exit threads"]
    print(f"  its CPU {up['cpu']:.2f} core-s (the command, its workers' server and its workers); with "
          f"cluster.processes=false (worker threads): fixed start-up {threads:.2f} s ({threads / fixed:.2f}x), the "
          f"whole tiny run {up['tiny run threads']:.2f} s ({up['tiny run threads'] / up['tiny run']:.2f}x), its CPU "
          f"{up['cpu threads']:.2f} core-s ({up['cpu threads'] / up['cpu']:.2f}x)", flush=True)


def _block_bytes() -> int:
    from pipeline.storage.layout import DEFAULT_CHUNK_BYTES, task_block

    window = 32 * 18 * 4  # bytes of one window of the demo config
    return task_block(max(1, DEFAULT_CHUNK_BYTES // window), window) * window


def say_unheld(p: dict[str, Any]) -> None:
    """The profiled build again with nothing held between passes: the raw files decoded
    and the features computed in each pass, as for an input over the hold budget."""
    block = _block_bytes()
    print(f"  with nothing held between passes (an input over the hold budget): {p['wall']:.2f} s wall; peak worker "
          f"memory {p['peak_over_base'] / 2**20:,.0f} MiB = {p['peak_over_base'] / block:.1f}x a task's block "
          f"(anonymous {p['anon_over_base'] / block:.1f}x) "
          f"(goal <= 4x); client and scheduler {100 * p['client_cpu'] / p['worker_cpu']:.1f}% of the workers' CPU",
          flush=True)


def say_profile(p: dict[str, Any], window_bytes: int) -> None:
    """The profiled run: CPU, memory, spilling, tasks, timeline."""
    block = _block_bytes()
    print(f"profiled run (no task stream, no sampling profiler): {p['wall']:.2f} s wall, {p['tasks']} tasks")
    print(f"  client and scheduler CPU {p['client_cpu']:.2f} s = {100 * p['client_cpu'] / p['worker_cpu']:.1f}% of "
          f"the workers' {p['worker_cpu']:.1f} s (goal < 5%); the run's own thread {p['main_cpu']:.2f} s, the "
          f"scheduler's event loop and the other threads {p['client_cpu'] - p['main_cpu']:.2f} s")
    print(f"  workers' system CPU {p['worker_sys']:.1f} s of it; {p['faults']:,} minor page faults "
          f"({p['faults'] * 4 / 2**20:.1f} GiB of 4 KiB pages first touched)")
    print(f"  peak worker memory over its idle baseline: {p['peak_over_base'] / 2**20:,.0f} MiB = "
          f"{p['peak_over_base'] / block:.1f}x a task's block of {block / 2**20:.0f} MiB (goal <= 4x); its own "
          f"(anonymous) memory alone, without the library code it mapped: {p['anon_over_base'] / 2**20:,.0f} MiB = "
          f"{p['anon_over_base'] / block:.1f}x")
    print(f"  dask: {p['tasks']} tasks at about {1e3 * p['per_task']:.1f} ms each (an empty task's round trip) "
          f"= {p['tasks'] * p['per_task']:.1f} s; one task per write block would be "
          f"{-(-window_bytes // block)} tasks; {p['moved'] / 2**20:,.0f} MiB moved between workers")
    last = 0.0
    stages = []
    for name, a, b in p["phases"]:
        stages.append(f"client {a - last:.2f} s, {name} {b - a:.2f} s")
        last = b
    stages.append(f"client {p['wall'] - last:.2f} s")
    print("  timeline: " + "; ".join(stages), flush=True)


def say_components(p: dict[str, Any], plain: dict[str, Any], limits: dict[str, float]) -> None:
    """The workers' time by component, from the same build run again with their sampling
    profiler (and what the profiler itself cost, against ``plain``, the run without)."""
    print(f"with the workers' sampling profiler and the task stream on: {p['wall']:.2f} s wall, workers' CPU "
          f"{p['worker_cpu']:.1f} s ({p['worker_cpu'] / plain['worker_cpu']:.2f}x the run without them), client and "
          f"scheduler {p['client_cpu']:.2f} s ({p['client_cpu'] / plain['client_cpu']:.2f}x), workers busy "
          f"{p['busy']:.1f} s")
    print(f"  spilling: {p['spills']} transfers to or from disk, {p['spill_s']:.2f} s (its limit: none)")
    total = sum(p["profile"].values()) or 1
    print("  workers' time by component (sampled)   in the run   its own limit (once, 1 core)   run / limit")
    for name, count in sorted(p["profile"].items(), key=lambda kv: -kv[1]):
        seconds = p["busy"] * count / total
        lim = limits.get(name)
        ratio = f"{seconds / lim:9.1f}x" if lim else "        -"
        print(f"    {name:38s} {seconds:8.2f} s   {'' if lim is None else f'{lim:8.2f} s':>28s}   {ratio}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
