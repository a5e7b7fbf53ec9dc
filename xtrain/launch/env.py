"""The launch environment a launcher gives every worker (``plan_env``). The worker side, reading
and checking those variables, is ``xtrain.planning.context.LaunchContext``'s alone."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from xtrain.errors import XtrainError
from xtrain.planning.context import PLAN_ENV
from xtrain.planning.plan import Plan


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


# what accelerate's state writes into os.environ for a CPU process group (RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE; MASTER_PORT 29500 when unset): a run in this process must not leave them behind
LAUNCH_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@contextlib.contextmanager
def patched_environ(values: dict[str, str], also: tuple[str, ...] = ()) -> Iterator[None]:
    """Set environment variables for the duration of a block, then restore them exactly, and
    the variables ``also`` names, which the block may set itself."""
    saved = {k: os.environ.get(k) for k in (*values, *also)}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old
