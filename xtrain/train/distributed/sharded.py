"""The model when accelerate shards it (FSDP2, DeepSpeed ZeRO-3): what then needs every rank.

Under FSDP2 each rank holds a slice of every weight (a DTensor), under ZeRO-3 a partition: the
whole weights exist only when gathered, and gathering is a collective that every rank must join.
So every save of a final output (adapter or model, the best model) is "gather on all ranks, write
on the main process", here, in ``save_on_main``. Without such sharding (one process, DDP,
ZeRO-2, whose weights are whole on every rank) it costs nothing: no collective, the main process
writes the unwrapped model as before.

Generation under sharding runs in lockstep: every forward all-gathers, so a rank that finished
its answers early must keep joining (``synced_gpus``), and FSDP2 must treat ``generate`` as a
forward method of the root module (``register_fsdp_forward_method``, as transformers' Trainer
does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypeVar

from xtrain.errors import XtrainError
from xtrain.model.sharding import sharding
from xtrain.train.checkpoint.save import write_on_main

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from accelerate import Accelerator
    from torch.nn import Module

T = TypeVar("T")


def check_outputs(
    accelerator: Accelerator, save_merged: bool, lora: bool, init_weights: str = "default"
) -> None:
    """Refuse, before any step, what cannot be written from sharded weights."""
    kind = sharding(accelerator)
    if kind is not None and lora and init_weights in ("pissa", "olora"):
        raise XtrainError(
            f"lora.init_weights={init_weights} does not work under FSDP or DeepSpeed: its adapter is "
            "converted for the original base on save, which needs the whole model in one process",
            "set lora.init_weights=default (or gaussian)",
        )
    if kind is not None and save_merged and lora:
        what = "FSDP" if kind == "fsdp" else "DeepSpeed ZeRO-3"
        raise XtrainError(
            f"run.save_merged does not work under {what}: merging needs the whole model in one process",
            "set run.save_merged=false; the adapter merges later onto the base model "
            "(peft's merge_and_unload, docs/fitting-big-models.md)",
        )


@contextlib.contextmanager
def whole_model_loading(accelerator: Accelerator) -> Iterator[None]:
    """Under ZeRO-3 the model loads whole in each process; DeepSpeed partitions it at ``prepare``.

    accelerate 1.15 registers its ZeRO-3 config with transformers whenever the plugin is selected
    (``DeepSpeedPlugin.set_deepspeed_weakref``, whatever ``zero3_init_flag`` says), and
    ``from_pretrained`` then loads inside ``deepspeed.zero.Init``: a collective every rank must
    join, while xtrain builds the workload on the main process first (it fills the datasets
    cache), so the ranks would wait on different collectives (seen here: gloo's "collective
    mismatch" abort). The registration is lifted for the build and restored after it (generate
    reads it: ``synced_gpus``)."""
    if sharding(accelerator) != "zero3":
        yield
        return
    from transformers.integrations import unset_hf_deepspeed_config

    unset_hf_deepspeed_config()
    try:
        yield
    finally:
        accelerator.state.deepspeed_plugin.set_deepspeed_weakref()


def check_quantization(accelerator: Accelerator, quantization: str | None) -> None:
    """8-bit weights under FSDP: bitsandbytes' ``Int8Params`` become plain DTensors when FSDP2
    shards them and lose their quantization state (seen here: ``'Parameter' object has no
    attribute 'CB'`` at the first forward). 4-bit works when stored in FSDP's dtype
    (``bnb_4bit_quant_storage``; docs: "FSDP with 4-bit weights")."""
    if quantization == "8bit" and sharding(accelerator) == "fsdp":
        raise XtrainError(
            "model.quantization=8bit does not work under FSDP: sharding drops the 8-bit weights' "
            "quantization state",
            "use model.quantization=4bit, or 8-bit without FSDP",
        )


def fill_deepspeed(accelerator: Accelerator, per_device: int, max_grad_norm: float | None) -> None:
    """DeepSpeed reads the micro-batch and the clipping from its own config; xtrain prepares no
    training DataLoader (each rank reads its own share), so accelerate cannot infer the batch.
    Values left "auto" get xtrain's (optim.max_grad_norm 0: no clipping); numbers the user's
    DeepSpeed config set stay."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return
    plugin = accelerator.state.deepspeed_plugin
    config = plugin.deepspeed_config
    clip = float(max_grad_norm or 0.0)  # DeepSpeed: 0 = no clipping
    for key, value in (("train_micro_batch_size_per_gpu", per_device), ("gradient_clipping", clip)):
        if config.get(key, "auto") == "auto":
            config[key] = value


def gathered_state_dict(
    accelerator: Accelerator, model: Module, trainable_only: bool
) -> dict[str, torch.Tensor] | None:
    """The whole state dict on the main process, None on the others. A collective under
    sharding: every rank must call it. ``trainable_only``: the weights that train (a LoRA
    adapter), so the frozen base is never gathered (FSDP2; ZeRO-3 gathers all, then filters)."""
    kind = sharding(accelerator)
    if kind == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # full tensors offloaded to the CPU of rank 0 only (the others get {})
        options = StateDictOptions(
            full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only
        )
        state = get_model_state_dict(model, options=options)
    else:
        state = accelerator.get_state_dict(model)  # ZeRO-3: the 16-bit consolidation
        if trainable_only and state is not None:
            inner = accelerator.unwrap_model(model, keep_torch_compile=False)
            trainable = {n for n, p in inner.named_parameters() if p.requires_grad}
            state = {k: v for k, v in state.items() if k in trainable}
    return state if accelerator.is_main_process else None


def save_on_main(
    accelerator: Accelerator,
    model: Module,
    write: Callable[[Module, dict[str, torch.Tensor] | None], T],
    where: tuple[str, str | Path],
    trainable_only: bool,
) -> T | None:
    """``write(unwrapped_model, state_dict)`` on the main process (its result; None elsewhere),
    the others waiting; a failure raises on every rank (``checkpoint.write_on_main``: the
    filesystem failing is one line naming ``where`` = (what is written, the output folder), the
    partial write removed). Under sharding the state dict is gathered first on all ranks and
    ``write`` must save it (``save_pretrained(state_dict=...)``); without sharding it is None and
    nothing is gathered."""
    state = gathered_state_dict(accelerator, model, trainable_only) if sharding(accelerator) else None
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    what, output_dir = where
    return write_on_main(accelerator, what, output_dir, lambda: write(unwrapped, state))


def finite_check_input(accelerator: Accelerator, params: list[torch.Tensor]) -> list[torch.Tensor]:
    """What ``failures.check_finite`` should look at so that every rank decides the same.

    Whole weights (no sharding) are the same on every rank: the parameters themselves. Sharded,
    each rank holds other slices, and a NaN in one rank's slice would stop that rank alone while
    the others enter the checkpoint's collectives and wait: the ranks' verdicts are reduced
    (MIN over gloo/NCCL) into one scalar that is finite exactly when every slice on every rank is."""
    if sharding(accelerator) is None:
        return params
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    # FSDP2: this rank's slice; ZeRO-3: its partition (p.data is empty)
    def local(p: torch.Tensor) -> torch.Tensor:
        return p.to_local() if isinstance(p, DTensor) else getattr(p, "ds_tensor", p)

    flags = [torch.isfinite(local(p).detach()).all() for p in params]
    ok = torch.stack(flags).all().float() if flags else torch.ones((), device=accelerator.device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return [ok.log()]  # log(1) = 0 when all are finite, log(0) = -inf otherwise
