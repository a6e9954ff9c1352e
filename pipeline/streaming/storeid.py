"""Which directory a stream opened: a local store replaced under a reader is refused.

An overwrite (``output.overwrite``, ``pipeline.write(..., overwrite=True)``) renames the
old store's directory aside and writes the new one at the same path
(:mod:`pipeline.storage.replace`). A stream reads its chunk files by path: files it had
mapped still hold the old bytes, files it opens afterwards are the new store's, so its
batches would pair one store's ``x`` with the other's ``y`` without a word. A reader
must never serve such a mix, and the old store is removed moments later, so it cannot
keep reading it either: the stream remembers the directory it opened (its device and
inode, held by an open descriptor so that the inode number cannot be reused by another
directory meanwhile), and each group's reads are checked before they start and after
the last one ends. A path that names another directory now fails the group with a
:class:`~pipeline.errors.StreamError` that names the store and says to open the stream
again. Appends never replace the directory (they add files and rewrite files inside
it), so a stream keeps its version through them.
"""

from __future__ import annotations

import os
import weakref
from dataclasses import dataclass
from typing import Any

from pipeline.errors import StreamError
from pipeline.storage.store import local_path

__all__ = ["DirIdentity", "StoreGuard", "local_store_dir"]


@dataclass(frozen=True, slots=True)
class DirIdentity:
    """A directory as the kernel knows it: its host (an identity from another machine
    says nothing here), device and inode."""

    host: str
    dev: int
    ino: int


def local_store_dir(location: Any) -> str | None:
    """The absolute path of a store held in a local directory, or None for any other
    location (an object store, a zip file, an open group)."""
    loc = local_path(location)
    return os.path.abspath(loc) if loc is not None and os.path.isdir(loc) else None


def replaced_message(label: str) -> str:
    """What a stream says when its store's path names another directory now."""
    return (f"{label}: the store was replaced while this stream read it (an overwrite wrote a new store at this "
            "path, or is writing it, and the one the stream opened is being removed); its batches would mix "
            "the two stores' chunks. Open the stream again to read the new store")


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:  # pragma: no cover - closed already
        pass


class StoreGuard:
    """The directory of a local store as a stream opened it, checked cheaply later.

    Parameters
    ----------
    directory
        The store's directory (its absolute path).
    label
        The store, for error messages.
    expected
        The identity the stream's first opening recorded (a DataLoader worker opening
        the store again, a move to a newer version): the directory there now must be
        that one.

    Raises
    ------
    StreamError
        When ``expected`` is given, is of this host, and the directory is another one.
    """

    def __init__(self, directory: str, label: str, expected: DirIdentity | None = None):
        self.directory, self.label = directory, label
        # An open descriptor keeps the directory's inode allocated, even once it is
        # renamed aside and removed: no directory made later can have its number.
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:  # a directory one may search but not list: its identity only
            st = os.stat(directory)
        else:
            weakref.finalize(self, _close, fd)
            st = os.fstat(fd)
        self.identity = DirIdentity(os.uname().nodename, int(st.st_dev), int(st.st_ino))
        if expected is not None and expected.host == self.identity.host and expected != self.identity:
            raise StreamError(replaced_message(label))

    def check(self) -> None:
        """Raise :class:`~pipeline.errors.StreamError` when the store's path no longer
        names the directory this guard opened (one ``stat``).

        Raises
        ------
        StreamError
            When the store was replaced (or removed), naming it.
        """
        try:
            st = os.stat(self.directory)
        except OSError:
            raise StreamError(replaced_message(self.label)) from None
        if st.st_ino != self.identity.ino or st.st_dev != self.identity.dev:
            raise StreamError(replaced_message(self.label))
