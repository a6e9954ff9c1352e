"""How a remote store's objects are fetched, by the chunk cache or by a stream without
one: through obstore where it can, else through the store's own fsspec file system.

s3fs (aiobotocore) spends about twice the CPU per byte fetched that obstore (Rust's
``object_store``) does, and on a machine that also decodes what it fetches that CPU
bounds a first epoch (``benchmarks/bench_s3_cache.py``). obstore is used for ``s3://``
stores when it is installed and the store's fsspec options say everything it needs in
terms it understands (:func:`obstore_config`); anything else (a profile, botocore
configuration, extra request arguments, fsspec's own configuration) keeps the fsspec
file system, which knows them. Both fetch the same bytes.

obstore runs its requests on a tokio runtime whose threads do not survive ``fork``: a
process forked after obstore sent a request (a DataLoader worker of a stream that
already fetched) fetches through fsspec, which starts its event loop again after a
fork. Workers forked from a parent that only opened the stream use obstore.

Requests go through obstore's blocking calls on threads of this package's own (the
cache's fetches) or the caller's (reads without a cache), never through its ``async``
calls: those complete on a tokio thread that calls into Python, and one that completes
while the interpreter exits aborts the process (seen at the end of spawned processes
streaming through the cache). A blocking call leaves Python alone on tokio's side,
and the threads that make them are joined before the interpreter finalizes.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Mapping

__all__ = ["FsspecFetcher", "ObstoreFetcher", "fetch_failure", "fetcher_for", "obstore_config", "store_fetcher"]

#: fsspec options of s3fs that change nothing about how an object's bytes are fetched.
_IRRELEVANT = frozenset({
    "asynchronous", "loop", "skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths",
    "default_block_size", "default_fill_cache", "default_cache_type", "cache_regions", "max_concurrency",
    "fixed_upload_size", "version_aware",
})
#: Environment variables through which botocore would find what obstore does not read
#: the same way: a named profile, its configuration files, an HTTP proxy (obstore takes a
#: proxy only as an option). Two translate: ``AWS_ENDPOINT_URL_S3`` (or
#: ``AWS_ENDPOINT_URL``) is the endpoint when the options name none, as botocore takes
#: it, and ``AWS_CA_BUNDLE``'s certificates are added to obstore's trusted roots, which
#: keep the system's.
_BOTOCORE_ENV = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE",
                 "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")

_fork_unsafe = False  # this process was forked from one whose obstore runtime may run
_requested = False  # this process sent obstore requests through a fetcher (its runtime started)
_imported_first: bool | None = None  # whether a fetcher imported obstore before anything else did
_stores: dict[tuple, Any] = {}  # obstore clients by (process, bucket, settings)
_stores_lock = threading.Lock()
_pool: Any = None  # the threads of the cache's fetches, with the process they belong to
_pool_pid = 0
#: Threads making the cache's requests (it makes up to 16 at a time).
_POOL_THREADS = 32



def fetch_failure(exc: BaseException, limit: int = 400) -> str:
    """``exc`` for a one-line message: its type and the first paragraph of its text.

    obstore's errors end with their Rust ``Debug`` form (``Debug source: Generic {
    store: "S3", source: RetryError { ... } }``), 25 lines that repeat the first
    paragraph; that paragraph (the status, the retries, the URL) is what a user needs.
    """
    text = str(exc).split("\n\nDebug source", 1)[0].split("\n\n", 1)[0]
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _after_fork_in_child() -> None:
    global _fork_unsafe
    # The runtime starts with the first request, not with the import or a store object
    # (checked: a child forked after those fetches; one forked after a request hangs).
    # Requests of other code that imported obstore first cannot be seen: assumed made.
    if _requested or ("obstore" in sys.modules and not _imported_first):
        _fork_unsafe = True


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _request_pool() -> Any:
    """This process's threads for the cache's requests (a pool does not survive a fork).
    Not daemons: the interpreter joins them before it finalizes."""
    global _pool, _pool_pid
    with _stores_lock:
        if _pool is None or _pool_pid != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            _pool, _pool_pid = ThreadPoolExecutor(_POOL_THREADS, "pipeline-obstore"), os.getpid()
        return _pool


def obstore_config(protocols: tuple[str, ...], options: Mapping[str, Any], bucket: str,
                   env: Mapping[str, str] | None = None, fsspec_conf: Mapping[str, Any] | None = None
                   ) -> dict[str, Any] | None:
    """The keyword arguments of an ``obstore.store.S3Store`` that fetches what s3fs with
    ``options`` fetches from ``bucket``, or None when the options do not translate.

    Parameters
    ----------
    protocols
        The fsspec file system's protocols (``("s3", "s3a")`` for s3fs).
    options
        Its storage options, as given to s3fs.
    bucket
        The store's bucket.
    env
        The environment (default: ``os.environ``). Credentials or a region from
        environment variables both clients read are left to obstore, which reads them;
        the certificates of ``AWS_CA_BUNDLE`` are read and passed on.
    fsspec_conf
        fsspec's configuration for s3 (default: ``fsspec.config.conf["s3"]``); any
        translates to None, since obstore would not see it.
    """
    env = os.environ if env is None else env
    if fsspec_conf is None:
        try:
            from fsspec.config import conf
            fsspec_conf = conf.get("s3") or conf.get("s3fs") or {}
        except ImportError:
            fsspec_conf = {}
    if not {"s3", "s3a"} & set(protocols) or fsspec_conf or any(env.get(k) for k in _BOTOCORE_ENV):
        return None
    opts = {k: v for k, v in options.items() if k not in _IRRELEVANT}
    client = dict(opts.pop("client_kwargs", None) or {})
    out: dict[str, Any] = {"bucket": bucket}

    def take(name: str, *aliases_in_client: str) -> Any:
        value = opts.pop(name, None)
        for alias in aliases_in_client:
            value = client.pop(alias, None) if value is None else value
            client.pop(alias, None)
        return value

    key = take("key", "aws_access_key_id")
    secret = take("secret", "aws_secret_access_key")
    token = take("token", "aws_session_token")
    anon = bool(opts.pop("anon", False))
    endpoint = take("endpoint_url", "endpoint_url")
    if not endpoint and str(env.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "")).lower() != "true":
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")  # botocore's order
    region = client.pop("region_name", None)
    requester_pays = bool(opts.pop("requester_pays", False))
    use_ssl = opts.pop("use_ssl", True)
    if opts or client:  # options obstore has no word for (a profile, botocore's config, ...)
        return None
    if anon:
        out["skip_signature"] = True
    elif key and secret:
        out.update(access_key_id=str(key), secret_access_key=str(secret))
        if token:
            out["session_token"] = str(token)
    elif key or secret or token or not (env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY")):
        # Half a key pair (or a token without one), or credentials botocore finds
        # elsewhere (its files, SSO).
        return None
    if endpoint:
        out["endpoint"] = str(endpoint)
        if str(endpoint).startswith("http://"):
            out["client_options"] = {"allow_http": True}
    elif not use_ssl:
        return None
    if env.get("AWS_CA_BUNDLE") and not str(endpoint or "").startswith("http://"):
        try:  # botocore trusts this bundle for https: so must obstore
            with open(env["AWS_CA_BUNDLE"], encoding="ascii") as fh:
                out["client_options"] = {"root_certificate": fh.read()}
        except (OSError, UnicodeDecodeError):
            return None  # s3fs reports an unreadable bundle in its own words
    if region:
        out["region"] = str(region)
    elif not (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")):
        if not endpoint:
            return None  # s3fs finds an AWS bucket's region; obstore would need it said
        out["region"] = "us-east-1"  # another S3 server: signed for any region it accepts
    if requester_pays:
        out["request_payer"] = True
    return out


class FsspecFetcher:
    """Objects fetched through an asynchronous fsspec file system."""

    def __init__(self, fs: Any, root: str):
        self.fs, self.root = fs, root.rstrip("/")

    async def get(self, path: str) -> Any:
        """The bytes of object ``path`` under the root, or None when there is none."""
        remote = f"{self.root}/{path}" if self.root else path
        try:
            return await self.fs._cat_file(remote)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None


class ObstoreFetcher:
    """Objects fetched through an obstore ``S3Store`` of the bucket."""

    def __init__(self, config: Mapping[str, Any], root: str):
        global _imported_first
        if _imported_first is None:
            _imported_first = "obstore" not in sys.modules
        from obstore.store import S3Store

        config = dict(config)
        self.bucket = config.pop("bucket")
        self.prefix = root.rstrip("/").split("/", 1)[1] if "/" in root.rstrip("/") else ""
        # One client per bucket and settings in a process: a store's arrays, and its
        # cache, share its connections (each new one costs round trips).
        key = (os.getpid(), self.bucket, repr(sorted(config.items())))
        with _stores_lock:
            if key not in _stores:
                _stores[key] = S3Store(self.bucket, **config)
            self.store = _stores[key]

    def fetch(self, path: str, start: int | None = None, stop: int | None = None,
              suffix: int | None = None) -> Any:
        """The bytes of object ``path`` under the root (an ``obstore.Bytes``, read
        through the buffer protocol), or of its range ``[start, stop)``, or of its last
        ``suffix`` bytes; None when there is no such object. Blocks (the GIL released)."""
        import obstore
        from obstore.exceptions import NotFoundError

        global _requested
        _requested = True
        key = f"{self.prefix}/{path}" if self.prefix else path
        try:
            if start is not None:
                return obstore.get_range(self.store, key, start=start, end=stop)
            options = {"range": {"suffix": suffix}} if suffix is not None else None
            return obstore.get(self.store, key, options=options).bytes()
        except (FileNotFoundError, NotFoundError):  # obstore raises the former for a missing key
            return None

    async def get(self, path: str) -> Any:
        """:meth:`fetch` of the whole object, on this package's request threads."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(_request_pool(), self.fetch, path)


