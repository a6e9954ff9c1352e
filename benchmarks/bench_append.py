"""Appending new sessions to a store (issue 19) against a from-scratch build of every session.

    python benchmarks/bench_append.py            # 2 instruments x 21 days x 50k rows
    python benchmarks/bench_append.py --quick    # 2 instruments x 21 days x 4k rows, a few minutes

Demo order-book data, one file per instrument and day, and ``configs/daily.yaml`` (date
splits; the new days fall in ``test``). Every timed run is ``pipeline run`` in a
subprocess, as a user runs it, on the same data and disk; all figures come from this one
invocation. Materialized and virtual stores (``windows.materialize``), each:

- full build: the 21 days from scratch;
- append: a store of the first ``21 - k`` days (built once, copied aside), the last
  ``k`` days added and ``pipeline run`` again (``k`` = 1 and 3 by default; the copy is
  restored before each). The appended store is checked against the full build (every
  array's bytes);
- fixed start-up of a run: ``pipeline run`` on the up-to-date store (interpreter,
  imports, config, the provenance check of every file: what an append does before its
  cluster starts) plus a fresh interpreter that starts the config's LocalCluster, has
  each worker import what a run's tasks import, and closes it (also shown without the
  workers' imports);
- these in ``--repeat`` turns (full build, each append, start-up), since the machine's
  speed drifts: times are medians, ratios the medians of the turns' ratios;
- the goal: append <= 2 x (k / 21) x full build + fixed start-up, in the same turn;
- old raw data read by the append, two ways:
  (a) inotify (IN_OPEN, IN_ACCESS) watches on every raw file during the timed appends:
  opens and read calls of each file by any process (the run, its workers, anything),
  whatever code opens it; memory-mapped reads would not show (nothing maps them);
  (b) bytes: the same append once more in this process, on an in-process cluster
  (threads), with fsspec's local file opener counting the bytes each read returns, per
  file (every loader reads raw files through ``fsspec.open``; (a) would show any other
  way in). That run also times the append's steps.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import select
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

BIN = Path(sys.executable).parent
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "daily.yaml"
DAYS = 21
INSTRUMENTS = ("AAA", "BBB")
_IN_ACCESS, _IN_OPEN = 0x1, 0x20
_EVENT = struct.Struct("iIII")


class FileWatch:
    """Counts opens and read calls of the given files by any process (inotify), from a
    background thread, while the block runs."""

    def __init__(self, paths: list[Path]):
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        self.files: dict[int, str] = {}
        for p in paths:
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(p), _IN_OPEN | _IN_ACCESS)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {p}")
            self.files[wd] = str(p)
        self.opens = dict.fromkeys(self.files.values(), 0)
        self.reads = dict.fromkeys(self.files.values(), 0)
        self._stop = threading.Event()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            pos = 0
            while pos < len(data):
                wd, mask, _, n = _EVENT.unpack_from(data, pos)
                pos += _EVENT.size + n
                path = self.files.get(wd)
                if path is not None:
                    self.opens[path] += bool(mask & _IN_OPEN)
                    self.reads[path] += bool(mask & _IN_ACCESS)

    def _run(self) -> None:
        while not self._stop.is_set():
            select.select([self.fd], [], [], 0.1)
            self._drain()

    def __enter__(self) -> "FileWatch":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self._drain()
        os.close(self.fd)


class CountReads:
    """Bytes returned by reads of files opened through fsspec's local filesystem in this
    process, per path (``fsspec.implementations.local`` opens them with ``open``)."""

    def __init__(self) -> None:
        self.bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> "CountReads":
        import fsspec.implementations.local as local

        counter = self

        class Counted:
            def __init__(self, f: Any, path: str):
                object.__setattr__(self, "_f", f)
                object.__setattr__(self, "_path", path)

            def _add(self, n: int) -> None:
                with counter._lock:
                    counter.bytes[self._path] = counter.bytes.get(self._path, 0) + n

            def read(self, *args: Any) -> Any:
                out = self._f.read(*args)
                self._add(len(out))
                return out

            def read1(self, *args: Any) -> Any:
                out = self._f.read1(*args)
                self._add(len(out))
                return out

            def readinto(self, b: Any) -> Any:
                n = self._f.readinto(b)
                self._add(n or 0)
                return n

            def readline(self, *args: Any) -> Any:
                out = self._f.readline(*args)
                self._add(len(out))
                return out

            def __getattr__(self, name: str) -> Any:
                return getattr(self._f, name)

            def __setattr__(self, name: str, value: Any) -> None:
                setattr(self._f, name, value)

            def __enter__(self) -> "Counted":
                return self

            def __exit__(self, *exc: Any) -> None:
                self._f.close()

            def __iter__(self) -> Any:
                return iter(self.readline, b"")

        def counted_open(path: Any, *args: Any, **kwargs: Any) -> Any:
            f = open(path, *args, **kwargs)
            mode = args[0] if args else kwargs.get("mode", "r")
            return Counted(f, str(path)) if "r" in mode and "b" in mode else f

        self._local = local
        local.open = counted_open  # the module's name shadows the builtin while set
        return self

    def __exit__(self, *exc: Any) -> None:
        del self._local.open


def config(raw: Path, out: Path, *, materialize: bool, days: list[str], cluster: dict | None = None) -> dict:
    cfg = yaml.safe_load(CONFIG.read_text())
    cfg["source"]["paths"] = f"{raw}/*/*.parquet"
    cfg["source"]["instrument"] = {"path": f"{raw}/{{instrument}}/*.parquet"}
    cfg["windows"]["materialize"] = materialize
    # Two thirds of the days train, then validation; the rest (and every appended day) test.
    cfg["output"]["splits"] = {"train": {"until": days[12]}, "val": {"until": days[15]}, "test": {}}
    cfg["output"]["path"] = str(out)
    if cluster is not None:
        cfg["cluster"] = cluster
    return cfg


def link_days(src: Path, dst: Path, days: list[str]) -> list[Path]:
    """Hard links to the days' files (same inode, size and mtime: the same files to a
    store's provenance)."""
    out = []
    for name in INSTRUMENTS:
        (dst / name).mkdir(parents=True, exist_ok=True)
        for day in days:
            target = dst / name / f"{day}.parquet"
            if not target.exists():
                os.link(src / name / f"{day}.parquet", target)
            out.append(target)
    return out


