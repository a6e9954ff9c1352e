"""Zarr another tool wrote, in every kind of store, streamed through DataLoader worker
processes: each worker reads every sample of its share once, the values zarr reads, or
the stream is refused with a StreamError that names the store and what to do (never a
hang, never a worker reading through its parent's session)."""

from __future__ import annotations

import pickle
import uuid

import numpy as np
import pytest
import zarr

import pipeline
from pipeline.errors import StreamError
from pipeline.streaming.foreign import ZarrSource

N = 600
KINDS = ["local", "zip", "memory", "fsspec-file", "fsspec-memory", "fsspec-s3"]


@pytest.fixture(scope="module")
def reference():
    rng = np.random.default_rng(1)
    return rng.standard_normal((N, 4, 3)).astype(np.float32), np.arange(N, dtype=np.int64)


def store_of(kind: str, tmp_path, request) -> zarr.abc.store.Store:
    """An empty store of ``kind``, open for writing."""
    if kind == "local":
        return zarr.storage.LocalStore(tmp_path / "s.zarr")
    if kind == "zip":
        return zarr.storage.ZipStore(tmp_path / "s.zip", mode="w")
    if kind == "memory":
        return zarr.storage.MemoryStore()
    if kind == "fsspec-file":
        return zarr.storage.FsspecStore.from_url(f"file://{tmp_path / 's.zarr'}", storage_options={"auto_mkdir": True})
    if kind == "fsspec-memory":
        url = f"memory://{uuid.uuid4().hex}/s.zarr"
        request.addfinalizer(lambda: __import__("fsspec").filesystem("memory").rm(url, recursive=True))
        return zarr.storage.FsspecStore.from_url(url)
    s3 = request.getfixturevalue("s3")
    return zarr.storage.FsspecStore.from_url(f"s3://training/workers/{uuid.uuid4().hex}.zarr", storage_options=s3)


def written(kind: str, tmp_path, request, x, y, zarr_format: int) -> tuple[zarr.Array, zarr.Array]:
    """``x`` and ``y`` written to a store of ``kind``, opened again for reading as a user
    would pass them (the zip store closed and opened read-only)."""
    store = store_of(kind, tmp_path, request)
    g = zarr.open_group(store, mode="w", zarr_format=zarr_format)
    g.create_array("x", shape=x.shape, dtype=x.dtype, chunks=(50, 4, 3))[:] = x
    g.create_array("y", shape=y.shape, dtype=y.dtype, chunks=(75,))[:] = y
    if kind == "zip":
        store.close()
        g = zarr.open_group(zarr.storage.ZipStore(tmp_path / "s.zip", mode="r"), mode="r")
    return g["x"], g["y"]


def served(s, workers: int = 2, context: str = "fork") -> tuple[np.ndarray, np.ndarray]:
    """One epoch of ``s`` through a DataLoader; its timeout turns a hang into an error."""
    from torch.utils.data import DataLoader

    loader = DataLoader(s.torch(), batch_size=None, num_workers=workers, timeout=60 if workers else 0,
                        multiprocessing_context=context if workers else None)
    xs, ys = [], []
    try:
        for xb, yb in loader:
            xs.append(xb.numpy())
            ys.append(yb.numpy())
    except StreamError as exc:
        # The DataLoader re-raises a worker's error from a frame that holds the error: a
        # cycle that keeps the loader's iterator, and its idle workers (5 s each to see
        # they are done), until the garbage collector runs. Without the traceback they
        # are shut down at once.
        exc.__traceback__ = None
        raise StreamError(str(exc)) from None
    return np.concatenate(xs), np.concatenate(ys)


def assert_once_each(xs, ys, zx, zy):
    """Every sample once, ``x`` aligned with its id, the values zarr reads."""
    order = np.argsort(ys, kind="stable")
    np.testing.assert_array_equal(ys[order], zy[:])
    np.testing.assert_array_equal(xs[order], zx[:])


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_forked_workers_stream_arrays_of_every_kind_of_store(kind, zarr_format, tmp_path, request, reference):
    """Forked workers (Linux's default) open each store again (an s3fs session, a zip
    handle are the parent's) or read the copy the fork made (a store in memory)."""
    zx, zy = written(kind, tmp_path, request, *reference, zarr_format)
    s = pipeline.stream((zx, zy), batch_size=40, seed=0)
    for _ in s:  # the parent has read through its stores (a validation pass) before forking
        pass
    s.set_epoch(1)
    assert_once_each(*served(s), zx, zy)


