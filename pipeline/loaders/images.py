"""Images (jpg, png, tiff) decoded with Pillow; optional resize and channel mode.

A glob or folder of images reads the files with an image suffix only
(:func:`image_files`); files named one by one are read whatever their suffix.

The probe opens the file and reads only its header (Pillow decodes lazily), so the
size and mode of 100,000 images are known without decoding any pixels. A file whose
bytes are not an image, or not the image its suffix says, is named with what was
expected and what was found. The probe also checks, from the file's last bytes, that it
was not cut short (see :func:`_cut_short`): a file that fails that check is decoded
once, and refused only when Pillow cannot decode it, so a complete image with bytes
after its end is still read.

Pixels come in the file's mode when it is ``L``, ``RGB``, ``RGBA``, ``I``, ``F`` or 16-bit
grayscale (``I;16``, and the big-endian ``I;16B`` of ImageJ's and other "MM" TIFFs, both
as native ``uint16``); files of other modes (palette ``P``, ``LA``, ``CMYK``, ``1``...)
come as ``RGB``, as torchvision's loader converts them. ``mode=`` converts to any mode of
:data:`MODES`, whose array shape and dtype are known before a pixel is decoded; a
conversion Pillow cannot make is refused when the array is built. Multi-page TIFFs and
animated GIFs give their first frame.

16-bit grayscale images converted to an 8-bit mode (``mode="L"``, ``"RGB"``) keep their
high byte (``value >> 8``), as OpenCV's ``imread`` and Pillow's own 16-bit RGB PNG
decoding do; Pillow's ``convert`` would clip every value above 255 to 255. EXIF
orientation is not applied (pixels come as stored, as Keras' ``load_img`` and
torchvision's ``decode_image`` give them by default).
"""

from __future__ import annotations

import functools
import re
from typing import Any, Collection, Sequence

import fsspec
import numpy as np

from pipeline.errors import ConfigError, EmptyInputError, FormatMismatchError, LoaderError, MissingDependencyError

__all__ = ["IMAGE_SUFFIXES", "MODES", "check_mode", "image_files", "mode_advice", "probe_image", "read_image"]

#: Suffixes of the files a glob or a folder of images reads (in any case, ``.PNG`` as
#: ``.png``): the formats Pillow decodes that torchvision's ``ImageFolder`` and Keras'
#: ``image_dataset_from_directory`` list. Other files found beside the images (a
#: README, ``Thumbs.db``, a labels ``.csv``) are left out, as those tools leave them.
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")
#: Formats that beside images make a glob ambiguous: refused as files of different formats.
_ARRAY_SUFFIXES = (".npy", ".npz", ".h5", ".hdf5")

#: The modes ``mode=`` takes: Pillow mode -> (channels, dtype) of ``np.asarray`` of an
#: image in that mode (1 channel: ``(H, W)``, else ``(H, W, C)``), so that the array's
#: shape is known from the header. Byte-order variants (``I;16B``) are left out: 16-bit
#: images come as ``I;16``, native ``uint16``.
MODES: dict[str, tuple[int, type]] = {
    "1": (1, np.bool_), "L": (1, np.uint8), "P": (1, np.uint8), "I;16": (1, np.uint16), "I": (1, np.int32),
    "F": (1, np.float32), "LA": (2, np.uint8), "La": (2, np.uint8), "PA": (2, np.uint8), "RGB": (3, np.uint8),
    "YCbCr": (3, np.uint8), "LAB": (3, np.uint8), "HSV": (3, np.uint8), "RGBA": (4, np.uint8),
    "RGBa": (4, np.uint8), "RGBX": (4, np.uint8), "CMYK": (4, np.uint8),
}
#: Modes a file is read in when ``mode`` is not given (others come as RGB).
_NATIVE = ("L", "RGB", "RGBA", "I;16", "I", "F")
#: 16-bit grayscale in any byte order: read as ``I;16`` (native ``uint16``).
_SIXTEEN = ("I;16", "I;16B", "I;16L", "I;16N")
_EXPECTED = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".tif": "TIFF", ".tiff": "TIFF"}


