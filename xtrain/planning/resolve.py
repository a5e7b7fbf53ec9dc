"""Settings resolved once: facts + config + CLI/launcher overrides -> the plan and the run settings.

Every "auto" a user can leave is decided here, in numbered steps (the spirit of Lightning
Fabric's connector), and nowhere else:

1. ``choose_precision``: ``run.mixed_precision`` when set, else what ``accelerate launch``
   exported (its config or ``--mixed_precision``), else None: the rules decide from the GPU.
2. ``machine_plan``: the rules' plan for this machine (processes, devices, backend, launcher,
   precision, ports, env) with those overrides: the one call of ``rules.make_plan`` for
   ``xtrain train``, ``python -m xtrain.run`` (spawn, accelerate's simple launcher, a worker
   without a plan sent to it) and ``xtrain bench``.
3. ``run_settings``: the plan + the config + the world size -> ``RunSettings``: accumulation,
   global batch, learning rate (scaled for the global batch), precision. Frozen; the launcher
   calls it once before any process starts (a global batch that does not divide stops there),
   each rank calls it again for its own world size and the loop reads only its fields.

Pure functions except ``machine_plan``'s optional probe (``facts=None``), so every platform's
answer is testable from a saved facts snapshot.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from xtrain.machine.facts import Facts
from xtrain.planning.plan import Diagnosis, Overrides, Plan

AUTO = (None, "", "auto")


@dataclass(frozen=True)
class RunSettings:
    """How this run trains, for this world size: what the loop, the banner and the checkpoint
    state read (never re-derived from the config)."""

    world_size: int
    per_device: int
    accumulation: int  # micro-batches per optimizer step on each rank
    global_batch: int  # per_device x world_size x accumulation: samples per optimizer step
    lr: float  # optim.lr scaled for the global batch (optim.lr_scaling)
    precision: str  # no | fp16 | bf16


def choose_precision(cfg: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """Step 1: the precision the user chose, or None when the rules should decide."""
    mp = cfg.run.mixed_precision
    if mp in AUTO:
        env = os.environ if environ is None else environ
        mp = env.get("ACCELERATE_MIXED_PRECISION") or None
    return mp


def machine_plan(
    cfg: Any | None = None,
    *,
    facts: Any | None = None,
    processes: int | None = None,
    gpu_ids: list[int] | None = None,
    platform: str | None = None,
    precision: str | None = None,
    num_machines: int = 1,
    main_address: str | None = None,
) -> Plan:
    """Step 2: the rules' plan for this machine. ``facts=None`` probes quickly; ``precision``
    (bench) stands in for a config's."""
    from xtrain.planning.rules import make_plan

    if facts is None:
        from xtrain.machine import probe

        facts = probe.collect(quick=True)
    if cfg is not None and precision is None:
        precision = choose_precision(cfg)
    overrides = Overrides(
        num_processes=processes,
        gpu_ids=gpu_ids,
        mixed_precision=precision,
        platform=platform,
        num_machines=num_machines,
        main_address=main_address if num_machines > 1 else None,
        weights_dtype=cfg.model.dtype if cfg is not None else None,
    )
    return make_plan(facts, overrides)


def diagnose(facts: Facts, overrides: Overrides | None = None) -> Diagnosis:
    """Facts (+ user overrides) -> the rules' plan and the checks' findings. Pure: safe on any
    saved snapshot."""
    from xtrain.planning.checks import CHECKS
    from xtrain.planning.rules import make_plan

    plan = make_plan(facts, overrides)
    findings = [f for check in CHECKS for f in check(facts, plan)]
    return Diagnosis(plan=plan, findings=findings)


def run_settings(cfg: Any, plan: Plan, world_size: int) -> RunSettings:
    """Step 3: the run's batch arithmetic, learning rate and precision for ``world_size``
    processes. Raises ``XtrainError`` (one line, with the sizes that work) when the global batch
    does not divide."""
    from xtrain.planning.batch import gradient_accumulation, scaled_lr

    accumulation = gradient_accumulation(cfg, world_size)
    global_batch = cfg.batch.per_device * world_size * accumulation
    mp = cfg.run.mixed_precision
    return RunSettings(
        world_size=world_size,
        per_device=cfg.batch.per_device,
        accumulation=accumulation,
        global_batch=global_batch,
        lr=scaled_lr(cfg, global_batch),
        precision=plan.mixed_precision if mp in AUTO else mp,
    )
