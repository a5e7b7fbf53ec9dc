"""Ctrl+C and SIGTERM, on both sides of a launch: the exit codes (128 + the signal: 130, 143), the
signal names of the one line, and one catcher (``Signals``) with its two uses:

- workers: the loop's ``StepSignals`` stops at the next step boundary and saves. Before the loop
  runs (loading the model, the data) a stop has nothing to save: ``stop_on_sigterm`` turns SIGTERM
  into ``StopRequested`` so the run ends with the same one line and code instead of dying
  silently. A second Ctrl+C raises ``StopAtOnce``.
- launchers: ``LauncherSignals`` passes the first SIGINT/SIGTERM on to the workers, which stop and
  save; the launcher then ends with 128 + the signal it got. A second Ctrl+C kills every worker at
  once and says so.

What the output folder then holds is said by ``xtrain.train.failures.stopped_error``."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from xtrain.runtime.lifetime import STOP_GRACE_S, kill_process_tree

if TYPE_CHECKING:
    from types import FrameType

    # what ``signal.signal`` returns: the handler it replaced (SIG_DFL/SIG_IGN, ints; None: not
    # set from Python)
    Handler = Callable[[int, FrameType | None], object] | int | None


def exit_code(signum: int) -> int:
    """The shell's convention: 128 + signal number (Ctrl+C: 130, SIGTERM: 143)."""
    return 130 if signum == signal.SIGINT else 128 + int(signum)


def signal_name(signum: int) -> str:
    return "Ctrl+C" if signum == signal.SIGINT else signal.Signals(signum).name


class StopRequested(BaseException):
    """SIGTERM (or SIGINT) before the training loop took over the signals: nothing to save.
    A BaseException, like KeyboardInterrupt, so that no ``except Exception`` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class StopAtOnce(KeyboardInterrupt):
    """A second Ctrl+C: stop now without a stop checkpoint."""


class stop_on_sigterm:  # noqa: N801 (used as a context manager, like contextlib's)
    """SIGTERM raises ``StopRequested`` until the loop installs its own handlers (main thread)."""

    def __enter__(self) -> stop_on_sigterm:
        self._old: Handler = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum: int, frame: FrameType | None) -> None:
        raise StopRequested(signum)

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


class Signals:
    """SIGINT/SIGTERM caught while a block runs (handlers only in the main thread, restored on
    exit). The first signal is recorded in ``signum`` and passed to ``first``; later ones go to
    ``again``, which by default turns a second SIGINT into ``StopAtOnce``."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Handler] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum
            self.first(signum)
        else:
            self.again(signum)

    def first(self, signum: int) -> None:
        """The first signal (the subclass acts on it)."""

    def again(self, signum: int) -> None:
        if signum == signal.SIGINT:
            raise StopAtOnce()  # a KeyboardInterrupt: the second Ctrl+C stops at once

    def __enter__(self) -> Signals:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self._old[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()


class StepSignals(Signals):
    """In a worker's training loop: the loop reads ``signum`` at every step boundary, saves and
    stops (all ranks agree first); a second SIGINT stops at once."""


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

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        super().__exit__(*exc)
