"""Early stopping (``run.early_stopping_patience``): a clean end, not an error. The loop finishes at
the evaluation that decided it (final checkpoint, adapter, ``train_result.json``'s
``stopped_early``), exit 0. The decision is a function of the evaluation history alone, which
every rank holds identically (the metrics come from the gathered eval) and every checkpoint
keeps: so a resumed run decides the same and does not train on; the main process's answer is
broadcast (``collective.main_decides``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError
from xtrain.train.checkpoint.outputs import lower_is_better

if TYPE_CHECKING:
    from xtrain.config.schema import RunConfig


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


def early_stop_at(step: int, history: list[dict[str, float]], run: RunConfig) -> EarlyStop | None:
    """``early_stop`` for ``run`` (its ``RunConfig``), when it ends the run at ``step``."""
    if not (run.early_stopping_patience and run.best_metric):
        return None
    found = early_stop(history, run.best_metric, run.early_stopping_patience, run.early_stopping_threshold)
    return found if found is not None and found.step == step else None


def check_early_stopping(run: RunConfig, has_eval_set: bool, metrics: dict[str, float] | None = None) -> None:
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
