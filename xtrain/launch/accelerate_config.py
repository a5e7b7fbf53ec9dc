"""The accelerate config file for a plan: build it, write it safely, check it with accelerate.

``config_for`` is pure (plan in, dict out). ``write_config`` never silently replaces a file,
``validate`` loads the result with accelerate's own ``ClusterConfig`` loader, and
``next_commands`` tells the user what to run next in their shell.

Why the values are what they are (checked in accelerate 1.15, ``commands/launch.py``):

- ``num_processes`` is the total over all machines; accelerate gives each machine
  ``num_processes // num_machines`` processes.
- Several CPU processes use ``distributed_type: MULTI_GPU`` plus ``use_cpu: true``. A
  ``MULTI_CPU`` config goes to accelerate's *simple* launcher, which starts ONE process unless
  MPI is configured; ``MULTI_GPU`` goes through torchrun and really starts N processes. The
  processes then form one gloo group when the code passes ``Accelerator(cpu=True)`` (xtrain.run
  does) or the environment has ``ACCELERATE_USE_CPU=1``.
- ``gpu_ids: all`` whenever the plan uses GPUs 0..n-1: accelerate then leaves
  ``CUDA_VISIBLE_DEVICES`` alone, and local rank i uses GPU i anyway. Other subsets are listed.
- Several machines rendezvous through c10d at ``main_process_ip:main_process_port``
  (``same_network: false`` makes accelerate pass that endpoint to torchrun).
- Windows (the plan's launcher is ``spawn``): ``distributed_type: NO`` with ``num_processes: N``.
  A MULTI_GPU config would make ``accelerate launch`` start torchrun, whose rendezvous stores
  (static_tcp_rendezvous.py, c10d_rendezvous_backend.py in torch 2.13) create a TCPStore with
  libuv whatever USE_LIBUV says, and Windows wheels have no libuv (pytorch#148283). With ``NO``
  accelerate's simple launcher starts one ``python -m xtrain.run`` (setting MASTER_ADDR/PORT
  because N > 1), which sees that (``xtrain.planning.context.LaunchContext.single_launch``) and
  spawns the N workers itself with a libuv-free rendezvous. A plain script under this config runs
  one process.
- DeepSpeed: ``gradient_accumulation_steps`` is left out on purpose: accelerate exports it as
  ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``, which overrides the accumulation the training loop
  derives from the global batch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import atomic
from xtrain.errors import XtrainError
from xtrain.launch.env import visible_entries
from xtrain.machine.probes.accelerate_config import accelerate_config_path
from xtrain.planning.plan import Plan
from xtrain.shell import quote, set_env

if TYPE_CHECKING:
    from accelerate.commands.config.config_args import ClusterConfig

# The keys ClusterConfig (accelerate 1.15) knows. Loading is strict: any other key is an error.
CLUSTER_KEYS = (
    "compute_environment",
    "distributed_type",
    "mixed_precision",
    "use_cpu",
    "debug",
    "num_processes",
    "machine_rank",
    "num_machines",
    "gpu_ids",
    "main_process_ip",
    "main_process_port",
    "rdzv_backend",
    "same_network",
    "main_training_function",
    "enable_cpu_affinity",
    "fp8_config",
    "deepspeed_config",
    "fsdp_config",
    "parallelism_config",
    "megatron_lm_config",
    "mpirun_config",
    "downcast_bf16",
    "tpu_name",
    "tpu_zone",
    "tpu_use_cluster",
    "tpu_use_sudo",
    "command_file",
    "commands",
    "tpu_vm",
    "tpu_env",
    "dynamo_config",
)
DEEPSPEED_STAGES = ("zero2", "zero3")
DYNAMO_BACKENDS = ("eager", "aot_eager", "inductor", "cudagraphs")


@dataclass
class WriteResult:
    path: Path
    backup_path: Path | None = None


# ---------------------------------------------------------------------------------------------
# The config itself
# ---------------------------------------------------------------------------------------------
def fsdp_config() -> dict[str, Any]:
    """FSDP2 settings that suit LoRA: shard every transformer block, full-state save off rank 0.

    Each key is an ``accelerate launch --fsdp_*`` option; accelerate turns them into ``FSDP_*``
    environment variables that ``FullyShardedDataParallelPlugin`` reads.
    """
    return {
        "fsdp_version": 2,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",  # blocks from model._no_split_modules
        "fsdp_reshard_after_forward": True,  # FULL_SHARD: the least memory
        "fsdp_offload_params": False,
        "fsdp_state_dict_type": "SHARDED_STATE_DICT",  # fast checkpoints; adapters are gathered
        "fsdp_cpu_ram_efficient_loading": False,  # True needs sync_module_states (obsolete in v2)
        "fsdp_activation_checkpointing": False,
    }


def deepspeed_config(stage: str, multi_node: bool = False) -> dict[str, Any]:
    """DeepSpeed ZeRO settings (keys are ``accelerate launch`` options, no JSON file needed)."""
    if stage not in DEEPSPEED_STAGES:
        raise XtrainError(f"unknown DeepSpeed stage {stage!r}", f"use one of {', '.join(DEEPSPEED_STAGES)}")
    cfg: dict[str, Any] = {
        "zero_stage": 2 if stage == "zero2" else 3,
        "offload_optimizer_device": "none",
        "offload_param_device": "none",
        "zero3_init_flag": False,  # True only helps when the Accelerator exists before the model
    }
    if stage == "zero3":
        cfg["zero3_save_16bit_model"] = True  # gather full weights on save (adapters stay loadable)
    if multi_node:
        cfg["deepspeed_multinode_launcher"] = "standard"  # torchrun on each node, no pdsh/hostfile
    return cfg


def _gpu_ids(plan: Plan) -> str:
    ids = plan.gpu_ids or []
    if plan.device != "cuda" or not ids or ids == list(range(len(ids))):
        return "all"
    return ",".join(str(i) for i in ids)


def physical_gpu_ids(gpu_ids: str, cuda_visible_devices: str | None) -> str:
    """Map torch's GPU ids through an existing ``CUDA_VISIBLE_DEVICES`` (unchanged when they do
    not fit it: doctor reports that).

    accelerate exports ``gpu_ids`` as ``CUDA_VISIBLE_DEVICES``, replacing the user's: with
    ``CUDA_VISIBLE_DEVICES=2,3`` torch's GPU 1 is the card listed as 3, so the file must say 3.
    """
    if gpu_ids == "all":
        return gpu_ids
    mapped = visible_entries([int(i) for i in gpu_ids.split(",")], cuda_visible_devices)
    return gpu_ids if mapped is None else mapped


def config_for(
    plan: Plan,
    *,
    fsdp: bool = False,
    deepspeed: str | None = None,
    dynamo: str | None = None,
) -> dict[str, Any]:
    """The accelerate ClusterConfig fields for ``plan`` (only keys accelerate's loader accepts)."""
    if fsdp and deepspeed:
        raise XtrainError("--fsdp and --deepspeed exclude each other", "pick one of them")
    if (fsdp or deepspeed) and plan.device != "cuda":
        what = "FSDP" if fsdp else "DeepSpeed"
        raise XtrainError(
            f"{what} needs CUDA GPUs, this plan runs on {plan.device}",
            "leave it out here, or configure on (or with --facts from) a GPU machine",
        )
    multi_node = plan.num_machines > 1

    if fsdp:
        distributed_type = "FSDP"
    elif deepspeed:
        distributed_type = "DEEPSPEED"
    elif plan.world_size > 1 and plan.launcher == "spawn":
        distributed_type = "NO"  # one process from accelerate; xtrain.run spawns the workers
    elif plan.world_size > 1:
        distributed_type = "MULTI_GPU"  # also for CPU processes: see the module docstring
    else:
        distributed_type = "NO"

    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "distributed_type": distributed_type,
        "downcast_bf16": False,
        "enable_cpu_affinity": False,
        "gpu_ids": _gpu_ids(plan),
        "machine_rank": plan.machine_rank,
        "main_training_function": "main",
        "mixed_precision": plan.mixed_precision,
        "num_machines": plan.num_machines,
        "num_processes": plan.world_size,
        "rdzv_backend": "c10d" if multi_node else "static",
        "same_network": False,
        "use_cpu": plan.cpu,
    }
    if plan.world_size > 1:
        cfg["main_process_ip"] = plan.main_address
        cfg["main_process_port"] = plan.main_port
    if fsdp:
        cfg["fsdp_config"] = fsdp_config()
    if deepspeed:
        cfg["deepspeed_config"] = deepspeed_config(deepspeed, multi_node=multi_node)
    if dynamo:
        if dynamo.lower() not in DYNAMO_BACKENDS:
            raise XtrainError(
                f"unknown dynamo backend {dynamo!r}", f"use one of {', '.join(DYNAMO_BACKENDS)}"
            )
        cfg["dynamo_config"] = {"dynamo_backend": dynamo.upper()}
    unknown = set(cfg) - set(CLUSTER_KEYS)
    assert not unknown, f"not ClusterConfig fields: {unknown}"  # a bug here, not a user error
    return cfg


