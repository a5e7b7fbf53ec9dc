"""Rules: pure functions from machine facts to a launch plan and findings.

Nothing here touches the machine: every input is in ``Facts`` (and the user's ``Overrides``),
so each platform is tested from a saved snapshot. The facts behind each rule are in
``../shared/FIELD_NOTES.md`` and explained for users in docs/rules.md and docs/findings.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from xtrain.errors import XtrainError
from xtrain.machine.facts import GPU, OS_KINDS, Facts
from xtrain.machine.torch_wheels import index_url, pick_tag, pinned_version
from xtrain.planning.plan import Diagnosis, Finding, Overrides, Plan
from xtrain.shell import comment, join_commands, pip_command, quote, set_env, shell_for, unset_env

PRECISIONS = ("no", "fp16", "bf16")
SMALL_SHM_MIB = 512  # below this NCCL's shared-memory transport fails (Docker's default is 64 MiB)
RTX40_P2P_FIXED_DRIVER = (550, 40, 7)  # accelerate: older drivers wrongly report P2P on RTX 40 cards


def is_geforce(gpu: GPU) -> bool:
    """Consumer GeForce cards (RTX 4090, 3090, ...), as opposed to datacenter/workstation parts."""
    name = gpu.name.upper()
    if "GEFORCE" in name or "TITAN" in name:
        return True
    # A bare "RTX 4090" is a GeForce card; "RTX 6000 Ada", "Quadro RTX 8000", "RTX A6000" are not.
    return bool(re.search(r"\bRTX [2-5]0[5-9]0\b", name)) and not re.search(r"QUADRO|ADA|\bRTX A", name)


def is_rtx40(gpu: GPU) -> bool:
    """Ada GeForce (RTX 40 series): no P2P between cards; NCCL hangs without NCCL_P2P_DISABLE."""
    return is_geforce(gpu) and bool(re.search(r"RTX 40\d\d", gpu.name.upper()))


def _version(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _os_kind(facts: Facts, overrides: Overrides) -> str:
    kind = overrides.platform or facts.os_kind
    if kind not in OS_KINDS:
        raise XtrainError(f"unknown platform {kind!r}", f"use one of {', '.join(OS_KINDS)}")
    return kind


def selected_gpus(facts: Facts, overrides: Overrides) -> list[GPU]:
    """The GPUs this plan uses: all visible ones, or the user's ``--gpus`` subset."""
    if not (facts.cuda_available and facts.gpus):
        if overrides.gpu_ids:
            raise XtrainError(
                f"--gpus {','.join(map(str, overrides.gpu_ids))} asked for, but torch sees no CUDA GPU",
                "run `xtrain doctor` to see why, or leave out --gpus",
            )
        return []
    if overrides.gpu_ids is None:
        return list(facts.gpus)
    by_index = {g.index: g for g in facts.gpus}
    missing = [i for i in overrides.gpu_ids if i not in by_index]
    if missing:
        raise XtrainError(
            f"--gpus asks for GPU {', '.join(map(str, missing))}, but torch sees only "
            f"{', '.join(map(str, sorted(by_index)))}",
            "pick GPU ids from `xtrain doctor`",
        )
    if len(set(overrides.gpu_ids)) != len(overrides.gpu_ids):
        raise XtrainError("--gpus lists a GPU twice", "give each GPU id once, e.g. --gpus 0,1")
    return [by_index[i] for i in overrides.gpu_ids]


def _p2p_missing(facts: Facts, gpus: list[GPU]) -> bool:
    """True when some pair of the selected GPUs cannot talk peer-to-peer."""
    if len(gpus) < 2:
        return False
    rtx40 = any(is_rtx40(g) for g in gpus)
    if rtx40 and _version(facts.driver_version) < RTX40_P2P_FIXED_DRIVER:
        # Older drivers (or an unknown one) report P2P that does not work: NCCL hangs (FIELD_NOTES).
        return True
    if facts.p2p:
        idx = [g.index for g in gpus]
        try:
            return not all(facts.p2p[a][b] for a in idx for b in idx if a != b)
        except IndexError:
            pass
    # No matrix (e.g. a snapshot without torch.cuda): fall back to what is known of the cards.
    return rtx40


