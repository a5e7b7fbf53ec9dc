"""Why a run stops before its last step: Ctrl+C or SIGTERM (the signals, exit codes and the one
line), or early stopping (``run.early_stopping_patience``: ``early_stop``, ``EarlyStop``).

Workers: the loop's ``StepSignals`` stops at the next step boundary and saves (exit 130 for
SIGINT, 143 for SIGTERM). Before the loop runs (loading the model, the data) a stop has nothing
to save: ``early_stop_signals`` turns SIGTERM into ``StopRequested`` so the run ends with the same
one line and code instead of dying silently. A second Ctrl+C raises ``StopAtOnce``.

Rank 0 records its final one-line outcome in ``XTRAIN_REPORT_DIR`` (set by xtrain's launchers),
so a launcher knows whether the worker already said where the stop checkpoint is, or must say
itself that none was written (``stopped_error``, with what the output folder holds).

Early stopping is a clean end, not an error: the loop finishes at the evaluation that decided it
(final checkpoint, adapter, ``train_result.json``'s ``stopped_early``), exit 0. The decision is a
function of the evaluation history alone, which every rank holds identically (the metrics come
from the gathered eval) and every checkpoint keeps: so a resumed run decides the same and does
not train on.

``Signals`` is the one signal catcher of both sides: ``StepSignals`` here, ``LauncherSignals``
(pass the stop on to the workers, kill them on a second Ctrl+C) in ``xtrain.launch.stops``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError
from xtrain.train.checkpoint.outputs import lower_is_better

REPORT_ENV = "XTRAIN_REPORT_DIR"
OUTCOME_FILE = "outcome.json"


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


def remove_killed_writes(output_dir: str | Path | None) -> None:
    """After a second Ctrl+C killed every worker (launcher side, the workers are gone): a stop
    checkpoint cut off mid-write (``step-N.tmp``) is removed, so the folder holds complete
    checkpoints only. (A resume would remove it too; the folder should not wait for one.)"""
    if not output_dir:
        return
    import shutil

    from xtrain.train.checkpoint.layout import partial_checkpoints

    for path in partial_checkpoints(output_dir):
        shutil.rmtree(path, ignore_errors=True)


def stopped_error(output_dir: str | Path | None, signum: int, at_once: bool = False) -> XtrainError:
    """The one line for a stop that wrote no stop checkpoint: names the newest complete
    checkpoint (what a resume continues from), or says that there is none."""
    from xtrain.train.checkpoint.layout import list_checkpoints

    found = list_checkpoints(output_dir) if output_dir else []
    how = "second Ctrl+C: stopped at once" if at_once else f"stopped on {signal_name(signum)}"
    if found:
        step, path = found[-1]
        where = f"no stop checkpoint was written; the newest complete checkpoint is {path} (step {step})"
        hint = "run the same command again to resume from it"
    else:
        where = "no checkpoint was written"
        hint = "run the same command again to start over"
    return XtrainError(f"{how}; {where}", hint, exit_code=exit_code(signum))


class early_stop_signals:  # noqa: N801 (used as a context manager, like contextlib's)
    """SIGTERM raises ``StopRequested`` until the loop installs its own handlers (main thread)."""

    def __enter__(self) -> early_stop_signals:
        self._old: Any = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._raise)
        return self

    @staticmethod
    def _raise(signum: int, frame: Any) -> None:
        raise StopRequested(signum)

    def __exit__(self, *exc: Any) -> None:
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)


def record_outcome(error: XtrainError) -> None:
    """Rank 0 tells xtrain's launcher how it ended (the launcher prints nothing more then)."""
    folder = os.environ.get(REPORT_ENV)
    if not folder or int(os.environ.get("RANK", "0") or 0) != 0:
        return
    from xtrain.atomic import write_text

    data = {"message": error.message, "hint": error.hint, "exit_code": error.exit_code}
    with contextlib.suppress(OSError):  # the launcher then says it itself
        write_text(Path(folder) / OUTCOME_FILE, json.dumps(data))


class Signals:
    """SIGINT/SIGTERM caught while a block runs (handlers only in the main thread, restored on
    exit). The first signal is recorded in ``signum`` and passed to ``first``; later ones go to
    ``again``, which by default turns a second SIGINT into ``StopAtOnce``."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
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

    def __exit__(self, *exc: Any) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()


class StepSignals(Signals):
    """In a worker's training loop: the loop reads ``signum`` at every step boundary, saves and
    stops (all ranks agree first); a second SIGINT stops at once."""


@dataclass(frozen=True)
class EarlyStop:
    """Why a run ended early: ``patience`` evaluations in a row without ``metric`` improving on
    its best by more than ``threshold``."""

    step: int  # the evaluation that ended the run
    metric: str
    patience: int
    threshold: float
    best: float
    best_step: int

    @property
    def reason(self) -> str:
        by = f" by more than {self.threshold:g}" if self.threshold else ""
        evals = f"{self.patience} evaluation{'s' if self.patience != 1 else ''}"
        return (
            f"stopped early at step {self.step}: {self.metric} did not improve{by} in {evals} "
            f"(best {self.best:.4g} at step {self.best_step})"
        )

    @classmethod
    def followed(cls, step: int) -> EarlyStop:
        """On a rank whose own history did not say stop while the main process did: it stops
        with it (only the main process's record is written)."""
        return cls(step, "", 0, 0.0, float("nan"), step)

    def to_dict(self) -> dict[str, Any]:
        """As ``train_result.json`` records it (``stopped_early``)."""
        return {**asdict(self), "reason": self.reason}


def early_stop(
    history: list[dict[str, float]], metric: str, patience: int, threshold: float = 0.0
) -> EarlyStop | None:
    """Whether the evaluations so far (in step order) end the run: the last ``patience`` of them
    did not beat the best before them by more than ``threshold``. As in transformers'
    EarlyStoppingCallback, a smaller gain still moves the best (and ``output_dir/best``) but
    counts as no improvement. None while the run should go on."""
    lower = lower_is_better(metric)
    best: float | None = None
    best_step, waited, last = 0, 0, 0
    for h in history:
        if metric not in h:
            continue
        value, last = float(h[metric]), int(h["step"])
        if best is None:
            best, best_step = value, last
            continue
        gain = best - value if lower else value - best
        waited = 0 if gain > threshold else waited + 1
        if gain > 0:
            best, best_step = value, last
    if best is None or waited < patience:
        return None
    return EarlyStop(last, metric, patience, threshold, best, best_step)


def early_stop_at(step: int, history: list[dict[str, float]], run: Any) -> EarlyStop | None:
    """``early_stop`` for ``run`` (its ``RunConfig``), when it ends the run at ``step``."""
    if not (run.early_stopping_patience and run.best_metric):
        return None
    found = early_stop(history, run.best_metric, run.early_stopping_patience, run.early_stopping_threshold)
    return found if found is not None and found.step == step else None


def check_early_stopping(run: Any, has_eval_set: bool, metrics: dict[str, float] | None = None) -> None:
    """What early stopping needs at run time (config validation checked the keys): an eval set,
    and ``run.best_metric`` among the eval's ``metrics``. One line each."""
    if not run.early_stopping_patience:
        return
    if not has_eval_set:
        raise XtrainError(
            "run.early_stopping_patience needs an eval set, and this run has none",
            "set data.eval, or data.eval_fraction to split one off the training data",
        )
    if metrics and run.best_metric not in metrics:
        raise XtrainError(
            f"run.best_metric={run.best_metric} is not among the eval metrics, so early stopping "
            "cannot follow it",
            f"set run.best_metric to one of {', '.join(metrics)}",
        )
