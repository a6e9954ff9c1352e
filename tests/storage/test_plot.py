"""``pipeline inspect --plot``'s file: its format follows its extension, checked before
anything is read (pipeline/storage/plot.py)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import pipeline
from pipeline.errors import ConfigError, StoreError
from pipeline.storage.plot import plot_formats, plot_store, plot_target


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("plot") / "s.zarr"
    x = np.random.default_rng(0).standard_normal((64, 4, 2)).astype(np.float32)
    pipeline.write(path, {"x": x, "y": np.arange(64)}, progress=False)
    return str(path)


@pytest.mark.parametrize(("name", "written", "pil_format"), [
    ("p.JPG", "p.JPG", "JPEG"), ("p", "p.png", "PNG"), ("p.v2.tiff", "p.v2.tiff", "TIFF")])
def test_the_image_written_is_the_file_returned_in_its_extensions_format(store, tmp_path, name, written, pil_format):
    assert plot_target(tmp_path / name) == str(tmp_path / written)
    assert plot_store(store, str(tmp_path / name)) == str(tmp_path / written)
    assert sorted(p.name for p in tmp_path.iterdir()) == [written]
    with Image.open(tmp_path / written) as image:  # the reference: PIL reads what the bytes are
        assert image.format == pil_format


def test_a_pdf_is_written_as_one(store, tmp_path):
    plot_store(store, str(tmp_path / "p.pdf"))
    assert (tmp_path / "p.pdf").read_bytes().startswith(b"%PDF-")


@pytest.mark.parametrize("name", ["p.txt", "p.pgf", "p.raw", "p.png.bak", "p."])
def test_an_extension_that_is_no_image_format_is_refused_naming_those_that_are(store, tmp_path, name):
    with pytest.raises(ConfigError) as err:
        plot_store(store, str(tmp_path / name))
    assert err.value.path == "--plot" and ".png, " in err.value.expected and ".pdf" in err.value.expected
    assert f".{name.rpartition('.')[2]}," not in err.value.expected or name.endswith(".")
    assert list(tmp_path.iterdir()) == []


def test_the_formats_are_matplotlibs_image_formats():
    from matplotlib.backend_bases import FigureCanvasBase

    assert set(plot_formats()) == set(FigureCanvasBase.get_supported_filetypes()) - {"pgf", "raw", "rgba"}
    assert list(plot_formats()) == sorted(plot_formats())


def test_a_directory_or_a_missing_folder_is_refused_before_the_store_is_read(tmp_path):
    (tmp_path / "figs").mkdir()
    (tmp_path / "p.png").mkdir()
    with pytest.raises(StoreError, match=r"--plot .*figs: a directory; name an image file, such as .*figs/plot\.png$"):
        plot_target(tmp_path / "figs")
    with pytest.raises(StoreError, match=r"--plot .*p\.png: a directory"):
        plot_target(tmp_path / "p")  # the .png added names a directory
    with pytest.raises(StoreError, match=r"the folder .*no does not exist"):
        plot_store(str(tmp_path / "no-store.zarr"), str(tmp_path / "no" / "p.png"))  # not the store's error
