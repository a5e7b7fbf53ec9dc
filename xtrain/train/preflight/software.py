"""The checks that look at the installed software against the plan: a Windows torch whose gloo
cannot form a group, FSDP/DeepSpeed, bitsandbytes for 8-bit optimizers and 4/8-bit weights, the
experiment trackers (``check_trackers``) and accelerate's default config file."""

from __future__ import annotations

import sys

from xtrain.errors import XtrainError
from xtrain.launch import sharding
from xtrain.machine.facts import Facts
from xtrain.model import quantization
from xtrain.planning.checks.comms import windows_gloo_refusal
from xtrain.planning.checks.fixes import pip_line
from xtrain.planning.run import Run
from xtrain.shell import pip_command
from xtrain.train import optim
from xtrain.train.preflight.notes import Note, Where
from xtrain.train.tracking import PACKAGES, missing


def _windows_gloo(run: Run, where: Where) -> list[Note]:
    """A Windows torch whose gloo cannot form a group (``checks.comms``): refused before any
    process starts; a dry run shows it as an error line."""
    if not where.launcher or run.facts is None:
        return []
    refusal = windows_gloo_refusal(run.facts, run.plan)
    if refusal is None:
        return []
    if not where.dry_run:
        raise refusal
    return [Note("error", refusal.one_line(), "error")]


def _sharding(run: Run, where: Where) -> list[Note]:
    """FSDP/DeepSpeed where they cannot run (``launch.sharding``), refused before any process starts."""
    if not where.launcher or where.sharding is None:
        return []
    pip = pip_line(run.facts or Facts(), run.plan, ["install", "deepspeed"])
    sharding.check(where.sharding, run.plan, where.sharding_from_options, pip, where.here)
    return []


def _optimizer(run: Run, where: Where) -> list[Note]:
    """An 8-bit ``optim.name`` (bitsandbytes) that cannot run on the plan's device: refused
    before any process starts and in the worker before its model loads (the machine that
    refuses is this one: not for a ``--facts`` snapshot's plan)."""
    if where.here:
        optim.check_backend(run.cfg.optim.name, run.plan.device)
    return []


def _quantization(run: Run, where: Where) -> list[Note]:
    """What ``model.quantization`` loads the weights as; refused where this machine's
    bitsandbytes cannot run it on the plan's device."""
    quantization_name = run.cfg.model.quantization
    if quantization_name is None:
        return []
    if where.here:
        quantization.check_backend(quantization_name, run.plan.device)
    return [Note("Weights", quantization.describe(quantization_name) or "")] if where.launcher else []


def check_trackers(trackers: tuple[str, ...], shell: str, executable: str | None = None) -> None:
    """Refuse a tracker that is not installed, with the line that installs its package (for the
    interpreter that runs xtrain, quoted for ``shell``)."""
    absent = missing(trackers)
    if absent:
        names = " and ".join(absent)
        pip = pip_command(shell, executable or sys.executable, ["install", *(PACKAGES[t] for t in absent)])
        raise XtrainError(
            f"run.report_to names {names}, which {'is' if len(absent) == 1 else 'are'} not installed",
            f"install with: {pip}",
        )


def _trackers(run: Run, where: Where) -> list[Note]:
    """Every tracker ``run.report_to`` names is installed (``check_trackers``)."""
    if not where.dry_run:
        check_trackers(run.settings.trackers, run.plan.shell)
    return []


def _accelerate_default(run: Run, where: Where) -> list[Note]:
    """accelerate's launcher reads its default config (under HF_HOME) and dies with a YAML
    traceback when that file is broken: refused first, naming the file (the probe read it)."""
    plan, facts = run.plan, run.facts
    if not where.launcher or where.dry_run or facts is None:
        return []
    if plan.world_size > 1 and plan.launcher != "spawn" and facts.accelerate_config_error:
        raise XtrainError(
            f"accelerate's default config {facts.accelerate_config_path} cannot be read: "
            f"{facts.accelerate_config_error}",
            "fix it, or rewrite it with `xtrain configure --force`, which keeps the old file as a backup",
        )
    return []


def _benchmarks(run: Run, where: Where) -> list[Note]:
    """``eval.benchmarks``: lm-evaluation-harness installed, its task files read, and (the launcher,
    and rank 0 of the workers) every task known and its data read, before hours of training."""
    e = run.cfg.eval
    if not e.benchmarks:
        return []
    from xtrain.evaluate import benchmarks, harness
    from xtrain.evaluate.scoring import manager_for

    key = "eval.benchmarks"
    harness.require(key)
    bench = benchmarks.resolve(benchmarks.split(e.benchmarks, key), key)
    if where.launcher or run.is_main:  # lm-eval's own task index is read in seconds: once a side
        harness.quiet()
        benchmarks.check(bench, manager_for(bench), key)
    if not where.launcher:
        return []
    what = "the result and the start it trained from" if e.at_start else "the result"
    notes = [Note("Benchmarks", f"{bench.shown} (lm-evaluation-harness), scored on {what} at the end")]
    return notes + benchmarks_sharded(where.sharding)


def benchmarks_sharded(kind: str | None) -> list[Note]:
    """lm-eval's HF model is data-parallel, every process a whole copy of the result: after a run
    whose weights were sharded (FSDP, ZeRO-3) that may not fit, said before the run."""
    if kind not in ("fsdp", "zero3"):
        return []
    said = (
        f"eval.benchmarks under {kind}: lm-eval loads the whole result on every process, not sharded; "
        "a model that fits only sharded runs out of memory at the end (the result is saved first): leave "
        "eval.benchmarks out and score it with `xtrain eval` on a card it fits"
    )
    return [Note("warning", said, "warning")]
