"""dask.array imported without xarray, and from_array as dask has it once xarray is."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


def test_dask_array_comes_without_xarray_and_from_array_still_knows_dataarrays():
    pytest.importorskip("xarray")
    out = _run("""
        import sys
        import pipeline.daskimport
        import dask.array as da
        import numpy as np
        print("xarray" in sys.modules, "pandas" in sys.modules)
        print(int(da.from_array(np.arange(10), chunks=5).sum().compute()))
        import xarray as xr
        chunked = xr.DataArray(np.arange(12.0)).chunk(4)
        # dask takes a chunked DataArray's own dask array (its chunks), as without us.
        print(da.from_array(chunked).chunks, da.from_array(xr.DataArray(np.arange(3.0))).chunks)
        print(type(sys.modules["dask.array.core"].xr).__name__, sys.modules["dask.array.core"].xr.DataArray is xr.DataArray)
    """)
    assert out.splitlines() == ["False False", "45", "((4, 4, 4),) ((3,),)", "_XarrayOnceImported True"]


def test_the_same_chunks_as_dask_with_xarray_imported_first():
    pytest.importorskip("xarray")
    code = """
        import sys
        {first}
        import dask.array as da, numpy as np, xarray as xr
        print(da.from_array(xr.DataArray(np.arange(12.0)).chunk(4)).chunks, type(sys.modules["dask.array.core"].xr).__name__)
    """
    plain = _run(code.format(first="import xarray"))
    ours = _run(code.format(first="import xarray, pipeline.daskimport"))
    assert plain == ours == "((4, 4, 4),) module"  # xarray imported first: dask's own module, untouched


def test_a_stand_in_never_claims_an_object_and_names_what_was_asked():
    from pipeline.daskimport import _NotImported, _XarrayOnceImported

    stand_in = _XarrayOnceImported()
    if "xarray" not in sys.modules:
        assert stand_in.DataArray is _NotImported and not isinstance(object(), stand_in.DataArray)
        with pytest.raises(AttributeError, match="xarray.Dataset"):
            stand_in.Dataset
    else:
        assert stand_in.DataArray is sys.modules["xarray"].DataArray
