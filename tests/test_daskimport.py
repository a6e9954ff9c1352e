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


def test_dask_array_comes_without_scipy_and_still_knows_sparse_blocks():
    pytest.importorskip("scipy")
    code = """
        import sys
        {first}
        import dask.array as da, numpy as np
        from dask.array.chunk_types import is_valid_array_chunk, is_valid_chunk_type
        before = [m for m in ("scipy", "scipy.sparse", "scipy.fftpack") if m in sys.modules]
        import scipy.sparse
        m = scipy.sparse.csr_matrix(np.eye(4))
        a = scipy.sparse.csr_array(np.eye(4))
        print(is_valid_chunk_type(type(m)), is_valid_chunk_type(type(a)), is_valid_array_chunk(m),
              is_valid_chunk_type(list), is_valid_array_chunk(np.ones(2)))
        # Blocks of sparse matrices: dask concatenates them as sparse (its lazy scipy registration).
        x = da.from_array(m, chunks=2, asarray=False)
        print(type(x.compute()).__name__, x.compute().nnz)
        print(np.allclose(da.fft.fft(da.arange(8.0, chunks=8)).compute(), np.fft.fft(np.arange(8.0))))
        print(before)
    """
    plain = _run(code.format(first="")).splitlines()
    ours = _run(code.format(first="import pipeline.daskimport")).splitlines()
    assert ours[:3] == plain[:3] == ["True True True False True", "csr_matrix 4", "True"]
    assert plain[3] != "[]" and ours[3] == "[]"  # dask alone imports scipy; through pipeline it waits
