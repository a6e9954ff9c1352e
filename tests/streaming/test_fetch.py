"""How the chunk cache fetches remote objects: obstore only where s3fs's options translate
exactly, the same bytes as s3fs from a real S3-protocol server (moto) on loopback, and
fsspec in a process forked after obstore was imported."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import re
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import pipeline
from pipeline.storage import write
from pipeline.streaming.fetch import FsspecFetcher, ObstoreFetcher, fetcher_for, obstore_config

pytest.importorskip("obstore")

S3 = ("s3", "s3a")
NO_ENV: dict[str, str] = {}


def config(options, env=NO_ENV, protocols=S3, conf=None):
    return obstore_config(protocols, options, "bucket", env=env, fsspec_conf=conf or {})


# -- what translates ----------------------------------------------------------------------


def test_explicit_keys_and_an_http_endpoint_translate():
    got = config({"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9000"})
    assert got == {"bucket": "bucket", "access_key_id": "k", "secret_access_key": "s",
                   "endpoint": "http://127.0.0.1:9000", "client_options": {"allow_http": True}, "region": "us-east-1"}
    # The same said through botocore's client arguments, with a token and a region.
    got = config({"client_kwargs": {"endpoint_url": "https://minio.lan", "region_name": "eu-west-1",
                                    "aws_access_key_id": "k", "aws_secret_access_key": "s",
                                    "aws_session_token": "t"}})
    assert got == {"bucket": "bucket", "access_key_id": "k", "secret_access_key": "s", "session_token": "t",
                   "endpoint": "https://minio.lan", "region": "eu-west-1"}


def test_anonymous_and_requester_pays_and_options_that_change_no_bytes():
    got = config({"anon": True, "client_kwargs": {"region_name": "us-west-2"}, "requester_pays": True,
                  "default_block_size": 1 << 20, "use_listings_cache": False, "skip_instance_cache": True})
    assert got == {"bucket": "bucket", "skip_signature": True, "region": "us-west-2", "request_payer": True}


def test_credentials_and_region_from_the_environment_are_left_to_obstore():
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "eu-central-1"}
    assert config({}, env) == {"bucket": "bucket"}


@pytest.mark.parametrize("options, env, why", [
    ({}, NO_ENV, "no credentials: botocore's files, SSO or instance roles"),
    ({"key": "k", "secret": "s"}, NO_ENV, "AWS itself with no region: s3fs looks the bucket's up"),
    ({"key": "k"}, NO_ENV, "half a key pair"),
    ({"token": "t", "endpoint_url": "http://h"}, {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"},
     "a token without its key pair"),
    ({"profile": "research", "client_kwargs": {"region_name": "us-east-1"}}, NO_ENV, "a named profile"),
    ({"key": "k", "secret": "s", "endpoint_url": "http://h", "config_kwargs": {"signature_version": "s3v4"}},
     NO_ENV, "botocore configuration"),
    ({"key": "k", "secret": "s", "endpoint_url": "http://h", "s3_additional_kwargs": {"SSECustomerKey": "x"}},
     NO_ENV, "extra request arguments"),
    ({"key": "k", "secret": "s", "client_kwargs": {"region_name": "r", "verify": False}}, NO_ENV,
     "an unknown client argument"),
    ({"key": "k", "secret": "s", "client_kwargs": {"region_name": "r"}}, {"AWS_PROFILE": "p"}, "a profile in env"),
    ({"key": "k", "secret": "s", "use_ssl": False, "client_kwargs": {"region_name": "r"}}, NO_ENV,
     "plain http to AWS"),
    ({"key": "k", "secret": "s", "endpoint_url": "https://minio.lan"}, {"AWS_CA_BUNDLE": "/nonexistent/ca.pem"},
     "an unreadable certificate bundle"),
    ({"key": "k", "secret": "s", "endpoint_url": "https://minio.lan"}, {"https_proxy": "http://proxy:3128"},
     "an HTTP proxy"),
])
def test_what_does_not_translate_stays_with_fsspec(options, env, why):
    assert config(options, env) is None, why


def test_the_certificate_bundle_botocore_trusts_is_added_to_obstores_roots(tmp_path):
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    (tmp_path / "ca.pem").write_text(pem)
    env = {"AWS_CA_BUNDLE": str(tmp_path / "ca.pem")}
    got = config({"key": "k", "secret": "s", "endpoint_url": "https://minio.lan"}, env)
    assert got["client_options"] == {"root_certificate": pem}
    # Plain http needs no certificates.
    got = config({"key": "k", "secret": "s", "endpoint_url": "http://minio.lan"}, env)
    assert got["client_options"] == {"allow_http": True}


def test_an_endpoint_in_the_environment_is_taken_as_botocore_takes_it():
    env = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_ENDPOINT_URL": "http://all:9000"}
    assert config({}, env)["endpoint"] == "http://all:9000"
    assert config({}, env)["client_options"] == {"allow_http": True}
    assert config({}, {**env, "AWS_ENDPOINT_URL_S3": "https://s3only"})["endpoint"] == "https://s3only"
    assert config({"endpoint_url": "http://given"}, env)["endpoint"] == "http://given"
    # Told to ignore endpoints from the environment: AWS itself, which needs a region.
    assert config({}, {**env, "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS": "true"}) is None


def test_a_minio_style_environment_streams_through_obstore(s3, monkeypatch):
    url = "s3://training/fetch/env.zarr"
    x = np.random.default_rng(9).standard_normal((200, 4)).astype(np.float32)
    write(url, {"x": x, "y": np.arange(200)}, chunk_samples=64, progress=False, storage_options=s3, overwrite=True)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3["key"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3["secret"])
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["endpoint_url"])
    for k in ("AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"):
        monkeypatch.delenv(k, raising=False)
    s = pipeline.stream(url, batch_size=50, seed=0)  # no storage options: all from the environment
    got = np.concatenate([yb.copy() for _, yb in s])
    assert sorted(got.tolist()) == list(range(200))
    assert all(isinstance(r._fetcher, ObstoreFetcher) for r in s.source.readers.values())


def test_other_protocols_and_fsspec_configuration_stay_with_fsspec():
    opts = {"key": "k", "secret": "s", "endpoint_url": "http://h"}
    assert config(opts, protocols=("gcs", "gs")) is None
    assert config(opts, conf={"endpoint_url": "http://elsewhere"}) is None


# -- the same bytes -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def objects(s3):
    import s3fs

    fs = s3fs.S3FileSystem(key=s3["key"], secret=s3["secret"], client_kwargs={"endpoint_url": s3["endpoint_url"]})
    rng = np.random.default_rng(3)
    blobs = {f"fetch/set.zarr/x/c/{i}": rng.bytes(n) for i, n in enumerate([0, 1, 4097, 3 << 20])}
    for key, data in blobs.items():
        fs.pipe_file(f"training/{key}", data)
    return fs, blobs


def zarr_fs(s3):
    """The asynchronous file system zarr opens the store with, on zarr's event loop."""
    import zarr

    return zarr.storage.FsspecStore.from_url("s3://training/fetch/set.zarr", storage_options=s3).fs


