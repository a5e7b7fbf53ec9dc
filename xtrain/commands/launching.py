"""What `xtrain train` and a recipe's stages share: a config made ready to launch (``prepare``: the
plan for this machine and every preflight check), launched or shown as a dry run (``run_stage``,
``launch_training``), the commands it equals (``equivalent_commands``) and the lines shown under
the plan. The exit code is the training's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console

    from xtrain.config.schema import TrainConfig
    from xtrain.machine.facts import Facts
    from xtrain.planning.plan import Plan
    from xtrain.planning.run import Run
    from xtrain.train.preflight import Note

RUN_MODULE = "xtrain.run"


def fitted_lines(cfg: TrainConfig) -> list[str]:
    """Defaults the user did not write that the model's positions lower (``data.max_length``,
    ``generation.max_new_tokens``), fitted in ``cfg`` from its config.json where it is on this
    machine, one line each (rich markup)."""
    from rich.markup import escape

    from xtrain.tasks import model_checks

    return [f"[bold]Fitted to the model:[/] {escape(note)}" for note in model_checks.fit_defaults(cfg)]


def note_lines(notes: list[Note]) -> list[str]:
    """The preflight checks' notes as rich markup lines (the data report is rendered apart)."""
    from rich.markup import escape

    styles = {"warning": "[bold yellow]warning:[/]", "error": "[bold red]error:[/]"}
    lines = []
    for note in notes:
        if note.data is not None:
            continue
        if note.level == "dim":
            lines.append(f"[dim]{escape(note.text)}[/]")
        else:
            lines.append(f"{styles.get(note.level, f'[bold]{note.label}:[/]')} {escape(note.text)}")
    return lines


