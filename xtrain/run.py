"""`python -m xtrain.run`: train, the same way under every launcher.

    python -m xtrain.run [--config C] [--processes N] [key=value ...]
    accelerate launch [--multi_gpu --num_processes N] -m xtrain.run [--config C] [key=value ...]
    torchrun --nproc_per_node N -m xtrain.run [--config C] [key=value ...]

Under a launcher (``WORLD_SIZE`` is set) this process is one rank: it trains. Without one,
``--processes N`` (N > 1) starts N ranks itself with ``torch.multiprocessing`` (spawn), meeting
through a file store in a private folder (``xtrain.launch.rendezvous``: no socket): the Windows
path, where torchrun and so accelerate launch can fail on libuv. Each rank runs this module as
a rank of that launch, through the same entry and report channel as ``xtrain train``'s spawn
launcher (``launch.launcher.spawn_module``, ``runtime.report``). ``--platform windows`` (or
``XTRAIN_PLATFORM=windows``) plans for Windows on any OS, so CI runs that path too.

A mistake a user can make ends as one line on stderr and a non-zero exit (2), Ctrl+C as a saved
checkpoint and exit 130.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import TYPE_CHECKING, NoReturn

from xtrain.config.schema import given_keys
from xtrain.errors import XtrainError
from xtrain.launch.launcher import spawn_module
from xtrain.launch.worker_errors import WorkerFailed, WorkerStopped
from xtrain.model.configs import local_config
from xtrain.planning.context import LaunchContext
from xtrain.planning.run import Run, for_process
from xtrain.runtime import lifetime, report
from xtrain.runtime.quiet import quiet_libraries
from xtrain.runtime.signals import StopAtOnce, StopRequested, stop_on_sigterm
from xtrain.tasks import model_checks
from xtrain.train.failures import NoPeers, remove_killed_writes, stopped_error
from xtrain.train.preflight import Note, run_checks
from xtrain.train.report import RichReporter

if TYPE_CHECKING:
    from xtrain.config.schema import TrainConfig
    from xtrain.train.result import TrainResult

MODULE = "xtrain.run"  # what each spawned rank runs: this module, as a rank of the launch
PLATFORM_ENV = "XTRAIN_PLATFORM"
SINGLE_LAUNCH_NOTE = (
    "xtrain: accelerate launch started one process (a single-process launch runs no torchrun, whose "
    "rendezvous needs libuv on Windows); xtrain.run starts the {n} workers itself (spawn, "
    "meeting through a file: no socket, no libuv), as `python -m xtrain.run --processes {n}` does\n"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m xtrain.run",
        description="Train with LoRA as the config says (same result under every launcher).",
    )
    p.add_argument(
        "--config", "-c", help="YAML train config (default: the built-in job `xtrain quickstart` runs)"
    )
    p.add_argument(
        "--processes",
        "-n",
        type=int,
        help="start this many processes here (no launcher needed; the Windows path)",
    )
    p.add_argument("--platform", help=argparse.SUPPRESS)  # tests/support: plan for another OS
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, e.g. run.max_steps=100"
    )
    return p.parse_args(argv)  # the overrides are read (and refused) by load_config, as everywhere


def run_worker(run: Run) -> TrainResult:
    """Train as one rank of the launch context (or as the only process)."""
    from xtrain.train.loop import train_run

    lifetime.watch_parent(run.context)  # started by a launcher: end with it (xtrain.runtime.lifetime)
    quiet_libraries()
    reporter = RichReporter() if run.is_main else None
    with stop_on_sigterm():  # SIGTERM before the loop: the same one line and code
        return train_run(run, reporter)


def _spawn(args: argparse.Namespace, run: Run, fitted: list[str]) -> int:
    """Start the plan's ranks here (spawn), each running this module as a rank of the launch, as
    ``xtrain train``'s spawn launcher does (one worker entry: ``launch.spawn.run_module``; one
    report channel: ``runtime.report``). ``fitted``: the lengths fitted here, handed to the ranks
    as overrides (said once, here). Returns the exit code when a rank said how it ended."""
    argv = ["--config", args.config, *args.overrides, *fitted]
    if args.platform:
        argv = ["--platform", args.platform, *argv]
    out = run.cfg.run.output_dir
    try:
        spawn_module(MODULE, argv, run.plan)
    except WorkerStopped as stopped:  # a rank said where the stop checkpoint is, else say it here
        if stopped.at_once:
            remove_killed_writes(out)
        if stopped.at_once or not stopped.reports:
            raise stopped_error(out, stopped.signum, stopped.at_once) from None
        if stopped.said is not None:
            return stopped.exit_code
        raise stopped.reports[0].error(stopped.exit_code) from None
    except WorkerFailed as failed:
        if (said := failed.said) is not None:
            return said.exit_code
        if failed.failure_reports:  # a rank that does not speak for the run: said once, here
            raise failed.failure_reports[0].error() from None
        if failed.details:
            sys.stderr.write(failed.details.rstrip() + "\n")
        raise
    return 0


def main(argv: list[str] | None = None) -> int:
    return _main(argv)[0]


def _main(argv: list[str] | None) -> tuple[int, LaunchContext | None]:
    """(the exit code, the launch context read once: None when it was malformed)."""
    args = parse_args(argv)
    platform = args.platform or os.environ.get(PLATFORM_ENV) or None
    try:
        context = LaunchContext.from_env()  # WORLD_SIZE=abc & co.: one line, not a ValueError in torch
    except XtrainError as e:  # every rank says it: a malformed rank cannot tell who is rank 0
        sys.stderr.write(f"error: {e.one_line()}\n")
        return e.exit_code, None
    cfg = None
    try:
        from xtrain.model.configs import checkpoint_dtype
        from xtrain.tasks import default_job
        from xtrain.tasks.validation import load_config

        args.config = args.config or str(default_job())  # none named: the job `xtrain quickstart` runs
        cfg = load_config(args.config, args.overrides)
        _built_in_start(cfg, context)  # a trained built-in as the start: trained once, first
        fitted = _fit_defaults(cfg, context)  # lengths the user did not set, from the model's positions
        # the launch mode, in one place: a rank of a launcher, accelerate's one-process launch
        # (xtrain.run starts the workers), --processes N (the same), or this process alone
        run = for_process(
            cfg, context, processes=args.processes, platform=platform, checkpoint_dtype=checkpoint_dtype(cfg)
        )
        # the preflight checks (a missing bitsandbytes, an unwritable output folder, ...) before the
        # model loads; a precision warning of a plan made here (accelerate launch, torchrun): one line
        _say(run_checks(run), run)
        if context.launched or run.plan.world_size == 1:
            run_worker(run)
        else:
            if context.single_launch:
                sys.stderr.write(SINGLE_LAUNCH_NOTE.format(n=run.plan.num_processes))
                sys.stderr.flush()
            return _spawn(args, run, fitted), context
    except XtrainError as e:
        return _report(e, context), context
    except (KeyboardInterrupt, StopRequested) as e:  # before the loop, or a second Ctrl+C
        signum = e.signum if isinstance(e, StopRequested) else signal.SIGINT
        at_once = isinstance(e, StopAtOnce)
        if at_once and context.launched and report.launcher_listens():
            return 130, context  # xtrain's launcher says it, once the killed ranks' writes are gone
        out = cfg.run.output_dir if cfg is not None else None
        return _report(stopped_error(out, signum, at_once=at_once), context), context
    return 0, context


def _built_in_start(cfg: TrainConfig, context: LaunchContext) -> None:
    """``train.builtin_stages.ensure``: a trained built-in that ``model.name_or_path`` names is
    trained once (xtrain's launchers built it before starting the ranks); rank 0 says it."""
    from xtrain.train.builtin_stages import ensure_config
    from xtrain.train.loop import train_run

    def say(line: str) -> None:
        if context.is_main:
            sys.stderr.write(f"note: {line}\n")

    ensure_config(cfg, train_run, say)


def _fit_defaults(cfg: TrainConfig, context: LaunchContext | None = None) -> list[str]:
    """``model_checks.fit_defaults`` from the model's config.json (a built-in is built and a hub
    model's config.json fetched here: the run loads the model next anyway); rank 0 (of
    ``context``) says each change. Returns the changes as ``key=value`` overrides."""
    lengths = {"data.max_length", "generation.max_new_tokens"}
    if lengths <= (given_keys(cfg) or lengths):
        return []  # both given (or a config built in code): nothing to fit, nothing to read
    before = (cfg.data.max_length, cfg.generation.max_new_tokens)
    for note in model_checks.fit_defaults(cfg, local_config(cfg, fetch=True)):
        if context is None or context.is_main:
            sys.stderr.write(f"note: {note}\n")
    after = (cfg.data.max_length, cfg.generation.max_new_tokens)
    keys = ("data.max_length", "generation.max_new_tokens")
    return [f"{key}={new}" for key, old, new in zip(keys, before, after, strict=True) if new != old]


def _say(notes: list[Note], run: Run) -> None:
    """The preflight checks' warnings, said once, by rank 0 (their other lines are the launcher's)."""
    if not run.is_main:
        return
    for note in notes:
        if note.level in ("warning", "error"):
            sys.stderr.write(f"{note.level}: {note.text}\n")
    sys.stderr.flush()


def _report(e: XtrainError, context: LaunchContext) -> int:
    """Rank 0 prints the one line; every rank tells xtrain's launcher how it ended and whether it
    said so (``runtime.report``); returns the exit code. A group that never formed has no rank 0
    to speak for the others: each says it."""
    printed = context.is_main or isinstance(e, NoPeers)
    if printed:
        prefix = "" if e.exit_code in (130, 143) else "error: "  # a stop is not an error
        sys.stderr.write(f"{prefix}{e.one_line()}\n")
        sys.stderr.flush()
    report.record(e, context.rank, printed)
    return e.exit_code


def exit_quietly(code: int) -> NoReturn:
    """``sys.exit(code)``; after a stop (130, 143) the run has stopped and said so: a further
    Ctrl+C during interpreter shutdown (atexit finalizers, torch's among them) would only add a
    KeyboardInterrupt traceback after the one line, so it is ignored from here on."""
    if code in (130, 143):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)


def one_rank_of_many(context: LaunchContext | None = None) -> bool:
    """Whether this process is one rank of a launch of several (the launcher's WORLD_SIZE, read
    by ``LaunchContext``: ``context``, else this environment's; a malformed one was reported by
    ``main``)."""
    try:
        return (context or LaunchContext.from_env()).distributed
    except XtrainError:
        return False


if __name__ == "__main__":
    code, context = _main(None)
    if one_rank_of_many(context):  # a rank under a launcher, done: see lifetime.end_rank
        lifetime.end_rank(code)
    exit_quietly(code)
