"""``.npz`` archives: one named array per file, header-only probe, never unpickled.

A member is read by rows without decompressing all of it for every block of rows: a
stored (uncompressed) member is read at its offset in the zip, a deflated one (what
``np.savez_compressed`` writes) is inflated forward from its start, keeping only the
rows asked for. Each process keeps checkpoints of the inflate state along the way
(zlib's state and 32 KiB window each, a block apart, at most 128 per member), so the
blocks of a member that one process reads, in any order, inflate each part of it
about once: time linear in the member's size, memory bounded by a block.
"""

from __future__ import annotations

import struct
import threading
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np

from pipeline.errors import FormatMismatchError, LoaderError
from pipeline.loaders.crc import CrcSpans
from pipeline.loaders.npy import HEADER_ERRORS, header_reason

__all__ = ["NpzMember", "probe_npz", "read_npz", "shared_member"]

#: Compressed bytes read from the file at a time while inflating (a checkpoint holds up
#: to this much input that zlib had not consumed yet).
_READ = 16 << 10
#: Inflated bytes produced at a time (what a block's reader holds beside the block).
_PIECE = 1 << 20
#: Inflate checkpoints kept per member (each about 40 KiB of zlib's state and window, and
#: up to :data:`_READ` of input).
_KEPT = 128
#: Members whose checkpoints a process keeps.
_MEMBERS = 2


def _member(path: str, names: list[str], key: str | None, key_from: str | None = None) -> str:
    arrays = [n[:-4] for n in names if n.endswith(".npy")]
    if key is None:
        if len(arrays) != 1:
            raise LoaderError(path, f"holds arrays {arrays}; choose one with key:")
        return arrays[0] + ".npy"
    if key not in arrays:
        why = (f"; {key!r} is the only array of {key_from}, the first file, and every file must hold the array "
               "read from the first: set key: to choose one" if key_from and key_from != path else "")
        raise LoaderError(path, f"has no array {key!r} (arrays: {arrays}){why}")
    return key + ".npy"


def shared_member(paths: list[str], so: dict, *, skip: bool = False) -> tuple[str | None, str | None]:
    """The array every file is read at when ``key`` is not given, and the file it comes
    from: the first file's one array (with ``skip``, the first readable file's;
    ``(None, None)`` when none is). Each file read at its own one array would join
    different arrays (one file's prices to another's volumes) into one, silently.

    Raises
    ------
    FormatMismatchError, LoaderError
        Without ``skip``, for a first file that is not an .npz or holds several arrays.
    """
    for path in paths:
        try:
            with fsspec.open(path, "rb", **so) as fh:
                try:
                    zf = zipfile.ZipFile(fh)
                except zipfile.BadZipFile:
                    raise FormatMismatchError(path, "expected an .npz (zip) archive, found something else") from None
                with zf:
                    return _member(path, zf.namelist(), None)[:-4], path
        except (FormatMismatchError, LoaderError):
            if not skip:
                raise
        except OSError as exc:
            if not skip:
                raise LoaderError(path, f"cannot read ({exc.strerror or exc})") from None
    return None, None


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where one member's array lies in the archive, from its zip and .npy headers."""

    member: str
    method: int  # zipfile.ZIP_STORED, ZIP_DEFLATED, or another compression
    start: int  # file offset of the member's (compressed) bytes
    compressed: int
    size: int  # the member's bytes once inflated: its .npy header and data
    crc: int
    header: int  # bytes of the .npy header inside the member
    shape: tuple[int, ...]
    dtype: np.dtype
    fortran: bool

    @property
    def key(self) -> tuple:
        return self.member, self.method, self.start, self.compressed, self.size, self.crc