def to_yaml(cfg: dict[str, Any], header: str | None = None) -> str:
    """The file's text: an optional ``#`` comment header, then the keys sorted like accelerate's."""
    import yaml

    body = yaml.safe_dump(cfg, sort_keys=True, default_flow_style=False)
    if not header:
        return body
    comment = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return comment + body


def header_for(plan: Plan) -> str:
    return (
        f"accelerate config written by `xtrain configure`: {plan.summary()}\n"
        "Loaded by `accelerate launch`. After a hardware change run\n"
        "`xtrain configure --force` again (it keeps a backup of this file)."
    )


# ---------------------------------------------------------------------------------------------
# Where it goes, writing it, checking it
# ---------------------------------------------------------------------------------------------
def default_config_path() -> Path:
    """accelerate's default config file (``accelerate_config_path`` of ``xtrain.machine.probes``)."""
    return accelerate_config_path()


def backup_path_for(path: Path, now: float | None = None) -> Path:
    """``default_config.yaml`` -> ``default_config.bak-20250101-120000.yaml`` (never an existing name)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    suffix = path.suffix or ".yaml"
    candidate = path.with_name(f"{path.stem}.bak-{stamp}{suffix}")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}.bak-{stamp}-{n}{suffix}")
        n += 1
    return candidate


def write_text_safely(
    text: str, path: str | Path, *, force: bool = False, backup: bool = True
) -> WriteResult:
    """Write ``text`` to ``path`` atomically; an existing file is refused, or backed up with ``force``."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise XtrainError(f"{path} is a directory", "give a file name, e.g. --output my_config.yaml")
    exists = path.exists()
    if exists and not force:
        raise XtrainError(f"{path} exists; use --force (a backup is kept)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise XtrainError(
            f"cannot create {path.parent}: {e.strerror or e}", "choose a writable --output"
        ) from None
    backup_path = None
    tmp_name = None
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        if exists and backup:
            backup_path = backup_path_for(path)
            shutil.copy2(path, backup_path)  # the old file stays in place until the atomic swap
        atomic.replace(tmp_name, path)  # retries a Windows sharing violation
        tmp_name = None
    except OSError as e:
        raise XtrainError(f"cannot write {path}: {e.strerror or e}", "choose a writable --output") from None
    finally:
        if tmp_name is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
    return WriteResult(path=path, backup_path=backup_path)


