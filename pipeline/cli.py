"""The ``pipeline`` command: ``run``, ``inspect``, ``demo-data`` and ``bench``.

Errors the user can fix (a bad config value, a bad input file, an incomplete store) are
printed as one line without a traceback: exit status 2 for configuration errors, 1 for
the others.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any, Iterator, NoReturn, Sequence

from pipeline import __version__
from pipeline.errors import ConfigError, PipelineError, StreamError

__all__ = ["main"]


class _Command(argparse.ArgumentParser):
    """A subcommand's parser, which refuses an argument it does not take itself.

    argparse hands a subcommand's unknown arguments back to the top-level parser, whose
    error printed the top-level usage (``pipeline [-h] [--version] COMMAND ...``) for
    ``pipeline run c.yaml --bogus``: this one prints ``pipeline run``'s.
    """

    def parse_known_args(self, args: Sequence[str] | None = None,
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed, unknown


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipeline",
        description=(
            "Out-of-core training sets: raw files -> lazy dask array -> feature windows on a "
            "dask cluster -> chunked, compressed zarr -> shuffled batches for Keras/PyTorch."
        ),
    )
    # The package's own version, which the installed distribution's metadata repeats.
    parser.add_argument("--version", action="version", version=f"pipeline {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Command)

    run = sub.add_parser(
        "run",
        help="run a YAML pipeline config and write its zarr store",
        description=(
            "Load the raw files, compute features and windows on the configured dask cluster "
            "(a LocalCluster unless cluster.address or --scheduler is set) and write the "
            "zarr store named by output.path. Rerunning the same config resumes an "
            "interrupted store; once the store is complete, a rerun whose files now include "
            "new sessions appends them as a new version of the store."
        ),
    )
    run.add_argument("config", metavar="CONFIG", help="path of the YAML config file")
    run.add_argument(
        "--scheduler",
        metavar="ADDR",
        help="address of a running dask scheduler (tcp://host:8786); overrides cluster.address",
    )
    run.add_argument(
        "--set",
        dest="overrides",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one config key by its dotted path, value parsed as YAML "
        "(e.g. --set windows.size=128 --set output.splits='{train: .9, val: .1}'); repeatable",
    )
    run.add_argument("--no-progress", action="store_true",
                     help="do not show the progress bar (it is shown only when stdout is a terminal)")
    again = run.add_mutually_exclusive_group()
    again.add_argument("--rebuild", action="store_true",
                       help="build the whole store again from every file, replacing it (after a refused append)")
    again.add_argument("--refit", action="store_true",
                       help="build the whole store again, normalization statistics refitted on today's splits "
                       "(an append keeps the first build's)")
    run.add_argument(
        "--print-config",
        action="store_true",
        help="validate the config, print it with defaults filled in, and exit",
    )

    insp = sub.add_parser(
        "inspect",
        help="describe a store: splits, shapes, chunks, codec, size, completeness, provenance",
        description="Describe a zarr store written by `pipeline run` or pipeline.write(), or the arrays of one "
                    "another tool wrote.",
    )
    insp.add_argument("store", metavar="STORE", help="store path or URL (directory, .zarr.zip, s3://...)")
    insp.add_argument("--plot", metavar="FILE", help="also draw sample windows, feature histograms and label "
                      "distributions (of a store pipeline wrote) to an image file; the format follows the "
                      "extension: .png, .jpg, .pdf, .svg and the others matplotlib writes (none: .png is added)")
    _storage_options_argument(insp)
    insp.add_argument(
        "--verify",
        action="store_true",
        help="read every chunk and check it against the checksum recorded when it was written "
        "(exit status 1 when any chunk is corrupt)",
    )

    demo = sub.add_parser(
        "demo-data",
        help="generate a seeded synthetic Level-2 order-book data set (Parquet, CSV or LOBSTER)",
        description="Write one file per trading day of timestamped bid/ask prices and sizes "
        "(YYYY-MM-DD.parquet, YYYY-MM-DD.csv), or with --format lobster one headerless LOBSTER pair per "
        "instrument and day (TICKER_YYYY-MM-DD_34200000_END_orderbook_L.csv and ..._message_L.csv; "
        "see pipeline.demo for the layout).",
    )
    demo.add_argument("directory", metavar="DIR", help="output directory")
    demo.add_argument("--days", type=_positive_int, default=5, help="number of days (default 5)")
    demo.add_argument("--rows-per-day", type=_positive_int, default=400_000,
                      help="snapshots per day (per instrument for lobster; default 400000)")
    demo.add_argument("--levels", type=_positive_int, default=10, help="book levels per side (default 10)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument(
        "--formats", "--format", dest="formats", default="parquet,csv",
        help="comma-separated: parquet, csv, lobster (default parquet,csv)",
    )
    demo.add_argument(
        "--instruments", default="AAA,BBB",
        help="lobster: comma-separated tickers, one file pair per ticker and day (default AAA,BBB)",
    )
    demo.add_argument(
        "--per-instrument", action="store_true",
        help="parquet/csv: one folder per instrument of --instruments (DIR/TICKER/YYYY-MM-DD.parquet)",
    )
    demo.add_argument(
        "--empty-level-rate", type=float, default=0.0, metavar="FRACTION",
        help="lobster: fraction of rows whose deepest level is empty on one side, written with LOBSTER's "
        "dummy prices (default 0: every row complete, so nan: raise works)",
    )

    _bench_parser(sub)
    return parser


def _bench_parser(sub: Any) -> None:
    """The ``bench`` command's arguments."""
    bench = sub.add_parser(
        "bench",
        help="measure shuffled streaming throughput of a store",
        description="Stream epochs of a split with shuffling, back to back as a training loop runs them, and "
        "print samples/s and GB/s per epoch, the median of the epochs after the first (which also allocates "
        "the stream's buffers and maps its chunk files), and the shuffle quality.",
    )
    bench.add_argument("store", metavar="STORE", help="store path or URL")
    bench.add_argument("--split", default="train", help="split to stream (default train)")
    bench.add_argument("--batch-size", type=_positive_int, default=256, help="batch size (default 256)")
    bench.add_argument("--buffer-chunks", type=_positive_int, default=4, help="chunks mixed in memory (default 4)")
    bench.add_argument("--epochs", type=_positive_int, default=3, help="epochs to time (default 3)")
    bench.add_argument("--arrays", type=_array_names, default=None, metavar="A,B",
                       help="comma-separated arrays (or another tool's variables) to stream, in order, as "
                       "pipeline.stream(arrays=...) (default x,y)")
    bench.add_argument("--dim", default=None, metavar="NAME",
                       help="an xarray store's samples' dimension, as pipeline.stream(dim=...)")
    _storage_options_argument(bench)
    bench.add_argument("--cache-dir", default=None, metavar="DIR",
                       help="a remote store: cache its chunks in DIR and print each epoch's hit rate; needs "
                       "--cache-bytes")
    bench.add_argument("--cache-bytes", default=None, metavar="SIZE",
                       help="the most the cache keeps on disk (bytes, or a size such as 50GiB); needs --cache-dir")


