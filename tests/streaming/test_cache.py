"""The node-local cache of a remote store's chunks: exactly once through it, shared safely
by processes under a small budget, least recently used evicted, nothing foreign deleted,
hit rates per epoch. Remote stores live on a real S3-protocol server (moto) on loopback."""

from __future__ import annotations

import multiprocessing
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline
from pipeline.errors import CorruptChunkError, StreamError
from pipeline.storage import write
from pipeline.streaming.cache import CacheStats, RemoteCache, cache_spec, merge_counts
from pipeline.streaming.diskcache import SUBDIR, CachedFile, DiskCache, eviction_target, lru_victims
from tests.streaming.conftest import make_store

N, CHUNK, WIDTH = 1000, 64, 16


def reference_x() -> np.ndarray:
    """The stored x, regenerated: random, so that chunks are of some size and a torn or
    misplaced byte shows."""
    return np.random.default_rng(7).standard_normal((N, WIDTH)).astype(np.float32)


@pytest.fixture(scope="module")
def remote(s3):
    url = "s3://training/cache/set.zarr"
    write(url, {"x": reference_x(), "y": np.arange(N, dtype=np.int64)}, chunk_samples=CHUNK, progress=False,
          storage_options=s3, overwrite=True)
    return url, s3


def store_objects(url: str, s3: dict) -> dict[str, bytes]:
    """Every chunk object of the store's x and y, by key, fetched directly (the reference)."""
    import s3fs

    fs = s3fs.S3FileSystem(key=s3["key"], secret=s3["secret"], client_kwargs={"endpoint_url": s3["endpoint_url"]})
    root = url.removeprefix("s3://")
    keys = [k for k in fs.find(root) if "/train/x/c/" in k or "/train/y/c/" in k]
    return {k: fs.cat_file(k) for k in keys}


def cache_files(cache_dir) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (Path(cache_dir) / SUBDIR).glob("*.chunk")}


def served(s, x_ref: np.ndarray) -> np.ndarray:
    """The ids of one epoch, each batch checked against the reference bytes."""
    ids = []
    for xb, yb in s:
        np.testing.assert_array_equal(xb, x_ref[yb])
        ids.append(yb.copy())
    return np.concatenate(ids)


# -- through the cache ------------------------------------------------------------------


