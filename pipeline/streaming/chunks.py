"""Fast chunk reads: fetch a chunk's bytes and decode them with numcodecs, in place.

zarr's array API pays per call for selection planning, an event-loop round trip and an
extra copy. For the layouts this package writes (regular chunks along axis 0, the
default ``c/i/0/...`` key encoding, little-endian ``bytes`` then blosc, zstd or nothing)
a chunk is one object: its bytes are read and decoded straight into a preallocated
array. Decoding in numcodecs releases the GIL, so a few threads decode in parallel.
Anything else (sharding, other codecs or key encodings) falls back to zarr's own read,
which is always correct.
"""

from __future__ import annotations

import os
from typing import Any

import numcodecs
import numpy as np
import zarr

from pipeline.errors import CorruptChunkError

__all__ = ["ChunkReader"]


class ChunkReader:
    """Reads chunk ``i`` (along axis 0) of one zarr array as a numpy array.

    Parameters
    ----------
    array
        The zarr array.
    where
        ``(store, split, name)`` used in error messages.
    """

    def __init__(self, array: zarr.Array, where: tuple[str, str, str], checksums: np.ndarray | None = None):
        self.array = array
        self.where = where
        # Rows of the split's ``_written`` table (one per chunk when unsharded): when
        # given, every decoded chunk's CRC32 must be one of its row's recorded values.
        self.checksums = checksums if array.shards is None else None
        self.rows = int(array.chunks[0])
        self.n = int(array.shape[0])
        self.tail_shape = tuple(array.shape[1:])
        self.dtype = np.dtype(array.dtype)
        self._transposed = False
        self._decoder, self._root = self._plan()

    @property
    def n_chunks(self) -> int:
        return -(-self.n // self.rows) if self.n else 0

    def length(self, i: int) -> int:
        """Samples in chunk ``i`` (the last one may be short)."""
        return min(self.rows, self.n - i * self.rows)

    def _plan(self) -> tuple[Any, str | None]:
        arr = self.array
        meta = arr.metadata.to_dict()
        if arr.shards is not None or meta.get("chunk_key_encoding", {}).get("name") != "default":
            return None, None
        if meta["chunk_key_encoding"].get("configuration", {}).get("separator", "/") != "/":
            return None, None
        if any(c != arr.shape[k] for k, c in enumerate(arr.chunks) if k > 0):
            return None, None
        codecs = list(meta.get("codecs", ()))
        # A 2-D chunk stored column-major (the transpose codec) decodes the same way and
        # is transposed back after.
        self._transposed = False
        if codecs and codecs[0].get("name") == "transpose":
            if tuple(codecs[0].get("configuration", {}).get("order", ())) != (1, 0) or len(arr.shape) != 2:
                return None, None
            self._transposed = True
            codecs = codecs[1:]
        if not codecs or codecs[0].get("name") != "bytes":
            return None, None
        if self.dtype.itemsize > 1 and codecs[0].get("configuration", {}).get("endian", "little") != "little":
            return None, None
        rest = codecs[1:]
        decoder: Any
        if not rest:
            decoder = "raw"
        elif len(rest) == 1 and rest[0]["name"] == "blosc":
            decoder = numcodecs.Blosc()
        elif len(rest) == 1 and rest[0]["name"] == "zstd":
            decoder = numcodecs.Zstd()
        else:
            return None, None
        store = arr.store_path.store
        root = getattr(store, "root", None)
        if root is None or not isinstance(store, zarr.storage.LocalStore):
            return decoder, None  # fast decode, bytes fetched through the store
        return decoder, os.path.join(str(root), arr.store_path.path)

    def _key(self, i: int) -> str:
        return "c/" + "/".join([str(i)] + ["0"] * len(self.tail_shape))

    def _fetch(self, i: int) -> bytes | None:
        if self._root is not None:
            try:
                with open(os.path.join(self._root, self._key(i)), "rb") as fh:
                    return fh.read()
            except FileNotFoundError:
                return None
        from zarr.core.buffer import default_buffer_prototype
        from zarr.core.sync import sync

        store = self.array.store_path.store
        path = f"{self.array.store_path.path}/{self._key(i)}".lstrip("/")
        buf = sync(store.get(path, prototype=default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    def read(self, i: int, out: np.ndarray | None = None) -> np.ndarray:
        """Chunk ``i`` as an array of ``length(i)`` rows, decoded into ``out`` if given."""
        out = self._read(i, out)
        if self.checksums is not None:
            import zlib

            row = self.checksums[i]
            if row[0] != 1 or zlib.crc32(np.ascontiguousarray(out).data) not in {int(v) for v in row[1:]}:
                store, split, name = self.where
                raise CorruptChunkError(store, split, name, i, "checksum mismatch (the chunk decodes, but not to "
                                        "what was written)")
        return out

    def _read(self, i: int, out: np.ndarray | None = None) -> np.ndarray:
        n = self.length(i)
        shape = (n,) + self.tail_shape
        if out is None:
            out = np.empty(shape, dtype=self.dtype)
        if self._decoder is None:
            try:
                out[...] = self.array[i * self.rows : i * self.rows + n]
            except Exception as exc:  # noqa: BLE001 - zarr's decode errors vary by codec
                store, split, name = self.where
                raise CorruptChunkError(store, split, name, i, f"cannot decode ({exc})") from exc
            return out
        raw = self._fetch(i)
        if raw is None:  # never written: zarr reads it as the fill value
            out[...] = self.array.fill_value
            return out
        full = (self.rows,) + self.tail_shape
        try:
            if self._transposed:
                data = raw if self._decoder == "raw" else self._decoder.decode(raw)
                decoded = np.frombuffer(data, dtype=self.dtype)
                out[...] = decoded.reshape(self.tail_shape[0], self.rows).T[:n]
                return out
            if self._decoder == "raw":
                decoded = np.frombuffer(raw, dtype=self.dtype)
            elif n == self.rows and out.flags.c_contiguous:
                # The common case: decode straight into the caller's buffer, no copy.
                self._decoder.decode(raw, out=out)
                return out
            else:
                decoded = np.frombuffer(self._decoder.decode(raw), dtype=self.dtype)
            if decoded.size == int(np.prod(full)):
                out[...] = decoded.reshape(full)[:n]
            elif decoded.size == int(np.prod(shape)):
                out[...] = decoded.reshape(shape)
            else:
                raise ValueError(f"decoded {decoded.size} values, expected {int(np.prod(full))}")
        except Exception as exc:  # noqa: BLE001 - any decode failure is a corrupt chunk
            store, split, name = self.where
            raise CorruptChunkError(store, split, name, i, f"cannot decode ({exc})") from exc
        return out
