""":func:`pipeline.stream`: the arguments checked, the source opened, a :class:`Stream` made.

The streamer itself (:mod:`~pipeline.streaming.streamer`) runs epochs; this module turns
what a user passes (a store path, a zarr group, arrays, several sources with weights)
into its source and shares.

A local store that an overwrite replaces while a stream reads it (the path then names
another directory) is never served mixed with the new one: the next group read fails
with :class:`~pipeline.errors.StreamError` naming the store, in the process and in
DataLoader workers; open the stream again. Appends, which add versions inside the same
directory, are not affected: the stream keeps its version. A chunk of a remote store
that fails in the node-local cache is dropped from it and fetched again once (a warning
names the cache file); only if the store's own bytes fail too is it reported as the
store's (:class:`~pipeline.errors.CorruptChunkError`).

Batch sizes (``stream(batch_size=B)`` on ``W`` ranks, ``N`` samples in the epoch): rank
``r`` serves the contiguous share ``[N * r // W, N * (r + 1) // W)`` of the epoch's
sample sequence, ``N // W`` samples or one more. Every rank serves the same number of
batches, ``ceil(ceil(N / W) / B)`` (``len(stream)``): a rank out of batches before the
others would leave them waiting for good in a collective step (DDP's all-reduce). A
rank's batches hold ``B`` samples each, then the rest of its share: ``R = ceil(N / W) %
B`` samples on the largest shares (``B`` when 0), one fewer on a share one sample short.
When the largest shares' last batch holds one sample, a short share's would be empty:
its batch before gives it one sample, ``[..., B - 1, 1]``, the only case of a batch but
the last below ``B`` (with ``B = 1`` none can give one: that stream is refused,
``drop_last`` fixes it). 1000 samples on 3 ranks with ``B = 333``: shares of 333, 333
and 334 samples, batches ``[332, 1]``, ``[332, 1]`` and ``[333, 1]``. With ``drop_last``
every batch holds ``B`` samples, ``floor(floor(N / W) / B)`` per rank, and the rest of
each share is not served that epoch. DataLoader workers split a rank's batches among
them, sizes kept; ``Stream.plan().batch_sizes`` lists a rank's. A last step of one or
two samples is avoided by a ``B`` whose ``R`` is larger, or by ``drop_last``.

Chunk files kept mapped (``stream(keep_mapped=)``): a local store's chunk files are
mapped to be decoded: the page cache's own pages, clean, nothing copied, which the
kernel may drop under memory pressure, but which count in the process's resident memory
(``RssFile``: what ``ps``, ``psutil``, SLURM's accounting and a pod's working set
report) and in its address space while mapped. A file kept mapped is read in later
epochs with no page fault or system call; the files mapped first are kept, the others
unmapped once decoded. The default budget is up to a quarter of the memory the process
may use (physical memory, or its cgroup's limit where lower: a container's, a SLURM
job's, a pod's), at most 16 GiB (:func:`~pipeline.streaming.maps.default_map_budget`):
the fastest later epochs, and a store that fits in it stays mapped whole. With
``keep_mapped=N`` (more than that default keeps the default; 0: each file unmapped once
decoded) resident memory grows over an epoch by about ``memory_bound()`` plus ``N`` plus
the files being decoded: the setting for an address-space limit (``ulimit -v``) or
strict accounting of resident memory, at a cost in stream CPU on a warm store (the API
reference's "Memory" paragraph measures it).
"""

from __future__ import annotations

import contextvars
import numbers
import os
import sys
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from pipeline.errors import StreamError
from pipeline.streaming.cache import cache_spec
from pipeline.streaming.elastic import per_rank_batch
from pipeline.streaming.localstore import is_zarr, one_reading, open_root
from pipeline.streaming.sources import ArraySource
from pipeline.streaming.streamer import Stream
from pipeline.streaming.subsets import open_store_source
from pipeline.streaming.zarrmeta import METADATA_FILES, damaged_json, metadata_error

if TYPE_CHECKING:  # pragma: no cover
    from pipeline.streaming.mix import Mix

__all__ = ["EMPTY_EPOCHS_OK", "check_seed", "stream"]

#: Set while :func:`~pipeline.streaming.mix.mix` opens its sources: a source without a
#: batch per epoch is the mix's to judge (weight 0 is fine), not refused when made.
EMPTY_EPOCHS_OK: contextvars.ContextVar[bool] = contextvars.ContextVar("pipeline_empty_epochs_ok", default=False)

