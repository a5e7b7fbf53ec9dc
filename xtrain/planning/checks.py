"""Checks: pure functions from machine facts and the plan to findings with exact fixes.

Each ``check_x(facts, plan)`` returns zero or more ``Finding``s (a stable code, a severity,
one sentence, the fix in the user's shell); ``CHECKS`` is the order doctor shows them in. The
facts behind each check are in ``../shared/FIELD_NOTES.md`` and explained for users in
docs/findings.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from xtrain.machine.facts import Facts
from xtrain.machine.torch_wheels import index_url, pick_tag, pinned_version
from xtrain.planning.plan import Finding, Plan
from xtrain.planning.rules import (
    SMALL_SHM_MIB,
    _version,
    is_rtx40,
)
from xtrain.shell import comment, join_commands, pip_command, quote, set_env, unset_env

# ======================================================================================
# Findings: each check looks at facts (and the plan) and returns zero or more findings.
# ======================================================================================
Check = Callable[[Facts, Plan], list[Finding]]


def _min_cc(facts: Facts) -> float | None:
    """Lowest compute capability of the cards: torch's view, else guessed from nvidia-smi names."""
    caps = [g.cc for g in facts.gpus if g.cc] or [
        cc for cc in (_cc_from_name(n) for n in facts.smi_gpu_names) if cc is not None
    ]
    return min(caps) if caps else None


def _torch_index_tag(facts: Facts) -> str | None:
    """The PyTorch wheel index tag of this torch release that the installed driver runs."""
    return pick_tag(facts.torch_version, facts.driver_cuda, facts.driver_version, _min_cc(facts))


def _pip(facts: Facts, plan: Plan, args: list[str]) -> str:
    """pip run by the interpreter that runs xtrain, in the user's shell."""
    return pip_command(plan.shell, facts.python_executable or None, args)


def _torch_install(facts: Facts, plan: Plan, reinstall: bool) -> str | None:
    """The pip line for this torch release in the CUDA build the driver runs (PyPI's build on a
    machine without an NVIDIA driver); None when the driver runs no build of this release."""
    args = ["install"] + (["--force-reinstall"] if reinstall else [])
    args.append(f"torch=={pinned_version(facts.torch_version)}")
    if facts.nvidia_smi:
        tag = _torch_index_tag(facts)
        if tag is None:
            return None
        args += ["--index-url", index_url(tag)]
    return _pip(facts, plan, args)


def _driver_update_lines(facts: Facts) -> list[str]:
    """Comment + check command for "update the driver" (there is no command that does it)."""
    have = f" (it supports CUDA {facts.driver_cuda})" if facts.driver_cuda else ""
    return [
        comment(
            f"update the NVIDIA driver{have} to one for CUDA 12.6 or newer, reboot, then check "
            "the CUDA Version that nvidia-smi reports:"
        ),
        "nvidia-smi",
    ]


def _cc_from_name(name: str) -> float | None:
    """Rough compute capability from a GPU name, for snapshots where torch cannot see the GPU."""
    n = name.upper()
    for pattern, cc in (
        (r"RTX 50\d\d|B200|B100", 10.0),
        (r"H100|H200|H800|GH200", 9.0),
        (r"RTX 40\d\d|L40|L4\b|ADA", 8.9),
        (r"RTX 30\d\d|A10|A40|RTX A\d", 8.6),
        (r"A100|A800|A30", 8.0),
        (r"RTX 20\d\d|T4|TITAN RTX", 7.5),
        (r"V100", 7.0),
        (r"GTX 10\d\d|P100|P40", 6.1),
    ):
        if re.search(pattern, n):
            return cc
    return None