def _layout(path: str, fh: Any, key: str | None, key_from: str | None = None) -> _Layout:
    """The layout of the chosen member of the open archive ``fh``.

    Raises
    ------
    FormatMismatchError
        For a file that is not a zip archive, an encrypted member, or a member whose
        local header is not where the zip's directory says.
    LoaderError
        For a missing member (or several arrays and no ``key``).
    """
    try:
        zf = zipfile.ZipFile(fh)
    except zipfile.BadZipFile:
        raise FormatMismatchError(path, "expected an .npz (zip) archive, found something else") from None
    with zf:
        info = zf.getinfo(_member(path, zf.namelist(), key, key_from))
        if info.flag_bits & 1:
            raise FormatMismatchError(path, f"member {info.filename!r} is encrypted; np.savez never writes that")
        with zf.open(info) as m:
            version = np.lib.format.read_magic(m)
            read = np.lib.format.read_array_header_1_0 if version[0] == 1 else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = read(m)
            header = m.tell()
    fh.seek(info.header_offset)
    local = fh.read(30)
    if len(local) < 30 or local[:4] != b"PK\x03\x04":
        raise FormatMismatchError(path, f"member {info.filename!r}: no zip local header at byte {info.header_offset}")
    name_len, extra_len = struct.unpack("<HH", local[26:30])
    return _Layout(info.filename, info.compress_type, info.header_offset + 30 + name_len + extra_len,
                   info.compress_size, info.file_size, info.CRC, header, tuple(int(s) for s in shape),
                   np.dtype(dtype), bool(fortran) and len(shape) > 1)


def probe_npz(path: str, so: dict, *, key: str | None = None,
              key_from: str | None = None) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of the chosen member, from its .npy header inside the zip
    (``key_from``: the file ``key`` was chosen in, named when this one lacks it)."""
    try:
        with fsspec.open(path, "rb", **so) as fh:
            lay = _layout(path, fh, key, key_from)
    except (FormatMismatchError, LoaderError):
        raise
    except (*HEADER_ERRORS, OSError, zipfile.BadZipFile, zlib.error) as exc:
        raise FormatMismatchError(path, "expected an .npz of .npy members, could not parse it "
                                  f"({header_reason(exc)})") from None
    if lay.dtype.hasobject:
        raise FormatMismatchError(path, "holds Python objects (dtype=object, a pickle); refusing to load it")
    return lay.shape, lay.dtype


# -- inflating a deflated member from a checkpoint ---------------------------------------


@dataclass(slots=True)
class _Inflate:
    """A member's inflate state: ``pos`` bytes produced from its first ``fed`` compressed ones."""

    z: Any = field(default_factory=lambda: zlib.decompressobj(-zlib.MAX_WBITS))  # a raw deflate stream
    pos: int = 0
    fed: int = 0
    tail: bytes = b""  # input handed to ``z`` that it has not consumed yet
    crc: int = 0  # of the ``pos`` bytes produced, checked against the zip's at the end

    def checkpoint(self) -> _Inflate:
        """A copy to restart from later (the unconsumed input is read again from the file)."""
        return _Inflate(self.z.copy(), self.pos, self.fed - len(self.tail), b"", self.crc)


#: Inflate checkpoints per member, sorted by ``pos``, most recently used member last.
_CHECKPOINTS: OrderedDict[tuple, list[_Inflate]] = OrderedDict()
_LOCK = threading.Lock()


