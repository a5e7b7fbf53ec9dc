"""`xtrain train sft.yaml dpo.yaml grpo.yaml`: stages trained in order, each from the one before.

The stages (``xtrain.train.stages``: configs checked, ``previous`` resolved, where each stands)
-> every stage not finished yet checked as a dry run checks it (its model, its data's first rows,
its memory), before the first one trains -> each stage launched in turn as ``xtrain train`` would
launch it alone, a finished one skipped. A stage that fails or is stopped ends the recipe with its
exit code; the same command again resumes it (``run.resume: auto``) and goes on.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from rich.markup import escape

if TYPE_CHECKING:
    from rich.console import Console

    from xtrain.commands.launching import LaunchOptions, Prepared
    from xtrain.train.stages import Stage, StageState


def run_recipe(stages: list[Stage], options: LaunchOptions, console: Console) -> int:
    """Check every stage, then train them in order (or, with ``--dry-run``, show each stage's
    plan and checks); the first failing stage's exit code, else 0."""
    from xtrain.commands.launching import prepare, run_stage
    from xtrain.train.stages import check_states, planned_config, stage_state

    states = [stage_state(stage) for stage in stages]  # a checkpoint of another training: refused here
    check_states(stages, states)  # a stage holding what started from another result of the one before
    done = {stage.number for stage, state in zip(stages, states, strict=True) if state.finished}
    console.print(f"[bold]Recipe:[/] {len(stages)} stages", soft_wrap=True)
    for stage, state in zip(stages, states, strict=True):
        console.print(f"  {escape(describe(stage, state))}", soft_wrap=True, highlight=False)
    # every stage checked before any trains: a broken third stage is found before hours of SFT
    checked: dict[int, Prepared] = {}
    check_options = dataclasses.replace(options, dry_run=True)
    for stage in stages:
        if stage.number in done:
            continue
        ready = prepare(planned_config(stages, stage, done), check_options, quiet=not options.dry_run)
        check_options = dataclasses.replace(check_options, facts=ready.run.facts)  # probed once
        checked[stage.number] = ready
    launch_options = dataclasses.replace(options, facts=check_options.facts)
    for stage in stages:
        header = f"Stage {stage.number} of {len(stages)}: {stage.path.name}"
        console.print(f"\n[bold]{escape(header)}[/]", soft_wrap=True)
        if stage.number in done:
            console.print(f"{escape(stage.cfg.run.output_dir)}: finished, skipped", soft_wrap=True)
            continue
        if options.dry_run:
            if stage.follows and stage.number - 1 not in done:
                start = checked[stage.number].run.cfg.model.name_or_path
                console.print(
                    f"[dim]checked on the start of the stage before ({escape(start)}): "
                    "its result is not trained yet[/]",
                    soft_wrap=True,
                )
            run_stage(checked[stage.number], stage.path, stage.overrides, options, console)
            continue
        ready = prepare(stage.cfg, launch_options)  # now its start is there: the launch's own checks
        code = run_stage(ready, stage.path, stage.overrides, launch_options, console)
        if code != 0:
            later = len(stages) - stage.number
            if later:
                console.print(
                    f"[bold red]{escape(stage.name)} did not finish[/]: the {later} stage"
                    f"{'s' if later != 1 else ''} after it did not start; run the same command again "
                    "to resume it and go on",
                    soft_wrap=True,
                )
            return code
    if not options.dry_run:
        last = stages[-1].cfg.run.output_dir
        console.print(f"[bold]Recipe done:[/] the chain's result is in {escape(last)}", soft_wrap=True)
        stage_scores(stages, console)
    return 0


def stage_scores(stages: list[Stage], console: Console) -> None:
    """The benchmarks after each stage (its ``eval.benchmarks``, kept in its ``benchmarks/``), the
    first stage's start before them where it was scored: one table, changes against the first column."""
    from pathlib import Path

    from xtrain.commands.eval import show_table
    from xtrain.evaluate import saved

    labels, columns = [], []
    for stage in stages:
        scores, reference, _ = saved.latest(saved.read_all(Path(stage.cfg.run.output_dir)))
        if not columns and reference:
            labels.append("start")
            columns.append(reference)
        if scores:
            labels.append(f"{stage.number}. {stage.path.stem}")
            columns.append(scores)
    if columns:
        console.print("\n[bold]Benchmarks after each stage:[/]", soft_wrap=True)
        show_table(labels, columns, console)


def describe(stage: Stage, state: StageState) -> str:
    """One line of the recipe's table: what the stage trains, from what, into where, and where it stands."""
    cfg = stage.cfg
    start = f"stage {stage.number - 1}'s result" if stage.follows else cfg.model.name_or_path
    where = f"-> {cfg.run.output_dir} ({state.describe()})"
    return f"{stage.number}. {stage.path.name}: {cfg.model.task} from {start} {where}"
