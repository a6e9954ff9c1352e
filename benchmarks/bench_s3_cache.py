"""Streaming a store on S3 through the node-local chunk cache, against the same store on local disk.

    python benchmarks/bench_s3_cache.py                # a 1.07 GB store, chunks of 4096 x 64 x 32 float32
    python benchmarks/bench_s3_cache.py --quick        # a 268 MB store, 2 turns: about a minute
    python benchmarks/bench_s3_cache.py --chunk 256    # chunks of 2 MiB: the requests' latency weighs more

The store (bench_streaming.py's: blosc lz4 with byte shuffle) is written to local disk
and copied to an S3-protocol server on loopback (moto, in a process of its own), which
the streams reach through a TCP proxy (also a process of its own) that holds every
request back ``--latency-ms`` (20 ms) before passing it on, as a network to an object
store in another building would.

Settings, each a fresh stream timed epoch by epoch (``set_epoch``, epochs back to back
as a training loop runs them), each run right after the same stream on local disk with
the store in the page cache (the reference: their epoch k against its epoch k):
  cached    ``cache_dir`` with a budget larger than the store, empty at the start: epoch
            0 fetches everything, later epochs read the cache (3 epochs)
  budget    the same with a budget of half the store's bytes: evictions all along
  cached_s3fs  the first epoch of ``cached`` with the cache fetching through s3fs, as
            it did before it used obstore (the baseline of that change)
  uncached  S3 with no cache (one epoch: every epoch costs the same)
  cold      the store on local disk, its files dropped from the page cache first
  fetch     the fetch limit: every chunk object fetched once through the proxy, 16
            requests in flight, nothing decoded or cached (GB/s of the decoded store),
            by the client the cache fetches with (obstore); ``fetch_s3fs`` by s3fs
The S3 server, the proxy and the stream share this machine's cores: on a small machine
the server's and the proxy's work (and the S3 client's) bound the first epoch, which
the fetch limit shows. One untimed epoch first pays the S3 client's first use. Ratios
are medians of the ratios of runs made side by side. GB/s counts the batches' decoded
bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import pipeline  # noqa: E402
from bench_streaming import make_store  # noqa: E402

BUCKET = "bench"
KEY, SECRET = "testing", "testing"

# The loopback S3 server, in its own process. moto looks its own package directory up on
# every request (a listdir and a stat per service, 5 ms); the server caches that answer,
# work a real object store does not make the reader's machine do either.
_SERVER = """
import functools, logging, sys, time
logging.getLogger("werkzeug").setLevel(logging.ERROR)
from moto import backends
backends.list_of_moto_modules = functools.lru_cache(maxsize=None)(backends.list_of_moto_modules)
from moto.server import ThreadedMotoServer
ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False).start()
while True:
    time.sleep(3600)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


# -- the latency proxy --------------------------------------------------------------------


def _pipe(src: socket.socket, dst: socket.socket, delay: float, state: dict, requests: bool) -> None:
    """Forward bytes from ``src`` to ``dst``. Client to server (``requests``): a request's
    first bytes wait ``delay`` seconds; the server's answer marks the next bytes from the
    client as a new request (HTTP/1.1 clients send one request at a time). The bytes go
    through a pipe by ``splice`` and never into this process: a network costs the reader's
    machine no CPU, and a proxy copying every byte through user space took 0.4 core-s per
    GB of the 2 cores it shares with the stream (0.15 this way)."""
    r, w = os.pipe()
    try:
        import fcntl

        fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
    except OSError:
        pass
    try:
        while True:
            n = os.splice(src.fileno(), w, 1 << 20)
            if not n:
                break
            if requests and state["new_request"]:
                state["new_request"] = False
                time.sleep(delay)
            elif not requests:
                state["new_request"] = True
            while n:
                n -= os.splice(r, dst.fileno(), n)
    except OSError:
        pass
    finally:
        os.close(r)
        os.close(w)
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def run_proxy(listen_port: int, upstream_port: int, delay: float) -> None:
    """A TCP proxy: a thread per connection and direction; every request held back ``delay`` s."""
    server = socket.create_server(("127.0.0.1", listen_port), backlog=256)
    while True:
        client, _ = server.accept()
        upstream = socket.create_connection(("127.0.0.1", upstream_port))
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state = {"new_request": True}
        threading.Thread(target=_pipe, args=(client, upstream, delay, state, True), daemon=True).start()
        threading.Thread(target=_pipe, args=(upstream, client, delay, state, False), daemon=True).start()


# -- measuring ----------------------------------------------------------------------------


def epochs(s: "pipeline.Stream", n: int) -> list[float]:
    """GB/s of each of ``n`` epochs back to back (the next epoch's first group is read
    during the last group of the one before, as in training); nothing is read ahead
    after the last."""
    out = []
    for e in range(n):
        s.set_epoch(e)
        nbytes = 0
        t0 = time.perf_counter()
        for xb, yb in s:
            nbytes += xb.nbytes + yb.nbytes
        out.append(nbytes / (time.perf_counter() - t0) / 1e9)
    s.stop_read_ahead()
    return out