def check_torch(facts: Facts, plan: Plan) -> list[Finding]:
    if facts.torch_version is None:
        return [
            Finding(
                "torch-missing",
                "error",
                "PyTorch is not installed in this Python.",
                _torch_install(facts, plan, reinstall=False) or "\n".join(_driver_update_lines(facts)),
            )
        ]
    out: list[Finding] = []
    if facts.nvidia_smi and facts.torch_cuda is None:
        fix = _torch_install(facts, plan, reinstall=True) or "\n".join(
            [
                *_driver_update_lines(facts),
                comment("then install the CUDA build of torch:"),
                _pip(
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
    need, have = _version(facts.torch_cuda), _version(facts.driver_cuda)
    if not (need and have) or have >= need[:2]:
        return []
    if have[0] < need[0]:
        return [
            Finding(
                "driver-too-old",
                "error",
                f"The driver supports CUDA up to {facts.driver_cuda}, torch needs CUDA {facts.torch_cuda}.",
                _driver_fix(facts, plan),
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
                _torch_install(facts, plan, reinstall=True) or "\n".join(_driver_update_lines(facts)),
            )
        )
    if plan.backend == "gloo" and not facts.gloo_available:
        out.append(
            Finding(
                "gloo-missing",
                "error",
                "This torch build has no gloo backend: processes cannot form a group.",
                _torch_install(facts, plan, reinstall=True) or "\n".join(_driver_update_lines(facts)),
            )
        )
    return out


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


# gloo binds its transport to the address the hostname resolves to, unless GLOO_SOCKET_IFNAME
# names an interface (FIELD_NOTES, turn 2). On one machine the fix is to pin gloo to loopback,
# not to rename the host. Linux calls the loopback "lo", macOS "lo0". Windows: torch's gloo uses
# the libuv transport there (GlooDeviceFactory.cpp registers makeUVDevice for WIN32), which
# matches GLOO_SOCKET_IFNAME with strcmp against uv_interface_addresses() names; libuv on
# Windows takes those from the adapter's FriendlyName (src/win/util.c), i.e. PowerShell's
# InterfaceAlias, "Loopback Pseudo-Interface 1" on an English install (loopback adapters are
# listed, with 127.0.0.1 and ::1). Not run on Windows here, and the alias may differ by
# language, so the fix asks Windows for the alias of 127.0.0.1 instead of spelling it out. The
# rendezvous itself is already 127.0.0.1 in xtrain's single-machine plans.
LOOPBACK_IFNAME = {"linux": "lo", "wsl2": "lo", "macos": "lo0"}
WINDOWS_LOOPBACK_ALIAS = "(Get-NetIPAddress -IPAddress 127.0.0.1).InterfaceAlias"


def _gloo_loopback_fix(plan: Plan) -> str:
    if plan.shell == "powershell":
        return "\n".join(
            [
                comment(
                    "pin gloo to the loopback adapter (its Windows alias, e.g. Loopback Pseudo-Interface 1):"
                ),
                f"$env:GLOO_SOCKET_IFNAME = {WINDOWS_LOOPBACK_ALIAS}",
            ]
        )
    return set_env(plan.shell, "GLOO_SOCKET_IFNAME", LOOPBACK_IFNAME.get(plan.os_kind, "lo"))


def _hosts_entry_fix(facts: Facts, plan: Plan) -> str:
    """Several machines: the name must resolve to this machine's LAN address on every peer."""
    if plan.shell == "powershell":
        ip = (
            "(Get-NetIPConfiguration | Where-Object IPv4DefaultGateway | Select-Object -First 1)"
            ".IPv4Address[0].IPAddress"
        )
        return "\n".join(
            [
                comment("as Administrator: map this PC's name to its LAN address"),
                'Add-Content -Path "$env:SystemRoot\\System32\\drivers\\etc\\hosts" '
                f'-Value "$({ip}) $env:COMPUTERNAME"',
            ]
        )
    return 'echo "$(hostname -I | cut -d" " -f1) $(hostname)" | sudo tee -a /etc/hosts'


def check_hostname(facts: Facts, plan: Plan) -> list[Finding]:
    pinned = "GLOO_SOCKET_IFNAME" in facts.launch_env  # gloo then never looks at the hostname
    one_machine = plan.num_machines == 1
    if not facts.hostname.strip():
        if pinned and one_machine:
            return []
        if one_machine:
            fix = _gloo_loopback_fix(plan)
        elif plan.shell == "powershell":
            fix = "\n".join([comment("as Administrator, then reboot:"), "Rename-Computer -NewName xtrain-pc"])
        else:
            fix = "sudo hostnamectl set-hostname xtrain-pc"
        return [
            Finding(
                "hostname-empty",
                "error",
                'The hostname is empty: gloo fails with "makeUVDevice(): interface or hostname '
                "can't be empty\" unless GLOO_SOCKET_IFNAME names an interface.",
                fix,
            )
        ]
    if facts.hostname_resolves is False and not (pinned and one_machine):
        return [
            Finding(
                "hostname-unresolvable",
                "warn" if one_machine else "error",
                f"The hostname {facts.hostname!r} does not resolve: gloo binds to the hostname's "
                "address, and torchelastic publishes the name to its peers"
                + (
                    " (on one machine, pin gloo to loopback with GLOO_SOCKET_IFNAME; xtrain's "
                    "rendezvous is already 127.0.0.1)."
                    if one_machine
                    else "."
                ),
                _gloo_loopback_fix(plan) if one_machine else _hosts_entry_fix(facts, plan),
            )
        ]
    return []


def check_port(facts: Facts, plan: Plan) -> list[Finding]:
    if facts.port_free is False and plan.main_port == facts.port:
        return [
            Finding(
                "port-busy",
                "warn" if plan.world_size > 1 else "ok",
                f"Port {facts.port} (the default rendezvous port) is in use: another training may be "
                "running.",
                "\n".join(
                    [
                        f"xtrain configure --port {facts.port + 1} --force",
                        comment(f"or stop the other job that holds port {facts.port}"),
                    ]
                ),
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
                    comment("or keep it and choose GPUs with --gpus, e.g. xtrain train CONFIG --gpus 0,1"),
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
            _pip(facts, plan, ["install", *missing]),
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
    problems: list[str] = []
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


def _as_int(value: object, default: int) -> int:
    """An int from a hand-edited config value; ``default`` when it is not one."""
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return default


def _driver_fix(facts: Facts, plan: Plan) -> str:
    install = _torch_install(facts, plan, reinstall=True)
    if install is None:
        return "\n".join(_driver_update_lines(facts))
    return "\n".join(
        [comment("update the NVIDIA driver, or install the torch build this driver runs:"), install]
    )


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


CHECKS: tuple[Check, ...] = (
    check_torch,
    check_driver,
    check_no_gpu,
    check_backend,
    check_libuv,
    check_p2p,
    check_shm,
    check_hostname,
    check_port,
    check_visible_devices,
    check_mismatched_gpus,
    check_packages,
    check_accelerate_config,
    check_probe_errors,
)
