"""Rules: a pure function from machine facts (and the user's overrides) to the launch plan
(``make_plan``). The checks of ``xtrain.planning.checks`` read the plan it makes; both are called
from ``xtrain.planning.resolve``.

Nothing here touches the machine: every input is in ``Facts`` (and the user's ``Overrides``),
so each platform is tested from a saved snapshot. The facts behind each rule are in
``../shared/FIELD_NOTES.md`` and explained for users in docs/rules.md and docs/findings.md.
"""

from __future__ import annotations

from xtrain.errors import XtrainError
from xtrain.machine.facts import GPU, Facts, is_geforce, is_rtx40, version_tuple
from xtrain.planning.plan import Overrides, Plan
from xtrain.planning.threads import THREADS_ENV, cpu_threads
from xtrain.shell import shell_for

SMALL_SHM_MIB = 512  # below this NCCL's shared-memory transport fails (Docker's default is 64 MiB)
RTX40_P2P_FIXED_DRIVER = (550, 40, 7)  # accelerate: older drivers wrongly report P2P on RTX 40 cards


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
    if rtx40 and version_tuple(facts.driver_version) < RTX40_P2P_FIXED_DRIVER:
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


HALF_DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16"}


def weights_half(weights_dtype: str | None, checkpoint_dtype: str | None) -> tuple[str | None, str]:
    """(the 16-bit format the weights are in: bf16 | fp16 | None, and where that comes from):
    ``model.dtype`` when it names one, else (``auto``) the checkpoint's own dtype (config.json's
    ``torch_dtype``/``dtype``), which is what ``auto`` loads on a GPU. An explicit float32 load
    of a bf16 checkpoint still holds bf16-trained values: their range is bf16's."""
    explicit = HALF_DTYPES.get(str(weights_dtype).removeprefix("torch."))
    if explicit is not None:
        return explicit, f"model.dtype: {weights_dtype}"
    saved = HALF_DTYPES.get(str(checkpoint_dtype).removeprefix("torch."))
    if saved is not None:
        return saved, f"the checkpoint's config.json says {checkpoint_dtype}"
    return None, ""


def machine_precision(device: str, gpus: list[GPU]) -> tuple[str, str]:
    """(mixed_precision, reason) for the machine alone, without a model: what ``xtrain configure``
    writes into accelerate's config (it plans without a train config)."""
    min_cc = min((g.cc for g in gpus), default=0.0)
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


def _check_asked(asked: str, device: str, min_cc: float, who: str = "") -> None:
    """An explicit precision the device cannot run: one line (``who``: where it came from, when
    not from the user's own flag or config)."""
    if asked == "fp16" and device != "cuda":
        raise XtrainError(
            f"fp16{who} needs a CUDA GPU, this plan runs on {device}",
            "use --precision no (or bf16 on a recent CPU)",
        )
    if asked == "bf16" and device == "cuda" and 0 < min_cc < 8.0:
        raise XtrainError(
            f"bf16{who} needs compute capability >= 8.0, the selected GPUs have {min_cc:.1f}",
            "use --precision fp16",
        )


def _precision(device: str, gpus: list[GPU], ov: Overrides) -> tuple[str, str]:
    """(mixed_precision, reason), in this order: the user's choice (``--precision``,
    ``run.mixed_precision``); the one ``accelerate launch`` exported where it differs from the
    machine's default (a config or ``--mixed_precision`` the user chose; the default is what
    ``xtrain configure`` writes, so its config is not a choice and both launchers agree); bf16 for
    weights in bf16 (``model.dtype``, else the checkpoint's dtype) on compute capability >= 8.0;
    else the machine's default."""
    min_cc = min((g.cc for g in gpus), default=0.0)
    machine, why = machine_precision(device, gpus)
    if ov.mixed_precision is not None:
        _check_asked(ov.mixed_precision, device, min_cc)
        return ov.mixed_precision, "chosen by the user"
    launched = ov.launcher_precision
    if launched is not None and launched != machine:
        _check_asked(launched, device, min_cc, " (exported by accelerate launch)")
        return launched, (
            f"accelerate launch exported {launched} (its config or --mixed_precision): the user's "
            f"choice, since it differs from this machine's default {machine}"
        )
    half, source = weights_half(ov.weights_dtype, ov.checkpoint_dtype)
    if device == "cuda" and half == "bf16" and min_cc >= 8.0:
        return "bf16", (
            f"bf16 weights, {source}: bf16 autocast keeps their range (fp16 tops out at 65504 "
            "and can overflow); compute capability >= 8.0 runs bf16 at full rate"
        )
    return machine, why


