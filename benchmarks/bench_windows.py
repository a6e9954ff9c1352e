"""Windows per second and peak worker memory on a LocalCluster, with 1 and 2 workers.

    python benchmarks/bench_windows.py            # 10M steps x 40 features, size 64, scales (1, 4), stride 10
    python benchmarks/bench_windows.py --quick    # 1M steps

The series is generated on the workers (no input I/O), windowed blockwise with its halo,
and each window chunk is reduced to a checksum so nothing is collected: the figure is
the cost of making windows.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import dask.array as da

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import MemorySampler  # noqa: E402

from pipeline.cluster import cluster  # noqa: E402
from pipeline.features import windows  # noqa: E402


def run(workers: int, steps: int, features: int, size: int, stride: int, scales: tuple[int, ...],
        chunk: int, memory_limit: str) -> tuple[float, int, int, int]:
    with cluster(n_workers=workers, threads_per_worker=1, memory_limit=memory_limit, log=None) as client:
        x = da.random.RandomState(0).standard_normal((steps, features), chunks=(chunk, features)).astype("float32")
        w = windows(x, size=size, stride=stride, scales=scales)
        total = w.sum(axis=(1, 2))  # one value per window: the windows are made, then dropped
        with MemorySampler(client) as mem:
            t0 = time.perf_counter()
            out = client.compute(total).result()
            dt = time.perf_counter() - t0
        return dt, int(out.shape[0]), mem.peak, int(w.nbytes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=10_000_000)
    parser.add_argument("--features", type=int, default=40)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--stride", type=int, default=10)
    parser.add_argument("--chunk", type=int, default=50_000, help="input steps per chunk")
    parser.add_argument("--memory-limit", default="4GiB")
    args = parser.parse_args()
    if args.quick:
        args.steps = 1_000_000
    scales = (1, 4)
    out_chunk = (args.chunk // args.stride) * args.size * args.features * len(scales) * 4
    print(f"series {args.steps:,} x {args.features} float32, windows size {args.size}, scales {scales}, "
          f"stride {args.stride}; output chunk ~{out_chunk / 2**20:.0f} MiB")
    times = {}
    for workers in (1, 2):
        dt, n, peak, nbytes = run(workers, args.steps, args.features, args.size, args.stride, scales, args.chunk,
                                  args.memory_limit)
        times[workers] = dt
        print(f"{workers} worker(s): {n:,} windows ({nbytes / 2**30:.1f} GiB) in {dt:.1f} s = {n / dt:,.0f} windows/s "
              f"({nbytes / dt / 2**30:.2f} GiB/s); peak worker memory {peak / 2**20:,.0f} MiB "
              f"= {peak / out_chunk:.1f}x the output chunk")
    print(f"scaling 1 -> 2 workers: {times[1] / times[2]:.2f}x")


if __name__ == "__main__":
    main()