def cli(cfg_path: Path) -> tuple[float, str]:
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    t0 = time.perf_counter()
    done = subprocess.run([str(BIN / "pipeline"), "run", str(cfg_path), "--no-progress"], capture_output=True,
                          text=True, env=env)
    dt = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"pipeline run {cfg_path} failed:\n{done.stderr}")
    return dt, done.stdout


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


#: What a run's first tasks import on each worker (loaders, features, the writer).
WORKER_IMPORTS = ("pyarrow.parquet", "zarr", "pipeline.loaders.segments", "pipeline.loaders.tables",
                  "pipeline.features", "pipeline.storage.writer")


def cluster_startup(cfg_path: Path, *, imports: bool) -> float:
    """Seconds for a fresh interpreter to import the cluster module, start the config's
    LocalCluster (with ``imports``: and have every worker import what a run's tasks
    import), and close it."""
    run_imports = (f"        c.run(lambda: [__import__(m) for m in {WORKER_IMPORTS!r}])\n" if imports else
                   "        pass\n")
    code = ("from pipeline.config import load_config\nfrom pipeline.cluster import cluster\n"
            "from pipeline.job import _cluster_kwargs\n"
            "if __name__ == '__main__':\n"
            f"    with cluster(**_cluster_kwargs(load_config({str(cfg_path)!r})), log=None) as c:\n" + run_imports)
    env = {**os.environ, "KERAS_BACKEND": "torch"}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