@pytest.mark.parametrize("cache", [False, True])
@pytest.mark.parametrize("layout", ["zarr3", "xarray-zarr2"])
def test_a_foreign_store_on_s3_streams_through_forked_workers(layout, cache, s3, tmp_path, reference):
    """A store another tool wrote on S3, streamed by URL: each worker reads through an
    s3fs session of its own (the parent's is bound to the parent's event loop: "attached
    to a different loop"), with and without the node-local cache."""
    x, y = reference
    url = f"s3://training/workers/{layout}-{uuid.uuid4().hex}.zarr"
    store = zarr.storage.FsspecStore.from_url(url, storage_options=s3)
    if layout == "zarr3":
        g = zarr.open_group(store, mode="w")
        g.create_array("x", data=x, chunks=(100, 4, 3))
        g.create_array("y", data=y, chunks=(100,))
        kw = {}
    else:
        import xarray as xr

        ds = xr.Dataset({"x": (("sample", "a", "b"), x), "y": ("sample", y)}).chunk({"sample": 128})
        ds.to_zarr(store, mode="w", zarr_format=2, consolidated=True)
        kw = {"dim": "sample"}
    if cache:
        kw.update(cache_dir=str(tmp_path / "cache"), cache_bytes=2**26)
    s = pipeline.stream(url, storage_options=s3, batch_size=64, seed=0, **kw)
    assert isinstance(s.source, ZarrSource)
    g = zarr.open_group(store, mode="r")
    assert_once_each(*served(s), g["x"], g["y"])


def icechunk_group(tmp_path, x, y) -> zarr.Group:
    """``x`` and ``y`` committed to an icechunk repository, opened read-only."""
    icechunk = pytest.importorskip("icechunk")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    session = repo.writable_session("main")
    g = zarr.open_group(session.store, mode="w")
    g.create_array("x", data=x, chunks=(100, 4, 3))
    g.create_array("y", data=y, chunks=(100,))
    session.commit("x and y")
    return zarr.open_group(repo.readonly_session(branch="main").store, mode="r")


def obstore_group(tmp_path, x, y) -> zarr.Group:
    """``x`` and ``y`` in a local directory, opened through zarr's obstore store."""
    obstore = pytest.importorskip("obstore")
    g = zarr.open_group(tmp_path / "o.zarr", mode="w")
    g.create_array("x", data=x, chunks=(100, 4, 3))
    g.create_array("y", data=y, chunks=(100,))
    store = zarr.storage.ObjectStore(obstore.store.LocalStore(str(tmp_path / "o.zarr")), read_only=True)
    return zarr.open_group(store, mode="r")


def logged_obstore_group(tmp_path, x, y) -> zarr.Group:
    """:func:`obstore_group` read through zarr's ``LoggingStore`` (a ``WrapperStore``)."""
    g = obstore_group(tmp_path, x, y)
    return zarr.open_group(zarr.storage.LoggingStore(g.store), mode="r")


@pytest.mark.parametrize("make", [icechunk_group, obstore_group, logged_obstore_group],
                         ids=["icechunk", "obstore", "logged-obstore"])
@pytest.mark.parametrize("as_group", [False, True], ids=["arrays", "group"])
def test_stores_on_a_tokio_runtime_are_refused_in_forked_workers(make, as_group, tmp_path, reference):
    """icechunk's and obstore's runtime threads do not survive a fork: a forked worker's
    first read would wait for them forever. It is refused, naming the store and the two
    ways that work; without workers the same stream serves every sample."""
    g = make(tmp_path, *reference)
    s = (pipeline.stream(g, split="", batch_size=64, seed=0) if as_group
         else pipeline.stream((g["x"], g["y"]), batch_size=64, seed=0))
    kind = type(g.store).__name__
    with pytest.raises(StreamError, match=rf"lives in {kind} .*tokio.*num_workers=0.*'spawn'"):
        served(s)
    assert_once_each(*served(s, workers=0), g["x"], g["y"])


@pytest.mark.parametrize("make", [icechunk_group, obstore_group], ids=["icechunk", "obstore"])
def test_stores_on_a_tokio_runtime_travel_pickled_to_spawned_workers(make, tmp_path, reference):
    """What a spawned worker receives: the read-only store pickled, read by the copy."""
    g = make(tmp_path, *reference)
    s = pipeline.stream((g["x"], g["y"]), batch_size=64, seed=0)
    copy = pickle.loads(pickle.dumps(s.source))
    assert copy.arrays["a0"].store_path.store is not g.store
    np.testing.assert_array_equal(copy.read("a0", 2), g["x"][200:300])
    np.testing.assert_array_equal(copy.read("a1", 5), g["y"][500:600])


