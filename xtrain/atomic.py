"""Atomic file writes, and the one line when the filesystem refuses a write.

Write to ``NAME.tmp`` in the same folder, flush and fsync, then ``os.replace`` onto the final
name: a reader sees the old file or the new one, never half of one. On Windows ``os.replace``
onto a file that another process holds open for a moment (antivirus, the search indexer,
TensorBoard) raises PermissionError (FIELD_NOTES): retried with a short backoff.

Every place xtrain writes is a ``Place`` (what it is, and the variable or key that moves it);
``writing(place, path)`` turns the filesystem refusing a write there (read-only, full, no
permission: ``disk_fault``, in Python's, safetensors' and torch's words) into ``CannotWrite``:
one line naming the place and what moves it, exit 2. ``PLACES`` lists them all
(tests/test_write_places.py checks each).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from xtrain.errors import XtrainError

RETRY_DELAYS_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)  # ~3 s in all before giving up


def replace(src: str | Path, dst: str | Path) -> None:
    """``os.replace`` that waits out a Windows sharing violation (PermissionError)."""
    for delay in (*RETRY_DELAYS_S, None):
        try:
            os.replace(src, dst)
            return
        except PermissionError:
            if delay is None or sys.platform != "win32":
                raise
            time.sleep(delay)


def write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def write_text(path: str | Path, text: str) -> Path:
    return write_bytes(path, text.encode("utf-8"))


# --------------------------------------------------------------------------------------------
# The filesystem refusing a write

# errno -> the words of the one line
WRITE_FAULTS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EACCES: "permission denied",
    errno.EPERM: "permission denied",
    errno.EROFS: "the file system is read-only",
    errno.EIO: "an I/O error",
    errno.EFBIG: "the file is too large for the file system",
}
# libraries that report an OS error in their own words (safetensors' Rust "os error N", torch's
# stream writer); Windows' wording for a full disk ("There is not enough space on the disk")
_PATTERNS = (
    (re.compile(r"os error (\d+)"), None),
    (re.compile(r"no space left|not enough space on the disk", re.I), errno.ENOSPC),
    (re.compile(r"quota exceeded", re.I), errno.EDQUOT),
    (re.compile(r"permission denied|access is denied", re.I), errno.EACCES),
    (re.compile(r"read-only file system", re.I), errno.EROFS),
    (re.compile(r"file write failed|unexpected pos|PytorchStreamWriter failed", re.I), errno.EIO),
)


def _reason(e: BaseException) -> str | None:
    if isinstance(e, OSError) and e.errno in WRITE_FAULTS:
        return WRITE_FAULTS[e.errno]
    if isinstance(e, OSError) and e.errno is not None:
        return None  # another OS error (a missing file, ...): not a write fault of the disk
    text = str(e)
    for pattern, code in _PATTERNS:
        found = pattern.search(text)
        if found is None:
            continue
        if code is None:  # "os error N": the errno itself
            code = int(found.group(1))
            if code not in WRITE_FAULTS:
                continue
        return WRITE_FAULTS[code]
    return None


def _faults(e: BaseException) -> Iterator[BaseException]:
    """``e`` and what it was raised from, until an XtrainError (already said)."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen and not isinstance(cur, XtrainError):
        seen.add(id(cur))
        yield cur
        cur = cur.__cause__ or cur.__context__


def disk_fault(e: BaseException) -> str | None:
    """What the filesystem did, when ``e`` (or what it was raised from) is a failed write;
    None for any other error."""
    return next((r for cur in _faults(e) if (r := _reason(cur)) is not None), None)


@dataclass(frozen=True)
class Place:
    """A place xtrain writes to, and what moves it: an environment variable (``XTRAIN_CACHE``),
    a config key (``run.output_dir``) or a command's option (``--output``)."""

    what: str
    moved_by: str

    def fix(self, reason: str) -> str:
        if "space" in reason or "quota" in reason or "large" in reason:
            return f"make room on that disk, or set {self.moved_by} to a folder on another one"
        return f"set {self.moved_by} to a writable folder"


BUILTIN_CACHE = Place("the built-in models and data cache", "XTRAIN_CACHE")
UTF8_COPIES = Place("the UTF-8 copies of data files", "XTRAIN_CACHE")
DATASETS_CACHE = Place("the datasets cache", "HF_DATASETS_CACHE (or HF_HOME)")
HUB_CACHE = Place("the Hugging Face hub cache", "HF_HUB_CACHE (or HF_HOME)")
OUTPUT_DIR = Place("the run's output folder", "run.output_dir")
REPORT_DIR = Place("the workers' report folder", "TMPDIR (TEMP on Windows)")
TEMP_DIR = Place("the temporary folder", "TMPDIR (TEMP on Windows)")
PLACES = (BUILTIN_CACHE, UTF8_COPIES, DATASETS_CACHE, HUB_CACHE, OUTPUT_DIR, REPORT_DIR, TEMP_DIR)


class CannotWrite(XtrainError):
    """The filesystem refused a write at a ``Place``: one line naming it and what moves it."""

    def __init__(self, place: Place, path: str | Path, reason: str) -> None:
        super().__init__(f"cannot write {place.what} at {path}: {reason}", place.fix(reason))
        self.place, self.path, self.reason = place, Path(path), reason


def _concerns(e: BaseException, path: Path) -> bool:
    """Whether the failed call was about ``path``: a file in it or a folder above it (mkdir of a
    parent), or no file named (a write that ran out of room)."""
    for cur in _faults(e):
        name = getattr(cur, "filename", None)
        if isinstance(cur, OSError) and name:
            failed = os.path.abspath(os.fsdecode(name))
            where = os.path.abspath(path)
            return os.path.commonpath([failed, where]) in (failed, where)
    return True


@contextlib.contextmanager
def writing(place: Place, path: str | Path) -> Iterator[None]:
    """The block writes to ``place`` at ``path``: the filesystem refusing one of its writes there
    is ``CannotWrite``. Cleaning up a partial write stays the block's own (it runs first)."""
    try:
        yield
    except XtrainError:
        raise
    except Exception as e:
        refused = cannot_write(place, path, e)
        if refused is None:
            raise
        raise refused from None


def cannot_write(place: Place, path: str | Path, e: BaseException) -> CannotWrite | None:
    """``e`` as the one line of ``place`` when it is the filesystem refusing a write at ``path``
    (``writing``'s rule, for code that catches the error itself); else None."""
    reason = disk_fault(e)
    if reason is None or not _concerns(e, Path(path)):
        return None
    return CannotWrite(place, path, reason)


def temporary_folder(prefix: str, place: Place = TEMP_DIR) -> tempfile.TemporaryDirectory[str]:
    """``tempfile.TemporaryDirectory(prefix=...)``; no writable temporary folder is one line.
    (tempfile tries TMPDIR, TEMP, TMP, the system's and the current folder in turn, and says
    FileNotFoundError when none of them takes a file.)"""
    try:
        return tempfile.TemporaryDirectory(prefix=prefix)
    except FileNotFoundError:
        tried = os.environ.get("TMPDIR") or os.environ.get("TEMP") or "the system's temporary folder"
        raise CannotWrite(place, tried, "no candidate temporary folder takes a file") from None
    except OSError as e:
        reason = disk_fault(e)
        if reason is None:
            raise
        where = Path(os.fsdecode(e.filename)).parent if e.filename else tempfile.gettempdir()
        raise CannotWrite(place, where, reason) from None