def _positive_int(text: str) -> int:
    """An option's value that must be a positive integer, refused by argparse (exit
    status 2, the option named, as for a value that is not a number): the library's own
    refusal would name its argument (``batch_size``), not the option."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _array_names(text: str) -> tuple[str, ...]:
    """``--arrays``: comma-separated names, refused by argparse when one is empty (a
    stray comma would otherwise ask the store for an array named ``''``)."""
    names = tuple(name.strip() for name in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated array names such as x,y, got {text!r}")
    return names


def _storage_options_argument(command: argparse.ArgumentParser) -> None:
    """``--storage-options`` of the commands that read a store (inspect, bench)."""
    command.add_argument("--storage-options", default=None, metavar="MAPPING",
                         help="fsspec options of a remote store, as a YAML or JSON mapping, e.g. "
                         "'{endpoint_url: http://minio:9000, anon: true}'")


def _starts_a_local_cluster(args: argparse.Namespace) -> bool:
    """Whether the run will start a LocalCluster, by a look at the YAML ahead of its
    validation (``False`` when in doubt: the run then starts its workers' server itself,
    only later)."""
    if args.scheduler or args.print_config:
        return False
    try:
        import yaml

        with open(args.config, encoding="utf-8") as fh:
            section = (yaml.safe_load(fh) or {}).get("cluster") or {}
        overridden = {key.strip(): value.strip()
                      for key, value in (item.split("=", 1) for item in args.overrides if "=" in item)}
        # Threads of this process (processes: false) are not forked from the server.
        processes = overridden.get("cluster.processes", section.get("processes", True))
        return not (section.get("address") or section.get("scheduler_file")
                    or overridden.keys() & {"cluster.address", "cluster.scheduler_file"}
                    or str(processes).lower() in ("false", "no", "off", "0"))
    except Exception:  # noqa: BLE001 - validation, next, says what is wrong with the file
        return False


def _cmd_run(args: argparse.Namespace) -> int:
    from pipeline.daskimport import import_dask_array

    import_dask_array()  # dask.array without xarray or scipy, before anything imports it
    if _starts_a_local_cluster(args):
        # Before validating the config, which imports the feature stage (dask.array and
        # its dependencies): the server the workers are forked from imports the same in
        # a process of its own, on another core.
        from pipeline.cluster import start_worker_server

        start_worker_server()
    from pipeline.config import load_config
    from pipeline.job import config_as_yaml, run

    config = load_config(args.config, overrides=args.overrides, scheduler=args.scheduler)
    if args.print_config:
        print(config_as_yaml(config), end="")
        return 0
    mode = "rebuild" if args.rebuild else "refit" if args.refit else "auto"
    # The bar redraws one line in place: on a terminal only, not into a log file or pipe.
    summary = run(config, progress=not args.no_progress and sys.stdout.isatty(), mode=mode)
    print(summary.format())
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from pipeline.storage import format_report, inspect_store, plot_store, verify_store
    from pipeline.storage.plot import plot_target

    options, problem = _storage_options(args.storage_options)
    if problem:
        print(f"pipeline inspect: {problem}", file=sys.stderr)
        return 2
    remote = {"storage_options": options} if options is not None else {}
    # The image's name is checked before the store is read and described: a refusal
    # after the whole report is easy to miss.
    target = plot_target(args.plot) if args.plot is not None else None
    report = inspect_store(args.store, **remote)
    print(format_report(report))
    if target is not None:
        print(f"plot: {plot_store(args.store, target, **remote)}")
    if args.verify:
        result = verify_store(args.store, **remote)
        for line in result.problems:
            print(f"CORRUPT {line}")
        # Units an unfinished build or append has not written yet are not damage: said,
        # and the status stays 0 (plain inspect already says ``complete: NO``).
        for line in result.pending:
            print(f"PENDING {line}")
        print(f"verify: {result.summary}")
        return 1 if result.problems else 0
    return 0


def _cmd_demo_data(args: argparse.Namespace) -> int:
    import re

    from pipeline.demo import DemoSpec, write_demo_data

    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    instruments = tuple(t.strip() for t in args.instruments.split(",") if t.strip())
    if not formats or set(formats) - {"parquet", "csv", "lobster"}:
        raise ConfigError("--format", "parquet, csv and/or lobster", args.formats)
    # A ticker starts each file name: keep it to characters every file system takes.
    if not instruments or len(set(instruments)) != len(instruments) or not all(
            re.fullmatch(r"[A-Za-z0-9._\-]+", t) for t in instruments):
        raise ConfigError("--instruments", "distinct comma-separated tickers of letters, digits, '.', '_' or '-'",
                          args.instruments)
    if not 0.0 <= args.empty_level_rate <= 1.0:
        raise ConfigError("--empty-level-rate", "a fraction in [0, 1]", args.empty_level_rate)
    spec = DemoSpec(
        days=args.days, rows_per_day=args.rows_per_day, levels=args.levels, seed=args.seed, formats=formats,
        instruments=instruments, empty_level_rate=args.empty_level_rate, per_instrument=args.per_instrument,
    )
    t0 = time.perf_counter()
    paths = write_demo_data(args.directory, spec)
    rows = spec.days * spec.rows_per_day * (len(instruments) if args.per_instrument else 1)
    # LOBSTER files are written per instrument whatever --per-instrument says.
    counts = [f"{rows:,} rows per format" if len(formats) > ("lobster" in formats) else ""]
    if "lobster" in formats:
        counts.append(f"lobster: {spec.days * spec.rows_per_day * len(instruments):,} rows over "
                      f"{len(instruments)} instruments")
    print(f"wrote {len(paths)} files ({'; '.join(c for c in counts if c)}) to {args.directory} "
          f"in {time.perf_counter() - t0:.1f} s")
    written = {os.path.abspath(p) for p in paths}
    others = sorted(os.path.join(root, name) for root, _, names in os.walk(args.directory) for name in names
                    if os.path.abspath(os.path.join(root, name)) not in written)
    if others:
        sys.stdout.flush()
        # A rerun with fewer --days left the earlier run's later days: a build over the
        # folder read them too, more data than this command describes.
        print(f"note: {args.directory} also holds {len(others)} file(s) this command did not write (such as "
              f"{others[0]}); a pipeline run over it reads them too: remove them, or use an empty directory",
              file=sys.stderr)
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    import statistics

    from pipeline.streaming import stream

    remote, problem = _bench_remote_options(args)
    if problem:
        print(f"pipeline bench: {problem}", file=sys.stderr)
        return 2
    rates: list[tuple[float, float]] = []
    # Passed only when given: the stream's own defaults (x, y; axis 0) stay the bench's.
    chosen = {k: v for k, v in (("arrays", args.arrays), ("dim", args.dim)) if v is not None}
    try:
        opened = stream(args.store, split=args.split, batch_size=args.batch_size, buffer_chunks=args.buffer_chunks,
                        **chosen, **remote)
    except StreamError as exc:
        raise _with_arrays_hint(exc, args.arrays) from exc
    with opened as s:
        for epoch in range(args.epochs):
            s.set_epoch(epoch)
            n = 0
            nbytes = 0
            t0 = time.perf_counter()
            for batch in s:
                n += len(batch[0])
                nbytes += sum(b.nbytes for b in batch)
            dt = time.perf_counter() - t0
            rates.append((n / dt, nbytes / dt / 1e9))
            note = " (cold: allocates buffers, maps chunk files)" if epoch == 0 and args.epochs > 1 else ""
            print(f"epoch {epoch}: {n:,} samples in {dt:.2f} s: {n / dt:,.0f} samples/s, "
                  f"{nbytes / dt / 1e9:.2f} GB/s{note}")
            if args.cache_dir is not None:
                stats = s.cache_stats(epoch)
                print(f"  {str(stats).split(': ', 1)[1]}" if stats is not None
                      else "  cache: not used (a local store is read directly)")
        quality = s.quality()
    if len(rates) > 1:
        warm = rates[1:]
        print(f"after the first epoch: median {statistics.median(r for r, _ in warm):,.0f} samples/s, "
              f"{statistics.median(g for _, g in warm):.2f} GB/s")
    if quality:
        print(f"shuffle quality: {quality['mean_distinct_chunks_per_batch']:.2f} distinct chunks per batch, "
              f"Spearman(position, index) = {quality['spearman_position_vs_index']:+.3f}")
    return 0


def _with_arrays_hint(exc: StreamError, arrays: tuple[str, ...] | None) -> StreamError:
    """``exc``, with the flag that fixes it when the default arrays (x, y) are missing
    from a store whose own are named otherwise."""
    if arrays is None and any(f"{what} {name!r}" in str(exc) for what in ("no variable", "has no array")
                              for name in ("x", "y")):
        return StreamError(f"{exc}; name the arrays to stream with --arrays, e.g. --arrays a,b")
    return exc


def _storage_options(text: str | None) -> tuple[dict | None, str]:
    """The mapping ``--storage-options`` gives (``None`` without the flag), or a
    one-line problem with it."""
    import yaml

    if text is None:
        return None, ""
    try:
        options = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return None, f"--storage-options: not YAML or JSON ({str(exc).splitlines()[0]})"
    if not isinstance(options, dict):
        return None, f"--storage-options: expected a mapping such as '{{anon: true}}', got {text!r}"
    return options, ""


def _bench_remote_options(args: argparse.Namespace) -> tuple[dict, str]:
    """``pipeline.stream``'s ``storage_options``, ``cache_dir`` and ``cache_bytes`` from
    the bench's flags, or a one-line problem with them."""
    from dask.utils import parse_bytes

    out: dict = {}
    options, problem = _storage_options(args.storage_options)
    if problem:
        return {}, problem
    if options is not None:
        out["storage_options"] = options
    if (args.cache_dir is None) != (args.cache_bytes is None):  # the stream needs both: say so by the flags' names
        given, missing = ("--cache-dir", "--cache-bytes") if args.cache_bytes is None else ("--cache-bytes",
                                                                                           "--cache-dir")
        return {}, f"{given} needs {missing} (the cache's directory and the most it keeps on disk, e.g. 50GiB)"
    if args.cache_dir is not None:
        out["cache_dir"] = args.cache_dir
    if args.cache_bytes is not None:
        try:
            out["cache_bytes"] = int(parse_bytes(args.cache_bytes))
        except (ValueError, TypeError):
            return {}, f"--cache-bytes: expected bytes or a size such as 50GiB, got {args.cache_bytes!r}"
    return out, ""


