"""One pipeline run: config -> cluster -> loaders -> features/windows -> zarr store.

This module only wires stages together; each stage lives in its subpackage. It is what
``pipeline run`` calls, and what a Python user calls to run a config programmatically.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Literal, NoReturn

import yaml

from pipeline.config import Config, config_fingerprint
from pipeline.errors import ConfigError, EmptyInputError, LoaderError, PipelineError, StoreConflictError

__all__ = ["RunSummary", "changed_files", "file_stamps", "mtime_text", "run", "skipped_line"]


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What a run did, printed at its end."""

    store: str
    rows_read: int
    samples: dict[str, int]
    bytes_written: int
    uncompressed_bytes: int
    seconds: float
    version: int = 0
    #: What the run did: "build", "append" (``added`` sessions) or "up to date".
    action: str = "build"
    added: int = 0
    #: Windows the splits left out (the store's ``split_left_out``): ``outside`` every
    #: split's time, ``across`` a cut between splits, and per split within an
    #: ``embargo`` of the next.
    left_out: dict[str, Any] = field(default_factory=dict)
    #: Windows left out per split for NaN, or a label on an empty price (the store's
    #: ``nan_windows_dropped``).
    nan_dropped: dict[str, int] = field(default_factory=dict)

    def format(self) -> str:
        """A few human-readable lines."""
        splits = ", ".join(f"{k} {v:,}" for k, v in self.samples.items())
        mb = self.uncompressed_bytes / 2**20
        rate = mb / self.seconds if self.seconds > 0 else float("nan")
        ratio = self.uncompressed_bytes / self.bytes_written if self.bytes_written else float("nan")
        did = {"append": f"appended {self.added} session(s)", "up to date": "up to date: no new file"}
        head = [f"store: {self.store} (version {self.version}: {did.get(self.action, self.action)})"]
        size = f"{self.bytes_written / 2**20:,.1f} MiB on disk ({mb:,.1f} MiB uncompressed, ratio {ratio:.2f}x)"
        if self.action == "up to date":  # nothing read or written: the store as it is
            return "\n".join(head + [f"windows per split: {splits}", f"store size: {size}",
                                      f"wall time: {self.seconds:.1f} s"])
        return "\n".join(head + [f"rows read: {self.rows_read:,}", f"windows per split: {splits}"] + self._left_out()
                         + [f"written: {size}", f"wall time: {self.seconds:.1f} s ({rate:,.1f} MiB/s of windows)"])

    def _left_out(self) -> list[str]:
        """The line of the windows the splits left out, when any were."""
        from pipeline.storage.inspect import left_out_line

        line = left_out_line(self.left_out, self.nan_dropped)
        return [line] if line else []


def _cluster_kwargs(config: Config) -> dict[str, Any]:
    c = config.cluster
    return {
        "address": c.address,
        "scheduler_file": c.scheduler_file,
        "n_workers": c.n_workers,
        "threads_per_worker": c.threads_per_worker,
        "processes": c.processes,
        "memory_limit": c.memory_limit,
        "dashboard_address": c.dashboard_address,
        "tls_ca_file": c.tls_ca_file,
        "tls_cert_file": c.tls_cert_file,
        "tls_key_file": c.tls_key_file,
    }


def _source_kwargs(config: Config) -> dict[str, Any]:
    """Loader options from the source section (header options only when set, so that
    formats without them are not handed options they do not take)."""
    src = config.source
    kwargs: dict[str, Any] = {
        "format": src.format,
        "combine": src.combine,
        "columns": src.columns,
        "read": _columns_read(config),
        "timestamp": src.timestamp,
        "timestamp_unit": src.timestamp_unit,
        "nan": src.nan,
        "fill_value": src.fill_value,
        "on_error": src.on_error,
        "chunk_rows": src.chunk_rows,
    }
    if src.header is not True or src.names:
        kwargs.update(header=src.header, names=src.names)
    if (src.delimiter, src.decimal) != (",", "."):
        kwargs.update(delimiter=src.delimiter, decimal=src.decimal)
    if src.rename:
        kwargs["rename"] = src.rename
    if src.date is not None:
        kwargs["date"] = src.date
    if src.halts is not None:  # LOBSTER's trading halts; unset, the loader's default (drop)
        kwargs["halts"] = src.halts
    if src.scale or src.missing is not None:
        kwargs.update(scale=src.scale or None, missing=src.missing)
    if src.dtype != "float32":  # the tables' default; arrays (npy, HDF5) keep their own dtype without it
        kwargs["dtype"] = src.dtype
    return kwargs


