"""Overwriting a local store: the old one set aside in one rename, kept until the new one
is complete, then removed without making the run wait; put back when the new write fails.

Removing a store file by file takes seconds (a demo build at stride 1 holds 9,000 files
and directories; measured in benchmarks/README.md). The old directory is renamed to a
hidden sibling, which is atomic and instant, and stays there, whole, while the workers
write the new store: a write that fails (a disk without room for two copies, an
interrupted run, a worker's error) must not leave the user with no complete store, so
the old one is renamed back into place and the new one's partial write set aside
instead (:meth:`Removal.wait`). Once the new store is marked complete the old one is
removed by a thread, while the run closes its cluster and prints its summary; the
process waits for that thread before it exits (:func:`wait_for_removals`, an exit
handler), so nothing is left behind by a run that finishes.

The old store is set aside only where it used to be removed: after the input is
checked, so bad input still leaves it whole. Siblings that a killed run left set aside
(``.<name>.replaced-<hex>``, a name nothing else makes) are removed by the next write of
the same store that completes, an overwrite or the resumed run. Object stores have no
rename: theirs is removed at once, as before.

A stream reading the old store when it is set aside would go on to open the new store's
chunk files at the same paths; it remembers the directory it opened and fails at its
next group instead, naming the store (:mod:`pipeline.streaming.storeid`).
"""

from __future__ import annotations

import atexit
import glob
import json
import os
import sys
import threading
import uuid
import warnings
from shutil import rmtree
from typing import Any

from pipeline.errors import StoreError
from pipeline.storage.store import ATTRS_KEY

__all__ = ["ASIDE_INFIX", "Removal", "make_way", "wait_for_removals"]

#: What a set-aside store's name holds between its own name and a random hex suffix.
ASIDE_INFIX = ".replaced-"

#: Removal threads of this process not yet joined, and the directories they remove
#: (which a later write of the same store in this process must not take for ones a
#: killed run left: two threads removing one tree fail each other).
_LOCK = threading.Lock()
_THREADS: list[threading.Thread] = []
_BUSY: set[str] = set()


def _remove(paths: list[str]) -> None:
    """Remove ``paths`` (a thread's work); warn, naming each, about any left behind."""
    failed = []
    for path in paths:
        try:
            rmtree(path)
        except OSError as exc:
            failed.append((path, exc.strerror or str(exc)))
        finally:
            with _LOCK:
                _BUSY.discard(path)
    for path, why in failed:
        warnings.warn(f"{path}: the store this run replaced could not be removed ({why}); delete it by hand",
                      RuntimeWarning, stacklevel=2)


def _remove_in_background(paths: list[str]) -> None:
    """Start removing ``paths`` in a thread that :func:`wait_for_removals` joins.

    A daemon thread, joined by an exit handler rather than by the interpreter's own
    wait for non-daemon threads: ``pipeline``'s entry point ends the process without
    the interpreter's teardown only when no non-daemon thread is left
    (:func:`pipeline.cli.entry`), and its exit handlers still run."""
    if not paths:
        return
    with _LOCK:
        _BUSY.update(paths)
        thread = threading.Thread(target=_remove, args=(paths,), name="pipeline-remove-old-store", daemon=True)
        _THREADS.append(thread)
    thread.start()


def wait_for_removals() -> None:
    """Wait until every store this process replaced is removed (the process does so at
    its exit; a caller that measures the disk, or removes the folder, calls it first)."""
    while True:
        with _LOCK:
            if not _THREADS:
                return
            thread = _THREADS.pop(0)
        thread.join()


atexit.register(wait_for_removals)


def _is_complete(path: str) -> bool:
    """Whether the store at ``path`` is marked complete (its root ``zarr.json`` read
    directly: a store still being written, or none, is not)."""
    try:
        with open(os.path.join(path, "zarr.json"), encoding="utf-8") as f:
            meta = json.load(f).get("attributes", {}).get(ATTRS_KEY, {})
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(meta, dict) and meta.get("complete") is True