@pytest.mark.slow
def test_an_icechunk_store_streams_through_spawned_workers(tmp_path, reference):
    g = icechunk_group(tmp_path, *reference)
    s = pipeline.stream((g["x"], g["y"]), batch_size=64, seed=0)
    assert_once_each(*served(s, context="spawn"), g["x"], g["y"])


def test_stores_in_memory_cannot_go_to_spawned_workers(tmp_path, request, reference):
    """A spawned worker has none of its parent's memory: fsspec's memory file system is
    refused when the stream is pickled (before any worker starts), as a MemoryStore is."""
    for kind in ("fsspec-memory", "memory"):
        zx, zy = written(kind, tmp_path, request, *reference, 3)
        s = pipeline.stream((zx, zy), batch_size=64)
        with pytest.raises(StreamError, match=r"(?i)array 'a0' lives in .*memory.*(num_workers=0|without workers)"):
            pickle.dumps(s.source)


# -- an open group with splits (read like a pipeline store) ----------------------------


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("kind", KINDS)
def test_forked_workers_stream_the_split_of_an_open_group(kind, zarr_format, tmp_path, request, reference):
    """``pipeline.stream(group, split="train")``: each forked worker opens the group's
    store again (a zip handle, an s3fs session are the parent's), or reads the copy the
    fork made of a store in memory."""
    x, y = reference
    store = store_of(kind, tmp_path, request)
    train = zarr.open_group(store, mode="w", zarr_format=zarr_format).create_group("train")
    train.create_array("x", shape=x.shape, dtype=x.dtype, chunks=(60, 4, 3))[:] = x
    train.create_array("y", shape=y.shape, dtype=y.dtype, chunks=(60,))[:] = y
    if kind == "zip":
        store.close()
        store = zarr.storage.ZipStore(tmp_path / "s.zip", mode="r")
    g = zarr.open_group(store, mode="r")
    s = pipeline.stream(g, split="train", batch_size=40, seed=0)
    assert_once_each(*served(s), g["train/x"], g["train/y"])


def test_an_open_group_goes_to_spawned_workers_as_its_stores_location(tmp_path, reference):
    """What a spawned worker receives for a stream over an open group: the store's
    location, opened again (not refused, not the parent's handle)."""
    x, y = reference
    with zarr.storage.ZipStore(tmp_path / "s.zip", mode="w") as zs:
        train = zarr.open_group(zs, mode="w").create_group("train")
        train.create_array("x", data=x, chunks=(60, 4, 3))
        train.create_array("y", data=y, chunks=(60,))
    g = zarr.open_group(zarr.storage.ZipStore(tmp_path / "s.zip", mode="r"), mode="r")
    s = pipeline.stream(g, split="train", batch_size=40, seed=0)
    copy = pickle.loads(pickle.dumps(s.source))
    assert copy.readers["x"].array.store_path.store is not g.store
    np.testing.assert_array_equal(copy.read("x", 2), x[120:180])
    np.testing.assert_array_equal(copy.read("y", 9), y[540:600])


def test_an_icechunk_group_with_splits_is_refused_in_forked_workers(tmp_path, reference):
    x, y = reference
    icechunk = pytest.importorskip("icechunk")
    repo = icechunk.Repository.create(icechunk.local_filesystem_storage(str(tmp_path / "repo")))
    session = repo.writable_session("main")
    train = zarr.open_group(session.store, mode="w").create_group("train")
    train.create_array("x", data=x, chunks=(100, 4, 3))
    train.create_array("y", data=y, chunks=(100,))
    session.commit("train split")
    g = zarr.open_group(repo.readonly_session(branch="main").store, mode="r")
    s = pipeline.stream(g, split="train", batch_size=64, seed=0)
    with pytest.raises(StreamError, match=r"<group> lives in IcechunkStore .*tokio.*num_workers=0.*'spawn'"):
        served(s)
    assert_once_each(*served(s, workers=0), g["train/x"], g["train/y"])


# -- a store another tool grows, shrinks or replaces under the stream -------------------

