"""Store versions (issue #19): icechunk as the versioning engine, against the pipeline store.

    python benchmarks/bench_versions.py            # ~1.07 GB of windows (131,072 x 64 x 32 float32)
    python benchmarks/bench_versions.py --quick    # ~200 MB (24,576 samples), to check the script

Needs icechunk (``pip install icechunk``; 1.x on Python 3.11, 2.x needs Python >= 3.12).
All in one process, on the same data:
  store    ``pipeline.write`` of the windows, chunks and codec as the package chooses them
  copy     the same arrays, with the same chunk shapes, shards, filters and compressors
           (read from the source arrays' metadata) and the same attributes, in an icechunk
           repository on local disk, one commit
  stream   ``pipeline.stream(..., batch_size=256, buffer_chunks=4, seed=0)``, one whole
           shuffled epoch per run (every sample checked to be served exactly once), over
           (a) the pipeline store by path and (b) the icechunk repository's snapshot opened
           read-only as a zarr group; (c) the raw decode limit of bench_streaming.py: every
           chunk of x read and decoded by numcodecs on all cores into a preallocated array
  append   one chunk's worth of samples appended and committed: icechunk (resize, write,
           commit) against plain zarr (resize, write, a version record in the root
           attributes, the own scheme's commit point)
  crash    a writer killed before its commit, for each engine: what a reader sees after
  plain    whether ``zarr.open_group`` reads the icechunk directory without icechunk
Readers run in turns (a, b, c, c, b, a, a, b, c), best of ``--repeat`` runs each; GB/s
counts the bytes of x served (or decoded, for the limit).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import zarr

import pipeline
from bench_streaming import bench_decode, interleaved

SIZE, WIDTH = 64, 32


def make_windows(n: int) -> tuple[Any, np.ndarray]:
    """Materialized windows of 64 steps of a 32-feature series (``pipeline.windows``,
    stride 1, lazily; smooth random walks plus a little noise, like order-book features)
    and labels that are the sample's index."""
    rng = np.random.default_rng(0)
    steps = n + SIZE - 1
    f = np.cumsum(rng.standard_normal((steps, WIDTH)).astype(np.float32), axis=0)
    f += 0.1 * rng.standard_normal((steps, WIDTH)).astype(np.float32)
    return pipeline.windows(f, size=SIZE), np.arange(n, dtype=np.int64)


def copy_to_icechunk(src_path: Path, repo_path: Path) -> tuple[Any, str, float]:
    """Every group and array of the pipeline store, with its attributes, chunk shapes,
    shards, filters, serializer and compressors, into a new icechunk repository; one
    commit. Returns the repository, the snapshot id and the seconds the copy took."""
    import icechunk

    t0 = time.perf_counter()
    src = zarr.open_group(str(src_path), mode="r")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(repo_path)))
    session = repo.writable_session("main")
    root = zarr.open_group(session.store, mode="w", attributes=dict(src.attrs))
    for path, node in sorted(src.members(max_depth=None), key=lambda m: m[0].count("/")):
        if isinstance(node, zarr.Group):
            root.create_group(path, attributes=dict(node.attrs))
            continue
        dst = zarr.create_array(
            store=session.store, name=path, shape=node.shape, dtype=node.dtype, chunks=node.chunks,
            shards=node.shards, filters=node.filters, serializer=node.serializer,
            compressors=node.compressors, fill_value=node.fill_value, attributes=dict(node.attrs),
            dimension_names=node.metadata.dimension_names, zarr_format=3)
        got, want = dst.metadata.to_dict(), node.metadata.to_dict()
        assert got["codecs"] == want["codecs"], (path, got["codecs"], want["codecs"])
        assert got["chunk_grid"] == want["chunk_grid"], (path, got["chunk_grid"], want["chunk_grid"])
        if node.ndim == 0:
            dst[()] = node[()]
            continue
        block = 8 * (node.shards or node.chunks)[0]  # whole chunks (or shards) at a time
        for i in range(0, node.shape[0], block):
            dst[i : i + block] = node[i : i + block]
    snapshot = session.commit("copy of the pipeline store")
    return repo, snapshot, time.perf_counter() - t0


