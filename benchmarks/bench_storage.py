"""Write throughput and compression of the demo windows: zarr codecs vs npy and HDF5-LZF.

    python benchmarks/bench_storage.py            # demo data: 2M rows -> ~100k windows (220 MB)
    python benchmarks/bench_storage.py --quick    # 2 days x 100k rows

The windows are computed once (from the seeded demo order book and configs/orderbook.yaml's
features) and held in memory, so every format writes the same bytes from the same array.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import dask
import numpy as np

from pipeline.config import load_config
from pipeline.demo import DemoSpec, write_demo_data
from pipeline.features import build_training_set
from pipeline.loaders import open_source
from pipeline.storage import write


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_storage_"))
    try:
        spec = DemoSpec(days=2, rows_per_day=100_000, formats=("parquet",)) if args.quick else \
            DemoSpec(formats=("parquet",))
        write_demo_data(work / "raw", spec)
        cfg = load_config("configs/orderbook.yaml")
        src = open_source(str(work / "raw" / "*.parquet"), timestamp="timestamp")
        with dask.config.set(scheduler="threads"):
            ts = build_training_set(src.array, columns=src.columns, features=cfg.features.steps,
                                    size=cfg.windows.size, stride=cfg.windows.stride, scales=cfg.windows.scales,
                                    label=cfg.labels, splits={"train": 1.0})
            x = ts.splits["train"]["x"].compute()
            y = ts.splits["train"]["y"].compute()
        raw = x.nbytes + y.nbytes
        print(f"windows: {x.shape} float32 + labels = {raw / 2**20:,.1f} MiB (demo order book, {spec.days} days)")
        rows = []

        def timed(name: str, fn, path: Path) -> None:
            t0 = time.perf_counter()
            fn(path)
            dt = time.perf_counter() - t0
            rows.append((name, raw / dt / 2**20, raw / dir_size(path), dir_size(path)))

        codecs = {
            "zarr blosc lz4 (default, noshuffle)": "blosc-lz4",
            "zarr blosc lz4 + byte shuffle": {"name": "blosc", "cname": "lz4", "shuffle": "shuffle"},
            "zarr blosc zstd (noshuffle)": "blosc-zstd",
            "zarr zstd": "zstd",
            "zarr uncompressed": "none",
        }
        for i, (name, codec) in enumerate(codecs.items()):
            timed(name, lambda p, c=codec: write(p, {"x": x, "y": y}, codec=c, progress=False, overwrite=True),
                  work / f"c{i}.zarr")

        def npy_batches(p: Path) -> None:
            p.mkdir()
            for i in range(0, len(x), 4096):
                np.save(p / f"x{i:09d}.npy", x[i : i + 4096])
                np.save(p / f"y{i:09d}.npy", y[i : i + 4096])

        timed("npy files (4096 samples each)", npy_batches, work / "npy")

        def hdf5_lzf(p: Path) -> None:
            import h5py

            with h5py.File(p, "w") as f:
                f.create_dataset("x", data=x, chunks=(min(len(x), 512),) + x.shape[1:], compression="lzf")
                f.create_dataset("y", data=y, chunks=(min(len(y), 4096),), compression="lzf")

        timed("HDF5 with LZF", hdf5_lzf, work / "set.h5")
        base = next(r for r in rows if r[0].startswith("npy"))
        print(f"{'format':<34} {'write MiB/s':>12} {'ratio':>7} {'on disk':>11} {'speed vs npy':>13}")
        for name, speed, ratio, size in rows:
            print(f"{name:<34} {speed:12,.0f} {ratio:6.2f}x {size / 2**20:9,.1f} MiB {speed / base[1]:12.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
