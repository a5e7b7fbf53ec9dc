"""Build the Accelerator for the launch context from the plan (and tear it down again).

Every choice here comes from ``xtrain.planning.resolve`` (the ``Plan`` and the ``RunSettings``);
this module only applies it in the order the libraries need (FIELD_NOTES):

- the plan's environment (USE_LIBUV, NCCL_P2P_DISABLE, ...) goes into ``os.environ`` before any
  process group exists, and its compute threads (``Plan.cpu_threads``: fewer on a busy CPU) into
  torch (``torch.set_num_threads``; a process a launcher started read them from OMP_NUM_THREADS
  already), given back to what they were when the Accelerator is released (a library caller's
  process keeps its own);
- a backend is passed only when the process really is one of several (a backend in a single,
  unlaunched process crashes accelerate);
- ``cpu=True`` when the plan has no accelerator: otherwise two CPU processes silently become
  two independent trainings;
- ``split_batches=True`` so that accelerate steps the scheduler once per optimizer step (xtrain
  feeds every rank its own micro-batches and never lets accelerate re-shard the training data);
- ``run.compile`` through accelerate's own ``TorchDynamoPlugin``: ``prepare`` compiles the model
  (after LoRA, around the DDP wrapper) with inductor; the plugin is always passed, so an
  ``ACCELERATE_DYNAMO_*`` variable from an accelerate config does not compile behind the config.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from xtrain.config.schema import TrainConfig
from xtrain.errors import XtrainError
from xtrain.planning.plan import Plan
from xtrain.planning.resolve import RunSettings
from xtrain.planning.run import Run
from xtrain.runtime.process_group import init_worker_group
from xtrain.train.distributed.cuda_settings import set_tf32
from xtrain.train.failures import rendezvous_error

if TYPE_CHECKING:
    from accelerate import Accelerator
    from accelerate.utils import KwargsHandler
    from torch.nn import Module

FORCE_CPU_STAGED_ENV = "XTRAIN_FORCE_CPU_STAGED"  # tests/support: use the Windows comm hook anywhere
_THREADS_BEFORE: list[int] = []  # torch's compute threads before a run set the plan's (release restores)
COMPILE_BACKEND = "inductor"  # torch.compile's default backend (tests use aot_eager: no C++ build)


def apply_plan_env(plan: Plan) -> None:
    """Plan variables into this process's environment; a value the user set wins."""
    for key, value in plan.env.items():
        os.environ.setdefault(key, str(value))


def build_accelerator(run: Run) -> Accelerator:
    """The Accelerator for this process's ``run``. Must run before anything creates a process
    group. Its device is the one the run placed the model on (``Run.device``): checked."""
    from datetime import timedelta

    import torch
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    cfg, plan, ctx = run.cfg, run.plan, run.context
    apply_plan_env(plan)
    _cache_lomo_check()
    if plan.tf32 and torch.cuda.is_available():
        set_tf32(True)  # the fp32_precision API where torch has it (allow_tf32 is deprecated)

    handlers: list[KwargsHandler] = [
        # LoRA: every trainable parameter gets a gradient each step, so no unused-parameter
        # search; gradients as bucket views save one copy per step.
        DistributedDataParallelKwargs(find_unused_parameters=False, gradient_as_bucket_view=True),
    ]
    try:
        if ctx.distributed and plan.backend:
            timeout = timedelta(seconds=cfg.run.collective_timeout_s)
            handlers.append(InitProcessGroupKwargs(backend=plan.backend, timeout=timeout))
            # xtrain's spawn launcher sent a socket-free rendezvous: join it (accelerate keeps the group)
            init_worker_group(plan.backend, ctx.rank, ctx.world_size, cfg.run.collective_timeout_s)
        accelerator = _accelerator(cfg, plan, run.settings, handlers)
    except Exception as e:  # the peers never came: one line instead of c10d's traceback
        failed = rendezvous_error(e, ctx.rank, ctx.world_size, ctx.main_endpoint)
        if failed is None:
            raise
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)  # half-made: a later run starts clean
        raise failed from None
    placed, planned = accelerator.device, torch.device(run.device)
    indexed = None not in (placed.index, planned.index)  # MULTI_CPU places ranks on "cpu:0"
    if placed.type != planned.type or (indexed and placed.index != planned.index):
        release(accelerator)
        raise XtrainError(
            f"accelerate placed this process on {placed}, but its model loads on {planned} "
            f"(local rank {ctx.local_rank} of {ctx.local_world_size})",
            "start at most one process per GPU that CUDA_VISIBLE_DEVICES leaves visible",
        )
    if plan.cpu_threads is not None:  # (release gives the process its own back)
        _THREADS_BEFORE.append(torch.get_num_threads())
        torch.set_num_threads(plan.cpu_threads)
    return accelerator


def _accelerator(
    cfg: TrainConfig, plan: Plan, settings: RunSettings, handlers: list[KwargsHandler]
) -> Accelerator:
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration, TorchDynamoPlugin

    out = Path(cfg.run.output_dir)
    return Accelerator(
        cpu=plan.cpu,
        mixed_precision=settings.precision,
        gradient_accumulation_steps=settings.accumulation,
        dataloader_config=DataLoaderConfiguration(split_batches=True),
        kwargs_handlers=handlers,
        # the trackers were checked to be installed (preflight): accelerate would drop a missing one
        log_with=list(settings.trackers) or None,
        project_config=ProjectConfiguration(project_dir=str(out), logging_dir=str(out / "logs")),
        step_scheduler_with_optimizer=True,
        # the whole model compiled (its state dict then has "_orig_mod." names: checkpoints and
        # outputs unwrap it, keep_torch_compile=False); "no": run.compile is the one switch
        dynamo_plugin=TorchDynamoPlugin(
            backend=COMPILE_BACKEND if settings.compile else "no", use_regional_compilation=False
        ),
    )


def _cache_lomo_check() -> None:
    """accelerate 1.15's ``AcceleratedOptimizer.step`` asks ``is_lomo_available()`` twice per call,
    and each answer is an uncached ``importlib`` search of sys.path (~0.3 ms, measured): cache it.
    Whether a package is installed does not change during a run."""
    import functools

    from accelerate import optimizer as acc_optimizer

    check = getattr(acc_optimizer, "is_lomo_available", None)
    if check is not None and not hasattr(check, "cache_info"):
        acc_optimizer.is_lomo_available = functools.cache(check)


def stage_allreduce_on_cpu(model: Module, plan: Plan, world: int) -> bool:
    """gloo + CUDA on Windows (or ``XTRAIN_FORCE_CPU_STAGED=1``): gradients are all-reduced through
    CPU copies (``comm_hook``); returns whether the hook is on."""
    if world < 2 or not (plan.cpu_staged_allreduce or os.environ.get(FORCE_CPU_STAGED_ENV, "") == "1"):
        return False
    from xtrain.train.distributed import comm_hook

    return comm_hook.register(getattr(model, "_orig_mod", model))  # run.compile: the DDP inside


def release(accelerator: Accelerator) -> None:
    """End trackers, leave the process group, and reset accelerate's process-wide state so a
    later ``train()`` in the same process starts clean."""
    import torch.distributed as dist
    from accelerate.state import AcceleratorState, GradientState

    try:
        accelerator.end_training()
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        if _THREADS_BEFORE:
            import torch

            torch.set_num_threads(_THREADS_BEFORE.pop())