def one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     line: str | None = None) -> str:
    """A warning as the command line prints it: its class and message on one line,
    without the file, line number and source line Python's default adds (they name the
    package's code, which the user did not write)."""
    return f"{category.__name__}: {message}\n"


class _Terminated(KeyboardInterrupt):
    """A SIGTERM that ``pipeline run`` received: a ``KeyboardInterrupt``, so that it
    stops the run as a Ctrl-C does (the cluster closed, its workers stopped, the store's
    lock released, what was written kept), told apart only by its line and exit status."""


#: The exit status of ``pipeline run`` stopped by SIGTERM: 128 + 15, as a shell reports
#: a process that the signal ended.
TERMINATED_STATUS = 128 + int(signal.SIGTERM)

TERMINATED_LINE = "terminated (SIGTERM); rerun the same command to resume (the units written so far are kept)"


def _raise_terminated_once(state: list[int]) -> Any:
    """The SIGTERM handler of :func:`_terminate_as_interrupt`: the first SIGTERM raises
    :class:`_Terminated`; later ones (a service manager that repeats it) are noted, and
    the close that the first began goes on."""

    def handler(signum: int, frame: object) -> None:
        state.append(signum)
        if len(state) == 1:
            raise _Terminated()

    handler.pipeline_terminate = True  # type: ignore[attr-defined] - see _default_term_in_child
    return handler


