"""YAML pipeline configuration -> frozen dataclasses, with key-path error messages.

Config flows one way: YAML (``yaml.safe_load`` only) -> these typed objects ->
keyword-only arguments of library functions. Library functions never read YAML.

Every validation failure raises :class:`pipeline.errors.ConfigError` whose message is one
line: ``<key.path>: expected <what>, got <value>``. The CLI prints it and exits with 2.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import yaml

from pipeline.errors import ConfigError

__all__ = [
    "ClusterConfig",
    "Config",
    "FeaturesConfig",
    "OutputConfig",
    "SourceConfig",
    "StreamConfig",
    "WindowsConfig",
    "apply_overrides",
    "config_fingerprint",
    "load_config",
    "parse_config",
]


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Where computation runs: a LocalCluster (``address: null``) or a remote scheduler."""

    address: str | None = None
    scheduler_file: str | None = None
    n_workers: int = 2
    threads_per_worker: int = 1
    #: LocalCluster only: workers as processes (``False``: threads of the run's own
    #: process, nothing to start or fork; the GIL then limits what they compute at
    #: once, so a large build wants processes).
    processes: bool = True
    # Kept as written (4GiB, 0.5, auto): dask reads it when the workers start.
    memory_limit: str | float | None = "auto"
    # 127.0.0.1 so a laptop run never exposes the dashboard to the network; ":0" picks a
    # free port, which avoids clashes between concurrent runs.
    dashboard_address: str | None = "127.0.0.1:0"
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """Raw input files and how to read them (see :func:`pipeline.loaders.open_source`).

    ``pipeline run`` reads tables (CSV, Parquet, LOBSTER, FI-2010): its features and labels
    read named columns. Array files (npy, npz, images, HDF5) are refused before a cluster
    starts; they go through the Python API (``pipeline.load``, ``pipeline.windows``,
    ``pipeline.write``), whose array options (``dataset``, ``key``, ``shape``, ``mode``)
    have no key here.
    """

    paths: str | tuple[str, ...]
    format: str | None = None
    combine: Literal["stack", "concat"] | None = None
    columns: tuple[str, ...] | None = None
    timestamp: str | None = None
    #: Unit of a numeric timestamp column since the epoch; ``None``: integers are
    #: nanoseconds and floats seconds (see :mod:`pipeline.loaders.columns`). Under
    #: ``source.date`` the unit applies to the times of day: numbers since midnight
    #: (``null``: integers nanoseconds, as NASDAQ ITCH gives them, and floats seconds).
    timestamp_unit: Literal["s", "ms", "us", "ns"] | None = None
    nan: Literal["raise", "drop", "fill"] = "raise"
    #: The value ``nan: fill`` writes (LOBSTER's empty levels: 0 gives back its size of 0).
    fill_value: float = 0.0
    on_error: Literal["raise", "skip"] = "raise"
    chunk_rows: int | None = None
    #: Tables: the dtype values are read in; features and labels are computed from
    #: them, and the stored windows stay float32.
    dtype: Literal["float32", "float64"] = "float32"
    storage_options: dict[str, Any] = field(default_factory=dict)
    #: CSV only: whether the first line is a header (``auto``: decided per file, for a
    #: folder that mixes files with and without one); ``names`` names the columns of a
    #: headerless file (``header: false`` or ``auto``).
    header: bool | Literal["auto"] = True
    names: tuple[str, ...] | None = None
    #: CSV only: the field delimiter (one character; ``";"`` where numbers have a
    #: decimal comma) and the decimal mark of its numbers.
    delimiter: str = ","
    decimal: Literal[".", ","] = "."
    #: ``{canonical: source_name}``: feeds with their own column names
    #: (``bid_price_1: "bids[0].price"``); a list of alternatives
    #: (``ask_price_1: [best_ask_price, askPrice]``) for a vendor that renames a column
    #: over time: each file reads the first it has.
    rename: dict[str, Any] = field(default_factory=dict)
    #: CSV, Parquet: ``{column or glob: factor}`` for fixed-point integer columns
    #: (Databento MBP-10 prices: ``"*_px_*": 1.0e-9``), scaled exactly in float64.
    scale: dict[str, float] = field(default_factory=dict)
    #: CSV, Parquet: values that mean "no value", read as NaN before ``nan`` applies: a
    #: list for every column, or ``{column or glob: [values]}``.
    missing: dict[str, Any] | tuple[float, ...] | None = None
    #: :class:`pipeline.features.sessions.SessionSpec`, or ``None``: ``file`` when there
    #: are several files.
    sessions: Any = None
    #: :class:`pipeline.features.sessions.InstrumentSpec` or ``None`` (one instrument).
    instrument: Any = None
    #: :class:`pipeline.features.sessions.DateSpec` or ``None``: each file's date from its
    #: path (``{path: ...}``), or each row's from a date column (``{column: ...}``), for
    #: timestamps that are times of day (NASDAQ ITCH's ns since midnight).
    date: Any = None
    #: LOBSTER only: its trading-halt messages (event type 7), whose rows repeat the
    #: book row before them: ``drop`` leaves those rows out of the series (no window,
    #: lookback or label horizon counts them as events), ``keep`` keeps them (their
    #: ``event_type`` column is 7, their ``event_price`` the halt code: -1 halt, 0
    #: quote, 1 resume). ``null``: ``drop`` for LOBSTER; set for another format it is
    #: refused.
    halts: Literal["drop", "keep"] | None = None


