"""Checks of the Python environment: the packages, accelerate's config file, the probes that failed."""

from __future__ import annotations

import re
from typing import Any

from xtrain.machine.facts import Facts
from xtrain.planning.checks.fixes import pip_line
from xtrain.planning.plan import Finding, Plan
from xtrain.shell import comment


def check_packages(facts: Facts, plan: Plan) -> list[Finding]:
    missing = [
        name
        for name in ("accelerate", "transformers", "peft", "datasets")
        if name in facts.packages and facts.packages[name] is None
    ]
    if not missing:
        return []
    return [
        Finding(
            "packages-missing",
            "error",
            f"Missing packages: {', '.join(missing)}.",
            pip_line(facts, plan, ["install", *missing]),
        )
    ]


def check_accelerate_config(facts: Facts, plan: Plan) -> list[Finding]:
    path = facts.accelerate_config_path or "accelerate's default config"
    fix = "\n".join(
        [
            comment("rewrite it for this machine (the old file is kept as a backup):"),
            "xtrain configure --force",
        ]
    )
    if facts.accelerate_config_error:
        return [
            Finding(
                "accelerate-config-invalid",
                "error",
                f"{path} cannot be loaded: {facts.accelerate_config_error}",
                fix,
            )
        ]
    cfg = facts.accelerate_config
    if not cfg:
        return [
            Finding(
                "accelerate-config-missing",
                "ok",
                "No accelerate default config yet: `xtrain configure` writes one.",
            )
        ]
    dtype = str(cfg.get("distributed_type", "NO"))
    if plan.os_kind == "windows" and dtype == "DEEPSPEED":
        return [
            Finding(
                "deepspeed-windows",
                "error",
                f"{path} asks for DeepSpeed, which does not run on native Windows (no NCCL, no "
                "prebuilt ops): use plain DDP here, or train under WSL2.",
                fix,
            )
        ]
    if plan.os_kind == "windows" and dtype == "FSDP":
        return [
            Finding(
                "fsdp-windows",
                "error",
                f"{path} asks for FSDP, which does not run on native Windows: its reduce-scatter goes "
                "through gloo's all-reduce, whose CUDA path the Windows wheels lack (pytorch#186535), "
                "and torchrun needs libuv (pytorch#148283). A model too big for one card trains "
                "there with model.quantization=4bit on each card (docs/fitting-big-models.md), or "
                "under WSL2.",
                fix,
            )
        ]
    problems = _config_problems(cfg, dtype, facts, plan)
    if not problems:
        return [Finding("accelerate-config", "ok", f"{path} matches this machine.")]
    return [
        Finding(
            "accelerate-config-mismatch",
            "warn",
            f"{path} does not fit this machine: {'; '.join(problems)}.",
            fix,
        )
    ]


def _config_problems(cfg: dict[str, Any], dtype: str, facts: Facts, plan: Plan) -> list[str]:
    """What in accelerate's config does not fit this machine and its plan (one phrase each)."""
    problems: list[str] = []
    machines = max(1, _as_int(cfg.get("num_machines"), 1))
    # accelerate's num_processes is the total over all machines (-1: not set).
    total = _as_int(cfg.get("num_processes"), 1)
    for key in ("num_processes", "num_machines"):
        if cfg.get(key) is not None and _as_int(cfg[key], -2) == -2:
            problems.append(f"{key} {cfg[key]!r} is not a number")
    per_machine = total // machines if total > 0 else 1
    # MULTI_GPU + use_cpu is how several CPU processes start (see xtrain/launch/accelerate_config.py)
    cpu_processes = dtype == "MULTI_GPU" and bool(cfg.get("use_cpu"))
    if dtype in ("MULTI_GPU", "FSDP", "DEEPSPEED") and plan.device != "cuda" and not cpu_processes:
        problems.append(f"distributed_type {dtype} but no CUDA GPU")
    if cfg.get("use_cpu") and plan.device == "cuda":
        problems.append("use_cpu is true but CUDA GPUs are available")
    if plan.device == "cuda" and per_machine > len(facts.gpus):
        problems.append(f"{per_machine} processes per machine but {len(facts.gpus)} GPU(s)")
    elif plan.device == "cuda" and per_machine < plan.num_processes:
        problems.append(
            f"{per_machine} process(es) per machine: `accelerate launch` would use {per_machine} of "
            f"{plan.num_processes} GPUs"
        )
    if plan.launcher == "spawn" and dtype == "MULTI_GPU" and per_machine > 1:
        problems.append(
            "distributed_type MULTI_GPU makes `accelerate launch` start torchrun, whose rendezvous "
            "needs libuv, which Windows torch lacks (xtrain's Windows config is NO with num_processes "
            f"{plan.num_processes}: xtrain.run then starts the workers)"
        )
    mp = cfg.get("mixed_precision")
    if mp == "bf16" and plan.device == "cuda" and min(g.cc for g in facts.gpus) < 8.0:
        problems.append("bf16 on GPUs without bf16 support")
    if mp == "fp16" and plan.device != "cuda":
        problems.append("fp16 without a CUDA GPU")
    ids = cfg.get("gpu_ids")
    if plan.device == "cuda" and ids not in (None, "all", ""):
        want = [int(x) for x in re.findall(r"\d+", str(ids))]
        have = {g.index for g in facts.gpus}
        if any(i not in have for i in want):
            problems.append(f"gpu_ids {ids} but GPUs {sorted(have)}")
    return problems


def _as_int(value: object, default: int) -> int:
    """An int from a hand-edited config value; ``default`` when it is not one."""
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return default


def check_probe_errors(facts: Facts, plan: Plan) -> list[Finding]:
    """Facts that could not be collected: the plan may rest on a guess there."""
    if not facts.probe_errors:
        return []
    what = "; ".join(f"{name}: {why}" for name, why in sorted(facts.probe_errors.items()))
    return [
        Finding(
            "probe-failed",
            "warn",
            f"Some facts could not be collected ({what}).",
            "\n".join(
                [
                    comment("if the plan looks wrong, save the facts and attach them to a bug report:"),
                    "xtrain doctor --save facts.json --force",
                ]
            ),
        )
    ]
