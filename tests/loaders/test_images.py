"""Images: files cut short are found when the array is built; 16-bit to 8-bit modes;
what is left as stored (EXIF orientation)."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from PIL import Image

import pipeline
import pipeline.loaders
from pipeline.errors import ConfigError, EmptyInputError, FormatMismatchError, LoaderError, ShapeMismatchError
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


def _png(path, pixels, mode=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels, mode).save(path)


def _tiff_16(path, pixels: np.ndarray, big_endian: bool) -> None:
    """A 16-bit grayscale TIFF in either byte order (ImageJ writes big-endian, "MM")."""
    h, w = pixels.shape
    if big_endian:
        Image.frombuffer("I;16B", (w, h), pixels.astype(">u2").tobytes(), "raw", "I;16B", 0, 1).save(path)
    else:
        Image.fromarray(pixels).save(path)


@pytest.mark.parametrize("big_endian", [False, True])
def test_16_bit_tiff_reads_as_uint16_in_either_byte_order(tmp_path, big_endian):
    wide = np.random.default_rng(3).integers(0, 65536, (12, 16), dtype=np.uint16)
    _tiff_16(tmp_path / "a.tif", wide, big_endian)
    with Image.open(tmp_path / "a.tif") as im:
        assert im.mode == ("I;16B" if big_endian else "I;16")
        reference = np.asarray(im).astype(np.uint16)  # Pillow's values, in native byte order
    np.testing.assert_array_equal(reference, wide)
    got = pipeline.load(str(tmp_path / "a.tif")).compute()[0]
    assert got.dtype == np.uint16 and got.shape == (12, 16)
    np.testing.assert_array_equal(got, wide)
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "a.tif"), mode="L").compute()[0],
                                  (wide >> 8).astype(np.uint8))
    resized = pipeline.load(str(tmp_path / "a.tif"), shape=(6, 8)).compute()[0]
    np.testing.assert_array_equal(resized, np.asarray(Image.fromarray(wide).resize((8, 6), Image.Resampling.BILINEAR)))


def test_16_bit_tiffs_of_both_byte_orders_stack_in_one_folder(tmp_path):
    rng = np.random.default_rng(4)
    stored = [rng.integers(0, 65536, (5, 7), dtype=np.uint16) for _ in range(2)]
    _tiff_16(tmp_path / "a.tif", stored[0], big_endian=False)
    _tiff_16(tmp_path / "b.tif", stored[1], big_endian=True)
    x = pipeline.load(str(tmp_path / "*.tif"))
    assert x.dtype == np.uint16 and x.shape == (2, 5, 7)
    np.testing.assert_array_equal(x.compute(), np.stack(stored))


def test_8_and_16_bit_images_are_refused_together_and_read_alike_with_mode(tmp_path):
    """Stacked as uint16, the 8-bit image's values stayed on its own scale (its 200 beside
    the other's 51400 for the same gray)."""
    Image.fromarray(np.full((4, 5), 200, np.uint8)).save(tmp_path / "a.png")
    Image.fromarray(np.full((4, 5), 51400, np.uint16)).save(tmp_path / "b.png")
    with Image.open(tmp_path / "b.png") as im:
        assert np.asarray(im).dtype == np.uint16
    with pytest.raises(LoaderError, match=r"b\.png: has uint16 pixels, but .*a\.png has uint8: images of different "
                       r"bit depths .* set mode='L'"):
        pipeline.load(str(tmp_path / "*.png"))
    got = pipeline.load(str(tmp_path / "*.png"), mode="L").compute()
    np.testing.assert_array_equal(got, np.full((2, 4, 5), 200, np.uint8))  # 51400 >> 8 == 200


@pytest.mark.parametrize("mode", sorted(images.MODES))
def test_every_mode_has_the_shape_and_values_of_pillows_convert(tmp_path, mode):
    _png(tmp_path / "a.png", _pixels((6, 8, 3), seed=5))
    x = pipeline.load(str(tmp_path / "a.png"), mode=mode)
    with Image.open(tmp_path / "a.png") as im:
        reference = np.asarray(im.convert(mode))
    assert x.shape[1:] == reference.shape and x.dtype == reference.dtype  # known before decoding
    np.testing.assert_array_equal(x.compute()[0], reference)


@pytest.mark.parametrize("mode", ["bogus", "I;16B", "rgb"])
def test_an_unknown_mode_is_refused_before_any_file_is_read(tmp_path, mode):
    with pytest.raises(ConfigError, match=rf"^mode: expected a Pillow mode .*RGBA.*, got '{re.escape(mode)}'"):
        pipeline.load(str(tmp_path / "nothing-here-*.png"), mode=mode)  # no glob looked at


def test_a_conversion_pillow_lacks_is_refused_when_the_array_is_built(tmp_path):
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "a.png")
    with Image.open(tmp_path / "a.png") as im, pytest.raises(ValueError):
        im.convert("RGBa")
    with pytest.raises(FormatMismatchError, match=r"a\.png: is a L image, which Pillow cannot convert to mode='RGBa'"):
        pipeline.load(str(tmp_path / "a.png"), mode="RGBa")