def write_config(
    cfg: dict[str, Any],
    path: str | Path,
    force: bool = False,
    backup: bool = True,
    header: str | None = None,
) -> WriteResult:
    """Write an accelerate config file (see ``write_text_safely`` for the no-overwrite rules)."""
    return write_text_safely(to_yaml(cfg, header), path, force=force, backup=backup)


def validate(path: str | Path) -> ClusterConfig:
    """Load ``path`` with accelerate's own loader; returns the ClusterConfig, or raises XtrainError."""
    from accelerate.commands.config.config_args import ClusterConfig

    try:
        cfg = ClusterConfig.from_yaml_file(yaml_file=str(path))
    except Exception as e:  # accelerate raises ValueError, KeyError, TypeError, yaml errors ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise XtrainError(
            f"{path} does not load with accelerate: {first}", "xtrain configure --force"
        ) from None
    if cfg.num_processes is None or cfg.num_processes < 1:
        raise XtrainError(f"{path} has num_processes={cfg.num_processes}", "xtrain configure --force")
    return cfg


def validate_dict(cfg: dict[str, Any]) -> ClusterConfig:
    """Like ``validate`` for a config not written yet (``--dry-run``)."""
    with atomic.temporary_folder("xtrain-cfg-") as tmp:
        p = Path(tmp) / "config.yaml"
        with atomic.writing(atomic.TEMP_DIR, tmp):
            p.write_text(to_yaml(cfg), encoding="utf-8")
        return validate(p)


