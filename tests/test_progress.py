"""pipeline.progress: results in the order the collections were given, with and without
a bar, on the local schedulers and on a distributed client."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest

from pipeline.progress import compute, ordered_compute


def _mixed():
    """Arrays and delayed objects interleaved, each result telling which it is."""
    a = da.arange(3, chunks=2)
    d1 = dask.delayed(lambda: "first delayed")()
    e = da.full(2, 7, chunks=1)
    d2 = dask.delayed(lambda: "second delayed")()
    return (a, d1, e, d2, np.int64(5)), [np.arange(3), "first delayed", np.full(2, 7), "second delayed", 5]


def _check(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, str):
            assert g == w
        else:
            np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_mixed_collections_come_back_in_the_order_given(scheduler):
    # dask.compute itself returns (a, e, d1, d2, 5) here: grouped by type.
    collections, want = _mixed()
    with dask.config.set(scheduler=scheduler):
        _check(ordered_compute(*collections), want)
        _check(compute(*collections, progress=False), want)
        _check(compute(*collections, progress=True), want)


def test_mixed_collections_on_a_distributed_client_come_back_in_the_order_given(capsys):
    from distributed import Client, LocalCluster

    collections, want = _mixed()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster):
        _check(compute(*collections, progress=True, desc="writing chunks"), want)
        # The scheduler's bar, with its label: dask names its client by the client's bound
        # ``get``, and no bar at all was shown on a cluster (a local bar never moved there).
        shown = capsys.readouterr()
        assert shown.err.startswith("writing chunks:\n") and "100% Completed" in shown.out, shown
        _check(compute(*collections, progress=False, desc="writing chunks"), want)
        assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("progress", [False, True])
def test_a_local_scheduler_named_in_the_config_computes_locally_while_a_client_exists(progress):
    """dask.compute honours ``scheduler="sync"`` over a default distributed client; the
    bar's compute did not (it asked distributed for the client first)."""
    import threading

    from distributed import Client, LocalCluster

    where = dask.delayed(lambda: threading.current_thread().name)()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster):
        (on_client,) = compute(where, progress=progress)
        with dask.config.set(scheduler="sync"):
            (local,) = compute(where, progress=progress)
    assert on_client != threading.current_thread().name  # a worker's thread
    assert local == threading.current_thread().name