def test_every_sample_once_per_epoch_and_hits_from_the_second(remote, tmp_path):
    url, s3 = remote
    x_ref = reference_x()
    s = pipeline.stream(url, batch_size=50, seed=3, buffer_chunks=3, storage_options=s3, cache_dir=tmp_path,
                        cache_bytes=1 << 30)
    objects = 2 * -(-N // CHUNK)  # x and y chunks
    for epoch in range(3):
        s.set_epoch(epoch)
        assert sorted(served(s, x_ref).tolist()) == list(range(N))
        stats = s.cache_stats()
        assert stats.epoch == epoch and stats.reads == objects
        if epoch == 0:
            assert stats.hits == 0 and stats.requests == objects
            assert stats.bytes_fetched == sum(len(v) for v in store_objects(url, s3).values())
        else:
            assert (stats.hits, stats.requests, stats.bytes_fetched, stats.hit_rate) == (objects, 0, 0, 1.0)
    assert "cache hit rate 100.0%" in str(s.cache_stats(2))
    # Every cache file is one of the store's objects, byte for byte.
    assert set(cache_files(tmp_path).values()) == set(store_objects(url, s3).values())


def test_ranks_sharing_a_cache_serve_each_sample_once(remote, tmp_path):
    url, s3 = remote
    x_ref = reference_x()
    streams = [pipeline.stream(url, batch_size=32, seed=1, rank=r, world_size=2, storage_options=s3,
                               cache_dir=tmp_path, cache_bytes=1 << 30) for r in range(2)]
    ids = np.concatenate([served(s, x_ref) for s in streams])
    assert sorted(ids.tolist()) == list(range(N))
    # The second rank found the chunk its share shares with the first in the cache.
    assert sum(s.cache_stats().requests for s in streams) < 2 * 2 * -(-N // CHUNK)


def test_dataloader_workers_forked_after_the_parent_streamed(remote, tmp_path):
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    url, s3 = remote
    x_ref = reference_x()
    s = pipeline.stream(url, batch_size=40, seed=2, storage_options=s3, cache_dir=tmp_path, cache_bytes=1 << 30)
    assert sorted(served(s, x_ref).tolist()) == list(range(N))  # the parent's fetch thread and loop are live
    ids = []
    for xb, yb in DataLoader(s.torch(), batch_size=None, num_workers=2, timeout=120):
        np.testing.assert_array_equal(xb.numpy(), x_ref[yb.numpy()])
        ids.append(yb.numpy())
    assert sorted(np.concatenate(ids).tolist()) == list(range(N))
    assert isinstance(xb, torch.Tensor)
    assert set(cache_files(tmp_path).values()) == set(store_objects(url, s3).values())


def test_stats_count_the_reads_of_dataloader_workers(remote, tmp_path):
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    url, s3 = remote
    objects = 2 * -(-N // CHUNK)
    total_bytes = sum(len(v) for v in store_objects(url, s3).values())
    s = pipeline.stream(url, batch_size=40, seed=4, storage_options=s3, cache_dir=tmp_path, cache_bytes=1 << 30)
    for epoch in range(2):
        s.set_epoch(epoch)
        ids = [yb.numpy() for xb, yb in DataLoader(s.torch(), batch_size=None, num_workers=2, timeout=120)]
        assert sorted(np.concatenate(ids).tolist()) == list(range(N))
        stats = s.cache_stats()
        # Only the workers read; the parent's report is theirs. A chunk both workers'
        # shares hold is read by each, and counted once.
        assert stats.reads == objects, stats
        if epoch == 0:
            assert stats.hits + stats.requests >= stats.reads and stats.bytes_fetched >= total_bytes, stats
        else:
            assert (stats.hit_rate, stats.requests, stats.bytes_fetched) == (1.0, 0, 0), stats


def test_a_store_another_tool_wrote_streams_through_the_cache(s3, tmp_path):
    import zarr

    url = "s3://training/cache/foreign.zarr"
    store = zarr.storage.FsspecStore.from_url(url, storage_options=s3)
    root = zarr.open_group(store, mode="w", zarr_format=3)
    x_ref = reference_x()
    root.create_array("x", data=x_ref, chunks=(CHUNK, WIDTH), dimension_names=("sample", "f"))
    root.create_array("y", data=np.arange(N), chunks=(CHUNK,), dimension_names=("sample",))
    objects = 2 * -(-N // CHUNK)
    s = pipeline.stream(url, arrays=("x", "y"), dim="sample", batch_size=50, seed=1, storage_options=s3,
                        cache_dir=tmp_path, cache_bytes=1 << 30)
    for epoch in range(2):
        s.set_epoch(epoch)
        assert sorted(served(s, x_ref).tolist()) == list(range(N))
        stats = s.cache_stats()
        assert (stats.reads, stats.hits, stats.requests) == ((objects, 0, objects) if epoch == 0 else (objects,) * 2 + (0,))
    # Arrays passed directly take the same cache; arrays of two remote stores cannot share one.
    arrays = (root["x"], root["y"])
    t = pipeline.stream(arrays, batch_size=50, cache_dir=tmp_path, cache_bytes=1 << 30)
    assert sum(len(xb) for xb, _ in t) == N and t.cache_stats().hit_rate == 1.0
    other = zarr.open_group(zarr.storage.FsspecStore.from_url("s3://training/cache/other.zarr", storage_options=s3),
                            mode="w", zarr_format=3)
    other.create_array("y", data=np.arange(N), chunks=(CHUNK,))
    with pytest.raises(StreamError, match="one remote store"):
        pipeline.stream((root["x"], other["y"]), batch_size=50, cache_dir=tmp_path, cache_bytes=1 << 30)


@pytest.mark.parametrize("separator", [".", "/"])
def test_a_zarr_2_store_streams_through_the_cache(s3, tmp_path, separator):
    """Zarr 2 chunk keys (``x/5.0``, or ``x/5/0``) are cached as zarr 3's are: every
    object fetched once in the first epoch, read from the cache after, byte for byte
    the store's objects."""
    import zarr

    url = f"s3://training/cache/v2-{'dot' if separator == '.' else 'slash'}.zarr"
    store = zarr.storage.FsspecStore.from_url(url, storage_options=s3)
    root = zarr.open_group(store, mode="w", zarr_format=2)
    x_ref = reference_x()
    keys = {"name": "v2", "separator": separator}
    root.create_array("x", data=x_ref, chunks=(CHUNK, WIDTH), chunk_key_encoding=keys)
    root.create_array("y", data=np.arange(N), chunks=(CHUNK,), chunk_key_encoding=keys)
    objects = 2 * -(-N // CHUNK)
    s = pipeline.stream(url, arrays=("x", "y"), batch_size=50, seed=1, storage_options=s3,
                        cache_dir=tmp_path, cache_bytes=1 << 30)
    for epoch in range(2):
        s.set_epoch(epoch)
        assert sorted(served(s, x_ref).tolist()) == list(range(N))
        stats = s.cache_stats()
        assert (stats.reads, stats.hits, stats.requests) == ((objects, 0, objects) if epoch == 0 else (objects,) * 2 + (0,))
    import s3fs

    fs = s3fs.S3FileSystem(key=s3["key"], secret=s3["secret"], client_kwargs={"endpoint_url": s3["endpoint_url"]})
    stored = sorted(fs.cat_file(k) for k in fs.find(url.removeprefix("s3://"))
                    if not k.rsplit("/", 1)[-1].startswith(".z"))
    assert len(stored) == objects and sorted(cache_files(tmp_path).values()) == stored


def test_the_last_object_is_cached_for_the_length_it_was_read_at(remote, tmp_path):
    url, s3 = remote
    s = pipeline.stream(url, batch_size=50, storage_options=s3, cache_dir=tmp_path, cache_bytes=1 << 30)
    reader = s.source.readers["y"]
    last = reader.n_chunks - 1
    assert reader.object_key(0) == ("train/y/c/0", "")
    # An append rewrites the object the length ends in with more samples: a reader of
    # a later version must not get these bytes.
    assert reader.object_key(last) == (f"train/y/c/{last}", f"@{N}")


def test_an_append_rewrites_the_last_chunk_and_readers_of_the_new_version_see_it(s3, tmp_path):
    from pipeline.storage.append import append
    from pipeline.storage.store import open_store_group, store_root_attrs

    url = "s3://training/cache/appended.zarr"
    x = np.random.default_rng(1).standard_normal((N + 30, WIDTH)).astype(np.float32)
    write(url, {"x": x[:N], "y": np.arange(N)}, chunk_samples=CHUNK, progress=False, storage_options=s3,
          overwrite=True)
    kw = dict(batch_size=50, storage_options=s3, cache_dir=tmp_path, cache_bytes=1 << 30)
    assert sorted(served(pipeline.stream(url, **kw), x).tolist()) == list(range(N))  # 1000 % 64: the last is partial
    attrs = store_root_attrs(open_store_group(url, storage_options=s3))
    append(url, {"train": {"x": x[N:], "y": np.arange(N, N + 30)}}, attrs=attrs, token="t1", storage_options=s3,
           progress=False)
    s = pipeline.stream(url, **kw)
    assert sorted(served(s, x).tolist()) == list(range(N + 30))  # the appended samples, not the cached chunk's
    # Full chunks came from the cache; the rewritten chunk and the new one were fetched, for x and y.
    assert (s.cache_stats().reads, s.cache_stats().requests) == (2 * 17, 2 * 2)


def test_sharded_stores_cache_whole_shards(s3, tmp_path):
    url = "s3://training/cache/sharded.zarr"
    x = reference_x()
    write(url, {"x": x, "y": np.arange(N)}, chunk_samples=CHUNK, shard_chunks=4, progress=False,
          storage_options=s3, overwrite=True)
    s = pipeline.stream(url, batch_size=50, seed=4, storage_options=s3, cache_dir=tmp_path, cache_bytes=1 << 30)
    shards = 2 * -(-N // (4 * CHUNK))
    for epoch in range(2):
        s.set_epoch(epoch)
        assert sorted(served(s, x).tolist()) == list(range(N))
        assert (s.cache_stats().reads, s.cache_stats().requests) == (shards, shards if epoch == 0 else 0)


def test_local_stores_ignore_the_cache_and_settings_are_checked(tmp_path):
    store = make_store(tmp_path / "s.zarr")
    s = pipeline.stream(store, batch_size=100, cache_dir=tmp_path / "cache", cache_bytes=1 << 20)
    assert sum(len(yb) for _, yb in s) == 1000
    assert s.cache_stats() is None and not (tmp_path / "cache").exists()
    with pytest.raises(StreamError, match="cache_dir needs cache_bytes"):
        pipeline.stream(store, batch_size=100, cache_dir=tmp_path / "cache")
    with pytest.raises(StreamError, match="needs cache_dir"):
        cache_spec(None, 10)
    with pytest.raises(StreamError, match="positive integer"):
        cache_spec(tmp_path, -1)


def test_stats_line():
    s = CacheStats(epoch=2, reads=40, hits=30, bytes_fetched=12_500_000, requests=10)
    assert (s.misses, s.hit_rate) == (10, 0.75)
    assert str(s) == "epoch 2: cache hit rate 75.0% (30 of 40 chunk objects), 12.5 MB fetched in 10 requests"
    assert CacheStats(0, 0, 0, 0, 0).hit_rate == 0.0


# -- processes sharing one directory and a small budget ---------------------------------


def _stream_in_process(url: str, s3: dict, cache_dir: str, budget: int, seed: int, start: object,
                       results: object) -> None:
    """A separate process: epochs through the shared cache, every batch checked."""
    try:
        results.put((seed, _epochs_through_cache(url, s3, cache_dir, budget, seed, start)))
    except BaseException as exc:
        results.put((seed, f"{type(exc).__name__}: {exc}"))
        raise


def _epochs_through_cache(url: str, s3: dict, cache_dir: str, budget: int, seed: int, start: object) -> list[str]:
    x_ref = reference_x()
    s = pipeline.stream(url, batch_size=40, seed=seed, buffer_chunks=2, storage_options=s3, cache_dir=cache_dir,
                        cache_bytes=budget)
    start.wait()  # all processes opened their stream: their epochs run at the same time
    out = []
    for epoch in range(2):
        s.set_epoch(epoch)
        ids = served(s, x_ref)
        if sorted(ids.tolist()) != list(range(N)):
            raise AssertionError(f"seed {seed} epoch {epoch}: samples not served exactly once")
        out.append(str(s.cache_stats()))
    return out


def test_processes_share_a_small_cache_without_torn_reads(remote, tmp_path):
    url, s3 = remote
    objects = store_objects(url, s3)
    budget = sum(len(v) for v in objects.values()) // 3  # a third of the store: evictions all along
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_stream_in_process, args=(url, s3, str(tmp_path), budget, seed, start, results))
             for seed in range(3)]
    for p in procs:
        p.start()
    lines = dict(results.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert all(isinstance(v, list) and len(v) == 2 for v in lines.values()), lines
    assert [p.exitcode for p in procs] == [0, 0, 0]
    files = cache_files(tmp_path)
    # Nothing torn: every file is one of the store's objects, whole.
    assert set(files.values()) <= set(objects.values())
    # The budget holds, the running count agrees with the files, no temporary file is left.
    total = sum(len(v) for v in files.values())
    assert 0 < total <= budget
    assert DiskCache(str(tmp_path), budget).usage() == total
    assert not [n for n in os.listdir(tmp_path / SUBDIR) if n.endswith(".tmp")]


# -- eviction ---------------------------------------------------------------------------


files_strategy = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 50)), max_size=30).map(
    lambda rows: [CachedFile(f"f{i}", size, used) for i, (size, used) in enumerate(rows)])


@settings(max_examples=300, deadline=None)
@given(files=files_strategy, target=st.integers(0, 20_000), keep_mask=st.integers(0, 2**30))
def test_lru_victims_are_the_oldest_and_just_enough(files, target, keep_mask):
    keep = {f.name for i, f in enumerate(files) if keep_mask >> i & 1}
    victims = lru_victims(files, target, keep)
    names = [v.name for v in victims]
    assert len(set(names)) == len(names) and not set(names) & keep
    left = [f for f in files if f.name not in names]
    total = sum(f.size for f in left)
    evictable = [f for f in left if f.name not in keep]
    # Enough: under the target, or nothing more that may go.
    assert total <= target or not evictable
    # Just enough: without the last victim, the rest was above the target.
    if victims:
        assert total + victims[-1].size > target
    # Least recently used first, ties by name; every file kept back is newer than every victim.
    order = lambda f: (f.used_ns, f.name)  # noqa: E731
    assert [order(v) for v in victims] == sorted(order(v) for v in victims)
    if victims:
        assert all(order(f) > order(victims[-1]) for f in evictable)


def test_eviction_target_is_below_the_budget():
    for budget in (1, 15, 16, 1000, 1 << 40):
        assert budget - budget // 16 == eviction_target(budget) <= budget


def test_the_least_recently_used_files_go(tmp_path):
    disk = DiskCache(str(tmp_path), budget=1000)
    names = [f"{i:016x}-{'0' * 31}{i:x}.chunk" for i in range(8)]
    for k, name in enumerate(names):
        assert disk.put(name, bytes([k]) * 100)
        os.utime(disk.path(name), ns=(k * 10**9, k * 10**9))  # written in order, a second apart
    os.utime(disk.path(names[0]), ns=(99 * 10**9, 99 * 10**9))  # the first is read again: now the newest
    extra = [f"{i:016x}-{'1' * 31}{i:x}.chunk" for i in range(3)]
    for name in extra:  # 1100 bytes: over budget, down to 1000 - 62 = 938 bytes
        assert disk.put(name, b"z" * 100)
    # The third extra file brought 1100 bytes: the two least recently used went.
    assert {f.name for f in disk.files()} == {names[0], *names[3:], *extra}
    assert disk.usage() == sum(f.size for f in disk.files()) <= eviction_target(1000)
    assert not disk.put("f" * 16 + "-" + "2" * 32 + ".chunk", b"x" * 1001)  # larger than the budget: not kept


# -- other people's files ---------------------------------------------------------------


def test_files_it_did_not_write_are_never_deleted(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("keep me")
    disk = DiskCache(str(tmp_path), budget=300)
    later = tmp_path / SUBDIR / "dropped-here.bin"  # put into the cache's folder after it was opened
    later.write_bytes(b"x" * 1000)
    lookalike = tmp_path / SUBDIR / ("a" * 16 + "-" + "b" * 32 + ".chunk")  # named like a chunk, a folder
    lookalike.mkdir()
    for i in range(20):
        disk.put(f"{i:016x}-{i:032x}.chunk", b"y" * 100)
    assert disk.evictions > 0
    assert mine.read_text() == "keep me" and later.read_bytes() == b"x" * 1000 and lookalike.is_dir()


def test_a_folder_holding_other_files_is_refused(tmp_path):
    sub = tmp_path / SUBDIR
    sub.mkdir()
    (sub / "data.npy").write_bytes(b"x")
    with pytest.raises(StreamError, match=r"did not write \(data\.npy\)"):
        DiskCache(str(tmp_path), budget=100)
    (sub / "data.npy").unlink()
    (sub / ("0" * 16 + "-" + "0" * 32 + ".chunk")).write_bytes(b"x")  # a chunk name, but no marker
    with pytest.raises(StreamError, match="expected a folder written only by"):
        DiskCache(str(tmp_path), budget=100)


def test_temporary_files_of_dead_writers_are_cleaned(tmp_path):
    DiskCache(str(tmp_path), budget=100)
    sub = tmp_path / SUBDIR
    name = "0" * 16 + "-" + "0" * 32 + ".chunk"
    old, fresh = sub / f".{name}.123.0badf00d.tmp", sub / f".{name}.124.0badf00e.tmp"
    old.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    DiskCache(str(tmp_path), budget=100)
    assert not old.exists() and fresh.exists()


def test_file_names_differ_by_store_object_and_length(tmp_path):
    disk = DiskCache(str(tmp_path), budget=100)
    a, b = (RemoteCache(disk, None, ns, "set.zarr") for ns in ("store a", "store b"))
    names = {a.name("train/y/c/0"), a.name("train/y/c/0", "@10"), a.name("train/x/c/0"), b.name("train/y/c/0")}
    assert len(names) == 4
    assert all(re.fullmatch(r"[0-9a-f]{16}-[0-9a-f]{32}\.chunk", n) for n in names)


# -- damaged cache files ------------------------------------------------------------------


def damage(path: Path) -> None:
    """64 zero bytes in the middle of a file, in place (a disk error, a torn copy)."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 64] = bytes(min(64, len(data) - mid))
    path.write_bytes(bytes(data))


def test_a_damaged_cache_file_is_named_dropped_and_fetched_again(remote, tmp_path):
    url, s3 = remote
    x_ref = reference_x()
    # verify: the random x chunks still decode once damaged; their CRC32 tells.
    s = pipeline.stream(url, batch_size=50, seed=5, storage_options=s3, cache_dir=tmp_path, cache_bytes=1 << 30,
                        verify=True)
    assert sorted(served(s, x_ref).tolist()) == list(range(N))
    s.close()  # nothing read ahead of epoch 1 before the damage
    files = sorted((tmp_path / SUBDIR).glob("*.chunk"))
    for f in files:
        damage(f)
    s.set_epoch(1)
    with pytest.warns(RuntimeWarning, match="a damaged file in the chunk cache") as caught:
        assert sorted(served(s, x_ref).tolist()) == list(range(N))  # the store's bytes, every sample
        s.stop_read_ahead()  # epoch 2's first reads, of cache files whole again, are not counted here
    named = {str(w.message).split(":")[0] for w in caught if "chunk cache" in str(w.message)}
    assert named == {str(f) for f in files}  # each damaged file named once
    assert set(cache_files(tmp_path).values()) == set(store_objects(url, s3).values())  # cached again, whole
    assert s.cache_stats(1).requests == len(files)


def test_a_chunk_damaged_in_the_store_too_is_the_stores(s3, tmp_path):
    import s3fs

    url = "s3://training/cache/damaged.zarr"
    y = np.arange(N, dtype=np.int64)
    write(url, {"x": reference_x(), "y": y}, chunk_samples=CHUNK, progress=False, storage_options=s3, overwrite=True)
    fs = s3fs.S3FileSystem(key=s3["key"], secret=s3["secret"], client_kwargs={"endpoint_url": s3["endpoint_url"]})
    key = url.removeprefix("s3://") + "/train/y/c/3"
    fs.pipe_file(key, b"\x02\x01garbage" * 30)  # not a blosc frame: fails to decode wherever it comes from
    s = pipeline.stream(url, batch_size=50, seed=5, storage_options=s3, cache_dir=tmp_path, cache_bytes=1 << 30)
    with pytest.raises(CorruptChunkError) as err:
        for _ in s:
            pass
    message = str(err.value)
    assert message.startswith(f"{url}: train/y chunk 3: cannot decode") and "fetched again from the store" in message
    assert "the store's object is damaged" in message


def _truncate_between_epochs(url, s3, cache_dir, results) -> None:
    """Epoch 0, then every cache file cut to half in place, then epoch 1: in a child, so
    that a SIGBUS (a mapped file truncated under the process) fails the test, not pytest."""
    import warnings

    s = pipeline.stream(url, batch_size=50, seed=6, storage_options=s3, cache_dir=cache_dir, cache_bytes=1 << 30)
    x_ref = reference_x()
    first = sorted(served(s, x_ref).tolist())
    s.stop_read_ahead()
    for f in (Path(cache_dir) / SUBDIR).glob("*.chunk"):
        os.truncate(f, f.stat().st_size // 2)
    s.set_epoch(1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = sorted(served(s, x_ref).tolist())
    named = sum("a damaged file in the chunk cache" in str(w.message) for w in caught)
    results.put((first == list(range(N)), second == list(range(N)), named, s.cache_stats(1).requests))


def test_a_cache_file_truncated_under_a_stream_is_fetched_again_not_a_crash(remote, tmp_path):
    url, s3 = remote
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    p = ctx.Process(target=_truncate_between_epochs, args=(url, s3, str(tmp_path), results))
    p.start()
    p.join(timeout=120)
    assert p.exitcode == 0, f"exit code {p.exitcode} (-7: SIGBUS)"
    first, second, named, refetched = results.get(timeout=5)
    objects = 2 * -(-N // CHUNK)
    assert first and second and named == objects and refetched == objects
    assert set(cache_files(tmp_path).values()) == set(store_objects(url, s3).values())  # whole again


def test_objects_larger_than_the_budget_are_counted_every_epoch(remote, tmp_path):
    url, s3 = remote
    objects = store_objects(url, s3)
    budget = min(len(v) for v in objects.values()) - 1  # no object fits
    s = pipeline.stream(url, batch_size=50, seed=3, storage_options=s3, cache_dir=tmp_path, cache_bytes=budget)
    for epoch in range(3):
        s.set_epoch(epoch)
        assert sorted(served(s, reference_x()).tolist()) == list(range(N))
        s.stop_read_ahead()  # the next epoch's first reads are the next epoch's
        stats = s.cache_stats()
        # Nothing fits: every object is fetched, every epoch, and counted as that epoch's
        # (an early read of the next epoch that stop_read_ahead gives up is fetched again).
        assert (stats.reads, stats.hits) == (len(objects), 0) and stats.requests >= len(objects), stats
        assert stats.bytes_fetched >= sum(len(v) for v in objects.values()), stats
    assert not cache_files(tmp_path)


def test_merged_counts_name_each_object_once():
    rng = np.random.default_rng(0)
    names = [f"o{i}" for i in range(40)]
    rows, outcome = [], {}
    for _ in range(3):
        mine = {n: bool(rng.integers(2)) for n in rng.choice(names, 20, replace=False)}
        for n, hit in mine.items():
            outcome[n] = outcome.get(n, True) and hit
        found = sorted(n for n, h in mine.items() if h)
        rows.append([len(mine), len(found), 7, 2, found, sorted(set(mine) - set(found))])
    assert merge_counts(rows) == (len(outcome), sum(outcome.values()), 21, 6)
    # An old epoch's rows, without their objects, add up.
    assert merge_counts([r[:4] for r in rows]) == (sum(r[0] for r in rows), sum(r[1] for r in rows), 21, 6)
