"""A write lock per store, so two runs aimed at one output never interleave writes.

The lock is a sibling file ``<store>.lock`` created atomically (``O_CREAT | O_EXCL``)
holding the owner's host, pid and start time. A second writer fails at once with a
message naming the holder; a lock left by a process that no longer exists on this host
(a run killed with SIGKILL) is taken over, so a crash never blocks the resume. Object
stores have no atomic create-if-absent through fsspec: there the lock is not taken, and
the README says to run one writer per output.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
from typing import Iterator

from pipeline.errors import StoreLockedError
from pipeline.storage.store import is_remote

__all__ = ["write_lock"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


@contextlib.contextmanager
def write_lock(location: str) -> Iterator[None]:
    """Hold the write lock of a local store for the duration of the block.

    Raises
    ------
    StoreLockedError
        When another live process holds it.
    """
    if is_remote(location):
        yield
        return
    path = os.path.abspath(location).rstrip(os.sep) + ".lock"
    me = {"host": socket.gethostname(), "pid": os.getpid(),
          "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                with open(path, encoding="utf-8") as fh:
                    holder = json.load(fh)
            except (OSError, ValueError):
                holder = {}
            same_host = holder.get("host") == me["host"]
            if same_host and isinstance(holder.get("pid"), int) and not _alive(holder["pid"]):
                os.unlink(path)  # the holder died (SIGKILL, power loss): take over
                continue
            raise StoreLockedError(
                f"{location}: another run is writing this store (host {holder.get('host', '?')}, "
                f"pid {holder.get('pid', '?')}, since {holder.get('since', '?')}); wait for it to finish, "
                f"or delete {path} if that process is gone"
            ) from None
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(me, fh)
        break
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