def equivalent_commands(
    plan: Plan, run_argv: list[str], sharding: list[str] | None = None
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


@dataclass(frozen=True)
class LaunchOptions:
    """What the command line says about where and how the stages run (the same for each)."""

    processes: int | None
    gpu_ids: list[int] | None
    platform: str | None
    facts: Facts | None
    fsdp: bool
    deepspeed: str | None
    dry_run: bool
    from_snapshot: bool


@dataclass
class Prepared:
    """A stage made ready to launch: its Run (plan), the preflight's notes and the lines shown
    under the plan, the sharding switches."""

    run: Run
    notes: list[Note]
    lines: list[str]
    shard_flags: list[str]


def prepare(cfg: TrainConfig, options: LaunchOptions, quiet: bool = False) -> Prepared:
    """``cfg``'s plan for this machine and every preflight check (a refusal raises here, before
    any process starts). ``quiet``: the defaults fitted to the model are not listed."""
    from xtrain.launch import sharding
    from xtrain.model.configs import checkpoint_dtype
    from xtrain.planning.run import for_launch
    from xtrain.train.preflight import Where, run_checks

    fitted = fitted_lines(cfg)  # lengths the user did not set, fitted to the model (each worker too)
    # the plan, checked against the config's global batch before any process starts; the
    # checkpoint's dtype (read here, where it is on this machine) decides model.dtype auto's precision
    weights = checkpoint_dtype(cfg)
    run = for_launch(
        cfg,
        processes=options.processes,
        gpu_ids=options.gpu_ids,
        platform=options.platform,
        facts=options.facts,
        checkpoint_dtype=weights,
    )
    accelerate_config = run.facts.accelerate_config if run.facts is not None else None
    kind = sharding.requested(options.fsdp, options.deepspeed, accelerate_config)
    from_options = options.fsdp or options.deepspeed is not None
    where = Where(
        True, not options.from_snapshot, options.dry_run, sharding=kind, sharding_from_options=from_options
    )
    notes = run_checks(run, where)  # every preflight check: a refusal stops here, before anything starts
    shard_flags = sharding.launch_flags(kind, from_options) if kind is not None else []
    return Prepared(run, notes, ([] if quiet else fitted) + note_lines(notes), shard_flags)


def run_stage(
    ready: Prepared,
    config: Path,
    overrides: Sequence[str],
    options: LaunchOptions,
    console: Console,
) -> int:
    """One config's training launched (its exit code), or with ``--dry-run`` its plan, checks
    and equivalent commands shown (0)."""
    cfg, plan = ready.run.cfg, ready.run.plan
    run_argv = ["--config", str(config), *overrides]
    batch = ready.run.settings.batch_line  # the run's batch in numbers, on the plan's line
    if not options.dry_run:
        out = cfg.run.output_dir
        return launch_training(plan, run_argv, console, out, ready.lines, ready.shard_flags, batch)
    from xtrain.commands import render_data

    console.print(f"[bold]Plan:[/] {plan.summary(batch)}", soft_wrap=True)
    for line in ready.lines:
        console.print(line, soft_wrap=True)
    for note in ready.notes:
        if note.data is not None:
            render_data.render(note.data, console)
    for title, commands in equivalent_commands(plan, run_argv, ready.shard_flags):
        shell = "PowerShell" if plan.shell == "powershell" else "bash"
        console.print(f"\n# {title} ({shell})", soft_wrap=True, markup=False)
        for line in commands:
            console.print(line, soft_wrap=True, markup=False)
    return 0


def built_in_start(cfg: TrainConfig, console: Console) -> None:
    """A trained built-in (``builtin:tiny-llama-sft``, ...) that ``model.name_or_path`` names,
    trained once by xtrain's own SFT stage before anything else reads it
    (``train.builtin_stages``), the two lines it says printed."""
    from xtrain.train.builtin_stages import ensure_config
    from xtrain.train.loop import train_run

    ensure_config(cfg, train_run, lambda line: console.print(line, soft_wrap=True, markup=False))


def launch_training(
    plan: Plan,
    run_argv: list[str],
    console: Console,
    output_dir: str | None = None,
    notes: list[str] | None = None,
    sharding: list[str] | None = None,
    batch: str | None = None,
) -> int:
    """Start xtrain.run on every planned process; returns its exit code (0 on success), and
    records how it ended in the run's folder (``runtime.run_control``'s end record: what a
    studio shows). ``notes``: lines shown under the plan (the memory estimate); ``batch``: the
    run's batch in numbers (``RunSettings.batch_line``)."""
    from xtrain.runtime import lock, run_control

    code, line = _launched(plan, run_argv, console, output_dir, notes, sharding, batch)
    if output_dir and lock.live_holder(output_dir) is None:  # (not over a run that holds the folder)
        run_control.write_end(output_dir, code, line)
    return code


def _launched(
    plan: Plan,
    run_argv: list[str],
    console: Console,
    output_dir: str | None,
    notes: list[str] | None,
    sharding: list[str] | None,
    batch: str | None,
) -> tuple[int, str]:
    """``launch_training``'s launch: (the exit code, the one line it ended with: "" when it
    finished)."""
    import sys

    from rich.markup import escape

    from xtrain.launch import launcher as launch
    from xtrain.train.failures import remove_killed_writes, stopped_error

    console.print(f"[bold]xtrain train:[/] {plan.summary(batch)}", soft_wrap=True)
    for line in notes or []:
        console.print(line, soft_wrap=True)
    try:
        launch.launch(RUN_MODULE, run_argv, plan, sharding=sharding or ())
    except launch.WorkerStopped as e:
        # Ctrl+C / SIGTERM: rank 0 said where the stop checkpoint is, else say what is there
        if e.at_once:
            remove_killed_writes(output_dir)
        if e.said is None or e.at_once:
            said = stopped_error(output_dir, e.signum, e.at_once).one_line()
            sys.stderr.write(said + "\n")
            return e.exit_code, said
        return e.exit_code, e.said.error().one_line()
    except launch.WorkerFailed as e:
        if (said := e.said) is not None:  # a rank already said it in one line
            return int(said.exit_code or e.worker_exit_code or 1), said.error().one_line()
        if e.worker_exit_code not in (2, 3, 130):
            console.print(f"[bold red]error:[/] {escape(e.one_line())}", soft_wrap=True)
        code = e.worker_exit_code if e.worker_exit_code > 0 else 1
        # a rank's own line where one came back (a stop it took itself: a stop request)
        report = next(iter(e.reports), None)
        return code, report.error().one_line() if report is not None else e.one_line()
    return 0, ""