@dataclass(frozen=True, slots=True)
class FeaturesConfig:
    """Per-step features, their normalization and the policy for NaN windows."""

    steps: tuple[Any, ...] = ()  # parsed FeatureSpecs; the defaults come from DEFAULT_STEPS
    #: :class:`pipeline.features.splits.NormalizeSpec`. A feature that does not vary
    #: where the statistics are fitted (a constant price, a flat day) keeps a std of 1:
    #: it is centred, never divided by zero.
    normalize: Any = "global"
    nan: Literal["raise", "drop", "fill"] = "drop"
    fill_value: float = 0.0


@dataclass(frozen=True, slots=True)
class WindowsConfig:
    """Window geometry, per the design: ``(n, size, F * len(scales))``."""

    size: int
    stride: int = 1
    scales: tuple[int, ...] = (1,)
    #: ``False`` stores per-step features once plus a window index; the streamer
    #: assembles the windows (about ``size`` times less disk for overlapping windows).
    materialize: bool = True


@dataclass(frozen=True, slots=True)
class OutputConfig:
    """The zarr store: location, splits, chunking and compression."""

    path: str
    #: Fractions by time (``{train: 0.8, val: 0.2}``) or dated splits: ``{from: ..., until: ...}``,
    #: ``{dates: [...]}``, each with an optional ``embargo: 1h``, or ``{file: splits.csv}`` (rows
    #: ``date,split``); see :func:`pipeline.features.splits.parse_splits`.
    splits: dict[str, Any] = field(default_factory=lambda: {"train": 1.0})
    #: :class:`pipeline.features.splits.FoldSpec`: walk-forward folds over sessions.
    folds: Any = None
    codec: Any = "blosc-lz4"
    chunk_samples: int | None = None
    target_chunk_mb: float = 4.0
    shard_chunks: int | None = None
    overwrite: bool = False
    storage_options: dict[str, Any] = field(default_factory=dict)
    #: An append whose new files hold a day for fewer instruments than the store:
    #: ``append`` warns and appends it (a file of the others for that day is refused
    #: later); ``refuse`` refuses it before anything is written, for an unattended job
    #: that reruns once the late files arrive. Not part of the fingerprint.
    on_partial_day: Literal["append", "refuse"] = "append"


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """Defaults for streaming the written store into training."""

    split: str = "train"
    batch_size: int = 256
    buffer_chunks: int = 4
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = False


@dataclass(frozen=True, slots=True)
class Config:
    """A whole pipeline run."""

    source: SourceConfig
    windows: WindowsConfig
    output: OutputConfig
    labels: Any
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    #: The validated mapping this config came from, for provenance (kept as YAML text).
    raw_yaml: str = ""


# -- generic coercion -------------------------------------------------------------------

_POSITIVE_INTS = {
    "n_workers", "threads_per_worker", "size", "stride", "chunk_rows", "chunk_samples",
    "shard_chunks", "batch_size", "buffer_chunks",
}  # fmt: skip
_POSITIVE_FLOATS = {"target_chunk_mb"}


#: What keys with their own validator accept, in the words of their errors (and of the
#: config reference, which describes every key by :func:`_describe`).
_ACCEPTS = {
    "memory_limit": "a size such as 4GiB or 500MB, a fraction of memory such as 0.5, auto, or null (no limit)",
    "dashboard_address": "a port such as 8787, or host:port such as 127.0.0.1:8787, or null (no dashboard)",
}


