"""The launch context: what the launcher that started this process says about it, read from the
environment. ``xtrain.planning.resolve`` takes it as one of its inputs (``python -m xtrain.run``
and the training loop pass it; a command that starts the processes itself passes none).

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
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass

from xtrain.planning.plan import Plan

PLAN_ENV = "XTRAIN_PLAN"  # the plan xtrain's launchers send their workers (JSON)


@dataclass(frozen=True)
class LaunchContext:
    """What the launcher says about this process (the truth for the world size)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    main_address: str | None = None
    launched: bool = False  # one rank of a launcher (WORLD_SIZE set)
    single_launch: bool = False  # accelerate launch started one process; xtrain.run starts the workers
    visible_gpus: int | None = None  # CUDA_VISIBLE_DEVICES entries, when set
    plan_json: str | None = None  # XTRAIN_PLAN: the plan xtrain's launcher sent

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def num_machines(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    @property
    def sent_plan(self) -> Plan | None:
        return Plan.from_dict(json.loads(self.plan_json)) if self.plan_json else None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> LaunchContext:
        env = os.environ if environ is None else environ
        world = int(env.get("WORLD_SIZE", "1") or 1)
        local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)) or world)
        visible = [e for e in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if e.strip()]
        launched = "WORLD_SIZE" in env
        return cls(
            rank=int(env.get("RANK", "0") or 0),
            local_rank=int(env.get("LOCAL_RANK", "0") or 0),
            world_size=world,
            local_world_size=local_world,
            main_address=env.get("MASTER_ADDR"),
            launched=launched,
            single_launch=not launched and "ACCELERATE_MIXED_PRECISION" in env and "MASTER_ADDR" in env,
            visible_gpus=len(visible) or None,
            plan_json=env.get(PLAN_ENV) or None,
        )