def stream(
    source: Any, *, split: str = "train", arrays: Sequence[str] = ("x", "y"), batch_size: int | None = None,
    global_batch_size: int | None = None, shuffle: bool = True, seed: int = 0, buffer_chunks: int = 4,
    drop_last: bool = False, rank: int | None = None, world_size: int | None = None, partial: bool = False,
    storage_options: dict[str, Any] | None = None, prefetch: int = 2, threads: int | None = None,
    verify: bool = False, read_niceness: int = 5, version: int | None = None, follow: bool = False,
    weights: Sequence[float] | None = None, cache_dir: str | os.PathLike[str] | None = None,
    cache_bytes: int | None = None, dim: str | None = None, keep_mapped: int | None = None,
) -> Stream:
    """Stream shuffled, aligned batches of a split.

    Parameters
    ----------
    source
        A store path or URL (directory, ``.zarr.zip``, ``s3://...``), a ``zarr.Group``,
        or a mapping / tuple of arrays: numpy, dask (chunks computed in background
        threads, on the active cluster if any) or ``zarr.Array`` (read chunk by chunk,
        see :mod:`~pipeline.streaming.foreign`). A store another tool wrote needs no
        ``partial``: its group ``split`` is read, else the variables at its root.
    split
        Split of a store, or a fold written with it (``"fold2/train"``, served from its
        base split's chunks, see :mod:`~pipeline.streaming.subsets`).
    arrays
        Names of the arrays (or an xarray store's variables) to yield, in order; a
        tuple source's arrays are ``a0, a1, ...``.
    dim
        For an xarray store: the samples' dimension, the first of every variable (else
        refused with the transpose that fixes it). Variables whose CF encoding would
        make the stored numbers wrong (``scale_factor``, time ``units``...) are refused.
    batch_size
        Samples per batch of a rank, ``B``; every rank serves ``ceil(ceil(N / W) / B)``
        batches (``W`` ranks, ``N`` samples): full ones, then the rest, or ``B - 1`` and 1
        where that rest would be empty (:mod:`pipeline.streaming.api`). States resume on
        the same world size and worker count only.
    global_batch_size
        Instead of ``batch_size``: samples per step over all ranks
        (:mod:`~pipeline.streaming.elastic`). Step ``j`` holds the same samples on every
        world size from 1 to 8 that divides it; a state saved by any rank resumes on any
        such world size and worker count. Every step is full but the epoch's last, of
        ``N mod global_batch_size`` samples (none with ``drop_last``), the ranks' shares
        within one sample; a world size above it (a rank without one) needs ``drop_last``.
    shuffle
        Permute the chunk order and mix samples in the buffer (``False``: store order;
        with ``global_batch_size``, store order lane by lane: each step takes its next
        samples from each of ``L`` stretches of the store, far apart, see
        :func:`~pipeline.streaming.elastic.lane_count`).
    seed
        Seeds the chunk order and the in-buffer mixing with ``(seed, epoch)``: an integer,
        0 or more, the same on every rank (not None: ranks would not share one order).
    buffer_chunks
        Chunks whose samples are mixed together (a group). Memory, per rank or
        DataLoader worker process, while the loop keeps no batch: at most
        ``(min(S, (A + 2 + V) * G) + 2 * B + (T + 1) * C) * b`` bytes, where ``b`` is one
        sample's bytes over ``arrays``, ``G = buffer_chunks * C`` (``C`` the longest
        chunk's samples), ``T`` the read threads (``threads``: chunks being decoded),
        ``B = batch_size``, ``S`` the samples of this rank's epoch, ``A`` the groups read
        ahead (``Stream.prefetch``, see ``prefetch``) and ``V = max(1, ceil((Q + 2) * B /
        G))`` the groups that the batches queued for the loop (``Q``:
        ``Stream.prefetch_batches``, 4, or 2-3 for batches over 16 MiB), the one it holds
        and the one being cut still view. A smaller split costs its size plus two batches
        (and ``G * b``, kept, if the loop holds its last batch into the next epoch). Virtual
        windows (``materialize: false``) add the batches being assembled, each loaded
        group's feature rows and ends, and up to 64 MiB of decoded features. ``Stream.memory_bound()``
        computes it all; the process's memory (interpreter, libraries) and mapped files come on top.
    drop_last
        Only full batches: ``floor(floor(N / W) / B)`` per rank, the rest not served.
    rank
        This process's rank: ``torch.distributed``'s when initialized, else torchrun's ``RANK``, else 0.
    world_size
        The number of ranks: ``torch.distributed``'s when initialized, else ``WORLD_SIZE``, else 1.
    partial
        Read a store that is not marked complete.
    storage_options
        fsspec options for a remote store (credentials, endpoint...).
    prefetch
        Groups read ahead in the background (small groups further: :func:`~pipeline.streaming.streamer.groups_ahead`).
    threads
        Threads reading chunks: one per core (at most 32), 16 or more for a remote store without ``cache_dir``.
    verify
        Check every chunk read against the CRC32 recorded when it was written (unsharded
        stores). Without it, a damaged chunk is refused only when it fails to decode: a
        flipped byte that still decodes is served. It costs a CRC pass over every byte.
        Other tools' arrays: their ``crc32c`` codec, checked by zarr on every read (else a warning).
    read_niceness
        How many steps nicer than the process the read threads run (Linux, 0 to 19):
        reading ahead must not take cores from the training loop.
    weights
        Whole batches drawn from a list of sources in these shares (:func:`pipeline.mix`).
    version
        The store version to serve (default the newest when the stream opens).
    follow
        Move to the newest version at each new epoch (``set_epoch``).
    cache_dir
        For a remote store: keep its chunk objects in this local directory, fetched
        ahead of need, shared by a node's ranks and DataLoader workers
        (:mod:`~pipeline.streaming.cache`; ``Stream.cache_stats(epoch)``).
    cache_bytes
        The most bytes ``cache_dir`` keeps (least recently used evicted).
    keep_mapped
        Bytes of a local store's chunk files kept mapped from one epoch to the next, per
        process (each DataLoader worker its own), counted in its resident memory. ``None``:
        up to a quarter of the memory the process may use, at most 16 GiB, the fastest
        later epochs; ``N`` (0 allowed, at most that default): for ``ulimit -v`` or strict
        accounting of resident memory (how, at what cost: :mod:`pipeline.streaming.api`).

    Returns
    -------
    Stream
        (a :class:`~pipeline.streaming.mix.Mix` with ``weights``); an overwrite of its
        store or a damaged cache file: see :mod:`pipeline.streaming.api`.
    """
    seed, keep_mapped = check_seed(seed, "stream"), _check_keep_mapped(keep_mapped)
    if weights is not None:
        return _mixed(source, weights, locals())  # locals(): a parameter added to stream cannot be left out
    rank, world_size, batch_size = _check_shares(batch_size, global_batch_size, buffer_chunks, read_niceness, rank,
                                                 world_size)
    src = _opened(source, split, arrays, partial, storage_options, verify, version,
                  cache_spec(cache_dir, cache_bytes), dim, keep_mapped)
    return _checked_stream(src, _where(source, split, src), batch_size, global_batch_size, drop_last, rank, world_size,
                           shuffle=shuffle, seed=seed, buffer_chunks=buffer_chunks, prefetch=prefetch, threads=threads,
                           read_niceness=read_niceness, follow=follow)