def _default_term_in_child() -> None:
    """In a process forked from this one (a worker started with the ``fork`` method),
    SIGTERM ends the process again: a nanny stops its worker with it, and a handler
    that raised in the worker's event loop could leave the worker running."""
    if getattr(signal.getsignal(signal.SIGTERM), "pipeline_terminate", False):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


_FORK_HOOK: list[bool] = []


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the block as a Ctrl-C does, raising :class:`_Terminated`.

    A service manager's or a batch scheduler's SIGTERM ended ``pipeline run`` at once,
    with no line in its log, its LocalCluster's workers left to notice, and the store's
    lock left for the next run to take over. Installed by the command only (a process
    that embeds pipeline keeps its own handling), where SIGTERM has the system's default
    handler, from the main thread, and for the block only. The workers' processes do not
    keep it: a forkserver or spawn starts a new program (handlers back to the default),
    and a process forked from this one drops it (:func:`_default_term_in_child`).
    """
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    if not _FORK_HOOK:
        os.register_at_fork(after_in_child=_default_term_in_child)
        _FORK_HOOK.append(True)
    previous = signal.signal(signal.SIGTERM, _raise_terminated_once([]))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


#: Where an object store's client raises from: its refusals (403, unknown keys) and
#: unreachable endpoints come out of these as PermissionError, ConnectionError or their
#: own classes, with tracebacks of 60-250 lines that name no store.
_OBJECT_STORE_CODE = (f"{os.sep}s3fs{os.sep}", f"{os.sep}botocore{os.sep}", f"{os.sep}aiobotocore{os.sep}",
                      f"{os.sep}obstore{os.sep}", f"{os.sep}gcsfs{os.sep}", f"{os.sep}adlfs{os.sep}")


def object_store_failure(exc: BaseException) -> str | None:
    """One line for an error an object store's client raised (credentials refused, an
    endpoint that does not answer), or None for any other error. Told by where it was
    raised: the traceback of ``exc`` or of an error it came from passes through the
    client's code."""
    seen = 0
    chain: BaseException | None = exc
    while chain is not None and seen < 8:
        tb = chain.__traceback__
        while tb is not None:
            if any(part in tb.tb_frame.f_code.co_filename for part in _OBJECT_STORE_CODE):
                # The client's own error: the one raised through its code, not a wrapper
                # raised while unwinding it (an event loop's context error).
                text = str(chain) or type(chain).__name__
                return (f"the object store refused the request or could not be reached ({type(chain).__name__}: "
                        f"{text}); check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                        "~/.aws/credentials, storage_options) and the endpoint (AWS_ENDPOINT_URL), on this machine "
                        "and on every worker")
            tb = tb.tb_next
        chain, seen = chain.__cause__ or chain.__context__, seen + 1
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pipeline`` console script and of ``python -m pipeline``.

    Returns
    -------
    int
        The exit status: 0, 1 for errors of the input, 2 for configuration errors, 130
        when interrupted, 143 when ``pipeline run`` is stopped by SIGTERM (``--help``
        and ``--version`` exit 0 through argparse).
    """
    args = _parser().parse_args(argv)
    # A warning is a line of the run's output, not a pointer into the package's source.
    warnings.formatwarning = one_line_warning
    handlers = {
        "run": _cmd_run,
        "inspect": _cmd_inspect,
        "demo-data": _cmd_demo_data,
        "bench": _cmd_bench,
    }
    try:
        # An unattended run is stopped with SIGTERM (a service manager, a batch
        # scheduler, `timeout`): it says so, and stops as a Ctrl-C does.
        with _terminate_as_interrupt() if args.command == "run" else contextlib.nullcontext():
            return handlers[args.command](args)
    except ConfigError as exc:
        print(f"pipeline {args.command}: {exc}", file=sys.stderr)
        return 2
    except PipelineError as exc:
        print(f"pipeline {args.command}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`pipeline inspect STORE | head`): nothing left to say.
        # Point stdout at /dev/null so that the interpreter's final flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except _Terminated:
        print(TERMINATED_LINE, file=sys.stderr)
        return TERMINATED_STATUS
    except KeyboardInterrupt:
        print("interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - an object store's refusal is said in one line; a bug still raises
        said = object_store_failure(exc)
        if said is None:
            raise
        print(f"pipeline {args.command}: {said}", file=sys.stderr)
        return 1


def entry() -> NoReturn:
    """The ``pipeline`` console script and ``python -m pipeline``: :func:`main`, then
    the process's exit.

    Once the command is done and nothing but this thread runs, the exit handlers run
    (``atexit``: temporary directories, logging, multiprocessing's helpers) and the
    standard streams are flushed, as at any exit; then the process ends without the
    interpreter's teardown of every module and object, which took 0.5 s after a ``pipeline
    run``, a sixth of its fixed start-up (benchmarks/README.md). Every file a command
    writes is closed before :func:`main` returns.
    """
    if "numpy" not in sys.modules:
        # The command's own process does no linear algebra (its workers are processes of
        # their own, given one BLAS thread by distributed). numpy's OpenBLAS starts a
        # thread per core at import that spins for 0.15 s of CPU, on the core the worker
        # server imports on meanwhile: set before numpy is imported, unless the user did.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    code = main()
    if any(t is not threading.main_thread() and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)  # a thread still has work: the interpreter's own exit waits for it
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone, or a stream closed
            stream.flush()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