def _precision(facts: Facts, device: str, gpus: list[GPU], asked: str | None) -> tuple[str, str]:
    """(mixed_precision, reason)."""
    min_cc = min((g.cc for g in gpus), default=0.0)
    if asked is not None:
        if asked not in PRECISIONS:
            raise XtrainError(f"unknown precision {asked!r}", f"use one of {', '.join(PRECISIONS)}")
        if asked == "fp16" and device != "cuda":
            raise XtrainError(
                f"fp16 needs a CUDA GPU, this plan runs on {device}",
                "use --precision no (or bf16 on a recent CPU)",
            )
        if asked == "bf16" and device == "cuda" and 0 < min_cc < 8.0:
            raise XtrainError(
                f"bf16 needs compute capability >= 8.0, the selected GPUs have {min_cc:.1f}",
                "use --precision fp16",
            )
        return asked, "chosen by the user"
    if device != "cuda":
        return "no", f"no CUDA GPU: fp32 on {device} (autocast gains little there)"
    if all(is_geforce(g) for g in gpus):
        return "fp16", (
            "GeForce card: fp16 autocast with a GradScaler (same tensor-core rate as bf16; fp16 "
            "keeps more mantissa bits but needs loss scaling, overflowing steps are skipped; "
            "--precision bf16 on compute capability >= 8.0 has fp32's range, no scaling)"
        )
    if min_cc >= 8.0:
        return "bf16", "datacenter GPU with compute capability >= 8.0: bf16 needs no loss scaling"
    return "fp16", f"compute capability {min_cc:.1f} < 8.0 has no fast bf16: fp16 with a GradScaler"


def _torchrun_works_on_windows(facts: Facts) -> bool:
    """On a real Windows machine: torch has libuv after all, or torchrun's stores honour
    USE_LIBUV=0 (a torch with the fix for pytorch#148283). A plan forced to Windows on another OS
    (``--platform windows``) keeps the Windows path whatever this machine's torch can do."""
    return facts.os_kind == "windows" and (facts.libuv_ok is True or facts.torchrun_honours_use_libuv is True)