def test_palette_and_la_images_come_as_rgb_by_default(tmp_path):
    rgb = _pixels((6, 5, 3), seed=6)
    Image.fromarray(rgb).convert("P").save(tmp_path / "p.png")
    Image.fromarray(rgb).convert("LA").save(tmp_path / "la.png")
    for name in ("la.png", "p.png"):
        with Image.open(tmp_path / name) as im:
            reference = np.asarray(im.convert("RGB"))
        x = pipeline.load(str(tmp_path / name))
        assert x.shape == (1, 6, 5, 3)
        np.testing.assert_array_equal(x.compute()[0], reference)


@pytest.mark.parametrize("how", ["raise", "pad", "crop", "resize"])
def test_another_channel_count_is_refused_naming_the_mode_to_set(tmp_path, how):
    _png(tmp_path / "a_logo.png", _pixels((8, 8, 4), seed=7), "RGBA")
    _png(tmp_path / "b_photo.png", _pixels((8, 8, 3), seed=8))
    with pytest.raises(ShapeMismatchError, match=r"b_photo\.png: has shape \(8, 8, 3\) \(3 channel\(s\)\), but "
                                                 r".*a_logo\.png has \(8, 8, 4\) \(4 channel\(s\)\).* set mode='RGBA'"):
        pipeline.load(str(tmp_path / "*.png"), on_mismatch=how)
    both = pipeline.load(str(tmp_path / "*.png"), mode="RGBA", on_mismatch=how).compute()
    with Image.open(tmp_path / "b_photo.png") as im:  # alpha 255, as Pillow's convert gives it
        np.testing.assert_array_equal(both[1], np.asarray(im.convert("RGBA")))


@pytest.mark.parametrize("how", ["raise", "pad", "resize"])
def test_a_grayscale_image_among_rgb_ones_is_told_to_set_mode_rgb(tmp_path, how):
    Image.fromarray(_pixels((8, 8, 3))).save(tmp_path / "a.jpg")
    Image.fromarray(_pixels((8, 8), seed=1)).save(tmp_path / "b.jpg")
    with pytest.raises(ShapeMismatchError, match=r"b\.jpg: has shape \(8, 8\) \(1 channel\(s\)\).*set mode='RGB'"):
        pipeline.load(str(tmp_path / "*.jpg"), on_mismatch=how)
    with Image.open(tmp_path / "b.jpg") as im:
        reference = np.asarray(im.convert("RGB"))
    np.testing.assert_array_equal(pipeline.load(str(tmp_path / "*.jpg"), mode="RGB").compute()[1], reference)


@pytest.mark.parametrize("how", ["crop", "resize"])
def test_on_mismatch_fits_height_and_width_and_keeps_every_channel(tmp_path, how):
    first, second = _pixels((6, 8, 3), seed=9), _pixels((4, 10, 3), seed=10)
    _png(tmp_path / "a.png", first)
    _png(tmp_path / "b.png", second)
    got = pipeline.load(str(tmp_path / "*.png"), on_mismatch=how).compute()
    if how == "resize":  # nearest neighbour on rows and columns, channels untouched
        rows, cols = np.arange(6) * 4 // 6, np.arange(8) * 10 // 8
        expected = second[rows][:, cols]
    else:  # the top-left part kept, zeros below
        expected = np.zeros((6, 8, 3), np.uint8)
        expected[:4] = second[:, :8]
    np.testing.assert_array_equal(got[1], expected)
    np.testing.assert_array_equal(got[0], first)


@pytest.mark.parametrize("order", ["abc", "cba", "bca"])
def test_pad_pads_every_image_to_the_largest_height_and_width_whatever_the_order(tmp_path, order):
    """pad fitted to the first image's size and refused a larger one: whether a folder
    loaded depended on its sort order. It pads to the tallest and widest image."""
    pixels = {"a": _pixels((6, 8, 3), seed=9), "b": _pixels((4, 5, 3), seed=10), "c": _pixels((4, 10, 3), seed=11)}
    for name, p in pixels.items():
        _png(tmp_path / f"{name}.png", p)
    got = pipeline.load([str(tmp_path / f"{n}.png") for n in order], on_mismatch="pad")
    assert got.shape == (3, 6, 10, 3)  # from the headers, nothing decoded
    with_pil = []
    for n in order:
        with Image.open(tmp_path / f"{n}.png") as im:
            with_pil.append(np.asarray(im))
    np.testing.assert_array_equal(got.compute(), np.stack([np.pad(p, ((0, 6 - p.shape[0]), (0, 10 - p.shape[1]),
                                                                      (0, 0))) for p in with_pil]))


