"""CSV and Parquet tables joined along time into one lazy ``(rows, columns)`` float32 array.

Parquet row counts and column names come from the file footer (no data read); each row
group becomes one dask chunk. CSV has no footer: the cheapest correct row count is a
newline count of the raw bytes (one sequential read per file, parallel across files,
about 1-2 GB/s per core), and each file becomes one chunk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import dask.array as da
import fsspec
import numpy as np

from pipeline.errors import FormatMismatchError, InvalidValueError, LoaderError, MissingColumnError, MissingDependencyError

__all__ = ["TablePart", "probe_table", "table_array"]


def _pyarrow() -> Any:
    try:
        import pyarrow  # noqa: F401
    except ImportError:  # pragma: no cover
        raise MissingDependencyError("Reading CSV and Parquet", "pyarrow", "tabular") from None
    return pyarrow


@dataclass(frozen=True, slots=True)
class TablePart:
    """One chunk of the joined table: rows ``[lo, hi)`` of row group / file ``path``."""

    path: str
    fmt: str
    group: int
    rows: int
    columns: tuple[str, ...]
    first_ts: Any = None
    last_ts: Any = None


def _parquet_parts(path: str, timestamp: str | None, so: dict) -> list[TablePart]:
    _pyarrow()
    import pyarrow.parquet as pq

    try:
        with fsspec.open(path, "rb", **so) as fh:
            meta = pq.ParquetFile(fh).metadata
            schema = meta.schema.to_arrow_schema()
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for bad files
        raise FormatMismatchError(path, f"expected a Parquet file, could not read its footer ({exc})") from None
    cols = tuple(schema.names)
    ts_idx = cols.index(timestamp) if timestamp in cols else None
    parts = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        first = last = None
        if ts_idx is not None:
            st = rg.column(ts_idx).statistics
            if st is not None and st.has_min_max:
                first, last = st.min, st.max
        parts.append(TablePart(path, "parquet", g, rg.num_rows, cols, first, last))
    return parts


def _csv_parts(path: str, so: dict) -> list[TablePart]:
    try:
        with fsspec.open(path, "rb", **so) as fh:
            header = fh.readline()
            count = 0
            last = header
            while True:
                block = fh.read(1 << 24)
                if not block:
                    break
                count += block.count(b"\n")
                last = block
            if last and not last.endswith(b"\n"):
                count += 1  # a final line without a newline
    except OSError as exc:
        raise LoaderError(path, f"cannot read ({exc})") from None
    try:
        cols = tuple(c.strip().strip('"') for c in header.decode("utf-8").rstrip("\r\n").split(","))
    except UnicodeDecodeError:
        raise FormatMismatchError(path, "expected UTF-8 CSV text, found undecodable bytes in the header") from None
    if not header.strip():
        raise FormatMismatchError(path, "expected a CSV header line, found an empty file")
    return [TablePart(path, "csv", 0, count, cols)]


def probe_table(path: str, fmt: str, timestamp: str | None, so: dict) -> list[TablePart]:
    """Row counts and column names of one file, from metadata only (Parquet) or a
    newline count (CSV)."""
    return _parquet_parts(path, timestamp, so) if fmt == "parquet" else _csv_parts(path, so)


def _read_part(part: TablePart, columns: tuple[str, ...], timestamp: str | None, nan: str,
               fill_value: float, so: dict) -> np.ndarray:
    pa = _pyarrow()
    import pyarrow.compute as pc

    try:
        if part.fmt == "parquet":
            import pyarrow.parquet as pq

            with fsspec.open(part.path, "rb", **so) as fh:
                table = pq.ParquetFile(fh).read_row_group(part.group, columns=list(columns))
        else:
            import pyarrow.csv as pacsv

            with fsspec.open(part.path, "rb", **so) as fh:
                table = pacsv.read_csv(fh, convert_options=pacsv.ConvertOptions(include_columns=list(columns)))
    except Exception as exc:  # noqa: BLE001
        raise LoaderError(part.path, f"cannot read {part.fmt} data ({exc})") from None
    if table.num_rows != part.rows:
        raise LoaderError(part.path, f"expected {part.rows} rows from its metadata, read {table.num_rows}")
    out = np.empty((table.num_rows, len(columns)), dtype=np.float32)
    for j, name in enumerate(columns):
        col = table.column(name)
        try:
            out[:, j] = pc.cast(col, pa.float32()).to_numpy(zero_copy_only=False)
        except Exception as exc:  # noqa: BLE001
            raise LoaderError(part.path, f"column {name!r}: expected numbers, got {col.type} ({exc})") from None
    if nan != "drop":
        bad = ~np.isfinite(out)
        if bad.any():
            if nan == "raise":
                r, c = np.argwhere(bad)[0]
                raise InvalidValueError(
                    part.path, f"NaN or inf in column {columns[c]!r} at row {int(r)} of "
                    f"{'row group ' + str(part.group) if part.fmt == 'parquet' else 'the file'}; "
                    "set source.nan: drop or fill")
            out[bad] = fill_value
    return out


def table_array(parts: Sequence[TablePart], columns: tuple[str, ...], timestamp: str | None, nan: str,
                fill_value: float, so: dict) -> da.Array:
    """One blockwise layer over the parts: each part is one chunk of the joined table."""
    specs = np.empty(len(parts), dtype=object)
    for i, p in enumerate(parts):
        specs[i] = p
    # Name the layer by its content: a fixed name would make two sources share keys.
    from dask.base import tokenize

    token = tokenize([(p.path, p.group, p.rows) for p in parts], columns, nan, fill_value)
    files = da.from_array(specs, chunks=1, name=f"table-parts-{token}")

    def read(block: np.ndarray) -> np.ndarray:
        return _read_part(block[0], columns, timestamp, nan, fill_value, so)

    return files.map_blocks(
        read,
        dtype=np.float32,
        chunks=(tuple(p.rows for p in parts), (len(columns),)),
        new_axis=1,
        token="read-table",
        meta=np.empty((0, 0), dtype=np.float32),
    )


def check_columns(parts: Sequence[TablePart], columns: Sequence[str] | None, timestamp: str | None) -> tuple[str, ...]:
    """The columns to read: the requested ones (each present in every file) or every
    column but the timestamp."""
    first = parts[0]
    wanted = tuple(columns) if columns else tuple(c for c in first.columns if c != timestamp)
    for p in parts:
        missing = [c for c in wanted if c not in p.columns]
        if missing:
            raise MissingColumnError(p.path, f"missing column(s) {missing}; the file has {list(p.columns)}")
        if timestamp and timestamp not in p.columns:
            raise MissingColumnError(p.path, f"missing timestamp column {timestamp!r}; the file has {list(p.columns)}")
    return wanted


def check_time_order(parts: Sequence[TablePart]) -> None:
    """Files must join in time order: each file starts no earlier than the previous ends."""
    prev = None
    for p in parts:
        if p.first_ts is None:
            continue
        if prev is not None and prev.last_ts is not None and p.first_ts < prev.last_ts and p.path != prev.path:
            raise LoaderError(
                p.path, f"starts at {p.first_ts}, before the previous file {prev.path} ends at {prev.last_ts}; "
                "files must be in time order when sorted by name")
        prev = p
