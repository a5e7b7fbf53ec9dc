"""Batch arithmetic: accumulation from the global batch, and the LR scaling rule (read by
``xtrain.planning.resolve.run_settings``; ``xtrain.train.config`` re-exports both for user code);
the one line that says a run's batch with its numbers (the dry run, the banner, the report)."""

from __future__ import annotations

import math

from xtrain.config.schema import TrainConfig
from xtrain.errors import XtrainError


def batch_line(
    global_batch: int, per_device: int, processes: int, accumulation: int, sequence: int = 1
) -> str:
    """``global batch 16 = 8 per-device x 1 process x 2 accumulation``; with ``sequence`` > 1
    (parallel.sequence: the processes that share each row) ``... x 1 group of 2 processes x ...``."""
    readers = f"{processes} process{'es' if processes != 1 else ''}"
    if sequence > 1:
        groups = processes // sequence
        readers = f"{groups} group{'s' if groups != 1 else ''} of {sequence} processes"
    return f"global batch {global_batch} = {per_device} per-device x {readers} x {accumulation} accumulation"


def _batch_hint(global_batch: int, per_device: int, world_size: int) -> str:
    unit = per_device * world_size
    below = (global_batch // unit) * unit
    above = below + unit
    options = [str(b) for b in (below, above) if b > 0]
    hint = f"use batch.global_batch={' or '.join(options)}"
    if global_batch % world_size == 0:
        per_rank = global_batch // world_size
        fits = [d for d in range(min(per_device, per_rank), 0, -1) if per_rank % d == 0]
        if fits and fits[0] != per_device:
            hint += f", or batch.per_device={fits[0]}"
    return hint


def gradient_accumulation(cfg: TrainConfig, world_size: int) -> int:
    """Micro-batches per optimizer step: global / (per_device x world_size), 1 without a global batch."""
    per_device, global_batch = cfg.batch.per_device, cfg.batch.global_batch
    if global_batch is None:
        return 1
    unit = per_device * world_size
    procs = f"{world_size} process{'es' if world_size != 1 else ''}"
    if global_batch % unit != 0:
        what = "is smaller than" if global_batch < unit else "is not divisible by"
        raise XtrainError(
            f"global batch {global_batch} {what} per-device {per_device} x {procs} ({unit})",
            _batch_hint(global_batch, per_device, world_size),
        )
    return global_batch // unit


def scaled_lr(cfg: TrainConfig, global_batch: int) -> float:
    """``optim.lr`` scaled for ``global_batch`` by ``optim.lr_scaling`` relative to ``base_global_batch``."""
    o = cfg.optim
    if o.lr_scaling == "none" or o.base_global_batch is None:
        return o.lr
    ratio = global_batch / o.base_global_batch
    return o.lr * (ratio if o.lr_scaling == "linear" else math.sqrt(ratio))
