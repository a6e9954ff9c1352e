"""A write lock per store, so two runs aimed at one output never interleave writes.

The lock is a sibling file ``<store>.lock`` holding the owner's host, pid, start time,
the process's start in clock ticks since boot and the boot's id. It is created atomically
and whole: the holder is written to a temporary file beside it and hard-linked into
place, so a full disk or a crash never leaves a lock without its holder. A second writer
fails at once with a message naming the holder. A lock is taken over, with a warning
naming the old holder, so that a crash never blocks the resume, when its holder is gone
from this host: no process has its pid; the process that has it started at another
time, or under another boot (the pid was reused); or the pid is this process's own,
which has not taken the lock (a container's main process is PID 1, and so is the same
command restarted after a SIGKILL, on the same hostname). A lock file that names no
holder (empty or unparsable: left by an older version on a full disk, or being created
on a filesystem without hard links) is taken over once it is
:data:`NO_HOLDER_GRACE_S` seconds old. Object stores have no atomic create-if-absent
through fsspec: there the lock is not taken, and the README says to run one writer per
output.

The lock is re-entrant within a process: ``pipeline run`` takes it before its cluster
starts, and the writer it calls takes it again.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import os
import socket
import threading
import time
import uuid
import warnings
from typing import Any, Iterator, Mapping

from pipeline.errors import StoreError, StoreLockedError
from pipeline.storage.store import is_remote

__all__ = ["NO_HOLDER_GRACE_S", "holder_is_gone", "lock_path", "names_a_holder", "process_start", "write_lock"]

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


#: A lock file naming no holder (empty or unparsable) younger than this is taken to be
#: one a run is still creating (a filesystem without hard links writes the holder after
#: creating the file); an older one was left by a run that could not write its holder.
NO_HOLDER_GRACE_S = 30.0


def _holder_of(path: str) -> tuple[dict[str, Any], os.stat_result | None]:
    """The holder a lock file names (``{}`` for an empty or unparsable one) and the file's
    stat (``None`` when it is gone meanwhile)."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            raw = fh.read()
    except FileNotFoundError:
        return {}, None
    except PermissionError as exc:  # another user's lock: it cannot be judged from here
        raise StoreLockedError(f"{path}: a write lock this user cannot read ({exc.strerror}): another user's run "
                               "may be writing the store; ask them, or delete the file if no run is") from exc
    try:
        holder = json.loads(raw.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError: a torn or empty file
        holder = {}
    return (holder if isinstance(holder, dict) else {}), st


def names_a_holder(holder: Mapping[str, Any]) -> bool:
    """Whether a lock file's content names the process that holds it (a host and a pid)."""
    return isinstance(holder.get("host"), str) and isinstance(holder.get("pid"), int)


def _write_holder(path: str, me: Mapping[str, Any]) -> bool:
    """Create the lock file ``path`` holding ``me``, whole or not at all; ``False`` when
    a lock file is there already.

    The holder is written to a temporary file beside it, flushed to disk, and hard-linked
    into place: ``link`` fails if the name exists, as ``O_EXCL`` does, and a lock never
    exists without its holder (a full disk fails the temporary file's write, which is
    removed; a crash leaves at most the temporary file). Where the filesystem has no hard
    links, the lock is created with ``O_EXCL`` and removed again when its holder cannot
    be written.
    """
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    data = json.dumps(dict(me)).encode("utf-8")
    try:
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)  # the content on disk before its name: a power loss leaves no empty lock
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
        return _create_excl(path, data)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


#: ``link`` errors of a filesystem without hard links (FAT, some FUSE and network mounts).
_NO_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EMLINK, errno.ENOSYS})


def _create_excl(path: str, data: bytes) -> bool:
    """``path`` created with ``O_EXCL`` and ``data`` written to it, or removed again when
    writing fails; ``False`` when it exists."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    return True


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data``: a write near a full disk or a file-size limit may
    write part of it, and only the next one fails."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _unlink_if_same(path: str, st: os.stat_result) -> None:
    """Remove the lock file ``path`` if it is still the file ``st`` describes: another run
    that took the stale lock over meanwhile has put its own file there, which stays."""
    with contextlib.suppress(FileNotFoundError):
        now = os.stat(path)
        if (now.st_dev, now.st_ino, now.st_mtime_ns) == (st.st_dev, st.st_ino, st.st_mtime_ns):
            os.unlink(path)


def _take(location: str, path: str) -> None:
    """Create the lock file ``path`` of ``location``, taking over a stale one."""
    me = {"host": socket.gethostname(), "pid": os.getpid(),
          "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
          "start": process_start(os.getpid()), "boot": _boot_id()}
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        for _ in range(3):
            if _write_holder(path, me):
                return
            holder, st = _holder_of(path)
            if st is None:
                continue  # released meanwhile: try again
            if not names_a_holder(holder):
                age = time.time() - st.st_mtime
                if age < NO_HOLDER_GRACE_S:
                    raise StoreLockedError(
                        f"{location}: the lock file {path} names no holder yet (written {max(age, 0):.0f} s ago): "
                        f"another run is taking it, or one failed to write it; rerun in {NO_HOLDER_GRACE_S:.0f} s, "
                        "when a lock without a holder is taken over")
                warnings.warn(f"{location}: taking over the write lock {path}, which names no holder (empty or "
                              f"unreadable, last written {_when(st.st_mtime)}): left by a run that could not "
                              "write it, a full disk for example", stacklevel=4)
                _unlink_if_same(path, st)
                continue
            if holder_is_gone(holder, host=me["host"], pid=me["pid"], boot=me["boot"]):
                # The holder died (SIGKILL, OOM kill, power loss): take over.
                warnings.warn(f"{location}: taking over the write lock {path} of pid {holder['pid']} on "
                              f"{holder['host']} (since {holder.get('since', '?')}): that process is gone",
                              stacklevel=4)
                _unlink_if_same(path, st)
                continue
            raise StoreLockedError(
                f"{location}: another run is writing this store (host {holder.get('host', '?')}, "
                f"pid {holder.get('pid', '?')}, since {holder.get('since', '?')}); wait for it to finish, "
                f"or delete {path} if that process is gone"
            )
    except OSError as exc:  # the output's folder is read-only, full, or not ours
        raise StoreError(f"{location}: cannot write ({exc.strerror or exc})") from exc
    raise StoreLockedError(f"{location}: could not take the write lock {path}: another run took it meanwhile")


def _when(mtime: float) -> str:
    return _dt.datetime.fromtimestamp(mtime, _dt.timezone.utc).isoformat(timespec="seconds")
