"""`xtrain train CONFIG [CONFIG ...] [key=value ...]`: train on every planned device with one command.

config (checked before anything starts) -> planning.resolve (facts, plan, run settings) -> the
plan's launcher: accelerate's own launcher called in-process (Linux, WSL2, macOS) or the spawn
path of `xtrain.run` (Windows, where torchrun trips on libuv). The exit code is the training's.
Several configs are the stages of a recipe (``commands.recipe``), trained in order.
"""

from __future__ import annotations

from pathlib import Path

import typer

from xtrain.commands.launching import LaunchOptions, built_in_start, prepare, run_stage
from xtrain.commands.options import parse_gpus, parse_int, whole
from xtrain.config import examples
from xtrain.errors import XtrainError


# longer: most of its lines are typer's option declarations, one per flag
def train(
    args: list[str] = typer.Argument(
        ...,
        metavar="CONFIG... [KEY=VALUE]...",
        help="YAML train config (see examples/ and docs/configuration.md); several: stages run in order, "
        "each from the one before (docs/chains.md). Then overrides, e.g. run.max_steps=100 "
        "(N:key=value for stage N alone).",
    ),
    processes: int = typer.Option(
        None, "--processes", "-n", parser=whole("--processes"), help="Processes (default: one per GPU)."
    ),
    gpus: str = typer.Option(None, "--gpus", help='GPU ids, e.g. "0,1" (default: all).'),
    precision: str = typer.Option(
        None, "--precision", help="no, fp16 or bf16 (default: the config, else the plan)."
    ),
    fsdp: bool = typer.Option(False, "--fsdp", help="Shard the model with FSDP2 (Linux, CUDA GPUs)."),
    deepspeed: str = typer.Option(
        None, "--deepspeed", help="DeepSpeed ZeRO stage: zero2 | zero3 (Linux, CUDA GPUs)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the equivalent commands and exit."),
    facts_file: Path = typer.Option(
        None, "--facts", help="With --dry-run: plan from a snapshot (xtrain doctor --save FILE)."
    ),
    platform: str = typer.Option(None, "--platform", hidden=True, help="Plan as if on this OS (tests)."),
) -> None:
    """Train CONFIG on every planned device (one process per GPU, fixed global batch); several
    configs train as stages, in order."""
    from xtrain.console import make_console
    from xtrain.machine.facts import Facts
    from xtrain.runtime.quiet import quiet_deepspeed
    from xtrain.train.stages import load_stages, split_args

    quiet_deepspeed()  # the plan's model skeleton may import deepspeed (its CPU line on stdout)
    console = make_console()
    configs, overrides = split_args(list(args or []))  # overrides read (and refused) by load_config
    if not configs:
        raise XtrainError("no config named", "e.g. xtrain train examples/seq-cls.yaml run.max_steps=20")
    if precision is not None:  # the same as the override run.mixed_precision=..., checked the same way
        overrides.append(f"run.mixed_precision={precision}")
    n = parse_int(processes, "--processes", example="e.g. --processes 2")
    gpu_ids = parse_gpus(gpus)
    if not configs[0].is_file():
        raise XtrainError(f"config {configs[0]} not found", examples.missing_hint(configs[0]))
    if facts_file is not None and not dry_run:
        raise XtrainError(
            "--facts plans from another machine's snapshot; training runs on this one",
            "add --dry-run to see that machine's plan, or leave out --facts",
        )
    stages = load_stages(configs, overrides)  # every stage read and checked before anything starts
    for stage in stages:  # a trained built-in as a start (builtin:tiny-llama-sft): trained once, first
        built_in_start(stage.cfg, console)
    facts = Facts.load(facts_file) if facts_file is not None else None  # else the plan probes
    options = LaunchOptions(n, gpu_ids, platform, facts, fsdp, deepspeed, dry_run, facts_file is not None)
    if len(stages) == 1:
        stage = stages[0]
        raise typer.Exit(
            run_stage(prepare(stage.cfg, options), stage.path, stage.overrides, options, console)
        )
    from xtrain.commands.recipe import run_recipe

    raise typer.Exit(run_recipe(stages, options, console))
