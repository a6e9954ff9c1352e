"""Text files as the table readers meet them: opened and decompressed as read, lines
counted and split into parts, fields split and told apart from a header.

CSV and LOBSTER files have no footer: the cheapest correct row count is a newline count
of the raw bytes (one sequential read per file, about 1-2 GB/s per core), which also
gives the byte offsets where each part of ``chunk_rows`` rows starts, so a file of
millions of rows is read by parts in parallel. Trailing blank lines are no rows.
"""

from __future__ import annotations

import io
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

import fsspec
import numpy as np

from pipeline.errors import FormatMismatchError, LoaderError, MissingDependencyError
from pipeline.loaders.registry import compression_of

__all__ = ["compressed_kind", "count_lines", "is_datum", "is_number", "looks_like_data", "open_text",
           "previous_line", "read_range", "require_pyarrow", "split_fields", "text_ranges", "trailing_blank_lines"]


def require_pyarrow() -> Any:
    """The pyarrow module, or an install hint."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:  # pragma: no cover
        raise MissingDependencyError("Reading CSV and Parquet", "pyarrow", "tabular") from None
    return pyarrow


def open_text(path: str, so: dict) -> Any:
    """A text file (CSV, LOBSTER) opened for reading its bytes: decompressed as read when
    its name ends in a compression suffix (``.csv.gz``, ``.bz2``, ``.xz``, ``.zst``)."""
    codec = compression_of(path)
    if codec == "zstd":  # fsspec's zstd needs the zstandard package; pyarrow has the codec
        return _zstd_text(path, so)
    return fsspec.open(path, "rb", compression=codec, **so)


class _ArrowRaw(io.RawIOBase):
    """A pyarrow input stream as a raw Python file, so that ``io.BufferedReader`` gives
    it ``readline`` and line iteration (pyarrow's streams have neither)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._stream.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


@contextmanager
def _zstd_text(path: str, so: dict) -> Iterator[Any]:
    """A zstd-compressed file's bytes, decompressed as read by pyarrow's codec."""
    pa = require_pyarrow()
    with fsspec.open(path, "rb", **so) as raw:
        stream = pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), "zstd")
        with io.BufferedReader(_ArrowRaw(stream), 1 << 20) as fh:
            yield fh


def is_number(field: str) -> bool:
    """Whether a CSV field parses as a number (tells a data line from a header)."""
    try:
        float(field)
    except ValueError:
        return False
    return True


def is_datum(field: str) -> bool:
    """Whether a CSV field is a value rather than a name: a number, or a date or time
    (``2026-01-05``, ``2026-01-05 09:30:00.123``, ``09:30:00``)."""
    if is_number(field):
        return True
    text = field.strip()
    if len(text) >= 8 and text[:1].isdigit():
        try:
            np.datetime64(text.replace(" ", "T").rstrip("Z"))
            return True
        except ValueError:
            pass
        parts = text.split(":")
        return len(parts) == 3 and all(is_number(p) for p in parts)
    return False


def looks_like_data(fields: Sequence[str]) -> bool:
    """A first line most of whose fields are values (numbers, dates, times) is data: a
    header names columns, and column names are rarely numbers."""
    values = sum(is_datum(f) for f in fields)
    return values > 0 and values * 2 > len(fields)


#: The first bytes of compressed files, by codec (for a message about a file that is).
_SIGNATURES = {b"\x1f\x8b": "gzip", b"BZh": "bz2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd",
               b"PK\x03\x04": "zip", b"\x04\x22\x4d\x18": "lz4"}


#: The compression suffix of each codec the text readers decompress.
_CODEC_SUFFIX = {"gzip": ".gz", "bz2": ".bz2", "xz": ".xz", "zstd": ".zst"}


def compressed_kind(head: bytes) -> str | None:
    """The codec whose signature ``head`` (a file's first bytes) starts with, or None."""
    return next((codec for sig, codec in _SIGNATURES.items() if head.startswith(sig)), None)


def _codec_mismatch(path: str, so: dict) -> FormatMismatchError | None:
    """For a file whose compression suffix (``.csv.zst``) failed to decompress: the
    error naming what its first bytes are instead (another codec's signature, or
    uncompressed text), as for a plain ``.csv`` holding compressed bytes; else None."""
    codec = compression_of(path)
    if codec is None:
        return None
    try:
        with fsspec.open(path, "rb", **so) as raw:
            head = raw.read(8)
    except OSError:
        return None
    found = compressed_kind(head)
    if found == codec or not head:
        return None
    suffix = _CODEC_SUFFIX[codec]
    if found is None:
        what, fix = "bytes that are not", f"if it is plain text, name it without {suffix}"
    else:
        known = _CODEC_SUFFIX.get(found)
        what = f"{found}-compressed bytes (its first bytes are the {found} signature), not"
        fix = (f"name it with its compression suffix (.csv{known} for CSV), which is read decompressed" if known else
               "decompress it first (the text readers decompress .gz, .bz2, .xz and .zst)")
    return FormatMismatchError(path, f"its {suffix} suffix says {codec}, but it holds {what} {codec}-compressed; "
                               f"{fix}")