def fetch_all(fetcher, paths):
    from zarr.core.sync import _get_loop

    async def run():
        return await asyncio.gather(*(fetcher.get(p) for p in paths))

    return asyncio.run_coroutine_threadsafe(run(), _get_loop()).result(60)


def test_obstore_fetches_the_bytes_s3fs_fetches(s3, objects):
    fs, blobs = zarr_fs(s3), objects[1]
    obs = fetcher_for(fs, "training/fetch/set.zarr", s3)
    assert isinstance(obs, ObstoreFetcher)
    paths = [k.removeprefix("fetch/set.zarr/") for k in blobs] + ["x/c/missing"]
    got = fetch_all(obs, paths)
    ref = fetch_all(FsspecFetcher(fs, "training/fetch/set.zarr"), paths)
    assert [bytes(memoryview(g)) for g in got[:-1]] == list(blobs.values()) == ref[:-1]
    assert got[-1] is None and ref[-1] is None  # never written: the fill value, not an error


def _fetcher_in_child(queue, s3):
    fs = zarr_fs(s3)  # a source opens its store again after a fork
    fetcher = fetcher_for(fs, "training/fetch/set.zarr", s3)
    data = fetch_all(fetcher, ["x/c/2"])[0]
    queue.put((type(fetcher).__name__, bytes(memoryview(data))))


