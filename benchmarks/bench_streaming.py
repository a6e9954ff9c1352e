"""Shuffled streaming against the ways people read training data today, on one store.

    python benchmarks/bench_streaming.py            # ~1 GB store, chunks of 4096 x 64 x 32 float32
    python benchmarks/bench_streaming.py --quick    # ~270 MB, to check the script (chart in benchmarks/out/)
    python benchmarks/bench_streaming.py --table [--quick]   # stream / decode limit across settings
                                                    # (benchmarks/bench_streaming_table.py)

All in one process, on the same data:
  stream   pipeline.stream: shuffled chunk order, 4 chunks mixed in memory, prefetching
           (decode, stream and mapped decode run in turns, 9 times each, then stream, zarr
           and cold decode; ratios of side-by-side runs;
           a stream run is 3 epochs back to back, from a cold start, and leaves nothing
           reading ahead into the next reader's run)
  decode   the raw decode limit: every chunk's bytes decoded by numcodecs on all cores, in order
           (3 passes per run, as long as a stream run)
  zarr     zarr's array API, reading chunk-sized slices in order
  random   per-batch random indexing into the zarr array (time-bounded)
  wds      webdataset tar shards with a 1000-sample shuffle buffer (time-bounded)
  npy      a torch DataLoader over one .npy file per batch (2 workers, shuffled file order)
Then the data-wait fraction of a training loop whose step takes 5 ms. Writes a PNG chart.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numcodecs
import numpy as np
import zarr

import pipeline
from pipeline.storage import write


def make_store(path: Path, n_chunks: int, chunk: int, size: int, width: int) -> None:
    rng = np.random.default_rng(0)
    n = n_chunks * chunk
    # Feature-like windows: smooth random walks plus noise, so blosc sees realistic data.
    base = np.cumsum(rng.standard_normal((n // 64 + 1, width)).astype(np.float32), axis=0)
    x = np.empty((n, size, width), dtype=np.float32)
    for i in range(0, n, chunk):
        b = base[i // 64 : i // 64 + chunk // 64 + 2]
        rep = np.repeat(b, 64, axis=0)[: chunk + size]
        idx = np.arange(chunk)[:, None] + np.arange(size)[None, :]
        x[i : i + chunk] = rep[idx] + 0.1 * rng.standard_normal((chunk, size, width)).astype(np.float32)
    y = np.arange(n, dtype=np.float32)
    # blosc lz4 with byte shuffle, the usual choice for numeric arrays (the store of the
    # issue's reference measurements).
    write(path, {"x": x, "y": y}, chunk_samples=chunk, codec={"name": "blosc", "cname": "lz4", "shuffle": "shuffle"},
          progress=False, overwrite=True)


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def stream_epoch(s: "pipeline.Stream", epoch: int, epochs: int = 1) -> float:
    """``epochs`` whole shuffled epochs back to back, as a training loop runs them, in
    GB/s: the first starts cold (its first group read while timed), each next one
    finds its first group read during the previous one's last. Nothing is read ahead
    after the last, so no work of the stream runs beside another reader's timed run."""
    s.stop_read_ahead()
    nbytes = 0
    t0 = time.perf_counter()
    for e in range(epoch, epoch + epochs):
        s.set_epoch(e)
        for xb, yb in s:
            nbytes += xb.nbytes + yb.nbytes
    dt = time.perf_counter() - t0
    s.stop_read_ahead()
    return gbps(nbytes, dt)


