"""What every rank must agree on outside the hot path: the workload (built by the main process
first), what the main process alone does (the trackers), whether to stop (a signal any rank
got; early stopping as the main process decided it)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch

from xtrain.errors import XtrainError
from xtrain.planning.run import Run
from xtrain.tasks.contract import MainProcessFirst, Workload

if TYPE_CHECKING:
    from accelerate import Accelerator
    from torch.distributed import ProcessGroup

BuildFn = Callable[[Run, MainProcessFirst], Workload]  # a task's build (or a test's stand-in)
T = TypeVar("T")


def build_workload_main_first(accelerator: Accelerator, run: Run, build: BuildFn) -> Workload:
    """The main process builds first (it fills the datasets cache), the others follow. When the
    main process fails, the others raise the same error instead of waiting forever."""
    workload = on_main(accelerator, lambda: build(run, contextlib.nullcontext), "build the workload")
    return workload if workload is not None else build(run, contextlib.nullcontext)


def on_main(accelerator: Accelerator, fn: Callable[[], T], what: str) -> T | None:
    """``fn()`` on the main process (its result; None elsewhere) while the others wait. When it
    fails, every rank raises the same error (a user's ``XtrainError`` keeps its line) instead of
    the others waiting at the next collective until the timeout."""
    if accelerator.num_processes == 1:
        return fn()
    from accelerate.utils import broadcast_object_list

    result: T | None = None
    failure: list[tuple[str, str | None, int] | None] = [None]
    error: BaseException | None = None
    if accelerator.is_main_process:
        try:
            result = fn()
        except XtrainError as e:
            error, failure[0] = e, (e.message, e.hint, e.exit_code)
        except Exception as e:
            error, failure[0] = e, (f"the main process failed to {what}", None, 1)
    broadcast_object_list(failure, from_process=0)
    if error is not None:
        raise error
    if failure[0] is not None:
        message, hint, code = failure[0]
        raise XtrainError(message, hint, exit_code=code)
    return result


def stop_group(world: int, backend: str | None) -> ProcessGroup | None:
    """The group the stop flags travel in: a gloo group (on the CPU) when the gradients go over
    another backend (NCCL), else None (the default group)."""
    if world < 2 or backend in (None, "gloo"):
        return None
    import torch.distributed as dist

    return dist.new_group(backend="gloo")


def agree_to_stop(accelerator: Accelerator, signum: int | None, group: ProcessGroup | None) -> int | None:
    """All ranks stop together: the highest signal number any rank got (CPU all-reduce, no
    device sync)."""
    if accelerator.num_processes == 1:
        return signum
    import torch.distributed as dist

    flag = torch.tensor([signum or 0], dtype=torch.int32)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    value = int(flag.item())
    return value or None


def main_decides(accelerator: Accelerator, decision: bool, group: ProcessGroup | None) -> bool:
    """The main process's yes or no on every rank (a CPU broadcast in the stop group, no device
    sync): where each rank decides from the same data, this makes sure they act the same."""
    if accelerator.num_processes == 1:
        return decision
    import torch.distributed as dist

    flag = torch.tensor([int(decision)], dtype=torch.int32)
    dist.broadcast(flag, src=0, group=group)
    return bool(flag.item())