def xarray_store(path, ids: np.ndarray, zarr_format: int, mode: str = "w", chunk: int | None = 100) -> None:
    """An xarray Dataset of ``x[i] = i`` (4 columns) and ``y = ids`` at ``path``; with
    ``mode="a"`` appended along ``time``, as another tool grows a store."""
    import xarray as xr

    ds = xr.Dataset({"x": (("time", "f"), np.repeat(ids[:, None].astype("float32"), 4, axis=1)),
                     "y": (("time",), ids.astype(np.int64))})
    if chunk is not None:
        ds = ds.chunk({"time": chunk})
    if mode == "a":
        ds.to_zarr(path, append_dim="time", zarr_format=zarr_format, consolidated=False)
    else:
        ds.to_zarr(path, mode="w", zarr_format=zarr_format, consolidated=False)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_workers_serve_the_samples_the_stream_opened_with_after_the_store_grew(tmp_path, zarr_format):
    """xarray appends 400 samples after the stream opened 1050: every rank's workers
    serve exactly the first 1050, each once, as the stream planned (num_workers=0 did;
    workers opening the store again served all 1450)."""
    p = str(tmp_path / "grow.zarr")
    n = 1050  # the last chunk partial: the append rewrites it with more samples
    xarray_store(p, np.arange(n), zarr_format)
    streams = [pipeline.stream(p, dim="time", batch_size=64, seed=0, buffer_chunks=2, rank=r, world_size=2)
               for r in range(2)]
    xarray_store(p, np.arange(n, n + 400), zarr_format, mode="a", chunk=None)
    assert zarr.open_group(p, mode="r")["y"].shape[0] == n + 400
    ys = []
    for s in streams:
        s.set_epoch(1)
        xs_r, ys_r = served(s)
        assert len(ys_r) == s.n_samples // 2 and len(s) == -(-len(ys_r) // 64)
        np.testing.assert_array_equal(xs_r, np.repeat(ys_r[:, None].astype("float32"), 4, axis=1))
        ys.append(ys_r)
    np.testing.assert_array_equal(np.sort(np.concatenate(ys)), np.arange(n))


def test_spawned_workers_pin_the_samples_too(tmp_path):
    """A spawned worker's copy (pickled) opens the grown store at the opened length."""
    p = str(tmp_path / "grow.zarr")
    xarray_store(p, np.arange(250), 3)
    s = pipeline.stream(p, dim="time", batch_size=64, seed=0)
    xarray_store(p, np.arange(250, 330), 3, mode="a", chunk=None)
    copy = pickle.loads(pickle.dumps(s.source))
    assert copy.n == 250 and copy.lengths == s.source.lengths == (100, 100, 50)
    np.testing.assert_array_equal(copy.read("y", 2), np.arange(200, 250))


def test_a_store_that_shrank_or_was_replaced_is_refused_naming_it(tmp_path):
    """Below the opened samples, another layout, or another directory at the path: a
    worker opening the store again refuses, naming the store."""
    import shutil

    p = str(tmp_path / "s.zarr")
    xarray_store(p, np.arange(250), 3)
    s = pipeline.stream(p, dim="time", batch_size=64, seed=0)
    zarr.open_array(p, path="y", mode="r+").resize((200,))
    with pytest.raises(StreamError, match=rf"{p}: array 'y' holds 200 samples, fewer than the 250"):
        pickle.loads(pickle.dumps(s.source))
    g = zarr.open_group(p, mode="r+")  # x written again in place, chunked otherwise
    g.create_array("x", data=np.zeros((250, 4), "f4"), chunks=(50, 4), dimension_names=("time", "f"), overwrite=True)
    g["y"].resize((250,))
    with pytest.raises(StreamError, match=rf"{p}: array 'x' is not laid out as when this stream opened it"):
        pickle.loads(pickle.dumps(s.source))
    t = pipeline.stream(p, dim="time", batch_size=64, seed=0)
    shutil.rmtree(p)
    xarray_store(p, np.arange(250), 3)  # the same layout in a new directory
    with pytest.raises(StreamError, match=rf"{p}: the store was replaced"):
        pickle.loads(pickle.dumps(t.source))


def test_a_foreign_split_that_grew_is_served_as_opened_by_workers(tmp_path):
    """A plain zarr store laid out in splits (read like a pipeline store) grows: workers
    serve the samples the stream opened with."""
    p = str(tmp_path / "splits.zarr")
    g = zarr.open_group(p, mode="w")
    tr = g.create_group("train")
    tr.create_array("x", data=np.repeat(np.arange(230, dtype="f4")[:, None], 3, axis=1), chunks=(50, 3))
    tr.create_array("y", data=np.arange(230), chunks=(50,))
    s = pipeline.stream(p, batch_size=32, seed=0)
    for name, extra in (("x", np.repeat(np.arange(230, 300, dtype="f4")[:, None], 3, axis=1)),
                        ("y", np.arange(230, 300))):
        a = zarr.open_array(p, path=f"train/{name}", mode="r+")
        a.append(extra)
    xs, ys = served(s)
    np.testing.assert_array_equal(np.sort(ys), np.arange(230))
    np.testing.assert_array_equal(xs[:, 0], ys.astype("f4"))
