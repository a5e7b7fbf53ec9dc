"""The processes lm-evaluation-harness scores in. lm-eval's HF model is data-parallel under
accelerate: it builds an ``Accelerator()``, and with more than one process each scores its share
of the requests (``rank::world_size``) and rank 0 gathers them (``torch.distributed.gather_object``,
``accelerator.gather``). lm-eval expects ``accelerate launch`` to have set that up, which fails
on Windows (torchrun's libuv store); here xtrain's own launcher starts the processes and
``joined`` makes the group and accelerate's state first, as the training loop does
(``train/distributed/accelerator.py``): xtrain's spawn rendezvous (a file store: no socket) or
``env://``, the plan's backend (gloo on CPU and on Windows), ``cpu=True`` for CPU processes.
lm-eval's ``Accelerator()`` then shares that state. Where the plan stages collectives through the
CPU (gloo with CUDA GPUs: Windows), lm-eval's gathers are staged too (``harness.stage_gathers_on_cpu``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

from xtrain.planning.context import LaunchContext
from xtrain.planning.plan import Plan
from xtrain.runtime.process_group import init_worker_group

TIMEOUT_S = 7 * 86400  # a collective waits this long: rank 0 may score a long generation task alone
FORCE_CPU_STAGED_ENV = "XTRAIN_FORCE_CPU_STAGED"  # tests: the Windows path's staged gathers anywhere


def staged(plan: Plan | None, world_size: int) -> bool:
    """lm-eval's gathers go through CPU copies: several processes on a plan that stages its
    collectives (gloo with CUDA GPUs: Windows), or ``XTRAIN_FORCE_CPU_STAGED=1``."""
    import os

    forced = os.environ.get(FORCE_CPU_STAGED_ENV, "") == "1"
    return world_size > 1 and (forced or (plan is not None and plan.cpu_staged_allreduce))


def device_of(plan: Plan | None, context: LaunchContext) -> str:
    """Where one process puts the model: its local rank's GPU, the GPU, MPS or the CPU."""
    if plan is None or plan.cpu or plan.device == "cpu":
        return "cpu"
    if plan.device == "cuda":
        return f"cuda:{context.local_rank}" if context.distributed else "cuda"
    return plan.device


@contextlib.contextmanager
def joined(context: LaunchContext, plan: Plan | None, timeout_s: float = TIMEOUT_S) -> Iterator[str]:
    """This process in its launch's group with accelerate's state made on it, for the block;
    yields the device lm-eval loads the model on. The group is left and the state reset after."""
    import torch.distributed as dist
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import InitProcessGroupKwargs

    backend = plan.backend if plan is not None else None
    handlers = []
    if context.distributed and backend:
        handlers.append(InitProcessGroupKwargs(backend=backend, timeout=timedelta(seconds=timeout_s)))
        init_worker_group(backend, context.rank, context.world_size, timeout_s)
    device = device_of(plan, context)
    if staged(plan, context.world_size):
        from xtrain.evaluate.harness import stage_gathers_on_cpu

        stage_gathers_on_cpu()
    try:
        Accelerator(cpu=device == "cpu", kwargs_handlers=handlers)
        yield device
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
