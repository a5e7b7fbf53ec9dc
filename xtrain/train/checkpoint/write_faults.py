"""The filesystem failing under a write (disk full, quota, permission lost, read-only, I/O error):
recognised whatever library was writing, and turned into one line that names what was being
written, says the partial write is gone and what is still intact.

torch, safetensors and Python each report the same fault their own way (measured on a full
tmpfs): Python ``OSError(errno=ENOSPC)``; safetensors ``SafetensorError("Error while
serializing: I/O error: No space left on device (os error 28)")``; torch.save ``RuntimeError``
("PytorchStreamWriter failed writing file ...: file write failed", "unexpected pos ..."). The
reason is read from the errno where there is one, else from the message (``xtrain.atomic``'s
``disk_fault``, which every place xtrain writes shares).
"""

from __future__ import annotations

from pathlib import Path

from xtrain.atomic import disk_fault
from xtrain.errors import XtrainError

__all__ = ["WriteFailed", "disk_fault", "resume_hint"]  # disk_fault: xtrain.atomic's, the one recogniser


class WriteFailed(XtrainError):
    """A write of the run failed for the filesystem: exit 2, as every place xtrain writes
    (``xtrain.atomic.CannotWrite``); the hint names run.output_dir, which moves it."""

    def __init__(self, what: str, where: Path, reason: str, intact: str, fix: str) -> None:
        super().__init__(
            f"could not write {what} to {where}: {reason}; the partial write was removed, {intact}",
            fix,
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