class Removal:
    """What one write of the store at ``store`` set aside: the store it replaces
    (``kept``, whole until :meth:`wait`) and what killed runs left (``left``)."""

    def __init__(self, store: str, kept: str | None, left: list[str]):
        self.store = store
        self.kept = kept
        self.left = left

    def wait(self, *, settled: bool = True) -> None:
        """The write is over (the writer calls this whether or not it raised): with the
        new store complete, start removing what was set aside; otherwise put the
        replaced store back where it was, set the partial new one aside for removal,
        and say so, naming the store.

        ``settled`` is False when the failed write could not confirm that none of its
        tasks still runs (:func:`pipeline.storage.inflight.settle`): one that did would
        write into the store put back, so the replaced store is then left aside, whole,
        and the warning (or error) names where it is.

        Raises
        ------
        StoreError
            In place of the writer's "cannot write" error (a full disk, a read-only
            directory), whose advice to rerun and resume no longer holds once the
            partial write is removed: the same cause, and what became of both stores.
        """
        if _is_complete(self.store):
            _remove_in_background(([self.kept] if self.kept else []) + self.left)
            return
        # Stores a killed run left aside stay until a write completes: one of them may
        # be the only complete copy, and the next write that completes removes them.
        if self.kept is None:
            return
        exc = sys.exc_info()[1]
        cause = exc.__cause__ if isinstance(exc, StoreError) else None
        if not settled:
            said = (f"tasks of its write may still be running, so the previous store is left whole at {self.kept}: "
                    f"once they have ended, move it back to {self.store}, or rerun to write the new one")
            if isinstance(cause, OSError):
                raise StoreError(f"{self.store}: cannot write ({cause.strerror or cause}); {said}") from cause
            warnings.warn(f"{self.store}: the new store was not completed; {said}", RuntimeWarning, stacklevel=2)
            return
        partial = None
        if os.path.lexists(self.store):
            partial = _aside_name(self.store)
            os.rename(self.store, partial)
        os.rename(self.kept, self.store)
        if partial is not None:
            _remove_in_background([partial])
        said = ("the previous store is back in place, as it was before this run, and the new one's partial write is "
                "being removed: rerun to write the new one again from the start")
        if isinstance(cause, OSError):
            raise StoreError(f"{self.store}: cannot write ({cause.strerror or cause}); {said}") from cause
        warnings.warn(f"{self.store}: the new store was not completed; {said}", RuntimeWarning, stacklevel=2)


def _aside_name(path: str) -> str:
    """A hidden sibling of ``path`` that only a store set aside is named like."""
    parent, name = os.path.split(path)
    return os.path.join(parent, "." + name + ASIDE_INFIX + uuid.uuid4().hex[:12])


def _left_aside(parent: str, name: str) -> list[str]:
    """Directories a killed run set aside when it replaced the store ``name`` (not
    those this process is removing)."""
    pattern = os.path.join(glob.escape(parent), glob.escape("." + name + ASIDE_INFIX) + "*")
    with _LOCK:
        busy = set(_BUSY)
    return [p for p in glob.glob(pattern) if os.path.isdir(p) and not os.path.islink(p) and p not in busy]


def _is_local(fs: Any) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocols


def make_way(fs: Any, root: str, *, replace: bool) -> Removal | None:
    """Clear the way for a write of the store at ``root`` (on fsspec filesystem ``fs``):
    with ``replace``, take the store there out of the way. A local directory is renamed
    to a hidden sibling and kept whole; the returned :class:`Removal`, waited for once
    the write is over, removes it with those a killed run set aside when the new store
    is complete, or puts it back when it is not. ``None`` when nothing was set aside.

    Removed at once, as before: an object store's objects (no rename), a link to a
    store (the link, never what it leads to: zarr cannot make a store through a link,
    and the new one is written in its place), and a directory that cannot be renamed
    (a mount point, say).
    """
    if not _is_local(fs):
        if replace:
            fs.rm(root, recursive=True)
        return None
    path = os.path.abspath(root).rstrip(os.sep)
    parent, name = os.path.split(path)
    left = _left_aside(parent, name)  # before the rename below adds one
    kept = None
    if replace and os.path.islink(path):
        fs.rm(root, recursive=True)
    elif replace:
        aside = _aside_name(path)
        try:
            os.rename(path, aside)
            kept = aside
        except OSError:
            rmtree(path)
    return Removal(path, kept, left) if kept or left else None
