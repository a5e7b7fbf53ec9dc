"""What the loop carries from step to step: ``RunState``, the run's history that a checkpoint
saves and a resume restores, and ``Due``, what a finished optimizer step calls for (log, eval,
save, stop): plain data, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xtrain.train.checkpoint import TrainState

if TYPE_CHECKING:
    from xtrain.config.schema import RunConfig
    from xtrain.data.sampler import DataOrder
    from xtrain.planning.resolve import RunSettings


@dataclass
class RunState:
    """The run's history: what a checkpoint saves beside accelerate's state (weights, optimizer,
    scheduler, loss scale, RNG), and what a resume restores."""

    losses: list[list[float]] = field(default_factory=list)  # [[step, loss], ...] at log points
    eval_history: list[dict[str, float]] = field(default_factory=list)
    skipped_steps: int = 0  # optimizer updates dropped for fp16 overflow
    last_saved: int = -1  # the step of the newest checkpoint of this run
    # what each logging window logged ({"step", "loss", "lr", the task's metrics, ...}): the curves
    log_history: list[dict[str, float]] = field(default_factory=list)

    @classmethod
    def resumed(cls, saved: TrainState) -> RunState:
        """The history of the checkpoint a run resumes from (saved at its step)."""
        history = (list(saved.losses), list(saved.eval_history))
        return cls(*history, saved.skipped_steps, saved.step, list(saved.log_history))

    def saved_at(
        self,
        step: int,
        order: DataOrder,
        settings: RunSettings,
        world_size: int,
        total_steps: int,
        seed: int,
        config: dict[str, dict[str, Any]],
        start: list[str],
    ) -> TrainState:
        """The checkpoint's ``TrainState`` at ``step``: the data position, what the run was
        planned with (``start``: the hashes of the adapters it started from) and this history."""
        epoch, step_in_epoch = order.position(step)
        return TrainState(
            step=step, epoch=epoch, step_in_epoch=step_in_epoch, samples_seen=step * settings.global_batch,
            seed=seed, global_batch=settings.global_batch, per_device=settings.per_device,
            world_size=world_size, accumulation=settings.accumulation, num_samples=order.num_samples,
            total_steps=total_steps, config=config, losses=self.losses, eval_history=self.eval_history,
            skipped_steps=self.skipped_steps, log_history=self.log_history, start=start,
        )  # fmt: skip


@dataclass(frozen=True)
class Due:
    """What optimizer step ``done`` (1-based) calls for. ``stop``: the signal every rank agreed
    to stop on (None: none). Evaluations and saves due at the last step are ``finish``'s."""

    done: int
    log: bool
    eval: bool
    save: bool
    stop: int | None = None

    @classmethod
    def after(cls, done: int, total: int, run: RunConfig, stop: int | None) -> Due:
        log = done % max(1, run.log_every) == 0 or done == total
        eval_due = bool(run.eval_every) and done % run.eval_every == 0 and done < total
        save_due = bool(run.save_every) and done % run.save_every == 0 and done < total
        return cls(done, log, eval_due, save_due, stop)

    @property
    def anything(self) -> bool:
        """Anything at all: the logging window closes (its one host sync) before it."""
        return self.log or self.eval or self.save or bool(self.stop)