def _mixed(source: Any, weights: Sequence[float], options: dict[str, Any]) -> Mix:
    """``stream(source, weights=weights, ...)``: a :class:`~pipeline.streaming.mix.Mix`.

    ``options`` are ``stream``'s own parameters, as checked: every one but ``source`` and
    ``weights`` goes on to each source's stream, so that none can be dropped here.
    """
    from pipeline.streaming.mix import mix  # here: the mix module builds on this one

    return mix(source, weights=weights, **{k: v for k, v in options.items() if k not in ("source", "weights")})


def _checked_stream(src: Any, where: str, batch_size: int, global_batch_size: int | None, drop_last: bool,
                    rank: int, world_size: int, **options: Any) -> Stream:
    """The :class:`Stream` over ``src`` (what ``where`` names), its samples checked first.

    ``options`` are :class:`Stream`'s other keywords (``shuffle``, ``seed``,
    ``buffer_chunks``, ``prefetch``, ``threads``, ``read_niceness``, ``follow``).

    Raises
    ------
    StreamError
        For a split of no samples or of fewer than ranks; and, the stream closed, when
        ``drop_last`` leaves every epoch without a batch (unless a mix opens it, see
        :data:`EMPTY_EPOCHS_OK`).
    """
    n = int(sum(src.lengths))
    _check_samples(where, n, world_size)
    try:
        s = Stream(src, names=src.names, batch_size=batch_size, drop_last=drop_last, rank=rank, world_size=world_size,
                   global_batch_size=global_batch_size, **options)
    except StreamError as exc:
        text = str(exc)
        if not text.startswith(f"stream: {n} samples: "):  # (the elastic order's refusal of a world size)
            raise
        raise StreamError(f"stream: {where} {text.removeprefix('stream: ')}") from None
    if drop_last and len(s) == 0 and not EMPTY_EPOCHS_OK.get():
        s.close()
        raise _no_whole_batch(where, s.n_samples, batch_size, global_batch_size, world_size)
    return s


