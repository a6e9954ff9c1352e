"""The checksum of every write unit: CRC-32 (zlib's polynomial, so the same values as
``zlib.crc32``), computed by zlib-ng, whose carry-less-multiply kernels run about 3.5x
faster than the system zlib (benchmarks/README.md). Writing a store computes it over
every byte, verifying reads and ``pipeline inspect --verify`` over every byte read.
"""

from __future__ import annotations

from typing import Any

from zlib_ng.zlib_ng import crc32 as _crc32

__all__ = ["crc32"]


def crc32(data: Any, value: int = 0) -> int:
    """The CRC-32 of a bytes-like object (a contiguous numpy array's ``.data``, bytes),
    as ``zlib.crc32`` gives it; ``value``: the CRC of the bytes before, to continue it
    block by block. The GIL is released for large inputs. A function of its own, not an
    alias, so that a profile names the time spent here."""
    return _crc32(data, value)