def _what_changed(config: Config) -> str:
    """For a refusal of a store of another fingerprint: the config keys that differ from
    the stored build's, and ``--rebuild`` (empty when the store records no config)."""
    from pipeline.config import config_differences
    from pipeline.storage.store import open_store_group, store_root_attrs

    try:
        stored = store_root_attrs(open_store_group(config.output.path, mode="r",
                                                   storage_options=config.output.storage_options or None))
    except PipelineError:
        return ""
    if not isinstance(stored.get("config"), str) or not stored.get("fingerprint"):
        return ""
    changes = config_differences(stored["config"], config.raw_yaml)
    return f". What differs from the stored build's config: {'; '.join(changes)} (--rebuild builds it again)" \
        if changes else ""


def dropped_text(dropped: int, src: Any) -> str:
    """``; N row(s) left out: ...`` for the source line of a run whose files' rows were
    left out as read (``source.nan: drop``, LOBSTER's halts), else nothing: the rows
    read count the rest only."""
    from pipeline.loaders.lobster import halts_option

    if not dropped:
        return ""
    halts = halts_option(src.halts, src.format) == "drop"
    why = [w for w, on in (("with NaN or inf (source.nan: drop)", src.nan == "drop"),
                           ("in trading halts (source.halts: drop)", halts)) if on]
    return f"; {dropped:,} row(s) left out " + (" or ".join(why) or "as read")


def glob_reaches(pattern: str, path: str) -> bool:
    """Whether the glob ``pattern`` (``*``, ``?``, ``[...]`` within one path component,
    ``**`` across any number of them, as ``glob.glob(recursive=True)`` reads them) matches
    ``path``; both absolute and normalized. Pure: the file need not exist."""
    import fnmatch

    def match(pat: list[str], parts: list[str]) -> bool:
        if not pat:
            return not parts
        if pat[0] == "**":
            return any(match(pat[1:], parts[k:]) for k in range(len(parts) + 1))
        return bool(parts) and fnmatch.fnmatchcase(parts[0], pat[0]) and match(pat[1:], parts[1:])

    return match(pattern.split(os.sep), path.split(os.sep))


def _check_output_bucket(config: Config) -> None:
    """Refuse an object-store output whose bucket does not exist before the cluster
    starts: the write failed only once every window was computed, saying "no zarr
    group found". One request (a bucket's existence), for remote outputs only."""
    from pipeline.errors import StoreError
    from pipeline.storage.store import is_remote, missing_bucket

    out = config.output
    if is_remote(out.path) and (missing := missing_bucket(out.path, out.storage_options or None)) is not None:
        raise StoreError(f"output.path: {out.path}: {missing}; nothing was read or written")


def _check_output_outside_source(config: Config) -> None:
    """Refuse an output store that ``source.paths`` would read as raw files (``raw/*``
    with ``output.path: raw/out.zarr``): its lock file, made first, was then named as an
    input of unknown suffix (a file gone once the run ended), and on a rerun the store
    itself would be.

    Raises
    ------
    ConfigError
        Naming ``output.path``, the pattern of ``source.paths`` that reaches it and what
        to change.
    """
    from pipeline.storage.lock import lock_path
    from pipeline.storage.store import zip_staging

    out = config.output.path
    paths = (config.source.paths,) if isinstance(config.source.paths, str) else tuple(config.source.paths)
    if "://" in str(out):
        return
    store = os.path.abspath(os.path.expanduser(str(out)))
    inside = zip_staging(store) if store.endswith(".zip") else os.path.join(store, "zarr.json")
    own = [store, lock_path(store), inside]
    for pattern in (str(p) for p in paths if "://" not in str(p)):
        full = os.path.normpath(os.path.abspath(os.path.expanduser(pattern)))
        hit = next((p for p in own if glob_reaches(full, p)), None)
        if hit is not None:
            raise ConfigError("output.path", "", detail=(
                f"{out!r} is where source.paths {pattern!r} reads raw files: the store's own files "
                f"({os.path.basename(hit)}) would be read as input; write the store outside the input folder, or "
                "narrow source.paths to the raw files (raw/*.parquet)"))


