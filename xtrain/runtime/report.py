"""What a worker tells xtrain's launcher about how it ended. Two files, one shape
(``message``, ``hint``, ``exit_code``):

- ``outcome.json`` in ``XTRAIN_REPORT_DIR`` (set by xtrain's launchers): rank 0's final one line,
  written after it printed it (``record_outcome``), so the launcher adds nothing, or says itself
  that no stop checkpoint was written (``read_outcome``).
- ``rank-N.json`` of ``python -m xtrain.run --processes N``'s spawned workers
  (``xtrain.run.spawned_worker``): any rank's error, printed once by the parent, lowest rank first.

They stay two: the first is written after rank 0 printed, the second instead of printing, by
every rank; one channel would change who prints what."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from xtrain.atomic import write_text
from xtrain.errors import XtrainError

REPORT_ENV = "XTRAIN_REPORT_DIR"


OUTCOME_FILE = "outcome.json"


def record_outcome(error: XtrainError, rank: int) -> None:
    """Rank 0 tells xtrain's launcher how it ended (the launcher prints nothing more then);
    ``rank``: this process's (its ``LaunchContext``)."""
    folder = os.environ.get(REPORT_ENV)
    if not folder or rank != 0:
        return
    data = {"message": error.message, "hint": error.hint, "exit_code": error.exit_code}
    with contextlib.suppress(OSError):  # the launcher then says it itself
        write_text(Path(folder) / OUTCOME_FILE, json.dumps(data))


def read_outcome(folder: str | Path) -> dict[str, Any] | None:
    """Rank 0's one-line outcome (``xtrain.runtime.report.record_outcome``), when it wrote one."""
    try:
        return json.loads((Path(folder) / OUTCOME_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