def _describe(tp: Any, name: str) -> str:
    if name in _ACCEPTS:
        return _ACCEPTS[name]
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [_describe(a, name) for a in args if a is not type(None)]
        text = " or ".join(parts)
        return f"{text} or null" if type(None) in args else text
    if origin is Literal:
        # One value beside other types (header: true, false or 'auto') is itself.
        return repr(args[0]) if len(args) == 1 else "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple:
        if not args:
            return "a list"
        item = _describe(args[0], name)
        # "a string" -> "a list of strings"; "a list of numbers" -> "a list of lists of
        # numbers"; "one of 'a', 'b'" -> "a list, each one of 'a', 'b'"
        if item.startswith("a list of "):
            return f"a list of lists of {item[len('a list of '):]}"
        return f"a list of {item.split(' ', 1)[1]}s" if item.startswith(("a ", "an ")) else f"a list, each {item}"
    if origin is dict or tp is dict:
        return "a mapping"
    if tp is int:
        return "a positive integer" if name in _POSITIVE_INTS else "an integer"
    if tp is float:
        return "a number"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a string"
    return "a value"


def _coerce(value: Any, tp: Any, path: str, name: str) -> Any:
    """Check ``value`` against the annotation ``tp``; return the (normalized) value."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path, name)
            except ConfigError:
                continue
        raise ConfigError(path, _describe(tp, name), value)
    if origin is Literal:
        if value in args:
            return value
        raise ConfigError(path, _describe(tp, name), value)
    if origin is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise ConfigError(path, _describe(tp, name), value)
        return tuple(_coerce(v, args[0], f"{path}.{i}", name) for i, v in enumerate(value))
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(path, "a mapping", value)
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(path, "true or false", value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(path, _describe(tp, name), value)
        if name in _POSITIVE_INTS and value <= 0:
            raise ConfigError(path, "a positive integer", value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(path, "a finite number", value)
        if name in _POSITIVE_FLOATS and value <= 0:
            raise ConfigError(path, "a positive number", value)
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(path, "a string", value)
        return value
    raise TypeError(f"unsupported annotation {tp!r} at {path}")  # a bug here, not user input


def _build(cls: type, value: Any, path: str, special: Mapping[str, Any] | None = None) -> Any:
    """Build dataclass ``cls`` from a mapping, naming unknown and missing keys."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigError(path, "a mapping", value)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name != "raw_yaml"}
    for key in value:
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(
                f"{path}.{key}" if path else str(key), "", detail=f"unknown key (expected one of: {known})"
            )
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key_path = f"{path}.{name}" if path else name
        if name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(key_path, "", detail=f"missing required key ({_describe(hints[name], name)})")
            continue
        if special and name in special:
            kwargs[name] = special[name](value[name], key_path)
        else:
            kwargs[name] = _coerce(value[name], hints[name], key_path, name)
    return cls(**kwargs)


# -- sections with their own validators ----------------------------------------------------


#: The per-step features of a config without ``features.steps``.
DEFAULT_STEPS = ("mid_price", "spread", "log_return")


def _feature_steps(value: Any, path: str) -> tuple[Any, ...]:
    from pipeline.features import FeatureSpec

    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        raise ConfigError(path, "a non-empty list of features", value)
    return tuple(FeatureSpec.from_mapping(v, f"{path}.{i}") for i, v in enumerate(value))


def _labels(value: Any, path: str) -> Any:
    from pipeline.features import LabelSpec

    return LabelSpec.from_mapping(value, path)


def _codec(value: Any, path: str) -> Any:
    from pipeline.storage import CodecSpec

    return CodecSpec.from_mapping(value, path)


def _splits(value: Any, path: str) -> dict[str, Any]:
    from pipeline.features.splits import parse_splits

    if value is None:  # null, as for other optional keys: the default, every sample in train
        return {"train": 1.0}
    return parse_splits(value, path)


def _folds(value: Any, path: str) -> Any:
    from pipeline.features.splits import FoldSpec

    return FoldSpec.from_value(value, path)


def _normalize(value: Any, path: str) -> Any:
    from pipeline.features.splits import NormalizeSpec

    return NormalizeSpec.from_value(value, path)


