"""``dask.array`` imported without importing xarray or scipy.

Wherever they are installed, ``import dask.array`` imports both:

- xarray (``dask/array/core.py``: ``xr = import_optional_dependency("xarray",
  errors="ignore")``), and pandas with it: half a second;
- scipy, for ``scipy.sparse`` (``dask/array/chunk_types.py`` registers its matrices
  and arrays as chunk types) and ``scipy.fftpack`` (``dask/array/fft.py`` checks
  whether a wrapped function comes from it): a third of a second.

They are paid in a run's own process and in the process its workers are forked from,
on the path to a ready cluster (measured in ``benchmarks/README.md``, build
throughput). dask keeps these modules only to recognize their objects: an xarray
``DataArray`` given to ``da.from_array``, a scipy sparse matrix as a block, a
``scipy.fftpack`` function given to ``fft_wrap``. Nothing a run builds is one.

:func:`import_dask_array` imports ``dask.array`` with both held back, then gives dask
stand-ins that answer as dask would have as soon as anything imports them: an object
can only be a ``DataArray`` or a sparse matrix once its module is imported, so dask
treats every object as it would have. Once ``dask.array`` is imported already, it
changes nothing; a module imported already is not held back.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

__all__ = ["import_dask_array"]

#: Imported by ``dask.array`` only to recognize their objects (see the module's text).
HELD_BACK = ("xarray", "scipy")


class _NotImported:
    """What ``DataArray`` is while xarray is not imported: no object is an instance."""


class _XarrayOnceImported:
    """dask.array's ``xr``: xarray's attributes once xarray is imported; before that,
    a ``DataArray`` nothing is an instance of (and no other attribute)."""

    def __getattr__(self, name: str) -> Any:
        module = sys.modules.get("xarray")
        if module is not None:
            return getattr(module, name)
        if name == "DataArray":
            return _NotImported
        raise AttributeError(f"xarray is not imported (dask.array asked for xarray.{name})")


def _sparse_types() -> tuple[type, ...]:
    """scipy's sparse matrix and array classes, once ``scipy.sparse`` is imported."""
    sparse = sys.modules.get("scipy.sparse")
    if sparse is None:
        return ()
    return tuple(t for t in (getattr(sparse, "spmatrix", None), getattr(sparse, "sparray", None))
                 if isinstance(t, type))


class _SparseOnceImportedMeta(type):
    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, _sparse_types())

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, _sparse_types())


class _SparseOnceImported(metaclass=_SparseOnceImportedMeta):
    """A chunk type for dask that is scipy's sparse matrices and arrays once
    ``scipy.sparse`` is imported (as dask registers them), and nothing before."""


class _ScipyOnceImported:
    """dask.array.fft's ``scipy``: not ``None`` (scipy is installed), and scipy's
    attributes once it is imported."""

    def __getattr__(self, name: str) -> Any:
        module = sys.modules.get("scipy")
        if module is None:
            raise AttributeError(f"scipy is not imported (dask.array asked for scipy.{name})")
        return getattr(module, name)


def _installed(name: str) -> bool:
    try:
        return name not in sys.modules and importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def import_dask_array() -> None:
    """Import ``dask.array`` without importing xarray or scipy (see the module's text)."""
    held = [name for name in HELD_BACK if _installed(name)]
    if "dask.array.core" in sys.modules or not held:
        importlib.import_module("dask.array")  # as it comes: nothing to hold back
        return
    # A None entry makes any import of the name fail, which dask's optional imports
    # take for "not installed". Only this process's import of dask.array runs now:
    # this is called before the caller starts any thread that imports.
    for name in held:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        core = importlib.import_module("dask.array.core")
        importlib.import_module("dask.array")
    finally:
        for name in held:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]
    if "xarray" in held and core.xr is None:
        core.xr = _XarrayOnceImported()
    if "scipy" in held:
        from dask.array import chunk_types, fft

        chunk_types.register_chunk_type(_SparseOnceImported)
        if fft.scipy is None:
            fft.scipy = _ScipyOnceImported()


import_dask_array()
