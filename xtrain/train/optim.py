"""The optimizer and the learning-rate schedule of a run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from xtrain.config.schema import TrainConfig
from xtrain.config.values import BNB_OPTIMIZERS
from xtrain.errors import XtrainError
from xtrain.model.quantization import bnb_problem

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LRScheduler

    from xtrain.model.quantization import Backend

if TYPE_CHECKING:  # torch is imported where it is used: `xtrain train` checks optim.name without it
    import torch


def build_optimizer(
    model: torch.nn.Module, cfg: TrainConfig, lr: float, device: torch.device
) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters only; no weight decay on biases and norms.
    ``optim.name``: torch's AdamW (fused on CUDA) or bitsandbytes' 8-bit AdamW, same groups."""
    import torch

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
    betas = tuple(cfg.optim.betas)
    if cfg.optim.name == "adamw":
        fused = device.type == "cuda"
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=cfg.optim.eps, fused=fused or None)
    optimizer = bnb_optimizer(cfg.optim.name, device)
    # the groups carry their own weight decay; bitsandbytes' default (1e-2) never applies
    return optimizer(groups, lr=lr, betas=betas, eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay)


def bnb_optimizer(name: str, device: torch.device) -> type[torch.optim.Optimizer]:
    """The bitsandbytes optimizer class for ``optim.name``, or one line saying why not here."""
    check_backend(name, device.type)
    try:
        import bitsandbytes.optim as bnb_optim
    except ImportError:  # read_backend found it, yet its optimizers do not import
        from xtrain.model.quantization import Backend

        problem = backend_problem(name, device.type, Backend(version=None))
        assert problem is not None
        raise problem from None
    return getattr(bnb_optim, BNB_OPTIMIZERS[name])


def backend_problem(name: str, device_type: str, backend: Backend) -> XtrainError | None:
    """Why ``optim.name`` cannot run on ``device_type`` with ``backend`` (``quantization.Backend``;
    None: it can, or it needs no bitsandbytes). bitsandbytes 0.50 has 8-bit optimizer kernels for
    CUDA, XPU and CPU, none for Apple MPS (backends/mps registers 4-bit ops only)."""
    if name not in BNB_OPTIMIZERS:
        return None
    if device_type == "mps":
        return XtrainError(
            f"optim.name={name} (bitsandbytes) has no 8-bit optimizer for Apple MPS",
            "use optim.name=adamw",
        )
    return bnb_problem(f"optim.name={name}", device_type, backend, "use optim.name=adamw")


def check_backend(name: str, device_type: str) -> None:
    """Refuse in one line when ``optim.name`` needs a bitsandbytes that cannot run on
    ``device_type`` here: ``xtrain train`` before any process starts, the worker before it loads
    the model, and the optimizer's build."""
    if name not in BNB_OPTIMIZERS:
        return
    from xtrain.model.quantization import Backend, read_backend

    # MPS is refused without importing bitsandbytes
    backend = Backend(version=None) if device_type == "mps" else read_backend()
    problem = backend_problem(name, device_type, backend)
    if problem is not None:
        raise problem


def build_scheduler(cfg: TrainConfig, optimizer: torch.optim.Optimizer, total_steps: int) -> LRScheduler:
    from transformers import get_scheduler

    warmup = cfg.optim.warmup_steps or int(round(cfg.optim.warmup_ratio * total_steps))
    name = {"constant": "constant_with_warmup"}.get(cfg.optim.schedule, cfg.optim.schedule)
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=total_steps)