def interleaved(runs: int, fns: dict, cpu: dict | None = None) -> dict[str, list[float]]:
    """Each reader run ``runs`` times in turns: the machine is shared and its speed
    drifts by 2x within a minute, so a ratio is taken between runs made side by side,
    and the median of those ratios is reported. The order turns round every other time
    (a, b, c, c, b, a, a, b, c, ...): a run leaves work behind it (the kernel freeing and
    reclaiming what it used) that slows whatever runs next by about 5% (measured). With
    two readers the turns are fair: each follows the other in half of its runs and
    itself in the other half. With three or more they are not: a reader in the middle
    always follows another reader, those at the ends follow themselves half the time.
    So a comparison that must be exact runs two readers at a time.

    With ``cpu`` given, each run's process CPU time is recorded in it too, per reader:
    ``(core-seconds per GB read, cores busy)``."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for turn in range(runs):
        for k, fn in (list(fns.items()) if turn % 2 == 0 else list(fns.items())[::-1]):
            c0, t0 = os.times(), time.perf_counter()
            rate = fn()
            c1, wall = os.times(), time.perf_counter() - t0
            out[k].append(rate)
            if cpu is not None:
                used = (c1.user - c0.user) + (c1.system - c0.system)
                cpu.setdefault(k, []).append((used / (rate * wall), used / wall))
    return out


def bench_decode(path: Path, out: np.ndarray | None = None, mapped: bool = False, passes: int = 1) -> float:
    """The raw decode limit as the issue measured it: every chunk's bytes read and
    decoded by numcodecs straight into its place in one preallocated array, on all
    cores, in order, no shuffle.

    With ``out`` given (allocated and written once before): decoding into memory
    already mapped, as the streamer's recycled buffers are, which is the pure decode
    limit. Without: into a new array whose pages are first touched by the decoder; on
    this virtual machine a first touch costs as much as decoding (sys time about equals
    user time), and varies with the host. With ``mapped``, the chunk files are mapped
    instead of read (no copy out of the page cache), as the streamer reads them: the
    strictest limit. ``passes`` decodes the store that many times in one timed run, so
    that a run lasts as long as the stream's run it is compared with and both see the
    same spell of the shared machine's speed.
    """
    arr = zarr.open_array(str(path / "train" / "x"), mode="r")
    c = arr.chunks[0]
    n_chunks = -(-arr.shape[0] // c)
    files = [path / "train" / "x" / "c" / str(i) / "0" / "0" for i in range(n_chunks)]
    blosc = numcodecs.Blosc()
    if out is None:
        out = np.empty(arr.shape, dtype=arr.dtype)  # preallocated, not yet touched

    def one(i: int) -> int:
        if mapped:
            with open(files[i], "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as raw:
                blosc.decode(raw, out=out[i * c : (i + 1) * c])
        else:
            blosc.decode(files[i].read_bytes(), out=out[i * c : (i + 1) * c])
        return out[i * c : (i + 1) * c].nbytes

    numcodecs.blosc.use_threads = False
    t0 = time.perf_counter()
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        total = sum(pool.map(one, [i for _ in range(passes) for i in range(n_chunks)]))
    dt = time.perf_counter() - t0
    numcodecs.blosc.use_threads = None
    y = zarr.open_array(str(path / "train" / "y"), mode="r")
    return gbps(total + passes * y.nbytes, dt)


def bench_zarr(path: Path) -> float:
    x = zarr.open_array(str(path / "train" / "x"), mode="r")
    y = zarr.open_array(str(path / "train" / "y"), mode="r")
    c = x.chunks[0]
    nbytes = 0
    t0 = time.perf_counter()
    for i in range(0, x.shape[0], c):
        a, b = x[i : i + c], y[i : i + c]
        nbytes += a.nbytes + b.nbytes
    return gbps(nbytes, time.perf_counter() - t0)


def bench_random(path: Path, batch: int, budget: float) -> float:
    x = zarr.open_array(str(path / "train" / "x"), mode="r")
    y = zarr.open_array(str(path / "train" / "y"), mode="r")
    rng = np.random.default_rng(0)
    nbytes = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < budget:
        idx = np.sort(rng.choice(x.shape[0], size=batch, replace=False))
        a = x.get_orthogonal_selection((idx, slice(None), slice(None)))
        b = y.get_orthogonal_selection((idx,))
        nbytes += a.nbytes + b.nbytes
    return gbps(nbytes, time.perf_counter() - t0)


def bench_wds(path: Path, work: Path, batch: int, budget: float, n_samples: int) -> float:
    import webdataset as wds

    x = zarr.open_array(str(path / "train" / "x"), mode="r")
    data = x[:n_samples]
    shards = work / "wds"
    shards.mkdir()
    with wds.ShardWriter(str(shards / "shard-%04d.tar"), maxcount=2000, verbose=0) as sink:
        for i in range(n_samples):
            sink.write({"__key__": f"{i:08d}", "x.npy": data[i], "y.cls": i})
    urls = sorted(str(p) for p in shards.glob("*.tar"))
    ds = (
        wds.WebDataset(urls, shardshuffle=False, empty_check=False)
        .shuffle(1000)
        .decode()
        .to_tuple("x.npy", "y.cls")
        .batched(batch)
    )
    nbytes = 0
    t0 = time.perf_counter()
    for xb, yb in ds:
        nbytes += np.asarray(xb).nbytes + np.asarray(yb).nbytes
        if time.perf_counter() - t0 > budget:
            break
    return gbps(nbytes, time.perf_counter() - t0)


class _NpyBatches:
    def __init__(self, files: list[tuple[str, str]]):
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        x_file, y_file = self.files[i]
        return np.load(x_file), np.load(y_file)  # never allow_pickle


def bench_npy(path: Path, work: Path, batch: int, n_samples: int) -> float:
    import torch
    from torch.utils.data import DataLoader

    x = zarr.open_array(str(path / "train" / "x"), mode="r")[:n_samples]
    files = []
    d = work / "npy"
    d.mkdir()
    # The hand-written layout this replaces: one .npy per batch (and one for its labels).
    for b in range(0, n_samples - batch + 1, batch):
        fx, fy = d / f"x-{b // batch:06d}.npy", d / f"y-{b // batch:06d}.npy"
        np.save(fx, x[b : b + batch])
        np.save(fy, np.arange(b, b + batch, dtype=np.float32))
        files.append((str(fx), str(fy)))
    loader = DataLoader(_NpyBatches(files), batch_size=None, shuffle=True, num_workers=2)
    nbytes = 0
    t0 = time.perf_counter()
    for xb, yb in loader:
        nbytes += xb.numel() * 4 + yb.numel() * 4
    del torch
    return gbps(nbytes, time.perf_counter() - t0)


def _timed_loop(batches, step: float) -> tuple[float, float, list[float]]:
    """Run a training loop of ``step`` seconds per batch; return the time spent in
    ``next()``, the loop's wall time, and each batch's wait."""
    waits = []
    t_all = time.perf_counter()
    it = iter(batches)
    while True:
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        waits.append(time.perf_counter() - t0)
        time.sleep(step)  # the training step
    return sum(waits), time.perf_counter() - t_all, waits


def wait_fraction(path: Path, batch: int, step: float, epochs: int = 3) -> dict:
    """Share of a training loop's wall time spent waiting for the next batch.

    Reports the fraction over the whole run, the fraction once running (leaving out
    only the run's very first batch: later epochs' first batches count), the median
    wait per batch, and the same loop over a Python list of ready batches: the floor
    that any iterator pays in this loop (after a sleep, the next Python call runs on
    cold caches).
    """
    s = pipeline.stream(str(path), batch_size=batch, buffer_chunks=4, seed=1)
    waited = total = cold = 0.0
    per_batch: list[float] = []
    for epoch in range(epochs):
        s.set_epoch(epoch)
        w, t, waits = _timed_loop(s, step)
        if epoch == 0:
            cold = waits[0]
        waited, total = waited + w, total + t
        per_batch += waits
    ready = [(np.zeros(1), np.zeros(1))] * len(per_batch)
    fw, ft, floor_waits = _timed_loop(ready, step)
    return {"whole": waited / total, "running": (waited - cold) / (total - cold), "batches": len(per_batch),
            "epochs": epochs, "median_us": 1e6 * float(np.median(per_batch)), "floor": fw / ft,
            "floor_median_us": 1e6 * float(np.median(floor_waits))}


_FIRST_BATCH = """
import time
start = time.perf_counter()
import pipeline
{patch}
s = pipeline.stream({store!r}, batch_size=256, seed=0)
batch = next(iter(s))
took = time.perf_counter() - start
import os, sys
print(took, int("zarr" in sys.modules), flush=True)
os._exit(0)
"""


def first_batch(store: Path, runs: int) -> dict[str, list[float]]:
    """Seconds from a fresh interpreter's first line to its first batch (``import
    pipeline``, open, read), as shipped and with the store opened by zarr (the metadata
    read that ``pipeline.streaming.localstore`` replaces), in turns; plus each whole
    process's wall time, the interpreter's start included."""
    patch = "import pipeline.streaming.localstore as L; L.open_local = lambda location: None"
    out: dict[str, list[float]] = {"shipped": [], "zarr": [], "shipped process": [], "zarr process": []}
    for _ in range(runs):
        for name, code in (("shipped", ""), ("zarr", patch)):
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", _FIRST_BATCH.format(patch=code, store=str(store))],
                                  capture_output=True, text=True, check=True)
            out[f"{name} process"].append(time.perf_counter() - t0)
            took, zarr_loaded = done.stdout.split()
            assert zarr_loaded == ("1" if code else "0"), (name, zarr_loaded)
            out[name].append(float(took))
    return out


def say_first_batch(store: Path, runs: int) -> None:
    t = first_batch(store, runs)
    med = {k: float(np.median(v)) for k, v in t.items()}
    print(f"import pipeline + open + first batch in a fresh process (median of {runs}, in turns, warm page cache): "
          f"{med['shipped']:.3f} s, worst {max(t['shipped']):.3f} s (goal < 0.5 s); the whole process "
          f"{med['shipped process']:.3f} s, worst {max(t['shipped process']):.3f} s. With the store opened by "
          f"zarr (its import): {med['zarr']:.3f} s, process {med['zarr process']:.3f} s")


def main() -> None:
    if "--table" in sys.argv[1:]:  # the settings table of bench_streaming_table.py
        from bench_streaming_table import main as table

        table([a for a in sys.argv[1:] if a != "--table"])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--chunks", type=int, default=32, help="chunks of 4096 samples (32 = ~1 GB)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--budget", type=float, default=10.0, help="seconds for the time-bounded baselines")
    parser.add_argument("--repeat", type=int, default=9, help="runs of the fast readers (median reported)")
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs back to back in one timed run of the stream (the first starts cold)")
    parser.add_argument("--first-batch", action="store_true",
                        help="only the fresh process's import + first batch (on a small store)")
    parser.add_argument("--png", default=None,
                        help="chart path (default benchmarks/results/streaming.png; with --quick benchmarks/out/)")
    args = parser.parse_args()
    if args.quick:
        # 8 chunks: with 4 the whole epoch is one buffer group, nothing to overlap.
        args.chunks, args.budget = 8, 3.0
    if args.png is None:  # a quick check never overwrites the README's full-size chart
        args.png = "benchmarks/out/streaming.png" if args.quick else "benchmarks/results/streaming.png"
    work = Path(tempfile.mkdtemp(prefix="bench_stream_"))
    try:
        store = work / "set.zarr"
        if args.first_batch:
            make_store(store, 8, 4096, 64, 32)
            say_first_batch(store, args.repeat)
            return
        make_store(store, args.chunks, 4096, 64, 32)
        # Write the new store's pages to disk before timing anything: otherwise the
        # kernel's writeback of a GB of dirty pages runs beside the first timed runs.
        os.sync()
        ds = pipeline.open(store)
        x = ds["train"]["x"]
        ratio = x.nbytes / x.nbytes_stored()
        print(f"store: {x.shape} float32, chunks {x.chunks}, blosc lz4 + shuffle, {x.nbytes / 1e9:.2f} GB "
              f"({ratio:.2f}x compression), {os.cpu_count()} cores")
        s = pipeline.stream(str(store), batch_size=args.batch, buffer_chunks=4, seed=0)
        # The first epoch also allocates the stream's group buffers (first-touch page
        # faults, slow on this VM): reported apart, the comparison is of later epochs,
        # as a training run of many epochs sees them.
        first = stream_epoch(s, 0)
        epochs = iter(range(1, 10**6, args.epochs))
        warm = np.ones(x.shape, dtype=x.dtype)  # mapped and written once: no page faults while timed
        # The decode limits run as many passes as the stream runs epochs: runs of equal
        # length are compared. The goal's comparison is two readers in turns by
        # themselves, so that neither follows the other more often (see interleaved:
        # with the mapped limit as a third, the stream always ran second, right after a
        # decode, and lost about 5% to it). The mapped limit, zarr and the decode into a
        # new array (which faults in and frees a whole array every run, work the kernel
        # partly does after the run has ended) run in turns with the stream afterwards.
        cpu: dict[str, list[tuple[float, float]]] = {}
        runs = interleaved(args.repeat, cpu=cpu, fns={
            "decode": lambda: bench_decode(store, warm, passes=args.epochs),
            "stream": lambda: stream_epoch(s, next(epochs), args.epochs)})
        others_cpu: dict[str, list[tuple[float, float]]] = {}
        others = interleaved(args.repeat, cpu=others_cpu, fns={
            "mapped": lambda: bench_decode(store, warm, mapped=True, passes=args.epochs),
            "stream": lambda: stream_epoch(s, next(epochs), args.epochs),
            "zarr": lambda: bench_zarr(store),
            "cold": lambda: bench_decode(store)})
        cpu["mapped"] = others_cpu["mapped"]
        quality = s.quality()
        results = {k: float(np.median(v)) for k, v in runs.items()}
        results.update({k: float(np.median(others[k])) for k in ("mapped", "zarr", "cold")})
        paired = {"decode": float(np.median(np.divide(runs["stream"], runs["decode"])))}
        paired.update({k: float(np.median(np.divide(others["stream"], others[k]))) for k in ("mapped", "zarr", "cold")})
        results["random"] = bench_random(store, args.batch, args.budget)
        n_small = min(x.shape[0], 16384 if not args.quick else 4096)
        results["wds"] = bench_wds(store, work, args.batch, args.budget, n_small)
        results["npy"] = bench_npy(store, work, args.batch, n_small)
        labels = {
            "stream": "pipeline.stream (shuffled, buffer 4 chunks)",
            "decode": "raw decode limit (numcodecs, all cores, in order)",
            "mapped": "the same, chunk files mapped instead of read",
            "cold": "the same, read into a new array (first-touch page faults)",
            "zarr": "zarr array API, in order",
            "random": "per-batch random indexing",
            "wds": "webdataset, shuffle buffer 1000",
            "npy": "torch DataLoader, one .npy per batch",
        }
        for k in ("stream", "decode", "mapped", "cold", "zarr", "random", "wds", "npy"):
            print(f"  {labels[k]:<52} {results[k]:8.3f} GB/s")
        print(f"(medians of {args.repeat} runs; ratios are medians of side-by-side runs; the stream's first "
              f"epoch, which allocates its buffers, ran at {first:.3f} GB/s)")
        r = results["stream"]
        print(f"stream / decode limit: {paired['decode']:.2f}x (goal >= 0.8x; runs: "
              + ", ".join(f"{a / b:.2f}" for a, b in zip(runs["stream"], runs["decode"])) + ")")
        print(f"stream / decode limit with mapped files: {paired['mapped']:.2f}x (the streamer maps them too)")
        # Where the time goes: the stream decodes what the limit decodes, then copies
        # every sample once more into its batch; and how busy it keeps the cores.
        print("CPU per GB (core-s, user + system) and cores busy, medians: " + "; ".join(
            f"{k} {np.median([c for c, _ in cpu[k]]):.3f} core-s/GB, {np.median([b for _, b in cpu[k]]):.2f} cores"
            for k in ("stream", "decode", "mapped")))
        print(f"stream / decode into a new array: {paired['cold']:.2f}x")
        print(f"stream / zarr API:     {paired['zarr']:.2f}x (goal >= 3x)")
        print(f"stream / random index: {r / results['random']:.0f}x")
        print(f"stream / webdataset:   {r / results['wds']:.0f}x (goal >= 50x)")
        print(f"stream / npy files:    {r / results['npy']:.2f}x")
        print(f"shuffle quality: {quality['mean_distinct_chunks_per_batch']:.2f} distinct chunks per batch, "
              f"Spearman(position, index) = {quality['spearman_position_vs_index']:+.3f}")
        w = wait_fraction(store, args.batch, 0.005)
        print(f"data-wait fraction with a 5 ms step over {w['epochs']} epochs ({w['batches']} batches): "
              f"{w['running']:.2%} once running (goal < 1%), median {w['median_us']:.0f} us per batch; "
              f"{w['whole']:.2%} counting the cold start (the run's first batch, which has no earlier step to "
              f"hide its read behind). The same loop over a list of ready batches: {w['floor']:.2%}, median "
              f"{w['floor_median_us']:.0f} us (the floor of any Python iterator here)")
        say_first_batch(store, args.repeat)
        plot(results, labels, args.png)
        print(f"chart: {args.png}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def plot(results: dict, labels: dict, png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(results, key=results.get)
    fig, ax = plt.subplots(figsize=(8, 3.6))
    bars = ax.barh([labels[k] for k in keys], [results[k] for k in keys],
                   color=["#d62728" if k == "stream" else "#7f7f7f" for k in keys])
    ax.set_xscale("log")
    ax.set_xlabel("GB/s (log scale)")
    ax.bar_label(bars, fmt="%.3f", padding=3, fontsize=8)
    ax.set_title("Reading a 64x32 float32 training set, 2 cores")
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