def test_a_process_forked_before_any_obstore_request_fetches_through_obstore(s3, objects):
    # Run first in a fresh process: this test module's own requests would start the runtime.
    code = f"""
import asyncio, multiprocessing, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
import zarr
from zarr.core.sync import _get_loop
from pipeline.streaming.fetch import fetcher_for
s3 = {s3!r}
def fetcher():
    fs = zarr.storage.FsspecStore.from_url("s3://training/fetch/set.zarr", storage_options=s3).fs
    return fetcher_for(fs, "training/fetch/set.zarr", s3)
def child(queue):
    f = fetcher()
    data = asyncio.run_coroutine_threadsafe(f.get("x/c/2"), _get_loop()).result(60)
    queue.put((type(f).__name__, len(data)))
assert type(fetcher()).__name__ == "ObstoreFetcher"  # obstore imported, a store made, no request
ctx = multiprocessing.get_context("fork")
queue = ctx.Queue()
proc = ctx.Process(target=child, args=(queue,))
proc.start()
name, n = queue.get(timeout=60)
proc.join(30)
print(name, n)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ObstoreFetcher", "4097"]


def test_a_process_forked_after_an_obstore_request_fetches_through_fsspec(s3, objects):
    fs, blobs = zarr_fs(s3), objects[1]
    assert len(fetch_all(fetcher_for(fs, "training/fetch/set.zarr", s3), ["x/c/2"])[0]) == 4097  # runtime started
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_fetcher_in_child, args=(queue, s3))
    child.start()
    name, data = queue.get(timeout=60)
    child.join(30)
    assert name == "FsspecFetcher" and data == blobs["fetch/set.zarr/x/c/2"]


def test_a_stream_through_the_cache_fetches_with_obstore(s3, tmp_path):
    url = "s3://training/fetch/stream.zarr"
    x = np.random.default_rng(5).standard_normal((300, 8)).astype(np.float32)
    write(url, {"x": x, "y": np.arange(300)}, chunk_samples=64, progress=False, storage_options=s3, overwrite=True)
    s = pipeline.stream(url, batch_size=32, seed=1, storage_options=s3, cache_dir=tmp_path, cache_bytes=1 << 30)
    ids = []
    for xb, yb in s:
        np.testing.assert_array_equal(xb, x[yb])
        ids.append(yb.copy())
    assert sorted(np.concatenate(ids).tolist()) == list(range(300))
    assert isinstance(s.source.cache.fetcher, ObstoreFetcher)
    assert s.cache_stats().requests == 2 * 5


@pytest.mark.parametrize("shard_chunks", [None, 4])
def test_a_stream_without_the_cache_reads_through_obstore_whole_objects_and_ranges(s3, shard_chunks):
    url = f"s3://training/fetch/uncached-{shard_chunks}.zarr"
    x = np.random.default_rng(6).standard_normal((500, 8)).astype(np.float32)
    write(url, {"x": x, "y": np.arange(500)}, chunk_samples=32, shard_chunks=shard_chunks, progress=False,
          storage_options=s3, overwrite=True)
    for verify in (False, True):
        s = pipeline.stream(url, batch_size=40, seed=2, storage_options=s3, verify=verify)
        ids = []
        for xb, yb in s:
            np.testing.assert_array_equal(xb, x[yb])
            ids.append(yb.copy())
        assert sorted(np.concatenate(ids).tolist()) == list(range(500))
        assert all(isinstance(r._fetcher, ObstoreFetcher) for r in s.source.readers.values())
    # The store's arrays share one client (and its connections).
    assert len({id(r._fetcher.store) for r in s.source.readers.values()}) == 1


def test_ranges_and_suffixes_are_the_bytes_s3fs_reads(s3, objects):
    blob = objects[1]["fetch/set.zarr/x/c/3"]
    obs = fetcher_for(zarr_fs(s3), "training/fetch/set.zarr", s3)
    assert bytes(obs.fetch("x/c/3", 1000, 5000)) == blob[1000:5000]
    assert bytes(obs.fetch("x/c/3", suffix=777)) == blob[-777:]
    assert obs.fetch("x/c/missing", 0, 10) is None and obs.fetch("x/c/missing", suffix=4) is None


def test_a_failed_fetch_names_the_store_and_the_object(s3, monkeypatch):
    from obstore.exceptions import GenericError

    from pipeline.errors import StoreError

    url = "s3://training/fetch/failing.zarr"
    write(url, {"x": np.ones((64, 4), np.float32), "y": np.arange(64)}, chunk_samples=32, progress=False,
          storage_options=s3, overwrite=True)
    s = pipeline.stream(url, batch_size=16, seed=0, storage_options=s3)

    def refused(*args, **kwargs):
        raise GenericError("connection refused after 10 retries")

    for reader in s.source.readers.values():
        monkeypatch.setattr(reader._fetcher, "fetch", refused)
    with pytest.raises(StoreError, match=r"failing\.zarr.*cannot fetch train/(x|y)/c/\d.*connection refused"):
        next(iter(s))


def test_a_failed_fetch_is_one_line_without_obstores_debug_dump(s3, monkeypatch):
    # obstore's message repeats itself as a Rust Debug dump after a blank line (25 lines
    # when the server died mid-epoch); the user's line keeps the first paragraph.
    from obstore.exceptions import GenericError

    from pipeline.errors import StoreError

    url = "s3://training/fetch/dumped.zarr"
    write(url, {"x": np.ones((64, 4), np.float32), "y": np.arange(64)}, chunk_samples=32, progress=False,
          storage_options=s3, overwrite=True)
    s = pipeline.stream(url, batch_size=16, seed=0, storage_options=s3)
    first = ("Generic S3 error: Error after 10 retries in 6.2s, max_retries:10, retry_timeout:180s, source:error "
             "sending request for url (http://127.0.0.1:1/training/x)")
    dump = "\n".join(["Generic {", '    store: "S3",', "    source: RetryError {"] + ["        ..."] * 20 + ["}"])

    def refused(*args, **kwargs):
        raise GenericError(f"{first}\n\nDebug source:\n{dump}")

    for reader in s.source.readers.values():
        monkeypatch.setattr(reader._fetcher, "fetch", refused)
    with pytest.raises(StoreError) as got:
        next(iter(s))
    text = str(got.value)
    assert "\n" not in text and "Debug source" not in text and "RetryError" not in text
    assert re.search(r"dumped\.zarr: cannot fetch train/(x|y)/c/\d/0 \(GenericError: Generic S3 error: Error after "
                     r"10 retries .* \(http://127\.0\.0\.1:1/training/x\)\)$", text), text


def test_a_foreign_store_whose_chunks_split_samples_streams_through_obstore(s3):
    import zarr

    url = "s3://training/fetch/foreign-blocks.zarr"
    root = zarr.open_group(zarr.storage.FsspecStore.from_url(url, storage_options=s3), mode="w", zarr_format=3)
    x = np.random.default_rng(8).standard_normal((300, 6, 5)).astype(np.float32)
    root.create_array("x", data=x, chunks=(40, 4, 3))  # blocks: every sample split over four objects
    root.create_array("y", data=np.arange(300), chunks=(64,))
    s = pipeline.stream(url, arrays=("x", "y"), batch_size=32, seed=3, storage_options=s3)
    ids = []
    for xb, yb in s:
        np.testing.assert_array_equal(xb, x[yb])
        ids.append(yb.copy())
    assert sorted(np.concatenate(ids).tolist()) == list(range(300))
    # x and y on different chunk grids: each reader sits in the grid both are read on.
    assert all(isinstance(getattr(r, "reader", r)._fetcher, ObstoreFetcher) for r in s.source.readers.values())


def test_a_client_obstore_cannot_build_falls_back_to_fsspec(s3, tmp_path, monkeypatch):
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    monkeypatch.setenv("AWS_CA_BUNDLE", str(tmp_path / "ca.pem"))
    opts = {**s3, "endpoint_url": s3["endpoint_url"].replace("http://", "https://")}
    assert isinstance(fetcher_for(zarr_fs(s3), "training/fetch/set.zarr", opts), FsspecFetcher)


def _held_back(src, dst, gate: threading.Event | None = None, held: threading.Event | None = None) -> None:
    """Bytes from ``src`` to ``dst``, once ``gate`` (if any) is open; ``held`` is set as
    soon as bytes wait for it."""
    try:
        while data := src.recv(1 << 16):
            if gate is not None:
                if held is not None:
                    held.set()
                gate.wait(120)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


@pytest.fixture()
def held_endpoint(s3):
    """The S3 server behind a proxy that holds every request until the returned gate is
    set, and an event set once a request is held."""
    upstream = int(s3["endpoint_url"].rsplit(":", 1)[1])
    server = socket.create_server(("127.0.0.1", 0))
    gate, held = threading.Event(), threading.Event()

    def accept() -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", upstream))
            threading.Thread(target=_held_back, args=(client, up, gate, held), daemon=True).start()
            threading.Thread(target=_held_back, args=(up, client), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", gate, held
    gate.set()
    server.close()


EXIT_CODE = """
import asyncio, os, sys
import zarr
from zarr.core.sync import _get_loop
from pipeline.streaming.fetch import ObstoreFetcher, fetcher_for

