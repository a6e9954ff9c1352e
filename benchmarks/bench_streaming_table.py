"""The stream against the decode limit across settings (issue #21, "Full speed everywhere").

    python benchmarks/bench_streaming.py --table            # 1 GB stores, a 4.1 GB store for the fresh first epoch
    python benchmarks/bench_streaming.py --table --quick    # about a minute: 256 MB stores, 1 GB for the fresh epoch
    python benchmarks/bench_streaming_table.py --clean      # remove the cached stores
    python benchmarks/bench_streaming.py --table --only cold --no-readahead   # the cold row without read ahead

Rows are settings: ``buffer_chunks`` 1, 2, 4, 8 and 16 at the writer's default chunk of 4
MiB (1, the least memory, is a user's choice the issue's list leaves out); chunks of 1,
8 and 32 MiB at ``buffer_chunks=4``; batches of 32 (a small model's: the cost of each
batch shows), 100, 1000 and 4096 samples (the others are 256), the last three not dividing
a group of 2048 or exceeding it, so that batches span groups; two foreign stores written by
plain zarr (``zarr.create_array``, no pipeline attributes, zarr's default zstd codec):
one chunked along the samples only, one with zarr's own automatic chunks, which also
split each sample; and the first epoch of a fresh stream (opened, read and closed
within the timed run) on a store of at least 4 GB, with its files in the page cache
and, in the last row, with none of them there (a cold epoch: every file of the store is
dropped from the page cache with ``posix_fadvise(POSIX_FADV_DONTNEED)`` before each run
of either reader, so both read from the disk). Samples are 64x32 float32 windows (8
KiB), blosc lz4 with byte shuffle unless said otherwise.

Columns: the stream's GB/s, the decode limit's GB/s (every chunk's bytes read and
decoded by numcodecs on all cores straight into one preallocated array, in order, as
``bench_streaming.py`` measures it; a chunk that splits samples is decoded into a
reused buffer and copied to its place, a run of the last axis at a time, as the stream
copies it), the median of the ratios of side-by-side runs and the worst of them; then
where the time goes, as medians: each reader's core-seconds (user + system) per GB and
the cores it kept busy.

The two readers run in turns (the order turning round every other time, see
``bench_streaming.interleaved``). A stream run is ``--epochs`` epochs back to back of
a stream kept across runs, starting cold, as in ``bench_streaming.py``; a decode-limit
run decodes the store as many times. The fresh-stream row times one epoch of a new
stream against one pass of the limit. The limit's threads run as nice as the stream's
read threads (``read_niceness=5``; ``--limit-niceness``): on a machine that other
processes load too, a nicer reader gets a smaller share of the cores (measured in
``benchmarks/README.md``), so at unequal niceness the ratio measures the machine's
load rather than the stream.

Stores are written once into ``--cache`` (default ``/tmp/pipeline_bench_table``) and
reused by later runs; ``--clean`` removes them.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numcodecs
import numpy as np
import zarr

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pipeline  # noqa: E402
from bench_streaming import gbps, interleaved, stream_epoch  # noqa: E402
from pipeline.streaming.chunks import copy_runs  # noqa: E402
from pipeline.streaming.groups import lower_thread_priority  # noqa: E402

SIZE, WIDTH = 64, 32
ROW_BYTES = SIZE * WIDTH * 4
MIB = 2**20
DEFAULT_CACHE = "/tmp/pipeline_bench_table"


def block(i: int) -> np.ndarray:
    """Samples ``[512 * i, 512 * (i + 1))``: feature-like windows (smooth random walks
    plus noise, as ``bench_streaming.make_store`` writes), generated per block so that a
    store of any size is written in bounded memory, and every store holds the same
    samples whatever its chunks."""
    rows = 512
    rng = np.random.default_rng([0, i])
    base = np.cumsum(rng.standard_normal((rows // 64 + 2, WIDTH)).astype(np.float32), axis=0)
    rep = np.repeat(base, 64, axis=0)[: rows + SIZE]
    idx = np.arange(rows)[:, None] + np.arange(SIZE)[None, :]
    return rep[idx] + 0.1 * rng.standard_normal((rows, SIZE, WIDTH)).astype(np.float32)


def samples(start: int, k: int) -> np.ndarray:
    """Samples ``[start, start + k)`` (``start`` a multiple of 512)."""
    return np.concatenate([block((start + j) // 512) for j in range(0, k, 512)])[:k]


def write_pipeline_store(path: Path, n: int, rows: int) -> None:
    import dask
    import dask.array as da

    from pipeline.storage import write

    step = -(-rows // 512) * 512  # generated in whole blocks; the writer rechunks to its chunks
    parts = [da.from_delayed(dask.delayed(samples)(i, min(step, n - i)), shape=(min(step, n - i), SIZE, WIDTH),
                             dtype=np.float32) for i in range(0, n, step)]
    x = da.concatenate(parts)
    y = da.arange(n, dtype=np.float32, chunks=rows)
    with dask.config.set(scheduler="threads", num_workers=2):
        write(path, {"x": x, "y": y}, chunk_samples=rows, codec={"name": "blosc", "cname": "lz4", "shuffle": "shuffle"},
              progress=False, overwrite=True)


def write_foreign_store(path: Path, n: int, rows: int | None) -> None:
    """A group as another tool writes it: plain zarr, default codec (zstd), no pipeline
    attributes. ``rows=None`` leaves the chunks to zarr (which splits samples too)."""
    root = zarr.open_group(str(path), mode="w")
    x = root.create_array("train/x", shape=(n, SIZE, WIDTH), dtype="float32",
                          chunks=(rows, SIZE, WIDTH) if rows else "auto")
    root.create_array("train/y", shape=(n,), dtype="float32", chunks=(x.chunks[0],))
    step = x.chunks[0]
    for i in range(0, n, step):
        k = min(step, n - i)
        x[i : i + k] = samples(i, k)
    root["train/y"][:] = np.arange(n, dtype=np.float32)


def ensure_store(cache: Path, kind: str, gb: float, chunk_mib: float | None) -> Path:
    """The store for a setting, written once into ``cache`` and reused."""
    rows = None if chunk_mib is None else int(chunk_mib * MIB) // ROW_BYTES
    n = int(gb * 1e9) // ROW_BYTES // 512 * 512
    path = cache / f"{kind}-{n}-{rows or 'auto'}.zarr"
    done = path / ".bench_complete"
    if done.exists():
        return path
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    if kind == "pipeline":
        write_pipeline_store(path, n, rows)
    else:
        write_foreign_store(path, n, rows)
    os.sync()  # nothing of the write runs beside the timed runs
    done.touch()
    print(f"  wrote {path.name} in {time.perf_counter() - t0:.0f} s", flush=True)
    return path


# -- the decode limit, for any codec and chunk grid -------------------------------------


def _decoder(arr: zarr.Array):
    codecs = arr.metadata.to_dict()["codecs"]
    rest = [c["name"] for c in codecs[1:]]
    if rest == ["blosc"]:
        return numcodecs.Blosc()
    if rest == ["zstd"]:
        return numcodecs.Zstd()
    if not rest:
        return None
    raise SystemExit(f"decode limit: codecs {rest} not handled")


def _chunk_jobs(path: Path, name: str, out: np.ndarray) -> list:
    """``(file, destination slices, chunk shape)`` for every chunk of ``train/name``."""
    arr = zarr.open_array(str(path / "train" / name), mode="r")
    grid = [range(-(-s // c)) for s, c in zip(arr.shape, arr.chunks)]
    jobs = []
    for idx in itertools.product(*grid):
        sl = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, arr.chunks, arr.shape))
        jobs.append((path / "train" / name / "c" / "/".join(map(str, idx)), sl, arr.chunks))
    return jobs


class DecodeLimit:
    """Every chunk of ``x`` and ``y`` read and decoded by numcodecs on all cores, in
    order, into preallocated arrays (written once, so no first touch while timed)."""

    def __init__(self, path: Path, niceness: int = 0):
        self.path, self.niceness = path, niceness
        self.out = {}
        self.jobs = []
        self.decoders = {}
        for name in ("x", "y"):
            arr = zarr.open_array(str(path / "train" / name), mode="r")
            self.out[name] = np.ones(arr.shape, dtype=arr.dtype)
            self.decoders[name] = _decoder(arr)
            self.jobs += [(name,) + j for j in _chunk_jobs(path, name, self.out[name])]
        self.nbytes = sum(a.nbytes for a in self.out.values())
        self._local = threading.local()

    def _one(self, job) -> None:
        name, file, sl, chunks = job
        raw = file.read_bytes()
        dest = self.out[name][sl]
        dec = self.decoders[name]
        if dest.shape == tuple(chunks) and dest.flags.c_contiguous:
            if dec is None:
                dest[...] = np.frombuffer(raw, dtype=dest.dtype).reshape(dest.shape)
            else:
                dec.decode(raw, out=dest)
            return
        # A chunk that splits samples (or the short last one): decoded into a reused
        # buffer, then copied to its place.
        tmp = getattr(self._local, name, None)
        if tmp is None:
            tmp = np.empty(chunks, dtype=dest.dtype)
            setattr(self._local, name, tmp)
        if dec is None:
            tmp[...] = np.frombuffer(raw, dtype=dest.dtype).reshape(chunks)
        else:
            dec.decode(raw, out=tmp)
        copy_runs(dest, tmp[tuple(slice(0, n) for n in dest.shape)])  # as fast as the stream copies

    def __call__(self, passes: int = 1) -> float:
        numcodecs.blosc.use_threads = False
        t0 = time.perf_counter()
        with ThreadPoolExecutor(os.cpu_count() or 2, initializer=lower_thread_priority,
                                initargs=(self.niceness,)) as pool:
            for _ in pool.map(self._one, self.jobs * passes):
                pass
        dt = time.perf_counter() - t0
        numcodecs.blosc.use_threads = None
        return gbps(self.nbytes * passes, dt)


# -- the table ---------------------------------------------------------------------------


def settings(quick: bool) -> list[dict]:
    gb = 0.27 if quick else 1.07
    fresh_gb = 1.07 if quick else 4.1
    rows = [dict(label=f"buffer_chunks={b}, 4 MiB chunks", kind="pipeline", chunk=4, buffer=b, gb=gb)
            for b in (1, 2, 4, 8, 16)]
    rows += [dict(label=f"{c} MiB chunks, buffer_chunks=4", kind="pipeline", chunk=c, buffer=4, gb=gb)
             for c in (1, 8, 32)]
    # A small batch (many batches per group), batch sizes that do not divide a group
    # (2048 samples here), and one larger than a group: their batches span groups.
    rows += [dict(label=f"batch {b}, 4 MiB chunks, buffer_chunks=4", kind="pipeline", chunk=4, buffer=4, gb=gb,
                  batch=b) for b in (32, 100, 1000, 4096)]
    rows += [dict(label="foreign: plain zarr, zstd, 8 MiB chunks", kind="foreign", chunk=8, buffer=4, gb=gb),
             dict(label="foreign: plain zarr, zstd, zarr's auto chunks", kind="foreign", chunk=None, buffer=4, gb=gb),
             dict(label=f"fresh stream, first epoch, {fresh_gb:.1f} GB store", kind="pipeline", chunk=4, buffer=4,
                  gb=fresh_gb, fresh=True),
             dict(label=f"cold page cache, fresh stream, first epoch, {fresh_gb:.1f} GB store", kind="pipeline",
                  chunk=4, buffer=4, gb=fresh_gb, fresh=True, cold=True)]
    return rows


def drop_from_page_cache(path: Path) -> None:
    """Drop every file under ``path`` from the page cache (clean pages only, which a
    store written and synced long ago has): the next read comes from the disk."""
    for root, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(root, f), os.O_RDONLY)
            try:
                os.fdatasync(fd)  # written pages must reach the disk before they can be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def cold(path: Path, fn):
    """``fn`` run with the store's files dropped from the page cache first. Each reader
    times itself, after the drop; the CPU columns count the drop too (a few
    milliseconds of system calls)."""
    def run() -> float:
        drop_from_page_cache(path)
        return fn()
    return run


def measure(row: dict, path: Path, repeat: int, epochs: int, batch: int, niceness: int) -> dict:
    limit = DecodeLimit(path, niceness)
    cpu: dict[str, list[tuple[float, float]]] = {}
    if row.get("fresh"):
        def run_stream() -> float:
            t0 = time.perf_counter()
            with pipeline.stream(str(path), batch_size=batch, buffer_chunks=row["buffer"], seed=0) as s:
                s.stop_read_ahead()
                nbytes = 0
                for xb, yb in s:
                    nbytes += xb.nbytes + yb.nbytes
                s.stop_read_ahead()
                dt = time.perf_counter() - t0
            return gbps(nbytes, dt)

        fns = {"decode": lambda: limit(1), "stream": run_stream}
        if row.get("cold"):
            fns = {k: cold(path, fn) for k, fn in fns.items()}
        runs = interleaved(repeat, fns, cpu=cpu)
    else:
        s = pipeline.stream(str(path), batch_size=batch, buffer_chunks=row["buffer"], seed=0)
        stream_epoch(s, 0)  # the first epoch allocates the stream's buffers: the fresh row counts it
        starts = iter(range(1, 10**6, epochs))
        runs = interleaved(repeat, {"decode": lambda: limit(epochs),
                                    "stream": lambda: stream_epoch(s, next(starts), epochs)}, cpu=cpu)
        s.close()
    ratios = np.divide(runs["stream"], runs["decode"])
    return {"stream": float(np.median(runs["stream"])), "decode": float(np.median(runs["decode"])),
            "ratio": float(np.median(ratios)), "worst": float(ratios.min()), "runs": ratios.tolist(),
            "cpu": {k: float(np.median([c for c, _ in v])) for k, v in cpu.items()},
            "busy": {k: float(np.median([b for _, b in v])) for k, v in cpu.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller stores and fewer runs (about a minute)")
    parser.add_argument("--repeat", type=int, default=None, help="runs of each reader per row (default 7; quick 3)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per stream run (passes per decode-limit run)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--cache", default=DEFAULT_CACHE, help="directory the stores are written to once")
    parser.add_argument("--only", default=None, help="run only rows whose label contains this text")
    parser.add_argument("--limit-niceness", type=int, default=5,
                        help="niceness of the decode limit's threads (default 5, the stream's read_niceness: both "
                             "then get the same share of a machine that other processes also load)")
    parser.add_argument("--clean", action="store_true", help="remove the cached stores and exit")
    parser.add_argument("--no-readahead", action="store_true",
                        help="streams do not ask the kernel to read chunk files ahead (the code before it, for "
                             "the cold row's comparison)")
    args = parser.parse_args(argv)
    if args.no_readahead:
        from pipeline.streaming.groups import GroupLoader

        real_init = GroupLoader.__init__

        def init_without_advice(self, *a, **k):
            real_init(self, *a, **k)
            self._advise = None

        GroupLoader.__init__ = init_without_advice
    cache = Path(args.cache)
    if args.clean:
        shutil.rmtree(cache, ignore_errors=True)
        print(f"removed {cache}")
        return
    repeat = args.repeat or (3 if args.quick else 7)
    cache.mkdir(parents=True, exist_ok=True)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"{os.cpu_count()} cores; uptime: {load}")
    print(f"{repeat} runs of each reader in turns per row; a stream run is {args.epochs} epochs, batch {args.batch}; "
          f"decode-limit threads at niceness {args.limit_niceness} (the stream's read threads: 5)")
    rows = [r for r in settings(args.quick) if args.only is None or args.only in r["label"]]
    results = []
    for row in rows:
        path = ensure_store(cache, row["kind"], row["gb"], row["chunk"])
        res = measure(row, path, repeat, 1 if row.get("fresh") else args.epochs, row.get("batch", args.batch),
                      args.limit_niceness)
        results.append((row, res))
        print(f"  {row['label']:<48} {res['stream']:6.2f} {res['decode']:6.2f} {res['ratio']:5.2f}x  worst "
              f"{res['worst']:.2f}  (" + ", ".join(f"{r:.2f}" for r in res["runs"]) + ")", flush=True)
    print()
    print("| setting | stream GB/s | decode limit GB/s | stream / limit (median) | worst run "
          "| core-s per GB, stream / limit | cores busy, stream / limit |")
    print("|---|---|---|---|---|---|---|")
    for row, res in results:
        flag = "" if res["ratio"] >= 0.9 else " (under 0.9x)"
        c, b = res["cpu"], res["busy"]
        print(f"| {row['label']} | {res['stream']:.2f} | {res['decode']:.2f} | {res['ratio']:.2f}x{flag} | "
              f"{res['worst']:.2f}x | {c['stream']:.3f} / {c['decode']:.3f} | {b['stream']:.2f} / {b['decode']:.2f} |")
    worst = min(results, key=lambda r: r[1]["ratio"])
    print(f"\nlowest median: {worst[1]['ratio']:.2f}x ({worst[0]['label']}); uptime after: "
          + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