def _sessions(value: Any, path: str) -> Any:
    from pipeline.features.sessions import SessionSpec

    return SessionSpec.from_value(value, path)


def _instrument(value: Any, path: str) -> Any:
    from pipeline.features.sessions import InstrumentSpec

    return InstrumentSpec.from_value(value, path)


def _date(value: Any, path: str) -> Any:
    from pipeline.features.sessions import DateSpec

    return DateSpec.from_value(value, path)


def _rename(value: Any, path: str) -> dict[str, str | tuple[str, ...]]:
    """``{canonical: source}``, a value a source name or a list of alternatives (a vendor
    that renames a column from one day on): each file reads the first it has."""
    if value is None:
        return {}
    expected = "a mapping of canonical column name to the source's column name (or a list of alternative names)"

    def names(v: Any) -> tuple[str, ...] | None:
        items = (v,) if isinstance(v, str) else tuple(v) if isinstance(v, (list, tuple)) and v else None
        return items if items and all(isinstance(n, str) and n for n in items) else None

    if not isinstance(value, Mapping) or not all(isinstance(k, str) and names(v) for k, v in value.items()):
        raise ConfigError(path, expected, value)
    every = [n for v in value.values() for n in names(v)]
    if len(set(every)) != len(every):
        twice = sorted({n for n in every if every.count(n) > 1})
        raise ConfigError(path, f"distinct source column names ({', '.join(map(repr, twice))} given twice)", value)
    return {k: v if isinstance(v, str) else tuple(v) for k, v in value.items()}


def _scale(value: Any, path: str) -> dict[str, float]:
    """``source.scale``, validated by the loader's own rules."""
    from pipeline.loaders.conversions import ValueRules

    ValueRules.from_options(value, None, path.rsplit(".", 1)[0])
    return dict(value or {})


def _missing(value: Any, path: str) -> Any:
    """``source.missing``: a list of numbers, or a mapping of column (glob) to a list."""
    from pipeline.loaders.conversions import ValueRules

    ValueRules.from_options(None, value, path.rsplit(".", 1)[0])
    if isinstance(value, Mapping):
        return {k: tuple(v) if isinstance(v, (list, tuple)) else (v,) for k, v in value.items()}
    return None if value is None else tuple(value) if isinstance(value, (list, tuple)) else (value,)


def _format(value: Any, path: str) -> str | None:
    """``source.format``: a format the loaders know, or ``None`` (by suffix), checked
    here so that a typo stops the run before its cluster starts."""
    from pipeline.loaders.registry import NAMED, SUFFIXES

    known = sorted(set(SUFFIXES.values()) | set(NAMED))
    if value is None:
        return None
    if not isinstance(value, str) or value not in known:
        raise ConfigError(path, f"one of {', '.join(known)} or null (by suffix)", value)
    tables = ("csv", "parquet", "lobster", "fi2010")
    if value not in tables:  # known, but an array format: refused here, naming this key
        raise ConfigError(path, f"a table format ({', '.join(tables)}) or null: pipeline run computes features "
                          "and labels from named columns; arrays (npy, npz, HDF5, images) go through the Python "
                          "API (pipeline.load, pipeline.windows, pipeline.write)", value)
    return value


def _paths(value: Any, path: str) -> str | tuple[str, ...]:
    """``source.paths``: a path, glob or URL, or a non-empty list of them (an empty list
    or string would only be refused once the run lists the files)."""
    expected = "a path or glob (a string) or a non-empty list of them"
    paths = _coerce(value, str | tuple[str, ...], path, "paths")
    if isinstance(paths, str):
        if not paths.strip():
            raise ConfigError(path, expected, value)
        return paths
    if not paths:
        raise ConfigError(path, expected, value)
    for i, item in enumerate(paths):
        if not item.strip():
            raise ConfigError(f"{path}.{i}", "a path or glob (a non-empty string)", item)
    return paths


