"""One run per output folder: an OS-level lock held for the run's lifetime.

``output_dir/.xtrain-run.lock`` is locked with the OS's own advisory lock (``fcntl.flock`` on
POSIX, ``msvcrt.locking`` on Windows) by the main process of a run, before anything is read or
written, and holds ``{"pid", "host", "started"}`` of its holder. The OS drops the lock when the
holder dies in any way (SIGKILL, power cut of the process): a lock file left by a killed run is
stale by construction and the next run takes it over. A second run while the first is alive
fails at once with one line naming the running process, having changed nothing (the file is
opened without truncation; only the holder writes to it).

The file is removed when the run ends. Removing a lock file races with a third process that
opened it just before; after locking, the holder checks that the path still names the file it
locked, and tries again if not.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from xtrain import atomic
from xtrain.errors import XtrainError

LOCK_NAME = ".xtrain-run.lock"
_WIN_LOCK_OFFSET = 1 << 30  # Windows locks are mandatory: lock a byte far past the holder info


class RunLock:
    """A held lock; ``release()`` (idempotent) removes the file and unlocks it."""

    def __init__(self, path: Path, fd: int, created_dir: bool = False) -> None:
        self.path = path
        self._fd: int | None = fd
        self._created_dir = created_dir  # removed again when the run leaves it empty

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()  # before unlocking: a waiting run then finds a fresh file
        with contextlib.suppress(OSError):
            _unlock(fd)
        os.close(fd)
        if self._created_dir:  # a run refused before writing anything leaves no empty folder
            with contextlib.suppress(OSError):
                self.path.parent.rmdir()

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try_lock(fd: int) -> bool:
    if os.name == "nt":
        import msvcrt

        os.lseek(fd, _WIN_LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _unlock(fd: int) -> None:
    if os.name == "nt":
        import msvcrt

        os.lseek(fd, _WIN_LOCK_OFFSET, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
    else:
        import fcntl

        fcntl.flock(fd, fcntl.LOCK_UN)


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def holder(path: Path) -> dict[str, Any]:
    """What the lock file says about its holder ({} when unreadable)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def live_holder(output_dir: str | Path) -> dict[str, Any] | None:
    """The holder of ``output_dir``'s lock while it runs, read without touching the lock (taking
    it, even for a moment, could refuse a run starting just then): the file's holder info when
    its process is alive on this machine and started no later than it took the lock (not a new
    process that got its number); a holder on another machine is taken as alive. None: no run."""
    path = Path(output_dir).expanduser() / LOCK_NAME
    who = holder(path) if path.is_file() else {}
    pid = who.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    if who.get("host") not in (None, socket.gethostname()):
        return who
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        created = proc.create_time()
    except (psutil.Error, OSError):
        return None
    try:
        took = time.mktime(time.strptime(str(who.get("started")), "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        return who
    return who if created <= took + 2 else None  # (the file's time has whole seconds)


def acquire(output_dir: str | Path) -> RunLock:
    """Lock ``output_dir`` for this run (created if missing); raises XtrainError naming the
    running process when another run holds it."""
    out = Path(output_dir).expanduser()
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # read-only or full: atomic.OUTPUT_DIR's line
        raise atomic.cannot_write(atomic.OUTPUT_DIR, out, e) or XtrainError(
            f"cannot create run.output_dir {out}: {e.strerror or e}", "choose a writable run.output_dir"
        ) from None
    path = out / LOCK_NAME
    for _ in range(20):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
        except OSError as e:
            raise atomic.cannot_write(atomic.OUTPUT_DIR, out, e) or XtrainError(
                f"cannot write in run.output_dir {out}: {e.strerror or e}", "choose a writable run.output_dir"
            ) from None
        if not _try_lock(fd):
            os.close(fd)
            who = holder(path)
            pid, host = who.get("pid", "?"), who.get("host") or "this machine"
            since = f", started {who['started']}" if who.get("started") else ""
            raise XtrainError(
                f"run.output_dir {out} is in use by another run (PID {pid} on {host}{since})",
                "wait for it to end, stop it, or choose another run.output_dir",
            )
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder removed the file as we opened it: lock the new one
    else:  # pragma: no cover - only under a storm of runs on one folder
        raise XtrainError(f"could not lock run.output_dir {out}", "try again")
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(info).encode("utf-8"))
    except OSError as e:  # a full disk: the lock file goes again, the folder as it was
        os.close(fd)
        with contextlib.suppress(OSError):
            path.unlink()
            if created:
                out.rmdir()
        if refused := atomic.cannot_write(atomic.OUTPUT_DIR, out, e):
            raise refused from None
        raise
    return RunLock(path, fd, created)


@contextlib.contextmanager
def waiting(path: Path, poll_s: float = 0.5) -> Iterator[None]:
    """Hold the OS lock of the file ``path`` (created if missing, never removed), waiting while
    another process holds it: work that one process does while the others wait for its result
    (a trained built-in, ``xtrain.train.builtin_stages``). A holder that dies frees it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o644)
    try:
        while not _try_lock(fd):
            time.sleep(poll_s)
        try:
            yield
        finally:
            _unlock(fd)
    finally:
        os.close(fd)
