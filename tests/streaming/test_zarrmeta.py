"""What another tool's zarr array says about itself: CF fill values named as the numbers
they are, in the refusal of a variable whose missing values would be served as numbers."""

from __future__ import annotations

import base64
import json
import struct
import warnings

import numpy as np
import pytest
import xarray as xr
import zarr

import pipeline
from pipeline.errors import StreamError


def refusal(path, variable: str) -> str:
    with pytest.raises(StreamError) as info:
        pipeline.stream(str(path), arrays=(variable,), dim="sample", batch_size=10)
    return str(info.value)


def stored_fill(path, variable: str):
    """The ``_FillValue`` attribute as the store's ``zarr.json`` holds it."""
    return json.loads((path / variable / "zarr.json").read_text())["attributes"]["_FillValue"]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_an_xarray_float_fill_value_is_named_as_its_number(tmp_path, dtype):
    path = tmp_path / "ds.zarr"
    xr.Dataset({"y": ("sample", np.arange(100, dtype=dtype))}).to_zarr(
        path, zarr_format=3, encoding={"y": {"_FillValue": -9999.0}}, consolidated=False)
    encoded = stored_fill(path, "y")
    # What the message decodes, independently: xarray's base64 of a little-endian double.
    assert struct.unpack("<d", base64.b64decode(encoded)) == (-9999.0,)
    message = refusal(path, "y")
    assert "variable 'y': attribute _FillValue=-9999.0: values equal to it are missing" in message
    assert encoded not in message


def test_a_fill_value_in_the_variables_own_bytes_is_decoded_and_nan_accepted(tmp_path):
    """Base64 of the variable's own dtype (4 bytes of a float32), as the brief of the
    encoding reads; a NaN so written is the stored NaN, not a number served."""
    path = tmp_path / "ds.zarr"
    group = zarr.open_group(path, mode="w")
    for name, fill in (("a", -9999.0), ("b", np.nan)):
        array = group.create_array(name, data=np.arange(100, dtype="f4"), chunks=(10,), dimension_names=("sample",))
        array.attrs["_FillValue"] = base64.b64encode(np.array(fill, "<f4").tobytes()).decode()
    assert "variable 'a': attribute _FillValue=-9999.0: values equal" in refusal(path, "a")
    s = pipeline.stream(str(path), arrays=("b",), dim="sample", batch_size=10)
    assert np.sort(np.concatenate([b for (b,) in s])).tolist() == list(range(100))
    s.close()


def test_a_fill_value_that_cannot_be_decoded_is_named_as_stored(tmp_path):
    path = tmp_path / "ds.zarr"
    group = zarr.open_group(path, mode="w")
    array = group.create_array("y", data=np.arange(100, dtype="f8"), chunks=(10,), dimension_names=("sample",))
    array.attrs["_FillValue"] = "not-a-number"
    assert "attribute _FillValue='not-a-number': values equal" in refusal(path, "y")


def test_a_zarr_2_fill_value_is_named_as_its_number(tmp_path):
    path = tmp_path / "ds.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xr.Dataset({"y": ("sample", np.arange(100, dtype="f4"))}).to_zarr(
            path, zarr_format=2, encoding={"y": {"_FillValue": -9999.0}}, consolidated=False)
    assert json.loads((path / "y" / ".zarray").read_text())["fill_value"] == -9999.0
    assert ("variable 'y': its .zarray's fill_value -9999.0 (xarray's _FillValue): values equal" in refusal(path, "y"))


def test_a_plain_zarr_2_fill_value_on_named_dimensions_says_where_it_is(tmp_path):
    """zarr 2's default fill value (0) on an array naming its dimensions, which xarray
    masks: named as the .zarray's fill_value, with how to write it without, not as an
    attribute the array does not have."""
    path = tmp_path / "v2.zarr"
    group = zarr.open_group(path, mode="w", zarr_format=2)
    y = group.create_array("y", data=np.arange(100) % 3, chunks=(10,))
    y.attrs["_ARRAY_DIMENSIONS"] = ["sample"]
    assert int(np.isnan(xr.open_zarr(path, consolidated=False)["y"].values).sum()) == 34  # xarray masks the zeros
    message = refusal(path, "y")
    assert "variable 'y': its .zarray's fill_value 0 (xarray's _FillValue)" in message
    assert "fill_value=None (xarray: encoding={'y': {'_FillValue': None}})" in message
    assert "attribute" not in message


@pytest.mark.parametrize("attrs", [{"calendar": "standard"}, {"dtype": "uint8"}, {"units": "seconds"},
                                   {"dtype": "float64", "units": "days"}])
def test_attributes_xarray_does_not_decode_stream_as_stored(tmp_path, attrs):
    """A ``calendar`` without times since a date, or a ``dtype`` other than xarray's
    bools and timedeltas: xarray serves the stored numbers, and so does the stream (it
    refused them, and advised a rewrite through xarray that kept them)."""
    path = tmp_path / "ds.zarr"
    group = zarr.open_group(path, mode="w")
    y = group.create_array("y", data=np.arange(100), chunks=(10,), dimension_names=("sample",))
    y.attrs.update(attrs)
    decoded = xr.open_zarr(path, consolidated=False)["y"].values
    np.testing.assert_array_equal(decoded, np.arange(100))  # what xarray reads: the stored numbers
    s = pipeline.stream(str(path), arrays=("y",), dim="sample", batch_size=10)
    assert np.sort(np.concatenate([b for (b,) in s])).tolist() == list(range(100))


@pytest.mark.parametrize("attrs", [{"dtype": "bool"}, {"dtype": "timedelta64[s]", "units": "seconds"}])
def test_attributes_xarray_decodes_to_another_dtype_are_refused(tmp_path, attrs):
    path = tmp_path / "ds.zarr"
    group = zarr.open_group(path, mode="w")
    y = group.create_array("y", data=np.arange(100) % 2, chunks=(10,), dimension_names=("sample",))
    y.attrs.update(attrs)
    assert xr.open_zarr(path, consolidated=False)["y"].dtype.kind in "bm"  # xarray decodes it
    assert f"variable 'y': attribute dtype={attrs['dtype']!r}: the stored numbers decode" in refusal(path, "y")


@pytest.mark.parametrize("attrs", [{"scale_factor": 1.0}, {"_FillValue": -1}, {"units": "seconds since epoch"},
                                   {"dtype": "bool"}])
def test_attributes_of_arrays_naming_no_dimensions_are_the_users_own(tmp_path, attrs):
    """xarray opens only arrays that name their dimensions: on another array (a plain
    zarr store, arrays passed directly) these are the user's attributes (-1 an ignore
    index), not encodings, and the stored numbers stream."""
    path = tmp_path / "plain.zarr"
    group = zarr.open_group(path, mode="w")
    group.create_array("x", data=np.arange(200, dtype="u1").reshape(100, 2), chunks=(10, 2))
    y = group.create_array("y", data=np.arange(100), chunks=(10,))
    y.attrs.update(attrs)
    for source in (str(path), (group["x"], group["y"])):
        s = pipeline.stream(source, split=None if isinstance(source, str) else "train", batch_size=10)
        ys = np.concatenate([yb.copy() for _, yb in s])
        assert np.sort(ys).tolist() == list(range(100))