def drop_from_page_cache(path: Path) -> None:
    """Evict the store's files (only them) from the page cache, so that they are read from disk."""
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def fetch_limit(url: str, opts: dict, keys: list[str], decoded: int, client: str) -> float:
    """Every chunk object fetched once through the proxy, as many requests in flight as
    the cache keeps, nothing decoded or written: the fastest any stream of the store
    could go over this network, in decoded GB/s. ``client``: ``"cache"``, the client
    the cache fetches with (obstore), or ``"s3fs"``."""
    import asyncio

    import zarr
    from zarr.core.sync import _get_loop

    from pipeline.streaming.cache import FETCH_REQUESTS
    from pipeline.streaming.fetch import FsspecFetcher, fetcher_for

    store = zarr.storage.FsspecStore.from_url(url, storage_options=opts)
    fetcher = (fetcher_for(store.fs, store.path, opts) if client == "cache"
               else FsspecFetcher(store.fs, store.path))
    paths = [k.removeprefix(store.path.strip("/") + "/") for k in keys]

    async def run() -> None:
        gate = asyncio.Semaphore(FETCH_REQUESTS)

        async def one(path: str) -> None:
            async with gate:
                await fetcher.get(path)

        await asyncio.gather(*(one(p) for p in paths))

    t0 = time.perf_counter()
    asyncio.run_coroutine_threadsafe(run(), _get_loop()).result()
    return decoded / (time.perf_counter() - t0) / 1e9


@contextlib.contextmanager
def s3fs_only():
    """The cache fetches through s3fs, as it did before obstore (the baseline)."""
    from pipeline.streaming import fetch

    saved = fetch.obstore_config
    fetch.obstore_config = lambda *a, **k: None
    try:
        yield
    finally:
        fetch.obstore_config = saved


LABELS = {"cached": "cache, budget > store", "budget": "cache, budget = store / 2",
          "cached_s3fs": "cache fetching through s3fs (before obstore)", "uncached": "no cache",
          "fetch": "fetch limit: GETs only, 16 in flight", "fetch_s3fs": "fetch limit through s3fs",
          "cold": "local disk, page cache dropped"}


