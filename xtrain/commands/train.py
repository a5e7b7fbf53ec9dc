"""`xtrain train CONFIG [key=value ...]`: train on every planned device with one command.

config (checked before anything starts) -> facts -> plan -> the plan's launcher:
accelerate's own launcher called in-process (Linux, WSL2, macOS) or the spawn path of
`xtrain.run` (Windows, where torchrun trips on libuv). The exit code is the training's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from xtrain.commands.options import parse_gpus, parse_int
from xtrain.errors import XtrainError

RUN_MODULE = "xtrain.run"


def check_overrides(overrides: list[str]) -> list[str]:
    bad = [o for o in overrides if "=" not in o or o.startswith("=")]
    if bad:
        raise XtrainError(f"override {bad[0]!r} is not key=value", "e.g. run.max_steps=100")
    return overrides


def plan_for_training(
    cfg: Any, processes: int | None, gpu_ids: list[int] | None, platform: str | None
) -> Any:
    """The plan for this machine, with the config's precision, checked against the config's
    global batch before any process starts."""
    from xtrain.planning.resolve import machine_plan, run_settings

    plan = machine_plan(cfg, processes=processes, gpu_ids=gpu_ids, platform=platform)
    run_settings(cfg, plan, plan.world_size)  # a global batch that does not divide stops here
    return plan


def equivalent_commands(plan: Any, run_argv: list[str]) -> list[tuple[str, list[str]]]:
    """What `xtrain train` does, as commands the user could type: [(title, lines)], the
    command xtrain itself uses first."""
    from xtrain.launch.launcher import accelerate_args
    from xtrain.shell import join_lines, python_exe, quote, set_env

    sh = plan.shell
    env = [set_env(sh, k, v) for k, v in plan.env.items()]
    args = " ".join(quote(sh, a) for a in run_argv)
    n = plan.num_processes
    spawn = f"{python_exe(sh)} -m {RUN_MODULE}" + (f" --processes {n}" if n > 1 else "") + f" {args}"
    # accelerate_args ends with "-m xtrain.run ARGV": keep its launcher flags, print the tail once
    flags = accelerate_args(RUN_MODULE, run_argv, plan)[: -(len(run_argv) + 2)]
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
    if plan.world_size == 1:  # one process: xtrain runs it as a plain child, no launcher
        return [
            ("what xtrain runs (one process, no launcher)", env + visible + [spawn]),
            ("the same with accelerate launch", env + visible + [accelerate]),
        ]
    if plan.launcher == "spawn":
        return [
            ("what xtrain runs (spawned workers, no torchrun: the Windows path)", env + visible + [spawn]),
            ("the same with accelerate launch (one process; xtrain.run starts the workers: no torchrun)",
             env + visible + [accelerate]),
        ]  # fmt: skip
    return [
        ("what xtrain runs", env + [accelerate]),
        ("the same with torchrun", env + visible + [torchrun]),
        ("the same without a launcher (spawned workers)", env + visible + [spawn]),
    ]


def train(
    config: Path = typer.Argument(..., help="YAML train config (see examples/ and docs/configuration.md)."),
    overrides: list[str] = typer.Argument(None, metavar="[KEY=VALUE]...", help="e.g. run.max_steps=100"),
    processes: str = typer.Option(None, "--processes", "-n", help="Processes (default: one per GPU)."),
    gpus: str = typer.Option(None, "--gpus", help='GPU ids, e.g. "0,1" (default: all).'),
    precision: str = typer.Option(
        None, "--precision", help="no, fp16 or bf16 (default: the config, else the plan)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the equivalent commands and exit."),
    platform: str = typer.Option(None, "--platform", hidden=True, help="Plan as if on this OS (tests)."),
) -> None:
    """Train CONFIG on every planned device (one process per GPU, fixed global batch)."""
    from xtrain.console import make_console
    from xtrain.train.config import load_config

    console = make_console()
    overrides = check_overrides(list(overrides or []))
    if precision is not None:  # the same as the override run.mixed_precision=..., checked the same way
        overrides.append(f"run.mixed_precision={precision}")
    n = parse_int(processes, "--processes", 1, example="e.g. --processes 2")
    gpu_ids = parse_gpus(gpus)
    if not config.is_file():
        raise XtrainError(f"config {config} not found", "check the path (examples/ has ready configs)")
    cfg = load_config(str(config), overrides)
    plan = plan_for_training(cfg, n, gpu_ids, platform)
    run_argv = ["--config", str(config), *overrides]

    if dry_run:
        console.print(f"[bold]Plan:[/] {plan.summary()}", soft_wrap=True)
        for title, lines in equivalent_commands(plan, run_argv):
            shell = "PowerShell" if plan.shell == "powershell" else "bash"
            console.print(f"\n# {title} ({shell})", soft_wrap=True, markup=False)
            for line in lines:
                console.print(line, soft_wrap=True, markup=False)
        return
    raise typer.Exit(launch_training(plan, run_argv, console, cfg.run.output_dir))


def launch_training(plan: Any, run_argv: list[str], console: Any, output_dir: str | None = None) -> int:
    """Start xtrain.run on every planned process; returns its exit code (0 on success)."""
    import sys

    from rich.markup import escape

    from xtrain.launch import launcher as launch
    from xtrain.launch import stops

    console.print(f"[bold]xtrain train:[/] {plan.summary()}", soft_wrap=True)
    try:
        launch.launch(RUN_MODULE, run_argv, plan)
    except launch.WorkerStopped as e:
        # Ctrl+C / SIGTERM: rank 0 said where the stop checkpoint is, else say what is there
        if e.at_once:
            stops.remove_killed_writes(output_dir)
        if e.outcome is None or e.at_once:
            sys.stderr.write(stops.stopped_error(output_dir, e.signum, e.at_once).one_line() + "\n")
        return e.exit_code
    except launch.WorkerFailed as e:
        if e.outcome is not None:  # rank 0 already reported it in one line
            return int(e.outcome.get("exit_code") or e.worker_exit_code or 1)
        if e.worker_exit_code not in (2, 3, 130):
            console.print(f"[bold red]error:[/] {escape(e.one_line())}", soft_wrap=True)
        return e.worker_exit_code if e.worker_exit_code > 0 else 1
    return 0