def _check_table_source(src: Any) -> None:
    """Refuse, before the cluster starts, local paths that match no file, and a source
    whose format (given, or every path's suffix) is an array format: features and labels
    name table columns. (Remote paths are listed once, when the source opens.)"""
    from pipeline.loaders import expand_paths
    from pipeline.loaders.registry import ARROW_IPC_SUFFIXES, SUFFIXES, TABLES, TEXT_COMPRESSIONS, format_of, own_name

    paths = (src.paths,) if isinstance(src.paths, str) else tuple(src.paths)
    if not any("://" in str(p) for p in paths):
        try:
            expand_paths(src.paths)  # a glob that matches nothing is named now, not once connected
        except EmptyInputError as exc:
            relative = [str(p) for p in paths if not os.path.isabs(os.path.expanduser(str(p)))]
            if not relative:
                raise
            # A relative glob is resolved against the working directory, which in a
            # container or a batch job is not the config's folder (a DaskJob's is /data).
            raise EmptyInputError(", ".join(map(str, paths)), (
                f"matched no file (relative paths are resolved against the working directory {os.getcwd()}, "
                f"not the config's folder: {os.path.join(os.getcwd(), relative[0])})")) from None
    formats = set()
    for p in map(str, paths):
        try:
            formats.add(format_of(p, src.format))
        except PipelineError as exc:
            suffix = os.path.splitext(own_name(p))[1].lower()
            if (not suffix or suffix in SUFFIXES or suffix in TEXT_COMPRESSIONS or suffix == ".zip" or "://" in p
                    or os.path.isdir(os.path.expanduser(p))):
                # No suffix to go by (a directory, a URL), or one that the files opened
                # tell more of (an archive, compressed text): the files will tell.
                return
            # A suffix no table format has: refused before the cluster starts, with the
            # tables' suffixes (the loaders' own list has the array formats' too).
            problem = getattr(exc, "problem", str(exc)) if suffix in ARROW_IPC_SUFFIXES else (
                f"unknown suffix {suffix!r}")
            by_suffix = sorted(s for s, f in SUFFIXES.items() if f in TABLES)
            raise ConfigError("source.paths", "", detail=(
                f"{p!r}: {problem}; pipeline run reads tables: {', '.join(by_suffix)} files (CSV also compressed: "
                f"{', '.join('.csv' + s for s in TEXT_COMPRESSIONS)}), or files of any suffix with source.format: "
                f"{', '.join(TABLES)}")) from None
    if formats and not formats & set(TABLES):
        _refuse_arrays(", ".join(map(str, paths)) + f" ({', '.join(sorted(formats))})")


def _refuse_arrays(got: str) -> NoReturn:
    raise ConfigError("source.paths", "tables with named columns (CSV, Parquet, LOBSTER, FI-2010): pipeline run "
                      "computes features and labels from named columns; arrays (npy, npz, HDF5, images) go "
                      "through the Python API (pipeline.load, pipeline.windows, pipeline.write)", got)


def _columns_read(config: Config) -> tuple[str, ...] | None:
    """The source columns a build decodes: those its features and label read (the rest
    of a wide book, deeper levels say, is never decoded); ``None``, every column, under
    ``source.nan: drop``, whose rows are dropped by every column's values, so that which
    rows a store holds does not depend on the features that read them."""
    from pipeline.features.steps import columns_read

    read = columns_read(config.features.steps, config.labels)
    if config.source.nan == "drop":
        if config.source.format == "lobster":
            from pipeline.loaders.lobster import EVERY_BOOK_COLUMN, MESSAGE_COLUMNS

            # LOBSTER's message columns are decoded only when named, and hold no NaN:
            # those read come beside every book column.
            messages = tuple(c for c in read if c in MESSAGE_COLUMNS)
            return (EVERY_BOOK_COLUMN, *messages) if messages else None
        return None
    return read


