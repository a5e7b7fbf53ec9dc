"""`xtrain train CONFIG [key=value ...]`: train on every planned device with one command.

config (checked before anything starts) -> planning.resolve (facts, plan, run settings) -> the
plan's launcher: accelerate's own launcher called in-process (Linux, WSL2, macOS) or the spawn
path of `xtrain.run` (Windows, where torchrun trips on libuv). The exit code is the training's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from xtrain.commands.options import parse_gpus, parse_int
from xtrain.errors import XtrainError

RUN_MODULE = "xtrain.run"


def memory_lines(cfg: Any, resolved: Any) -> list[str]:
    """The plan's memory estimate against its smallest GPU, and the warning when it does not fit
    (rich markup). CUDA plans only: transformers (seconds to import) loads only then. A model
    whose config is not on this machine is skipped in a dim line (nothing is downloaded)."""
    from rich.markup import escape

    from xtrain.model import memory

    plan = resolved.plan
    gpus = [(g.index, g.name, g.memory_mib) for g in resolved.facts.gpus]
    gpu = memory.smallest_gpu(gpus, plan.gpu_ids) if plan.device == "cuda" else None
    if gpu is None:
        return []
    from xtrain import tasks
    from xtrain.runtime.quiet import quiet_libraries
    from xtrain.tasks.sizes import offline_sizes

    quiet_libraries()  # building the model's skeleton: no library chatter
    sizes = offline_sizes(cfg)
    if isinstance(sizes, str):
        return [f"[dim]memory estimate skipped: {escape(sizes)}[/]"]
    check = memory.check_memory(
        sizes,
        cfg.batch.per_device,
        cfg.data.max_length,
        cfg.model.gradient_checkpointing,
        resolved.settings.precision,
        gpu[1],
        gpu[0],
        images=tasks.get(cfg.model.task).image_tokens,
        windows=resolved.facts.os_kind == "windows",
    )
    lines = [f"[bold]Memory:[/] {escape(check.summary())}"]
    return lines + ([f"[bold yellow]warning:[/] {escape(check.warning)}"] if check.warning else [])


def model_check_lines(cfg: Any, resolved: Any) -> list[str]:
    """``--dry-run``: the run's model checks (lengths, LoRA targets) on the model's config where it
    is on this machine (nothing is downloaded); a failure is the run's own error line. A plan
    without CUDA checks the lengths from config.json only: transformers (seconds) is not imported."""
    from rich.markup import escape

    from xtrain.tasks import model_checks

    light = resolved.plan.device != "cuda"
    if not light:
        from xtrain.runtime.quiet import quiet_libraries

        quiet_libraries()  # building the model's skeleton: no library chatter
    return [f"[bold]Model checks:[/] {escape(model_checks.check_offline(cfg, light))}"]


def fitted_lines(cfg: Any) -> list[str]:
    """Defaults the user did not write that the model's positions lower (``data.max_length``,
    ``generation.max_new_tokens``), fitted in ``cfg`` from its config.json where it is on this
    machine, one line each (rich markup)."""
    from rich.markup import escape

    from xtrain.tasks import model_checks

    return [f"[bold]Fitted to the model:[/] {escape(note)}" for note in model_checks.fit_defaults(cfg)]


def precision_lines(resolved: Any) -> list[str]:
    """The precision the workers train in and why (the plan's reason: the user's choice, the
    weights' dtype, the GPU), with a warning line when it narrows the weights' range (rich markup)."""
    from rich.markup import escape

    plan = resolved.plan
    shown = plan.mixed_precision if plan.mixed_precision != "no" else "fp32"
    why = plan.reasons.get("mixed_precision", "")
    lines = [f"[bold]Precision:[/] {shown} ({escape(why)})" if why else f"[bold]Precision:[/] {shown}"]
    for f in resolved.findings:
        if f.code.startswith("precision-"):
            fix = f"; fix: {escape(f.fix)}" if f.fix else ""
            lines.append(f"[bold yellow]warning:[/] {escape(f.message)}{fix}")
    return lines


def loading_lines(cfg: Any, resolved: Any) -> list[str]:
    """The DataLoader workers each process reads its batches with, and why (rich markup)."""
    from rich.markup import escape

    from xtrain import tasks

    workers, why = resolved.settings.workers_for(tasks.get(cfg.model.task).decodes_media)
    return [f"[bold]Data loading:[/] {workers} worker(s) per process ({escape(why)})"]


def attention_lines(cfg: Any, resolved: Any) -> list[str]:
    """The attention implementation the plan's workers will load with, and why (rich markup); an
    explicit ``model.attn_implementation`` that cannot work stops here, before any process starts."""
    from rich.markup import escape

    from xtrain import tasks
    from xtrain.model import attention

    chosen = attention.for_plan(cfg, resolved, tasks.get(cfg.model.task).model_class)
    return [f"[bold]Attention:[/] {escape(chosen.summary())}"]


def quantization_lines(cfg: Any, resolved: Any, here: bool) -> list[str]:
    """What ``model.quantization`` loads the weights as; refused here when this machine's
    bitsandbytes cannot run it on the plan's device (``here``: the plan is for this machine, not
    a ``--facts`` snapshot), before any process starts."""
    if cfg.model.quantization is None:
        return []
    from rich.markup import escape

    from xtrain.model import quantization

    if here:
        quantization.check_backend(cfg.model.quantization, resolved.plan.device)
    return [f"[bold]Weights:[/] {escape(quantization.describe(cfg.model.quantization) or '')}"]


def check_optimizer(cfg: Any, resolved: Any, here: bool) -> None:
    """An 8-bit ``optim.name`` (bitsandbytes) refused before any process starts when this
    machine's bitsandbytes cannot run it on the plan's device (``here``: as ``quantization_lines``)."""
    from xtrain.train import optim  # no torch import unless the optimizer is bitsandbytes'

    if here:
        optim.check_backend(cfg.optim.name, resolved.plan.device)


def equivalent_commands(
    plan: Any, run_argv: list[str], sharding: list[str] | None = None
) -> list[tuple[str, list[str]]]:
    """What `xtrain train` does, as commands the user could type: [(title, lines)], the
    command xtrain itself uses first. ``sharding``: FSDP/DeepSpeed switches (accelerate only)."""
    from xtrain.launch.accelerate_launcher import accelerate_args
    from xtrain.shell import join_lines, python_exe, quote, set_env

    sh = plan.shell
    env = [set_env(sh, k, v) for k, v in plan.env.items()]
    args = " ".join(quote(sh, a) for a in run_argv)
    n = plan.num_processes
    spawn = f"{python_exe(sh)} -m {RUN_MODULE}" + (f" --processes {n}" if n > 1 else "") + f" {args}"
    # accelerate_args ends with "-m xtrain.run ARGV": keep its launcher flags, print the tail once
    flags = accelerate_args(RUN_MODULE, run_argv, plan, sharding=sharding or ())[: -(len(run_argv) + 2)]
    accelerate = join_lines(
        sh, ["accelerate launch " + " ".join(quote(sh, a) for a in flags), f"-m {RUN_MODULE} {args}"]
    )
    torchrun = join_lines(
        sh,
        [
            f"torchrun --nproc_per_node {n} --master_addr {plan.main_address} --master_port {plan.main_port}",
            f"-m {RUN_MODULE} {args}",
        ],
    )
    visible = []
    if plan.gpu_ids is not None and plan.device == "cuda":
        visible = [set_env(sh, "CUDA_VISIBLE_DEVICES", ",".join(map(str, plan.gpu_ids)))]
    if sharding:  # only accelerate's launcher starts FSDP/DeepSpeed
        return [
            (
                "what xtrain runs (FSDP/DeepSpeed: accelerate launch, also for one process)",
                env + visible + [accelerate],
            )
        ]
    if plan.world_size == 1:  # one process: xtrain runs it itself (launcher.runs_here) or as a child
        return [
            (
                "what xtrain runs (one process, no launcher; in its own process where it can)",
                env + visible + [spawn],
            ),
            ("the same with accelerate launch", env + visible + [accelerate]),
        ]
    if plan.launcher == "spawn":
        return [
            ("what xtrain runs (spawned workers, no torchrun: the Windows path)", env + visible + [spawn]),
            ("the same with accelerate launch (--num_processes without --multi_gpu: accelerate starts "
             "one process and xtrain.run spawns the workers: no torchrun)", env + visible + [accelerate]),
        ]  # fmt: skip
    return [
        ("what xtrain runs", env + [accelerate]),
        ("the same with torchrun", env + visible + [torchrun]),
        ("the same without a launcher (spawned workers)", env + visible + [spawn]),
    ]


# longer: most of its lines are typer's option declarations, one per flag
def train(
    config: Path = typer.Argument(..., help="YAML train config (see examples/ and docs/configuration.md)."),
    overrides: list[str] = typer.Argument(None, metavar="[KEY=VALUE]...", help="e.g. run.max_steps=100"),
    processes: str = typer.Option(None, "--processes", "-n", help="Processes (default: one per GPU)."),
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
    """Train CONFIG on every planned device (one process per GPU, fixed global batch)."""
    from rich.markup import escape

    from xtrain.console import make_console
    from xtrain.machine.facts import Facts
    from xtrain.planning.checks.comms import windows_gloo_refusal
    from xtrain.planning.resolve import resolve
    from xtrain.tasks.validation import load_config

    console = make_console()
    overrides = list(overrides or [])  # read (and refused) by load_config
    if precision is not None:  # the same as the override run.mixed_precision=..., checked the same way
        overrides.append(f"run.mixed_precision={precision}")
    n = parse_int(processes, "--processes", example="e.g. --processes 2")
    gpu_ids = parse_gpus(gpus)
    if not config.is_file():
        raise XtrainError(f"config {config} not found", "check the path (examples/ has ready configs)")
    if facts_file is not None and not dry_run:
        raise XtrainError(
            "--facts plans from another machine's snapshot; training runs on this one",
            "add --dry-run to see that machine's plan, or leave out --facts",
        )
    cfg = load_config(str(config), overrides)
    fitted = fitted_lines(cfg)  # lengths the user did not set, fitted to the model (each worker too)
    facts = Facts.load(facts_file) if facts_file is not None else None  # else resolve probes
    from xtrain.model.configs import checkpoint_dtype

    # the plan, checked against the config's global batch before any process starts; the
    # checkpoint's dtype (read here, where it is on this machine) decides model.dtype auto's precision
    resolved = resolve(
        cfg,
        processes=n,
        gpu_ids=gpu_ids,
        platform=platform,
        facts=facts,
        checkpoint_dtype=checkpoint_dtype(cfg),
    )
    plan = resolved.plan
    refusal = windows_gloo_refusal(resolved.facts, plan)  # a torch that cannot form a group
    if refusal is not None and not dry_run:
        raise refusal
    # refused here where it cannot run
    shard_flags = sharding_flags(resolved, fsdp, deepspeed, here=facts_file is None)
    run_argv = ["--config", str(config), *overrides]
    notes = fitted + precision_lines(resolved) + loading_lines(cfg, resolved) + attention_lines(cfg, resolved)
    check_optimizer(cfg, resolved, here=facts_file is None)
    if refusal is not None:
        notes.append(f"[bold red]error:[/] {escape(refusal.one_line())}")
    notes += quantization_lines(cfg, resolved, here=facts_file is None) + memory_lines(cfg, resolved)

    if dry_run:
        notes += model_check_lines(cfg, resolved)  # the checks a worker runs on the loaded model
        from xtrain.commands import render_data

        # the data on this machine, also for another machine's plan (--facts): read as the run reads
        # it, a bad row refused in its one line before anything is printed
        report = render_data.check(cfg)
        console.print(f"[bold]Plan:[/] {plan.summary()}", soft_wrap=True)
        for line in notes:
            console.print(line, soft_wrap=True)
        render_data.render(report, console)
        for title, lines in equivalent_commands(plan, run_argv, shard_flags):
            shell = "PowerShell" if plan.shell == "powershell" else "bash"
            console.print(f"\n# {title} ({shell})", soft_wrap=True, markup=False)
            for line in lines:
                console.print(line, soft_wrap=True, markup=False)
        return
    from xtrain.train import preflight

    assert resolved.settings is not None
    preflight.check_trackers(resolved.settings.trackers, plan.shell)  # before any process starts
    check_accelerate_default(resolved)
    raise typer.Exit(launch_training(plan, run_argv, console, cfg.run.output_dir, notes, shard_flags))


def sharding_flags(resolved: Any, fsdp: bool, deepspeed: str | None, here: bool = True) -> list[str]:
    """The `accelerate launch` switches for FSDP/DeepSpeed when the options or accelerate's
    default config ask for them (``launch.sharding``), [] otherwise; a machine that cannot run
    them stops here, before any process starts."""
    from xtrain.launch import sharding
    from xtrain.planning.checks.fixes import pip_line

    plan, facts = resolved.plan, resolved.facts
    kind = sharding.requested(fsdp, deepspeed, facts.accelerate_config if facts is not None else None)
    if kind is None:
        return []
    from_options = fsdp or deepspeed is not None
    sharding.check(kind, plan, from_options, pip_line(facts, plan, ["install", "deepspeed"]), here)
    return sharding.launch_flags(kind, from_options)


def check_accelerate_default(resolved: Any) -> None:
    """accelerate's launcher reads its default config (under HF_HOME) and dies with a YAML
    traceback when that file is broken: refuse first, naming the file (the probe read it)."""
    plan, facts = resolved.plan, resolved.facts
    if plan.world_size > 1 and plan.launcher != "spawn" and facts.accelerate_config_error:
        raise XtrainError(
            f"accelerate's default config {facts.accelerate_config_path} cannot be read: "
            f"{facts.accelerate_config_error}",
            "fix it, or rewrite it with `xtrain configure --force`, which keeps the old file as a backup",
        )


def launch_training(
    plan: Any,
    run_argv: list[str],
    console: Any,
    output_dir: str | None = None,
    notes: list[str] | None = None,
    sharding: list[str] | None = None,
) -> int:
    """Start xtrain.run on every planned process; returns its exit code (0 on success).
    ``notes``: lines shown under the plan (the memory estimate)."""
    import sys

    from rich.markup import escape

    from xtrain.launch import launcher as launch
    from xtrain.train.failures import remove_killed_writes, stopped_error

    console.print(f"[bold]xtrain train:[/] {plan.summary()}", soft_wrap=True)
    for line in notes or []:
        console.print(line, soft_wrap=True)
    try:
        launch.launch(RUN_MODULE, run_argv, plan, sharding=sharding or ())
    except launch.WorkerStopped as e:
        # Ctrl+C / SIGTERM: rank 0 said where the stop checkpoint is, else say what is there
        if e.at_once:
            remove_killed_writes(output_dir)
        if e.outcome is None or e.at_once:
            sys.stderr.write(stopped_error(output_dir, e.signum, e.at_once).one_line() + "\n")
        return e.exit_code
    except launch.WorkerFailed as e:
        if e.outcome is not None:  # rank 0 already reported it in one line
            return int(e.outcome.get("exit_code") or e.worker_exit_code or 1)
        if e.worker_exit_code not in (2, 3, 130):
            console.print(f"[bold red]error:[/] {escape(e.one_line())}", soft_wrap=True)
        return e.worker_exit_code if e.worker_exit_code > 0 else 1
    return 0
