"""Which input files are new, and which stored ones changed, since a store was built.

A store records every file it read: its path, size and modification time, the CRC-32
of its whole content (``crc32``), and a BLAKE2b hash of its size, first MiB and last
MiB (``hash``). An append, or a rerun of the same config, compares the files a config
matches now against that record, before it reads or writes anything:

- a file not in the record is new;
- a recorded file whose size differs, or whose modification time differs and whose
  content differs too, has changed: the stored windows no longer describe it;
- a recorded file that is gone is missing.

Comparing size and time first (as ``make`` and ``rsync`` do) keeps an append from
reading the old files; the content is read only for a file whose time moved, so a file
copied or touched with the same bytes is not taken for a changed one.

Every byte is checksummed because a correction in the middle of a file (one price, one
line) keeps its size: the first and last MiB alone took such a file for an unchanged
one, and its stale windows stayed in the store. CRC-32 (zlib-ng's, as
:mod:`pipeline.storage.checksum` computes it, here continued block by block) runs at
about memory speed, so the pass costs little beside reading the file; a cryptographic
hash of every byte would cost several times more. With the size and the 128-bit hash
of both ends, a changed file passes only if its change lies in the middle, keeps the
size and keeps the CRC: odds of 2^-32 for a random change, and none for a change of up
to 32 consecutive bits, which CRC-32 always detects.

Stores written before the ``crc32`` key existed record only ``hash``: their files are
checked as before, by size, first MiB and last MiB.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

import fsspec


from pipeline.errors import LoaderError
from pipeline.storage.checksum import crc32

__all__ = ["CRC_KEY", "HASH_PRIORITY", "HASH_TASK_BYTES", "HASH_TASK_FILES", "FileChanges", "compare_files",
           "content_hash", "file_digests", "hash_batches", "hashes_on", "recorded_files", "with_hashes"]

#: The record key of a file's whole-content CRC-32 (8 hex digits). Its own key, not a
#: new meaning of ``hash``: a record without it was written before, and is compared
#: by ``hash`` alone.
CRC_KEY = "crc32"

#: Bytes hashed at each end of a file by ``hash``.
_HASH_BYTES = 1 << 20

#: Bytes read at a time by the whole-content pass: large enough that a read and a CRC
#: call cost next to nothing beside their bytes, small enough that a thread per file
#: holds little memory.
_BLOCK_BYTES = 4 << 20

#: Threads that hash files at once: reads and CRC-32 release the GIL, and a disk or an
#: object store serves several requests in flight faster than one.
_THREADS = min(16, (os.cpu_count() or 1) + 4)

_T = TypeVar("_T")
_R = TypeVar("_R")


def _open(path: str, storage_options: dict | None) -> Any:
    """A binary file object; local files without fsspec's wrapper (a large ``readinto``
    reads straight into the caller's buffer)."""
    if "://" not in path or path.startswith("file://"):
        return open(path.removeprefix("file://"), "rb")
    # The OpenFile, not its .open(): a chained URL's filesystem (zip::) must live while it is read.
    return fsspec.open(path, "rb", **(storage_options or {}))


