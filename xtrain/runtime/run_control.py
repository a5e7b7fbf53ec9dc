"""What passes between a run and whoever watches it through its output folder, in files only (a
page, a studio restarted since, another shell): a stop request and the run's end record.

- ``STOP_REQUEST``: asking a run to stop as Ctrl+C stops it (a checkpoint, then the stop). The
  training loop's main process reads it at every step boundary (one ``stat``), passes it to the
  other ranks as a stop signal, and removes it once the stop checkpoint is saved. A file, not a
  signal: a detached process on Windows cannot be sent Ctrl+C. A request older than the run's
  own start (left by a run killed before it could honour it) is removed unread.
- ``END_RECORD``: how the last launch of the run ended (its exit code, its one line, when),
  written by ``xtrain train`` where it turns the workers' ending into its exit code
  (``commands.launching.launch_training``), so a run started from a shell records it too.

Signals stay as they are (``runtime.signals``); these files add a way in, never replace one.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from xtrain import atomic

STOP_REQUEST = ".xtrain-stop"  # {"requested": epoch seconds, "by": who asked}
END_RECORD = "run_end.json"  # RunEnd as a dict


def request_stop(out: str | Path, by: str = "xtrain studio") -> Path:
    """Ask the run in ``out`` to stop at its next step boundary (after a checkpoint)."""
    text = json.dumps({"requested": time.time(), "by": by, "host": socket.gethostname()})
    return atomic.write_text(Path(out) / STOP_REQUEST, text)


def stop_requested(out: str | Path, since: float) -> bool:
    """Whether a stop was asked for the run in ``out`` since ``since`` (epoch seconds: this run's
    start). An older request is removed: it was meant for a run that is gone."""
    path = Path(out) / STOP_REQUEST
    try:
        asked = path.stat().st_mtime
    except OSError:
        return False
    if asked >= since - 1.0:  # (file times are coarse on some file systems)
        return True
    clear_stop(out)
    return False


def clear_stop(out: str | Path) -> None:
    """The request honoured (or stale): removed."""
    with contextlib.suppress(OSError):
        (Path(out) / STOP_REQUEST).unlink()


def stop_pending(out: str | Path) -> bool:
    return (Path(out) / STOP_REQUEST).is_file()


@dataclass(frozen=True)
class RunEnd:
    """How a launch of the run ended: ``exit_code`` (0 finished, 130/143 stopped, else failed),
    ``line``: its one line (empty when it finished), ``ended``: epoch seconds."""

    exit_code: int
    line: str = ""
    ended: float = 0.0
    pid: int = 0

    @property
    def stopped(self) -> bool:
        return self.exit_code in (130, 143)


def write_end(out: str | Path | None, exit_code: int, line: str = "") -> None:
    """The end record of the launch that just ended (nothing when ``out`` is not a folder: a run
    refused before it made one). Never fails the command: the exit code is the truth either way."""
    if not out or not Path(out).is_dir():
        return
    end = RunEnd(int(exit_code), line.strip(), time.time(), os.getpid())
    with contextlib.suppress(OSError):
        atomic.write_text(Path(out) / END_RECORD, json.dumps(asdict(end), ensure_ascii=False))


def read_end(out: str | Path) -> RunEnd | None:
    """The end record in ``out`` (None: none, or not one of ours)."""
    try:
        data: Any = json.loads((Path(out) / END_RECORD).read_text(encoding="utf-8"))
        return RunEnd(int(data["exit_code"]), str(data.get("line") or ""), float(data.get("ended") or 0),
                      int(data.get("pid") or 0))  # fmt: skip
    except (OSError, ValueError, TypeError, KeyError):
        return None