class Breakdown:
    """Seconds spent in the steps of an append run in this process (functions wrapped
    with timers where ``pipeline.job.run`` and ``pipeline.update.build_append`` call
    them; nested steps count in their parent too)."""

    STEPS = (("pipeline.update", "stored_build"), ("pipeline.update", "new_files"),
             ("pipeline.cluster", "cluster"),
             ("pipeline.loaders.segments", "open_segmented"), ("pipeline.loaders.segments", "_first_times"),
             ("pipeline.features", "build_training_set"), ("pipeline.loaders.provenance", "with_hashes"),
             ("pipeline.storage.append", "append"))

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> "Breakdown":
        import contextlib
        import importlib

        for mod_name, name in self.STEPS:
            mod = importlib.import_module(mod_name)
            f = getattr(mod, name)
            self._saved.append((mod, name, f))
            if name == "cluster":  # a context manager: time its start and its close apart
                def timed_cm(*a: Any, _f: Any = f, **k: Any) -> Any:
                    @contextlib.contextmanager
                    def cm() -> Any:
                        t0 = time.perf_counter()
                        inner = _f(*a, **k)
                        value = inner.__enter__()
                        self._add("cluster start", time.perf_counter() - t0)
                        try:
                            yield value
                        finally:
                            t1 = time.perf_counter()
                            inner.__exit__(None, None, None)
                            self._add("cluster close", time.perf_counter() - t1)
                    return cm()
                setattr(mod, name, timed_cm)
                continue

            def timed(*a: Any, _f: Any = f, _n: str = name, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return _f(*a, **k)
                finally:
                    self._add(_n, time.perf_counter() - t0)
            setattr(mod, name, timed)
        return self

    def _add(self, name: str, dt: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + dt

    def __exit__(self, *exc: Any) -> None:
        for mod, name, f in self._saved:
            setattr(mod, name, f)


def same_arrays(a: Path, b: Path) -> bool:
    """The newest version of ``a`` holds the same samples as ``b``, every array's bytes."""
    import pipeline
    from pipeline.storage.versions import pinned_array

    da_, db = pipeline.open(a), pipeline.open(b)
    if da_.splits != db.splits:
        return False
    for split in db.splits:
        for name in db[split]:
            if name.startswith("_"):
                continue
            if np.asarray(da_[split][name][:]).tobytes() != np.asarray(db[split][name][:]).tobytes():
                return False
    if "_shared" in db.group:
        x = pinned_array(da_.group["_shared/features"], da_.version.shared_rows)[:]
        return x.tobytes() == db.group["_shared/features"][:].tobytes()
    return True


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="4k rows per day and file, 2 turns")
    parser.add_argument("--rows-per-day", type=int, default=None, help="rows per instrument and day (50k)")
    parser.add_argument("--repeat", type=int, default=None, help="turns of full build and appends (3; --quick 2)")
    parser.add_argument("--new", default="1,3", help="days appended, one case each (default 1,3)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    rows = args.rows_per_day or (4_000 if args.quick else 50_000)
    repeat = args.repeat or (2 if args.quick else 3)
    news = [int(k) for k in args.new.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench_append_"))
    from distributed import LocalCluster

    from pipeline.config import parse_config
    from pipeline.demo import DemoSpec, write_demo_data
    from pipeline.job import run

    try:
        t0 = time.perf_counter()
        write_demo_data(work / "all", DemoSpec(days=DAYS, rows_per_day=rows, seed=7, formats=("parquet",),
                                               per_instrument=True, instruments=INSTRUMENTS))
        days = sorted(p.stem for p in (work / "all" / INSTRUMENTS[0]).glob("*.parquet"))
        raw_mb = sum(p.stat().st_size for p in (work / "all").rglob("*.parquet")) / 2**20
        print(f"data: {len(INSTRUMENTS)} instruments x {DAYS} days x {rows:,} rows = {raw_mb:,.1f} MiB of parquet "
              f"(written in {time.perf_counter() - t0:.1f} s); config {CONFIG.name}, test split from {days[15]}; "
              f"{repeat} turns of: full build, each append, start-up (medians; ratios are medians of the turns' "
              "ratios)")
        results = []
        for materialize in (True, False):
            mode = "materialized" if materialize else "virtual"
            full_raw, full_store = work / f"full-{mode}" / "raw", work / f"full-{mode}.zarr"
            link_days(work / "all", full_raw, days)
            full_cfg = write_config(work / f"full-{mode}.yaml",
                                    config(full_raw, full_store, materialize=materialize, days=days))
            cases = []
            for k in news:
                case = work / f"{mode}-{k}"
                raw = case / "raw"
                old = link_days(work / "all", raw, days[: DAYS - k])
                cfg = config(raw, case / "store.zarr", materialize=materialize, days=days)
                cfg_path = write_config(case / "run.yaml", cfg)
                build_s, _ = cli(cfg_path)
                shutil.copytree(case / "store.zarr", case / "v0.zarr")
                new = link_days(work / "all", raw, days[DAYS - k:])
                cases.append({"k": k, "dir": case, "cfg": cfg, "cfg_path": cfg_path, "old": old, "new": new,
                              "build": build_s, "appends": [], "watches": []})
            fulls, uptodate, bare, warm = [], [], [], []
            for turn in range(repeat):
                shutil.rmtree(full_store, ignore_errors=True)
                fulls.append(cli(full_cfg)[0])
                for c in cases:
                    store = c["dir"] / "store.zarr"
                    shutil.rmtree(store)
                    shutil.copytree(c["dir"] / "v0.zarr", store)
                    with FileWatch(c["old"] + c["new"]) as w:
                        dt, out = cli(c["cfg_path"])
                    if "version 1: appended" not in out:
                        raise SystemExit(f"the run did not append:\n{out}")
                    c["appends"].append(dt)
                    c["watches"].append(w)
                uptodate.append(cli(cases[0]["cfg_path"])[0])
                bare.append(cluster_startup(cases[0]["cfg_path"], imports=False))
                warm.append(cluster_startup(cases[0]["cfg_path"], imports=True))
            print(f"{mode}: full build of {DAYS} days {median(fulls):.1f} s (turns " +
                  ", ".join(f"{t:.1f}" for t in fulls) + f"); fixed start-up of a run: pipeline run on an up-to-date "
                  f"store {median(uptodate):.1f} s + LocalCluster start and close {median(bare):.1f} s = "
                  f"{median(uptodate) + median(bare):.1f} s; with the workers' imports "
                  f"{median(uptodate) + median(warm):.1f} s")
            for c in cases:
                k, old, new = c["k"], c["old"], c["new"]
                store = c["dir"] / "store.zarr"
                equal = same_arrays(store, full_store)
                starts = [u + w for u, w in zip(uptodate, warm)]
                starts_bare = [u + b for u, b in zip(uptodate, bare)]
                goals = [2 * k / DAYS * f + st for f, st in zip(fulls, starts)]
                goals_bare = [2 * k / DAYS * f + st for f, st in zip(fulls, starts_bare)]
                vs_full = median([a / f for a, f in zip(c["appends"], fulls)])
                vs_goal = median([a / g for a, g in zip(c["appends"], goals)])
                vs_goal_bare = median([a / g for a, g in zip(c["appends"], goals_bare)])
                work_ratio = median([(a - st) / (f - st) for a, f, st in zip(c["appends"], fulls, starts)])
                # Bytes, and where the time goes: the same append once more in this
                # process (an in-process cluster of threads), reads and steps counted.
                shutil.rmtree(store)
                shutil.copytree(c["dir"] / "v0.zarr", store)
                with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0") as lc:
                    inproc = parse_config({**c["cfg"], "cluster": {"address": lc.scheduler_address}})
                    t0 = time.perf_counter()
                    with CountReads() as counted, Breakdown() as steps:
                        run(inproc, log=None, progress=False)
                    inproc_s = time.perf_counter() - t0
                old_set, new_set = {str(p) for p in old}, {str(p) for p in new}
                old_bytes = sum(n for p, n in counted.bytes.items() if p in old_set)
                new_bytes = sum(n for p, n in counted.bytes.items() if p in new_set)
                old_size = sum(p.stat().st_size for p in old)
                new_size = sum(p.stat().st_size for p in new)
                opens = {"old": max(sum(w.opens[str(p)] for p in old) for w in c["watches"]),
                         "new": max(sum(w.opens[str(p)] for p in new) for w in c["watches"])}
                reads = {"old": max(sum(w.reads[str(p)] for p in old) for w in c["watches"]),
                         "new": max(sum(w.reads[str(p)] for p in new) for w in c["watches"])}
                met = all(a <= g for a, g in zip(c["appends"], goals))
                results.append({"mode": mode, "k": k, "vs_goal": vs_goal, "vs_goal_bare": vs_goal_bare, "met": met,
                                "old_bytes": old_bytes, "old_opens": opens["old"], "old_reads": reads["old"]})
                print(f"  {DAYS - k} days + {k} new (built in {c['build']:.1f} s): append {median(c['appends']):.1f} s "
                      f"(turns " + ", ".join(f"{t:.1f}" for t in c["appends"]) + f") = {vs_full:.3f}x the full build "
                      f"(the new data's share: {k}/{DAYS} = {k / DAYS:.3f}); equal to the full build: "
                      f"{'yes' if equal else 'NO'}")
                print(f"    goal: append <= 2 x {k}/{DAYS} x full build + fixed start-up = {median(goals):.1f} s: "
                      f"{vs_goal:.2f}x the goal, {'met' if met else 'NOT met'} in {'every' if met else 'some'} turn; "
                      f"with the start-up less the workers' imports: {vs_goal_bare:.2f}x. Beyond the start-up, the "
                      f"append's work is {work_ratio:.3f}x the full build's")
                print(f"    old raw data: {len(old)} files, {old_size / 2**20:,.1f} MiB: {opens['old']} opens and "
                      f"{reads['old']} read calls in a timed run (inotify, any process; the most of the turns), "
                      f"{old_bytes:,} bytes read through fsspec in the in-process run. New: {len(new)} files, "
                      f"{new_size / 2**20:,.1f} MiB: {opens['new']} opens, {reads['new']} read calls; {new_bytes:,} "
                      f"bytes through fsspec ({new_bytes / max(new_size, 1):.2f}x their size)")
                print(f"    where an append's time goes (in-process run, threads, {inproc_s:.1f} s): " +
                      ", ".join(f"{n} {t:.2f} s" for n, t in steps.seconds.items()))
        worst = max(results, key=lambda r: r["vs_goal"])
        print(f"worst case: {worst['mode']}, {worst['k']} new day(s): the append takes {worst['vs_goal']:.2f}x its goal "
              f"({worst['vs_goal_bare']:.2f}x with the start-up less the workers' imports); goal met in every case "
              f"and turn: {'yes' if all(r['met'] for r in results) else 'no'}. Old raw data read "
              f"by any append: {max(r['old_bytes'] for r in results):,} bytes, {max(r['old_opens'] for r in results)} "
              f"opens, {max(r['old_reads'] for r in results)} read calls (goal: only the lookback tail, which for "
              "new sessions is none: stored moments and attributes stand in for it)")
    finally:
        if args.keep:
            print(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
