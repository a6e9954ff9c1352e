"""The decoded size a zstd frame declares, from its header (RFC 8878, section 3.1.1).

numcodecs' zstd decoder, decoding into a chunk's buffer, fills as many bytes as the
frame holds and leaves the rest as they were: a valid frame of fewer bytes (a wrong file
copied in) would serve the buffer's old contents. A chunk is decoded in place only when
its frame declares the chunk's size.
"""

from __future__ import annotations

from typing import Any

__all__ = ["content_size"]

#: A zstd frame's magic number, as its first 4 bytes.
_MAGIC = b"\x28\xb5\x2f\xfd"
#: Bytes of the Dictionary_ID field for each value of the descriptor's flag.
_DICT_ID_BYTES = (0, 1, 2, 4)


def content_size(raw: Any) -> int | None:
    """The Frame_Content_Size of the zstd frame starting ``raw``, or None where the
    frame does not declare it (a streamed frame) or ``raw`` is no zstd frame."""
    head = bytes(raw[:18])  # magic, descriptor, window, dictionary id and size: at most 18
    if len(head) < 5 or head[:4] != _MAGIC:
        return None
    descriptor = head[4]
    fcs_flag, single_segment = descriptor >> 6, (descriptor >> 5) & 1
    at = 5 + (0 if single_segment else 1) + _DICT_ID_BYTES[descriptor & 3]
    size = (1 if single_segment else 0) if fcs_flag == 0 else (2, 4, 8)[fcs_flag - 1]
    if size == 0 or len(head) < at + size:
        return None
    value = int.from_bytes(head[at : at + size], "little")
    return value + 256 if size == 2 else value  # a 2-byte field counts from 256