def stream_epoch(s: pipeline.Stream, epoch: int, n: int) -> float:
    """One whole shuffled epoch in GB/s of x; every sample must be served once."""
    s.stop_read_ahead()
    seen = np.zeros(n, dtype=np.int32)
    nbytes = count = 0
    t0 = time.perf_counter()
    s.set_epoch(epoch)
    for xb, yb in s:
        nbytes += xb.nbytes
        count += len(yb)
        seen[yb] += 1  # the labels are sample indices, unique within a batch
    dt = time.perf_counter() - t0
    s.stop_read_ahead()
    assert count == n and bool((seen == 1).all()), f"served {count} samples, {int((seen != 1).sum())} not once"
    return nbytes / dt / 1e9


def fast_path(s: pipeline.Stream) -> str:
    """How the streamer reads x from this source (see pipeline.streaming.chunks.ChunkReader)."""
    r = s.source.readers["x"]
    decoder = type(r._decoder).__name__ if r._decoder is not None else None
    if decoder is None:
        return "zarr's array API (no fast decode)"
    how = "chunk files mapped from disk" if r._root is not None and r.maps is not None else (
        "chunk files read from disk" if r._root is not None else "chunk bytes fetched through the zarr store API")
    return f"fast {decoder} decode, {how}"


def fetch_us(group: zarr.Group, n_chunks: int) -> float:
    """Microseconds per chunk to fetch x's stored bytes through the zarr store API, one
    chunk after another (no decode): what a read costs each engine before decoding."""
    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.sync import sync

    arr = group["train/x"]
    store, prefix = arr.store_path.store, arr.store_path.path
    keys = [f"{prefix}/c/{i}/0/0" for i in range(n_chunks)]
    t0 = time.perf_counter()
    for key in keys:
        assert sync(store.get(key, prototype=default_buffer_prototype())) is not None, key
    return 1e6 * (time.perf_counter() - t0) / n_chunks


def append_icechunk(repo: Any, x_new: np.ndarray, y_new: np.ndarray) -> float:
    t0 = time.perf_counter()
    session = repo.writable_session("main")
    g = zarr.open_group(session.store, mode="r+")
    x, y = g["train/x"], g["train/y"]
    n = x.shape[0]
    x.resize((n + len(x_new),) + x.shape[1:])
    y.resize((n + len(y_new),))
    x[n:] = x_new
    y[n:] = y_new
    session.commit(f"append {len(x_new)} samples")
    return time.perf_counter() - t0


def append_zarr(path: Path, x_new: np.ndarray, y_new: np.ndarray) -> float:
    """The own scheme's append as plain zarr does it: grow the arrays (new samples after
    the old ones; the last partial chunk rewritten, by temp file and rename), then a
    version record in the root attributes, the commit point."""
    t0 = time.perf_counter()
    g = zarr.open_group(str(path), mode="r+")
    x, y = g["train/x"], g["train/y"]
    n = x.shape[0]
    x.resize((n + len(x_new),) + x.shape[1:])
    y.resize((n + len(y_new),))
    x[n:] = x_new
    y[n:] = y_new
    meta = dict(g.attrs["pipeline"])
    versions = list(meta.get("bench_versions", []))
    versions.append({"version": len(versions) + 1, "samples": {"train": n + len(x_new)}})
    meta["bench_versions"] = versions
    g.attrs["pipeline"] = meta
    return time.perf_counter() - t0


_KILLED_WRITER = """
import os, signal, sys
import numpy as np, zarr
engine, where, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
if engine == "icechunk":
    import icechunk
    repo = icechunk.Repository.open(icechunk.local_filesystem_storage(where))
    session = repo.writable_session("main")
    g = zarr.open_group(session.store, mode="r+")
else:
    g = zarr.open_group(where, mode="r+")
x = g["train/x"]
n = x.shape[0]
x.resize((n + k,) + x.shape[1:])
x[n:] = np.full((k,) + x.shape[1:], 7, dtype=x.dtype)
os.kill(os.getpid(), signal.SIGKILL)  # killed after writing, before its commit
"""


def killed_writer(engine: str, where: Path, k: int) -> int:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_KILLED_WRITER), engine, str(where), str(k)],
                          capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])
    return proc.returncode


