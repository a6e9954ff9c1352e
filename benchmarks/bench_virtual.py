"""Virtual against materialized windows on the demo data: bytes on disk, streaming speed.

    python benchmarks/bench_virtual.py            # demo data (2M rows), configs/orderbook.yaml, stride 1
    python benchmarks/bench_virtual.py --quick    # 2 days x 100k rows

Both stores come from the same config but `windows.materialize`; streaming reads whole
epochs of the train split with the same seed, batch size and buffer, the two stores in
turns (``--repeat`` runs of ``--epochs`` epochs back to back, nothing read ahead across
runs): the machine is shared and its speed drifts, so the speed ratio is the median of
the ratios of side-by-side runs.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

import pipeline
from pipeline.config import parse_config
from pipeline.demo import DemoSpec, write_demo_data
from pipeline.job import run


def store_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def window_bytes(path: str) -> int:
    """Bytes of what holds the windows: each split's ``x`` (materialized), or its window
    ends and the shared per-step features (virtual). Labels, end times and sessions,
    which both stores hold alike, one value per window, are left out."""
    root = Path(path)
    total = 0
    for p in root.rglob("*"):
        parts = p.relative_to(root).parts
        if p.is_file() and len(parts) > 2 and (parts[1] in ("x", "ends") or parts[:2] == ("_shared", "features")):
            total += p.stat().st_size
    return total


def epoch_rate(s: "pipeline.Stream", epoch: int, epochs: int = 1) -> tuple[float, float]:
    """Samples/s and GB/s of windows over ``epochs`` whole epochs back to back.

    Nothing is read ahead before or after (the stream's next-epoch read would run
    beside the other store's timed epochs): the first epoch starts cold, the later
    ones as in training.
    """
    s.stop_read_ahead()
    n = nbytes = 0
    t0 = time.perf_counter()
    for e in range(epoch, epoch + epochs):
        s.set_epoch(e)
        for xb, yb in s:
            n += len(yb)
            nbytes += xb.nbytes + yb.nbytes
    dt = time.perf_counter() - t0
    s.stop_read_ahead()
    return n / dt, nbytes / dt / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5, help="runs streamed from each store, in turns")
    parser.add_argument("--epochs", type=int, default=2, help="epochs back to back in one run")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_virtual_"))
    try:
        spec = DemoSpec(days=2, rows_per_day=100_000, formats=("parquet",)) if args.quick else \
            DemoSpec(formats=("parquet",))
        write_demo_data(work / "raw", spec)
        base = yaml.safe_load(Path("configs/orderbook.yaml").read_text())
        base["source"]["paths"] = str(work / "raw" / "*.parquet")
        base["source"].pop("instrument", None)  # one instrument's files, flat in raw/
        base["windows"]["stride"] = args.stride
        size = base["windows"]["size"]
        built = {}
        for materialize in (True, False):
            cfg = {**base, "windows": {**base["windows"], "materialize": materialize},
                   "output": {**base["output"], "path": str(work / f"m{int(materialize)}.zarr")}}
            t0 = time.perf_counter()
            summary = run(parse_config(cfg), log=None, progress=False)
            built[materialize] = (cfg["output"]["path"], time.perf_counter() - t0, summary.samples["train"])
        streams = {m: pipeline.stream(path, batch_size=args.batch, seed=0, buffer_chunks=4)
                   for m, (path, _, _) in built.items()}
        rates: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for turn in range(args.repeat):
            for materialize, s in streams.items():
                rates[materialize].append(epoch_rate(s, turn * args.epochs, args.epochs))
        for materialize, (path, build, n) in built.items():
            name = "materialized" if materialize else "virtual"
            sps = float(np.median([r[0] for r in rates[materialize]]))
            gbs = float(np.median([r[1] for r in rates[materialize]]))
            print(f"{name:>12}: {store_bytes(path) / 2**20:9,.1f} MiB on disk, written in {build:5.1f} s; "
                  f"streaming {n:,} train windows at {sps:,.0f} samples/s ({gbs:.2f} GB/s of windows), "
                  f"median of {args.repeat} runs of {args.epochs} epochs")
        disk = store_bytes(built[True][0]) / store_bytes(built[False][0])
        held = window_bytes(built[True][0]) / window_bytes(built[False][0])
        ratios = [v[0] / m[0] for v, m in zip(rates[False], rates[True])]
        print(f"disk: the windows {held:.1f}x smaller (goal >= size/2 = {size / 2:g}x), the whole store {disk:.1f}x "
              "(both also hold per window y, t, session); "
              f"streaming: virtual at {np.median(ratios):.2f}x the materialized speed (goal >= 1x; "
              "side-by-side runs: " + ", ".join(f"{r:.2f}" for r in ratios) + ")")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