def run(config: Config, *, log: IO[str] | None = sys.stderr, progress: bool = True,
        mode: Literal["auto", "refit", "rebuild"] = "auto") -> RunSummary:
    """Run a whole config on its cluster and write its store, or append to it.

    Parameters
    ----------
    config
        A validated configuration (see :func:`pipeline.config.load_config`).
    log
        Where to print the dashboard address and stage messages; ``None`` for silence.
    progress
        Show a progress bar while chunks are written.
    mode
        ``auto``: build the store, resume an interrupted build, or, when the store holds
        a build of this config and the config now matches new files, append their
        sessions as a new version (:mod:`pipeline.update`). ``refit`` and ``rebuild``
        build everything again, statistics included, replacing the store.

    Returns
    -------
    RunSummary
    """
    from pipeline.cluster import start_worker_server
    from pipeline.daskimport import import_dask_array

    import_dask_array()  # dask.array without xarray or scipy, before anything imports it

    if config.cluster.address is None and config.cluster.scheduler_file is None:
        # First: the LocalCluster's workers are forked from a server process that imports
        # what they run while this process imports the same for itself, on another core.
        start_worker_server()

    def say(msg: str) -> None:
        if log is not None:
            print(msg, file=log, flush=True)

    from pipeline.remote import quiet_abandoned_gathers, remote_errors_explained
    from pipeline.storage.lock import write_lock
    from pipeline.storage.writer import local_absolute

    t0 = time.perf_counter()
    # The workers of a remote cluster write the store: a relative path would be theirs.
    config = dataclasses.replace(config, output=dataclasses.replace(
        config.output, path=local_absolute(config.output.path), overwrite=config.output.overwrite or mode != "auto"))
    remote = config.cluster.address is not None or config.cluster.scheduler_file is not None
    if remote:
        # Before anything else, whether or not there turns out to be work: a run on an
        # up-to-date store connects to no scheduler, and a typo'd address or a missing
        # TLS file passed there unseen (exit 0) until the day there was work to do.
        from pipeline.remote import check_remote

        c = config.cluster
        check_remote(c.address, c.scheduler_file, c.tls_ca_file, c.tls_cert_file, c.tls_key_file)
    # The store's write lock first, before the source is read or the cluster starts: a
    # run that another run's lock refuses costs nothing. The writer takes it again
    # within this hold (pipeline.storage.lock is re-entrant).
    _check_table_source(config.source)  # no file, or arrays: refused before anything is written
    _check_output_outside_source(config)
    _check_output_bucket(config)
    sources = (config.source.paths,) if isinstance(config.source.paths, str) else tuple(config.source.paths)
    # Ctrl-C leaves the client's gathers unawaited: without their tracebacks, the
    # interruption is the one line the command prints.
    with write_lock(config.output.path), quiet_abandoned_gathers(), \
            remote_errors_explained(config.output.path, sources=sources, remote=remote):
        return _run_locked(config, mode=mode, say=say, progress=progress, log=log, t0=t0)