def _torchrun_works_on_windows(facts: Facts) -> bool:
    """On a real Windows machine: torch has libuv after all, or torchrun's stores honour
    USE_LIBUV=0 (a torch with the fix for pytorch#148283). A plan forced to Windows on another OS
    (``--platform windows``) keeps the Windows path whatever this machine's torch can do."""
    return facts.os_kind == "windows" and (facts.libuv_ok is True or facts.torchrun_honours_use_libuv is True)


def make_plan(facts: Facts, overrides: Overrides | None = None) -> Plan:
    """Resolve every "auto" setting for this machine in one place (each ``_plan_*`` step adds
    its reasons, in the order doctor shows them)."""
    ov = overrides or Overrides()
    ov.check()
    os_kind = ov.platform or facts.os_kind
    gpus = selected_gpus(facts, ov)
    reasons: dict[str, str] = {}
    device = _plan_device(facts, gpus, reasons)
    num_processes = _plan_processes(ov, device, gpus, reasons)
    if device == "cuda" and num_processes < len(gpus):
        gpus = gpus[:num_processes]
    world_size = num_processes * ov.num_machines
    backend, launcher, cpu_staged = _plan_backend(facts, os_kind, device, world_size, reasons)
    mixed_precision, reasons["mixed_precision"] = _precision(device, gpus, ov)
    tf32 = device == "cuda" and min(g.cc for g in gpus) >= 8.0
    reasons["tf32"] = (
        "Ampere or newer: TF32 matmuls for the fp32 parts"
        if tf32
        else "TF32 needs a CUDA GPU with compute capability >= 8.0"
    )
    threads, why = cpu_threads(facts, device, num_processes, ov.cpu_threads)
    if why is not None:
        reasons["threads"] = why
    env = _plan_env(facts, os_kind, device, backend, gpus, threads)
    workers, media_workers, pin_memory = _plan_loading(facts, os_kind, device, num_processes, reasons)
    return Plan(
        os_kind=os_kind,
        shell=shell_for(os_kind),
        device=device,
        backend=backend,
        num_processes=num_processes,
        gpu_ids=[g.index for g in gpus] if device == "cuda" else None,
        mixed_precision=mixed_precision,
        tf32=tf32,
        launcher=launcher,
        cpu=device == "cpu",
        cpu_staged_allreduce=cpu_staged,
        env=env,
        main_address=ov.main_address or "127.0.0.1",
        main_port=ov.port if ov.port is not None else facts.port,
        num_machines=ov.num_machines,
        machine_rank=ov.machine_rank,
        dataloader_workers=workers,
        media_workers=media_workers,
        pin_memory=pin_memory,
        cpu_threads=threads,
        compile_blocker=compile_blocker(os_kind, device, bool(facts.packages.get("triton"))),
        weights_half=weights_half(ov.weights_dtype, ov.checkpoint_dtype)[0],
        reasons=reasons,
    )


def compile_blocker(os_kind: str, device: str, triton: bool) -> str | None:
    """Why ``run.compile`` (torch.compile, inductor) cannot work; None where it can. inductor
    writes its GPU kernels in Triton; on CPU it writes C++ (Linux, macOS: the system compiler),
    and on Windows torch's inductor wants Triton too (PyPI's ``triton-windows``: torch's Windows
    wheels do not bring it). Pure: from the OS, the device and whether Triton is installed."""
    if triton:
        return None
    if os_kind == "windows":
        return "torch.compile needs Triton on Windows, and it is not installed"
    if device == "cuda":
        return "torch.compile writes its GPU kernels with Triton, which is not installed"
    return None


def _plan_device(facts: Facts, gpus: list[GPU], reasons: dict[str, str]) -> str:
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
    return device


def _plan_processes(ov: Overrides, device: str, gpus: list[GPU], reasons: dict[str, str]) -> int:
    """Processes on this machine: the user's number (checked against the device), else one per GPU."""
    if ov.num_processes is not None:
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
        reasons["num_processes"] = "chosen by the user"
        return ov.num_processes
    if device == "cuda":
        reasons["num_processes"] = "one process per GPU (DDP)"
        return len(gpus)
    reasons["num_processes"] = f"one process on {device} (more CPU processes rarely train faster)"
    return 1