def _check_keep_mapped(keep_mapped: Any) -> int | None:
    """``keep_mapped`` checked: None (the default budget) or a number of bytes, 0 or more.

    Raises
    ------
    StreamError
        For a bool, a float, a string or a negative number, naming ``keep_mapped``.
    """
    if keep_mapped is None:
        return None
    if isinstance(keep_mapped, bool) or not isinstance(keep_mapped, numbers.Integral) or keep_mapped < 0:
        raise StreamError(f"stream: keep_mapped must be None (the default: chunk files kept mapped up to a quarter "
                          f"of the memory the process may use) or bytes, an integer 0 or more; got {keep_mapped!r} "
                          f"({type(keep_mapped).__name__})")
    return int(keep_mapped)


def _check_samples(where: str, n: int, world_size: int) -> None:
    """Refuse, naming the store (``where``), a split of no samples, or of fewer than ranks."""
    if not n:
        raise StreamError(f"stream: {where} no samples; there is nothing to stream")
    if n < world_size:
        raise StreamError(f"stream: {where} {n} samples, which cannot be shared among {world_size} ranks: every "
                          "rank needs one at least; stream it on fewer ranks")


def _no_whole_batch(where: str, n: int, batch_size: int, global_batch_size: int | None, world_size: int
                    ) -> StreamError:
    """The refusal of a stream whose ``drop_last`` leaves every epoch without a batch:
    silently empty epochs train on nothing (Keras then fails on a None input)."""
    per = (f"a global batch of {global_batch_size}" if global_batch_size is not None
           else f"batches of {batch_size}" + (f" on each of {world_size} ranks" if world_size > 1 else ""))
    return StreamError(f"stream: {where} {n} samples, which fill no whole batch: {per} with drop_last=True "
                       "leaves every epoch without a batch; use a smaller batch size, or drop_last=False")


def check_seed(seed: Any, caller: str) -> int:
    """``seed`` as an int, checked: a non-negative integer (numpy integers too).

    Checked when the stream is made: numpy would refuse it only at the first batch,
    inside a DataLoader worker, without naming ``seed``; and a string would be accepted
    there and saved as a string in every state.

    Raises
    ------
    StreamError
        For None (each rank and worker would draw its own seed, and they would no longer
        share one order of the epoch: samples served twice or never), a bool, a
        negative number, a float or a string.
    """
    if seed is None:
        raise StreamError(f"{caller}: seed=None is refused: every rank and DataLoader worker must use the same "
                          "seed to share one order of the epoch (a seed drawn in each would serve some samples "
                          "twice and others never); pass an integer such as seed=0, or draw one once and give "
                          "every rank that value")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise StreamError(f"{caller}: seed must be an integer, 0 or more, got {seed!r} ({type(seed).__name__})")
    return int(seed)


def _where(source: Any, split: str, src: Any = None) -> str:
    """What ``stream(source, split=split)`` streams, as the subject of "holds": the
    split and its store, the zarr group's split, the variables of another tool's store
    (``src``, which names it; ``split`` does not apply to them), or the arrays."""
    # Asked without importing the foreign module (and zarr with it): a local pipeline
    # store opens without zarr (pipeline.streaming.localstore).
    foreign = sys.modules.get("pipeline.streaming.foreign")
    if foreign is not None and isinstance(src, foreign.ZarrSource) and getattr(src, "group", None) == "":
        what = src.label if src.label != "<group>" else "the zarr group passed"
        return f"the variables {', '.join(repr(n) for n in src.names)} of {what} hold"
    if isinstance(source, (str, os.PathLike)):
        return f"split {split!r} of {os.fspath(source)} holds"
    if is_zarr(source, "Group"):
        return f"split {split!r} of the zarr group passed holds"
    return "the arrays passed hold"