opts = {"endpoint_url": sys.argv[1], "key": "testing", "secret": "testing"}
fs = zarr.storage.FsspecStore.from_url("s3://training/fetch/set.zarr", storage_options=opts).fs
fetcher = fetcher_for(fs, "training/fetch/set.zarr", opts)
assert isinstance(fetcher, ObstoreFetcher)
# The cache's fetches, as its fetch thread starts them: nobody waits for these.
pending = [asyncio.run_coroutine_threadsafe(fetcher.get(f"x/c/{i % 4}"), _get_loop()) for i in range(16)]


class Teardown:  # a module whose teardown waits (a framework flushing its logs): here, for the test
    def __del__(self, write=os.write, read=os.read):
        write(1, b"finalizing\\n")
        read(0, 1)


teardown = Teardown()
print("fetching", flush=True)
os.read(0, 1)  # until the test has seen a request held: the script then ends with it in flight
"""


def test_a_process_exits_cleanly_with_fetches_in_flight(held_endpoint, objects):
    # A request completing on obstore's runtime as the interpreter finalized aborted the
    # process (SIGABRT, about once in thirty exits of the cache's processes test), or
    # panicked tokio's threads. The process must wait for its requests before it
    # finalizes: here they are held until the test lets them through.
    endpoint, gate, held = held_endpoint
    proc = subprocess.Popen([sys.executable, "-c", EXIT_CODE, endpoint], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    try:
        assert proc.stdout.readline() == b"fetching\n", proc.stderr.read()[-2000:]
        # The fetches start on zarr's loop thread: let the script end only once one of
        # them is a request in flight (on a loaded machine the script could otherwise
        # end before any was sent, and nothing would be in flight to wait for).
        assert held.wait(60), "no request reached the proxy"
        proc.stdin.write(b"g")
        # Its script is done; it must not finalize while its requests are held.
        early, _, _ = select.select([proc.stdout], [], [], 2.0)
        assert not early, f"the interpreter finalized with requests in flight: {proc.stdout.readline()!r}"
        gate.set()
        assert proc.stdout.readline() == b"finalizing\n"
        _, err = proc.communicate(timeout=120)  # closes its stdin: the teardown ends
    finally:
        gate.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = err.decode(errors="replace")
    assert proc.returncode == 0, err[-2000:]
    assert "panicked" not in err and "Fatal Python error" not in err, err[-2000:]
