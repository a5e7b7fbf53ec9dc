"""The launch environment: what a launcher gives every worker (``plan_env``), and, in the worker,
the variables checked before they are used.

``WORLD_SIZE``/``RANK``/... come from a launcher or from a hand-written script (SLURM, a shell
loop); a typo there otherwise surfaces as a ``ValueError`` traceback deep in torch or accelerate.
Checked once at the start of ``python -m xtrain.run``: one line naming the variable.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from typing import Any

from xtrain.errors import XtrainError
from xtrain.planning.context import PLAN_ENV
from xtrain.planning.plan import Plan

WHOLE_NUMBERS = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_PORT")
XTRAIN_NUMBERS = ("XTRAIN_PARENT_PID", "XTRAIN_NODE_RANK")


def _number(env: Any, name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    if not raw.strip().isdigit():
        raise XtrainError(
            f"environment variable {name}={raw!r} is not a whole number",
            f"fix or unset {name}; launchers set it for their workers",
        )
    return int(raw)


def check(environ: Any = None) -> None:
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
    plan = env.get("XTRAIN_PLAN")
    if plan:
        from xtrain.planning.plan import Plan

        try:
            Plan.from_dict(json.loads(plan))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise XtrainError(
                f"environment variable XTRAIN_PLAN is not a plan xtrain wrote ({type(e).__name__})",
                "unset XTRAIN_PLAN: xtrain's launchers set it for their own workers",
            ) from None
    url = env.get("XTRAIN_RENDEZVOUS")
    if url and not url.startswith("file:"):
        raise XtrainError(
            f"environment variable XTRAIN_RENDEZVOUS={url!r} is not a file:// URL",
            "unset it: xtrain's launchers set it for their own workers",
        )


def visible_entries(gpu_ids: list[int], cuda_visible_devices: str | None) -> str | None:
    """torch's GPU ids as ``CUDA_VISIBLE_DEVICES`` entries. torch's ids count only the devices an
    existing ``CUDA_VISIBLE_DEVICES`` leaves visible (``2,3``: torch's 1 is the card listed as 3),
    so they map through it; None when an id is beyond it. The one mapping for the launcher and
    the accelerate config."""
    entries = [e.strip() for e in (cuda_visible_devices or "").split(",") if e.strip()]
    if not entries:
        return ",".join(str(i) for i in gpu_ids)
    if any(i >= len(entries) for i in gpu_ids):
        return None
    return ",".join(entries[i] for i in gpu_ids)


def _visible_devices(gpu_ids: list[int]) -> str:
    """CUDA_VISIBLE_DEVICES for the plan's GPU ids, mapped through the current one."""
    current = os.environ.get("CUDA_VISIBLE_DEVICES")
    mapped = visible_entries(gpu_ids, current)
    if mapped is None:
        raise XtrainError(
            f"GPU ids {gpu_ids} do not fit CUDA_VISIBLE_DEVICES={current!r}",
            "run `xtrain doctor` again in this shell and pick ids from its GPU list",
        )
    return mapped


def plan_env(plan: Plan) -> dict[str, str]:
    """The environment every worker needs, whichever launcher starts it.

    CUDA_VISIBLE_DEVICES is set whenever the plan names GPUs, so worker ``LOCAL_RANK`` i uses
    ``cuda:i`` and sees only the planned cards (also for a ``--gpus 1,3`` selection)."""
    env = {k: str(v) for k, v in plan.env.items()}
    if plan.device == "cuda" and plan.gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = _visible_devices(plan.gpu_ids)
    env[PLAN_ENV] = plan.to_json()
    return env


@contextlib.contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of a block, then restore them exactly."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old