def _ends(size: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The byte ranges ``hash`` covers, as the first version read them: the first MiB,
    then the last MiB, or for a file of up to 2 MiB the bytes after the first MiB."""
    tail = (size - _HASH_BYTES, size) if size > 2 * _HASH_BYTES else (_HASH_BYTES, 2 * _HASH_BYTES)
    return (0, _HASH_BYTES), tail


def content_hash(path: str, size: int, storage_options: dict | None = None) -> str:
    """BLAKE2b (128 bits) of a file's size, first MiB and last MiB: the record's
    ``hash``, read without the rest of the file.

    Raises
    ------
    LoaderError
        When the file cannot be read, naming it.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(int(size).to_bytes(8, "little"))
    try:
        with _open(path, storage_options) as f:
            for lo, hi in _ends(int(size)):
                f.seek(lo)
                h.update(f.read(hi - lo))
    except OSError as exc:
        raise LoaderError(path, f"cannot read ({exc})") from None
    return h.hexdigest()


def file_digests(path: str, size: int, storage_options: dict | None = None) -> tuple[str, str]:
    """A file's ``hash`` (as :func:`content_hash`) and ``crc32`` (the CRC-32 of its
    whole content, 8 hex digits), in one pass over its bytes.

    Parameters
    ----------
    path
        Local path or fsspec URL.
    size
        The size the record holds beside the digests (``hash`` covers it, and the
        ends it names).
    storage_options
        fsspec options for remote paths.

    Raises
    ------
    LoaderError
        When the file cannot be read, naming it.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(int(size).to_bytes(8, "little"))
    ranges = _ends(int(size))
    crc = 0
    offset = 0
    view = memoryview(bytearray(_BLOCK_BYTES))
    try:
        with _open(path, storage_options) as f:
            while True:
                n = f.readinto(view)  # fsspec's files and local ones: no copy of each block
                if not n:
                    break
                block = view[:n]
                crc = crc32(block, crc)
                # The ends are fed as the blocks pass, in file order, so no block is kept.
                for lo, hi in ranges:
                    a, b = max(lo, offset), min(hi, offset + n)
                    if a < b:
                        h.update(block[a - offset:b - offset])
                offset += n
    except OSError as exc:
        raise LoaderError(path, f"cannot read ({exc})") from None
    return h.hexdigest(), f"{crc:08x}"


def _in_threads(fn: Callable[[_T], _R], items: Sequence[_T]) -> list[_R]:
    """``[fn(x) for x in items]``, several at once when there are several (the first
    error in item order is raised)."""
    if len(items) < 2:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(_THREADS, len(items)), thread_name_prefix="pipeline-hash") as pool:
        return list(pool.map(fn, items))


def recorded_files(sources: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``{path: {"size", "mtime", "hash", "crc32"}}`` of every file (and LOBSTER
    companion) a store's ``sources`` attribute records (``crc32`` is ``None`` in a
    store written before it was recorded)."""
    keys = ("size", "mtime", "hash", CRC_KEY)
    out: dict[str, dict[str, Any]] = {}
    for entry in (sources or {}).get("files") or []:
        path = _local_absolute(str(entry["path"]))
        out[path] = {k: entry.get(k) for k in keys}
        comp = entry.get("companion")
        if isinstance(comp, Mapping) and comp.get("path"):
            out[_local_absolute(str(comp["path"]))] = {**{k: comp.get(k) for k in keys}, "companion_of": path}
    return out


def _local_absolute(path: str) -> str:
    """A recorded local path as :func:`~pipeline.loaders.expand_paths` gives it now
    (absolute): stores built before it did so recorded relative ones, taken here as
    relative to this working directory (where their config's relative globs point)."""
    return path if "://" in path or os.path.isabs(path) else os.path.abspath(path)


def _records(sources: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Copies of a ``sources`` attribute's file records, and the records to hash in
    order (each file, then its companion) among them."""
    files = [dict(entry) for entry in sources.get("files") or []]
    items: list[dict[str, Any]] = []
    for entry in files:
        items.append(entry)
        if isinstance(entry.get("companion"), Mapping):
            entry["companion"] = dict(entry["companion"])
            items.append(entry["companion"])
    return files, items


def with_hashes(sources: Mapping[str, Any], storage_options: dict | None = None, *,
                digests: Sequence[tuple[str, str]] | None = None) -> dict[str, Any]:
    """A ``sources`` attribute with every file's (and companion's) ``hash`` and
    ``crc32`` added, the files read several at once.

    Parameters
    ----------
    sources
        The attribute, with each file's ``path`` and ``size``.
    storage_options
        fsspec options for remote paths.
    digests
        The files' ``(hash, crc32)``, each file then its companion, already computed
        (by :func:`hashes_on`'s tasks): then no file is read here.

    Raises
    ------
    LoaderError
        Naming the first file (in record order) that cannot be read.
    """
    files, items = _records(sources)
    if digests is None:
        digests = _in_threads(lambda item: file_digests(item["path"], int(item["size"]), storage_options), items)
    elif len(digests) != len(items):
        raise ValueError(f"{len(digests)} digests for {len(items)} files")
    for item, (hashed, crc) in zip(items, digests):
        item["hash"], item[CRC_KEY] = hashed, crc
    out = dict(sources)
    out["files"] = files
    return out


#: The priority of the hashing tasks of :func:`hashes_on`: below every task of a build
#: (dask's default is 0), so they fill the workers' idle moments between its passes.
HASH_PRIORITY = -100

#: Bytes and files that one hashing task of :func:`hashes_on` reads at most (a larger
#: file is a task of its own). A task costs the scheduler and the client about a
#: millisecond or more of their own CPU: an input of 100,000 small files as as many
#: tasks would keep them busy for minutes, where the client's threads took seconds.
HASH_TASK_BYTES = 256 << 20
HASH_TASK_FILES = 256


def hash_batches(sizes: Sequence[int], max_bytes: int = HASH_TASK_BYTES,
                 max_files: int = HASH_TASK_FILES) -> list[tuple[int, int]]:
    """Consecutive ranges ``[start, stop)`` of files of ``sizes`` (in record order), each
    at most ``max_files`` files and ``max_bytes`` bytes, except that a larger file is a
    range of its own: every file in exactly one range, in order."""
    out: list[tuple[int, int]] = []
    start, held = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (i - start >= max_files or held + int(size) > max_bytes):
            out.append((start, i))
            start, held = i, 0
        held += int(size)
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out


def _digest_files(paths: Sequence[str], sizes: Sequence[int], storage_options: dict | None
                  ) -> list[tuple[str, str]]:
    """:func:`file_digests` of each file in order (one of :func:`hashes_on`'s tasks)."""
    return [file_digests(path, size, storage_options) for path, size in zip(paths, sizes)]


def hashes_on(client: Any, sources: Mapping[str, Any],
              storage_options: dict | None = None) -> Callable[[], dict[str, Any]]:
    """:func:`with_hashes` of ``sources``, its files read by ``client``'s workers from now on.

    A build records every input file's digests, which takes reading every byte of
    every file once more. Read by the client, that is a pass over the whole input on one
    machine, with the cluster idle, between the build's statistics and its write; and
    where the input lies beside a remote cluster (an object store), every byte crosses
    to the client. As tasks, the files are read where the loaders read them, one task a
    group of files (:func:`hash_batches`), at :data:`HASH_PRIORITY`: while the client
    plans the build's passes and between them, and at worst before the write, as before.

    Parameters
    ----------
    client
        A ``distributed.Client``.
    sources
        The attribute, with each file's ``path`` and ``size``.
    storage_options
        fsspec options for remote paths.

    Returns
    -------
    callable
        Waits for the tasks and returns ``with_hashes(sources, storage_options)``.
        It raises :class:`~pipeline.errors.LoaderError` naming the first file (in
        record order) that could not be read.
    """
    _, items = _records(sources)
    paths, sizes = [str(item["path"]) for item in items], [int(item["size"]) for item in items]
    ranges = hash_batches(sizes, HASH_TASK_BYTES, HASH_TASK_FILES)
    futures = client.map(_digest_files, [paths[a:b] for a, b in ranges], [sizes[a:b] for a, b in ranges],
                         storage_options=storage_options, key="file-digests", pure=False,
                         priority=HASH_PRIORITY) if ranges else []

    def result() -> dict[str, Any]:
        from distributed import wait

        wait(futures)
        # The first failure in record order, as with_hashes raises it: the ranges are in
        # that order, and a task stops at its first unreadable file.
        for future in futures:
            if future.status == "error":
                future.result()
        digests = [d for batch in client.gather(futures) for d in batch]
        return with_hashes(sources, storage_options, digests=digests)

    return result


@dataclass(frozen=True, slots=True)
class FileChanges:
    """New files (in path order), changed files with what changed, and missing files."""

    new: tuple[str, ...]
    changed: tuple[tuple[str, str], ...]
    missing: tuple[str, ...]


def _content_differs(path: str, size: int, rec: Mapping[str, Any], storage_options: dict | None) -> bool:
    """Whether a file whose modification time moved holds other bytes than recorded:
    every byte when the record has ``crc32``, else (a store written before) its size
    and ends as ``hash`` covers them; with neither, it is taken as changed."""
    if rec.get(CRC_KEY) is not None:
        hashed, crc = file_digests(path, size, storage_options)
        return crc != rec[CRC_KEY] or (rec.get("hash") is not None and hashed != rec["hash"])
    if rec.get("hash") is not None:
        return content_hash(path, size, storage_options) != rec["hash"]
    return True


def compare_files(recorded: Mapping[str, Mapping[str, Any]], current: Iterable[str],
                  stat: Any, storage_options: dict | None = None) -> FileChanges:
    """What changed between the recorded files and the ``current`` ones.

    Parameters
    ----------
    recorded
        From :func:`recorded_files`.
    current
        The paths a config matches now (companions are looked up in ``recorded``).
    stat
        ``stat(path) -> (size, mtime)``.
    storage_options
        fsspec options for remote paths.

    Returns
    -------
    FileChanges
        Changed files in record order, each with why.

    Raises
    ------
    LoaderError
        Naming a file whose time moved but that cannot be read.
    """
    current = list(current)
    seen = set(current)
    new = tuple(p for p in current if p not in recorded)
    verdicts: list[tuple[str, str | None]] = []  # (path, why) in record order; None: read its content
    moved: list[tuple[str, int, Mapping[str, Any]]] = []
    missing: list[str] = []
    for path, rec in recorded.items():
        if path not in seen and rec.get("companion_of") not in seen:
            if "companion_of" not in rec:
                missing.append(path)
            continue
        try:
            size, mtime = stat(path)
        except LoaderError:
            missing.append(path)
            continue
        if rec.get("size") is not None and int(rec["size"]) != int(size):
            verdicts.append((path, f"its size is {size:,} bytes, the store recorded {int(rec['size']):,}"))
        elif rec.get("mtime") is not None and float(rec["mtime"]) != float(mtime):
            verdicts.append((path, None))
            moved.append((path, int(size), rec))
    # Only files whose time moved are read; many of them (a folder copied anew) are read
    # several at once.
    differs = dict(zip((m[0] for m in moved),
                       _in_threads(lambda m: _content_differs(m[0], m[1], m[2], storage_options), moved)))
    modified = "it was modified: its modification time and its content differ from the store's record"
    changed = tuple((path, why if why is not None else modified) for path, why in verdicts
                    if why is not None or differs[path])
    return FileChanges(new, changed, tuple(missing))
