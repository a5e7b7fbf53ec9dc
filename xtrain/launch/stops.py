"""Stopping a run, launcher side: ``LauncherSignals`` passes the first SIGINT/SIGTERM on to the
workers, which stop and save; the launcher then ends with 128 + the signal it got. A second
Ctrl+C kills every worker at once and says so. ``read_outcome``: what rank 0 recorded (the worker
side, its signals, exit codes and one-line stop errors are ``xtrain.train.stops``).
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xtrain.launch.lifetime import STOP_GRACE_S, kill_process_tree
from xtrain.train.stops import OUTCOME_FILE, Signals, StopAtOnce


def read_outcome(folder: str | Path) -> dict[str, Any] | None:
    """Rank 0's one-line outcome (``xtrain.train.stops.record_outcome``), when it wrote one."""
    try:
        return json.loads((Path(folder) / OUTCOME_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


class LauncherSignals(Signals):
    """In a launcher, while workers run: the first SIGINT/SIGTERM goes to ``forward(signum)``
    (the workers stop at the next step and save); a second SIGINT kills every descendant at once
    and raises ``StopAtOnce``; workers still running ``grace_s`` after the first signal (a rank
    stuck in a collective) are killed."""

    def __init__(self, forward: Callable[[int], None], grace_s: float = STOP_GRACE_S) -> None:
        super().__init__()
        self.forward = forward
        self.grace_s = grace_s
        self.at_once = False
        self._timer: threading.Timer | None = None

    def first(self, signum: int) -> None:
        self._timer = threading.Timer(self.grace_s, kill_process_tree)
        self._timer.daemon = True
        self._timer.start()
        self.forward(signum)

    def again(self, signum: int) -> None:
        if signum != signal.SIGINT:
            return  # a repeated SIGTERM changes nothing: the workers are already stopping
        self.at_once = True
        kill_process_tree()
        raise StopAtOnce()

    def __exit__(self, *exc: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
        super().__exit__(*exc)
