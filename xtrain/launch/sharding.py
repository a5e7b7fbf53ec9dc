"""FSDP2 and DeepSpeed ZeRO under `xtrain train`: whether a run asks for them, whether they can
run here, and the `accelerate launch` switches that start them.

A run asks for sharding with ``--fsdp`` / ``--deepspeed zero2|zero3``, or through accelerate's
default config (``distributed_type: FSDP | DEEPSPEED``, as ``xtrain configure --fsdp`` writes
it). With the options the settings are xtrain's own (``accelerate_config.fsdp_config`` /
``deepspeed_config``, the one place they are decided); from the config file only the switch is
passed and accelerate fills the rest from that file, as ``accelerate launch`` would.

Where they cannot run the run stops before any process starts, in one line with the fix:
native Windows (torchrun's rendezvous needs libuv; DeepSpeed has no Windows training build;
gloo's reduce-scatter of CUDA tensors goes through an all-reduce whose CUDA path the Windows
wheels lack, pytorch#186535), a machine without a CUDA GPU (accelerate 1.15 sets neither up on
the CPU), DeepSpeed not installed.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

from xtrain.errors import XtrainError
from xtrain.launch.accelerate_config import DEEPSPEED_STAGES, deepspeed_config, fsdp_config
from xtrain.planning.plan import Plan

Kind = Literal["fsdp", "zero2", "zero3"]


def requested(fsdp: bool, deepspeed: str | None, accelerate_config: dict[str, Any] | None) -> Kind | None:
    """What the options ask for, else what accelerate's default config asks for, else None."""
    if fsdp and deepspeed:
        raise XtrainError("--fsdp and --deepspeed exclude each other", "pick one of them")
    if deepspeed is not None:
        if deepspeed not in DEEPSPEED_STAGES:
            raise XtrainError(f"--deepspeed {deepspeed!r} is unknown", "use --deepspeed zero2 or zero3")
        return "zero2" if deepspeed == "zero2" else "zero3"
    if fsdp:
        return "fsdp"
    kind = str((accelerate_config or {}).get("distributed_type") or "").upper()
    if kind == "FSDP":
        return "fsdp"
    if kind == "DEEPSPEED":
        stage = ((accelerate_config or {}).get("deepspeed_config") or {}).get("zero_stage")
        return "zero3" if str(stage) == "3" else "zero2"
    return None


def check(kind: Kind, plan: Plan, from_options: bool, pip: str, here: bool = True) -> None:
    """Refuse, in one line with the fix, where ``kind`` cannot run (before anything starts).
    ``pip``: the pip line that installs DeepSpeed in the user's shell; ``here``: the plan is for
    this machine (a ``--facts`` snapshot's machine may have DeepSpeed where this one has not)."""
    what = "FSDP" if kind == "fsdp" else "DeepSpeed"
    switch = ("--fsdp" if kind == "fsdp" else "--deepspeed") if from_options else None
    drop = f"leave out {switch}" if switch else "rewrite accelerate's config: xtrain configure --force"
    if plan.os_kind == "windows":
        why = (
            "DeepSpeed has no Windows training build"
            if kind != "fsdp"
            else "torchrun needs libuv, and gloo's reduce-scatter of CUDA tensors crashes (pytorch#186535)"
        )
        raise XtrainError(
            f"{what} does not run on native Windows: {why}",
            f"fit the model on each card with model.quantization=4bit (docs/fitting-big-models.md), "
            f"or run in WSL2/Linux; {drop}",
        )
    if plan.device != "cuda":
        raise XtrainError(
            f"{what} needs CUDA GPUs; this plan runs on {plan.device} (accelerate sets neither up there)",
            f"{drop}; plain data parallel trains on the CPU",
        )
    if here and kind != "fsdp" and importlib.util.find_spec("deepspeed") is None:
        raise XtrainError("DeepSpeed is not installed", f"{pip}, or use --fsdp")


def launch_flags(kind: Kind, from_options: bool) -> list[str]:
    """The `accelerate launch` switches: ``--use_fsdp`` / ``--use_deepspeed`` and, when the
    options asked, xtrain's settings (each key of the config dict is a launch option)."""
    if kind == "fsdp":
        flags, settings = ["--use_fsdp"], fsdp_config()
    else:
        flags, settings = ["--use_deepspeed"], deepspeed_config(kind)
    if not from_options:
        return flags  # accelerate reads the rest from its config file
    for key, value in settings.items():
        flags += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return flags