def _suffix(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return "." + name.rsplit(".", 1)[-1].lower() if "." in name.lstrip(".") else ""


def image_files(files: Sequence[str], named: Collection[str], format: str | None, where: str) -> list[str]:
    """Of the files globs or folders matched, those to read as images, in order.

    With ``format="image"``, or without a format when the globs matched files with an
    image suffix (:data:`IMAGE_SUFFIXES`) and no npy, npz or HDF5 file, only the files
    with an image suffix are kept, and the files named one by one (``named``). Other
    globs come back as they are. A file with an image suffix that is not an image is
    still probed, and refused or skipped by ``on_error``.

    Raises
    ------
    EmptyInputError
        For ``format="image"`` globs that matched no file with an image suffix.
    """
    globbed = [p for p in files if p not in named]
    if format is None:
        if not any(_suffix(p) in IMAGE_SUFFIXES for p in globbed) or any(
                _suffix(p) in _ARRAY_SUFFIXES for p in globbed):
            return list(files)
    elif format != "image":
        return list(files)
    kept = [p for p in files if p in named or _suffix(p) in IMAGE_SUFFIXES]
    if not kept:
        raise EmptyInputError(where, f"matched no image file (suffixes {' '.join(IMAGE_SUFFIXES)}, in any case), but "
                              f"{len(files)} other file(s), such as {files[0]}")
    return kept


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
        reason = _reason(exc)
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


#: Bytes read from a file's end to look for its format's end marker.
_TAIL = 4096
#: PNG's last chunk: length 0, type IEND, and its CRC.
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"
#: JPEG's end-of-image marker. Inside compressed data 0xFF is always followed by 0x00
#: or a restart marker, so these two bytes mark the end (or an embedded thumbnail's).
_JPEG_END = b"\xff\xd9"


def _cut_short(fmt: str, head: bytes, tail: bytes, size: int, data_end: int | None) -> str | None:
    """Why a file of format ``fmt`` looks cut short, from its first bytes ``head``, its
    last ``tail`` bytes, its ``size`` and (TIFF) where its first frame's pixel data
    ends; None when it looks complete or the format has nothing cheap to check.

    PNG and JPEG end with a marker (the IEND chunk, the EOI marker), GIF with a trailer
    byte; a WebP's RIFF header gives its length; a TIFF's strip or tile offsets and byte
    counts say where its data ends. A marker a little before the end (bytes appended
    after a complete image) passes.
    """
    where = "it holds" if len(tail) >= size else f"its last {len(tail)} bytes hold"
    if fmt == "PNG" and _PNG_END not in tail:
        return f"{where} no IEND chunk, PNG's end"
    if fmt == "JPEG" and _JPEG_END not in tail:
        return f"{where} no end-of-image marker (FF D9)"
    if fmt == "GIF" and not tail.rstrip(b"\x00").endswith(b";"):
        return "it does not end with GIF's trailer byte (;)"
    if fmt == "WEBP" and len(head) >= 8 and int.from_bytes(head[4:8], "little") + 8 > size:
        return f"its RIFF header declares {int.from_bytes(head[4:8], 'little') + 8} bytes, the file has {size}"
    if fmt == "TIFF" and data_end is not None and data_end > size:
        return f"its pixel data is declared to end at byte {data_end}, the file has {size}"
    return None


def _tiff_data_end(im: Any) -> int | None:
    """Where the first frame's strips or tiles end (offset + byte count), from its tags."""
    tags = getattr(im, "tag_v2", None)
    if tags is None:
        return None
    offsets, counts = tags.get(273) or tags.get(324), tags.get(279) or tags.get(325)
    if not offsets or not counts:
        return None
    offsets = offsets if isinstance(offsets, tuple) else (offsets,)
    counts = counts if isinstance(counts, tuple) else (counts,)
    return max(int(o) + int(c) for o, c in zip(offsets, counts))


def _end_bytes(fh: Any) -> tuple[bytes, int]:
    """The last :data:`_TAIL` bytes of an open file, and its size."""
    fh.seek(0, 2)
    size = fh.tell()
    fh.seek(max(0, size - _TAIL))
    return fh.read(), size


def _check_complete(path: str, fh: Any, fmt: str, head: bytes, data_end: int | None) -> None:
    """Refuse a file that looks cut short (:func:`_cut_short`) and that Pillow cannot
    decode. Only such a file is decoded here: a complete one costs a read of its end.

    Raises
    ------
    FormatMismatchError
        Saying why it looks cut short and Pillow's reason.
    """
    tail, size = _end_bytes(fh)
    why = _cut_short(fmt, head, tail, size, data_end)
    if why is None:
        return
    Image = _pil()
    fh.seek(0)
    try:
        with Image.open(fh) as im:
            im.load()
    except Exception as exc:  # noqa: BLE001 - Pillow raises OSError, SyntaxError, struct.error...
        raise FormatMismatchError(path, f"is a truncated {fmt} image: {why}, and Pillow cannot decode it "
                                  f"({_reason(exc)})") from None


def probe_image(path: str, so: dict, *, shape: tuple[int, ...] | None = None, mode: str | None = None) -> tuple[tuple[int, ...], np.dtype]:
    """``(H, W)`` or ``(H, W, C)`` and dtype after the optional resize and mode conversion.

    Raises
    ------
    FormatMismatchError
        For a file that is not an image, not the image its suffix says, or an image
        that is cut short (:func:`_check_complete`).
    """
    Image = _pil()
    try:
        with fsspec.open(path, "rb", **so) as fh:
            head = fh.read(16)
            fh.seek(0)
            try:
                with Image.open(fh) as im:
                    fmt, size, src_mode = im.format, im.size, im.mode
                    data_end = _tiff_data_end(im) if fmt == "TIFF" else None
            except Exception as exc:  # noqa: BLE001 - Pillow's UnidentifiedImageError and friends
                raise _not_opened(path, head, exc) from None
            suffix = "." + path.rsplit(".", 1)[-1].lower() if "." in path else ""
            if suffix in _EXPECTED and fmt != _EXPECTED[suffix]:
                raise FormatMismatchError(path, f"expected a {_EXPECTED[suffix]} image from its suffix, found {fmt}")
            _check_complete(path, fh, fmt, head, data_end)
    except OSError as exc:
        raise LoaderError(path, f"cannot read ({exc})") from None
    out_mode = _target(src_mode, mode)
    if not _convertible(src_mode, out_mode):
        raise FormatMismatchError(path, f"is a {src_mode} image, which Pillow cannot convert to mode={out_mode!r}; "
                                  "choose another mode (such as 'RGB' or 'L')")
    h, w = (shape[0], shape[1]) if shape else (size[1], size[0])
    channels, dtype = MODES[out_mode]
    dims = (h, w) if channels == 1 else (h, w, channels)
    return dims, np.dtype(dtype)


#: Modes that hold 16-bit values whole: a 16-bit image converted to any other keeps its high byte.
_WIDE = ("I;16", "I", "F")


def check_mode(mode: str | None) -> None:
    """Refuse a ``mode`` option that is not one of :data:`MODES`, before any file is read.

    Raises
    ------
    ConfigError
        Naming the option, the modes it takes and the value given.
    """
    if mode is not None and mode not in MODES:
        raise ConfigError("mode", f"a Pillow mode whose array shape is known: {', '.join(MODES)}", mode)


def mode_advice(channels: int) -> str:
    """The ``mode=`` that reads every image with ``channels`` channels, for an error."""
    mode = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}.get(channels, "RGB")
    return f"mode={mode!r}"


