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

16-bit grayscale images converted to an 8-bit mode (``mode="L"``, ``"RGB"``) keep their
high byte (``value >> 8``), as OpenCV's ``imread`` and Pillow's own 16-bit RGB PNG
decoding do; Pillow's ``convert`` would clip every value above 255 to 255. EXIF
orientation is not applied (pixels come as stored, as Keras' ``load_img`` and
torchvision's ``decode_image`` give them by default).
"""

from __future__ import annotations

from typing import Any, Collection, Sequence

import fsspec
import numpy as np

from pipeline.errors import EmptyInputError, FormatMismatchError, LoaderError, MissingDependencyError

__all__ = ["IMAGE_SUFFIXES", "image_files", "probe_image", "read_image"]

#: Suffixes of the files a glob or a folder of images reads (in any case, ``.PNG`` as
#: ``.png``): the formats Pillow decodes that torchvision's ``ImageFolder`` and Keras'
#: ``image_dataset_from_directory`` list. Other files found beside the images (a
#: README, ``Thumbs.db``, a labels ``.csv``) are left out, as those tools leave them.
IMAGE_SUFFIXES = (".bmp", ".gif", ".jpeg", ".jpg", ".png", ".tif", ".tiff", ".webp")
#: Formats that beside images make a glob ambiguous: refused as files of different formats.
_ARRAY_SUFFIXES = (".npy", ".npz", ".h5", ".hdf5")

_CHANNELS = {"L": 1, "RGB": 3, "RGBA": 4, "I;16": 1, "I": 1, "F": 1}
_DTYPES = {"I;16": np.uint16, "I": np.int32, "F": np.float32}
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
                                  f"({str(exc) or type(exc).__name__})") from None


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
    out_mode = mode or src_mode
    if out_mode not in _CHANNELS:
        out_mode = "RGB"
    h, w = (shape[0], shape[1]) if shape else (size[1], size[0])
    channels = _CHANNELS[out_mode]
    dims = (h, w) if channels == 1 else (h, w, channels)
    return dims, np.dtype(_DTYPES.get(out_mode, np.uint8))


#: Modes that hold 16-bit values whole: a 16-bit image converted to any other keeps its high byte.
_WIDE = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")


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
            target = mode or (im.mode if im.mode in _CHANNELS else "RGB")
            if im.mode.startswith("I;16") and target not in _WIDE:
                im = _high_byte(im)
            if im.mode != target:
                im = im.convert(target)
            if shape and (im.size[1], im.size[0]) != tuple(shape[:2]):
                im = im.resize((shape[1], shape[0]), Image.Resampling.BILINEAR)
            return np.asarray(im)
    except OSError as exc:  # a truncated or corrupt image fails at decode time
        raise LoaderError(path, f"cannot decode the image ({exc})") from None