def _check_shares(batch_size: int | None, global_batch_size: int | None, buffer_chunks: int, read_niceness: int,
                  rank: int | None, world_size: int | None) -> tuple[int, int, int]:
    """``stream``'s sizes checked: this process's rank, the world size and the batch size
    per rank (from ``global_batch_size`` when given).

    Raises
    ------
    StreamError
        Naming the argument that is missing, out of range or inconsistent.
    """
    if batch_size is None and global_batch_size is None:
        raise StreamError("stream: pass batch_size (samples per batch of each rank) or global_batch_size (samples "
                          "per step over all ranks)")
    for name, value in (("batch_size", batch_size), ("global_batch_size", global_batch_size),
                        ("buffer_chunks", buffer_chunks)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise StreamError(f"stream: {name} must be a positive integer, got {value!r}")
    if isinstance(read_niceness, bool) or not isinstance(read_niceness, int) or not 0 <= read_niceness <= 19:
        raise StreamError(f"stream: read_niceness must be an integer from 0 to 19, got {read_niceness!r}")
    if rank is None or world_size is None:
        r, w = _distributed_rank()
        rank = r if rank is None else rank
        world_size = w if world_size is None else world_size
    if world_size <= 0 or not 0 <= rank < world_size:
        raise StreamError(f"stream: rank {rank} is outside 0..{world_size - 1}")
    if global_batch_size is not None:
        per_rank = per_rank_batch(global_batch_size, world_size)
        if batch_size is not None and batch_size != per_rank:
            raise StreamError(f"stream: batch_size={batch_size} and global_batch_size={global_batch_size} on "
                              f"{world_size} ranks disagree (that is {per_rank} per rank); pass only one of them")
        batch_size = per_rank
    return rank, world_size, int(batch_size)


def _opened(source: Any, split: str, arrays: Sequence[str], partial: bool, storage_options: dict[str, Any] | None,
            verify: bool, version: int | None, cache: Any, dim: str | None, keep_mapped: int | None = None) -> Any:
    """:func:`_open_source`, with a store's metadata file that is not valid JSON named
    (zarr raises a bare ``JSONDecodeError`` that names neither the store nor the file).

    Raises
    ------
    StoreError
        For a damaged ``zarr.json``, ``.zarray``, ``.zattrs``, ``.zgroup`` or
        ``.zmetadata``, naming the store and the file.
    """
    try:
        return _open_source(source, split, arrays, partial, storage_options, verify, version, cache, dim,
                            keep_mapped)
    except Exception as exc:
        bad = damaged_json(exc)
        if bad is None or not (isinstance(source, (str, os.PathLike)) or is_zarr(source, "Group")):
            raise
        if any(name in str(exc) for name in METADATA_FILES):
            raise  # named already (a pipeline store's metadata, read without zarr)
        nodes = ["", split, *arrays, *(f"{split}/{n}" for n in arrays)]
        raise metadata_error(source, storage_options, nodes, bad) from exc


def _open_source(source: Any, split: str, arrays: Sequence[str], partial: bool,
                 storage_options: dict[str, Any] | None, verify: bool, version: int | None, cache: Any,
                 dim: str | None = None, keep_mapped: int | None = None) -> Any:
    """The source ``stream`` reads: a store's split or fold, another tool's variables, or
    arrays (zarr arrays, alone or with numpy ones, through the fast chunk reader).
    ``keep_mapped``: bytes of a pipeline store's chunk files kept mapped (None: the
    default budget, see :func:`~pipeline.streaming.sources.map_budget`).

    Raises
    ------
    StreamError
        When ``source`` is none of the kinds ``stream`` takes, or ``dim`` is given for a
        source it does not apply to.
    """
    if split and any(part in (".", "..") for part in split.split("/")):
        # zarr's own refusal ("The path '.' is invalid ...") named no store.
        label = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<group>"
        raise StreamError(f"{label}: split={split!r}: a split is a group's name inside the store (train, "
                          "fold0/train); '.' and '..' name none (split=None streams the arrays at the root)")
    if isinstance(source, (str, os.PathLike)) or is_zarr(source, "Group"):
        with one_reading():  # the store's metadata read once, whoever asks
            foreign = _foreign_variables(source, split, arrays, storage_options, version, dim, cache)
            if foreign is not None:
                _unverifiable(verify, foreign.label, list(foreign.arrays.values()))
                return foreign
            return open_store_source(source, split, arrays, partial, storage_options, verify, version, cache=cache,
                                     keep_mapped=keep_mapped)
    if dim is not None:
        raise StreamError(f"stream: dim={dim!r} names the samples' dimension of a store's variables; arrays "
                          "passed directly have their samples along axis 0")
    if isinstance(source, (tuple, list)):
        names = tuple(f"a{i}" for i in range(len(source)))
        source, arrays = dict(zip(names, source)), names
    if not isinstance(source, Mapping):
        raise StreamError(f"stream: cannot stream from {type(source).__name__}; pass a store path, a zarr group or "
                          "arrays")
    _unverifiable(verify, "arrays passed directly", [source.get(n) for n in arrays])
    if any(is_zarr(source.get(n), "Array") for n in arrays):
        from pipeline.streaming.foreign import ZarrSource

        return ZarrSource(source, arrays, cache=cache)
    return ArraySource(source, arrays)


def _unverifiable(verify: bool, label: str, arrays: Sequence[Any]) -> None:
    """``verify=True`` for what has no checksums: said, not silently skipped."""
    if verify:
        from pipeline.streaming.sources import warn_unverifiable

        warn_unverifiable(label, arrays)


def _foreign_variables(source: Any, split: str, arrays: Sequence[str], storage_options: dict[str, Any] | None,
                       version: int | None, dim: str | None, cache: Any = None) -> Any:
    """A :class:`~pipeline.streaming.foreign.ZarrSource` over the variables of a store
    another tool wrote (those at its root when it has no group ``split``, else those of
    that group when ``dim`` is given), or None for a store ``open_store_source`` reads.

    Raises
    ------
    StreamError
        For ``dim`` or ``version`` with a store they do not apply to.
    """
    from pipeline.storage.store import ATTRS_KEY

    group = open_root(source, storage_options)
    label = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<group>"
    if ATTRS_KEY in group.attrs:
        if dim is not None:
            raise StreamError(f"{label}: dim={dim!r} is for stores another tool wrote (xarray's); this pipeline "
                              "store's samples run along axis 0 of its splits")
        return None
    # Only another tool's store comes this far: zarr opened it.
    import zarr

    from pipeline.streaming.foreign import open_variables

    node = group.get(split) if split else None
    if isinstance(node, zarr.Group):
        if dim is None and not _chunked_differently(node, arrays):
            return None  # a foreign store laid out in splits: read like a pipeline store
        # Arrays chunked differently along the samples (zarr's automatic chunks differ
        # for x and y) stream over their common grid, as variables do.
        where = split
    elif next(iter(group.arrays()), None) is not None:
        if split and split != "train":  # the default split is the root's variables; another name is a mistake
            groups = sorted(name for name, _ in group.groups())
            raise StreamError(f"{label}: no split {split!r}; this store (not written by pipeline) holds its "
                              f"variables at its root, streamed with the default split='train'"
                              + (f"; its groups: {', '.join(groups)}" if groups else ""))
        node, where = group, ""  # variables at the root, as xarray writes a Dataset
    else:
        return None  # neither: open_store_source names what the store holds
    if version is not None:
        raise StreamError(f"{label}: version={version} asked for, but the store has no versions (pipeline did not "
                          "write it)")
    return open_variables(source, node, where, arrays, dim, cache)


def _chunked_differently(group: Any, names: Sequence[str]) -> bool:
    """Whether the arrays ``names`` of ``group`` (those present) have chunks of
    different lengths along axis 0."""
    import zarr

    arrays = [group.get(n) for n in names]
    return len({a.chunks[0] for a in arrays if isinstance(a, zarr.Array) and a.ndim}) > 1


def _distributed_rank() -> tuple[int, int]:
    """This process's ``(rank, world_size)``: torch.distributed's group when initialized,
    else the launcher's ``RANK`` and ``WORLD_SIZE`` (torchrun, ``torch.distributed.run``
    and most launchers set them), else ``(0, 1)``. A stream opened before
    ``init_process_group`` under torchrun served the whole epoch on every rank."""
    # A process whose torch.distributed group is initialized has imported torch: asking
    # only then keeps a numpy loop, or Keras on JAX, from paying seconds to import it.
    if "torch" in sys.modules:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(), dist.get_world_size()
        except ImportError:
            pass
    rank, world = os.environ.get("RANK", ""), os.environ.get("WORLD_SIZE", "")
    if rank.isdigit() and world.isdigit() and 0 <= int(rank) < int(world):
        return int(rank), int(world)
    return 0, 1