def _output_path(value: Any, path: str) -> str:
    """``output.path``: a non-empty string (an empty one is the working directory)."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(path, "a store path or URL (a non-empty string)", value)
    return value


def _csv_marks(source: SourceConfig, path: str) -> SourceConfig:
    """``source.delimiter`` and ``source.decimal`` checked by the loader's own rule
    (:func:`pipeline.loaders.tables.check_csv_marks`, which the loader applies again),
    so that ``--print-config`` refuses what the run would, naming the key path."""
    from pipeline.loaders.tables import check_csv_marks

    try:
        check_csv_marks(source.delimiter, source.decimal)
    except ConfigError as exc:
        if exc.path.startswith(f"{path}."):
            raise
        # A loader's message may name the bare option (delimiter): the key path is the section's.
        raise ConfigError(f"{path}.{exc.path}", exc.expected, exc.got) from None
    return source


def _halts(source: SourceConfig, path: str) -> SourceConfig:
    """``source.halts`` checked against ``source.format`` by the loader's own rule
    (:func:`pipeline.loaders.lobster.halts_option`): set for a format other than
    ``lobster`` it would change nothing, so it is refused when the config is read."""
    from pipeline.loaders.lobster import halts_option

    try:
        halts_option(source.halts, source.format)
    except ConfigError as exc:
        raise ConfigError(f"{path}.halts", exc.expected, exc.got) from None
    return source


def _calendar_times(source: SourceConfig, path: str) -> SourceConfig:
    """Refuse ``source.sessions: {calendar: ...}`` without ``source.timestamp``: each
    row's session is found from its time, which only a timestamp column gives, or
    LOBSTER's message files: its format named, or paths that name its order-book files
    (the loader checks the files it finds)."""
    spec = source.sessions
    paths = (source.paths,) if isinstance(source.paths, str) else tuple(source.paths)
    lobster = source.format == "lobster" or (source.format is None and any("orderbook" in p for p in paths))
    if spec is not None and spec.mode == "calendar" and not source.timestamp and not lobster:
        raise ConfigError(f"{path}.sessions", "", detail=f"calendar {spec.calendar} sessions place each row by its "
                          f"time; set {path}.timestamp to the timestamp column")
    return source


def _check_order_ids(source: SourceConfig, features: FeaturesConfig, labels: Any) -> None:
    """Refuse LOBSTER's ``order_id`` read in float32: its ids (8 digits and more) run
    past 2**24, from where float32 rounds integers to even ones, and more, so two orders
    would share an id, silently.

    Raises
    ------
    ConfigError
        Naming ``source.dtype`` and the fix.
    """
    if source.format != "lobster" or source.dtype != "float32":
        return
    from pipeline.features.steps import columns_read

    read = set(source.columns or ()) | set(columns_read(features.steps, labels) or ())
    if "order_id" in read:
        raise ConfigError("source.dtype", "float64 when order_id is read (LOBSTER's order ids run past 2**24 = "
                          "16,777,216, beyond which float32 rounds integers: two orders would share an id)",
                          source.dtype)


def _cluster(value: Any, path: str) -> ClusterConfig:
    """The cluster section, its address checked as :func:`pipeline.remote.connect_remote`
    checks it before a client starts (syntax, scheme, port, TLS files set for an
    unencrypted address), so that ``--print-config`` refuses what the run would.

    What needs the file system (the TLS files, the scheduler file's folder) is checked
    when a run starts (:func:`pipeline.remote.check_remote`): a config is often written
    and checked on another machine than the one it runs on.
    """
    from pipeline.remote import check_address, check_encryption

    cfg = _build(ClusterConfig, value, path, {"memory_limit": _memory_limit,
                                              "dashboard_address": _dashboard_address})
    for name in ("scheduler_file", "tls_ca_file", "tls_cert_file", "tls_key_file"):
        given = getattr(cfg, name)
        if given is not None and not given.strip():
            raise ConfigError(f"{path}.{name}", "a file path (a non-empty string) or null", given)
    if cfg.address is not None:
        check_address(cfg.address, key=f"{path}.address")
        tls_files = any((cfg.tls_ca_file, cfg.tls_cert_file, cfg.tls_key_file))
        check_encryption(cfg.address, key=f"{path}.address", tls_files=tls_files)
    return cfg


def _memory_limit(value: Any, path: str) -> str | float | None:
    """``cluster.memory_limit`` as dask's LocalCluster reads it
    (``distributed.worker_memory.parse_memory_limit``): ``auto``, ``null`` (no limit), a
    number (at most 1: a fraction of the machine's memory; above: bytes) or a size that
    :func:`dask.utils.parse_bytes` reads (``4GiB``, ``500 MB``). Checked here, because
    the LocalCluster's own refusal is a traceback from inside its start.

    Returns
    -------
    The value as given (dask reads it the same way when the run starts).
    """
    if value is None or value == "auto":
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str) and value.strip():
        try:  # "0.5" is a fraction to dask, as 0.5 is
            number = float(value)
        except ValueError:
            from dask.utils import parse_bytes

            try:
                number = float(parse_bytes(value))
            except (ValueError, TypeError):
                raise ConfigError(path, _ACCEPTS["memory_limit"], value) from None
    else:
        raise ConfigError(path, _ACCEPTS["memory_limit"], value)
    # dask takes a negative size, or infinity, and fails on it once the workers start.
    if not math.isfinite(number) or number < 0:
        raise ConfigError(path, _ACCEPTS["memory_limit"], value)
    return value


def _dashboard_address(value: Any, path: str) -> str | None:
    """``cluster.dashboard_address``: ``host:port``, ``host`` (port 0: a free one), or a
    bare port (``8787``, ``":8787"``), which dask would open on every network interface:
    here it means the loopback address, as the default does, so that only a host written
    out (``0.0.0.0:8787``) exposes the dashboard. ``null``: no dashboard.

    Returns
    -------
    The address as ``host:port`` or ``host``, ``127.0.0.1:<port>`` for a bare port.
    """
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        host, port = "", str(value)
    elif isinstance(value, str) and value.strip() and not any(c.isspace() for c in value):
        host, sep, port = value.rpartition(":")
        if not sep:  # "8787" is a port, "localhost" a host
            host, port = ("", value) if value.isdigit() else (value, "0")
    else:
        raise ConfigError(path, _ACCEPTS["dashboard_address"], value)
    # dask splits host and port on every ":" (an IPv6 address is refused there too).
    if ":" in host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(path, _ACCEPTS["dashboard_address"], value)
    return f"{host or '127.0.0.1'}:{int(port)}"


def _scales(value: Any, path: str) -> tuple[int, ...]:
    scales = _coerce(value, tuple[int, ...], path, "size")
    if not scales:
        raise ConfigError(path, "a non-empty list of positive integers", value)
    if len(set(scales)) != len(scales):
        raise ConfigError(path, "distinct scales", value)
    return scales


def _features(value: Any, path: str) -> FeaturesConfig:
    """The features section; defaults (steps, normalize) are parsed like given values, so
    a config that leaves them out gets the same typed objects."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigError(path, "a mapping", value)
    value = {"steps": list(DEFAULT_STEPS), "normalize": "global", **value}
    return _build(FeaturesConfig, value, path, {"steps": _feature_steps, "normalize": _normalize})


def parse_config(data: Any) -> Config:
    """Validate a mapping (for example from ``yaml.safe_load``) into a :class:`Config`.

    Parameters
    ----------
    data
        The whole configuration mapping.

    Returns
    -------
    Config

    Raises
    ------
    ConfigError
        For the first unknown key, missing key or wrongly typed value, with its key path.
    """
    if not isinstance(data, Mapping):
        raise ConfigError("<root>", "a mapping of sections", data)
    sections = {
        "cluster": _cluster,
        "source": lambda v, p: _calendar_times(_halts(_csv_marks(_build(SourceConfig, v, p, {
            "paths": _paths, "sessions": _sessions, "instrument": _instrument, "date": _date, "rename": _rename,
            "format": _format, "scale": _scale, "missing": _missing}), p), p), p),
        "features": _features,
        "windows": lambda v, p: _build(WindowsConfig, v, p, {"scales": _scales}),
        "labels": _labels,
        "output": lambda v, p: _build(OutputConfig, v, p, {"path": _output_path, "splits": _splits,
                                                           "codec": _codec, "folds": _folds}),
        "stream": lambda v, p: _build(StreamConfig, v, p),
    }
    for key in data:
        if key not in sections:
            raise ConfigError(
                str(key), "", detail=f"unknown section (expected one of: {', '.join(sections)})"
            )
    kwargs: dict[str, Any] = {}
    for name, build in sections.items():
        if name not in data:
            if name in ("source", "windows", "output"):
                raise ConfigError(name, "", detail="missing required section")
            if name == "labels":
                kwargs[name] = _labels({}, name)
            continue
        kwargs[name] = build(data[name], name)
    if "features" not in kwargs:
        kwargs["features"] = _features({}, "features")
    _check_order_ids(kwargs["source"], kwargs["features"], kwargs["labels"])
    raw = yaml.safe_dump(_plain(data), sort_keys=False)
    return Config(**kwargs, raw_yaml=raw)


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides (values parsed as YAML) to a config mapping.

    ``windows.size=128`` sets an integer, ``windows.scales=[1,4]`` a list,
    ``cluster.address=null`` clears a value; ``features.steps.2.window=50`` indexes lists.
    """
    result = _plain(data)
    for item in overrides:
        if "=" not in item:
            raise ConfigError("--set", "key.path=value", item)
        key, _, text = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise ConfigError("--set", "key.path=value", item)
        try:
            value = _safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            raise ConfigError(key, "a YAML value", text, detail=_unparsed_value(key, text)) from None
        node: Any = result
        for depth, part in enumerate(parts[:-1]):
            here = ".".join(parts[: depth + 1])
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(here, f"a list index below {len(node)}", part)
                node = node[int(part)]
            elif isinstance(node, dict):
                node = node.setdefault(part, {})
            else:
                raise ConfigError(here, "a mapping or list to index into", node)
        last = parts[-1]
        if isinstance(node, list):
            if not last.isdigit() or int(last) >= len(node):
                raise ConfigError(key, f"a list index below {len(node)}", last)
            node[int(last)] = value
        elif isinstance(node, dict):
            node[last] = value
        else:
            raise ConfigError(key, "a mapping or list to index into", node)
    return result


def _unparsed_value(key: str, text: str) -> str:
    """What ``--set key=text`` says when YAML cannot parse ``text`` alone, with the
    override that quotes it: a ``,`` or a leading ``%`` (``source.decimal=,``,
    ``source.date.format=%Y%m%d``) is YAML syntax, but fine as a string."""
    quoted = json.dumps(text)  # a JSON string is a YAML double-quoted scalar
    # The single quotes keep the shell from eating the double quotes.
    shown = f"--set '{key}={quoted}'" if "'" not in quoted else f"--set {key}={quoted}"
    return f"expected a YAML value, got {text!r}; quote a string: {shown}"


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping holding one key twice.

    YAML says keys are unique, but PyYAML keeps the last of two silently: a second
    ``windows:`` section, pasted below the first, would replace it unseen."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.setdefault(key, line)
            except TypeError:  # an unhashable key: the base constructor says so
                break
            if first != line:
                raise _DuplicateKey(key, first, line)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2 reads 1e-9 and 1.5e3 as numbers; PyYAML (YAML 1.1) wants a dot and a sign
# (1.0e-9, 1.5e+3) and reads them as strings, which a number key then refused.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key: Any, first: int, second: int):
        super().__init__(f"duplicate key {key!r}")
        self.key, self.first, self.second = key, first, second


def _safe_load(stream: Any) -> Any:
    """``yaml.safe_load``, refusing duplicate keys (:class:`_UniqueKeyLoader`)."""
    loader = _UniqueKeyLoader(stream)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_config(
    path: str | os.PathLike[str],
    *,
    overrides: Sequence[str] = (),
    scheduler: str | None = None,
) -> Config:
    """Read a YAML file, apply ``--set`` overrides and ``--scheduler``, and validate.

    Parameters
    ----------
    path
        The YAML file.
    overrides
        ``key.path=value`` strings, applied in order.
    scheduler
        A scheduler address that replaces ``cluster.address``.

    Raises
    ------
    ConfigError
        For an unreadable file, invalid YAML or an invalid value.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            data = _safe_load(fh)
    except OSError as exc:
        raise ConfigError(str(path), "a readable YAML file", detail=f"cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), "", detail="not UTF-8 text") from None
    except _DuplicateKey as exc:
        raise ConfigError(str(path), "", detail=f"key {exc.key!r} appears twice, at lines {exc.first} and "
                          f"{exc.second} of one mapping (YAML would keep the last silently); keep one") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise ConfigError(str(path), "", detail=f"invalid YAML{line}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(str(path), "a mapping of sections", data)
    data = apply_overrides(data, overrides)
    if scheduler:
        data.setdefault("cluster", {})
        if not isinstance(data["cluster"], dict):
            raise ConfigError("cluster", "a mapping", data["cluster"])
        data["cluster"]["address"] = scheduler
    return parse_config(data)


def config_fingerprint(config: Config) -> str:
    """Hash of everything that determines the stored data.

    The ``cluster`` and ``stream`` sections, ``output.overwrite`` and
    ``output.on_partial_day`` are left out: running the same config on another cluster,
    streaming it differently, or appending under another policy must not be taken as a
    different data set (it would refuse to resume or append). So is ``source.dtype: float32``,
    the default written out: stores built before the key existed keep their fingerprint.
    """
    return _fingerprint_of(config.raw_yaml)


@functools.lru_cache(maxsize=8)
def _fingerprint_of(raw_yaml: str) -> str:
    # Asked for more than once per run (parsing the YAML again took a run 0.05 s each time).
    canonical = json.dumps(_fingerprinted(raw_yaml), sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def config_differences(stored_yaml: str, raw_yaml: str, limit: int = 5) -> list[str]:
    """The key paths where two configs differ in what the fingerprint covers, as
    ``"windows.stride: 2 -> 3"`` (``limit`` of them, sorted): what a refusal of a store
    of another fingerprint names.

    A key written as one value on one side and as a mapping on the other is one
    difference, not one per field of the mapping; ``output.codec`` is compared as the
    codec each side parses to, in words (``output.codec: blosc lz4 clevel 5 noshuffle
    -> zstd clevel 5``), an unset codec as the default it stands for.
    """
    try:
        a, b = _fingerprinted(stored_yaml), _fingerprinted(raw_yaml)
    except yaml.YAMLError:
        return []
    return [f"{key}: {text}" for key, text in sorted(_differences(a, b, ""))[:limit]]


class _Unset:
    """A key one of two configs does not hold."""

    def __repr__(self) -> str:
        return "(unset)"


_UNSET = _Unset()


def _differences(a: Any, b: Any, path: str) -> list[tuple[str, str]]:
    """``(key path, "old -> new")`` for each difference between two config values."""
    if path in _COMPARED_AS:
        text = _COMPARED_AS[path](a, b)
        return [(path, text)] if text else []
    if (isinstance(a, Mapping) or isinstance(b, Mapping)) and all(
            isinstance(v, Mapping) or v is _UNSET for v in (a, b)):
        da, db = ({} if v is _UNSET else v for v in (a, b))
        return [d for key in {**da, **db}
                for d in _differences(da.get(key, _UNSET), db.get(key, _UNSET), f"{path}.{key}" if path else str(key))]
    a, b = _iso(a), _iso(b)
    return [] if a == b else [(path, f"{a!r} -> {b!r}")]


def _iso(value: Any) -> Any:
    """A config value as compared and shown: a date as its ISO text (YAML reads an
    unquoted 2026-01-06 as a date, shown as ``datetime.date(2026, 1, 6)``, and unequal
    to the quoted ``"2026-01-06"`` that means the same)."""
    import datetime

    return value.isoformat() if isinstance(value, (datetime.date, datetime.datetime)) else value


def _codec_change(a: Any, b: Any) -> str:
    """``output.codec``'s change in words, or ``""`` when equal. Compared field by field,
    a short name (``zstd``) against a mapping was a difference per field, fields that do
    not apply to the new codec among them (``output.codec.cname: 'lz4' -> (unset)``)."""
    from pipeline.storage import CodecSpec

    if a == b:
        return ""
    default = OutputConfig.__dataclass_fields__["codec"].default
    try:
        words = [CodecSpec.from_mapping(default if v is _UNSET else v, "output.codec").in_words() for v in (a, b)]
    except ConfigError:  # a stored config of an older version, say: as written
        return f"{a!r} -> {b!r}"
    if words[0] == words[1]:  # written otherwise (a short name, an unset default): the fingerprint differs
        return f"{a!r} -> {b!r} (the same codec, {words[0]}, written otherwise)"
    return f"{words[0]} -> {words[1]}"


#: Keys whose values are compared as what they mean, not field by field.
_COMPARED_AS = {"output.codec": _codec_change}


def _fingerprinted(raw_yaml: str) -> dict[str, Any]:
    """The part of a config the fingerprint covers (see :func:`config_fingerprint`)."""
    data = yaml.safe_load(raw_yaml) or {}
    data.pop("cluster", None)
    data.pop("stream", None)
    if isinstance(data.get("output"), dict):
        data["output"].pop("overwrite", None)
        # What an append may do, not what the store holds: set on an existing store's
        # config (for a nightly job) it must still append to it.
        data["output"].pop("on_partial_day", None)
    if isinstance(data.get("source"), dict) and data["source"].get("dtype") == "float32":
        del data["source"]["dtype"]  # the default, written out: the same data as before the key existed
    return data
