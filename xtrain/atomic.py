"""Atomic file writes: the one writer behind every small file xtrain puts on disk.

Write to ``NAME.tmp`` in the same folder, flush and fsync, then ``os.replace`` onto the final
name: a reader sees the old file or the new one, never half of one. On Windows ``os.replace``
onto a file that another process holds open for a moment (antivirus, the search indexer,
TensorBoard) raises PermissionError (FIELD_NOTES): retried with a short backoff.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

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