def _target(src_mode: str, mode: str | None) -> str:
    """The mode an image stored in ``src_mode`` is read in."""
    if mode is not None:
        return mode
    if src_mode in _SIXTEEN:
        return "I;16"
    return src_mode if src_mode in _NATIVE else "RGB"


def _to_mode(im: Any, target: str) -> Any:
    """``im`` converted to ``target``; 16-bit grayscale as :func:`_high_byte` says for
    8-bit targets, and in native byte order for 16-bit and wider ones."""
    if im.mode in _SIXTEEN:
        if target not in _WIDE:
            im = _high_byte(im)
        elif im.mode != "I;16":  # I;16B: Pillow converts it to few modes, numpy to native uint16 exactly
            im = _pil().fromarray(np.asarray(im).astype(np.uint16))
    return im if im.mode == target else im.convert(target)


@functools.lru_cache(maxsize=256)
def _convertible(src_mode: str, target: str) -> bool:
    """Whether :func:`_to_mode` converts ``src_mode`` to ``target`` (tried on one pixel,
    once per pair of modes), so that a conversion Pillow lacks is refused when the array
    is built rather than when it is computed."""
    Image = _pil()
    try:
        one = Image.new(src_mode, (1, 1))
    except (ValueError, OSError):  # a mode Image.new does not make: left to the read
        return True
    try:
        _to_mode(one, target)
    except (ValueError, OSError):
        return False
    return True


def _reason(exc: Exception) -> str:
    """Pillow's message without the object reprs it holds (``<_io.BufferedReader ...>``):
    the error names the file itself."""
    text = re.sub(r"\s*<[^<>]*>", "", str(exc)).strip()
    return text or type(exc).__name__


def _high_byte(im: Any) -> Any:
    """A 16-bit grayscale image as 8-bit ``L``, each value ``>> 8`` (OpenCV's
    ``imread`` rule, and Pillow's for 16-bit RGB PNGs): Pillow's ``convert("L")``
    clips values above 255 instead, which turns nearly every pixel white."""
    return _pil().fromarray((np.asarray(im) >> 8).astype(np.uint8))


def read_image(path: str, so: dict, *, shape: tuple[int, ...] | None = None, mode: str | None = None) -> np.ndarray:
    """Decoded pixels, converted to ``mode`` and resized to ``shape[:2]`` when given."""
    Image = _pil()
    try:
        with fsspec.open(path, "rb", **so) as fh, Image.open(fh) as im:
            im = _to_mode(im, _target(im.mode, mode))
            if shape and (im.size[1], im.size[0]) != tuple(shape[:2]):
                im = im.resize((shape[1], shape[0]), Image.Resampling.BILINEAR)
            a = np.asarray(im)
    except (OSError, ValueError) as exc:  # a truncated or corrupt image fails at decode time
        raise LoaderError(path, f"cannot decode the image ({_reason(exc)})") from None
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))