def split_fields(line: bytes, path: str, delimiter: str = ",") -> list[str]:
    """The ``delimiter``-separated fields of one CSV line, unquoted (for header probes
    only); a UTF-8 byte order mark before the first (Excel's, pandas'
    ``encoding="utf-8-sig"``) is no part of its name, as pyarrow's reader drops it."""
    try:
        text = line.decode("utf-8-sig").rstrip("\r\n")
    except UnicodeDecodeError:
        codec = compressed_kind(line)
        if codec is not None:
            known = _CODEC_SUFFIX.get(codec)
            fix = (f"name it with its compression suffix (.csv{known}), which is read decompressed" if known else
                   "decompress it first (the text readers decompress .gz, .bz2, .xz and .zst)")
            raise FormatMismatchError(path, f"expected CSV text, found {codec}-compressed bytes (its first bytes are "
                                      f"the {codec} signature); {fix}") from None
        raise FormatMismatchError(path, "expected UTF-8 CSV text, found undecodable bytes in its first line") from None
    return [c.strip().strip('"') for c in text.split(delimiter)]


#: Bytes per read while counting a text file's lines.
_READ_BLOCK = 1 << 24


#: Bytes of the second line :func:`count_lines` keeps (for its first fields).
_HEAD_BYTES = 1 << 16


def count_lines(path: str, so: dict, every: int = 0, base: int = 0) -> tuple[bytes, int, list[int], bytes]:
    """The first line of a text file, its number of lines (a last line without a
    newline counts; blank lines at its end do not, as pyarrow's reader and pandas skip
    them), with ``every`` the byte offset where each line ``base + k * every``
    (``k >= 1``) starts, and the bytes after the first line (up to
    :data:`_HEAD_BYTES`, or to the end of the second line if that is longer), from one
    sequential read.

    Offsets are found only in the blocks that hold them, so a file without parts costs
    a newline count."""
    starts: list[int] = []
    try:
        with open_text(path, so) as fh:
            first = fh.readline()
            count = 1 if first.endswith(b"\n") else 0  # newlines so far: line i starts after newline i
            pos, last, head = len(first), first, b""  # head: the bytes after the first line
            tail = first  # the file's last bytes, for its blank lines at the end
            target = base + every if every else None
            if target is not None and target <= count:  # line 1 starts right after the first line
                starts.append(pos)
                target += every
            while True:
                block = fh.read(_READ_BLOCK)
                if not block:
                    break
                if len(head) < _HEAD_BYTES or b"\n" not in head:  # the first data lines under a header
                    head += block[:_HEAD_BYTES]
                tail = block[-_HEAD_BYTES:] if len(block) >= _HEAD_BYTES else (tail + block)[-_HEAD_BYTES:]
                n = block.count(b"\n")
                if target is not None and count + n >= target:
                    newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == ord("\n"))
                    while count + n >= target:
                        starts.append(pos + int(newlines[target - count - 1]) + 1)
                        target += every
                count += n
                pos += len(block)
                last = block
            if last and not last.endswith(b"\n"):
                count += 1  # a final line without a newline
            count -= trailing_blank_lines(tail, whole=pos <= len(tail))
    except FileNotFoundError:
        raise LoaderError(path, "no such file") from None
    except (OSError, EOFError) as exc:
        raise _codec_mismatch(path, so) or LoaderError(path, f"cannot read ({exc})") from None
    # A newline that ends the file starts no line; nor does a part start in its blank end.
    return first, count, [o for k, o in enumerate(starts) if base + (k + 1) * every < count], head


def trailing_blank_lines(tail: bytes, whole: bool = False) -> int:
    """How many empty lines (``\\n`` or ``\\r\\n`` alone) end a text file whose last bytes
    are ``tail`` (``whole``: ``tail`` is the whole file). An editor or a concatenation
    leaves them (``df.to_csv() + "\\n"``); pyarrow's reader and pandas skip them."""
    body = tail.rstrip(b"\r\n")
    end = tail[len(body):]
    lines = end.count(b"\n") + int(bool(end) and not end.endswith(b"\n"))  # lines the end holds or closes
    if not body:
        return lines if whole else max(0, lines - 1)
    return max(0, lines - 1)  # its first newline ends the last line of data


def text_ranges(head: int, starts: Sequence[int], rows: int,
                part_rows: int) -> list[tuple[int, tuple[int, int | None]]]:
    """``(row0, (start, stop))`` of each part of a text file's data lines: ``head`` is the
    byte offset of its first data line and ``starts`` where every ``part_rows``-th data
    line after it starts (from :func:`count_lines`)."""
    bounds = [head, *starts]
    return [(k * part_rows, (a, bounds[k + 1] if k + 1 < len(bounds) else None)) for k, a in enumerate(bounds)
            if k * part_rows < rows]


def previous_line(path: str, start: int, so: dict) -> int:
    """The byte offset of the line that ends just before ``start`` (a line's start, after
    a newline) in a text file: read backwards in growing windows, so a part can check its
    first row against the row above it."""
    window = 4096
    with open_text(path, so) as fh:
        while True:
            lo = max(0, start - window)
            fh.seek(lo)
            found = fh.read(start - lo)[:-1].rfind(b"\n")  # the byte before start is the line's newline
            if found >= 0:
                return lo + found + 1
            if lo == 0:
                return 0
            window *= 4


def read_range(fh: Any, data: tuple[int, int | None]) -> Any:
    """The bytes ``[start, stop)`` of an open file (``stop`` None: to its end), as a
    stream pyarrow's CSV reader takes."""
    import io

    start, stop = data
    fh.seek(start)
    return io.BytesIO(fh.read() if stop is None else fh.read(stop - start))
