"""`python -m xtrain.run`: train, the same way under every launcher.

    python -m xtrain.run [--config C] [--processes N] [key=value ...]
    accelerate launch [--multi_gpu --num_processes N] -m xtrain.run [--config C] [key=value ...]
    torchrun --nproc_per_node N -m xtrain.run [--config C] [key=value ...]

Under a launcher (``WORLD_SIZE`` is set) this process is one rank: it trains. Without one,
``--processes N`` (N > 1) starts N ranks itself with ``torch.multiprocessing`` (spawn) and a
rendezvous on 127.0.0.1 at a free port: the Windows path, where torchrun and so accelerate
launch can fail on libuv. ``--platform windows`` (or ``XTRAIN_PLATFORM=windows``) plans for
Windows on any OS, so CI runs that path too.

A mistake a user can make ends as one line on stderr and a non-zero exit (2), Ctrl+C as a saved
checkpoint and exit 130.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError
from xtrain.launch import env as launchenv
from xtrain.launch import lifetime
from xtrain.train import stops

PLATFORM_ENV = "XTRAIN_PLATFORM"
SINGLE_LAUNCH_NOTE = (
    "xtrain: accelerate launch started one process (a single-process launch runs no torchrun, whose "
    "rendezvous needs libuv on Windows); xtrain.run starts the {n} workers itself (spawn, "
    "127.0.0.1 rendezvous without libuv), as `python -m xtrain.run --processes {n}` does\n"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m xtrain.run",
        description="Train with LoRA as the config says (same result under every launcher).",
    )
    p.add_argument("--config", "-c", help="YAML train config (default: the built-in example job)")
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
    args = p.parse_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        p.error(f"overrides must look like key=value, got {bad[0]!r}")
    return args


def _launched() -> bool:
    return "WORLD_SIZE" in os.environ


def _is_rank0() -> bool:
    rank = os.environ.get("RANK", "0").strip() or "0"
    return not rank.isdigit() or int(rank) == 0  # a malformed RANK is reported (by every rank)


def accelerate_single_launch(environ: dict[str, str] | None = None) -> bool:
    """``accelerate launch`` started this as ONE process for a config that asks for several.

    That is xtrain's Windows accelerate config (``distributed_type: NO``, ``num_processes: N``):
    accelerate's simple launcher starts one ``python -m xtrain.run`` without torchrun (whose
    rendezvous stores need libuv, which Windows torch lacks) and exports the config's precision
    as ACCELERATE_MIXED_PRECISION and, for N > 1, MASTER_ADDR/MASTER_PORT, but no WORLD_SIZE
    (accelerate/utils/launch.py ``prepare_simple_launcher_cmd_env``). xtrain.run then starts the
    workers itself, exactly like ``python -m xtrain.run --processes N``."""
    env = os.environ if environ is None else environ
    return "WORLD_SIZE" not in env and "ACCELERATE_MIXED_PRECISION" in env and "MASTER_ADDR" in env


def single_launch_processes(cfg: Any, platform: str | None) -> int:
    """How many workers to start under ``accelerate_single_launch``: one per GPU that accelerate
    left visible (it exports the config's ``gpu_ids`` as CUDA_VISIBLE_DEVICES), else the plan's
    count for this machine. (accelerate does not export ``num_processes`` itself.)"""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return len([e for e in visible.split(",") if e.strip()])
    from xtrain.planning.resolve import machine_plan

    return machine_plan(cfg, platform=platform).num_processes


def worker_plan(cfg: Any, platform: str | None) -> Any:
    """This rank's plan: the one xtrain's launcher sent (``XTRAIN_PLAN``), else the rules'
    answer for this machine and the launch context (accelerate launch, torchrun, plain python)."""
    from xtrain.launch.env import PLAN_ENV
    from xtrain.planning.plan import Plan
    from xtrain.train.accelerator import LaunchContext

    ctx = LaunchContext.from_env()
    sent = os.environ.get(PLAN_ENV)
    if sent:
        plan = Plan.from_dict(json.loads(sent))
        if plan.world_size == ctx.world_size:
            return plan
    from xtrain.planning.resolve import machine_plan

    return machine_plan(
        cfg,
        processes=ctx.local_world_size,
        num_machines=ctx.num_machines,
        main_address=ctx.main_address,
        platform=platform,
    )


def run_worker(cfg: Any, platform: str | None) -> Any:
    """Train as one rank of the launch context (or as the only process)."""
    from xtrain.train.loop import train
    from xtrain.train.quiet import quiet_libraries
    from xtrain.train.report import RichReporter

    lifetime.watch_parent()  # started by a launcher: end with it (xtrain.launch.lifetime)
    quiet_libraries()
    plan = worker_plan(cfg, platform)
    reporter = RichReporter() if _is_rank0() else None
    with stops.early_stop_signals():  # SIGTERM before the loop: the same one line and code
        return train(cfg, plan, reporter)


def spawned_worker(cfg: Any, platform: str | None, error_dir: str) -> None:
    """The spawn target (top-level, importable). A user-facing error goes to a file for the
    parent to print once, instead of once per rank."""
    try:
        run_worker(cfg, platform)
    except XtrainError as e:
        rank = int(os.environ.get("RANK", "0") or 0)
        data = {"message": e.message, "hint": e.hint, "exit_code": e.exit_code}
        (Path(error_dir) / f"rank-{rank}.json").write_text(json.dumps(data), encoding="utf-8")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:  # Ctrl+C before the loop took over the signal (or a second one)
        sys.exit(130)
    except stops.StopRequested as e:  # the parent says what was (not) saved
        sys.exit(stops.exit_code(e.signum))


def _spawn(cfg: Any, processes: int, platform: str | None) -> None:
    """Start ``processes`` ranks here with torch.multiprocessing (spawn)."""
    from xtrain.launch.failures import WorkerFailed, WorkerStopped
    from xtrain.launch.spawn import spawn
    from xtrain.planning.resolve import machine_plan, run_settings

    plan = machine_plan(cfg, processes=processes, platform=platform)
    run_settings(cfg, plan, processes)  # a global batch that does not divide fails here, once
    with tempfile.TemporaryDirectory(prefix="xtrain-errors-") as error_dir:
        try:
            spawn(spawned_worker, (cfg, platform, error_dir), plan, nprocs=processes)
        except WorkerFailed as failed:
            reported = sorted(Path(error_dir).glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))
            stopped = failed if isinstance(failed, WorkerStopped) else None
            if stopped is not None and stopped.at_once:
                stops.remove_killed_writes(cfg.run.output_dir)
            if stopped is not None and (stopped.at_once or not reported):
                raise stops.stopped_error(cfg.run.output_dir, stopped.signum, stopped.at_once) from None
            if reported:
                data = json.loads(reported[0].read_text(encoding="utf-8"))
                code = stopped.exit_code if stopped is not None else int(data["exit_code"])
                raise XtrainError(data["message"], data["hint"], exit_code=code) from None
            if failed.details:
                sys.stderr.write(failed.details.rstrip() + "\n")
            raise


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    platform = args.platform or os.environ.get(PLATFORM_ENV) or None
    cfg = None
    try:
        launchenv.check()  # WORLD_SIZE=abc & co.: one line, not a ValueError deep in torch
    except XtrainError as e:  # every rank says it: a malformed rank cannot tell who is rank 0
        sys.stderr.write(f"error: {e.one_line()}\n")
        return e.exit_code
    try:
        from xtrain.train.config.loading import load_config

        cfg = load_config(args.config, args.overrides)
        processes = args.processes
        if not _launched() and accelerate_single_launch():
            processes = processes or single_launch_processes(cfg, platform)
            if processes > 1:
                sys.stderr.write(SINGLE_LAUNCH_NOTE.format(n=processes))
                sys.stderr.flush()
        if _launched():
            world = int(os.environ["WORLD_SIZE"])
            if args.processes is not None and args.processes != world:
                raise XtrainError(
                    f"--processes {args.processes} conflicts with the launcher's {world} processes",
                    "leave out --processes when starting through accelerate launch or torchrun",
                )
            run_worker(cfg, platform)
        elif processes is not None and processes > 1:
            _spawn(cfg, processes, platform)
        else:
            if processes is not None and processes < 1:
                raise XtrainError(f"--processes must be at least 1, got {processes}", "e.g. --processes 2")
            run_worker(cfg, platform)
    except XtrainError as e:
        return _report(e)
    except (KeyboardInterrupt, stops.StopRequested) as e:  # before the loop, or a second Ctrl+C
        signum = e.signum if isinstance(e, stops.StopRequested) else signal.SIGINT
        out = cfg.run.output_dir if cfg is not None else None
        return _report(stops.stopped_error(out, signum, at_once=isinstance(e, stops.StopAtOnce)))
    return 0


def _report(e: XtrainError) -> int:
    """Rank 0 prints the one line (and tells xtrain's launcher it did); returns the exit code."""
    if _is_rank0():
        prefix = "" if e.exit_code in (130, 143) else "error: "  # a stop is not an error
        sys.stderr.write(f"{prefix}{e.one_line()}\n")
        sys.stderr.flush()
        stops.record_outcome(e)
    return e.exit_code


if __name__ == "__main__":
    code = main()
    if code in (130, 143):
        # the run has stopped and said so: a further Ctrl+C during interpreter shutdown (atexit
        # finalizers) would only add a KeyboardInterrupt traceback after the one line
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)