def _plan_backend(
    facts: Facts, os_kind: str, device: str, world_size: int, reasons: dict[str, str]
) -> tuple[str | None, str, bool]:
    """(collective backend, launcher, whether gradients are reduced through CPU copies)."""
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
        "torch.multiprocessing spawn, meeting through a file in a private folder (no socket): "
        "torchrun's stores need libuv, which Windows torch lacks"
        if launcher == "spawn"
        else "accelerate launch (torchrun underneath)"
        + ("; this Windows torch's torchrun works without libuv" if os_kind == "windows" else "")
        + ("; one process: xtrain train runs it without a launcher" if world_size == 1 else "")
    )
    cpu_staged = device == "cuda" and backend == "gloo" and os_kind == "windows"
    if cpu_staged:
        reasons["cpu_staged_allreduce"] = (
            "gloo's CUDA all-reduce crashes on Windows (pytorch#186535): gradients are reduced "
            "through CPU copies"
        )
    return backend, launcher, cpu_staged


def _plan_env(
    facts: Facts, os_kind: str, device: str, backend: str | None, gpus: list[GPU], threads: int | None
) -> dict[str, str]:
    """The environment variables every worker gets; ``threads``: the compute threads of each
    (``threads.cpu_threads``), set before the worker's first import of torch."""
    env: dict[str, str] = {}
    if os_kind == "windows" or facts.libuv_ok is False:
        env["USE_LIBUV"] = "0"
    if backend == "nccl":
        if _p2p_missing(facts, gpus):
            env["NCCL_P2P_DISABLE"] = "1"
            env["NCCL_IB_DISABLE"] = "1"
        if facts.shm_mib is not None and facts.shm_mib < SMALL_SHM_MIB:
            env["NCCL_SHM_DISABLE"] = "1"
    if threads is not None:
        # Each process would start one compute thread per core: N processes on C cores, or one on a
        # busy CPU, then oversubscribe, and OpenMP's spinning threads slow training down many times
        # over (measured here: 2 processes on 2 cores, 7x slower than with 1 thread each)
        env[THREADS_ENV] = str(threads)
    return env


def _plan_loading(
    facts: Facts, os_kind: str, device: str, num_processes: int, reasons: dict[str, str]
) -> tuple[int, int, bool]:
    """(DataLoader workers per process for tokenised rows, for rows that decode images or audio,
    pinned memory). Workers are persistent (``xtrain.train.loop``): a spawned worker's start
    (Windows, macOS) is paid once per run, not once per epoch."""
    cores = facts.cpu_count // max(1, num_processes)  # this process's share of the cores
    spare = max(0, min(4, cores - 1))  # one core stays with the training process
    if device == "cuda" and os_kind in ("linux", "wsl2"):
        workers = spare
        reasons["dataloader_workers"] = "fork is cheap on Linux: a few workers per GPU process"
    else:
        workers = 0
        reasons["dataloader_workers"] = (
            "spawned workers re-import the program on Windows/macOS; tokenised data needs none"
            if os_kind in ("windows", "macos")
            else "CPU training: workers would take cores from compute"
        )
    if device != "cpu":
        # decoding images/audio costs a step's worth of time: workers decode the next batches
        # while the GPU trains, on every OS (spawned ones on Windows/macOS are persistent)
        media = max(1, spare)
        reasons["media_workers"] = (
            "images and audio decode while the GPU trains (cores per process - 1, at most 4; "
            "persistent: a spawned worker starts once)"
        )
    else:
        # CPU training: a worker shares the cores with compute; it pays off only with cores to spare
        media = 1 if cores >= 4 else 0
        reasons["media_workers"] = (
            f"CPU training on {cores} core(s) per process: one worker decodes while the rest compute"
            if media
            else f"CPU training on {cores} core(s) per process: a worker would take a core from compute"
        )
    pin_memory = device == "cuda" and os_kind != "wsl2"
    reasons["pin_memory"] = (
        "WSL2 limits pinned memory"
        if device == "cuda" and os_kind == "wsl2"
        else "pinned host memory speeds host-to-GPU copies"
        if pin_memory
        else "no GPU to copy to"
    )
    return workers, media, pin_memory
