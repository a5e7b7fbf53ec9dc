"""Checks of how processes talk: the collective backend (NCCL, gloo), libuv for torchrun's store,
NCCL's P2P and shared-memory transports."""

from __future__ import annotations

from xtrain.errors import XtrainError
from xtrain.machine.facts import Facts, is_rtx40
from xtrain.machine.torch_wheels import RECOMMENDED_TORCH, WINDOWS_GLOO_FALLBACK, windows_gloo_broken
from xtrain.planning.checks.fixes import driver_update_lines, torch_install, torch_or_driver_fix
from xtrain.planning.plan import Finding, Plan
from xtrain.planning.rules import SMALL_SHM_MIB
from xtrain.shell import comment, join_commands, set_env


def check_backend(facts: Facts, plan: Plan) -> list[Finding]:
    out: list[Finding] = []
    multi_gpu = plan.device == "cuda" and plan.world_size > 1
    if plan.os_kind == "windows" and multi_gpu:
        out.append(
            Finding(
                "nccl-absent-windows",
                "warn",
                "Windows torch has no NCCL: xtrain uses gloo (works; about 1.6-1.8x on 2 GPUs "
                "instead of 1.9-2.0x with NCCL under WSL2; to switch, install WSL2 and see docs/wsl2.md).",
                "\n".join(
                    [
                        comment("optional, for NCCL speed: train under WSL2 (docs/wsl2.md)"),
                        "wsl --install -d Ubuntu",
                    ]
                ),
            )
        )
    elif multi_gpu and not facts.nccl_available:
        out.append(
            Finding(
                "nccl-missing",
                "warn",
                "This torch build has no NCCL: gloo will be used for GPU gradients (slow).",
                torch_or_driver_fix(facts, plan, reinstall=True),
            )
        )
    if plan.backend == "gloo" and not facts.gloo_available:
        out.append(
            Finding(
                "gloo-missing",
                "error",
                "This torch build has no gloo backend: processes cannot form a group.",
                torch_or_driver_fix(facts, plan, reinstall=True),
            )
        )
    return out


def check_windows_gloo(facts: Facts, plan: Plan) -> list[Finding]:
    """Windows builds of torch 2.8-2.10 have no gloo transport (pytorch#150381): a process group
    cannot form, so several processes cannot train (one still does)."""
    if plan.os_kind != "windows" or not facts.gloo_available or not windows_gloo_broken(facts.torch_version):
        return []
    several = plan.distributed
    # the recommended release where the driver runs a build of it, else the last one before the break
    install = torch_install(facts, plan, reinstall=False, version=RECOMMENDED_TORCH) or torch_install(
        facts, plan, reinstall=False, version=WINDOWS_GLOO_FALLBACK
    )
    lines = (
        [comment("install a torch whose Windows build has gloo's transport:"), install]
        if install
        else driver_update_lines(facts)
    )
    lines.append(comment("torchvision and torchaudio, if installed, need the matching release (same index)"))
    return [
        Finding(
            "gloo-windows-broken",
            "error" if several else "warn",
            f"torch {facts.torch_version} for Windows was built without gloo's transport: "
            "init_process_group fails with 'makeDeviceForHostname(): unsupported gloo device' "
            "(pytorch#150381; Windows builds of 2.8, 2.9 and 2.10), so "
            + ("these processes cannot form a group." if several else "one process trains, several cannot."),
            "\n".join(lines),
        )
    ]


def windows_gloo_refusal(facts: Facts, plan: Plan) -> XtrainError | None:
    """What `xtrain train` says, in one line, before it starts several processes on a Windows torch
    without gloo's transport (``check_windows_gloo``'s error); None where the plan can run."""
    found = [f for f in check_windows_gloo(facts, plan) if f.severity == "error"]
    if not found:
        return None
    install = next((line for line in (found[0].fix or "").splitlines() if not line.startswith("#")), None)
    return XtrainError(
        f"torch {facts.torch_version} for Windows cannot start {plan.world_size} processes: its gloo has "
        "no transport ('unsupported gloo device', pytorch#150381)",
        (f"install a torch that can: {install}" if install else "update the NVIDIA driver, then torch")
        + "; or train on one GPU with --processes 1",
    )


def check_libuv(facts: Facts, plan: Plan) -> list[Finding]:
    if not plan.distributed:
        return []  # one process starts no TCPStore: libuv does not matter
    if plan.os_kind == "windows" and plan.launcher == "spawn":
        return [
            Finding(
                "libuv",
                "warn",
                "Windows torch lacks libuv, and torchrun's rendezvous stores ignore USE_LIBUV "
                "(pytorch#148283): torchrun, and `accelerate launch` with a MULTI_GPU config, fail "
                "with 'use_libuv was requested but PyTorch was built without libuv support'. "
                "xtrain runs no torchrun here: `xtrain train`, `python -m xtrain.run --processes N` "
                "and `accelerate launch -m xtrain.run` with the config `xtrain configure` writes "
                "(one process from accelerate, the workers from xtrain.run) all work. USE_LIBUV=0 "
                "is for your own init_process_group scripts.",
                set_env(plan.shell, "USE_LIBUV", "0"),
            )
        ]
    if facts.libuv_ok is False:
        return [
            Finding(
                "libuv",
                "warn",
                "TCPStore could not start with libuv on this machine"
                + (f" ({facts.libuv_error})" if facts.libuv_error else "")
                + ": xtrain sets USE_LIBUV=0 for its launches.",
                set_env(plan.shell, "USE_LIBUV", "0"),
            )
        ]
    return []


def check_p2p(facts: Facts, plan: Plan) -> list[Finding]:
    if "NCCL_P2P_DISABLE" not in plan.env:
        return []
    rtx40 = any(is_rtx40(g) for g in facts.gpus)
    why = (
        "RTX 40-series cards have no peer-to-peer access"
        if rtx40
        else "these GPUs cannot access each other peer-to-peer"
    )
    fix = join_commands([set_env(plan.shell, k, "1") for k in ("NCCL_P2P_DISABLE", "NCCL_IB_DISABLE")])
    return [
        Finding(
            "p2p-missing",
            "warn",
            f"{why}: NCCL hangs unless NCCL_P2P_DISABLE=1 (xtrain sets it for its own launches; "
            "set it yourself for other launchers).",
            fix,
        )
    ]


def check_shm(facts: Facts, plan: Plan) -> list[Finding]:
    out: list[Finding] = []
    on_linux = plan.os_kind in ("linux", "wsl2")  # /dev/shm (a forced --platform windows has none)
    if on_linux and facts.shm_mib is not None and facts.shm_mib < SMALL_SHM_MIB and plan.world_size > 1:
        lines = ["sudo mount -o remount,size=8G /dev/shm"]
        if plan.os_kind == "wsl2":
            lines.append(comment("or, instead: export NCCL_SHM_DISABLE=1"))
        if plan.os_kind == "linux":
            lines.append(comment("in Docker: start the container with docker run --shm-size=8g ..."))
        sets = " (xtrain sets NCCL_SHM_DISABLE=1)" if "NCCL_SHM_DISABLE" in plan.env else ""
        out.append(
            Finding(
                "shm-small",
                "warn",
                f"/dev/shm is only {facts.shm_mib} MiB: NCCL and DataLoader workers need more{sets}.",
                "\n".join(lines),
            )
        )
    if plan.os_kind == "wsl2" and plan.device == "cuda":
        out.append(
            Finding(
                "wsl2-pinned-memory",
                "ok",
                "WSL2 limits pinned memory: xtrain turns DataLoader pin_memory off here.",
            )
        )
    return out
