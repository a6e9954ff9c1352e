"""Overwriting a local store: the old one set aside in one rename, removed while the new
one is written.

Removing a store file by file takes seconds (a demo build at stride 1 holds 9,000 files
and directories; measured in benchmarks/README.md), and an overwrite used to spend them
in the run's wall time, after the statistics pass and before the first write. Now
the old directory is renamed to a hidden sibling, which is atomic and instant, and a
thread removes it while the workers write the new store; the write waits for that
thread before it returns, so nothing is left behind by a run that finishes.

The old store is set aside only where it used to be removed: after the input is
checked, so bad input still leaves it whole. Siblings that a killed run left set aside
(``.<name>.replaced-<hex>``, a name nothing else makes) are removed by the next write
of the same store, an overwrite or the resumed run. Object stores have no rename: theirs
is removed at once, as before.

A stream reading the old store when it is set aside would go on to open the new store's
chunk files at the same paths; it remembers the directory it opened and fails at its
next group instead, naming the store (:mod:`pipeline.streaming.storeid`).
"""

from __future__ import annotations

import glob
import os
import threading
import uuid
import warnings
from shutil import rmtree
from typing import Any

__all__ = ["ASIDE_INFIX", "Removal", "make_way"]

#: What a set-aside store's name holds between its own name and a random hex suffix.
ASIDE_INFIX = ".replaced-"


class Removal:
    """Directories being removed by a background thread; :meth:`wait` joins it."""

    def __init__(self, paths: list[str]):
        self.paths = paths
        self.failed: list[tuple[str, str]] = []
        self._thread = threading.Thread(target=self._run, name="pipeline-remove-old-store", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for path in self.paths:
            try:
                rmtree(path)
            except OSError as exc:
                self.failed.append((path, exc.strerror or str(exc)))

    def wait(self) -> None:
        """Wait for the removal; warn, naming each directory, about any left behind."""
        self._thread.join()
        for path, why in self.failed:
            warnings.warn(f"{path}: the store this run replaced could not be removed ({why}); "
                          "delete it by hand", RuntimeWarning, stacklevel=2)


def _left_aside(parent: str, name: str) -> list[str]:
    """Directories a killed run set aside when it replaced the store ``name``."""
    pattern = os.path.join(glob.escape(parent), glob.escape("." + name + ASIDE_INFIX) + "*")
    return [p for p in glob.glob(pattern) if os.path.isdir(p) and not os.path.islink(p)]


def _is_local(fs: Any) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return "file" in protocols


def make_way(fs: Any, root: str, *, replace: bool) -> Removal | None:
    """Clear the way for a write of the store at ``root`` (on fsspec filesystem ``fs``):
    start removing what a killed run set aside there and, with ``replace``, take the
    store there out of the way first. A local directory is renamed to a hidden sibling
    and removed with those in the background (the returned :class:`Removal`, to be
    waited for once the new store is written); ``None`` when nothing is being removed.

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
    doomed = _left_aside(parent, name)  # before the rename below adds one
    if replace and os.path.islink(path):
        fs.rm(root, recursive=True)
    elif replace:
        aside = os.path.join(parent, "." + name + ASIDE_INFIX + uuid.uuid4().hex[:12])
        try:
            os.rename(path, aside)
            doomed.append(aside)
        except OSError:
            rmtree(path)
    return Removal(doomed) if doomed else None