def measure(args: argparse.Namespace, work: Path, local: Path, url: str, opts: dict, store_bytes: int,
            keys: list[str]) -> dict:
    """Every setting, each run right after a run of the local reference (page cache
    warm): ``{setting: [(run, local run)]}``, a run being a list of ``(GB/s, stats or
    None)`` per epoch."""
    kw = dict(batch_size=args.batch, buffer_chunks=args.buffer_chunks, seed=0)

    def remote(budget: int | None, n: int, s3fs: bool = False) -> list:
        if s3fs:
            with s3fs_only():
                return remote(budget, n)
        cache = work / "cache"
        shutil.rmtree(cache, ignore_errors=True)  # every run starts with an empty cache
        extra = {} if budget is None else {"cache_dir": cache, "cache_bytes": budget}
        s = pipeline.stream(url, storage_options=opts, **kw, **extra)
        rates = epochs(s, n)
        stats = [s.cache_stats(e) for e in range(n)]
        s.close()
        return list(zip(rates, stats))

    def reference(n: int, cold: bool = False) -> list:
        if cold:
            drop_from_page_cache(local)
        s = pipeline.stream(str(local), **kw)
        out = [(r, None) for r in epochs(s, n)]
        s.close()
        return out

    decoded = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in zarr_arrays(local))
    settings = {"cached": lambda: remote(4 * store_bytes, args.epochs),
                "budget": lambda: remote(store_bytes // 2, args.epochs),
                "cached_s3fs": lambda: remote(4 * store_bytes, 1, s3fs=True),
                "uncached": lambda: remote(None, 1),
                "cold": lambda: reference(1, cold=True),
                "fetch": lambda: [(fetch_limit(url, opts, keys, decoded, "cache"), None)],
                "fetch_s3fs": lambda: [(fetch_limit(url, opts, keys, decoded, "s3fs"), None)]}
    remote(4 * store_bytes, 1)  # untimed: the S3 clients' first use (sessions, connections)
    remote(4 * store_bytes, 1, s3fs=True)
    out: dict[str, list] = {k: [] for k in settings}
    for turn in range(args.turns):
        # The order turns round every other time: a run slows whatever runs next a little.
        for name in list(settings) if turn % 2 == 0 else list(settings)[::-1]:
            ref = reference(args.epochs if name in ("cached", "budget") else 1)
            run = settings[name]()
            out[name].append((run, ref))
            print(f"  turn {turn}: {name:8s} " + "  ".join(f"{r:.2f}" for r, _ in run)
                  + " GB/s (local " + "  ".join(f"{r:.2f}" for r, _ in ref) + ")", flush=True)
    return out


def zarr_arrays(local: Path) -> list:
    import zarr

    group = zarr.open_group(str(local), mode="r")
    return [group["train/x"], group["train/y"]]


def table(runs: dict) -> list[tuple]:
    """Rows of (setting, GB/s, ratio to local disk, the ratios, ratio to local disk with
    the page cache dropped (the run of the same turn), hit rate, bytes fetched)."""
    rows = []
    cold = [run[0][0] for run, _ in runs["cold"]]
    for name, label in LABELS.items():
        pairs = runs[name]
        for e in range(len(pairs[0][0])):
            ratios = [run[e][0] / ref[e][0] for run, ref in pairs]
            to_cold = float(np.median([run[e][0] / c for (run, _), c in zip(pairs, cold)]))
            stats = [run[e][1] for run, _ in pairs]
            known = stats[0] is not None
            hit = float(np.median([st.hit_rate for st in stats])) if known else float("nan")
            fetched = float(np.median([st.bytes_fetched for st in stats])) if known else float("nan")
            epoch = f", epoch {e}" if name in ("cached", "budget") else ""
            rows.append((label + epoch, float(np.median([run[e][0] for run, _ in pairs])),
                         float(np.median(ratios)), ratios, to_cold, hit, fetched))
    refs = [ref for pairs in runs.values() for _, ref in pairs]
    for e in range(max(len(r) for r in refs)):
        rows.append((f"local disk, page cache warm, epoch {e}",
                     float(np.median([ref[e][0] for ref in refs if len(ref) > e])), 1.0, [], float("nan"),
                     float("nan"), float("nan")))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a 268 MB store and 2 turns: about a minute")
    parser.add_argument("--samples", type=int, default=32 * 4096, help="samples of 64 x 32 float32 (1.07 GB)")
    parser.add_argument("--chunk", type=int, default=4096, help="samples per chunk")
    parser.add_argument("--turns", type=int, default=3, help="runs of each cached setting (medians reported)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--buffer-chunks", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=20.0, help="added to every request by the proxy")
    parser.add_argument("--store", default=None, help="stream this local pipeline store instead of writing one")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.turns = 8 * 4096, 2

    import multiprocessing

    import boto3
    import s3fs

    work = Path(tempfile.mkdtemp(prefix="bench_s3_cache_"))
    server = proxy = None
    try:
        local = Path(args.store) if args.store else work / "set.zarr"
        if not args.store:
            make_store(local, args.samples // args.chunk, args.chunk, 64, 32)
        store_bytes = sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
        os.sync()
        s3_port, proxy_port = free_port(), free_port()
        server = subprocess.Popen([sys.executable, "-c", _SERVER, str(s3_port)], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        wait_for_port(s3_port)
        direct = f"http://127.0.0.1:{s3_port}"
        boto3.client("s3", endpoint_url=direct, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, client_kwargs={"endpoint_url": direct})
        fs.put(str(local), f"{BUCKET}/set.zarr", recursive=True)
        proxy = multiprocessing.get_context("spawn").Process(
            target=run_proxy, args=(proxy_port, s3_port, args.latency_ms / 1000), daemon=True)
        proxy.start()
        wait_for_port(proxy_port)
        opts = {"key": KEY, "secret": SECRET, "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{proxy_port}"}}
        url = f"s3://{BUCKET}/set.zarr"
        shape = "" if args.store else (f" ({args.samples // args.chunk} chunks of {args.chunk} x 64 x 32 float32, "
                                       "blosc lz4 + shuffle)")
        print(f"store: {store_bytes / 1e9:.2f} GB on disk{shape}, {args.latency_ms:g} ms added to every request; "
              f"batch {args.batch}, "
              f"buffer_chunks {args.buffer_chunks}; {os.cpu_count()} cores", flush=True)
        keys = [k for k in fs.find(f"{BUCKET}/set.zarr") if "/c/" in k and "/_" not in k]
        print_table(table(measure(args, work, local, url, opts, store_bytes, keys)))
    finally:
        if proxy is not None:
            proxy.terminate()
        if server is not None:
            server.terminate()
            server.wait()
        shutil.rmtree(work, ignore_errors=True)


def print_table(rows: list[tuple]) -> None:
    print()
    print("| setting | GB/s | ratio to local disk | to local disk, page cache dropped | hit rate | bytes fetched |")
    print("|---|---|---|---|---|---|")
    for name, rate, ratio, ratios, to_cold, hit, fetched in rows:
        runs = f" (runs {', '.join(f'{r:.2f}' for r in ratios)})" if ratios else ""
        cold_s = "" if np.isnan(to_cold) else f"{to_cold:.2f}x"
        hit_s = "" if np.isnan(hit) else f"{hit:.1%}"
        fetched_s = "" if np.isnan(fetched) else f"{fetched / 1e9:.2f} GB"
        print(f"| {name} | {rate:.2f} | {ratio:.2f}x{runs} | {cold_s} | {hit_s} | {fetched_s} |")


if __name__ == "__main__":
    main()