# ---------------------------------------------------------------------------------------------
# What to run next
# ---------------------------------------------------------------------------------------------


def _config_file_flag(plan: Plan, path: str | Path | None) -> str:
    """`` --config_file PATH`` unless the file is accelerate's default (then it needs no flag)."""
    if path is None or Path(path).expanduser().resolve() == default_config_path().resolve():
        return ""
    return f" --config_file {quote(plan.shell, str(path))}"


def next_commands(plan: Plan, path: str | Path | None, sharded: bool = False) -> list[str]:
    """The exact commands to run next, in the user's shell (plan.shell); comments start with #.

    ``path`` is where the accelerate config was written; at accelerate's default location
    ``accelerate launch`` needs no ``--config_file``. Without ``--config`` xtrain.run trains its
    built-in job, so the first launch line works as printed. ``sharded`` (FSDP/DeepSpeed): `xtrain
    train` reads them from accelerate's default config (``launch.sharding``), but not from a file
    at another path: then ``accelerate launch --config_file`` is the line.
    """
    sh = plan.shell
    lines = [set_env(sh, k, v) for k, v in plan.env.items()]
    procs = "" if plan.num_processes == 1 else f" --processes {plan.num_processes}"

    if plan.launcher == "spawn":  # Windows: no torchrun (its rendezvous needs libuv)
        if plan.num_machines > 1:
            lines.append("# several Windows machines: use WSL2 or Linux (torchrun's rendezvous needs libuv)")
            return lines
        config_file = _config_file_flag(plan, path)
        # a single-process accelerate config: xtrain.run starts the workers itself
        lines.append(f"accelerate launch{config_file} -m xtrain.run")
        if config_file or sharded:
            lines.append(f"accelerate launch{config_file} -m xtrain.run --config YOUR.yaml   # your own job")
        else:
            lines.append(f"xtrain train YOUR.yaml{procs}   # your own job")
        return lines

    if plan.cpu and plan.world_size > 1:
        lines.append(
            "# plain accelerate scripts on CPU also need "
            + set_env(sh, "ACCELERATE_USE_CPU", "1")
            + " (xtrain.run passes cpu=True itself)"
        )
    config_file = _config_file_flag(plan, path)
    lines.append(f"accelerate launch{config_file} -m xtrain.run")
    if plan.num_machines == 1 and not config_file:
        note = " (reads the sharding from it)" if sharded else ""
        lines.append(f"xtrain train YOUR.yaml   # your own job{note}")
    else:
        lines.append(f"accelerate launch{config_file} -m xtrain.run --config YOUR.yaml   # your own job")
    if plan.num_machines > 1:
        lines.append(
            f"# start the same on each of the {plan.num_machines} machines; configure machine R with "
            f"xtrain configure --machines {plan.num_machines} --machine-rank R "
            f"--main-address {plan.main_address} --port {plan.main_port}"
        )
    return lines