def test_pad_with_shape_resizes_every_image_to_it_as_before(tmp_path):
    """With shape=(H, W) every image is read resized to it (bilinear): pad has nothing
    to fit, larger or smaller."""
    _png(tmp_path / "a.png", _pixels((4, 5, 3), seed=1))
    _png(tmp_path / "b.png", _pixels((9, 12, 3), seed=2))
    got = pipeline.load(str(tmp_path / "*.png"), shape=(6, 7), on_mismatch="pad").compute()
    for i, name in enumerate(("a.png", "b.png")):
        with Image.open(tmp_path / name) as im:
            np.testing.assert_array_equal(got[i], np.asarray(im.resize((7, 6), Image.Resampling.BILINEAR)))


def _image_tree(root, layout) -> None:
    for i, rel in enumerate(layout):
        _png(root / rel, _pixels((4, 4), seed=i))


def test_a_directory_labels_each_image_by_its_top_level_class_folder(tmp_path):
    layout = ["cat/1.png", "cat/indoor/2.png", "cat/outdoor/3.png", "dog/4.png", "dog/indoor/5.png"]
    _image_tree(tmp_path, layout)
    src = pipeline.loaders.open_source(str(tmp_path), format="image", labels="folder")
    got = {str(p.relative_to(tmp_path)) for p in map(type(tmp_path), (f.path for f in src.files))}
    assert got == set(layout)
    assert src.classes == ("cat", "dog")  # torchvision's ImageFolder: the folders right below the root
    names = [f.path.split(str(tmp_path) + "/")[1].split("/")[0] for f in src.files]
    assert [src.classes[i] for i in src.labels.compute()] == names
    (tmp_path / "loose.png").write_bytes((tmp_path / "dog" / "4.png").read_bytes())
    with pytest.raises(LoaderError, match=r"loose\.png: is directly in .*, not in a class folder below it"):
        pipeline.loaders.open_source(str(tmp_path), format="image", labels="folder")


def test_a_skipped_file_does_not_shift_class_indices(tmp_path):
    _image_tree(tmp_path, ["ant/1.png", "cow/1.png"])
    (tmp_path / "bee").mkdir()
    (tmp_path / "bee" / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n")  # a cut-off download
    src = pipeline.loaders.open_source(str(tmp_path), format="image", labels="folder", on_error="skip")
    assert [p for p, _ in src.skipped] == [str(tmp_path / "bee" / "1.png")]
    assert src.classes == ("ant", "bee", "cow") and src.labels.compute().tolist() == [0, 2]
    assert src.array.shape[0] == 2


def test_classes_pin_the_index_of_each_folder_and_refuse_others(tmp_path):
    _image_tree(tmp_path, ["cow/1.png", "ant/1.png"])
    src = pipeline.loaders.open_source(str(tmp_path / "*" / "*.png"), labels="folder", classes=["cow", "bee", "ant"])
    assert src.classes == ("cow", "bee", "ant")
    assert [f.path for f in src.files] == [str(tmp_path / "ant" / "1.png"), str(tmp_path / "cow" / "1.png")]
    assert src.labels.compute().tolist() == [2, 0]
    with pytest.raises(LoaderError, match=r"ant/1\.png: has class folder 'ant', which classes=\['cow'\] does not list"):
        pipeline.loaders.open_source(str(tmp_path / "*" / "*.png"), labels="folder", classes=["cow"])
    with pytest.raises(ConfigError, match=r"^classes: "):
        pipeline.loaders.open_source(str(tmp_path / "*" / "*.png"), labels="folder", classes="cow")
    with pytest.raises(ConfigError, match=r"^classes: classes= pins .* no labels= was given"):
        pipeline.loaders.open_source(str(tmp_path / "*" / "*.png"), classes=["cow"])


@pytest.mark.parametrize("given", [False, True])
def test_a_store_written_from_a_source_records_its_classes_and_skipped_files(tmp_path, given):
    """The array carries the source's provenance, which pipeline.write records by itself
    (the class names were lost unless the caller knew to pass attrs=src.metadata())."""
    root = tmp_path / "im"
    _image_tree(root, ["cat/0.png", "cat/1.png", "dog/0.png"])
    (root / "cat" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 10)
    src = pipeline.loaders.open_source(str(root), format="image", labels="folder", on_error="skip")
    store = tmp_path / "set.zarr"
    pipeline.write(str(store), {"x": src.array, "y": src.labels}, progress=False,
                   **({"attrs": src.metadata()} if given else {}))
    ds = pipeline.open(str(store))
    assert ds.attrs["classes"] == ["cat", "dog"]
    assert [p for p, _ in ds.attrs["skipped"]] == [str(root / "cat" / "bad.png")]
    np.testing.assert_array_equal(np.asarray(ds["train"]["y"]), [0, 0, 1])
    expected = np.stack([np.asarray(Image.open(root / p)) for p in ("cat/0.png", "cat/1.png", "dog/0.png")])
    np.testing.assert_array_equal(np.asarray(ds["train"]["x"]), expected)


def test_pillows_object_repr_is_left_out_of_errors(tmp_path):
    (tmp_path / "a.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 10)
    with pytest.raises(FormatMismatchError) as info:
        pipeline.load(str(tmp_path / "a.png"))
    assert "<" not in str(info.value) and "a.png: is a truncated or damaged PNG image" in str(info.value)
