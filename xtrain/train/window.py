"""The logging window: loss, tokens, non-finite steps and the task's statistics summed on the
device, read once.

Per micro-batch the loop only adds device tensors (no host sync): its share of the step's loss
(``step_loss.StepLoss.micro``: its token sum over the step's trained tokens, its sequence mean over
the step's micro-batches), so a step's shares, summed over the processes, are the step's loss (the
step's token mean for a token loss), and the task's statistics of the micro-batch (its forward's
``.metrics``). When a window closes (every ``run.log_every`` steps, before an eval, a save or a
stop) one ``gather`` brings every rank's [loss sum, tokens, non-finite streak, statistics] to the
host: the only sync of the window. The task's ``Workload.window_metrics`` turns the statistics
summed over the window's micro-batches and processes into what it logs (preference tuning: its
sums of rewards and counts into the window's means, as its evaluation reduces a whole eval set);
without one, each is its mean over the window's micro-batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from collections.abc import Iterator

    from accelerate import Accelerator

    from xtrain.tasks.contract import Batch, WindowMetricsFn


@dataclass
class WindowStats:
    """A closed window, on the host."""

    loss: float  # the mean of the window's step losses (train/step_loss.py)
    tokens: int
    samples: int
    seconds: float
    worst_streak: int  # the longest run of consecutive non-finite steps on any rank, up to now
    steps: int = 0  # optimizer steps in the window
    data_seconds: float = 0.0  # this rank's time waiting for its next batch (host clock)
    task: dict[str, float] = field(default_factory=dict)  # the task's own metrics (Workload.window_metrics)

    def metrics(self, lr: float) -> dict[str, float]:
        """What the window logs: the loss, the learning rate, the throughput (and the task's own)."""
        seconds = self.seconds if self.seconds > 0 else float("inf")
        return {"loss": self.loss, "lr": lr, "samples_per_s": self.samples / seconds,
                "tokens_per_s": self.tokens / seconds, **self.task}  # fmt: skip

    def record(self, step: int) -> dict[str, float]:
        """The window as ``TrainResult.windows`` keeps it (``time``: when it closed)."""
        return {"step": step, "steps": self.steps, "seconds": self.seconds, "samples": self.samples,
                "tokens": self.tokens, "data_seconds": self.data_seconds, "time": time.time()}  # fmt: skip


def peak_memory(accelerator: Accelerator, device: torch.device) -> dict[str, float]:
    """Every rank's peak of allocated device memory in MiB (CUDA: one gather; else nothing)."""
    if device.type != "cuda":
        return {}
    peaks = accelerator.gather(torch.tensor([torch.cuda.max_memory_allocated(device)], device=device))
    return {f"peak_mem_mib/rank{i}": float(v) / 2**20 for i, v in enumerate(peaks.tolist())}


def mean_per_micro_batch(sums: dict[str, torch.Tensor], micro_batches: int) -> dict[str, float]:
    """The window's metrics of a task without ``Workload.window_metrics``: each statistic's mean
    over the window's micro-batches (on every process)."""
    return {name: float(total) / max(1, micro_batches) for name, total in sums.items()}


class LogWindow:
    def __init__(self, device: torch.device, reduce: WindowMetricsFn | None = None) -> None:
        self.loss = torch.zeros((), device=device)
        self.tokens = torch.zeros((), device=device, dtype=torch.long)
        # consecutive steps whose loss was NaN/inf on this rank (kept across windows)
        self.streak = torch.zeros((), device=device, dtype=torch.long)
        self.step_bad = torch.zeros((), device=device, dtype=torch.bool)
        self.task: dict[str, torch.Tensor] = {}  # a task's statistics (Workload.forward), summed
        self.reduce = reduce or mean_per_micro_batch  # the window's sums -> what it logs
        self.steps = 0
        self.started = 0.0
        self.data_seconds = 0.0
        self.reset()

    def reset(self) -> None:
        self.loss.zero_()
        self.tokens.zero_()
        for value in self.task.values():
            value.zero_()
        self.steps = 0
        self.data_seconds = 0.0
        self.started = time.perf_counter()

    def next_batch(self, batches: Iterator[Batch]) -> Batch:
        """The next micro-batch, the wait for it counted (the loader's workers keep it near 0)."""
        t = time.perf_counter()
        batch = next(batches)
        self.data_seconds += time.perf_counter() - t
        return batch

    def add(
        self, loss: torch.Tensor, tokens: torch.Tensor | None, task: dict[str, torch.Tensor] | None = None
    ) -> None:
        """One micro-batch's share of its step's loss (and token count, and the task's
        statistics), device-side."""
        for name, value in (task or {}).items():
            total = self.task.setdefault(name, torch.zeros((), device=self.loss.device))
            total += value.detach().float()
        loss = loss.detach()
        self.loss += loss.float()
        self.step_bad |= ~torch.isfinite(loss)
        if tokens is not None:
            self.tokens += tokens.sum()

    def end_step(self) -> None:
        self.steps += 1
        self.streak.add_(1).mul_(self.step_bad)  # +1, or back to 0 after a finite step
        self.step_bad.zero_()

    def close(self, accelerator: Accelerator, micro_batches_per_step: int, global_batch: int) -> WindowStats:
        """The window's one host sync: every rank's sums, gathered."""
        names = sorted(self.task)  # every rank has the same (the task's forward returns the same keys)
        extra = [self.task[n] for n in names]
        width = 3 + len(names)
        stats = accelerator.gather(
            torch.stack([self.loss, self.tokens.to(self.loss.dtype), self.streak.float(), *extra])
        ).reshape(-1, width)
        loss, tokens = stats[:, :2].sum(0).tolist()
        # the task's statistics summed over the window's micro-batches on every rank, then its reduce
        task_sums = dict(zip(names, stats[:, 3:].sum(0).cpu().unbind(), strict=True))
        task = self.reduce(task_sums, self.steps * micro_batches_per_step) if task_sums else {}
        return WindowStats(
            loss=loss / max(1, self.steps),  # every rank's shares of every step
            tokens=int(tokens),
            samples=self.steps * global_batch,
            seconds=time.perf_counter() - self.started,
            worst_streak=int(stats[:, 2].max()),
            steps=self.steps,
            data_seconds=self.data_seconds,
            task=task,
        )
