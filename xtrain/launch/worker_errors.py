"""How a worker's failure or stop comes back to the launcher: ``WorkerFailed`` (naming the rank),
``WorkerStopped``; the launchers' own exit logs are quieted so xtrain's one line is the report."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from xtrain.errors import XtrainError
from xtrain.runtime.report import Report, said
from xtrain.runtime.signals import exit_code, signal_name


class WorkerFailed(XtrainError):
    """A worker process failed. ``rank`` is its global rank, ``exit_code`` what it exited with,
    ``details`` the worker's traceback when one came back (the one-line message keeps only its
    last line), ``reports`` what the ranks reported (``xtrain.runtime.report``), lowest rank first."""

    def __init__(self, rank: int | None, exit_code: int, message: str, details: str = "") -> None:
        super().__init__(message, None, exit_code=exit_code if exit_code > 0 else 1)
        self.rank = rank
        self.worker_exit_code = exit_code
        self.details = details
        self.reports: list[Report] = []  # filled in by the launcher that named the report folder

    @property
    def failure_reports(self) -> list[Report]:
        """What the ranks reported about this failure. A rank that ended on a stop signal (the
        launcher stops the others once one rank fails: torch.multiprocessing and torchrun send
        SIGTERM) reports its stop, not the failure, so its report does not speak for it: when the
        failed rank itself left none (killed), the launcher names it."""
        stops = {exit_code(signal.SIGINT), exit_code(signal.SIGTERM)}
        return [r for r in self.reports if r.exit_code not in stops]

    @property
    def said(self) -> Report | None:
        """The report a rank printed itself about this failure (the launcher then repeats
        nothing), if any."""
        return said(self.failure_reports)


class WorkerStopped(WorkerFailed):
    """The launcher got SIGINT/SIGTERM and passed it on: the workers stopped (and saved, when
    the loop was running); ``at_once``: a second Ctrl+C killed them without saving."""

    def __init__(self, signum: int, at_once: bool = False) -> None:
        code = exit_code(signum)
        super().__init__(None, code, f"stopped on {signal_name(signum)}")
        self.exit_code = code
        self.signum = signum
        self.at_once = at_once

    @property
    def failure_reports(self) -> list[Report]:
        """A stop's reports are the ranks' stop lines (where the stop checkpoint is)."""
        return self.reports


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


@contextlib.contextmanager
def quiet_launcher_logs(prefix: str) -> Iterator[None]:
    """torchrun's agent and torch.multiprocessing log every worker exit and signal ("Sending
    process ... closing signal", "failed (exitcode: 2)") after the worker's own one-line error;
    xtrain reports failures itself, so those records are dropped while they run here."""
    import logging

    names = [n for n in logging.Logger.manager.loggerDict if n.startswith(prefix)]
    loggers = [logging.getLogger(n) for n in names]
    saved = [lg.disabled for lg in loggers]
    for lg in loggers:
        lg.disabled = True
    try:
        yield
    finally:
        for lg, was in zip(loggers, saved, strict=True):
            lg.disabled = was
