"""The optimizer and the learning-rate schedule of a run."""

from __future__ import annotations

from typing import Any

import torch

from xtrain.errors import XtrainError
from xtrain.train.config.schema import TrainConfig


def build_optimizer(
    model: torch.nn.Module, cfg: TrainConfig, lr: float, device: torch.device
) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters only; no weight decay on biases and norms."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    if not decay and not no_decay:
        raise XtrainError(
            "the model has no trainable parameters", "check lora.target_modules or lora.enabled"
        )
    groups = [{"params": decay, "weight_decay": cfg.optim.weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    fused = device.type == "cuda"
    return torch.optim.AdamW(
        groups, lr=lr, betas=tuple(cfg.optim.betas), eps=cfg.optim.eps, fused=fused or None
    )


def build_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> Any:
    from transformers import get_scheduler

    warmup = cfg.optim.warmup_steps or int(round(cfg.optim.warmup_ratio * total_steps))
    name = {"constant": "constant_with_warmup"}.get(cfg.optim.schedule, cfg.optim.schedule)
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)
