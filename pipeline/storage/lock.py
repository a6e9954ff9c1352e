"""A write lock per store, so two runs aimed at one output never interleave writes.

The lock is a sibling file ``<store>.lock`` created atomically (``O_CREAT | O_EXCL``)
holding the owner's host, pid, start time, the process's start in clock ticks since
boot and the boot's id. A second writer fails at once with a message naming the holder.
A lock is taken over, so that a crash never blocks the resume, when its holder is gone
from this host: no process has its pid; the process that has it started at another
time, or under another boot (the pid was reused); or the pid is this process's own,
which has not taken the lock (a container's main process is PID 1, and so is the same
command restarted after a SIGKILL, on the same hostname). Object stores have no atomic
create-if-absent through fsspec: there the lock is not taken, and the README says to
run one writer per output.

The lock is re-entrant within a process: ``pipeline run`` takes it before its cluster
starts, and the writer it calls takes it again.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
import threading
from typing import Any, Iterator

from pipeline.errors import StoreError, StoreLockedError
from pipeline.storage.store import is_remote

__all__ = ["holder_is_gone", "lock_path", "process_start", "write_lock"]

#: Lock files this process holds, with how many blocks hold each (re-entrance).
_HELD: dict[str, int] = {}
_HELD_GUARD = threading.Lock()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def process_start(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``
    field 22); ``None`` where there is no such process or no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': the
    # fields after its last ')' start at field 3.
    fields = stat.rpartition(b")")[2].split()
    try:
        return int(fields[22 - 3])
    except (IndexError, ValueError):
        return None


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def holder_is_gone(holder: dict[str, Any], *, host: str, pid: int, boot: str | None,
                   start_of: Any = process_start, alive: Any = _alive) -> bool:
    """Whether the process a lock file names (``holder``, as :func:`write_lock` writes
    it) is gone, judged from the process ``pid`` on ``host`` under boot ``boot``.

    A holder on another host is never judged gone: its processes cannot be seen from
    here. ``start_of`` and ``alive`` look a process up (its start in clock ticks, or
    ``None``; whether it exists).
    """
    if holder.get("host") != host or not isinstance(holder.get("pid"), int):
        return False
    other = holder["pid"]
    if other == pid:  # our own pid, and we have not taken the lock: a restart reused it
        return True
    if boot is not None and isinstance(holder.get("boot"), str) and holder["boot"] != boot:
        return True  # the machine restarted since: no process of that boot is left
    if not alive(other):
        return True
    start = holder.get("start")
    now = start_of(other)
    # Another process got the pid since (a locks' start recorded, and it differs).
    return isinstance(start, int) and now is not None and now != start


def lock_path(location: str) -> str:
    """The lock file of the local store ``location``: ``<store>.lock`` beside it."""
    return os.path.abspath(location).rstrip(os.sep) + ".lock"


def _held(path: str, step: int) -> bool:
    """Count this process's hold of ``path`` up (``step`` 1; returns whether it held it
    already) or down (``step`` -1; returns whether it still holds it)."""
    with _HELD_GUARD:
        before = _HELD.get(path, 0)
        after = before + step
        if after > 0:
            _HELD[path] = after
        else:
            _HELD.pop(path, None)
        return before > 0 if step > 0 else after > 0


@contextlib.contextmanager
def write_lock(location: str) -> Iterator[None]:
    """Hold the write lock of a local store for the duration of the block (re-entrant:
    a block inside another of the same process holds it already).

    Raises
    ------
    StoreLockedError
        When another live process holds it.
    StoreError
        When the lock file cannot be created (a read-only or full disk).
    """
    if is_remote(location):
        yield
        return
    path = lock_path(location)
    if _held(path, 1):
        try:
            yield
        finally:
            _held(path, -1)
        return
    try:
        _take(location, path)
    except BaseException:
        _held(path, -1)
        raise
    try:
        yield
    finally:
        if not _held(path, -1):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _take(location: str, path: str) -> None:
    """Create the lock file ``path`` of ``location``, taking over a stale one."""
    me = {"host": socket.gethostname(), "pid": os.getpid(),
          "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
          "start": process_start(os.getpid()), "boot": _boot_id()}
    try:
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
                if not isinstance(holder, dict):
                    holder = {}
                if holder_is_gone(holder, host=me["host"], pid=me["pid"], boot=me["boot"]):
                    # The holder died (SIGKILL, OOM kill, power loss): take over.
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                    continue
                raise StoreLockedError(
                    f"{location}: another run is writing this store (host {holder.get('host', '?')}, "
                    f"pid {holder.get('pid', '?')}, since {holder.get('since', '?')}); wait for it to finish, "
                    f"or delete {path} if that process is gone"
                ) from None
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(me, fh)
            return
    except OSError as exc:  # the output's folder is read-only, full, or not ours
        raise StoreError(f"{location}: cannot write ({exc.strerror or exc})") from exc
    raise StoreLockedError(f"{location}: could not take the write lock {path}: another run took it meanwhile")
