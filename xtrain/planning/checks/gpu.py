"""Checks of torch, the NVIDIA driver and the GPUs it shows."""

from __future__ import annotations

from xtrain.machine.facts import Facts, version_tuple
from xtrain.machine.torch_wheels import index_url, pinned_version
from xtrain.planning.checks.fixes import (
    driver_fix,
    driver_update_lines,
    pip_line,
    torch_install,
    torch_or_driver_fix,
)
from xtrain.planning.plan import Finding, Plan
from xtrain.shell import comment, quote, unset_env


def check_torch(facts: Facts, plan: Plan) -> list[Finding]:
    if facts.torch_version is None:
        return [
            Finding(
                "torch-missing",
                "error",
                "PyTorch is not installed in this Python.",
                torch_or_driver_fix(facts, plan, reinstall=False),
            )
        ]
    out: list[Finding] = []
    if facts.nvidia_smi and facts.torch_cuda is None:
        fix = torch_install(facts, plan, reinstall=True) or "\n".join(
            [
                *driver_update_lines(facts),
                comment("then install the CUDA build of torch:"),
                pip_line(
                    facts,
                    plan,
                    [
                        "install",
                        "--force-reinstall",
                        f"torch=={pinned_version(facts.torch_version)}",
                        "--index-url",
                        index_url("cu126"),
                    ],
                ),
            ]
        )
        why = (
            " (`pip install torch` on Windows always gives the CPU build)"
            if plan.os_kind == "windows"
            else ""
        )
        out.append(
            Finding(
                "cpu-torch-with-driver",
                "error",
                f"An NVIDIA driver is installed but torch {facts.torch_version} is a CPU-only build{why}.",
                fix,
            )
        )
    elif facts.torch_cuda and facts.nvidia_smi and not facts.cuda_available:
        out.append(
            Finding(
                "cuda-unavailable",
                "error",
                f"torch is built for CUDA {facts.torch_cuda} but cannot use the GPU "
                f"(driver {facts.driver_version or 'unknown'}).",
                "\n".join(
                    [
                        comment("update the NVIDIA driver and reboot; then nvidia-smi must list the GPUs:"),
                        "nvidia-smi",
                    ]
                ),
            )
        )
    return out


def check_driver(facts: Facts, plan: Plan) -> list[Finding]:
    need, have = version_tuple(facts.torch_cuda), version_tuple(facts.driver_cuda)
    if not (need and have) or have >= need[:2]:
        return []
    if have[0] < need[0]:
        return [
            Finding(
                "driver-too-old",
                "error",
                f"The driver supports CUDA up to {facts.driver_cuda}, torch needs CUDA {facts.torch_cuda}.",
                driver_fix(facts, plan),
            )
        ]
    return [
        Finding(
            "driver-older-than-build",
            "warn",
            f"The driver supports CUDA {facts.driver_cuda}, torch was built with {facts.torch_cuda}: "
            "it runs through minor-version compatibility, but JIT-compiled kernels may fail.",
            "\n".join(
                [
                    comment("optional: update the NVIDIA driver when convenient; it supports now:"),
                    "nvidia-smi",
                ]
            ),
        )
    ]


def check_no_gpu(facts: Facts, plan: Plan) -> list[Finding]:
    if plan.device == "cpu" and not facts.nvidia_smi and facts.torch_version:
        return [
            Finding("cpu-only", "ok", "No GPU: xtrain trains on the CPU (slow, but every feature works).")
        ]
    if plan.device == "mps":
        return [Finding("mps", "ok", "Apple GPU (MPS): one process; torch.distributed has no MPS backend.")]
    if plan.device == "cuda":
        counts: dict[str, int] = {}
        for g in facts.gpus:
            counts[g.name] = counts.get(g.name, 0) + 1
        names = ", ".join(f"{n}x {name}" for name, n in counts.items())
        return [
            Finding(
                "gpus",
                "ok",
                f"torch {facts.torch_version} (CUDA {facts.torch_cuda}) "
                f"sees {len(facts.gpus)} GPU(s): {names}.",
            )
        ]
    return []


def check_visible_devices(facts: Facts, plan: Plan) -> list[Finding]:
    cvd = facts.cuda_visible_devices
    if cvd is None or facts.torch_cuda is None or facts.smi_gpu_count is None:
        return []  # a CPU build hides every GPU whatever the variable says (check_torch covers it)
    if facts.smi_gpu_count <= len(facts.gpus):
        return []
    return [
        Finding(
            "cuda-visible-devices",
            "warn",
            f"CUDA_VISIBLE_DEVICES={cvd!r} hides {facts.smi_gpu_count - len(facts.gpus)} of "
            f"{facts.smi_gpu_count} GPUs from torch.",
            "\n".join(
                [
                    unset_env(plan.shell, "CUDA_VISIBLE_DEVICES"),
                    comment(
                        "or keep it and choose GPUs with --gpus, e.g. xtrain train CONFIG "
                        f"--gpus {quote(plan.shell, '0,1')}"  # PowerShell: an unquoted 0,1 is an array
                    ),
                ]
            ),
        )
    ]


def check_mismatched_gpus(facts: Facts, plan: Plan) -> list[Finding]:
    gpus = [g for g in facts.gpus if plan.gpu_ids and g.index in plan.gpu_ids]
    if len({(g.name, g.memory_mib // 1024) for g in gpus}) <= 1:
        return []
    slowest = min(gpus, key=lambda g: (g.cc, g.memory_mib))
    kinds = ", ".join(sorted({g.name for g in gpus}))
    same = [g.index for g in gpus if g.name == max(gpus, key=lambda g: g.cc).name]
    return [
        Finding(
            "mismatched-gpus",
            "warn",
            f"Different GPUs ({kinds}): every step waits for the slowest ({slowest.name}) and the "
            "smallest memory sets the batch.",
            "\n".join(
                [
                    comment("use only the matching cards:"),
                    f"xtrain configure --gpus {quote(plan.shell, ','.join(map(str, same)))} --force",
                ]
            ),
        )
    ]
