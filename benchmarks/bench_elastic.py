"""What the elastic order (``global_batch_size``) costs against a stream without it.

    python benchmarks/bench_elastic.py            # reads on a 256-chunk store, speed on ~1 GB
    python benchmarks/bench_elastic.py --quick    # 64 chunks, speed on ~270 MB

Reads: every rank and DataLoader worker of world sizes 1, 2, 4 and 8 serves one epoch
of a store of 256 chunks of 1024 samples (blosc lz4); each read the streamer makes is counted (a whole
chunk, or a piece of one) with the samples it asks for and the blosc blocks it must
decode. Printed per world size: chunks a rank reads, read calls per chunk, and blocks
decoded per block of the rank's own samples, with and without ``global_batch_size``.

Speed: one rank's epochs, elastic against plain, in turns on the streaming benchmark's
store (chunks of 4096 x 64 x 32 float32), as ratios of side-by-side runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import pipeline
from pipeline.storage import write

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_streaming import make_store  # noqa: E402 - the streaming benchmark's store


def count_reads(s: "pipeline.Stream", block_rows: int) -> dict[str, int]:
    """Wrap the stream's source so that every read is counted: calls, distinct chunks,
    samples asked for, and blosc blocks holding them."""
    src = getattr(s.source, "base", s.source)
    counts = {"calls": 0, "samples": 0, "blocks": 0}
    chunks: set[int] = set()

    def note(chunk: int, lo: int, hi: int) -> None:
        counts["calls"] += 1
        counts["samples"] += hi - lo
        counts["blocks"] += (hi - 1) // block_rows - lo // block_rows + 1
        chunks.add(chunk)

    scatter, read = src.scatter, src.read

    def counted_scatter(name: str, piece: Any, out: np.ndarray, rows: np.ndarray) -> None:
        if name == s.names[0]:
            note(piece.chunk, piece.lo, piece.hi)
        return scatter(name, piece, out, rows)

    def counted_read(name: str, chunk: int, out: np.ndarray | None = None) -> np.ndarray:
        if name == s.names[0]:
            note(chunk, 0, src.lengths[chunk])
        return read(name, chunk, out)

    src.scatter, src.read = counted_scatter, counted_read
    counts["chunks"] = chunks  # type: ignore[assignment]
    return counts


def reads(store: Path, global_batch: int, buffer_chunks: int, block_rows: int, n_chunks: int) -> None:
    print(f"reads per rank and epoch, global batch {global_batch}, buffer_chunks {buffer_chunks} "
          f"({n_chunks} chunks; blocks of {block_rows} samples):")
    print(f"  {'world':>5} {'workers':>7} | {'chunks/rank':>11} {'reads/chunk':>11} {'blocks/own':>10} | "
          f"{'chunks/rank':>11} {'reads/chunk':>11} {'blocks/own':>10}   (plain | elastic)")
    for world in (1, 2, 4, 8):
        for workers in (1, 2):
            row = []
            for elastic in (False, True):
                kw = (dict(global_batch_size=global_batch) if elastic else dict(batch_size=global_batch // world))
                chunks, calls, blocks, own = [], [], [], []
                for rank in range(world):
                    s = pipeline.stream(str(store), rank=rank, world_size=world, seed=1, buffer_chunks=buffer_chunks,
                                        **kw)
                    c = count_reads(s, block_rows)
                    n = 0
                    for k in range(workers):
                        for _, y in s.iter_worker(k, workers):
                            n += len(y)
                    chunks.append(len(c["chunks"]))
                    calls.append(c["calls"] / max(1, len(c["chunks"])))
                    blocks.append(c["blocks"] / max(1, -(-n // block_rows)))
                    own.append(n)
                row += [np.mean(chunks), np.mean(calls), np.mean(blocks)]
            print(f"  {world:>5} {workers:>7} | {row[0]:>11.1f} {row[1]:>11.2f} {row[2]:>10.2f} | "
                  f"{row[3]:>11.1f} {row[4]:>11.2f} {row[5]:>10.2f}")


def epoch_rate(s: "pipeline.Stream", epoch: int) -> float:
    s.stop_read_ahead()
    t0 = time.perf_counter()
    nbytes = 0
    s.set_epoch(epoch)
    for xb, yb in s:
        nbytes += xb.nbytes + yb.nbytes
    dt = time.perf_counter() - t0
    s.stop_read_ahead()
    return nbytes / dt / 1e9


def speed(store: Path, batch: int, runs: int) -> None:
    for world in (1, 2):
        plain = pipeline.stream(str(store), batch_size=batch // world, rank=0, world_size=world, seed=0,
                                buffer_chunks=4)
        elastic = pipeline.stream(str(store), global_batch_size=batch, rank=0, world_size=world, seed=0,
                                  buffer_chunks=4)
        epoch_rate(plain, 0), epoch_rate(elastic, 0)  # buffers allocated before timing
        ratios, rates = [], {"plain": [], "elastic": []}
        for turn in range(runs):
            order = [("plain", plain), ("elastic", elastic)]
            got = {}
            for name, s in (order if turn % 2 == 0 else order[::-1]):
                got[name] = epoch_rate(s, turn + 1)
                rates[name].append(got[name])
            ratios.append(got["elastic"] / got["plain"])
        print(f"speed, rank 0 of {world}: plain {np.median(rates['plain']):.2f} GB/s, elastic "
              f"{np.median(rates['elastic']):.2f} GB/s; elastic / plain {np.median(ratios):.2f}x (runs: "
              + ", ".join(f"{r:.2f}" for r in ratios) + ")")
        for name, s in (("plain", plain), ("elastic", elastic)):
            q = s.quality()
            print(f"  quality {name}: {q['mean_distinct_chunks_per_batch']:.2f} distinct chunks per batch, "
                  f"Spearman {q['spearman_position_vs_index']:+.3f}")
        plain.close(), elastic.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_elastic_"))
    try:
        # Reads: chunks of 1024 samples of 16 x 8 float32 (the counts do not depend on
        # the sample shape).
        n_chunks = 64 if args.quick else 256
        n = n_chunks * 1024
        x = np.random.default_rng(0).standard_normal((n, 16, 8)).astype(np.float32)
        small = work / "reads.zarr"
        write(small, {"x": x, "y": np.arange(n, dtype=np.float32)}, chunk_samples=1024,
              codec={"name": "blosc", "cname": "lz4", "shuffle": "shuffle"}, progress=False)
        chunk_file = sorted(p for p in (small / "train" / "x").rglob("*") if p.is_file() and p.name == "0")[0]
        blocksize = int.from_bytes(chunk_file.read_bytes()[8:12], "little")  # blosc's header
        block_rows = max(1, blocksize // (16 * 8 * 4))
        for global_batch, buffer_chunks in ((256, 4), (256, 8), (24, 4)):
            reads(small, global_batch, buffer_chunks, block_rows, n_chunks)
        big = work / "speed.zarr"
        make_store(big, 8 if args.quick else 32, 4096, 64, 32)
        os.sync()
        speed(big, 256, 3 if args.quick else args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
