"""Virtual against materialized windows on the demo data: bytes on disk, streaming speed.

    python benchmarks/bench_virtual.py            # demo data (2M rows), configs/orderbook.yaml, stride 1
    python benchmarks/bench_virtual.py --quick    # 2 days x 100k rows

Both stores come from the same config but `windows.materialize`; streaming reads one
epoch of the train split with the same seed, batch size and buffer.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import yaml

import pipeline
from pipeline.config import parse_config
from pipeline.demo import DemoSpec, write_demo_data
from pipeline.job import run


def store_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def stream_rate(path: str, batch: int) -> tuple[float, float]:
    s = pipeline.stream(path, batch_size=batch, seed=0, buffer_chunks=4)
    n = nbytes = 0
    t0 = time.perf_counter()
    for xb, yb in s:
        n += len(yb)
        nbytes += xb.nbytes + yb.nbytes
    dt = time.perf_counter() - t0
    return n / dt, nbytes / dt / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_virtual_"))
    try:
        spec = DemoSpec(days=2, rows_per_day=100_000, formats=("parquet",)) if args.quick else \
            DemoSpec(formats=("parquet",))
        write_demo_data(work / "raw", spec)
        base = yaml.safe_load(Path("configs/orderbook.yaml").read_text())
        base["source"]["paths"] = str(work / "raw" / "*.parquet")
        base["windows"]["stride"] = args.stride
        size = base["windows"]["size"]
        results = {}
        for materialize in (True, False):
            cfg = {**base, "windows": {**base["windows"], "materialize": materialize},
                   "output": {**base["output"], "path": str(work / f"m{int(materialize)}.zarr")}}
            t0 = time.perf_counter()
            summary = run(parse_config(cfg), log=None, progress=False)
            build = time.perf_counter() - t0
            sps, gbs = stream_rate(cfg["output"]["path"], args.batch)
            results[materialize] = (store_bytes(cfg["output"]["path"]), sps, gbs, build, summary.samples["train"])
        for materialize, (nbytes, sps, gbs, build, n) in results.items():
            name = "materialized" if materialize else "virtual"
            print(f"{name:>12}: {nbytes / 2**20:9,.1f} MiB on disk, written in {build:5.1f} s; "
                  f"streaming {n:,} train windows at {sps:,.0f} samples/s ({gbs:.2f} GB/s of windows)")
        (bm, sm, *_), (bv, sv, *_) = results[True], results[False]
        print(f"disk: virtual is {bm / bv:.1f}x smaller (goal >= size/2 = {size / 2:g}x); "
              f"streaming: virtual at {sv / sm:.2f}x the materialized speed (goal >= 1x)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
