"""The Run: what this process decided, once (the spirit of torchtune's recipes, where the recipe
owns device and dtype and hands them to its builders).

``python -m xtrain.run`` builds one ``Run`` per process (``for_process``: the launch context read
once, ``resolve`` called once) and hands it to the recipe (``xtrain.train.loop``), to the
preflight checks (``xtrain.train.preflight``) and to the task's ``build`` (``Task.build(run,
main_process_first)``). Nothing downstream decides again: the loaders take ``run.device`` and
``run.precision`` as arguments, the loop reads ``run.settings``, and the launch variables are
read only by ``LaunchContext``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xtrain.config.schema import TrainConfig
from xtrain.machine.facts import Facts
from xtrain.planning.context import LaunchContext
from xtrain.planning.plan import Finding, Plan
from xtrain.planning.resolve import Resolved, RunSettings, resolve


@dataclass(frozen=True)
class Run:
    """One process's run: the checked config, the plan, the run settings for the launch
    context's world size, the launch context itself, and where this process computes."""

    cfg: TrainConfig
    plan: Plan
    settings: RunSettings
    context: LaunchContext
    device: str  # cpu | mps | cuda (the current GPU, one process) | cuda:N (rank of a launch)
    findings: list[Finding] = field(default_factory=list)  # a plan made here (none for a sent one)
    facts: Facts | None = None  # the machine's facts the plan was made from (None: a plan given)

    @property
    def precision(self) -> str:
        """no | fp16 | bf16: the one precision the Accelerator, the loaders and the checks use."""
        return self.settings.precision

    @property
    def world_size(self) -> int:
        return self.settings.world_size

    @property
    def is_main(self) -> bool:
        return self.context.is_main

    @property
    def device_type(self) -> str:
        return self.device.split(":")[0]

    @property
    def fsdp(self) -> bool:
        """accelerate shards this run's model with FSDP (``accelerate launch --use_fsdp`` on CUDA)."""
        return self.context.sharding == "fsdp" and self.context.launched and self.device_type == "cuda"


def process_device(plan: Plan, context: LaunchContext) -> str:
    """Where this process computes, as accelerate's ``PartialState.set_device`` places it: the
    CPU for a plan without an accelerator; a rank of a launch on its local rank's GPU (the
    launcher left each rank the planned cards, ``CUDA_VISIBLE_DEVICES``); a process alone on the
    current GPU. ``xtrain.train.distributed.accelerator`` checks the Accelerator agrees."""
    if plan.cpu or plan.device == "cpu":
        return "cpu"
    if plan.device == "cuda":
        return f"cuda:{context.local_rank}" if context.launched else "cuda"
    return plan.device


def for_process(
    cfg: TrainConfig,
    context: LaunchContext,
    *,
    plan: Plan | None = None,
    processes: int | None = None,
    platform: str | None = None,
    checkpoint_dtype: str | None = None,
) -> Run:
    """This process's ``Run``: ``resolve`` (once) for the launch ``context``, with the ``plan``
    this process already holds (a spawned worker, a library caller) or the one xtrain's launcher
    sent, else planned here (``processes``, ``platform``, ``checkpoint_dtype`` as ``resolve``)."""
    resolved = resolve(
        cfg,
        processes=processes,
        platform=platform,
        context=context,
        plan=plan,
        checkpoint_dtype=checkpoint_dtype,
    )
    return _run(cfg, resolved, context)


def for_launch(
    cfg: TrainConfig,
    *,
    processes: int | None = None,
    gpu_ids: list[int] | None = None,
    platform: str | None = None,
    facts: Facts | None = None,
    checkpoint_dtype: str | None = None,
) -> Run:
    """The ``Run`` of a command that starts the processes itself (``xtrain train``): planned for
    this machine (probed here, or the ``facts`` of a ``--facts`` snapshot), the settings for the
    plan's world size; this process computes nothing (its device is the plan's)."""
    resolved = resolve(
        cfg,
        processes=processes,
        gpu_ids=gpu_ids,
        platform=platform,
        facts=facts,
        checkpoint_dtype=checkpoint_dtype,
    )
    return _run(cfg, resolved, LaunchContext())


def _run(cfg: TrainConfig, resolved: Resolved, context: LaunchContext) -> Run:
    assert resolved.settings is not None  # resolve always settles a train config
    return Run(
        cfg=cfg,
        plan=resolved.plan,
        settings=resolved.settings,
        context=context,
        device=process_device(resolved.plan, context),
        findings=resolved.findings,
        facts=resolved.facts,
    )
