"""How accelerate split the model's weights across ranks (FSDP2, DeepSpeed ZeRO-3, or whole), and
what generating then needs: every rank steps ``generate`` in lockstep (``generate_kwargs``), and
FSDP2 treats ``generate`` as a forward method (``prepare_generation``). The saving side is
``xtrain.train.distributed.sharded``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from accelerate import Accelerator
    from torch.nn import Module

Sharding = Literal["fsdp", "zero3"]


def sharding(accelerator: Accelerator) -> Sharding | None:
    """How the weights are split across ranks: "fsdp" (FSDP2), "zero3" (DeepSpeed ZeRO-3), or
    None (whole on every rank: one process, DDP, DeepSpeed ZeRO-1/2)."""
    from accelerate.utils import DistributedType

    kind = accelerator.distributed_type
    if kind == DistributedType.FSDP:
        return "fsdp"
    if kind == DistributedType.DEEPSPEED and accelerator.state.deepspeed_plugin.zero_stage == 3:
        return "zero3"
    return None


def prepare_generation(accelerator: Accelerator, model: Module) -> None:
    """FSDP2: ``generate`` runs the root module's all-gather like ``forward`` does."""
    if sharding(accelerator) != "fsdp":
        return
    from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method

    inner = accelerator.unwrap_model(model, keep_torch_compile=False)
    if isinstance(inner, FSDPModule) and hasattr(inner, "generate"):
        register_fsdp_forward_method(inner, "generate")


def generate_kwargs(accelerator: Accelerator) -> dict[str, Any]:
    """Every rank keeps stepping ``generate`` until all are done: each step is a collective."""
    return {"synced_gpus": True} if sharding(accelerator) and accelerator.num_processes > 1 else {}
