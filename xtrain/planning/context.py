"""The launch context: what the launcher that started this process says about it, read from the
environment. It is the one reader of the launch variables (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` and what ``accelerate
launch`` exports, ``ACCELERATE_*``): every other module asks a ``LaunchContext``
(tests/test_run.py greps the tree). ``xtrain.planning.resolve`` takes it as one of its inputs
(``python -m xtrain.run`` reads it once and keeps it in the process's ``Run``; a command that
starts the processes itself passes none).

- a rank of torchrun, ``accelerate launch`` (multi-process) or xtrain's own launchers:
  ``WORLD_SIZE`` is set; the world size, ranks and main address are the launcher's, and the plan
  xtrain's launchers send (``XTRAIN_PLAN``) is read back instead of planning again;
- ``accelerate launch`` that started ONE process for a config asking for several (xtrain's Windows
  config, ``distributed_type: NO`` with ``num_processes: N``): accelerate's simple launcher runs
  no torchrun (whose rendezvous stores need libuv, which Windows torch lacks) and exports the
  config's precision as ACCELERATE_MIXED_PRECISION and, for N > 1, MASTER_ADDR/MASTER_PORT, but
  no WORLD_SIZE (accelerate/utils/launch.py ``prepare_simple_launcher_cmd_env``), and its
  ``gpu_ids`` as CUDA_VISIBLE_DEVICES: xtrain.run then starts the workers itself;
- else: a process started by hand, alone unless ``--processes N`` asks for more.

A malformed variable (``WORLD_SIZE=abc``, a rank not below the world size, a port out of range,
an ``XTRAIN_PLAN`` that is not a plan) is refused in one line naming it (``check_env``), not a
``ValueError`` deep in torch or accelerate: a launcher's typo, or a hand-written script's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from xtrain.errors import XtrainError
from xtrain.planning.plan import Plan

PLAN_ENV = "XTRAIN_PLAN"  # the plan xtrain's launchers send their workers (JSON)
RENDEZVOUS_ENV = "XTRAIN_RENDEZVOUS"  # the FileStore URL of xtrain's spawn launcher
WHOLE_NUMBERS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_PORT")
XTRAIN_NUMBERS = ("XTRAIN_PARENT_PID",)


@dataclass(frozen=True)
class LaunchContext:
    """What the launcher says about this process (the truth for the world size)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    main_address: str | None = None
    main_port: int | None = None
    launched: bool = False  # one rank of a launcher (WORLD_SIZE set)
    single_launch: bool = False  # accelerate launch started one process; xtrain.run starts the workers
    visible_gpus: int | None = None  # CUDA_VISIBLE_DEVICES entries, when set
    plan_json: str | None = None  # XTRAIN_PLAN: the plan xtrain's launcher sent
    # ACCELERATE_MIXED_PRECISION: what ``accelerate launch`` exported (``exported_precision``)
    exported_precision: str | None = None
    # ACCELERATE_USE_CPU without WORLD_SIZE: accelerate launch's one-process (simple) launcher
    # may have started this process (``runtime.lifetime`` then watches its parent)
    accelerate_simple: bool = False
    # ACCELERATE_USE_FSDP / ACCELERATE_USE_DEEPSPEED: accelerate launch's sharding switches
    sharding: str | None = None  # fsdp | deepspeed

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def num_machines(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that speaks for the run (prints, writes the outcome)."""
        return self.rank == 0

    @property
    def sent_plan(self) -> Plan | None:
        return Plan.from_dict(json.loads(self.plan_json)) if self.plan_json else None

    @property
    def main_endpoint(self) -> str:
        """MASTER_ADDR:MASTER_PORT as this process read them ("?" for one not set)."""
        port = self.main_port if self.main_port is not None else "?"
        return f"{self.main_address or '?'}:{port}"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LaunchContext:
        """Read (and check: ``check_env``) the launch variables of ``environ`` (default: this
        process's environment)."""
        env = os.environ if environ is None else environ
        check_env(env)
        world = int(env.get("WORLD_SIZE", "1") or 1)
        local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)) or world)
        visible = [e for e in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
        launched = "WORLD_SIZE" in env
        port = env.get("MASTER_PORT", "").strip()
        return cls(
            rank=int(env.get("RANK", "0") or 0),
            local_rank=int(env.get("LOCAL_RANK", "0") or 0),
            world_size=world,
            local_world_size=local_world,
            main_address=env.get("MASTER_ADDR"),
            main_port=int(port) if port else None,
            launched=launched,
            single_launch=not launched and "ACCELERATE_MIXED_PRECISION" in env and "MASTER_ADDR" in env,
            visible_gpus=len(visible) or None,
            plan_json=env.get(PLAN_ENV) or None,
            exported_precision=exported_precision(env),
            accelerate_simple="ACCELERATE_USE_CPU" in env and not launched,
            sharding=_sharding(env),
        )


def alone(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) without the launch variables: the environment of a
    process that a rank starts to run alone (a trained built-in's stage, ``train.builtin_stages``)."""
    env = os.environ if environ is None else environ
    launch = {
        *WHOLE_NUMBERS,
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "GROUP_RANK",
        "ROLE_RANK",
        PLAN_ENV,
        RENDEZVOUS_ENV,
    }
    prefixes = ("TORCHELASTIC_", "ACCELERATE_", "FSDP_", "TORCH_NCCL_")
    return {k: v for k, v in env.items() if k not in launch and not k.startswith(prefixes)}


def exported_precision(environ: Mapping[str, str] | None = None) -> str | None:
    """What ``accelerate launch`` exported (ACCELERATE_MIXED_PRECISION: its config's
    ``mixed_precision`` or ``--mixed_precision``); None when no accelerate launcher started this
    process. The rules count it as the user's choice only where it differs from the machine's
    default (what ``xtrain configure`` writes): ``rules._precision``."""
    env = os.environ if environ is None else environ
    value = (env.get("ACCELERATE_MIXED_PRECISION") or "").strip().lower()
    return value or None


def _sharding(env: Mapping[str, str]) -> str | None:
    """The sharding ``accelerate launch --use_fsdp`` / DeepSpeed switched on for its workers."""
    if env.get("ACCELERATE_USE_FSDP", "false").strip().lower() == "true":
        return "fsdp"
    if env.get("ACCELERATE_USE_DEEPSPEED", "false").strip().lower() == "true":
        return "deepspeed"
    return None


def _number(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    if not raw.strip().isdigit():
        raise XtrainError(
            f"environment variable {name}={raw!r} is not a whole number",
            f"fix or unset {name}; launchers set it for their workers",
        )
    return int(raw)


def check_env(environ: Mapping[str, str] | None = None) -> None:
    """Raise XtrainError for a malformed launch or xtrain variable."""
    env = os.environ if environ is None else environ
    n = {name: _number(env, name) for name in (*WHOLE_NUMBERS, *XTRAIN_NUMBERS)}
    world, rank, local, local_world = n["WORLD_SIZE"], n["RANK"], n["LOCAL_RANK"], n["LOCAL_WORLD_SIZE"]
    if world is not None and world < 1:
        raise XtrainError(
            "environment variable WORLD_SIZE=0: a run has at least one process", "fix WORLD_SIZE"
        )
    if world is not None and rank is not None and rank >= world:
        raise XtrainError(f"RANK={rank} is not below WORLD_SIZE={world}", "ranks count 0..WORLD_SIZE-1")
    if local is not None and local_world is not None and local >= local_world:
        raise XtrainError(
            f"LOCAL_RANK={local} is not below LOCAL_WORLD_SIZE={local_world}", "local ranks count from 0"
        )
    port = n["MASTER_PORT"]
    if port is not None and not 0 < port < 65536:
        raise XtrainError(f"MASTER_PORT={port} is not a TCP port", "use 1024..65535")
    plan = env.get(PLAN_ENV)
    if plan:
        try:
            Plan.from_dict(json.loads(plan))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise XtrainError(
                f"environment variable XTRAIN_PLAN is not a plan xtrain wrote ({type(e).__name__})",
                "unset XTRAIN_PLAN: xtrain's launchers set it for their own workers",
            ) from None
    url = env.get(RENDEZVOUS_ENV)
    if url and not url.startswith("file:"):
        raise XtrainError(
            f"environment variable XTRAIN_RENDEZVOUS={url!r} is not a file:// URL",
            "unset it: xtrain's launchers set it for their own workers",
        )
