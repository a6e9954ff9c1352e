"""Images (jpg, png, tiff) decoded with Pillow; optional resize and channel mode.

The probe opens the file and reads only its header (Pillow decodes lazily), so the
size and mode of 100,000 images are known without decoding any pixels. A file whose
bytes are not an image, or not the image its suffix says, is named with what was
expected and what was found.
"""

from __future__ import annotations

from typing import Any

import fsspec
import numpy as np

from pipeline.errors import FormatMismatchError, LoaderError, MissingDependencyError

__all__ = ["probe_image", "read_image"]

_CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4, "I;16": 1, "I": 1, "F": 1}
_DTYPES = {"I;16": np.uint16, "I": np.int32, "F": np.float32}
_EXPECTED = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".tif": "TIFF", ".tiff": "TIFF"}


def _pil() -> Any:
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover
        raise MissingDependencyError("Reading images", "Pillow", "images") from None
    return Image


#: Image formats by their files' first bytes (Pillow's format names).
_SIGNATURES = ((b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"II*\x00", "TIFF"),
               (b"MM\x00*", "TIFF"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"))


def _signature(head: bytes) -> str | None:
    """The image format whose signature ``head`` starts with, or None."""
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "WEBP"
    return next((fmt for sig, fmt in _SIGNATURES if head.startswith(sig)), None)


def _not_opened(path: str, head: bytes, exc: Exception) -> FormatMismatchError:
    """The error for a file Pillow could not open: a damaged image when its first bytes
    are an image's signature (with Pillow's reason), else what the bytes look like."""
    fmt = _signature(head)
    if fmt is not None:
        reason = str(exc) or type(exc).__name__
        return FormatMismatchError(path, f"is a truncated or damaged {fmt} image (its first bytes are {fmt}'s "
                                   f"signature, but Pillow cannot read its header: {reason})")
    return FormatMismatchError(path, f"expected an image (jpg, png, tiff), found {_sniff(head)}")


def _sniff(head: bytes) -> str:
    if head.startswith(b"\x93NUMPY"):
        return "an .npy array"
    if head.startswith(b"PK"):
        return "a zip archive (.npz?)"
    if head.startswith(b"\x89HDF"):
        return "an HDF5 file"
    if head[:1] in (b"{", b"[") or head[:5].isascii():
        return f"text starting with {head[:16]!r}"
    return f"bytes {head[:8]!r}"


def probe_image(path: str, so: dict, *, shape: tuple[int, ...] | None = None, mode: str | None = None) -> tuple[tuple[int, ...], np.dtype]:
    """``(H, W)`` or ``(H, W, C)`` and dtype after the optional resize and mode conversion."""
    Image = _pil()
    try:
        with fsspec.open(path, "rb", **so) as fh:
            head = fh.read(16)
            fh.seek(0)
            try:
                with Image.open(fh) as im:
                    fmt, size, src_mode = im.format, im.size, im.mode
            except Exception as exc:  # noqa: BLE001 - Pillow's UnidentifiedImageError and friends
                raise _not_opened(path, head, exc) from None
    except OSError as exc:
        raise LoaderError(path, f"cannot read ({exc})") from None
    suffix = "." + path.rsplit(".", 1)[-1].lower() if "." in path else ""
    if suffix in _EXPECTED and fmt != _EXPECTED[suffix]:
        raise FormatMismatchError(path, f"expected a {_EXPECTED[suffix]} image from its suffix, found {fmt}")
    out_mode = mode or src_mode
    if out_mode not in _CHANNELS:
        out_mode = "RGB"
    h, w = (shape[0], shape[1]) if shape else (size[1], size[0])
    channels = _CHANNELS[out_mode]
    dims = (h, w) if channels == 1 else (h, w, channels)
    return dims, np.dtype(_DTYPES.get(out_mode, np.uint8))


def read_image(path: str, so: dict, *, shape: tuple[int, ...] | None = None, mode: str | None = None) -> np.ndarray:
    """Decoded pixels, converted to ``mode`` and resized to ``shape[:2]`` when given."""
    Image = _pil()
    try:
        with fsspec.open(path, "rb", **so) as fh, Image.open(fh) as im:
            target = mode or (im.mode if im.mode in _CHANNELS else "RGB")
            if im.mode != target:
                im = im.convert(target)
            if shape and (im.size[1], im.size[0]) != tuple(shape[:2]):
                im = im.resize((shape[1], shape[0]), Image.Resampling.BILINEAR)
            return np.asarray(im)
    except OSError as exc:  # a truncated or corrupt image fails at decode time
        raise LoaderError(path, f"cannot decode the image ({exc})") from None