def _run_locked(config: Config, *, mode: str, say: Any, progress: bool, log: IO[str] | None,
                t0: float) -> RunSummary:
    """:func:`run`'s work, under the store's write lock."""
    from pipeline import update
    from pipeline.cluster import cluster
    from pipeline.features import build_training_set
    from pipeline.loaders.provenance import hashes_on
    from pipeline.loaders.segments import open_segmented
    from pipeline.storage.layout import task_block, unit_samples
    from pipeline.storage.writer import check_target

    src_cfg = config.source
    out = config.output
    stored = update.stored_build(config) if mode == "auto" and not out.overwrite else None
    files = update.new_files(config, stored) if stored is not None else []
    if stored is not None and not files:
        remote = config.cluster.address is not None or config.cluster.scheduler_file is not None
        # Its settings were checked (run), but nothing is asked of the scheduler: say so,
        # lest an up-to-date run be taken for proof that the scheduler answers.
        contacted = "; nothing to compute, so the cluster was not contacted" if remote else ""
        say(f"{out.path}: up to date (every file the config matches is in the store{contacted})")
        return _summary(config, 0, t0, "up to date")
    if stored is None:  # a build: refuse a target it would damage before the cluster starts
        try:
            check_target(out.path, config_fingerprint(config), out.overwrite, out.storage_options or None)
        except StoreConflictError as exc:
            raise StoreConflictError(f"{exc}{_what_changed(config)}") from None
        if not out.overwrite:
            update.check_resume_files(config)

    def block_windows(window_bytes: int) -> int:
        # Windows made in the blocks the writer's tasks write: see build_training_set.
        return task_block(unit_samples(window_bytes, out.chunk_samples, out.shard_chunks,
                                       int(out.target_chunk_mb * 2**20)), window_bytes)

    from pipeline.gcfreeze import WARM_MODULES, frozen_heap

    # Frozen once the cluster is up: full collections then scan only what the build
    # makes (pipeline.gcfreeze).
    with cluster(**_cluster_kwargs(config), log=log, warm_imports=WARM_MODULES) as client, frozen_heap():
        if config.cluster.address is not None or config.cluster.scheduler_file is not None:
            _check_workers_see(client, config)
        if stored is not None:
            done = update.build_append(config, stored, files, say=say, progress=progress,
                                       source_kwargs=_source_kwargs(config), block_windows=block_windows,
                                       client=client)
            return _summary(config, done["rows"], t0, "append", done["added"])
        source = open_segmented(
            src_cfg.paths,
            sessions=src_cfg.sessions,
            instrument=src_cfg.instrument,
            storage_options=src_cfg.storage_options or None,
            **_source_kwargs(config),
        )
        if not source.columns:  # the suffixes did not tell (see _refuse_arrays): the files did
            _refuse_arrays(f"{source.files[0].path} ({source.array.shape} {source.array.dtype}, no column names)")
        # Every file's digests, read by the workers while the build plans and runs.
        hashes = hashes_on(client, source.metadata(), src_cfg.storage_options or None)
        rows = int(source.array.shape[0])
        segs = source.segments
        n_files = len(source.files)
        say(f"source: {n_files} file{'s' if n_files != 1 else ''}, {rows:,} rows x {source.array.shape[1]} columns read, "
            f"{len(set(segs.instrument.tolist()))} instrument(s), {len(segs)} session(s) ({source.sessions_text})"
            + dropped_text(source.dropped, src_cfg))
        if source.skipped:
            # A line of the run's output (the command prints warnings as lines), and a
            # warning for a caller of run(): the store's attrs alone went unread.
            warnings.warn(skipped_line(source.skipped, len(source.files) + len(source.skipped)), UserWarning,
                          stacklevel=3)  # run()'s caller
        tset = build_training_set(
            source.array,
            columns=source.columns,
            features=config.features.steps,
            size=config.windows.size,
            stride=config.windows.stride,
            scales=config.windows.scales,
            label=config.labels,
            splits=update.splits_in_zone(out.splits, source),
            normalize=config.features.normalize,
            nan=config.features.nan,
            fill_value=config.features.fill_value,
            progress=progress,
            materialize=config.windows.materialize,
            block_windows=block_windows,
            segments=segs,
            timestamps=source.timestamps,
            folds=out.folds,
            # The value the loader wrote into empty cells: no label reads it as a price.
            source_fill=config.source.fill_value if config.source.nan == "fill" else None,
        )
        say("writing " + ", ".join(f"{k}: {next(iter(v.values())).shape[0]:,} windows" for k, v in tset.splits.items())
            + ("" if config.windows.materialize else " (virtual: features stored once)"))
        _write_build(config, tset, source, progress, hashes)
    return _summary(config, rows, t0, "build")


def skipped_line(skipped: Any, listed: int, *, shown: int = 3) -> str:
    """One line naming the files ``source.on_error: skip`` left out, and why: the first
    ``shown`` of them, and how many more (all are in the store's ``skipped``
    attribute, which ``pipeline inspect`` lists).

    Parameters
    ----------
    skipped
        ``(path, why)`` of every file left out, in the order the source listed them.
    listed
        How many files the source listed, those left out included.
    shown
        How many to name.
    """
    named = "; ".join(f"{path}: {why}" for path, why in list(skipped)[:shown])
    more = len(skipped) - shown
    rest = f"; and {more} more" if more > 0 else ""
    return (f"source.on_error: skip left out {len(skipped)} of {listed} files: {named}{rest} (the store's skipped "
            "attribute lists them: pipeline inspect STORE)")


def file_stamps(files: Any) -> dict[str, tuple[int, float]]:
    """``{path: (size, mtime)}`` of every file a source read (and of its companion,
    LOBSTER's message file), as probed when the source was opened: the identity the
    store records beside each file's hashes."""
    out: dict[str, tuple[int, float]] = {}
    for f in files:
        for item in (f, f.companion):
            if item is not None:
                out[str(item.path)] = (int(item.size), float(item.mtime))
    return out


