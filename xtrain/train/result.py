"""What a training run produced: ``TrainResult`` (also ``output_dir/train_result.json``)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from xtrain.model.start import RUN_FILE  # saved next to the adapter (or full model): what it trained

__all__ = ["RUN_FILE", "TrainResult", "run_info", "run_record", "session_result"]

if TYPE_CHECKING:
    from accelerate import Accelerator

    from xtrain.model.memory import MemoryCheck
    from xtrain.planning.plan import Plan
    from xtrain.planning.resolve import RunSettings
    from xtrain.train.precision import SkipDetector
    from xtrain.train.state import RunState


@dataclass
class TrainResult:
    """What a training run produced (also written to ``output_dir/train_result.json``)."""

    final_step: int
    total_steps: int
    losses: list[list[float]]  # [[step, mean loss over the log window], ...]
    eval_metrics: dict[str, float]  # the final evaluation ({} without an eval set)
    eval_history: list[dict[str, float]]  # [{"step": s, "eval_loss": ...}, ...]
    outputs: dict[str, str]  # adapter / model / merged / checkpoint / result -> path
    samples_per_s: float  # over the optimizer steps of this session (eval and saves excluded)
    tokens_per_s: float
    world_size: int
    accumulation: int
    global_batch: int
    resumed_from: str | None = None
    skipped_steps: int = 0
    run_info: dict[str, Any] = field(default_factory=dict)  # how it ran: backend, device, hook, ...
    predictions: list[dict[str, str]] = field(default_factory=list)  # [{"reference", "prediction"}]
    # this session's logging windows: [{"step", "steps", "seconds", "samples", "tokens",
    # "data_seconds" (rank 0's wait for batches), "time"}]
    # (``time``: time.time() when the window closed), what ``xtrain bench`` measures rates from
    windows: list[dict[str, float]] = field(default_factory=list)
    # run.early_stopping_patience ended the run at final_step: step, metric, best, best_step, reason
    stopped_early: dict[str, Any] | None = None
    # what each logging window logged: [{"step", "loss", "lr", "samples_per_s", the task's metrics}]
    log_history: list[dict[str, float]] = field(default_factory=list)
    # eval.benchmarks (train/benchmarks.py): {"tasks", "step", "end": [score rows], "start": rows or
    # None, "file": lm-eval's JSON in benchmarks/}; None without benchmarks
    benchmarks: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainResult:
        """A result as ``train_result.json`` holds it (keys it does not know are left out)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def data_wait(self) -> float | None:
        """The share of this session's training time rank 0 spent waiting for batches."""
        seconds = sum(w["seconds"] for w in self.windows)
        return sum(w.get("data_seconds", 0.0) for w in self.windows) / seconds if seconds > 0 else None


def session_result(
    final: int,
    total_steps: int,
    state: RunState,
    metrics: dict[str, float],
    outputs: dict[str, str],
    windows: list[dict[str, float]],
    settings: RunSettings,
    world: int,
    **more: Any,
) -> TrainResult:
    """``TrainResult`` of a session: the run's history (``state``), its final evaluation
    (``metrics``) and ``outputs``, this session's throughput from its closed log ``windows``;
    ``more``: the other fields (resumed_from, predictions, stopped_early, run_info)."""
    seconds = sum(w["seconds"] for w in windows)
    samples, tokens = sum(w["samples"] for w in windows), sum(w["tokens"] for w in windows)
    return TrainResult(
        final_step=final,
        total_steps=total_steps,
        losses=state.losses,
        eval_metrics=metrics,
        eval_history=state.eval_history,
        outputs=outputs,
        samples_per_s=samples / seconds if seconds > 0 else 0.0,
        tokens_per_s=tokens / seconds if seconds > 0 else 0.0,
        world_size=world,
        accumulation=settings.accumulation,
        global_batch=settings.global_batch,
        skipped_steps=state.skipped_steps,
        windows=windows,
        log_history=state.log_history,
        **more,
    )


def run_info(
    accelerator: Accelerator,
    plan: Plan,
    settings: RunSettings,
    cpu_staged: bool,
    skips: SkipDetector,
    memory: MemoryCheck | None = None,
) -> dict[str, Any]:
    """How the run ran (``TrainResult.run_info``): device, backend, precision, hooks, memory
    (``memory``: the loop's ``MemoryCheck`` on CUDA, else None)."""
    import torch

    device, world = accelerator.device, accelerator.num_processes
    return {
        "device": str(device),
        "backend": accelerator.state.backend if world > 1 else None,
        "distributed_type": str(accelerator.distributed_type),
        "precision": settings.precision,
        "plan_os": plan.os_kind,
        "cpu_staged_allreduce": cpu_staged,
        "use_libuv": os.environ.get("USE_LIBUV"),
        # this rank's peak of allocated device memory (the main process writes the result)
        "peak_mem_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "skip_check": "loss scale" if skips.scaler is not None else None,
        # the estimate of xtrain.model.memory for this rank's card (CUDA only)
        "memory_estimate_gib": round(memory.estimate_gib, 4) if memory is not None else None,
    }


def run_record(task: str, chat: bool, more: dict[str, Any] | None = None) -> dict[str, str]:
    """``{RUN_FILE: text}``: the run's task, whether it trained on chat conversations (then
    predict renders prompts with the saved chat template), and what else its task records."""
    return {RUN_FILE: json.dumps({**(more or {}), "task": task, "chat": chat})}