def store_fetcher(store: Any) -> ObstoreFetcher | None:
    """An obstore fetcher of a zarr ``FsspecStore``'s objects, or None where
    :func:`fetcher_for` would keep the store's own file system (the store is then read
    through zarr)."""
    fs = getattr(store, "fs", None)
    if fs is None:
        return None
    fetcher = fetcher_for(fs, store.path, getattr(fs, "storage_options", None))
    return fetcher if isinstance(fetcher, ObstoreFetcher) else None


def fetcher_for(fs: Any, root: str, options: Mapping[str, Any] | None) -> FsspecFetcher | ObstoreFetcher:
    """The fetcher of the objects under ``root`` on ``fs`` (opened with ``options``):
    obstore where :func:`obstore_config` translates the options, it is installed, and
    this process was not forked from one whose obstore runtime may run; else ``fs``
    itself."""
    p = getattr(fs, "protocol", ())
    protocols = (p,) if isinstance(p, str) else tuple(p)
    bucket = root.strip("/").split("/", 1)[0]
    config = obstore_config(protocols, dict(options or {}), bucket) if bucket else None
    if config is not None and not _fork_unsafe:
        try:
            return ObstoreFetcher(config, root.strip("/"))
        except Exception:  # noqa: BLE001 - obstore not installed, or a client it cannot build
            pass  # (bad certificates): s3fs speaks for it
    return FsspecFetcher(fs, root)