def changed_files(stamps: dict[str, tuple[int, float]], storage_options: dict | None = None
                  ) -> list[tuple[str, str]]:
    """``(path, what changed)`` of the files whose size or modification time differ now
    from ``stamps`` (:func:`file_stamps`), or that are gone, in ``stamps``' order."""
    from pipeline.loaders import _stat

    so = storage_options or {}

    def now(path: str) -> tuple[int, float] | None:
        try:
            return _stat(path, so)
        except LoaderError:
            return None

    paths = list(stamps)
    if any("://" in p and not p.startswith("file://") for p in paths):
        with ThreadPoolExecutor(max_workers=16) as pool:  # remote stats are latency-bound
            current = list(pool.map(now, paths))
    else:
        current = [now(p) for p in paths]
    out = []
    for path, cur in zip(paths, current):
        (size, mtime) = stamps[path]
        if cur is None:
            out.append((path, "it is gone"))
        elif cur[0] != size:
            out.append((path, f"its size was {size:,} bytes, is {cur[0]:,}"))
        elif cur[1] != mtime:
            was, is_ = mtime_text(mtime), mtime_text(cur[1])
            if was == is_:  # apart by less than the microseconds shown: the raw seconds tell them apart
                was, is_ = f"{was} ({mtime!r} s)", f"{is_} ({cur[1]!r} s)"
            out.append((path, f"its modification time was {was}, is {is_}"))
    return out


def mtime_text(seconds: float) -> str:
    """A modification time (seconds since the epoch, as ``os.stat`` gives it) as an ISO
    time in UTC to the microsecond, ``2026-11-27T18:44:02.230330Z``: what a user
    compares with ``ls --full-time``, not an epoch float."""
    when = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return when.replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def _refuse_changed(changed: list[tuple[str, str]], outcome: str) -> None:
    """Raise, naming the first of the files that changed since the source was opened
    (:func:`changed_files`), if any; ``outcome``: what became of the store."""
    if changed:
        path, why = changed[0]
        others = f" (and {len(changed) - 1} more file(s))" if len(changed) > 1 else ""
        raise LoaderError(path, f"changed while this run read it ({why}){others}; {outcome}")


def _check_workers_see(client: Any, config: Config) -> None:
    """Refuse, before any task, a remote cluster whose workers cannot see the local
    output's folder (the write lock this process holds beside the store) or one of the
    local raw files, or see a raw file at another size than this process (a stale
    copy), naming the workers (:func:`pipeline.remote.check_workers_see`).

    Every file is checked, not a sample: a worker with one stale day among thousands
    wrote that day's windows from the wrong bytes. Each worker stats them all in one
    call (no byte is read)."""
    from pipeline.loaders import _local_target, expand_paths
    from pipeline.remote import check_workers_see
    from pipeline.storage.lock import lock_path
    from pipeline.storage.store import is_remote

    out, src = config.output, config.source
    paths = (src.paths,) if isinstance(src.paths, str) else tuple(src.paths)
    files: list[str] = []
    if not any("://" in str(p) for p in paths):
        # A zip's member (zip://NAME::/abs/x.zip) is seen where its archive is.
        files = list(dict.fromkeys(_local_target(str(f)) or str(f) for f in expand_paths(src.paths)))
    marker = None if is_remote(out.path) else lock_path(out.path)
    check_workers_see(client, store=out.path, marker=marker, files=files)