def _spacing(size: int, block: int) -> int:
    """Inflated bytes between a member's checkpoints: a block's (the blocks of one array
    are of one size, so the checkpoints fall next to where other blocks start), but no
    more than :data:`_KEPT` of them along the member."""
    return max(_READ, block, -(-size // _KEPT))


def _resume(key: tuple, start: int) -> _Inflate:
    """A copy of the checkpoint of ``key`` furthest along but not past ``start``, or a
    fresh state at the member's start. Blocks read in any order (dask does not read
    them in row order) so inflate each part of the member about once."""
    with _LOCK:
        kept = [c for c in _CHECKPOINTS.get(key, []) if c.pos <= start]
        if key in _CHECKPOINTS:
            _CHECKPOINTS.move_to_end(key)
        return kept[-1].checkpoint() if kept else _Inflate()


def _save(key: tuple, state: _Inflate) -> None:
    """Keep a checkpoint of ``state``; members beyond the last few are forgotten."""
    with _LOCK:
        kept = _CHECKPOINTS.setdefault(key, [])
        if any(c.pos == state.pos for c in kept):
            return
        kept.append(state.checkpoint())
        kept.sort(key=lambda c: c.pos)
        _CHECKPOINTS.move_to_end(key)
        while len(_CHECKPOINTS) > _MEMBERS:
            _CHECKPOINTS.popitem(last=False)
        if len(kept) > 2 * _KEPT:  # block ends of a reader with small blocks: keep every other one
            kept[:] = kept[::2]


def _inflate(path: str, fh: Any, lay: _Layout, start: int, n: int) -> bytearray:
    """Bytes ``start:start + n`` of a deflated member, inflated forward from the nearest
    checkpoint before them; checkpoints are left along the way and at the end.

    Raises
    ------
    LoaderError
        For a member that ends early, fails to inflate, or whose CRC differs from the
        zip's once it is inflated to its end.
    """
    out = bytearray(n)
    st = _resume(lay.key, start)
    end, every = start + n, _spacing(lay.size, n)
    mark = (st.pos // every + 1) * every  # checkpoints at multiples of a block: next to block starts
    while st.pos < end and not st.z.eof:
        data = st.tail
        if not data:
            if st.fed >= lay.compressed:
                break
            fh.seek(lay.start + st.fed)
            data = fh.read(min(_READ, lay.compressed - st.fed))
            if not data:
                break
            st.fed += len(data)
        want = end - st.pos if st.pos >= start else start - st.pos  # skip up to the block, then fill it
        chunk = st.z.decompress(data, min(want, _PIECE, mark - st.pos))
        st.tail = st.z.unconsumed_tail
        st.crc = zlib.crc32(chunk, st.crc)
        lo = max(st.pos, start)
        if st.pos + len(chunk) > lo:
            out[lo - start : st.pos + len(chunk) - start] = memoryview(chunk)[lo - st.pos :]
        st.pos += len(chunk)
        if st.pos >= mark:
            if st.pos < end:
                _save(lay.key, st)
            mark += every
    if st.pos < end:
        raise LoaderError(path, f"member {lay.member!r} ends after {st.pos} inflated bytes; its headers declare "
                          f"{lay.size} (the archive is truncated or damaged)")
    if st.pos == lay.size:
        _check_crc(path, lay, st.crc)
    else:
        _save(lay.key, st)  # where the next block of a reader in row order starts
    return out


#: For stored members, the spans of each member read so far with their CRCs, the most
#: recently used member last.
_STORED_CRC: OrderedDict[tuple, CrcSpans] = OrderedDict()


def _stored(path: str, fh: Any, lay: _Layout, start: int, n: int) -> bytes | memoryview:
    """Bytes ``start:start + n`` of a stored (uncompressed, ``np.savez``) member, read at
    their offset. Each block's CRC is joined to those of the blocks this process read
    before it, in any order (:class:`~pipeline.loaders.crc.CrcSpans`; the first block
    reads the .npy header before it too), and checked against the zip's once they cover
    the member, as a deflated member's is: a member read whole is always checked.

    Raises
    ------
    LoaderError
        For a member cut short, or one whose CRC differs from the zip's.
    """
    lead = start if start <= lay.header else 0  # the header bytes before the first block
    fh.seek(lay.start + start - lead)
    data = fh.read(n + lead)
    if len(data) < n + lead:
        raise LoaderError(path, f"member {lay.member!r} is cut short: {n} bytes asked at {start}, "
                          f"{max(0, len(data) - lead)} there")
    crc = zlib.crc32(data)
    with _LOCK:
        spans = _STORED_CRC.setdefault(lay.key, CrcSpans())
        _STORED_CRC.move_to_end(lay.key)
        while len(_STORED_CRC) > _MEMBERS:
            _STORED_CRC.popitem(last=False)
        first, last, crc = spans.add(start - lead, start + n, crc)
    if (first, last) == (0, lay.size):
        _check_crc(path, lay, crc)
    return memoryview(data)[lead:] if lead else data


def _check_crc(path: str, lay: _Layout, crc: int) -> None:
    """Refuse a member whose bytes, all of them read, give another CRC than the zip's."""
    if crc != lay.crc:
        raise LoaderError(path, f"member {lay.member!r} fails its CRC check (zip says {lay.crc:08x}, its bytes "
                          f"give {crc:08x}): the archive is damaged")


def _member_bytes(path: str, fh: Any, lay: _Layout, start: int, n: int) -> bytes | bytearray | memoryview:
    """Bytes ``start:start + n`` of the member, however it is stored."""
    if lay.method == zipfile.ZIP_STORED:
        return _stored(path, fh, lay, start, n)
    if lay.method == zipfile.ZIP_DEFLATED:
        return _inflate(path, fh, lay, start, n)
    # bzip2 or lzma (not what numpy writes): zipfile's own stream, which skips forward
    # to ``start`` by decompressing in pieces, so memory stays bounded by the block.
    with zipfile.ZipFile(fh) as zf, zf.open(lay.member) as m:
        m.seek(start)
        return m.read(n)


def _rows(path: str, fh: Any, lay: _Layout, lo: int, hi: int) -> np.ndarray:
    """Rows ``lo:hi`` (already within the member's rows) as an array."""
    if not lay.shape or lay.fortran:
        # A 0-d member has no rows and a Fortran-ordered one keeps no row contiguous:
        # both are read whole (as np.load reads them), then sliced.
        fh.seek(0)
        with zipfile.ZipFile(fh) as zf, zf.open(lay.member) as m:
            whole = np.lib.format.read_array(m, allow_pickle=False)
        return whole if not lay.shape else whole[lo:hi]
    row = int(np.prod(lay.shape[1:], dtype=np.int64)) * lay.dtype.itemsize
    if hi <= lo or row == 0:
        return np.empty((max(0, hi - lo), *lay.shape[1:]), dtype=lay.dtype)
    data = _member_bytes(path, fh, lay, lay.header + lo * row, (hi - lo) * row)
    return np.frombuffer(data, dtype=lay.dtype).reshape(hi - lo, *lay.shape[1:])


class NpzMember:
    """One member of an ``.npz``, read lazily: ``member[lo:hi]`` reads those rows only
    (linear in the member's size over its blocks, see the module), ``np.asarray(member)``
    all of it. ``shape`` and ``dtype`` are the member's header's when it was opened.
    """

    __slots__ = ("_layout", "dtype", "path", "shape", "so")

    def __init__(self, path: str, so: dict, layout: _Layout) -> None:
        self.path, self.so, self._layout = path, so, layout
        self.shape, self.dtype = layout.shape, layout.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo:hi``, clipped to the member's rows as numpy clips a slice (a 0-d
        member: its value)."""
        if self.shape:
            lo, hi, _ = slice(lo, hi).indices(self.shape[0])
            hi = max(lo, hi)
        try:
            with fsspec.open(self.path, "rb", **self.so) as fh:
                return _rows(self.path, fh, self._layout, lo, hi)
        except LoaderError:
            raise
        except (*HEADER_ERRORS, OSError, zipfile.BadZipFile, zlib.error) as exc:
            raise LoaderError(self.path, f"cannot read .npz member {self._layout.member!r} "
                              f"({header_reason(exc)})") from None

    def __getitem__(self, key: Any) -> np.ndarray:
        if self.shape and isinstance(key, slice) and key.step in (None, 1):
            return self.rows(*key.indices(self.shape[0])[:2])
        return np.asarray(self)[key]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        a = self.rows(0, self.shape[0] if self.shape else 0)
        return a if dtype is None else a.astype(dtype, copy=False)


def read_npz(path: str, so: dict, *, key: str | None = None, key_from: str | None = None,
             rows: slice | None = None) -> NpzMember | np.ndarray:
    """The chosen member (``allow_pickle`` stays off): lazily, as an :class:`NpzMember`
    that reads rows when sliced, or with ``rows`` (a slice of its first axis) those rows
    (``key_from``: see :func:`probe_npz`).
    """
    try:
        with fsspec.open(path, "rb", **so) as fh:
            lay = _layout(path, fh, key, key_from)
    except (FormatMismatchError, LoaderError):
        raise
    except (*HEADER_ERRORS, OSError, zipfile.BadZipFile, zlib.error) as exc:
        raise LoaderError(path, f"cannot read .npz data ({header_reason(exc)})") from None
    if lay.dtype.hasobject:
        raise FormatMismatchError(path, "holds Python objects (dtype=object, a pickle); refusing to load it")
    member = NpzMember(path, so, lay)
    return member if rows is None else member[rows]
