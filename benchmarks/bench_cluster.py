"""Out-of-core run and worker scaling on a LocalCluster.

    python benchmarks/bench_cluster.py            # full: >= 8 GiB of windows, 2 x 1 GiB workers
    python benchmarks/bench_cluster.py --quick    # a few hundred MB, to check the script

Runs the order-book config over windows at least 4x larger than the workers' total
memory limit, samples every worker's RSS while it runs, counts worker restarts, and
prints the wall time with 1 and with 2 workers (the scaling ratio).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil  # noqa: E402
from common import MemorySampler  # noqa: E402

from pipeline.cluster import cluster  # noqa: E402
from pipeline.config import parse_config  # noqa: E402
from pipeline.demo import DemoSpec, write_demo_data  # noqa: E402


def one_run(raw: Path, out: Path, workers: int, memory_limit: str, args) -> dict:
    from pipeline import job

    with cluster(n_workers=workers, threads_per_worker=1, memory_limit=memory_limit, log=None) as client:
        cfg = {
            # The run connects to this cluster by address, as it would to a remote one.
            "cluster": {"address": client.scheduler.address},
            "source": {"paths": str(raw / "*.parquet"), "timestamp": "timestamp"},
            "features": {"steps": ["mid_price", "spread", {"name": "imbalance", "levels": 1},
                                   {"name": "imbalance", "levels": 5}, {"name": "imbalance", "levels": 10},
                                   "log_return", {"name": "rolling_mean", "window": 20},
                                   {"name": "rolling_std", "window": 20}, {"name": "rolling_std", "window": 100}]},
            "windows": {"size": args.size, "stride": args.stride, "scales": [1, 4]},
            "labels": {"kind": "return", "horizon": 20},
            "output": {"path": str(out), "splits": {"train": 0.8, "val": 0.1, "test": 0.1}, "overwrite": True},
        }
        pids = list(client.run(os.getpid).values())
        procs = [psutil.Process(p) for p in pids]
        me = psutil.Process()
        with MemorySampler(client) as mem:
            cpu0 = psutil.cpu_times()
            w0 = [p.cpu_times() for p in procs]
            m0 = me.cpu_times()
            t0 = time.perf_counter()
            summary = job.run(parse_config(cfg), log=None, progress=False)
            dt = time.perf_counter() - t0
            cpu1 = psutil.cpu_times()
            workers_cpu = sum((b.user + b.system) - (a.user + a.system) for a, b in zip(w0, [p.cpu_times() for p in procs]))
            m1 = me.cpu_times()
    busy = lambda t: t.user + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0)  # noqa: E731
    return {"seconds": dt, "summary": summary, "peak": mem.peak, "restarts": len(mem.new_workers),
            "machine_cpu": busy(cpu1) - busy(cpu0), "workers_cpu": workers_cpu,
            "client_cpu": (m1.user + m1.system) - (m0.user + m0.system),
            "steal": getattr(cpu1, "steal", 0) - getattr(cpu0, "steal", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--days", type=int, default=5)
    parser.add_argument("--rows-per-day", type=int, default=400_000)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--memory-limit", default="1GiB")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if args.quick:
        args.days, args.rows_per_day, args.stride = 2, 50_000, 2
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_cluster_"))
    raw = work / "raw"
    write_demo_data(raw, DemoSpec(days=args.days, rows_per_day=args.rows_per_day, formats=("parquet",)))
    limit_bytes = parse_bytes(args.memory_limit)
    # The first run would otherwise pay this process's one-time imports (pyarrow, zarr's
    # codecs, the pipeline's stages: about a second of the client's CPU) and the second
    # not: import them before either is timed.
    import pyarrow.parquet  # noqa: F401
    import pipeline.features  # noqa: F401
    import pipeline.loaders  # noqa: F401
    import pipeline.storage  # noqa: F401
    results = {}
    for workers in (2, 1):
        r = one_run(raw, work / f"out{workers}.zarr", workers, args.memory_limit, args)
        results[workers] = r
        s = r["summary"]
        peak = r["peak"]
        print(f"{workers} worker(s) x {args.memory_limit}: {s.uncompressed_bytes / 2**30:.2f} GiB of windows "
              f"({s.uncompressed_bytes / (workers * limit_bytes):.1f}x the workers' total memory) in "
              f"{r['seconds']:.1f} s; peak worker memory {peak / 2**20:,.0f} MiB "
              f"({peak / limit_bytes:.0%} of the limit); workers restarted: {r['restarts']}")
        cores = os.cpu_count() or 1
        print(f"    CPU: {r['machine_cpu']:.0f} core-s busy of {cores * r['seconds']:.0f} available "
              f"({r['machine_cpu'] / (cores * r['seconds']):.0%}); workers {r['workers_cpu']:.0f} core-s, "
              f"client and scheduler (this process) {r['client_cpu']:.0f}, the rest (kernel writeback, "
              f"other processes) {r['machine_cpu'] - r['workers_cpu'] - r['client_cpu']:.0f}; "
              f"stolen by the host {r['steal']:.0f}")
    print(f"scaling 1 -> 2 workers: {results[1]['seconds'] / results[2]['seconds']:.2f}x (goal 1.7x); "
          f"worker CPU per GiB: {results[1]['workers_cpu'] / gib(results[1]):.1f} core-s with 1 worker, "
          f"{results[2]['workers_cpu'] / gib(results[2]):.1f} with 2")
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


def gib(result: dict) -> float:
    return result["summary"].uncompressed_bytes / 2**30


def parse_bytes(text: str) -> int:
    from dask.utils import parse_bytes as pb

    return int(pb(text))


if __name__ == "__main__":
    main()