def n_files(d: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(d))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~200 MB instead of ~1 GB")
    parser.add_argument("--samples", type=int, default=131072, help="windows of 64 x 32 float32 (131072 = 1.07 GB)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each reader (best reported)")
    parser.add_argument("--keep", action="store_true", help="keep the store and repository (path printed)")
    parser.add_argument("--appends", type=int, default=3, help="appends timed per engine")
    args = parser.parse_args()
    if args.quick:
        args.samples = 24576
    try:
        import icechunk
    except ImportError:
        sys.exit("bench_versions.py needs icechunk: pip install icechunk (1.x on Python 3.11; 2.x needs 3.12)")

    # icechunk logs, once per repository opened on local disk: "The LocalFileSystem
    # storage is not safe for concurrent commits" (printed below, once).
    if hasattr(icechunk, "set_logs_filter"):
        icechunk.set_logs_filter("error")
    work = Path(tempfile.mkdtemp(prefix="bench_versions_"))
    try:
        store, repo_path = work / "set.zarr", work / "set.icechunk"
        x, y = make_windows(args.samples)
        t0 = time.perf_counter()
        pipeline.write(store, {"x": x, "y": y}, progress=False)
        t_write = time.perf_counter() - t0
        del x, y
        if args.keep:
            print(f"keeping {work}")
        repo, snapshot, t_copy = copy_to_icechunk(store, repo_path)
        os.sync()  # no writeback of the new files beside the timed runs
        src = zarr.open_group(str(store), mode="r")
        ax = src["train/x"]
        n, c = ax.shape[0], ax.chunks[0]
        codec = ax.metadata.to_dict()["codecs"]
        print(f"icechunk {icechunk.__version__}, zarr {zarr.__version__}, {os.cpu_count()} cores (icechunk warns, "
              "silenced here: 'The LocalFileSystem storage is not safe for concurrent commits')")
        print(f"store: x {ax.shape} {ax.dtype}, chunks {ax.chunks}, shards {ax.shards}, "
              f"compressors {[type(k).__name__ for k in ax.compressors]}, {ax.nbytes / 1e9:.2f} GB "
              f"({ax.nbytes / ax.nbytes_stored():.2f}x compression); pipeline.write {t_write:.1f} s")
        ic_bytes = sum(f.stat().st_size for f in repo_path.rglob("*") if f.is_file())
        st_bytes = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
        print(f"icechunk copy: {t_copy:.1f} s, snapshot {snapshot}, {ic_bytes / 1e9:.3f} GB on disk "
              f"({n_files(repo_path)} files) against {st_bytes / 1e9:.3f} GB ({n_files(store)} files); "
              f"codecs and chunk grid checked equal: {codec}")

        ic_group = zarr.open_group(repo.readonly_session("main").store, mode="r")
        s_a = pipeline.stream(str(store), split="train", batch_size=256, buffer_chunks=4, seed=0)
        s_b = pipeline.stream(ic_group, split="train", batch_size=256, buffer_chunks=4, seed=0)
        print(f"streamer reads (a) by {fast_path(s_a)}; (b) by {fast_path(s_b)}")
        # One untimed epoch each: the streams allocate their buffers, the files are cached.
        first = {"a": stream_epoch(s_a, 0, n), "b": stream_epoch(s_b, 0, n)}
        x_bytes = ax.nbytes
        y_bytes = src["train/y"].nbytes
        warm = np.ones(ax.shape, dtype=ax.dtype)  # mapped and written once, as bench_streaming does
        use_decode = ax.shards is None and [k["name"] for k in codec] == ["bytes", "blosc"]
        assert use_decode, "bench_streaming.bench_decode reads unsharded blosc chunk files"
        epochs = iter(range(1, 10**6))
        runs = interleaved(args.repeat, fns={
            "a": lambda: stream_epoch(s_a, next(epochs), n),
            "b": lambda: stream_epoch(s_b, next(epochs), n),
            # bench_decode counts x and y; the limit here is of x alone (same time).
            "c": lambda: bench_decode(store, warm) * x_bytes / (x_bytes + y_bytes)})
        best = {k: max(v) for k, v in runs.items()}
        labels = {"a": "(a) pipeline.stream, pipeline store by path",
                  "b": "(b) pipeline.stream, icechunk snapshot (read-only session)",
                  "c": "(c) raw decode limit (numcodecs, all cores, in order)"}
        print(f"\nreader (best of {args.repeat}, GB/s of x)                       GB/s   runs")
        for k in "abc":
            print(f"  {labels[k]:<60} {best[k]:6.3f}   " + ", ".join(f"{r:.3f}" for r in runs[k]))
        print(f"  first (untimed) epochs: (a) {first['a']:.3f}, (b) {first['b']:.3f} GB/s")
        print(f"  (b)/(a) = {best['b'] / best['a']:.2f}x   (a)/(c) = {best['a'] / best['c']:.2f}x   "
              f"(b)/(c) = {best['b'] / best['c']:.2f}x")
        s_a.close()
        s_b.close()
        n_chunks = -(-n // c)
        fetch = {"zarr": min(fetch_us(src, n_chunks) for _ in range(3)),
                 "icechunk": min(fetch_us(ic_group, n_chunks) for _ in range(3))}
        print(f"  stored bytes of one chunk of x fetched through the zarr store API, in turn (best of 3): "
              f"LocalStore {fetch['zarr']:.0f} us, icechunk {fetch['icechunk']:.0f} us per chunk "
              f"({ax.nbytes_stored() / n_chunks / 1e6:.2f} MB stored, {c * SIZE * WIDTH * 4 / 1e6:.1f} MB decoded)")

        # Appends: one chunk's worth of new samples each (the first also fills the last
        # partial chunk, if there is one), committed; the engines in turns.
        rng = np.random.default_rng(1)
        x_new = rng.standard_normal((c, SIZE, WIDTH)).astype(np.float32)
        times: dict[str, list[float]] = {"icechunk": [], "zarr": []}
        for i in range(args.appends):
            y_new = np.arange(n + i * c, n + (i + 1) * c, dtype=np.int64)
            order = ["icechunk", "zarr"] if i % 2 == 0 else ["zarr", "icechunk"]
            for e in order:
                times[e].append(append_icechunk(repo, x_new, y_new) if e == "icechunk"
                                else append_zarr(store, x_new, y_new))
        print(f"\nappend of {c} samples ({x_new.nbytes / 1e6:.1f} MB of x) + commit, {args.appends} times: "
              + "; ".join(f"{e} best {1e3 * min(t):.1f} ms, median {1e3 * float(np.median(t)):.1f} ms"
                          for e, t in times.items())
              + f"; icechunk / zarr (best): {min(times['icechunk']) / min(times['zarr']):.2f}x")
        g = zarr.open_group(repo.readonly_session("main").store, mode="r")
        assert g["train/x"].shape[0] == n + args.appends * c
        assert (g["train/y"][n:] == np.arange(n, n + args.appends * c)).all()

        # A writer killed after writing its chunks, before its commit.
        k = c
        before_snap = repo.lookup_branch("main")
        before_files = n_files(repo_path / "chunks")
        killed_writer("icechunk", repo_path, k)
        repo2 = icechunk.Repository.open(icechunk.local_filesystem_storage(str(repo_path)))
        after = zarr.open_group(repo2.readonly_session("main").store, mode="r")["train/x"]
        print(f"\nkilled icechunk writer (SIGKILL after resize + writing {k} samples, before commit): branch main "
              f"{'unchanged' if repo2.lookup_branch('main') == before_snap else 'CHANGED'}, x has "
              f"{after.shape[0]} samples (committed: {n + args.appends * c}); "
              f"{n_files(repo_path / 'chunks') - before_files} orphan chunk files left in chunks/ "
              f"(referenced by no snapshot; Repository.garbage_collect removes them)")
        committed = n + args.appends * c
        killed_writer("zarr", store, k)
        gz = zarr.open_group(str(store), mode="r")
        record = gz.attrs["pipeline"]["bench_versions"][-1]["samples"]["train"]
        shown = gz["train/x"].shape[0]
        print(f"killed plain-zarr writer (same): zarr.json of x says {shown} samples, the last version record "
              f"{record} (committed: {committed}); a reader that slices to its version's count sees "
              f"{'the committed data only' if record == committed else 'WRONG DATA'}; one that trusts the "
              f"array's shape sees {shown - record} uncommitted samples")

        # Plain zarr on the icechunk directory.
        top = sorted(p.name for p in repo_path.iterdir())
        try:
            gz = zarr.open_group(str(repo_path), mode="r")
            print(f"\nplain zarr.open_group on the icechunk directory: opened?! members {list(gz)}")
        except Exception as exc:  # noqa: BLE001 - what happens is the finding
            print(f"\nplain zarr.open_group(icechunk directory, mode='r'): {type(exc).__name__}: {exc}")
        print(f"  the directory holds {top}: no zarr.json, chunks in files named by random ids "
              f"(zarr keys live only in icechunk's snapshot and manifest files)")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