def _write_build(config: Config, tset: Any, source: Any, progress: bool,
                 hashes: Callable[[], dict[str, Any]]) -> None:
    """Write a whole build's training set with its provenance (``hashes``: the
    source's files with their digests, from
    :func:`~pipeline.loaders.provenance.hashes_on`)."""
    from pipeline.storage import write
    from pipeline.storage.layout import chunk_samples_for
    from pipeline.storage.writer import BEFORE_COMPLETE

    out, src_cfg = config.output, config.source
    so = src_cfg.storage_options or None
    rows = int(source.array.shape[0])
    stamps = file_stamps(source.files)
    attrs = dict(tset.attrs)
    attrs.update(
        {
            "config": config.raw_yaml,
            "config_hash": config_fingerprint(config),
            # Content hashes let an append tell a touched file from a changed one.
            "sources": hashes(),
            "skipped": [list(s) for s in source.skipped],
            "rows_read": rows,
        }
    )
    if source.timestamps is None:  # what orders new sessions after these in an append
        attrs["session_keys"] = list(source.session_keys)
    # The store records each file's size and time as probed and its hashes as read
    # just now: a file replaced in between (a vendor's re-send) is refused before
    # anything is written, lest the record describe neither content.
    _refuse_changed(changed_files(stamps, so), "nothing was written: rerun to build from the files as they are")
    chunk_samples = out.chunk_samples
    if not config.windows.materialize and chunk_samples is None:
        # Chunk the window index as the windows would be chunked, so streaming a
        # virtual store serves the same batches as the materialized one.
        width = len(tset.attrs["features"]) * len(config.windows.scales)
        chunk_samples = chunk_samples_for(config.windows.size * width * 4, int(out.target_chunk_mb * 2**20))
    # The workers read the files while the write ran: one replaced meanwhile may have
    # given some windows its new content. Checked once every unit is written, before
    # the store is marked complete: it stays incomplete, and an overwrite's previous
    # store is put back (checked after the write, an overwrite had removed it by then).
    check = BEFORE_COMPLETE.set(lambda: _refuse_changed(changed_files(stamps, so), (
        "the store, which may hold windows of both contents, is not marked complete (an overwrite's previous "
        "store is put back): rerun with --rebuild to build it from the files as they are")))
    try:
        write(
            out.path,
            tset.splits,
            shared=tset.shared or None,
            shared_chunk_rows=(chunk_samples * config.windows.stride) if tset.shared else None,
            chunk_samples=chunk_samples,
            target_chunk_bytes=int(out.target_chunk_mb * 2**20),
            shard_chunks=out.shard_chunks,
            codec=out.codec,
            attrs=attrs,
            fingerprint=config_fingerprint(config),
            overwrite=out.overwrite,
            storage_options=out.storage_options or None,
            progress=progress,
            **({"folds": tset.folds, "fold_base": next(iter(tset.splits))} if tset.folds else {}),
        )
    finally:
        BEFORE_COMPLETE.reset(check)


def _summary(config: Config, rows: int, t0: float, action: str, added: int = 0) -> RunSummary:
    """What the store holds after a run (its newest version), and what the run did."""
    from pipeline.storage import open as open_store
    from pipeline.storage.store import stored_bytes

    out = config.output
    ds = open_store(out.path, storage_options=out.storage_options or None)
    samples = {name: int(ds[name]["y"].shape[0]) for name in ds.splits}
    stored = 0
    raw = 0
    for name in (*ds.splits, "_shared"):
        if name not in ds.group:
            continue
        for arr_name, arr in ds.group[name].arrays():
            if arr_name.startswith("_"):  # write markers, not data
                continue
            stored += stored_bytes(arr)
            raw += int(arr.nbytes)
    return RunSummary(
        store=str(out.path),
        rows_read=rows,
        samples=samples,
        bytes_written=stored,
        uncompressed_bytes=raw,
        seconds=time.perf_counter() - t0,
        version=ds.version.number,
        action=action,
        added=added,
        left_out=dict(ds.attrs.get("split_left_out") or {}),
        nan_dropped={k: int(v) for k, v in dict(ds.attrs.get("nan_windows_dropped") or {}).items()},
    )


def config_as_yaml(config: Config) -> str:
    """The validated config as YAML, with defaults filled in (for ``--print-config``)."""

    def plain(value: Any) -> Any:
        if hasattr(value, "to_value"):  # specs parsed from YAML values render as those values
            return plain(value.to_value())
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name != "raw_yaml"}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    from pipeline.features.splits import splits_value

    from pipeline.storage import CodecSpec

    data = plain(config)
    data["output"]["splits"] = splits_value(config.output.splits)
    # The default codec is its shorthand until parsed: printed parsed, as a given one is,
    # so that the printed config prints the same again.
    data["output"]["codec"] = plain(CodecSpec.from_mapping(config.output.codec, "output.codec"))
    return yaml.safe_dump(data, sort_keys=False)
