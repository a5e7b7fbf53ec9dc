"""`xtrain doctor`: what this machine can do for multi-GPU training, what is wrong, how to fix it.

options -> planning.resolve (facts probed in full, or loaded with --facts; plan; findings) ->
rendered table or --json; --smoke then starts the planned processes for real. Exit codes: 0 ready
(warnings allowed), 1 an error finding or a failed smoke test, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from xtrain.commands.options import parse_gpus, parse_int, whole
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from rich.console import Console

    from xtrain.launch.smoke import SmokeResult
    from xtrain.machine.facts import Facts
    from xtrain.planning.plan import Diagnosis, Plan


def check_save_path(path: Path, force: bool) -> None:
    """Refuse before any work is done: never overwrite silently, fail early on a bad folder."""
    if path.is_dir():
        raise XtrainError(f"--save {path} is a folder", "give a file name, e.g. --save machine.json")
    if path.exists() and not force:
        raise XtrainError(f"{path} already exists", "choose another name, or add --force to replace it")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.exists():
        raise XtrainError(f"cannot save to {path}: folder {parent} does not exist", "create it first")
    if not parent.is_dir():
        raise XtrainError(f"cannot save to {path}: {parent} is not a folder", "choose another path")
    if not os.access(parent, os.W_OK):
        raise XtrainError(f"cannot save to {path}: folder {parent} is not writable", "choose another folder")


def write_snapshot(path: Path, text: str) -> None:
    """Write through a temporary file and rename: a failed write leaves no half file behind."""
    from xtrain import atomic

    try:
        atomic.write_text(path, text + "\n")
    except OSError as e:
        raise XtrainError(f"cannot save to {path}: {e.strerror or e}", "choose another --save path") from None


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at stderr for a block, so child processes (which inherit it)
    cannot print into the --json output."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


# Over 80 lines only by its typer options (about 40 of them); the body is about 55.
# longer: most of its lines are typer's option declarations, one per flag
def doctor(
    json_out: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one JSON object {facts, plan, findings, smoke?} and nothing else."
        ),
    ] = False,
    smoke: Annotated[
        bool,
        typer.Option(
            "--smoke",
            help="Start the planned processes with the planned backend, check an all-reduce "
            "on every rank and measure its bandwidth.",
        ),
    ] = False,
    facts_file: Annotated[
        Path | None,
        typer.Option("--facts", metavar="FILE", help="Diagnose a saved snapshot instead of this machine."),
    ] = None,
    save: Annotated[
        Path | None, typer.Option("--save", metavar="FILE", help="Write this machine's facts to FILE (JSON).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Let --save replace an existing file.")] = False,
    processes: Annotated[
        int | None,
        typer.Option(
            "--processes", parser=whole("--processes"), help="Processes on this machine (default: auto)."
        ),
    ] = None,
    gpus: Annotated[
        str | None, typer.Option("--gpus", metavar="IDS", help='GPU ids to use, e.g. "0,1" (default: all).')
    ] = None,
    precision: Annotated[
        str | None,
        typer.Option("--precision", metavar="no|fp16|bf16", help="Mixed precision (default: auto)."),
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", parser=whole("--port"), help="Rendezvous port (default: 29500).")
    ] = None,
    platform: Annotated[
        str | None,
        typer.Option("--platform", hidden=True, help="Force an OS kind (tests/support: windows, wsl2, ...)."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            metavar="FILE",
            help="Also size this train config on this machine: memory a process, and the longest "
            "sequence a card fits with and without parallel.sequence (docs/long-context.md).",
        ),
    ] = None,
) -> None:
    """Check this machine for multi-GPU training and print findings with fixes."""
    from xtrain.machine.facts import Facts
    from xtrain.planning.resolve import resolve

    # -- validate everything cheap before probing (probing imports torch; resolve checks the
    # settings themselves before it probes) ------------------------------------------------------
    n = parse_int(processes, "--processes", example="e.g. --processes 2")
    gpu_ids = parse_gpus(gpus)
    port_number = parse_int(port, "--port", example="e.g. --port 29500")
    if smoke and facts_file is not None:
        raise XtrainError(
            "--smoke tests this machine, not a saved snapshot", "leave out --facts to run the smoke test"
        )
    if save is not None:
        check_save_path(save, force)

    # -- facts (a snapshot, else the full probe) -> plan + findings ------------------------------
    snapshot = Facts.load(facts_file) if facts_file is not None else None
    diagnosis = resolve(
        processes=n, gpu_ids=gpu_ids, precision=precision, port=port_number, platform=platform,
        facts=snapshot, full_probe=True,
    )  # fmt: skip
    facts = diagnosis.facts

    from xtrain.console import make_console

    out = make_console()
    err = make_console(stderr=True)
    if save is not None:
        write_snapshot(save, facts.to_json())
    if not json_out:
        from xtrain.commands.render import render_diagnosis

        render_diagnosis(out, facts, diagnosis)
        if config is not None:
            _config_fit(out, config, facts, n, gpu_ids, platform)
        if save is not None:
            out.print(f"Saved the facts to {save} (send it along with a bug report).", soft_wrap=True)

    smoke_result = _smoke(diagnosis.plan, out, json_out) if smoke else None
    if json_out:
        _print_json(facts, diagnosis, smoke_result)
        if save is not None:
            err.print(f"Saved the facts to {save}.", soft_wrap=True)

    if diagnosis.has_errors or (smoke_result is not None and not smoke_result.ok):
        raise typer.Exit(code=1)


def _config_fit(
    out: Console,
    path: Path,
    facts: Facts,
    processes: int | None,
    gpu_ids: list[int] | None,
    platform: str | None,
) -> None:
    """``--config``: the train config planned on these facts, its sequence split, memory a process
    and the longest sequence that fits a card (the dry run's own checks), a line each."""
    from xtrain.planning.run import for_launch
    from xtrain.tasks.validation import load_config
    from xtrain.train.preflight import Where
    from xtrain.train.preflight.plan import _memory, _sequence

    cfg = load_config(path)
    run = for_launch(cfg, processes=processes, gpu_ids=gpu_ids, platform=platform, facts=facts)
    where = Where(launcher=True, dry_run=True)
    lines = [
        f"{n.label}: {n.text}" if n.label else n.text for n in _sequence(run, where) + _memory(run, where)
    ]
    out.print(
        f"\n{path} ({cfg.model.name_or_path}, data.max_length={cfg.data.max_length}):",
        soft_wrap=True,
        markup=False,
    )
    for line in lines or ["Memory: estimated for CUDA plans (this one is on " + run.plan.device + ")"]:
        out.print(f"  {line}", soft_wrap=True, markup=False)


def _smoke(plan: Plan, out: Console, json_out: bool) -> SmokeResult:
    """``--smoke``: start the planned processes for real; the result is shown unless ``--json``."""
    from xtrain.launch.smoke import run_smoke

    if json_out:
        with stdout_to_stderr():
            return run_smoke(plan)
    what = (
        f"{plan.num_processes} processes, {plan.backend} on {plan.device}, via {plan.launcher}"
        if plan.distributed
        else f"one process on {plan.device}"
    )
    out.print(f"\nRunning the smoke test ({what})...")
    result = run_smoke(plan)
    from xtrain.commands.render import render_smoke

    render_smoke(out, result)
    return result


def _print_json(facts: Facts, diagnosis: Diagnosis, smoke_result: SmokeResult | None) -> None:
    """``--json``: one object {facts, plan, findings, smoke?} on stdout."""
    doc: dict[str, Any] = {
        "facts": facts.to_dict(),
        "plan": diagnosis.plan.to_dict(),
        "findings": [vars(f) for f in diagnosis.findings],
    }
    if smoke_result is not None:
        doc["smoke"] = smoke_result.to_dict()
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()