def make_plan(facts: Facts, overrides: Overrides | None = None) -> Plan:
    """Resolve every "auto" setting for this machine in one place."""
    ov = overrides or Overrides()
    os_kind = _os_kind(facts, ov)
    shell = shell_for(os_kind)
    gpus = selected_gpus(facts, ov)
    reasons: dict[str, str] = {}

    if gpus:
        device = "cuda"
    elif facts.mps_available:
        device = "mps"
    else:
        device = "cpu"
    reasons["device"] = {
        "cuda": f"torch sees {len(gpus)} CUDA GPU(s)",
        "mps": "Apple GPU through MPS",
        "cpu": "no GPU usable by torch",
    }[device]

    # -- processes -------------------------------------------------------------------------
    if ov.num_processes is not None:
        if ov.num_processes < 1:
            raise XtrainError(f"--processes must be at least 1, got {ov.num_processes}", "e.g. --processes 2")
        if device == "cuda" and ov.num_processes > len(gpus):
            raise XtrainError(
                f"--processes {ov.num_processes} needs as many GPUs, {len(gpus)} selected",
                f"use --processes {len(gpus)} or fewer",
            )
        if device == "mps" and ov.num_processes > 1:
            raise XtrainError(
                "MPS runs one process (torch.distributed has no MPS backend)",
                "use --processes 1",
            )
        num_processes = ov.num_processes
        reasons["num_processes"] = "chosen by the user"
    elif device == "cuda":
        num_processes = len(gpus)
        reasons["num_processes"] = "one process per GPU (DDP)"
    else:
        num_processes = 1
        reasons["num_processes"] = f"one process on {device} (more CPU processes rarely train faster)"
    if device == "cuda" and num_processes < len(gpus):
        gpus = gpus[:num_processes]
    gpu_ids = [g.index for g in gpus] if device == "cuda" else None

    if ov.num_machines < 1:
        raise XtrainError(f"--machines must be at least 1, got {ov.num_machines}", "e.g. --machines 2")
    if not 0 <= ov.machine_rank < ov.num_machines:
        raise XtrainError(
            f"--machine-rank {ov.machine_rank} is outside 0..{ov.num_machines - 1}",
            "the main machine is rank 0, the others 1, 2, ...",
        )
    if ov.num_machines > 1 and not ov.main_address:
        raise XtrainError(
            "several machines need the main machine's address",
            "pass --main-address IP (the IP of the rank-0 machine)",
        )
    world_size = num_processes * ov.num_machines

    # -- backend and launcher ----------------------------------------------------------------
    if world_size == 1:
        backend = None
        reasons["backend"] = "one process: no process group"
    elif device == "cuda" and facts.nccl_available and os_kind != "windows":
        backend = "nccl"
        reasons["backend"] = "NCCL: the fast GPU collective library on Linux/WSL2"
    else:
        backend = "gloo"
        reasons["backend"] = {
            "windows": "Windows torch has no NCCL: gloo",
            "cuda": "this torch has no NCCL: gloo",
        }.get(os_kind if os_kind == "windows" else device, f"gloo on {device}")
    launcher = "spawn" if os_kind == "windows" and not _torchrun_works_on_windows(facts) else "accelerate"
    reasons["launcher"] = (
        "torch.multiprocessing spawn with a 127.0.0.1 rendezvous: torchrun's stores need libuv, "
        "which Windows torch lacks"
        if launcher == "spawn"
        else "accelerate launch (torchrun underneath)"
        + ("; this Windows torch's torchrun works without libuv" if os_kind == "windows" else "")
    )
    cpu_staged = device == "cuda" and backend == "gloo" and os_kind == "windows"
    if cpu_staged:
        reasons["cpu_staged_allreduce"] = (
            "gloo's CUDA all-reduce crashes on Windows (pytorch#186535): gradients are reduced "
            "through CPU copies"
        )

    mixed_precision, reasons["mixed_precision"] = _precision(facts, device, gpus, ov.mixed_precision)
    tf32 = device == "cuda" and min(g.cc for g in gpus) >= 8.0
    reasons["tf32"] = (
        "Ampere or newer: TF32 matmuls for the fp32 parts"
        if tf32
        else "TF32 needs a CUDA GPU with compute capability >= 8.0"
    )

    # -- environment ---------------------------------------------------------------------------
    env: dict[str, str] = {}
    if os_kind == "windows" or facts.libuv_ok is False:
        env["USE_LIBUV"] = "0"
    if backend == "nccl":
        if _p2p_missing(facts, gpus):
            env["NCCL_P2P_DISABLE"] = "1"
            env["NCCL_IB_DISABLE"] = "1"
        if facts.shm_mib is not None and facts.shm_mib < SMALL_SHM_MIB:
            env["NCCL_SHM_DISABLE"] = "1"
    if device == "cpu" and num_processes > 1:
        # Each process would start one compute thread per core: N processes on C cores then
        # oversubscribe, and OpenMP's spinning threads slow training down many times over
        # (measured here: 2 processes on 2 cores, 7x slower than with 1 thread each).
        env["OMP_NUM_THREADS"] = str(max(1, facts.cpu_count // num_processes))
        reasons["threads"] = f"{env['OMP_NUM_THREADS']} compute thread(s) per process: cores / processes"

    # -- data loading ----------------------------------------------------------------------------
    if device == "cuda" and os_kind in ("linux", "wsl2"):
        workers = max(0, min(4, facts.cpu_count // max(1, num_processes) - 1))
        reasons["dataloader_workers"] = "fork is cheap on Linux: a few workers per GPU process"
    else:
        workers = 0
        reasons["dataloader_workers"] = (
            "spawned workers re-import the program on Windows/macOS; tokenised data needs none"
            if os_kind in ("windows", "macos")
            else "CPU training: workers would take cores from compute"
        )
    pin_memory = device == "cuda" and os_kind != "wsl2"
    reasons["pin_memory"] = (
        "WSL2 limits pinned memory"
        if device == "cuda" and os_kind == "wsl2"
        else "pinned host memory speeds host-to-GPU copies"
        if pin_memory
        else "no GPU to copy to"
    )

    main_address = ov.main_address or "127.0.0.1"
    return Plan(
        os_kind=os_kind,
        shell=shell,
        device=device,
        backend=backend,
        num_processes=num_processes,
        gpu_ids=gpu_ids,
        mixed_precision=mixed_precision,
        tf32=tf32,
        launcher=launcher,
        cpu=device == "cpu",
        cpu_staged_allreduce=cpu_staged,
        env=env,
        main_address=main_address,
        main_port=ov.port if ov.port is not None else facts.port,
        num_machines=ov.num_machines,
        machine_rank=ov.machine_rank,
        dataloader_workers=workers,
        pin_memory=pin_memory,
        persistent_workers=workers > 0,
        reasons=reasons,
    )


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


def diagnose(facts: Facts, overrides: Overrides | None = None) -> Diagnosis:
    """Facts (+ user overrides) -> plan and findings. Pure: safe on any saved snapshot."""
    plan = make_plan(facts, overrides)
    findings = [f for check in CHECKS for f in check(facts, plan)]
    return Diagnosis(plan=plan, findings=findings)
