"""Building a lazy array over many small files: time and graph layers.

    python benchmarks/bench_loaders.py            # 1k, 10k and 100k npy files
    python benchmarks/bench_loaders.py --quick    # 1k and 10k

Each file is a 16x16 float32 .npy. Only headers are probed (in threads); the graph must
have a constant number of layers whatever the file count. Goal: 100k files < 10 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from pipeline.loaders import load


def make_files(directory: Path, n: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    a = np.zeros((16, 16), dtype=np.float32)
    # np.save once, then copy the bytes: the benchmark is about reading, not writing.
    first = directory / "f0000000.npy"
    np.save(first, a)
    data = first.read_bytes()
    for i in range(1, n):
        (directory / f"f{i:07d}.npy").write_bytes(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    counts = (1_000, 10_000) if args.quick else (1_000, 10_000, 100_000)
    work = Path(tempfile.mkdtemp(prefix="bench_loaders_"))
    try:
        for n in counts:
            d = work / str(n)
            make_files(d, n)
            os.sync()
            t0 = time.perf_counter()
            arr = load(str(d / "*.npy"))
            build = time.perf_counter() - t0
            layers = len(arr.dask.layers)
            t0 = time.perf_counter()
            total = float(arr.blocks[0].sum().compute(scheduler="threads"))
            sample = time.perf_counter() - t0
            print(f"{n:>7,} files: build {build:6.2f} s ({n / build:,.0f} files/s), {layers} graph layers, "
                  f"shape {arr.shape}, {arr.numblocks[0]} chunks; reading its first chunk ({arr.chunks[0][0]:,} files): {sample:.2f} s (sum {total:g})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
