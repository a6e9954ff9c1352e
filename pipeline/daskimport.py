"""``dask.array`` imported without importing xarray.

Wherever xarray is installed, ``import dask.array`` imports it (``dask/array/core.py``:
``xr = import_optional_dependency("xarray", errors="ignore")``), and xarray imports
pandas with it: half a second, in a run's own process and in the process its workers
are forked from, on the path to a ready cluster (measured in ``benchmarks/README.md``,
build throughput). dask keeps the module only to tell whether an array given to
``da.from_array`` is an xarray ``DataArray``, and nothing a run builds is one.

:func:`import_dask_array` imports ``dask.array`` with xarray held back, then gives dask
a stand-in that answers for xarray as soon as anything imports it: an object can only
be a ``DataArray`` once xarray is imported, so ``from_array`` treats every object as it
would have. Once xarray or ``dask.array`` is imported already, it changes nothing.
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

__all__ = ["import_dask_array"]


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


def import_dask_array() -> None:
    """Import ``dask.array`` without importing xarray (see the module's text)."""
    try:
        installed = "xarray" not in sys.modules and importlib.util.find_spec("xarray") is not None
    except (ImportError, ValueError):
        installed = False
    if "dask.array.core" in sys.modules or not installed:
        importlib.import_module("dask.array")  # as it comes: nothing to hold back
        return
    # A None entry makes any import of the name fail, which dask's optional import
    # takes for "not installed". Only this process's import of dask.array runs now:
    # this is called before the caller starts any thread that imports.
    sys.modules["xarray"] = None  # type: ignore[assignment]
    try:
        core = importlib.import_module("dask.array.core")
        importlib.import_module("dask.array")
    finally:
        if "xarray" in sys.modules and sys.modules["xarray"] is None:
            del sys.modules["xarray"]
    if core.xr is None:
        core.xr = _XarrayOnceImported()


import_dask_array()
