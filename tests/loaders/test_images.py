"""Images: files cut short are found when the array is built; 16-bit to 8-bit modes;
what is left as stored (EXIF orientation)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

import pipeline
import pipeline.loaders
from pipeline.errors import EmptyInputError, FormatMismatchError
from pipeline.loaders import images


def _encoded(fmt: str, pixels: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt)
    return buf.getvalue()


def _pixels(shape=(48, 64, 3), seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, shape, dtype=np.uint8)


@pytest.mark.parametrize("fmt, suffix", [("PNG", "png"), ("JPEG", "jpg"), ("TIFF", "tif")])
def test_an_image_cut_short_is_refused_when_built_and_skipped(tmp_path, fmt, suffix):
    raw = _encoded(fmt, _pixels())
    (tmp_path / f"a.{suffix}").write_bytes(raw)
    (tmp_path / f"b.{suffix}").write_bytes(raw[: len(raw) * 2 // 3])  # its header is whole, its pixels are not
    with Image.open(tmp_path / f"b.{suffix}") as im:  # Pillow opens it, and fails to decode it
        with pytest.raises(OSError, match="truncated"):
            im.load()
    with pytest.raises(FormatMismatchError, match=rf"b\.{suffix}: is a truncated {fmt} image: .*Pillow cannot "
                                                  r"decode it \(image file is truncated"):
        pipeline.load(str(tmp_path / f"*.{suffix}"))
    x = pipeline.load(str(tmp_path / f"*.{suffix}"), on_error="skip")
    assert [p for p, _ in x.attrs["skipped"]] == [str(tmp_path / f"b.{suffix}")]
    np.testing.assert_array_equal(x.compute(), np.asarray(Image.open(tmp_path / f"a.{suffix}"))[None])


@pytest.mark.parametrize("fmt, suffix", [("PNG", "png"), ("JPEG", "jpg")])
def test_bytes_after_a_complete_image_do_not_make_it_truncated(tmp_path, fmt, suffix):
    # More than the tail the end marker is looked for in: the image is decoded once to decide.
    (tmp_path / f"a.{suffix}").write_bytes(_encoded(fmt, _pixels()) + b"\x01" * (2 * images._TAIL))
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / f"a.{suffix}")).compute()[0],
                                  np.asarray(Image.open(tmp_path / f"a.{suffix}")))


@pytest.mark.parametrize("fmt, head, cut, expected", [
    ("PNG", b"", b"IDAT\x00\x01", "no IEND chunk"),
    ("JPEG", b"", b"\xff\x00\x12", "no end-of-image marker"),
    ("GIF", b"", b"\x00\x01", "trailer byte"),
    ("WEBP", b"RIFF\x10\x00\x00\x00WEBP", b"", "RIFF header declares 24 bytes, the file has 20"),
])
def test_cut_short_reasons(fmt, head, cut, expected):
    assert expected in images._cut_short(fmt, head, cut, 20, None)
    whole = {"PNG": b"\x00\x00\x00\x00IEND\xaeB`\x82", "JPEG": b"\xff\xd9", "GIF": b";", "WEBP": b""}[fmt]
    assert images._cut_short(fmt, head[:4] + b"\x0c\x00\x00\x00" + head[8:], b"..." + whole, 20, None) is None


def test_a_tiff_whose_strips_end_past_the_file_is_cut_short():
    said = images._cut_short("TIFF", b"", b"", 20, 30)
    assert said == "its pixel data is declared to end at byte 30, the file has 20"
    assert images._cut_short("TIFF", b"", b"", 30, 30) is None


def test_16_bit_grayscale_to_8_bit_modes_keeps_the_high_byte(tmp_path):
    wide = np.random.default_rng(1).integers(0, 65535, (6, 7), dtype=np.uint16)
    Image.fromarray(wide).save(tmp_path / "a.png")
    with Image.open(tmp_path / "a.png") as im:
        assert im.mode == "I;16"
        stored = np.asarray(im)
    np.testing.assert_array_equal(stored, wide)
    high = (wide >> 8).astype(np.uint8)  # OpenCV's imread rule for 16-bit to 8-bit
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "a.png"), mode="L").compute()[0], high)
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "a.png"), mode="RGB").compute()[0],
                                  np.repeat(high[..., None], 3, axis=-1))
    default = pipeline.load(str(tmp_path / "a.png")).compute()[0]  # unchanged: the stored 16-bit values
    assert default.dtype == np.uint16
    np.testing.assert_array_equal(default, stored)


def test_exif_orientation_is_not_applied(tmp_path):
    im = Image.fromarray(_pixels((10, 20, 3)))
    exif = im.getexif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    im.save(tmp_path / "r.jpg", exif=exif)
    got = pipeline.load(str(tmp_path / "r.jpg")).compute()[0]
    np.testing.assert_array_equal(got, np.asarray(Image.open(tmp_path / "r.jpg")))  # as stored: (10, 20, 3)
    assert got.shape == (10, 20, 3)


def _class_folders(root, names=("cat/0.png", "cat/1.jpg", "dog/0.png", "dog/1.PNG")) -> list:
    """Class folders of RGB images (one with an upper-case suffix), and the files tools
    such as Finder, Explorer or a labelling script leave beside them."""
    paths = []
    for i, name in enumerate(names):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_pixels((6, 5, 3), seed=i)).save(root / name, "JPEG" if name.endswith("jpg") else "PNG")
        paths.append(root / name)
    (root / "README.txt").write_text("cats and dogs\n")
    (root / "labels.csv").write_text("path,label\ncat/0.png,cat\n")
    (root / "cat" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (root / "dog" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1")
    return paths


@pytest.mark.parametrize("pattern, fmt", [("*/*", None), ("**/*", None), ("*/*", "image"), ("", "image")])
def test_files_that_are_not_images_beside_them_are_left_out_of_a_glob_or_folder(tmp_path, pattern, fmt):
    images = _class_folders(tmp_path)
    where = str(tmp_path / pattern) if pattern else str(tmp_path)  # "": the folder itself
    src = pipeline.loaders.open_source(where, format=fmt, labels="folder")
    assert [f.path for f in src.files] == sorted(map(str, images))
    expected = np.stack([np.asarray(Image.open(p)) for p in sorted(map(str, images))])
    np.testing.assert_array_equal(src.array.compute(), expected)
    assert src.classes == ("cat", "dog") and src.labels.compute().tolist() == [0, 0, 1, 1]


def test_named_files_are_read_whatever_their_suffix_and_an_image_suffix_is_still_checked(tmp_path):
    _class_folders(tmp_path)
    with pytest.raises(FormatMismatchError, match=r"README\.txt: expected an image \(jpg, png, tiff\), found text"):
        pipeline.load([str(tmp_path / "*" / "*"), str(tmp_path / "README.txt")], format="image")
    (tmp_path / "dog" / "fake.png").write_text("not a png")  # an image's suffix: probed, and on_error applies
    with pytest.raises(FormatMismatchError, match=r"fake\.png: expected an image"):
        pipeline.load(str(tmp_path / "*" / "*"))
    x = pipeline.load(str(tmp_path / "*" / "*"), on_error="skip")
    assert [p for p, _ in x.attrs["skipped"]] == [str(tmp_path / "dog" / "fake.png")] and x.shape[0] == 4
    with pytest.raises(EmptyInputError, match=r"matched no image file .*README\.txt"):
        pipeline.load(str(tmp_path / "*.*"), format="image")


def test_arrays_beside_images_in_a_glob_are_still_refused_as_two_formats(tmp_path):
    _class_folders(tmp_path)
    np.save(tmp_path / "cat" / "extra.npy", np.zeros(3))  # which of the two was meant is not guessed
    (tmp_path / "dog" / "Thumbs.db").unlink()  # the glob is taken as it is: this one would be named first
    with pytest.raises(FormatMismatchError, match="files of different formats cannot be combined"):
        pipeline.load(str(tmp_path / "*" / "*.*"))
