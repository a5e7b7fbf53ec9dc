"""The filesystem failing under a write (disk full, quota, permission lost, read-only, I/O error):
recognised whatever library was writing, and turned into one line that names what was being
written, says the partial write is gone and what is still intact.

torch, safetensors and Python each report the same fault their own way (measured on a full
tmpfs): Python ``OSError(errno=ENOSPC)``; safetensors ``SafetensorError("Error while
serializing: I/O error: No space left on device (os error 28)")``; torch.save ``RuntimeError``
("PytorchStreamWriter failed writing file ...: file write failed", "unexpected pos ..."). The
reason is read from the errno where there is one, else from the message.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

from xtrain.errors import XtrainError

# errno -> the words of the one line
_ERRNOS = {
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
    if isinstance(e, OSError) and e.errno in _ERRNOS:
        return _ERRNOS[e.errno]
    if isinstance(e, OSError) and e.errno is not None:
        return None  # another OS error (a missing file, ...): not a write fault of the disk
    text = str(e)
    for pattern, code in _PATTERNS:
        found = pattern.search(text)
        if found is None:
            continue
        if code is None:  # "os error N": the errno itself
            code = int(found.group(1))
            if code not in _ERRNOS:
                continue
        return _ERRNOS[code]
    return None


def disk_fault(e: BaseException) -> str | None:
    """What the filesystem did, when ``e`` (or what it was raised from) is a failed write;
    None for any other error."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, XtrainError):
            return None
        reason = _reason(cur)
        if reason is not None:
            return reason
        cur = cur.__cause__ or cur.__context__
    return None


class WriteFailed(XtrainError):
    """A write of the run failed for the filesystem: exit 1 (the run failed, the input was fine)."""

    def __init__(self, what: str, where: Path, reason: str, intact: str, fix: str) -> None:
        super().__init__(
            f"could not write {what} to {where}: {reason}; the partial write was removed, {intact}",
            fix,
            exit_code=1,
        )


def resume_hint(folder: Path, reason: str) -> str:
    """What to do: make room (or write access), then the same command continues."""
    first = (
        "make room on that disk"
        if "space" in reason or "quota" in reason or "large" in reason
        else (f"restore write access to {folder}")
    )
    return (
        f"{first} (or point run.output_dir elsewhere), then run the same command again: "
        "run.resume=auto continues from the last complete checkpoint"
    )
